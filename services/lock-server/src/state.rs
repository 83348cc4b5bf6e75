//! What every handler is given: the repository, the metrics, the admin token and the grant signer.
//! Passed explicitly through axum's `State`; there are no globals.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::config::{Config, QueueFaults};
use crate::metrics::Metrics;
use crate::repo::Repo;
use crate::signing::Signer;
use crate::sql::Statements;
use crate::watch::Feeds;

#[derive(Debug, Clone)]
pub struct AppState {
    repo: Backend,
    metrics: Arc<Metrics>,
    admin_token: Option<Arc<str>>,
    signer: Option<Arc<Signer>>,
    max_wait: Duration,
    watch_max: Duration,
    queue_faults: QueueFaults,
    feeds: Arc<Feeds>,
    /// Fired when the server shuts down: waits answer and watch streams end, so that the graceful
    /// drain is not held up by them.
    closing: CancellationToken,
}

impl AppState {
    /// The production state: the contract's statements.
    pub fn new(pool: PgPool, admin_token: Option<String>) -> Self {
        Self::with_statements(pool, admin_token, Statements::C1)
    }

    /// For negative controls only: a server whose repository runs a deliberately different statement set.
    pub fn with_statements(pool: PgPool, admin_token: Option<String>, stmts: Statements) -> Self {
        Self::with_backend(Backend::Postgres(Repo::with_statements(pool, stmts)), admin_token)
    }

    /// A state over any backend (etcd, or a deliberately broken one for negative controls).
    pub fn with_backend(backend: Backend, admin_token: Option<String>) -> Self {
        Self {
            metrics: Arc::new(Metrics::with_store(Some(&backend))),
            repo: backend,
            // An empty token is never a valid credential; treat it as "not configured".
            admin_token: admin_token.filter(|t| !t.is_empty()).map(Arc::from),
            signer: None,
            max_wait: Duration::from_millis(dlock_wire::lock::MAX_WAIT_MS.unsigned_abs()),
            watch_max: Duration::from_secs(300),
            queue_faults: QueueFaults::NONE,
            feeds: Arc::new(Feeds::default()),
            closing: CancellationToken::new(),
        }
    }

    /// Waits and watches end when `closing` fires (the server's shutdown).
    pub fn with_closing(mut self, closing: CancellationToken) -> Self {
        self.closing = closing;
        self
    }

    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// The configured limits of waits and watches (and a negative control's broken queue).
    pub fn with_config(mut self, config: &Config) -> Self {
        self.max_wait = config.max_wait;
        self.watch_max = config.watch_max;
        self.queue_faults = config.queue_faults;
        self
    }

    /// The longest a blocking acquire waits here.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// How long one watch stream stays open.
    pub fn watch_max(&self) -> Duration {
        self.watch_max
    }

    pub fn queue_faults(&self) -> QueueFaults {
        self.queue_faults
    }

    /// The watch feeds of this process (PostgreSQL backend).
    pub fn feeds(&self) -> &Arc<Feeds> {
        &self.feeds
    }

    /// Signs every grant with `signer` (`None`: grants go out unsigned).
    pub fn with_signer(mut self, signer: Option<Signer>) -> Self {
        self.signer = signer.map(Arc::new);
        self
    }

    pub fn signer(&self) -> Option<&Signer> {
        self.signer.as_deref()
    }

    /// The store the handlers use (PostgreSQL or etcd).
    pub fn repo(&self) -> &Backend {
        &self.repo
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref()
    }
}
