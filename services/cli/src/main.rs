//! `dlock`: the command a user runs against a running lock-server — run a command under a lock
//! (`dlock lock KEY -- command`, as `etcdctl lock` / `consul lock`) and list the locks held
//! (`dlock locks list`). It links no test code and ships in the image; the demo, the drill, the
//! benchmarks and the fault campaign are `dlock-dev` (services/devtools).

mod lockcmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    about = "dlock: run a command under a fenced lock, list the locks lock-server holds",
    after_help = "The demo, the drill, the benchmarks and the fault campaign are `dlock-dev` \
                  (cargo run -p dlock-devtools --bin dlock-dev -- --help).",
    version
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock (as `etcdctl lock`, `consul lock`): wait for KEY, run the
    /// command with DLOCK_LOCK_KEY, DLOCK_FENCING_TOKEN and DLOCK_FENCING_GRANT set, renew while it runs, release when it
    /// ends, exit with its status. If the lock is lost the command gets SIGTERM at once (SIGKILL after
    /// --grace-ms) and dlock exits 3; a lock not acquired exits 2.
    Lock(lockcmd::LockArgs),
    /// The locks lock-server holds.
    #[command(subcommand)]
    Locks(lockcmd::LocksCommand),
}

/// The developer commands that were part of `dlock` before it shipped: named here so that an old
/// command line is told where the command went instead of only that it is unknown.
const MOVED: [&str; 5] = ["demo", "up", "bench", "drill", "chaos"];

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber_init();
    if let Some(moved) = std::env::args().nth(1).filter(|a| MOVED.contains(&a.as_str())) {
        eprintln!(
            "dlock: `{moved}` is a developer command of `dlock-dev` now: \
             cargo run -p dlock-devtools --bin dlock-dev -- {moved} …"
        );
        return ExitCode::from(2);
    }
    match Cli::parse().command {
        Command::Lock(args) => lockcmd::lock(args).await,
        Command::Locks(lockcmd::LocksCommand::List(args)) => match lockcmd::list(args).await {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dlock: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Only warnings and errors of the command itself reach the terminal.
fn tracing_subscriber_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// The hint is for names `dlock` no longer has: it must never hide one of its commands.
    #[test]
    fn the_moved_names_are_not_commands() {
        let cli = Cli::command();
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(names, ["lock", "locks"]);
        for moved in MOVED {
            assert!(!names.contains(&moved), "{moved} is a dlock command");
        }
    }
}
