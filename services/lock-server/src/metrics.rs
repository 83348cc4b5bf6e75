//! lock-server's Prometheus metrics (docs/lock-api.md). Labels are small closed sets; lock keys,
//! owners and session ids go to logs, never to labels.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::backend::Backend;
use crate::batch::BatchFamilies;

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AcquireResult {
    granted,
    contended,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RevokeOutcome {
    revoked,
    already_revoked,
    held_by_other_token,
    not_held,
}

/// Why a queued waiter was woken to look again (`lock_wait_wakeups_total{reason}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum WakeReason {
    /// A release, revocation or session end freed the key (or, on etcd, a lapse): the head is woken.
    freed,
    /// The waiter ahead left: this one may be the head.
    head,
    /// The holder's lease was due to end (PostgreSQL: a lapse has no event).
    lease_end,
    /// The waiter ahead was due to lapse (its replica died).
    ahead_lapsed,
    /// Its own place went with its session.
    gone,
    /// The listener reconnected and notifications may have been missed.
    resync,
}

/// How a blocking acquire ended (`lock_wait_total{result}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum WaitResult {
    granted,
    contended,
    session_gone,
    cancelled,
    error,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeLabels {
    pub reason: WakeReason,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    pub result: WaitResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcquireLabels {
    pub result: AcquireResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReleaseLabels {
    pub stale: bool,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevokeLabels {
    pub outcome: RevokeOutcome,
}

/// `route` is the matched route template (`/v1/locks/{key}/renew`), never the raw path.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

type HistogramFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Contract `lock.session.lost`: renew or heartbeat found zero rows.
    pub session_lost: Counter,
    pub acquire: Family<AcquireLabels, Counter>,
    pub release: Family<ReleaseLabels, Counter>,
    pub revoke: Family<RevokeLabels, Counter>,
    pub reaper_sessions_deleted: Counter,
    pub http_duration: HistogramFamily,
    /// Blocking acquires asleep in a queue in this process now (waiting for a wake-up or a timer).
    pub waiting: Gauge,
    /// Watch streams open in this process now.
    pub watchers: Gauge,
    pub waits: Family<WaitLabels, Counter>,
    pub wakeups: Family<WakeLabels, Counter>,
}

fn http_histogram() -> Histogram {
    // 0.5 ms … ~16 s: lock calls are a round trip to lockdb.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The store's own metrics, exported as they are counted (the registry holds the same histograms
/// and counters the store updates):
///
/// - PostgreSQL, per batched statement (`statement="acquire"|"release"`):
///   `lock_batch_wait_seconds` (a call's wait in the queue until a batch takes it),
///   `lock_batch_statement_seconds` (per call, the round trip of the statement that carried it) and
///   `lock_batch_calls` (calls per statement) — where an acquire's time goes, next to
///   `http_request_duration_seconds` — and `lock_batch_paired_total` (statements that carried
///   both kinds at once, counted under both in `lock_batch_calls`);
/// - etcd: the same three histograms for `statement="release"`, whose concurrent calls share one
///   transaction ([`crate::etcd_batch`]), and `lock_etcd_grant_leases_total{source="granted"|"reused"}`
///   (a new lease from etcd, or a released grant's lease kept alive for the session's next grant).
fn register_store(registry: &mut Registry, store: &Backend) {
    match store {
        Backend::Postgres(repo) => {
            let b = repo.batch_families();
            register_batches(registry, b);
            registry.register(
                "lock_batch_paired",
                "Statements to lockdb that carried a batch of acquires and a batch of releases together (counted in lock_batch_calls under both)",
                b.paired.clone(),
            );
        }
        Backend::Etcd(repo) => {
            register_batches(registry, repo.batch_families());
            registry.register(
                "lock_etcd_grant_leases",
                "Grant leases by where they came from: granted (a new lease from etcd) or reused (a released grant's lease, kept alive for its session's next grant)",
                repo.lease_sources().clone(),
            );
        }
    }
}

/// The batches' histograms: lockdb's statements, or etcd's release transactions.
fn register_batches(registry: &mut Registry, b: &BatchFamilies) {
    registry.register(
        "lock_batch_wait_seconds",
        "A batched call's wait in the queue until a batch takes it, by statement",
        b.waited.clone(),
    );
    registry.register(
        "lock_batch_statement_seconds",
        "Per call: the round trip to the store of the statement (etcd: transaction) that carried it (a batch, or the call alone), by statement",
        b.statement.clone(),
    );
    registry.register(
        "lock_batch_calls",
        "Calls carried by one statement to lockdb (etcd: one transaction), by statement",
        b.calls.clone(),
    );
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_store(None)
    }

    /// Every metric of [`Metrics::new`], and those of the store behind the server: the batch
    /// timings on PostgreSQL, where the grant leases came from on etcd ([`register_store`]).
    pub fn with_store(store: Option<&Backend>) -> Self {
        let mut registry = Registry::default();
        let session_lost = Counter::default();
        registry.register(
            "lock_session_lost",
            "Renew or heartbeat found zero rows: the lease or session was lost (contract lock.session.lost)",
            session_lost.clone(),
        );
        let acquire = Family::<AcquireLabels, Counter>::default();
        registry.register("lock_acquire", "Acquire attempts by result", acquire.clone());
        let release = Family::<ReleaseLabels, Counter>::default();
        registry.register(
            "lock_release",
            "Releases; stale=true when the grant was no longer the caller's",
            release.clone(),
        );
        let revoke = Family::<RevokeLabels, Counter>::default();
        registry.register("lock_revoke", "Force-revokes by outcome", revoke.clone());
        let reaper_sessions_deleted = Counter::default();
        registry.register(
            "lock_reaper_sessions_deleted",
            "Expired sessions deleted by the reaper (their locks go by the cascade)",
            reaper_sessions_deleted.clone(),
        );
        let http_duration: HistogramFamily = Family::new_with_constructor(http_histogram);
        registry.register(
            "http_request_duration_seconds",
            "HTTP request duration by matched route",
            http_duration.clone(),
        );
        let waiting = Gauge::default();
        registry.register(
            "lock_waiting",
            "Blocking acquires asleep in a queue in this process (until a wake-up or a timer)",
            waiting.clone(),
        );
        let watchers = Gauge::default();
        registry.register(
            "lock_watchers",
            "Watch streams open in this process",
            watchers.clone(),
        );
        let waits = Family::<WaitLabels, Counter>::default();
        registry.register("lock_wait", "Blocking acquires by how they ended", waits.clone());
        let wakeups = Family::<WakeLabels, Counter>::default();
        registry.register(
            "lock_wait_wakeups",
            "Times a queued waiter was woken to look again, by reason (a release wakes one waiter)",
            wakeups.clone(),
        );
        for result in [
            WaitResult::granted,
            WaitResult::contended,
            WaitResult::session_gone,
            WaitResult::cancelled,
            WaitResult::error,
        ] {
            let _ = waits.get_or_create(&WaitLabels { result });
        }
        for reason in [
            WakeReason::freed,
            WakeReason::head,
            WakeReason::lease_end,
            WakeReason::ahead_lapsed,
            WakeReason::gone,
            WakeReason::resync,
        ] {
            let _ = wakeups.get_or_create(&WakeLabels { reason });
        }
        // Every label value is exported from the start (as 0), so rates and alerts need no special case.
        for result in [AcquireResult::granted, AcquireResult::contended] {
            let _ = acquire.get_or_create(&AcquireLabels { result });
        }
        for stale in [false, true] {
            let _ = release.get_or_create(&ReleaseLabels { stale });
        }
        for outcome in [
            RevokeOutcome::revoked,
            RevokeOutcome::already_revoked,
            RevokeOutcome::held_by_other_token,
            RevokeOutcome::not_held,
        ] {
            let _ = revoke.get_or_create(&RevokeLabels { outcome });
        }
        if let Some(store) = store {
            register_store(&mut registry, store);
        }
        Self {
            registry: Arc::new(registry),
            session_lost,
            acquire,
            release,
            revoke,
            reaper_sessions_deleted,
            http_duration,
            waiting,
            watchers,
            waits,
            wakeups,
        }
    }

    /// Counts a waiter as asleep while the guard lives.
    pub fn asleep(&self) -> Asleep<'_> {
        self.waiting.inc();
        Asleep(self)
    }

    pub fn woken(&self, reason: WakeReason) {
        self.wakeups.get_or_create(&WakeLabels { reason }).inc();
    }

    pub fn waited(&self, result: WaitResult) {
        self.waits.get_or_create(&WaitLabels { result }).inc();
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    pub fn acquired(&self, result: AcquireResult) {
        self.acquire.get_or_create(&AcquireLabels { result }).inc();
    }

    pub fn released(&self, stale: bool) {
        self.release.get_or_create(&ReleaseLabels { stale }).inc();
    }

    pub fn revoked(&self, outcome: RevokeOutcome) {
        self.revoke.get_or_create(&RevokeLabels { outcome }).inc();
    }

    pub fn observe_http(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.http_duration
            .get_or_create(&HttpLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status,
            })
            .observe(elapsed.as_secs_f64());
    }
}

/// A waiter asleep in a queue ([`Metrics::asleep`]).
#[derive(Debug)]
pub struct Asleep<'a>(&'a Metrics);

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        self.0.waiting.dec();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
