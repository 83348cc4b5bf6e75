//! The LockService reconciler: lockdb → migration Job → lock-server.

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::error::{Error, Result};
use super::status::{Blocked, Observation};
use super::{Context, database, migration, steps};
use crate::builders::Owner;
use crate::builders::lockservice::{self as plan, HISTORY, Inputs};
use crate::builders::migration::JobState;
use crate::crd::LockService;

pub async fn reconcile(ls: &LockService, ctx: &Context) -> Result<Action> {
    let owner = Owner::of(ls).ok_or(Error::MissingObjectKey)?;
    let regarding = ls.object_ref(&());
    let previous = ls.status.as_ref();
    let mut obs = Observation::default();

    let db = match database::resolve(ctx, &owner, HISTORY, &ls.spec.database).await? {
        Ok(db) => db,
        Err(blocked) => {
            obs.blocked = Some(blocked);
            return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None).await;
        }
    };
    if db.credentials_created {
        ctx.publish(
            &regarding,
            EventType::Normal,
            "CredentialsCreated",
            format!("generated the {} passwords into a Secret", HISTORY.name()),
        )
        .await;
    }
    obs.database_ready = db.ready;

    let job = match plan::migration_job(ls, &owner, &ctx.settings.default_image) {
        Ok(job) => job,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None).await;
        }
    };
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let job_state = migration::observe(&ctx.client, &owner.namespace, &job_name).await?;

    let inputs = Inputs {
        default_image: &ctx.settings.default_image,
        database_ready: db.ready,
        migration: &job_state,
        db_secret_version: db.secret_version.as_deref(),
    };
    let desired = match plan::desired(ls, &owner, &inputs) {
        Ok(d) => d,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None).await;
        }
    };
    obs.deployments = steps::act(ctx, &owner, &regarding, HISTORY, &desired, &job_state).await?;
    obs.expected_deployments = 1;
    obs.migration = Some(job_state.clone());

    let applied_version = if needs_version(previous, &job_name, &job_state) {
        migration::applied_version(&ctx.client, &owner.namespace, &job_name).await
    } else {
        None
    };
    steps::finish(
        ctx,
        ls,
        previous,
        &regarding,
        &obs,
        HISTORY,
        Some(&desired),
        applied_version,
    )
    .await
}

/// The applied version is read (from the Job's log) once per succeeded Job.
pub fn needs_version(previous: Option<&crate::crd::DlockStatus>, job_name: &str, state: &JobState) -> bool {
    *state == JobState::Succeeded
        && !previous.and_then(|p| p.migration.as_ref()).is_some_and(|m| {
            m.succeeded && m.job_name.as_deref() == Some(job_name) && m.applied_version.is_some()
        })
}
