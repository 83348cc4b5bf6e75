//! rail-stub: a stand-in external payment rail.
//!
//! It pays each idempotency key at most once (the first request decides ACK / REJECT / TIMEOUT),
//! can add latency or hang past the caller's timeout after paying (the ambiguous case), and keeps
//! the ground truth of what it received (`GET /v1/received`) for the proof that nothing was paid
//! twice. In-memory only: a restart forgets everything.
//!
//! - [`config`]: defaults and bounds; [`input`]: request validation;
//! - [`ledger`]: dedup and the received log; [`stub`]: the ledger plus counters and pauses;
//! - [`api`]: the HTTP routes; [`metrics`]: the counters.

pub mod api;
pub mod config;
pub mod input;
pub mod ledger;
pub mod metrics;
pub mod stub;

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::{Config, ConfigError, Mode};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot listen: {0}")]
    Bind(#[from] std::io::Error),
}

/// A stub serving in the background of this process.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, ends pending latency and TIMEOUT hangs, and waits for in-flight requests.
    pub async fn shutdown(self) -> std::io::Result<()> {
        self.shutdown.cancel();
        self.task.await.map_err(std::io::Error::other)?
    }
}

/// Binds `config.listen` and serves until [`RunningServer::shutdown`].
pub async fn spawn(config: Config) -> Result<RunningServer, StartError> {
    config.validate()?;
    if config.test_mode {
        tracing::warn!(
            event = "rail_stub_test_mode",
            "TEST MODE IS ON: per-request outcome headers and PUT /v1/admin/behaviour are enabled; never run this way in production"
        );
    }
    let shutdown = CancellationToken::new();
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    let stub = Arc::new(stub::Stub::new(&config, metrics, shutdown.clone()));
    let app = api::router(stub, Arc::new(registry));

    let listener = dlock_common::serve::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(
        event = "rail_stub_started",
        %addr,
        mode = ?config.mode,
        latency_ms = config.latency_ms,
        timeout_hang_ms = config.timeout_hang_ms
    );
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    Ok(RunningServer { addr, shutdown, task })
}
