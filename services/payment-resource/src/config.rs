//! Service configuration. Everything arrives explicitly (CLI flags / env via [`Cli`], or a struct
//! literal in tests); nothing is read from globals later.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand};
use dlock_common::auth::{CredentialError, Credentials, Role};
use dlock_common::db::PoolArgs;
use dlock_common::grant::{GrantConfigError, GrantPolicy, PublicKeyArgs};
use dlock_common::tls::{TlsError, TlsFiles};

/// Env prefix of this service's credentials: `PAYMENT_RESOURCE_{ADMIN,EXECUTOR,CLIENT}_TOKEN`
/// (or `…_TOKEN_FILE`).
pub const CREDENTIALS_PREFIX: &str = "PAYMENT_RESOURCE";
/// The roles this service admits (docs/security.md).
pub const ROLES: &[Role] = &[Role::Admin, Role::Executor, Role::Client];

/// The switch of grant verification (on unless set to `false`, for a rolling migration only).
pub const GRANT_VERIFICATION_SETTING: &str = "PAYMENT_GRANT_VERIFICATION_ENABLED";
/// Default and bounds of the stuck threshold (`stuckAfterSeconds` of a reconciliation, and the
/// periodic one's `--reconcile-stuck-after-secs`): how long a payout may stay not terminal before
/// it is reported STUCK.
pub const DEFAULT_STUCK_AFTER_SECONDS: i64 = 900;
pub const MAX_STUCK_AFTER_SECONDS: i64 = 30 * 86_400;
/// Default interval of the periodic reconciliation.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(300);
/// Default interval of the open-payout count.
pub const DEFAULT_PAYOUT_STATS_INTERVAL: Duration = Duration::from_secs(30);

/// How often the periodic checks ([`crate::monitor`]) run; `None` turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub reconcile_every: Option<Duration>,
    /// The periodic reconciliation's stuck threshold.
    pub stuck_after_seconds: i64,
    pub payout_stats_every: Option<Duration>,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            reconcile_every: Some(DEFAULT_RECONCILE_INTERVAL),
            stuck_after_seconds: DEFAULT_STUCK_AFTER_SECONDS,
            payout_stats_every: Some(DEFAULT_PAYOUT_STATS_INTERVAL),
        }
    }
}

impl Schedule {
    /// Both checks off.
    pub fn off() -> Self {
        Self {
            reconcile_every: None,
            payout_stats_every: None,
            ..Self::default()
        }
    }
}

/// `payment.fencing.enabled` (env `PAYMENT_FENCING_ENABLED`). Selects the statement variant of
/// (a)(b)(c) at the repository boundary; it is never expressed as a sentinel token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fencing {
    #[default]
    Enabled,
    /// The kill switch: the demo's evidence that without fencing a stale holder corrupts balances.
    Disabled,
}

impl Fencing {
    pub fn from_enabled(enabled: bool) -> Self {
        if enabled {
            Fencing::Enabled
        } else {
            Fencing::Disabled
        }
    }

    pub fn is_enabled(self) -> bool {
        self == Fencing::Enabled
    }
}

/// Redacted in `Debug` (below): the database URL may carry a password.
#[derive(Clone)]
pub struct Config {
    /// paydb, as role `payapp`.
    pub database_url: String,
    /// Where to listen; port 0 picks a free port (tests, the demo).
    pub listen: SocketAddr,
    pub fencing: Fencing,
    pub max_connections: u32,
    /// How long a request waits for a pooled connection before answering 503.
    pub acquire_timeout: Duration,
    /// Bearer credentials per role; a role without one admits nobody. Redacted in `Debug`.
    pub credentials: Credentials,
    /// Signed grants: verified with these public keys (the default; none configured refuses to
    /// start), or off.
    pub grants: GrantPolicy,
    /// The periodic reconciliation and open-payout count ([`crate::monitor`]).
    pub monitor: Schedule,
    /// The certificate and key files of HTTPS (`--tls-cert-file`, `--tls-key-file`). `Some`: the
    /// listen address serves HTTPS only; `None`: plain HTTP, with a WARN at start-up.
    pub tls: Option<TlsFiles>,
}

// Hand-written so that the database URL's password never reaches a log (credentials redact
// themselves).
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("database_url", &dlock_common::db::redact(&self.database_url))
            .field("listen", &self.listen)
            .field("fencing", &self.fencing)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("credentials", &self.credentials)
            .field("grants", &self.grants)
            .field("monitor", &self.monitor)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Config {
    /// Defaults for everything but the database. Grant verification is on with no key, which
    /// [`crate::spawn`] refuses: give the lock service's public keys ([`Config::with_grants`]).
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            fencing: Fencing::Enabled,
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            credentials: Credentials::new(),
            grants: GrantPolicy::Verify(Arc::default()),
            monitor: Schedule::default(),
            tls: None,
        }
    }

    /// Same, on an ephemeral loopback port.
    pub fn ephemeral(database_url: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..Self::new(database_url)
        }
    }

    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    pub fn with_fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    pub fn with_grants(mut self, grants: GrantPolicy) -> Self {
        self.grants = grants;
        self
    }

    pub fn with_monitor(mut self, monitor: Schedule) -> Self {
        self.monitor = monitor;
        self
    }

    /// Serves HTTPS with the certificate and key in `files`.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }
}

/// Why `serve`'s configuration was refused (exit 2, nothing started).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("credentials: {0}")]
    Credentials(#[from] CredentialError),
    #[error("grants: {0}")]
    Grants(#[from] GrantConfigError),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// `payment-resource serve` runs the service; `payment-resource reconcile` prints the reconciliation
/// report as JSON and exits non-zero when the books do not balance. Credentials come from
/// `PAYMENT_RESOURCE_{ADMIN,EXECUTOR,CLIENT}_TOKEN` (or `…_TOKEN_FILE`), never from flags; the lock
/// service's grant public keys from `DLOCK_GRANT_PUBLIC_KEYS` (or `…_FILE`, or the flag: they are not
/// secret).
#[derive(Debug, Parser)]
#[command(
    name = "payment-resource",
    version,
    about = "dlock's protected resource over paydb"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API until SIGTERM.
    Serve(ServeArgs),
    /// Check the accounting invariants once; print the report; exit 1 if not clean.
    Reconcile {
        /// paydb, as role payapp.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// paydb, as role payapp.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    #[arg(long, env = "PAYMENT_RESOURCE_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// The `payment.fencing.enabled` kill switch. `false` drops the fence predicates of (a)(b)(c)
    /// (demo of corruption only).
    #[arg(
        long = "fencing-enabled",
        alias = "payment-fencing-enabled",
        alias = "payment.fencing.enabled",
        env = "PAYMENT_FENCING_ENABLED",
        default_value = "true",
        value_parser = parse_bool,
        action = ArgAction::Set
    )]
    pub fencing_enabled: bool,
    /// Signed-grant verification: every fenced write needs `X-Fencing-Grant`, verified with the
    /// lock service's public keys. `false` only for a rolling migration (WARN at start-up).
    #[arg(
        long = "grant-verification-enabled",
        env = GRANT_VERIFICATION_SETTING,
        default_value = "true",
        value_parser = parse_bool,
        action = ArgAction::Set
    )]
    pub grant_verification_enabled: bool,
    #[command(flatten)]
    pub grant_keys: PublicKeyArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Seconds between two runs of the reconciliation (every ledger invariant and the rail
    /// comparison), exported as `payment_reconciliation_breaks{kind}`; 0 turns it off.
    #[arg(long, env = "PAYMENT_RESOURCE_RECONCILE_INTERVAL_SECS", default_value_t = 300)]
    pub reconcile_interval_secs: u64,
    /// The periodic reconciliation reports a payout STUCK when it is not terminal and unchanged
    /// for this many seconds.
    #[arg(
        long,
        env = "PAYMENT_RESOURCE_RECONCILE_STUCK_AFTER_SECS",
        default_value_t = DEFAULT_STUCK_AFTER_SECONDS,
        value_parser = clap::value_parser!(i64).range(1..=MAX_STUCK_AFTER_SECONDS)
    )]
    pub reconcile_stuck_after_secs: i64,
    /// Seconds between two counts of the payouts not terminal yet (`payment_payouts_open{state}`,
    /// `payment_payouts_open_oldest_age_seconds{state}`); 0 turns it off.
    #[arg(
        long,
        env = "PAYMENT_RESOURCE_PAYOUT_STATS_INTERVAL_SECS",
        default_value_t = 30
    )]
    pub payout_stats_interval_secs: u64,
    /// HTTPS: `--tls-cert-file`, `--tls-key-file` (the same flags in every server).
    #[command(flatten)]
    pub tls: dlock_common::tls::TlsArgs,
}

impl ServeArgs {
    /// The checked [`Config`], with the credentials read from the environment or their files.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let tls = self.tls.into_files()?;
        Ok(Config {
            listen: self.listen,
            fencing: Fencing::from_enabled(self.fencing_enabled),
            max_connections: self.pool.db_max_connections,
            acquire_timeout: self.pool.acquire_timeout(),
            credentials: Credentials::from_env(CREDENTIALS_PREFIX, ROLES)?,
            grants: self
                .grant_keys
                .policy(self.grant_verification_enabled, GRANT_VERIFICATION_SETTING)?,
            monitor: Schedule {
                reconcile_every: every(self.reconcile_interval_secs),
                stuck_after_seconds: self.reconcile_stuck_after_secs,
                payout_stats_every: every(self.payout_stats_interval_secs),
            },
            tls,
            ..Config::new(self.database_url)
        })
    }
}

/// An interval flag: 0 is off.
fn every(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// Parses a boolean config value strictly: `true` or `false` (any case). Anything else is an error
/// rather than a silent default, so a typo cannot switch fencing off.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected true or false, got {value:?}")),
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
    fn fencing_defaults_on() {
        assert_eq!(Fencing::default(), Fencing::Enabled);
        assert_eq!(Config::new("postgres://x").fencing, Fencing::Enabled);
    }

    #[test]
    fn debug_hides_the_database_password() {
        let shown = format!("{:?}", Config::new("postgres://payapp:hunter2@db/paydb"));
        assert!(
            !shown.contains("hunter2") && shown.contains("db/paydb"),
            "{shown}"
        );
    }

    fn serve(args: &[&str]) -> Result<Config, ConfigError> {
        let mut all = vec![
            "payment-resource",
            "serve",
            "--database-url",
            "postgres://payapp@db/paydb",
        ];
        all.extend_from_slice(args);
        match parse(all).expect("parses").command {
            Command::Serve(args) => args.into_config(),
            Command::Reconcile { .. } => unreachable!("serve was given"),
        }
    }

    fn schedule(extra: &[&str]) -> Result<Schedule, clap::Error> {
        let mut args = vec![
            "payment-resource",
            "serve",
            "--database-url",
            "postgres://x/paydb",
            // Grant verification needs keys; these tests are about the schedule.
            "--grant-verification-enabled",
            "false",
        ];
        args.extend_from_slice(extra);
        match parse(args)?.command {
            Command::Serve(serve) => Ok(serve.into_config().expect("no credentials in the env").monitor),
            Command::Reconcile { .. } => panic!("parsed as reconcile"),
        }
    }

    #[test]
    fn grant_verification_is_on_by_default_and_needs_keys() {
        assert!(Config::new("postgres://x").grants.is_on());
        assert!(matches!(
            serve(&[]),
            Err(ConfigError::Grants(GrantConfigError::NoKeys { .. }))
        ));
        let key = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
        let keys = key.public_key().to_text();
        assert!(serve(&["--grant-public-keys", &keys]).unwrap().grants.is_on());
        let off = serve(&["--grant-verification-enabled", "false"]).unwrap();
        assert!(!off.grants.is_on());
        assert!(matches!(
            serve(&["--grant-public-keys", "k1=not-a-key"]),
            Err(ConfigError::Grants(GrantConfigError::Keys(_)))
        ));
    }

    #[test]
    fn the_periodic_checks_run_by_default_and_zero_turns_each_off() {
        let s = schedule(&[]).unwrap();
        assert_eq!(s, Schedule::default());
        assert_eq!(s.reconcile_every, Some(Duration::from_secs(300)));
        assert_eq!(s.payout_stats_every, Some(Duration::from_secs(30)));
        let s = schedule(&[
            "--reconcile-interval-secs",
            "0",
            "--payout-stats-interval-secs",
            "7",
            "--reconcile-stuck-after-secs",
            "60",
        ])
        .unwrap();
        assert_eq!(s.reconcile_every, None);
        assert_eq!(s.payout_stats_every, Some(Duration::from_secs(7)));
        assert_eq!(s.stuck_after_seconds, 60);
        for bad in [
            ["--reconcile-stuck-after-secs", "0"],
            ["--reconcile-stuck-after-secs", "2592001"],
            ["--reconcile-interval-secs", "-1"],
        ] {
            assert!(schedule(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bools_are_strict() {
        assert_eq!(parse_bool("true"), Ok(true));
        assert_eq!(parse_bool("FALSE"), Ok(false));
        for bad in ["", "0", "no", "off", "yes", "ture"] {
            assert!(parse_bool(bad).is_err(), "{bad:?}");
        }
    }
}
