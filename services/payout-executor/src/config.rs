//! The executor's settings: the command line ([`Cli`], flags or `PAYOUT_EXECUTOR_*` env) and the
//! checked [`Config`] the library runs with. Bad settings are refused with a reason, never clamped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dlock_common::auth::{Credential, CredentialError};
use dlock_common::validate;
use uuid::Uuid;

use crate::fault::Step;

/// `payout-executor`: drives payouts claim → lock → rail submit → post, over HTTP only.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "payout-executor", version, about)]
pub struct Cli {
    /// lock-server base URL.
    #[arg(long, env = "PAYOUT_EXECUTOR_LOCK_SERVER_URL")]
    pub lock_server_url: String,

    /// payment-resource base URL.
    #[arg(long, env = "PAYOUT_EXECUTOR_PAYMENT_RESOURCE_URL")]
    pub payment_resource_url: String,

    /// rail-proxy base URL.
    #[arg(long, env = "PAYOUT_EXECUTOR_RAIL_PROXY_URL")]
    pub rail_proxy_url: String,

    /// Owner id of this process's lock sessions (worker n uses `<owner-id>-w<n>`). Default:
    /// `<hostname>-<pid>`.
    #[arg(long, env = "PAYOUT_EXECUTOR_OWNER_ID")]
    pub owner_id: Option<String>,

    /// Concurrent workers in this process, each with its own lock session.
    #[arg(long, env = "PAYOUT_EXECUTOR_WORKERS", default_value_t = 1)]
    pub workers: u32,

    /// Lease of each account lock, in milliseconds (renewed every third of it).
    #[arg(long, env = "PAYOUT_EXECUTOR_LEASE_TTL_MS", default_value_t = 5_000)]
    pub lease_ttl_ms: i64,

    /// Lock-session TTL, in milliseconds (heartbeat every third of it).
    #[arg(long, env = "PAYOUT_EXECUTOR_SESSION_TTL_MS", default_value_t = 15_000)]
    pub session_ttl_ms: i64,

    /// How long to wait for a contended account lock before moving on to another account. Short:
    /// the holder works the account's payouts in one visit, and the waiter would mostly find them
    /// done; a pass that met only held accounts still waits in one account's queue for the poll
    /// interval.
    #[arg(long, env = "PAYOUT_EXECUTOR_ACQUIRE_WAIT_MS", default_value_t = 50)]
    pub acquire_wait_ms: u64,

    /// Pause between passes that found nothing to do (or only contended work).
    #[arg(long, env = "PAYOUT_EXECUTOR_POLL_INTERVAL_MS", default_value_t = 500)]
    pub poll_interval_ms: u64,

    /// Upper bound of one request to payment-resource or rail-proxy. Must exceed rail-proxy's rail
    /// timeout, or a slow rail looks like a failure of ours.
    #[arg(long, env = "PAYOUT_EXECUTOR_HTTP_TIMEOUT_MS", default_value_t = 10_000)]
    pub http_timeout_ms: u64,

    /// Page size of the payout listing.
    #[arg(long, env = "PAYOUT_EXECUTOR_PAGE_SIZE", default_value_t = 100)]
    pub page_size: u32,

    /// Work only on these payouts (repeatable, or comma-separated in the env) instead of listing
    /// PENDING and in-flight payouts: e.g. to have a takeover finish a dead holder's payout.
    #[arg(long = "payout-id", env = "PAYOUT_EXECUTOR_PAYOUT_IDS", value_delimiter = ',')]
    pub payout_ids: Vec<Uuid>,

    /// Batch mode: exit 0 once nothing this executor can take is left (PENDING or in flight,
    /// including a payout waiting out its retry backoff); non-zero, naming the payouts, if it spent
    /// the error budget of some payout (--max-errors-per-payout), so that the next run finishes them.
    #[arg(long, env = "PAYOUT_EXECUTOR_EXIT_WHEN_IDLE")]
    pub exit_when_idle: bool,

    /// Consecutive unexpected errors (transport errors, 5xx) on one payout before it is reported.
    /// A long-running executor logs it once at ERROR (`payout_retry_backoff`), counts it in
    /// `payouts_over_error_budget`, and keeps retrying it at the capped backoff: it never gives a
    /// payout up. A batch run (--exit-when-idle) stops trying it (`payout_given_up`) and exits
    /// non-zero naming it.
    #[arg(long, env = "PAYOUT_EXECUTOR_MAX_ERRORS_PER_PAYOUT", default_value_t = 5)]
    pub max_errors_per_payout: u32,

    /// After an attempt of a payout ends in an unexpected error, the wait before it is tried again,
    /// in milliseconds; doubled after each further consecutive error, up to
    /// --payout-retry-backoff-max-ms, jittered (each wait is drawn between half and all of it), and
    /// reset by an attempt that gets an answer. Discovery skips the payout only until then.
    #[arg(long, env = "PAYOUT_EXECUTOR_PAYOUT_RETRY_BACKOFF_MS", default_value_t = 500)]
    pub payout_retry_backoff_ms: u64,

    /// The cap of that backoff, in milliseconds: also the wait between the attempts of a payout
    /// past --max-errors-per-payout. At least --payout-retry-backoff-ms.
    #[arg(
        long,
        env = "PAYOUT_EXECUTOR_PAYOUT_RETRY_BACKOFF_MAX_MS",
        default_value_t = 30_000
    )]
    pub payout_retry_backoff_max_ms: u64,

    /// On SIGTERM, how long the current payout may still run before it is abandoned (safely: every
    /// step is fenced, and a successor resumes from the recorded state).
    #[arg(long, env = "PAYOUT_EXECUTOR_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,

    /// Address of /metrics, /healthz and /readyz (port 0: a free port).
    #[arg(long, env = "PAYOUT_EXECUTOR_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    /// How many times one critical section asks rail-proxy about an ambiguous submission before it
    /// leaves it for a later pass (the rail-proxy deadline ends the ambiguity).
    #[arg(long, env = "PAYOUT_EXECUTOR_RESOLVE_ATTEMPTS", default_value_t = 6)]
    pub resolve_attempts: u32,

    /// First wait between two such questions; doubled each time, capped at 5 s.
    #[arg(long, env = "PAYOUT_EXECUTOR_RESOLVE_BACKOFF_MS", default_value_t = 250)]
    pub resolve_backoff_ms: u64,

    /// Allows --pause-at. Tests and demos only; logged loudly.
    #[arg(long, env = "PAYOUT_EXECUTOR_ENABLE_FAULT_INJECTION")]
    pub enable_fault_injection: bool,

    /// Fault injection: SIGSTOP this whole process at this step of the first payout reaching it.
    #[arg(long, env = "PAYOUT_EXECUTOR_PAUSE_AT", value_enum)]
    pub pause_at: Option<Step>,

    /// The CA certificate(s) (PEM) that sign the certificates of lock-server, payment-resource and
    /// rail-proxy: the only roots trusted. Required when any of their URLs is https.
    #[arg(long, env = CA_FILE_ENV)]
    pub ca_file: Option<PathBuf>,

    /// A file holding this executor's lock client token, presented to lock-server when it has a
    /// clients file. Or the token itself in the environment variable DLOCK_LOCK_TOKEN (never a
    /// flag: command lines are visible to every user of the machine).
    #[arg(long, env = LOCK_TOKEN_FILE_ENV)]
    pub lock_token_file: Option<PathBuf>,
}

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub lock_server_url: String,
    pub payment_resource_url: String,
    pub rail_proxy_url: String,
    pub owner_id: String,
    pub workers: u32,
    pub lease_ttl: Duration,
    pub session_ttl: Duration,
    pub acquire_wait: Duration,
    pub poll_interval: Duration,
    pub http_timeout: Duration,
    pub page_size: u32,
    /// Non-empty: explicit mode (no listing).
    pub payout_ids: Vec<Uuid>,
    pub exit_when_idle: bool,
    pub max_errors_per_payout: u32,
    /// First retry backoff of a payout after an unexpected error ([`crate::worker::RetryPolicy`]).
    pub payout_retry_backoff: Duration,
    /// Its cap.
    pub payout_retry_backoff_max: Duration,
    pub shutdown_grace: Duration,
    pub listen: SocketAddr,
    pub fault_injection: bool,
    pub pause_at: Option<Step>,
    pub resolve_attempts: u32,
    pub resolve_backoff: Duration,
    /// Presented to payment-resource (its executor role): `PAYOUT_EXECUTOR_PAYMENT_RESOURCE_TOKEN`
    /// or `…_TOKEN_FILE`. Never a flag; redacted in Debug.
    pub payment_credential: Option<Credential>,
    /// Presented to rail-proxy: `PAYOUT_EXECUTOR_RAIL_PROXY_TOKEN` or `…_TOKEN_FILE`.
    pub rail_credential: Option<Credential>,
    /// The CA of the three servers (PEM file); `None` only when every URL is http.
    pub ca_file: Option<PathBuf>,
    /// Presented to lock-server (`Authorization: Bearer`): `DLOCK_LOCK_TOKEN` or the file of
    /// `--lock-token-file`. Redacted in Debug.
    pub lock_token: Option<LockToken>,
}

/// Env names of the executor's own credentials.
pub const PAYMENT_CREDENTIAL_ENV: &str = "PAYOUT_EXECUTOR_PAYMENT_RESOURCE_TOKEN";
pub const RAIL_CREDENTIAL_ENV: &str = "PAYOUT_EXECUTOR_RAIL_PROXY_TOKEN";
/// The CA file of the three servers (as `--ca-file`).
pub const CA_FILE_ENV: &str = "DLOCK_CA_FILE";
/// The lock client token itself (there is no flag for it).
pub const LOCK_TOKEN_ENV: &str = "DLOCK_LOCK_TOKEN";
/// The file holding the lock client token (as `--lock-token-file`).
pub const LOCK_TOKEN_FILE_ENV: &str = "DLOCK_LOCK_TOKEN_FILE";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("--pause-at is fault injection and needs --enable-fault-injection")]
    PauseWithoutFaultInjection,
    #[error(
        "--enable-fault-injection: this build has no fault injection (it is the cargo feature \
         `fault-injection` of payout-executor, off in release images)"
    )]
    FaultInjectionNotBuilt,
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange {
        field: &'static str,
        min: u64,
        max: u64,
        value: u64,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Credential(#[from] CredentialError),
    #[error(
        "{field} {url:?} is https: give the CA that signs the servers' certificates (--ca-file or {CA_FILE_ENV})"
    )]
    CaRequired { field: &'static str, url: String },
    /// Never quotes the token.
    #[error("the lock client token: {0}")]
    LockToken(String),
}

const MAX_WORKERS: u64 = 64;
const MAX_PAGE: u64 = 500;

fn range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            min,
            max,
            value,
        })
    }
}

fn ttl(field: &str, ms: i64) -> Result<Duration, ConfigError> {
    validate::ttl_ms(field, ms).map_err(|e| ConfigError::Invalid(e.message))?;
    Ok(Duration::from_millis(ms.unsigned_abs()))
}

/// `<hostname>-<pid>`; the hostname as the kernel reports it.
pub fn default_owner_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "payout-executor".to_owned());
    format!("{host}-{}", std::process::id())
}

/// The owner id of worker `n`.
pub fn worker_owner_id(owner_id: &str, n: u32) -> String {
    format!("{owner_id}-w{n}")
}

/// The lock client token lock-server knows this executor by (its clients file). `Debug` never
/// shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LockToken(String);

impl LockToken {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token, for the lock client's `Authorization` header only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for LockToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockToken(<redacted>)")
    }
}

/// The lock client token from `env_token` (the value of [`LOCK_TOKEN_ENV`]) or the file `file`;
/// both set is refused rather than one silently winning. A file's surrounding whitespace (its final
/// newline) is not part of the token.
fn lock_token(env_token: Option<String>, file: Option<&PathBuf>) -> Result<Option<LockToken>, ConfigError> {
    let from_file = match file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| ConfigError::LockToken(format!("cannot read {}: {e}", path.display())))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let token = match (env_token, from_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::LockToken(format!(
                "both {LOCK_TOKEN_ENV} and --lock-token-file ({LOCK_TOKEN_FILE_ENV}) are set; set one"
            )));
        }
        (Some(t), None) | (None, Some(t)) => t,
        (None, None) => return Ok(None),
    };
    // The shape lock-server's clients file accepts; the message never quotes the value.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::LockToken(
            "it must be visible ASCII characters, not empty".into(),
        ));
    }
    Ok(Some(LockToken::new(token)))
}

impl Cli {
    /// The checked [`Config`], with the lock client token from [`LOCK_TOKEN_ENV`] when it is set.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let env_token = std::env::var(LOCK_TOKEN_ENV).ok();
        self.into_config_with_lock_token(env_token)
    }

    /// [`Cli::into_config`] with `env_token` standing for the value of [`LOCK_TOKEN_ENV`].
    pub fn into_config_with_lock_token(self, env_token: Option<String>) -> Result<Config, ConfigError> {
        if self.pause_at.is_some() && !self.enable_fault_injection {
            return Err(ConfigError::PauseWithoutFaultInjection);
        }
        if self.enable_fault_injection && !cfg!(feature = "fault-injection") {
            return Err(ConfigError::FaultInjectionNotBuilt);
        }
        range("--workers", u64::from(self.workers), 1, MAX_WORKERS)?;
        range("--page-size", u64::from(self.page_size), 1, MAX_PAGE)?;
        range("--acquire-wait-ms", self.acquire_wait_ms, 0, 60_000)?;
        range("--poll-interval-ms", self.poll_interval_ms, 1, 600_000)?;
        range("--http-timeout-ms", self.http_timeout_ms, 10, 600_000)?;
        range("--shutdown-grace-ms", self.shutdown_grace_ms, 0, 600_000)?;
        range("--resolve-attempts", u64::from(self.resolve_attempts), 1, 100)?;
        range("--resolve-backoff-ms", self.resolve_backoff_ms, 1, 60_000)?;
        range(
            "--max-errors-per-payout",
            u64::from(self.max_errors_per_payout),
            1,
            1_000,
        )?;
        range(
            "--payout-retry-backoff-ms",
            self.payout_retry_backoff_ms,
            1,
            600_000,
        )?;
        range(
            "--payout-retry-backoff-max-ms",
            self.payout_retry_backoff_max_ms,
            self.payout_retry_backoff_ms,
            3_600_000,
        )?;
        let lease_ttl = ttl("--lease-ttl-ms", self.lease_ttl_ms)?;
        let session_ttl = ttl("--session-ttl-ms", self.session_ttl_ms)?;
        let owner_id = self.owner_id.unwrap_or_else(default_owner_id);
        // The id itself and every worker's id (the longest one included) must be valid owner ids.
        for id in [owner_id.clone(), worker_owner_id(&owner_id, self.workers)] {
            validate::owner_id(&id)
                .map_err(|e| ConfigError::Invalid(format!("--owner-id: {}", e.message)))?;
        }
        for (field, url) in [
            ("--lock-server-url", &self.lock_server_url),
            ("--payment-resource-url", &self.payment_resource_url),
            ("--rail-proxy-url", &self.rail_proxy_url),
        ] {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::Invalid(format!(
                    "{field} must be an http(s) URL, got {url:?}"
                )));
            }
            // No built-in roots are trusted, so an https server without a CA could only fail every
            // call: refused here, before anything starts.
            if url.starts_with("https://") && self.ca_file.is_none() {
                return Err(ConfigError::CaRequired {
                    field,
                    url: url.clone(),
                });
            }
        }
        let lock_token = lock_token(env_token, self.lock_token_file.as_ref())?;
        // Repeats are harmless but pointless; keep the first occurrence, in order.
        let mut seen = std::collections::HashSet::new();
        let mut payout_ids = self.payout_ids;
        payout_ids.retain(|id| seen.insert(*id));
        Ok(Config {
            lock_server_url: self.lock_server_url,
            payment_resource_url: self.payment_resource_url,
            rail_proxy_url: self.rail_proxy_url,
            owner_id,
            workers: self.workers,
            lease_ttl,
            session_ttl,
            acquire_wait: Duration::from_millis(self.acquire_wait_ms),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            http_timeout: Duration::from_millis(self.http_timeout_ms),
            page_size: self.page_size,
            payout_ids,
            exit_when_idle: self.exit_when_idle,
            max_errors_per_payout: self.max_errors_per_payout,
            payout_retry_backoff: Duration::from_millis(self.payout_retry_backoff_ms),
            payout_retry_backoff_max: Duration::from_millis(self.payout_retry_backoff_max_ms),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            listen: self.listen,
            fault_injection: self.enable_fault_injection,
            pause_at: self.pause_at,
            resolve_attempts: self.resolve_attempts,
            resolve_backoff: Duration::from_millis(self.resolve_backoff_ms),
            payment_credential: Credential::from_env(PAYMENT_CREDENTIAL_ENV)?,
            rail_credential: Credential::from_env(RAIL_CREDENTIAL_ENV)?,
            ca_file: self.ca_file,
            lock_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn cli(extra: &[&str]) -> Result<Cli, clap::Error> {
        let mut args = vec![
            "payout-executor",
            "--lock-server-url",
            "http://127.0.0.1:1",
            "--payment-resource-url",
            "http://127.0.0.1:2",
            "--rail-proxy-url",
            "http://127.0.0.1:3",
        ];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args)
    }

    #[test]
    fn defaults() {
        let c = cli(&[]).unwrap().into_config().unwrap();
        assert_eq!(c.workers, 1);
        assert_eq!(c.lease_ttl, Duration::from_millis(5_000));
        assert_eq!(c.acquire_wait, Duration::from_millis(50));
        assert!(c.payout_ids.is_empty());
        assert!(!c.exit_when_idle);
        assert_eq!(c.pause_at, None);
        assert_eq!(c.max_errors_per_payout, 5);
        assert_eq!(c.payout_retry_backoff, Duration::from_millis(500));
        assert_eq!(c.payout_retry_backoff_max, Duration::from_secs(30));
        assert!(c.owner_id.ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn pause_needs_the_fault_injection_flag() {
        assert_eq!(
            cli(&["--pause-at", "before_post"])
                .unwrap()
                .into_config()
                .unwrap_err(),
            ConfigError::PauseWithoutFaultInjection
        );
        let c = cli(&["--pause-at", "before_rail_submit", "--enable-fault-injection"])
            .unwrap()
            .into_config();
        if cfg!(feature = "fault-injection") {
            assert_eq!(c.unwrap().pause_at, Some(Step::BeforeRailSubmit));
        } else {
            assert_eq!(c.unwrap_err(), ConfigError::FaultInjectionNotBuilt);
        }
        assert!(cli(&["--pause-at", "whenever", "--enable-fault-injection"]).is_err());
    }

    /// A build without the feature (a release image) refuses the flag instead of ignoring it.
    #[test]
    fn fault_injection_is_refused_by_a_build_without_it() {
        let c = cli(&["--enable-fault-injection"]).unwrap().into_config();
        assert_eq!(c.is_ok(), cfg!(feature = "fault-injection"), "{c:?}");
    }

    #[test]
    fn bad_values_are_refused_not_clamped() {
        for bad in [
            &["--workers", "0"][..],
            &["--workers", "65"],
            &["--lease-ttl-ms", "0"],
            &["--lease-ttl-ms", "-5"],
            &["--session-ttl-ms", "5"],
            &["--page-size", "0"],
            &["--max-errors-per-payout", "0"],
            &["--payout-retry-backoff-ms", "0"],
            &["--payout-retry-backoff-ms", "-1"],
            // The cap below the first wait.
            &[
                "--payout-retry-backoff-ms",
                "1000",
                "--payout-retry-backoff-max-ms",
                "999",
            ],
            &["--payout-retry-backoff-max-ms", "3600001"],
            &["--owner-id", " padded"],
            &["--owner-id", ""],
        ] {
            let parsed = cli(bad);
            assert!(
                parsed.is_err() || parsed.unwrap().into_config().is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(cli(&["--workers", "abc"]).is_err());
        assert!(cli(&["--payout-id", "not-a-uuid"]).is_err());
        let mut bad_url = cli(&[]).unwrap();
        bad_url.rail_proxy_url = "ftp://x".into();
        assert!(bad_url.into_config().is_err());
    }

    #[test]
    fn an_https_url_needs_the_ca_file() {
        type Set = fn(&mut Cli, String);
        let fields: [(&str, Set); 3] = [
            ("--lock-server-url", |c, u| c.lock_server_url = u),
            ("--payment-resource-url", |c, u| c.payment_resource_url = u),
            ("--rail-proxy-url", |c, u| c.rail_proxy_url = u),
        ];
        for (field, set) in fields {
            let mut https = cli(&[]).unwrap();
            set(&mut https, "https://127.0.0.1:9".into());
            let e = https.clone().into_config_with_lock_token(None).unwrap_err();
            assert!(
                matches!(&e, ConfigError::CaRequired { field: f, .. } if *f == field),
                "{e:?}"
            );
            assert!(e.to_string().contains("--ca-file"), "{e}");
            // The same URL with a CA is accepted (the file is read when the clients are built).
            https.ca_file = Some(PathBuf::from("/etc/dlock/ca.crt"));
            let c = https.into_config_with_lock_token(None).unwrap();
            assert_eq!(c.ca_file, Some(PathBuf::from("/etc/dlock/ca.crt")));
        }
        // Plain http needs none.
        let c = cli(&[]).unwrap().into_config_with_lock_token(None).unwrap();
        assert_eq!(c.ca_file, None);
    }

    #[test]
    fn the_lock_token_comes_from_the_env_or_a_file_never_both() {
        const SECRET: &str = "lock-client-token-0123456789abcdef";
        let c = cli(&[])
            .unwrap()
            .into_config_with_lock_token(Some(SECRET.into()))
            .unwrap();
        assert_eq!(c.lock_token, Some(LockToken::new(SECRET)));
        let none = cli(&[]).unwrap().into_config_with_lock_token(None).unwrap();
        assert_eq!(none.lock_token, None);

        let dir = std::env::temp_dir().join(format!("executor-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, format!("{SECRET}\n")).unwrap();
        let path = file.to_str().unwrap();
        let c = cli(&["--lock-token-file", path])
            .unwrap()
            .into_config_with_lock_token(None)
            .unwrap();
        assert_eq!(
            c.lock_token,
            Some(LockToken::new(SECRET)),
            "the newline is not the token's"
        );

        let both = cli(&["--lock-token-file", path])
            .unwrap()
            .into_config_with_lock_token(Some(SECRET.into()))
            .unwrap_err();
        assert!(matches!(both, ConfigError::LockToken(_)), "{both:?}");
        let missing = cli(&["--lock-token-file", "/nonexistent/token"])
            .unwrap()
            .into_config_with_lock_token(None)
            .unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/token"), "{missing}");
        for bad in ["", "has space", "tab\there"] {
            let e = cli(&[])
                .unwrap()
                .into_config_with_lock_token(Some(bad.into()))
                .unwrap_err();
            assert!(matches!(e, ConfigError::LockToken(_)), "{bad:?}: {e:?}");
            assert!(bad.is_empty() || !e.to_string().contains(bad), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_never_shows_the_lock_token() {
        const SECRET: &str = "lock-client-token-0123456789abcdef";
        let c = cli(&[])
            .unwrap()
            .into_config_with_lock_token(Some(SECRET.into()))
            .unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains(SECRET), "{shown}");
        // The control: the field is there, only its value is hidden.
        assert!(
            shown.contains("lock_token: Some(LockToken(<redacted>))"),
            "{shown}"
        );
    }

    #[test]
    fn payout_ids_repeat_or_comma_separate() {
        let a = "00000000-0000-4000-8000-000000000001";
        let b = "00000000-0000-4000-8000-000000000002";
        let c = cli(&["--payout-id", a, "--payout-id", b])
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(c.payout_ids.len(), 2);
        let joined = format!("{a},{b}");
        let c = cli(&["--payout-id", &joined]).unwrap().into_config().unwrap();
        assert_eq!(c.payout_ids.len(), 2);
    }
}
