//! One measured phase of `bench lock`: HTTP clients through a lock-server (or the hop alone), the
//! bare C1 statement against lockdb, or etcd's Mutex recipe (the Go program); each warms up for a
//! second, then measures for the phase's time while its [`Meter`] reads the window.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dlock_client::{ClientConfig, ClientError, LockApi};
use dlock_testkit::etcd::EtcdCluster;
use hdrhistogram::Histogram;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use super::meter::{Cost, Meter, Phase, Proc, histogram};

/// How the HTTP clients acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
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

/// The Go program of bench/etcd-mutex, built into the tools cache by scripts/bench.sh.
pub(super) fn mutex_bench_bin() -> Result<PathBuf> {
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
pub(super) async fn mutex_phase(
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

/// `config`: how the clients reach the server (its CA, a lock client's token; the default for
/// plain HTTP and no authentication).
pub(super) async fn http_phase(
    name: impl Into<String>,
    base: &str,
    config: &ClientConfig,
    clients: u32,
    mode: Mode,
    measure: Duration,
    meter: Meter,
) -> Result<Phase> {
    // The client a user's program would use: dlock-client's typed API over one pooled connection
    // set (the load generator's own CPU is in the cost table).
    let api = LockApi::new(base, config)?;
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

pub(super) async fn bare_phase(url: &str, clients: u32, measure: Duration, meter: Meter) -> Result<Phase> {
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
