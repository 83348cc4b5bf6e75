//! The etcd backend: the same operations as lockdb's [`Repo`](crate::store::postgres::Repo), on the
//! etcd v3 API.
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

pub mod batch;
pub mod feed;
pub mod leases;
pub mod repo;
pub mod tls;
pub mod wait;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use etcd_client::{Client, ConnectOptions, KeyValue, KvClient, TxnOpResponse};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use self::batch::{ReleaseStats, Releases};
use self::leases::{LeaseLabels, LeasePool, LeaseSource};
use super::BatchFamilies;
use crate::config::EtcdTlsFiles;
use crate::error::Error;

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
    /// Concurrent releases, sent as one transaction ([`super::batch`]).
    releases: Arc<Releases>,
    /// What the release batches observe (`lock_batch_*{statement="release"}`).
    batches: BatchFamilies,
    /// Where etcd is and how it is reached, for messages ([`EtcdRepo::connection_problem`]).
    target: Arc<Target>,
}

/// The endpoints and TLS files a repository was connected with.
#[derive(Debug, Default)]
struct Target {
    endpoints: Vec<String>,
    tls: Option<EtcdTlsFiles>,
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
        Self::connect_tls(endpoints, prefix, None).await
    }

    /// [`EtcdRepo::connect`], over TLS with `tls` (the endpoints are then `https://`). Also starts a
    /// task that asks etcd until it answers once, saying why it does not in an operator's words
    /// (`etcd_connect_failed`: ERROR for a TLS refusal, a configuration to fix; WARN otherwise),
    /// since the calls' own errors carry only the TLS library's words, and `/readyz` none.
    pub async fn connect_tls(
        endpoints: &[String],
        prefix: &str,
        tls: Option<&EtcdTlsFiles>,
    ) -> Result<Self, Error> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(2))
            .with_timeout(std::time::Duration::from_secs(5))
            .with_keep_alive(
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(2),
            );
        if let Some(files) = tls {
            opts = opts.with_tls(self::tls::options(files).map_err(|e| Error::etcd(e.into()))?);
        }
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(Error::etcd)?;
        let mut repo = Self::with_client(client, prefix, EtcdFaults::NONE);
        repo.target = Arc::new(Target {
            endpoints: endpoints.to_vec(),
            tls: tls.cloned(),
        });
        tokio::spawn(repo.clone().explain_until_connected());
        Ok(repo)
    }

    /// Asks etcd once (its status): `None` when it answers, else why not, in an operator's words.
    pub async fn connection_problem(&self) -> Option<self::tls::Explained> {
        match self.client().status().await {
            Ok(_) => None,
            Err(e) => Some(self::tls::explain(
                &e,
                &self.target.endpoints,
                self.target.tls.as_ref(),
            )),
        }
    }

    /// Asks etcd until it answers, each change of reason logged once, with backoff from 1 s to
    /// 30 s; `etcd_connected` at the first answer, then the calls' own errors take over.
    async fn explain_until_connected(self) {
        let mut backoff = std::time::Duration::from_secs(1);
        let mut said: Option<String> = None;
        loop {
            match self.connection_problem().await {
                None => {
                    tracing::info!(
                        event = "etcd_connected",
                        endpoints = %self.target.endpoints.join(","),
                        tls = self.target.tls.is_some(),
                        "lock-server reached etcd"
                    );
                    return;
                }
                Some(problem) => {
                    if said.as_deref() != Some(problem.message.as_str()) {
                        let endpoints = self.target.endpoints.join(",");
                        if problem.tls {
                            tracing::error!(event = "etcd_connect_failed", endpoints = %endpoints, "{}", problem.message);
                        } else {
                            tracing::warn!(event = "etcd_connect_failed", endpoints = %endpoints, "{}", problem.message);
                        }
                        said = Some(problem.message);
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
        }
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
            target: Arc::default(),
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

    /// The histograms of the release batches (exported by [`EtcdRepo::register_metrics`]).
    pub fn batch_families(&self) -> &BatchFamilies {
        &self.batches
    }

    /// What the release batcher has done.
    pub fn release_batches(&self) -> ReleaseStats {
        self.releases.stats()
    }

    /// Where this replica's grant leases came from (exported by [`EtcdRepo::register_metrics`]).
    pub fn lease_sources(&self) -> &Family<LeaseLabels, Counter> {
        &self.leases
    }

    /// The release batches' timings and where the grant leases came from
    /// ([`crate::store::Backend::register_metrics`]).
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.batch_families().register(registry);
        registry.register(
            "lock_etcd_grant_leases",
            "Grant leases by where they came from: granted (a new lease from etcd) or reused (a released grant's lease, kept alive for its session's next grant)",
            self.lease_sources().clone(),
        );
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
