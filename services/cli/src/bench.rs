//! `dlock bench lock`: acquire/release over HTTP through lock-server, and the bare C1 acquire
//! statement straight against the same lockdb, in one run — so their ratio is what the service
//! costs on top of the statement.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use dlock_testkit::History;
use hdrhistogram::Histogram;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::stack::{Database, RunDir, lock_server, step};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Lock acquire/release latency and throughput: service vs bare statement.
    Lock(LockArgs),
    /// Payouts per second end to end, fencing on and off in the same run.
    Payouts(PayoutArgs),
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

#[derive(Debug, Args)]
pub struct LockArgs {
    /// Concurrent clients (and database connections on each side).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// Measured seconds per phase (after a 1 s warm-up).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
}

pub async fn run(cmd: BenchCommand, run_dir: &RunDir) -> Result<bool> {
    match cmd {
        BenchCommand::Lock(args) => lock(args, run_dir).await,
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
            crate::paybench::run(args.payouts, args.executors, args.workers, args.rounds, run_dir).await
        }
    }
}

/// What one phase measured.
struct Phase {
    name: &'static str,
    /// Completed cycles (acquire attempt, and release when granted).
    cycles: u64,
    grants: u64,
    secs: f64,
    acquire: Histogram<u64>,
}

impl Phase {
    fn per_sec(&self) -> f64 {
        self.cycles as f64 / self.secs
    }

    fn ms(&self, q: f64) -> f64 {
        self.acquire.value_at_quantile(q) as f64 / 1000.0
    }
}

fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

async fn lock(args: LockArgs, run_dir: &RunDir) -> Result<bool> {
    println!(
        "dlock bench lock — {} clients, {} s per phase",
        args.clients, args.seconds
    );
    let db = Database::start(History::Lockdb).await?;
    let pool_size = args.clients.to_string();
    let server = lock_server(&db, run_dir.path(), &["--db-pool-size", &pool_size]).await?;
    let measure = Duration::from_secs(args.seconds);

    let mut phases = Vec::new();
    for (name, contended) in [
        ("service, distinct keys", false),
        ("service, one contended key", true),
    ] {
        step(format!("{name} …"));
        phases.push(http_phase(name, &server.url(), args.clients, contended, measure).await?);
    }
    step("bare C1 acquire statement, distinct keys …");
    phases.push(bare_phase(&db.app_url(), args.clients, measure).await?);

    println!();
    println!(
        "{:<28} {:>8} {:>10} {:>10} {:>12} {:>12}",
        "phase", "clients", "cycles/s", "grants/s", "acquire p50", "acquire p99"
    );
    for p in &phases {
        println!(
            "{:<28} {:>8} {:>10.0} {:>10.0} {:>9.2} ms {:>9.2} ms",
            p.name,
            args.clients,
            p.per_sec(),
            p.grants as f64 / p.secs,
            p.ms(0.50),
            p.ms(0.99)
        );
    }
    let ratio = phases[0].per_sec() / phases[2].per_sec();
    println!();
    println!("service / bare statement throughput (distinct keys): {ratio:.2}  (target ≥ 0.70)");
    println!(
        "service acquire p99 at {} clients: {:.2} ms  (target < 5 ms)",
        args.clients,
        phases[0].ms(0.99)
    );
    Ok(true)
}

async fn http_phase(
    name: &'static str,
    base: &str,
    clients: u32,
    contended: bool,
    measure: Duration,
) -> Result<Phase> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients as usize)
        .build()?;
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + measure;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let http = http.clone();
        let base = base.to_owned();
        tasks.push(tokio::spawn(async move {
            let owner = format!("bench-{i}");
            let s: serde_json::Value = http
                .post(format!("{base}/v1/sessions"))
                .json(&json!({"ownerId": owner, "ttlMs": 600_000}))
                .send()
                .await?
                .json()
                .await?;
            let session = s["sessionId"].as_str().context("session id")?.to_owned();
            let key = if contended {
                "bench:hot".to_owned()
            } else {
                format!("bench:{i}")
            };
            let mut hist = histogram()?;
            let (mut cycles, mut grants) = (0u64, 0u64);
            loop {
                let t0 = Instant::now();
                if t0 >= stop_at {
                    break;
                }
                let resp = http
                    .post(format!("{base}/v1/locks/{key}/acquire"))
                    .json(&json!({"sessionId": session, "ownerId": owner, "ttlMs": 30_000}))
                    .send()
                    .await?;
                let status = resp.status();
                let body: serde_json::Value = resp.json().await?;
                let took = t0.elapsed();
                let counted = t0 >= warm_until;
                if status == StatusCode::OK {
                    let token = body["fencingToken"].as_i64().context("token")?;
                    let r = http
                        .post(format!("{base}/v1/locks/{key}/release"))
                        .header("X-Fencing-Token", token.to_string())
                        .send()
                        .await?;
                    if !r.status().is_success() {
                        bail!("release answered {}", r.status());
                    }
                    grants += u64::from(counted);
                } else if status != StatusCode::CONFLICT {
                    bail!("acquire answered {status}: {body}");
                }
                if counted {
                    hist.record(took.as_micros() as u64)?;
                    cycles += 1;
                }
            }
            anyhow::Ok((hist, cycles, grants))
        }));
    }
    collect(name, tasks, measure).await
}

async fn bare_phase(url: &str, clients: u32, measure: Duration) -> Result<Phase> {
    use lock_server::sql::{ACQUIRE, CREATE_SESSION, RELEASE};
    let pool = PgPoolOptions::new().max_connections(clients).connect(url).await?;
    let warm_until = Instant::now() + Duration::from_secs(1);
    let stop_at = warm_until + measure;
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
    collect("bare C1 acquire statement", tasks, measure).await
}

type TaskResult = Result<(Histogram<u64>, u64, u64)>;

async fn collect(
    name: &'static str,
    tasks: Vec<tokio::task::JoinHandle<TaskResult>>,
    measure: Duration,
) -> Result<Phase> {
    let mut phase = Phase {
        name,
        cycles: 0,
        grants: 0,
        secs: measure.as_secs_f64(),
        acquire: histogram()?,
    };
    for t in tasks {
        let (h, c, g) = t.await??;
        phase.acquire.add(h)?;
        phase.cycles += c;
        phase.grants += g;
    }
    Ok(phase)
}
