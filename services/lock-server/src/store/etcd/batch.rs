//! Concurrent releases on the etcd backend sent to etcd as one transaction: each call's C1 §1.4
//! compare-and-delete a transaction of its own, nested in one request ([`EtcdRepo::release_batch`]),
//! so several releases cost etcd one request and one Raft entry, and lock-server one gRPC call.
//!
//! Only releases: a release issues no token, so its revision is nobody's. Acquires are never
//! batched on etcd: every key a transaction writes gets that transaction's one revision, and C1
//! §1.4 gives each grant a token of its own (docs/benchmarks.md).
//!
//! The shape is lockdb's batches' ([`crate::store::postgres::batch`]), smaller. A call that finds
//! nothing queued and nothing in flight ([`MAX_IN_FLIGHT`]) is sent at once from its caller's own
//! task, alone, as a release always was. Any other call is queued, and a batch task (started when
//! the slot is free) takes whatever is queued (oldest first, at most [`MAX_BATCH`], never two calls
//! for one key) and goes on with the next batch while calls are queued. So batches form only while
//! an earlier request is in flight.
//!
//! Each call's outcome is its own nested transaction's. A batch that etcd did not answer (or
//! refused as a whole) answers every caller with that error, as a lone release would: whether a
//! request that got no answer was applied is not known, so nothing is sent again.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdRepo, GrantValue, decode};
use crate::error::Error;
use crate::store::{BatchFamilies, StatementLabels};

/// The most releases one transaction carries (etcd's own limit, `--max-txn-ops`, is 128 by default).
pub const MAX_BATCH: usize = 32;

/// Release transactions in flight at once. One: under load the releases that come while one is in
/// flight wait for it and go together in the next (at 16 clients 3.8 releases per transaction,
/// against 2.3 with two in flight, and less CPU per cycle: docs/benchmarks.md). A lone release
/// still goes at once. No deadlock to avoid: a transaction holds no lock in etcd while it waits.
pub const MAX_IN_FLIGHT: usize = 1;

/// One release: the etcd key of the lock and the token it must still be at.
#[derive(Debug, Clone)]
pub(crate) struct ReleaseCall {
    pub lkey: String,
    pub token: i64,
}

struct Pending {
    call: ReleaseCall,
    reply: oneshot::Sender<Result<bool, Error>>,
    queued_at: Instant,
}

/// What the release batcher has done, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseStats {
    /// Transactions sent (a release sent alone counts as one).
    pub transactions: u64,
    /// Releases answered.
    pub calls: u64,
    /// The most releases one transaction carried.
    pub largest: usize,
}

/// The queue of one repository's releases and the slots its batches run in.
pub(crate) struct Releases {
    queue: Mutex<VecDeque<Pending>>,
    slots: Arc<Semaphore>,
    transactions: AtomicU64,
    calls: AtomicU64,
    largest: AtomicUsize,
    waited: Histogram,
    round_trip: Histogram,
    sizes: Histogram,
}

impl std::fmt::Debug for Releases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releases")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Releases {
    /// Observing into `families`' `statement="release"` series (`lock_batch_*`, as on PostgreSQL).
    pub(crate) fn new(families: &BatchFamilies) -> Arc<Self> {
        let labels = StatementLabels {
            statement: "release".to_owned(),
        };
        Arc::new(Self {
            queue: Mutex::new(VecDeque::new()),
            slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            transactions: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            largest: AtomicUsize::new(0),
            waited: families.waited.get_or_create(&labels).clone(),
            round_trip: families.statement.get_or_create(&labels).clone(),
            sizes: families.calls.get_or_create(&labels).clone(),
        })
    }

    pub(crate) fn stats(&self) -> ReleaseStats {
        ReleaseStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        // Never held across an await or a panic-prone section; a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `call` on `repo` and returns its own outcome: at once in the caller's own task when
    /// nothing is queued and no batch is running (a lone release, as it always was, without a
    /// hand-off to a batch task and back: lock-server's lightest case stays its cheapest), else in
    /// the next batch.
    pub(crate) async fn call(self: &Arc<Self>, repo: &EtcdRepo, call: ReleaseCall) -> Result<bool, Error> {
        if self.queue().is_empty()
            && let Ok(slot) = self.slots.clone().try_acquire_owned()
        {
            // Kicks the queue when this call is done or dropped: calls queued meanwhile found the
            // slot taken.
            let _alone = Alone {
                releases: self,
                repo,
                slot: Some(slot),
            };
            let out = self.send(repo, &[call], &[Instant::now()]).await?;
            return out
                .first()
                .copied()
                .ok_or_else(|| Error::Corrupt("etcd answered no release".into()));
        }
        let (reply, answer) = oneshot::channel();
        self.queue().push_back(Pending {
            call,
            reply,
            queued_at: Instant::now(),
        });
        // In a task of its own, so a caller that goes away never takes the others' request with it.
        self.kick(repo);
        // Dropped unanswered only when the runtime running the batch shut down.
        answer.await.unwrap_or(Err(Error::Cancelled))
    }

    /// Starts a batch task if calls are queued and a slot is free. No call is left queued with nobody
    /// to run it: a call whose own kick found no slot was queued while the slot was held, and its
    /// holder (a batch task, or a lone call's [`Alone`]), after giving the slot back, kicks again.
    fn kick(self: &Arc<Self>, repo: &EtcdRepo) {
        if self.queue().is_empty() {
            return;
        }
        // Outside a runtime (one shutting down drops its tasks' futures) nobody is left to answer.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return;
        };
        let me = self.clone();
        let repo = repo.clone();
        runtime.spawn(async move {
            loop {
                let batch = me.take();
                if batch.is_empty() {
                    break;
                }
                me.run(&repo, batch).await;
            }
            drop(slot);
            me.kick(&repo);
        });
    }

    /// The oldest queued calls, at most one per key (a later one waits for a later batch), callers
    /// that went away left out (their release is never sent, as when a lone request is dropped).
    fn take(&self) -> Vec<Pending> {
        let mut queue = self.queue();
        let mut batch = Vec::new();
        let mut keys = HashSet::new();
        let mut i = 0;
        while i < queue.len() && batch.len() < MAX_BATCH {
            if queue[i].reply.is_closed() {
                queue.remove(i);
            } else if keys.insert(queue[i].call.lkey.clone()) {
                batch.extend(queue.remove(i));
            } else {
                i += 1;
            }
        }
        batch
    }

    /// Sends `calls` as one request and counts it (`queued`: when each call was queued).
    async fn send(
        &self,
        repo: &EtcdRepo,
        calls: &[ReleaseCall],
        queued: &[Instant],
    ) -> Result<Vec<bool>, Error> {
        let taken = Instant::now();
        for at in queued {
            self.waited.observe(taken.duration_since(*at).as_secs_f64());
        }
        self.sizes.observe(calls.len() as f64);
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.calls.fetch_add(calls.len() as u64, Ordering::Relaxed);
        self.largest.fetch_max(calls.len(), Ordering::Relaxed);
        let out = repo.release_batch(calls).await;
        let took = taken.elapsed().as_secs_f64();
        for _ in calls {
            self.round_trip.observe(took);
        }
        out
    }

    /// Sends a batch taken from the queue and answers each caller.
    async fn run(&self, repo: &EtcdRepo, batch: Vec<Pending>) {
        let calls: Vec<ReleaseCall> = batch.iter().map(|p| p.call.clone()).collect();
        let queued: Vec<Instant> = batch.iter().map(|p| p.queued_at).collect();
        let out = self.send(repo, &calls, &queued).await;
        match out {
            Ok(outs) => {
                for (p, released) in batch.into_iter().zip(outs) {
                    // A caller that went away meanwhile: its outcome has nobody to go to.
                    let _ = p.reply.send(Ok(released));
                }
            }
            Err(e) => {
                tracing::debug!(event = "etcd_release_batch_failed", calls = batch.len(), error = %e);
                let mut errors: Vec<Error> = (1..batch.len()).map(|_| e.shared()).collect();
                errors.push(e);
                for (p, e) in batch.into_iter().zip(errors) {
                    let _ = p.reply.send(Err(e));
                }
            }
        }
    }
}

/// The slot a lone call runs in, from the caller's own task: given back, and the queue kicked, when
/// the call is done or its caller goes away.
struct Alone<'a> {
    releases: &'a Arc<Releases>,
    repo: &'a EtcdRepo,
    slot: Option<OwnedSemaphorePermit>,
}

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.releases.kick(self.repo);
    }
}

impl EtcdRepo {
    /// C1 §1.4 release: compare-and-delete on key + token (`mod_revision`). `false`: stale.
    /// Concurrent releases share one request ([`super::batch`]).
    pub async fn release(&self, key: &str, token: i64) -> Result<bool, Error> {
        let call = ReleaseCall {
            lkey: self.lock_key(key),
            token,
        };
        self.releases.call(self, call).await
    }

    /// The releases of `calls` (distinct keys) in one request, each call's outcome its own. One
    /// call is sent as it always was: its compare-and-delete as the transaction. Several are each
    /// their own transaction nested in one, which etcd applies as one: each nested compare decides
    /// its own delete only.
    pub(crate) async fn release_batch(&self, calls: &[ReleaseCall]) -> Result<Vec<bool>, Error> {
        let txn = |c: &ReleaseCall| {
            Txn::new()
                .when([self.release_compare(c)])
                .and_then([TxnOp::delete(
                    c.lkey.clone(),
                    Some(DeleteOptions::new().with_prev_key()),
                )])
        };
        if let [call] = calls {
            let resp = self.kv().txn(txn(call)).await.map_err(Error::etcd)?;
            return Ok(vec![self.released(resp.succeeded(), resp.op_responses())]);
        }
        let resp = self
            .kv()
            .txn(Txn::new().and_then(calls.iter().map(|c| TxnOp::txn(txn(c))).collect::<Vec<_>>()))
            .await
            .map_err(Error::etcd)?;
        let outs: Vec<bool> = resp
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Txn(t) => Some(self.released(t.succeeded(), t.op_responses())),
                _ => None,
            })
            .collect();
        if outs.len() != calls.len() {
            return Err(Error::Corrupt(format!(
                "etcd answered {} of {} nested releases",
                outs.len(),
                calls.len()
            )));
        }
        Ok(outs)
    }

    /// What a release compares: the key still at the call's token (`mod_revision`).
    fn release_compare(&self, c: &ReleaseCall) -> Compare {
        let lkey = c.lkey.clone();
        if self.faults.release_by_key_alone {
            Compare::create_revision(lkey, CompareOp::Greater, 0)
        } else if self.faults.token_from_version {
            Compare::version(lkey, CompareOp::Equal, c.token)
        } else {
            Compare::mod_revision(lkey, CompareOp::Equal, c.token)
        }
    }

    /// A release's outcome from its transaction's answer: released if the compare held. The grant is
    /// gone and its lease carries nothing else of it: the lease waits for the session's next grant
    /// (a grant written before pooling has its lease revoked).
    fn released(&self, succeeded: bool, ops: Vec<TxnOpResponse>) -> bool {
        if !succeeded {
            return false;
        }
        if let Some(TxnOpResponse::Delete(d)) = ops.first() {
            for kv in d.prev_kvs() {
                match decode::<GrantValue>(kv) {
                    Ok(g) => self.give_back(g.session_id, g.lease_secs, kv.lease(), true),
                    Err(_) => self.revoke_lease_later(kv.lease()),
                }
            }
        }
        true
    }
}
