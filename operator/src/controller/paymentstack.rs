//! The PaymentStack reconciler: paydb → migration Job → payment-resource, rail-proxy and
//! payout-executor, once the referenced LockService is Ready; plus the optional rail-stub.

use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::error::{Error, Result};
use super::status::{Blocked, Observation};
use super::{Context, apply, steps};
use crate::builders::paymentstack::{self as plan, HISTORY, Inputs, LockServiceView};
use crate::builders::{Owner, security};
use crate::crd::{LockService, PaymentStack};
use kube::runtime::events::EventType;

/// The three Deployments that wait for the schema and the LockService.
const GATED_DEPLOYMENTS: usize = 3;

pub async fn reconcile(ps: &PaymentStack, ctx: &Context) -> Result<Action> {
    let owner = Owner::of(ps).ok_or(Error::MissingObjectKey)?;
    let regarding = ps.object_ref(&());
    let previous = ps.status.as_ref();
    let mut obs = Observation::default();

    let lock_service = lock_service_view(ctx, &owner.namespace, &ps.spec.lock_service_ref.name).await?;
    obs.waiting = match &lock_service {
        None => Some(Blocked::new(
            "LockServiceNotFound",
            format!(
                "LockService {} does not exist in this namespace",
                ps.spec.lock_service_ref.name
            ),
        )),
        Some(v) if !v.ready || v.endpoint.is_none() => Some(Blocked::new(
            "WaitingForLockService",
            format!("LockService {} is not Ready yet", ps.spec.lock_service_ref.name),
        )),
        Some(_) => None,
    };

    let Some(prepared) = steps::prepare(
        ctx,
        &owner,
        &regarding,
        HISTORY,
        &ps.spec.database,
        &mut obs,
        || plan::migration_job(ps, &owner, &ctx.settings.default_image),
    )
    .await?
    else {
        return steps::finish(ctx, ps, previous, &regarding, &obs, HISTORY, None, None, None).await;
    };
    let inputs = Inputs {
        default_image: &ctx.settings.default_image,
        database_ready: prepared.db.ready,
        migration: &prepared.job_state,
        db_secret_version: prepared.db.secret_version.as_deref(),
        lock_service: lock_service.as_ref(),
    };
    let desired = match plan::desired(ps, &owner, &inputs) {
        Ok(d) => d,
        Err(e) => {
            obs.blocked = Some(Blocked::new(e.reason(), e.to_string()));
            return steps::finish(ctx, ps, previous, &regarding, &obs, HISTORY, None, None, None).await;
        }
    };
    // The payment credentials (created once, before any Deployment that reads them).
    let secret = security::credentials_secret(&owner);
    let (_, created) = apply::create_secret_once(&ctx.client, &owner.namespace, &secret)
        .await
        .map_err(|e| match e {
            Error::Kube(source) => Error::step("create the payment credentials Secret", source),
            other => other,
        })?;
    if created {
        ctx.publish(
            &regarding,
            EventType::Normal,
            "CredentialsCreated",
            "generated the payment services' bearer credentials into a Secret".into(),
        )
        .await;
    }
    obs.deployments = steps::act(ctx, &owner, &regarding, HISTORY, &desired, &prepared.job_state).await?;
    obs.expected_deployments = GATED_DEPLOYMENTS + usize::from(ps.spec.rail_stub.enabled);
    obs.migration = Some(prepared.job_state.clone());

    let applied_version = steps::applied_version(ctx, &owner, previous, &prepared).await;
    steps::finish(
        ctx,
        ps,
        previous,
        &regarding,
        &obs,
        HISTORY,
        Some(&desired),
        applied_version,
        None,
    )
    .await
}

async fn lock_service_view(ctx: &Context, namespace: &str, name: &str) -> Result<Option<LockServiceView>> {
    let api: Api<LockService> = Api::namespaced(ctx.client.clone(), namespace);
    Ok(api.get_opt(name).await?.map(|ls| {
        let status = ls.status.as_ref();
        LockServiceView {
            ready: status.is_some_and(|s| s.is_ready())
                && status.and_then(|s| s.observed_generation) == ls.metadata.generation,
            endpoint: status.and_then(|s| s.endpoints.get("lockServer").cloned()),
            lease: ls.spec.lease.clone(),
        }
    }))
}
