//! Deployments and Services of the dlock binaries. Each container runs the binary of the same name
//! from the dlock image, listens on 0.0.0.0:8080 (container port `http`, where `/metrics` is, which
//! the chart's PodMonitor scrapes: for payout-executor it is all it serves, so it gets no Service and
//! no probes), and reads DATABASE_URL from the connection Secret, never from a plain env value.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, HTTPGetAction, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::postgres::{History, KEY_URL, names};
use super::{Child, Desired, HTTP_PORT, HTTP_PORT_NAME, LISTEN_ADDR, Owner, configmap_env, env, secret_env};
use super::{LABEL_LOCK_SERVICE, LOCK_SERVER, PAYMENT_RESOURCE, PAYOUT_EXECUTOR, RAIL_PROXY, RAIL_STUB};
use super::{credentials, grant_keys, lock_clients};
use crate::crd::{KillSwitches, LeaseSpec, RailStubMode};

/// Env keys of the contracts' kill switches (`payment.fencing.enabled`, `rail.proxy.fencing.enabled`).
pub const PAYMENT_FENCING_ENV: &str = "PAYMENT_FENCING_ENABLED";
pub const RAIL_PROXY_FENCING_ENV: &str = "RAIL_PROXY_FENCING_ENABLED";
/// The LockService's `spec.lease`, as payout-executor reads it (services/payout-executor/src/config.rs):
/// the lease of each account lock and the TTL of each worker's session. lock-server itself has no
/// lease setting (every acquire and session names its own TTL), so only its clients are told.
pub const EXECUTOR_LEASE_TTL_ENV: &str = "PAYOUT_EXECUTOR_LEASE_TTL_MS";
pub const EXECUTOR_SESSION_TTL_ENV: &str = "PAYOUT_EXECUTOR_SESSION_TTL_MS";
/// lock-server reads its admin bearer token from here (services/lock-server/src/config.rs).
pub const ADMIN_TOKEN_ENV: &str = "DLOCK_ADMIN_TOKEN";
/// Signed grants (services' config.rs, dlock_common::grant): lock-server's signing key and the lock
/// service id it signs, the resources' public keys and their verification switches.
pub const GRANT_SIGNING_KEY_ENV: &str = dlock_common::grant::SIGNING_KEY_ENV;
pub const LOCK_SERVICE_ID_ENV: &str = dlock_common::grant::LOCK_SERVICE_ID_ENV;
pub const GRANT_PUBLIC_KEYS_ENV: &str = dlock_common::grant::PUBLIC_KEYS_ENV;
pub const PAYMENT_GRANT_VERIFICATION_ENV: &str = "PAYMENT_GRANT_VERIFICATION_ENABLED";
pub const RAIL_PROXY_GRANT_VERIFICATION_ENV: &str = "RAIL_PROXY_GRANT_VERIFICATION_ENABLED";

/// What lock-server signs grants with: one key of its LockService's signing-key Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningGrants {
    /// The Secret ([`grant_keys::signing_secret_name`]) and the key id in it.
    pub secret: String,
    pub key_id: String,
    /// `<namespace>/<name>` of the LockService, signed into every grant.
    pub lock_service_id: String,
}

/// How payment-resource and rail-proxy verify grants: the public key set of their LockService's
/// ConfigMap (never a Secret of it), and the stack's switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyingGrants {
    /// The ConfigMap ([`grant_keys::public_keys_name`]).
    pub configmap: String,
    /// [`grant_keys::checksum`] of the set: a changed set rolls the pods.
    pub checksum: String,
    pub enabled: bool,
}

impl Workload {
    /// lock-server: the one signing key by `secretKeyRef`, the lock service id, and the annotation
    /// that rolls it when the key it signs with changes. lock-server is the only workload that
    /// references the signing-key Secret.
    pub fn signing(mut self, grants: &SigningGrants) -> Self {
        self.env
            .push(secret_env(GRANT_SIGNING_KEY_ENV, &grants.secret, &grants.key_id));
        self.env
            .push(env(LOCK_SERVICE_ID_ENV, grants.lock_service_id.clone()));
        self.annotations
            .insert(grant_keys::SIGNING_KEY_ANNOTATION.into(), grants.key_id.clone());
        self
    }

    /// payment-resource and rail-proxy: the public keys by `configMapKeyRef`, the component's
    /// switch, and the annotation that rolls the pods when the key set changes. Other workloads
    /// verify nothing and are returned as they are.
    pub fn verifying(mut self, grants: &VerifyingGrants) -> Self {
        let switch_env = match self.component {
            PAYMENT_RESOURCE => PAYMENT_GRANT_VERIFICATION_ENV,
            RAIL_PROXY => RAIL_PROXY_GRANT_VERIFICATION_ENV,
            _ => return self,
        };
        self.env.push(env(switch_env, grants.enabled.to_string()));
        if grants.enabled {
            self.env.push(configmap_env(
                GRANT_PUBLIC_KEYS_ENV,
                &grants.configmap,
                grant_keys::KEY_SET,
            ));
            self.annotations
                .insert(grant_keys::PUBLIC_KEYS_ANNOTATION.into(), grants.checksum.clone());
        }
        self
    }
}

/// Pod-template annotation carrying the connection Secret's resourceVersion, so pods restart when the
/// URL they read at start-up changes.
pub const DB_SECRET_VERSION_ANNOTATION: &str = "dlock.dev/database-secret-version";

impl Desired {
    /// A workload's Deployment, and its Service when it serves HTTP (without one, a Service of that
    /// name is an orphan).
    pub fn workload(&mut self, owner: &Owner, w: &Workload) {
        self.apply.push(Child::Deployment(deployment(owner, w)));
        if w.serves_http {
            self.apply.push(Child::Service(service(owner, w.component)));
        }
    }
}

/// What one Deployment runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub component: &'static str,
    pub image: String,
    pub replicas: i32,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub resources: Option<ResourceRequirements>,
    /// Serves its API on [`HTTP_PORT`] with `/healthz` and `/readyz` (and so gets probes and a
    /// Service). Every workload listens there for `/metrics` either way.
    pub serves_http: bool,
    pub annotations: BTreeMap<String, String>,
    /// Pod labels beyond the standard ones (e.g. what a NetworkPolicy admits by).
    pub pod_labels: BTreeMap<String, String>,
}

impl Workload {
    /// `DATABASE_URL` from the connection Secret of `history`, plus the annotation that restarts pods
    /// when that Secret changes.
    fn with_database(mut self, owner: &Owner, history: History, secret_version: Option<&str>) -> Self {
        self.env.push(secret_env(
            "DATABASE_URL",
            &names(owner, history).connection_secret,
            KEY_URL,
        ));
        if let Some(v) = secret_version {
            self.annotations
                .insert(DB_SECRET_VERSION_ANNOTATION.into(), v.to_owned());
        }
        self
    }
}

/// Where lock-server keeps its grants, as its pods are told.
#[derive(Debug, Clone, PartialEq)]
pub enum LockServerStore<'a> {
    /// lockdb: `DATABASE_URL` from the connection Secret (its resourceVersion restarts the pods).
    Postgres { db_secret_version: Option<&'a str> },
    /// etcd at client URLs known from the spec (a managed cluster): plain flags, nothing secret.
    Etcd { endpoints: Vec<String>, prefix: &'a str },
    /// etcd whose client URLs are a Secret key (an external cluster): `DLOCK_ETCD_ENDPOINTS` from
    /// it; lock-server reads it at start-up, so the Secret's resourceVersion restarts the pods.
    EtcdFromSecret {
        secret: &'a str,
        key: &'a str,
        prefix: &'a str,
        secret_version: Option<&'a str>,
    },
}

/// Env key lock-server reads etcd's client URLs from (services/lock-server/src/config.rs).
pub const ETCD_ENDPOINTS_ENV: &str = "DLOCK_ETCD_ENDPOINTS";
/// Pod-template annotation carrying the external etcd Secret's resourceVersion.
pub const ETCD_SECRET_VERSION_ANNOTATION: &str = "dlock.dev/etcd-secret-version";

/// `_lease` is not passed on: lock-server reads no lease setting (each acquire and session carries
/// its TTL), and an env var it never reads would only pretend the spec reaches it. The lease
/// reaches the clients instead ([`payout_executor`]).
pub fn lock_server(
    owner: &Owner,
    image: String,
    replicas: i32,
    resources: Option<ResourceRequirements>,
    _lease: &LeaseSpec,
    store: &LockServerStore<'_>,
    admin_secret: &str,
) -> Workload {
    // The admin token (force-revoke) from its Secret: never a flag, never a plain value.
    let mut env = vec![secret_env(ADMIN_TOKEN_ENV, admin_secret, "token")];
    let mut args: Vec<String> = vec!["--listen".into(), LISTEN_ADDR.into()];
    let mut annotations = BTreeMap::new();
    let etcd_args = |prefix: &str| {
        vec![
            "--backend".to_owned(),
            "etcd".into(),
            "--etcd-prefix".into(),
            prefix.into(),
        ]
    };
    match store {
        LockServerStore::Postgres { .. } => {}
        LockServerStore::Etcd { endpoints, prefix } => {
            args.extend(etcd_args(prefix));
            args.extend(["--etcd-endpoints".to_owned(), endpoints.join(",")]);
        }
        LockServerStore::EtcdFromSecret {
            secret,
            key,
            prefix,
            secret_version,
        } => {
            args.extend(etcd_args(prefix));
            env.push(secret_env(ETCD_ENDPOINTS_ENV, secret, key));
            if let Some(v) = secret_version {
                annotations.insert(ETCD_SECRET_VERSION_ANNOTATION.into(), (*v).to_owned());
            }
        }
    }
    let w = Workload {
        component: LOCK_SERVER,
        image,
        replicas,
        args,
        env,
        resources,
        serves_http: true,
        annotations,
        pod_labels: BTreeMap::new(),
    };
    match store {
        LockServerStore::Postgres { db_secret_version } => {
            w.with_database(owner, History::Lockdb, *db_secret_version)
        }
        _ => w,
    }
}

pub fn payment_resource(
    owner: &Owner,
    image: String,
    replicas: i32,
    resources: Option<ResourceRequirements>,
    kill_switches: &KillSwitches,
    db_secret_version: Option<&str>,
) -> Workload {
    let credentials_secret = &credentials::credentials_secret_name(owner);
    let mut env = vec![env(
        PAYMENT_FENCING_ENV,
        kill_switches.payment_fencing_enabled.to_string(),
    )];
    // Each role's bearer credential from the generated Secret: never a flag, never a plain value.
    for (name, key) in [
        ("PAYMENT_RESOURCE_ADMIN_TOKEN", credentials::KEY_ADMIN),
        ("PAYMENT_RESOURCE_EXECUTOR_TOKEN", credentials::KEY_EXECUTOR),
        ("PAYMENT_RESOURCE_CLIENT_TOKEN", credentials::KEY_CLIENT),
    ] {
        env.push(secret_env(name, credentials_secret, key));
    }
    Workload {
        component: PAYMENT_RESOURCE,
        image,
        replicas,
        args: vec!["serve".into(), "--listen".into(), LISTEN_ADDR.into()],
        env,
        resources,
        serves_http: true,
        annotations: BTreeMap::new(),
        pod_labels: BTreeMap::new(),
    }
    .with_database(owner, History::Paydb, db_secret_version)
}

pub fn rail_proxy(
    owner: &Owner,
    image: String,
    replicas: i32,
    resources: Option<ResourceRequirements>,
    rail_url: &str,
    kill_switches: &KillSwitches,
    db_secret_version: Option<&str>,
) -> Workload {
    let credentials_secret = &credentials::credentials_secret_name(owner);
    let env = vec![
        env(
            RAIL_PROXY_FENCING_ENV,
            kill_switches.rail_proxy_fencing_enabled.to_string(),
        ),
        secret_env(
            "RAIL_PROXY_EXECUTOR_TOKEN",
            credentials_secret,
            credentials::KEY_RAIL_PROXY_EXECUTOR,
        ),
    ];
    Workload {
        component: RAIL_PROXY,
        image,
        replicas,
        args: vec![
            "--listen".into(),
            LISTEN_ADDR.into(),
            "--rail-url".into(),
            rail_url.into(),
        ],
        env,
        resources,
        serves_http: true,
        annotations: BTreeMap::new(),
        pod_labels: BTreeMap::new(),
    }
    .with_database(owner, History::Paydb, db_secret_version)
}

pub fn rail_stub(image: String, mode: Option<RailStubMode>) -> Workload {
    Workload {
        component: RAIL_STUB,
        image,
        replicas: 1,
        args: vec![
            "--listen".into(),
            LISTEN_ADDR.into(),
            "--mode".into(),
            mode.unwrap_or(RailStubMode::Ack).as_str().into(),
        ],
        env: Vec::new(),
        resources: None,
        serves_http: true,
        annotations: BTreeMap::new(),
        pod_labels: BTreeMap::new(),
    }
}

/// What payout-executor talks to. It has no database credentials at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorTargets {
    /// The LockService it takes its locks from (a pod label lock-server's NetworkPolicy admits by).
    pub lock_service: String,
    pub lock_server_url: String,
    pub payment_resource_url: String,
    pub rail_proxy_url: String,
}

/// Who payout-executor is to lock-server: its stack's lock client (`builders::lock_clients`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorLockClient {
    /// The PaymentStack's name: its owner ids are `<stack>/<pod name>`.
    pub stack: String,
    /// `<stack>-lock-client`, whose `token` it presents.
    pub secret: String,
}

#[allow(clippy::too_many_arguments)]
pub fn payout_executor(
    image: String,
    replicas: i32,
    workers: i32,
    resources: Option<ResourceRequirements>,
    targets: &ExecutorTargets,
    lease: &LeaseSpec,
    credentials_secret: &str,
    lock_client: &ExecutorLockClient,
) -> Workload {
    // Its LockService's lease governs every account lock and session it takes.
    let mut env = lease_env(lease);
    // The executor presents its own credentials: the executor role of each resource.
    env.push(secret_env(
        "PAYOUT_EXECUTOR_PAYMENT_RESOURCE_TOKEN",
        credentials_secret,
        credentials::KEY_EXECUTOR,
    ));
    env.push(secret_env(
        "PAYOUT_EXECUTOR_RAIL_PROXY_TOKEN",
        credentials_secret,
        credentials::KEY_RAIL_PROXY_EXECUTOR,
    ));
    // Its stack's lock client: the token lock-server's clients file knows, and owner ids under the
    // stack's owner prefix (lock-server refuses sessions of any other owner to this token).
    env.extend(lock_clients::executor_env(
        &lock_client.stack,
        &lock_client.secret,
    ));
    Workload {
        component: PAYOUT_EXECUTOR,
        image,
        replicas,
        args: vec![
            "--lock-server-url".into(),
            targets.lock_server_url.clone(),
            "--payment-resource-url".into(),
            targets.payment_resource_url.clone(),
            "--rail-proxy-url".into(),
            targets.rail_proxy_url.clone(),
            "--workers".into(),
            workers.to_string(),
            // /metrics, /healthz and /readyz, for the scrape (its default is loopback only).
            "--listen".into(),
            LISTEN_ADDR.into(),
        ],
        env,
        resources,
        serves_http: false,
        annotations: BTreeMap::new(),
        // lock-server's NetworkPolicy admits the executors of the stacks that use it by this label.
        pod_labels: BTreeMap::from([(LABEL_LOCK_SERVICE.into(), targets.lock_service.clone())]),
    }
}

/// The LockService's lease, under the names payout-executor reads.
fn lease_env(lease: &LeaseSpec) -> Vec<EnvVar> {
    vec![
        env(EXECUTOR_LEASE_TTL_ENV, lease.default_ttl_ms.to_string()),
        env(EXECUTOR_SESSION_TTL_ENV, lease.session_ttl_ms.to_string()),
    ]
}

fn http_probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(HTTP_PORT_NAME.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        ..Probe::default()
    }
}

/// The Deployment of one workload, named `<owner>-<component>`.
pub fn deployment(owner: &Owner, w: &Workload) -> Deployment {
    let container = Container {
        name: w.component.into(),
        image: Some(w.image.clone()),
        command: Some(vec![w.component.into()]),
        args: Some(w.args.clone()),
        env: (!w.env.is_empty()).then(|| w.env.clone()),
        ports: Some(vec![ContainerPort {
            name: Some(HTTP_PORT_NAME.into()),
            container_port: HTTP_PORT,
            ..ContainerPort::default()
        }]),
        readiness_probe: w.serves_http.then(|| http_probe("/readyz", 5)),
        liveness_probe: w.serves_http.then(|| Probe {
            initial_delay_seconds: Some(10),
            ..http_probe("/healthz", 10)
        }),
        resources: w.resources.clone(),
        ..Container::default()
    };
    Deployment {
        metadata: owner.meta(owner.child(w.component), w.component),
        spec: Some(DeploymentSpec {
            replicas: Some(w.replicas),
            selector: LabelSelector {
                match_labels: Some(owner.selector(w.component)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some({
                        let mut labels = owner.labels(w.component);
                        labels.extend(w.pod_labels.clone());
                        labels
                    }),
                    annotations: (!w.annotations.is_empty()).then(|| w.annotations.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    // payout-executor and friends must drain on SIGTERM (release locks, finish posting).
                    termination_grace_period_seconds: Some(30),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The ClusterIP Service in front of one HTTP workload.
pub fn service(owner: &Owner, component: &str) -> Service {
    Service {
        metadata: owner.meta(owner.child(component), component),
        spec: Some(ServiceSpec {
            selector: Some(owner.selector(component)),
            ports: Some(vec![ServicePort {
                name: Some(HTTP_PORT_NAME.into()),
                port: HTTP_PORT,
                // By number: the container port's name says whether it serves HTTPS.
                target_port: Some(IntOrString::Int(HTTP_PORT)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
