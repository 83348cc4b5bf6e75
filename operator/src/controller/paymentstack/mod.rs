//! The PaymentStack's part of the reconcile pipeline ([`super::pipeline`]): paydb → migration Job →
//! payment-resource, rail-proxy and payout-executor, once the referenced LockService is Ready
//! ([`children`], pure); the optional rail-stub; the payment credentials Secret; the
//! NetworkPolicies. The kind's outcome is [`LockServiceWait`].

pub mod children;

use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;

use super::pipeline::{Reconciled, invalid_spec};
use super::steps::{CreateOnce, Plan, Prepared, Store};
use super::verdict::{Blocked, KindOutcome, KindVerdict};
use crate::builders::postgres::History;
use crate::builders::{Owner, SpecError, credentials};
use crate::context::{Context, Settings};
use crate::crd::{DlockStatus, LockService, PaymentStack};
use crate::error::{Result, at};
use crate::reasons::Reason;
use children::{HISTORY, Inputs, LockServiceView};

/// The three Deployments that wait for the schema and the LockService.
const GATED_DEPLOYMENTS: usize = 3;

/// What the stack waits for: its LockService, while it is missing or not Ready.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockServiceWait(pub Option<Blocked>);

impl KindOutcome for LockServiceWait {
    fn verdict(&self) -> KindVerdict {
        KindVerdict {
            waiting: self.0.clone(),
            ..KindVerdict::default()
        }
    }
}

impl Reconciled for PaymentStack {
    const HISTORY: History = HISTORY;
    /// The referenced LockService (`None`: it does not exist).
    type Observed = Option<LockServiceView>;
    type Next = LockServiceWait;
    type Outcome = LockServiceWait;

    fn status(&self) -> Option<&DlockStatus> {
        self.status.as_ref()
    }

    fn store(&self) -> std::result::Result<Store<'_>, SpecError> {
        Ok(Store::Database(&self.spec.database))
    }

    fn migration_job(&self, owner: &Owner, settings: &Settings) -> std::result::Result<Job, SpecError> {
        children::migration_job(self, owner, &settings.default_image)
    }

    async fn observe(
        &self,
        ctx: &Context,
        owner: &Owner,
        _prepared: &Prepared,
    ) -> Result<Option<LockServiceView>> {
        lock_service_view(ctx, &owner.namespace, &self.spec.lock_service_ref.name).await
    }

    fn plan(
        &self,
        settings: &Settings,
        owner: &Owner,
        prepared: &Prepared,
        observed: &Option<LockServiceView>,
    ) -> std::result::Result<Plan<LockServiceWait>, Blocked> {
        let name = &self.spec.lock_service_ref.name;
        let wait = match observed {
            None => Some(Blocked::new(
                Reason::LockServiceNotFound,
                format!("LockService {name} does not exist in this namespace"),
            )),
            Some(v) if !v.ready || v.endpoint.is_none() => Some(Blocked::new(
                Reason::WaitingForLockService,
                format!("LockService {name} is not Ready yet"),
            )),
            Some(_) => None,
        };
        let inputs = Inputs {
            default_image: &settings.default_image,
            database_ready: prepared.db.ready,
            migration: &prepared.job_state,
            db_secret_version: prepared.db.secret_version.as_deref(),
            lock_service: observed.as_ref(),
            scraper: settings.scraper.as_ref(),
        };
        let desired = children::desired(self, owner, &inputs).map_err(|e| invalid_spec(&e))?;
        Ok(Plan {
            desired,
            secrets: vec![CreateOnce {
                secret: credentials::credentials_secret(owner),
                step: "create the payment credentials Secret",
                note: "generated the payment services' bearer credentials into a Secret",
            }],
            expected_deployments: GATED_DEPLOYMENTS + usize::from(self.spec.rail_stub.enabled),
            next: LockServiceWait(wait),
        })
    }

    /// Nothing beyond the children.
    async fn apply(
        &self,
        _ctx: &Context,
        _owner: &Owner,
        plan: &Plan<LockServiceWait>,
    ) -> Result<LockServiceWait> {
        Ok(plan.next.clone())
    }
}

async fn lock_service_view(ctx: &Context, namespace: &str, name: &str) -> Result<Option<LockServiceView>> {
    let api: Api<LockService> = Api::namespaced(ctx.client.clone(), namespace);
    let ls = api
        .get_opt(name)
        .await
        .map_err(|e| at("observe the referenced LockService")(e.into()))?;
    Ok(ls.map(|ls| {
        let status = ls.status.as_ref();
        LockServiceView {
            ready: status.is_some_and(|s| s.is_ready())
                && status.and_then(|s| s.observed_generation) == ls.metadata.generation,
            endpoint: status.and_then(|s| s.endpoints.get("lockServer").cloned()),
            lease: ls.spec.lease.clone(),
        }
    }))
}
