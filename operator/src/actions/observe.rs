//! What the action planning needs, read from the cluster: the requests, lock-server's view of the
//! key to revoke and its last jump of the sequence (through [`super::client`]), lock-server's pods,
//! the restore and check Jobs and their reports, the PaymentStacks that use this LockService.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::jobs::{CHECK_COMPONENT, JobRun, restore_job_name};
use super::{ActionInputs, Request, StackRef, client};
use crate::builders::postgres::{History, names};
use crate::builders::{LOCK_SERVER, Owner};
use crate::context::Context;
use crate::crd::actions::{
    ANNOTATION_RESTORE, ANNOTATION_REVOKE, ActionPhase, ActionStep, RestoreRequest, RevokeRequest, id_of,
    parse_restore, parse_revoke,
};
use crate::crd::{Backend, LockService, PaymentStack};
use crate::error::{Error, Result};
use crate::health::{DeploymentHealth, JobState};

/// The requests in the LockService's annotations.
pub fn requests(ls: &LockService) -> (Option<Request<RevokeRequest>>, Option<Request<RestoreRequest>>) {
    let ann = ls.annotations();
    let revoke = ann.get(ANNOTATION_REVOKE).map(|raw| match parse_revoke(raw) {
        Ok(r) => Request::Valid(r),
        Err(error) => Request::Invalid {
            id: id_of(raw),
            error,
        },
    });
    let restore = ann.get(ANNOTATION_RESTORE).map(|raw| match parse_restore(raw) {
        Ok(r) => Request::Valid(r),
        Err(error) => Request::Invalid {
            id: id_of(raw),
            error,
        },
    });
    (revoke, restore)
}

/// Reads what the action planning needs; only what the current requests need.
pub async fn observe(
    ctx: &Context,
    ls: &LockService,
    owner: &Owner,
    lock_server_url: &str,
    stacks: &[PaymentStack],
) -> Result<ActionInputs> {
    let (revoke, restore) = requests(ls);
    let status = ls.status.as_ref();
    // etcd: the restore and the periodic check read and move lockdb's sequence; neither applies.
    let etcd = ls.spec.backend == Backend::Etcd;
    let mut inputs = ActionInputs {
        etcd_backend: etcd,
        actions: status.map(|s| s.actions.clone()).unwrap_or_default(),
        gate: status.and_then(|s| s.gate.clone()),
        fencing: status.and_then(|s| s.fencing.clone()),
        now: now(),
        now_secs: k8s_openapi::jiff::Timestamp::now().as_second(),
        check_interval_secs: ctx
            .settings
            .fencing_check_interval
            .filter(|_| !etcd)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
        ..ActionInputs::default()
    };
    let ns = &owner.namespace;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let deployment = deployments
        .get_opt(&owner.child(LOCK_SERVER))
        .await
        .map_err(|e| Error::step("observe lock-server Deployment", e))?;
    let mut serving = false;
    if let Some(d) = &deployment {
        let health = DeploymentHealth::of(d);
        inputs.lock_server_available = health.desired > 0 && health.is_available();
        inputs.lock_server_replicas = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        serving = health.available > 0;
    }
    // lock-server's last jump of the sequence (backend postgres: etcd's revision never jumps). Only
    // shown: without an answer the status keeps what it had and the reconcile goes on.
    inputs.sequence = status.and_then(|s| s.sequence.clone());
    if !etcd && serving {
        let read = match ctx.http_for(ns, lock_server_url).await {
            Ok(http) => client::read_sequence(&http, lock_server_url).await,
            Err(e) => Err(e),
        };
        match read {
            Ok(view) => inputs.sequence_read = Some(view),
            Err(e) => {
                tracing::debug!(event = "sequence_not_read", namespace = %ns, name = %owner.name, error = %e, "lock-server did not answer GET /v1/sequence; status.sequence is kept");
            }
        }
    }
    let active = |id: &str| {
        inputs
            .actions
            .iter()
            .find(|a| a.id == id)
            .is_none_or(|a| !a.phase.is_final())
    };

    if let Some(Request::Valid(r)) = &revoke {
        let recorded = inputs.actions.iter().find(|a| a.id == r.id);
        let needs_lock = recorded.is_none_or(|a| a.phase == ActionPhase::Pending);
        if needs_lock && inputs.lock_server_available {
            inputs.lock = Some(client::get_lock(ctx, owner, lock_server_url, &r.key).await?);
        }
    }

    // The restore whose pods and Jobs to observe: the one the planning runs (a requested one while
    // it is not finished, else the one the operator started itself after a promotion).
    let observed = {
        let mut probe = inputs.clone();
        probe.restore = restore.clone();
        super::sequence::auto_restore(&probe)
            .map(Request::Valid)
            .or_else(|| restore.clone())
    };
    let restore_active = !etcd && matches!(&observed, Some(Request::Valid(r)) if active(&r.id));
    if restore_active || inputs.check_interval_secs.is_some() {
        inputs.stacks = stacks_of(ctx, stacks, owner).await?;
    }
    if inputs.check_interval_secs.is_some() {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
        let selector = owner.component_selector(CHECK_COMPONENT);
        let list = jobs
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::step("observe fencing check Jobs", e))?;
        if let Some(name) = list.items.iter().filter_map(|j| j.metadata.name.clone()).max() {
            let run = job_run(ctx, ns, &name).await?;
            inputs.check_job = Some((name, run));
        }
    }
    if let Some(Request::Valid(r)) = &observed
        && restore_active
    {
        let step = inputs.actions.iter().find(|a| a.id == r.id).and_then(|a| a.step);
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let selector = selector(&owner.selector(LOCK_SERVER));
        inputs.lock_server_pods = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::step("observe lock-server pods", e))?
            .items
            .len();
        if step == Some(ActionStep::ReadHighWater) {
            inputs.read_job = job_run(ctx, ns, &restore_job_name(owner, &r.id, "read")).await?;
        }
        if step == Some(ActionStep::Advance) {
            inputs.advance_job = job_run(ctx, ns, &restore_job_name(owner, &r.id, "advance")).await?;
        }
    }
    inputs.revoke = revoke;
    inputs.restore = restore;
    Ok(inputs)
}

fn selector(labels: &std::collections::BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Every PaymentStack in the namespace that references this LockService, sorted by name: listed
/// once per reconcile, for the actions, the grant keys and the lock clients alike.
pub async fn stacks_using(ctx: &Context, ls: &LockService, owner: &Owner) -> Result<Vec<PaymentStack>> {
    let api: Api<PaymentStack> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let mut stacks: Vec<PaymentStack> = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::step("list PaymentStacks", e))?
        .items
        .into_iter()
        .filter(|ps| ps.spec.lock_service_ref.name == ls.name_any())
        .collect();
    stacks.sort_by_key(ResourceExt::name_any);
    Ok(stacks)
}

/// What a restore and the periodic check need of each stack in `stacks`.
async fn stacks_of(ctx: &Context, stacks: &[PaymentStack], owner: &Owner) -> Result<Vec<StackRef>> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let mut out = Vec::new();
    for ps in stacks {
        let stack_owner = Owner {
            name: ps.name_any(),
            ..owner.clone()
        };
        let conn = names(&stack_owner, History::Paydb).connection_secret;
        let connection_ready = secrets
            .get_opt(&conn)
            .await
            .map_err(|e| Error::step("read a paydb connection Secret", e))?
            .is_some();
        let migrated = ps
            .status
            .as_ref()
            .and_then(|s| s.migration.as_ref())
            .is_some_and(|m| m.succeeded);
        out.push(StackRef {
            name: ps.name_any(),
            connection_ready,
            migrated,
        });
    }
    Ok(out)
}

/// A Job and, once it ended, its container's termination message (the report).
pub async fn job_run(ctx: &Context, ns: &str, name: &str) -> Result<JobRun> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let job = jobs
        .get_opt(name)
        .await
        .map_err(|e| Error::step("observe a restore Job", e))?;
    let state = JobState::of(job.as_ref());
    let report = match state {
        JobState::Succeeded | JobState::Failed(_) => termination_message(ctx, ns, name).await?,
        _ => None,
    };
    Ok(match state {
        JobState::Absent => JobRun::Absent,
        JobState::Running => JobRun::Running,
        JobState::Succeeded => JobRun::Succeeded(report),
        JobState::Failed(msg) => JobRun::Failed(report.or(Some(msg))),
    })
}

async fn termination_message(ctx: &Context, ns: &str, job: &str) -> Result<Option<String>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .map_err(|e| Error::step("read a restore Job's pod", e))?;
    Ok(list.items.iter().rev().find_map(|p| {
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
            .filter(|m| !m.trim().is_empty())
    }))
}
