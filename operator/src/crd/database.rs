//! The database block shared by both kinds: a managed PostgreSQL 16 (one pod in the operator's own
//! StatefulSet, or a highly available CloudNativePG Cluster), or an external database (e.g. Cloud
//! SQL) whose owner-role URL lives in a Secret.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Exactly one of `managed` or `external`. The choice is fixed at creation: switching would strand
/// the data (and, for lockdb, restart the token sequence behind tokens the resources have seen).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.managed) != has(self.external)")
        .message("set exactly one of database.managed or database.external: managed mode takes no secretRef, external mode requires one")
        .reason(Reason::FieldValueInvalid),
    validation = Rule::new("has(self.managed) == has(oldSelf.managed)")
        .message("database mode (managed vs external) is immutable after creation")
        .reason(Reason::FieldValueForbidden)
)]
pub struct DatabaseSpec {
    /// A PostgreSQL StatefulSet run by the operator, with a generated password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedDatabase>,
    /// A database run elsewhere; the operator only reads its URL from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalDatabase>,
}

impl DatabaseSpec {
    /// The mode, or `None` when the block sets neither or both (only objects that bypassed the
    /// CRD's CEL rule can; the controller reports them as an invalid spec).
    pub fn mode(&self) -> Option<DatabaseMode<'_>> {
        match (&self.managed, &self.external) {
            (Some(managed), None) => Some(DatabaseMode::Managed(managed)),
            (None, Some(external)) => Some(DatabaseMode::External(external)),
            _ => None,
        }
    }

    pub fn managed() -> Self {
        DatabaseSpec {
            managed: Some(ManagedDatabase::default()),
            external: None,
        }
    }

    pub fn external(secret_name: &str) -> Self {
        DatabaseSpec {
            managed: None,
            external: Some(ExternalDatabase {
                secret_ref: SecretKeyRef {
                    name: secret_name.to_owned(),
                    key: default_url_key(),
                },
                ca_secret_ref: None,
            }),
        }
    }
}

/// Which database a spec asks for, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DatabaseMode<'a> {
    Managed(&'a ManagedDatabase),
    External(&'a ExternalDatabase),
}

/// The volume is fixed at creation (a StatefulSet's claim templates are immutable): resize the PVC
/// itself instead. The engine too: moving a database between engines is a dump and a restore, not
/// a change of field.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    // The rules read absent fields as their defaults: the API server defaults before it validates,
    // but a rule must not depend on that to mean what it says.
    validation = Rule::new("self.storageSize == oldSelf.storageSize && has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)")
        .message("storageSize and storageClassName are immutable: resize the PersistentVolumeClaim directly")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("(has(self.engine) ? self.engine : 'StatefulSet') == (has(oldSelf.engine) ? oldSelf.engine : 'StatefulSet')")
        .message("database.managed.engine is immutable after creation: moving the data to another engine is a backup and a restore into a new object")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("(has(self.engine) && self.engine == 'CloudNativePG') || !has(self.instances) || self.instances == 1")
        .message("database.managed.instances above 1 needs engine: CloudNativePG (the StatefulSet engine runs exactly one PostgreSQL pod)")
        .reason(Reason::FieldValueInvalid),
    validation = Rule::new("!has(self.synchronous) || (has(self.engine) && self.engine == 'CloudNativePG')")
        .message("database.managed.synchronous needs engine: CloudNativePG (the StatefulSet engine has no standby)")
        .reason(Reason::FieldValueInvalid),
    validation = Rule::new("!has(self.synchronous) || (has(self.synchronous.number) ? self.synchronous.number : 1) < (has(self.instances) ? self.instances : 1)")
        .message("database.managed.synchronous.number must be below instances: each synchronous standby is an instance besides the primary")
        .reason(Reason::FieldValueInvalid)
)]
pub struct ManagedDatabase {
    /// Who runs PostgreSQL: `StatefulSet` (the default: one pod run by this operator, for laptops
    /// and tests) or `CloudNativePG` (a `postgresql.cnpg.io/v1` Cluster: a primary, standbys and
    /// automatic failover, run by CloudNativePG, which must be installed in the cluster).
    /// Immutable.
    #[serde(default)]
    pub engine: DatabaseEngine,
    /// PostgreSQL instances (engine CloudNativePG): one primary and `instances - 1` streaming
    /// standbys. Scaling up or down is a change of this field.
    #[serde(default = "default_instances")]
    #[schemars(range(min = 1, max = 9))]
    pub instances: i32,
    /// Synchronous replication (engine CloudNativePG). Absent: asynchronous, CloudNativePG's
    /// default, where a failover can lose writes the primary had acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous: Option<Synchronous>,
    /// Size of the data volume (a Kubernetes quantity, e.g. 1Gi).
    #[serde(default = "default_storage_size")]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("storageSize must be a quantity such as 1Gi"))]
    pub storage_size: String,
    /// StorageClass of the data volume; the cluster default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// PostgreSQL image; the schemas are written for PostgreSQL 16.
    #[serde(default = "default_postgres_image")]
    #[schemars(length(min = 1))]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for ManagedDatabase {
    fn default() -> Self {
        ManagedDatabase {
            engine: DatabaseEngine::default(),
            instances: default_instances(),
            synchronous: None,
            storage_size: default_storage_size(),
            storage_class_name: None,
            image: default_postgres_image(),
            resources: None,
        }
    }
}

/// Who runs a managed database.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DatabaseEngine {
    /// One PostgreSQL pod in a StatefulSet of this operator.
    #[default]
    StatefulSet,
    /// A CloudNativePG `Cluster`: CloudNativePG runs the instances, replication and failover.
    #[serde(rename = "CloudNativePG")]
    CloudNativePg,
}

/// Synchronous replication: a commit returns once `number` standbys have it (CloudNativePG's
/// `postgresql.synchronous` with method `any`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Synchronous {
    /// How many standbys must confirm each commit.
    #[serde(default = "default_synchronous_number")]
    #[schemars(range(min = 1, max = 8))]
    pub number: i32,
    /// `Required` (the default): with fewer healthy standbys than `number`, commits wait — every
    /// grant and payout blocks rather than be acknowledged by the primary alone. `Preferred`:
    /// replication falls back to asynchronous while standbys are missing, and a failover in that
    /// time can lose acknowledged writes.
    #[serde(default)]
    pub data_durability: DataDurability,
}

impl Default for Synchronous {
    fn default() -> Self {
        Synchronous {
            number: default_synchronous_number(),
            data_durability: DataDurability::default(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DataDurability {
    #[default]
    Required,
    Preferred,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalDatabase {
    /// The Secret key holding a `postgres://` URL of a role that owns the database (it runs the
    /// migrations and sets the application role's password).
    pub secret_ref: SecretKeyRef,
    /// The CA that signed the server's certificate (PEM), for `sslmode=verify-full`: a Secret key
    /// (default `ca.crt`). The operator mounts it into every container that connects, and the URLs
    /// it hands out name it (`sslrootcert`) and verify the server against it (`sslmode`
    /// verify-full unless the URL says verify-ca). The URL then names no `sslrootcert` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<CaSecretRef>,
}

impl ExternalDatabase {
    /// Where the migration and action Jobs read the owner-role URL: the user's Secret, or, with a
    /// CA, the connection Secret's `admin-url` (`None`), which names the mounted CA file.
    pub fn owner_url_ref(&self) -> Option<&SecretKeyRef> {
        match self.ca_secret_ref {
            Some(_) => None,
            None => Some(&self.secret_ref),
        }
    }
}

/// A Secret key holding a PEM CA certificate, in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaSecretRef {
    #[x_kube(validation = Rule::new("self.size() > 0").message("caSecretRef.name must not be empty"))]
    pub name: String,
    #[serde(default = "default_ca_key")]
    #[x_kube(validation = Rule::new("self.size() > 0").message("caSecretRef.key must not be empty"))]
    pub key: String,
}

pub fn default_ca_key() -> String {
    "ca.crt".to_owned()
}

/// A key of a Secret in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[x_kube(validation = Rule::new("self.size() > 0").message("secretRef.name must not be empty"))]
    pub name: String,
    #[serde(default = "default_url_key")]
    #[x_kube(validation = Rule::new("self.size() > 0").message("secretRef.key must not be empty"))]
    pub key: String,
}

pub fn default_instances() -> i32 {
    1
}

pub fn default_synchronous_number() -> i32 {
    1
}

pub fn default_storage_size() -> String {
    "1Gi".to_owned()
}

pub fn default_postgres_image() -> String {
    "postgres:16".to_owned()
}

pub fn default_url_key() -> String {
    "url".to_owned()
}
