//! `dlock-dev`, the developer command: the local demo, a stack you can explore with curl, the restore
//! drill, the benchmarks and the fault campaign. Dev-only: it runs everything on the test kit and
//! is never shipped (the shipped `dlock`, services/cli, runs commands under locks and lists them).

mod bench;
mod chaos;
mod drill;
mod failover_demo;
mod lockapi;
mod lockdemo;
mod paydemo;
mod stack;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dlock-dev",
    about = "dlock-dev: the demo, the drill, the benchmarks and the fault campaign of dlock, on loopback",
    version
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Folder for database data and service logs (default: a fresh temporary folder).
    #[arg(long, global = true)]
    run_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start everything on loopback, show fencing at work, print a verdict, stop everything.
    Demo {
        /// Only the lock scenes (the lock store and lock-server).
        #[arg(long)]
        locks_only: bool,
        /// Where lock-server keeps the locks: lockdb on PostgreSQL, or a single-member etcd
        /// (`lock-server --backend etcd`). paydb is PostgreSQL either way.
        #[arg(long, value_enum, default_value_t = dlock_testkit::stack::LockBackend::Postgres)]
        backend: dlock_testkit::stack::LockBackend,
    },
    /// Start everything on loopback and keep it running; print the endpoints (Ctrl-C stops).
    Up,
    /// Benchmarks; results go to stdout (record them in docs/benchmarks.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Operational drills on loopback (no Kubernetes); a verdict like `dlock-dev demo`.
    #[command(subcommand)]
    Drill(DrillCommand),
    /// The fault campaign: the whole stack under randomized faults from a seed, every operation
    /// recorded, then checked (docs/reliability.md). Exit 0 only when every check holds.
    Chaos(chaos::ChaosArgs),
}

#[derive(Debug, Subcommand)]
enum DrillCommand {
    /// Snapshot lockdb, keep paying, restore the snapshot, show every new grant fenced out and
    /// nothing paid twice, run the fast-forward, show the payouts resume (docs/operations.md).
    Restore {
        /// Negative control: skip the fast-forward; the "payouts resume" check must then fail.
        #[arg(long, hide = true)]
        skip_fast_forward: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    // The demo narrates on stdout; the services' own JSON logs go to their log files.
    tracing_subscriber_init();
    let cli = Cli::parse();
    // Serving the bench's HTTP hop needs no run folder.
    let command = match cli.command {
        Command::Bench(bench::BenchCommand::HopServer(args)) => return done(bench::hop::serve(args).await),
        other => other,
    };
    let run_dir = match stack::RunDir::new(cli.run_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("dlock-dev: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        Command::Demo { locks_only, backend } => lockdemo::run(&run_dir, !locks_only, backend).await,
        Command::Up => stack::up(&run_dir).await,
        Command::Bench(cmd) => bench::run(cmd, &run_dir).await,
        Command::Chaos(args) => chaos::run(args, &run_dir).await,
        Command::Drill(DrillCommand::Restore { skip_fast_forward }) => {
            drill::restore(&run_dir, drill::Options { skip_fast_forward }).await
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("dlock-dev: {e:#}");
            eprintln!("dlock-dev: logs are in {}", run_dir.path().display());
            run_dir.keep();
            ExitCode::FAILURE
        }
    }
}

/// The exit of a command that runs without a run folder: 0, or 1 with the error.
fn done<T>(result: anyhow::Result<T>) -> ExitCode {
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlock-dev: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Only warnings and errors of the CLI itself reach the terminal.
fn tracing_subscriber_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
