//! Pure planning of the LockService actions: from the request (annotation), what status says about
//! it, and what was observed, the next step — a status transition, a pinned revoke call, or the Jobs
//! of a restore fast-forward. No I/O here; the controller observes, calls these, performs the one
//! write they ask for, and records the result with [`revoke_outcome`] / the returned status.
//!
//! Crash safety rests on one rule: every step is decided from persisted status alone, and a step
//! that acts is only planned once the status naming its target has been written by an earlier
//! reconcile. A revoke's target token is in `status.actions[id]` (phase `Running`) before the revoke
//! is sent, and the revoke removes exactly that token, so a crash anywhere and a re-run of the same
//! id can never remove a newer holder.

use crate::reasons::Reason;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::database::{History, KEY_URL, names};
use super::{Owner, env, secret_env, short_hash};
use std::str::FromStr;

use crate::crd::SecretKeyRef;
use crate::crd::actions::{
    ACTION_HISTORY, ActionPhase, ActionStatus, ActionStep, ActionType, FencingStatus, GateStatus,
    RequestError, RestoreRequest, RevokeRequest, StackHighWater,
};

/// The binary (in the dlock image) that reads high-water marks and advances the sequence.
pub const FASTFORWARD_BINARY: &str = "dlock-fastforward";
/// Component label of the restore Jobs (orphans are found by it).
pub const RESTORE_COMPONENT: &str = "fencing-restore";
/// Component label of the periodic check Jobs.
pub const CHECK_COMPONENT: &str = "fencing-check";
/// Where the Jobs write their one-line JSON report: the container's termination message, which the
/// operator reads from the pod status (no log access, no database credentials in the operator).
pub const REPORT_PATH: &str = "/dev/termination-log";

/// A request read from an annotation: usable, or refused with the reason (and its id if it had one).
#[derive(Debug, Clone, PartialEq)]
pub enum Request<T> {
    Valid(T),
    Invalid { id: Option<String>, error: RequestError },
}

/// What `GET /v1/locks/{key}` said.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    pub state: String,
    #[serde(default)]
    pub fencing_token: Option<i64>,
    #[serde(default)]
    pub owner_id: Option<String>,
}

impl LockView {
    pub fn live_token(&self) -> Option<i64> {
        (self.state == "HELD").then_some(self.fencing_token).flatten()
    }
}

/// lock-server's answer to a pinned revoke.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokeAnswer {
    pub outcome: String,
    #[serde(default)]
    pub previous_owner: Option<String>,
    #[serde(default)]
    pub previous_token: Option<i64>,
    #[serde(default)]
    pub current_token: Option<i64>,
}

/// The pinned revoke to send: key and the token recorded in status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeCall {
    pub id: String,
    pub key: String,
    pub token: i64,
    pub reason: String,
    pub requested_by: String,
}

/// Where a Job of a restore stands, with its report once it ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum JobRun {
    #[default]
    Absent,
    Running,
    /// Ended; `report` is the termination message (None if it could not be read).
    Succeeded(Option<String>),
    Failed(Option<String>),
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
}

/// A step's Event: reason and note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionEvent {
    pub reason: Reason,
    pub warning: bool,
    pub note: String,
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
    pub events: Vec<ActionEvent>,
    /// The periodic comparison after this step.
    pub fencing: Option<FencingStatus>,
    /// A check Job to create now.
    pub check_job: Option<Job>,
    /// A check Job that is running and stays (every other check Job is an orphan).
    pub keep_check: Option<String>,
    /// Restore Jobs that are running and stay (besides those in `jobs`).
    pub keep_jobs: Vec<String>,
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
        self.events.push(ActionEvent {
            reason,
            warning,
            note,
        });
    }

    /// A new comparison of the sequence with the high-water, whoever made it (the periodic check or
    /// a restore): an Event when it crosses over in either direction.
    fn record_fencing(&mut self, next: FencingStatus) {
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

    /// Ends a restore as Failed with `message` (the gate stays closed) and says so in an Event.
    fn fail_restore(&mut self, mut s: ActionStatus, id: &str, now: &str, message: String) {
        self.event(Reason::RestoreFailed, format!("{id}: {message}"));
        failed(&mut s, now, message);
        self.put(s);
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
    match &inputs.revoke {
        Some(Request::Valid(r)) => plan_revoke(inputs, r, &mut out),
        Some(Request::Invalid { id, error }) => {
            invalid(inputs, ActionType::Revoke, id.as_deref(), error, &mut out)
        }
        None => {}
    }
    match &inputs.restore {
        Some(Request::Valid(r)) if inputs.etcd_backend => refuse_restore(inputs, r, &mut out),
        Some(Request::Valid(r)) => plan_restore(inputs, r, jobs, &mut out),
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
    match &inputs.restore {
        Some(Request::Valid(r)) => keep.push(r.id.clone()),
        Some(Request::Invalid { id: Some(id), .. }) => keep.push(id.clone()),
        _ => {}
    }
    out.actions = bounded(std::mem::take(&mut out.actions), &keep);
    plan_check(inputs, jobs, &mut out);
    out
}

/// The periodic check: a read Job every interval (named by the interval's bucket, so a re-run after
/// a crash finds the same one), its report recorded in `status.fencing`. Not while a restore runs:
/// the restore reads the same numbers and records them itself.
fn plan_check(inputs: &ActionInputs, jobs: &RestoreJobs<'_>, out: &mut ActionPlan) {
    let Some(interval) = inputs.check_interval_secs.filter(|i| *i > 0) else {
        return;
    };
    let restoring = out.gate.is_some() || !out.jobs.is_empty() || !out.keep_jobs.is_empty();
    match &inputs.check_job {
        Some((name, JobRun::Succeeded(Some(report)))) => {
            let Ok(r) = serde_json::from_str::<ReadReport>(report) else {
                return;
            };
            let (Some(sequence), None) = (r.sequence, &r.error) else {
                return;
            };
            let top = r.stacks.iter().max_by_key(|s| s.highest);
            let next = FencingStatus {
                sequence,
                high_water: top.map_or(0, |s| s.highest),
                high_water_stack: top.map(|s| s.name.clone()),
                checked_at: inputs.now.clone(),
                job_name: Some(name.clone()),
            };
            out.record_fencing(next);
        }
        // Ended without a usable report: keep the last result; the next bucket tries again.
        Some((_, JobRun::Succeeded(None) | JobRun::Failed(_))) => {}
        // Running: left as it is (a Job's template is immutable).
        Some((name, JobRun::Running | JobRun::Absent)) => out.keep_check = Some(name.clone()),
        None => {
            let last = out
                .fencing
                .as_ref()
                .and_then(|f| k8s_openapi::jiff::Timestamp::from_str(&f.checked_at).ok())
                .map(|t| t.as_second());
            let due = last.is_none_or(|t| inputs.now_secs - t >= interval);
            let migrated = inputs.stacks.iter().all(|st| st.migrated && st.connection_ready);
            if due && !restoring && inputs.schema_ready && migrated && !inputs.stacks.is_empty() {
                let bucket = inputs.now_secs / interval;
                let name = jobs.owner.child(&format!(
                    "fencing-check-{}",
                    short_hash(bucket.to_string().as_bytes())
                ));
                out.check_job = Some(read_job(jobs, name, CHECK_COMPONENT, &inputs.stacks));
            }
        }
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

fn plan_revoke(inputs: &ActionInputs, r: &RevokeRequest, out: &mut ActionPlan) {
    let existing = find(&inputs.actions, &r.id);
    if existing.is_some_and(|a| a.phase.is_final()) {
        return;
    }
    if let Some(a) = existing
        && a.phase == ActionPhase::Running
    {
        // The target token is persisted: send exactly that revoke (again, after a crash).
        if let Some(token) = a.target_token {
            out.busy = true;
            if inputs.lock_server_available {
                out.revoke = Some(RevokeCall {
                    id: r.id.clone(),
                    key: a.key.clone().unwrap_or_else(|| r.key.clone()),
                    token,
                    reason: r.reason.clone(),
                    requested_by: a.requested_by.clone().unwrap_or_else(|| r.requested_by.clone()),
                });
            }
            return;
        }
    }
    let mut s = existing
        .cloned()
        .unwrap_or_else(|| ActionStatus::new(&r.id, ActionType::Revoke, ActionPhase::Pending));
    s.key = Some(r.key.clone());
    s.requested_by = Some(r.requested_by.clone());
    s.started_at.get_or_insert_with(|| inputs.now.clone());
    out.busy = true;
    if !inputs.lock_server_available {
        let msg = if inputs.gate.is_some() {
            "waiting: lock traffic is gated by a restore fast-forward"
        } else {
            "waiting for lock-server to be available"
        };
        if existing.is_none() || s.message.as_deref() != Some(msg) {
            s.phase = ActionPhase::Pending;
            s.message = Some(msg.into());
            out.event(Reason::RevokeWaiting, format!("{}: {msg}", r.id));
            out.put(s);
        }
        return;
    }
    let Some(lock) = &inputs.lock else {
        // Not observed (the controller reads it only when lock-server is available): next time.
        return;
    };
    match lock.live_token() {
        Some(token) => {
            s.phase = ActionPhase::Running;
            s.step = Some(ActionStep::Revoke);
            s.target_token = Some(token);
            s.message = Some(format!(
                "revoking the grant with fencing token {token} on {} (owner {})",
                r.key,
                lock.owner_id.as_deref().unwrap_or("?")
            ));
            out.event(
                Reason::RevokeTargetRecorded,
                format!("{}: target token {token} on key {} recorded", r.id, r.key),
            );
        }
        None => {
            s.phase = ActionPhase::Succeeded;
            s.outcome = Some("NOT_HELD".into());
            s.message = Some(format!(
                "{} has no live grant ({}); nothing revoked",
                r.key, lock.state
            ));
            s.finished_at = Some(inputs.now.clone());
            out.event(
                Reason::RevokeSucceeded,
                format!("{}: {} is not held; nothing revoked", r.id, r.key),
            );
        }
    }
    out.put(s);
}

/// Records lock-server's answer to the pinned revoke of `running`.
pub fn revoke_outcome(
    running: &ActionStatus,
    answer: &RevokeAnswer,
    now: &str,
) -> (ActionStatus, ActionEvent) {
    let mut s = running.clone();
    let key = s.key.clone().unwrap_or_default();
    let token = s.target_token.unwrap_or_default();
    s.outcome = Some(answer.outcome.clone());
    s.previous_owner = answer.previous_owner.clone();
    s.previous_token = answer.previous_token;
    s.current_token = answer.current_token;
    s.finished_at = Some(now.to_owned());
    s.step = None;
    let (phase, reason, message) = match answer.outcome.as_str() {
        "REVOKED" => (
            ActionPhase::Succeeded,
            Reason::RevokeSucceeded,
            format!(
                "revoked the grant of {} with token {token} on {key}",
                answer.previous_owner.as_deref().unwrap_or("?")
            ),
        ),
        "ALREADY_REVOKED" => (
            ActionPhase::Succeeded,
            Reason::RevokeSucceeded,
            format!("token {token} on {key} had already been revoked (a retry); nothing else touched"),
        ),
        "NOT_HELD" => (
            ActionPhase::Succeeded,
            Reason::RevokeSucceeded,
            format!("token {token} on {key} was released before the revoke; nothing revoked"),
        ),
        "HELD_BY_OTHER_TOKEN" => (
            ActionPhase::Failed,
            Reason::RevokeFailed,
            format!(
                "token {token} on {key} is gone; the key is now held by token {}, which was left alone (request a new id to revoke it)",
                answer
                    .current_token
                    .map_or_else(|| "?".to_owned(), |t| t.to_string())
            ),
        ),
        other => (
            ActionPhase::Failed,
            Reason::RevokeFailed,
            format!("lock-server answered an unknown outcome {other:?}; nothing assumed"),
        ),
    };
    s.phase = phase;
    s.message = Some(message.clone());
    let warning = phase == ActionPhase::Failed;
    (
        s,
        ActionEvent {
            reason,
            warning,
            note: format!("{}: {message}", running.id),
        },
    )
}

/// Inputs of the restore Jobs' pod templates.
#[derive(Debug, Clone)]
pub struct RestoreJobs<'a> {
    pub owner: &'a Owner,
    pub image: &'a str,
    /// The lockdb owner-role URL (setval needs more than the app role's USAGE).
    pub lockdb_admin_url: &'a SecretKeyRef,
}

/// `<owner>-ff-<hash of id>-<suffix>`: deterministic, so a re-run after a crash finds the same Job.
pub fn restore_job_name(owner: &Owner, id: &str, suffix: &str) -> String {
    owner.child(&format!("ff-{}-{suffix}", short_hash(id.as_bytes())))
}

/// The read Job: `dlock-fastforward read`, one `--paydb NAME=ENV` per PaymentStack.
pub fn read_job(j: &RestoreJobs<'_>, name: String, component: &str, stacks: &[StackRef]) -> Job {
    let mut args = vec!["read".to_owned(), "--report".to_owned(), REPORT_PATH.to_owned()];
    let mut envs = vec![secret_env(
        "DATABASE_URL",
        &j.lockdb_admin_url.name,
        &j.lockdb_admin_url.key,
    )];
    for (i, s) in stacks.iter().enumerate() {
        let var = format!("PAYDB_URL_{i}");
        let paydb = names(
            &Owner {
                name: s.name.clone(),
                ..j.owner.clone()
            },
            History::Paydb,
        );
        envs.push(secret_env(&var, &paydb.connection_secret, KEY_URL));
        args.push("--paydb".into());
        args.push(format!("{}={var}", s.name));
    }
    job(j, name, component, args, envs)
}

/// The advance Job: `dlock-fastforward advance --at-least N` against lockdb.
pub fn advance_job(j: &RestoreJobs<'_>, name: String, at_least: i64) -> Job {
    let args = vec![
        "advance".to_owned(),
        "--at-least".to_owned(),
        at_least.to_string(),
        "--report".to_owned(),
        REPORT_PATH.to_owned(),
    ];
    let envs = vec![secret_env(
        "DATABASE_URL",
        &j.lockdb_admin_url.name,
        &j.lockdb_admin_url.key,
    )];
    job(j, name, RESTORE_COMPONENT, args, envs)
}

fn job(
    j: &RestoreJobs<'_>,
    name: String,
    component: &str,
    args: Vec<String>,
    mut envs: Vec<k8s_openapi::api::core::v1::EnvVar>,
) -> Job {
    envs.push(env("RUST_LOG", "info"));
    let container = Container {
        name: "fastforward".into(),
        image: Some(j.image.into()),
        command: Some(vec![FASTFORWARD_BINARY.into()]),
        args: Some(args),
        env: Some(envs),
        termination_message_path: Some(REPORT_PATH.into()),
        ..Container::default()
    };
    Job {
        metadata: j.owner.meta(name, component),
        spec: Some(JobSpec {
            // A failed read must fail the action (and keep the gate closed), not be retried blindly.
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(j.owner.labels(component)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    restart_policy: Some("Never".into()),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// The read Job's report.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadReport {
    #[serde(default)]
    pub sequence: Option<i64>,
    #[serde(default)]
    pub stacks: Vec<StackHighWater>,
    /// Set when a database could not be read: which one, and why.
    #[serde(default)]
    pub error: Option<String>,
}

/// The advance Job's report.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvanceReport {
    #[serde(default)]
    pub before: Option<i64>,
    #[serde(default)]
    pub after: Option<i64>,
    #[serde(default)]
    pub error: Option<String>,
}

/// Why a restore Job failed: the error of its JSON report, else the report's raw text, else `default`.
fn job_error<R: serde::de::DeserializeOwned>(
    report: &Option<String>,
    error: impl FnOnce(R) -> Option<String>,
    default: &str,
) -> String {
    report
        .as_deref()
        .and_then(|t| serde_json::from_str::<R>(t).ok())
        .and_then(error)
        .or_else(|| report.clone())
        .unwrap_or_else(|| default.to_owned())
}

fn failed(s: &mut ActionStatus, now: &str, message: String) {
    s.phase = ActionPhase::Failed;
    s.finished_at = Some(now.to_owned());
    s.message = Some(message);
}

/// What a restore request on an etcd LockService is told.
pub const ETCD_RESTORE_MESSAGE: &str = "the operator does not run a restore fast-forward for backend etcd: the fencing token is the etcd revision, which only `etcdutl snapshot restore --bump-revision` can raise; follow docs/operations.md, \"Restore on an etcd LockService\" (`dlock-fastforward etcd-bump` computes the bump from the paydbs' high-water). Nothing was changed and lock traffic was not gated";

/// A restore on an etcd LockService: recorded Failed at once, with the runbook to follow instead.
/// No gate, no Job, nothing else changes (the LockService is not Degraded by it).
fn refuse_restore(inputs: &ActionInputs, r: &RestoreRequest, out: &mut ActionPlan) {
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

fn plan_restore(inputs: &ActionInputs, r: &RestoreRequest, jobs: &RestoreJobs<'_>, out: &mut ActionPlan) {
    let existing = find(&inputs.actions, &r.id);
    if existing.is_some_and(|a| a.phase.is_final()) {
        return;
    }
    let now = &inputs.now;
    let owner = jobs.owner;
    let read_name = restore_job_name(owner, &r.id, "read");
    let advance_name = restore_job_name(owner, &r.id, "advance");
    let mut s = existing
        .cloned()
        .unwrap_or_else(|| ActionStatus::new(&r.id, ActionType::Restore, ActionPhase::Running));
    out.busy = true;
    match (existing.map(|a| a.phase), s.step) {
        // Not started (or Pending): close the gate first, in status, before anything else.
        (None | Some(ActionPhase::Pending), _) | (Some(ActionPhase::Running), None) => {
            s.phase = ActionPhase::Running;
            s.step = Some(ActionStep::Gate);
            s.margin = Some(r.margin());
            s.started_at.get_or_insert_with(|| now.clone());
            s.message = Some("gating lock traffic: lock-server is scaled to zero".into());
            out.gate = Some(GateStatus {
                action_id: r.id.clone(),
                since: now.clone(),
                message: format!("restore fast-forward {} in progress", r.id),
            });
            out.event(
                Reason::RestoreGateClosing,
                format!(
                    "{}: scaling lock-server to zero; no grant is issued until the sequence has moved",
                    r.id
                ),
            );
            out.put(s);
        }
        (_, Some(ActionStep::Gate)) => {
            if out.gate.is_none() {
                out.gate = Some(GateStatus {
                    action_id: r.id.clone(),
                    since: now.clone(),
                    message: format!("restore fast-forward {} in progress", r.id),
                });
            }
            if inputs.lock_server_pods > 0 || inputs.lock_server_replicas > 0 {
                return;
            }
            if let Some(missing) = inputs.stacks.iter().find(|st| !st.connection_ready) {
                out.fail_restore(s, &r.id, now, format!(
                        "PaymentStack {} has no paydb connection Secret yet, so its high-water cannot be read; lock traffic stays gated. Fix it, then request a new restore id",
                        missing.name
                    ));
                return;
            }
            s.step = Some(ActionStep::ReadHighWater);
            s.message = Some(format!(
                "gate closed (no lock-server pod left); reading the high-water of {} paydb(s)",
                inputs.stacks.len()
            ));
            out.event(
                Reason::RestoreGateClosed,
                format!("{}: no lock-server pod can serve; reading high-water", r.id),
            );
            out.put(s);
        }
        (_, Some(ActionStep::ReadHighWater)) => match &inputs.read_job {
            JobRun::Absent => out
                .jobs
                .push(read_job(jobs, read_name, RESTORE_COMPONENT, &inputs.stacks)),
            JobRun::Running => out.keep_jobs.push(read_name),
            JobRun::Failed(report) => {
                let why = job_error(
                    report,
                    |r: ReadReport| r.error,
                    "the read Job failed without a report",
                );
                out.fail_restore(
                    s,
                    &r.id,
                    now,
                    format!("reading the high-water failed: {why}; lock traffic stays gated"),
                );
            }
            JobRun::Succeeded(report) => {
                let parsed = report
                    .as_deref()
                    .and_then(|t| serde_json::from_str::<ReadReport>(t).ok());
                let Some(report) = parsed.filter(|p| p.error.is_none()) else {
                    out.fail_restore(s, &r.id, now, "the read Job succeeded but its report is missing or unreadable; lock traffic stays gated".into());
                    return;
                };
                let highest = report.stacks.iter().map(|st| st.highest).max().unwrap_or(0);
                let target = highest.saturating_add(r.margin());
                s.stacks = report.stacks;
                s.sequence_before = report.sequence;
                s.target_sequence = Some(target);
                s.step = Some(ActionStep::Advance);
                s.message = Some(format!(
                    "highest token seen by any resource: {highest}; advancing fencing_token_seq to at least {target}"
                ));
                out.event(
                    Reason::RestoreHighWaterRead,
                    format!(
                        "{}: high-water {highest}, sequence {}; advancing to {target}",
                        r.id,
                        report.sequence.map_or_else(|| "?".into(), |v| v.to_string())
                    ),
                );
                out.put(s);
            }
        },
        (_, Some(ActionStep::Advance)) => {
            let target = s.target_sequence.unwrap_or(1);
            match &inputs.advance_job {
                JobRun::Absent => out.jobs.push(advance_job(jobs, advance_name, target)),
                JobRun::Running => out.keep_jobs.push(advance_name),
                JobRun::Failed(report) => {
                    let why = job_error(
                        report,
                        |r: AdvanceReport| r.error,
                        "the advance Job failed without a report",
                    );
                    out.fail_restore(
                        s,
                        &r.id,
                        now,
                        format!("advancing the sequence failed: {why}; lock traffic stays gated"),
                    );
                }
                JobRun::Succeeded(report) => {
                    let parsed = report
                        .as_deref()
                        .and_then(|t| serde_json::from_str::<AdvanceReport>(t).ok());
                    let Some(AdvanceReport {
                        before,
                        after: Some(after),
                        error: None,
                    }) = parsed
                    else {
                        out.fail_restore(s, &r.id, now, "the advance Job succeeded but its report is missing or unreadable; lock traffic stays gated".into());
                        return;
                    };
                    if after < target {
                        out.fail_restore(s, &r.id, now, format!(
                                "the sequence is at {after}, below the target {target}; lock traffic stays gated"
                            ));
                        return;
                    }
                    if s.sequence_before.is_none() {
                        s.sequence_before = before;
                    }
                    s.sequence_after = Some(after);
                    let seq_before = s.sequence_before;
                    for st in &mut s.stacks {
                        st.sequence_before = seq_before;
                        st.sequence_after = Some(after);
                    }
                    s.step = Some(ActionStep::Resume);
                    s.message = Some(format!(
                        "fencing_token_seq moved from {} to {after}; resuming lock traffic",
                        seq_before.map_or_else(|| "?".into(), |v| v.to_string())
                    ));
                    out.gate = None;
                    out.event(
                        Reason::RestoreSequenceAdvanced,
                        format!("{}: {}", r.id, s.message.clone().unwrap_or_default()),
                    );
                    out.put(s);
                }
            }
        }
        (_, Some(ActionStep::Resume)) => {
            out.gate = None;
            if inputs.lock_server_available {
                s.phase = ActionPhase::Succeeded;
                s.step = None;
                s.finished_at = Some(now.clone());
                if let Some(after) = s.sequence_after {
                    let top = s.stacks.iter().max_by_key(|st| st.highest);
                    out.record_fencing(FencingStatus {
                        sequence: after,
                        high_water: top.map_or(0, |st| st.highest),
                        high_water_stack: top.map(|st| st.name.clone()),
                        checked_at: now.clone(),
                        job_name: None,
                    });
                }
                s.message = Some(format!(
                    "lock traffic resumed with fencing_token_seq at {}",
                    s.sequence_after.map_or_else(|| "?".into(), |v| v.to_string())
                ));
                out.event(
                    Reason::RestoreSucceeded,
                    format!("{}: {}", r.id, s.message.clone().unwrap_or_default()),
                );
                out.put(s);
            }
        }
        (Some(ActionPhase::Succeeded | ActionPhase::Failed), None) => {}
        (_, Some(ActionStep::Revoke)) => {
            failed(
                &mut s,
                now,
                "internal: a restore entry carries a revoke step".into(),
            );
            out.put(s);
        }
    }
}

/// `kubectl get lsvc` column: the most recent action and its phase, e.g. `r-42 Succeeded`.
pub fn last_action(actions: &[ActionStatus]) -> Option<String> {
    actions
        .iter()
        .max_by(|a, b| a.started_at.cmp(&b.started_at))
        .map(|a| format!("{} {:?}", a.id, a.phase))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::actions::{parse_restore, parse_revoke};

    fn owner() -> Owner {
        Owner {
            name: "locks".into(),
            namespace: "pay".into(),
            kind: "LockService".into(),
            owner_ref: Default::default(),
        }
    }

    fn secret() -> SecretKeyRef {
        SecretKeyRef {
            name: "locks-lockdb-conn".into(),
            key: "admin-url".into(),
        }
    }

    fn revoke_inputs() -> ActionInputs {
        ActionInputs {
            revoke: Some(Request::Valid(
                parse_revoke(r#"{"id":"r-1","key":"account:1","reason":"stuck","requestedBy":"alice"}"#)
                    .unwrap(),
            )),
            lock_server_available: true,
            now: "2026-01-01T00:00:00Z".into(),
            ..ActionInputs::default()
        }
    }

    fn held(token: i64) -> LockView {
        LockView {
            state: "HELD".into(),
            fencing_token: Some(token),
            owner_id: Some("worker-a".into()),
        }
    }

    fn run(inputs: &ActionInputs) -> ActionPlan {
        let o = owner();
        let s = secret();
        plan(
            inputs,
            &RestoreJobs {
                owner: &o,
                image: "dlock:1",
                lockdb_admin_url: &s,
            },
        )
    }

    #[test]
    fn revoke_records_the_target_before_it_acts_then_revokes_exactly_that_token() {
        let mut i = revoke_inputs();
        i.lock = Some(held(7));
        let p = run(&i);
        assert_eq!(p.revoke, None, "nothing is sent before the target is persisted");
        let a = &p.actions[0];
        assert_eq!(
            (a.phase, a.step, a.target_token),
            (ActionPhase::Running, Some(ActionStep::Revoke), Some(7))
        );
        assert_eq!(p.events[0].reason, Reason::RevokeTargetRecorded);

        // Next reconcile (or after a crash): the recorded token is revoked, whatever the key shows now.
        let mut i2 = revoke_inputs();
        i2.actions = p.actions.clone();
        i2.lock = Some(held(9));
        let p2 = run(&i2);
        let call = p2.revoke.clone().unwrap();
        assert_eq!(
            (call.token, call.key.as_str(), call.requested_by.as_str()),
            (7, "account:1", "alice")
        );
        assert!(p2.events.is_empty());

        // lock-server unavailable: nothing sent, still Running.
        i2.lock_server_available = false;
        assert_eq!(run(&i2).revoke, None);

        // The answers.
        let running = &p.actions[0];
        let ans = |outcome: &str, current: Option<i64>| RevokeAnswer {
            outcome: outcome.into(),
            previous_owner: Some("worker-a".into()),
            previous_token: Some(7),
            current_token: current,
        };
        let (done, ev) = revoke_outcome(running, &ans("REVOKED", None), "t");
        assert_eq!(
            (done.phase, done.previous_token, ev.warning),
            (ActionPhase::Succeeded, Some(7), false)
        );
        let (done, _) = revoke_outcome(running, &ans("ALREADY_REVOKED", None), "t");
        assert_eq!(done.phase, ActionPhase::Succeeded);
        let (done, ev) = revoke_outcome(running, &ans("HELD_BY_OTHER_TOKEN", Some(9)), "t");
        assert_eq!(
            (done.phase, done.current_token, ev.warning),
            (ActionPhase::Failed, Some(9), true)
        );
        assert!(done.message.unwrap().contains("left alone"));

        // Finished: never executed again, even if the key is held again.
        let mut i3 = revoke_inputs();
        i3.actions = vec![revoke_outcome(running, &ans("REVOKED", None), "t").0];
        i3.lock = Some(held(11));
        let p3 = run(&i3);
        assert_eq!(
            (p3.revoke, p3.actions, p3.busy),
            (None, i3.actions.clone(), false)
        );
    }

    #[test]
    fn revoke_of_a_free_key_succeeds_without_a_call_and_waits_for_lock_server() {
        let mut i = revoke_inputs();
        i.lock = Some(LockView {
            state: "EXPIRED".into(),
            fencing_token: Some(3),
            owner_id: None,
        });
        let p = run(&i);
        assert_eq!(p.revoke, None);
        assert_eq!(
            (p.actions[0].phase, p.actions[0].outcome.as_deref()),
            (ActionPhase::Succeeded, Some("NOT_HELD"))
        );

        let mut i = revoke_inputs();
        i.lock_server_available = false;
        let p = run(&i);
        assert_eq!(
            (p.actions[0].phase, p.revoke.clone()),
            (ActionPhase::Pending, None)
        );
        assert_eq!(p.events[0].reason, Reason::RevokeWaiting);
        // The same wait again: no new Event, no status change.
        let mut again = i.clone();
        again.actions = p.actions.clone();
        let p2 = run(&again);
        assert!(p2.events.is_empty());
        assert_eq!(p2.actions, p.actions);
    }

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

    fn restore_inputs() -> ActionInputs {
        ActionInputs {
            restore: Some(Request::Valid(
                parse_restore(r#"{"id":"ff-1","margin":100}"#).unwrap(),
            )),
            lock_server_available: true,
            lock_server_pods: 1,
            lock_server_replicas: 1,
            stacks: vec![
                StackRef {
                    name: "pay-a".into(),
                    connection_ready: true,
                    migrated: true,
                },
                StackRef {
                    name: "pay-b".into(),
                    connection_ready: true,
                    migrated: true,
                },
            ],
            now: "t".into(),
            ..ActionInputs::default()
        }
    }

    fn then(prev: &ActionPlan, mut next: ActionInputs) -> ActionInputs {
        next.actions = prev.actions.clone();
        next.gate = prev.gate.clone();
        next
    }

    fn step(p: &ActionPlan) -> (ActionPhase, Option<ActionStep>) {
        (p.actions[0].phase, p.actions[0].step)
    }

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
        let args = p4.jobs[0]
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
        assert!(
            args.contains(&"pay-a=PAYDB_URL_0".to_owned()) && args.contains(&"pay-b=PAYDB_URL_1".to_owned()),
            "{args:?}"
        );
        assert_eq!(
            p4.jobs[0].metadata.name.as_deref(),
            Some(restore_job_name(&owner(), "ff-1", "read").as_str())
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
        let args = p6.jobs[0]
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
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
