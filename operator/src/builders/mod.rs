//! Pure functions that build the child objects, one module per object built (whichever kind asks
//! for it): [`postgres`] a managed PostgreSQL (Secrets, Service, StatefulSet), [`etcd_members`] a
//! managed etcd cluster, [`migration_job`] the migration Job, [`deployments`] the Deployments and
//! Services of the dlock binaries, [`network_policies`], [`credentials`] the generated Secrets,
//! [`grant_keys`] a LockService's grant signing keys and their public ConfigMap, [`lock_clients`]
//! the lock clients' tokens and lock-server's clients file. No
//! I/O here; which of them a kind asks for is the kind's plan (`controller::<kind>::children`).

pub mod cnpg;
pub mod credentials;
pub mod deployments;
pub mod etcd_members;
pub mod grant_keys;
pub mod lock_clients;
pub mod migration_job;
pub mod network_policies;
pub mod postgres;
pub mod security;
pub mod tls;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, EnvVar, EnvVarSource, ObjectFieldSelector, Secret, SecretKeySelector, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

/// The one field manager for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "dlock-operator";
pub const MANAGED_BY: &str = "dlock-operator";
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
pub const LABEL_OWNER_KIND: &str = "dlock.dev/owner-kind";
/// Pod label of a PaymentStack's executors naming the LockService they take locks from; lock-server's
/// policy admits exactly these pods.
pub const LABEL_LOCK_SERVICE: &str = "dlock.dev/lock-service";

/// The components: each is the `app.kubernetes.io/component` (and name) label of its children and
/// the suffix of their names.
pub const LOCK_SERVER: &str = "lock-server";
pub const PAYMENT_RESOURCE: &str = "payment-resource";
pub const RAIL_PROXY: &str = "rail-proxy";
pub const RAIL_STUB: &str = "rail-stub";
pub const PAYOUT_EXECUTOR: &str = "payout-executor";
/// Every dlock HTTP service listens here inside its pod.
pub const HTTP_PORT: i32 = 8080;
/// The container port's name when it serves plain HTTP: the chart's PodMonitor scrapes `/metrics` on
/// the port of this name. It is also the name of the Services' port, either way.
pub const HTTP_PORT_NAME: &str = "http";
/// The same port's name in a pod that serves HTTPS (`spec.tls`): the PodMonitor scrapes it with
/// `scheme: https`, so that one PodMonitor serves namespaces with and without TLS.
pub const HTTPS_PORT_NAME: &str = "https";
pub const LISTEN_ADDR: &str = "0.0.0.0:8080";
pub const POSTGRES_PORT: i32 = 5432;

/// The parent of a set of children: its identity, and the controller owner reference every child carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub kind: String,
    pub owner_ref: OwnerReference,
    /// The owner's APIs are served over HTTPS (`spec.tls`): its URLs say `https://`.
    pub https: bool,
}

impl Owner {
    /// `None` when the object lacks a namespace, name or uid (not yet persisted).
    pub fn of<K>(obj: &K) -> Option<Owner>
    where
        K: Resource<DynamicType = ()>,
    {
        Some(Owner {
            name: obj.meta().name.clone()?,
            namespace: obj.namespace()?,
            kind: K::kind(&()).into_owned(),
            owner_ref: obj.controller_owner_ref(&())?,
            https: false,
        })
    }

    /// The standard labels of one child.
    pub fn labels(&self, component: &str) -> BTreeMap<String, String> {
        let mut labels = self.selector(component);
        labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
        labels.insert(LABEL_PART_OF.into(), "dlock".into());
        labels.insert(LABEL_OWNER_KIND.into(), self.kind.clone());
        labels
    }

    /// The stable subset used as Deployment/StatefulSet selectors (selectors are immutable).
    pub fn selector(&self, component: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_NAME.into(), component.into()),
            (LABEL_INSTANCE.into(), self.name.clone()),
            (LABEL_COMPONENT.into(), component.into()),
        ])
    }

    /// Label selector (as a string) for every child of this owner with one component.
    pub fn component_selector(&self, component: &str) -> String {
        format!(
            "{LABEL_INSTANCE}={},{LABEL_COMPONENT}={component},{LABEL_OWNER_KIND}={},{LABEL_MANAGED_BY}={MANAGED_BY}",
            self.name, self.kind
        )
    }

    /// Label selector (as a string) for every child of this owner, whatever its component.
    pub fn owner_selector(&self) -> String {
        format!(
            "{LABEL_INSTANCE}={},{LABEL_OWNER_KIND}={},{LABEL_MANAGED_BY}={MANAGED_BY}",
            self.name, self.kind
        )
    }

    /// Metadata of one child: name, namespace, labels, controller owner reference.
    pub fn meta(&self, name: impl Into<String>, component: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels(component)),
            owner_references: Some(vec![self.owner_ref.clone()]),
            ..ObjectMeta::default()
        }
    }

    /// `<owner>-<suffix>`, the name of one child.
    pub fn child(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.name)
    }

    /// `<owner>-<component>-tls`: the Secret with a served component's certificate
    /// ([`tls`]).
    pub fn tls_secret(&self, component: &str) -> String {
        format!("{}-tls", self.child(component))
    }

    /// In-cluster URL of one of the owner's HTTP Services.
    pub fn http_url(&self, service: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{service}.{}.svc:{HTTP_PORT}", self.namespace)
    }
}

/// A plain environment variable (never a secret: those go through [`secret_env`]).
pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// An environment variable read from a Secret key, so no credential appears in any pod spec.
pub fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// `name` set to the pod's own name (the downward API's `metadata.name`), for a later variable's
/// `$(name)` or a process that names itself after its pod.
pub fn pod_name_env(name: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// An environment variable read from a ConfigMap key (public settings another object publishes).
pub fn configmap_env(name: &str, configmap: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: configmap.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// FNV-1a over `bytes`, as 8 hex digits: a short, stable content hash for child names (Jobs are
/// immutable, so a new template needs a new name). Stable across Rust versions, unlike `DefaultHasher`.
pub fn short_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", (h >> 32) ^ (h & 0xffff_ffff))
}

/// One child object to server-side apply.
#[derive(Debug, Clone, PartialEq)]
pub enum Child {
    Service(Service),
    StatefulSet(StatefulSet),
    Job(Job),
    Deployment(Deployment),
    NetworkPolicy(NetworkPolicy),
    PodDisruptionBudget(PodDisruptionBudget),
    /// A CloudNativePG Cluster (`database.managed.engine: CloudNativePG`).
    PostgresCluster(Box<cnpg::Cluster>),
    /// A Secret derived anew on every reconcile (lock-server's clients file), applied before the
    /// children that read it.
    Secret(AppliedSecret),
}

/// A Secret applied as a child. `Debug` names it and never shows its data.
#[derive(Clone, PartialEq)]
pub struct AppliedSecret(pub Box<Secret>);

impl std::fmt::Debug for AppliedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.0.metadata.name)
            .field("data", &"<redacted>")
            .finish()
    }
}

impl Child {
    pub fn kind(&self) -> ChildKind {
        match self {
            Child::Service(_) => ChildKind::Service,
            Child::StatefulSet(_) => ChildKind::StatefulSet,
            Child::Job(_) => ChildKind::Job,
            Child::Deployment(_) => ChildKind::Deployment,
            Child::NetworkPolicy(_) => ChildKind::NetworkPolicy,
            Child::PodDisruptionBudget(_) => ChildKind::PodDisruptionBudget,
            Child::PostgresCluster(_) => ChildKind::PostgresCluster,
            Child::Secret(_) => ChildKind::Secret,
        }
    }

    pub fn name(&self) -> &str {
        let meta = match self {
            Child::Service(o) => &o.metadata,
            Child::StatefulSet(o) => &o.metadata,
            Child::Job(o) => &o.metadata,
            Child::Deployment(o) => &o.metadata,
            Child::NetworkPolicy(o) => &o.metadata,
            Child::PodDisruptionBudget(o) => &o.metadata,
            Child::PostgresCluster(o) => &o.metadata,
            Child::Secret(o) => &o.0.metadata,
        };
        meta.name.as_deref().unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChildKind {
    Service,
    StatefulSet,
    Job,
    Deployment,
    NetworkPolicy,
    PodDisruptionBudget,
    /// Never swept: the engine is immutable, so a Cluster never turns into an orphan while its
    /// owner lives (owner references delete it with the owner), and listing it would fail where
    /// CloudNativePG is not installed.
    PostgresCluster,
    /// Never swept: its owner references delete it with its owner.
    Secret,
}

impl ChildKind {
    /// The kinds whose orphans [`Desired`] implies: every child of the owner of one of these kinds
    /// (found by label) that is neither applied nor held is deleted. Jobs are not among them: each
    /// family of Jobs (migration, restore, fencing check) keeps its own by label and component.
    pub const SWEPT: [ChildKind; 5] = [
        ChildKind::NetworkPolicy,
        ChildKind::Deployment,
        ChildKind::PodDisruptionBudget,
        ChildKind::Service,
        ChildKind::StatefulSet,
    ];
}

/// The children that run a managed database: the StatefulSet engine's headless Service and
/// StatefulSet, or CloudNativePG's Cluster (which makes its own Services).
pub fn database_children(
    owner: &Owner,
    history: postgres::History,
    spec: &crate::crd::ManagedDatabase,
) -> Vec<Child> {
    match spec.engine {
        crate::crd::DatabaseEngine::StatefulSet => vec![
            Child::Service(postgres::service(owner, history)),
            Child::StatefulSet(postgres::statefulset(owner, history, spec)),
        ],
        crate::crd::DatabaseEngine::CloudNativePg => vec![Child::PostgresCluster(Box::new(cnpg::cluster(
            owner, history, spec,
        )))],
    }
}

/// A child named without its body: one the spec still asks for but this reconcile leaves as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChildRef {
    pub kind: ChildKind,
    pub name: String,
}

/// Everything one reconcile should converge to, given what was observed. What it names neither in
/// `apply` nor in `hold` is an orphan: the apply step deletes the owner's children of the
/// [`ChildKind::SWEPT`] kinds found by label that are not named here.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Desired {
    /// Applied in order (database before Job before Deployments).
    pub apply: Vec<Child>,
    /// Still wanted, but held back as they are (e.g. Deployments behind the schema gate).
    pub hold: Vec<ChildRef>,
    /// The migration Job of the current inputs; every other migration Job of the owner is stale.
    pub migration_job: String,
    /// Service URLs to publish in status, by component (camelCase).
    pub endpoints: BTreeMap<String, String>,
}

impl Desired {
    pub fn deployments(&self) -> impl Iterator<Item = &Deployment> {
        self.apply.iter().filter_map(|c| match c {
            Child::Deployment(d) => Some(d),
            _ => None,
        })
    }

    pub fn find(&self, kind: ChildKind, name: &str) -> Option<&Child> {
        self.apply.iter().find(|c| c.kind() == kind && c.name() == name)
    }

    /// Whether `kind`/`name` is applied or held: anything else of a swept kind is an orphan.
    pub fn wants(&self, kind: ChildKind, name: &str) -> bool {
        self.find(kind, name).is_some() || self.hold.iter().any(|r| r.kind == kind && r.name == name)
    }

    /// A workload held behind a gate: its existing Deployment and Service stay as they are
    /// (nothing new is created before the gate opens).
    /// Each database's CA mounted where its URLs look for it ([`postgres::mount_database_cas`]),
    /// in every Deployment and Job of the set.
    pub fn with_database_cas(mut self) -> Self {
        for child in &mut self.apply {
            let pod = match child {
                Child::Deployment(d) => d.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
                Child::Job(j) => j.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
                _ => None,
            };
            if let Some(pod) = pod {
                postgres::mount_database_cas(pod);
            }
        }
        self
    }

    /// Every pod of the set (Deployments, Jobs, StatefulSets) made to meet the Pod Security
    /// Standard "restricted" ([`security::restrict`]).
    pub fn restricted(mut self) -> Self {
        for child in &mut self.apply {
            let pod = match child {
                Child::Deployment(d) => d.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
                Child::Job(j) => j.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
                Child::StatefulSet(s) => s.spec.as_mut().and_then(|s| s.template.spec.as_mut()),
                _ => None,
            };
            if let Some(pod) = pod {
                security::restrict(pod);
            }
        }
        self
    }

    /// The components this set gives a Service and that get a certificate with HTTPS
    /// ([`tls::CERTIFIED`]), by their component label.
    pub fn served_components(&self) -> Vec<&'static str> {
        tls::CERTIFIED
            .into_iter()
            .filter(|c| {
                self.apply.iter().any(|child| {
                    matches!(child, Child::Service(s) if s.metadata.labels.as_ref()
                        .and_then(|l| l.get(LABEL_COMPONENT))
                        .is_some_and(|l| l == c))
                })
            })
            .collect()
    }

    pub fn hold_workload(&mut self, owner: &Owner, component: &str) {
        for kind in [ChildKind::Deployment, ChildKind::Service] {
            self.hold.push(ChildRef {
                kind,
                name: owner.child(component),
            });
        }
    }
}

/// A spec the controller cannot act on (only objects that bypassed the CRD's CEL rules can be).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec.database must set exactly one of managed or external")]
    DatabaseMode,
    #[error("backend postgres needs spec.database, backend etcd needs spec.etcd")]
    StoreMissing,
    #[error("spec.etcd must set exactly one of managed or external")]
    EtcdMode,
    #[error("spec.railProxy.railUrl is required unless spec.railStub.enabled is true")]
    RailUrl,
}

impl SpecError {
    pub fn reason(&self) -> crate::reasons::Reason {
        crate::reasons::Reason::InvalidSpec
    }
}

#[cfg(test)]
mod tests;
