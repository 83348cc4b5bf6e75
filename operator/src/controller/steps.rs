//! The steps both kinds share: resolve the store and observe its migration Job ([`prepare`]),
//! create the Secrets, apply the desired children and delete the rest ([`apply_children`]), then
//! write the status built from what was applied and explain what changed with Events ([`finish`]).

use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde::de::DeserializeOwned;

use super::apply::{self, Applied as AppliedChild};
use super::schema;
use super::store::{self, DatabaseState};
use super::verdict::{self, Assessment, Blocked, EtcdHealth, KindOutcome, Reconciliation, Stopped};
use crate::builders::postgres::{self, History};
use crate::builders::{ChildKind, Desired, Owner, SpecError};
use crate::context::Context;
use crate::crd::{DatabaseSpec, EtcdSpec};
use crate::crd::{DlockStatus, Phase};
use crate::error::{Result, at};
use crate::health::{DeploymentHealth, JobState};
use crate::metrics;
use crate::reasons::Reason;

/// How often a healthy object is looked at again even without any watch event.
const REQUEUE_READY: Duration = Duration::from_secs(300);
/// How often an object that is still converging is looked at again.
const REQUEUE_PROGRESSING: Duration = Duration::from_secs(15);
/// How often an object blocked on a human (bad Secret, failed migration) is looked at again.
const REQUEUE_BLOCKED: Duration = Duration::from_secs(60);

/// A Secret the operator creates once and never rewrites (generated credentials), and the Event
/// note that says so.
#[derive(Debug, Clone)]
pub struct CreateOnce {
    pub secret: Secret,
    pub step: &'static str,
    pub note: &'static str,
}

/// The outcome of the pure planning step.
#[derive(Debug, Clone)]
pub struct Plan<Next> {
    pub desired: Desired,
    /// Created before any child that reads them.
    pub secrets: Vec<CreateOnce>,
    /// Deployments the spec asks for once past the gates (for the Ready verdict).
    pub expected_deployments: usize,
    /// The kind's own next step (a LockService's actions, a PaymentStack's wait for its
    /// LockService).
    pub next: Next,
}

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
    /// Backend etcd: the cluster's health (`db.ready` is its quorum).
    pub etcd: Option<EtcdHealth>,
    pub job_name: String,
    pub job_state: JobState,
    /// `false` for etcd: no migration Job was looked at, and `job_state` is `Succeeded` so that
    /// nothing waits for one (no migration status is written either).
    pub schema: bool,
}

fn stopped(blocked: Blocked) -> Stopped {
    Stopped { blocked, etcd: None }
}

/// Step 1, the shared reads: resolve the store. A database: its credentials Secret, managed
/// StatefulSet or external URL, and the migration Job `migration_job` builds. etcd: its members'
/// readiness or the external Secret. `Ok(Err(_))`: what a human must fix.
pub async fn prepare(
    ctx: &Context,
    owner: &Owner,
    regarding: &ObjectReference,
    history: History,
    store: std::result::Result<Store<'_>, SpecError>,
    migration_job: impl FnOnce() -> std::result::Result<Job, SpecError>,
) -> Result<std::result::Result<Prepared, Stopped>> {
    let database_spec = match store {
        Ok(Store::Database(db)) => db,
        Ok(Store::Etcd(spec)) => {
            let state = match store::resolve_etcd(ctx, owner, spec).await? {
                Ok(state) => state,
                Err(blocked) => return Ok(Err(stopped(blocked))),
            };
            return Ok(Ok(Prepared {
                db: DatabaseState {
                    ready: state.health.has_quorum(),
                    secret_version: state.secret_version,
                    credentials_created: false,
                    cluster: None,
                },
                etcd: Some(state.health),
                job_name: String::new(),
                job_state: JobState::Succeeded,
                schema: false,
            }));
        }
        Err(e) => return Ok(Err(stopped(Blocked::new(e.reason(), e.to_string())))),
    };
    let db = match store::resolve_database(ctx, owner, history, database_spec).await? {
        Ok(db) => db,
        Err(blocked) => return Ok(Err(stopped(blocked))),
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
    let job = match migration_job() {
        Ok(job) => job,
        Err(e) => return Ok(Err(stopped(Blocked::new(e.reason(), e.to_string())))),
    };
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let job_state = schema::observe(&ctx.client, &owner.namespace, &job_name).await?;
    Ok(Ok(Prepared {
        db,
        etcd: None,
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
        schema::applied_version(&ctx.client, &owner.namespace, &prepared.job_name).await
    } else {
        None
    }
}

/// Step 3, the shared writes: the Secrets to create once (before the children that read them),
/// `plan.desired` in order, what it no longer asks for, stale migration Jobs. Returns the health
/// of the Deployments applied.
pub async fn apply_children<N>(
    ctx: &Context,
    owner: &Owner,
    regarding: &ObjectReference,
    history: History,
    plan: &Plan<N>,
    job_before: &JobState,
) -> Result<Vec<DeploymentHealth>> {
    for once in &plan.secrets {
        let (_, created) = apply::create_secret_once(&ctx.client, &owner.namespace, &once.secret)
            .await
            .map_err(at(once.step))?;
        if created {
            ctx.publish(
                regarding,
                EventType::Normal,
                Reason::CredentialsCreated,
                once.note.into(),
            )
            .await;
        }
    }
    act(ctx, owner, regarding, history, &plan.desired, job_before).await
}

/// Applies `desired` in order, deletes what it no longer asks for and stale migration Jobs.
/// Returns the health of the Deployments applied.
async fn act(
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
        if let AppliedChild::Deployment(d) = apply::apply_child(client, ns, child).await? {
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
        .map_err(at("list children for orphans"))?;
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
    let selector = owner.component_selector(&postgres::migration_component(history));
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

/// Step 4: writes the status built from `reconciliation` (only when it changed; the one status
/// write of a reconcile), publishes an Event when the verdict changed and the kind's Events, and
/// picks the requeue interval.
pub async fn finish<K>(
    ctx: &Context,
    obj: &K,
    previous: Option<&DlockStatus>,
    history: History,
    reconciliation: &Reconciliation<impl KindOutcome>,
) -> Result<Action>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let regarding = &obj.object_ref(&());
    let (new, assessment) = verdict::status_of(
        previous,
        obj.meta().generation,
        history,
        reconciliation,
        Timestamp::now(),
    );
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let name = obj.meta().name.clone().unwrap_or_default();
    if previous != Some(&new) {
        apply::patch_status::<K>(&ctx.client, &ns, &name, &new).await?;
    }
    announce(ctx, regarding, previous, &assessment, &ns, &name).await;
    if let Reconciliation::Applied(a) = reconciliation {
        let kind = if K::kind(&()) == metrics::LOCK_SERVICE {
            metrics::LOCK_SERVICE
        } else {
            metrics::PAYMENT_STACK
        };
        ctx.metrics.workloads_observed(
            &(kind, ns.clone(), name.clone()),
            &a.deployments,
            a.migration.as_ref().map(|m| &m.state),
        );
    }
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
    // Each change of the database's primary (CloudNativePG), and each change in how many of its
    // instances are ready, as it happens.
    if let Some(d) = new.database.as_ref() {
        let before = previous.and_then(|p| p.database.as_ref());
        if let Some(change) = d
            .last_primary_change
            .as_ref()
            // A new change, not the timeline filled in on one already told.
            .filter(|c| {
                before
                    .and_then(|b| b.last_primary_change.as_ref())
                    .is_none_or(|b| (&b.from, &b.to, &b.seen_at) != (&c.from, &c.to, &c.seen_at))
            })
        {
            let (reason, type_) = if change.kind == "Switchover" {
                (Reason::DatabaseSwitchover, EventType::Normal)
            } else {
                (Reason::DatabaseFailover, EventType::Warning)
            };
            let timeline = change
                .timeline
                .map(|t| format!(", on timeline {t}"))
                .unwrap_or_default();
            tracing::warn!(event = "database_primary_changed", namespace = %ns, name = %name, kind = %change.kind, from = %change.from, to = %change.to, timeline = ?change.timeline);
            // lockdb's new history makes lock-server jump; paydb's only moves the connections.
            let then = if regarding.kind.as_deref() == Some("LockService") {
                "lock-server jumps its token sequence on the new timeline"
            } else {
                "the services reconnect to it through the -rw Service"
            };
            ctx.publish(
                regarding,
                type_,
                reason,
                format!(
                    "{}: {} is the primary of {} in place of {}{timeline}; {then}",
                    change.kind, change.to, d.cluster, change.from
                ),
            )
            .await;
        }
        if before.map(|b| &b.ready) != Some(&d.ready) {
            tracing::info!(event = "database_instances_ready", namespace = %ns, name = %name, ready = %d.ready);
            ctx.publish(
                regarding,
                EventType::Normal,
                Reason::DatabaseInstancesReady,
                format!(
                    "database instances ready: {} (synchronous: {})",
                    d.ready, d.synchronous
                ),
            )
            .await;
        }
    }
    let after = match assessment.phase {
        Phase::Ready => REQUEUE_READY,
        Phase::Degraded => REQUEUE_BLOCKED,
        Phase::Pending | Phase::Migrating => REQUEUE_PROGRESSING,
    };
    // A rotation of the namespace's CA waits on other objects (their Deployments, their status),
    // whose changes do not wake this one: look again soon until it is over.
    let rotating = matches!(reconciliation, Reconciliation::Applied(a)
        if a.tls.as_ref().is_some_and(|t| t.ca_rotation.is_some()));
    let after = if rotating {
        after.min(REQUEUE_PROGRESSING)
    } else {
        after
    };
    let Some(kind) = reconciliation.kind() else {
        return Ok(Action::requeue(after));
    };
    for e in kind.events() {
        let type_ = if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.publish(regarding, type_, e.reason, e.note.clone()).await;
    }
    Ok(Action::requeue(kind.requeue(after)))
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
