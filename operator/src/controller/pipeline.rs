//! The one reconcile both kinds run, a short driver over steps that know no kind:
//!
//! 1. **observe** (reads only): the database and its migration Job, or a LockService's etcd cluster
//!    ([`steps::prepare`]), then what the kind itself needs ([`Reconciled::observe`]: a
//!    PaymentStack's LockService; a LockService's action requests, Jobs and the stacks that use it);
//! 2. **plan** (pure, no API calls): the children, the Secrets to create once and the kind's next
//!    step ([`Reconciled::plan`]);
//! 3. **apply** (the only writer): Secrets, children by server-side apply, orphans deleted by label
//!    ([`steps::apply_children`]), then the kind's own writes ([`Reconciled::apply`]: Job sweeps,
//!    the pinned revoke), which return the kind's [`KindOutcome`]; together an [`Applied`];
//! 4. **status** (pure, built from the [`Reconciliation`] alone, [`super::verdict::status_of`]) and
//!    its one write, then the Events that explain what this reconcile did ([`steps::finish`]).
//!
//! A step that needs a human (a bad Secret, a spec the CRD should have refused) ends the pipeline
//! as [`Reconciliation::Stopped`] with a `Degraded` status; an API failure ends it with an [`Error`]
//! naming the step.

use std::future::Future;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::Job;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde::de::DeserializeOwned;

use super::steps::{self, Plan, Prepared, Store};
use super::tls::{self, Served};
use super::verdict::{Applied, Blocked, KindOutcome, MigrationRun, Reconciliation, Stopped};
use crate::builders::postgres::History;
use crate::builders::{Owner, SpecError};
use crate::context::{Context, Settings};
use crate::crd::tls::{ANNOTATION_RENEW_CERTIFICATES, check_renew_request};
use crate::crd::{DlockStatus, TlsSpec};
use crate::error::{Error, Result};
use crate::health::DeploymentHealth;
use crate::reasons::Reason;

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
    /// What the kind's own writes did: its part of the verdict and of status.
    type Outcome: KindOutcome;

    /// The components whose APIs the kind's children serve (each gets a certificate with HTTPS).
    const SERVED: &'static [&'static str];

    fn status(&self) -> Option<&DlockStatus>;
    /// `spec.tls`.
    fn tls(&self) -> &TlsSpec;
    /// The store step 1 resolves (a spec error when the spec names none the controller can use).
    fn store(&self) -> std::result::Result<Store<'_>, SpecError>;
    /// The migration Job the current spec needs (pure).
    fn migration_job(&self, owner: &Owner, settings: &Settings) -> std::result::Result<Job, SpecError>;

    /// Step 1, the kind's reads.
    fn observe(
        &self,
        ctx: &Context,
        owner: &Owner,
        prepared: &Prepared,
    ) -> impl Future<Output = Result<Self::Observed>> + Send;

    /// Step 2, pure: from the spec and the observations to what should exist.
    fn plan(
        &self,
        settings: &Settings,
        owner: &Owner,
        prepared: &Prepared,
        observed: &Self::Observed,
    ) -> std::result::Result<Plan<Self::Next>, Blocked>;

    /// Step 3, the kind's own writes after the children.
    fn apply(
        &self,
        ctx: &Context,
        owner: &Owner,
        plan: &Plan<Self::Next>,
        deployments: &[DeploymentHealth],
    ) -> impl Future<Output = Result<Self::Outcome>> + Send;
}

/// A blocked planning step (an invalid spec) as the status says it.
pub fn invalid_spec(e: &SpecError) -> Blocked {
    Blocked::new(e.reason(), e.to_string())
}

/// The reconcile of both kinds.
pub async fn reconcile<K: Reconciled>(obj: &K, ctx: &Context) -> Result<Action> {
    let mut owner = Owner::of(obj).ok_or(Error::MissingObjectKey)?;
    owner.https = obj.tls().https();
    let reconciliation = run(obj, ctx, &owner).await?;
    steps::finish(ctx, obj, obj.status(), K::HISTORY, &reconciliation).await
}

/// Steps 1 to 3.
async fn run<K: Reconciled>(obj: &K, ctx: &Context, owner: &Owner) -> Result<Reconciliation<K::Outcome>> {
    let regarding = &obj.object_ref(&());

    // 1. Observe.
    let prepared = match steps::prepare(ctx, owner, regarding, K::HISTORY, obj.store(), || {
        obj.migration_job(owner, &ctx.settings)
    })
    .await?
    {
        Ok(prepared) => prepared,
        Err(stopped) => return Ok(Reconciliation::Stopped(stopped)),
    };
    let observed = obj.observe(ctx, owner, &prepared).await?;
    let all_served: Vec<Served> = K::SERVED.iter().map(|c| Served::of(owner, c)).collect();
    let mut tls_observed = tls::io::observe(ctx, owner, owner.https, &all_served).await?;
    tls_observed.renew_handled = obj
        .status()
        .and_then(|s| s.tls.as_ref())
        .and_then(|t| t.last_handled_renew_request.clone());
    if let Some(request) = obj
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_RENEW_CERTIFICATES))
    {
        match check_renew_request(request) {
            Ok(()) => tls_observed.renew_request = Some(request.clone()),
            // Refused whole: nothing is renewed, and the Event says why.
            Err(problem) => {
                ctx.publish(
                    regarding,
                    EventType::Warning,
                    Reason::RenewRequestInvalid,
                    format!("annotation {ANNOTATION_RENEW_CERTIFICATES} {problem}; nothing was renewed"),
                )
                .await;
            }
        }
    }

    // 2. Plan (pure): the kind's children, then HTTPS for the components they serve.
    let stop = |blocked| {
        Ok(Reconciliation::Stopped(Stopped {
            blocked,
            etcd: prepared.etcd.clone(),
        }))
    };
    let mut plan = match obj.plan(&ctx.settings, owner, &prepared, &observed) {
        Ok(p) => p,
        Err(blocked) => return stop(blocked),
    };
    let served: Vec<Served> = plan
        .desired
        .served_components()
        .into_iter()
        .filter(|c| K::SERVED.contains(c))
        .map(|c| Served::of(owner, c))
        .collect();
    let now = chrono::Utc::now().timestamp();
    let tls = tls::plan(&tls_observed, &served, &owner.namespace, now)
        .map_err(|e| Error::Certificate(e.to_string()))?;
    if let Some(broken) = &tls.broken {
        return stop(Blocked::new(Reason::TlsCaInvalid, broken.clone()));
    }
    plan.desired = std::mem::take(&mut plan.desired).with_tls(owner, &tls.wiring);

    // 3. Apply: certificates and Secrets first (the children read them), children and orphans, the
    // kind's writes.
    tls::io::write(ctx, owner, regarding, &tls).await?;
    let deployments =
        steps::apply_children(ctx, owner, regarding, K::HISTORY, &plan, &prepared.job_state).await?;
    let kind = obj.apply(ctx, owner, &plan, &deployments).await?;
    let read_version = steps::applied_version(ctx, owner, obj.status(), &prepared).await;
    Ok(Reconciliation::Applied(Applied {
        database_ready: prepared.db.ready,
        etcd: prepared.etcd.clone(),
        cluster: prepared.db.cluster.clone().map(Box::new),
        migration: prepared.schema.then(|| MigrationRun {
            job_name: plan.desired.migration_job.clone(),
            state: prepared.job_state.clone(),
            read_version,
        }),
        deployments,
        expected_deployments: plan.expected_deployments,
        endpoints: plan.desired.endpoints.clone(),
        tls: tls.status.map(Box::new),
        kind,
    }))
}
