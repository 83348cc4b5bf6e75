//! The local stack: PostgreSQL 16 servers and dlock's services as processes on loopback.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use dlock_common::grant::SIGNING_KEY_ENV;
use dlock_grant::{KeyId, SigningKey};
use dlock_testkit::etcd::{EtcdCluster, etcd_bin};
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::served;
use dlock_testkit::stack::{LockBackend, StackTls};
use dlock_testkit::{History, PgServer};

/// Where data and logs go; removed at the end unless something failed or the user named it.
pub struct RunDir {
    path: PathBuf,
    keep: AtomicBool,
}

impl RunDir {
    pub fn new(given: Option<PathBuf>) -> Result<Self> {
        let (path, keep) = match given {
            Some(p) => (p, true),
            None => (
                std::env::temp_dir().join(format!("dlock-run-{}", std::process::id())),
                false,
            ),
        };
        std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(Self {
            path,
            keep: AtomicBool::new(keep),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn keep(&self) {
        self.keep.store(true, Ordering::Relaxed);
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Prints one progress line.
pub fn step(msg: impl AsRef<str>) {
    println!("  · {}", msg.as_ref());
}

/// A PostgreSQL 16 server holding one migrated database.
pub struct Database {
    pub server: PgServer,
    pub history: History,
}

impl Database {
    pub async fn start(history: History) -> Result<Self> {
        Self::start_with(history, &[]).await
    }

    /// [`Database::start`] with extra `-c name=value` settings (a bench's `pg_stat_statements`).
    pub async fn start_with(history: History, settings: &[(&str, &str)]) -> Result<Self> {
        let (server, report) = served::start(&format!("demo-{}", history.name()), settings, history).await?;
        step(format!(
            "{}: PostgreSQL 16 on 127.0.0.1:{} (pid {}), migrations applied: {}",
            history.name(),
            server.port,
            server.pid,
            report.applied.join(", ")
        ));
        Ok(Self { server, history })
    }

    /// URL as the owning service's role (lockapp / payapp).
    pub fn app_url(&self) -> String {
        self.server.url(self.history.app_role(), self.history.name())
    }
}

/// A grant signing key made for this run (never written anywhere but lock-server's environment).
pub fn run_key(id: &str) -> Result<SigningKey> {
    let id = KeyId::new(id).with_context(|| format!("{id:?} is not a key id"))?;
    Ok(SigningKey::generate(id))
}

/// lock-server's environment: the demo admin token and, when given, the grant signing key.
pub fn lock_server_env(spec: Spec, signing: Option<&SigningKey>) -> Spec {
    let spec = spec.env("DLOCK_ADMIN_TOKEN", "demo-admin-token");
    match signing {
        Some(key) => spec.env(SIGNING_KEY_ENV, key.expose_text()),
        None => spec,
    }
}

/// `spec` serving HTTPS with the run's lock-server certificate, when there is a [`StackTls`].
fn serve_lock_server(tls: Option<&StackTls>, spec: Spec) -> Spec {
    match tls {
        Some(t) => t.serve_lock_server(spec),
        None => spec,
    }
}

/// lock-server on lockdb; it signs grants with `signing` (none: unsigned grants); HTTPS with `tls`,
/// else plain HTTP (`--plaintext`).
pub async fn lock_server(
    db: &Database,
    run_dir: &Path,
    extra: &[&str],
    signing: Option<&SigningKey>,
    tls: Option<&StackTls>,
) -> Result<Service> {
    let spec = Spec::new("lock-server", "lock-server")?
        .args(["--database-url", &db.app_url(), "--listen", "127.0.0.1:{port}"])
        .args(extra.iter().copied());
    let spec = serve_lock_server(tls, lock_server_env(spec, signing));
    let svc = Service::start(spec, run_dir).await?;
    step(format!(
        "lock-server on {} (pid {}), backend postgres",
        svc.url(),
        svc.pid()
    ));
    Ok(svc)
}

/// Where the demo's lock-server keeps its locks: lockdb on its own PostgreSQL 16 server, or a
/// single-member etcd on loopback (data on tmpfs).
pub enum LockStore {
    Postgres(Database),
    Etcd(EtcdCluster),
}

impl LockStore {
    pub async fn start(backend: LockBackend) -> Result<Self> {
        match backend {
            LockBackend::Postgres => Ok(Self::Postgres(Database::start(History::Lockdb).await?)),
            LockBackend::Etcd => {
                // On this thread, not in `spawn_blocking`: etcd gets PR_SET_PDEATHSIG, which
                // fires when the *thread* that started it exits, and tokio retires idle blocking
                // threads after 10 s. Startup blocks for about a second, before anything else runs.
                let etcd = EtcdCluster::single().context("start etcd for the locks")?;
                step(format!(
                    "etcd: one member on {} ({}), data on tmpfs",
                    etcd.endpoint(0),
                    etcd_bin().display()
                ));
                Ok(Self::Etcd(etcd))
            }
        }
    }
}

/// lock-server over `store`: [`lock_server`] on lockdb, `--backend etcd` on etcd.
pub async fn lock_server_on(
    store: &LockStore,
    run_dir: &Path,
    extra: &[&str],
    signing: Option<&SigningKey>,
    tls: Option<&StackTls>,
) -> Result<Service> {
    let etcd = match store {
        LockStore::Postgres(db) => return lock_server(db, run_dir, extra, signing, tls).await,
        LockStore::Etcd(etcd) => etcd,
    };
    let spec = Spec::new("lock-server", "lock-server")?
        .args([
            "--backend".to_owned(),
            "etcd".to_owned(),
            "--etcd-endpoints".to_owned(),
            etcd.endpoints().join(","),
            "--listen".to_owned(),
            "127.0.0.1:{port}".to_owned(),
        ])
        .args(extra.iter().copied());
    let spec = serve_lock_server(tls, lock_server_env(spec, signing));
    let svc = Service::start(spec, run_dir).await?;
    step(format!(
        "lock-server on {} (pid {}), backend etcd",
        svc.url(),
        svc.pid()
    ));
    Ok(svc)
}

/// `dlock-dev up`: the stack stays up until Ctrl-C.
pub async fn up(run_dir: &RunDir) -> Result<bool> {
    println!(
        "Starting the dlock stack on loopback (data and logs in {})",
        run_dir.path().display()
    );
    let lockdb = Database::start(History::Lockdb).await?;
    let key = run_key("up")?;
    let ls = lock_server(&lockdb, run_dir.path(), &[], Some(&key), None).await?;
    println!();
    println!("lockdb          {}", lockdb.app_url());
    println!("lock-server     {}   (admin token: demo-admin-token)", ls.url());
    println!(
        "grant key       {}   (public: grants in acquire/renew answers verify with it)",
        key.public_key().to_text()
    );
    println!();
    println!("Try:");
    println!(
        "  curl -s -XPOST {}/v1/sessions -H 'content-type: application/json' -d '{{\"ownerId\":\"me\",\"ttlMs\":60000}}'",
        ls.url()
    );
    println!("  curl -s {}/metrics", ls.url());
    println!("Ctrl-C stops everything.");
    dlock_common::serve::shutdown_signal().await;
    Ok(true)
}
