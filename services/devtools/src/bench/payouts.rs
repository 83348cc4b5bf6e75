//! `dlock-dev bench payouts`: end-to-end payouts per second through the real processes, with fencing on
//! and with both kill switches off, in one run — and with signed grants on (lock-server signs, the
//! resources verify), off, or both (`--grants`); lock acquire latency and payout latency read
//! separately from the executors' own histograms, the CPU each process spent per payout (read from
//! `/proc` over the batch), and the cost of one signature and one verification measured in this
//! process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use dlock_testkit::History;
use dlock_testkit::cpu;
use dlock_testkit::stack::{Stack, StackOptions, StackTls};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use super::costs::print_grant_cost;
use super::payout_floor::{self, Floor};
use super::per_payout::{Ran, Requests, STATEMENT_SETTINGS, Statements};
use super::{Fencing, Grants, Hardening};
use crate::stack::{Database, RunDir, step};

struct Run {
    row: Row,
    per_sec: f64,
    acquire_mean_ms: f64,
    acquire_p99_ms: f64,
    payout_mean_ms: f64,
    payout_p99_ms: f64,
    /// The payout p99 interpolated within its bucket (as Prometheus's `histogram_quantile`).
    payout_p99_est_ms: f64,
    /// CPU-seconds of each process over the batch, by role ([`COST_ROLES`]).
    cpu: Vec<(&'static str, f64)>,
    /// Requests each service answered over the batch, by route and status.
    requests: Requests,
    /// What lockdb and paydb ran over the batch.
    statements: Vec<Ran>,
}

/// The processes of a payout run whose CPU is read, in the order the cost table prints them.
pub(super) const COST_ROLES: [&str; 8] = [
    "executors",
    "payment-resource",
    "rail-proxy",
    "rail-stub",
    "lock-server",
    "paydb",
    "lockdb",
    "bench",
];

/// CPU-seconds so far of each role's processes (PostgreSQL: the postmaster and its backends;
/// executors: all of them).
fn cpu_now(
    stack: &Stack,
    executors: &[u32],
    paydb: &Database,
    lockdb: &Database,
) -> Vec<(&'static str, f64)> {
    let one = |pid: u32| cpu::process_secs(pid).unwrap_or(0.0);
    let mut v = vec![
        ("executors", executors.iter().map(|p| one(*p)).sum()),
        ("payment-resource", one(stack.payment.pid())),
        ("rail-proxy", one(stack.rail_proxy.pid())),
        ("rail-stub", one(stack.rail_stub.pid())),
    ];
    if let Some(l) = &stack.lock_server {
        v.push(("lock-server", one(l.pid())));
    }
    v.push(("paydb", cpu::tree_secs(paydb.server.pid)));
    v.push(("lockdb", cpu::tree_secs(lockdb.server.pid)));
    v.push(("bench", one(std::process::id())));
    v
}

/// Sum, count and cumulative buckets of one histogram (all label sets added) from metrics text.
fn histogram(text: &str, name: &str) -> (f64, f64, Vec<(f64, f64)>) {
    let (mut sum, mut count) = (0.0, 0.0);
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(name)) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else { continue };
        if series.starts_with(&format!("{name}_sum")) {
            sum += v;
        } else if series.starts_with(&format!("{name}_count")) {
            count += v;
        } else if let Some(le) = series.split("le=\"").nth(1).and_then(|r| r.split('"').next()) {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += v,
                None => buckets.push((le, v)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    (sum, count, buckets)
}

/// The run with the median throughput.
fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    let mid = runs.len() / 2;
    runs.swap_remove(mid)
}

/// Quantile `q` interpolated linearly within its bucket, as Prometheus's `histogram_quantile`
/// does: finer than the bucket bound for comparing two runs, still an estimate.
fn quantile_interpolated(buckets: &[(f64, f64)], count: f64, q: f64) -> f64 {
    let rank = q * count;
    let mut below = (0.0, 0.0);
    for &(le, cum) in buckets {
        if cum >= rank {
            if le.is_infinite() {
                return below.0;
            }
            let share = if cum > below.1 {
                (rank - below.1) / (cum - below.1)
            } else {
                1.0
            };
            return below.0 + (le - below.0) * share;
        }
        below = (le, cum);
    }
    f64::NAN
}

/// The upper bound of the bucket holding quantile `q` (buckets double, so this is within 2×).
fn quantile_bound(buckets: &[(f64, f64)], count: f64, q: f64) -> f64 {
    buckets
        .iter()
        .find(|(_, c)| *c >= q * count)
        .map_or(f64::NAN, |(le, _)| *le)
}

/// The settings of one table row: which build's services, fencing, signed grants, and how
/// hardened the stack is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    /// The services of `--base-bin` rather than this build's.
    base: bool,
    fencing: bool,
    grants: bool,
    /// HTTPS on every API, each client trusting the run's CA.
    tls: bool,
    /// Lock clients authenticated: the executors present a lock client's token.
    lock_auth: bool,
}

impl Row {
    fn label(self) -> String {
        format!(
            "{}fencing {}, grants {}{}",
            if self.base { "base: " } else { "" },
            if self.fencing { "on" } else { "off" },
            if self.grants { "on" } else { "off" },
            match (self.tls, self.lock_auth) {
                (false, false) => "",
                (true, false) => ", TLS",
                (false, true) => ", lock clients",
                (true, true) => ", TLS + lock clients",
            }
        )
    }

    /// This row in plaintext, lock clients unauthenticated.
    fn plain(self) -> Self {
        Row {
            tls: false,
            lock_auth: false,
            ..self
        }
    }
}

/// What every run of `bench payouts` shares.
#[derive(Debug, Clone)]
pub(super) struct Setup {
    pub payouts: u32,
    pub executors: u32,
    pub workers: u32,
    /// Accounts the payouts are spread over: the first `accounts` of the 20 seeded ones, or, above
    /// 20, those and more made through the API.
    pub accounts: u32,
    /// The base build's binaries, for rows beside this build's in the same run (A/B).
    pub base_bin: Option<PathBuf>,
    /// Which fencing settings get rows.
    pub fencing: Fencing,
    /// Plaintext rows, hardened ones (TLS, and TLS with lock clients authenticated), or both.
    pub hardening: Hardening,
}

/// The accounts of a run: the seeded ones first, then new ones (funded to cover every payout).
async fn accounts(stack: &Stack, n: u32) -> Result<Vec<(Uuid, String)>> {
    let mut out = Vec::new();
    for i in 0..n.min(20) {
        let account: Uuid = format!("00000000-0000-4000-8000-{:012}", i + 1).parse()?;
        let currency = stack.account(account).await?.currency;
        out.push((account, currency));
    }
    for _ in 20..n {
        out.push((stack.create_account("EUR", 1_000_000).await?, "EUR".to_owned()));
    }
    Ok(out)
}

async fn one_run(row: Row, setup: &Setup, run_dir: &RunDir) -> Result<Run> {
    let Setup {
        payouts,
        executors,
        workers,
        ..
    } = *setup;
    let (fencing, grants) = (row.fencing, row.grants);
    let lockdb = Database::start_with(History::Lockdb, STATEMENT_SETTINGS).await?;
    let paydb = Database::start_with(History::Paydb, STATEMENT_SETTINGS).await?;
    let mut opts = StackOptions::new(run_dir.path().join(format!(
        "bench-{}{}-{}{}{}",
        if row.base { "base-" } else { "" },
        if fencing { "fenced" } else { "unfenced" },
        if grants { "signed" } else { "unsigned" },
        if row.tls { "-tls" } else { "" },
        if row.lock_auth { "-lock-clients" } else { "" }
    )));
    opts.bin_dir = row.base.then(|| setup.base_bin.clone()).flatten();
    opts.rail_fencing = fencing;
    opts.payment_fencing = fencing;
    opts.grant_signing = grants;
    opts.grant_verification = grants;
    if row.tls {
        opts.tls = Some(StackTls::new()?);
    }
    if row.lock_auth {
        // The executors' owner ids (`bench-executor-N`) and their workers' start with it.
        opts.lock_client_owner_prefix = Some(EXECUTOR_PREFIX.to_owned());
    }
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts).await?;
    let accounts = accounts(&stack, setup.accounts).await?;
    let mut ids = Vec::new();
    for (account, currency) in accounts.iter().cycle().take(payouts as usize) {
        ids.push(stack.create_payout(*account, 100, currency).await?.payout_id);
    }
    step(format!(
        "{}: {payouts} payouts created over {} accounts; starting {executors} executors × {workers} workers",
        row.label(),
        accounts.len()
    ));
    let databases = [
        Statements::start(&lockdb).await?,
        Statements::start(&paydb).await?,
    ];
    let requests_before = Requests::scrape(&stack).await?;
    let before = cpu_now(&stack, &[], &paydb, &lockdb);
    let started = Instant::now();
    let mut procs = Vec::new();
    for e in 0..executors {
        let spec = stack
            .service_executor_spec(&format!("{EXECUTOR_PREFIX}{e}"))?
            .args(["--workers", &workers.to_string()]);
        procs.push(stack.start_executor(spec).await?);
    }
    // Polled in paydb directly (as the superuser, whose statements the per-payout counts leave
    // out), not through payment-resource, whose requests and CPU are the payouts' own.
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&paydb.server.url("postgres", "paydb"))
        .await?;
    let mut last_report = Instant::now();
    loop {
        let open: i64 = sqlx::query_scalar(COUNT_OPEN).fetch_one(&admin).await?;
        if open == 0 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            step(format!("{} of {payouts} done", i64::from(payouts) - open));
            last_report = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the batch did not finish in 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin.close().await;
    let secs = started.elapsed().as_secs_f64();
    // The executors started with the batch: their whole lives are its cost.
    let pids: Vec<u32> = procs.iter().map(|p| p.pid()).collect();
    let cpu = cpu_now(&stack, &pids, &paydb, &lockdb)
        .into_iter()
        .map(|(role, after)| {
            let was = before.iter().find(|(r, _)| *r == role).map_or(0.0, |(_, b)| *b);
            (role, after - was)
        })
        .collect();
    let requests = Requests::scrape(&stack).await?.since(&requests_before);
    let mut statements = Vec::new();
    for db in databases {
        statements.push(db.read().await?);
        db.close().await;
    }
    let (mut a_sum, mut a_count, mut a_buckets) = (0.0, 0.0, Vec::<(f64, f64)>::new());
    let (mut p_sum, mut p_count, mut p_buckets) = (0.0, 0.0, Vec::<(f64, f64)>::new());
    for p in &procs {
        let text = stack.metrics(&p.url()).await?;
        for (name, sum, count, buckets) in [
            (
                "lock_acquire_duration_seconds",
                &mut a_sum,
                &mut a_count,
                &mut a_buckets,
            ),
            (
                "payout_duration_seconds",
                &mut p_sum,
                &mut p_count,
                &mut p_buckets,
            ),
        ] {
            let (s, c, b) = histogram(&text, name);
            *sum += s;
            *count += c;
            for (le, v) in b {
                match buckets.iter_mut().find(|(x, _)| *x == le) {
                    Some((_, y)) => *y += v,
                    None => buckets.push((le, v)),
                }
            }
            buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
        }
    }
    let posted = ids.len();
    Ok(Run {
        row,
        per_sec: posted as f64 / secs,
        acquire_mean_ms: a_sum / a_count * 1000.0,
        acquire_p99_ms: quantile_bound(&a_buckets, a_count, 0.99) * 1000.0,
        payout_mean_ms: p_sum / p_count * 1000.0,
        payout_p99_ms: quantile_bound(&p_buckets, p_count, 0.99) * 1000.0,
        payout_p99_est_ms: quantile_interpolated(&p_buckets, p_count, 0.99) * 1000.0,
        cpu,
        requests,
        statements,
    })
}

pub(super) async fn run(setup: &Setup, rounds: u32, grants: Grants, run_dir: &RunDir) -> Result<bool> {
    let Setup {
        payouts,
        executors,
        workers,
        ..
    } = *setup;
    // (fencing, grants) of each row: fencing on and off under the grants asked for, and with
    // `both` a third row, fencing on without grants, to compare with the first.
    let combos: &[(bool, bool)] = match grants {
        Grants::On => &[(true, true), (false, true)],
        Grants::Off => &[(true, false), (false, false)],
        Grants::Both => &[(true, true), (false, true), (true, false)],
    };
    // With a base build, each row twice: the base's services, then this build's.
    let builds: &[bool] = if setup.base_bin.is_some() {
        &[true, false]
    } else {
        &[false]
    };
    let rows: Vec<Row> = combos
        .iter()
        .filter(|(fencing, _)| setup.fencing.has(*fencing))
        .flat_map(|&(fencing, grants)| {
            setup
                .hardening
                .settings()
                .iter()
                .flat_map(move |&(tls, lock_auth)| {
                    builds.iter().map(move |&base| Row {
                        base,
                        fencing,
                        grants,
                        tls,
                        lock_auth,
                    })
                })
        })
        .collect();
    println!(
        "dlock-dev bench payouts — {payouts} payouts over {} accounts, {executors} executors × {workers} workers, \
         {rounds} rounds of {} alternated (medians reported){}",
        setup.accounts,
        rows.iter().map(|r| r.label()).collect::<Vec<_>>().join(" / "),
        setup
            .base_bin
            .as_ref()
            .map(|d| format!("; base: the services in {}", d.display()))
            .unwrap_or_default()
    );
    let load = cpu::load_average();
    println!("load average at the start: {load} (/proc/loadavg)");
    let mut runs: Vec<Vec<Run>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        step(format!("round {round} of {rounds}"));
        for (i, row) in rows.iter().enumerate() {
            runs[i].push(one_run(*row, setup, run_dir).await?);
        }
    }
    for (row, rs) in rows.iter().zip(&runs) {
        let rates: Vec<String> = rs.iter().map(|r| format!("{:.1}", r.per_sec)).collect();
        step(format!(
            "{}: payouts/s per round {}",
            row.label(),
            rates.join(", ")
        ));
    }
    let medians: Vec<Run> = runs.into_iter().map(median).collect();
    println!();
    println!(
        "{:<44} {:>11} {:>16} {:>16} {:>16} {:>16} {:>16}",
        "settings",
        "payouts/s",
        "acquire mean",
        "acquire p99 ≤",
        "payout mean",
        "payout p99 ≤",
        "payout p99 ≈"
    );
    for r in &medians {
        println!(
            "{:<44} {:>11.1} {:>13.2} ms {:>13.1} ms {:>13.1} ms {:>13.1} ms {:>13.1} ms",
            r.row.label(),
            r.per_sec,
            r.acquire_mean_ms,
            r.acquire_p99_ms,
            r.payout_mean_ms,
            r.payout_p99_ms,
            r.payout_p99_est_ms
        );
    }
    println!();
    let rate = |fencing: bool, grants: bool| {
        medians
            .iter()
            .find(|r| {
                r.row
                    == Row {
                        base: false,
                        fencing,
                        grants,
                        tls: false,
                        lock_auth: false,
                    }
            })
            .map(|r| r.per_sec)
    };
    for grants in [true, false] {
        if let (Some(on), Some(off)) = (rate(true, grants), rate(false, grants)) {
            println!(
                "fencing costs {:.1}% of throughput with grants {} (target ≤ 10%)",
                (1.0 - on / off) * 100.0,
                if grants { "on" } else { "off" }
            );
        }
    }
    if let (Some(signed), Some(unsigned)) = (rate(true, true), rate(true, false)) {
        println!(
            "signed grants cost {:.1}% of throughput (fencing on, grants on vs off)",
            (1.0 - signed / unsigned) * 100.0
        );
    }
    for hardened in medians.iter().filter(|r| r.row.tls || r.row.lock_auth) {
        if let Some(plain) = medians.iter().find(|p| p.row == hardened.row.plain()) {
            println!(
                "{} costs {:.1}% of throughput against plaintext ({:.1} / {:.1} payouts/s)",
                hardened.row.label(),
                (1.0 - hardened.per_sec / plain.per_sec) * 100.0,
                hardened.per_sec,
                plain.per_sec
            );
        }
    }
    println!("p99 ≤: the histogram's bucket bound (buckets double); p99 ≈: interpolated within the bucket");
    println!();
    println!(
        "CPU per payout, ms, of each process over the batch (/proc; the median run's; load average at the start {load})"
    );
    print!("{:<44}", "settings");
    for role in COST_ROLES {
        print!(" {role:>16}");
    }
    println!(" {:>8}", "all");
    for r in &medians {
        print!("{:<44}", r.row.label());
        for role in COST_ROLES {
            match r.cpu.iter().find(|(x, _)| *x == role) {
                Some((_, secs)) => print!(" {:>16.3}", secs / f64::from(payouts) * 1000.0),
                None => print!(" {:>16}", "-"),
            }
        }
        let all: f64 = r.cpu.iter().map(|(_, s)| s).sum();
        println!(" {:>8.3}", all / f64::from(payouts) * 1000.0);
    }
    let cpu_ms = |r: &Run| r.cpu.iter().map(|(_, s)| s).sum::<f64>() / f64::from(payouts) * 1000.0;
    for this in medians.iter().filter(|r| !r.row.base) {
        if let Some(base) = medians.iter().find(|b| {
            b.row
                == Row {
                    base: true,
                    ..this.row
                }
        }) {
            println!(
                "{}: this build against the base — payouts/s ×{:.2} ({:.1} / {:.1}), CPU per payout ×{:.2} \
                 ({:.3} / {:.3} ms), payout p99 ≈ {:.0} / {:.0} ms",
                this.row.label(),
                this.per_sec / base.per_sec,
                this.per_sec,
                base.per_sec,
                cpu_ms(this) / cpu_ms(base),
                cpu_ms(this),
                cpu_ms(base),
                this.payout_p99_est_ms,
                base.payout_p99_est_ms
            );
        }
    }
    let floor = payout_floor::measure(executors * workers, FLOOR_EACH, 5, run_dir).await?;
    print_floor(&floor, &medians, payouts);
    for r in &medians {
        println!();
        println!(
            "{}, the median run: requests per payout by process, route and status (the services' \
             http_request_duration_seconds_count)",
            r.row.label()
        );
        r.requests.print(payouts);
        println!("statements per payout by statement (pg_stat_statements, the services' roles)");
        for ran in &r.statements {
            ran.print(payouts, 12, 110);
        }
    }
    println!();
    print_grant_cost()?;
    Ok(true)
}

/// Payouts per pgbench connection in the floor's measurement.
const FLOOR_EACH: u32 = 500;

/// The floor beside the cost table: each process's share, what each median row spent above it, and
/// the payouts/s the floor allows on this machine's cores.
fn print_floor(floor: &Floor, medians: &[Run], payouts: u32) {
    let roles: Vec<&str> = COST_ROLES.iter().copied().filter(|r| *r != "bench").collect();
    let ms = |secs: f64| secs * 1000.0;
    println!();
    println!(
        "The floor, CPU per payout, ms: PostgreSQL running exactly one payout's statements (pgbench -M prepared, \
         {} payouts, the helper subtracted) and {} HTTP requests as the hop alone costs them ({:.3} ms client + \
         {:.3} ms server each); then what each row spent above it",
        floor.payouts,
        payout_floor::REQUESTS.iter().map(|(_, n, _)| n).sum::<u32>(),
        ms(floor.request_client),
        ms(floor.request_server)
    );
    print!("{:<44}", "");
    for role in &roles {
        print!(" {role:>16}");
    }
    println!(" {:>8}", "all");
    print!("{:<44}", "floor");
    for role in &roles {
        print!(" {:>16.3}", ms(floor.of(role)));
    }
    println!(" {:>8.3}", ms(floor.total(&roles)));
    for r in medians {
        print!("{:<44}", format!("above: {}", r.row.label()));
        for role in &roles {
            match r.cpu.iter().find(|(x, _)| x == role) {
                Some((_, secs)) => print!(" {:>+16.3}", ms(secs / f64::from(payouts) - floor.of(role))),
                None => print!(" {:>16}", "-"),
            }
        }
        let all: f64 = r
            .cpu
            .iter()
            .filter(|(x, _)| roles.contains(x))
            .map(|(_, s)| s)
            .sum();
        println!(" {:>+8.3}", ms(all / f64::from(payouts) - floor.total(&roles)));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "the floor allows at most {:.0} payouts/s on {cores} cores (every core busy with nothing but the floor)",
        cores / floor.total(&roles)
    );
}

/// Seeds `n` PENDING payouts of 1 minor unit over the 20 seeded customer accounts with one bulk
/// INSERT (not `n` HTTP calls), oldest first in a defined order.
const SEED_BACKLOG: &str = "
INSERT INTO payout (payout_id, account_id, amount_minor, currency, idempotency_key, created_at, updated_at)
SELECT gen_random_uuid(),
       ('00000000-0000-4000-8000-' || lpad((1 + i % 20)::text, 12, '0'))::uuid,
       1,
       CASE WHEN i % 20 < 10 THEN 'EUR' ELSE 'USD' END,
       'bench-backlog-' || i,
       now() - make_interval(secs => ($1 - i) / 1000.0),
       now()
  FROM generate_series(0, $1 - 1) AS i";

/// Payouts not ended yet (every state but the terminal ones).
/// The owner ids of the bench's executors start with it (`bench-executor-0`, …): what the lock
/// client of a row with lock clients authenticated may open sessions for.
const EXECUTOR_PREFIX: &str = "bench-executor-";

const COUNT_OPEN: &str = "SELECT count(*) FROM payout WHERE state NOT IN ('POSTED', 'FAILED', 'ABANDONED')";

/// Payouts POSTED so far, counted from the ledger (a posted payout has its legs; nothing else has):
/// the bench polls every 20 ms, and a count over `payout` would scan the whole backlog each time —
/// CPU taken from the stack it measures, growing with the backlog.
const COUNT_POSTED: &str = "SELECT count(DISTINCT payout_id) FROM ledger_entry";

/// One backlog measurement: payouts per second over the first `measure` payouts to be POSTED.
async fn backlog_run(size: u32, measure: u32, executors: u32, workers: u32, run_dir: &RunDir) -> Result<f64> {
    let lockdb = Database::start(History::Lockdb).await?;
    let paydb = Database::start(History::Paydb).await?;
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&paydb.server.url("postgres", "paydb"))
        .await?;
    let seeding = Instant::now();
    sqlx::query(SEED_BACKLOG)
        .bind(i64::from(size))
        .execute(&admin)
        .await?;
    sqlx::query("ANALYZE payout").execute(&admin).await?;
    step(format!(
        "backlog of {size} PENDING payouts seeded in {:.1} s (one INSERT … SELECT generate_series)",
        seeding.elapsed().as_secs_f64()
    ));
    let opts = StackOptions::new(run_dir.path().join(format!("bench-backlog-{size}")));
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts).await?;
    let target = i64::from(measure.min(size));
    let mut procs = Vec::new();
    for e in 0..executors {
        let spec = stack
            .service_executor_spec(&format!("{EXECUTOR_PREFIX}{e}"))?
            .args(["--workers", &workers.to_string()]);
        procs.push(stack.start_executor(spec).await?);
    }
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let posted: i64 = sqlx::query_scalar(COUNT_POSTED).fetch_one(&admin).await?;
        if posted >= target {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            step(format!("backlog {size}: {posted} of {target} posted"));
            last_report = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("{target} payouts were not posted in 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    drop(procs);
    admin.close().await;
    Ok(target as f64 / secs)
}

/// `dlock-dev bench payouts --backlog N…`: throughput against backlogs of different sizes.
pub(super) async fn backlog(
    sizes: &[u32],
    measure: u32,
    executors: u32,
    workers: u32,
    rounds: u32,
    run_dir: &RunDir,
) -> Result<bool> {
    println!(
        "dlock-dev bench payouts --backlog — backlogs {sizes:?}, first {measure} payouts posted per run, \
         {executors} executors × {workers} workers, {rounds} rounds alternated (medians reported), fencing on"
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for round in 1..=rounds {
        step(format!("round {round} of {rounds}"));
        for (i, size) in sizes.iter().enumerate() {
            let r = backlog_run(*size, measure, executors, workers, run_dir).await?;
            step(format!("backlog {size}: {r:.1} payouts/s"));
            rates[i].push(r);
        }
    }
    println!();
    println!("{:>10} {:>24} {:>12}", "backlog", "payouts/s per round", "median");
    let mut medians = Vec::new();
    for (size, rs) in sizes.iter().zip(&rates) {
        let mut sorted = rs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        medians.push(median);
        let per: Vec<String> = rs.iter().map(|r| format!("{r:.1}")).collect();
        println!("{size:>10} {:>24} {median:>12.1}", per.join(", "));
    }
    if let (Some(first), Some(last)) = (medians.first(), medians.last()) {
        println!();
        println!(
            "largest / smallest backlog throughput: {:.2} (target ≥ 0.90)",
            last / first
        );
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_from_cumulative_buckets() {
        // 100 observations: 50 ≤ 0.01, 90 ≤ 0.02, 100 ≤ 0.04.
        let b = [(0.01, 50.0), (0.02, 90.0), (0.04, 100.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile_bound(&b, 100.0, 0.99), 0.04);
        // Rank 99 lies nine tenths of the way through the (0.02, 0.04] bucket.
        assert!((quantile_interpolated(&b, 100.0, 0.99) - 0.038).abs() < 1e-12);
        assert!((quantile_interpolated(&b, 100.0, 0.5) - 0.01).abs() < 1e-12);
        // Past the last finite bound: that bound, never infinity.
        let tail = [(0.01, 50.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile_interpolated(&tail, 100.0, 0.99), 0.01);
    }
}
