//! The etcd block of a LockService with `backend: etcd`: a managed etcd cluster (a StatefulSet of
//! an odd number of members) or an external one whose client URLs live in a Secret.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::database::CaSecretRef;

/// Exactly one of `managed` or `external`, fixed at creation: the fencing token is the etcd
/// revision, so moving to another cluster would restart the tokens behind those the resources saw.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.managed) != has(self.external)")
        .message("set exactly one of etcd.managed (the operator runs the members) or etcd.external (a Secret names the client URLs)")
        .reason(Reason::FieldValueInvalid),
    validation = Rule::new("has(self.managed) == has(oldSelf.managed)")
        .message("etcd mode (managed vs external) is immutable after creation: the fencing tokens are that cluster's revisions")
        .reason(Reason::FieldValueForbidden)
)]
pub struct EtcdSpec {
    /// An etcd cluster run by the operator: a StatefulSet of `replicas` members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedEtcd>,
    /// An etcd cluster run elsewhere; its client URLs come from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalEtcd>,
    /// Key prefix lock-server keeps its sessions and grants under (`--etcd-prefix`).
    #[serde(default = "default_key_prefix")]
    #[x_kube(validation = Rule::new("self.startsWith('/') && self.endsWith('/') && self.size() >= 2")
        .message("etcd.keyPrefix must start and end with '/', e.g. /dlock/"))]
    pub key_prefix: String,
}

impl EtcdSpec {
    /// The mode, or `None` when the block sets neither or both (only objects that bypassed the
    /// CRD's CEL rule can).
    pub fn mode(&self) -> Option<EtcdMode<'_>> {
        match (&self.managed, &self.external) {
            (Some(m), None) => Some(EtcdMode::Managed(m)),
            (None, Some(e)) => Some(EtcdMode::External(e)),
            _ => None,
        }
    }

    pub fn managed() -> Self {
        EtcdSpec {
            managed: Some(ManagedEtcd::default()),
            external: None,
            key_prefix: default_key_prefix(),
        }
    }

    pub fn external(secret_name: &str) -> Self {
        EtcdSpec {
            managed: None,
            external: Some(ExternalEtcd {
                secret_ref: EndpointsSecretRef {
                    name: secret_name.to_owned(),
                    key: default_endpoints_key(),
                },
                ca_secret_ref: None,
                client_certificate_secret_ref: None,
            }),
            key_prefix: default_key_prefix(),
        }
    }
}

/// Which etcd a spec asks for, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EtcdMode<'a> {
    Managed(&'a ManagedEtcd),
    External(&'a ExternalEtcd),
}

/// The member count and the volumes are fixed at creation: the members bootstrap their cluster
/// once (`--initial-cluster-state new`), and a StatefulSet's claim templates are immutable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedEtcd {
    /// Number of members: odd, so that a majority survives the loss of (replicas - 1) / 2.
    #[serde(default = "default_etcd_replicas")]
    #[schemars(range(min = 1, max = 7))]
    #[x_kube(
        validation = Rule::new("self % 2 == 1")
            .message("etcd.managed.replicas must be odd (1, 3, 5 or 7): an even count tolerates no more lost members than the odd count below it")
            .reason(Reason::FieldValueInvalid),
        validation = Rule::new("self == oldSelf")
            .message("etcd.managed.replicas is immutable: the members formed their cluster at creation; change membership with etcdctl member add/remove")
            .reason(Reason::FieldValueForbidden)
    )]
    pub replicas: i32,
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message("etcd.managed.storage is immutable: a StatefulSet's volumes are fixed at creation")
        .reason(Reason::FieldValueForbidden))]
    pub storage: EtcdStorage,
    /// etcd image (it must run `etcd` from PATH; etcd >= 3.5 for the /readyz probe).
    #[serde(default = "default_etcd_image")]
    #[schemars(length(min = 1))]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for ManagedEtcd {
    fn default() -> Self {
        ManagedEtcd {
            replicas: default_etcd_replicas(),
            storage: EtcdStorage::default(),
            image: default_etcd_image(),
            resources: None,
        }
    }
}

/// Each member's data directory: a PersistentVolumeClaim (the default), or an emptyDir for
/// throwaway clusters: with `emptyDir` a member that restarts comes back without its data, and all
/// of them restarting at once starts the revisions — the fencing tokens — from 1 again.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.emptyDir) && self.emptyDir) || !has(self.storageClassName)")
    .message("etcd.managed.storage: emptyDir takes no storageClassName (it uses no PersistentVolumeClaim)")
    .reason(Reason::FieldValueInvalid))]
pub struct EtcdStorage {
    /// Size of each member's volume (a Kubernetes quantity); with `emptyDir`, its size limit.
    #[serde(default = "default_storage_size")]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("etcd.managed.storage.size must be a quantity such as 1Gi"))]
    pub size: String,
    /// StorageClass of the volumes; the cluster default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// An emptyDir instead of a PersistentVolumeClaim: for tests only (see above).
    #[serde(default)]
    pub empty_dir: bool,
}

impl Default for EtcdStorage {
    fn default() -> Self {
        EtcdStorage {
            size: default_storage_size(),
            storage_class_name: None,
            empty_dir: false,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.clientCertificateSecretRef) || has(self.caSecretRef)")
    .message("etcd.external.clientCertificateSecretRef needs etcd.external.caSecretRef: a client certificate is presented over TLS, and lock-server trusts only the CA it is given")
    .reason(Reason::FieldValueInvalid))]
pub struct ExternalEtcd {
    /// The Secret key holding the cluster's client URLs, comma-separated, all in one scheme, e.g.
    /// `https://etcd-0.example:2379,https://etcd-1.example:2379`.
    pub secret_ref: EndpointsSecretRef,
    /// The PEM CA that signs the etcd members' server certificates: required when the URLs are
    /// `https://` (lock-server then trusts this CA alone), refused when they are `http://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<CaSecretRef>,
    /// A Secret of type `kubernetes.io/tls` (`tls.crt`, `tls.key`): the client certificate
    /// lock-server presents to an etcd that runs with `--client-cert-auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret_ref: Option<TlsSecretRef>,
}

/// A Secret of type `kubernetes.io/tls` in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSecretRef {
    #[x_kube(validation = Rule::new("self.size() > 0").message("clientCertificateSecretRef.name must not be empty"))]
    pub name: String,
}

/// A key of a Secret in the LockService's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointsSecretRef {
    #[x_kube(validation = Rule::new("self.size() > 0").message("etcd.external.secretRef.name must not be empty"))]
    pub name: String,
    #[serde(default = "default_endpoints_key")]
    #[x_kube(validation = Rule::new("self.size() > 0").message("etcd.external.secretRef.key must not be empty"))]
    pub key: String,
}

pub fn default_key_prefix() -> String {
    "/dlock/".to_owned()
}

pub fn default_etcd_replicas() -> i32 {
    3
}

/// The etcd kubeadm 1.34 deploys; its image carries `etcd` in /usr/local/bin.
pub fn default_etcd_image() -> String {
    "registry.k8s.io/etcd:3.6.5-0".to_owned()
}

fn default_storage_size() -> String {
    "1Gi".to_owned()
}

pub fn default_endpoints_key() -> String {
    "endpoints".to_owned()
}
