//! The database block shared by both kinds: a managed PostgreSQL 16 StatefulSet, or an external
//! database (e.g. Cloud SQL) whose owner-role URL lives in a Secret.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::KubeSchema;
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
/// itself instead.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.storageSize == oldSelf.storageSize && has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)")
        .message("storageSize and storageClassName are immutable: resize the PersistentVolumeClaim directly")
        .reason(Reason::FieldValueForbidden)
)]
pub struct ManagedDatabase {
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
            storage_size: default_storage_size(),
            storage_class_name: None,
            image: default_postgres_image(),
            resources: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalDatabase {
    /// The Secret key holding a `postgres://` URL of a role that owns the database (it runs the
    /// migrations and sets the application role's password).
    pub secret_ref: SecretKeyRef,
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

pub fn default_storage_size() -> String {
    "1Gi".to_owned()
}

pub fn default_postgres_image() -> String {
    "postgres:16".to_owned()
}

pub fn default_url_key() -> String {
    "url".to_owned()
}
