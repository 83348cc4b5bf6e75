//! Status shared by both kinds: phase, standard conditions, endpoints, the migration history applied,
//! and room for operator actions (force-revoke, restore fast-forward) requested through the spec.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// The outcome of one operator action (reserved for force-revoke and restore fast-forward: each is
/// requested in the spec with an `id`, and reported here under the same id, so retries are idempotent).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionStatus {
    /// The request id from the spec.
    pub id: String,
    /// `revoke` or `restore`.
    #[serde(rename = "type")]
    pub type_: String,
    /// e.g. Pending, Running, Succeeded, Failed.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Step-by-step detail (e.g. previous owner and token, each fast-forward step).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
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
    /// Outcomes of operator actions, by request id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<ActionStatus>,
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
