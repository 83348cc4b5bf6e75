//! The test support of the workspace — dev-only: no shipped binary links it (tests/shipped.rs checks
//! the Dockerfile's binaries). Real PostgreSQL 16 and etcd for tests and for the local demo, the
//! services as real processes ([`procs`], [`stack`]), metric scraping with one rule ([`metrics`]),
//! waiting on conditions ([`wait`]).
//!
//! - [`pg::PgServer`] runs one `postgres` process on a free loopback port, as an unprivileged user
//!   when we are root (postgres refuses to run as root). It dies with the process that started it.
//!   Streaming standbys (pg_basebackup), promotion, a standby held behind, base backups and copies
//!   of PGDATA restored in place are its methods too.
//! - [`lockdb`] / [`paydb`] give each test its own database, cloned from a template that holds the
//!   migrated history plus the synthetic seed ([`demo_dirs`]), on two *separate* servers (C1 §1.1:
//!   never one instance for both).
//!
//! Binaries: `DLOCK_PG_BIN` names a folder with initdb and postgres (and pg_basebackup, pg_ctl and
//! psql for replication); otherwise `$DLOCK_TOOLS_DIR/pg16/bin` (default `/var/tmp/dlock-tools`),
//! the full PostgreSQL 16.15 build `scripts/setup.sh` installs.

#![allow(unsafe_code)] // pg.rs: prctl(PR_SET_PDEATHSIG) and atexit, both documented there

pub mod cpu;
pub mod etcd;
pub mod metrics;
pub mod openapi;
pub mod pg;
pub mod procs;
pub mod served;
pub mod stack;
pub mod wait;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

pub use pg::{PgError, PgServer, psql_path, tool_path};

pub use dlock_common::db::History;

/// One test per lock backend: for each scenario `name`, a module `name` holding the tests `postgres`
/// and `etcd`, which call `super::name(<that backend's argument>)`. The arguments are written as
/// seen from inside that module (`super::LockBackend::Postgres`, or plain values).
///
/// ```ignore
/// dlock_testkit::on_both_backends!(postgres: super::LockBackend::Postgres, etcd: super::LockBackend::Etcd;
///     first_scenario, second_scenario);
/// ```
#[macro_export]
macro_rules! on_both_backends {
    (postgres: $pg:expr, etcd: $etcd:expr; $($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($pg).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                super::$name($etcd).await;
            }
        }
    )+};
}

/// The repository's `migrations/` folder (or `DLOCK_MIGRATIONS_DIR`).
pub fn migrations_root() -> PathBuf {
    std::env::var_os("DLOCK_MIGRATIONS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations")))
}

/// The production history of `history` (schema only).
pub fn migrations_dir(history: History) -> PathBuf {
    migrations_root().join(history.name())
}

/// The synthetic-data location of a history, applied on top of [`migrations_dir`] only by the demo,
/// the tests and the benchmarks (`migrations/paydb-seed`; lockdb has none).
pub fn seed_dir(history: History) -> Option<PathBuf> {
    match history {
        History::Lockdb => None,
        History::Paydb => Some(migrations_root().join("paydb-seed")),
    }
}

/// Every location a demo / test database of `history` is migrated from: the production history,
/// then its seed.
pub fn demo_dirs(history: History) -> Vec<PathBuf> {
    std::iter::once(migrations_dir(history))
        .chain(seed_dir(history))
        .collect()
}

static LOCKDB_SERVER: OnceLock<PgServer> = OnceLock::new();
static PAYDB_SERVER: OnceLock<PgServer> = OnceLock::new();
static TEMPLATES: tokio::sync::Mutex<Vec<History>> = tokio::sync::Mutex::const_new(Vec::new());
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// The process-wide server for one history (started on first use).
pub fn server(history: History) -> &'static PgServer {
    let cell = match history {
        History::Lockdb => &LOCKDB_SERVER,
        History::Paydb => &PAYDB_SERVER,
    };
    cell.get_or_init(|| match PgServer::start(history.name()) {
        Ok(s) => s,
        // Tests cannot do anything useful without the database; say why loudly.
        Err(e) => panic!("cannot start PostgreSQL 16 for {}: {e}", history.name()),
    })
}

/// A database of its own for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    pub name: String,
    pub port: u16,
    pub history: History,
}

impl TestDb {
    /// As the superuser `postgres` (for setup and for negative-control statements).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, self.name)
    }

    /// As the application role (lockapp / payapp), as the services connect.
    pub fn app_url(&self) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}",
            self.history.app_role(),
            self.port,
            self.name
        )
    }

    pub async fn admin_pool(&self) -> PgPool {
        pool(&self.admin_url()).await
    }

    pub async fn app_pool(&self) -> PgPool {
        pool(&self.app_url()).await
    }

    /// One application connection, handed out without a ping: after
    /// [`TestDb::terminate_app_connections`] the next statement on it meets the terminated backend,
    /// as a service's steadily used connection does.
    pub async fn one_unpinged_app_connection(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect(&self.app_url())
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.app_url()))
    }

    /// Terminates every connection of the application role to this database, as an administrator
    /// (or a restore's `DROP DATABASE … WITH (FORCE)`) does; panics unless there was one and each
    /// went.
    pub async fn terminate_app_connections(&self) {
        let admin = self.admin_pool().await;
        let terminated: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
              WHERE datname = current_database() AND usename = $1",
        )
        .bind(self.history.app_role())
        .fetch_all(&admin)
        .await
        .unwrap_or_else(|e| panic!("terminate {}'s connections: {e}", self.history.app_role()));
        admin.close().await;
        assert!(
            !terminated.is_empty() && terminated.iter().all(|t| *t),
            "terminated {terminated:?}"
        );
    }

    /// One digest per table (every row, ordered) and per sequence (its last value), as
    /// `(name, digest)`: two equal digests mean nothing in the database changed (what a refused
    /// request must leave behind).
    pub async fn digest(&self) -> Vec<(String, String)> {
        use sqlx::Row;
        let pool = self.admin_pool().await;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables \
             WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .expect("list tables");
        let mut out = Vec::new();
        for t in tables {
            // `t` is a quote_ident-ed name read from the catalogue, not input.
            let digest: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT md5(coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')) FROM {t} x"
            )))
            .fetch_one(&pool)
            .await
            .expect("digest a table");
            out.push((t, digest.unwrap_or_default()));
        }
        let seqs = sqlx::query(
            "SELECT schemaname || '.' || sequencename AS name, coalesce(last_value, 0)::text AS v \
             FROM pg_sequences ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .expect("list sequences");
        for s in seqs {
            out.push((s.get("name"), s.get("v")));
        }
        pool.close().await;
        out
    }
}

async fn pool(url: &str) -> PgPool {
    let opts: PgConnectOptions = url.parse().unwrap_or_else(|e| panic!("bad url {url}: {e}"));
    PgPoolOptions::new()
        .max_connections(20)
        .connect_with(opts)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// A fresh, migrated lockdb on the lockdb server.
pub async fn lockdb() -> TestDb {
    migrated(History::Lockdb).await
}

/// A fresh, migrated paydb on the paydb server (a different PostgreSQL instance from lockdb).
pub async fn paydb() -> TestDb {
    migrated(History::Paydb).await
}

/// A fresh, empty database (no migrations) on the given history's server.
pub async fn blank(history: History) -> TestDb {
    let srv = server(history);
    let name = next_name("blank");
    admin_exec(srv.port, "postgres", &format!("CREATE DATABASE {name}")).await;
    TestDb {
        name,
        port: srv.port,
        history,
    }
}

fn next_name(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, Ordering::Relaxed)
    )
}

async fn migrated(history: History) -> TestDb {
    let srv = server(history);
    let template = format!("template_{}", history.name());
    {
        let mut done = TEMPLATES.lock().await;
        if !done.contains(&history) {
            admin_exec(srv.port, "postgres", &format!("CREATE DATABASE {template}")).await;
            let mut conn = connect(srv.port, &template).await;
            // Test databases carry the synthetic seed (settlement accounts the tests rely on).
            let files = dlock_migrate::load_dirs(&demo_dirs(history))
                .unwrap_or_else(|e| panic!("load {} migrations: {e}", history.name()));
            dlock_migrate::migrate(&mut conn, &files)
                .await
                .unwrap_or_else(|e| panic!("migrate {template}: {e}"));
            // CREATE DATABASE ... TEMPLATE needs the template to have no connections.
            let _ = conn.close().await;
            done.push(history);
        }
    }
    let name = next_name(history.name());
    admin_exec(
        srv.port,
        "postgres",
        &format!("CREATE DATABASE {name} TEMPLATE {template}"),
    )
    .await;
    TestDb {
        name,
        port: srv.port,
        history,
    }
}

/// A migrated database of `history` on a server of the test's own (a primary it will fail over, a
/// lockdb it will restore), named after the history.
pub async fn migrated_on(server: &PgServer, history: History) -> TestDb {
    // The one "create the database, migrate it" of the project (served.rs), panicking as tests do.
    served::create(server, history)
        .await
        .unwrap_or_else(|e| panic!("{} on port {}: {e:#}", history.name(), server.port));
    TestDb {
        name: history.name().to_owned(),
        port: server.port,
        history,
    }
}

async fn connect(port: u16, db: &str) -> PgConnection {
    let url = format!("postgres://postgres@127.0.0.1:{port}/{db}");
    PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

async fn admin_exec(port: u16, db: &str, sql: &str) {
    // Concurrent CREATE DATABASE from one template can collide briefly; retry that case only.
    for attempt in 0.. {
        let mut conn = connect(port, db).await;
        match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await {
            Ok(_) => return,
            Err(e) if attempt < 50 && e.to_string().contains("being accessed by other users") => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{sql}: {e}"),
        }
    }
}
