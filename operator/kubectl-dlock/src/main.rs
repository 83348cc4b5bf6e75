//! `kubectl-dlock`: `kubectl dlock revoke|restore|status|locks|completion` (see the crate documentation).
//! Exit codes: 0 done (or requested, without --wait), 1 the action failed, 2 a request that cannot
//! be made, 3 --wait ran out, 4 Kubernetes or lock-server errors.

use std::process::ExitCode;

use clap::Parser;
use kubectl_dlock::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    // `kubectl_complete-dlock` asks for candidates: every word after `__complete` is the user's,
    // flags included, so they are not parsed as this command's.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.get(1).map(String::as_str) == Some(kubectl_dlock::complete::COMPLETE) {
        print!("{}", kubectl_dlock::complete::answer(&args[2..]));
        return ExitCode::SUCCESS;
    }
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
