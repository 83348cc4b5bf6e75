//! `payment-resource serve` runs the service; `payment-resource reconcile` prints the reconciliation
//! report as JSON and exits non-zero when the books do not balance.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand};
use payment_resource::config::parse_bool;
use payment_resource::{Config, Fencing};

#[derive(Debug, Parser)]
#[command(
    name = "payment-resource",
    version,
    about = "dlock's protected resource over paydb"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API until SIGTERM.
    Serve {
        /// paydb, as role payapp.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, env = "PAYMENT_RESOURCE_LISTEN", default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
        /// The `payment.fencing.enabled` kill switch. `false` drops the fence predicates of (a)(b)(c)
        /// (demo of corruption only).
        #[arg(
            long = "payment-fencing-enabled",
            alias = "payment.fencing.enabled",
            env = "PAYMENT_FENCING_ENABLED",
            default_value = "true",
            value_parser = parse_bool,
            action = ArgAction::Set
        )]
        fencing_enabled: bool,
        #[arg(long, env = "PAYMENT_RESOURCE_MAX_CONNECTIONS", default_value_t = 16)]
        max_connections: u32,
    },
    /// Check the accounting invariants once; print the report; exit 1 if not clean.
    Reconcile {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    dlock_common::telemetry::init("payment-resource");
    match cli.command {
        Command::Serve {
            database_url,
            listen,
            fencing_enabled,
            max_connections,
        } => {
            // Credentials come from the environment or files (mounted Secrets), never from flags.
            let credentials = match dlock_common::auth::Credentials::from_env(
                payment_resource::config::CREDENTIALS_PREFIX,
                payment_resource::config::ROLES,
            ) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(event = "config_invalid", error = %e);
                    return ExitCode::from(2);
                }
            };
            let config = Config {
                listen,
                fencing: Fencing::from_enabled(fencing_enabled),
                max_connections,
                credentials,
                ..Config::new(database_url)
            };
            match payment_resource::serve(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(event = "serve_failed", error = %format!("{e:#}"));
                    ExitCode::from(2)
                }
            }
        }
        Command::Reconcile { database_url } => reconcile(Config::new(database_url)).await,
    }
}

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
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                tracing::error!(event = "reconcile_failed", error = %e);
                ExitCode::from(2)
            }
        },
        Err(e) => {
            tracing::error!(event = "reconcile_failed", error = %format!("{e:#}"));
            ExitCode::from(2)
        }
    }
}
