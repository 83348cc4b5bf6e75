//! The `rail-stub` binary: flags (or env) → [`rail_stub::Config`], then the server kit's life:
//! serve until SIGTERM/SIGINT, drain, exit code.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use rail_stub::{Config, Mode};
#[derive(Debug, Parser)]
#[command(name = "rail-stub", about = "A stand-in external payment rail for dlock")]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "RAIL_STUB_LISTEN", default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Default outcome of a first request for an idempotency key.
    #[arg(long, env = "RAIL_STUB_MODE", value_enum, default_value_t = Mode::Ack)]
    mode: Mode,
    /// Latency added before every answer, in milliseconds.
    #[arg(long, env = "RAIL_STUB_LATENCY_MS", default_value_t = 0)]
    latency_ms: u64,
    /// How long a TIMEOUT answer hangs (after paying), in milliseconds; ends early at shutdown.
    #[arg(long, env = "RAIL_STUB_TIMEOUT_HANG_MS", default_value_t = 30_000)]
    timeout_hang_ms: u64,
    /// Enables the X-Rail-Stub-* request headers and PUT /v1/admin/behaviour. Tests and demos only.
    #[arg(long, env = "RAIL_STUB_TEST_MODE")]
    test_mode: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = Config {
        listen: args.listen,
        mode: args.mode,
        latency_ms: args.latency_ms,
        timeout_hang_ms: args.timeout_hang_ms,
        test_mode: args.test_mode,
    };
    dlock_common::serve::main(
        "rail-stub",
        Ok::<_, std::convert::Infallible>(config),
        rail_stub::spawn,
    )
    .await
}
