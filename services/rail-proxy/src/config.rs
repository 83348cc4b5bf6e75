//! rail-proxy's configuration, including the `rail.proxy.fencing.enabled` kill switch.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use clap::ArgAction;
use dlock_common::auth::{CredentialError, Credentials, Role};
use dlock_common::db::PoolArgs;
use dlock_common::grant::{GrantConfigError, GrantPolicy, PublicKeyArgs};
use dlock_common::tls::{TlsError, TlsFiles};

use crate::sql;

/// Env prefix of the credential: `RAIL_PROXY_EXECUTOR_TOKEN` (or `…_TOKEN_FILE`).
pub const CREDENTIALS_PREFIX: &str = "RAIL_PROXY";
/// Only the executor submits and resolves (docs/security.md).
pub const ROLES: &[Role] = &[Role::Executor];
/// The switch of grant verification (on unless set to `false`, for a rolling migration only).
pub const GRANT_VERIFICATION_SETTING: &str = "RAIL_PROXY_GRANT_VERIFICATION_ENABLED";

/// The environment variable that may name the CA of an `https://` rail (as `--rail-ca-file` does).
pub const RAIL_CA_FILE_ENV: &str = "DLOCK_RAIL_CA_FILE";

/// Default abandonment deadline: an attempt the rail has never seen is given up this long after it
/// was recorded.
pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(600);

/// Fault injection, for the crash tests. Only reachable with `--enable-fault-injection`, and only in
/// a build with the cargo feature `fault-injection` (off in the release image; a build without it
/// refuses the flag at start-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Exit the process right after the attempt row commits, before forwarding to the rail.
    ExitAfterAttempt,
    /// The attempt INSERT runs but its reply is lost (as when paydb's primary dies with the reply
    /// in flight): every attempt insert — whether it committed a new attempt or found one there —
    /// answers a connection-reset I/O error instead of its result, so the submission must read the
    /// attempt back to learn which.
    LoseAttemptReply,
    /// Negative control of `LoseAttemptReply`: the reply is lost and the read-back is skipped, as
    /// before it existed (the submission answers 503 and never forwards).
    LoseAttemptReplyNoReadBack,
    /// The attempt INSERT runs (and commits) but its reply never comes (as when paydb's primary
    /// vanishes without a connection reset: the connection hangs instead of breaking): every
    /// attempt insert, on a connection it then holds, awaits forever after its statement, so only
    /// the INSERT's own bound (`ATTEMPT_INSERT_TIMEOUT`) ends it, and the submission reads the
    /// attempt back as for a lost reply.
    StallAttemptReply,
    /// Negative control of `StallAttemptReply`: the reply stalls and the INSERT is awaited without
    /// its bound, as before it existed (the submission is never answered; the caller's own request
    /// timeout drops it, and the committed attempt is never forwarded).
    StallAttemptReplyNoBound,
}

/// Bounds on the rail timeout: long enough to be meaningful, short enough to never hang a worker.
pub const MIN_RAIL_TIMEOUT_MS: u64 = 1;
pub const MAX_RAIL_TIMEOUT_MS: u64 = 600_000;

/// Whether (d) runs. Off is a distinct code path that skips (d) entirely — never a sentinel token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailFence {
    /// Run (d) before forwarding. `statement` is [`sql::HIGH_WATER`]; it is a field only so that the
    /// negative-control tests can substitute a deliberately broken variant.
    Enforced { statement: &'static str },
    /// `rail.proxy.fencing.enabled=false`: forward without consulting or advancing the high-water mark.
    Disabled,
}

impl RailFence {
    pub fn from_flag(enabled: bool) -> Self {
        if enabled {
            RailFence::Enforced {
                statement: sql::HIGH_WATER,
            }
        } else {
            RailFence::Disabled
        }
    }
}

/// Redacted in `Debug` (below): the database URL may carry a password.
#[derive(Clone)]
pub struct Config {
    /// paydb, as role payapp.
    pub database_url: String,
    /// Port 0 picks a free port; [`crate::RunningServer::addr`] reports it.
    pub listen: SocketAddr,
    /// Base URL of the rail (`http://host:port`); `/v1/payments` is appended.
    pub rail_url: String,
    /// How long the one forward may take before it is recorded as TIMEOUT (ambiguous).
    pub rail_timeout: Duration,
    pub fence: RailFence,
    pub max_connections: u32,
    /// How long a request waits for a paydb connection before answering 503.
    pub db_acquire_timeout: Duration,
    /// An attempt the rail has no record of is abandoned once it is older than this. Must exceed
    /// the rail timeout, so that the one forward has certainly ended.
    pub abandon_after: Duration,
    /// Bearer credential of the executor role; without one, writes admit nobody. Redacted in Debug.
    pub credentials: Credentials,
    /// Signed grants: verified with these public keys (the default; none configured refuses to
    /// start), or off.
    pub grants: GrantPolicy,
    pub fault: Option<Fault>,
    /// The certificate and key files of HTTPS (`--tls-cert-file`, `--tls-key-file`). `Some`: the
    /// listen address serves HTTPS only; `None`: plain HTTP, with a WARN at start-up.
    pub tls: Option<TlsFiles>,
    /// The CA (PEM) that signs the rail's certificate: then the only root the rail client trusts.
    /// Without it an `https://` rail is checked against the public roots; unused for `http://`.
    pub rail_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("rail timeout must be between {MIN_RAIL_TIMEOUT_MS} and {MAX_RAIL_TIMEOUT_MS} ms, got {0} ms")]
    RailTimeout(u128),
    #[error("rail url must be an absolute http(s) URL: {0}")]
    RailUrl(String),
    #[error("{0}")]
    DatabaseUrl(String),
    #[error("max connections must be at least 1")]
    MaxConnections,
    #[error("the abandonment deadline ({abandon_ms} ms) must exceed the rail timeout ({rail_ms} ms)")]
    AbandonAfter { abandon_ms: u128, rail_ms: u128 },
    #[error(
        "--fault: this build has no fault injection (it is the cargo feature `fault-injection` of \
         rail-proxy, off in release images)"
    )]
    FaultInjectionNotBuilt,
    #[error("credentials: {0}")]
    Credentials(#[from] CredentialError),
    #[error("grants: {0}")]
    Grants(#[from] GrantConfigError),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("the rail CA file: {0}")]
    RailCa(String),
}

/// `rail-proxy`: fencing point (d) in front of the payment rail. The executor's credential comes
/// from `RAIL_PROXY_EXECUTOR_TOKEN` or `RAIL_PROXY_EXECUTOR_TOKEN_FILE`, never a flag; the lock
/// service's grant public keys from `DLOCK_GRANT_PUBLIC_KEYS` (or `…_FILE`, or the flag).
#[derive(Debug, clap::Parser)]
#[command(
    name = "rail-proxy",
    version,
    about = "Fencing point (d) in front of the payment rail"
)]
pub struct Cli {
    /// paydb URL, connecting as role payapp.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Address to listen on.
    #[arg(long, env = "RAIL_PROXY_LISTEN", default_value = "127.0.0.1:8083")]
    pub listen: SocketAddr,
    /// Base URL of the payment rail (e.g. the rail-stub).
    #[arg(long, env = "RAIL_PROXY_RAIL_URL")]
    pub rail_url: String,
    /// How long the one forward may take before it is recorded as TIMEOUT (ambiguous).
    #[arg(long, env = "RAIL_PROXY_RAIL_TIMEOUT_MS", default_value_t = 2_000)]
    pub rail_timeout_ms: u64,
    /// rail.proxy.fencing.enabled: `false` skips statement (d) entirely (demo of the corruption).
    #[arg(long, env = "RAIL_PROXY_FENCING_ENABLED", default_value_t = true, action = ArgAction::Set)]
    pub fencing_enabled: bool,
    /// Signed-grant verification: every submission and resolution needs `X-Fencing-Grant`,
    /// verified with the lock service's public keys. `false` only for a rolling migration (WARN at
    /// start-up).
    #[arg(long, env = GRANT_VERIFICATION_SETTING, default_value_t = true, action = ArgAction::Set)]
    pub grant_verification_enabled: bool,
    #[command(flatten)]
    pub grant_keys: PublicKeyArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// An attempt the rail has never received is abandoned once older than this (must exceed the
    /// rail timeout).
    #[arg(long, env = "RAIL_PROXY_ABANDON_AFTER_MS", default_value_t = 600_000)]
    pub abandon_after_ms: u64,
    /// Allows --fault. Tests and demos only, in a build with the `fault-injection` feature; logged
    /// loudly.
    #[arg(long, env = "RAIL_PROXY_ENABLE_FAULT_INJECTION")]
    pub enable_fault_injection: bool,
    /// Fault injection: `exit-after-attempt` exits right after an attempt row commits;
    /// `lose-attempt-reply` loses the reply of every attempt insert; `stall-attempt-reply` never
    /// answers it (only the insert's own timeout ends the wait).
    #[arg(
        long,
        env = "RAIL_PROXY_FAULT",
        value_enum,
        requires = "enable_fault_injection"
    )]
    pub fault: Option<Fault>,
    /// HTTPS: `--tls-cert-file`, `--tls-key-file` (the same flags in every server).
    #[command(flatten)]
    pub tls: dlock_common::tls::TlsArgs,
    /// The CA certificate(s) (PEM) that sign the rail's certificate: then the only roots trusted
    /// for an `https://` rail URL (without it: the public roots, as for a payment provider).
    #[arg(long, env = RAIL_CA_FILE_ENV)]
    pub rail_ca_file: Option<PathBuf>,
}

impl Cli {
    /// The checked [`Config`], with the credential read from the environment or its file.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let mut config = Config::new(self.database_url, self.rail_url);
        config.listen = self.listen;
        config.rail_timeout = Duration::from_millis(self.rail_timeout_ms);
        config.fence = RailFence::from_flag(self.fencing_enabled);
        config.max_connections = self.pool.db_max_connections;
        config.db_acquire_timeout = self.pool.acquire_timeout();
        config.abandon_after = Duration::from_millis(self.abandon_after_ms);
        config.fault = self.fault.filter(|_| self.enable_fault_injection);
        config.tls = self.tls.into_files()?;
        config.rail_ca = self.rail_ca_file;
        config.credentials = Credentials::from_env(CREDENTIALS_PREFIX, ROLES)?;
        config.grants = self
            .grant_keys
            .policy(self.grant_verification_enabled, GRANT_VERIFICATION_SETTING)?;
        config.validate()?;
        Ok(config)
    }
}

// Hand-written so that the database URL's password never reaches a log (credentials redact
// themselves).
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("database_url", &dlock_common::db::redact(&self.database_url))
            .field("listen", &self.listen)
            .field("rail_url", &self.rail_url)
            .field("rail_timeout", &self.rail_timeout)
            .field("fence", &self.fence)
            .field("max_connections", &self.max_connections)
            .field("db_acquire_timeout", &self.db_acquire_timeout)
            .field("abandon_after", &self.abandon_after)
            .field("credentials", &self.credentials)
            .field("grants", &self.grants)
            .field("fault", &self.fault)
            .field("tls", &self.tls)
            .field("rail_ca", &self.rail_ca)
            .finish()
    }
}

impl Config {
    /// Defaults for everything but the two addresses: fencing on, 2 s rail timeout, grant
    /// verification on with no key — which [`Config::validate`] refuses: give the lock service's
    /// public keys.
    pub fn new(database_url: impl Into<String>, rail_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            rail_url: rail_url.into(),
            rail_timeout: Duration::from_millis(2_000),
            fence: RailFence::from_flag(true),
            max_connections: 10,
            db_acquire_timeout: Duration::from_secs(5),
            abandon_after: DEFAULT_ABANDON_AFTER,
            credentials: Credentials::new(),
            grants: GrantPolicy::Verify(Arc::default()),
            fault: None,
            tls: None,
            rail_ca: None,
        }
    }

    /// Serves HTTPS with the certificate and key in `files`.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Trusts only the CA certificates in the PEM file at `path` for an `https://` rail.
    pub fn with_rail_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.rail_ca = Some(path.into());
        self
    }

    pub fn with_grants(mut self, grants: GrantPolicy) -> Self {
        self.grants = grants;
        self
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = self.rail_timeout.as_millis();
        if ms < u128::from(MIN_RAIL_TIMEOUT_MS) || ms > u128::from(MAX_RAIL_TIMEOUT_MS) {
            return Err(ConfigError::RailTimeout(ms));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::MaxConnections);
        }
        if self.fault.is_some() && !cfg!(feature = "fault-injection") {
            return Err(ConfigError::FaultInjectionNotBuilt);
        }
        self.grants.validate(GRANT_VERIFICATION_SETTING)?;
        if self.abandon_after <= self.rail_timeout {
            return Err(ConfigError::AbandonAfter {
                abandon_ms: self.abandon_after.as_millis(),
                rail_ms: ms,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line as given, with `--plaintext` unless it names a TLS file: these tests are
    /// about other flags.
    fn parse<I: IntoIterator<Item = S>, S: Into<String>>(args: I) -> Result<Cli, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(dlock_testkit::procs::plaintext_unless_tls(args))
    }

    #[test]
    fn debug_hides_the_database_password() {
        let config = Config::new("postgres://payapp:hunter2@db/paydb", "http://rail");
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("db/paydb"),
            "{shown}"
        );
    }

    fn keys() -> dlock_grant::PublicKeys {
        let key = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
        dlock_grant::PublicKeys::new(vec![key.public_key()]).unwrap()
    }

    #[test]
    fn grant_verification_is_on_by_default_and_needs_keys() {
        let config = Config::new("postgres://payapp@localhost/paydb", "http://127.0.0.1:1");
        assert!(config.grants.is_on());
        assert!(matches!(config.validate(), Err(ConfigError::Grants(_))));
        let cli = |extra: &[&str]| {
            let mut args = vec![
                "rail-proxy",
                "--database-url",
                "postgres://payapp@localhost/paydb",
                "--rail-url",
                "http://127.0.0.1:1",
            ];
            args.extend_from_slice(extra);
            parse(args).expect("parses").into_config()
        };
        assert!(matches!(
            cli(&[]),
            Err(ConfigError::Grants(GrantConfigError::NoKeys { .. }))
        ));
        let text = keys().to_text();
        assert!(cli(&["--grant-public-keys", &text]).unwrap().grants.is_on());
        assert!(
            !cli(&["--grant-verification-enabled", "false"])
                .unwrap()
                .grants
                .is_on()
        );
    }

    /// A build without the feature (the release image) refuses a fault instead of ignoring it.
    #[test]
    fn a_fault_needs_a_build_with_fault_injection() {
        let mut config = Config::new("postgres://payapp@localhost/paydb", "http://127.0.0.1:1")
            .with_grants(GrantPolicy::new(true, keys(), GRANT_VERIFICATION_SETTING).unwrap());
        assert!(config.validate().is_ok());
        config.fault = Some(Fault::ExitAfterAttempt);
        assert_eq!(
            config.validate().is_ok(),
            cfg!(feature = "fault-injection"),
            "{:?}",
            config.validate()
        );
    }
}
