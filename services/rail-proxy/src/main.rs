//! The `rail-proxy` binary: flags (or env) → [`rail_proxy::Config`], serve until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Parser};
use rail_proxy::{Config, RailFence};

#[derive(Debug, Parser)]
#[command(name = "rail-proxy", about = "Fencing point (d) in front of the payment rail")]
struct Args {
    /// paydb URL, connecting as role payapp.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Address to listen on.
    #[arg(long, env = "RAIL_PROXY_LISTEN", default_value = "127.0.0.1:8083")]
    listen: SocketAddr,
    /// Base URL of the payment rail (e.g. the rail-stub).
    #[arg(long, env = "RAIL_PROXY_RAIL_URL")]
    rail_url: String,
    /// How long the one forward may take before it is recorded as TIMEOUT (ambiguous).
    #[arg(long, env = "RAIL_PROXY_RAIL_TIMEOUT_MS", default_value_t = 2_000)]
    rail_timeout_ms: u64,
    /// rail.proxy.fencing.enabled: `false` skips statement (d) entirely (demo of the corruption).
    #[arg(long, env = "RAIL_PROXY_FENCING_ENABLED", default_value_t = true, action = ArgAction::Set)]
    fencing_enabled: bool,
    /// paydb connection pool size.
    #[arg(long, env = "RAIL_PROXY_DB_MAX_CONNECTIONS", default_value_t = 10)]
    db_max_connections: u32,
    /// An attempt the rail has never received is abandoned once older than this (must exceed the
    /// rail timeout).
    #[arg(long, env = "RAIL_PROXY_ABANDON_AFTER_MS", default_value_t = 600_000)]
    abandon_after_ms: u64,
    /// Allows --fault. Tests and demos only; logged loudly.
    #[arg(long, env = "RAIL_PROXY_ENABLE_FAULT_INJECTION")]
    enable_fault_injection: bool,
    /// Fault injection: e.g. `exit-after-attempt` exits right after an attempt row commits.
    #[arg(
        long,
        env = "RAIL_PROXY_FAULT",
        value_enum,
        requires = "enable_fault_injection"
    )]
    fault: Option<rail_proxy::Fault>,
}

#[tokio::main]
async fn main() -> ExitCode {
    dlock_common::telemetry::init("rail-proxy");
    let args = Args::parse();
    let mut config = Config::new(args.database_url, args.rail_url);
    config.listen = args.listen;
    config.rail_timeout = Duration::from_millis(args.rail_timeout_ms);
    config.fence = RailFence::from_flag(args.fencing_enabled);
    config.max_connections = args.db_max_connections;
    config.abandon_after = Duration::from_millis(args.abandon_after_ms);
    config.fault = args.fault.filter(|_| args.enable_fault_injection);
    // The executor's credential: from the environment or a file, never a flag.
    config.credentials = match dlock_common::auth::Credentials::from_env(
        rail_proxy::config::CREDENTIALS_PREFIX,
        rail_proxy::config::ROLES,
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(event = "config_invalid", error = %e, "rail-proxy cannot start");
            return ExitCode::from(2);
        }
    };
    // Before the server announces itself (see shutdown_signal).
    let shutdown = dlock_common::serve::shutdown_signal();
    let server = match rail_proxy::spawn(config).await {
        Ok(s) => s,
        Err(e @ rail_proxy::StartError::Config(_)) => {
            tracing::error!(event = "config_invalid", error = %e, "rail-proxy cannot start");
            return ExitCode::from(2);
        }
        Err(e) => {
            tracing::error!(event = "start_failed", error = %e, "rail-proxy cannot start");
            return ExitCode::FAILURE;
        }
    };
    shutdown.await;
    // The server logs `stopped` itself once in-flight requests are done.
    match server.shutdown().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(event = "serve_failed", error = %e);
            ExitCode::FAILURE
        }
    }
}
