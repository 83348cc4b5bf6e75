//! `dlock bench lock`: acquire/release over HTTP through lock-server on PostgreSQL and on etcd, the
//! bare C1 acquire statement straight against the same lockdb, and etcd's own lock recipe
//! (`concurrency.Mutex`, the Go program in bench/etcd-mutex) against the same etcd — side by side in
//! one run, at each client count asked for; lock-server signing grants or not (`--grant-signing`),
//! and the cost of one signature and one verification measured in this process ([`grant_cost`]).
//! The "one key, blocking" rows are every client waiting in the key's queue (`waitMs`), the
//! counterpart of the Mutex on one key, which queues the same way: grants/s and the longest wait.
//!
//! Every row also says what it cost ([`Meter`]): the CPU-seconds per 1,000 cycles of each process
//! (the load generator, lock-server, PostgreSQL's processes, etcd), read from `/proc` over the
//! measured window, how busy the machine was, and for lock-server where an acquire's time went
//! (its own histograms: the batch queue, the lockdb round trip, the rest of the HTTP path; on etcd,
//! where its grant leases came from). The load average at the start heads the output.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use dlock_client::{ClientConfig, ClientError, LockApi};
use dlock_testkit::History;
use dlock_testkit::cpu;
use dlock_testkit::metrics::{metric_sum, scrape};
use hdrhistogram::Histogram;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use std::path::PathBuf;
use std::process::Command;

use dlock_testkit::etcd::{EtcdCluster, etcd_bin};
use dlock_testkit::procs::{Service, Spec};

use crate::stack::{Database, RunDir, lock_server, run_key, step};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Lock acquire/release latency and throughput: service vs bare statement.
    Lock(LockArgs),
    /// Payouts per second end to end, fencing on and off in the same run.
    Payouts(PayoutArgs),
    /// The HTTP hop alone (`dlock bench lock` starts it): the routes of a bench cycle answered
    /// with no store behind them.
    #[command(hide = true)]
    HopServer(crate::hop::HopServerArgs),
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
    /// Backlog mode: payouts that must end (POSTED) for one measurement.
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    measure: u32,
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

/// How many grants [`grant_cost`] signs and verifies.
const GRANT_COST_N: u32 = 2_000;

/// The cost of signed grants on one core, measured in this process: µs to sign one grant (what
/// lock-server adds to each acquire and renew) and µs to check one (what a resource adds to each
/// fenced write: the header read, the signature, the token and the account key).
pub fn grant_cost(n: u32) -> Result<(f64, f64)> {
    use dlock_common::grant::{FENCING_GRANT_HEADER, GrantPolicy};
    let key = run_key("bench")?;
    let policy = GrantPolicy::new(
        true,
        dlock_grant::PublicKeys::new(vec![key.public_key()])?,
        "bench",
    )?;
    let lock_key = dlock_common::grant::account_key(Uuid::new_v4());
    let session = Uuid::new_v4();
    let started = Instant::now();
    let mut grants = Vec::with_capacity(n as usize);
    for token in 1..=i64::from(n) {
        grants.push(bench_grant(&key, &lock_key, token, session)?);
    }
    let sign_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    let started = Instant::now();
    for (token, grant) in (1..).zip(&grants) {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(FENCING_GRANT_HEADER, grant.parse()?);
        policy
            .check(&headers, dlock_common::FencingToken::new(token)?)
            .map_err(|e| anyhow::anyhow!("a grant just signed was refused: {e}"))?;
    }
    let verify_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    Ok((sign_us, verify_us))
}

/// Prints [`grant_cost`]'s line and returns it (µs to sign, µs to verify).
pub fn print_grant_cost() -> Result<(f64, f64)> {
    let (sign, verify) = grant_cost(GRANT_COST_N)?;
    println!(
        "signed grants (Ed25519, this process, {GRANT_COST_N} each): sign {sign:.1} µs/grant (lock-server, per acquire and renew), \
         verify {verify:.1} µs/write (payment-resource, rail-proxy, per fenced write)"
    );
    Ok((sign, verify))
}

/// A grant as lock-server signs it, for the bench's owner on lock service "bench".
fn bench_grant(key: &dlock_grant::SigningKey, lock_key: &str, token: i64, session: Uuid) -> Result<String> {
    Ok(key.sign(&dlock_grant::Claims {
        lock_service: "bench",
        lock_key,
        token,
        owner_id: "bench-owner",
        session_id: session,
    })?)
}

/// How many cycles [`json_cost`] encodes and decodes.
const JSON_COST_N: u32 = 20_000;

/// The JSON of one lock cycle, measured in this process: µs to encode and decode everything an
/// acquire and a release carry, on both ends — the acquire request (client encodes, lock-server
/// decodes), the grant (lock-server encodes, client decodes) and the release's answer (the same) —
/// with `grant` (a signed grant) in it if given. What the HTTP rows' CPU per cycle holds of JSON.
pub fn json_cost(n: u32, grant: Option<String>) -> Result<f64> {
    use dlock_wire::lock::{AcquireRequest, LockGrant, LockReleased};
    let now = chrono::Utc::now();
    let session = Uuid::new_v4();
    let started = Instant::now();
    for i in 1..=i64::from(n) {
        let key = format!("bench/{i:08}");
        let request = serde_json::to_vec(&AcquireRequest {
            session_id: session,
            owner_id: "bench-owner".to_owned(),
            ttl_ms: 30_000,
            wait_ms: None,
        })?;
        let request: AcquireRequest = serde_json::from_slice(&request)?;
        let token = dlock_common::FencingToken::new(i)?;
        let granted = serde_json::to_vec(&LockGrant {
            lock_key: key,
            fencing_token: token,
            owner_id: request.owner_id,
            session_id: request.session_id,
            acquired_at: now,
            expires_at: now,
            grant: grant.clone(),
        })?;
        let granted: LockGrant = serde_json::from_slice(&granted)?;
        let released = serde_json::to_vec(&LockReleased {
            lock_key: granted.lock_key,
            fencing_token: granted.fencing_token,
            released: true,
            stale: false,
        })?;
        let released: LockReleased = serde_json::from_slice(&released)?;
        anyhow::ensure!(released.released, "the release's answer did not read back");
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(n))
}

/// Prints [`json_cost`]'s line.
pub fn print_json_cost() -> Result<()> {
    let grant = bench_grant(&run_key("bench")?, "bench/00000001", 1, Uuid::new_v4())?;
    let unsigned = json_cost(JSON_COST_N, None)?;
    let signed = json_cost(JSON_COST_N, Some(grant))?;
    println!(
        "JSON per cycle (this process, {JSON_COST_N} cycles; acquire request, grant and release answer, \
         each encoded and decoded): {unsigned:.1} µs unsigned, {signed:.1} µs with a signed grant — \
         on both ends together, against the CPU per cycle above"
    );
    Ok(())
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
}

pub async fn run(cmd: BenchCommand, run_dir: &RunDir) -> Result<bool> {
    match cmd {
        BenchCommand::Lock(args) => lock(args, run_dir).await,
        BenchCommand::HopServer(args) => crate::hop::serve(args).await,
        BenchCommand::Payouts(args) if !args.backlog.is_empty() => {
            crate::paybench::backlog(
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
            crate::paybench::run(
                args.payouts,
                args.executors,
                args.workers,
                args.rounds,
                args.grants,
                run_dir,
            )
            .await
        }
    }
}

/// What one phase measured.
struct Phase {
    name: String,
    /// Completed cycles (acquire attempt, and release when granted).
    cycles: u64,
    grants: u64,
    secs: f64,
    acquire: Histogram<u64>,
    cost: Cost,
}

/// The roles a phase's processes play, in the order the cost table prints them.
const ROLES: [&str; 4] = ["generator", "lock-server", "postgres", "etcd"];

/// One process whose CPU a phase reads: the process alone, or it and everything it started
/// (PostgreSQL: the postmaster and its backends).
#[derive(Debug, Clone, Copy)]
enum Proc {
    One(u32),
    Tree(u32),
}

/// What a phase's cost is read from: its processes by role ([`ROLES`]), and the lock-server whose
/// histograms split an acquire's time.
#[derive(Debug, Clone, Default)]
struct Meter {
    procs: Vec<(&'static str, Proc)>,
    server: Option<String>,
}

/// One reading of a [`Meter`].
struct Reading {
    cpu: Vec<Option<f64>>,
    machine: Option<(u64, u64)>,
    metrics: Option<String>,
}

/// What a phase cost over its measured window.
#[derive(Debug, Default)]
struct Cost {
    /// CPU-seconds by role.
    cpu: Vec<(&'static str, f64)>,
    /// The machine's busy share (0..1).
    busy: Option<f64>,
    /// Where lock-server says an acquire's time went.
    latency: Option<String>,
}

impl Meter {
    /// The load generator is this process, lock-server the service at `server` (if any).
    fn here(server: Option<&Service>) -> Self {
        let mut m = Meter::default().with("generator", Proc::One(std::process::id()));
        if let Some(s) = server {
            m = m.with("lock-server", Proc::One(s.pid()));
            m.server = Some(s.url());
        }
        m
    }

    fn with(mut self, role: &'static str, p: Proc) -> Self {
        self.procs.push((role, p));
        self
    }

    async fn read(&self) -> Reading {
        let cpu = self
            .procs
            .iter()
            .map(|(_, p)| match *p {
                Proc::One(pid) => cpu::process_secs(pid),
                Proc::Tree(pid) => Some(cpu::tree_secs(pid)),
            })
            .collect();
        let metrics = match &self.server {
            Some(url) => scrape(url).await.ok(),
            None => None,
        };
        Reading {
            cpu,
            machine: cpu::machine_ticks(),
            metrics,
        }
    }

    /// Reads at `from` and at `to` (the phase's measured window).
    async fn window(self, from: Instant, to: Instant) -> Cost {
        tokio::time::sleep_until(tokio::time::Instant::from_std(from)).await;
        let a = self.read().await;
        tokio::time::sleep_until(tokio::time::Instant::from_std(to)).await;
        let b = self.read().await;
        let cpu = self
            .procs
            .iter()
            .zip(a.cpu.iter().zip(&b.cpu))
            .filter_map(|((role, _), (x, y))| Some((*role, (*y)? - (*x)?)))
            .collect();
        let busy = match (a.machine, b.machine) {
            (Some((b0, a0)), Some((b1, a1))) if a1 > a0 => Some((b1 - b0) as f64 / (a1 - a0) as f64),
            _ => None,
        };
        let latency = match (&a.metrics, &b.metrics) {
            (Some(x), Some(y)) => acquire_breakdown(x, y),
            _ => None,
        };
        Cost { cpu, busy, latency }
    }
}

/// Where lock-server's acquires spent their time between two scrapes (means, µs).
fn acquire_breakdown(before: &str, after: &str) -> Option<String> {
    let d = |name: &str, labels: &[(&str, &str)]| {
        metric_sum(after, name, labels) - metric_sum(before, name, labels)
    };
    let route = [("route", "/v1/locks/{key}/acquire")];
    let n = d("http_request_duration_seconds_count", &route);
    if n <= 0.0 {
        return None;
    }
    let http = d("http_request_duration_seconds_sum", &route) / n * 1e6;
    let acq = [("statement", "acquire")];
    let calls = d("lock_batch_wait_seconds_count", &acq);
    // Calls per statement of each kind (etcd: releases per transaction): what the store's CPU per
    // cycle follows most closely.
    let per = |kind| {
        let labels = [("statement", kind)];
        let statements = d("lock_batch_calls_count", &labels);
        if statements > 0.0 {
            d("lock_batch_calls_sum", &labels) / statements
        } else {
            0.0
        }
    };
    if calls > 0.0 {
        let queue = d("lock_batch_wait_seconds_sum", &acq) / calls * 1e6;
        let lockdb = d("lock_batch_statement_seconds_sum", &acq) / calls * 1e6;
        // Statements sent: each kind's, less those that carried both (counted under each).
        let paired = d("lock_batch_paired_total", &[]);
        let statements = d("lock_batch_calls_count", &acq)
            + d("lock_batch_calls_count", &[("statement", "release")])
            - paired;
        return Some(format!(
            "acquire {http:.0} µs = batch queue {queue:.0} + lockdb {lockdb:.0} + HTTP path {:.0}; {:.1} calls per statement ({:.1} per release statement), {:.0} % of statements carried both",
            http - queue - lockdb,
            per("acquire"),
            per("release"),
            if statements > 0.0 {
                paired / statements * 100.0
            } else {
                0.0
            }
        ));
    }
    let lease = |source| d("lock_etcd_grant_leases_total", &[("source", source)]);
    let (granted, reused) = (lease("granted"), lease("reused"));
    if granted + reused > 0.0 {
        return Some(format!(
            "acquire {http:.0} µs; grant leases {reused:.0} reused, {granted:.0} new; {:.1} releases per transaction",
            per("release")
        ));
    }
    Some(format!("acquire {http:.0} µs"))
}

/// How the HTTP clients acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Each client on its own key.
    Distinct,
    /// Every client on one key, no wait: a 409 and try again.
    OneKey,
    /// Every client on one key, waiting in its queue (`waitMs`).
    Blocking,
}

/// The wait of a blocking client: far longer than any grant takes to come round.
const BENCH_WAIT_MS: i64 = 30_000;
/// The TTL of every benchmark grant.
const BENCH_TTL_MS: i64 = 30_000;

impl Phase {
    /// CPU-seconds per cycle of one role, or of every process measured (`None`).
    fn cpu_per_cycle(&self, role: Option<&str>) -> Option<f64> {
        let secs: Vec<f64> = self
            .cost
            .cpu
            .iter()
            .filter(|(r, _)| role.is_none_or(|want| *r == want))
            .map(|(_, s)| *s)
            .collect();
        (!secs.is_empty() && self.cycles > 0).then(|| secs.iter().sum::<f64>() / self.cycles as f64)
    }

    fn per_sec(&self) -> f64 {
        self.cycles as f64 / self.secs
    }

    fn ms(&self, q: f64) -> f64 {
        self.acquire.value_at_quantile(q) as f64 / 1000.0
    }

    fn longest_ms(&self) -> f64 {
        self.acquire.max() as f64 / 1000.0
    }
}

fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

async fn lock(args: LockArgs, run_dir: &RunDir) -> Result<bool> {
    let clients_list = args
        .clients
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "dlock bench lock — backends {:?}, clients {clients_list}, {} s per phase",
        args.backend, args.seconds
    );
    println!(
        "load average at the start: {} (/proc/loadavg)",
        cpu::load_average()
    );
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let measure = Duration::from_secs(args.seconds);
    let pg = matches!(args.backend, BenchBackend::Postgres | BenchBackend::All);
    let etcd = matches!(args.backend, BenchBackend::Etcd | BenchBackend::All);

    let pool_size = max_clients.to_string();
    let db = if pg {
        Some(Database::start(History::Lockdb).await?)
    } else {
        None
    };
    // One lock-server per signing setting asked for, over the same store.
    let key = run_key("bench")?;
    let signings = args.grant_signing.settings();
    let mut pg_servers = Vec::new();
    if let Some(db) = &db {
        for &signed in signings {
            let signing = signed.then_some(&key);
            let server = lock_server(db, run_dir.path(), &["--db-pool-size", &pool_size], signing).await?;
            pg_servers.push((signed, server));
        }
    }
    let cluster = if etcd {
        step("etcd (one member, data on tmpfs) …");
        let c = EtcdCluster::single().context("start etcd (scripts/cluster-tools.sh etcd installs it)")?;
        step(format!("etcd {} ({})", c.endpoint(0), etcd_bin().display()));
        Some(c)
    } else {
        None
    };
    let mut etcd_servers = Vec::new();
    if let Some(c) = &cluster {
        for &signed in signings {
            let server = etcd_lock_server(&c.endpoint(0), run_dir.path(), signed.then_some(&key)).await?;
            etcd_servers.push((signed, server));
        }
    }
    // "unsigned" marks the rows of a lock-server without a signing key.
    let name = |store: &str, signed: bool, shape: &str| {
        format!("dlock/{store}{}, {shape}", if signed { "" } else { " unsigned" })
    };
    // Every lock-server row in both stores: distinct keys, one key without waiting, one key queued.
    const SHAPES: [(&str, Mode); 3] = [
        ("distinct", Mode::Distinct),
        ("one key", Mode::OneKey),
        ("one key, blocking", Mode::Blocking),
    ];
    let mutex_bin = if etcd { Some(mutex_bench_bin()?) } else { None };

    let hop = Service::start(
        Spec::new("hop-server", "dlock")?.args(["bench", "hop-server", "--listen", "127.0.0.1:{port}"]),
        run_dir.path(),
    )
    .await?;
    step(format!("the HTTP hop alone on {} (pid {})", hop.url(), hop.pid()));

    let mut rows: Vec<(u32, Phase)> = Vec::new();
    for &clients in &args.clients {
        step(format!("{HOP_ROW}, {clients} clients …"));
        let meter = Meter::here(Some(&hop));
        rows.push((
            clients,
            http_phase(HOP_ROW, &hop.url(), clients, Mode::Distinct, measure, meter).await?,
        ));
        if let Some(db) = &db {
            for (signed, server) in &pg_servers {
                for (shape, mode) in SHAPES {
                    let name = name("postgres", *signed, shape);
                    step(format!("{name}, {clients} clients …"));
                    let meter = Meter::here(Some(server)).with("postgres", Proc::Tree(db.server.pid));
                    rows.push((
                        clients,
                        http_phase(name, &server.url(), clients, mode, measure, meter).await?,
                    ));
                }
            }
            step(format!("bare C1 statement, {clients} clients …"));
            let meter = Meter::here(None).with("postgres", Proc::Tree(db.server.pid));
            rows.push((clients, bare_phase(&db.app_url(), clients, measure, meter).await?));
        }
        if let (Some(cluster), Some(bin)) = (&cluster, &mutex_bin) {
            for (signed, server) in &etcd_servers {
                for (shape, mode) in SHAPES {
                    let name = name("etcd", *signed, shape);
                    step(format!("{name}, {clients} clients …"));
                    let mut meter = Meter::here(Some(server));
                    if let Some(pid) = cluster.pid(0) {
                        meter = meter.with("etcd", Proc::One(pid));
                    }
                    rows.push((
                        clients,
                        http_phase(name, &server.url(), clients, mode, measure, meter).await?,
                    ));
                }
            }
            for (name, contended) in [("etcd Mutex, distinct", false), ("etcd Mutex, one key", true)] {
                step(format!("{name}, {clients} clients …"));
                rows.push((
                    clients,
                    mutex_phase(name, bin, cluster, clients, contended, measure).await?,
                ));
            }
        }
    }

    println!();
    println!(
        "{:<44} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "phase", "clients", "cycles/s", "grants/s", "acquire p50", "acquire p99", "longest"
    );
    for (clients, p) in &rows {
        println!(
            "{:<44} {:>8} {:>10.0} {:>10.0} {:>9.2} ms {:>9.2} ms {:>9.2} ms",
            p.name,
            clients,
            p.per_sec(),
            p.grants as f64 / p.secs,
            p.ms(0.50),
            p.ms(0.99),
            p.longest_ms()
        );
    }
    println!();
    println!(
        "cost per 1,000 cycles: CPU-seconds of each process over the measured window (/proc), and the machine's busy share"
    );
    print!("{:<44} {:>8}", "phase", "clients");
    for role in ROLES {
        print!(" {role:>11}");
    }
    println!(" {:>11} {:>6}", "all", "busy");
    for (clients, p) in &rows {
        let per_k = |secs: f64| secs / p.cycles.max(1) as f64 * 1000.0;
        print!("{:<44} {:>8}", p.name, clients);
        for role in ROLES {
            match p.cost.cpu.iter().find(|(r, _)| *r == role) {
                Some((_, secs)) => print!(" {:>11.3}", per_k(*secs)),
                None => print!(" {:>11}", "-"),
            }
        }
        let all: f64 = p.cost.cpu.iter().map(|(_, s)| s).sum();
        match p.cost.busy {
            Some(b) => println!(" {:>11.3} {:>5.0}%", per_k(all), b * 100.0),
            None => println!(" {:>11.3} {:>6}", per_k(all), "-"),
        }
    }
    println!();
    println!("where lock-server's acquires spent their time (its own histograms, means over the window)");
    for (clients, p) in &rows {
        if let Some(l) = &p.cost.latency {
            println!("{}, {clients} clients: {l}", p.name);
        }
    }
    println!();
    let (sign_us, _) = print_grant_cost()?;
    print_json_cost()?;
    println!();
    // The floors are for the first signing setting asked for (a deployment's: signed).
    let signed = signings.first().copied().unwrap_or(true);
    let sign_secs = if signed { sign_us * 1e-6 } else { 0.0 };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let dlock_rows = [
        name("postgres", signed, "distinct"),
        name("etcd", signed, "distinct"),
    ];
    println!(
        "floors: the least CPU a dlock cycle on distinct keys can cost on {cores} cores, from parts measured above \
         (needs the Mutex rows: --backend all)"
    );
    for line in floors(&rows, [&dlock_rows[0], &dlock_rows[1]], sign_secs, cores) {
        println!("  {line}");
    }
    println!();
    println!("goal: dlock (either backend) at 16 clients ≥ etcd Mutex cycles/s at 16 clients, p99 no worse");
    Ok(true)
}

/// The row of the HTTP hop alone ([`crate::hop`]).
const HOP_ROW: &str = "HTTP hop alone (no store), distinct";

/// For each client count with a Mutex row: the fewest CPU-seconds a dlock cycle on distinct keys
/// can cost, and so the most cycles/s `cores` allow, against the Mutex's rate; then what the dlock
/// row spent above its floor, by process. A floor is a sum of parts measured in the same run, each
/// one a dlock cycle cannot do without: the HTTP hop alone (its generator and its server), one
/// signature (`sign_secs`), and the store's work — on PostgreSQL what lockdb spent per dlock cycle,
/// on etcd what etcd spent per Mutex cycle (the least a grant and a release can cost it). No row
/// keeps every core busy, so the real bound is lower still.
fn floors(rows: &[(u32, Phase)], dlock_rows: [&str; 2], sign_secs: f64, cores: f64) -> Vec<String> {
    let find = |clients: u32, name: &str| {
        rows.iter()
            .find(|(c, p)| *c == clients && p.name == name)
            .map(|(_, p)| p)
    };
    let ms = |secs: f64| secs * 1e3;
    let mut counts: Vec<u32> = rows.iter().map(|(c, _)| *c).collect();
    counts.dedup();
    let mut lines = Vec::new();
    for clients in counts {
        let (Some(hop), Some(mutex)) = (find(clients, HOP_ROW), find(clients, "etcd Mutex, distinct")) else {
            continue;
        };
        let (Some(hop_cpu), Some(mutex_cpu)) = (hop.cpu_per_cycle(None), mutex.cpu_per_cycle(None)) else {
            continue;
        };
        let hop_part = hop_cpu + sign_secs;
        lines.push(format!(
            "{clients} clients: the Mutex {:.0} cycles/s at {:.3} ms CPU per cycle; the HTTP hop and a signature {:.3} ms",
            mutex.per_sec(),
            ms(mutex_cpu),
            ms(hop_part)
        ));
        // The store's part: lockdb as the dlock row measured it (so nothing of lockdb's is above
        // the floor: not printed); etcd as the Mutex row did.
        let pg = find(clients, dlock_rows[0]);
        let stores = [
            (
                "postgres",
                pg,
                pg.and_then(|p| p.cpu_per_cycle(Some("postgres"))),
                "lockdb per dlock cycle",
                false,
            ),
            (
                "etcd",
                find(clients, dlock_rows[1]),
                mutex.cpu_per_cycle(Some("etcd")),
                "etcd per Mutex cycle",
                true,
            ),
        ];
        for (store, dlock, store_cpu, what, store_above) in stores {
            let (Some(dlock), Some(store_cpu)) = (dlock, store_cpu) else {
                continue;
            };
            let floor = hop_part + store_cpu;
            let most = cores / floor;
            lines.push(format!(
                "  dlock/{store}: floor {:.3} ms (+ {what} {:.3}) → at most {most:.0} cycles/s = {:.2}× the Mutex",
                ms(floor),
                ms(store_cpu),
                most / mutex.per_sec()
            ));
            // Above the floor, by process: lock-server against the hop's server and a signature,
            // the generator against the hop's, the store against its part of the floor.
            let above = |role: &str, base: f64| dlock.cpu_per_cycle(Some(role)).map(|c| ms(c - base));
            let parts = [
                (
                    "lock-server",
                    above(
                        "lock-server",
                        hop.cpu_per_cycle(Some("lock-server")).unwrap_or(0.0) + sign_secs,
                    ),
                ),
                (
                    "generator",
                    above("generator", hop.cpu_per_cycle(Some("generator")).unwrap_or(0.0)),
                ),
                (store, above(store, store_cpu).filter(|_| store_above)),
            ];
            let parts: Vec<String> = parts
                .iter()
                .filter_map(|(role, d)| d.map(|d| format!("{role} {d:+.3}")))
                .collect();
            if let Some(all) = dlock.cpu_per_cycle(None) {
                lines.push(format!(
                    "    measured {:.3} ms per cycle ({:.0} cycles/s), above the floor: {}",
                    ms(all),
                    dlock.per_sec(),
                    parts.join(", ")
                ));
            }
        }
    }
    lines
}

/// lock-server as a process with `--backend etcd`, signing grants with `signing` if given.
async fn etcd_lock_server(
    endpoint: &str,
    run_dir: &std::path::Path,
    signing: Option<&dlock_grant::SigningKey>,
) -> Result<Service> {
    let spec = Spec::new("lock-server-etcd", "lock-server")?.args([
        "--backend",
        "etcd",
        "--etcd-endpoints",
        endpoint,
        "--listen",
        "127.0.0.1:{port}",
    ]);
    let spec = crate::stack::lock_server_env(spec, signing);
    let svc = Service::start(spec, run_dir).await?;
    step(format!("lock-server (etcd) on {} (pid {})", svc.url(), svc.pid()));
    Ok(svc)
}

/// The Go program of bench/etcd-mutex, built into the tools cache by scripts/bench.sh.
fn mutex_bench_bin() -> Result<PathBuf> {
    let p = dlock_testkit::pg::tools_dir().join("bin/etcd-mutex-bench");
    if !p.is_file() {
        bail!(
            "{} is missing: build it with scripts/bench.sh (go build in bench/etcd-mutex)",
            p.display()
        );
    }
    Ok(p)
}

#[derive(serde::Deserialize)]
struct MutexResult {
    cycles: u64,
    p50_us: u64,
    p99_us: u64,
    /// The longest Lock (a program built before it reported this reads as 0).
    #[serde(default)]
    max_us: u64,
}

/// etcd's Mutex: cycles and the Lock latency quantiles come from the Go program; the histogram is
/// rebuilt from its two quantiles (only p50/p99 are printed).
async fn mutex_phase(
    name: impl Into<String>,
    bin: &PathBuf,
    cluster: &EtcdCluster,
    clients: u32,
    contended: bool,
    measure: Duration,
) -> Result<Phase> {
    let endpoint = cluster.endpoint(0);
    let child = Command::new(bin)
        .args([
            "--endpoints",
            &endpoint,
            "--clients",
            &clients.to_string(),
            "--seconds",
            &measure.as_secs().to_string(),
            &format!("--contended={contended}"),
            "--prefix",
            &format!("/bench-mutex/{clients}/"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("run etcd-mutex-bench")?;
    // The program warms up for 1 s from its start, then measures: the same window as ours, give
    // or take its start-up (its cost per cycle reads a little high, never low).
    let warm_until = Instant::now() + Duration::from_secs(1);
    let mut meter = Meter::default().with("generator", Proc::One(child.id()));
    if let Some(pid) = cluster.pid(0) {
        meter = meter.with("etcd", Proc::One(pid));
    }
    let cost = tokio::spawn(meter.window(warm_until, warm_until + measure));
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await?
        .context("run etcd-mutex-bench")?;
    if !out.status.success() {
        bail!(
            "etcd-mutex-bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let r: MutexResult = serde_json::from_slice(&out.stdout).context("etcd-mutex-bench output")?;
    let mut acquire = histogram()?;
    // Half the samples at p50, the rest up to p99, one at p99: quantiles read back as measured.
    acquire.record_n(r.p50_us.max(1), r.cycles.div_ceil(2).max(1))?;
    acquire.record_n(r.p99_us.max(1), (r.cycles / 2).max(1))?;
    acquire.record(r.max_us.max(1))?;
    Ok(Phase {
        name: name.into(),
        cycles: r.cycles,
        grants: r.cycles,
        secs: measure.as_secs_f64(),
        acquire,
        cost: cost.await?,
    })
}

async fn http_phase(
    name: impl Into<String>,
    base: &str,
    clients: u32,
    mode: Mode,
    measure: Duration,
    meter: Meter,
) -> Result<Phase> {
    // The client a user's program would use: dlock-client's typed API over one pooled connection
    // set (the load generator's own CPU is in the cost table).
    let api = LockApi::new(base, &ClientConfig::default())?;
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + measure;
    let cost = tokio::spawn(meter.window(warm_until, stop_at));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let owner = format!("bench-{i}");
            let session = api.open_session(&owner, 600_000).await?.session_id;
            let key = match mode {
                Mode::Distinct => format!("bench:{i}"),
                Mode::OneKey => "bench:hot".to_owned(),
                Mode::Blocking => "bench:queue".to_owned(),
            };
            let mut hist = histogram()?;
            let (mut cycles, mut grants) = (0u64, 0u64);
            loop {
                let t0 = Instant::now();
                if t0 >= stop_at {
                    break;
                }
                let answer = match mode {
                    Mode::Blocking => {
                        api.acquire_waiting(&key, session, &owner, BENCH_TTL_MS, BENCH_WAIT_MS)
                            .await
                    }
                    Mode::Distinct | Mode::OneKey => api.acquire(&key, session, &owner, BENCH_TTL_MS).await,
                };
                let took = t0.elapsed();
                let counted = t0 >= warm_until;
                match answer {
                    Ok(grant) => {
                        let released = api.release(&key, grant.fencing_token).await?;
                        if !released.released {
                            bail!("the release of a grant just made was stale: {released:?}");
                        }
                        grants += u64::from(counted);
                    }
                    Err(ClientError::Contended { .. }) => {}
                    Err(e) => bail!("acquire failed: {e}"),
                }
                if counted {
                    hist.record(took.as_micros() as u64)?;
                    cycles += 1;
                }
            }
            anyhow::Ok((hist, cycles, grants))
        }));
    }
    collect(name, tasks, measure, cost).await
}

async fn bare_phase(url: &str, clients: u32, measure: Duration, meter: Meter) -> Result<Phase> {
    use lock_server::sql::{ACQUIRE, CREATE_SESSION, RELEASE};
    let pool = PgPoolOptions::new().max_connections(clients).connect(url).await?;
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + measure;
    let cost = tokio::spawn(meter.window(warm_until, stop_at));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let owner = format!("bare-{i}");
            let session: Uuid = sqlx::query_scalar(CREATE_SESSION)
                .bind(&owner)
                .bind(600.0_f64)
                .fetch_one(&pool)
                .await?;
            let key = format!("bare:{i}");
            let mut hist = histogram()?;
            let (mut cycles, mut grants) = (0u64, 0u64);
            loop {
                let t0 = Instant::now();
                if t0 >= stop_at {
                    break;
                }
                let row: Option<i64> = sqlx::query_scalar(ACQUIRE)
                    .bind(&key)
                    .bind(&owner)
                    .bind(session)
                    .bind(30.0_f64)
                    .fetch_optional(&pool)
                    .await?;
                let took = t0.elapsed();
                let counted = t0 >= warm_until;
                if let Some(token) = row {
                    sqlx::query(RELEASE).bind(&key).bind(token).execute(&pool).await?;
                    grants += u64::from(counted);
                }
                if counted {
                    hist.record(took.as_micros() as u64)?;
                    cycles += 1;
                }
            }
            anyhow::Ok((hist, cycles, grants))
        }));
    }
    collect("bare C1 acquire statement", tasks, measure, cost).await
}

type TaskResult = Result<(Histogram<u64>, u64, u64)>;

async fn collect(
    name: impl Into<String>,
    tasks: Vec<tokio::task::JoinHandle<TaskResult>>,
    measure: Duration,
    cost: tokio::task::JoinHandle<Cost>,
) -> Result<Phase> {
    let mut phase = Phase {
        name: name.into(),
        cycles: 0,
        grants: 0,
        secs: measure.as_secs_f64(),
        acquire: histogram()?,
        cost: Cost::default(),
    };
    for t in tasks {
        let (h, c, g) = t.await??;
        phase.acquire.add(h)?;
        phase.cycles += c;
        phase.grants += g;
    }
    phase.cost = cost.await?;
    Ok(phase)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, cycles: u64, cpu: &[(&'static str, f64)]) -> (u32, Phase) {
        let phase = Phase {
            name: name.to_owned(),
            cycles,
            grants: cycles,
            secs: 1.0,
            acquire: histogram().unwrap(),
            cost: Cost {
                cpu: cpu.to_vec(),
                ..Cost::default()
            },
        };
        (16, phase)
    }

    /// 1,000 cycles each: CPU-seconds read as ms per cycle. The floor on PostgreSQL is the hop
    /// (0.03 + 0.05) + a signature (0.02) + lockdb's 0.2 = 0.3 ms, so 2 cores do at most 6,667
    /// cycles/s, 1.33× the Mutex's 5,000; what the dlock row spent above it is lock-server's 0.15
    /// against 0.03 + 0.02 and the generator's 0.08 against 0.05 (lockdb's part is the row's own, so
    /// nothing of it is above). On etcd the store's part is the Mutex's etcd, 0.2 ms per cycle, and
    /// the dlock row's etcd is above it by 0.15.
    #[test]
    fn floors_add_the_hop_a_signature_and_the_store_and_say_what_a_row_spent_above() {
        let rows = [
            phase(HOP_ROW, 1_000, &[("generator", 0.05), ("lock-server", 0.03)]),
            phase(
                "dlock/postgres, distinct",
                1_000,
                &[("generator", 0.08), ("lock-server", 0.15), ("postgres", 0.2)],
            ),
            phase(
                "etcd Mutex, distinct",
                5_000,
                &[("generator", 0.5), ("etcd", 1.0)],
            ),
            phase(
                "dlock/etcd, distinct",
                1_000,
                &[("generator", 0.08), ("lock-server", 0.2), ("etcd", 0.35)],
            ),
        ];
        let lines = floors(
            &rows,
            ["dlock/postgres, distinct", "dlock/etcd, distinct"],
            0.000_02,
            2.0,
        );
        assert_eq!(
            lines,
            [
                "16 clients: the Mutex 5000 cycles/s at 0.300 ms CPU per cycle; the HTTP hop and a signature 0.100 ms",
                "  dlock/postgres: floor 0.300 ms (+ lockdb per dlock cycle 0.200) → at most 6667 cycles/s = 1.33× the Mutex",
                "    measured 0.430 ms per cycle (1000 cycles/s), above the floor: lock-server +0.100, generator +0.030",
                "  dlock/etcd: floor 0.300 ms (+ etcd per Mutex cycle 0.200) → at most 6667 cycles/s = 1.33× the Mutex",
                "    measured 0.630 ms per cycle (1000 cycles/s), above the floor: lock-server +0.150, generator +0.030, etcd +0.150",
            ]
        );
        // Without the hop's row there is no floor to state.
        assert!(
            floors(
                &rows[1..],
                ["dlock/postgres, distinct", "dlock/etcd, distinct"],
                0.0,
                2.0
            )
            .is_empty()
        );
    }

    #[test]
    fn json_cost_reads_a_cycle_back_with_and_without_a_signed_grant() {
        let grant = bench_grant(&run_key("bench").unwrap(), "bench/00000001", 1, Uuid::new_v4()).unwrap();
        assert!(json_cost(10, None).unwrap() > 0.0);
        assert!(json_cost(10, Some(grant)).unwrap() > 0.0);
    }
}
