//! payment-resource: the protected resource over paydb. Accounts, payouts and the ledger, with the
//! fenced writes (a)(b)(c) in one transaction ([`posting`]), the payout lifecycle ([`payouts`]),
//! reconciliation ([`reconcile`]) and the HTTP API ([`api`]).
//!
//! - [`sql`]: every statement, each once; [`repo`]: one function per statement;
//! - [`config`]: settings, including the `payment.fencing.enabled` kill switch and grant
//!   verification (`PAYMENT_GRANT_VERIFICATION_ENABLED`, on by default);
//! - [`error`]: the one error enum, mapped to HTTP at the edge; [`metrics`]: `lock_fenced_out` & co.;
//! - [`monitor`]: reconciliation and the open-payout count on an interval, into the metrics.

pub mod accounts;
pub mod api;
pub mod config;
pub mod error;
pub mod metrics;
pub mod model;
pub mod monitor;
pub mod payouts;
pub mod posting;
pub mod reconcile;
pub mod repo;
pub mod sql;
pub mod validate;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use dlock_common::serve::Background;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use config::{Config, Fencing};
pub use error::PaymentError;

use crate::accounts::Accounts;
use crate::api::AppState;
use crate::metrics::Metrics;
use crate::payouts::Payouts;
use crate::posting::Posting;
use crate::sql::Statements;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    DatabaseUrl(#[from] dlock_common::db::UrlError),
    #[error("{0}")]
    Grants(#[from] dlock_common::grant::GrantConfigError),
    #[error("{0}")]
    Tls(#[from] dlock_common::tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl dlock_common::serve::StartFailure for StartError {
    fn is_config(&self) -> bool {
        matches!(
            self,
            StartError::DatabaseUrl(_) | StartError::Grants(_) | StartError::Tls(_)
        )
    }
}

/// A pool for paydb. Lazy: the service starts (and `/readyz` says 503) before the database answers.
pub fn pool(config: &Config) -> Result<PgPool, dlock_common::db::UrlError> {
    dlock_common::db::lazy_pool(
        &config.database_url,
        "payment-resource",
        config.max_connections,
        config.acquire_timeout,
    )
}

/// The wired service: router plus the parts tests and the demo may want to look at.
#[derive(Debug)]
pub struct App {
    pub router: Router,
    pub pool: PgPool,
    pub metrics: Arc<Metrics>,
}

/// Builds the service from its configuration (no I/O yet). Grant verification on without a key is
/// refused here: a configuration error, nothing started.
pub fn app(config: &Config) -> Result<App, StartError> {
    config.grants.validate(config::GRANT_VERIFICATION_SETTING)?;
    config
        .grants
        .announce("payment-resource", config::GRANT_VERIFICATION_SETTING);
    if !config.fencing.is_enabled() {
        tracing::warn!(
            event = "fencing_disabled",
            key = "payment.fencing.enabled",
            "payment.fencing.enabled=false: statements (a)(b)(c) run WITHOUT their fence predicates; a stale holder can corrupt balances"
        );
    }
    config
        .credentials
        .warn_missing("payment-resource", config::CREDENTIALS_PREFIX, config::ROLES);
    let pool = pool(config)?;
    let (metrics, registry) = Metrics::new();
    let metrics = Arc::new(metrics);
    let state = AppState {
        pool: pool.clone(),
        metrics: metrics.clone(),
        credentials: Arc::new(config.credentials.clone()),
        grants: dlock_common::grant::GrantGate {
            policy: config.grants.clone(),
            metrics: metrics.grants.clone(),
        },
        accounts: Accounts::new(pool.clone()),
        payouts: Payouts::new(pool.clone(), metrics.clone())
            .with_statements(Statements::for_fencing(config.fencing)),
        posting: Posting::new(
            pool.clone(),
            Statements::for_fencing(config.fencing),
            metrics.clone(),
        ),
    };
    Ok(App {
        router: api::router(state, Arc::new(registry)),
        pool,
        metrics,
    })
}

/// A server running in-process (tests, the demo, the binary).
#[derive(Debug)]
pub struct RunningServer {
    pub pool: PgPool,
    pub metrics: Arc<Metrics>,
    server: Background,
    monitor: monitor::Monitor,
}

impl RunningServer {
    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS)
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Graceful stop: in-flight requests finish, the periodic checks stop, then the pool closes.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let served = self.server.shutdown().await;
        self.monitor.stop().await;
        self.pool.close().await;
        served
    }
}

impl dlock_common::serve::Server for RunningServer {
    type StopError = std::io::Error;
    async fn stop(self) -> std::io::Result<()> {
        self.shutdown().await
    }
}

/// Starts the service on `config.listen` (port 0: an ephemeral port) and returns once it is bound.
pub async fn spawn(config: Config) -> Result<RunningServer, StartError> {
    // Loaded before anything starts: a bad pair is a configuration error naming the file.
    let tls =
        dlock_common::tls::ServerTls::start(config.tls.as_ref(), "bearer credentials and signed grants")?;
    let app = app(&config)?;
    let bind_error = |source| StartError::Bind {
        addr: config.listen,
        source,
    };
    let listener = dlock_common::serve::bind(config.listen)
        .await
        .map_err(bind_error)?;
    let server =
        dlock_common::serve::spawn_background_tls(listener, app.router, tls, CancellationToken::new())
            .map_err(bind_error)?;
    let monitor = monitor::Monitor::start(app.pool.clone(), app.metrics.clone(), config.monitor);
    Ok(RunningServer {
        pool: app.pool,
        metrics: app.metrics,
        server,
        monitor,
    })
}
