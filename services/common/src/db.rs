//! The PostgreSQL pool every service with a database opens the same way, and its flags: one name
//! for each setting across the services (`--db-max-connections`, `--db-acquire-timeout-ms`).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

/// Which of the two histories a database carries (C1 §1.1): lockdb and paydb are always separate
/// instances. The one definition of their names, shared by the operator and the test kit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum History {
    Lockdb,
    Paydb,
}

impl History {
    /// Database name, history folder name and component label.
    pub fn name(self) -> &'static str {
        match self {
            History::Lockdb => "lockdb",
            History::Paydb => "paydb",
        }
    }

    /// The application role the migrations create and the owning service logs in as.
    pub fn app_role(self) -> &'static str {
        match self {
            History::Lockdb => "lockapp",
            History::Paydb => "payapp",
        }
    }
}

/// Pool settings, flattened into each service's command line.
#[derive(Debug, Clone, clap::Args)]
pub struct PoolArgs {
    /// Largest number of database connections.
    #[arg(
        long,
        env = "DB_MAX_CONNECTIONS",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..=1000),
        // The names these had before they were one convention; kept so existing deployments start.
        alias = "db-pool-size",
        alias = "max-connections"
    )]
    pub db_max_connections: u32,

    /// Milliseconds a request waits for a free connection before answering 503.
    #[arg(
        long,
        env = "DB_ACQUIRE_TIMEOUT_MS",
        default_value_t = 5_000,
        value_parser = clap::value_parser!(u64).range(1..=600_000)
    )]
    pub db_acquire_timeout_ms: u64,
}

impl PoolArgs {
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.db_acquire_timeout_ms)
    }
}

/// A database URL that cannot be used; the URL in the message has its password removed.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("the database URL must start with postgres:// or postgresql://: {0}")]
    Scheme(String),
    #[error("the database URL is not a PostgreSQL URL ({url}): {source}")]
    Parse {
        url: String,
        #[source]
        source: sqlx::Error,
    },
}

/// A lazy pool: connections open on first use, so a service starts (and its `/readyz` says 503)
/// while its database is still down. Fails only on a URL that is not a PostgreSQL URL (sqlx
/// itself ignores the scheme, so it is checked here: a wrong URL fails at start, not at first use).
pub fn lazy_pool(
    database_url: &str,
    application_name: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, UrlError> {
    if !["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| database_url.starts_with(scheme))
    {
        return Err(UrlError::Scheme(redact(database_url)));
    }
    let options = database_url
        .parse::<PgConnectOptions>()
        .map_err(|source| UrlError::Parse {
            url: redact(database_url),
            source,
        })?
        .application_name(application_name);
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        // sqlx's own test pings every connection at every acquire: a round trip to the database
        // before each statement. Only a connection idle for a while is pinged (as HikariCP's
        // "alive bypass window"); one in steady use proves itself, and a statement that meets a
        // broken one fails and closes it.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_WHEN_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(options))
}

/// A pooled connection idle longer than this is pinged before it is handed out.
pub const PING_WHEN_IDLE_FOR: Duration = Duration::from_millis(500);

/// The database (or the way to it) is going or gone, rather than the statement being wrong: no
/// connection to be had (`PoolTimedOut`, `PoolClosed`), the connection broke (`Io`), or the server
/// said so itself ([`unavailable_sqlstate`]). Every service answers these 503 `UNAVAILABLE`, for
/// the client to retry; any other database error is a 500.
pub fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => unavailable_sqlstate(db.code().as_deref()),
        _ => false,
    }
}

/// SQLSTATE classes 08 (connection exception) and 57P (operator intervention: the server shutting
/// down, a connection an administrator terminated — as a restore's `DROP DATABASE … WITH (FORCE)`
/// does —, the database starting up). Not the rest of class 57 (`57014`, a cancelled statement),
/// not a deadlock (`40P01`), not a constraint.
pub fn unavailable_sqlstate(code: Option<&str>) -> bool {
    code.is_some_and(|c| c.starts_with("08") || c.starts_with("57P"))
}

/// `url` without its password (`postgres://***@host/db`), for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***{}", &url[..scheme], &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        pool: PoolArgs,
    }

    #[test]
    fn one_name_for_each_setting_and_the_old_names_still_start() {
        let c = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(c.pool.db_max_connections, 16);
        assert_eq!(c.pool.acquire_timeout(), Duration::from_secs(5));
        for flag in ["--db-max-connections", "--db-pool-size", "--max-connections"] {
            let c = Cli::try_parse_from(["x", flag, "7"]).unwrap();
            assert_eq!(c.pool.db_max_connections, 7, "{flag}");
        }
        for bad in [
            &["--db-max-connections", "0"][..],
            &["--db-acquire-timeout-ms", "0"],
            &["--db-max-connections", "-1"],
        ] {
            let mut args = vec!["x"];
            args.extend_from_slice(bad);
            assert!(
                Cli::try_parse_from(args).is_err(),
                "{bad:?} must be refused, not clamped"
            );
        }
    }

    #[test]
    fn redacts_the_password() {
        assert_eq!(
            redact("postgres://payapp:secret@db:5432/paydb"),
            "postgres://***@db:5432/paydb"
        );
        assert_eq!(redact("postgres://db/paydb"), "postgres://db/paydb");
    }

    #[tokio::test]
    async fn a_url_that_is_not_postgres_is_refused_before_any_connection() {
        let e = lazy_pool("mysql://u:hunter2@y/z", "t", 1, Duration::from_secs(1)).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let pool = lazy_pool("postgres://u@127.0.0.1:1/db", "t", 1, Duration::from_secs(1)).unwrap();
        assert_eq!(pool.size(), 0, "lazy: nothing connected yet");
    }

    #[test]
    fn a_terminated_or_shutting_down_database_is_unavailable_and_a_bad_statement_is_not() {
        for code in ["57P01", "57P02", "57P03", "08006", "08003"] {
            assert!(unavailable_sqlstate(Some(code)), "{code}");
        }
        for code in ["23503", "23505", "40P01", "42601", "57014"] {
            assert!(!unavailable_sqlstate(Some(code)), "{code}");
        }
        assert!(!unavailable_sqlstate(None));
        assert!(unavailable(&sqlx::Error::PoolTimedOut));
        assert!(!unavailable(&sqlx::Error::RowNotFound));
    }
}
