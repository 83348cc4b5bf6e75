//! Prometheus metrics. `lock_fenced_out{resource}` is the contract's `lock.fenced.out` (exported as
//! `lock_fenced_out_total`): a must-be-zero counter in a healthy run, so only real fence refusals
//! count — never a funds rejection. Resource ids go to logs, never to labels.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use dlock_common::fencing::FencedOutDetails;
use dlock_common::grant::GrantMetrics;
use dlock_common::metrics::{Resource, ResourceLabel};

/// How one posting call ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PostingOutcome {
    posted,
    idempotent,
    fenced_out,
    insufficient_funds,
    not_postable,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: PostingOutcome,
}

#[derive(Debug, Default)]
pub struct Metrics {
    fenced_out: Family<ResourceLabel, Counter>,
    postings: Family<OutcomeLabel, Counter>,
    funds_rejected: Counter,
    stuck: prometheus_client::metrics::gauge::Gauge,
    /// `grant_refused_total{code}` (dlock_common::grant).
    pub grants: GrantMetrics,
}

impl Metrics {
    /// The metrics and a registry that exports them.
    pub fn new() -> (Metrics, Registry) {
        let mut registry = Registry::default();
        let metrics = Metrics {
            grants: GrantMetrics::register(&mut registry),
            ..Metrics::default()
        };
        registry.register(
            "lock_fenced_out",
            "Writes refused because a newer fencing token had already written the resource",
            metrics.fenced_out.clone(),
        );
        registry.register(
            "payment_posting",
            "Posting calls ((a)(b)(c)) by outcome",
            metrics.postings.clone(),
        );
        registry.register(
            "payment_funds_rejected",
            "Payouts failed because the account could not cover them (at the reservation, before the rail)",
            metrics.funds_rejected.clone(),
        );
        registry.register(
            "payment_payouts_stuck",
            "Payouts not terminal after the stuck threshold, as of the last reconciliation run",
            metrics.stuck.clone(),
        );
        // Export every series from the start: a must-be-zero counter should read 0, not be absent.
        for resource in [Resource::account, Resource::ledger, Resource::payout] {
            let _ = metrics.fenced_out.get_or_create(&ResourceLabel { resource });
        }
        for outcome in [
            PostingOutcome::posted,
            PostingOutcome::idempotent,
            PostingOutcome::fenced_out,
            PostingOutcome::insufficient_funds,
            PostingOutcome::not_postable,
        ] {
            let _ = metrics.postings.get_or_create(&OutcomeLabel { outcome });
        }
        (metrics, registry)
    }

    pub fn fenced_out(&self, resource: Resource) {
        self.fenced_out.get_or_create(&ResourceLabel { resource }).inc();
    }

    pub fn fenced_out_count(&self, resource: Resource) -> u64 {
        self.fenced_out.get_or_create(&ResourceLabel { resource }).get()
    }

    pub fn funds_rejected(&self) {
        self.funds_rejected.inc();
    }

    pub fn funds_rejected_count(&self) -> u64 {
        self.funds_rejected.get()
    }

    /// Set by every reconciliation run.
    pub fn set_stuck(&self, n: u64) {
        self.stuck.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn posting(&self, outcome: PostingOutcome) {
        self.postings.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn posting_count(&self, outcome: PostingOutcome) -> u64 {
        self.postings.get_or_create(&OutcomeLabel { outcome }).get()
    }
}

/// Counts `lock_fenced_out{resource}` once and logs the contract event `fenced_out`.
pub(crate) fn report_fenced_out(metrics: &Metrics, resource: Resource, key: &str, d: &FencedOutDetails) {
    metrics.fenced_out(resource);
    tracing::warn!(
        event = "fenced_out",
        key,
        resource = %d.resource_type,
        resource_id = %d.resource_id,
        presented = d.presented,
        stored = d.highest,
        owner_id = %d.owner_id,
        "write refused: a newer fencing token has already written this resource"
    );
}
