//! The `rail-proxy` binary: flags (or env) → [`rail_proxy::Config`] ([`rail_proxy::config::Cli`],
//! `rail-proxy --help`), then the server kit's life: serve until SIGTERM/SIGINT, drain, exit code.

use std::process::ExitCode;

use clap::Parser;
use rail_proxy::config::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Cli::parse().into_config();
    dlock_common::serve::main("rail-proxy", config, rail_proxy::spawn).await
}
