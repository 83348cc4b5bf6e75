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

use std::sync::Arc;

use dlock_common::serve::Background;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use config::{Config, ConfigError, Mode};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot listen: {0}")]
    Bind(#[from] std::io::Error),
}

/// A stub serving in the background of this process. [`shutdown`](Background::shutdown) stops
/// accepting, ends pending latency and TIMEOUT hangs (they watch the same token), and waits for
/// in-flight requests.
impl dlock_common::serve::StartFailure for StartError {
    fn is_config(&self) -> bool {
        matches!(self, StartError::Config(_))
    }
}

pub type RunningServer = Background;

/// Binds `config.listen` and serves until [`RunningServer::shutdown`].
pub async fn spawn(config: Config) -> Result<RunningServer, StartError> {
    config.validate()?;
    // Loaded before anything starts: a bad pair is a configuration error naming the file.
    let tls = dlock_common::tls::ServerTls::start(config.tls.as_ref(), "payment orders")
        .map_err(ConfigError::Tls)?;
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
    Ok(dlock_common::serve::spawn_background_tls(
        listener, app, tls, shutdown,
    )?)
}
