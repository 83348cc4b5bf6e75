//! `kubectl-dlock`: `kubectl dlock revoke|restore|status|locks` (see the crate documentation).
//! Exit codes: 0 done (or requested, without --wait), 1 the action failed, 2 a request that cannot
//! be made, 3 --wait ran out, 4 Kubernetes or lock-server errors.

use std::process::ExitCode;

use clap::Parser;
use kubectl_dlock::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match kubectl_dlock::run(cli).await {
        Ok(outcome) => {
            kubectl_dlock::report(&outcome);
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
