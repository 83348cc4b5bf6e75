//! A granted lock: its key and fencing token, a background renewal every `lease_ttl / 3`, and the
//! moment it is lost.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dlock_wire::{FENCING_GRANT_HEADER, FENCING_TOKEN_HEADER, FencingToken};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::api::{LockApi, LockGrant};
use crate::error::{ClientError, LossReason};
use crate::keepalive::{self, Ended};
use crate::liveness::Liveness;

/// What a session's handles share with it (its API, id and owner, and whether it is still live);
/// the session holds it too.
#[derive(Debug)]
pub(crate) struct SessionShared {
    pub(crate) api: LockApi,
    pub(crate) id: Uuid,
    pub(crate) owner_id: String,
    pub(crate) live: Arc<Liveness>,
}

/// What an explicit release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Our grant was deleted.
    Released,
    /// The grant was no longer ours (expired, taken over, or its session gone). Not an error, and
    /// never retried: the token is in the predicate so that we cannot delete a newer holder's grant.
    Stale,
}

/// What a protected write presents: the fencing token and, when lock-server signed one, the grant
/// (`X-Fencing-Token`, `X-Fencing-Grant`). Take a fresh one from [`LockHandle::fence`] for each
/// write: a renewal may have re-signed the grant with a newer key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub token: FencingToken,
    pub grant: Option<String>,
}

impl Fence {
    /// Both headers on an outgoing request (the grant only when there is one).
    pub fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header(FENCING_TOKEN_HEADER, self.token.to_string());
        match &self.grant {
            Some(grant) => request.header(FENCING_GRANT_HEADER, grant),
            None => request,
        }
    }
}

/// A held lock. Pass [`LockHandle::fence`] (token and signed grant) to every protected write.
///
/// It renews in the background and is **lost** — for good — when a renew answers 410
/// `LEASE_EXPIRED`, when its session is lost, or when no renewal could be confirmed before the
/// lease's deadline minus a safety margin. Wait for that with [`LockHandle::lost`] (or
/// [`LockHandle::lost_token`]) in a `tokio::select!` around the critical section, and call
/// [`LockHandle::ensure_held`] right before each write.
///
/// Dropping the handle stops renewing (the lease then lapses on the server); [`LockHandle::release`]
/// gives the lock back at once.
#[derive(Debug)]
pub struct LockHandle {
    session: Arc<SessionShared>,
    grant: LockGrant,
    live: Arc<Liveness>,
    stop: CancellationToken,
    suspended: watch::Sender<bool>,
    /// The grant as last signed by lock-server (acquire, then each renewal).
    signed: watch::Receiver<Option<String>>,
    /// The lease asked for, kept for [`LockHandle::reenter`].
    ttl: Duration,
    ttl_ms: i64,
}

impl LockHandle {
    pub(crate) fn start(
        session: Arc<SessionShared>,
        grant: LockGrant,
        ttl: Duration,
        ttl_ms: i64,
        sent: Instant,
    ) -> Self {
        let live = Arc::new(Liveness::new(
            ttl,
            sent,
            grant.expires_at,
            LossReason::RenewalUnconfirmed,
            Some(session.live.clone()),
        ));
        let stop = CancellationToken::new();
        let (suspended, suspended_rx) = watch::channel(false);
        let (resigned, signed) = watch::channel(grant.grant.clone());
        tokio::spawn(renew(
            session.clone(),
            Renewal {
                key: grant.lock_key.clone(),
                token: grant.fencing_token,
                ttl_ms,
                resigned,
            },
            live.clone(),
            stop.clone(),
            suspended_rx,
        ));
        Self {
            session,
            grant,
            live,
            stop,
            suspended,
            signed,
            ttl,
            ttl_ms,
        }
    }

    pub fn key(&self) -> &str {
        &self.grant.lock_key
    }

    /// The fencing token of this grant: strictly greater than every token issued before it.
    pub fn token(&self) -> FencingToken {
        self.grant.fencing_token
    }

    /// The grant lock-server signed for this token (`X-Fencing-Grant`): the latest one, since a
    /// renewal signs it again with the key lock-server signs with then. `None` when lock-server
    /// signs no grants.
    pub fn grant(&self) -> Option<String> {
        self.signed.borrow().clone()
    }

    /// The token and its latest grant, as every protected write presents them.
    pub fn fence(&self) -> Fence {
        Fence {
            token: self.token(),
            grant: self.grant(),
        }
    }

    pub fn owner_id(&self) -> &str {
        &self.grant.owner_id
    }

    pub fn session_id(&self) -> Uuid {
        self.grant.session_id
    }

    /// When the server granted the lock (lockdb clock).
    pub fn acquired_at(&self) -> DateTime<Utc> {
        self.grant.acquired_at
    }

    /// The lease's expiry as last confirmed by the server (lockdb clock; informational).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.live.expires_at()
    }

    /// The local instant until which the lock counts as held without a further renewal: the last
    /// confirmed `request sent + ttl`, minus the safety margin.
    pub fn valid_until(&self) -> Instant {
        self.live.deadline()
    }

    /// `Ok(())` if the lock is still ours right now; otherwise the terminal
    /// [`ClientError::LockLost`]. Synchronous: it also checks the deadline itself, so it is right
    /// even when the renewal task has not had a chance to run.
    pub fn ensure_held(&self) -> Result<(), ClientError> {
        self.live.check().map_err(|reason| self.lock_lost(reason))
    }

    pub fn is_lost(&self) -> bool {
        self.ensure_held().is_err()
    }

    /// Why the lock was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.live.reason()
    }

    /// Resolves the moment the lock is lost, with the reason. Cancel-safe; use it in `select!`.
    pub fn lost(&self) -> impl Future<Output = LossReason> + '_ {
        self.live.lost()
    }

    /// A token cancelled when the lock is lost, to hand to other tasks (cancelling it yourself
    /// affects only your copy).
    pub fn lost_token(&self) -> CancellationToken {
        self.live.lost_token().child_token()
    }

    /// [`ClientError::LockLost`] for this handle.
    pub fn lock_lost(&self, reason: LossReason) -> ClientError {
        ClientError::LockLost {
            key: self.grant.lock_key.clone(),
            token: self.grant.fencing_token,
            reason,
        }
    }

    /// From now on, also watch the key (`GET /v1/locks/{key}/watch`): the handle is lost the moment
    /// the server says its grant went — revoked, lapsed, its session ended, taken over — rather than
    /// at the next renewal. Costs one open stream to lock-server while the handle lives.
    pub fn watch_grant(&self) {
        tokio::spawn(crate::watch::guard(
            self.session.api.clone(),
            self.grant.lock_key.clone(),
            self.grant.fencing_token,
            self.live.clone(),
            self.stop.clone(),
        ));
    }

    /// Stops renewing, voids the handle, and deletes the grant if it is still ours. A stale release
    /// (the grant was no longer ours) is `Ok(Stale)`, logged, and never retried.
    pub async fn release(self) -> Result<ReleaseOutcome, ClientError> {
        self.stop.cancel();
        // From here the critical section must not write, whatever the server answers.
        self.live.lose(LossReason::Released);
        let key = self.key();
        let token = self.token();
        let answer = self.session.api.release(key, token).await?;
        if answer.fencing_token != token {
            return Err(ClientError::Protocol(format!(
                "released {key:?} with token {token} and got an answer for token {}",
                answer.fencing_token
            )));
        }
        if answer.released {
            tracing::info!(event = "lock_released", lock_key = %key, fencing_token = %token, stale = false);
            Ok(ReleaseOutcome::Released)
        } else {
            tracing::warn!(
                event = "lock_released",
                lock_key = %key,
                fencing_token = %token,
                stale = true,
                "the grant was no longer ours"
            );
            Ok(ReleaseOutcome::Stale)
        }
    }

    /// A newer token for the same key without giving the lock up: this handle is void from here, and
    /// the key is acquired again in the same session, which C1 grants as a re-entry with a fresh
    /// token from the sequence (§1.3: "same session re-entering"). For a holder that does one
    /// piece of fenced work per token — each payout on an account needs a newer token than the one
    /// before it, strict at (a) and (d) — that is one request instead of a release and an acquire,
    /// and no other holder comes in between. [`ClientError::Contended`] if the grant had lapsed and
    /// another holder has the key now.
    ///
    /// On any error the old grant is released (compare-and-delete on its token: it deletes nothing
    /// if the re-entry did happen), so that an unanswered re-entry does not hold the key for a lease.
    pub async fn reenter(self) -> Result<LockHandle, ClientError> {
        self.stop.cancel();
        self.live.lose(LossReason::Released);
        let session = self.session.clone();
        let key = self.grant.lock_key.clone();
        let token = self.grant.fencing_token;
        let (ttl, ttl_ms) = (self.ttl, self.ttl_ms);
        drop(self);
        session
            .live
            .check()
            .map_err(|reason| ClientError::SessionGone { reason })?;
        let sent = Instant::now();
        let answer = session
            .api
            .acquire(&key, session.id, &session.owner_id, ttl_ms)
            .await
            .and_then(|grant| {
                if grant.session_id != session.id || grant.lock_key != key {
                    Err(ClientError::Protocol(format!(
                        "re-entered {key:?} in session {} and was granted {:?} in session {}",
                        session.id, grant.lock_key, grant.session_id
                    )))
                } else if grant.fencing_token <= token {
                    Err(ClientError::Protocol(format!(
                        "re-entered {key:?} after token {token} and was granted token {}",
                        grant.fencing_token
                    )))
                } else {
                    Ok(grant)
                }
            });
        match answer {
            Ok(grant) => {
                tracing::debug!(event = "lock_reentered", lock_key = %key, previous = %token, fencing_token = %grant.fencing_token);
                Ok(LockHandle::start(session, grant, ttl, ttl_ms, sent))
            }
            Err(e) => {
                if let ClientError::SessionGone { reason } = &e {
                    session.live.lose(*reason);
                }
                if let Err(release) = session.api.release(&key, token).await {
                    tracing::warn!(event = "lock_release_failed", lock_key = %key, fencing_token = %token, error = %release);
                }
                Err(e)
            }
        }
    }

    /// Fault injection (tests, the pause-and-return demo): stop sending renewals, as if this holder
    /// were paused or cut off. The deadline keeps running, so the lock is declared lost when it
    /// passes — exactly what a real holder would find out on waking up.
    pub fn suspend_renewal(&self) {
        self.suspended.send_replace(true);
    }

    /// Undoes [`LockHandle::suspend_renewal`] (a lock already lost stays lost).
    pub fn resume_renewal(&self) {
        self.suspended.send_replace(false);
    }
}

impl Drop for LockHandle {
    fn drop(&mut self) {
        self.stop.cancel();
        // Tasks still watching `lost_token()` must not go on believing in a lease nobody renews.
        self.live.lose(LossReason::Released);
    }
}

/// What the renewal loop renews, and where it puts the grant each renewal re-signs.
struct Renewal {
    key: String,
    token: FencingToken,
    ttl_ms: i64,
    resigned: watch::Sender<Option<String>>,
}

async fn renew(
    session: Arc<SessionShared>,
    renewal: Renewal,
    live: Arc<Liveness>,
    stop: CancellationToken,
    suspended: watch::Receiver<bool>,
) {
    let Renewal {
        key,
        token,
        ttl_ms,
        resigned,
    } = renewal;
    let ended = keepalive::run(live, stop, suspended, || async {
        let renewed = session.api.renew(&key, token, ttl_ms).await?;
        if renewed.fencing_token != token {
            return Err(ClientError::Protocol(format!(
                "renewed {key:?} with token {token} and got token {}",
                renewed.fencing_token
            )));
        }
        if let Some(grant) = renewed.grant {
            resigned.send_replace(Some(grant));
        }
        Ok(renewed.expires_at)
    })
    .await;
    match ended {
        Ended::Lost(LossReason::LeaseExpired) => tracing::warn!(
            event = "lease_expired",
            lock_key = %key,
            fencing_token = %token,
            "renew found the lease gone; the lock is lost"
        ),
        Ended::Lost(reason) => tracing::warn!(
            event = "lock_lost",
            lock_key = %key,
            fencing_token = %token,
            %reason,
            "the lock is lost"
        ),
        Ended::Stopped => {}
    }
}
