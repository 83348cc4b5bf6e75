//! The blocking acquire on etcd: a waiter key per waiter on the session's lease, ordered by create
//! revision; each waiter watches only its predecessor's key, and the head the grant key, as etcd's
//! `concurrency.Mutex`.

use chrono::Utc;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
    WatchStream,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{EtcdRepo, WaiterValue, decode, encode, first_get};
use crate::config::QueueFaults;
use crate::error::Error;
use crate::store::{GRACE, Grant, WaitMetrics, Waiter, WakeReason};

impl EtcdRepo {
    /// Waits in etcd's queue of `w.key` ([`EtcdRepo::wait_for`]).
    pub(crate) async fn wait(
        &self,
        w: &Waiter,
        deadline: Instant,
        faults: QueueFaults,
        cancel: &CancellationToken,
        metrics: &WaitMetrics,
    ) -> Result<Option<Grant>, Error> {
        self.wait_for(
            &w.key,
            &w.owner_id,
            w.session_id,
            w.ttl_secs,
            deadline,
            faults,
            cancel,
            metrics,
        )
        .await
    }

    /// Whether nobody is queued for `key` (no waiter key; one a dead replica left counts until it is
    /// removed, so such a queue is joined and cleaned as usual).
    pub(crate) async fn queue_empty(&self, key: &str) -> Result<bool, Error> {
        Ok(self.queue_len(key).await? == 0)
    }

    /// How many waiter keys `key`'s queue holds.
    pub(crate) async fn queue_len(&self, key: &str) -> Result<i64, Error> {
        Ok(self
            .client()
            .get(
                self.queue_prefix(key),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .map_err(Error::etcd)?
            .count())
    }

    /// The blocking acquire on etcd ([`crate::queue`]): a waiter key on the session's lease, in
    /// create-revision order; the head tries [`EtcdRepo::acquire`] and, contended, watches the grant
    /// key (its release, revocation, lapse or session end deletes it); every other waiter watches
    /// only its predecessor's key. `Some` granted, `None` the deadline passed.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
        deadline: Instant,
        faults: QueueFaults,
        cancel: &CancellationToken,
        metrics: &WaitMetrics,
    ) -> Result<Option<Grant>, Error> {
        let skey = self.session_key(session_id);
        let Some(session) = self.get_one(skey.clone()).await? else {
            return Err(Error::SessionGone);
        };
        let me = format!("{}{}", self.queue_prefix(key), Uuid::new_v4());
        let left = deadline.saturating_duration_since(Instant::now());
        let value = encode(&WaiterValue {
            owner_id: owner_id.to_owned(),
            session_id,
            deadline_ms: Utc::now().timestamp_millis()
                + i64::try_from(left.as_millis()).unwrap_or(i64::MAX / 2),
        });
        let joined = self
            .client()
            .txn(
                Txn::new()
                    .when([Compare::create_revision(skey, CompareOp::Greater, 0)])
                    .and_then([TxnOp::put(
                        me.clone(),
                        value,
                        Some(PutOptions::new().with_lease(session.lease())),
                    )]),
            )
            .await
            .map_err(Error::etcd)?;
        if !joined.succeeded() {
            return Err(Error::SessionGone);
        }
        let mine = joined
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::Corrupt("a transaction without a header".into()))?;
        let out = self
            .queued(
                key, owner_id, session_id, ttl_secs, &me, mine, deadline, faults, cancel, metrics,
            )
            .await;
        // Leaving wakes the waiter behind (it watches this key).
        if let Err(e) = self.client().delete(me, None).await {
            tracing::warn!(event = "waiter_dequeue_failed", lock_key = %key, error = %e);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    async fn queued(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
        me: &str,
        mine: i64,
        deadline: Instant,
        faults: QueueFaults,
        cancel: &CancellationToken,
        metrics: &WaitMetrics,
    ) -> Result<Option<Grant>, Error> {
        let lkey = self.lock_key(key);
        loop {
            let ahead = if faults.lifo {
                GetOptions::new()
                    .with_prefix()
                    .with_min_create_revision(mine + 1)
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1)
            } else {
                GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(mine - 1)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1)
            };
            let seen = self
                .client()
                .txn(Txn::new().and_then([
                    TxnOp::get(me, None),
                    TxnOp::get(self.queue_prefix(key), Some(ahead)),
                ]))
                .await
                .map_err(Error::etcd)?;
            let rev = seen.header().map(|h| h.revision()).unwrap_or(0);
            let ops = seen.op_responses();
            if first_get(&ops, 0).is_none() {
                // The waiter key went with its session's lease.
                return Err(Error::SessionGone);
            }
            let mut watched = vec![(me.to_owned(), WakeReason::gone)];
            let mut timer = None;
            match first_get(&ops, 1) {
                Some(ahead) => {
                    let w: WaiterValue = decode(&ahead)?;
                    let lapses_in = w.deadline_ms - Utc::now().timestamp_millis()
                        + i64::try_from(GRACE.as_millis()).unwrap_or(0);
                    if lapses_in <= 0 {
                        // Left behind by a replica that died: remove it (only as it was seen).
                        self.client()
                            .txn(
                                Txn::new()
                                    .when([Compare::mod_revision(
                                        ahead.key().to_vec(),
                                        CompareOp::Equal,
                                        ahead.mod_revision(),
                                    )])
                                    .and_then([TxnOp::delete(ahead.key().to_vec(), None)]),
                            )
                            .await
                            .map_err(Error::etcd)?;
                        continue;
                    }
                    timer = Some(std::time::Duration::from_millis(lapses_in.unsigned_abs()));
                    watched.push((
                        String::from_utf8_lossy(ahead.key()).into_owned(),
                        WakeReason::head,
                    ));
                    if faults.wake_every_waiter {
                        watched.push((lkey.clone(), WakeReason::freed));
                    }
                }
                None => {
                    if let Some(g) = self.acquire(key, owner_id, session_id, ttl_secs).await? {
                        return Ok(Some(g));
                    }
                    watched.push((lkey.clone(), WakeReason::freed));
                }
            }
            let asleep = metrics.asleep();
            let why = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(Error::Cancelled),
                () = tokio::time::sleep_until(deadline) => return Ok(None),
                () = async {
                    match timer {
                        Some(t) => tokio::time::sleep(t).await,
                        None => std::future::pending().await,
                    }
                } => WakeReason::ahead_lapsed,
                r = self.first_delete(&watched, rev) => r?,
            };
            drop(asleep);
            metrics.woken(why);
        }
    }

    /// The reason of the first of `keys` deleted after `rev`.
    async fn first_delete(&self, keys: &[(String, WakeReason)], rev: i64) -> Result<WakeReason, Error> {
        let mut streams: Vec<(WatchStream, WakeReason, etcd_client::Watcher)> = Vec::new();
        for (k, why) in keys {
            let (watcher, stream) = self
                .client()
                .watch(k.clone(), Some(WatchOptions::new().with_start_revision(rev + 1)))
                .await
                .map_err(Error::etcd)?;
            streams.push((stream, *why, watcher));
        }
        loop {
            let pending = streams
                .iter_mut()
                .map(|(s, why, _)| Box::pin(async move { (s.message().await, *why) }));
            let ((msg, why), _, _) = futures::future::select_all(pending).await;
            match msg.map_err(Error::etcd)? {
                Some(resp) if resp.events().iter().any(|e| e.event_type() == EventType::Delete) => {
                    return Ok(why);
                }
                Some(resp) if resp.canceled() => {
                    return Err(Error::Corrupt(format!(
                        "etcd cancelled a watch: {}",
                        resp.cancel_reason()
                    )));
                }
                Some(_) => {}
                None => {
                    return Err(Error::etcd(etcd_client::Error::WatchError(
                        "the watch stream ended".into(),
                    )));
                }
            }
        }
    }
}
