//! The I/O around the LockService actions: observing what the pure planning in
//! [`crate::builders::actions`] needs (the requests, lock-server's view of a key, lock-server's
//! pods, the restore Jobs and their reports, the PaymentStacks that use this LockService), and the
//! one external write an action makes outside Kubernetes, the pinned revoke.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::Context;
use super::error::{Error, Result};
use super::status::DeploymentHealth;
use crate::builders::Owner;
use crate::builders::actions::{
    ActionInputs, JobRun, LockView, Request, RevokeAnswer, RevokeCall, StackRef, restore_job_name,
};
use crate::builders::database::{History, names};
use crate::builders::lockservice::{KEY_ADMIN_TOKEN, admin_secret_name};
use crate::builders::migration::JobState;
use crate::builders::workloads::LOCK_SERVER;
use crate::crd::actions::{
    ANNOTATION_RESTORE, ANNOTATION_REVOKE, ActionPhase, ActionStep, id_of, parse_restore, parse_revoke,
};
use crate::crd::{Backend, LockService, PaymentStack};

/// The requests in the LockService's annotations.
pub fn requests(
    ls: &LockService,
) -> (
    Option<Request<crate::crd::actions::RevokeRequest>>,
    Option<Request<crate::crd::actions::RestoreRequest>>,
) {
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
    if let Some(d) = &deployment {
        let health = DeploymentHealth::of(d);
        inputs.lock_server_available = health.desired > 0 && health.is_available();
        inputs.lock_server_replicas = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
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
            inputs.lock = Some(get_lock(ctx, lock_server_url, &r.key).await?);
        }
    }

    let restore_active = !etcd && matches!(&restore, Some(Request::Valid(r)) if active(&r.id));
    if restore_active || inputs.check_interval_secs.is_some() {
        inputs.stacks = stacks_of(ctx, ls, owner).await?;
    }
    if inputs.check_interval_secs.is_some() {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
        let selector = owner.component_selector(crate::builders::actions::CHECK_COMPONENT);
        let list = jobs
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::step("observe fencing check Jobs", e))?;
        if let Some(name) = list.items.iter().filter_map(|j| j.metadata.name.clone()).max() {
            let run = job_run(ctx, ns, &name).await?;
            inputs.check_job = Some((name, run));
        }
    }
    if let Some(Request::Valid(r)) = &restore
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

/// Every PaymentStack in the namespace that references this LockService, sorted by name.
pub async fn stacks_of(ctx: &Context, ls: &LockService, owner: &Owner) -> Result<Vec<StackRef>> {
    let api: Api<PaymentStack> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::step("list PaymentStacks", e))?;
    let mut out = Vec::new();
    for ps in list.items {
        if ps.spec.lock_service_ref.name != ls.name_any() {
            continue;
        }
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
    out.sort_by(|a, b| a.name.cmp(&b.name));
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

/// lock-server's admin token, from the Secret the operator generated.
async fn admin_token(ctx: &Context, owner: &Owner) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let name = admin_secret_name(owner);
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(|e| Error::step("read the lock-server admin Secret", e))?;
    secret
        .and_then(|s| s.data)
        .and_then(|d| d.get(KEY_ADMIN_TOKEN).cloned())
        .and_then(|v| String::from_utf8(v.0).ok())
        .filter(|t| !t.is_empty())
        .ok_or(Error::LockServer {
            step: "read the lock-server admin Secret",
            message: format!("Secret {name} has no key {KEY_ADMIN_TOKEN}"),
        })
}

fn lock_url(base: &str, segments: &[&str]) -> Result<url::Url> {
    let mut url = url::Url::parse(base).map_err(|e| Error::LockServer {
        step: "build the lock-server URL",
        message: e.to_string(),
    })?;
    url.path_segments_mut()
        .map_err(|()| Error::LockServer {
            step: "build the lock-server URL",
            message: format!("{base} cannot carry a path"),
        })?
        .extend(segments);
    Ok(url)
}

/// `GET /v1/locks/{key}`: the current holder and its fencing token.
pub async fn get_lock(ctx: &Context, base: &str, key: &str) -> Result<LockView> {
    const STEP: &str = "read the current grant (GET /v1/locks/{key})";
    let url = lock_url(base, &["v1", "locks", key])?;
    let resp = ctx.http.get(url).send().await.map_err(|e| Error::LockServer {
        step: STEP,
        message: e.to_string(),
    })?;
    decode(STEP, resp).await
}

/// The pinned revoke: removes the grant only if it still carries `call.token`.
pub async fn revoke(ctx: &Context, owner: &Owner, base: &str, call: &RevokeCall) -> Result<RevokeAnswer> {
    const STEP: &str = "revoke the recorded token (POST /v1/admin/locks/{key}/revoke)";
    let token = admin_token(ctx, owner).await?;
    let url = lock_url(base, &["v1", "admin", "locks", &call.key, "revoke"])?;
    let body = json!({
        "operator": call.requested_by,
        "reason": call.reason,
        "requestId": call.id,
        "fencingToken": call.token,
    });
    let resp = ctx
        .http
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .map_err(|e| Error::LockServer {
            step: STEP,
            message: e.to_string(),
        })?;
    decode(STEP, resp).await
}

async fn decode<T: serde::de::DeserializeOwned>(step: &'static str, resp: reqwest::Response) -> Result<T> {
    let status = resp.status();
    let text = resp.text().await.map_err(|e| Error::LockServer {
        step,
        message: e.to_string(),
    })?;
    if !status.is_success() {
        // lock-server's errors are {code, message}; never echo anything that could hold a secret.
        let short: String = text.chars().take(300).collect();
        return Err(Error::LockServer {
            step,
            message: format!("HTTP {status}: {short}"),
        });
    }
    serde_json::from_str(&text).map_err(|e| Error::LockServer {
        step,
        message: format!("unexpected answer: {e}"),
    })
}
