//! The blocking acquire on PostgreSQL: a `lock_waiter` row per waiter (migration V3; its id is the
//! arrival order). The head (the oldest live row) tries C1's acquire statement — the grant is that
//! statement, as for anyone. When it is contended it waits for lockdb to say the key was freed (the
//! trigger on `lock_entry` names the head, and only that waiter is woken, by the listener of the
//! replica it waits on: [`super::hub`]), and for the holder's lease end by the database clock (a
//! lapse has no event). A waiter behind the head waits to be told it is the head (V3's trigger on
//! `lock_waiter`), and for the end of the row ahead of it (a replica that died leaves rows that no
//! longer count once they lapse).

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Repo;
use super::hub::Wake;
use crate::config::QueueFaults;
use crate::error::Error;
use crate::store::{GRACE, Grant, WaitMetrics, Waiter, WakeReason};

/// How long a waiter waits at most for the lockdb listener to be connected (right after the
/// server started, or while it reconnects).
const LISTENER_WAIT: Duration = Duration::from_secs(5);

/// A holder's lease end is checked this long after lockdb's clock says it comes.
const LEASE_END_SLACK: Duration = Duration::from_millis(2);

impl Repo {
    /// Waits in lockdb's queue of `w.key` (see the module's documentation).
    pub(crate) async fn wait(
        &self,
        w: &Waiter,
        deadline: Instant,
        faults: QueueFaults,
        cancel: &CancellationToken,
        metrics: &WaitMetrics,
    ) -> Result<Option<Grant>, Error> {
        wait(self, w, deadline, faults, cancel, metrics).await
    }
}

async fn wait(
    repo: &Repo,
    w: &Waiter,
    deadline: Instant,
    faults: QueueFaults,
    cancel: &CancellationToken,
    metrics: &WaitMetrics,
) -> Result<Option<Grant>, Error> {
    let hub = repo.hub();
    // The listener must hear the queue's notifications before the waiter joins it.
    // Bounded by the wait, but never shorter than the moment a listener needs to connect after the
    // server started (a wait of 0 still takes its turn once).
    let connect_by = deadline.max(Instant::now() + LISTENER_WAIT);
    let listening = tokio::select! {
        biased;
        ok = hub.ready(cancel) => ok,
        () = tokio::time::sleep_until(connect_by) => false,
    };
    if !listening {
        return if cancel.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Err(Error::Unavailable("the lockdb listener is not connected"))
        };
    }
    let lasts = deadline.saturating_duration_since(Instant::now()) + GRACE;
    let id = repo
        .enqueue_waiter(&w.key, w.session_id, &w.owner_id, lasts.as_secs_f64())
        .await?;
    // Registered after the row exists: whatever was told before is covered by the check that every
    // turn of the loop starts with.
    let mut wakes = hub.register_waiter(id, &w.key);
    let out = queued(repo, w, id, deadline, faults, cancel, &mut wakes, metrics).await;
    hub.unregister_waiter(id);
    // Leaving tells the next waiter if this one was the head (V3's trigger). On failure the row
    // lapses by itself and the reaper removes it.
    if let Err(e) = repo.dequeue_waiter(id).await {
        tracing::warn!(event = "waiter_dequeue_failed", lock_key = %w.key, waiter = id, error = %e);
    }
    out
}

#[allow(clippy::too_many_arguments)]
async fn queued(
    repo: &Repo,
    w: &Waiter,
    id: i64,
    deadline: Instant,
    faults: QueueFaults,
    cancel: &CancellationToken,
    wakes: &mut UnboundedReceiver<Wake>,
    metrics: &WaitMetrics,
) -> Result<Option<Grant>, Error> {
    loop {
        let pos = repo.waiter_position(&w.key, id, faults.lifo).await?;
        if !pos.present {
            return Err(Error::SessionGone);
        }
        // Until when nothing can change without a notification: the row ahead lapsing, or the
        // holder's lease ending.
        let (until, timer_reason) = match pos.ahead_secs {
            Some(ahead) => (secs(ahead) + LEASE_END_SLACK, WakeReason::ahead_lapsed),
            None => {
                if let Some(g) = repo
                    .acquire(&w.key, &w.owner_id, w.session_id, w.ttl_secs)
                    .await?
                {
                    return Ok(Some(g));
                }
                match repo.holder_left(&w.key).await? {
                    Some(left) => (secs(left) + LEASE_END_SLACK, WakeReason::lease_end),
                    // Freed since the attempt: try again now.
                    None => continue,
                }
            }
        };
        let asleep = metrics.asleep();
        let mut why = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(Error::Cancelled),
            () = tokio::time::sleep_until(deadline) => return Ok(None),
            got = wakes.recv() => match got {
                Some(Wake::Freed) => WakeReason::freed,
                Some(Wake::Head) => WakeReason::head,
                Some(Wake::Gone) => WakeReason::gone,
                Some(Wake::Resync) | None => WakeReason::resync,
            },
            () = tokio::time::sleep(until) => timer_reason,
        };
        drop(asleep);
        // Several notifications for one turn are one wake-up; a freed key is what it is for.
        while let Ok(more) = wakes.try_recv() {
            if more == Wake::Freed {
                why = WakeReason::freed;
            }
        }
        metrics.woken(why);
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::from_secs(3600))
}
