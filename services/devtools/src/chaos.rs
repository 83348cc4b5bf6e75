//! `dlock-dev chaos`: one campaign run (services/chaos), its verdict table and a one-line summary for
//! docs/reliability.md.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use dlock_chaos::nemesis::{FailoverOn, Nemesis, Replication};
use dlock_chaos::run::{Options, run as run_campaign};
use dlock_testkit::stack::LockBackend;

use crate::stack::RunDir;

#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// Where the locks live: lockdb on PostgreSQL 16, or a three-member etcd cluster.
    #[arg(long, value_enum, default_value_t = LockBackend::Postgres)]
    backend: LockBackend,
    /// Payouts the client creates, at a steady rate over the fault window.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    payouts: u32,
    /// The fault window in seconds (payouts are created and faults applied during it).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=7_200))]
    seconds: u64,
    /// The seed the whole schedule of faults follows from (default: a fresh one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// A nemesis to run (repeatable): pause, kill, database, partition, clock, rail, failover, or
    /// all (the default; on etcd, failover only with --failover-on paydb).
    #[arg(long, value_parser = nemesis_set)]
    nemesis: Vec<Vec<Nemesis>>,
    /// payout-executor processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    executors: u64,
    /// Workers per executor.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    workers: u32,
    /// Customer accounts the payouts are spread over.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    accounts: u32,
    /// Seconds after the last fault heals within which every payout must have ended (default: 60,
    /// or a tenth of a second per payout when that is more — the backlog left at the end of the
    /// window drains at the stack's own pace).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=7_200))]
    settle_secs: Option<u64>,
    /// Positive control: both kill switches off (payment.fencing.enabled, rail.proxy.fencing.enabled).
    #[arg(long)]
    kill_switches_off: bool,
    /// Positive control: rewind lockdb's sequence half-way through without the fast-forward (which
    /// the run applies only when the faults heal, so that every payout can end).
    #[arg(long)]
    rewind_sequence: bool,
    /// The failover nemesis: how the standby replicates. sync: the primary waits for the standby
    /// (synchronous_standby_names names it); async: it does not, and the nemesis holds the standby
    /// behind (it stops receiving WAL) before it kills the primary, so acknowledged transactions
    /// are lost.
    #[arg(long, value_enum, default_value_t = Replication::Sync)]
    replication: Replication,
    /// The failover nemesis: which databases run with a standby and fail over. paydb's
    /// asynchronous failover loses acknowledged postings, which the checker reports.
    #[arg(long, value_enum, default_value_t = FailoverOn::Lockdb)]
    failover_on: FailoverOn,
    /// NEGATIVE CONTROL ONLY, never in production: start lock-server with
    /// DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true, so it does not jump fencing_token_seq on a lockdb history
    /// it cannot vouch for (a promoted standby). With --replication async and the failover nemesis
    /// the run must then fail on `grants` (tokens issued again).
    #[arg(long)]
    unsafe_no_sequence_jump: bool,
    /// Run every service and link in plain HTTP instead of HTTPS (the default: a CA made for the
    /// run, a certificate per server, every client trusting that CA alone). Bearer credentials,
    /// lock-client tokens and signed grants then cross loopback in cleartext; the run says so, and
    /// its report row says `plain HTTP`.
    #[arg(long)]
    plaintext: bool,
    /// Run nothing: judge a recorded run again (a folder with history.jsonl and final.json), e.g.
    /// after the checker changed.
    #[arg(long, value_name = "DIR")]
    judge: Option<std::path::PathBuf>,
}

/// `--nemesis`: one of the nemeses, or `all` of them.
fn nemesis_set(s: &str) -> Result<Vec<Nemesis>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Nemesis::ALL.to_vec());
    }
    <Nemesis as clap::ValueEnum>::from_str(s, true)
        .map(|n| vec![n])
        .map_err(|_| {
            let names: Vec<String> = Nemesis::ALL
                .iter()
                .filter_map(|n| clap::ValueEnum::to_possible_value(n).map(|v| v.get_name().to_owned()))
                .collect();
            format!("unknown nemesis {s:?}: one of all, {}", names.join(", "))
        })
}

pub async fn run(args: ChaosArgs, run_dir: &RunDir) -> Result<bool> {
    if let Some(dir) = &args.judge {
        let verdict = dlock_chaos::check::check_files(&dir.join("history.jsonl"), &dir.join("final.json"))?;
        println!("{verdict}");
        return Ok(verdict.ok());
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut nemeses: Vec<Nemesis> = if args.nemesis.is_empty() {
        Nemesis::ALL.to_vec()
    } else {
        args.nemesis.concat()
    };
    nemeses.sort();
    nemeses.dedup();
    let mut opts = Options::new(args.backend, run_dir.path().join(format!("chaos-{seed}")));
    opts.payouts = args.payouts;
    opts.seconds = args.seconds;
    opts.seed = seed;
    opts.nemeses = nemeses;
    opts.executors = usize::try_from(args.executors).unwrap_or(3);
    opts.workers = args.workers;
    opts.accounts = args.accounts;
    opts.settle = Duration::from_secs(
        args.settle_secs
            .unwrap_or_else(|| (u64::from(args.payouts) / 10).max(60)),
    );
    opts.payment_fencing = !args.kill_switches_off;
    opts.rail_fencing = !args.kill_switches_off;
    opts.rewind_sequence = args.rewind_sequence;
    opts.replication = args.replication;
    opts.failover_on = args.failover_on;
    opts.sequence_jump = !args.unsafe_no_sequence_jump;
    opts.tls = !args.plaintext;
    if args.plaintext {
        eprintln!(
            "WARNING: --plaintext: every service and link of this run serves plain HTTP; credentials and grants cross loopback in cleartext, and the run does not test the services as they are deployed (HTTPS)"
        );
    }
    println!(
        "dlock-dev chaos: seed {seed} (replay with --seed {seed}), backend {}, {}, output in {}",
        args.backend,
        if args.plaintext {
            "plain HTTP (--plaintext)"
        } else {
            "HTTPS on every hop"
        },
        opts.dir.display()
    );
    let outcome = run_campaign(&opts).await?;
    println!("{}", outcome.verdict);
    println!("report row: {}", dlock_chaos::report::row(&outcome));
    // The record stays for inspection; the databases and logs of a passed run do not.
    if !outcome.verdict.ok() {
        run_dir.keep();
    }
    Ok(outcome.verdict.ok())
}
