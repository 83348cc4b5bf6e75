//! Status shared by both kinds: phase, standard conditions, endpoints, the migration history applied,
//! and the operator actions (force-revoke, restore fast-forward) requested through annotations.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::actions::{ActionPhase, ActionStatus, ActionStep, ActionType, FencingStatus, GateStatus};

/// Coarse lifecycle, for `kubectl get`. Conditions carry the detail.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum Phase {
    /// Waiting for the database, the LockService, or the first rollout.
    #[default]
    Pending,
    /// The migration Job is running; the Deployments that need the schema are held back.
    Migrating,
    /// Every Deployment asked for is available.
    Ready,
    /// Something needs a human: a failed migration, an unusable external database, an invalid spec.
    Degraded,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Phase::Pending => "Pending",
            Phase::Migrating => "Migrating",
            Phase::Ready => "Ready",
            Phase::Degraded => "Degraded",
        };
        f.write_str(s)
    }
}

/// The last migration Job the operator ran for this object's database.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// Which history: `lockdb` or `paydb`.
    pub history: String,
    /// Name of the Job that applies the current image's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Highest versioned migration (`V<n>`) applied, as reported by the Job's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_version: Option<i64>,
    /// Whether that Job has succeeded.
    #[serde(default)]
    pub succeeded: bool,
}

/// LockService with backend etcd: the cluster lock-server runs on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct EtcdStatus {
    /// `managed` or `external`.
    pub mode: String,
    /// Managed: members the StatefulSet asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<i32>,
    /// Managed: members whose readiness probe (etcd's /readyz) passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_members: Option<i32>,
    /// For `kubectl get`: `ready/members` (managed) or `external`.
    pub ready: String,
}

/// A managed database on CloudNativePG (`database.managed.engine: CloudNativePG`), as its Cluster
/// reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// The CloudNativePG Cluster's name.
    pub cluster: String,
    /// The instance (pod) that is primary; absent while none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// For `kubectl get`: `ready/instances`.
    pub ready: String,
    pub instances: i32,
    pub ready_instances: i32,
    /// `any N (required|preferred)`, or `async`.
    pub synchronous: String,
    /// The PostgreSQL timeline of the primary: it goes up by one at each promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    /// CloudNativePG's phase (e.g. `Cluster in healthy state`, `Failing over`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_phase: Option<String>,
    /// The last change of primary the operator saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_primary_change: Option<PrimaryChange>,
}

/// One change of primary: a failover (CloudNativePG promoted a standby after losing the primary) or
/// a switchover (one asked for).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PrimaryChange {
    /// `Failover` or `Switchover`.
    pub kind: String,
    pub from: String,
    pub to: String,
    /// When the operator saw it (RFC 3339).
    pub seen_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
}

/// What the controller last saw and did. Identical for both kinds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DlockStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub phase: Phase,
    /// `Ready`, `Progressing`, `Degraded` (metav1.Condition).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// In-cluster URLs of the Services, by component (e.g. `lockServer`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStatus>,
    /// Outcomes of operator actions, keyed by request id (a map list: one entry per id), the most
    /// recent last, bounded to [`super::actions::ACTION_HISTORY`] finished entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"]))]
    pub actions: Vec<ActionStatus>,
    /// LockService: present while lock traffic is gated by a restore fast-forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateStatus>,
    /// LockService: the last comparison of the fencing sequence with the resources' high-water.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingStatus>,
    /// LockService with backend postgres: lock-server's last jump of `fencing_token_seq` (a new
    /// lockdb history: its start, a promotion, a restore, a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<super::sequence::SequenceStatus>,
    /// LockService with backend etcd: its members' readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdStatus>,
    /// A managed database on CloudNativePG: its primary, instances, replication and timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseStatus>,
    /// LockService: id of the most recent action, and its phase (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_action: Option<String>,
    /// Signed grants: a LockService's published keys and the one lock-server signs with; a
    /// PaymentStack's keys its payment-resource and rail-proxy are rolled out with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<GrantStatus>,
    /// HTTPS: the namespace's CA and the certificates issued for the object's components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<super::tls::TlsStatus>,
}

/// The grant keys, as `status.grants` reports them (docs/operations.md, "Rotating the grant signing
/// key"). Key ids only: no key material is ever in status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantStatus {
    /// LockService: the published public keys (ConfigMap `<name>-grant-public-keys`), oldest first.
    /// PaymentStack: the keys its payment-resource and rail-proxy verify with, once both are rolled
    /// out with them (what lets the LockService switch its signer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_ids: Vec<String>,
    /// LockService: the key lock-server signs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key_id: Option<String>,
    /// LockService: the last `dlock.dev/grant-keys` request handled, and what became of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<String>,
    /// What the grant keys are waiting for, if anything (a rotation under way, a pending request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl DlockStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// `Ready=True` for the generation the controller last observed.
    pub fn is_ready(&self) -> bool {
        self.condition(CONDITION_READY)
            .is_some_and(|c| c.status == "True")
    }
}

pub const CONDITION_READY: &str = "Ready";
pub const CONDITION_PROGRESSING: &str = "Progressing";
pub const CONDITION_DEGRADED: &str = "Degraded";
