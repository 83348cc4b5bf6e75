//! From what a reconcile applied to its status: the phase, the three standard conditions, the
//! migration block, and each kind's own part ([`KindOutcome`]). Pure functions; the pipeline
//! patches the result with server-side apply.

use std::collections::BTreeMap;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::builders::cnpg::ClusterHealth;
use crate::builders::postgres::History;
use crate::crd::status::{CONDITION_DEGRADED, CONDITION_PROGRESSING, CONDITION_READY};
use crate::crd::{DlockStatus, EtcdStatus, MigrationStatus, Phase};
use crate::health::{DeploymentHealth, JobState};
use crate::reasons::{EventNote, Reason};

/// Something a human must fix (or wait for) before the controller can go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// Shared by the condition and the Event.
    pub reason: Reason,
    pub message: String,
}

impl Blocked {
    pub fn new(reason: Reason, message: impl Into<String>) -> Blocked {
        Blocked {
            reason,
            message: message.into(),
        }
    }
}

/// The etcd cluster of a LockService with backend etcd, as the etcd step saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdHealth {
    /// The operator's members: how many the StatefulSet asks for, how many are ready.
    Managed { members: i32, ready: i32 },
    /// Run elsewhere: its health is lock-server's readiness (its probe reaches etcd).
    External,
}

impl EtcdHealth {
    /// The cluster can commit: lock-server may start.
    pub fn has_quorum(&self) -> bool {
        match self {
            EtcdHealth::Managed { members, ready } => {
                *ready >= crate::builders::etcd_members::quorum(*members)
            }
            EtcdHealth::External => true,
        }
    }

    pub fn all_ready(&self) -> bool {
        match self {
            EtcdHealth::Managed { members, ready } => ready >= members,
            EtcdHealth::External => true,
        }
    }

    pub fn status(&self) -> EtcdStatus {
        match self {
            EtcdHealth::Managed { members, ready } => EtcdStatus {
                mode: "managed".into(),
                members: Some(*members),
                ready_members: Some(*ready),
                ready: format!("{ready}/{members}"),
            },
            EtcdHealth::External => EtcdStatus {
                mode: "external".into(),
                members: None,
                ready_members: None,
                ready: "external".into(),
            },
        }
    }
}

/// What a kind's own apply step did ([`super::pipeline::Reconciled::apply`]): what it says about
/// the verdict, its own part of status, how soon to look again, the Events of what it did.
pub trait KindOutcome: Send + Sync {
    /// What blocks the object, gates it, or is awaited, by the kind's own reckoning.
    fn verdict(&self) -> KindVerdict {
        KindVerdict::default()
    }
    /// Writes the kind's own part of `status` (the rest is shared).
    fn write_status(&self, _status: &mut DlockStatus) {}
    /// The requeue interval, given the one the phase asks for.
    fn requeue(&self, after: Duration) -> Duration {
        after
    }
    /// The Events of what was done, published after the status write.
    fn events(&self) -> &[EventNote] {
        &[]
    }
}

/// A kind's contribution to the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KindVerdict {
    /// Something a human must fix.
    pub blocked: Option<Blocked>,
    /// Lock traffic is gated (a restore fast-forward in progress).
    pub gated: Option<Blocked>,
    /// A dependency that is not there yet.
    pub waiting: Option<Blocked>,
}

/// A reconcile that ended before anything was applied: what a human must fix.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    pub blocked: Blocked,
    /// The etcd cluster, when it was looked at before the stop.
    pub etcd: Option<EtcdHealth>,
}

/// The migration Job of one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationRun {
    pub job_name: String,
    pub state: JobState,
    /// Read from the Job's log once it succeeded (`None`: not read this time).
    pub read_version: Option<i64>,
}

/// What a reconcile applied, which is all its status is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied<O> {
    pub database_ready: bool,
    /// Backend etcd: the cluster (in place of the database's schema, which it has not).
    pub etcd: Option<EtcdHealth>,
    /// A managed database on CloudNativePG: its Cluster (boxed: most reconciles have none).
    pub cluster: Option<Box<ClusterHealth>>,
    /// `None` without a schema (etcd).
    pub migration: Option<MigrationRun>,
    /// Deployments applied (empty while a gate holds them back).
    pub deployments: Vec<DeploymentHealth>,
    /// How many Deployments the spec asks for once past the gates.
    pub expected_deployments: usize,
    pub endpoints: BTreeMap<String, String>,
    /// `status.tls` (`None`: the owner serves plain HTTP).
    /// (Boxed: it is the largest part of a reconcile's outcome.)
    pub tls: Option<Box<crate::crd::TlsStatus>>,
    /// The kind's own outcome.
    pub kind: O,
}

/// How one reconcile ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciliation<O> {
    Stopped(Stopped),
    Applied(Applied<O>),
}

impl<O: KindOutcome> Reconciliation<O> {
    /// The verdict's inputs.
    pub fn observation(&self) -> Observation {
        match self {
            Reconciliation::Stopped(s) => Observation {
                blocked: Some(s.blocked.clone()),
                etcd: s.etcd.clone(),
                ..Observation::default()
            },
            Reconciliation::Applied(a) => {
                let kind = a.kind.verdict();
                Observation {
                    blocked: kind.blocked,
                    database_ready: a.database_ready,
                    migration: a.migration.as_ref().map(|m| m.state.clone()),
                    waiting: kind.waiting,
                    deployments: a.deployments.clone(),
                    expected_deployments: a.expected_deployments,
                    gated: kind.gated,
                    etcd: a.etcd.clone(),
                    cluster: a.cluster.as_deref().cloned(),
                }
            }
        }
    }

    /// The kind's outcome, when the reconcile got as far as applying.
    pub fn kind(&self) -> Option<&O> {
        match self {
            Reconciliation::Stopped(_) => None,
            Reconciliation::Applied(a) => Some(&a.kind),
        }
    }
}

/// The new status of a reconcile that ended as `r`, with its verdict.
pub fn status_of<O: KindOutcome>(
    previous: Option<&DlockStatus>,
    generation: Option<i64>,
    history: History,
    r: &Reconciliation<O>,
    now: Timestamp,
) -> (DlockStatus, Assessment) {
    let obs = r.observation();
    let assessment = assess(&obs);
    let previous_migration = || previous.and_then(|p| p.migration.clone());
    let previous_endpoints = || previous.map(|p| p.endpoints.clone()).unwrap_or_default();
    let (migration, endpoints) = match r {
        Reconciliation::Stopped(_) => (previous_migration(), previous_endpoints()),
        Reconciliation::Applied(a) => (
            match &a.migration {
                Some(m) => Some(migration_status(
                    previous.and_then(|p| p.migration.as_ref()),
                    history.name(),
                    &m.job_name,
                    &m.state,
                    m.read_version,
                )),
                None => previous_migration(),
            },
            if a.endpoints.is_empty() {
                previous_endpoints()
            } else {
                a.endpoints.clone()
            },
        ),
    };
    let mut new = build(previous, generation, &assessment, endpoints, migration, now);
    if let Some(etcd) = &obs.etcd {
        new.etcd = Some(etcd.status());
    }
    // Carried over while a stop hides the Cluster (the change of primary stays recorded).
    new.database = match &obs.cluster {
        Some(c) => Some(c.status(previous.and_then(|p| p.database.as_ref()), &now.to_string())),
        None => previous.and_then(|p| p.database.clone()),
    };
    new.tls = match r {
        Reconciliation::Applied(a) => a.tls.as_deref().cloned(),
        Reconciliation::Stopped(_) => previous.and_then(|p| p.tls.clone()),
    };
    if let Some(kind) = r.kind() {
        kind.write_status(&mut new);
    }
    (new, assessment)
}

/// Everything the verdict is computed from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// A configuration problem (invalid spec, unusable external database, tampered Secret).
    pub blocked: Option<Blocked>,
    pub database_ready: bool,
    pub migration: Option<JobState>,
    /// A dependency that is not there yet (the LockService of a PaymentStack).
    pub waiting: Option<Blocked>,
    /// Deployments applied this round (empty while the schema gate holds them back).
    pub deployments: Vec<DeploymentHealth>,
    /// How many Deployments the spec asks for once past the gates.
    pub expected_deployments: usize,
    /// Lock traffic is gated by a restore fast-forward in progress.
    pub gated: Option<Blocked>,
    /// Backend etcd: the cluster (in place of the database and its migration, which it has not).
    pub etcd: Option<EtcdHealth>,
    /// A managed database on CloudNativePG: its Cluster.
    pub cluster: Option<ClusterHealth>,
}

/// The verdict: phase plus one (status, reason, message) per condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub phase: Phase,
    pub reason: Reason,
    pub message: String,
}

impl Assessment {
    fn new(phase: Phase, reason: Reason, message: impl Into<String>) -> Assessment {
        Assessment {
            phase,
            reason,
            message: message.into(),
        }
    }

    /// Warnings for `Degraded`, normal events otherwise.
    pub fn is_warning(&self) -> bool {
        self.phase == Phase::Degraded
    }
}

pub fn assess(obs: &Observation) -> Assessment {
    if let Some(b) = &obs.blocked {
        return Assessment::new(Phase::Degraded, b.reason, b.message.clone());
    }
    match &obs.etcd {
        Some(etcd) => {
            if let (false, EtcdHealth::Managed { members, ready }) = (etcd.has_quorum(), etcd) {
                return Assessment::new(
                    Phase::Pending,
                    Reason::WaitingForEtcd,
                    format!(
                        "waiting for a quorum of the etcd members: {ready}/{members} ready; lock-server starts at {}",
                        crate::builders::etcd_members::quorum(*members)
                    ),
                );
            }
        }
        None => {
            if let Some(a) = database_and_schema(obs) {
                return a;
            }
        }
    }
    if let Some(g) = &obs.gated {
        return Assessment::new(Phase::Pending, g.reason, g.message.clone());
    }
    if let Some(w) = &obs.waiting {
        return Assessment::new(Phase::Pending, w.reason, w.message.clone());
    }
    let unavailable: Vec<&str> = obs
        .deployments
        .iter()
        .filter(|d| !d.is_available())
        .map(|d| d.name.as_str())
        .collect();
    if !unavailable.is_empty() || obs.deployments.len() < obs.expected_deployments {
        return Assessment::new(
            Phase::Pending,
            Reason::RollingOut,
            format!(
                "waiting for Deployments to become available: {}",
                unavailable.join(", ")
            ),
        );
    }
    if let Some(EtcdHealth::Managed { members, ready }) = obs.etcd.as_ref().filter(|e| !e.all_ready()) {
        return Assessment::new(
            Phase::Pending,
            Reason::WaitingForEtcd,
            format!("lock-server is available; etcd members ready: {ready}/{members}"),
        );
    }
    if let Some(c) = obs.cluster.as_ref().filter(|c| !c.all_ready()) {
        let sync = match &c.synchronous {
            Some(s) => format!("; synchronous {s}"),
            None => String::new(),
        };
        return Assessment::new(
            Phase::Pending,
            Reason::WaitingForDatabaseInstances,
            format!(
                "the services are available; database instances ready: {}/{}{sync}",
                c.ready, c.instances
            ),
        );
    }
    Assessment::new(Phase::Ready, Reason::Ready, "all components are available")
}

/// The lockdb / paydb part of the verdict: the migration failed, the database is not up yet, or the
/// migration is running (`None`: none of these).
fn database_and_schema(obs: &Observation) -> Option<Assessment> {
    if let Some(JobState::Failed(msg)) = &obs.migration {
        return Some(Assessment::new(
            Phase::Degraded,
            Reason::MigrationFailed,
            format!("the migration Job failed: {msg}; fix the cause, then delete the Job to retry"),
        ));
    }
    if !obs.database_ready {
        return Some(Assessment::new(
            Phase::Pending,
            Reason::WaitingForDatabase,
            "waiting for the database to accept connections",
        ));
    }
    match &obs.migration {
        Some(JobState::Succeeded) => None,
        _ => Some(Assessment::new(
            Phase::Migrating,
            Reason::Migrating,
            "the migration Job is running; Deployments that need the schema wait for it",
        )),
    }
}

/// The migration block of the status. The applied version is kept from the previous status while
/// the Job is the same one; `read_version` supplies it when it is not known yet.
pub fn migration_status(
    previous: Option<&MigrationStatus>,
    history: &str,
    job_name: &str,
    state: &JobState,
    read_version: Option<i64>,
) -> MigrationStatus {
    // Known only if this very Job had already succeeded: while a new Job runs, the status carries
    // the previous Job's version under the new name.
    let known = previous
        .filter(|p| p.succeeded && p.job_name.as_deref() == Some(job_name))
        .and_then(|p| p.applied_version);
    let applied_version = match state {
        JobState::Succeeded => known.or(read_version),
        // A new Job is running or failed: the database still carries what the last one applied.
        _ => previous.and_then(|p| p.applied_version),
    };
    MigrationStatus {
        history: history.to_owned(),
        job_name: Some(job_name.to_owned()),
        applied_version,
        succeeded: *state == JobState::Succeeded,
    }
}

/// The new status. A condition keeps its `lastTransitionTime` while its status is unchanged.
pub fn build(
    previous: Option<&DlockStatus>,
    generation: Option<i64>,
    assessment: &Assessment,
    endpoints: BTreeMap<String, String>,
    migration: Option<MigrationStatus>,
    now: Timestamp,
) -> DlockStatus {
    let ready = assessment.phase == Phase::Ready;
    let degraded = assessment.phase == Phase::Degraded;
    let progressing = !ready && !degraded;
    let cond = |type_: &str, on: bool, reason: Reason| {
        let status = if on { "True" } else { "False" };
        let since = previous
            .and_then(|p| p.condition(type_))
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.as_str().into(),
            message: assessment.message.clone(),
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    let reason = assessment.reason;
    DlockStatus {
        observed_generation: generation,
        phase: assessment.phase,
        conditions: vec![
            cond(CONDITION_READY, ready, reason),
            cond(
                CONDITION_PROGRESSING,
                progressing,
                if progressing { reason } else { Reason::Idle },
            ),
            cond(
                CONDITION_DEGRADED,
                degraded,
                if degraded { reason } else { Reason::AsExpected },
            ),
        ],
        endpoints,
        migration,
        actions: previous.map(|p| p.actions.clone()).unwrap_or_default(),
        gate: previous.and_then(|p| p.gate.clone()),
        fencing: previous.and_then(|p| p.fencing.clone()),
        sequence: previous.and_then(|p| p.sequence.clone()),
        etcd: previous.and_then(|p| p.etcd.clone()),
        tls: previous.and_then(|p| p.tls.clone()),
        database: previous.and_then(|p| p.database.clone()),
        last_action: previous.and_then(|p| p.last_action.clone()),
        grants: previous.and_then(|p| p.grants.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(name: &str) -> DeploymentHealth {
        DeploymentHealth {
            name: name.into(),
            desired: 2,
            available: 2,
            updated: 2,
            observed: true,
        }
    }

    fn migrated() -> Observation {
        Observation {
            database_ready: true,
            migration: Some(JobState::Succeeded),
            deployments: vec![healthy("a")],
            expected_deployments: 1,
            ..Observation::default()
        }
    }

    #[test]
    fn verdicts_in_order_of_precedence() {
        assert_eq!(assess(&migrated()).phase, Phase::Ready);

        let mut o = migrated();
        o.deployments[0].available = 1;
        assert_eq!(assess(&o).reason, Reason::RollingOut);
        o.deployments[0].available = 2;
        o.deployments[0].observed = false;
        assert_eq!(assess(&o).reason, Reason::RollingOut);

        let mut o = migrated();
        o.deployments.clear();
        assert_eq!(
            assess(&o).reason,
            Reason::RollingOut,
            "an expected Deployment is missing"
        );

        let mut o = migrated();
        o.waiting = Some(Blocked::new(Reason::WaitingForLockService, "not yet"));
        assert_eq!(
            (assess(&o).phase, assess(&o).reason),
            (Phase::Pending, Reason::WaitingForLockService)
        );

        let mut o = migrated();
        o.migration = Some(JobState::Running);
        assert_eq!(assess(&o).phase, Phase::Migrating);
        o.migration = None;
        assert_eq!(assess(&o).phase, Phase::Migrating);

        o.database_ready = false;
        assert_eq!(assess(&o).reason, Reason::WaitingForDatabase);

        o.migration = Some(JobState::Failed("boom".into()));
        let a = assess(&o);
        assert_eq!((a.phase, a.reason), (Phase::Degraded, Reason::MigrationFailed));
        assert!(a.message.contains("boom") && a.is_warning());

        o.blocked = Some(Blocked::new(Reason::ExternalSecretMissing, "no secret"));
        assert_eq!(assess(&o).reason, Reason::ExternalSecretMissing);
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let migrating = assess(&Observation {
            database_ready: true,
            migration: Some(JobState::Running),
            ..Observation::default()
        });
        let first = build(None, Some(1), &migrating, BTreeMap::new(), None, t0);
        assert_eq!(first.phase, Phase::Migrating);
        let by_type = |s: &DlockStatus, t: &str| s.condition(t).unwrap().clone();
        assert_eq!(by_type(&first, "Progressing").status, "True");
        assert_eq!(by_type(&first, "Ready").status, "False");

        // Same verdict later: identical status, so nothing to write.
        let again = build(Some(&first), Some(1), &migrating, BTreeMap::new(), None, t1);
        assert_eq!(again, first);

        // Ready: Ready flips (new time), Degraded stays False (old time).
        let ready = build(
            Some(&first),
            Some(2),
            &assess(&migrated()),
            BTreeMap::new(),
            None,
            t1,
        );
        assert_eq!(by_type(&ready, "Ready").status, "True");
        assert_eq!(by_type(&ready, "Ready").last_transition_time, Time(t1));
        assert_eq!(by_type(&ready, "Degraded").last_transition_time, Time(t0));
        assert_eq!(by_type(&ready, "Ready").observed_generation, Some(2));
        assert_eq!(ready.observed_generation, Some(2));
    }

    #[test]
    fn applied_version_follows_the_job() {
        let first = migration_status(None, "lockdb", "job-a", &JobState::Succeeded, Some(2));
        assert_eq!((first.applied_version, first.succeeded), (Some(2), true));
        // Known for this Job: kept without reading again.
        let kept = migration_status(Some(&first), "lockdb", "job-a", &JobState::Succeeded, None);
        assert_eq!(kept.applied_version, Some(2));
        // A new Job running: the database still has what the last one applied.
        let running = migration_status(Some(&first), "lockdb", "job-b", &JobState::Running, None);
        assert_eq!((running.applied_version, running.succeeded), (Some(2), false));
        assert_eq!(running.job_name.as_deref(), Some("job-b"));
        let done = migration_status(Some(&running), "lockdb", "job-b", &JobState::Succeeded, Some(3));
        assert_eq!(done.applied_version, Some(3));
    }
}
