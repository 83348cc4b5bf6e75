//! The periodic fencing check: a `dlock-fastforward read` Job every interval compares
//! `fencing_token_seq` with the highest token any paydb has seen, so a rewound sequence is found
//! without being asked (`status.fencing`, `Degraded/FencingSequenceBehind`), and at once when
//! lock-server reports a jump on a new lockdb history ([`super::sequence`]).

use std::str::FromStr;

use super::jobs::{self, CHECK_COMPONENT, ReadReport, Reported, RestoreJobs};
use super::{ActionInputs, ActionPlan};
use crate::builders::short_hash;
use crate::crd::actions::{FencingStatus, StackHighWater};
use crate::reasons::Reason;

/// A read Job every interval (named by the interval's bucket, so a re-run after a crash finds the
/// same one), its report recorded in `status.fencing`. Not while a restore runs: the restore reads
/// the same numbers and records them itself.
pub(super) fn plan(inputs: &ActionInputs, jobs: &RestoreJobs<'_>, out: &mut ActionPlan) {
    let Some(interval) = inputs.check_interval_secs.filter(|i| *i > 0) else {
        return;
    };
    let restoring = out.gate.is_some() || !out.jobs.is_empty() || !out.keep_jobs.is_empty();
    match &inputs.check_job {
        Some((name, run)) => match jobs::reported::<ReadReport>(run, "read") {
            Reported::Succeeded(r) => {
                let Some(sequence) = r.sequence else {
                    return;
                };
                let next = comparison(sequence, &r.stacks, &inputs.now, Some(name.clone()));
                out.record_fencing(next);
            }
            // Ended without a usable report: keep the last result; the next bucket tries again.
            Reported::Unreadable | Reported::Failed(_) => {}
            // Running: left as it is (a Job's template is immutable).
            Reported::Running | Reported::Absent => out.keep_check = Some(name.clone()),
        },
        None => {
            let ready = !restoring
                && inputs.schema_ready
                && inputs.stacks.iter().all(|st| st.migrated && st.connection_ready)
                && !inputs.stacks.is_empty();
            // A jump on a new lockdb history asked for a check (`status.sequence.fencingCheck`):
            // now, whatever the interval, under the name it recorded.
            if let Some(name) = out.sequence.as_ref().and_then(|s| s.fencing_check.clone()) {
                if ready {
                    out.check_job = Some(jobs::read_job(jobs, name, CHECK_COMPONENT, &inputs.stacks));
                }
                return;
            }
            let last = out
                .fencing
                .as_ref()
                .and_then(|f| k8s_openapi::jiff::Timestamp::from_str(&f.checked_at).ok())
                .map(|t| t.as_second());
            let due = last.is_none_or(|t| inputs.now_secs - t >= interval);
            if due && ready {
                let bucket = inputs.now_secs / interval;
                let name = jobs.owner.child(&format!(
                    "fencing-check-{}",
                    short_hash(bucket.to_string().as_bytes())
                ));
                out.check_job = Some(jobs::read_job(jobs, name, CHECK_COMPONENT, &inputs.stacks));
            }
        }
    }
}

/// The sequence compared with the highest of the stacks' high-water marks.
pub(super) fn comparison(
    sequence: i64,
    stacks: &[StackHighWater],
    now: &str,
    job_name: Option<String>,
) -> FencingStatus {
    let top = stacks.iter().max_by_key(|s| s.highest);
    FencingStatus {
        sequence,
        high_water: top.map_or(0, |s| s.highest),
        high_water_stack: top.map(|s| s.name.clone()),
        checked_at: now.to_owned(),
        job_name,
    }
}

impl ActionPlan {
    /// A new comparison of the sequence with the high-water, whoever made it (the periodic check or
    /// a restore): an Event when it crosses over in either direction.
    pub(super) fn record_fencing(&mut self, next: FencingStatus) {
        let was_behind = self.fencing.as_ref().is_some_and(FencingStatus::is_behind);
        if next.is_behind() && !was_behind {
            self.event(Reason::FencingSequenceBehind, behind_message(&next));
        } else if !next.is_behind() && was_behind {
            self.event(
                Reason::FencingSequenceCaughtUp,
                format!(
                    "fencing_token_seq ({}) is again at or above the high-water ({})",
                    next.sequence, next.high_water
                ),
            );
        }
        self.fencing = Some(next);
    }
}

/// The Degraded message of a sequence found behind: both numbers, and what to do.
pub fn behind_message(f: &FencingStatus) -> String {
    format!(
        "fencing_token_seq is at {}, below the highest token a resource has seen ({}{}): every new grant is fenced out. Run a restore fast-forward (docs/operations.md)",
        f.sequence,
        f.high_water,
        f.high_water_stack
            .as_deref()
            .map(|s| format!(", PaymentStack {s}"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::super::jobs::JobRun;
    use super::super::testing::{restore_inputs, run};
    use super::*;

    fn checked(job: JobRun) -> ActionPlan {
        let mut i = restore_inputs();
        i.restore = None;
        i.schema_ready = true;
        i.check_interval_secs = Some(300);
        i.now_secs = 1_800_000_000;
        i.check_job = Some(("locks-fencing-check-1".into(), job));
        run(&i)
    }

    #[test]
    fn a_check_records_the_comparison_and_says_when_the_sequence_falls_behind() {
        let mut i = restore_inputs();
        i.restore = None;
        i.schema_ready = true;
        i.check_interval_secs = Some(300);
        i.now_secs = 1_800_000_000;
        let due = run(&i);
        let job = due.check_job.expect("a check is due");
        assert!(job.metadata.name.unwrap().starts_with("locks-fencing-check-"));
        // Off without an interval.
        i.check_interval_secs = None;
        assert!(run(&i).check_job.is_none());

        let behind = checked(JobRun::Succeeded(Some(
            r#"{"sequence":3,"stacks":[{"name":"pay-a","railHighWater":6,"accountFence":5,"ledgerFence":0,"claimToken":0,"highest":6}]}"#.into(),
        )));
        let f = behind.fencing.clone().unwrap();
        assert_eq!(
            (f.sequence, f.high_water, f.high_water_stack.as_deref()),
            (3, 6, Some("pay-a"))
        );
        assert_eq!(behind.events[0].reason, Reason::FencingSequenceBehind);
        assert!(behind_message(&f).contains("PaymentStack pay-a"));
        // Running: kept; failed: the last result stays.
        assert_eq!(
            checked(JobRun::Running).keep_check.as_deref(),
            Some("locks-fencing-check-1")
        );
        assert_eq!(checked(JobRun::Failed(None)).fencing, None);
    }
}
