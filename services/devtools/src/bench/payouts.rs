//! `dlock-dev bench payouts`: end-to-end payouts per second through the real processes, with fencing on
//! and with both kill switches off, in one run — and with signed grants on (lock-server signs, the
//! resources verify), off, or both (`--grants`); lock acquire latency and payout latency read
//! separately from the executors' own histograms, the CPU each process spent per payout (read from
//! `/proc` over the batch), and the cost of one signature and one verification measured in this
//! process.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use dlock_testkit::History;
use dlock_testkit::cpu;
use dlock_testkit::stack::{Stack, StackOptions};
use serde_json::Value;
use uuid::Uuid;

use super::Grants;
use super::costs::print_grant_cost;
use crate::stack::{Database, RunDir, step};

struct Run {
    fencing: bool,
    grants: bool,
    per_sec: f64,
    acquire_mean_ms: f64,
    acquire_p99_ms: f64,
    payout_mean_ms: f64,
    payout_p99_ms: f64,
    /// CPU-seconds of each process over the batch, by role ([`COST_ROLES`]).
    cpu: Vec<(&'static str, f64)>,
}

/// The processes of a payout run whose CPU is read, in the order the cost table prints them.
const COST_ROLES: [&str; 8] = [
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

/// The upper bound of the bucket holding quantile `q` (buckets double, so this is within 2×).
fn quantile_bound(buckets: &[(f64, f64)], count: f64, q: f64) -> f64 {
    buckets
        .iter()
        .find(|(_, c)| *c >= q * count)
        .map_or(f64::NAN, |(le, _)| *le)
}

/// The label of a run's settings.
fn label(fencing: bool, grants: bool) -> String {
    format!(
        "fencing {}, grants {}",
        if fencing { "on" } else { "off" },
        if grants { "on" } else { "off" }
    )
}

async fn one_run(
    fencing: bool,
    grants: bool,
    payouts: u32,
    executors: u32,
    workers: u32,
    run_dir: &RunDir,
) -> Result<Run> {
    let lockdb = Database::start(History::Lockdb).await?;
    let paydb = Database::start(History::Paydb).await?;
    let mut opts = StackOptions::new(run_dir.path().join(format!(
        "bench-{}-{}",
        if fencing { "fenced" } else { "unfenced" },
        if grants { "signed" } else { "unsigned" }
    )));
    opts.rail_fencing = fencing;
    opts.payment_fencing = fencing;
    opts.grant_signing = grants;
    opts.grant_verification = grants;
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts).await?;
    let mut ids = Vec::new();
    for i in 0..payouts {
        let account: Uuid = format!("00000000-0000-4000-8000-{:012}", i % 20 + 1).parse()?;
        let currency = stack.account(account).await?.currency;
        ids.push(stack.create_payout(account, 100, &currency).await?.payout_id);
    }
    step(format!(
        "{}: {payouts} payouts created; starting {executors} executors × {workers} workers",
        label(fencing, grants)
    ));
    let before = cpu_now(&stack, &[], &paydb, &lockdb);
    let started = Instant::now();
    let mut procs = Vec::new();
    for e in 0..executors {
        let spec = stack
            .service_executor_spec(&format!("bench-executor-{e}"))?
            .args(["--workers", &workers.to_string()]);
        procs.push(stack.start_executor(spec).await?);
    }
    let http = reqwest::Client::new();
    let base = stack.payment.url();
    let mut last_report = Instant::now();
    loop {
        let mut open = 0;
        for state in [
            "PENDING",
            "CLAIMED",
            "RAIL_SUBMITTED",
            "RAIL_ACKED",
            "RAIL_AMBIGUOUS",
        ] {
            let v: Value = http
                .get(format!("{base}/v1/payouts?state={state}&limit=500"))
                .send()
                .await?
                .json()
                .await?;
            open += v["items"].as_array().map_or(0, Vec::len);
        }
        if open == 0 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            step(format!("{} of {payouts} done", payouts as usize - open));
            last_report = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the batch did not finish in 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        fencing,
        grants,
        per_sec: posted as f64 / secs,
        acquire_mean_ms: a_sum / a_count * 1000.0,
        acquire_p99_ms: quantile_bound(&a_buckets, a_count, 0.99) * 1000.0,
        payout_mean_ms: p_sum / p_count * 1000.0,
        payout_p99_ms: quantile_bound(&p_buckets, p_count, 0.99) * 1000.0,
        cpu,
    })
}

pub(super) async fn run(
    payouts: u32,
    executors: u32,
    workers: u32,
    rounds: u32,
    grants: Grants,
    run_dir: &RunDir,
) -> Result<bool> {
    // (fencing, grants) of each row: fencing on and off under the grants asked for, and with
    // `both` a third row, fencing on without grants, to compare with the first.
    let combos: &[(bool, bool)] = match grants {
        Grants::On => &[(true, true), (false, true)],
        Grants::Off => &[(true, false), (false, false)],
        Grants::Both => &[(true, true), (false, true), (true, false)],
    };
    println!(
        "dlock-dev bench payouts — {payouts} payouts, {executors} executors × {workers} workers, \
         {rounds} rounds of {} alternated (medians reported)",
        combos
            .iter()
            .map(|(f, g)| label(*f, *g))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    let load = cpu::load_average();
    println!("load average at the start: {load} (/proc/loadavg)");
    let mut runs: Vec<Vec<Run>> = combos.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        step(format!("round {round} of {rounds}"));
        for (i, (fencing, grants)) in combos.iter().enumerate() {
            runs[i].push(one_run(*fencing, *grants, payouts, executors, workers, run_dir).await?);
        }
    }
    for ((fencing, grants), rs) in combos.iter().zip(&runs) {
        let rates: Vec<String> = rs.iter().map(|r| format!("{:.1}", r.per_sec)).collect();
        step(format!(
            "{}: payouts/s per round {}",
            label(*fencing, *grants),
            rates.join(", ")
        ));
    }
    let medians: Vec<Run> = runs.into_iter().map(median).collect();
    println!();
    println!(
        "{:<26} {:>11} {:>16} {:>16} {:>16} {:>16}",
        "settings", "payouts/s", "acquire mean", "acquire p99 ≤", "payout mean", "payout p99 ≤"
    );
    for r in &medians {
        println!(
            "{:<26} {:>11.1} {:>13.2} ms {:>13.1} ms {:>13.1} ms {:>13.1} ms",
            label(r.fencing, r.grants),
            r.per_sec,
            r.acquire_mean_ms,
            r.acquire_p99_ms,
            r.payout_mean_ms,
            r.payout_p99_ms
        );
    }
    println!();
    let rate = |fencing: bool, grants: bool| {
        medians
            .iter()
            .find(|r| r.fencing == fencing && r.grants == grants)
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
    println!("p99 figures are histogram bucket bounds (buckets double)");
    println!();
    println!(
        "CPU per payout, ms, of each process over the batch (/proc; the median run's; load average at the start {load})"
    );
    print!("{:<26}", "settings");
    for role in COST_ROLES {
        print!(" {role:>16}");
    }
    println!(" {:>8}", "all");
    for r in &medians {
        print!("{:<26}", label(r.fencing, r.grants));
        for role in COST_ROLES {
            match r.cpu.iter().find(|(x, _)| *x == role) {
                Some((_, secs)) => print!(" {:>16.3}", secs / f64::from(payouts) * 1000.0),
                None => print!(" {:>16}", "-"),
            }
        }
        let all: f64 = r.cpu.iter().map(|(_, s)| s).sum();
        println!(" {:>8.3}", all / f64::from(payouts) * 1000.0);
    }
    println!();
    print_grant_cost()?;
    Ok(true)
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

const COUNT_POSTED: &str = "SELECT count(*) FROM payout WHERE state = 'POSTED'";

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
            .service_executor_spec(&format!("bench-executor-{e}"))?
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
