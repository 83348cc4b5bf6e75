//! The dlock payments stack as real processes on loopback — lock-server, rail-stub, rail-proxy,
//! payment-resource and any number of payout-executors — plus the HTTP probes the proof needs
//! (metrics scraping, the rail's ground truth, reconciliation, lock status, process state).
//!
//! Used by payout-executor's cross-process proof tests and by the `dlock` command (demo, drill,
//! benchmarks); like the rest of this crate, no shipped binary links it (tests/shipped.rs). The caller
//! brings the two databases (separate PostgreSQL 16 instances, C1 §1.1) as URLs for the app roles
//! (lockapp / payapp); binaries are found by [`crate::procs::binary`] (next to the running
//! executable, or in `DLOCK_BIN_DIR`). With [`LockBackend::Etcd`] the locks live in a real
//! single-member etcd the stack starts itself (lock-server `--backend etcd`), and no lockdb is used;
//! paydb stays PostgreSQL either way. Grants are signed with a key pair generated for each run
//! ([`StackOptions::grant_key`]): lock-server gets the private key, the resources the public one,
//! all through the environment.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::etcd::EtcdCluster;
use crate::metrics::metric_value;
use crate::pg::tls::{ServerCert, TestCa, client_trusting};
use crate::procs::{Service, Spec};
use anyhow::{Context, Result, anyhow, bail};
use dlock_client::{ClientConfig, LockClient, LockView};
use dlock_common::grant::{PUBLIC_KEYS_ENV, SIGNING_KEY_ENV};
use dlock_grant::{KeyId, PublicKeys, SigningKey};
use serde_json::{Value, json};
use uuid::Uuid;

use payout_executor::model::Payout;

/// Where lock-server keeps sessions and grants (also `dlock demo --backend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LockBackend {
    /// lockdb on PostgreSQL 16 (C1's statements): the default.
    #[default]
    Postgres,
    /// A real single-member etcd on loopback (`--backend etcd`), started with the stack.
    Etcd,
}

impl LockBackend {
    /// The value of lock-server's `--backend`.
    pub fn name(self) -> &'static str {
        match self {
            LockBackend::Postgres => "postgres",
            LockBackend::Etcd => "etcd",
        }
    }
}

impl std::fmt::Display for LockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to start the stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Where each process writes `<name>.log`.
    pub log_dir: PathBuf,
    /// lock-server's store. With [`StackOptions::lock_server_url`] it only names the backend of that
    /// outside server (nothing is started for it).
    pub lock_backend: LockBackend,
    /// `rail.proxy.fencing.enabled` (the kill switch of (d)).
    pub rail_fencing: bool,
    /// `payment.fencing.enabled` (the kill switch of (a)(b)(c)).
    pub payment_fencing: bool,
    /// Use this lock-server instead of starting the binary (e.g. one running in-process).
    pub lock_server_url: Option<String>,
    /// rail-proxy's timeout for its one forward.
    pub rail_timeout_ms: u64,
    /// Start rail-stub with `--test-mode`, so that [`Stack::set_rail_behaviour`] works.
    pub rail_stub_test_mode: bool,
    /// rail-proxy's abandonment deadline (`--abandon-after-ms`); `None`: its default.
    pub rail_abandon_after_ms: Option<u64>,
    /// Extra rail-proxy arguments (e.g. fault injection).
    pub rail_proxy_args: Vec<String>,
    /// The grant signing key of this run (fresh in [`StackOptions::new`]): lock-server signs with
    /// it (a lock-server of [`StackOptions::lock_server_url`] must be given it too), and the
    /// resources trust its public key plus [`StackOptions::extra_public_keys`].
    pub grant_key: SigningKey,
    /// Whether lock-server signs grants at all (a bench row without signing).
    pub grant_signing: bool,
    /// `PAYMENT_GRANT_VERIFICATION_ENABLED` / `RAIL_PROXY_GRANT_VERIFICATION_ENABLED`.
    pub grant_verification: bool,
    /// More public keys the resources trust besides the run's own (a rotation in a test).
    pub extra_public_keys: PublicKeys,
    /// HTTPS on every API (a CA made for the run, a certificate per server, every client trusting
    /// that CA alone: [`StackTls::new`]); `None`: plain HTTP, asked for with `--plaintext`. A
    /// lock-server of [`StackOptions::lock_server_url`] serves with [`StackTls::serve_lock_server`].
    pub tls: Option<std::sync::Arc<StackTls>>,
    /// Start the services from this folder's binaries instead of this build's (a benchmark's
    /// A/B against a base build); `None`: [`crate::procs::binary`]'s search.
    pub bin_dir: Option<PathBuf>,
    /// Lock clients authenticated (docs/lock-api.md, "Authentication"): the lock-server this stack
    /// starts gets a clients file with one client, `stack`, that may lock, read and watch the
    /// `account:` keys for owner ids starting with this prefix; the stack's own lock client and its
    /// executors present that client's token ([`StackCredentials::lock`]). `None`: lock-server
    /// answers anyone (and says so at start-up).
    pub lock_client_owner_prefix: Option<String>,
}

/// The run's CA and the certificate of each server, when [`StackOptions::tls`] is on.
#[derive(Debug)]
pub struct StackTls {
    ca: TestCa,
    rail_stub: ServerCert,
    rail_proxy: ServerCert,
    payment: ServerCert,
    lock_server: ServerCert,
    /// Certificates valid from a day ago ([`StackTls::new_backdated`]).
    backdated: bool,
}

/// One of the servers a [`StackTls`] holds a certificate for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackServer {
    LockServer,
    PaymentResource,
    RailProxy,
    RailStub,
}

/// The names every certificate of a stack is valid for: the servers listen on loopback.
const STACK_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

impl StackTls {
    pub fn new() -> Result<std::sync::Arc<Self>> {
        Self::issued(false).map(std::sync::Arc::new)
    }

    /// As [`StackTls::new`], but every certificate valid from a day ago
    /// ([`TestCa::issue_backdated`]): for a run that sets a client's wall clock back (the fault
    /// campaign's clock nemesis, minutes behind), which would refuse a certificate issued a
    /// moment ago as not valid yet. Needs libfaketime.
    pub fn new_backdated() -> Result<std::sync::Arc<Self>> {
        Self::issued(true).map(std::sync::Arc::new)
    }

    fn issued(backdated: bool) -> Result<Self> {
        let ca = TestCa::new("stack").context("the stack's CA")?;
        let issue = |stem: &str| Self::issue_by(&ca, backdated, stem, &STACK_NAMES);
        Ok(Self {
            rail_stub: issue("rail-stub")?,
            rail_proxy: issue("rail-proxy")?,
            payment: issue("payment-resource")?,
            lock_server: issue("lock-server")?,
            ca,
            backdated,
        })
    }

    fn issue_by(ca: &TestCa, backdated: bool, stem: &str, names: &[&str]) -> Result<ServerCert> {
        let cert = if backdated {
            ca.issue_backdated(stem, names)
        } else {
            ca.issue(stem, names)
        };
        cert.with_context(|| format!("{stem}'s certificate"))
    }

    /// One more server certificate of the run's CA for loopback (`127.0.0.1`, `localhost`), dated
    /// as the others: for a server of the run besides the stack's four (a proxy in front of them).
    pub fn issue(&self, file_stem: &str) -> Result<ServerCert> {
        Self::issue_by(&self.ca, self.backdated, file_stem, &STACK_NAMES)
    }

    /// The CA certificate every server's is signed by: what the clients trust.
    pub fn ca_file(&self) -> &Path {
        self.ca.cert()
    }

    /// `spec` serving HTTPS with the run's certificate of `server`.
    pub fn serve_as(&self, server: StackServer, spec: Spec) -> Spec {
        let cert = match server {
            StackServer::LockServer => &self.lock_server,
            StackServer::PaymentResource => &self.payment,
            StackServer::RailProxy => &self.rail_proxy,
            StackServer::RailStub => &self.rail_stub,
        };
        spec.https(cert, self.ca.cert())
    }

    /// A lock-server started outside the stack ([`StackOptions::lock_server_url`]) serving HTTPS
    /// with the run's lock-server certificate.
    pub fn serve_lock_server(&self, spec: Spec) -> Spec {
        spec.https(&self.lock_server, self.ca.cert())
    }

    /// `spec` serving HTTPS with `cert`, if there is a [`StackTls`].
    fn serve(tls: Option<&Self>, spec: Spec, cert: impl Fn(&Self) -> &ServerCert) -> Spec {
        match tls {
            Some(t) => spec.https(cert(t), t.ca.cert()),
            None => spec,
        }
    }
}

/// The credentials of one stack, generated fresh for every start. Services receive them through
/// the environment, never on their command lines.
#[derive(Clone)]
pub struct StackCredentials {
    pub admin: String,
    pub executor: String,
    pub client: String,
    pub rail_executor: String,
    /// The lock client token, when lock clients are authenticated
    /// ([`StackOptions::lock_client_owner_prefix`]).
    pub lock: Option<String>,
}

impl std::fmt::Debug for StackCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StackCredentials(<redacted>)")
    }
}

impl StackCredentials {
    fn generate(opts: &StackOptions) -> Self {
        let fresh = |role: &str| format!("{role}-{}", Uuid::new_v4().simple());
        Self {
            admin: fresh("admin"),
            executor: fresh("executor"),
            client: fresh("client"),
            rail_executor: fresh("rail-executor"),
            // Two UUIDs: a lock client token is at least 32 bytes.
            lock: opts
                .lock_client_owner_prefix
                .as_ref()
                .map(|_| format!("{}{}", fresh("lock"), Uuid::new_v4().simple())),
        }
    }
}

/// A lock-server clients file in `dir` with one client, `stack`, holding `token`: it may lock, read
/// and watch the keys starting with `key_prefix`, for owner ids starting with `owner_prefix`.
pub fn lock_clients_file(dir: &Path, key_prefix: &str, owner_prefix: &str, token: &str) -> Result<PathBuf> {
    let path = dir.join("lock-clients.json");
    let body = json!({"clients": [{
        "name": "stack",
        "token": token,
        "keyPrefixes": [key_prefix],
        "ownerPrefixes": [owner_prefix],
        "operations": ["lock", "read", "watch"],
    }]});
    std::fs::write(&path, body.to_string()).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

impl StackOptions {
    pub fn new(log_dir: impl Into<PathBuf>) -> Self {
        Self {
            log_dir: log_dir.into(),
            lock_backend: LockBackend::Postgres,
            rail_fencing: true,
            payment_fencing: true,
            lock_server_url: None,
            rail_timeout_ms: 2_000,
            rail_stub_test_mode: false,
            rail_abandon_after_ms: None,
            rail_proxy_args: Vec::new(),
            grant_key: SigningKey::generate(run_key_id()),
            grant_signing: true,
            grant_verification: true,
            extra_public_keys: PublicKeys::default(),
            tls: None,
            bin_dir: None,
            lock_client_owner_prefix: None,
        }
    }

    /// A service of this stack: its binary from [`StackOptions::bin_dir`] when set.
    fn spec(&self, name: &str, binary: &str) -> Result<Spec, crate::procs::ProcError> {
        Ok(Spec::new(name, binary)?.bin_dir(self.bin_dir.clone()))
    }

    /// The public keys the resources of this stack trust.
    pub fn public_keys(&self) -> Result<PublicKeys> {
        let keys = std::iter::once(self.grant_key.public_key())
            .chain(self.extra_public_keys.iter().cloned())
            .collect();
        PublicKeys::new(keys).context("the stack's public keys")
    }

    /// The verification settings of payment-resource and rail-proxy: `--grant-verification-enabled`
    /// and, when on, the public keys in the environment.
    fn grant_settings(&self, spec: Spec) -> Result<Spec> {
        let spec = spec.args([
            "--grant-verification-enabled".to_owned(),
            self.grant_verification.to_string(),
        ]);
        Ok(if self.grant_verification {
            spec.env(PUBLIC_KEYS_ENV, self.public_keys()?.to_text())
        } else {
            spec
        })
    }
}

/// The key id of a run's key: `run-` and a few random hex digits, so that two runs' keys differ in
/// name as in value.
fn run_key_id() -> KeyId {
    let id = format!("run-{}", &Uuid::new_v4().simple().to_string()[..8]);
    KeyId::new(&id).unwrap_or_else(|| unreachable!("run-<8 hex> is a valid key id"))
}

/// An account as payment-resource reports it (recomputed from the ledger), and the rail stub's
/// ground truth (`GET /v1/received`): the services' own bodies, from the wire crate.
pub use dlock_wire::payment::Account;
pub use dlock_wire::stub::{
    PayoutCount as RailPayoutCount, Received as RailRequest, ReceivedReport as RailReceived,
};

/// The running stack.
#[derive(Debug)]
pub struct Stack {
    /// `None` when [`StackOptions::lock_server_url`] named an outside lock-server.
    pub lock_server: Option<Service>,
    /// How the stack started its lock-server, for [`Stack::restart_lock_server_same_port`].
    lock_server_spec: Option<Spec>,
    pub rail_stub: Service,
    pub rail_proxy: Service,
    pub payment: Service,
    /// The etcd member the locks live in ([`LockBackend::Etcd`] with a lock-server of our own).
    /// Declared after the services, so that it is dropped after lock-server has stopped.
    pub etcd: Option<EtcdCluster>,
    pub lock_backend: LockBackend,
    pub lock_url: String,
    pub log_dir: PathBuf,
    pub credentials: StackCredentials,
    /// The run's grant key (tests sign grants of their own with it, or forge around it).
    pub grant_key: SigningKey,
    /// How the resources were started with respect to grants ([`Stack::restart_rail_proxy`] keeps it).
    grant_opts: StackOptions,
    paydb_url: String,
    /// The CA and certificates of an HTTPS stack; kept for the processes restarted later.
    tls: Option<std::sync::Arc<StackTls>>,
    http: reqwest::Client,
    lock: LockClient,
}

impl Stack {
    /// Starts every service and waits until each answers `/readyz`. `lockdb_url` is used only by
    /// a lock-server of our own on [`LockBackend::Postgres`]. On [`LockBackend::Etcd`], call it
    /// from a thread that outlives the stack (the runtime's `block_on` thread, as the tests and
    /// `dlock` do): the etcd member dies with the thread that started it.
    pub async fn start(lockdb_url: &str, paydb_url: &str, opts: &StackOptions) -> Result<Self> {
        let dir = opts.log_dir.as_path();
        let tls = opts.tls.clone();
        let mut stub =
            opts.spec("rail-stub", "rail-stub")?
                .args(["--listen", "127.0.0.1:{port}", "--mode", "ack"]);
        if opts.rail_stub_test_mode {
            stub = stub.arg("--test-mode");
        }
        let rail_stub = Service::start(StackTls::serve(tls.as_deref(), stub, |t| &t.rail_stub), dir).await?;
        let credentials = StackCredentials::generate(opts);
        let rail_proxy = Service::start(
            rail_proxy_spec(
                "rail-proxy",
                paydb_url,
                &rail_stub.url(),
                opts,
                opts.rail_fencing,
                &credentials,
                tls.as_deref(),
            )?
            .args(opts.rail_proxy_args.iter().cloned()),
            dir,
        )
        .await?;
        // The grant settings are `serve`'s: after the subcommand.
        let payment = opts
            .grant_settings(opts.spec("payment-resource", "payment-resource")?.args([
                "serve".to_owned(),
                "--database-url".to_owned(),
                paydb_url.to_owned(),
                "--listen".to_owned(),
                "127.0.0.1:{port}".to_owned(),
                "--fencing-enabled".to_owned(),
                opts.payment_fencing.to_string(),
            ]))?
            .env("PAYMENT_RESOURCE_ADMIN_TOKEN", &credentials.admin)
            .env("PAYMENT_RESOURCE_EXECUTOR_TOKEN", &credentials.executor)
            .env("PAYMENT_RESOURCE_CLIENT_TOKEN", &credentials.client);
        let payment = Service::start(StackTls::serve(tls.as_deref(), payment, |t| &t.payment), dir).await?;
        let mut lock_server_spec = None;
        let (lock_server, lock_url, etcd) = match &opts.lock_server_url {
            Some(url) => (None, url.clone(), None),
            None => {
                let (spec, etcd) = match opts.lock_backend {
                    LockBackend::Postgres => (
                        opts.spec("lock-server", "lock-server")?
                            .args(["--database-url", lockdb_url]),
                        None,
                    ),
                    LockBackend::Etcd => {
                        // On this thread, not in `spawn_blocking`: etcd gets PR_SET_PDEATHSIG,
                        // which fires when the *thread* that started it exits, and tokio retires
                        // idle blocking threads after 10 s — etcd would die mid-run. Startup
                        // blocks this thread for about a second.
                        let etcd = EtcdCluster::single().context("start etcd for the locks")?;
                        let spec = opts.spec("lock-server", "lock-server")?.args([
                            "--backend".to_owned(),
                            "etcd".to_owned(),
                            "--etcd-endpoints".to_owned(),
                            etcd.endpoints().join(","),
                        ]);
                        (spec, Some(etcd))
                    }
                };
                let mut spec = spec.args(["--listen", "127.0.0.1:{port}"]);
                if let (Some(prefix), Some(token)) = (&opts.lock_client_owner_prefix, &credentials.lock) {
                    let file = lock_clients_file(dir, "account:", prefix, token)?;
                    spec = spec.args(["--clients-file".to_owned(), file.display().to_string()]);
                }
                if opts.grant_signing {
                    spec = spec.env(SIGNING_KEY_ENV, opts.grant_key.expose_text());
                }
                let spec = StackTls::serve(tls.as_deref(), spec, |t| &t.lock_server);
                lock_server_spec = Some(spec.clone());
                let svc = Service::start(spec, dir).await?;
                let url = svc.url();
                (Some(svc), url, etcd)
            }
        };
        let timeout = Duration::from_secs(30);
        let (http, lock_config) = match &tls {
            Some(t) => (
                client_trusting(t.ca.cert(), timeout)?,
                ClientConfig::default().with_ca_file(t.ca.cert()),
            ),
            None => (
                reqwest::Client::builder().timeout(timeout).build()?,
                ClientConfig::default(),
            ),
        };
        let lock_config = match &credentials.lock {
            Some(token) => lock_config.with_token(token),
            None => lock_config,
        };
        let lock = LockClient::with_config(&lock_url, lock_config)?;
        Ok(Self {
            lock_server,
            lock_server_spec,
            rail_stub,
            rail_proxy,
            payment,
            etcd,
            lock_backend: opts.lock_backend,
            lock_url,
            log_dir: dir.to_path_buf(),
            credentials,
            grant_key: opts.grant_key.clone(),
            grant_opts: opts.clone(),
            paydb_url: paydb_url.to_owned(),
            tls,
            http,
            lock,
        })
    }

    /// The CA every server's certificate is signed by, when the stack serves HTTPS: what its
    /// clients must trust (`--ca-file`, [`ClientConfig::with_ca_file`]).
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca.cert())
    }

    /// An HTTP client for this stack's APIs (trusting its CA alone, when it serves HTTPS).
    pub fn http_client(&self) -> reqwest::Client {
        self.http.clone()
    }

    /// The settings of a lock client of this stack's lock-server (its CA, when HTTPS; the lock
    /// client token, when lock clients are authenticated).
    pub fn lock_client_config(&self) -> ClientConfig {
        let config = match self.ca_file() {
            Some(ca) => ClientConfig::default().with_ca_file(ca),
            None => ClientConfig::default(),
        };
        match &self.credentials.lock {
            Some(token) => config.with_token(token),
            None => config,
        }
    }

    /// A payout-executor against this stack in batch mode (`--exit-when-idle`), owner id `name`.
    /// Add flags, then [`Stack::start_executor`]. Readiness is not awaited: a batch executor may be
    /// done before anyone asks.
    pub fn executor_spec(&self, name: &str) -> Result<Spec> {
        Ok(self
            .service_executor_spec(name)?
            .arg("--exit-when-idle")
            .no_wait())
    }

    /// A long-running payout-executor (until SIGTERM); [`Stack::start_executor`] waits until it
    /// answers `/readyz`.
    pub fn service_executor_spec(&self, name: &str) -> Result<Spec> {
        let spec = self.grant_opts.spec(name, "payout-executor")?;
        let spec = match self.ca_file() {
            Some(ca) => spec.env(payout_executor::config::CA_FILE_ENV, ca.display().to_string()),
            None => spec,
        };
        let spec = match &self.credentials.lock {
            Some(token) => spec.env(payout_executor::config::LOCK_TOKEN_ENV, token),
            None => spec,
        };
        Ok(spec
            .env(
                payout_executor::config::PAYMENT_CREDENTIAL_ENV,
                &self.credentials.executor,
            )
            .env(
                payout_executor::config::RAIL_CREDENTIAL_ENV,
                &self.credentials.rail_executor,
            )
            .args([
                "--lock-server-url".to_owned(),
                self.lock_url.clone(),
                "--payment-resource-url".to_owned(),
                self.payment.url(),
                "--rail-proxy-url".to_owned(),
                self.rail_proxy.url(),
                "--owner-id".to_owned(),
                name.to_owned(),
                "--listen".to_owned(),
                "127.0.0.1:{port}".to_owned(),
            ]))
    }

    /// Starts the stack's lock-server again on the **same port** (same store), after it was stopped:
    /// the end of a lock-server outage, as the executors see it. The new log is
    /// `lock-server-restarted.log`.
    pub async fn restart_lock_server_same_port(&mut self) -> Result<()> {
        let mut spec = self
            .lock_server_spec
            .clone()
            .context("this stack did not start a lock-server")?;
        if let Some(old) = self.lock_server.as_mut() {
            old.stop();
        }
        spec.name = "lock-server-restarted".into();
        self.lock_server = Some(Service::start(spec, &self.log_dir).await?);
        Ok(())
    }

    /// Replaces rail-proxy with a fresh process (same database, rail and credentials; fencing on),
    /// e.g. after a fault made it exit. `extra` adds arguments.
    pub async fn restart_rail_proxy(&mut self, fencing: bool, extra: &[&str]) -> Result<()> {
        self.replace_rail_proxy("rail-proxy-2", None, fencing, extra)
            .await
    }

    /// Replaces rail-proxy with a fresh process on the **same port** (same database, rail and
    /// credentials; fencing as given), so that executors started against the old one reach the new
    /// one: a brief outage of rail-proxy, as the executors see it. The port is free while no
    /// rail-proxy runs; `extra` adds arguments.
    pub async fn restart_rail_proxy_same_port(&mut self, fencing: bool, extra: &[&str]) -> Result<()> {
        let port = self.rail_proxy.port;
        self.replace_rail_proxy("rail-proxy-same-port", Some(port), fencing, extra)
            .await
    }

    async fn replace_rail_proxy(
        &mut self,
        name: &str,
        port: Option<u16>,
        fencing: bool,
        extra: &[&str],
    ) -> Result<()> {
        self.rail_proxy.stop();
        let mut spec = rail_proxy_spec(
            name,
            &self.paydb_url,
            &self.rail_stub.url(),
            &self.grant_opts,
            fencing,
            &self.credentials,
            self.tls.as_deref(),
        )?
        .args(extra.iter().copied());
        if let Some(port) = port {
            spec.port = port;
        }
        self.rail_proxy = Service::start(spec, &self.log_dir).await?;
        Ok(())
    }

    pub async fn start_executor(&self, spec: Spec) -> Result<Service> {
        Ok(Service::start(spec, &self.log_dir).await?)
    }

    async fn json(&self, request: reqwest::RequestBuilder) -> Result<Value> {
        let response = request.send().await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{status}: {body}");
        }
        Ok(body)
    }

    /// A new customer account with a fresh id.
    pub async fn create_account(&self, currency: &str, opening_balance_minor: i64) -> Result<Uuid> {
        let body = self
            .json(
                self.http
                    .post(format!("{}/v1/accounts", self.payment.url()))
                    .bearer_auth(&self.credentials.admin)
                    .json(&json!({"currency": currency, "openingBalanceMinor": opening_balance_minor})),
            )
            .await?;
        serde_json::from_value(body["accountId"].clone()).context("accountId")
    }

    /// A new PENDING payout (random idempotency key).
    pub async fn create_payout(&self, account_id: Uuid, amount_minor: i64, currency: &str) -> Result<Payout> {
        let body = self
            .json(
                self.http
                    .post(format!("{}/v1/payouts", self.payment.url()))
                    .bearer_auth(&self.credentials.client)
                    .json(&json!({
                        "accountId": account_id,
                        "amountMinor": amount_minor,
                        "currency": currency,
                        "idempotencyKey": format!("proof-{}", Uuid::new_v4()),
                    })),
            )
            .await?;
        Ok(serde_json::from_value(body)?)
    }

    pub async fn payout(&self, payout_id: Uuid) -> Result<Payout> {
        let body = self
            .json(
                self.http
                    .get(format!("{}/v1/payouts/{payout_id}", self.payment.url())),
            )
            .await?;
        Ok(serde_json::from_value(body)?)
    }

    pub async fn account(&self, account_id: Uuid) -> Result<Account> {
        let body = self
            .json(
                self.http
                    .get(format!("{}/v1/accounts/{account_id}", self.payment.url())),
            )
            .await?;
        Ok(serde_json::from_value(body)?)
    }

    /// payment-resource's reconciliation report (`clean`, `accounts`, `payouts`).
    pub async fn reconciliation(&self) -> Result<Value> {
        self.json(
            self.http
                .get(format!("{}/v1/reconciliation", self.payment.url()))
                .bearer_auth(&self.credentials.admin),
        )
        .await
    }

    /// Changes the rail stub's default outcome (`ack`, `reject`, `timeout`); needs
    /// [`StackOptions::rail_stub_test_mode`].
    pub async fn set_rail_behaviour(&self, mode: &str) -> Result<()> {
        self.json(
            self.http
                .put(format!("{}/v1/admin/behaviour", self.rail_stub.url()))
                .json(&json!({"mode": mode, "latencyMs": 0})),
        )
        .await
        .map(|_| ())
    }

    /// rail-proxy's record for a payout (`submissions`).
    pub async fn rail_submissions(&self, payout_id: Uuid) -> Result<Value> {
        self.json(
            self.http
                .get(format!("{}/v1/submissions/{payout_id}", self.rail_proxy.url())),
        )
        .await
    }

    pub async fn rail_received(&self) -> Result<RailReceived> {
        let body = self
            .json(self.http.get(format!("{}/v1/received", self.rail_stub.url())))
            .await?;
        Ok(serde_json::from_value(body)?)
    }

    pub async fn lock_status(&self, key: &str) -> Result<LockView> {
        Ok(self.lock.lock_status(key).await?)
    }

    /// The `/metrics` text of the service at `base_url`.
    pub async fn metrics(&self, base_url: &str) -> Result<String> {
        Ok(self
            .http
            .get(format!("{base_url}/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// One sample of the service at `base_url`; a series that is absent reads as 0.
    pub async fn metric(&self, base_url: &str, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        Ok(metric_value(&self.metrics(base_url).await?, name, labels).unwrap_or(0.0))
    }
}

fn rail_proxy_spec(
    name: &str,
    paydb_url: &str,
    rail_url: &str,
    opts: &StackOptions,
    fencing: bool,
    credentials: &StackCredentials,
    tls: Option<&StackTls>,
) -> Result<Spec> {
    let (rail_timeout_ms, abandon_after_ms) = (opts.rail_timeout_ms, opts.rail_abandon_after_ms);
    let mut spec = opts
        .grant_settings(opts.spec(name, "rail-proxy")?)?
        .args([
            "--database-url".to_owned(),
            paydb_url.to_owned(),
            "--listen".to_owned(),
            "127.0.0.1:{port}".to_owned(),
            "--rail-url".to_owned(),
            rail_url.to_owned(),
            "--rail-timeout-ms".to_owned(),
            rail_timeout_ms.to_string(),
            "--fencing-enabled".to_owned(),
            fencing.to_string(),
        ])
        .env("RAIL_PROXY_EXECUTOR_TOKEN", &credentials.rail_executor);
    if let Some(ms) = abandon_after_ms {
        spec = spec.args(["--abandon-after-ms".to_owned(), ms.to_string()]);
    }
    if let Some(t) = tls {
        // The rail (rail-stub) serves HTTPS too, under the same CA.
        spec = spec.env("DLOCK_RAIL_CA_FILE", t.ca.cert().display().to_string());
    }
    Ok(StackTls::serve(tls, spec, |t| &t.rail_proxy))
}

/// The scheduler state letter of a process (`R`, `S`, `T` stopped, `Z`, ...) from `/proc/<pid>/stat`.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// SIGKILL: no cleanup, no release — a crashed holder.
pub fn kill_hard(pid: u32) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(anyhow!("kill -KILL {pid}: {status}"))
    }
}

/// The JSON log lines of a service whose `event` field is `event`.
pub fn log_events(log: &Path, event: &str) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_process_state() {
        // We are running, so not stopped.
        let state = process_state(std::process::id()).unwrap();
        assert!(matches!(state, 'R' | 'S' | 'D'), "{state}");
        assert_eq!(process_state(u32::MAX), None);
    }
}
