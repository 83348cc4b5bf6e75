//! The `rail-stub` binary: flags (or env) → [`rail_stub::Config`] ([`rail_stub::config::Cli`],
//! `rail-stub --help`), then the server kit's life: serve until SIGTERM/SIGINT, drain, exit code.

use std::process::ExitCode;

use clap::Parser;
use rail_stub::config::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Cli::parse().into_config();
    dlock_common::serve::main("rail-stub", config, rail_stub::spawn).await
}
