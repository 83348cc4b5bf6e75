//! rail-proxy's counters, in Prometheus form of the contract names:
//! `rail.duplicate.attempted` → `rail_duplicate_attempted_total`,
//! `lock.fenced.out{resource=rail}` → `lock_fenced_out_total{resource="rail"}`. Both must stay at
//! zero in a healthy run. Ids go to logs, never to labels.

use dlock_common::metrics::{Resource, ResourceLabel};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The `outcome` label of `rail_proxy_submissions_total`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SubmissionOutcome {
    acked,
    rejected,
    timeout,
    fenced,
    duplicate_attempt,
    /// Refused because the payout did not hold its funds reservation.
    not_reserved,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: SubmissionOutcome,
}

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub duplicate_attempted: Counter,
    pub fenced_out: Family<ResourceLabel, Counter>,
    pub submissions: Family<OutcomeLabel, Counter>,
    /// Attempts given up: the rail, asked after the deadline, had never received them.
    pub abandoned: Counter,
    pub http: dlock_common::metrics::HttpMetrics,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            http: dlock_common::metrics::HttpMetrics::register(registry),
            ..Self::default()
        };
        // Created up front so that the must-be-zero series is visible at zero, not absent.
        let _ = m.fenced_out.get_or_create(&ResourceLabel {
            resource: Resource::rail,
        });
        registry.register(
            "rail_duplicate_attempted",
            "Submissions refused by the rail high-water mark (d): a stale token tried to reach the rail",
            m.duplicate_attempted.clone(),
        );
        registry.register(
            "lock_fenced_out",
            "Writes refused because a higher fencing token had already been seen, by resource",
            m.fenced_out.clone(),
        );
        registry.register(
            "rail_proxy_submissions",
            "Submission requests by what became of them",
            m.submissions.clone(),
        );
        registry.register(
            "rail_proxy_attempts_abandoned",
            "Attempts abandoned because the rail, asked after the deadline, had never received them",
            m.abandoned.clone(),
        );
        m
    }

    pub fn abandoned(&self) {
        self.abandoned.inc();
    }

    pub fn fenced(&self) {
        self.duplicate_attempted.inc();
        self.fenced_out
            .get_or_create(&ResourceLabel {
                resource: Resource::rail,
            })
            .inc();
        self.submission(SubmissionOutcome::fenced);
    }

    pub fn submission(&self, outcome: SubmissionOutcome) {
        self.submissions.get_or_create(&OutcomeLabel { outcome }).inc();
    }
}
