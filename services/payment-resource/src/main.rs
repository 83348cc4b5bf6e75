//! `payment-resource serve` runs the service (the server kit's life: exit 2 on bad configuration, 0
//! after a graceful drain); `payment-resource reconcile` prints the reconciliation report as JSON and
//! exits 1 when the books do not balance, 2 when it cannot run. Flags: [`payment_resource::config::Cli`].

use std::process::ExitCode;

use clap::Parser;
use dlock_common::serve::exit;
use payment_resource::Config;
use payment_resource::config::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => {
            let config = args.into_config();
            dlock_common::serve::main("payment-resource", config, payment_resource::spawn).await
        }
        Command::Reconcile { database_url } => {
            dlock_common::telemetry::init("payment-resource");
            reconcile(Config::new(database_url)).await
        }
    }
}

/// `reconcile`'s third answer, beside clean (0) and not clean (1): the check did not run.
const COULD_NOT_CHECK: u8 = 2;

async fn reconcile(config: Config) -> ExitCode {
    let report = async {
        let pool = payment_resource::pool(&config)?;
        let report = payment_resource::reconcile::run(&pool).await?;
        pool.close().await;
        anyhow::Ok(report)
    }
    .await;
    match report {
        Ok(report) => match serde_json::to_string_pretty(&report) {
            Ok(json) => {
                println!("{json}");
                if report.clean {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(exit::FAILURE)
                }
            }
            Err(e) => {
                tracing::error!(event = "reconcile_failed", error = %e);
                ExitCode::from(COULD_NOT_CHECK)
            }
        },
        Err(e) => {
            tracing::error!(event = "reconcile_failed", error = %format!("{e:#}"));
            ExitCode::from(COULD_NOT_CHECK)
        }
    }
}
