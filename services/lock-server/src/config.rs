//! lock-server configuration: the [`Config`] the library runs with, and the binary's command line
//! ([`Cli`]), which reads flags and environment variables into it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dlock_common::tls::{TlsError, TlsFiles};
use dlock_grant::SigningKey;

use crate::clients::{Clients, ClientsError};
use crate::signing::{SIGNING_KEY_ENV, Signer};

/// The environment variable that may name the lock clients file (as `--clients-file` does).
pub const CLIENTS_FILE_ENV: &str = "DLOCK_CLIENTS_FILE";

/// Which store holds sessions and grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// lockdb, with C1's statements ([`Config::database_url`]).
    Postgres,
    /// etcd v3: the cluster's client URLs, and the key prefix everything lives under.
    Etcd { endpoints: Vec<String>, prefix: String },
}

/// The etcd backend's TLS: the CA that signs etcd's server certificates (`--etcd-ca-file`), the only
/// one trusted, and a client certificate for etcd's `--client-cert-auth` (`--etcd-cert-file`,
/// `--etcd-key-file`). The paths are not secret; the key's content is never logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    pub ca: PathBuf,
    pub client: Option<TlsFiles>,
}

impl EtcdTlsFiles {
    /// Reads and checks the files as the client will use them, and throws them away: the CA file
    /// must hold one or more certificates usable as trust anchors; the client pair must be one that
    /// can be presented (PEM, a key that matches the certificate, not expired). Each error names the
    /// file and what is wrong with it.
    pub fn check(&self) -> Result<(), ConfigError> {
        dlock_common::tls::check_ca_file(&self.ca).map_err(|reason| ConfigError::EtcdCaFile {
            path: self.ca.display().to_string(),
            reason,
        })?;
        if let Some(client) = &self.client {
            client.check().map_err(ConfigError::EtcdClientCert)?;
        }
        Ok(())
    }
}

/// The default key prefix of the etcd backend.
pub const DEFAULT_ETCD_PREFIX: &str = "/dlock/";

/// The default lock service id signed into every grant (the operator sets `<namespace>/<name>`).
pub const DEFAULT_LOCK_SERVICE_ID: &str = "dlock";
/// Longest lock service id: what a grant can carry.
pub const MAX_LOCK_SERVICE_ID_LEN: usize = dlock_grant::MAX_LOCK_SERVICE_BYTES;

/// Everything the server needs to run. Build it with [`Config::new`] and adjust the public fields.
#[derive(Clone)]
pub struct Config {
    /// The store: PostgreSQL (the default) or etcd.
    pub backend: BackendConfig,
    /// lockdb, as role `lockapp` (the sole writer of lockdb). Unused with the etcd backend.
    pub database_url: String,
    /// Where to listen; port 0 picks a free port (see [`crate::RunningServer::addr`]).
    pub listen: SocketAddr,
    /// Bearer token for `/v1/admin/*`. `None` turns admin endpoints off (403 `ADMIN_DISABLED`).
    pub admin_token: Option<String>,
    /// How often expired sessions are deleted. `None` disables the reaper.
    pub reaper_interval: Option<Duration>,
    /// Largest number of lockdb connections for sessions, renewals, reads and the admin paths.
    /// Acquires and releases run on [`crate::store::postgres::batch::MAX_IN_FLIGHT`] connections of
    /// their own beside these, so a replica opens at most this many plus that.
    pub pool_max_connections: u32,
    /// How long a request waits for a free connection before answering 503.
    pub pool_acquire_timeout: Duration,
    /// Named in every signed grant: which lock service issued it.
    pub lock_service_id: String,
    /// The key grants are signed with. `None`: answers carry no `grant` (a WARN at start-up), and
    /// resources that verify grants refuse their tokens.
    pub signing_key: Option<SigningKey>,
    /// The longest a blocking acquire waits here, whatever its `waitMs` asks (at most
    /// [`dlock_wire::lock::MAX_WAIT_MS`]); its answer at that point is `CONTENDED`, as at the end of
    /// any wait.
    pub max_wait: Duration,
    /// How long one watch stream stays open; the client then reconnects (a stream starts with the
    /// key's state).
    pub watch_max: Duration,
    /// For negative controls only: a deliberately broken queue. Production is [`QueueFaults::NONE`].
    pub queue_faults: QueueFaults,
    /// Jump `fencing_token_seq` before any grant on a lockdb history this process cannot vouch for
    /// ([`crate::store::postgres::epoch`]). `false` only for negative controls
    /// (`DLOCK_UNSAFE_NO_SEQUENCE_JUMP`): a promoted standby or a restored lockdb then hands out
    /// tokens it handed out before.
    pub sequence_jump: bool,
    /// The lock clients (`--clients-file`). `None`: the lock and session routes answer anyone who
    /// reaches them (a WARN at start-up); `Some`: each needs a client's bearer token and rights.
    pub clients: Option<Clients>,
    /// The certificate and key files of HTTPS (`--tls-cert-file`, `--tls-key-file`). `Some`: the
    /// listen address serves HTTPS only, and the files are re-read when they change; `None`: plain
    /// HTTP (a WARN at start-up).
    pub tls: Option<TlsFiles>,
    /// TLS to etcd (`--etcd-ca-file`, `--etcd-cert-file`, `--etcd-key-file`): `Some` exactly when
    /// the etcd endpoints are `https://`.
    pub etcd_tls: Option<EtcdTlsFiles>,
}

/// Deliberately broken queues, for the negative controls of the blocking acquire only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueFaults {
    /// A release wakes every waiter of the key, not only the head (a thundering herd).
    pub wake_every_waiter: bool,
    /// The newest waiter is served first (LIFO), not the oldest.
    pub lifo: bool,
    /// A blocking acquire takes a free key without looking whether anyone is queued for it (it
    /// jumps the queue while the head is being handed the key).
    pub barge: bool,
}

impl QueueFaults {
    pub const NONE: QueueFaults = QueueFaults {
        wake_every_waiter: false,
        lifo: false,
        barge: false,
    };
}

impl Config {
    /// Defaults suited to running in-process: an ephemeral port on loopback, no admin token, the
    /// reaper every second, 10 connections.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            backend: BackendConfig::Postgres,
            database_url: database_url.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_token: None,
            reaper_interval: Some(Duration::from_secs(1)),
            pool_max_connections: 10,
            pool_acquire_timeout: Duration::from_secs(5),
            lock_service_id: DEFAULT_LOCK_SERVICE_ID.to_owned(),
            signing_key: None,
            max_wait: Duration::from_millis(dlock_wire::lock::MAX_WAIT_MS.unsigned_abs()),
            watch_max: Duration::from_secs(300),
            queue_faults: QueueFaults::NONE,
            sequence_jump: true,
            clients: None,
            tls: None,
            etcd_tls: None,
        }
    }

    /// Speaks TLS to etcd (its endpoints must be `https://`), trusting `files.ca` alone.
    pub fn with_etcd_tls(mut self, files: EtcdTlsFiles) -> Self {
        self.etcd_tls = Some(files);
        self
    }

    /// Serves HTTPS with the certificate and key in `files`.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Requires a client's bearer token and rights on every lock and session route.
    pub fn with_clients(mut self, clients: Clients) -> Self {
        self.clients = Some(clients);
        self
    }

    /// Signs every grant with `key`.
    pub fn with_signing_key(mut self, key: Option<SigningKey>) -> Self {
        self.signing_key = key;
        self
    }

    pub fn with_lock_service_id(mut self, id: impl Into<String>) -> Self {
        self.lock_service_id = id.into();
        self
    }

    /// What the handlers sign with, if there is a key.
    pub fn signer(&self) -> Option<Signer> {
        self.signing_key
            .clone()
            .map(|key| Signer::new(self.lock_service_id.clone(), key))
    }

    /// [`Config::new`] for the etcd backend.
    pub fn etcd(endpoints: Vec<String>, prefix: impl Into<String>) -> Self {
        Self {
            backend: BackendConfig::Etcd {
                endpoints,
                prefix: prefix.into(),
            },
            ..Self::new(String::new())
        }
    }

    pub fn with_admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Some(token.into());
        self
    }

    pub fn with_listen(mut self, listen: SocketAddr) -> Self {
        self.listen = listen;
        self
    }

    pub fn with_reaper_interval(mut self, interval: Option<Duration>) -> Self {
        self.reaper_interval = interval;
        self
    }

    /// Refuses settings that would make the server unsafe or useless.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.backend {
            BackendConfig::Postgres if self.database_url.trim().is_empty() => {
                return Err(ConfigError::MissingDatabaseUrl);
            }
            BackendConfig::Postgres if self.etcd_tls.is_some() => {
                return Err(ConfigError::EtcdTlsWithoutEtcd);
            }
            BackendConfig::Etcd { endpoints, prefix } => {
                let https = endpoints.iter().filter(|e| e.starts_with("https://")).count();
                let http = endpoints.iter().filter(|e| e.starts_with("http://")).count();
                if endpoints.is_empty() || http + https != endpoints.len() {
                    return Err(ConfigError::EtcdEndpoints);
                }
                // One cluster, one way to reach it: a mix would send some calls in cleartext.
                if http > 0 && https > 0 {
                    return Err(ConfigError::EtcdMixedSchemes);
                }
                match (https > 0, &self.etcd_tls) {
                    // Without a CA of its own the client would need the system's roots, which
                    // would trust any public certificate for the endpoint's name.
                    (true, None) => return Err(ConfigError::EtcdHttpsWithoutCa),
                    // Certificates with http:// endpoints would suggest an encryption there is not.
                    (false, Some(_)) => return Err(ConfigError::EtcdTlsWithoutHttps),
                    _ => {}
                }
                if prefix.is_empty() || !prefix.ends_with('/') {
                    return Err(ConfigError::EtcdPrefix);
                }
            }
            _ => {}
        }
        // An empty token would let `Authorization: Bearer ` through.
        if self.admin_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(ConfigError::EmptyAdminToken);
        }
        // One bearer value must mean one role: the admin's token cannot also be a client's.
        if let (Some(admin), Some(clients)) = (&self.admin_token, &self.clients)
            && let Some(client) = clients.holding_token(admin)
        {
            return Err(ConfigError::ClientTokenIsAdminToken(client.to_owned()));
        }
        // On lockdb one connection of the pool is the listener's (`LISTEN`, held for the process's
        // life): a pool of one would leave none for the statements, and every request would wait
        // out the pool's timeout.
        let least = match self.backend {
            BackendConfig::Postgres => 2,
            BackendConfig::Etcd { .. } => 1,
        };
        if self.pool_max_connections < least {
            return Err(ConfigError::PoolSize(least));
        }
        let id = &self.lock_service_id;
        if id.is_empty() || id.len() > MAX_LOCK_SERVICE_ID_LEN || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::LockServiceId);
        }
        if self
            .reaper_interval
            .is_some_and(|i| i < Duration::from_millis(10))
        {
            return Err(ConfigError::ReaperInterval);
        }
        if self.max_wait.as_millis() > u128::from(dlock_wire::lock::MAX_WAIT_MS.unsigned_abs()) {
            return Err(ConfigError::MaxWait);
        }
        if self.watch_max < Duration::from_millis(10) {
            return Err(ConfigError::WatchMax);
        }
        Ok(())
    }
}

// Hand-written so that the admin token and the database URL (which may hold a password) never reach logs.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend)
            .field("database_url", &"<redacted>")
            .field("listen", &self.listen)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<redacted>"))
            .field("reaper_interval", &self.reaper_interval)
            .field("pool_max_connections", &self.pool_max_connections)
            .field("pool_acquire_timeout", &self.pool_acquire_timeout)
            .field("lock_service_id", &self.lock_service_id)
            .field("signing_key", &self.signing_key)
            .field("max_wait", &self.max_wait)
            .field("watch_max", &self.watch_max)
            .field("queue_faults", &self.queue_faults)
            .field("sequence_jump", &self.sequence_jump)
            .field("clients", &self.clients)
            .field("tls", &self.tls)
            .field("etcd_tls", &self.etcd_tls)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no database URL: pass --database-url or set DATABASE_URL")]
    MissingDatabaseUrl,
    #[error("the admin token is empty; set a non-empty token or none at all")]
    EmptyAdminToken,
    #[error(
        "the etcd backend needs --etcd-endpoints: one or more comma-separated client URLs, http:// or https://"
    )]
    EtcdEndpoints,
    #[error("the etcd endpoints mix http:// and https://: give all of them in one scheme")]
    EtcdMixedSchemes,
    #[error(
        "the etcd endpoints are https:// but no CA is given: pass --etcd-ca-file (DLOCK_ETCD_CA_FILE), the CA certificate that signs etcd's server certificates"
    )]
    EtcdHttpsWithoutCa,
    #[error(
        "--etcd-ca-file / --etcd-cert-file / --etcd-key-file are for https:// etcd endpoints, and the endpoints are http://: use https:// client URLs, or drop the TLS flags"
    )]
    EtcdTlsWithoutHttps,
    #[error("--etcd-ca-file / --etcd-cert-file / --etcd-key-file are for the etcd backend (--backend etcd)")]
    EtcdTlsWithoutEtcd,
    #[error(
        "the etcd client certificate needs both files: --etcd-{given}-file is given, --etcd-{missing}-file is not (DLOCK_ETCD_CERT_FILE and DLOCK_ETCD_KEY_FILE)"
    )]
    EtcdClientHalf {
        given: &'static str,
        missing: &'static str,
    },
    #[error(
        "--etcd-cert-file / --etcd-key-file need --etcd-ca-file: a client certificate is presented over TLS, to https:// endpoints"
    )]
    EtcdClientWithoutCa,
    #[error("the etcd CA file {path} (--etcd-ca-file): {reason}")]
    EtcdCaFile { path: String, reason: String },
    #[error("the etcd client certificate (--etcd-cert-file / --etcd-key-file): {0}")]
    EtcdClientCert(#[source] TlsError),
    #[error("the etcd key prefix must be non-empty and end with '/'")]
    EtcdPrefix,
    #[error(
        "the pool needs at least {0} connection(s) (on lockdb one is the listener's, held for the process's life)"
    )]
    PoolSize(u32),
    #[error("the reaper interval must be at least 10 ms (0 disables the reaper)")]
    ReaperInterval,
    #[error("the longest wait of a blocking acquire is 0..=60000 ms")]
    MaxWait,
    #[error("a watch stream must stay open at least 10 ms")]
    WatchMax,
    #[error("cannot read the admin token file {path}: {source}")]
    AdminTokenFile { path: String, source: std::io::Error },
    #[error("give the admin token either in --admin-token-file or in DLOCK_ADMIN_TOKEN, not both")]
    AdminTokenTwice,
    #[error("the lock service id must be 1..={MAX_LOCK_SERVICE_ID_LEN} visible ASCII characters")]
    LockServiceId,
    #[error("the grant signing key: {0}")]
    SigningKey(String),
    #[error("{0}")]
    Clients(#[from] ClientsError),
    #[error(
        "the clients file is not valid: client {0:?}: token: it is the admin token; the admin and each client need their own"
    )]
    ClientTokenIsAdminToken(String),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// The grant signing key from `DLOCK_GRANT_SIGNING_KEY` or the file `DLOCK_GRANT_SIGNING_KEY_FILE`
/// names (both set is an error; the rules of every credential, `dlock_common::auth`). `None` when
/// neither is set. Never a flag: it would show in a process listing.
pub fn signing_key_from_env() -> Result<Option<SigningKey>, ConfigError> {
    let Some(text) = dlock_common::auth::Credential::from_env(SIGNING_KEY_ENV)
        .map_err(|e| ConfigError::SigningKey(e.to_string()))?
    else {
        return Ok(None);
    };
    SigningKey::parse(text.expose())
        .map(Some)
        .map_err(|e| ConfigError::SigningKey(format!("{SIGNING_KEY_ENV}: {e}")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Postgres,
    Etcd,
}

/// The environment variable that may carry the admin bearer token.
pub const ADMIN_TOKEN_ENV: &str = "DLOCK_ADMIN_TOKEN";

/// `lock-server`: the dlock lock service, sole writer of lockdb.
///
/// The admin bearer token (for `POST /v1/admin/locks/{key}/revoke`) comes from
/// `--admin-token-file` or the environment variable `DLOCK_ADMIN_TOKEN`; it is deliberately not a
/// flag, so that it never shows in a process listing. Without it admin endpoints answer 403.
///
/// The grant signing key (`<keyId>=<base64url seed>`) comes from `DLOCK_GRANT_SIGNING_KEY` or the
/// file `DLOCK_GRANT_SIGNING_KEY_FILE` names, never a flag. Without it grants are not signed.
#[derive(Debug, clap::Parser)]
#[command(name = "lock-server", version, about)]
pub struct Cli {
    /// Where sessions and grants live: `postgres` (lockdb) or `etcd`.
    #[arg(long, env = "DLOCK_BACKEND", value_enum, default_value_t = BackendKind::Postgres)]
    pub backend: BackendKind,

    /// lockdb connection URL, as role lockapp (the postgres backend).
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        required_if_eq("backend", "postgres")
    )]
    pub database_url: Option<String>,

    /// etcd client URLs, comma-separated (the etcd backend).
    #[arg(long, env = "DLOCK_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// Key prefix of the etcd backend.
    #[arg(long, env = "DLOCK_ETCD_PREFIX", default_value = DEFAULT_ETCD_PREFIX)]
    pub etcd_prefix: String,

    /// The CA certificate (PEM) that signs etcd's server certificates: required with https://
    /// endpoints, whose certificates are verified against it alone (and must name the endpoint's
    /// host); refused with http:// ones.
    #[arg(long, env = "DLOCK_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,

    /// A client certificate (PEM, leaf first) for etcd's `--client-cert-auth`, with
    /// `--etcd-key-file`; both or neither.
    #[arg(long, env = "DLOCK_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,

    /// The private key (PEM) of `--etcd-cert-file`.
    #[arg(long, env = "DLOCK_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,

    /// Address to listen on.
    #[arg(long, env = "DLOCK_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// File holding the admin bearer token (surrounding whitespace is ignored).
    #[arg(long, env = "DLOCK_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Named in every signed grant: which lock service issued it.
    #[arg(long, env = dlock_common::grant::LOCK_SERVICE_ID_ENV, default_value = DEFAULT_LOCK_SERVICE_ID)]
    pub lock_service_id: String,

    /// Reaper period in milliseconds; 0 disables the reaper.
    #[arg(long, env = "DLOCK_REAPER_INTERVAL_MS", default_value_t = 1000)]
    pub reaper_interval_ms: u64,

    /// The longest a blocking acquire waits here, in milliseconds (0..=60000), whatever its `waitMs`
    /// asks; it then answers CONTENDED, as at the end of any wait.
    #[arg(long, env = "DLOCK_MAX_WAIT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub max_wait_ms: u64,

    /// How long one watch stream stays open, in milliseconds; clients reconnect (each stream starts
    /// with the key's state).
    #[arg(long, env = "DLOCK_WATCH_MAX_MS", default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(10..=86_400_000))]
    pub watch_max_ms: u64,

    /// For negative controls only: never jump the fencing sequence, so a promoted standby or a
    /// restored lockdb can hand out tokens it already handed out. Logged as an ERROR at start-up.
    #[arg(long, env = "DLOCK_UNSAFE_NO_SEQUENCE_JUMP", hide = true,
          value_parser = clap::builder::FalseyValueParser::new())]
    pub unsafe_no_sequence_jump: bool,

    /// The lock clients file (JSON: each client's name, bearer token, key prefixes, owner prefixes
    /// and operations; docs/lock-api.md). Without it the lock API answers anyone who reaches it.
    #[arg(long, env = CLIENTS_FILE_ENV)]
    pub clients_file: Option<PathBuf>,

    /// HTTPS: `--tls-cert-file`, `--tls-key-file` (the same flags in every server).
    #[command(flatten)]
    pub tls: dlock_common::tls::TlsArgs,

    /// lockdb pool: `--db-max-connections`, `--db-acquire-timeout-ms` (the same flags in every
    /// service with a database).
    #[command(flatten)]
    pub pool: dlock_common::db::PoolArgs,
}

impl Cli {
    /// Builds the [`Config`]; `env_token` is the value of [`ADMIN_TOKEN_ENV`], if set.
    pub fn into_config(self, env_token: Option<String>) -> Result<Config, ConfigError> {
        let file_token = match &self.admin_token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::AdminTokenFile {
                        path: path.display().to_string(),
                        source,
                    })?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        let admin_token = match (file_token, env_token) {
            (Some(_), Some(_)) => return Err(ConfigError::AdminTokenTwice),
            (Some(t), None) | (None, Some(t)) => Some(t),
            (None, None) => None,
        };
        let backend = match self.backend {
            BackendKind::Postgres => BackendConfig::Postgres,
            BackendKind::Etcd => BackendConfig::Etcd {
                endpoints: self.etcd_endpoints,
                prefix: self.etcd_prefix,
            },
        };
        let tls = self.tls.into_files()?;
        let client = match (self.etcd_cert_file, self.etcd_key_file) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::EtcdClientHalf {
                    given: "cert",
                    missing: "key",
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::EtcdClientHalf {
                    given: "key",
                    missing: "cert",
                });
            }
        };
        let etcd_tls = match (self.etcd_ca_file, client) {
            (Some(ca), client) => Some(EtcdTlsFiles { ca, client }),
            (None, None) => None,
            (None, Some(_)) => return Err(ConfigError::EtcdClientWithoutCa),
        };
        let config = Config {
            backend,
            database_url: self.database_url.unwrap_or_default(),
            listen: self.listen,
            admin_token,
            reaper_interval: (self.reaper_interval_ms > 0)
                .then(|| Duration::from_millis(self.reaper_interval_ms)),
            pool_max_connections: self.pool.db_max_connections,
            pool_acquire_timeout: self.pool.acquire_timeout(),
            lock_service_id: self.lock_service_id,
            signing_key: None,
            max_wait: Duration::from_millis(self.max_wait_ms),
            watch_max: Duration::from_millis(self.watch_max_ms),
            queue_faults: QueueFaults::NONE,
            sequence_jump: !self.unsafe_no_sequence_jump,
            clients: match &self.clients_file {
                Some(path) => Some(Clients::from_file(path)?),
                None => None,
            },
            tls,
            etcd_tls,
        };
        config.validate()?;
        // After the endpoints are checked, so that a flag that does not belong is said as such
        // rather than as a file that cannot be read.
        if let Some(etcd_tls) = &config.etcd_tls {
            etcd_tls.check()?;
        }
        Ok(config)
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

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec![
            "lock-server",
            "--database-url",
            "postgres://lockapp@127.0.0.1/lockdb",
        ];
        all.extend_from_slice(args);
        parse(all).unwrap()
    }

    #[test]
    fn defaults() {
        let c = cli(&[]).into_config(None).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.admin_token, None);
        assert_eq!(c.reaper_interval, Some(Duration::from_secs(1)));
        assert_eq!(
            c.pool_max_connections, 16,
            "the default of every service (dlock_common::db::PoolArgs)"
        );
        assert!(
            c.sequence_jump,
            "the jump is on unless a negative control turns it off"
        );
        assert!(
            !cli(&["--unsafe-no-sequence-jump"])
                .into_config(None)
                .unwrap()
                .sequence_jump
        );
    }

    /// On lockdb the listener holds one connection of the pool for good: a pool of one would leave
    /// the statements none (every request waited out the pool's timeout: 503), so it is refused.
    #[test]
    fn a_lockdb_pool_has_room_for_the_listener() {
        assert!(matches!(
            cli(&["--db-max-connections", "1"]).into_config(None),
            Err(ConfigError::PoolSize(2))
        ));
        let c = cli(&["--db-max-connections", "2"]).into_config(None).unwrap();
        assert_eq!(c.pool_max_connections, 2);
    }

    #[test]
    fn reaper_zero_disables_and_tiny_is_refused() {
        let c = cli(&["--reaper-interval-ms", "0"]).into_config(None).unwrap();
        assert_eq!(c.reaper_interval, None);
        assert!(matches!(
            cli(&["--reaper-interval-ms", "5"]).into_config(None),
            Err(ConfigError::ReaperInterval)
        ));
    }

    #[test]
    fn admin_token_from_env_or_file_not_both_not_empty() {
        let c = cli(&[]).into_config(Some("s3cret".into())).unwrap();
        assert_eq!(c.admin_token.as_deref(), Some("s3cret"));
        assert!(matches!(
            cli(&[]).into_config(Some("  ".into())),
            Err(ConfigError::EmptyAdminToken)
        ));

        let path = std::env::temp_dir().join(format!("lock-server-token-{}", std::process::id()));
        std::fs::write(&path, "from-file\n").unwrap();
        let p = path.to_str().unwrap();
        let c = cli(&["--admin-token-file", p]).into_config(None).unwrap();
        assert_eq!(c.admin_token.as_deref(), Some("from-file"));
        assert!(matches!(
            cli(&["--admin-token-file", p]).into_config(Some("x".into())),
            Err(ConfigError::AdminTokenTwice)
        ));
        let _ = std::fs::remove_file(&path);
        assert!(matches!(
            cli(&["--admin-token-file", p]).into_config(None),
            Err(ConfigError::AdminTokenFile { .. })
        ));
    }

    #[test]
    fn etcd_backend_needs_endpoints_not_a_database_url() {
        let c = parse([
            "lock-server",
            "--backend",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,http://127.0.0.1:2381",
        ])
        .unwrap()
        .into_config(None)
        .unwrap();
        assert_eq!(
            c.backend,
            BackendConfig::Etcd {
                endpoints: vec!["http://127.0.0.1:2379".into(), "http://127.0.0.1:2381".into()],
                prefix: DEFAULT_ETCD_PREFIX.into()
            }
        );
        assert!(matches!(
            parse(["lock-server", "--backend", "etcd"])
                .unwrap()
                .into_config(None),
            Err(ConfigError::EtcdEndpoints)
        ));
        assert!(
            matches!(
                parse(["lock-server"]).unwrap().into_config(None),
                Err(ConfigError::MissingDatabaseUrl)
            ),
            "postgres needs --database-url"
        );
    }

    #[test]
    fn debug_redacts_secrets() {
        let key = SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
        let seed = key.expose_text().split_once('=').unwrap().1.to_owned();
        let c = Config::new("postgres://lockapp:pw@h/db")
            .with_admin_token("s3cret")
            .with_signing_key(Some(key));
        let text = format!("{c:?}");
        assert!(
            !text.contains("s3cret") && !text.contains("pw@") && !text.contains(&seed),
            "{text}"
        );
        assert!(text.contains("k1"), "the key id is not secret: {text}");
    }

    const CLIENT_TOKEN: &str = "payments-client-token-0123456789abcdef";

    fn clients_file(name: &str, body: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("lock-server-clients-{name}-{}", std::process::id()));
        std::fs::write(&path, body).unwrap();
        path
    }

    fn payments_file() -> String {
        serde_json::json!({"clients": [{"name": "payments", "token": CLIENT_TOKEN,
            "keyPrefixes": ["account:"], "ownerPrefixes": ["payments-"], "operations": ["lock"]}]})
        .to_string()
    }

    #[test]
    fn clients_come_from_the_clients_file_and_a_bad_one_is_refused() {
        assert!(cli(&[]).into_config(None).unwrap().clients.is_none());
        let good = clients_file("good", &payments_file());
        let c = cli(&["--clients-file", good.to_str().unwrap()])
            .into_config(None)
            .unwrap();
        let names: Vec<&str> = c.clients.as_ref().unwrap().names().collect();
        assert_eq!(names, ["payments"]);

        // The admin's token cannot be a client's as well.
        let e = cli(&["--clients-file", good.to_str().unwrap()])
            .into_config(Some(CLIENT_TOKEN.into()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"payments\"") && e.contains("admin token") && !e.contains(CLIENT_TOKEN),
            "{e}"
        );
        let _ = std::fs::remove_file(&good);

        let bad = clients_file("bad", &payments_file().replace("\"lock\"", "\"lock\", \"write\""));
        let e = cli(&["--clients-file", bad.to_str().unwrap()])
            .into_config(None)
            .unwrap_err();
        assert!(matches!(e, ConfigError::Clients(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("\"payments\"") && text.contains("operations") && !text.contains(CLIENT_TOKEN),
            "{text}"
        );
        let _ = std::fs::remove_file(&bad);
        assert!(matches!(
            cli(&["--clients-file", bad.to_str().unwrap()]).into_config(None),
            Err(ConfigError::Clients(ClientsError::Read { .. }))
        ));
    }

    #[test]
    fn debug_redacts_client_tokens() {
        let c =
            Config::new("postgres://lockapp@h/db").with_clients(Clients::parse(&payments_file()).unwrap());
        let text = format!("{c:?}");
        assert!(!text.contains(CLIENT_TOKEN), "{text}");
        assert!(text.contains("payments") && text.contains("account:"), "{text}");
    }

    #[test]
    fn tls_files_come_in_pairs_and_are_checked_at_start_up() {
        assert_eq!(cli(&[]).into_config(None).unwrap().tls, None);
        let e = cli(&["--tls-cert-file", "/nonexistent/tls.crt"])
            .into_config(None)
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::Tls(TlsError::Half { missing: "key", .. })),
            "{e:?}"
        );
        let e = cli(&["--tls-key-file", "/nonexistent/tls.key"])
            .into_config(None)
            .unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Tls(TlsError::Half {
                    missing: "certificate",
                    ..
                })
            ),
            "{e:?}"
        );
        // Both given: the files are read now, and the error names the one that is missing.
        let e = cli(&[
            "--tls-cert-file",
            "/nonexistent/tls.crt",
            "--tls-key-file",
            "/nonexistent/tls.key",
        ])
        .into_config(None)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/nonexistent/tls.crt") && e.contains("cannot read"),
            "{e}"
        );
    }

    fn etcd(args: &[&str]) -> Result<Config, ConfigError> {
        let mut all = vec!["lock-server", "--backend", "etcd"];
        all.extend_from_slice(args);
        parse(all).unwrap().into_config(None)
    }

    const HTTPS: &str = "https://127.0.0.1:2379";
    const HTTP: &str = "http://127.0.0.1:2379";

    #[test]
    fn etcd_tls_flags_follow_the_scheme_of_the_endpoints() {
        let e = etcd(&["--etcd-endpoints", HTTPS]).unwrap_err();
        assert!(matches!(e, ConfigError::EtcdHttpsWithoutCa), "{e:?}");
        assert!(e.to_string().contains("--etcd-ca-file"), "{e}");
        let e = etcd(&["--etcd-endpoints", HTTP, "--etcd-ca-file", "/nonexistent/ca.crt"]).unwrap_err();
        assert!(matches!(e, ConfigError::EtcdTlsWithoutHttps), "{e:?}");
        let e = etcd(&[
            "--etcd-endpoints",
            &format!("{HTTPS},{HTTP}"),
            "--etcd-ca-file",
            "/x",
        ])
        .unwrap_err();
        assert!(matches!(e, ConfigError::EtcdMixedSchemes), "{e:?}");
        let e = etcd(&["--etcd-endpoints", "127.0.0.1:2379"]).unwrap_err();
        assert!(matches!(e, ConfigError::EtcdEndpoints), "{e:?}");
        let e = cli(&["--etcd-ca-file", "/x"]).into_config(None).unwrap_err();
        assert!(matches!(e, ConfigError::EtcdTlsWithoutEtcd), "{e:?}");
    }

    #[test]
    fn the_etcd_client_certificate_comes_in_pairs_and_with_a_ca() {
        let https = ["--etcd-endpoints", HTTPS, "--etcd-ca-file", "/nonexistent/ca.crt"];
        let e = etcd(&[&https[..], &["--etcd-cert-file", "/c.crt"]].concat()).unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::EtcdClientHalf {
                    given: "cert",
                    missing: "key"
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("--etcd-key-file is not"), "{e}");
        let e = etcd(&[&https[..], &["--etcd-key-file", "/c.key"]].concat()).unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::EtcdClientHalf {
                    given: "key",
                    missing: "cert"
                }
            ),
            "{e:?}"
        );
        let e = etcd(&[
            "--etcd-endpoints",
            HTTPS,
            "--etcd-cert-file",
            "/c.crt",
            "--etcd-key-file",
            "/c.key",
        ])
        .unwrap_err();
        assert!(matches!(e, ConfigError::EtcdClientWithoutCa), "{e:?}");
    }

    #[test]
    fn etcd_tls_files_are_read_and_checked_at_start_up() {
        let ca = dlock_testkit::pg::TestCa::new("config-etcd").unwrap();
        let client = ca.issue_client("client", "lock-server").unwrap();
        let other = ca.issue_client("other", "lock-server").unwrap();
        let ca_file = ca.cert().to_str().unwrap();
        let (cert, key) = (client.cert.to_str().unwrap(), client.key.to_str().unwrap());

        let c = etcd(&[
            "--etcd-endpoints",
            HTTPS,
            "--etcd-ca-file",
            ca_file,
            "--etcd-cert-file",
            cert,
            "--etcd-key-file",
            key,
        ])
        .unwrap();
        assert_eq!(
            c.etcd_tls,
            Some(EtcdTlsFiles {
                ca: ca.cert().to_owned(),
                client: Some(TlsFiles {
                    cert: client.cert.clone(),
                    key: client.key.clone()
                })
            })
        );
        // Paths may be logged; the key's content never is.
        let shown = format!("{c:?}");
        let key_pem = std::fs::read_to_string(&client.key).unwrap();
        assert!(shown.contains(key) && !shown.contains(key_pem.trim()), "{shown}");
        // The CA alone: etcd without client certificate auth.
        let c = etcd(&["--etcd-endpoints", HTTPS, "--etcd-ca-file", ca_file]).unwrap();
        assert_eq!(c.etcd_tls.unwrap().client, None);

        let e = etcd(&["--etcd-endpoints", HTTPS, "--etcd-ca-file", "/nonexistent/ca.crt"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/nonexistent/ca.crt") && e.contains("cannot read it"),
            "{e}"
        );
        // A key file as the CA: PEM, but no certificate in it.
        let e = etcd(&["--etcd-endpoints", HTTPS, "--etcd-ca-file", key])
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("not PEM"), "{e}");
        // A key that belongs to another certificate.
        let e = etcd(&[
            "--etcd-endpoints",
            HTTPS,
            "--etcd-ca-file",
            ca_file,
            "--etcd-cert-file",
            cert,
            "--etcd-key-file",
            other.key.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(
            matches!(e, ConfigError::EtcdClientCert(TlsError::KeyMismatch { .. })),
            "{e:?}"
        );
        assert!(e.to_string().contains("does not match"), "{e}");
    }

    #[test]
    fn the_etcd_tls_flags_are_read_from_the_environment_too() {
        let cmd = <Cli as clap::CommandFactory>::command();
        for (id, env) in [
            ("etcd_ca_file", "DLOCK_ETCD_CA_FILE"),
            ("etcd_cert_file", "DLOCK_ETCD_CERT_FILE"),
            ("etcd_key_file", "DLOCK_ETCD_KEY_FILE"),
        ] {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new(env)), "{id}");
        }
    }

    #[test]
    fn the_lock_service_id_is_checked() {
        assert_eq!(
            cli(&[]).into_config(None).unwrap().lock_service_id,
            DEFAULT_LOCK_SERVICE_ID
        );
        let c = cli(&["--lock-service-id", "payments/locks"])
            .into_config(None)
            .unwrap();
        assert_eq!(c.lock_service_id, "payments/locks");
        for bad in ["", "has space", &"x".repeat(MAX_LOCK_SERVICE_ID_LEN + 1)] {
            assert!(
                matches!(
                    cli(&["--lock-service-id", bad]).into_config(None),
                    Err(ConfigError::LockServiceId)
                ),
                "{bad:?}"
            );
        }
    }
}
