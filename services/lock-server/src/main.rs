//! `lock-server` binary: flags and environment are documented on [`lock_server::Cli`]
//! (`lock-server --help`).

use std::process::ExitCode;

use clap::Parser;
use lock_server::config::{ADMIN_TOKEN_ENV, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    dlock_common::telemetry::init("lock-server");
    let config = match cli.into_config(std::env::var(ADMIN_TOKEN_ENV).ok()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(event = "config_invalid", error = %e);
            return ExitCode::from(2);
        }
    };
    match lock_server::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(event = "fatal", error = %e);
            ExitCode::FAILURE
        }
    }
}
