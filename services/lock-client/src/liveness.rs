//! What this process may believe about a lease (a lock's or a session's) without asking the
//! server: the last confirmed expiry on the local monotonic clock, and a one-way "lost" signal.
//!
//! Server times come from the lockdb clock and are never compared with ours. Instead, a
//! confirmation is dated by when its request was *sent*: the server computed `now() + ttl` after
//! that instant, so `sent + ttl` is at or before the real expiry. The lease counts as ours only
//! until that instant minus a safety margin (clock-rate drift, the gap between a check and the write
//! it guards). After that it is lost, whatever the server would still say.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LossReason;

/// The share of a TTL kept back as a safety margin.
const MARGIN_DIVISOR: u32 = 5;

/// The margin kept back from a lease of `ttl`.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / MARGIN_DIVISOR
}

#[derive(Debug, Clone, Copy)]
struct Confirmed {
    /// When the confirming request was sent (local clock).
    sent: Instant,
    /// The server's expiry, for display only.
    expires_at: DateTime<Utc>,
}

#[derive(Debug)]
pub(crate) struct Liveness {
    ttl: Duration,
    /// What a deadline miss is reported as.
    unconfirmed: LossReason,
    confirmed: Mutex<Confirmed>,
    lost: CancellationToken,
    reason: OnceLock<LossReason>,
    parent: Option<std::sync::Arc<Liveness>>,
}

impl Liveness {
    pub(crate) fn new(
        ttl: Duration,
        sent: Instant,
        expires_at: DateTime<Utc>,
        unconfirmed: LossReason,
        parent: Option<std::sync::Arc<Liveness>>,
    ) -> Self {
        // A child is lost the moment its parent is (a session's loss voids its handles).
        let lost = match &parent {
            Some(p) => p.lost.child_token(),
            None => CancellationToken::new(),
        };
        Self {
            ttl,
            unconfirmed,
            confirmed: Mutex::new(Confirmed { sent, expires_at }),
            lost,
            reason: OnceLock::new(),
            parent,
        }
    }

    fn confirmed(&self) -> MutexGuard<'_, Confirmed> {
        // The guarded value is two plain fields, always consistent: a poisoned lock is still fine.
        self.confirmed.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the lease stops counting as ours unless renewed: last `sent + ttl - margin`.
    pub(crate) fn deadline(&self) -> Instant {
        self.confirmed().sent + self.ttl - margin(self.ttl)
    }

    pub(crate) fn last_sent(&self) -> Instant {
        self.confirmed().sent
    }

    pub(crate) fn expires_at(&self) -> DateTime<Utc> {
        self.confirmed().expires_at
    }

    /// Records a confirmation whose request was sent at `sent`. Never revives a lost lease.
    pub(crate) fn confirm(&self, sent: Instant, expires_at: DateTime<Utc>) {
        if self.lost.is_cancelled() {
            return;
        }
        let mut c = self.confirmed();
        // Out-of-order answers must not move the deadline backwards.
        if sent >= c.sent {
            *c = Confirmed { sent, expires_at };
        }
    }

    /// Declares the lease lost (first reason wins) and wakes everyone waiting on it.
    pub(crate) fn lose(&self, reason: LossReason) {
        let _ = self.reason.set(reason);
        self.lost.cancel();
    }

    /// Why it was lost, if it was: our own reason, else the parent's.
    pub(crate) fn reason(&self) -> Option<LossReason> {
        if let Some(r) = self.reason.get() {
            return Some(*r);
        }
        if self.lost.is_cancelled() {
            return self.parent.as_ref().and_then(|p| p.reason());
        }
        None
    }

    /// The synchronous check: lost already, or past the deadline now (then it is lost from here
    /// on), for this lease and its parent.
    pub(crate) fn check(&self) -> Result<(), LossReason> {
        if let Some(parent) = &self.parent {
            parent.check()?;
        }
        if let Some(r) = self.reason() {
            return Err(r);
        }
        if Instant::now() >= self.deadline() {
            self.lose(self.unconfirmed);
            return Err(self.reason().unwrap_or(self.unconfirmed));
        }
        Ok(())
    }

    pub(crate) fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    pub(crate) fn unconfirmed_reason(&self) -> LossReason {
        self.unconfirmed
    }

    /// Resolves once the lease is lost, with the reason.
    pub(crate) async fn lost(&self) -> LossReason {
        self.lost.cancelled().await;
        self.reason().unwrap_or(self.unconfirmed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn lease_sent(ttl_ms: u64, ago_ms: u64, parent: Option<Arc<Liveness>>) -> Arc<Liveness> {
        Arc::new(Liveness::new(
            Duration::from_millis(ttl_ms),
            Instant::now() - Duration::from_millis(ago_ms),
            Utc::now(),
            LossReason::RenewalUnconfirmed,
            parent,
        ))
    }

    #[tokio::test]
    async fn deadline_is_sent_plus_ttl_minus_margin() {
        let l = lease_sent(10_000, 0, None);
        assert_eq!(l.deadline(), l.last_sent() + Duration::from_millis(8_000));
        assert!(l.check().is_ok());
        // 7 s into a 10 s lease: still inside the margin.
        assert!(lease_sent(10_000, 7_000, None).check().is_ok());
        // 8 s in: the margin starts, the lease is lost.
        let late = lease_sent(10_000, 8_000, None);
        assert_eq!(late.check(), Err(LossReason::RenewalUnconfirmed));
        // Lost for good, even if a late confirmation arrives.
        late.confirm(Instant::now(), Utc::now());
        assert_eq!(late.check(), Err(LossReason::RenewalUnconfirmed));
        assert_eq!(late.reason(), Some(LossReason::RenewalUnconfirmed));
    }

    #[tokio::test]
    async fn confirmation_moves_the_deadline_forward_only() {
        let l = lease_sent(10_000, 9_000, None);
        let first = l.last_sent();
        let now = Instant::now();
        l.confirm(now, Utc::now());
        assert_eq!(l.deadline(), now + Duration::from_millis(8_000));
        assert!(l.check().is_ok());
        // An older answer arriving late changes nothing.
        l.confirm(first, Utc::now());
        assert_eq!(l.deadline(), now + Duration::from_millis(8_000));
    }

    #[tokio::test]
    async fn parent_loss_voids_child_with_parent_reason() {
        let parent = Arc::new(Liveness::new(
            Duration::from_secs(10),
            Instant::now(),
            Utc::now(),
            LossReason::HeartbeatUnconfirmed,
            None,
        ));
        let child = lease_sent(10_000, 0, Some(parent.clone()));
        assert!(child.check().is_ok());
        parent.lose(LossReason::SessionGone);
        assert_eq!(child.check(), Err(LossReason::SessionGone));
        assert_eq!(child.lost().await, LossReason::SessionGone);
        assert_eq!(child.reason(), Some(LossReason::SessionGone));
    }

    #[tokio::test]
    async fn parent_past_its_deadline_voids_child() {
        let parent = Arc::new(Liveness::new(
            Duration::from_secs(10),
            Instant::now() - Duration::from_secs(9),
            Utc::now(),
            LossReason::HeartbeatUnconfirmed,
            None,
        ));
        let child = lease_sent(10_000, 0, Some(parent.clone()));
        assert_eq!(child.check(), Err(LossReason::HeartbeatUnconfirmed));
        assert!(child.lost_token().is_cancelled());
    }

    #[tokio::test]
    async fn first_reason_wins() {
        let l = lease_sent(1000, 0, None);
        l.lose(LossReason::LeaseExpired);
        l.lose(LossReason::RenewalUnconfirmed);
        assert_eq!(l.lost().await, LossReason::LeaseExpired);
    }
}
