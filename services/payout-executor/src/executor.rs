//! The process: wire the clients, serve `/metrics`, `/healthz` and `/readyz`, run the workers until
//! SIGTERM (or, in batch mode, until they are idle), and report how it went.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use dlock_client::{ClientConfig, LockClient};
use dlock_common::ApiError;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::{Config, worker_owner_id};
use crate::critical::Resources;
use crate::fault::Faults;
use crate::metrics::{Metrics, Outcome};
use crate::resources::{PaymentApi, RailApi, authenticated_client};
use crate::worker::{RetryPolicy, Shared, Tracked, Worker, WorkerExit};

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub exits: Vec<WorkerExit>,
    /// Batch mode only: the payouts whose error budget this run spent (`payout_given_up`). The run
    /// exits non-zero and names them (`executor_stopped`), handing them to the next run. Always
    /// empty for a long-running executor, which never gives a payout up.
    pub given_up: Vec<Uuid>,
    pub posted: u64,
    pub failed: u64,
    pub fenced_out: u64,
}

impl Report {
    /// Clean: no worker gave up on the services, and no payout was given up.
    pub fn is_clean(&self) -> bool {
        self.given_up.is_empty() && !self.exits.contains(&WorkerExit::Unreachable)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Client(#[from] dlock_client::ClientError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A URL or credential the executor cannot use is bad configuration (exit 2); a failed bind, or a
/// client that could not be built, is a failure to start (exit 1), as for every other service.
impl dlock_common::serve::StartFailure for StartError {
    fn is_config(&self) -> bool {
        matches!(
            self,
            StartError::Client(dlock_client::ClientError::InvalidArgument { .. })
        )
    }
}

/// Runs the executor until `shutdown` is cancelled or, with `exit_when_idle`, until every worker is
/// idle. `on_listening` learns the metrics address (port 0 picks one).
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<Report, StartError> {
    if config.fault_injection {
        tracing::warn!(
            event = "fault_injection_enabled",
            pause_at = config.pause_at.map(|s| s.as_str()),
            "FAULT INJECTION IS ON: this process will SIGSTOP itself at the chosen step. Tests and demos only."
        );
    }
    let mut lock_config = ClientConfig {
        request_timeout: config.http_timeout,
        ..ClientConfig::default()
    };
    if let Some(ca) = &config.ca_file {
        lock_config = lock_config.with_ca_file(ca);
    }
    if let Some(token) = &config.lock_token {
        lock_config = lock_config.with_token(token.expose());
    }
    let lock_client = LockClient::with_config(&config.lock_server_url, lock_config)?;
    // Each resource gets its own credential (and so its own client); one CA for all three servers.
    let ca = config.ca_file.as_deref();
    let payment_http = authenticated_client(config.http_timeout, config.payment_credential.as_ref(), ca)?;
    let rail_http = authenticated_client(config.http_timeout, config.rail_credential.as_ref(), ca)?;
    let resources = Resources {
        payments: PaymentApi::new(payment_http, &config.payment_resource_url)?,
        rail: RailApi::new(rail_http, &config.rail_proxy_url)?,
        faults: config.pause_at.map_or_else(Faults::none, Faults::pause_at),
        resolve: crate::critical::ResolvePolicy {
            attempts: config.resolve_attempts,
            backoff: config.resolve_backoff,
        },
    };
    let (metrics, registry) = Metrics::new();
    let shared = Arc::new(Shared {
        tracked: Tracked::new(&config.payout_ids, RetryPolicy::of(&config), metrics.backoff()),
        config,
        lock_client,
        resources,
        metrics,
        inflight_listing: AtomicBool::new(true),
        shutdown: shutdown.clone(),
    });

    let listen = shared.config.listen;
    let listener = dlock_common::serve::bind(listen)
        .await
        .map_err(|source| StartError::Bind { addr: listen, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr: listen, source })?;
    on_listening(addr);
    let ready = Arc::new(AtomicBool::new(false));
    let stop_serving = CancellationToken::new();
    let server = tokio::spawn({
        let app = router(Arc::new(registry), ready.clone());
        let stop = stop_serving.clone();
        async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        }
    });

    tracing::info!(
        event = "executor_started",
        owner_id = %shared.config.owner_id,
        workers = shared.config.workers,
        lease_ttl_ms = shared.config.lease_ttl.as_millis() as u64,
        explicit_payouts = shared.config.payout_ids.len(),
        exit_when_idle = shared.config.exit_when_idle,
        %addr,
    );
    let workers: Vec<_> = (1..=shared.config.workers)
        .map(|n| {
            tokio::spawn(
                Worker {
                    n,
                    owner_id: worker_owner_id(&shared.config.owner_id, n),
                    shared: shared.clone(),
                }
                .run(),
            )
        })
        .collect();
    ready.store(true, Ordering::SeqCst);

    let mut exits = Vec::new();
    for w in workers {
        match w.await {
            Ok(exit) => exits.push(exit),
            Err(e) => {
                tracing::error!(event = "worker_crashed", error = %e);
                exits.push(WorkerExit::Unreachable);
            }
        }
    }
    ready.store(false, Ordering::SeqCst);
    stop_serving.cancel();
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(event = "metrics_server_failed", error = %e),
        Err(e) => tracing::warn!(event = "metrics_server_failed", error = %e),
    }
    let m = &shared.metrics;
    let report = Report {
        exits,
        given_up: shared.tracked.given_up(),
        posted: m.processed_count(Outcome::posted),
        failed: m.processed_count(Outcome::failed),
        fenced_out: m.processed_count(Outcome::fenced_out),
    };
    tracing::info!(
        event = "executor_stopped",
        posted = report.posted,
        failed = report.failed,
        fenced_out = report.fenced_out,
        given_up = report.given_up.len(),
        given_up_ids = %report
            .given_up
            .iter()
            .map(Uuid::to_string)
            .collect::<Vec<_>>()
            .join(","),
        clean = report.is_clean(),
    );
    Ok(report)
}

fn router(registry: Arc<Registry>, ready: Arc<AtomicBool>) -> Router {
    let metrics = Router::new()
        .route("/metrics", get(dlock_common::metrics::handler))
        .with_state(registry);
    Router::new()
        .route("/healthz", get(dlock_common::serve::healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
        .merge(metrics)
        .fallback(dlock_common::error::not_found_fallback)
}

/// Ready while the workers run.
async fn readyz(State(ready): State<Arc<AtomicBool>>) -> Result<&'static str, ApiError> {
    if ready.load(Ordering::SeqCst) {
        Ok("ready")
    } else {
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "NOT_READY",
            "the workers are not running",
        ))
    }
}
