//! The one reconcile both kinds run, as a pipeline of small steps:
//!
//! 1. **observe** (reads only): the database and its migration Job, or a LockService's etcd cluster
//!    ([`steps::prepare`]), then what
//!    the kind itself needs ([`Reconciled::observe`]: a PaymentStack's LockService; a LockService's
//!    action requests, restore Jobs and the stacks that use it);
//! 2. **plan** (pure, no API calls): the children, the Secrets to create once and the kind's next
//!    action step ([`Reconciled::plan`]);
//! 3. **apply** (the only writer): Secrets, children by server-side apply, orphans deleted by label
//!    ([`steps::act`]), then the kind's own writes ([`Reconciled::apply`]: Job sweeps, the pinned
//!    revoke);
//! 4. **status** (pure, [`super::status`]) and one status write per reconcile ([`steps::finish`]),
//!    then the Events that explain what this reconcile did.
//!
//! A step that needs a human (a bad Secret, a spec the CRD should have refused) ends the pipeline
//! with a `Degraded` status; an API failure ends it with an [`Error`] naming the step.

use std::future::Future;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde::de::DeserializeOwned;

use super::error::{Error, Result};
use super::status::{Blocked, Observation};
use super::steps::{self, ActionsOutcome, Prepared, Store};
use super::{Context, Settings, apply};
use crate::builders::actions::ActionEvent;
use crate::builders::database::History;
use crate::builders::{Desired, Owner, SpecError};
use crate::crd::DlockStatus;
use crate::reasons::Reason;

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
    /// The kind's own next step (a LockService's actions); `()` for kinds without one.
    pub next: Next,
}

/// What one kind contributes to [`reconcile`]; everything else is shared.
pub trait Reconciled:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + DeserializeOwned
    + Clone
    + std::fmt::Debug
    + Send
    + Sync
{
    /// The migration history of the kind's database.
    const HISTORY: History;
    /// What [`Reconciled::observe`] read.
    type Observed: Send + Sync;
    /// The kind's own next step, planned purely.
    type Next: Send + Sync;

    fn status(&self) -> Option<&DlockStatus>;
    /// The store step 1 resolves (a spec error when the spec names none the controller can use).
    fn store(&self) -> std::result::Result<Store<'_>, SpecError>;
    /// The migration Job the current spec needs (pure).
    fn migration_job(&self, owner: &Owner, settings: &Settings) -> std::result::Result<Job, SpecError>;

    /// Step 1, the kind's reads. May record a dependency that is not there yet in `obs.waiting`.
    fn observe(
        &self,
        ctx: &Context,
        owner: &Owner,
        prepared: &Prepared,
        obs: &mut Observation,
    ) -> impl Future<Output = Result<Self::Observed>> + Send;

    /// Step 2, pure: from the spec and the observations to what should exist.
    fn plan(
        &self,
        settings: &Settings,
        owner: &Owner,
        prepared: &Prepared,
        observed: &Self::Observed,
    ) -> std::result::Result<Plan<Self::Next>, Blocked>;

    /// Step 3, the kind's own writes after the children. Returns the action part of the status and
    /// the Events of what was done; may record what blocks the object in `obs`.
    fn apply(
        &self,
        ctx: &Context,
        owner: &Owner,
        plan: &Plan<Self::Next>,
        obs: &mut Observation,
    ) -> impl Future<Output = Result<(Option<ActionsOutcome>, Vec<ActionEvent>)>> + Send;
}

/// A blocked planning step (an invalid spec) as the status says it.
pub fn invalid_spec(e: &SpecError) -> Blocked {
    Blocked::new(e.reason(), e.to_string())
}

/// Names the step of an API failure (the other errors name themselves).
pub fn at(step: &'static str) -> impl Fn(Error) -> Error {
    move |e| match e {
        Error::Kube(source) => Error::step(step, source),
        other => other,
    }
}

/// The reconcile of both kinds.
pub async fn reconcile<K: Reconciled>(obj: &K, ctx: &Context) -> Result<Action> {
    let owner = Owner::of(obj).ok_or(Error::MissingObjectKey)?;
    let regarding = &obj.object_ref(&());
    let previous = obj.status();
    let mut obs = Observation::default();
    let stop = |obs: Observation| async move {
        steps::finish(ctx, obj, previous, regarding, &obs, K::HISTORY, None, None, None).await
    };

    // 1. Observe.
    let Some(prepared) = steps::prepare(ctx, &owner, regarding, K::HISTORY, obj.store(), &mut obs, || {
        obj.migration_job(&owner, &ctx.settings)
    })
    .await?
    else {
        return stop(obs).await;
    };
    let observed = obj.observe(ctx, &owner, &prepared, &mut obs).await?;

    // 2. Plan (pure).
    let plan = match obj.plan(&ctx.settings, &owner, &prepared, &observed) {
        Ok(p) => p,
        Err(blocked) => {
            obs.blocked = Some(blocked);
            return stop(obs).await;
        }
    };

    // 3. Apply: Secrets first (the children read them), children and orphans, the kind's writes.
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
    obs.deployments = steps::act(
        ctx,
        &owner,
        regarding,
        K::HISTORY,
        &plan.desired,
        &prepared.job_state,
    )
    .await?;
    obs.expected_deployments = plan.expected_deployments;
    obs.migration = prepared.schema.then(|| prepared.job_state.clone());
    let (outcome, events) = obj.apply(ctx, &owner, &plan, &mut obs).await?;

    // 4. Status (pure) and its one write; then the Events of this reconcile.
    let applied_version = steps::applied_version(ctx, &owner, previous, &prepared).await;
    let action = steps::finish(
        ctx,
        obj,
        previous,
        regarding,
        &obs,
        K::HISTORY,
        Some(&plan.desired),
        applied_version,
        outcome.as_ref(),
    )
    .await?;
    for e in events {
        let type_ = if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.publish(regarding, type_, e.reason, e.note).await;
    }
    Ok(action)
}
