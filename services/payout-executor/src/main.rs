//! `payout-executor` binary: flags and environment are documented on [`payout_executor::config::Cli`]
//! (`payout-executor --help`). Exit codes: 0 done (or stopped by SIGTERM), 1 some payout could not be
//! driven, the services stayed unreachable or the metrics port could not be bound, 2 bad
//! configuration (nothing started).

use std::process::ExitCode;

use clap::Parser;
use dlock_common::serve::{StartFailure, exit};
use payout_executor::config::Cli;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    dlock_common::telemetry::init("payout-executor");
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(event = "config_invalid", error = %e);
            eprintln!("payout-executor: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        // Registered now, before the executor starts (see shutdown_signal).
        let signal = dlock_common::serve::shutdown_signal();
        async move {
            signal.await;
            shutdown.cancel();
        }
    });
    match payout_executor::run(config, shutdown, |_| {}).await {
        Ok(report) if report.is_clean() => ExitCode::from(exit::OK),
        Ok(_) => ExitCode::from(exit::FAILURE),
        Err(e) if e.is_config() => {
            tracing::error!(event = "config_invalid", error = %e);
            eprintln!("payout-executor: {e}");
            ExitCode::from(exit::CONFIG)
        }
        Err(e) => {
            tracing::error!(event = "start_failed", error = %e);
            eprintln!("payout-executor: {e}");
            ExitCode::from(exit::FAILURE)
        }
    }
}
