//! Restore fast-forward, one function per step: [`gate`] (scale lock-server to zero and wait until
//! no pod can serve), [`read`] (the paydbs' high-water, by a Job), [`advance`] (`setval` with
//! `GREATEST`, by a Job), [`resume`] (lock-server back). Each step is recorded in status before the
//! next one acts; a failed read or advance keeps the gate closed.

use super::check::comparison;
use k8s_openapi::api::batch::v1::Job;

use super::jobs::{
    self, AdvanceReport, JobRun, RESTORE_COMPONENT, ReadReport, Report, Reported, RestoreJobs,
};
use super::{ActionInputs, ActionPlan, failed, find};
use crate::crd::actions::{ActionPhase, ActionStatus, ActionStep, ActionType, GateStatus, RestoreRequest};
use crate::reasons::Reason;

/// What a restore request on an etcd LockService is told.
pub const ETCD_RESTORE_MESSAGE: &str = "the operator does not run a restore fast-forward for backend etcd: the fencing token is the etcd revision, which only `etcdutl snapshot restore --bump-revision` can raise; follow docs/operations.md, \"Restore on an etcd LockService\" (`dlock-fastforward etcd-bump` computes the bump from the paydbs' high-water). Nothing was changed and lock traffic was not gated";

/// A restore on an etcd LockService: recorded Failed at once, with the runbook to follow instead.
/// No gate, no Job, nothing else changes (the LockService is not Degraded by it).
pub(super) fn refuse(inputs: &ActionInputs, r: &RestoreRequest, out: &mut ActionPlan) {
    if find(&inputs.actions, &r.id).is_some_and(|a| a.phase.is_final()) {
        return;
    }
    let mut s = ActionStatus::new(&r.id, ActionType::Restore, ActionPhase::Failed);
    s.started_at = Some(inputs.now.clone());
    failed(&mut s, &inputs.now, ETCD_RESTORE_MESSAGE.into());
    out.event(
        Reason::RestoreUnsupported,
        format!("{}: {ETCD_RESTORE_MESSAGE}", r.id),
    );
    out.put(s);
}

/// One step of one restore: the request, its status entry as it stands, and the plan to write to.
struct Step<'a, 'p> {
    inputs: &'a ActionInputs,
    r: &'a RestoreRequest,
    s: ActionStatus,
    out: &'p mut ActionPlan,
}

impl Step<'_, '_> {
    /// Records the entry as it now stands.
    fn put(self) {
        self.out.put(self.s);
    }

    /// Ends the restore as Failed with `message` (the gate stays closed) and says so in an Event.
    fn fail(mut self, message: String) {
        let id = &self.r.id;
        self.out.event(Reason::RestoreFailed, format!("{id}: {message}"));
        failed(&mut self.s, &self.inputs.now, message);
        self.out.put(self.s);
    }

    /// The Job of this step (`read`, `advance`) and its report: created when absent, kept while it
    /// runs, and the restore failed (the gate stays closed) when the Job failed or its report is
    /// unusable. `Some` with the report once it succeeded.
    fn job_report<R: Report>(
        self,
        jobs: &RestoreJobs<'_>,
        kind: &str,
        run: &JobRun,
        job: impl FnOnce(String) -> Job,
        doing: &str,
    ) -> Option<(Self, R)> {
        let name = jobs::restore_job_name(jobs.owner, &self.r.id, kind);
        match jobs::reported::<R>(run, kind) {
            Reported::Absent => self.out.jobs.push(job(name)),
            Reported::Running => self.out.keep_jobs.push(name),
            Reported::Failed(why) => {
                self.fail(format!("{doing} failed: {why}; lock traffic stays gated"));
            }
            Reported::Unreadable => self.fail(format!(
                "the {kind} Job succeeded but its report is missing or unreadable; lock traffic stays gated"
            )),
            Reported::Succeeded(report) => return Some((self, report)),
        }
        None
    }

    /// The gate is closed (lock-server held at zero) while this restore runs.
    fn close_gate(&mut self) {
        self.out.gate = Some(GateStatus {
            action_id: self.r.id.clone(),
            since: self.inputs.now.clone(),
            message: format!("restore fast-forward {} in progress", self.r.id),
        });
    }
}

/// The next step of a restore, from the step its status entry records.
pub(super) fn plan(inputs: &ActionInputs, r: &RestoreRequest, jobs: &RestoreJobs<'_>, out: &mut ActionPlan) {
    let existing = find(&inputs.actions, &r.id);
    if existing.is_some_and(|a| a.phase.is_final()) {
        return;
    }
    let s = existing
        .cloned()
        .unwrap_or_else(|| ActionStatus::new(&r.id, ActionType::Restore, ActionPhase::Running));
    out.busy = true;
    let phase = existing.map(|a| a.phase);
    let step = s.step;
    let at = Step { inputs, r, s, out };
    match (phase, step) {
        // Not started (or Pending): close the gate first, in status, before anything else.
        (None | Some(ActionPhase::Pending), _) | (Some(ActionPhase::Running), None) => start(at),
        (_, Some(ActionStep::Gate)) => gate(at),
        (_, Some(ActionStep::ReadHighWater)) => read(at, jobs),
        (_, Some(ActionStep::Advance)) => advance(at, jobs),
        (_, Some(ActionStep::Resume)) => resume(at),
        (Some(ActionPhase::Succeeded | ActionPhase::Failed), None) => {}
        (_, Some(ActionStep::Revoke)) => {
            let mut at = at;
            failed(
                &mut at.s,
                &inputs.now,
                "internal: a restore entry carries a revoke step".into(),
            );
            at.put();
        }
    }
}

/// The request arrives: the gate closes in status first.
fn start(mut at: Step<'_, '_>) {
    let inputs = at.inputs;
    let now = &inputs.now;
    at.s.phase = ActionPhase::Running;
    at.s.step = Some(ActionStep::Gate);
    at.s.margin = Some(at.r.margin());
    at.s.started_at.get_or_insert_with(|| now.clone());
    at.s.message = Some("gating lock traffic: lock-server is scaled to zero".into());
    at.close_gate();
    at.out.event(
        Reason::RestoreGateClosing,
        format!(
            "{}: scaling lock-server to zero; no grant is issued until the sequence has moved",
            at.r.id
        ),
    );
    at.put();
}

/// Gate: wait until no lock-server pod is left, then read (every paydb must be reachable).
fn gate(mut at: Step<'_, '_>) {
    if at.out.gate.is_none() {
        at.close_gate();
    }
    let inputs = at.inputs;
    if inputs.lock_server_pods > 0 || inputs.lock_server_replicas > 0 {
        return;
    }
    if let Some(missing) = inputs.stacks.iter().find(|st| !st.connection_ready) {
        let message = format!(
            "PaymentStack {} has no paydb connection Secret yet, so its high-water cannot be read; lock traffic stays gated. Fix it, then request a new restore id",
            missing.name
        );
        return at.fail(message);
    }
    at.s.step = Some(ActionStep::ReadHighWater);
    at.s.message = Some(format!(
        "gate closed (no lock-server pod left); reading the high-water of {} paydb(s)",
        inputs.stacks.len()
    ));
    at.out.event(
        Reason::RestoreGateClosed,
        format!("{}: no lock-server pod can serve; reading high-water", at.r.id),
    );
    at.put();
}

/// Read: the read Job, then the target (the highest token seen plus the margin).
fn read(at: Step<'_, '_>, jobs: &RestoreJobs<'_>) {
    let inputs = at.inputs;
    let job = |name| jobs::read_job(jobs, name, RESTORE_COMPONENT, &inputs.stacks);
    let Some((mut at, report)) =
        at.job_report::<ReadReport>(jobs, "read", &inputs.read_job, job, "reading the high-water")
    else {
        return;
    };
    let highest = report.stacks.iter().map(|st| st.highest).max().unwrap_or(0);
    let target = highest.saturating_add(at.r.margin());
    at.s.stacks = report.stacks;
    at.s.sequence_before = report.sequence;
    at.s.target_sequence = Some(target);
    at.s.step = Some(ActionStep::Advance);
    at.s.message = Some(format!(
        "highest token seen by any resource: {highest}; advancing fencing_token_seq to at least {target}"
    ));
    at.out.event(
        Reason::RestoreHighWaterRead,
        format!(
            "{}: high-water {highest}, sequence {}; advancing to {target}",
            at.r.id,
            report.sequence.map_or_else(|| "?".into(), |v| v.to_string())
        ),
    );
    at.put();
}

/// Advance: the advance Job, which must leave the sequence at or above the target; then the gate
/// opens.
fn advance(at: Step<'_, '_>, jobs: &RestoreJobs<'_>) {
    let inputs = at.inputs;
    let target = at.s.target_sequence.unwrap_or(1);
    let job = |name| jobs::advance_job(jobs, name, target);
    let Some((mut at, AdvanceReport { before, after, .. })) = at.job_report::<AdvanceReport>(
        jobs,
        "advance",
        &inputs.advance_job,
        job,
        "advancing the sequence",
    ) else {
        return;
    };
    let after = after.unwrap_or_default();
    if after < target {
        return at.fail(format!(
            "the sequence is at {after}, below the target {target}; lock traffic stays gated"
        ));
    }
    if at.s.sequence_before.is_none() {
        at.s.sequence_before = before;
    }
    at.s.sequence_after = Some(after);
    let seq_before = at.s.sequence_before;
    for st in &mut at.s.stacks {
        st.sequence_before = seq_before;
        st.sequence_after = Some(after);
    }
    at.s.step = Some(ActionStep::Resume);
    at.s.message = Some(format!(
        "fencing_token_seq moved from {} to {after}; resuming lock traffic",
        seq_before.map_or_else(|| "?".into(), |v| v.to_string())
    ));
    at.out.gate = None;
    at.out.event(
        Reason::RestoreSequenceAdvanced,
        format!("{}: {}", at.r.id, at.s.message.clone().unwrap_or_default()),
    );
    at.put();
}

/// Resume: done once lock-server is available again; the new comparison goes to `status.fencing`.
fn resume(mut at: Step<'_, '_>) {
    at.out.gate = None;
    if !at.inputs.lock_server_available {
        return;
    }
    let inputs = at.inputs;
    let now = &inputs.now;
    at.s.phase = ActionPhase::Succeeded;
    at.s.step = None;
    at.s.finished_at = Some(now.clone());
    if let Some(after) = at.s.sequence_after {
        let next = comparison(after, &at.s.stacks, now, None);
        at.out.record_fencing(next);
    }
    at.s.message = Some(format!(
        "lock traffic resumed with fencing_token_seq at {}",
        at.s.sequence_after.map_or_else(|| "?".into(), |v| v.to_string())
    ));
    at.out.event(
        Reason::RestoreSucceeded,
        format!("{}: {}", at.r.id, at.s.message.clone().unwrap_or_default()),
    );
    at.put();
}

#[cfg(test)]
mod tests {
    use super::super::testing::{container_args, owner, restore_inputs, run, step, then};
    use super::*;
    use crate::crd::actions::FencingStatus;

    #[test]
    fn restore_gates_reads_advances_and_resumes_in_order() {
        let p1 = run(&restore_inputs());
        assert_eq!(step(&p1), (ActionPhase::Running, Some(ActionStep::Gate)));
        assert!(p1.gated() && p1.jobs.is_empty());

        // Pods still there: keep waiting, gate closed.
        let p2 = run(&then(&p1, restore_inputs()));
        assert_eq!(step(&p2), (ActionPhase::Running, Some(ActionStep::Gate)));
        assert!(p2.gated());

        let mut gone = restore_inputs();
        gone.lock_server_pods = 0;
        gone.lock_server_replicas = 0;
        gone.lock_server_available = false;
        let p3 = run(&then(&p2, gone.clone()));
        assert_eq!(step(&p3), (ActionPhase::Running, Some(ActionStep::ReadHighWater)));
        assert!(
            p3.jobs.is_empty(),
            "the step is recorded before its Job is created"
        );

        let p4 = run(&then(&p3, gone.clone()));
        assert_eq!(p4.jobs.len(), 1);
        let args = container_args(&p4.jobs[0]);
        assert!(
            args.contains(&"pay-a=PAYDB_URL_0".to_owned()) && args.contains(&"pay-b=PAYDB_URL_1".to_owned()),
            "{args:?}"
        );
        assert_eq!(
            p4.jobs[0].metadata.name.as_deref(),
            Some(jobs::restore_job_name(&owner(), "ff-1", "read").as_str())
        );

        let mut read = gone.clone();
        read.read_job = JobRun::Succeeded(Some(
            r#"{"sequence":3,"stacks":[{"name":"pay-a","railHighWater":6,"accountFence":5,"ledgerFence":0,"claimToken":0,"highest":6},{"name":"pay-b","railHighWater":0,"accountFence":4,"ledgerFence":0,"claimToken":3,"highest":4}]}"#.into(),
        ));
        let p5 = run(&then(&p4, read));
        assert_eq!(step(&p5), (ActionPhase::Running, Some(ActionStep::Advance)));
        assert_eq!(
            (p5.actions[0].target_sequence, p5.actions[0].sequence_before),
            (Some(106), Some(3))
        );
        assert!(p5.gated());

        let p6 = run(&then(&p5, gone.clone()));
        let args = container_args(&p6.jobs[0]);
        assert!(args.windows(2).any(|w| w == ["--at-least", "106"]), "{args:?}");

        let mut adv = gone.clone();
        adv.advance_job = JobRun::Succeeded(Some(r#"{"before":3,"after":106}"#.into()));
        let p7 = run(&then(&p6, adv));
        assert_eq!(step(&p7), (ActionPhase::Running, Some(ActionStep::Resume)));
        assert!(!p7.gated(), "the gate opens only once the sequence has moved");
        assert_eq!(p7.actions[0].stacks[1].sequence_after, Some(106));

        let mut back = gone.clone();
        back.lock_server_available = true;
        let p8 = run(&then(&p7, back.clone()));
        assert_eq!(p8.actions[0].phase, ActionPhase::Succeeded);
        assert!(!p8.gated());
        assert_eq!(
            p8.fencing.as_ref().map(|f| (f.sequence, f.high_water)),
            Some((106, 6))
        );
        let caught_up = |p: &ActionPlan| {
            p.events
                .iter()
                .any(|e| e.reason == Reason::FencingSequenceCaughtUp)
        };
        assert!(!caught_up(&p8), "never behind: nothing to announce");
        // Found behind before (by the periodic check): the resume announces that it caught up.
        let mut was_behind = back.clone();
        was_behind.fencing = Some(FencingStatus {
            sequence: 3,
            high_water: 6,
            high_water_stack: Some("pay-a".into()),
            checked_at: "t".into(),
            job_name: None,
        });
        assert!(caught_up(&run(&then(&p7, was_behind))));
        let p9 = run(&then(&p8, back));
        assert!(
            !p9.busy && p9.events.is_empty() && p9.jobs.is_empty(),
            "finished: nothing more to do"
        );
    }

    #[test]
    fn an_etcd_restore_is_refused_with_the_runbook_and_changes_nothing() {
        let mut etcd = restore_inputs();
        etcd.etcd_backend = true;
        let p = run(&etcd);
        assert_eq!(p.actions.len(), 1);
        let a = &p.actions[0];
        assert_eq!(
            (a.id.as_str(), a.phase, a.step),
            ("ff-1", ActionPhase::Failed, None)
        );
        let message = a.message.as_deref().unwrap_or_default();
        assert!(
            message.contains("dlock-fastforward etcd-bump") && message.contains("docs/operations.md"),
            "{message}"
        );
        assert!(a.finished_at.is_some());
        // No gate, no Job, nothing in flight.
        assert!(!p.gated() && p.jobs.is_empty() && p.keep_jobs.is_empty() && !p.busy);
        assert_eq!(p.events.len(), 1);
        assert_eq!(p.events[0].reason, Reason::RestoreUnsupported);
        assert!(p.events[0].warning && p.events[0].note.starts_with("ff-1: "));
        // Once recorded, the same id is not reported again.
        let again = run(&then(&p, etcd.clone()));
        assert_eq!(again.actions, p.actions);
        assert!(again.events.is_empty());
        // Negative control: the same request on a postgres LockService closes the gate.
        let postgres = run(&restore_inputs());
        assert!(postgres.gated());
        assert_eq!(postgres.actions[0].phase, ActionPhase::Running);
    }

    #[test]
    fn a_failed_read_or_advance_keeps_the_gate_closed() {
        let mut gone = restore_inputs();
        gone.lock_server_pods = 0;
        gone.lock_server_replicas = 0;
        let p = run(&restore_inputs());
        let p = run(&then(&p, gone.clone()));
        let mut failed = gone.clone();
        failed.read_job = JobRun::Failed(Some(
            r#"{"error":"paydb of PaymentStack pay-b: relation \"rail_high_water\" does not exist"}"#.into(),
        ));
        let p = run(&then(&p, failed));
        assert_eq!(p.actions[0].phase, ActionPhase::Failed);
        assert!(p.actions[0].message.as_deref().unwrap().contains("pay-b"));
        assert!(p.gated(), "the gate stays closed");
        assert_eq!(p.events.last().unwrap().reason, Reason::RestoreFailed);
        // The failed id is final; the gate stays closed while it is the current request.
        let p2 = run(&then(&p, gone.clone()));
        assert!(p2.gated() && p2.jobs.is_empty());

        // A report below the target is a failure, not a success.
        let mut adv = gone.clone();
        let mut s = ActionStatus::new("ff-1", ActionType::Restore, ActionPhase::Running);
        s.step = Some(ActionStep::Advance);
        s.target_sequence = Some(500);
        adv.actions = vec![s];
        adv.gate = p.gate.clone();
        adv.advance_job = JobRun::Succeeded(Some(r#"{"before":3,"after":400}"#.into()));
        let p3 = run(&adv);
        assert_eq!(p3.actions[0].phase, ActionPhase::Failed);
        assert!(p3.gated());

        // A stack without its paydb Secret fails at the gate, naming it.
        let mut missing = gone.clone();
        missing.stacks[1].connection_ready = false;
        let p = run(&restore_inputs());
        let p = run(&then(&p, missing));
        assert_eq!(p.actions[0].phase, ActionPhase::Failed);
        assert!(p.actions[0].message.as_deref().unwrap().contains("pay-b"));
    }
}
