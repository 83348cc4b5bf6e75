//! payment-resource: the protected resource over paydb. Accounts, payouts and the ledger, with the
//! fenced writes (a)(b)(c) in one transaction ([`posting`]), the payout lifecycle ([`payouts`]),
//! reconciliation ([`reconcile`]) and the HTTP API ([`api`]).
//!
//! - [`sql`]: every statement, each once; [`repo`]: one function per statement;
//! - [`config`]: settings, including the `payment.fencing.enabled` kill switch;
//! - [`error`]: the one error enum, mapped to HTTP at the edge; [`metrics`]: `lock_fenced_out` & co.

pub mod accounts;
pub mod api;
pub mod config;
pub mod error;
pub mod metrics;
pub mod model;
pub mod payouts;
pub mod posting;
pub mod reconcile;
pub mod repo;
pub mod sql;
pub mod validate;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use dlock_common::serve::Background;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;

pub use config::{Config, Fencing};
pub use error::PaymentError;

use crate::accounts::Accounts;
use crate::api::AppState;
use crate::metrics::Metrics;
use crate::payouts::Payouts;
use crate::posting::Posting;
use crate::sql::Statements;

/// A pool for paydb. Lazy: the service starts (and `/readyz` says 503) before the database answers.
pub fn pool(config: &Config) -> anyhow::Result<PgPool> {
    let opts: PgConnectOptions = config
        .database_url
        .parse()
        .context("--database-url is not a PostgreSQL URL")?;
    Ok(PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.acquire_timeout)
        .connect_lazy_with(opts))
}

/// The wired service: router plus the parts tests and the demo may want to look at.
#[derive(Debug)]
pub struct App {
    pub router: Router,
    pub pool: PgPool,
    pub metrics: Arc<Metrics>,
}

/// Builds the service from its configuration (no I/O yet).
pub fn app(config: &Config) -> anyhow::Result<App> {
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

/// Serves until SIGTERM/SIGINT (the binary's `serve`), then lets in-flight requests finish.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    // Before the server announces itself (see shutdown_signal).
    let signal = dlock_common::serve::shutdown_signal();
    let server = spawn(config).await?;
    signal.await;
    server.shutdown().await
}

/// A server running in-process (tests, the demo, the binary).
#[derive(Debug)]
pub struct RunningServer {
    pub pool: PgPool,
    pub metrics: Arc<Metrics>,
    server: Background,
}

impl RunningServer {
    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Graceful stop: in-flight requests finish, then the pool closes.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let served = self.server.shutdown().await.context("server task");
        self.pool.close().await;
        served
    }
}

/// Starts the service on `config.listen` (port 0: an ephemeral port) and returns once it is bound.
pub async fn spawn(config: Config) -> anyhow::Result<RunningServer> {
    let app = app(&config)?;
    let listener = dlock_common::serve::bind(config.listen)
        .await
        .with_context(|| format!("bind {}", config.listen))?;
    let server = dlock_common::serve::spawn_background(listener, app.router, CancellationToken::new())?;
    Ok(RunningServer {
        pool: app.pool,
        metrics: app.metrics,
        server,
    })
}
