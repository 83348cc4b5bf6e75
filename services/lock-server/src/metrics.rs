//! lock-server's Prometheus metrics (docs/lock-api.md). Labels are small closed sets; lock keys,
//! owners and session ids go to logs, never to labels.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::store::{Backend, WaitMetrics, WakeLabels, WakeReason};

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

/// How a blocking acquire ended (`lock_wait_total{result}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum WaitResult {
    /// Granted at once: nobody was queued and the key was free (the queue was not joined).
    free,
    /// Granted in the queue, after waiting.
    granted,
    contended,
    session_gone,
    cancelled,
    error,
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

/// Why a lock client's request was refused (`lock_client_refusals_total{reason}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RefusalReason {
    /// No token, or one no client has (401).
    unauthenticated,
    /// The client lacks the route's operation (403).
    operation,
    /// The key, or the listing's prefix, lies outside the client's key prefixes (403).
    key,
    /// The ownerId lies outside the client's owner prefixes (403).
    owner,
    /// The session, or the grant, belongs to another client (403).
    session,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 5] = [
        RefusalReason::unauthenticated,
        RefusalReason::operation,
        RefusalReason::key,
        RefusalReason::owner,
        RefusalReason::session,
    ];
}

/// `client` is a configured client's name or `unknown`: a closed set fixed at start-up.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub client: String,
    pub reason: RefusalReason,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Contract `lock.session.lost`: renew or heartbeat found zero rows.
    pub session_lost: Counter,
    pub acquire: Family<AcquireLabels, Counter>,
    pub release: Family<ReleaseLabels, Counter>,
    pub revoke: Family<RevokeLabels, Counter>,
    pub reaper_sessions_deleted: Counter,
    pub http: dlock_common::metrics::HttpMetrics,
    /// Watch streams open in this process now.
    pub watchers: Gauge,
    pub waits: Family<WaitLabels, Counter>,
    /// What the queues count while they wait (`lock_waiting`, `lock_wait_wakeups_total`).
    pub wait: WaitMetrics,
    /// Requests refused to lock clients, by client and reason (only with a clients file).
    pub client_refusals: Family<RefusalLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_store(None)
    }

    /// Every metric of [`Metrics::new`], and those of the store behind the server: the batch
    /// timings on PostgreSQL, where the grant leases came from on etcd ([`Backend::register_metrics`]).
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
        let http = dlock_common::metrics::HttpMetrics::register(&mut registry);
        let wait = WaitMetrics::default();
        registry.register(
            "lock_waiting",
            "Blocking acquires asleep in a queue in this process (until a wake-up or a timer)",
            wait.waiting.clone(),
        );
        let watchers = Gauge::default();
        registry.register(
            "lock_watchers",
            "Watch streams open in this process",
            watchers.clone(),
        );
        let waits = Family::<WaitLabels, Counter>::default();
        registry.register("lock_wait", "Blocking acquires by how they ended", waits.clone());
        registry.register(
            "lock_wait_wakeups",
            "Times a queued waiter was woken to look again, by reason (a release wakes one waiter)",
            wait.wakeups.clone(),
        );
        for result in [
            WaitResult::free,
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
            let _ = wait.wakeups.get_or_create(&WakeLabels { reason });
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
        let client_refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "lock_client_refusals",
            "Lock API requests refused to clients (with a clients file), by client (or unknown) and reason",
            client_refusals.clone(),
        );
        if let Some(store) = store {
            store.register_metrics(&mut registry);
        }
        Self {
            registry: Arc::new(registry),
            session_lost,
            acquire,
            release,
            revoke,
            reaper_sessions_deleted,
            http,
            watchers,
            waits,
            wait,
            client_refusals,
        }
    }

    /// Exports every (client, reason) of the configured clients as 0 from the start, as the other
    /// families are, so that rates and alerts need no special case.
    pub fn declare_clients<'a>(&self, names: impl Iterator<Item = &'a str>) {
        // A request without a known token can only be refused as unauthenticated, and a client's
        // never is.
        let pairs = names
            .flat_map(|c| RefusalReason::ALL[1..].iter().map(move |r| (c.to_owned(), *r)))
            .chain([(
                crate::clients::UNKNOWN_CLIENT.to_owned(),
                RefusalReason::unauthenticated,
            )]);
        for (client, reason) in pairs {
            let _ = self
                .client_refusals
                .get_or_create(&RefusalLabels { client, reason });
        }
    }

    pub fn client_refused(&self, client: &str, reason: RefusalReason) {
        self.client_refusals
            .get_or_create(&RefusalLabels {
                client: client.to_owned(),
                reason,
            })
            .inc();
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
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
