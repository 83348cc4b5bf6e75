//! rail-proxy: fencing enforcement point (d) in front of the payment rail.
//!
//! `POST /v1/submissions` with `X-Fencing-Token: t` runs C1 statement (d) on the payout's account:
//! if a token at least as high already submitted for that account, it records a `FENCED`
//! `rail_submission`, counts `rail_duplicate_attempted` and `lock_fenced_out{resource=rail}`, and
//! answers 409 without forwarding. Otherwise it records the payout's one forwardable attempt
//! (`rail_submission_attempt_uidx`), forwards it once with the payout's idempotency key, and records
//! ACKED / REJECTED / TIMEOUT. An ambiguous TIMEOUT is resolved by asking the rail, never by
//! submitting again.
//!
//! - [`config`]: settings, the `rail.proxy.fencing.enabled` kill switch and grant verification
//!   (`RAIL_PROXY_GRANT_VERIFICATION_ENABLED`, on by default: the token only inside a signed grant for
//!   `account:<the payout's account>`);
//! - [`sql`]: every statement, once; [`rail`]: the rail client;
//! - [`proxy`]: the flow; [`error`]: outcomes mapped to HTTP; [`api`]: routes; [`metrics`]: counters.

pub mod api;
pub mod config;
pub mod error;
pub mod metrics;
pub mod proxy;
pub mod rail;
pub mod sql;

use std::sync::Arc;

use dlock_common::serve::Background;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use config::{Config, ConfigError, Fault, RailFence};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot listen: {0}")]
    Bind(#[from] std::io::Error),
}

impl dlock_common::serve::StartFailure for StartError {
    fn is_config(&self) -> bool {
        matches!(self, StartError::Config(_))
    }
}

/// A rail-proxy serving in the background of this process. [`shutdown`](Background::shutdown) stops
/// accepting and waits for in-flight requests (each bounded by the rail timeout).
pub type RunningServer = Background;

/// Connects to paydb lazily (so `/readyz` can report it down), binds, and serves until
/// [`RunningServer::shutdown`].
pub async fn spawn(config: Config) -> Result<RunningServer, StartError> {
    config.validate()?;
    let pool = dlock_common::db::lazy_pool(
        &config.database_url,
        "rail-proxy",
        config.max_connections,
        config.db_acquire_timeout,
    )
    .map_err(|e| ConfigError::DatabaseUrl(e.to_string()))?;
    let rail = rail::Rail::with_ca(&config.rail_url, config.rail_timeout, config.rail_ca.as_deref())?;
    // Loaded before anything starts: a bad pair is a configuration error naming the file.
    let tls =
        dlock_common::tls::ServerTls::start(config.tls.as_ref(), "bearer credentials and signed grants")
            .map_err(ConfigError::Tls)?;

    match config.fence {
        RailFence::Enforced { statement } if statement == sql::HIGH_WATER => {}
        RailFence::Enforced { .. } => tracing::warn!(
            event = "rail_fence_statement_substituted",
            "statement (d) is not the contract's; only negative-control tests do this"
        ),
        RailFence::Disabled => tracing::warn!(
            event = "rail_fencing_disabled",
            key = "rail.proxy.fencing.enabled",
            "RAIL FENCING IS OFF: statement (d) is skipped and stale tokens reach the rail"
        ),
    }

    if let Some(fault) = config.fault {
        tracing::warn!(
            event = "fault_injection_enabled",
            ?fault,
            "FAULT INJECTION IS ON (tests and demos only)"
        );
    }
    config
        .credentials
        .warn_missing("rail-proxy", config::CREDENTIALS_PREFIX, config::ROLES);
    config
        .grants
        .announce("rail-proxy", config::GRANT_VERIFICATION_SETTING);

    let mut registry = Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    let proxy = Arc::new(proxy::Proxy {
        pool,
        rail,
        fence: config.fence,
        grants: dlock_common::grant::GrantGate {
            policy: config.grants.clone(),
            metrics: dlock_common::grant::GrantMetrics::register(&mut registry),
        },
        metrics,
        abandon_after: config.abandon_after,
        fault: config.fault,
    });
    let app = api::router(proxy, Arc::new(registry), Arc::new(config.credentials.clone()));

    let listener = dlock_common::serve::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(
        event = "rail_proxy_started",
        %addr,
        rail_url = %config.rail_url,
        rail_timeout_ms = config.rail_timeout.as_millis() as u64,
        fencing_enabled = !matches!(config.fence, RailFence::Disabled),
        grant_verification_enabled = config.grants.is_on()
    );
    Ok(dlock_common::serve::spawn_background_tls(
        listener,
        app,
        tls,
        CancellationToken::new(),
    )?)
}

/// The URL without its password, for error messages.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_switch_is_a_distinct_variant_not_a_token() {
        assert_eq!(
            RailFence::from_flag(true),
            RailFence::Enforced {
                statement: sql::HIGH_WATER
            }
        );
        assert_eq!(RailFence::from_flag(false), RailFence::Disabled);
    }
}
