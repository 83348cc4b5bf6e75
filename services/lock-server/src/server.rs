//! Starting the server: in-process on an ephemeral port ([`spawn`], for tests, the client library's
//! tests and the demo) or for the binary ([`start`], which [`dlock_common::serve::main`] serves
//! until SIGTERM).

use std::net::SocketAddr;

use dlock_common::serve::{self, Background};
use dlock_common::tls::ServerTls;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{BackendConfig, Config, ConfigError};
use crate::reaper;
use crate::routes::app;
use crate::state::AppState;
use crate::store::Backend;
use crate::store::etcd::EtcdRepo;
use crate::store::postgres::{Repo, Statements};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    DatabaseUrl(#[source] dlock_common::db::UrlError),
    #[error("invalid etcd endpoints: {0}")]
    Etcd(#[source] Box<crate::error::Error>),
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The lockdb pool. Connections are opened lazily, so the server starts while lockdb is down and
/// `/readyz` reports it.
pub fn pool(config: &Config) -> Result<PgPool, StartError> {
    dlock_common::db::lazy_pool(
        &config.database_url,
        "lock-server",
        config.pool_max_connections,
        config.pool_acquire_timeout,
    )
    .map_err(StartError::DatabaseUrl)
}

/// A server running in this process. Dropping it stops it (without waiting); [`shutdown`](Self::shutdown)
/// stops it and waits.
#[derive(Debug)]
pub struct RunningServer {
    server: Background,
    state: AppState,
    // A child of the server's shutdown token, so dropping the server stops it too.
    reaper: Option<JoinHandle<()>>,
    /// The lockdb listener (PostgreSQL backend), likewise.
    hub: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://<addr>`, or `https://<addr>` with TLS, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.url()
    }

    /// The server's state (its repository and metrics), for tests.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops accepting, lets in-flight requests finish, stops the reaper, closes the pool.
    pub async fn shutdown(self) -> Result<(), StartError> {
        let Self {
            server,
            state,
            reaper,
            hub,
        } = self;
        let served = server.shutdown().await;
        if let Some(reaper) = reaper {
            reaper.await?;
        }
        if let Some(hub) = hub {
            hub.await?;
        }
        state.repo().close().await;
        Ok(served?)
    }
}

/// Starts the server in-process with the configured backend (PostgreSQL with the contract's
/// statements, or etcd) and returns once it is listening.
pub async fn spawn(config: Config) -> Result<RunningServer, StartError> {
    match &config.backend {
        BackendConfig::Postgres => {
            let stmts = if config.sequence_jump {
                Statements::C1
            } else {
                Statements::NO_JUMP
            };
            spawn_with_statements(config, stmts).await
        }
        BackendConfig::Etcd { endpoints, prefix } => {
            config.validate()?;
            // The binary checked the files when it read its configuration; in-process callers
            // get the same refusal here, before anything starts.
            if let Some(tls) = &config.etcd_tls {
                tls.check()?;
            }
            let repo = EtcdRepo::connect_tls(endpoints, prefix, config.etcd_tls.as_ref())
                .await
                .map_err(|e| StartError::Etcd(Box::new(e)))?;
            spawn_with_backend(config, Backend::Etcd(repo)).await
        }
    }
}

/// For negative controls only: [`spawn`] with a deliberately different statement set.
pub async fn spawn_with_statements(config: Config, stmts: Statements) -> Result<RunningServer, StartError> {
    config.validate()?;
    let backend = Backend::Postgres(Repo::with_statements(pool(&config)?, stmts));
    spawn_with_backend(config, backend).await
}

/// [`spawn`] over a given backend (the etcd negative controls pass a deliberately broken one).
pub async fn spawn_with_backend(config: Config, backend: Backend) -> Result<RunningServer, StartError> {
    config.validate()?;
    // Loaded before anything starts: a bad pair is a configuration error naming the file.
    let tls = ServerTls::start(
        config.tls.as_ref(),
        "bearer credentials (client and admin tokens) and signed grants",
    )
    .map_err(ConfigError::Tls)?;
    let shutdown = CancellationToken::new();
    let state = AppState::with_backend(backend, config.admin_token.clone())
        .with_config(&config)
        .with_signer(config.signer())
        .with_closing(shutdown.child_token());
    let listener = serve::bind(config.listen).await?;
    // The PostgreSQL backend's one listener (blocking acquires and watches); etcd pushes by itself.
    let hub = state.repo().listen(config.queue_faults, shutdown.child_token());
    let reaper = config
        .reaper_interval
        .map(|every| reaper::spawn(state.clone(), every, shutdown.child_token()));
    let server = serve::spawn_background_tls(listener, app(state.clone()), tls, shutdown)?;
    Ok(RunningServer {
        server,
        state,
        reaper,
        hub,
    })
}

/// The binary's start ([`dlock_common::serve::main`] then waits for SIGTERM/SIGINT and calls
/// [`RunningServer::shutdown`]): [`spawn`], after saying so when no admin token is configured.
pub async fn start(config: Config) -> Result<RunningServer, StartError> {
    // `spawn` validates the config; the binary's config was also validated by `Cli::into_config`.
    if config.admin_token.is_none() {
        tracing::warn!(
            event = "admin_disabled",
            "no admin token configured; admin endpoints answer 403"
        );
    }
    if !config.sequence_jump && config.backend == BackendConfig::Postgres {
        tracing::error!(
            event = "sequence_jump_disabled",
            "DLOCK_UNSAFE_NO_SEQUENCE_JUMP: fencing_token_seq is never jumped, so a promoted standby or a restored lockdb can hand out tokens it already handed out; for negative controls only"
        );
    }
    match &config.clients {
        None => tracing::warn!(
            event = "lock_clients_unauthenticated",
            setting = crate::config::CLIENTS_FILE_ENV,
            "no clients file configured: the lock API (sessions, acquire, renew, release, read, watch) is open to any client that can reach it"
        ),
        Some(clients) => tracing::info!(
            event = "lock_clients_configured",
            clients = %clients.names().collect::<Vec<_>>().join(","),
        ),
    }
    match &config.signing_key {
        None => tracing::warn!(
            event = "grant_signing_disabled",
            setting = crate::signing::SIGNING_KEY_ENV,
            "no grant signing key configured: grants carry no signature, and resources that verify grants (the default) refuse their tokens"
        ),
        Some(key) => tracing::info!(
            event = "grant_signing_enabled",
            key_id = %key.id(),
            lock_service_id = %config.lock_service_id,
        ),
    }
    spawn(config).await
}

impl serve::Server for RunningServer {
    type StopError = StartError;
    async fn stop(self) -> Result<(), StartError> {
        self.shutdown().await
    }
}

impl serve::StartFailure for StartError {
    fn is_config(&self) -> bool {
        matches!(self, StartError::Config(_) | StartError::DatabaseUrl(_))
    }
}
