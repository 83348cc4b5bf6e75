//! The LockService reconciler: lockdb → migration Job → lock-server.

use kube::Resource;
use kube::runtime::controller::Action;

use super::error::{Error, Result};
use super::status::{Blocked, Observation};
use super::{Context, steps};
use crate::builders::Owner;
use crate::builders::lockservice::{self as plan, HISTORY, Inputs};
use crate::crd::LockService;

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
        return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None).await;
    };
    let inputs = Inputs {
        default_image: &ctx.settings.default_image,
        database_ready: prepared.db.ready,
        migration: &prepared.job_state,
        db_secret_version: prepared.db.secret_version.as_deref(),
    };
    let desired = match plan::desired(ls, &owner, &inputs) {
        Ok(d) => d,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return steps::finish(ctx, ls, previous, &regarding, &obs, HISTORY, None, None).await;
        }
    };
    obs.deployments = steps::act(ctx, &owner, &regarding, HISTORY, &desired, &prepared.job_state).await?;
    obs.expected_deployments = 1;
    obs.migration = Some(prepared.job_state.clone());

    let applied_version = steps::applied_version(ctx, &owner, previous, &prepared).await;
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
