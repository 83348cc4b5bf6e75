//! The kind tier's steps after the setup (`e2e/kind/run.sh` builds the cluster, installs the
//! operator and applies the stack, then runs `tests/kind.rs`): the cluster as typed objects through
//! `kube::Client`, waits on watches (`await_condition`), the ledger over sqlx and the services' HTTP
//! APIs over reqwest, all through `kubectl port-forward` to loopback ports.
//!
//! - [`ha`]: the HA step's CloudNativePG Clusters, steady payouts and checks across failovers.
//! - [`netpol`]: TCP connections opened from inside pods, for the packet-level NetworkPolicy checks.
//! - [`upgrade`]: the rolling upgrade's parts: `helm upgrade`, the migration Jobs, a watch on the old
//!   version's pods.

pub mod ha;
pub mod netpol;
pub mod renewal;
pub mod upgrade;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

// The client and the watch waits are the cluster tier's too (`crate::k8s`).
pub use crate::k8s::{client, wait_until};

/// Where the stack runs, as `e2e/kind/run.sh` passes it.
#[derive(Debug, Clone)]
pub struct KindEnv {
    pub kubeconfig: PathBuf,
    /// The stack's namespace (LockServices, PaymentStack).
    pub ns: String,
    /// The operator's namespace (its pods and its Lease).
    pub op_ns: String,
    /// The stack's LockService (backend postgres), its PaymentStack, and the LockService with
    /// backend etcd (`e2e/kind/samples/`).
    pub lsvc: String,
    pub pstack: String,
    pub elsvc: String,
    /// Payouts per batch.
    pub payouts: u32,
    /// Bound of every wait.
    pub timeout: Duration,
    /// The operator's Helm release and chart, and the dlock image it was installed with.
    pub release: String,
    pub chart: PathBuf,
    pub image: String,
    /// The dlock image of the rolling upgrade: a version bump with one more paydb migration.
    pub upgrade_image: String,
    /// The steps to run (`DLOCK_KIND_STEPS=netpol,upgrade`, for a rerun against a cluster left by
    /// `DLOCK_KIND_KEEP=1`); `None`: every step.
    pub steps: Option<Vec<String>>,
}

impl KindEnv {
    /// Whether step `name` is to run.
    pub fn runs(&self, name: &str) -> bool {
        self.steps.as_ref().is_none_or(|s| s.iter().any(|n| n == name))
    }
}

/// `Some` inside a kind run (`DLOCK_KIND_KUBECONFIG` set by `e2e/kind/run.sh`); otherwise prints
/// why the test does nothing and returns `None`, so `cargo test --workspace` passes by it. With the
/// variable set but no kubeconfig file it panics: a run that was asked for must not pass by skipping.
pub fn kind_env(test: &str) -> Option<KindEnv> {
    let Some(kubeconfig) = std::env::var_os("DLOCK_KIND_KUBECONFIG") else {
        eprintln!(
            "skipped {test}: not in a kind run (DLOCK_KIND_KUBECONFIG is not set); e2e/kind/run.sh \
             sets up the cluster and runs this test"
        );
        return None;
    };
    let kubeconfig = PathBuf::from(kubeconfig);
    assert!(
        kubeconfig.is_file(),
        "DLOCK_KIND_KUBECONFIG ({}) is not a file",
        kubeconfig.display()
    );
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let number = |name: &str, default: &str| -> u64 {
        let v = var(name, default);
        v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    };
    Some(KindEnv {
        kubeconfig,
        ns: var("DLOCK_KIND_NAMESPACE", "dlock-e2e"),
        op_ns: var("DLOCK_KIND_OPERATOR_NAMESPACE", "dlock-system"),
        lsvc: var("DLOCK_KIND_LOCKSERVICE", "payments-locks"),
        pstack: var("DLOCK_KIND_PAYMENTSTACK", "payments"),
        elsvc: var("DLOCK_KIND_ETCD_LOCKSERVICE", "etcd-locks"),
        payouts: u32::try_from(number("DLOCK_KIND_PAYOUTS", "20")).expect("DLOCK_KIND_PAYOUTS fits u32"),
        timeout: Duration::from_secs(number("DLOCK_KIND_TIMEOUT", "600")),
        release: var("DLOCK_KIND_RELEASE", "dlock-operator"),
        chart: std::env::var_os("DLOCK_KIND_CHART").map_or_else(
            || crate::env::repo_root().join("charts/dlock-operator"),
            PathBuf::from,
        ),
        image: var("DLOCK_KIND_IMAGE", "dlock-local/dlock:kind-e2e"),
        upgrade_image: var("DLOCK_KIND_UPGRADE_IMAGE", "dlock-local/dlock:kind-e2e-next"),
        steps: std::env::var("DLOCK_KIND_STEPS")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| s.split(',').map(|n| n.trim().to_owned()).collect()),
    })
}

/// One progress line on stderr, as run.sh's own.
pub fn log(msg: impl AsRef<str>) {
    eprintln!("[kind] {}", msg.as_ref());
}

/// The step log: each step opens with `---- NAME` and closes with its duration, so a long run shows
/// where it stands.
#[derive(Debug, Default)]
pub struct Steps {
    current: Option<(String, Instant)>,
}

impl Steps {
    /// Closes the previous step (with its duration) and opens `name`.
    pub fn step(&mut self, name: &str) {
        self.close();
        log(format!("---- {name}"));
        self.current = Some((name.to_owned(), Instant::now()));
    }

    /// Closes the step in progress.
    pub fn close(&mut self) {
        if let Some((name, started)) = self.current.take() {
            log(format!("step {name}: done in {}s", started.elapsed().as_secs()));
        }
    }
}

/// How often [`poll`] probes what has no watch (the ledger, pods' exec results, lists).
pub const POLL: Duration = Duration::from_secs(1);

/// Probes every [`POLL`] until `probe` returns `Ok`, at most `timeout` (the test kit's
/// `wait::poll`); panics naming `what` and the last `Err`.
pub async fn poll<T>(what: &str, timeout: Duration, probe: impl AsyncFnMut() -> Result<T, String>) -> T {
    match dlock_testkit::wait::poll(timeout, POLL, probe).await {
        Ok(v) => v,
        Err(last) => panic!(
            "timed out after {}s waiting for {what}; last: {last}",
            timeout.as_secs()
        ),
    }
}

/// `kubectl rollout status deploy/...`: the latest spec observed, every replica updated, none of an
/// older ReplicaSet left, every updated one available.
pub fn deployment_rolled_out(obj: Option<&Deployment>) -> bool {
    let Some(d) = obj else { return false };
    let (Some(spec), Some(st)) = (&d.spec, &d.status) else {
        return false;
    };
    let updated = st.updated_replicas.unwrap_or(0);
    st.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && updated >= spec.replicas.unwrap_or(1)
        && st.replicas.unwrap_or(0) <= updated
        && st.available_replicas.unwrap_or(0) >= updated
}

/// `kubectl rollout status sts/...`: the latest spec observed, every replica ready, on one revision.
pub fn statefulset_rolled_out(obj: Option<&StatefulSet>) -> bool {
    let Some(s) = obj else { return false };
    let (Some(spec), Some(st)) = (&s.spec, &s.status) else {
        return false;
    };
    st.observed_generation.unwrap_or(0) >= s.metadata.generation.unwrap_or(0)
        && st.ready_replicas.unwrap_or(0) >= spec.replicas.unwrap_or(1)
        && st.update_revision.is_some()
        && st.update_revision == st.current_revision
}

/// A `kubectl port-forward` to a Service on a loopback port, stopped when dropped. (The API server's
/// service proxy rewrites content types, which the services rightly refuse.)
#[derive(Debug)]
pub struct Forward {
    pub port: u16,
    /// The Service's in-cluster name, for an HTTPS API ([`forward_api`]): the name its certificate
    /// carries. `None`: plain TCP (PostgreSQL, etcd).
    pub host: Option<String>,
    _child: Child,
}

impl Forward {
    /// `http://127.0.0.1:PORT` + `path`; for an HTTPS API `https://<service>.<ns>.svc:PORT` + `path`,
    /// which [`api_client`] connects to the forward's loopback port.
    pub fn url(&self, path: &str) -> String {
        match &self.host {
            Some(host) => format!("https://{host}:{}{path}", self.port),
            None => format!("http://127.0.0.1:{}{path}", self.port),
        }
    }

    /// lock-server's API through this forward, over HTTPS verified against `ca_pem` for the
    /// Service's name.
    pub fn lock_api(&self, ca_pem: &str) -> crate::lockapi::LockApi {
        let host = self
            .host
            .as_deref()
            .unwrap_or_else(|| panic!("the forward on {} is not to an HTTPS API", self.port));
        crate::lockapi::LockApi::https(self.port, ca_pem, host)
    }
}

/// A port-forward to the HTTPS API (port 8080) of the dlock Service `service`: every object of the
/// kind tier serves HTTPS with the operator's certificates (`spec.tls` left at its default).
pub async fn forward_api(env: &KindEnv, service: &str) -> Forward {
    forward_tls(env, service, 8080).await
}

/// A port-forward to port `port` of Service `service`, which serves HTTPS with the operator's
/// certificate (a dlock API, a managed etcd's client port): its URLs carry the Service's name.
pub async fn forward_tls(env: &KindEnv, service: &str, port: u16) -> Forward {
    let mut f = forward(env, service, port).await;
    f.host = Some(format!("{service}.{}.svc", env.ns));
    f
}

/// The namespace's CA bundle (ConfigMap `dlock-ca-bundle`, which the operator publishes).
pub async fn ca_bundle(client: &Client, ns: &str) -> String {
    use dlock_operator::builders::tls::{CA_BUNDLE, CA_BUNDLE_KEY};
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .get(CA_BUNDLE)
        .await
        .unwrap_or_else(|e| panic!("get ConfigMap {CA_BUNDLE}: {e}"));
    cm.data
        .and_then(|mut d| d.remove(CA_BUNDLE_KEY))
        .unwrap_or_else(|| panic!("ConfigMap {CA_BUNDLE} has no {CA_BUNDLE_KEY}"))
}

/// Every name resolves to loopback: the URLs of [`forward_api`] carry the Service's name (what the
/// certificate is checked against) and the forward's local port.
struct Loopback;

impl reqwest::dns::Resolve for Loopback {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs: reqwest::dns::Addrs =
            Box::new(std::iter::once(std::net::SocketAddr::from(([127, 0, 0, 1], 0))));
        Box::pin(std::future::ready(Ok(addrs)))
    }
}

/// The HTTP client of the checks: trusts only the namespace's CA (never the public roots), and
/// reaches each Service through its port-forward.
pub async fn api_client(client: &Client, ns: &str) -> reqwest::Client {
    let ca = ca_bundle(client, ns).await;
    // Every certificate of the bundle (two while the namespace's CA is rotated).
    let cas =
        reqwest::Certificate::from_pem_bundle(ca.as_bytes()).unwrap_or_else(|e| panic!("the CA bundle: {e}"));
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .tls_built_in_root_certs(false);
    for ca in cas {
        builder = builder.add_root_certificate(ca);
    }
    builder
        .dns_resolver(std::sync::Arc::new(Loopback))
        .no_proxy()
        .build()
        .expect("an HTTPS client")
}

/// Starts a port-forward to `svc/SERVICE:PORT` in `ns` and waits (at most 60 s) until it listens.
pub async fn forward(env: &KindEnv, service: &str, port: u16) -> Forward {
    forward_to(env, &format!("svc/{service}"), port).await
}

/// Starts a port-forward to `TARGET:PORT` (`svc/NAME`, `pod/NAME`) in `ns` and waits (at most
/// 60 s) until it listens.
pub async fn forward_to(env: &KindEnv, target: &str, port: u16) -> Forward {
    let kubectl = crate::env::tool("kubectl").expect("kubectl on PATH or in the tools dir");
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .args(["-n", &env.ns, "port-forward", target, &format!(":{port}")])
        .args(["--address", "127.0.0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start kubectl port-forward {target}: {e}"));
    let stdout = child.stdout.take().expect("port-forward stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let first = async {
        while let Some(line) = lines.next_line().await.ok().flatten() {
            // `Forwarding from 127.0.0.1:40123 -> 8080`
            if let Some(p) = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|p| p.parse().ok())
            {
                return Some(p);
            }
        }
        None
    };
    let port = match tokio::time::timeout(Duration::from_secs(60), first).await {
        Ok(Some(p)) => p,
        Ok(None) => panic!("kubectl port-forward {target} ended before it listened"),
        Err(_) => panic!("timed out after 60s waiting for a port-forward to {target}"),
    };
    // kubectl prints a line per connection; the pipe is drained so it never blocks on a full one.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Forward {
        port,
        host: None,
        _child: child,
    }
}

/// One key of a Secret, as text.
pub async fn secret_value(client: &Client, ns: &str, name: &str, key: &str) -> String {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get Secret {name}: {e}"));
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("Secret {name} has no key {key}"));
    String::from_utf8(bytes.0.clone()).unwrap_or_else(|_| panic!("Secret {name}/{key} is not UTF-8"))
}

/// The payment stack's ledger and services, as the checks see them: paydb as its owner (the URL
/// from the stack's connection Secret, never printed), payment-resource with the stack's `client`
/// credential, and the rail-stub's ground truth.
#[derive(Debug)]
pub struct Payments {
    pub db: PgPool,
    pub http: reqwest::Client,
    pub rail_stub: Forward,
    /// A port-forward reaches one pod; when a rolling update replaces it, a new forward is made.
    payment_resource: tokio::sync::Mutex<Forward>,
    env: KindEnv,
    pstack: String,
    client_token: String,
    /// The URL `db` connects with (through the port-forward below).
    paydb_url: url::Url,
    _paydb: Forward,
}

/// `posted failed total` of one run's payouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub posted: i64,
    pub failed: i64,
    pub total: i64,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} posted, {} failed, of {} created",
            self.posted, self.failed, self.total
        )
    }
}

/// The payout a negative control pays a second time.
#[derive(Debug, Clone)]
pub struct Victim {
    pub payout_id: String,
    pub account_id: String,
    pub amount_minor: i64,
}

/// A run's payouts are those whose idempotency key starts with `RUN-`.
fn run_pattern(run: &str) -> String {
    format!("{run}-%")
}

impl Payments {
    /// Connects to the PaymentStack `pstack`'s paydb (a StatefulSet's) and services in `env.ns`.
    pub async fn connect(env: &KindEnv, client: &Client, pstack: &str) -> Self {
        Self::connect_to(env, client, pstack, None).await
    }

    /// The same, with paydb on the CloudNativePG Cluster `cluster`: reached through its `-rw`
    /// Service (the primary when the forward starts: after a failover, connect again). Both over TLS
    /// when the database serves it, verified against its CA (`verify-ca`: the forward's 127.0.0.1
    /// is not a name the server's certificate carries).
    pub async fn connect_cnpg(env: &KindEnv, client: &Client, pstack: &str, cluster: &str) -> Self {
        Self::connect_to(env, client, pstack, Some(cluster)).await
    }

    async fn connect_to(env: &KindEnv, client: &Client, pstack: &str, cluster: Option<&str>) -> Self {
        let service = cluster.map_or_else(|| format!("{pstack}-paydb"), |c| format!("{c}-rw"));
        let paydb = forward(env, &service, 5432).await;
        let admin_url = secret_value(client, &env.ns, &format!("{pstack}-paydb-conn"), "admin-url").await;
        let mut url = url::Url::parse(admin_url.trim()).expect("the paydb admin URL parses");
        url.set_host(Some("127.0.0.1"))
            .expect("a postgres URL takes a host");
        url.set_port(Some(paydb.port))
            .expect("a postgres URL takes a port");
        // A database that serves TLS (CloudNativePG's; the StatefulSet engine's with HTTPS on) has
        // its CA in `<server>-ca`, as the pods mount it.
        if url.query_pairs().any(|(k, _)| k == "sslrootcert") {
            let server = cluster.map_or_else(|| format!("{pstack}-paydb"), str::to_owned);
            let ca = secret_value(client, &env.ns, &format!("{server}-ca"), "ca.crt").await;
            let path = std::env::temp_dir().join(format!("dlock-kind-{}-{server}-ca.crt", env.ns));
            std::fs::write(&path, ca).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            url.query_pairs_mut()
                .clear()
                .append_pair("sslmode", "verify-ca")
                .append_pair("sslrootcert", &path.to_string_lossy());
        }
        let db = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url.as_str())
            .await
            .unwrap_or_else(|e| panic!("connect to paydb of {pstack} through the port-forward: {e}"));
        let client_token = secret_value(
            client,
            &env.ns,
            &format!("{pstack}-payment-credentials"),
            "client",
        )
        .await;
        assert!(
            client_token.len() >= 16,
            "Secret {pstack}-payment-credentials has no client credential"
        );
        let http = api_client(client, &env.ns).await;
        Payments {
            db,
            http,
            payment_resource: tokio::sync::Mutex::new(
                forward_api(env, &format!("{pstack}-payment-resource")).await,
            ),
            rail_stub: forward_api(env, &format!("{pstack}-rail-stub")).await,
            env: env.clone(),
            pstack: pstack.to_owned(),
            client_token,
            paydb_url: url,
            _paydb: paydb,
        }
    }

    /// paydb serves TLS only: the harness's own connection and every connection from the cluster's
    /// pods are encrypted (`pg_stat_ssl`), and a connection that asks for none is refused by the
    /// server's `pg_hba.conf`, naming it. The negative control is that refused connection.
    pub async fn check_database_tls(&self) -> Result<String, String> {
        let mine: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&self.db)
            .await
            .map_err(|e| format!("read pg_stat_ssl: {e}"))?;
        if !mine {
            return Err("the harness's connection to paydb is not encrypted".into());
        }
        let (clients, plain): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE NOT s.ssl) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) \
             WHERE a.backend_type = 'client backend' AND a.client_addr IS NOT NULL",
        )
        .fetch_one(&self.db)
        .await
        .map_err(|e| format!("read pg_stat_activity: {e}"))?;
        if plain != 0 || clients < 2 {
            return Err(format!(
                "{plain} of {clients} TCP connections to paydb are not encrypted (the services' pools \
                 and this one expected, all with TLS)"
            ));
        }
        let mut plaintext = self.paydb_url.clone();
        plaintext
            .query_pairs_mut()
            .clear()
            .append_pair("sslmode", "disable");
        match PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect(plaintext.as_str())
            .await
        {
            Ok(_) => Err("paydb accepted a connection without TLS".into()),
            Err(e) if e.to_string().contains("no encryption") => Ok(format!(
                "{clients} TCP connections to paydb, all with TLS; one without TLS refused: {e}"
            )),
            Err(e) => Err(format!(
                "a connection without TLS failed, but not as refused by pg_hba.conf: {e}"
            )),
        }
    }

    /// Creates one payout through payment-resource's API. The only place payouts are made.
    ///
    /// A pod that goes away under the request (a rolling update, a kill: the connection fails, or
    /// the answer is 502, 503 or 504) is not a failure: the same request is sent again, through a
    /// new port-forward, with backoff, until `env.timeout`. The idempotency key makes the repeat
    /// safe: a payout the first attempt created comes back as it is. Any other answer that is not a
    /// success (a 4xx, a 500) is a failure at once.
    pub async fn create_payout(&self, key: &str, account: u32, amount_minor: i64) {
        let body = json!({
            "accountId": format!("00000000-0000-4000-8000-0000000000{account:02}"),
            "amountMinor": amount_minor,
            "currency": "EUR",
            "idempotencyKey": key,
        });
        let deadline = Instant::now() + self.env.timeout;
        let mut backoff = Duration::from_millis(200);
        loop {
            let url = self.payment_resource.lock().await.url("/v1/payouts");
            let sent = self
                .http
                .post(url)
                .bearer_auth(&self.client_token)
                .json(&body)
                .send()
                .await;
            let failure = match sent {
                Ok(resp) if resp.status().is_success() => return,
                Ok(resp) if matches!(resp.status().as_u16(), 502..=504) => resp.status().to_string(),
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    panic!("create payout {key}: {status}: {text}");
                }
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "create payout {key}: still failing after {}s: {failure}",
                self.env.timeout.as_secs()
            );
            log(format!(
                "create payout {key}: {failure}; again through a new port-forward in {}ms",
                backoff.as_millis()
            ));
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            let fresh = forward_api(&self.env, &format!("{}-payment-resource", self.pstack)).await;
            *self.payment_resource.lock().await = fresh;
        }
    }

    /// Payouts `RUN-FROM` ..= `RUN-TO`, over ten accounts.
    pub async fn create_batch(&self, run: &str, from: u32, to: u32) {
        for i in from..=to {
            self.create_payout(&format!("{run}-{i}"), 1 + i % 10, 100 + i64::from(i))
                .await;
        }
    }

    pub async fn counts(&self, run: &str) -> Result<Counts, String> {
        let (posted, failed, total): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'POSTED'),
                    count(*) FILTER (WHERE state IN ('FAILED','ABANDONED')), count(*)
               FROM payout WHERE idempotency_key LIKE $1",
        )
        .bind(run_pattern(run))
        .fetch_one(&self.db)
        .await
        .map_err(|e| format!("count the payouts of {run}: {e}"))?;
        Ok(Counts {
            posted,
            failed,
            total,
        })
    }

    /// Waits until all `n` payouts of `run` are POSTED; panics at once if one failed. Logs a line
    /// whenever the count changes, not per probe.
    pub async fn await_posted(&self, run: &str, n: u32, timeout: Duration) {
        let mut last: Option<Counts> = None;
        poll(&format!("the executors to post {run}"), timeout, async || {
            let c = self.counts(run).await?;
            assert!(
                c.failed == 0,
                "{} payouts of {run} ended FAILED/ABANDONED",
                c.failed
            );
            if last != Some(c) {
                log(format!("{run}: {}/{n} posted", c.posted));
                last = Some(c);
            }
            if c.total == i64::from(n) && c.posted == i64::from(n) {
                Ok(())
            } else {
                Err(c.to_string())
            }
        })
        .await;
    }

    /// The ledger and the rail's ground truth for the payouts of `run`: every payout with one debit
    /// and one credit leg of its amount, every customer account's balance its opening balance plus
    /// its ledger, no payout ACKED twice in rail_submission; and the rail-stub paid none twice and
    /// each of them exactly once. `Err` says which check failed.
    pub async fn check_batch(&self, run: &str) -> Result<(), String> {
        let (unbalanced, drifted, duplicates): (i64, i64, i64) = sqlx::query_as(
            "WITH batch AS (SELECT payout_id, amount_minor FROM payout WHERE idempotency_key LIKE $1),
             legs AS (
               SELECT b.payout_id,
                      count(l.*) FILTER (WHERE l.direction = 'DEBIT')  AS debits,
                      count(l.*) FILTER (WHERE l.direction = 'CREDIT') AS credits,
                      coalesce(sum(l.amount_minor) FILTER (WHERE l.direction = 'DEBIT'), 0)  AS debit_sum,
                      coalesce(sum(l.amount_minor) FILTER (WHERE l.direction = 'CREDIT'), 0) AS credit_sum,
                      b.amount_minor
                 FROM batch b LEFT JOIN ledger_entry l ON l.payout_id = b.payout_id
                GROUP BY b.payout_id, b.amount_minor)
             SELECT
               (SELECT count(*) FROM legs WHERE debits <> 1 OR credits <> 1
                                             OR debit_sum <> amount_minor OR credit_sum <> amount_minor),
               (SELECT count(*) FROM account a WHERE a.kind = 'CUSTOMER' AND a.balance_minor <>
                    a.opening_balance_minor
                    - coalesce((SELECT sum(amount_minor) FROM ledger_entry l WHERE l.account_id = a.account_id AND l.direction = 'DEBIT'), 0)
                    + coalesce((SELECT sum(amount_minor) FROM ledger_entry l WHERE l.account_id = a.account_id AND l.direction = 'CREDIT'), 0)),
               (SELECT count(*) FROM (SELECT s.payout_id FROM rail_submission s JOIN batch b USING (payout_id)
                                       WHERE s.outcome = 'ACKED' GROUP BY s.payout_id HAVING count(*) > 1) d)",
        )
        .bind(run_pattern(run))
        .fetch_one(&self.db)
        .await
        .map_err(|e| format!("read the ledger of {run}: {e}"))?;
        log(format!(
            "{run}: payouts with unbalanced legs: {unbalanced}; customer accounts off their ledger: \
             {drifted}; payouts acked twice in rail_submission: {duplicates}"
        ));
        if unbalanced != 0 || drifted != 0 || duplicates != 0 {
            return Err(format!("the ledger of {run} is wrong"));
        }
        // The rail's own record of what it paid: every payout of the batch paid exactly once.
        let report: Value = self
            .http
            .get(self.rail_stub.url("/v1/received"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("GET the rail-stub's /v1/received: {e}"))?
            .json()
            .await
            .map_err(|e| format!("the rail-stub's /v1/received: {e}"))?;
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT payout_id::text FROM payout WHERE idempotency_key LIKE $1")
                .bind(run_pattern(run))
                .fetch_all(&self.db)
                .await
                .map_err(|e| format!("read the payout ids of {run}: {e}"))?;
        let paid_twice = report["paidTwice"].as_array().map_or(0, Vec::len);
        let paid_once = ids
            .iter()
            .filter(|id| report["perPayout"][id.as_str()]["paid"].as_i64() == Some(1))
            .count();
        log(format!(
            "{run}: rail-stub paid {paid_once}/{} of them exactly once; paid twice (any run): {paid_twice}",
            ids.len()
        ));
        if paid_twice != 0 {
            return Err(format!(
                "the rail paid {paid_twice} payouts twice: {}",
                report["paidTwice"]
            ));
        }
        if paid_once != ids.len() {
            return Err(format!("the rail did not pay every payout of {run} exactly once"));
        }
        Ok(())
    }

    /// The payout under idempotency key `key`.
    pub async fn payout(&self, key: &str) -> Victim {
        let (payout_id, account_id, amount_minor): (String, String, i64) = sqlx::query_as(
            "SELECT payout_id::text, account_id::text, amount_minor FROM payout WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_one(&self.db)
        .await
        .unwrap_or_else(|e| panic!("read payout {key}: {e}"));
        Victim {
            payout_id,
            account_id,
            amount_minor,
        }
    }

    /// Pays `victim` straight at the rail-stub under `key`, bypassing rail-proxy's fence, as an
    /// unfenced stale holder would.
    pub async fn pay_at_rail(&self, key: &str, victim: &Victim) {
        let body = json!({
            "idempotencyKey": key,
            "payoutId": victim.payout_id,
            "accountId": victim.account_id,
            "amountMinor": victim.amount_minor,
            "currency": "EUR",
        });
        self.http
            .post(self.rail_stub.url("/v1/payments"))
            .json(&body)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .unwrap_or_else(|e| panic!("pay {} at the rail-stub: {e}", victim.payout_id));
    }
}
