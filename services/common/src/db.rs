//! The PostgreSQL pool every service with a database opens the same way, and its flags: one name
//! for each setting across the services (`--db-max-connections`, `--db-acquire-timeout-ms`); the
//! one connection of the one-shot programs (the migrator, the fast-forward Job), [`connect`]; and
//! TLS to PostgreSQL for both: `sslmode` / `sslrootcert` in the URL, the CA file checked before
//! anything connects, and a refused server certificate explained in an operator's words
//! ([`explain`]).

use std::path::PathBuf;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{Connection, PgConnection, PgPool};

/// Which of the two histories a database carries (C1 §1.1): lockdb and paydb are always separate
/// instances. The one definition of their names, shared by the operator and the test kit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum History {
    Lockdb,
    Paydb,
}

impl History {
    /// Database name, history folder name and component label.
    pub const fn name(self) -> &'static str {
        match self {
            History::Lockdb => "lockdb",
            History::Paydb => "paydb",
        }
    }

    /// The application role the migrations create and the owning service logs in as.
    pub const fn app_role(self) -> &'static str {
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
    /// `sslrootcert` names a file that cannot serve as the CA of a TLS connection. Found before
    /// anything connects: at start-up for a service (a configuration error), not at first use.
    #[error(
        "sslrootcert={path} (the CA file for TLS to the database) cannot be used: {reason}; it must be a readable PEM file holding the certificate of the CA that signed the database server's certificate"
    )]
    RootCert { path: String, reason: String },
}

/// Where a database URL leads and how it checks the server, for messages: host, port and
/// database, the TLS mode in force and the CA file. Never the user's password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub database: Option<String>,
    pub ssl_mode: SslMode,
    /// The CA file of `sslrootcert` (or `PGSSLROOTCERT`); `None` when none is set (or
    /// `PGSSLROOTCERT` holds the PEM text itself).
    pub root_cert: Option<PathBuf>,
}

/// `sslmode`, as libpq spells it. sqlx's own enum is neither comparable nor printable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn of(mode: PgSslMode) -> Self {
        match mode {
            PgSslMode::Disable => SslMode::Disable,
            PgSslMode::Allow => SslMode::Allow,
            PgSslMode::Prefer => SslMode::Prefer,
            PgSslMode::Require => SslMode::Require,
            PgSslMode::VerifyCa => SslMode::VerifyCa,
            PgSslMode::VerifyFull => SslMode::VerifyFull,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The server's certificate is checked against a CA (and, under verify-full, its name).
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)?;
        if let Some(db) = &self.database {
            write!(f, "/{db}")?;
        }
        Ok(())
    }
}

impl Target {
    /// "sslrootcert=<file>" or what stands in for it, for messages.
    fn ca_words(&self) -> String {
        match &self.root_cert {
            Some(path) => format!("the CA file sslrootcert={}", path.display()),
            None => "the built-in public CA roots (no sslrootcert file given)".to_owned(),
        }
    }
}

/// The connect options of a database URL, and its [`Target`] for messages. Every service and
/// program opens its connections from these.
///
/// - The scheme must be `postgres://` or `postgresql://` (sqlx ignores it; a wrong URL fails here,
///   not at first use).
/// - `sslmode=verify-full&sslrootcert=/path/ca.crt` verifies the server's certificate against that
///   CA and its name against the URL's host; `verify-ca` checks the CA only.
/// - A `sslrootcert` file that is missing, unreadable or holds no certificate is refused here,
///   [`UrlError::RootCert`], rather than as a connection error later.
/// - `sslmode=require` with a `sslrootcert` verifies the CA, as libpq does (sqlx alone would
///   encrypt without checking anything, although the URL names a CA).
pub fn connect_options(
    database_url: &str,
    application_name: &str,
) -> Result<(PgConnectOptions, Target), UrlError> {
    if !["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| database_url.starts_with(scheme))
    {
        return Err(UrlError::Scheme(redact(database_url)));
    }
    let mut options = database_url
        .parse::<PgConnectOptions>()
        .map_err(|source| UrlError::Parse {
            url: redact(database_url),
            source,
        })?
        .application_name(application_name);
    let root_cert = root_cert_file(database_url);
    if let Some(path) = &root_cert {
        check_root_cert(path)?;
        if matches!(options.get_ssl_mode(), PgSslMode::Require) {
            options = options.ssl_mode(PgSslMode::VerifyCa);
        }
    }
    let target = Target {
        host: options.get_host().to_owned(),
        port: options.get_port(),
        database: options.get_database().map(str::to_owned),
        ssl_mode: SslMode::of(options.get_ssl_mode()),
        root_cert,
    };
    Ok((options, target))
}

/// The CA file a URL names, as sqlx reads it: the last of `sslrootcert` / `ssl-root-cert` /
/// `ssl-ca` in the query (always a file name), else `PGSSLROOTCERT` (which may instead hold the
/// PEM text itself: not a file).
fn root_cert_file(database_url: &str) -> Option<PathBuf> {
    let from_url = url::Url::parse(database_url).ok().and_then(|u| {
        u.query_pairs()
            .filter(|(k, _)| matches!(&**k, "sslrootcert" | "ssl-root-cert" | "ssl-ca"))
            .map(|(_, v)| v.into_owned())
            .last()
    });
    if let Some(file) = from_url {
        return Some(PathBuf::from(file));
    }
    let value = std::env::var("PGSSLROOTCERT").ok()?;
    let trimmed = value.trim();
    (!(trimmed.starts_with("-----BEGIN") && trimmed.ends_with("-----"))).then(|| PathBuf::from(value))
}

/// The CA file can be read and holds at least one certificate a TLS client accepts as a root.
fn check_root_cert(path: &std::path::Path) -> Result<(), UrlError> {
    crate::tls::check_ca_file(path).map_err(|reason| UrlError::RootCert {
        path: path.display().to_string(),
        reason,
    })
}

/// A lazy pool: connections open on first use, so a service starts (and its `/readyz` says 503)
/// while its database is still down. Fails only on a URL that cannot be used
/// ([`connect_options`]: the scheme, the syntax, the CA file), so a wrong URL fails at start, not
/// at first use.
pub fn lazy_pool(
    database_url: &str,
    application_name: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, UrlError> {
    let (options, target) = connect_options(database_url, application_name)?;
    if target.ssl_mode.verifies() {
        // The pool connects later, and what a refused certificate then logs comes from the TLS
        // library alone; this line says which server, mode and CA file it was checked against.
        tracing::info!(
            event = "database_tls",
            target = %target,
            sslmode = %target.ssl_mode,
            ca = %target.ca_words(),
            "{application_name} verifies the database server's certificate"
        );
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(explain_until_connected(
            options.clone(),
            target,
            application_name.to_owned(),
        ));
    }
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

/// Connects once, beside the lazy pool, until that succeeds, so that a service whose database
/// refuses it says why in an operator's words ([`explain`]: the server, the sslmode, the CA file),
/// where the pool's own failures carry only the TLS library's text (`UnknownIssuer`). Each change
/// of reason is logged once (`event=database_connect_failed`: ERROR for a configuration to fix,
/// WARN for a server not there yet), with backoff from 1 s to 30 s between tries; at the first
/// success it logs `database_connected` and ends, and the pool's own errors take over.
async fn explain_until_connected(options: PgConnectOptions, target: Target, application_name: String) {
    let mut backoff = Duration::from_secs(1);
    let mut said: Option<String> = None;
    loop {
        match PgConnection::connect_with(&options).await {
            Ok(conn) => {
                let _ = conn.close().await;
                tracing::info!(event = "database_connected", target = %target, "{application_name} reached its database");
                return;
            }
            Err(e) => {
                let e = explain(e, &target);
                let message = e.to_string();
                if said.as_deref() != Some(message.as_str()) {
                    if e.is_config() {
                        tracing::error!(event = "database_connect_failed", target = %target, failure = ?e.failure(), "{message}");
                    } else {
                        tracing::warn!(event = "database_connect_failed", target = %target, failure = ?e.failure(), "{message}");
                    }
                    said = Some(message);
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// A pooled connection idle longer than this is pinged before it is handed out.
pub const PING_WHEN_IDLE_FOR: Duration = Duration::from_millis(500);

/// One connection, for the one-shot programs (the migrator, the fast-forward Job): the URL checked
/// as [`connect_options`] does, and a failure explained ([`explain`]).
pub async fn connect(database_url: &str, application_name: &str) -> Result<PgConnection, ConnectError> {
    let (options, target) = connect_options(database_url, application_name)?;
    PgConnection::connect_with(&options)
        .await
        .map_err(|e| explain(e, &target))
}

/// Why a connection could not be made, in an operator's words ([`explain`]).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The message names the server (host:port/database) and, for TLS, the mode and the CA file;
    /// `cause` is sqlx's error, whose text the message ends with.
    #[error("{message}")]
    Failed {
        failure: Failure,
        message: String,
        cause: sqlx::Error,
    },
}

impl ConnectError {
    /// What kind of failure it was; `None` for a URL that could not be used.
    pub fn failure(&self) -> Option<Failure> {
        match self {
            ConnectError::Url(_) => None,
            ConnectError::Failed { failure, .. } => Some(*failure),
        }
    }

    /// A configuration to fix rather than a server to wait for: the URL, the CA file, a server
    /// certificate that does not verify, a server that will not speak TLS as the URL requires.
    pub fn is_config(&self) -> bool {
        match self {
            ConnectError::Url(_) => true,
            ConnectError::Failed { failure, .. } => *failure != Failure::Other,
        }
    }
}

/// The kinds of connection failure [`explain`] tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// TLS verification: the server's certificate is not signed by the configured CA.
    UntrustedCertificate,
    /// TLS verification: the certificate does not name the host the URL connects to
    /// (`sslmode=verify-full`).
    HostNameMismatch,
    /// TLS verification: the certificate was refused for another reason (expired, not yet valid,
    /// not for a server, …).
    CertificateRejected,
    /// The TLS handshake failed otherwise, or the server does not offer TLS although the URL's
    /// sslmode requires it.
    Tls,
    /// The CA file could not be read when the connection was made (removed since start-up).
    RootCertUnreadable,
    /// The server refused a connection without TLS (its `pg_hba.conf` admits TLS only).
    TlsRequiredByServer,
    /// Anything else: the server down or unreachable, authentication, a missing database.
    Other,
}

/// sqlx's connection error `e` explained for `target`: a TLS verification failure says so and
/// names the host and the CA file (sqlx's own text, from the TLS library, names neither), a
/// server that refuses plain connections is named as requiring TLS. The message always ends with
/// sqlx's text. Services can map a failed query of their pool the same way to log it.
pub fn explain(e: sqlx::Error, target: &Target) -> ConnectError {
    let (failure, what) = classify(&e, target);
    let message = format!("cannot connect to the database at {target}: {what}: {e}");
    ConnectError::Failed {
        failure,
        message,
        cause: e,
    }
}

fn classify(e: &sqlx::Error, target: &Target) -> (Failure, String) {
    use rustls::CertificateError as Cert;

    let mode = target.ssl_mode;
    match e {
        sqlx::Error::Io(io) => {
            let tls = io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>());
            match tls {
                Some(rustls::Error::InvalidCertificate(Cert::UnknownIssuer)) => (
                    Failure::UntrustedCertificate,
                    format!(
                        "TLS verification failed (sslmode={mode}): the server's certificate is not signed by a CA in {}",
                        target.ca_words()
                    ),
                ),
                Some(rustls::Error::InvalidCertificate(
                    Cert::NotValidForName | Cert::NotValidForNameContext { .. },
                )) => (
                    Failure::HostNameMismatch,
                    format!(
                        "TLS verification failed (sslmode={mode}): the server's certificate is not valid for the host name {:?} the URL connects to (checked against {})",
                        target.host,
                        target.ca_words()
                    ),
                ),
                Some(rustls::Error::InvalidCertificate(_)) => (
                    Failure::CertificateRejected,
                    format!(
                        "TLS verification failed (sslmode={mode}): the server's certificate was refused (checked against {})",
                        target.ca_words()
                    ),
                ),
                Some(_) => (Failure::Tls, format!("the TLS handshake failed (sslmode={mode})")),
                None if target
                    .root_cert
                    .as_ref()
                    .is_some_and(|p| std::fs::File::open(p).is_err())
                    && matches!(
                        io.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                    ) =>
                {
                    (
                        Failure::RootCertUnreadable,
                        format!("{} cannot be read", target.ca_words()),
                    )
                }
                None => (Failure::Other, "the connection failed".to_owned()),
            }
        }
        sqlx::Error::Tls(_) => (
            Failure::Tls,
            format!("TLS failed (sslmode={mode}; a server whose ssl setting is off does not offer TLS)"),
        ),
        sqlx::Error::Database(db)
            if db.code().as_deref() == Some(INVALID_AUTHORIZATION)
                && matches!(mode, SslMode::Disable | SslMode::Allow) =>
        {
            (
                Failure::TlsRequiredByServer,
                format!(
                    "the server refused a connection without TLS (sslmode={mode}); if it requires TLS, set sslmode=verify-full and sslrootcert=<its CA file> in the URL"
                ),
            )
        }
        _ => (Failure::Other, "the connection failed".to_owned()),
    }
}

/// SQLSTATE `invalid_authorization_specification`: what a `pg_hba.conf` `reject` line (or a
/// missing line) answers, among others a `hostnossl … reject` to a connection without TLS.
const INVALID_AUTHORIZATION: &str = "28000";

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
/// does —, the database starting up), and `25006` (a write on a read-only server: a standby, or a
/// primary the engine is demoting, which is where a failover's connections land for a moment). Not
/// the rest of class 57 (`57014`, a cancelled statement), not a deadlock (`40P01`), not a
/// constraint.
pub fn unavailable_sqlstate(code: Option<&str>) -> bool {
    code.is_some_and(|c| c.starts_with("08") || c.starts_with("57P") || c == READ_ONLY_SQL_TRANSACTION)
}

/// SQLSTATE `read_only_sql_transaction`.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

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

    fn target(root_cert: Option<&str>) -> Target {
        Target {
            host: "db.internal".into(),
            port: 5432,
            database: Some("paydb".into()),
            ssl_mode: SslMode::VerifyFull,
            root_cert: root_cert.map(PathBuf::from),
        }
    }

    fn tls_refusal(e: rustls::Error) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn a_refused_server_certificate_names_tls_verification_the_host_and_the_ca_file() {
        let t = target(Some("/etc/dlock/ca.crt"));
        let e = explain(
            tls_refusal(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
            &t,
        );
        assert_eq!(e.failure(), Some(Failure::UntrustedCertificate));
        let m = e.to_string();
        for part in [
            "db.internal:5432/paydb",
            "TLS verification failed",
            "sslrootcert=/etc/dlock/ca.crt",
            "verify-full",
        ] {
            assert!(m.contains(part), "{part:?} missing from {m}");
        }

        let e = explain(
            tls_refusal(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            )),
            &t,
        );
        assert_eq!(e.failure(), Some(Failure::HostNameMismatch));
        assert!(e.to_string().contains("host name \"db.internal\""), "{e}");

        let e = explain(
            tls_refusal(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired,
            )),
            &t,
        );
        assert_eq!(e.failure(), Some(Failure::CertificateRejected));

        // Without a CA file the message says which roots were used instead.
        let e = explain(
            tls_refusal(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
            &target(None),
        );
        assert!(e.to_string().contains("no sslrootcert"), "{e}");

        // The negative control: a server that is down is neither TLS nor configuration.
        let e = explain(
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            &t,
        );
        assert_eq!(e.failure(), Some(Failure::Other));
        assert!(!e.is_config());
        assert!(!e.to_string().contains("TLS"), "{e}");
    }

    #[test]
    fn the_url_decides_the_tls_mode_and_the_ca_file() {
        let (_, t) =
            connect_options("postgres://u:pw@db.internal:6432/lockdb?sslmode=verify-ca", "t").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.ssl_mode),
            ("db.internal", 6432, SslMode::VerifyCa)
        );
        assert_eq!(t.database.as_deref(), Some("lockdb"));
        assert_eq!(t.to_string(), "db.internal:6432/lockdb", "no user, no password");

        // A CA file named, percent-encoded: read from the decoded path.
        let dir = std::env::temp_dir().join(format!("dlock-db-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("my ca.crt");
        std::fs::write(&ca, TEST_CA).unwrap();
        let encoded = ca.display().to_string().replace(' ', "%20");
        let (options, t) = connect_options(
            &format!("postgres://u@h/db?sslmode=require&sslrootcert={encoded}"),
            "t",
        )
        .unwrap();
        assert_eq!(t.root_cert.as_deref(), Some(ca.as_path()));
        // require with a CA file verifies the CA (libpq's rule), not merely encrypts.
        assert_eq!(t.ssl_mode, SslMode::VerifyCa);
        assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyCa));

        // The negative control: require without a CA file stays require.
        let (_, t) = connect_options("postgres://u@h/db?sslmode=require", "t").unwrap();
        assert_eq!(t.ssl_mode, SslMode::Require);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A self-signed CA certificate (EC P-256), only ever parsed here.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBfjCCASSgAwIBAgIUFbXkUzgC3MhDQw2k7YdEYdK1E3YwCgYIKoZIzj0EAwIw
HTEbMBkGA1UEAwwSZGxvY2sgdW5pdCB0ZXN0IENBMB4XDTI2MTIwNjE1MjMxOFoX
DTM2MTIwMzE1MjMxOFowHTEbMBkGA1UEAwwSZGxvY2sgdW5pdCB0ZXN0IENBMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEOdY5T7HsEZYFoyCRFrhjm/ABmvK6uIcL
WbU+RThYNDdQ+/OB9eDFHuW5ZxXnDpdGJxx9hBdKX/eQLqK24IAzE6NCMEAwDwYD
VR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAQYwHQYDVR0OBBYEFEnzOWvCwNWt
ywUj3BLRhXSBTFeXMAoGCCqGSM49BAMCA0gAMEUCIAHiiBzDo6zbnxEcYCbMkid4
O56lHgJi/wdpQc5yHZFoAiEAqQdrquk0MLE8HrXjLsD4Bkv3AH6IFVYxd2+XX4uL
1X0=
-----END CERTIFICATE-----
";

    #[test]
    fn a_terminated_or_shutting_down_database_is_unavailable_and_a_bad_statement_is_not() {
        for code in ["57P01", "57P02", "57P03", "08006", "08003", "25006"] {
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
