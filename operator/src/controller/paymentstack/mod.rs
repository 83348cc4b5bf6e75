//! The PaymentStack's part of the reconcile pipeline ([`super::pipeline`]): paydb → migration Job →
//! payment-resource, rail-proxy and payout-executor, once the referenced LockService is Ready
//! ([`children`], pure); the optional rail-stub; the payment credentials Secret; the
//! NetworkPolicies. The kind's outcome is [`StackOutcome`]: the wait for the LockService, and the
//! grant keys the stack's resources are rolled out with (what lets the LockService switch signers).

pub mod children;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use super::pipeline::{Reconciled, invalid_spec};
use super::steps::{CreateOnce, Plan, Prepared, Store};
use super::verdict::{Blocked, KindOutcome, KindVerdict};
use crate::builders::grant_keys::{self, Published};
use crate::builders::postgres::History;
use crate::builders::{Owner, PAYMENT_RESOURCE, RAIL_PROXY, RAIL_STUB, SpecError, credentials, lock_clients};
use crate::context::{Context, Settings};
use crate::crd::{DlockStatus, GrantStatus, LockService, PaymentStack, TlsSpec};
use crate::error::{Result, at};
use crate::health::DeploymentHealth;
use crate::reasons::Reason;
use children::{HISTORY, Inputs, LockServiceView};

/// The three Deployments that wait for the schema and the LockService.
const GATED_DEPLOYMENTS: usize = 3;

/// What the stack waits for: its LockService, while it is missing or not Ready.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockServiceWait(pub Option<Blocked>);

/// What the plan decided besides the children: the wait, and the grant key set the resources get.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StackNext {
    pub wait: LockServiceWait,
    pub grant_keys: Option<String>,
}

/// What a PaymentStack reconcile did: its wait, and what to say in `status.grants`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StackOutcome {
    pub wait: LockServiceWait,
    /// `None`: keep `status.grants` as it is (a roll in progress: the previous set still runs);
    /// `Some(x)`: write `x`.
    pub grants: Option<Option<GrantStatus>>,
}

impl KindOutcome for StackOutcome {
    fn verdict(&self) -> KindVerdict {
        KindVerdict {
            waiting: self.wait.0.clone(),
            ..KindVerdict::default()
        }
    }

    fn write_status(&self, status: &mut DlockStatus) {
        if let Some(grants) = &self.grants {
            status.grants = grants.clone();
        }
    }
}

/// The keys the stack's resources verify with, for `status.grants`: the published set once both
/// payment-resource and rail-proxy are rolled out with it (their templates carry its checksum, so
/// "available with every replica updated" means "running with this set"); nothing while verification
/// is off (such a stack holds no rotation back).
pub fn rolled_out_grants(
    ps: &PaymentStack,
    owner: &Owner,
    keys: Option<&str>,
    deployments: &[DeploymentHealth],
) -> Option<Option<GrantStatus>> {
    if !ps.spec.kill_switches.grant_verification_enabled {
        return Some(None);
    }
    let keys = keys?;
    let rolled_out = |component: &str| {
        deployments
            .iter()
            .any(|d| d.name == owner.child(component) && d.is_available())
    };
    if !(rolled_out(PAYMENT_RESOURCE) && rolled_out(RAIL_PROXY)) {
        return None;
    }
    let set = dlock_grant::PublicKeys::parse(keys).ok()?;
    Some(Some(GrantStatus {
        key_ids: set.ids().map(ToString::to_string).collect(),
        ..GrantStatus::default()
    }))
}

impl Reconciled for PaymentStack {
    const HISTORY: History = HISTORY;
    /// The referenced LockService (`None`: it does not exist).
    type Observed = Option<LockServiceView>;
    type Next = StackNext;
    type Outcome = StackOutcome;
    const SERVED: &'static [&'static str] = &[
        PAYMENT_RESOURCE,
        RAIL_PROXY,
        RAIL_STUB,
        crate::builders::tls::PAYDB,
    ];

    fn status(&self) -> Option<&DlockStatus> {
        self.status.as_ref()
    }

    fn tls(&self) -> &TlsSpec {
        &self.spec.tls
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
    ) -> std::result::Result<Plan<StackNext>, Blocked> {
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
            Some(v) if v.grant_keys.is_none() => Some(Blocked::new(
                Reason::WaitingForLockService,
                format!(
                    "LockService {name} has not published its grant public keys (ConfigMap {}) yet",
                    grant_keys::public_keys_name(name)
                ),
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
            secrets: vec![
                CreateOnce {
                    secret: credentials::credentials_secret(owner),
                    step: "create the payment credentials Secret",
                    note: "generated the payment services' bearer credentials into a Secret",
                },
                // Its LockService lists it in lock-server's clients file once it exists.
                CreateOnce {
                    secret: lock_clients::client_secret(owner),
                    step: "create the lock client Secret",
                    note: "generated the payout executors' lock client token into a Secret",
                },
            ],
            expected_deployments: GATED_DEPLOYMENTS + usize::from(self.spec.rail_stub.enabled),
            next: StackNext {
                wait: LockServiceWait(wait),
                grant_keys: observed.as_ref().and_then(|v| v.grant_keys.clone()),
            },
        })
    }

    /// Nothing beyond the children; reports the key set its resources are rolled out with.
    async fn apply(
        &self,
        _ctx: &Context,
        owner: &Owner,
        plan: &Plan<StackNext>,
        deployments: &[DeploymentHealth],
    ) -> Result<StackOutcome> {
        Ok(StackOutcome {
            wait: plan.next.wait.clone(),
            grants: rolled_out_grants(self, owner, plan.next.grant_keys.as_deref(), deployments),
        })
    }
}

async fn lock_service_view(ctx: &Context, namespace: &str, name: &str) -> Result<Option<LockServiceView>> {
    let api: Api<LockService> = Api::namespaced(ctx.client.clone(), namespace);
    let ls = api
        .get_opt(name)
        .await
        .map_err(|e| at("observe the referenced LockService")(e.into()))?;
    let Some(ls) = ls else { return Ok(None) };
    // The public keys only: the ConfigMap, never the LockService's signing-key Secret.
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let grant_keys = configmaps
        .get_opt(&grant_keys::public_keys_name(name))
        .await
        .map_err(|e| at("read the LockService's grant public keys")(e.into()))?
        .and_then(|cm| Published::of(&cm).ok())
        .filter(|p| !p.keys.is_empty())
        .map(|p| p.keys.to_text());
    let status = ls.status.as_ref();
    Ok(Some(LockServiceView {
        ready: status.is_some_and(|s| s.is_ready())
            && status.and_then(|s| s.observed_generation) == ls.metadata.generation,
        endpoint: status.and_then(|s| s.endpoints.get("lockServer").cloned()),
        lease: ls.spec.lease.clone(),
        grant_keys,
    }))
}
