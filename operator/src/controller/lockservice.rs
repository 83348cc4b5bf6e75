//! The LockService reconciler: lockdb → migration Job → lock-server, and the actions (force-revoke,
//! restore fast-forward) requested in its annotations.
//!
//! observe (database, migration Job, the actions' inputs) → plan (pure: children, the admin Secret,
//! the next action step) → apply (the only writer: children, orphaned Jobs by label, the pinned
//! revoke) → status (pure) → one status write.

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::error::{Error, Result};
use super::status::{Blocked, Observation};
use super::steps::ActionsOutcome;
use super::{Context, actions, apply, steps};
use crate::builders::actions::{self as action_plan, CHECK_COMPONENT, RESTORE_COMPONENT, RestoreJobs};
use crate::builders::lockservice::{self as plan, HISTORY, Inputs};
use crate::builders::workloads::LOCK_SERVER;
use crate::builders::{Child, Owner};
use crate::crd::LockService;
use crate::crd::actions::ActionPhase;

fn step_error(step: &'static str, e: Error) -> Error {
    match e {
        Error::Kube(source) => Error::step(step, source),
        other => other,
    }
}

pub async fn reconcile(ls: &LockService, ctx: &Context) -> Result<Action> {
    let owner = Owner::of(ls).ok_or(Error::MissingObjectKey)?;
    let regarding = ls.object_ref(&());
    let previous = ls.status.as_ref();
    let mut obs = Observation::default();

    let Some(prepared) = steps::prepare(
        ctx,
        &owner,
        &regarding,
        HISTORY,
        &ls.spec.database,
        &mut obs,
        || plan::migration_job(ls, &owner, &ctx.settings.default_image),
    )
    .await?
    else {
        return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None, None).await;
    };

    // Observe what the actions need, then plan their next step (pure).
    let lock_server_url = owner.http_url(&owner.child(LOCK_SERVER));
    let mut action_inputs = actions::observe(ctx, ls, &owner, &lock_server_url).await?;
    action_inputs.schema_ready = prepared.job_state == crate::builders::migration::JobState::Succeeded;
    let image = ls
        .spec
        .migration_image
        .clone()
        .unwrap_or_else(|| plan::lock_server_image(ls, &ctx.settings.default_image));
    let lockdb_admin_url = match plan::lockdb_admin_url(ls, &owner) {
        Ok(u) => u,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None, None).await;
        }
    };
    let restore_jobs = RestoreJobs {
        owner: &owner,
        image: &image,
        lockdb_admin_url: &lockdb_admin_url,
    };
    let next = action_plan::plan(&action_inputs, &restore_jobs);

    let inputs = Inputs {
        default_image: &ctx.settings.default_image,
        database_ready: prepared.db.ready,
        migration: &prepared.job_state,
        db_secret_version: prepared.db.secret_version.as_deref(),
        gated: next.gated(),
    };
    let mut desired = match plan::desired(ls, &owner, &inputs) {
        Ok(d) => d,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None, None).await;
        }
    };
    desired.apply.extend(next.jobs.iter().cloned().map(Child::Job));
    desired
        .apply
        .extend(next.check_job.iter().cloned().map(Child::Job));

    // Apply: the admin token Secret (created once), the children, orphaned restore Jobs (by label).
    let (_, created) = apply::create_secret_once(&ctx.client, &owner.namespace, &plan::admin_secret(&owner))
        .await
        .map_err(|e| step_error("create the lock-server admin Secret", e))?;
    if created {
        ctx.publish(
            &regarding,
            EventType::Normal,
            "CredentialsCreated",
            "generated lock-server's admin token into a Secret".into(),
        )
        .await;
    }
    obs.deployments = steps::act(ctx, &owner, &regarding, HISTORY, &desired, &prepared.job_state).await?;
    obs.expected_deployments = 1;
    obs.migration = Some(prepared.job_state.clone());
    let keep: Vec<&str> = next
        .jobs
        .iter()
        .filter_map(|j| j.metadata.name.as_deref())
        .chain(next.keep_jobs.iter().map(String::as_str))
        .collect();
    apply::delete_stale_jobs(
        &ctx.client,
        &owner.namespace,
        &owner.component_selector(RESTORE_COMPONENT),
        &keep,
    )
    .await
    .map_err(|e| step_error("delete finished restore Jobs", e))?;
    let keep_check: Vec<&str> = next
        .check_job
        .iter()
        .filter_map(|j| j.metadata.name.as_deref())
        .chain(next.keep_check.as_deref())
        .collect();
    apply::delete_stale_jobs(
        &ctx.client,
        &owner.namespace,
        &owner.component_selector(CHECK_COMPONENT),
        &keep_check,
    )
    .await
    .map_err(|e| step_error("delete finished fencing check Jobs", e))?;

    // The one write outside Kubernetes: the revoke of the token recorded in status.
    let mut outcome = ActionsOutcome {
        actions: next.actions.clone(),
        gate: next.gate.clone(),
        fencing: next.fencing.clone(),
        busy: next.busy,
        // Look again in time for the next fencing check.
        requeue_within: ctx.settings.fencing_check_interval,
    };
    let mut events = next.events.clone();
    if let Some(call) = &next.revoke {
        let answer = actions::revoke(ctx, &owner, &lock_server_url, call).await?;
        if let Some(running) = outcome.actions.iter_mut().find(|a| a.id == call.id) {
            let (done, event) = action_plan::revoke_outcome(running, &answer, &actions::now());
            tracing::info!(event = "action_finished", id = %call.id, key = %call.key, token = call.token, outcome = %answer.outcome);
            *running = done;
            events.push(event);
        }
    }

    // Status: a sequence found behind the resources' high-water needs a restore fast-forward.
    let behind = outcome
        .fencing
        .as_ref()
        .filter(|f| f.is_behind() && outcome.gate.is_none());
    ctx.metrics
        .fencing_observed(&owner.namespace, &owner.name, outcome.fencing.as_ref());
    if let Some(f) = behind {
        obs.blocked = Some(Blocked::new(
            "FencingSequenceBehind",
            action_plan::behind_message(f),
        ));
    }
    // A failed restore keeps the gate closed and needs a human.
    if let Some(gate) = &outcome.gate {
        let failed = outcome
            .actions
            .iter()
            .find(|a| a.id == gate.action_id)
            .filter(|a| a.phase == ActionPhase::Failed);
        obs.gated = Some(Blocked::new("LockTrafficGated", gate.message.clone()));
        if let Some(f) = failed {
            obs.blocked = Some(Blocked::new(
                "RestoreFailed",
                format!(
                    "lock traffic stays gated: restore {} failed: {}",
                    f.id,
                    f.message.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    let applied_version = steps::applied_version(ctx, &owner, previous, &prepared).await;
    let action = steps::finish(
        ctx,
        ls,
        previous,
        &regarding,
        &obs,
        HISTORY,
        Some(&desired),
        applied_version,
        Some(&outcome),
    )
    .await?;
    for e in events {
        let type_ = if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.publish(&regarding, type_, e.reason.as_str(), e.note).await;
    }
    Ok(action)
}
