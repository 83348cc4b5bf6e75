//! The blocking acquire (`waitMs` on `POST /v1/locks/{key}/acquire`): a FIFO queue per key, granted
//! in arrival order, where a release wakes only the next waiter.
//!
//! The queue lives in the store, not in this process, so that several replicas serve one queue
//! ([`Backend::wait`](crate::store::Backend::wait)): on PostgreSQL a `lock_waiter` row per waiter,
//! woken by lockdb's notifications; on etcd a waiter key on the session's lease that watches only
//! its predecessor's key, as etcd's `concurrency.Mutex`.
//!
//! The wait runs in a task of its own, whatever becomes of the request: when the client goes away
//! (axum drops the handler's future), a drop guard cancels the task, which takes its waiter out of
//! the queue; a grant that could not be handed over any more is released. No-wait acquires are not
//! queued: they may take a free key before the head does (the head then waits for that grant). A
//! blocking acquire that finds nobody queued tries the grant first and joins the queue only if the
//! key is held ([`at_once`]).

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::metrics::WaitResult;
use crate::state::AppState;
use crate::store::Grant;
pub use crate::store::Waiter;

/// Waits in `key`'s queue for at most `wait` (and the server's `max_wait`): `Some` granted, `None`
/// the wait ended (CONTENDED).
pub async fn acquire(state: &AppState, w: Waiter) -> Result<Option<Grant>, Error> {
    let (tx, rx) = oneshot::channel();
    // Also cancelled when the server shuts down: the request then answers 503.
    let cancel = state.closing().child_token();
    // Dropped with the request's future: the task leaves the queue.
    let _guard = cancel.clone().drop_guard();
    tokio::spawn(run(state.clone(), w, tx, cancel));
    rx.await.unwrap_or(Err(Error::Cancelled))
}

async fn run(
    state: AppState,
    w: Waiter,
    tx: oneshot::Sender<Result<Option<Grant>, Error>>,
    cancel: CancellationToken,
) {
    let deadline = Instant::now() + w.wait.min(state.max_wait());
    let metrics = state.metrics();
    let faults = state.queue_faults();
    let first = at_once(&state, &w).await;
    let queued = matches!(first, Ok(None));
    let out = if queued {
        state
            .repo()
            .wait(&w, deadline, faults, &cancel, &metrics.wait)
            .await
    } else {
        first
    };
    metrics.waited(match &out {
        Ok(Some(_)) if !queued => WaitResult::free,
        Ok(Some(_)) => WaitResult::granted,
        Ok(None) => WaitResult::contended,
        Err(Error::Cancelled) => WaitResult::cancelled,
        Err(Error::SessionGone) => WaitResult::session_gone,
        Err(_) => WaitResult::error,
    });
    if let Err(Ok(Some(g))) = tx.send(out) {
        // Granted after the client went away: nobody will use it, so give it back at once.
        tracing::info!(event = "lock_released", lock_key = %w.key, fencing_token = g.fencing_token, stale = false, cause = "waiter_gone");
        if let Err(e) = state.repo().release(&w.key, g.fencing_token).await {
            tracing::warn!(event = "lock_release_failed", lock_key = %w.key, error = %e);
        }
    }
}

/// The grant of a key nobody is queued for, taken at once as a no-wait acquire takes it: joining,
/// reading one's place and leaving the queue (three lockdb statements on PostgreSQL, a put, a read
/// and a delete on etcd) are paid only by a request that has someone to wait for. Arrival order
/// holds: a waiter that joins after the check arrived after this request, and a request that finds
/// the key held (or anyone queued) joins the queue behind everyone already in it. `None`: not
/// granted this way.
async fn at_once(state: &AppState, w: &Waiter) -> Result<Option<Grant>, Error> {
    let repo = state.repo();
    if !state.queue_faults().barge && !repo.queue_empty(&w.key).await? {
        return Ok(None);
    }
    repo.acquire(&w.key, &w.owner_id, w.session_id, w.ttl_secs).await
}
