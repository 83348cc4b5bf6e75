//! The builders as pure functions: a resource in, the children it asks for out. One file per
//! builder module; the fixtures they share (a representative LockService and PaymentStack, their
//! plans' inputs, readers of containers and env) are here.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, EnvVar, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::deployments::{PAYMENT_FENCING_ENV, RAIL_PROXY_FENCING_ENV};
use super::postgres::{Credentials, History};
use super::{Child, ChildKind, Desired, Owner, short_hash};
use crate::controller::paymentstack::children::LockServiceView;
use crate::controller::{lockservice, paymentstack};
use crate::crd::{LeaseSpec, LockService, LockServiceSpec, PaymentStack, PaymentStackSpec};
use crate::health::JobState;

mod binary_env;
mod credentials;
mod deployments;
mod desired;
mod etcd_members;
mod grant_keys;
mod lock_clients;
mod migration_job;
mod network_policies;
mod postgres;
mod security;
mod tls;

const IMAGE: &str = "registry.example/dlock:1.2.3";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("pay".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

fn lock_service(spec: serde_json::Value) -> LockService {
    let spec: LockServiceSpec = serde_json::from_value(spec).unwrap();
    LockService {
        metadata: meta("locks"),
        spec,
        status: None,
    }
}

fn stack(spec: serde_json::Value) -> PaymentStack {
    let spec: PaymentStackSpec = serde_json::from_value(spec).unwrap();
    PaymentStack {
        metadata: meta("shop"),
        spec,
        status: None,
    }
}

fn managed_ls() -> LockService {
    lock_service(
        json!({"database": {"managed": {"storageClassName": "fast"}}, "lockServer": {"replicas": 3}}),
    )
}

fn default_stack() -> PaymentStack {
    stack(json!({
        "lockServiceRef": {"name": "locks"},
        "database": {"managed": {}},
        "railStub": {"enabled": true, "mode": "timeout"},
        "payoutExecutor": {"replicas": 1, "workers": 7},
    }))
}

/// A clients file of one stack, `pay`, as the LockService builds it.
static LOCK_CLIENTS: std::sync::LazyLock<crate::builders::lock_clients::ClientsFile> =
    std::sync::LazyLock::new(|| {
        use crate::builders::lock_clients::{ClientToken, StackClient, clients_file};
        let pay = StackClient {
            stack: "pay".into(),
            token: ClientToken::generate(),
        };
        clients_file(&[pay], None, &ClientToken::generate()).unwrap()
    });

fn ls_inputs<'a>(migration: &'a JobState) -> lockservice::children::Inputs<'a> {
    lockservice::children::Inputs {
        default_image: IMAGE,
        database_ready: true,
        migration,
        db_secret_version: Some("42"),
        gated: false,
        signing_key: Some("k1"),
        scraper: None,
        lock_clients: &LOCK_CLIENTS,
    }
}

fn ready_lock_service() -> LockServiceView {
    LockServiceView {
        ready: true,
        endpoint: Some("http://locks-lock-server.pay.svc:8080".into()),
        lease: LeaseSpec {
            default_ttl_ms: 5000,
            session_ttl_ms: 20000,
        },
        grant_keys: Some(PUBLISHED_KEYS.to_text()),
    }
}

/// A published key set, as the LockService's ConfigMap holds it.
static PUBLISHED_KEYS: std::sync::LazyLock<dlock_grant::PublicKeys> = std::sync::LazyLock::new(|| {
    let k1 = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
    dlock_grant::PublicKeys::new(vec![k1.public_key()]).unwrap()
});

fn ps_inputs<'a>(
    migration: &'a JobState,
    ls: Option<&'a LockServiceView>,
) -> paymentstack::children::Inputs<'a> {
    paymentstack::children::Inputs {
        default_image: IMAGE,
        database_ready: true,
        migration,
        db_secret_version: Some("7"),
        lock_service: ls,
        scraper: None,
    }
}

fn containers(child: &Child) -> Vec<Container> {
    pod_spec(child).map(|p| p.containers).unwrap_or_default()
}

/// The pod template's spec of a child that has one.
fn pod_spec(child: &Child) -> Option<k8s_openapi::api::core::v1::PodSpec> {
    let spec = match child {
        Child::StatefulSet(s) => s.spec.as_ref().map(|s| &s.template),
        Child::Job(j) => j.spec.as_ref().map(|s| &s.template),
        Child::Deployment(d) => d.spec.as_ref().map(|s| &s.template),
        // A CloudNativePG Cluster has no pod template of ours: its operator builds the pods.
        Child::Service(_)
        | Child::NetworkPolicy(_)
        | Child::PodDisruptionBudget(_)
        | Child::PostgresCluster(_)
        | Child::Secret(_) => None,
    };
    spec.and_then(|t| t.spec.clone())
}

fn env_of<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

fn secret_ref(e: &EnvVar) -> (String, String) {
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{} is not read from a Secret", e.name));
    assert!(e.value.is_none(), "{} has a plain value too", e.name);
    (r.name.clone(), r.key.clone())
}

fn deployment<'a>(d: &'a Desired, name: &str) -> &'a Deployment {
    match d.find(ChildKind::Deployment, name) {
        Some(Child::Deployment(dep)) => dep,
        _ => panic!(
            "no Deployment {name} in {:?}",
            d.apply.iter().map(Child::name).collect::<Vec<_>>()
        ),
    }
}

fn all_children(d: &Desired) -> impl Iterator<Item = (&str, ObjectMeta)> {
    d.apply.iter().map(|c| {
        let m = match c {
            Child::Service(o) => o.metadata.clone(),
            Child::StatefulSet(o) => o.metadata.clone(),
            Child::Job(o) => o.metadata.clone(),
            Child::Deployment(o) => o.metadata.clone(),
            Child::NetworkPolicy(o) => o.metadata.clone(),
            Child::PodDisruptionBudget(o) => o.metadata.clone(),
            Child::PostgresCluster(o) => o.metadata.clone(),
            Child::Secret(o) => o.0.metadata.clone(),
        };
        (c.name(), m)
    })
}

/// `matchLabels` semantics (the only form the builders use): every listed label present and equal.
fn selects(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    assert!(
        sel.match_expressions.is_none(),
        "only matchLabels is evaluated here"
    );
    sel.match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels(d: &Desired, name: &str) -> std::collections::BTreeMap<String, String> {
    deployment(d, name)
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap()
}

fn etcd_ls(etcd: serde_json::Value) -> LockService {
    lock_service(json!({"backend": "etcd", "etcd": etcd, "lockServer": {"replicas": 2}}))
}

fn etcd_inputs(quorum: bool) -> lockservice::children::Inputs<'static> {
    lockservice::children::Inputs {
        default_image: IMAGE,
        database_ready: quorum,
        migration: &JobState::Succeeded,
        db_secret_version: None,
        gated: false,
        signing_key: Some("k1"),
        scraper: None,
        lock_clients: &LOCK_CLIENTS,
    }
}

fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}
