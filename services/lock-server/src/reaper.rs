//! The reaper: deletes expired sessions on a period; `ON DELETE CASCADE` takes their locks along.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::state::AppState;

/// One pass: deletes every expired session (judged by the database clock), counts and logs them.
pub async fn reap_once(state: &AppState) -> Result<u64, Error> {
    let deleted = state.repo().reap().await?;
    if deleted > 0 {
        state.metrics().reaper_sessions_deleted.inc_by(deleted);
        tracing::info!(event = "sessions_reaped", deleted);
    }
    Ok(deleted)
}

/// Runs [`reap_once`] every `interval` until `cancel` fires. A failed pass is logged and retried on
/// the next tick: an unreaped session only delays cleanup, it never makes a lock unsafe, because
/// acquire takes over expired rows by itself.
pub fn spawn(state: AppState, interval: Duration, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = ticks.tick() => {
                    if let Err(e) = reap_once(&state).await {
                        tracing::warn!(event = "reaper_failed", error = %e);
                    }
                }
            }
        }
    })
}
