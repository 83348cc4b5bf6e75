//! The grant leases of the etcd backend: each grant has a lease of its own, and a released grant's
//! lease waits in a pool for its session's next grant with the same TTL (see the backend's
//! documentation), kept alive once instead of granting a new one.

use std::collections::HashMap;
use std::sync::MutexGuard;

use chrono::{DateTime, Utc};
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use tokio::time::Instant;
use uuid::Uuid;

use super::{EtcdRepo, is_lease_not_found, keep_alive_outcome, lease_end};
use crate::error::Error;

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum LeaseSource {
    granted,
    reused,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub source: LeaseSource,
}

/// How many grant leases one session may keep pooled per TTL (the most grants it held at once, up
/// to this; the rest lapse by their TTL).
const POOLED_PER_SESSION: usize = 64;
/// A pooled lease is not offered once it may be within this of its end: a keep-alive that reaches
/// a lease etcd has let run out waits for the lessor's next round (up to 500 ms) to be told so.
const POOL_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);
/// The pool is swept of leases past their end every this many returns.
const SWEEP_EVERY: u64 = 1024;

/// Leases carrying no grant, by (session, lease TTL in seconds): given back by the release that
/// deleted their one grant (they carry its index entry `P h/<session>/<lease>`, and keep it until
/// they go), or by an acquire that found the key held (a new lease then carries nothing, and says
/// so). Each is alive until at most its TTL after it was given back (no one keeps a pooled lease
/// alive). A lease is in at most one pool, or under at most one grant: it leaves only to carry one
/// new grant.
///
/// The keep-alive stream of each lease that was reused is parked here too, by lease, from the
/// reuse on (through the grant it carries and back into the pool): the next reuse sends one message
/// on it. A parked stream is dropped with its lease (taken for a grant without it, evicted, swept),
/// with its session (closed or reaped), or once it is older than its lease's TTL.
#[derive(Debug, Default)]
pub(super) struct LeasePool {
    free: HashMap<(Uuid, i64), Vec<Free>>,
    streams: HashMap<i64, Parked>,
    returns: u64,
}

/// A pooled lease: when it was given back, and whether it carries its index entry already.
#[derive(Debug, Clone, Copy)]
pub(super) struct Free {
    lease: i64,
    at: Instant,
    indexed: bool,
}

/// An open keep-alive stream of one lease.
pub(super) struct KeepAlive {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAlive")
            .field("lease", &self.keeper.id())
            .finish()
    }
}

/// A keep-alive stream waiting for its lease's next reuse: the lease's session and TTL, and when it
/// was last renewed on it.
#[derive(Debug)]
struct Parked {
    keep: KeepAlive,
    session: Uuid,
    secs: i64,
    at: Instant,
}

impl LeasePool {
    /// A lease of `session` granted for `secs`, newest first, that cannot have lapsed yet, with its
    /// parked keep-alive stream if it has one.
    pub(super) fn take(
        &mut self,
        session: Uuid,
        secs: i64,
        now: Instant,
    ) -> Option<(Free, Option<KeepAlive>)> {
        let list = self.free.get_mut(&(session, secs))?;
        let mut found = None;
        while let Some(free) = list.pop() {
            let parked = self.streams.remove(&free.lease).map(|p| p.keep);
            if !Self::lapsing(free.at, secs, now) {
                found = Some((free, parked));
                break;
            }
        }
        if list.is_empty() {
            self.free.remove(&(session, secs));
        }
        found
    }

    /// Keeps `keep` open for the next reuse of `lease`, `session`'s lease of `secs`.
    pub(super) fn park(&mut self, session: Uuid, lease: i64, secs: i64, keep: KeepAlive, now: Instant) {
        self.streams.insert(
            lease,
            Parked {
                keep,
                session,
                secs,
                at: now,
            },
        );
        self.tick(now);
    }

    pub(super) fn give_back(&mut self, session: Uuid, secs: i64, lease: i64, indexed: bool, now: Instant) {
        let list = self.free.entry((session, secs)).or_default();
        if list.len() >= POOLED_PER_SESSION {
            let evicted = list.remove(0);
            self.streams.remove(&evicted.lease);
        }
        list.push(Free {
            lease,
            at: now,
            indexed,
        });
        self.tick(now);
    }

    /// Every [`SWEEP_EVERY`] returns and parks: drops the leases past their end, and the streams of
    /// leases that lapsed under a grant never released (or that a renewal on another stream kept
    /// alive: reopened at their next reuse, if there is one).
    pub(super) fn tick(&mut self, now: Instant) {
        self.returns += 1;
        if self.returns.is_multiple_of(SWEEP_EVERY) {
            self.free.retain(|(_, secs), list| {
                list.retain(|f| !Self::lapsing(f.at, *secs, now));
                !list.is_empty()
            });
            self.streams.retain(|_, p| !Self::lapsing(p.at, p.secs, now));
        }
    }

    /// The session is closed: its pooled leases, and the streams of all its leases, pooled or held.
    pub(super) fn forget(&mut self, session: Uuid) {
        self.free.retain(|(s, _), _| *s != session);
        self.streams.retain(|_, p| p.session != session);
    }

    pub(super) fn lapsing(at: Instant, secs: i64, now: Instant) -> bool {
        let ttl = std::time::Duration::from_secs(secs.unsigned_abs());
        at + ttl <= now + POOL_MARGIN
    }
}

/// The lease a grant is about to be written on, and the end of it measured from before etcd
/// started (or restarted) its clock.
pub(super) struct GrantLease {
    pub(super) id: i64,
    pub(super) end: DateTime<Utc>,
    /// It carries the session's index entry for it already (a pooled lease that carried a grant):
    /// the grant need not write it again.
    pub(super) indexed: bool,
}

impl EtcdRepo {
    pub(super) fn count_lease(&self, source: LeaseSource) {
        self.leases.get_or_create(&LeaseLabels { source }).inc();
    }

    pub(super) fn pool(&self) -> MutexGuard<'_, LeasePool> {
        // Never held across an await or a panic-prone section; a poisoned pool is still consistent.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease for the next grant of `session` with a `secs` lease: a pooled one kept alive once
    /// (etcd restores its TTL), or a new one.
    pub(super) async fn lease_for(&self, session_id: Uuid, secs: i64) -> Result<GrantLease, Error> {
        loop {
            let Some((free, parked)) = self.pool().take(session_id, secs, Instant::now()) else {
                break;
            };
            let id = free.lease;
            let before = Utc::now();
            // Answered only once etcd has renewed the lease: its end is `secs` from then at least.
            // `None`: revoked (its session closed on another replica) or lapsed; try the next.
            if let Some(keep) = self.keep_pooled_alive(id, parked).await? {
                self.pool().park(session_id, id, secs, keep, Instant::now());
                self.count_lease(LeaseSource::reused);
                return Ok(GrantLease {
                    id,
                    end: lease_end(before, secs),
                    indexed: free.indexed,
                });
            }
        }
        let before = Utc::now();
        let lease = self.client().lease_grant(secs, None).await.map_err(Error::etcd)?;
        self.count_lease(LeaseSource::granted);
        Ok(GrantLease {
            id: lease.id(),
            end: lease_end(before, lease.ttl()),
            indexed: false,
        })
    }

    /// One keep-alive of the pooled lease `id`, on its parked stream if it has one that still works,
    /// else on a new stream: the stream to park, or `None` if the lease is gone. Either way the
    /// answer comes only after etcd renewed the lease (etcd's TTL-0 answer: gone).
    pub(super) async fn keep_pooled_alive(
        &self,
        id: i64,
        parked: Option<KeepAlive>,
    ) -> Result<Option<KeepAlive>, Error> {
        if let Some(mut keep) = parked
            && keep.keeper.keep_alive().await.is_ok()
        {
            // The stream is owned here from send to answer, so no answer of an earlier keep-alive
            // can be waiting on it (a dropped acquire drops the stream with it). Ended or broken
            // (etcd restarted, the connection was replaced): a new stream, below.
            if let Ok(Some(r)) = keep.stream.message().await
                && r.id() == id
            {
                return Ok(keep_alive_outcome(Ok(Some(r.ttl())))?.map(|_| keep));
            }
        }
        match self.client().lease_keep_alive(id).await {
            Ok((keeper, stream)) => Ok(Some(KeepAlive { keeper, stream })),
            Err(e) if is_lease_not_found(&e) => Ok(None),
            Err(e) => Err(Error::etcd(e)),
        }
    }

    /// A lease whose grant is gone (released, or never written): to the pool, if the grant was
    /// written with a pooled lease's index (`secs` > 0), else revoked. `indexed`: the lease carries
    /// its index entry (it carried a grant).
    pub(super) fn give_back(&self, session_id: Uuid, secs: i64, lease: i64, indexed: bool) {
        if secs > 0 {
            self.pool()
                .give_back(session_id, secs, lease, indexed, Instant::now());
        } else {
            self.revoke_lease_later(lease);
        }
    }
}
