//! Desired children of a LockService.
//!
//! - backend postgres: lockdb (managed) → migration Job (once the database is up) → lock-server
//!   (once the Job has succeeded);
//! - backend etcd: the etcd members (managed) → lock-server (once a quorum of them is ready, or at
//!   once for an external cluster). No lockdb, no migration Job: etcd has no schema.
//!
//! Either way lock-server also waits for its grant signing key (`Inputs::signing_key`): it starts
//! signing from its first grant.

use crate::builders::credentials::admin_secret_name;
use crate::builders::deployments::{self, LockServerStore, SigningGrants};
use crate::builders::grant_keys;
use crate::builders::lock_clients::{self, ClientsFile};
use crate::builders::network_policies::Scraper;
use crate::builders::postgres::{self, History};
use crate::builders::{AppliedSecret, Child, Desired, LOCK_SERVER, Owner, SpecError};
use crate::builders::{etcd_members, migration_job, network_policies};
use crate::crd::{DatabaseMode, DatabaseSpec, EtcdMode, EtcdSpec, LockService, LockStore};
use crate::health::JobState;

/// What the controller observed, and its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs<'a> {
    /// The operator's `--image`, for components whose spec names none.
    pub default_image: &'a str,
    /// Managed lockdb: the StatefulSet has a ready pod. Managed etcd: a quorum of members is ready.
    /// External: always true.
    pub database_ready: bool,
    /// The migration Job (backend postgres; unused with etcd).
    pub migration: &'a JobState,
    /// resourceVersion of the Secret lock-server reads at start-up (lockdb's connection Secret, or
    /// an external etcd's endpoints Secret): pods restart when it changes.
    pub db_secret_version: Option<&'a str>,
    /// A restore fast-forward gates lock traffic: lock-server is held at zero replicas.
    pub gated: bool,
    /// The grant key id lock-server signs with (`crate::builders::grant_keys::signer`); `None`
    /// until the first key is published, and lock-server is held until then.
    pub signing_key: Option<&'a str>,
    /// The Prometheus the NetworkPolicies admit to the metrics ports.
    pub scraper: Option<&'a Scraper>,
    /// lock-server's clients file (`crate::builders::lock_clients::clients_file`): always one, so
    /// that the lock API is never open to whoever reaches it.
    pub lock_clients: &'a ClientsFile,
}

/// lockdb's block (backend postgres only).
fn database(ls: &LockService) -> Result<&DatabaseSpec, SpecError> {
    match ls.spec.store().ok_or(SpecError::StoreMissing)? {
        LockStore::Postgres(db) => Ok(db),
        LockStore::Etcd(_) => Err(SpecError::StoreMissing),
    }
}

/// The lockdb owner-role URL (managed: the connection Secret's `admin-url`; external: the user's Secret).
pub fn lockdb_admin_url(ls: &LockService, owner: &Owner) -> Result<crate::crd::SecretKeyRef, SpecError> {
    let external = match database(ls)?.mode().ok_or(SpecError::DatabaseMode)? {
        DatabaseMode::Managed(_) => None,
        DatabaseMode::External(e) => e.owner_url_ref(),
    };
    Ok(postgres::admin_url_source(owner, HISTORY, external))
}

pub const HISTORY: History = History::Lockdb;

pub fn lock_server_image(ls: &LockService, default_image: &str) -> String {
    ls.spec
        .lock_server
        .image
        .clone()
        .unwrap_or_else(|| default_image.to_owned())
}

/// The migration Job for the current spec (also used to look the Job up before planning).
pub fn migration_job(
    ls: &LockService,
    owner: &Owner,
    default_image: &str,
) -> Result<k8s_openapi::api::batch::v1::Job, SpecError> {
    let external = match database(ls)?.mode().ok_or(SpecError::DatabaseMode)? {
        DatabaseMode::Managed(_) => None,
        DatabaseMode::External(e) => e.owner_url_ref(),
    };
    let image = ls
        .spec
        .migration_image
        .clone()
        .unwrap_or_else(|| lock_server_image(ls, default_image));
    let source = postgres::admin_url_source(owner, HISTORY, external);
    Ok(migration_job::job(owner, HISTORY, &image, &source, &[]))
}

pub fn desired(ls: &LockService, owner: &Owner, inputs: &Inputs<'_>) -> Result<Desired, SpecError> {
    let mut out = match ls.spec.store().ok_or(SpecError::StoreMissing)? {
        LockStore::Postgres(db) => desired_postgres(ls, db, owner, inputs)?,
        LockStore::Etcd(spec) => desired_etcd(ls, spec, owner, inputs)?,
    };
    // First of all: a lock-server pod that starts must find the file its template's hash names.
    out.apply.insert(
        0,
        Child::Secret(AppliedSecret(Box::new(lock_clients::clients_secret(
            owner,
            inputs.lock_clients,
        )))),
    );
    Ok(out.with_database_cas().restricted())
}

fn desired_postgres(
    ls: &LockService,
    db: &DatabaseSpec,
    owner: &Owner,
    inputs: &Inputs<'_>,
) -> Result<Desired, SpecError> {
    let mut out = Desired::default();
    match db.mode().ok_or(SpecError::DatabaseMode)? {
        DatabaseMode::Managed(managed) => {
            out.apply
                .extend(crate::builders::database_children(owner, HISTORY, managed));
        }
        // External: a managed StatefulSet and Service left from before are orphans (the sweep).
        DatabaseMode::External(_) => {}
    }
    // Who may reach lock-server, from before its first pod starts.
    out.apply.push(Child::NetworkPolicy(network_policies::lock_server(
        owner,
        inputs.scraper,
    )));

    let job = migration_job(ls, owner, inputs.default_image)?;
    out.migration_job = job.metadata.name.clone().unwrap_or_default();
    if inputs.database_ready {
        out.apply.push(Child::Job(job));
    }

    // The schema gate: nothing that needs lockdb's tables is created (or changed) before the Job of
    // the current image has succeeded. Existing Deployments are left as they are meanwhile.
    if *inputs.migration == JobState::Succeeded {
        let store = LockServerStore::Postgres {
            db_secret_version: inputs.db_secret_version,
        };
        lock_server(ls, owner, inputs, &store, &mut out);
    } else {
        out.hold_workload(owner, LOCK_SERVER);
    }
    Ok(out)
}

fn desired_etcd(
    ls: &LockService,
    spec: &EtcdSpec,
    owner: &Owner,
    inputs: &Inputs<'_>,
) -> Result<Desired, SpecError> {
    let mut out = Desired::default();
    let prefix = spec.key_prefix.as_str();
    let store = match spec.mode().ok_or(SpecError::EtcdMode)? {
        EtcdMode::Managed(managed) => {
            out.apply.push(Child::NetworkPolicy(etcd_members::network_policy(
                owner,
                inputs.scraper,
            )));
            out.apply.push(Child::Service(etcd_members::peer_service(owner)));
            out.apply
                .push(Child::Service(etcd_members::client_service(owner)));
            out.apply
                .push(Child::StatefulSet(etcd_members::statefulset(owner, managed)));
            // One member has no quorum to keep through a drain: a budget would only block it.
            if managed.replicas > 1 {
                out.apply
                    .push(Child::PodDisruptionBudget(etcd_members::disruption_budget(
                        owner,
                        managed.replicas,
                    )));
            }
            out.endpoints
                .insert("etcd".into(), etcd_members::client_url(owner));
            LockServerStore::Etcd {
                endpoints: etcd_members::member_client_urls(owner, managed.replicas),
                prefix,
            }
        }
        // External: the members' children left from a managed spec are orphans (the sweep).
        EtcdMode::External(external) => LockServerStore::EtcdFromSecret {
            secret: &external.secret_ref.name,
            key: &external.secret_ref.key,
            prefix,
            secret_version: inputs.db_secret_version,
        },
    };
    out.apply.push(Child::NetworkPolicy(network_policies::lock_server(
        owner,
        inputs.scraper,
    )));
    // lock-server starts once the cluster can commit (a quorum of members ready): before that it
    // could only fail its readiness probe. Once created, it is left running through a member loss.
    if inputs.database_ready {
        lock_server(ls, owner, inputs, &store, &mut out);
    } else {
        out.hold_workload(owner, LOCK_SERVER);
    }
    if let EtcdMode::External(external) = spec.mode().ok_or(SpecError::EtcdMode)? {
        out = out.with_external_etcd_tls(external);
    }
    Ok(out)
}

/// lock-server's Deployment and Service (at zero replicas while a restore gates lock traffic), once
/// it has a key to sign grants with.
fn lock_server(
    ls: &LockService,
    owner: &Owner,
    inputs: &Inputs<'_>,
    store: &LockServerStore<'_>,
    out: &mut Desired,
) {
    let Some(key_id) = inputs.signing_key else {
        out.hold_workload(owner, LOCK_SERVER);
        return;
    };
    let grants = SigningGrants {
        secret: grant_keys::signing_secret_name(&owner.name),
        key_id: key_id.to_owned(),
        lock_service_id: grant_keys::lock_service_id(owner),
    };
    let replicas = if inputs.gated {
        0
    } else {
        ls.spec.lock_server.replicas
    };
    let w = deployments::lock_server(
        owner,
        lock_server_image(ls, inputs.default_image),
        replicas,
        ls.spec.lock_server.resources.clone(),
        &ls.spec.lease,
        store,
        &admin_secret_name(owner),
    )
    .signing(&grants);
    // The clients file, mounted, and its hash on the pod template: lock-server reads it only at
    // start-up, so a new set of clients rolls it.
    let mut deployment = deployments::deployment(owner, &w);
    if let Some(spec) = deployment.spec.as_mut() {
        lock_clients::serve_clients(&mut spec.template, &owner.name, inputs.lock_clients);
    }
    out.apply.push(Child::Deployment(deployment));
    out.apply
        .push(Child::Service(deployments::service(owner, LOCK_SERVER)));
    out.endpoints
        .insert("lockServer".into(), owner.http_url(&owner.child(LOCK_SERVER)));
}
