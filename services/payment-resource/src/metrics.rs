//! Prometheus metrics. `lock_fenced_out{resource}` is the contract's `lock.fenced.out` (exported as
//! `lock_fenced_out_total`): a must-be-zero counter in a healthy run, so only real fence refusals
//! count — never a funds rejection. Resource ids go to logs, never to labels.
//!
//! What the periodic checks ([`crate::monitor`]) find, for alerts on what must stay zero:
//! - `payment_reconciliation_breaks{kind}`: breaks of each kind in the last completed reconciliation
//!   (every kind exported, 0 when none);
//! - `payment_reconciliation_runs_total{result="clean"|"breaks"|"failed"}`;
//! - `payment_reconciliation_last_success_timestamp_seconds`: when the last run completed (the
//!   service's start until one has);
//! - `payment_payouts_open{state}` and `payment_payouts_open_oldest_age_seconds{state}`: payouts not
//!   terminal yet, per state, and for how long the oldest has been unchanged.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use dlock_common::fencing::FencedOutDetails;
use dlock_common::grant::GrantMetrics;
use dlock_common::metrics::{Resource, ResourceLabel};

use crate::model::PayoutState;
use crate::reconcile::Report;
use crate::repo::payout::OpenStats;

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

/// How one periodic reconciliation ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RunResult {
    clean,
    breaks,
    failed,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabel {
    pub result: RunResult,
}

/// A break kind (`BALANCE_MISMATCH`, …): a closed set, [`crate::reconcile::break_kinds`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// A payout state that is not terminal.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Debug, Default)]
pub struct Metrics {
    fenced_out: Family<ResourceLabel, Counter>,
    postings: Family<OutcomeLabel, Counter>,
    funds_rejected: Counter,
    stuck: Gauge,
    /// `grant_refused_total{code}` (dlock_common::grant).
    pub grants: GrantMetrics,
    /// `http_request_duration_seconds` by route (dlock_common::metrics).
    pub http: dlock_common::metrics::HttpMetrics,
    breaks: Family<KindLabel, Gauge>,
    runs: Family<RunLabel, Counter>,
    last_success: Gauge,
    open: Family<StateLabel, Gauge>,
    open_oldest_age: Family<StateLabel, Gauge>,
}

impl Metrics {
    /// The metrics and a registry that exports them.
    pub fn new() -> (Metrics, Registry) {
        let mut registry = Registry::default();
        let metrics = Metrics {
            grants: GrantMetrics::register(&mut registry),
            http: dlock_common::metrics::HttpMetrics::register(&mut registry),
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
        registry.register(
            "payment_reconciliation_breaks",
            "Breaks of each kind found by the last completed periodic reconciliation (must stay 0)",
            metrics.breaks.clone(),
        );
        registry.register(
            "payment_reconciliation_runs",
            "Periodic reconciliation runs by result",
            metrics.runs.clone(),
        );
        registry.register(
            "payment_reconciliation_last_success_timestamp_seconds",
            "Unix time the last periodic reconciliation completed (the service's start until one has)",
            metrics.last_success.clone(),
        );
        registry.register(
            "payment_payouts_open",
            "Payouts not terminal yet, by state, as of the last count",
            metrics.open.clone(),
        );
        registry.register(
            "payment_payouts_open_oldest_age_seconds",
            "Seconds the oldest payout of each state that is not terminal has been unchanged (0: none)",
            metrics.open_oldest_age.clone(),
        );
        metrics.last_success.set(unix_now());
        for result in [RunResult::clean, RunResult::breaks, RunResult::failed] {
            let _ = metrics.runs.get_or_create(&RunLabel { result });
        }
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
        self.stuck.set(saturating(n));
    }

    /// One completed periodic reconciliation: every kind's count (0 for the kinds it did not find),
    /// the stuck gauge, the run's result and its time.
    pub fn reconciled(&self, report: &Report) {
        for kind in crate::reconcile::break_kinds() {
            self.breaks
                .get_or_create(&KindLabel { kind })
                .set(saturating(report.break_count(kind)));
        }
        self.set_stuck(report.break_count(crate::reconcile::STUCK));
        let result = if report.clean {
            RunResult::clean
        } else {
            RunResult::breaks
        };
        self.runs.get_or_create(&RunLabel { result }).inc();
        self.last_success.set(unix_now());
    }

    /// A periodic reconciliation that could not run (paydb unreachable, a statement failed). The
    /// last counts stay as they were: they are what is known.
    pub fn reconcile_failed(&self) {
        self.runs
            .get_or_create(&RunLabel {
                result: RunResult::failed,
            })
            .inc();
    }

    /// The open payouts of every state that is not terminal (0 for the states without any).
    pub fn payouts_open(&self, stats: &[OpenStats]) {
        for state in PayoutState::ALL.into_iter().filter(|s| !s.is_terminal()) {
            let found = stats.iter().find(|s| s.state == state);
            let label = StateLabel {
                state: state.as_str(),
            };
            self.open
                .get_or_create(&label)
                .set(found.map_or(0, |s| s.payouts));
            self.open_oldest_age
                .get_or_create(&label)
                .set(found.map_or(0, |s| s.oldest_age_seconds));
        }
    }

    pub fn posting(&self, outcome: PostingOutcome) {
        self.postings.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn posting_count(&self, outcome: PostingOutcome) -> u64 {
        self.postings.get_or_create(&OutcomeLabel { outcome }).get()
    }
}

fn saturating(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
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
