//! The benchmarks (`dlock-dev bench`). `bench lock`: acquire/release over HTTP through lock-server
//! on PostgreSQL and on etcd, the bare C1 acquire statement straight against the same lockdb, and
//! etcd's own lock recipe (`concurrency.Mutex`, the Go program in bench/etcd-mutex) against the
//! same etcd — side by side in one run, at each client count asked for; lock-server signing grants
//! or not (`--grant-signing`), and the cost of one signature and one verification measured in this
//! process ([`costs::grant_cost`]). The "one key, blocking" rows are every client waiting in the
//! key's queue (`waitMs`), the counterpart of the Mutex on one key, which queues the same way:
//! grants/s and the longest wait.
//!
//! Every row also says what it cost ([`meter::Meter`]): the CPU-seconds per 1,000 cycles of each
//! process (the load generator, lock-server, PostgreSQL's processes, etcd), read from `/proc` over
//! the measured window, how busy the machine was, and for lock-server where an acquire's time went
//! (its own histograms: the batch queue, the lockdb round trip, the rest of the HTTP path; on etcd,
//! where its grant leases came from). The load average at the start heads the output.
//!
//! - [`lock`]: `bench lock`, its phases ([`phases`]), what each cost ([`meter`]) and the floors
//!   under the dlock rows ([`floors`]); [`hop`]: the HTTP hop alone, a process of its own.
//! - [`payouts`]: `bench payouts`, end to end through the payments stack; [`per_payout`]: the
//!   requests and statements a payout makes, by route and by statement.
//! - [`costs`]: what a signed grant and a cycle's JSON cost in this process (both benchmarks).

mod costs;
mod floors;
pub mod hop;
mod lock;
mod meter;
mod payout_floor;
mod payouts;
mod per_payout;
mod phases;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::stack::RunDir;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Lock acquire/release latency and throughput: service vs bare statement.
    Lock(LockArgs),
    /// Payouts per second end to end, fencing on and off in the same run.
    Payouts(PayoutArgs),
    /// The HTTP hop alone (`dlock-dev bench lock` starts it): the routes of a bench cycle answered
    /// with no store behind them.
    #[command(hide = true)]
    HopServer(hop::HopServerArgs),
}

#[derive(Debug, Args)]
pub struct PayoutArgs {
    /// Payouts per run, spread over the 20 seeded accounts.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    payouts: u32,
    /// Executor processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    executors: u32,
    /// Workers per executor.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Rounds of (fencing on, fencing off), alternated so drift hits both alike.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Signed grants: lock-server signs and the resources verify (`on`, what a deployment runs),
    /// neither (`off`), or both side by side (`both`: a third row, fencing on with grants off).
    #[arg(long, value_enum, default_value_t = Grants::On)]
    grants: Grants,
    /// Backlog mode (repeatable, e.g. `--backlog 1000 --backlog 100000`): seed this many PENDING
    /// payouts with one bulk INSERT, then time how fast the executors work through the first
    /// `--measure` of them, fencing on. Shows that discovery is bounded work (throughput does not
    /// fall with the size of the backlog).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    backlog: Vec<u32>,
    /// Rows with fencing on, off, or both (the default: the cost of fencing, side by side).
    #[arg(long, value_enum, default_value_t = Fencing::Both)]
    fencing: Fencing,
    /// Accounts the payouts are spread over: 1 is the contended case (every payout on one
    /// account); above the 20 seeded ones, more are made through the API.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    accounts: u32,
    /// A folder with a base build's service binaries (lock-server, payment-resource, rail-proxy,
    /// rail-stub, payout-executor): every row runs twice, the base's services and this build's,
    /// alternated in the same run (A/B).
    #[arg(long, value_name = "DIR")]
    base_bin: Option<std::path::PathBuf>,
    /// Plaintext rows (`off`), hardened rows (`on`: TLS on every API, then TLS with lock clients
    /// authenticated — what a deployment made by the operator runs), or all three side by side
    /// (`both`: what TLS and authentication cost).
    #[arg(long, value_enum, default_value_t = Hardening::Off)]
    hardening: Hardening,
    /// Backlog mode: payouts that must end (POSTED) for one measurement.
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    measure: u32,
}

/// Which fencing settings a payouts run has rows for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fencing {
    On,
    Off,
    Both,
}

impl Fencing {
    pub fn has(self, on: bool) -> bool {
        match self {
            Fencing::On => on,
            Fencing::Off => !on,
            Fencing::Both => true,
        }
    }
}

/// Which hardening settings a payouts run has rows for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Hardening {
    Off,
    On,
    Both,
}

impl Hardening {
    /// The rows' (TLS, lock clients authenticated) settings.
    pub fn settings(self) -> &'static [(bool, bool)] {
        match self {
            Hardening::Off => &[(false, false)],
            Hardening::On => &[(true, false), (true, true)],
            Hardening::Both => &[(false, false), (true, false), (true, true)],
        }
    }
}

/// Whether a run signs (and verifies) grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Grants {
    On,
    Off,
    /// On and off, side by side in the same run.
    Both,
}

impl Grants {
    /// The settings to run, `true` meaning grants on.
    pub fn settings(self) -> &'static [bool] {
        match self {
            Grants::On => &[true],
            Grants::Off => &[false],
            Grants::Both => &[true, false],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    Postgres,
    Etcd,
    /// Both, side by side.
    All,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// Which backends to measure.
    #[arg(long, value_enum, default_value_t = BenchBackend::All)]
    backend: BenchBackend,
    /// Concurrent clients per phase (and database connections), comma-separated: one table row
    /// group per count.
    #[arg(long, value_delimiter = ',', default_value = "1,16", value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: Vec<u32>,
    /// Measured seconds per phase (after a 1 s warm-up).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// lock-server signing grants (`on`, what a deployment runs), not (`off`), or both side by
    /// side (`both`: each dlock phase once with a signing lock-server, once without).
    #[arg(long, value_enum, default_value_t = Grants::On)]
    grant_signing: Grants,
    /// lockdb's lock-server in plaintext (`off`), hardened (`on`: HTTPS, then HTTPS with lock
    /// clients authenticated, signing as a deployment does), or all three side by side (`both`:
    /// what TLS and authentication cost).
    #[arg(long, value_enum, default_value_t = Hardening::Off)]
    hardening: Hardening,
}

pub async fn run(cmd: BenchCommand, run_dir: &RunDir) -> Result<bool> {
    match cmd {
        BenchCommand::Lock(args) => lock::run(args, run_dir).await,
        BenchCommand::HopServer(args) => hop::serve(args).await,
        BenchCommand::Payouts(args) if !args.backlog.is_empty() => {
            payouts::backlog(
                &args.backlog,
                args.measure,
                args.executors,
                args.workers,
                args.rounds,
                run_dir,
            )
            .await
        }
        BenchCommand::Payouts(args) => {
            let setup = payouts::Setup {
                payouts: args.payouts,
                executors: args.executors,
                workers: args.workers,
                accounts: args.accounts,
                base_bin: args.base_bin,
                fencing: args.fencing,
                hardening: args.hardening,
            };
            payouts::run(&setup, args.rounds, args.grants, run_dir).await
        }
    }
}
