//! The stack under test ([`Stack`]): the databases or etcd, two lock-servers, the payments stack
//! and the executors, each reached through its recording links; the faults applied to it, the heal
//! and the final state read from it. Unless the run is `--plaintext`, every HTTP hop (the servers,
//! the links, the run's own calls) speaks HTTPS under a CA made for the run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use dlock_common::grant::{PUBLIC_KEYS_ENV, SIGNING_KEY_ENV};
use dlock_testkit::History;
use dlock_testkit::pg::tls::client_trusting;
use dlock_testkit::procs::Spec;
use dlock_testkit::stack::{LockBackend, StackServer, StackTls};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use sqlx::Connection;
use tokio::time::Instant;

use crate::history::F;
use crate::nemesis::{Cut, Db, Fault, Process, RailFault};
use crate::proxy::{InFlight, Link, LinkTls, Mode, Recorder, Upstream};
use crate::state::{self, FinalState, RunInfo};

use super::Options;
use super::database::Database;
use super::procs::{EtcdCmd, EtcdKeeper, Proc};
/// An executor and its three links.
pub(super) struct Executor {
    pub(super) proc: Proc,
    lock: Link,
    payment: Link,
    rail: Link,
}

impl Executor {
    pub(super) fn links(&self) -> [&Link; 3] {
        [&self.lock, &self.payment, &self.rail]
    }
}

/// The credentials of the run's services (generated per run; passed in the environment only).
pub(super) struct Credentials {
    pub(super) admin: String,
    executor: String,
    pub(super) client: String,
    rail_executor: String,
    lock_admin: String,
    /// Both lock-servers sign grants with it; the resources verify them (every fenced write of the
    /// campaign carries its grant, through the proxies like its token).
    grant_key: dlock_grant::SigningKey,
}

impl Credentials {
    pub(super) fn generate() -> Self {
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
pub(super) struct Stack {
    paydb: Database,
    pub(super) lockdb: Option<Database>,
    etcd: Option<EtcdKeeper>,
    lock_servers: Vec<Proc>,
    pub(super) payment: Proc,
    rail_proxy: Proc,
    rail_stub: Proc,
    rail_link: Link,
    pub(super) executors: Vec<Executor>,
    inflight: Arc<InFlight>,
    pub(super) creds: Credentials,
    pub(super) http: reqwest::Client,
    dir: PathBuf,
    pub(super) libfaketime: Option<PathBuf>,
    lease: Duration,
    /// The record, for a nemesis that waits on it.
    recorder: Arc<Recorder>,
    /// One connection, kept, for the progress line and the settle loop's counts (once a second);
    /// the pool reconnects after the database nemesis restarted paydb.
    counts_pool: sqlx::PgPool,
    /// HTTPS on every hop: the run's CA and the servers' certificates, and the links' side of it;
    /// `None` for a `--plaintext` run.
    tls: Option<RunTls>,
}

/// The TLS of a run: one CA ([`StackTls`], as the demo's stack), a certificate per server, and the
/// links' own certificate of that CA.
struct RunTls {
    stack: Arc<StackTls>,
    links: LinkTls,
}

impl RunTls {
    fn new() -> Result<Self> {
        // Valid from a day ago: the clock nemesis sets an executor's wall clock minutes back, and
        // a certificate issued at the start of the run would not be valid yet by that clock.
        let stack = StackTls::new_backdated().context("the run's CA and certificates")?;
        let links = LinkTls::new(&stack.issue("links")?, stack.ca_file())?;
        Ok(Self { stack, links })
    }

    fn serve(tls: Option<&Self>, server: StackServer, spec: Spec) -> Spec {
        match tls {
            Some(t) => t.stack.serve_as(server, spec),
            None => spec,
        }
    }
}

impl Stack {
    /// paydb as postgres (the fast-forward reads its high-water marks).
    pub(super) fn paydb_admin_url(&self) -> String {
        self.paydb.admin_url()
    }

    pub(super) async fn start(opts: &Options, recorder: &Arc<Recorder>) -> Result<Self> {
        let dir = opts.dir.join("logs");
        std::fs::create_dir_all(&dir)?;
        let creds = Credentials::generate();
        let tls = if opts.tls { Some(RunTls::new()?) } else { None };
        let inflight = Arc::new(InFlight::default());
        let replicated = opts.replicated();
        let standby = |db: Db| replicated.contains(&db).then_some(opts.replication);
        let paydb = Database::start(History::Paydb, standby(Db::Paydb))
            .await
            .context("paydb")?;
        let (lockdb, etcd) = match opts.backend {
            LockBackend::Postgres => (
                Some(
                    Database::start(History::Lockdb, standby(Db::Lockdb))
                        .await
                        .context("lockdb")?,
                ),
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
            let spec = if opts.sequence_jump {
                spec
            } else {
                // "true": what a clap boolean read from the environment accepts, whichever parser it uses.
                spec.env("DLOCK_UNSAFE_NO_SEQUENCE_JUMP", "true")
            };
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
            let spec = RunTls::serve(tls.as_ref(), StackServer::LockServer, spec);
            lock_servers.push(Proc::start(spec, &dir).await?);
        }
        let rail_stub = Proc::start(
            RunTls::serve(
                tls.as_ref(),
                StackServer::RailStub,
                Spec::new("rail-stub", "rail-stub")?.args([
                    "--listen",
                    "127.0.0.1:{port}",
                    "--mode",
                    "ack",
                    "--test-mode",
                ]),
            ),
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
            tls.as_ref().map(|t| &t.links),
        )
        .await?;
        let rail_proxy = Spec::new("rail-proxy", "rail-proxy")?
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
            .env(PUBLIC_KEYS_ENV, creds.grant_key.public_key().to_text());
        let rail_proxy = match &tls {
            // The rail (through its link) serves HTTPS under the run's CA too.
            Some(t) => t
                .stack
                .serve_as(StackServer::RailProxy, rail_proxy)
                .env("DLOCK_RAIL_CA_FILE", t.stack.ca_file().display().to_string()),
            None => rail_proxy,
        };
        let rail_proxy = Proc::start(rail_proxy, &dir).await?;
        let payment = Proc::start(
            RunTls::serve(
                tls.as_ref(),
                StackServer::PaymentResource,
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
            ),
            &dir,
        )
        .await?;
        // The campaign's own calls (accounts, the client's creates, the rail's behaviour, the final
        // state) go to the services directly, trusting the run's CA alone; etcd's status is plain
        // HTTP, which this client also speaks.
        let timeout = Duration::from_secs(2);
        let http = match &tls {
            Some(t) => client_trusting(t.stack.ca_file(), timeout)?,
            None => reqwest::Client::builder().timeout(timeout).build()?,
        };
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
            libfaketime: dlock_testkit::pg::tls::libfaketime(),
            lease: opts.lease(),
            recorder: recorder.clone(),
            counts_pool: sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect_lazy(&admin_url)?,
            tls,
        };
        for i in 0..opts.executors {
            stack.start_executor(i, opts, recorder).await?;
        }
        Ok(stack)
    }

    pub(super) async fn start_executor(
        &mut self,
        i: usize,
        opts: &Options,
        recorder: &Arc<Recorder>,
    ) -> Result<()> {
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
                    self.tls.as_ref().map(|t| &t.links),
                )
                .await?,
            );
        }
        let [lock, payment, rail]: [Link; 3] = links.try_into().map_err(|_| anyhow!("three links"))?;
        let lease = opts.lease().as_millis().to_string();
        let session = opts.session().as_millis().to_string();
        let workers = opts.workers.to_string();
        let spec = Spec::new(&process, "payout-executor")?;
        let spec = match &self.tls {
            // One CA for the three links, as for the three services in a deployment.
            Some(t) => spec.env(
                payout_executor::config::CA_FILE_ENV,
                t.stack.ca_file().display().to_string(),
            ),
            None => spec,
        };
        let spec = spec
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

    /// That TLS is really in force on a run that asked for it: the run's client is answered
    /// through an executor's link (so the link and the service behind it speak HTTPS under the
    /// run's CA), while a plain HTTP request to that link or to the service gets no answer and a
    /// client trusting the built-in roots but not the run's CA is refused by both. `Ok(false)`:
    /// a plaintext run.
    pub(super) async fn check_tls(&self) -> Result<bool> {
        if self.tls.is_none() {
            return Ok(false);
        }
        let link = &self
            .executors
            .first()
            .ok_or_else(|| anyhow!("no executor"))?
            .payment;
        if !link.url().starts_with("https://") || !self.payment.url().starts_with("https://") {
            bail!("{} or payment-resource is not served over HTTPS", link.name);
        }
        self.http
            .get(format!("{}/readyz", link.url()))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("the run's client through {}", link.name))?;
        let timeout = Duration::from_secs(2);
        let plain = reqwest::Client::builder().timeout(timeout).build()?;
        for port in [link.port, self.payment.port()] {
            if plain
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .is_ok()
            {
                bail!("127.0.0.1:{port} answered plain HTTP");
            }
        }
        // reqwest's built-in roots (webpki-roots): what a client of the public CAs trusts.
        let other_roots = reqwest::Client::builder().timeout(timeout).build()?;
        for url in [link.url(), self.payment.url()] {
            if other_roots.get(format!("{url}/readyz")).send().await.is_ok() {
                bail!("{url} was trusted by a client without the run's CA");
            }
        }
        Ok(true)
    }

    pub(super) fn proc_mut(&mut self, p: Process) -> &mut Proc {
        match p {
            Process::Executor(i) => &mut self.executors[i].proc,
            Process::LockServer(i) => &mut self.lock_servers[i],
            Process::PaymentResource => &mut self.payment,
            Process::RailProxy => &mut self.rail_proxy,
        }
    }

    pub(super) async fn rail_behaviour(&self, mode: &str, latency_ms: u64) -> Result<()> {
        self.http
            .put(format!("{}/v1/admin/behaviour", self.rail_stub.url()))
            .json(&json!({"mode": mode, "latencyMs": latency_ms}))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The etcd member that leads, by asking each member's status.
    pub(super) async fn etcd_leader(&self, endpoints: &[String]) -> Option<usize> {
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
    pub(super) async fn apply(&mut self, fault: &Fault, rng: &mut StdRng) -> Result<String> {
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
            Fault::Failover { db, lag, down } => {
                let d = match db {
                    Db::Paydb => &self.paydb,
                    Db::Lockdb => self.lockdb.as_ref().ok_or_else(|| anyhow!("no lockdb"))?,
                    Db::EtcdMember { .. } => bail!("etcd is not failed over"),
                };
                note = d.failover(lag, down, &self.recorder).await?;
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
    pub(super) async fn heal_all(&mut self) -> Result<()> {
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

    pub(super) async fn paydb(&self) -> Result<sqlx::PgConnection> {
        Ok(sqlx::PgConnection::connect(&self.paydb.admin_url()).await?)
    }

    /// Payouts by state, read from paydb.
    pub(super) async fn counts(&self) -> Result<Vec<(String, i64)>> {
        Ok(
            sqlx::query_as("SELECT state, count(*) FROM payout GROUP BY state ORDER BY state")
                .fetch_all(&self.counts_pool)
                .await?,
        )
    }

    pub(super) async fn lock_sequence(&self) -> Result<Option<i64>> {
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

    pub(super) async fn final_state(&self, run: RunInfo) -> Result<FinalState> {
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
