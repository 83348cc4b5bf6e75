//! The etcd backend: the same operations as [`crate::repo::Repo`], on the etcd v3 API.
//!
//! Layout under the configured prefix `P` (see docs/design.md, "The etcd backend"):
//!
//! - `P s/<session>`          a session: value `{ownerId}`, attached to the session's lease;
//! - `P l/<key>`              a grant: value `{ownerId, sessionId, acquiredAtMs}`, attached to the
//!   grant's own lease (TTL = the lock TTL); the fencing token is this key's `mod_revision`;
//! - `P h/<session>/<lease>`  the session's index of its grant leases, on that lease (for close/reap);
//! - `P r/<token>/<key>`      the append-only force-revoke audit record, no lease.
//!
//! Only etcd's clock decides expiry: a grant is alive exactly while its lease is. The timestamps in
//! answers (`acquiredAt`, `expiresAt`) are this server's reading of the lease TTL etcd reported and are
//! informative only; nothing compares them.
//!
//! A grant's lease is its own (renewing one grant never keeps another alive), but it is not thrown
//! away at release: the release's compare-and-delete leaves it carrying nothing but its index entry,
//! and it waits in a pool for the same session's next grant with the same TTL, which keeps it alive
//! once (a keep-alive, not a Raft write) instead of granting a new lease and revoking the old one.
//! So an acquire/release cycle costs etcd two writes, as etcd's own `concurrency.Mutex` does. The
//! keep-alive stream a reused lease was renewed on stays open with it, so its next reuse is one
//! message on that stream rather than a new gRPC stream.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KeyValue, KvClient,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchOptions, WatchStream,
};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::batch::BatchFamilies;
use crate::config::QueueFaults;
use crate::error::Error;
use crate::etcd_batch::{ReleaseCall, ReleaseStats, Releases};
use crate::metrics::{Metrics, WakeReason};
use crate::repo::{Grant, ListedRow, LockRow, Renewed, Revocation, Revoked, Session};

/// Deliberately broken variants, for the negative controls only. Production is [`EtcdFaults::NONE`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EtcdFaults {
    /// The token is the key's per-key `version` (C1 §1.7's per-row counter) instead of the revision.
    pub token_from_version: bool,
    /// Release deletes the key whatever its token.
    pub release_by_key_alone: bool,
    /// Renew keeps the key's current lease alive whatever the token.
    pub renew_ignores_token: bool,
    /// A grant's lease goes to the pool at once, while the grant still holds it: the session's next
    /// grant shares it, and renewing either keeps both alive.
    pub pool_leases_in_use: bool,
    /// A lease that carried a grant is taken to carry its index entry still: its next grant neither
    /// checks nor writes it, so a lease whose entry is gone is one that closing the session misses.
    pub trust_pooled_index: bool,
}

impl EtcdFaults {
    pub const NONE: EtcdFaults = EtcdFaults {
        token_from_version: false,
        release_by_key_alone: false,
        renew_ignores_token: false,
        pool_leases_in_use: false,
        trust_pooled_index: false,
    };
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionValue {
    owner_id: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GrantValue {
    owner_id: String,
    session_id: Uuid,
    acquired_at_ms: i64,
    /// The TTL the grant's lease was granted with, whole seconds: its pool at release. 0 in a grant
    /// written before leases were pooled (its lease is revoked at release, as then).
    #[serde(default)]
    lease_secs: i64,
}

/// A waiter of a key's queue (`P q/<key>\0<id>`, on the session's lease).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WaiterValue {
    owner_id: String,
    session_id: Uuid,
    /// When the waiter's own wait ends (its replica's clock): past it (and a grace) the key is one
    /// a dead replica left behind, and the waiter behind it removes it.
    deadline_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RevocationValue {
    lock_key: String,
    prev_owner: String,
    prev_token: i64,
    operator: String,
    reason: String,
}

/// The end of a lease that etcd granted or kept alive for `ttl` seconds, measured from `before`,
/// an instant taken *before* the call: etcd starts (or restarts) the lease's clock somewhere
/// between the call and its answer, so an end measured from after the answer would promise the
/// holder more than etcd keeps. The fault campaign caught it (docs/reliability.md, anomaly 5): a
/// grant answered with an `expiresAt` up to the call's latency past the instant etcd let the key go
/// to the next holder.
fn lease_end(before: DateTime<Utc>, ttl: i64) -> DateTime<Utc> {
    before + ChronoDuration::seconds(ttl.max(0))
}

/// etcd leases are whole seconds: a TTL in (fractional) seconds rounds *up*, so a lease never lapses
/// before the TTL the caller asked for; etcd itself raises anything below its minimum TTL
/// (1.5 × election timeout, 2 s with the defaults) to that minimum.
pub fn lease_secs(ttl_secs: f64) -> i64 {
    // The API validates ttlMs to a bounded positive range before we get here.
    (ttl_secs.ceil() as i64).max(1)
}

#[derive(Clone)]
pub struct EtcdRepo {
    // Boxed: the client is large and the backend enum is passed around by value.
    client: Box<Client>,
    prefix: String,
    faults: EtcdFaults,
    pool: Arc<Mutex<LeasePool>>,
    /// Where this replica's grant leases came from (`lock_etcd_grant_leases_total{source}`).
    leases: Family<LeaseLabels, Counter>,
    /// Concurrent releases, sent as one transaction ([`crate::etcd_batch`]).
    releases: Arc<Releases>,
    /// What the release batches observe (`lock_batch_*{statement="release"}`).
    batches: BatchFamilies,
}

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
struct LeasePool {
    free: HashMap<(Uuid, i64), Vec<Free>>,
    streams: HashMap<i64, Parked>,
    returns: u64,
}

/// A pooled lease: when it was given back, and whether it carries its index entry already.
#[derive(Debug, Clone, Copy)]
struct Free {
    lease: i64,
    at: Instant,
    indexed: bool,
}

/// An open keep-alive stream of one lease.
struct KeepAlive {
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
    fn take(&mut self, session: Uuid, secs: i64, now: Instant) -> Option<(Free, Option<KeepAlive>)> {
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
    fn park(&mut self, session: Uuid, lease: i64, secs: i64, keep: KeepAlive, now: Instant) {
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

    fn give_back(&mut self, session: Uuid, secs: i64, lease: i64, indexed: bool, now: Instant) {
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
    fn tick(&mut self, now: Instant) {
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
    fn forget(&mut self, session: Uuid) {
        self.free.retain(|(s, _), _| *s != session);
        self.streams.retain(|_, p| p.session != session);
    }

    fn lapsing(at: Instant, secs: i64, now: Instant) -> bool {
        let ttl = std::time::Duration::from_secs(secs.unsigned_abs());
        at + ttl <= now + POOL_MARGIN
    }
}

/// The lease a grant is about to be written on, and the end of it measured from before etcd
/// started (or restarted) its clock.
struct GrantLease {
    id: i64,
    end: DateTime<Utc>,
    /// It carries the session's index entry for it already (a pooled lease that carried a grant):
    /// the grant need not write it again.
    indexed: bool,
}

impl std::fmt::Debug for EtcdRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRepo")
            .field("prefix", &self.prefix)
            .field("faults", &self.faults)
            .finish()
    }
}

/// Whether etcd said that the lease does not exist (any more: lapsed by etcd's clock, or revoked).
/// etcd-client has two shapes for it:
///
/// - gRPC `NOT_FOUND` "etcdserver: requested lease not found" ([`etcd_client::Error::GRpcStatus`]),
///   from `LeaseRevoke` and `LeaseTimeToLive` of a lease that is gone;
/// - [`etcd_client::Error::LeaseKeepAliveError`] "lease not found", which `lease_keep_alive` makes
///   of etcd's keep-alive answer with TTL 0. etcd answers a keep-alive that way once the lease is
///   revoked — and a keep-alive that reaches a lease whose TTL has run out but which etcd's lessor
///   has not revoked yet (it does so in rounds, every 500 ms) waits for that revocation and then
///   answers TTL 0. So this is what a renew meets at a lease's lapse.
///
/// Everything else (transport, timeouts, no leader, a broken keep-alive stream) is a real failure.
pub fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}

fn lookup_ok<T>(r: Result<T, etcd_client::Error>) -> Result<Option<T>, Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        // Revoking or keeping alive a lease that is already gone is "nothing there", not a failure.
        Err(e) if is_lease_not_found(&e) => Ok(None),
        Err(e) => Err(Error::etcd(e)),
    }
}

/// What one keep-alive exchange says about the lease: `Ok(Some(ttl))` it is alive with `ttl` seconds
/// left, `Ok(None)` it is gone, `Err` etcd could not be asked. `answer` is the TTL etcd answered
/// (`Ok(None)`: the stream ended without an answer) or the error etcd-client reported on the way.
/// Every "gone" shape maps to `Ok(None)`: TTL <= 0 on the stream, and the errors of
/// [`is_lease_not_found`].
pub fn keep_alive_outcome(answer: Result<Option<i64>, etcd_client::Error>) -> Result<Option<i64>, Error> {
    match answer {
        Ok(Some(ttl)) if ttl > 0 => Ok(Some(ttl)),
        // etcd's own "not found" on the keep-alive stream.
        Ok(Some(_)) => Ok(None),
        // etcd never closes a keep-alive stream for a missing lease (it answers TTL 0 and goes on),
        // so a stream that ends unanswered says nothing about the lease: the exchange failed.
        Ok(None) => Err(Error::etcd(etcd_client::Error::LeaseKeepAliveError(
            "the keep-alive stream ended without an answer".to_owned(),
        ))),
        Err(e) if is_lease_not_found(&e) => Ok(None),
        Err(e) => Err(Error::etcd(e)),
    }
}

fn first_get(resp: &[TxnOpResponse], idx: usize) -> Option<KeyValue> {
    match resp.get(idx) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
        _ => None,
    }
}

fn decode<T: for<'de> Deserialize<'de>>(kv: &KeyValue) -> Result<T, Error> {
    serde_json::from_slice(kv.value())
        .map_err(|e| Error::Corrupt(format!("{}: {e}", kv.key_str().unwrap_or("?"))))
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

impl EtcdRepo {
    /// Connects lazily (the channel dials on first use), so the server starts while etcd is down and
    /// `/readyz` reports it.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self, Error> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(2))
            .with_timeout(std::time::Duration::from_secs(5))
            .with_keep_alive(
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(2),
            );
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(Error::etcd)?;
        Ok(Self::with_client(client, prefix, EtcdFaults::NONE))
    }

    /// For negative controls only: the same backend with a deliberate fault.
    pub fn with_client(client: Client, prefix: &str, faults: EtcdFaults) -> Self {
        let batches = BatchFamilies::default();
        Self {
            releases: Releases::new(&batches),
            batches,
            client: Box::new(client),
            prefix: prefix.to_owned(),
            faults,
            pool: Arc::default(),
            leases: {
                let f = Family::default();
                // Both series exported from the start, at 0.
                for source in [LeaseSource::granted, LeaseSource::reused] {
                    let _ = f.get_or_create(&LeaseLabels { source });
                }
                f
            },
        }
    }

    /// The histograms of the release batches (exported by [`crate::metrics`]).
    pub fn batch_families(&self) -> &BatchFamilies {
        &self.batches
    }

    /// What the release batcher has done.
    pub fn release_batches(&self) -> ReleaseStats {
        self.releases.stats()
    }

    /// Where this replica's grant leases came from (exported by [`crate::metrics`]).
    pub fn lease_sources(&self) -> &Family<LeaseLabels, Counter> {
        &self.leases
    }

    fn count_lease(&self, source: LeaseSource) {
        self.leases.get_or_create(&LeaseLabels { source }).inc();
    }

    fn pool(&self) -> MutexGuard<'_, LeasePool> {
        // Never held across an await or a panic-prone section; a poisoned pool is still consistent.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease for the next grant of `session` with a `secs` lease: a pooled one kept alive once
    /// (etcd restores its TTL), or a new one.
    async fn lease_for(&self, session_id: Uuid, secs: i64) -> Result<GrantLease, Error> {
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
    async fn keep_pooled_alive(
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
    fn give_back(&self, session_id: Uuid, secs: i64, lease: i64, indexed: bool) {
        if secs > 0 {
            self.pool()
                .give_back(session_id, secs, lease, indexed, Instant::now());
        } else {
            self.revoke_lease_later(lease);
        }
    }

    pub fn client(&self) -> Client {
        (*self.client).clone()
    }

    /// The KV service alone, for the calls of every cycle: a clone of one channel where cloning
    /// the whole client clones eight and its options.
    fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn session_key(&self, session_id: Uuid) -> String {
        format!("{}s/{session_id}", self.prefix)
    }
    /// The etcd key of a lock key (public for tests that inspect etcd directly).
    pub fn lock_key(&self, key: &str) -> String {
        format!("{}l/{key}", self.prefix)
    }
    fn held_prefix(&self, session_id: Uuid) -> String {
        format!("{}h/{session_id}/", self.prefix)
    }
    /// The index entry of one of the session's grant leases, on that lease.
    fn index_key(&self, session_id: Uuid, lease: i64) -> String {
        format!("{}{lease:016x}", self.held_prefix(session_id))
    }
    fn revocation_key(&self, key: &str, token: i64) -> String {
        format!("{}r/{token:020}/{key}", self.prefix)
    }
    /// The prefix of `key`'s queue. A NUL ends the key (lock keys never hold control characters), so
    /// that the queue of `a` is not a prefix of the queue of `a/b`.
    pub fn queue_prefix(&self, key: &str) -> String {
        format!("{}q/{key}\u{0}", self.prefix)
    }

    fn token_of(&self, kv: &KeyValue) -> i64 {
        if self.faults.token_from_version {
            kv.version()
        } else {
            kv.mod_revision()
        }
    }

    /// Cleanup of a lease nobody needs any more. Failure only leaves it to lapse by its TTL.
    fn revoke_lease_later(&self, lease: i64) {
        let mut c = self.client();
        tokio::spawn(async move {
            let _ = c.lease_revoke(lease).await;
        });
    }

    /// One keep-alive: the remaining TTL etcd reports, `None` if the lease is gone (however
    /// etcd-client reports that: see [`keep_alive_outcome`]).
    ///
    /// `lease_keep_alive` sends the first keep-alive itself and reads its answer (a TTL of 0 comes
    /// back as an error), but does not return the TTL; the second keep-alive reads it.
    async fn keep_alive_once(&self, lease: i64) -> Result<Option<i64>, Error> {
        let (mut keeper, mut stream) = match self.client().lease_keep_alive(lease).await {
            Ok(pair) => pair,
            Err(e) => return keep_alive_outcome(Err(e)),
        };
        let answer = match keeper.keep_alive().await {
            Ok(()) => stream.message().await.map(|m| m.map(|r| r.ttl())),
            Err(e) => Err(e),
        };
        keep_alive_outcome(answer)
    }

    async fn get_one(&self, key: String) -> Result<Option<KeyValue>, Error> {
        let r = self.kv().get(key, None).await.map_err(Error::etcd)?;
        Ok(r.kvs().first().cloned())
    }

    pub async fn create_session(&self, owner_id: &str, ttl_secs: f64) -> Result<Session, Error> {
        let secs = lease_secs(ttl_secs);
        let before = Utc::now();
        let lease = self.client().lease_grant(secs, None).await.map_err(Error::etcd)?;
        let session_id = Uuid::new_v4();
        let value = encode(&SessionValue {
            owner_id: owner_id.to_owned(),
        });
        self.client()
            .put(
                self.session_key(session_id),
                value,
                Some(PutOptions::new().with_lease(lease.id())),
            )
            .await
            .map_err(Error::etcd)?;
        Ok(Session {
            session_id,
            owner_id: owner_id.to_owned(),
            expires_at: lease_end(before, lease.ttl()),
        })
    }

    /// `None`: the session's lease is gone (closed, or lapsed by etcd's clock).
    pub async fn heartbeat(&self, session_id: Uuid, _ttl_secs: f64) -> Result<Option<DateTime<Utc>>, Error> {
        let Some(kv) = self.get_one(self.session_key(session_id)).await? else {
            return Ok(None);
        };
        // A keep-alive restores the TTL the lease was granted with; etcd cannot change a lease's TTL.
        let before = Utc::now();
        Ok(self
            .keep_alive_once(kv.lease())
            .await?
            .map(|ttl| lease_end(before, ttl)))
    }

    /// `false`: no such session. Revoking the session's lease first makes every later acquire under
    /// it fail; then every grant it still holds goes with its own lease (the cascade).
    pub async fn close_session(&self, session_id: Uuid) -> Result<bool, Error> {
        let Some(kv) = self.get_one(self.session_key(session_id)).await? else {
            return Ok(false);
        };
        lookup_ok(self.client().lease_revoke(kv.lease()).await)?;
        self.revoke_grants_of(&[session_id]).await?;
        self.pool().forget(session_id);
        Ok(true)
    }

    async fn revoke_grants_of(&self, sessions: &[Uuid]) -> Result<(), Error> {
        for s in sessions {
            let held = self
                .client()
                .get(
                    self.held_prefix(*s),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
                .map_err(Error::etcd)?;
            let leases: BTreeSet<i64> = held.kvs().iter().map(|kv| kv.lease()).collect();
            for lease in leases {
                lookup_ok(self.client().lease_revoke(lease).await)?;
            }
        }
        Ok(())
    }

    /// C1 §1.3's acquire as one etcd transaction, on the grant's own lease ([`EtcdRepo::lease_for`]).
    /// `None`: held by a live, different holder (CONTENDED).
    pub async fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
    ) -> Result<Option<Grant>, Error> {
        let secs = lease_secs(ttl_secs);
        let mut lease = self.lease_for(session_id, secs).await?;
        let now_ms = Utc::now().timestamp_millis();
        let lkey = self.lock_key(key);
        let skey = self.session_key(session_id);
        let value = encode(&GrantValue {
            owner_id: owner_id.to_owned(),
            session_id,
            acquired_at_ms: now_ms,
            lease_secs: secs,
        });
        // One transaction: the session must be alive, and the key absent (never written, released,
        // or its lease lapsed — a key goes with its lease), or still the grant this very session
        // holds (re-entry, pinned to the mod_revision we saw, so it cannot overwrite a newer holder).
        let mut pinned: Option<(i64, i64, i64)> = None; // (mod_revision, lease, lease secs) of our own grant
        let mut lapsed_leases = 0;
        let mut attempts = 0;
        while attempts < 3 {
            let key_cmp = match pinned {
                None => Compare::create_revision(lkey.clone(), CompareOp::Equal, 0),
                Some((rev, _, _)) => Compare::mod_revision(lkey.clone(), CompareOp::Equal, rev),
            };
            // The index entry is written with the first grant a lease carries, and stays on it until
            // the lease goes, so close and the reaper find the lease, pooled or not; a reused lease
            // that carried a grant has it already (one put per cycle, as etcd's Mutex does). That is
            // not taken on trust: the transaction also compares that the entry is there on this very
            // lease (etcd restored from a snapshot older than the lease's first grant would not have
            // it), and writes it again, once, if not.
            let ikey = self.index_key(session_id, lease.id);
            let mut when = vec![
                Compare::create_revision(skey.clone(), CompareOp::Greater, 0),
                key_cmp,
            ];
            let mut or_else = vec![TxnOp::get(lkey.clone(), None), TxnOp::get(skey.clone(), None)];
            if lease.indexed && !self.faults.trust_pooled_index {
                when.push(Compare::lease(ikey.clone(), CompareOp::Equal, lease.id));
                or_else.push(TxnOp::get(ikey.clone(), None));
            }
            let mut write = vec![TxnOp::put(
                lkey.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease.id)),
            )];
            if !lease.indexed {
                write.push(TxnOp::put(
                    ikey.clone(),
                    "",
                    Some(PutOptions::new().with_lease(lease.id)),
                ));
            }
            write.push(TxnOp::get(lkey.clone(), None));
            let written = write.len() - 1;
            let txn = Txn::new().when(when).and_then(write).or_else(or_else);
            let resp = match self.kv().txn(txn).await {
                Ok(resp) => resp,
                // The pooled lease went between its keep-alive and the transaction (its session
                // was closed on another replica): nothing was written; a new lease, once.
                Err(e) if is_lease_not_found(&e) && lapsed_leases == 0 => {
                    lapsed_leases += 1;
                    lease = self.lease_for(session_id, secs).await?;
                    continue;
                }
                Err(e) => return Err(Error::etcd(e)),
            };
            attempts += 1;
            let ops = resp.op_responses();
            if resp.succeeded() {
                if let Some((_, old, old_secs)) = pinned.filter(|(_, old, _)| *old != lease.id) {
                    // Re-entry moved the grant to the new lease: the old one carries nothing now.
                    self.give_back(session_id, old_secs, old, true);
                }
                if self.faults.pool_leases_in_use {
                    self.give_back(session_id, secs, lease.id, true);
                }
                let kv =
                    first_get(&ops, written).ok_or_else(|| Error::Corrupt("acquire wrote nothing".into()))?;
                let held = ms_to_time(now_ms);
                return Ok(Some(Grant {
                    fencing_token: self.token_of(&kv),
                    owner_id: owner_id.to_owned(),
                    session_id,
                    acquired_at: held,
                    expires_at: lease.end,
                }));
            }
            if first_get(&ops, 1).is_none() {
                self.revoke_lease_later(lease.id);
                return Err(Error::SessionGone);
            }
            if lease.indexed
                && !self.faults.trust_pooled_index
                && first_get(&ops, 2).is_none_or(|kv| kv.lease() != lease.id)
            {
                // The lease lost its index entry: the same transaction again, writing it.
                lease.indexed = false;
                attempts -= 1;
                continue;
            }
            pinned = match first_get(&ops, 0) {
                // Released or lapsed since: the free-key branch again.
                None => None,
                Some(current) => {
                    let g: GrantValue = decode(&current)?;
                    if g.session_id != session_id || g.owner_id != owner_id {
                        self.give_back(session_id, secs, lease.id, lease.indexed);
                        return Ok(None);
                    }
                    Some((current.mod_revision(), current.lease(), g.lease_secs))
                }
            };
        }
        // The key kept changing hands under us: report it as held by someone else.
        self.give_back(session_id, secs, lease.id, lease.indexed);
        Ok(None)
    }

    /// C1 §1.4 renew. `None`: the grant at `token` is gone (released, revoked, lapsed, taken over).
    pub async fn renew(&self, key: &str, token: i64, _ttl_secs: f64) -> Result<Option<Renewed>, Error> {
        let lkey = self.lock_key(key);
        let Some(kv) = self.get_one(lkey.clone()).await? else {
            return Ok(None);
        };
        if !self.faults.renew_ignores_token && self.token_of(&kv) != token {
            return Ok(None);
        }
        let before = Utc::now();
        let Some(ttl) = self.keep_alive_once(kv.lease()).await? else {
            return Ok(None);
        };
        // The lease was alive when extended; the grant must still be the one at `token` *after*
        // that, or the lease we extended may already carry nothing of ours.
        if !self.faults.renew_ignores_token {
            let still = self
                .client()
                .txn(Txn::new().when([Compare::mod_revision(lkey, CompareOp::Equal, kv.mod_revision())]))
                .await
                .map_err(Error::etcd)?;
            if !still.succeeded() {
                return Ok(None);
            }
        }
        // The grant's own value names its holder (for the re-signed grant): the key was at `token`
        // when read and still is, so this is that grant's value.
        let holder: GrantValue = decode(&kv)?;
        Ok(Some(Renewed {
            fencing_token: token,
            expires_at: lease_end(before, ttl),
            owner_id: holder.owner_id,
            session_id: holder.session_id,
        }))
    }

    /// C1 §1.4 release: compare-and-delete on key + token (`mod_revision`). `false`: stale.
    /// Concurrent releases share one request ([`crate::etcd_batch`]).
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

    pub async fn read(&self, key: &str) -> Result<Option<LockRow>, Error> {
        let Some(kv) = self.get_one(self.lock_key(key)).await? else {
            return Ok(None);
        };
        let g: GrantValue = decode(&kv)?;
        let ttl = self
            .client()
            .lease_time_to_live(kv.lease(), None)
            .await
            .map_err(Error::etcd)?
            .ttl();
        // The key exists, so etcd has not revoked its lease: it is held. (TimeToLive truncates to
        // whole seconds, so 0 only means "under a second left", never "expired".)
        Ok(Some(LockRow {
            fencing_token: self.token_of(&kv),
            owner_id: g.owner_id,
            acquired_at: ms_to_time(g.acquired_at_ms),
            expires_at: Utc::now() + ChronoDuration::seconds(ttl.max(0)),
            expired: false,
        }))
    }

    /// Unpinned force-revoke: revokes whatever live grant holds the key. `None`: nothing held.
    pub async fn revoke(&self, key: &str, operator: &str, reason: &str) -> Result<Option<Revoked>, Error> {
        let Some(kv) = self.get_one(self.lock_key(key)).await? else {
            return Ok(None);
        };
        match self
            .revoke_pinned(key, kv.mod_revision(), operator, reason)
            .await?
        {
            Revocation::Revoked(r) => Ok(Some(r)),
            _ => Ok(None),
        }
    }

    /// Token-pinned force-revoke: one transaction deletes the grant only if its `mod_revision` is
    /// `token` and appends the audit record (which must not exist yet: append-only).
    pub async fn revoke_pinned(
        &self,
        key: &str,
        token: i64,
        operator: &str,
        reason: &str,
    ) -> Result<Revocation, Error> {
        let lkey = self.lock_key(key);
        let rkey = self.revocation_key(key, token);
        let current = self.get_one(lkey.clone()).await?;
        if let Some(kv) = current.as_ref().filter(|kv| kv.mod_revision() == token) {
            let g: GrantValue = decode(kv)?;
            let record = encode(&RevocationValue {
                lock_key: key.to_owned(),
                prev_owner: g.owner_id.clone(),
                prev_token: token,
                operator: operator.to_owned(),
                reason: reason.to_owned(),
            });
            let resp = self
                .client()
                .txn(
                    Txn::new()
                        .when([
                            Compare::mod_revision(lkey.clone(), CompareOp::Equal, token),
                            Compare::create_revision(rkey.clone(), CompareOp::Equal, 0),
                        ])
                        .and_then([
                            TxnOp::delete(lkey.clone(), None),
                            TxnOp::put(rkey.clone(), record, None),
                        ]),
                )
                .await
                .map_err(Error::etcd)?;
            if resp.succeeded() {
                self.revoke_lease_later(kv.lease());
                return Ok(Revocation::Revoked(Revoked {
                    owner_id: g.owner_id,
                    fencing_token: token,
                }));
            }
        }
        if let Some(r) = self.get_one(rkey).await? {
            let r: RevocationValue = decode(&r)?;
            return Ok(Revocation::AlreadyRevoked(Revoked {
                owner_id: r.prev_owner,
                fencing_token: r.prev_token,
            }));
        }
        Ok(match self.get_one(lkey).await? {
            Some(kv) if kv.mod_revision() != token => Revocation::HeldByOtherToken {
                current_token: kv.mod_revision(),
            },
            _ => Revocation::NotHeld,
        })
    }

    /// The reaper: grants indexed under a session whose lease is gone are revoked (the cascade that
    /// PostgreSQL's foreign key does). Returns how many dead sessions still held grants.
    pub async fn reap(&self) -> Result<u64, Error> {
        let keys_only = || Some(GetOptions::new().with_prefix().with_keys_only());
        let live: BTreeSet<String> = self
            .client()
            .get(format!("{}s/", self.prefix), keys_only())
            .await
            .map_err(Error::etcd)?
            .kvs()
            .iter()
            .filter_map(|kv| {
                kv.key_str()
                    .ok()
                    .and_then(|k| k.rsplit('/').next())
                    .map(str::to_owned)
            })
            .collect();
        let held_root = format!("{}h/", self.prefix);
        let held = self
            .client()
            .get(held_root.clone(), keys_only())
            .await
            .map_err(Error::etcd)?;
        let mut dead: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
        for kv in held.kvs() {
            let Some(rest) = kv.key_str().ok().and_then(|k| k.strip_prefix(held_root.as_str())) else {
                continue;
            };
            let session = rest.split('/').next().unwrap_or_default();
            if !live.contains(session) {
                dead.entry(session.to_owned()).or_default().insert(kv.lease());
            }
        }
        for (session, leases) in &dead {
            for lease in leases {
                lookup_ok(self.client().lease_revoke(*lease).await)?;
            }
            // What this replica pooled or kept open for the session goes with it.
            if let Ok(session) = session.parse::<Uuid>() {
                self.pool().forget(session);
            }
        }
        Ok(dead.len() as u64)
    }

    pub async fn ping(&self) -> Result<(), Error> {
        self.client().status().await.map_err(Error::etcd)?;
        Ok(())
    }

    /// One page of held keys after `after`, in key order, with their queue lengths.
    pub async fn list(&self, prefix: &str, after: &str, limit: i64) -> Result<Vec<ListedRow>, Error> {
        let from = if after.is_empty() {
            self.lock_key(prefix)
        } else {
            // The smallest key after `after`.
            format!("{}\u{0}", self.lock_key(after))
        };
        let end = prefix_end(self.lock_key(prefix).into_bytes());
        let page = self
            .client()
            .get(from, Some(GetOptions::new().with_range(end).with_limit(limit)))
            .await
            .map_err(Error::etcd)?;
        let root = self.lock_key("");
        let mut out = Vec::with_capacity(page.kvs().len());
        for kv in page.kvs() {
            let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(root.as_str())) else {
                continue;
            };
            let g: GrantValue = decode(kv)?;
            let ttl = self
                .client()
                .lease_time_to_live(kv.lease(), None)
                .await
                .map_err(Error::etcd)?
                .ttl();
            let waiters = self
                .client()
                .get(
                    self.queue_prefix(key),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await
                .map_err(Error::etcd)?
                .count();
            out.push(ListedRow {
                lock_key: key.to_owned(),
                fencing_token: self.token_of(kv),
                owner_id: g.owner_id,
                session_id: g.session_id,
                acquired_at: ms_to_time(g.acquired_at_ms),
                expires_at: Utc::now() + ChronoDuration::seconds(ttl.max(0)),
                expired: false,
                waiters,
            });
        }
        Ok(out)
    }

    /// The blocking acquire on etcd ([`crate::queue`]): a waiter key on the session's lease, in
    /// create-revision order; the head tries [`EtcdRepo::acquire`] and, contended, watches the grant
    /// key (its release, revocation, lapse or session end deletes it); every other waiter watches
    /// only its predecessor's key. `Some` granted, `None` the deadline passed.
    #[allow(clippy::too_many_arguments)]
    pub async fn wait_for(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
        deadline: Instant,
        faults: QueueFaults,
        cancel: &CancellationToken,
        metrics: &Metrics,
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
        metrics: &Metrics,
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
                        + i64::try_from(crate::queue::GRACE.as_millis()).unwrap_or(0);
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

    /// A watch of `key` from `rev` on ([`crate::watch`]).
    pub async fn watch_key(&self, key: &str, rev: i64) -> Result<(etcd_client::Watcher, WatchStream), Error> {
        self.client()
            .watch(
                self.lock_key(key),
                Some(WatchOptions::new().with_start_revision(rev).with_prev_key()),
            )
            .await
            .map_err(Error::etcd)
    }

    /// The key's grant as [`EtcdRepo::read`] sees it, and the revision of that read.
    pub async fn read_at(&self, key: &str) -> Result<(Option<LockRow>, i64), Error> {
        let r = self
            .client()
            .get(self.lock_key(key), None)
            .await
            .map_err(Error::etcd)?;
        let rev = r.header().map(|h| h.revision()).unwrap_or(0);
        let Some(kv) = r.kvs().first() else {
            return Ok((None, rev));
        };
        let g: GrantValue = decode(kv)?;
        Ok((
            Some(LockRow {
                fencing_token: self.token_of(kv),
                owner_id: g.owner_id,
                acquired_at: ms_to_time(g.acquired_at_ms),
                expires_at: Utc::now(),
                expired: false,
            }),
            rev,
        ))
    }

    /// A grant written at a watch's PUT: its token and owner.
    pub fn granted_by(&self, kv: &KeyValue) -> Result<(i64, String), Error> {
        let g: GrantValue = decode(kv)?;
        Ok((self.token_of(kv), g.owner_id))
    }

    /// Why the grant `prev` (as it was before a watch's DELETE at `rev`) went: revoked (its audit
    /// record exists), released (deleted while its lease lived: the index entry on the same lease was
    /// still there at `rev`), or with its lease: expired, or its session ended (the session key was
    /// gone at `rev`). A history etcd compacted away reads as released.
    pub async fn why_deleted(
        &self,
        key: &str,
        prev: &KeyValue,
        rev: i64,
    ) -> Result<crate::watch::Cause, Error> {
        use crate::watch::Cause;
        let token = self.token_of(prev);
        if self.get_one(self.revocation_key(key, token)).await?.is_some() {
            return Ok(Cause::Revoked);
        }
        let g: GrantValue = decode(prev)?;
        let at = |k: String| {
            let mut c = self.client();
            async move { c.get(k, Some(GetOptions::new().with_revision(rev))).await }
        };
        // The index entry lives on the grant's lease: there at `rev`, the lease still was.
        let index_key = if g.lease_secs > 0 {
            self.index_key(g.session_id, prev.lease())
        } else {
            // A grant written before pooling: its index entry was per key.
            format!("{}{key}", self.held_prefix(g.session_id))
        };
        let Ok(index) = at(index_key).await else {
            return Ok(Cause::Released);
        };
        if !index.kvs().is_empty() {
            return Ok(Cause::Released);
        }
        let Ok(session) = at(self.session_key(g.session_id)).await else {
            return Ok(Cause::Expired);
        };
        Ok(if session.kvs().is_empty() {
            Cause::SessionEnded
        } else {
            Cause::Expired
        })
    }
}

/// The end of the range of every key starting with `prefix` (etcd's `prefix_end`).
fn prefix_end(mut key: Vec<u8>) -> Vec<u8> {
    while let Some(last) = key.pop() {
        if last < 0xff {
            key.push(last + 1);
            return key;
        }
    }
    // Every byte was 0xff: to the end of the keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::{Error, keep_alive_outcome, lease_secs};

    fn keep_alive_error(message: &str) -> etcd_client::Error {
        etcd_client::Error::LeaseKeepAliveError(message.to_owned())
    }

    /// The shapes etcd-client 0.14 gives a keep-alive of a lease that is gone, each "gone" (`None`:
    /// renew answers 410 LEASE_EXPIRED, heartbeat SESSION_GONE), never an error (a 5xx).
    #[test]
    fn every_shape_of_a_gone_lease_is_gone_not_an_error() {
        // `lease_keep_alive` on etcd's TTL-0 answer (the lease lapsed or was revoked).
        assert!(matches!(
            keep_alive_outcome(Err(keep_alive_error("lease not found"))),
            Ok(None)
        ));
        // A TTL of 0 (or etcd's -1) read from the stream afterwards.
        assert!(matches!(keep_alive_outcome(Ok(Some(0))), Ok(None)));
        assert!(matches!(keep_alive_outcome(Ok(Some(-1))), Ok(None)));
        // Alive.
        assert!(matches!(keep_alive_outcome(Ok(Some(2))), Ok(Some(2))));
    }

    /// What says nothing about the lease stays a failure.
    #[test]
    fn a_broken_exchange_is_still_an_error() {
        for answer in [
            Ok(None),
            // The keeper's channel closed: the stream is gone.
            Err(keep_alive_error("channel closed")),
            Err(etcd_client::Error::WatchError(
                "failed to create lease keeper".to_owned(),
            )),
            Err(etcd_client::Error::InvalidArgs("x".to_owned())),
        ] {
            let shown = format!("{answer:?}");
            assert!(
                matches!(keep_alive_outcome(answer), Err(Error::Etcd(_))),
                "{shown}"
            );
        }
    }

    #[test]
    fn lease_ttl_rounds_up_to_whole_seconds() {
        assert_eq!(lease_secs(0.05), 1);
        assert_eq!(lease_secs(1.0), 1);
        assert_eq!(lease_secs(1.001), 2);
        assert_eq!(lease_secs(600.0), 600);
    }
}
