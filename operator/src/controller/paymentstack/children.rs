//! Desired children of a PaymentStack: paydb (managed) → migration Job (once the database is up) →
//! payment-resource, rail-proxy and payout-executor (once the Job has succeeded and the LockService
//! is Ready). The optional rail-stub needs neither and follows `spec.railStub.enabled` alone.

use crate::builders::deployments::{self, ExecutorLockClient, ExecutorTargets, VerifyingGrants};
use crate::builders::grant_keys;
use crate::builders::network_policies::Scraper;
use crate::builders::postgres::{self, History};
use crate::builders::{
    Child, Desired, Owner, SpecError, credentials, lock_clients, migration_job, network_policies,
};
use crate::builders::{PAYMENT_RESOURCE, PAYOUT_EXECUTOR, RAIL_PROXY, RAIL_STUB};
use crate::crd::{DatabaseMode, LeaseSpec, PaymentStack};
use crate::health::JobState;

pub const HISTORY: History = History::Paydb;

/// The opt-in synthetic seed in the dlock image (`migrations/paydb-seed`), applied by the migration
/// Job only when `spec.demoData` is true.
pub const DEMO_SEED_DIR: &str = "/migrations/paydb-seed";

/// What the stack needs from its LockService.
#[derive(Debug, Clone, PartialEq)]
pub struct LockServiceView {
    /// `Ready=True` and an endpoint published.
    pub ready: bool,
    pub endpoint: Option<String>,
    pub lease: LeaseSpec,
    /// The LockService's published grant public key set (its ConfigMap's `keys`); `None` until
    /// published — the resources wait for it like for the LockService itself.
    pub grant_keys: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Inputs<'a> {
    pub default_image: &'a str,
    pub database_ready: bool,
    pub migration: &'a JobState,
    pub db_secret_version: Option<&'a str>,
    /// `None` when the referenced LockService does not exist.
    pub lock_service: Option<&'a LockServiceView>,
    /// The Prometheus the NetworkPolicies admit to the metrics port.
    pub scraper: Option<&'a Scraper>,
}

fn image(spec_image: &Option<String>, default_image: &str) -> String {
    spec_image.clone().unwrap_or_else(|| default_image.to_owned())
}

pub fn migration_job(
    ps: &PaymentStack,
    owner: &Owner,
    default_image: &str,
) -> Result<k8s_openapi::api::batch::v1::Job, SpecError> {
    let external = match ps.spec.database.mode().ok_or(SpecError::DatabaseMode)? {
        DatabaseMode::Managed(_) => None,
        DatabaseMode::External(e) => e.owner_url_ref(),
    };
    let image = ps
        .spec
        .migration_image
        .clone()
        .unwrap_or_else(|| image(&ps.spec.payment_resource.image, default_image));
    let source = postgres::admin_url_source(owner, HISTORY, external);
    // The synthetic accounts only when the spec asks for demo data (C1 §1.8: harness only).
    let extra: &[&str] = if ps.spec.demo_data { &[DEMO_SEED_DIR] } else { &[] };
    Ok(migration_job::job(owner, HISTORY, &image, &source, extra))
}

/// The rail rail-proxy forwards to: the spec's URL, else the in-cluster stub.
pub fn rail_url(ps: &PaymentStack, owner: &Owner) -> Result<String, SpecError> {
    match (&ps.spec.rail_proxy.rail_url, ps.spec.rail_stub.enabled) {
        (Some(url), _) => Ok(url.clone()),
        (None, true) => Ok(owner.http_url(&owner.child(RAIL_STUB))),
        (None, false) => Err(SpecError::RailUrl),
    }
}

pub fn desired(ps: &PaymentStack, owner: &Owner, inputs: &Inputs<'_>) -> Result<Desired, SpecError> {
    let spec = &ps.spec;
    let mut out = Desired::default();
    match spec.database.mode().ok_or(SpecError::DatabaseMode)? {
        DatabaseMode::Managed(managed) => {
            out.apply
                .extend(crate::builders::database_children(owner, HISTORY, managed));
        }
        // External: a managed StatefulSet and Service left from before are orphans (the sweep).
        DatabaseMode::External(_) => {}
    }
    // Who may reach the payment services, from before their first pods start.
    out.apply
        .push(Child::NetworkPolicy(network_policies::payment_resource(
            owner,
            inputs.scraper,
        )));
    out.apply.push(Child::NetworkPolicy(network_policies::rail_proxy(
        owner,
        inputs.scraper,
    )));
    let rail_url = rail_url(ps, owner)?;

    let job = migration_job(ps, owner, inputs.default_image)?;
    out.migration_job = job.metadata.name.clone().unwrap_or_default();
    if inputs.database_ready {
        out.apply.push(Child::Job(job));
    }

    if spec.rail_stub.enabled {
        let w = deployments::rail_stub(
            image(&spec.rail_stub.image, inputs.default_image),
            spec.rail_stub.mode,
        );
        out.workload(owner, &w);
        out.apply.push(Child::NetworkPolicy(network_policies::rail_stub(
            owner,
            inputs.scraper,
        )));
        out.endpoints
            .insert("railStub".into(), owner.http_url(&owner.child(RAIL_STUB)));
    }
    // Disabled: its Deployment, Service and NetworkPolicy are orphans (the sweep).

    let lock_service = inputs
        .lock_service
        .filter(|ls| ls.ready)
        .and_then(|ls| Some((ls.endpoint.as_deref()?, &ls.lease, ls.grant_keys.as_deref()?)));
    // The schema gate, and the lock-service gate: held back (existing ones left as they are) until
    // the current Job has succeeded and the LockService is Ready with its grant keys published.
    if let (JobState::Succeeded, Some((lock_server_url, lease, keys))) = (inputs.migration, lock_service) {
        let credentials = credentials::credentials_secret_name(owner);
        let grants = VerifyingGrants {
            configmap: grant_keys::public_keys_name(&spec.lock_service_ref.name),
            checksum: grant_keys::checksum(keys),
            enabled: spec.kill_switches.grant_verification_enabled,
        };
        let payment_resource = deployments::payment_resource(
            owner,
            image(&spec.payment_resource.image, inputs.default_image),
            spec.payment_resource.replicas,
            spec.payment_resource.resources.clone(),
            &spec.kill_switches,
            inputs.db_secret_version,
        )
        .verifying(&grants);
        let rail_proxy = deployments::rail_proxy(
            owner,
            image(&spec.rail_proxy.image, inputs.default_image),
            spec.rail_proxy.replicas,
            spec.rail_proxy.resources.clone(),
            &rail_url,
            &spec.kill_switches,
            inputs.db_secret_version,
        )
        .verifying(&grants);
        let targets = ExecutorTargets {
            lock_service: spec.lock_service_ref.name.clone(),
            lock_server_url: lock_server_url.to_owned(),
            payment_resource_url: owner.http_url(&owner.child(PAYMENT_RESOURCE)),
            rail_proxy_url: owner.http_url(&owner.child(RAIL_PROXY)),
        };
        let executor = deployments::payout_executor(
            image(&spec.payout_executor.image, inputs.default_image),
            spec.payout_executor.replicas,
            spec.payout_executor.workers,
            spec.payout_executor.resources.clone(),
            &targets,
            lease,
            &credentials,
            &ExecutorLockClient {
                stack: owner.name.clone(),
                secret: lock_clients::client_secret_name(owner),
            },
        );
        out.workload(owner, &payment_resource);
        out.workload(owner, &rail_proxy);
        out.workload(owner, &executor);
        out.endpoints
            .insert("paymentResource".into(), targets.payment_resource_url);
        out.endpoints.insert("railProxy".into(), targets.rail_proxy_url);
        out.endpoints.insert("lockServer".into(), targets.lock_server_url);
    } else {
        for component in [PAYMENT_RESOURCE, RAIL_PROXY, PAYOUT_EXECUTOR] {
            out.hold_workload(owner, component);
        }
    }
    Ok(out.with_database_cas().restricted())
}
