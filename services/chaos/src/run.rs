//! One campaign run: start the stack, create payouts at a steady rate while the nemesis runs its
//! schedule, heal, wait until every payout has ended (bounded), read the final state, check.
//!
//! The stack, all real processes on loopback: paydb on its own PostgreSQL 16; lockdb on another
//! PostgreSQL 16 *or* a three-member etcd cluster; two lock-server processes (the executors are
//! spread over them); payment-resource; rail-proxy; rail-stub; several payout-executors with
//! several workers each. Every executor reaches each service through its own [`Link`], which
//! records the history and is where partitions happen; rail-proxy reaches the rail through one too.
//! Every process can be paused, killed and restarted on the same port.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use dlock_common::grant::{PUBLIC_KEYS_ENV, SIGNING_KEY_ENV};
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::stack::{LockBackend, kill_hard};
use dlock_testkit::{History, PgServer, demo_dirs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sqlx::Connection;
use tokio::time::Instant;

use crate::check::{self, Verdict};
use crate::history::{F, Type, Value};
use crate::nemesis::{self, Cut, Db, Fault, Nemesis, Process, RailFault, Scheduled, Shape};
use crate::proxy::{InFlight, Link, Mode, Recorder, Upstream};
use crate::state::{self, FaultRecord, FinalState, RunInfo};

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
    /// Positive control: rewind lockdb's sequence half-way through, without the fast-forward.
    pub rewind_sequence: bool,
    /// How long after the last fault heals every payout must have ended.
    pub settle: Duration,
    /// Print a progress line while it runs.
    pub progress: bool,
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
            settle: Duration::from_secs(60),
            progress: true,
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
}

/// What a run produced.
pub struct Outcome {
    pub verdict: Verdict,
    pub state: FinalState,
    pub schedule: Vec<Scheduled>,
    pub duration: Duration,
    pub dir: PathBuf,
}

/// Owns the etcd cluster on a thread of its own for the whole run: etcd members get
/// PR_SET_PDEATHSIG, which fires when the *thread* that started them ends, so they must be started
/// and restarted from a thread that outlives them.
struct EtcdKeeper {
    tx: std::sync::mpsc::Sender<(EtcdCmd, tokio::sync::oneshot::Sender<Result<()>>)>,
    endpoints: Vec<String>,
}

enum EtcdCmd {
    Stop(usize),
    Restart(usize),
}

impl EtcdKeeper {
    fn start() -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<(EtcdCmd, tokio::sync::oneshot::Sender<Result<()>>)>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("etcd-keeper".into())
            .spawn(move || {
                let mut cluster = match EtcdCluster::three() {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(c.endpoints()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow!("start a three-member etcd: {e}")));
                        return;
                    }
                };
                // Ends (and the cluster with it) when the keeper is dropped.
                while let Ok((cmd, reply)) = rx.recv() {
                    let r = match cmd {
                        EtcdCmd::Stop(i) => {
                            cluster.stop(i);
                            Ok(())
                        }
                        EtcdCmd::Restart(i) => cluster.restart(i).map_err(|e| anyhow!("{e}")),
                    };
                    let _ = reply.send(r);
                }
            })?;
        let endpoints = ready_rx.recv().context("etcd keeper")??;
        Ok(Self { tx, endpoints })
    }

    async fn cmd(&self, c: EtcdCmd) -> Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send((c, tx)).map_err(|_| anyhow!("etcd keeper gone"))?;
        rx.await.map_err(|_| anyhow!("etcd keeper gone"))?
    }
}

/// A PostgreSQL 16 server with one migrated database. The server sits behind a lock so that the
/// database nemesis can crash and restart it from a blocking thread.
struct Database {
    server: Arc<std::sync::Mutex<PgServer>>,
    port: u16,
    history: History,
}

impl Database {
    async fn start(history: History) -> Result<Self> {
        // Committed means committed: the database nemesis crashes these servers, and the test
        // kit's default (synchronous_commit=off) would lose acknowledged transactions in a crash.
        let server = tokio::task::spawn_blocking(move || {
            PgServer::start_with(
                &format!("chaos-{}", history.name()),
                &[("synchronous_commit", "on")],
            )
        })
        .await??;
        let mut conn = sqlx::PgConnection::connect(&server.url("postgres", "postgres")).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {}", history.name())))
            .execute(&mut conn)
            .await?;
        let mut db = sqlx::PgConnection::connect(&server.url("postgres", history.name())).await?;
        let files = dlock_migrate::load_dirs(&demo_dirs(history))?;
        dlock_migrate::migrate(&mut db, &files).await?;
        Ok(Self {
            port: server.port,
            server: Arc::new(std::sync::Mutex::new(server)),
            history,
        })
    }

    fn url(&self, user: &str) -> String {
        format!(
            "postgres://{user}@127.0.0.1:{}/{}",
            self.port,
            self.history.name()
        )
    }

    fn app_url(&self) -> String {
        self.url(self.history.app_role())
    }

    fn admin_url(&self) -> String {
        self.url("postgres")
    }

    /// `pg_ctl stop -m immediate`, `down` of nothing, start again on the same port and data.
    async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || {
            let mut s = server.lock().unwrap_or_else(|p| p.into_inner());
            s.crash();
            std::thread::sleep(down);
            s.restart()
        })
        .await??;
        Ok(())
    }
}

/// One restartable service process: its spec (port included) and the running incarnation.
struct Proc {
    spec: Spec,
    /// Arguments added to the next incarnation only.
    spec_extra: Vec<String>,
    svc: Option<Service>,
    incarnation: u32,
    dir: PathBuf,
}

impl Proc {
    async fn start(spec: Spec, dir: &Path) -> Result<Self> {
        let mut p = Self {
            spec,
            spec_extra: Vec::new(),
            svc: None,
            incarnation: 0,
            dir: dir.to_path_buf(),
        };
        p.restart_with(&[]).await?;
        Ok(p)
    }

    /// Starts a new incarnation on the same port (its own log file), with extra environment.
    async fn restart_with(&mut self, env: &[(&str, &str)]) -> Result<()> {
        self.kill();
        let mut spec = self.spec.clone();
        spec.name = format!("{}.{}", self.spec.name, self.incarnation);
        if !self.spec_extra.is_empty() {
            // It may stop itself before it answers /readyz: the caller waits for the stop instead.
            spec = spec.args(self.spec_extra.iter().cloned()).no_wait();
        }
        for (k, v) in env {
            spec = spec.env(k, *v);
        }
        self.incarnation += 1;
        self.svc = Some(
            Service::start(spec, &self.dir)
                .await
                .with_context(|| format!("start {}", self.spec.name))?,
        );
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(svc) = self.svc.take() {
            let _ = svc.resume();
            let _ = kill_hard(svc.pid());
            drop(svc); // reaps it
        }
    }

    fn pause(&self) -> Result<()> {
        self.svc
            .as_ref()
            .ok_or_else(|| anyhow!("{} is not running", self.spec.name))?
            .pause()?;
        Ok(())
    }

    fn resume(&self) {
        if let Some(s) = &self.svc {
            let _ = s.resume();
        }
    }

    fn port(&self) -> u16 {
        self.spec.port
    }

    fn pid(&self) -> Option<u32> {
        self.svc.as_ref().map(Service::pid)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.spec.port)
    }
}

/// An executor and its three links.
struct Executor {
    proc: Proc,
    lock: Link,
    payment: Link,
    rail: Link,
}

impl Executor {
    fn links(&self) -> [&Link; 3] {
        [&self.lock, &self.payment, &self.rail]
    }
}

/// The credentials of the run's services (generated per run; passed in the environment only).
struct Credentials {
    admin: String,
    executor: String,
    client: String,
    rail_executor: String,
    lock_admin: String,
    /// Both lock-servers sign grants with it; the resources verify them (every fenced write of the
    /// campaign carries its grant, through the proxies like its token).
    grant_key: dlock_grant::SigningKey,
}

impl Credentials {
    fn generate() -> Self {
        let fresh = |role: &str| format!("{role}-{}", uuid::Uuid::new_v4().simple());
        Self {
            admin: fresh("admin"),
            executor: fresh("executor"),
            client: fresh("client"),
            rail_executor: fresh("rail-executor"),
            lock_admin: fresh("lock-admin"),
            grant_key: dlock_grant::SigningKey::generate(
                dlock_grant::KeyId::new("chaos").unwrap_or_else(|| unreachable!("a valid key id")),
            ),
        }
    }
}

/// The running stack.
struct Stack {
    paydb: Database,
    lockdb: Option<Database>,
    etcd: Option<EtcdKeeper>,
    lock_servers: Vec<Proc>,
    payment: Proc,
    rail_proxy: Proc,
    rail_stub: Proc,
    rail_link: Link,
    executors: Vec<Executor>,
    inflight: Arc<InFlight>,
    creds: Credentials,
    http: reqwest::Client,
    dir: PathBuf,
    libfaketime: Option<PathBuf>,
    lease: Duration,
    /// One connection, kept, for the progress line and the settle loop's counts (once a second);
    /// the pool reconnects after the database nemesis restarted paydb.
    counts_pool: sqlx::PgPool,
}

fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

impl Stack {
    async fn start(opts: &Options, recorder: &Arc<Recorder>) -> Result<Self> {
        let dir = opts.dir.join("logs");
        std::fs::create_dir_all(&dir)?;
        let creds = Credentials::generate();
        let inflight = Arc::new(InFlight::default());
        let paydb = Database::start(History::Paydb).await.context("paydb")?;
        let (lockdb, etcd) = match opts.backend {
            LockBackend::Postgres => (
                Some(Database::start(History::Lockdb).await.context("lockdb")?),
                None,
            ),
            LockBackend::Etcd => (None, Some(EtcdKeeper::start()?)),
        };
        let mut lock_servers = Vec::new();
        for i in 0..2 {
            let spec = Spec::new(&format!("lock-server-{i}"), "lock-server")?
                .args(["--listen", "127.0.0.1:{port}"])
                .env("DLOCK_ADMIN_TOKEN", &creds.lock_admin)
                .env(SIGNING_KEY_ENV, creds.grant_key.expose_text());
            let spec = match (&lockdb, &etcd) {
                (Some(db), _) => spec.args(["--database-url".to_owned(), db.app_url()]),
                (None, Some(e)) => spec.args([
                    "--backend".to_owned(),
                    "etcd".to_owned(),
                    "--etcd-endpoints".to_owned(),
                    e.endpoints.join(","),
                ]),
                (None, None) => bail!("no lock store"),
            };
            lock_servers.push(Proc::start(spec, &dir).await?);
        }
        let rail_stub = Proc::start(
            Spec::new("rail-stub", "rail-stub")?.args([
                "--listen",
                "127.0.0.1:{port}",
                "--mode",
                "ack",
                "--test-mode",
            ]),
            &dir,
        )
        .await?;
        let rail_link = Link::start(
            "rail-proxy->rail",
            "rail-proxy",
            Upstream::Rail,
            rail_stub.port(),
            None,
            inflight.clone(),
        )
        .await?;
        let rail_proxy = Proc::start(
            Spec::new("rail-proxy", "rail-proxy")?
                .args([
                    "--database-url".to_owned(),
                    paydb.app_url(),
                    "--listen".to_owned(),
                    "127.0.0.1:{port}".to_owned(),
                    "--rail-url".to_owned(),
                    rail_link.url(),
                    "--rail-timeout-ms".to_owned(),
                    "1000".to_owned(),
                    // Ambiguity ends: an attempt the rail never received is given up this soon.
                    "--abandon-after-ms".to_owned(),
                    "3000".to_owned(),
                    "--fencing-enabled".to_owned(),
                    opts.rail_fencing.to_string(),
                ])
                .env("RAIL_PROXY_EXECUTOR_TOKEN", &creds.rail_executor)
                .env(PUBLIC_KEYS_ENV, creds.grant_key.public_key().to_text()),
            &dir,
        )
        .await?;
        let payment = Proc::start(
            Spec::new("payment-resource", "payment-resource")?
                .args([
                    "serve".to_owned(),
                    "--database-url".to_owned(),
                    paydb.app_url(),
                    "--listen".to_owned(),
                    "127.0.0.1:{port}".to_owned(),
                    "--fencing-enabled".to_owned(),
                    opts.payment_fencing.to_string(),
                ])
                .env("PAYMENT_RESOURCE_ADMIN_TOKEN", &creds.admin)
                .env("PAYMENT_RESOURCE_EXECUTOR_TOKEN", &creds.executor)
                .env("PAYMENT_RESOURCE_CLIENT_TOKEN", &creds.client)
                .env(PUBLIC_KEYS_ENV, creds.grant_key.public_key().to_text()),
            &dir,
        )
        .await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let admin_url = paydb.admin_url();
        let mut stack = Self {
            paydb,
            lockdb,
            etcd,
            lock_servers,
            payment,
            rail_proxy,
            rail_stub,
            rail_link,
            executors: Vec::new(),
            inflight,
            creds,
            http,
            dir,
            libfaketime: libfaketime(),
            lease: opts.lease(),
            counts_pool: sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect_lazy(&admin_url)?,
        };
        for i in 0..opts.executors {
            stack.start_executor(i, opts, recorder).await?;
        }
        Ok(stack)
    }

    async fn start_executor(&mut self, i: usize, opts: &Options, recorder: &Arc<Recorder>) -> Result<()> {
        let process = format!("executor-{i}");
        let lock_server = &self.lock_servers[i % self.lock_servers.len()];
        let mut links = Vec::new();
        for (name, up, port) in [
            ("lock-server", Upstream::LockServer, lock_server.port()),
            ("payment-resource", Upstream::PaymentResource, self.payment.port()),
            ("rail-proxy", Upstream::RailProxy, self.rail_proxy.port()),
        ] {
            let link_name = format!("{process}->{name}");
            links.push(
                Link::start(
                    &link_name,
                    &process,
                    up,
                    port,
                    Some(recorder.clone()),
                    self.inflight.clone(),
                )
                .await?,
            );
        }
        let [lock, payment, rail]: [Link; 3] = links.try_into().map_err(|_| anyhow!("three links"))?;
        let lease = opts.lease().as_millis().to_string();
        let session = opts.session().as_millis().to_string();
        let workers = opts.workers.to_string();
        let spec = Spec::new(&process, "payout-executor")?
            .env(
                payout_executor::config::PAYMENT_CREDENTIAL_ENV,
                &self.creds.executor,
            )
            .env(
                payout_executor::config::RAIL_CREDENTIAL_ENV,
                &self.creds.rail_executor,
            )
            .args([
                "--lock-server-url",
                &lock.url(),
                "--payment-resource-url",
                &payment.url(),
                "--rail-proxy-url",
                &rail.url(),
                "--owner-id",
                &process,
                "--listen",
                "127.0.0.1:{port}",
                "--workers",
                &workers,
                "--lease-ttl-ms",
                &lease,
                "--session-ttl-ms",
                &session,
                "--acquire-wait-ms",
                "100",
                "--poll-interval-ms",
                "200",
                "--http-timeout-ms",
                "2000",
                "--resolve-backoff-ms",
                "100",
                "--shutdown-grace-ms",
                "500",
            ]);
        let proc = Proc::start(spec, &self.dir).await?;
        self.executors.push(Executor {
            proc,
            lock,
            payment,
            rail,
        });
        Ok(())
    }

    fn proc_mut(&mut self, p: Process) -> &mut Proc {
        match p {
            Process::Executor(i) => &mut self.executors[i].proc,
            Process::LockServer(i) => &mut self.lock_servers[i],
            Process::PaymentResource => &mut self.payment,
            Process::RailProxy => &mut self.rail_proxy,
        }
    }

    async fn rail_behaviour(&self, mode: &str, latency_ms: u64) -> Result<()> {
        self.http
            .put(format!("{}/v1/admin/behaviour", self.rail_stub.url()))
            .json(&json!({"mode": mode, "latencyMs": latency_ms}))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The etcd member that leads, by asking each member's status.
    async fn etcd_leader(&self, endpoints: &[String]) -> Option<usize> {
        // One status call per member: each names itself and the leader it follows.
        let mut ids = Vec::with_capacity(endpoints.len());
        let mut leader = None;
        for ep in endpoints {
            let status = match self
                .http
                .post(format!("{ep}/v3/maintenance/status"))
                .json(&json!({}))
                .send()
                .await
            {
                Ok(r) => r.json::<serde_json::Value>().await.ok(),
                Err(_) => None,
            };
            let status = status.unwrap_or_default();
            if leader.is_none() {
                leader = status["leader"].as_str().map(str::to_owned);
            }
            ids.push(status["header"]["member_id"].as_str().map(str::to_owned));
        }
        let leader = leader?;
        ids.iter().position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// Applies one fault, holds it, heals it.
    async fn apply(&mut self, fault: &Fault, rng: &mut StdRng) -> Result<String> {
        let mut note = String::new();
        match *fault {
            Fault::Pause {
                target,
                hold,
                gap: None,
            } => {
                self.proc_mut(target).pause()?;
                tokio::time::sleep(hold).await;
                self.proc_mut(target).resume();
            }
            Fault::Pause {
                target,
                hold,
                gap: Some(gap),
            } => {
                // A fresh incarnation that stops itself at the gap once; wait (bounded) for it.
                let proc = self.proc_mut(target);
                proc.spec_extra = vec![
                    "--enable-fault-injection".into(),
                    "--pause-at".into(),
                    gap.flag().into(),
                ];
                proc.restart_with(&[]).await?;
                proc.spec_extra.clear();
                let pid = proc.pid();
                let deadline = Instant::now() + Duration::from_secs(5);
                let mut stopped = false;
                while Instant::now() < deadline {
                    if pid.and_then(dlock_testkit::stack::process_state) == Some('T') {
                        stopped = true;
                        break;
                    }
                    // Polling another process's scheduler state: there is nothing to await.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                note = if stopped {
                    "stopped in the gap".into()
                } else {
                    "did not reach the gap in 5 s".into()
                };
                if stopped {
                    tokio::time::sleep(hold).await;
                }
                self.proc_mut(target).resume();
            }
            Fault::Kill {
                target,
                down,
                in_flight,
            } => {
                if in_flight {
                    let (up, f) = match target {
                        Process::RailProxy => {
                            // A slow rail keeps the submission in flight while rail-proxy dies:
                            // between the rail's answer and its recording.
                            self.rail_behaviour("ack", 400).await?;
                            (Upstream::RailProxy, F::Submit)
                        }
                        _ => (Upstream::PaymentResource, F::Post),
                    };
                    let caught = self.inflight.wait_for(up, f, Duration::from_secs(3)).await;
                    if caught && target == Process::RailProxy {
                        // Let the order reach the rail first.
                        tokio::time::sleep(Duration::from_millis(rng.random_range(50..350))).await;
                    }
                    note = if caught {
                        "a write was in flight".into()
                    } else {
                        "no write came in 3 s".into()
                    };
                }
                self.proc_mut(target).kill();
                if target == Process::RailProxy {
                    self.rail_behaviour("ack", 0).await?;
                }
                tokio::time::sleep(down).await;
                self.proc_mut(target).restart_with(&[]).await?;
            }
            Fault::Database { db, down } => match db {
                Db::Paydb => self.paydb.crash_and_restart(down).await?,
                Db::Lockdb => {
                    let l = self.lockdb.as_ref().ok_or_else(|| anyhow!("no lockdb"))?;
                    l.crash_and_restart(down).await?;
                }
                Db::EtcdMember { leader } => {
                    let keeper = self.etcd.as_ref().ok_or_else(|| anyhow!("no etcd"))?;
                    let endpoints = keeper.endpoints.clone();
                    let lead = self.etcd_leader(&endpoints).await.unwrap_or(0);
                    let i = if leader {
                        lead
                    } else {
                        (lead + 1) % endpoints.len()
                    };
                    note = format!("member m{i}");
                    let keeper = self.etcd.as_ref().ok_or_else(|| anyhow!("no etcd"))?;
                    keeper.cmd(EtcdCmd::Stop(i)).await?;
                    tokio::time::sleep(down).await;
                    keeper.cmd(EtcdCmd::Restart(i)).await?;
                }
            },
            Fault::Partition { executor, cut, hold } => {
                let e = &self.executors[executor];
                match cut {
                    Cut::LockService => e.lock.set(Mode::Blackhole),
                    Cut::Resources => {
                        e.payment.set(Mode::Blackhole);
                        e.rail.set(Mode::Blackhole);
                    }
                    Cut::LockServiceAnswers => e.lock.set(Mode::DropAnswers),
                    Cut::ResourceAnswers => {
                        e.payment.set(Mode::DropAnswers);
                        e.rail.set(Mode::DropAnswers);
                    }
                    Cut::Reset => e.links().iter().for_each(|l| l.set(Mode::Reset)),
                    Cut::Delay => {
                        // Longer than the lease: a write arrives after its grant may have lapsed.
                        let late = self.lease + Duration::from_millis(rng.random_range(100..600));
                        e.payment.set(Mode::Delay(late));
                        e.rail.set(Mode::Delay(late));
                    }
                }
                tokio::time::sleep(hold).await;
                e.links().iter().for_each(|l| l.set(Mode::Pass));
            }
            Fault::Clock {
                executor,
                offset_secs,
                hold,
            } => {
                let lib = self.libfaketime.clone().ok_or_else(|| {
                    anyhow!("libfaketime is not installed (Debian: faketime; scripts/setup.sh)")
                })?;
                let lib = lib.display().to_string();
                let offset = format!("{offset_secs:+}");
                let proc = &mut self.executors[executor].proc;
                proc.restart_with(&[
                    ("LD_PRELOAD", lib.as_str()),
                    ("FAKETIME", offset.as_str()),
                    // Only the wall clock is skewed: timers and leases run on CLOCK_MONOTONIC.
                    ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
                ])
                .await?;
                tokio::time::sleep(hold).await;
                self.executors[executor].proc.restart_with(&[]).await?;
            }
            Fault::Rail { fault, hold } => {
                match fault {
                    RailFault::Timeout => self.rail_behaviour("timeout", 0).await?,
                    RailFault::Slow(ms) => self.rail_behaviour("ack", ms).await?,
                    RailFault::Reject => self.rail_behaviour("reject", 0).await?,
                    RailFault::Unknown => self.rail_link.set(Mode::Unknown),
                    RailFault::LostAnswer => self.rail_link.set(Mode::DropAnswers),
                }
                tokio::time::sleep(hold).await;
                self.rail_link.set(Mode::Pass);
                self.rail_behaviour("ack", 0).await?;
            }
        }
        Ok(note)
    }

    /// Every process running and resumed, every link passing, the rail acking.
    async fn heal_all(&mut self) -> Result<()> {
        for p in self
            .lock_servers
            .iter()
            .chain([&self.payment, &self.rail_proxy])
            .chain(self.executors.iter().map(|e| &e.proc))
        {
            p.resume();
        }
        for e in &self.executors {
            e.links().iter().for_each(|l| l.set(Mode::Pass));
        }
        self.rail_link.set(Mode::Pass);
        self.rail_behaviour("ack", 0).await
    }

    async fn paydb(&self) -> Result<sqlx::PgConnection> {
        Ok(sqlx::PgConnection::connect(&self.paydb.admin_url()).await?)
    }

    /// Payouts by state, read from paydb.
    async fn counts(&self) -> Result<Vec<(String, i64)>> {
        Ok(
            sqlx::query_as("SELECT state, count(*) FROM payout GROUP BY state ORDER BY state")
                .fetch_all(&self.counts_pool)
                .await?,
        )
    }

    async fn lock_sequence(&self) -> Result<Option<i64>> {
        if let Some(l) = &self.lockdb {
            let mut c = sqlx::PgConnection::connect(&l.admin_url()).await?;
            let (v,): (i64,) = sqlx::query_as("SELECT last_value FROM fencing_token_seq")
                .fetch_one(&mut c)
                .await?;
            return Ok(Some(v));
        }
        if let Some(e) = &self.etcd {
            for ep in &e.endpoints {
                if let Ok(r) = self
                    .http
                    .post(format!("{ep}/v3/maintenance/status"))
                    .json(&json!({}))
                    .send()
                    .await
                    && let Ok(v) = r.json::<serde_json::Value>().await
                    && let Some(rev) = v["header"]["revision"].as_str().and_then(|s| s.parse().ok())
                {
                    return Ok(Some(rev));
                }
            }
        }
        Ok(None)
    }

    async fn final_state(&self, run: RunInfo) -> Result<FinalState> {
        let mut c = self.paydb().await?;
        let accounts = sqlx::query_as(state::sql::ACCOUNTS).fetch_all(&mut c).await?;
        let payouts = sqlx::query_as(state::sql::PAYOUTS).fetch_all(&mut c).await?;
        let ledger = sqlx::query_as(state::sql::LEDGER).fetch_all(&mut c).await?;
        let rail_submissions = sqlx::query_as(state::sql::RAIL_SUBMISSIONS)
            .fetch_all(&mut c)
            .await?;
        let rail_high_water = sqlx::query_as(state::sql::HIGH_WATER).fetch_all(&mut c).await?;
        let rail = self
            .http
            .get(format!("{}/v1/received", self.rail_stub.url()))
            .timeout(Duration::from_secs(30))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let reconciliation = self
            .http
            .get(format!("{}/v1/reconciliation", self.payment.url()))
            .bearer_auth(&self.creds.admin)
            .timeout(Duration::from_secs(60))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(FinalState {
            run,
            accounts,
            payouts,
            ledger,
            rail_submissions,
            rail_high_water,
            rail,
            reconciliation,
            lock_sequence: self.lock_sequence().await?,
        })
    }
}

/// The client: `n` payouts over the accounts at a steady rate across `window`; now and then a
/// create is sent again with the same idempotency key (a client that timed out and retries), and
/// one that got no answer is retried with backoff, a bounded number of times.
struct ClientPlan {
    url: String,
    credential: String,
    accounts: Vec<uuid::Uuid>,
    n: u32,
    window: Duration,
    seed: u64,
}

async fn client(plan: ClientPlan, recorder: Arc<Recorder>, created: Arc<AtomicU64>) {
    let ClientPlan {
        url,
        credential,
        accounts,
        n,
        window,
        seed,
    } = plan;
    let http = match reqwest::Client::builder().timeout(Duration::from_secs(2)).build() {
        Ok(h) => h,
        Err(_) => return,
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00c1_1e47);
    let start = Instant::now();
    let gap = window.mul_f64(0.85) / n.max(1);
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until(start + gap * i).await;
        let account = accounts[rng.random_range(0..accounts.len())];
        let amount: i64 = rng.random_range(100..=5_000);
        let again = rng.random_bool(0.05);
        let key = format!("chaos-{seed}-{i}");
        let (http, url, credential, recorder, created, limit) = (
            http.clone(),
            url.clone(),
            credential.clone(),
            recorder.clone(),
            created.clone(),
            limit.clone(),
        );
        tasks.spawn(async move {
            let Ok(_permit) = limit.acquire_owned().await else {
                return;
            };
            let sends = if again { 2 } else { 1 };
            let mut done = 0;
            let mut tries = 0u32;
            while done < sends && tries < 8 {
                tries += 1;
                let ok = create(&http, &url, &credential, account, amount, &key, &recorder).await;
                if ok {
                    if done == 0 {
                        created.fetch_add(1, Ordering::Relaxed);
                    }
                    done += 1;
                } else {
                    tokio::time::sleep(Duration::from_millis(100 * 2u64.pow(tries.min(5)))).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// One create, recorded; `true` when it was answered 2xx.
async fn create(
    http: &reqwest::Client,
    url: &str,
    credential: &str,
    account: uuid::Uuid,
    amount: i64,
    key: &str,
    recorder: &Recorder,
) -> bool {
    let op = recorder.new_op();
    let asked = Value {
        account: Some(account),
        amount: Some(amount),
        idempotency_key: Some(key.to_owned()),
        ..Value::default()
    };
    recorder.record("client", Type::Invoke, F::Create, op, asked.clone());
    let answer = http
        .post(format!("{url}/v1/payouts"))
        .bearer_auth(credential)
        .json(&json!({"accountId": account, "amountMinor": amount, "currency": "EUR", "idempotencyKey": key}))
        .send()
        .await;
    let (kind, value, ok) = match answer {
        Ok(r) => {
            let status = r.status();
            let body: serde_json::Value = r.json().await.unwrap_or(serde_json::Value::Null);
            let mut v = Value {
                status: Some(status.as_u16()),
                ..asked
            };
            if status.is_success() {
                v.payout = body["payoutId"].as_str().and_then(|s| s.parse().ok());
                v.state = body["state"].as_str().map(str::to_owned);
                (Type::Ok, v, true)
            } else if status.is_client_error() {
                v.code = body["code"].as_str().map(str::to_owned);
                (Type::Fail, v, false)
            } else {
                v.error = Some(format!("answered {status}"));
                (Type::Info, v, false)
            }
        }
        Err(e) => (
            Type::Info,
            Value {
                error: Some(if e.is_timeout() {
                    "timeout".into()
                } else {
                    "no answer".into()
                }),
                ..asked
            },
            false,
        ),
    };
    recorder.record("client", kind, F::Create, op, value);
    ok
}

const TERMINAL: [&str; 3] = ["POSTED", "FAILED", "ABANDONED"];

/// Runs one campaign.
pub async fn run(opts: &Options) -> Result<Outcome> {
    std::fs::create_dir_all(&opts.dir)?;
    if opts.rewind_sequence && opts.backend != LockBackend::Postgres {
        bail!("--rewind-sequence is a lockdb control (postgres backend only)");
    }
    let began = Instant::now();
    let recorder = Arc::new(Recorder::create(&opts.dir.join("history.jsonl"))?);
    let shape = Shape {
        executors: opts.executors,
        lock_servers: 2,
        etcd: opts.backend == LockBackend::Etcd,
        lease: opts.lease(),
        session: opts.session(),
    };
    let window = Duration::from_secs(opts.seconds);
    let plan = nemesis::schedule(opts.seed, window, &opts.nemeses, shape);
    let mut schedule_text = format!(
        "seed {} · backend {} · nemeses {} · {} payouts over {} s · {} faults\n",
        opts.seed,
        opts.backend,
        opts.nemeses
            .iter()
            .map(|n| n.name())
            .collect::<Vec<_>>()
            .join(","),
        opts.payouts,
        opts.seconds,
        plan.len()
    );
    for s in &plan {
        schedule_text.push_str(&format!("  t+{:>6.2}s  {}\n", s.at.as_secs_f64(), s.fault));
    }
    std::fs::write(opts.dir.join("schedule.txt"), &schedule_text)?;
    if opts.progress {
        print!("{schedule_text}");
    }

    let mut stack = Stack::start(opts, &recorder).await?;
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
