//! What every handler is given: the repository, the metrics, the admin token and the grant signer.
//! Passed explicitly through axum's `State`; there are no globals.

use std::sync::Arc;

use sqlx::PgPool;

use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::repo::Repo;
use crate::signing::Signer;
use crate::sql::Statements;

#[derive(Debug, Clone)]
pub struct AppState {
    repo: Backend,
    metrics: Arc<Metrics>,
    admin_token: Option<Arc<str>>,
    signer: Option<Arc<Signer>>,
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
            repo: backend,
            metrics: Arc::new(Metrics::new()),
            // An empty token is never a valid credential; treat it as "not configured".
            admin_token: admin_token.filter(|t| !t.is_empty()).map(Arc::from),
            signer: None,
        }
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
