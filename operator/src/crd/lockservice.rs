//! `LockService`: a lock-server Deployment over its own lockdb (backend postgres) or over an etcd
//! cluster (backend etcd, managed by the operator or external).

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::database::DatabaseSpec;
use super::etcd::EtcdSpec;
use super::status::DlockStatus;

/// Lease TTL bounds in the CR, in milliseconds. Inside the lock API's own bounds
/// (`dlock_common::validate::{MIN_TTL_MS, MAX_TTL_MS}`, checked by a test), and no shorter than
/// 100 ms: a cluster cannot renew anything faster.
pub const MIN_LEASE_TTL_MS: i64 = 100;
pub const MAX_LEASE_TTL_MS: i64 = 86_400_000;
/// Replica bounds for every Deployment the operator manages.
pub const MAX_REPLICAS: i32 = 20;

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "dlock.dev",
    version = "v1alpha1",
    kind = "LockService",
    namespaced,
    status = "DlockStatus",
    shortname = "lsvc",
    category = "dlock",
    derive = "PartialEq",
    doc = "A fenced lock service: lock-server over its own PostgreSQL lockdb, or over etcd.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.lockServer.replicas"),
    printcolumn(name = "Schema", type_ = "integer", json_path = ".status.migration.appliedVersion"),
    printcolumn(name = "Etcd-Ready", type_ = "string", json_path = ".status.etcd.ready"),
    printcolumn(name = "DB-Ready", type_ = "string", json_path = ".status.database.ready"),
    printcolumn(name = "Primary", type_ = "string", json_path = ".status.database.primary", priority = "1"),
    printcolumn(name = "Sync", type_ = "string", json_path = ".status.database.synchronous", priority = "1"),
    printcolumn(name = "DB-Timeline", type_ = "integer", json_path = ".status.database.timeline", priority = "1"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoints.lockServer", priority = "1"),
    printcolumn(name = "Last-Action", type_ = "string", json_path = ".status.lastAction"),
    printcolumn(name = "Sequence", type_ = "integer", json_path = ".status.fencing.sequence"),
    printcolumn(name = "High-Water", type_ = "integer", json_path = ".status.fencing.highWater"),
    printcolumn(name = "Timeline", type_ = "integer", json_path = ".status.sequence.lastJump.timeline"),
    printcolumn(name = "Last-Jump", type_ = "string", json_path = ".status.sequence.lastJump.cause", priority = "1"),
    printcolumn(name = "Gated-By", type_ = "string", json_path = ".status.gate.actionId", priority = "1"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 36")
        .message("metadata.name must be at most 36 characters: child names add suffixes such as -lockdb-migrate-<hash>")
        .reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.backend) && self.backend == 'etcd') != has(self.database)")
        .message("spec.database is required with backend postgres (lockdb) and not allowed with backend etcd, which keeps no lockdb")
        .reason(Reason::FieldValueInvalid),
    validation = Rule::new("(has(self.backend) && self.backend == 'etcd') == has(self.etcd)")
        .message("spec.etcd is required with backend etcd and not allowed with backend postgres")
        .reason(Reason::FieldValueInvalid)
)]
pub struct LockServiceSpec {
    /// lockdb (backend postgres): managed PostgreSQL or an external database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseSpec>,
    /// The etcd cluster (backend etcd): managed by the operator or external.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,
    #[serde(default)]
    pub lock_server: LockServerSpec,
    #[serde(default)]
    pub lease: LeaseSpec,
    /// Storage behind the fencing tokens: `postgres` (lockdb's sequence) or `etcd` (the etcd
    /// revision). Fixed at creation.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message("backend is immutable: the fencing tokens of one store mean nothing in the other; create a new LockService")
        .reason(Reason::FieldValueForbidden))]
    pub backend: Backend,
    /// Image of the migration Job (it must carry `dlock-migrate` and `/migrations`); defaults to the
    /// lock-server image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_image: Option<String>,
    /// HTTPS on the APIs the object serves: the operator's certificates (the default) or plain HTTP.
    #[serde(default)]
    pub tls: super::tls::TlsSpec,
}

/// What lock-server keeps its grants in, borrowed from the spec.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LockStore<'a> {
    Postgres(&'a DatabaseSpec),
    Etcd(&'a EtcdSpec),
}

impl LockServiceSpec {
    /// The store the backend names; `None` when its block is missing (only objects that bypassed
    /// the CRD's CEL rules can lack it).
    pub fn store(&self) -> Option<LockStore<'_>> {
        match self.backend {
            Backend::Postgres => self.database.as_ref().map(LockStore::Postgres),
            Backend::Etcd => self.etcd.as_ref().map(LockStore::Etcd),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockServerSpec {
    #[serde(default = "default_lock_server_replicas")]
    #[schemars(range(min = 0, max = 20))]
    pub replicas: i32,
    /// dlock image; the operator's `--image` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Lock clients of your own (applications other than the payout executors of the
    /// PaymentStacks that use this LockService): a Secret key holding them in lock-server's
    /// clients-file format (`{"clients": [...]}`, docs/lock-api.md). The operator adds them to the
    /// clients file it builds from its PaymentStacks; their owner prefixes must not overlap the
    /// stacks' (`<stack>/`). Read at each reconcile: a change rolls lock-server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients_secret_ref: Option<ClientsSecretRef>,
}

/// A key of a Secret in the LockService's namespace holding lock clients.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientsSecretRef {
    #[schemars(length(min = 1))]
    pub name: String,
    #[serde(default = "default_clients_key")]
    #[schemars(length(min = 1))]
    pub key: String,
}

fn default_clients_key() -> String {
    "clients.json".to_owned()
}

impl Default for LockServerSpec {
    fn default() -> Self {
        LockServerSpec {
            replicas: default_lock_server_replicas(),
            image: None,
            resources: None,
            clients_secret_ref: None,
        }
    }
}

/// The leases the payout executors of every PaymentStack on this LockService take (lock-server
/// itself has none: each acquire and session names its TTL). The range is within what the executor
/// accepts (10..=86400000).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSpec {
    /// TTL of each account lock an executor takes, in milliseconds (renewed every third of it).
    #[serde(default = "default_lease_ttl_ms")]
    #[schemars(range(min = 100, max = 86_400_000))]
    pub default_ttl_ms: i64,
    /// TTL of each executor worker's session (a heartbeat every third of it), in milliseconds.
    #[serde(default = "default_session_ttl_ms")]
    #[schemars(range(min = 100, max = 86_400_000))]
    pub session_ttl_ms: i64,
}

impl Default for LeaseSpec {
    fn default() -> Self {
        LeaseSpec {
            default_ttl_ms: default_lease_ttl_ms(),
            session_ttl_ms: default_session_ttl_ms(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Postgres,
    /// lock-server `--backend etcd`, over the cluster in `spec.etcd`.
    Etcd,
}

fn default_lock_server_replicas() -> i32 {
    2
}

fn default_lease_ttl_ms() -> i64 {
    10_000
}

fn default_session_ttl_ms() -> i64 {
    30_000
}
