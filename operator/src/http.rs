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

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::metrics::Metrics;

    async fn get(app: &Router, path: &str) -> (StatusCode, String) {
        let res = app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readiness_follows_start_up_and_metrics_are_exported() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let health = Health::default();
        let app = router(Arc::new(registry), health.clone());

        assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        health.set(Readiness::Standby);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
        health.set(Readiness::Leading);
        assert_eq!(
            get(&app, "/readyz").await,
            (StatusCode::OK, "ok: leader, controllers running".into())
        );
        health.set(Readiness::ShuttingDown);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);

        drop(metrics.reconcile_started("LockService"));
        metrics.reconcile_failed("PaymentStack", "conflict");
        let (status, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains(r#"dlock_operator_reconciliations_total{kind="LockService"} 1"#),
            "{body}"
        );
        assert!(
            body.contains(
                r#"dlock_operator_reconcile_failures_total{kind="PaymentStack",reason="conflict"} 1"#
            ),
            "{body}"
        );
        assert!(body.contains(r#"dlock_operator_reconcile_duration_seconds_count{kind="LockService"} 1"#));
    }
}
