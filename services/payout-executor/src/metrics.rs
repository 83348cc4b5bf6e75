//! The executor's metrics, in Prometheus form:
//!
//! - `payouts_processed_total{outcome}`: one per payout attempt, by how it ended;
//! - `lock_fenced_out_observed_total{resource}`: 409 `FENCED_OUT` answers this executor received, by
//!   the resource that refused (must stay zero in a healthy run, like the resources' own counters);
//! - `lock_acquire_duration_seconds{result}`: lock acquisition, granted or given up as contended;
//! - `payout_duration_seconds`: end to end, from picking a payout to its POSTED/FAILED answer;
//! - `payouts_backing_off` (gauge): payouts whose last attempt ended in an unexpected error and that
//!   wait out a retry backoff (`crate::worker::RetryPolicy`);
//! - `payouts_over_error_budget` (gauge): of the payouts tracked, those past
//!   `--max-errors-per-payout` consecutive errors — still retried at the capped backoff by a
//!   long-running executor, given up by a batch run (which then exits non-zero naming them). Must be
//!   zero in a healthy run.
//!
//! The two latencies are kept apart on purpose (C1 §1.1: lock latency and payout latency must be
//! separable). Ids go to logs, never to labels.

use std::time::Duration;

use dlock_common::metrics::{Resource, ResourceLabel};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How one payout attempt ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// This attempt posted it.
    posted,
    /// The rail rejected it, or the account could not cover it.
    failed,
    /// A resource refused our token (terminal for this attempt; never retried with a fresh token).
    fenced_out,
    /// The lease was lost before or during a step; the attempt was abandoned.
    lock_lost,
    /// Another live holder had the account; skipped for now.
    contended,
    /// Nothing to do: already terminal when we got to it (another holder finished it).
    skipped,
    /// The rail cannot tell yet what became of an ambiguous submission; tried again later.
    unresolved,
    /// Anything unexpected (transport errors, protocol surprises); tried again later.
    error,
    /// Shutdown interrupted it.
    interrupted,
    /// The rail never received it and rail-proxy's deadline passed: this attempt ended it ABANDONED.
    abandoned,
}

impl Outcome {
    pub const ALL: [Outcome; 10] = [
        Outcome::posted,
        Outcome::failed,
        Outcome::fenced_out,
        Outcome::lock_lost,
        Outcome::contended,
        Outcome::skipped,
        Outcome::unresolved,
        Outcome::error,
        Outcome::interrupted,
        Outcome::abandoned,
    ];
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AcquireResult {
    granted,
    contended,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcquireLabel {
    pub result: AcquireResult,
}

fn latency_histogram() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

#[derive(Debug, Clone)]
pub struct Metrics {
    processed: Family<OutcomeLabel, Counter>,
    fenced_out: Family<ResourceLabel, Counter>,
    acquire: Family<AcquireLabel, Histogram, fn() -> Histogram>,
    payout: Histogram,
    backoff: BackoffGauges,
}

/// The two retry gauges; [`crate::worker::Tracked`] sets them whenever what it tracks changes.
#[derive(Debug, Clone, Default)]
pub struct BackoffGauges {
    pub backing_off: Gauge,
    pub over_budget: Gauge,
}

impl Metrics {
    pub fn new() -> (Self, Registry) {
        let mut registry = Registry::default();
        let m = Self {
            processed: Family::default(),
            fenced_out: Family::default(),
            acquire: Family::new_with_constructor(latency_histogram),
            payout: latency_histogram(),
            backoff: BackoffGauges::default(),
        };
        // The must-be-zero series exist at zero from the start, rather than appearing on first use.
        for resource in [
            Resource::account,
            Resource::ledger,
            Resource::payout,
            Resource::rail,
        ] {
            let _ = m.fenced_out.get_or_create(&ResourceLabel { resource });
        }
        // Every outcome from the start too: an alert on the increase of `abandoned` must see its
        // first one, which it would not if the series appeared with it.
        for outcome in Outcome::ALL {
            let _ = m.processed.get_or_create(&OutcomeLabel { outcome });
        }
        registry.register(
            "payouts_processed",
            "Payout attempts by how they ended",
            m.processed.clone(),
        );
        registry.register(
            "lock_fenced_out_observed",
            "FENCED_OUT refusals this executor received, by the resource that refused",
            m.fenced_out.clone(),
        );
        registry.register(
            "lock_acquire_duration_seconds",
            "Time to acquire an account lock (granted) or to give up on it (contended)",
            m.acquire.clone(),
        );
        registry.register(
            "payout_duration_seconds",
            "Payout end to end: from picking it to its POSTED or FAILED answer",
            m.payout.clone(),
        );
        registry.register(
            "payouts_backing_off",
            "Payouts whose last attempt ended in an unexpected error, waiting out a retry backoff",
            m.backoff.backing_off.clone(),
        );
        registry.register(
            "payouts_over_error_budget",
            "Payouts past --max-errors-per-payout consecutive errors (retried at the capped backoff; \
             given up only by a batch run, which then exits non-zero)",
            m.backoff.over_budget.clone(),
        );
        (m, registry)
    }

    /// The retry gauges, for the tracker that sets them.
    pub fn backoff(&self) -> BackoffGauges {
        self.backoff.clone()
    }

    pub fn processed(&self, outcome: Outcome) {
        self.processed.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn processed_count(&self, outcome: Outcome) -> u64 {
        self.processed.get_or_create(&OutcomeLabel { outcome }).get()
    }

    pub fn fenced_out(&self, resource: Resource) {
        self.fenced_out.get_or_create(&ResourceLabel { resource }).inc();
    }

    pub fn acquire(&self, result: AcquireResult, took: Duration) {
        self.acquire
            .get_or_create(&AcquireLabel { result })
            .observe(took.as_secs_f64());
    }

    pub fn payout_done(&self, took: Duration) {
        self.payout.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_prometheus_form() {
        let (m, registry) = Metrics::new();
        m.processed(Outcome::posted);
        m.fenced_out(Resource::rail);
        m.acquire(AcquireResult::granted, Duration::from_millis(3));
        m.payout_done(Duration::from_millis(40));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("payouts_processed_total{outcome=\"posted\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lock_fenced_out_observed_total{resource=\"rail\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lock_fenced_out_observed_total{resource=\"account\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("lock_acquire_duration_seconds_count{result=\"granted\"} 1"),
            "{text}"
        );
        assert!(text.contains("payout_duration_seconds_count 1"), "{text}");
        assert!(
            text.contains("payouts_processed_total{outcome=\"abandoned\"} 0"),
            "every outcome from the start: {text}"
        );
        assert!(text.contains("\npayouts_backing_off 0\n"), "{text}");
        m.backoff().over_budget.set(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE payouts_backing_off gauge"), "{text}");
        assert!(text.contains("\npayouts_over_error_budget 2\n"), "{text}");
        assert_eq!(m.processed_count(Outcome::posted), 1);
    }
}
