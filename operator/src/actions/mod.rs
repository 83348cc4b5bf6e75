//! The LockService actions, as a state machine planned purely: from the request (annotation), what
//! status says about it, and what was observed, the next step — a status transition, a pinned
//! revoke call, or the Jobs of a restore fast-forward. [`plan`] decides both requests and the
//! periodic check; each has its module ([`revoke`], [`restore`], [`check`]); [`sequence`] records
//! lock-server's jumps of the sequence and asks for the check at once when one shows a new lockdb
//! history; [`jobs`] builds the fast-forward Jobs and reads their reports. The I/O around it:
//! [`observe`] reads what the planning needs, [`client`] is lock-server's API (the one write outside
//! Kubernetes, the pinned revoke).
//!
//! Crash safety rests on one rule: every step is decided from persisted status alone, and a step
//! that acts is only planned once the status naming its target has been written by an earlier
//! reconcile. A revoke's target token is in `status.actions[id]` (phase `Running`) before the revoke
//! is sent, and the revoke removes exactly that token, so a crash anywhere and a re-run of the same
//! id can never remove a newer holder.

pub mod check;
pub mod client;
pub mod jobs;
pub mod observe;
pub mod restore;
pub mod revoke;
pub mod sequence;

use k8s_openapi::api::batch::v1::Job;

use crate::crd::actions::{
    ACTION_HISTORY, ActionPhase, ActionStatus, ActionType, FencingStatus, GateStatus, RequestError,
    RestoreRequest, RevokeRequest,
};
use crate::crd::sequence::SequenceStatus;
use crate::reasons::{EventNote, Reason};
use jobs::{JobRun, RestoreJobs};
use revoke::{LockView, RevokeCall};

/// A request read from an annotation: usable, or refused with the reason (and its id if it had one).
#[derive(Debug, Clone, PartialEq)]
pub enum Request<T> {
    Valid(T),
    Invalid { id: Option<String>, error: RequestError },
}

/// One PaymentStack whose paydb a restore must read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackRef {
    pub name: String,
    /// The paydb connection Secret exists (else the Job's pod could not even start).
    pub connection_ready: bool,
    /// paydb's migration Job has succeeded (the periodic check waits for it: the tables it reads
    /// exist only then).
    pub migrated: bool,
}

/// Everything the action planning looks at.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ActionInputs {
    pub revoke: Option<Request<RevokeRequest>>,
    pub restore: Option<Request<RestoreRequest>>,
    /// `status.actions` as last written.
    pub actions: Vec<ActionStatus>,
    pub gate: Option<GateStatus>,
    /// lock-server's Deployment is available at the replicas the spec asks for.
    pub lock_server_available: bool,
    /// lock-server pods that still exist (any phase): the gate is closed only when this is 0.
    pub lock_server_pods: usize,
    /// The lock-server Deployment's own count of pods.
    pub lock_server_replicas: i32,
    /// `GET /v1/locks/{key}` for the pending revoke's key, when observed.
    pub lock: Option<LockView>,
    pub read_job: JobRun,
    pub advance_job: JobRun,
    /// Every PaymentStack that references this LockService.
    pub stacks: Vec<StackRef>,
    /// RFC 3339, for startedAt / finishedAt.
    pub now: String,
    /// Seconds since the epoch (for the periodic check).
    pub now_secs: i64,
    /// The periodic comparison of sequence and high-water: last result, and its Job if one exists.
    pub fencing: Option<FencingStatus>,
    pub check_job: Option<(String, JobRun)>,
    /// Seconds between checks; `None` turns the check off.
    pub check_interval_secs: Option<i64>,
    /// lockdb is migrated (a check before that would only fail).
    pub schema_ready: bool,
    /// Backend etcd: a restore is refused (its fast-forward is the etcd-bump runbook, not lockdb's
    /// sequence), and `check_interval_secs` is `None`.
    pub etcd_backend: bool,
    /// `status.sequence` as last written.
    pub sequence: Option<SequenceStatus>,
    /// What `GET /v1/sequence` answered this time; `None` when it was not asked (etcd, no
    /// lock-server pod available) or did not answer: the status stays as it is.
    pub sequence_read: Option<sequence::SequenceView>,
}

/// The next step of the actions, as decided from the inputs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ActionPlan {
    /// `status.actions` after this step (bounded; written once by the controller).
    pub actions: Vec<ActionStatus>,
    pub gate: Option<GateStatus>,
    /// The pinned revoke to send (only for an id already recorded `Running` with its token).
    pub revoke: Option<RevokeCall>,
    /// Restore Jobs to create now; every restore Job of this owner not here or in `keep_jobs` is an
    /// orphan.
    pub jobs: Vec<Job>,
    /// Work is in flight: look again soon.
    pub busy: bool,
    pub events: Vec<EventNote>,
    /// The periodic comparison after this step.
    pub fencing: Option<FencingStatus>,
    /// A check Job to create now.
    pub check_job: Option<Job>,
    /// A check Job that is running and stays (every other check Job is an orphan).
    pub keep_check: Option<String>,
    /// Restore Jobs that are running and stay (besides those in `jobs`).
    pub keep_jobs: Vec<String>,
    /// `status.sequence` after this step.
    pub sequence: Option<SequenceStatus>,
}

impl ActionPlan {
    /// lock-server is held at zero replicas while the gate is closed.
    pub fn gated(&self) -> bool {
        self.gate.is_some()
    }

    fn event(&mut self, reason: Reason, note: String) {
        let warning = matches!(
            reason,
            Reason::ActionRequestInvalid
                | Reason::RevokeFailed
                | Reason::RestoreFailed
                | Reason::RestoreUnsupported
                | Reason::FencingSequenceBehind
        );
        self.events.push(EventNote {
            reason,
            warning,
            note,
        });
    }

    fn put(&mut self, status: ActionStatus) {
        match self.actions.iter_mut().find(|a| a.id == status.id) {
            Some(a) => *a = status,
            None => self.actions.push(status),
        }
    }
}

fn find<'a>(actions: &'a [ActionStatus], id: &str) -> Option<&'a ActionStatus> {
    actions.iter().find(|a| a.id == id)
}

/// Decides the next step of both actions. `jobs` builds the restore Jobs (owner-specific inputs).
pub fn plan(inputs: &ActionInputs, jobs: &RestoreJobs<'_>) -> ActionPlan {
    let mut out = ActionPlan {
        actions: inputs.actions.clone(),
        gate: inputs.gate.clone(),
        fencing: inputs.fencing.clone(),
        ..ActionPlan::default()
    };
    sequence::plan(inputs, jobs, &mut out);
    match &inputs.revoke {
        Some(Request::Valid(r)) => revoke::plan(inputs, r, &mut out),
        Some(Request::Invalid { id, error }) => {
            invalid(inputs, ActionType::Revoke, id.as_deref(), error, &mut out)
        }
        None => {}
    }
    // A promotion whose check found the sequence behind its paydbs starts the same fast-forward.
    let restore = sequence::auto_restore(inputs)
        .map(Request::Valid)
        .or_else(|| inputs.restore.clone());
    match &restore {
        Some(Request::Valid(r)) if inputs.etcd_backend => restore::refuse(inputs, r, &mut out),
        Some(Request::Valid(r)) => restore::plan(inputs, r, jobs, &mut out),
        Some(Request::Invalid { id, error }) => {
            invalid(inputs, ActionType::Restore, id.as_deref(), error, &mut out)
        }
        None => {}
    }
    let mut keep: Vec<String> = Vec::new();
    match &inputs.revoke {
        Some(Request::Valid(r)) => keep.push(r.id.clone()),
        Some(Request::Invalid { id: Some(id), .. }) => keep.push(id.clone()),
        _ => {}
    }
    match &restore {
        Some(Request::Valid(r)) => keep.push(r.id.clone()),
        Some(Request::Invalid { id: Some(id), .. }) => keep.push(id.clone()),
        _ => {}
    }
    out.actions = bounded(std::mem::take(&mut out.actions), &keep);
    check::plan(inputs, jobs, &mut out);
    sequence::settle(inputs, &mut out);
    out
}

/// Keeps every unfinished entry and the current requests, plus the most recent finished entries up
/// to [`ACTION_HISTORY`]; drops the oldest finished ones first.
pub fn bounded(actions: Vec<ActionStatus>, keep: &[String]) -> Vec<ActionStatus> {
    let finished_droppable = actions
        .iter()
        .filter(|a| a.phase.is_final() && !keep.contains(&a.id))
        .count();
    let mut excess = finished_droppable.saturating_sub(ACTION_HISTORY);
    actions
        .into_iter()
        .filter(|a| {
            if excess > 0 && a.phase.is_final() && !keep.contains(&a.id) {
                excess -= 1;
                false
            } else {
                true
            }
        })
        .collect()
}

fn invalid(
    inputs: &ActionInputs,
    type_: ActionType,
    id: Option<&str>,
    error: &RequestError,
    out: &mut ActionPlan,
) {
    match id {
        // A finished id stays finished, whatever the annotation says now.
        Some(id) if find(&inputs.actions, id).is_some() => {}
        Some(id) => {
            let mut s = ActionStatus::new(id, type_, ActionPhase::Failed);
            s.message = Some(format!("invalid request: {error}"));
            s.started_at = Some(inputs.now.clone());
            s.finished_at = Some(inputs.now.clone());
            out.put(s);
            out.event(Reason::ActionRequestInvalid, format!("{id}: {error}"));
        }
        None => {
            // No id to record it under: only an Event (the recorder folds repeats into one).
            out.event(Reason::ActionRequestInvalid, error.to_string());
        }
    }
}

fn failed(s: &mut ActionStatus, now: &str, message: String) {
    s.phase = ActionPhase::Failed;
    s.finished_at = Some(now.to_owned());
    s.message = Some(message);
}

/// `kubectl get lsvc` column: the most recent action and its phase, e.g. `r-42 Succeeded`.
pub fn last_action(actions: &[ActionStatus]) -> Option<String> {
    actions
        .iter()
        .max_by(|a, b| a.started_at.cmp(&b.started_at))
        .map(|a| format!("{} {:?}", a.id, a.phase))
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::testing::run;
    use super::*;
    use crate::crd::actions::parse_revoke;

    #[test]
    fn invalid_requests_are_reported_once_under_their_id() {
        let mut i = ActionInputs {
            now: "t".into(),
            ..ActionInputs::default()
        };
        let raw = r#"{"id":"r-9","key":"","reason":"x","requestedBy":"a"}"#;
        i.revoke = Some(Request::Invalid {
            id: crate::crd::actions::id_of(raw),
            error: parse_revoke(raw).unwrap_err(),
        });
        let p = run(&i);
        assert_eq!(p.actions[0].phase, ActionPhase::Failed);
        assert!(p.actions[0].message.as_deref().unwrap().contains("key"));
        i.actions = p.actions.clone();
        let p2 = run(&i);
        assert!(p2.events.is_empty(), "reported once");
    }

    #[test]
    fn history_is_bounded_but_keeps_current_and_unfinished_entries() {
        let mut actions: Vec<ActionStatus> = (0..15)
            .map(|n| ActionStatus::new(&format!("r-{n}"), ActionType::Revoke, ActionPhase::Succeeded))
            .collect();
        actions.push(ActionStatus::new(
            "r-run",
            ActionType::Revoke,
            ActionPhase::Running,
        ));
        let kept = bounded(actions, &["r-0".to_owned()]);
        let ids: Vec<&str> = kept.iter().map(|a| a.id.as_str()).collect();
        assert!(ids.contains(&"r-0") && ids.contains(&"r-run") && ids.contains(&"r-14"));
        assert!(!ids.contains(&"r-1"), "the oldest droppable go first: {ids:?}");
        assert_eq!(kept.len(), ACTION_HISTORY + 2);
    }
}
