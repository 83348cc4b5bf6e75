//! `PaymentStack`: paydb, payment-resource, rail-proxy, payout-executor and an optional rail-stub,
//! fenced by the tokens of one LockService.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::database::DatabaseSpec;
use super::status::DlockStatus;

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "dlock.dev",
    version = "v1alpha1",
    kind = "PaymentStack",
    namespaced,
    status = "DlockStatus",
    shortname = "pstack",
    category = "dlock",
    derive = "PartialEq",
    doc = "A payments stack whose resources enforce the fencing tokens of one LockService.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "LockService", type_ = "string", json_path = ".spec.lockServiceRef.name"),
    printcolumn(name = "Fencing", type_ = "boolean", json_path = ".spec.killSwitches.paymentFencingEnabled"),
    printcolumn(name = "Schema", type_ = "integer", json_path = ".status.migration.appliedVersion"),
    printcolumn(name = "DB-Ready", type_ = "string", json_path = ".status.database.ready"),
    printcolumn(name = "Primary", type_ = "string", json_path = ".status.database.primary", priority = "1"),
    printcolumn(name = "Sync", type_ = "string", json_path = ".status.database.synchronous", priority = "1"),
    printcolumn(name = "DB-Timeline", type_ = "integer", json_path = ".status.database.timeline", priority = "1"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 36")
        .message("metadata.name must be at most 36 characters: child names add suffixes such as -paydb-migrate-<hash>")
        .reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.railProxy) && has(self.railProxy.railUrl)) || (has(self.railStub) && self.railStub.enabled)")
        .message("railProxy.railUrl is required unless railStub.enabled is true")
        .reason(Reason::FieldValueRequired)
)]
pub struct PaymentStackSpec {
    /// The LockService (same namespace) whose tokens fence this stack. Immutable: tokens of another
    /// lock service are not comparable with the ones the resources have already seen.
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message("lockServiceRef is immutable: tokens of another LockService are not comparable with those already seen")
        .reason(Reason::FieldValueForbidden))]
    pub lock_service_ref: LocalObjectRef,
    /// paydb: managed PostgreSQL or an external database.
    pub database: DatabaseSpec,
    #[serde(default)]
    pub payment_resource: WorkloadSpec,
    #[serde(default)]
    pub rail_proxy: RailProxySpec,
    #[serde(default)]
    pub payout_executor: PayoutExecutorSpec,
    #[serde(default)]
    pub rail_stub: RailStubSpec,
    #[serde(default)]
    pub kill_switches: KillSwitches,
    /// Image of the migration Job; defaults to the payment-resource image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_image: Option<String>,
    /// Seed paydb with the synthetic, well-known demo accounts (C1 §1.8: for a harness, never for
    /// real money). Off by default: a production paydb starts with zero accounts.
    #[serde(default)]
    pub demo_data: bool,
    /// HTTPS on the APIs the object serves: the operator's certificates (the default) or plain HTTP.
    #[serde(default)]
    pub tls: super::tls::TlsSpec,
}

/// A name in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectRef {
    #[x_kube(validation = Rule::new("self.size() > 0")
        .message("lockServiceRef.name must name a LockService")
        .reason(Reason::FieldValueRequired))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 20))]
    pub replicas: i32,
    /// dlock image; the operator's `--image` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            replicas: default_replicas(),
            image: None,
            resources: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailProxySpec {
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 20))]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The payment rail (http or https URL). Defaults to the in-cluster rail-stub when it is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub rail_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for RailProxySpec {
    fn default() -> Self {
        RailProxySpec {
            replicas: default_replicas(),
            image: None,
            rail_url: None,
            resources: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PayoutExecutorSpec {
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 20))]
    pub replicas: i32,
    /// Concurrent payout workers per replica.
    #[serde(default = "default_workers")]
    #[schemars(range(min = 1, max = 64))]
    pub workers: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for PayoutExecutorSpec {
    fn default() -> Self {
        PayoutExecutorSpec {
            replicas: default_replicas(),
            workers: default_workers(),
            image: None,
            resources: None,
        }
    }
}

/// An in-cluster stand-in for the external payment rail (demos and tests).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RailStubSpec {
    #[serde(default)]
    pub enabled: bool,
    /// Default answer of the stub; `ack` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RailStubMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RailStubMode {
    Ack,
    Reject,
    Timeout,
}

impl RailStubMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RailStubMode::Ack => "ack",
            RailStubMode::Reject => "reject",
            RailStubMode::Timeout => "timeout",
        }
    }
}

/// The contracts' kill switches (`payment.fencing.enabled`, `rail.proxy.fencing.enabled`). Turning one
/// off removes that enforcement point: for demonstrating corruption only. And signed-grant
/// verification at payment-resource and rail-proxy (`grantVerificationEnabled`, on by default): off
/// only for a rolling migration of executors that do not send grants yet (docs/security.md).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KillSwitches {
    #[serde(default = "enabled")]
    pub payment_fencing_enabled: bool,
    #[serde(default = "enabled")]
    pub rail_proxy_fencing_enabled: bool,
    #[serde(default = "enabled")]
    pub grant_verification_enabled: bool,
}

impl Default for KillSwitches {
    fn default() -> Self {
        KillSwitches {
            payment_fencing_enabled: true,
            rail_proxy_fencing_enabled: true,
            grant_verification_enabled: true,
        }
    }
}

fn default_replicas() -> i32 {
    2
}

fn default_workers() -> i32 {
    4
}

fn enabled() -> bool {
    true
}
