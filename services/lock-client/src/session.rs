//! A lock session: opened once per worker, kept alive by a background heartbeat, and the parent of
//! every lock handle acquired through it. Losing the session voids all of them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dlock_wire::validate;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::api::{LockApi, LockGrant};
use crate::error::{ClientError, LossReason};
use crate::handle::{LockHandle, SessionShared};
use crate::keepalive::{self, Ended};
use crate::liveness::Liveness;

/// A TTL as the whole milliseconds sent to the server, and the same amount as a `Duration` for our
/// own deadline arithmetic (so sub-millisecond parts never make us believe in a longer lease).
pub(crate) fn ttl_ms(field: &str, ttl: Duration) -> Result<(i64, Duration), ClientError> {
    let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    validate::ttl_ms(field, ms).map_err(ClientError::invalid)?;
    Ok((ms, Duration::from_millis(ms.unsigned_abs())))
}

/// An open lock session. Heartbeats every `ttl / 3` in the background.
///
/// The session is lost when a heartbeat answers 410 `SESSION_GONE` (reaped or closed server-side),
/// or when no heartbeat could be confirmed before the session's deadline minus a safety margin.
/// Every [`LockHandle`] acquired through it is lost with it. Dropping the session stops the
/// heartbeat and voids its handles (the server reaps it after its TTL, which releases their locks).
#[derive(Debug)]
pub struct Session {
    shared: Arc<SessionShared>,
    stop: CancellationToken,
    suspended: watch::Sender<bool>,
}

impl Session {
    pub(crate) async fn open(api: LockApi, owner_id: &str, ttl: Duration) -> Result<Self, ClientError> {
        validate::owner_id(owner_id).map_err(ClientError::invalid)?;
        let (ms, ttl) = ttl_ms("session ttl", ttl)?;
        let sent = Instant::now();
        let opened = api.open_session(owner_id, ms).await?;
        let live = Arc::new(Liveness::new(
            ttl,
            sent,
            opened.expires_at,
            LossReason::HeartbeatUnconfirmed,
            None,
        ));
        let shared = Arc::new(SessionShared {
            api,
            id: opened.session_id,
            owner_id: opened.owner_id,
            live,
        });
        let stop = CancellationToken::new();
        let (suspended, suspended_rx) = watch::channel(false);
        tokio::spawn(heartbeat(shared.clone(), stop.clone(), suspended_rx, ms));
        tracing::info!(event = "session_opened", session_id = %shared.id, owner_id = %shared.owner_id);
        Ok(Self {
            shared,
            stop,
            suspended,
        })
    }

    pub fn id(&self) -> Uuid {
        self.shared.id
    }

    pub fn owner_id(&self) -> &str {
        &self.shared.owner_id
    }

    /// The session's expiry as last confirmed by the server (lockdb clock; informational).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.shared.live.expires_at()
    }

    /// `Err(SessionGone)` if the session is lost (checking the local deadline now).
    pub fn check(&self) -> Result<(), ClientError> {
        self.shared
            .live
            .check()
            .map_err(|reason| ClientError::SessionGone { reason })
    }

    pub fn is_lost(&self) -> bool {
        self.check().is_err()
    }

    /// Resolves when the session is lost, with the reason.
    pub fn lost(&self) -> impl Future<Output = LossReason> + '_ {
        self.shared.live.lost()
    }

    /// A token cancelled when the session is lost, to hand to other tasks (cancelling it yourself
    /// affects only your copy).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.live.lost_token().child_token()
    }

    /// One attempt: a [`LockHandle`] if granted, [`ClientError::Contended`] if another live holder
    /// has the key. Acquiring a key this session already holds re-enters it with a new token; the
    /// older handle then loses its lease.
    pub async fn try_acquire(&self, key: &str, lease_ttl: Duration) -> Result<LockHandle, ClientError> {
        validate::lock_key(key).map_err(ClientError::invalid)?;
        let (ms, ttl) = ttl_ms("lease ttl", lease_ttl)?;
        self.check()?;
        let sent = Instant::now();
        let answer = self
            .shared
            .api
            .acquire(key, self.shared.id, &self.shared.owner_id, ms)
            .await;
        self.handle(key, answer, ttl, ms, sent)
    }

    /// Acquires `key`, waiting up to `max_wait` in the key's queue on the server: granted in
    /// arrival order, woken by the release before it (no polling). When `max_wait` has elapsed the
    /// answer is [`ClientError::Contended`]. Other errors return at once. A wait longer than the
    /// server's longest (60 s) is asked again each time (at the back of the queue).
    pub async fn acquire(
        &self,
        key: &str,
        lease_ttl: Duration,
        max_wait: Duration,
    ) -> Result<LockHandle, ClientError> {
        validate::lock_key(key).map_err(ClientError::invalid)?;
        let (ms, ttl) = ttl_ms("lease ttl", lease_ttl)?;
        let give_up = Instant::now() + max_wait;
        loop {
            self.check()?;
            let left = give_up.saturating_duration_since(Instant::now());
            let wait_ms = i64::try_from(left.as_millis())
                .unwrap_or(i64::MAX)
                .min(dlock_wire::lock::MAX_WAIT_MS);
            let sent = Instant::now();
            let answer = self
                .shared
                .api
                .acquire_waiting(key, self.shared.id, &self.shared.owner_id, ms, wait_ms)
                .await;
            match answer {
                Err(ClientError::Contended { key }) if Instant::now() < give_up => {
                    tracing::debug!(event = "lock_contended", lock_key = %key, "waiting again");
                }
                Ok(grant) if sent.elapsed() >= crate::liveness::margin(ttl) => {
                    // The lease began when the grant was made, somewhere in a long wait: confirm it
                    // with a renewal, whose sending starts a lease we can count from.
                    let renewed_at = Instant::now();
                    let renewed = self.shared.api.renew(key, grant.fencing_token, ms).await;
                    match renewed {
                        Ok(r) if r.fencing_token == grant.fencing_token => {
                            let grant = LockGrant {
                                expires_at: r.expires_at,
                                ..grant
                            };
                            return self.handle(key, Ok(grant), ttl, ms, renewed_at);
                        }
                        Ok(r) => {
                            return Err(ClientError::Protocol(format!(
                                "renewed {key:?} with token {} and got token {}",
                                grant.fencing_token, r.fencing_token
                            )));
                        }
                        Err(e) => return Err(e),
                    }
                }
                other => return self.handle(key, other, ttl, ms, sent),
            }
        }
    }

    /// A grant answered to a request sent at `sent` as a handle; a lost session voids this one.
    fn handle(
        &self,
        key: &str,
        answer: Result<LockGrant, ClientError>,
        ttl: Duration,
        ms: i64,
        sent: Instant,
    ) -> Result<LockHandle, ClientError> {
        match answer {
            Ok(grant) => {
                if grant.session_id != self.shared.id || grant.lock_key != key {
                    return Err(ClientError::Protocol(format!(
                        "asked for {key:?} in session {} and was granted {:?} in session {}",
                        self.shared.id, grant.lock_key, grant.session_id
                    )));
                }
                tracing::debug!(event = "lock_granted", lock_key = %key, fencing_token = %grant.fencing_token);
                Ok(LockHandle::start(self.shared.clone(), grant, ttl, ms, sent))
            }
            Err(ClientError::SessionGone { reason }) => {
                self.shared.live.lose(reason);
                Err(ClientError::SessionGone { reason })
            }
            Err(e) => Err(e),
        }
    }

    /// Closes the session server-side (its locks are released by the cascade) and voids every
    /// handle under it. `Ok(false)` if the server had already lost it.
    pub async fn close(self) -> Result<bool, ClientError> {
        self.stop.cancel();
        self.shared.live.lose(LossReason::SessionEnded);
        let closed = self.shared.api.close_session(self.shared.id).await?;
        tracing::info!(event = "session_closed", session_id = %self.shared.id, closed = closed.closed);
        Ok(closed.closed)
    }

    /// Fault injection (tests, the pause-and-return demo): stop sending heartbeats, as if this
    /// process were cut off from lock-server. The deadline keeps running, so the session is declared
    /// lost when it passes.
    pub fn suspend_heartbeat(&self) {
        self.suspended.send_replace(true);
    }

    /// Undoes [`Session::suspend_heartbeat`] (a session already lost stays lost).
    pub fn resume_heartbeat(&self) {
        self.suspended.send_replace(false);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared.live.lose(LossReason::SessionEnded);
    }
}

async fn heartbeat(
    shared: Arc<SessionShared>,
    stop: CancellationToken,
    suspended: watch::Receiver<bool>,
    ttl_ms: i64,
) {
    let ended = keepalive::run(shared.live.clone(), stop, suspended, || async {
        shared
            .api
            .heartbeat(shared.id, ttl_ms)
            .await
            .map(|h| h.expires_at)
    })
    .await;
    if let Ended::Lost(reason) = ended {
        tracing::warn!(
            event = "session_lost",
            session_id = %shared.id,
            owner_id = %shared.owner_id,
            %reason,
            "lock session lost; every lock under it is void"
        );
    }
}
