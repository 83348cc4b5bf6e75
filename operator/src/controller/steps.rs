//! The steps both reconcilers share: resolve the database and observe its migration Job ([`prepare`]),
//! apply the desired children and delete the rest ([`act`]), then write status and explain what
//! changed with Events ([`finish`]).

use crate::reasons::Reason;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde::de::DeserializeOwned;

use super::apply::{self, Applied};
use super::database::{self, DatabaseState};
use super::error::Result;
use super::etcd;
use super::migration;
use super::status::{self, Assessment, Blocked, DeploymentHealth, Observation};
use super::{Context, REQUEUE_BLOCKED, REQUEUE_PROGRESSING, REQUEUE_READY};
use crate::builders::database::History;
use crate::builders::migration::JobState;
use crate::builders::{ChildKind, Desired, Owner, SpecError};
use crate::crd::{DatabaseSpec, EtcdSpec};
use crate::crd::{DlockStatus, Phase};

/// What step 1 resolves: a database with a migrated schema, or (a LockService with backend etcd)
/// an etcd cluster, which has no schema.
#[derive(Debug, Clone, Copy)]
pub enum Store<'a> {
    Database(&'a DatabaseSpec),
    Etcd(&'a EtcdSpec),
}

/// The database and the state of its migration Job, once neither is blocked.
pub struct Prepared {
    pub db: DatabaseState,
    pub job_name: String,
    pub job_state: JobState,
    /// `false` for etcd: no migration Job was looked at, and `job_state` is `Succeeded` so that
    /// nothing waits for one (no migration status is written either).
    pub schema: bool,
}

/// Steps 1 and 2: resolve the store. A database: its credentials Secret, managed StatefulSet or
/// external URL, and the migration Job `migration_job` builds. etcd: its members' readiness or the
/// external Secret. `Ok(None)`: `obs.blocked` says what a human must fix, and the caller finishes
/// with it.
#[allow(clippy::too_many_arguments)]
pub async fn prepare(
    ctx: &Context,
    owner: &Owner,
    regarding: &ObjectReference,
    history: History,
    store: std::result::Result<Store<'_>, SpecError>,
    obs: &mut Observation,
    migration_job: impl FnOnce() -> std::result::Result<Job, SpecError>,
) -> Result<Option<Prepared>> {
    let database_spec = match store {
        Ok(Store::Database(db)) => db,
        Ok(Store::Etcd(spec)) => {
            let state = match etcd::resolve(ctx, owner, spec).await? {
                Ok(state) => state,
                Err(blocked) => {
                    obs.blocked = Some(blocked);
                    return Ok(None);
                }
            };
            obs.database_ready = state.health.has_quorum();
            obs.etcd = Some(state.health.clone());
            return Ok(Some(Prepared {
                db: DatabaseState {
                    ready: state.health.has_quorum(),
                    secret_version: state.secret_version,
                    credentials_created: false,
                },
                job_name: String::new(),
                job_state: JobState::Succeeded,
                schema: false,
            }));
        }
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return Ok(None);
        }
    };
    let db = match database::resolve(ctx, owner, history, database_spec).await? {
        Ok(db) => db,
        Err(blocked) => {
            obs.blocked = Some(blocked);
            return Ok(None);
        }
    };
    if db.credentials_created {
        ctx.publish(
            regarding,
            EventType::Normal,
            Reason::CredentialsCreated,
            format!("generated the {} passwords into a Secret", history.name()),
        )
        .await;
    }
    obs.database_ready = db.ready;
    let job = match migration_job() {
        Ok(job) => job,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return Ok(None);
        }
    };
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let job_state = migration::observe(&ctx.client, &owner.namespace, &job_name).await?;
    Ok(Some(Prepared {
        db,
        job_name,
        job_state,
        schema: true,
    }))
}

/// The applied schema version, read from the migration Job's log once per succeeded Job.
pub async fn applied_version(
    ctx: &Context,
    owner: &Owner,
    previous: Option<&DlockStatus>,
    prepared: &Prepared,
) -> Option<i64> {
    let already_read = previous.and_then(|p| p.migration.as_ref()).is_some_and(|m| {
        m.succeeded
            && m.job_name.as_deref() == Some(prepared.job_name.as_str())
            && m.applied_version.is_some()
    });
    if prepared.schema && prepared.job_state == JobState::Succeeded && !already_read {
        migration::applied_version(&ctx.client, &owner.namespace, &prepared.job_name).await
    } else {
        None
    }
}

/// Applies `desired` in order, deletes what it no longer asks for and stale migration Jobs.
/// Returns the health of the Deployments applied.
pub async fn act(
    ctx: &Context,
    owner: &Owner,
    regarding: &ObjectReference,
    history: History,
    desired: &Desired,
    job_before: &JobState,
) -> Result<Vec<DeploymentHealth>> {
    let client = &ctx.client;
    let ns = &owner.namespace;
    let mut deployments = Vec::new();
    for child in &desired.apply {
        if let Applied::Deployment(d) = apply::apply_child(client, ns, child).await? {
            deployments.push(DeploymentHealth::of(&d));
        }
        if child.kind() == ChildKind::Job && *job_before == JobState::Absent {
            tracing::info!(event = "migration_started", namespace = %ns, owner = %owner.name, job = child.name());
            ctx.publish(
                regarding,
                EventType::Normal,
                Reason::MigrationStarted,
                format!("created migration Job {} for {}", child.name(), history.name()),
            )
            .await;
        }
    }
    // Orphans by label: whatever of the owner's children the plan neither applies nor holds.
    let orphans = apply::orphans(client, owner, desired)
        .await
        .map_err(|e| match e {
            super::error::Error::Kube(source) => {
                super::error::Error::step("list children for orphans", source)
            }
            other => other,
        })?;
    for gone in &orphans {
        if apply::delete_child(client, ns, gone).await? {
            tracing::info!(event = "child_deleted", namespace = %ns, owner = %owner.name, kind = ?gone.kind, name = %gone.name);
            ctx.publish(
                regarding,
                EventType::Normal,
                Reason::ChildDeleted,
                format!(
                    "deleted {:?} {}: the spec no longer asks for it",
                    gone.kind, gone.name
                ),
            )
            .await;
        }
    }
    let selector = owner.component_selector(&history.migration_component());
    for job in apply::delete_stale_jobs(client, ns, &selector, &[desired.migration_job.as_str()]).await? {
        tracing::info!(event = "stale_migration_job_deleted", namespace = %ns, owner = %owner.name, job = %job);
        ctx.publish(
            regarding,
            EventType::Normal,
            Reason::StaleMigrationJobDeleted,
            format!(
                "deleted migration Job {job}: superseded by {}",
                desired.migration_job
            ),
        )
        .await;
    }
    Ok(deployments)
}

/// The action part of the status a LockService reconcile computed (None: keep what was there).
#[derive(Debug, Clone, Default)]
pub struct ActionsOutcome {
    pub actions: Vec<crate::crd::ActionStatus>,
    pub gate: Option<crate::crd::actions::GateStatus>,
    pub fencing: Option<crate::crd::actions::FencingStatus>,
    /// An action is in flight: look again soon.
    pub busy: bool,
    /// Look again at least this often (the fencing check interval).
    pub requeue_within: Option<std::time::Duration>,
}

/// How soon a reconcile with an action in flight runs again (status writes also trigger one).
const REQUEUE_ACTION: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes the status computed from `obs` (only when it changed; the one status write of a
/// reconcile), publishes an Event when the verdict changed, and picks the requeue interval.
#[allow(clippy::too_many_arguments)]
pub async fn finish<K>(
    ctx: &Context,
    obj: &K,
    previous: Option<&DlockStatus>,
    regarding: &ObjectReference,
    obs: &Observation,
    history: History,
    desired: Option<&Desired>,
    applied_version: Option<i64>,
    actions: Option<&ActionsOutcome>,
) -> Result<Action>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let assessment = status::assess(obs);
    let migration = match (desired, &obs.migration) {
        (Some(d), Some(state)) => Some(status::migration_status(
            previous.and_then(|p| p.migration.as_ref()),
            history.name(),
            &d.migration_job,
            state,
            applied_version,
        )),
        _ => previous.and_then(|p| p.migration.clone()),
    };
    let endpoints = desired
        .map(|d| d.endpoints.clone())
        .filter(|e| !e.is_empty())
        .or_else(|| previous.map(|p| p.endpoints.clone()))
        .unwrap_or_default();
    let mut new = status::build(
        previous,
        obj.meta().generation,
        &assessment,
        endpoints,
        migration,
        Timestamp::now(),
    );
    if let Some(etcd) = &obs.etcd {
        new.etcd = Some(etcd.status());
    }
    if let Some(a) = actions {
        new.actions = a.actions.clone();
        new.gate = a.gate.clone();
        new.fencing = a.fencing.clone().or(new.fencing);
        new.last_action = crate::builders::actions::last_action(&new.actions);
    }
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let name = obj.meta().name.clone().unwrap_or_default();
    if previous != Some(&new) {
        apply::patch_status::<K>(&ctx.client, &ns, &name, &new).await?;
    }
    announce(ctx, regarding, previous, &assessment, &ns, &name).await;
    // Each change in the managed etcd members' readiness, as it happens.
    if let Some(e) = new.etcd.as_ref().filter(|e| e.members.is_some())
        && previous.and_then(|p| p.etcd.as_ref()).map(|p| &p.ready) != Some(&e.ready)
    {
        tracing::info!(event = "etcd_members_ready", namespace = %ns, name = %name, ready = %e.ready);
        ctx.publish(
            regarding,
            EventType::Normal,
            Reason::EtcdMembersReady,
            format!("etcd members ready: {}", e.ready),
        )
        .await;
    }
    if actions.is_some_and(|a| a.busy) {
        return Ok(Action::requeue(REQUEUE_ACTION));
    }
    let after = match assessment.phase {
        Phase::Ready => REQUEUE_READY,
        Phase::Degraded => REQUEUE_BLOCKED,
        Phase::Pending | Phase::Migrating => REQUEUE_PROGRESSING,
    };
    let cap = actions.and_then(|a| a.requeue_within).unwrap_or(after);
    Ok(Action::requeue(after.min(cap)))
}

/// One Event (and log line) per change of verdict, not per reconcile.
async fn announce(
    ctx: &Context,
    regarding: &ObjectReference,
    previous: Option<&DlockStatus>,
    assessment: &Assessment,
    namespace: &str,
    name: &str,
) {
    let before = previous
        .and_then(|p| p.condition(crate::crd::status::CONDITION_READY))
        .map(|c| (c.reason.as_str(), c.message.as_str()));
    if before == Some((assessment.reason.as_str(), assessment.message.as_str())) {
        return;
    }
    let phase = assessment.phase.to_string();
    if assessment.is_warning() {
        tracing::warn!(event = "phase_changed", namespace, name, phase, reason = assessment.reason.as_str(), message = %assessment.message);
    } else {
        tracing::info!(event = "phase_changed", namespace, name, phase, reason = assessment.reason.as_str(), message = %assessment.message);
    }
    let type_ = if assessment.is_warning() {
        EventType::Warning
    } else {
        EventType::Normal
    };
    ctx.publish(regarding, type_, assessment.reason, assessment.message.clone())
        .await;
}
