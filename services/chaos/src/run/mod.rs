//! One campaign run: start the stack, create payouts at a steady rate while the nemesis runs its
//! schedule, heal, wait until every payout has ended (bounded), read the final state, check.
//!
//! The stack, all real processes on loopback: paydb on its own PostgreSQL 16; lockdb on another
//! PostgreSQL 16 *or* a three-member etcd cluster; two lock-server processes (the executors are
//! spread over them); payment-resource; rail-proxy; rail-stub; several payout-executors with
//! several workers each. Every executor reaches each service through its own [`Link`](crate::proxy::Link), which
//! records the history and is where partitions happen; rail-proxy reaches the rail through one too.
//! Every process can be paused, killed and restarted on the same port. With the failover nemesis,
//! lockdb (or paydb, `failover_on`) is a primary with a streaming standby that its clients reach
//! through a [`TcpLink`](crate::tcp::TcpLink); a failover kills the primary, promotes the standby, re-points the link
//! and builds the next standby.
//!
//! [`stack`] starts and drives the processes ([`procs`], [`database`]), [`client`] creates the
//! payouts; this module runs the schedule and checks the record.

mod client;
mod database;
mod procs;
mod stack;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use dlock_testkit::stack::LockBackend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sqlx::Connection;
use tokio::time::Instant;

use crate::check::{self, Verdict};
use crate::nemesis::{self, Db, FailoverOn, Nemesis, Replication, Scheduled, Shape};
use crate::proxy::Recorder;
use crate::state::{FaultRecord, FinalState, RunInfo};

use client::{ClientPlan, client};
use stack::Stack;

/// How to run one campaign.
#[derive(Debug, Clone)]
pub struct Options {
    pub backend: LockBackend,
    pub payouts: u32,
    /// The fault window: payouts are created and faults applied during it.
    pub seconds: u64,
    pub seed: u64,
    pub nemeses: Vec<Nemesis>,
    pub executors: usize,
    pub workers: u32,
    pub accounts: u32,
    /// Where the history, the final state, the schedule, the verdict and every log go.
    pub dir: PathBuf,
    /// The kill switches (a positive control turns them off).
    pub payment_fencing: bool,
    pub rail_fencing: bool,
    /// Positive control: rewind lockdb's sequence half-way through, without the fast-forward; the
    /// restore runbook's fast-forward comes only when the faults heal, so that the payouts the
    /// rewind stranded can end.
    pub rewind_sequence: bool,
    /// The failover nemesis: how the standbys replicate, and which databases fail over (only
    /// those run with a standby, and only when the failover nemesis is on).
    pub replication: Replication,
    pub failover_on: FailoverOn,
    /// lock-server's sequence jump on a lockdb history it cannot vouch for. `false` starts it with
    /// `DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true`: a negative control only.
    pub sequence_jump: bool,
    /// How long after the last fault heals every payout must have ended.
    pub settle: Duration,
    /// Print a progress line while it runs.
    pub progress: bool,
    /// HTTPS on every HTTP hop (the default): the servers with certificates of a CA made for the
    /// run, the links serving and forwarding HTTPS under it. `false`: plain HTTP (`--plaintext`).
    pub tls: bool,
}

impl Options {
    pub fn new(backend: LockBackend, dir: impl Into<PathBuf>) -> Self {
        Self {
            backend,
            payouts: 300,
            seconds: 30,
            seed: 1,
            nemeses: Nemesis::ALL.to_vec(),
            executors: 3,
            workers: 4,
            accounts: 40,
            dir: dir.into(),
            payment_fencing: true,
            rail_fencing: true,
            rewind_sequence: false,
            replication: Replication::Sync,
            failover_on: FailoverOn::Lockdb,
            sequence_jump: true,
            settle: Duration::from_secs(60),
            progress: true,
            tls: true,
        }
    }

    /// The executors' lease: etcd's leases cannot be shorter than 2 s.
    fn lease(&self) -> Duration {
        match self.backend {
            LockBackend::Postgres => Duration::from_millis(1_000),
            LockBackend::Etcd => Duration::from_millis(2_000),
        }
    }

    fn session(&self) -> Duration {
        self.lease() * 3
    }

    /// The schedule's view of the stack.
    fn shape(&self) -> Shape {
        Shape {
            executors: self.executors,
            lock_servers: 2,
            etcd: self.backend == LockBackend::Etcd,
            lease: self.lease(),
            session: self.session(),
            replication: self.replication,
            failover_on: self.failover_on,
        }
    }

    /// The databases that run with a standby: those the failover nemesis can fail over, when it
    /// is on.
    fn replicated(&self) -> Vec<Db> {
        if self.nemeses.contains(&Nemesis::Failover) {
            self.shape().failover_targets()
        } else {
            Vec::new()
        }
    }
}

/// What a run produced.
pub struct Outcome {
    pub verdict: Verdict,
    pub state: FinalState,
    pub schedule: Vec<Scheduled>,
    pub duration: Duration,
    pub dir: PathBuf,
}

const TERMINAL: [&str; 3] = ["POSTED", "FAILED", "ABANDONED"];

/// Runs one campaign.
pub async fn run(opts: &Options) -> Result<Outcome> {
    std::fs::create_dir_all(&opts.dir)?;
    if opts.rewind_sequence && opts.backend != LockBackend::Postgres {
        bail!("--rewind-sequence is a lockdb control (postgres backend only)");
    }
    if !opts.sequence_jump && opts.backend != LockBackend::Postgres {
        bail!("--unsafe-no-sequence-jump is a lockdb control (postgres backend only)");
    }
    let shape = opts.shape();
    if opts.nemeses == [Nemesis::Failover] && shape.failover_targets().is_empty() {
        bail!(
            "the failover nemesis has nothing to fail over: lockdb is etcd (--failover-on paydb fails paydb over)"
        );
    }
    let began = Instant::now();
    let recorder = Arc::new(Recorder::create(&opts.dir.join("history.jsonl"))?);
    let window = Duration::from_secs(opts.seconds);
    let plan = nemesis::schedule(opts.seed, window, &opts.nemeses, shape);
    let replicated = opts.replicated();
    let mut schedule_text = format!(
        "seed {} · backend {} · {} · nemeses {} · {} payouts over {} s · {} faults{}{}\n",
        opts.seed,
        opts.backend,
        if opts.tls {
            "HTTPS on every hop (a CA made for the run)"
        } else {
            "PLAIN HTTP (--plaintext: credentials and grants in cleartext)"
        },
        opts.nemeses
            .iter()
            .map(|n| n.name())
            .collect::<Vec<_>>()
            .join(","),
        opts.payouts,
        opts.seconds,
        plan.len(),
        if replicated.is_empty() {
            String::new()
        } else {
            format!(
                " · {} with a standby ({} replication)",
                replicated_names(&replicated).join(" and "),
                opts.replication
            )
        },
        if opts.sequence_jump {
            ""
        } else {
            " · lock-server without its sequence jump (DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true: negative control)"
        }
    );
    for s in &plan {
        schedule_text.push_str(&format!("  t+{:>6.2}s  {}\n", s.at.as_secs_f64(), s.fault));
    }
    std::fs::write(opts.dir.join("schedule.txt"), &schedule_text)?;
    if opts.progress {
        print!("{schedule_text}");
    }

    let mut stack = Stack::start(opts, &recorder).await?;
    let tls = stack.check_tls().await.context("TLS on every hop")?;
    if opts.progress && stack.libfaketime.is_none() && opts.nemeses.contains(&Nemesis::Clock) {
        bail!("the clock nemesis needs libfaketime (Debian package faketime; scripts/setup.sh installs it)");
    }

    // Accounts, each with its own opening balance; the settlement account comes with the seed.
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut accounts = Vec::new();
    // Openings around what the client will ask of each account (amounts average 2,550): most
    // payouts are covered, and some accounts run dry, so a few end FAILED for want of funds.
    let demand = (i64::from(opts.payouts) * 2_550 / i64::from(opts.accounts.max(1))).max(20_000);
    for _ in 0..opts.accounts {
        let opening: i64 = rng.random_range(demand * 6 / 10..=demand * 14 / 10);
        let r: serde_json::Value = stack
            .http
            .post(format!("{}/v1/accounts", stack.payment.url()))
            .bearer_auth(&stack.creds.admin)
            .json(&json!({"currency": "EUR", "openingBalanceMinor": opening}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        accounts.push(
            r["accountId"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("no accountId in {r}"))?,
        );
    }

    let window_start = Instant::now();
    let created = Arc::new(AtomicU64::new(0));
    let client_task = tokio::spawn(client(
        ClientPlan {
            http: stack.http.clone(),
            url: stack.payment.url(),
            credential: stack.creds.client.clone(),
            accounts,
            n: opts.payouts,
            window,
            seed: opts.seed,
        },
        recorder.clone(),
        created.clone(),
    ));

    // The nemesis, one fault after another, with a progress line.
    let mut records = Vec::new();
    let mut fault_rng = StdRng::seed_from_u64(opts.seed ^ 0x0fa1_7000);
    let mut rewound = !opts.rewind_sequence;
    for s in &plan {
        if !rewound && window_start.elapsed() >= window / 2 {
            rewind(&stack).await?;
            rewound = true;
        }
        tokio::time::sleep_until(window_start + s.at).await;
        // A failover's length is not known ahead (it waits on the standby and on the record, and
        // builds a new standby): one the run reaches too late to heal inside the window is left
        // out, so that payouts are still flowing while it runs.
        if s.fault.nemesis() == Nemesis::Failover && window_start.elapsed() + s.fault.hold() > window {
            if opts.progress {
                println!("\n  - {} left out: the run is behind its schedule", s.fault);
            }
            continue;
        }
        if opts.progress {
            progress(&stack, began, &created, records.len(), &format!("{}", s.fault)).await;
        }
        let start_ns = recorder.now_ns();
        let note = stack
            .apply(&s.fault, &mut fault_rng)
            .await
            .with_context(|| format!("fault {}", s.fault))?;
        records.push(FaultRecord {
            nemesis: s.fault.nemesis().name().into(),
            what: if note.is_empty() {
                s.fault.to_string()
            } else {
                format!("{} ({note})", s.fault)
            },
            target: s.fault.target(),
            start_ns,
            healed_ns: recorder.now_ns(),
        });
    }
    if !rewound {
        tokio::time::sleep_until(window_start + window / 2).await;
        rewind(&stack).await?;
    }
    stack.heal_all().await?;
    if opts.rewind_sequence {
        fast_forward(&stack).await?;
    }
    let last_heal_ns = recorder.now_ns();
    let _ = client_task.await;

    // Every payout must end: wait (bounded) until none is in flight.
    let settle_until = Instant::now() + opts.settle;
    loop {
        let counts = stack.counts().await.unwrap_or_default();
        let open: i64 = counts
            .iter()
            .filter(|(s, _)| !TERMINAL.contains(&s.as_str()))
            .map(|(_, n)| n)
            .sum();
        if opts.progress {
            progress(&stack, began, &created, records.len(), "settling").await;
        }
        if open == 0 || Instant::now() >= settle_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if opts.progress {
        println!();
    }
    // Freeze the history: no executor writes after this.
    for e in &mut stack.executors {
        if let Some(mut s) = e.proc.svc.take() {
            s.stop();
        }
    }
    let run = RunInfo {
        seed: opts.seed,
        backend: opts.backend.to_string(),
        nemeses: opts.nemeses.iter().map(|n| n.name().to_owned()).collect(),
        faults: records,
        last_heal_ns,
        ended_ns: recorder.now_ns(),
        settle_bound_ns: u64::try_from(opts.settle.as_nanos()).unwrap_or(u64::MAX),
        payment_fencing: opts.payment_fencing,
        rail_fencing: opts.rail_fencing,
        replicated: replicated_names(&replicated)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        replication: (!replicated.is_empty()).then(|| opts.replication.name().to_owned()),
        sequence_jump: opts.sequence_jump,
        tls,
    };
    let state = stack.final_state(run).await?;
    let events = recorder.finish()?;
    std::fs::write(opts.dir.join("final.json"), serde_json::to_vec_pretty(&state)?)?;
    let verdict = check::check(&events, &state);
    std::fs::write(opts.dir.join("verdict.txt"), verdict.to_string())?;
    Ok(Outcome {
        verdict,
        state,
        schedule: plan,
        duration: began.elapsed(),
        dir: opts.dir.clone(),
    })
}

fn replicated_names(dbs: &[Db]) -> Vec<&'static str> {
    dbs.iter()
        .map(|d| match d {
            Db::Lockdb => "lockdb",
            Db::Paydb => "paydb",
            Db::EtcdMember { .. } => "etcd",
        })
        .collect()
}

/// The positive control's fault: lockdb's sequence back to 1, as a restore without the
/// fast-forward would leave it (C1 §1.7).
async fn rewind(stack: &Stack) -> Result<()> {
    let l = stack.lockdb.as_ref().ok_or_else(|| anyhow!("no lockdb"))?;
    let mut c = sqlx::PgConnection::connect(&l.admin_url()).await?;
    sqlx::query("SELECT setval('fencing_token_seq', 1)")
        .execute(&mut c)
        .await?;
    println!("\n  ! lockdb's fencing_token_seq rewound to 1 (positive control: no fast-forward)");
    Ok(())
}

/// The end of the positive control's rewind: what the restore runbook does (C1 §1.7, `dlock-dev
/// drill restore`'s step 6) — the sequence moved past the highest token paydb has seen. Until then
/// every grant after the rewind is fenced out, so a payout the rail had paid when its holder died
/// could never be posted: stranded with its reservation, not lost, and ended by the first holder
/// after this.
async fn fast_forward(stack: &Stack) -> Result<()> {
    /// The drill's margin above the high-water mark.
    const MARGIN: i64 = dlock_fastforward::DEFAULT_MARGIN;
    let l = stack.lockdb.as_ref().ok_or_else(|| anyhow!("no lockdb"))?;
    let high = dlock_fastforward::read_high_water("paydb", &stack.paydb_admin_url()).await?;
    let moved = dlock_fastforward::advance(&l.admin_url(), high.highest + MARGIN).await?;
    println!(
        "\n  ! lockdb's fencing_token_seq fast-forwarded from {} to {} (paydb's high-water mark {} + {MARGIN})",
        moved.before, moved.after, high.highest
    );
    Ok(())
}

async fn progress(stack: &Stack, began: Instant, created: &AtomicU64, faults: usize, now: &str) {
    let counts = stack.counts().await.unwrap_or_default();
    let get = |s: &str| counts.iter().find(|(k, _)| k == s).map_or(0, |(_, n)| *n);
    let open: i64 = counts
        .iter()
        .filter(|(s, _)| !TERMINAL.contains(&s.as_str()))
        .map(|(_, n)| n)
        .sum();
    let line = format!(
        "\r  t={:>5.1}s created {:>6} posted {:>6} failed {:>5} abandoned {:>4} in flight {:>5} · faults {:>3} · {}",
        began.elapsed().as_secs_f64(),
        created.load(Ordering::Relaxed),
        get("POSTED"),
        get("FAILED"),
        get("ABANDONED"),
        open,
        faults,
        now
    );
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = write!(out, "{line:<150}");
    let _ = out.flush();
}
