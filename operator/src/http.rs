//! The operator's HTTP endpoints: `/metrics` (Prometheus), `/healthz` (the process is up) and
//! `/readyz` (the CRDs are established and this replica either runs the controllers or stands by
//! for the lease).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// Where this replica stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Waiting for the CRDs to be established.
    WaitingForCrds,
    /// CRDs are there; another replica holds the lease.
    Standby,
    /// Leader: the controllers are running.
    Leading,
    ShuttingDown,
}

impl Readiness {
    pub fn is_ready(self) -> bool {
        matches!(self, Readiness::Standby | Readiness::Leading)
    }

    fn describe(self) -> &'static str {
        match self {
            Readiness::WaitingForCrds => "waiting for the dlock.dev CRDs to be established",
            Readiness::Standby => "ok: standing by for the leader lease",
            Readiness::Leading => "ok: leader, controllers running",
            Readiness::ShuttingDown => "shutting down",
        }
    }
}

/// Shared readiness, set by `main` as start-up progresses.
#[derive(Debug, Clone)]
pub struct Health {
    tx: Arc<watch::Sender<Readiness>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            tx: Arc::new(watch::Sender::new(Readiness::WaitingForCrds)),
        }
    }
}

impl Health {
    pub fn set(&self, r: Readiness) {
        self.tx.send_replace(r);
    }

    pub fn get(&self) -> Readiness {
        *self.tx.borrow()
    }
}

async fn readyz(State(health): State<Health>) -> (StatusCode, &'static str) {
    let r = health.get();
    let code = if r.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, r.describe())
}

pub fn router(registry: Arc<Registry>, health: Health) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(dlock_common::metrics::handler).with_state(registry),
        )
        .route("/healthz", get(dlock_common::serve::healthz))
        .route("/readyz", get(readyz).with_state(health))
}
