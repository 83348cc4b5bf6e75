//! The operator's own metrics, on `/metrics`:
//! - `dlock_operator_reconciliations_total{kind}`
//! - `dlock_operator_reconcile_failures_total{kind,reason}`
//! - `dlock_operator_reconcile_duration_seconds{kind}` (histogram)
//! - `dlock_operator_fencing_sequence_behind{namespace,name}`: 1 while a LockService's
//!   `fencing_token_seq` is below the highest token its paydbs have seen (C1 §1.7), else 0;
//!   `dlock_operator_fencing_sequence{…}` and `dlock_operator_fencing_high_water{…}`: the two numbers.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub kind: &'static str,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub namespace: String,
    pub name: String,
}

type HistogramFamily = Family<KindLabel, Histogram, fn() -> Histogram>;

#[derive(Debug, Clone)]
pub struct Metrics {
    reconciliations: Family<KindLabel, Counter>,
    failures: Family<FailureLabels, Counter>,
    duration: HistogramFamily,
    behind: Family<ObjectLabels, Gauge>,
    sequence: Family<ObjectLabels, Gauge>,
    high_water: Family<ObjectLabels, Gauge>,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~20 s: a reconcile is a handful of API calls.
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            reconciliations: Family::default(),
            failures: Family::default(),
            duration: HistogramFamily::new_with_constructor(duration_histogram),
            behind: Family::default(),
            sequence: Family::default(),
            high_water: Family::default(),
        };
        registry.register(
            "dlock_operator_fencing_sequence_behind",
            "1 while the LockService's fencing sequence is below a token its resources have seen",
            m.behind.clone(),
        );
        registry.register(
            "dlock_operator_fencing_sequence",
            "Last checked value of the LockService's fencing_token_seq",
            m.sequence.clone(),
        );
        registry.register(
            "dlock_operator_fencing_high_water",
            "Highest token any paydb of the LockService's PaymentStacks has seen, when last checked",
            m.high_water.clone(),
        );
        registry.register(
            "dlock_operator_reconciliations",
            "Reconciliations run, by kind",
            m.reconciliations.clone(),
        );
        registry.register(
            "dlock_operator_reconcile_failures",
            "Reconciliations that failed, by kind and reason",
            m.failures.clone(),
        );
        registry.register(
            "dlock_operator_reconcile_duration_seconds",
            "Duration of one reconciliation, by kind",
            m.duration.clone(),
        );
        m
    }

    /// Counts a reconciliation and times it until [`ReconcileTimer`] drops.
    pub fn reconcile_started(&self, kind: &'static str) -> ReconcileTimer {
        self.reconciliations.get_or_create(&KindLabel { kind }).inc();
        ReconcileTimer {
            start: Instant::now(),
            histogram: self.duration.get_or_create(&KindLabel { kind }).clone(),
        }
    }

    /// Exports the last fencing check of one LockService.
    pub fn fencing_observed(
        &self,
        namespace: &str,
        name: &str,
        f: Option<&crate::crd::actions::FencingStatus>,
    ) {
        let Some(f) = f else { return };
        let labels = ObjectLabels {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.behind.get_or_create(&labels).set(i64::from(f.is_behind()));
        self.sequence.get_or_create(&labels).set(f.sequence);
        self.high_water.get_or_create(&labels).set(f.high_water);
    }

    pub fn reconcile_failed(&self, kind: &'static str, reason: &'static str) {
        self.failures.get_or_create(&FailureLabels { kind, reason }).inc();
    }
}

pub struct ReconcileTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}
