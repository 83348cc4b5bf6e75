//! Step 1 of a LockService with `backend: etcd`, in place of the database step: how many managed
//! members are ready, or whether the external cluster's Secret names usable client URLs.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::Context;
use super::error::Result;
use super::status::{Blocked, EtcdHealth};
use crate::builders::Owner;
use crate::builders::etcd::{self, parse_endpoints};
use crate::crd::{EtcdMode, EtcdSpec};
use crate::reasons::Reason;

/// What the etcd step found.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdState {
    pub health: EtcdHealth,
    /// resourceVersion of the external cluster's Secret (lock-server reads it at start-up).
    pub secret_version: Option<String>,
}

/// `Ok(Err(blocked))` for problems a human must fix; `Err` for API failures worth a retry.
pub async fn resolve(ctx: &Context, owner: &Owner, spec: &EtcdSpec) -> Result<Result<EtcdState, Blocked>> {
    let Some(mode) = spec.mode() else {
        return Ok(Err(Blocked::new(
            Reason::InvalidSpec,
            "spec.etcd must set exactly one of managed or external",
        )));
    };
    let ns = &owner.namespace;
    match mode {
        EtcdMode::Managed(managed) => {
            let sts: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), ns);
            let ready = sts
                .get_opt(&etcd::names(owner).server)
                .await?
                .and_then(|s| s.status)
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            Ok(Ok(EtcdState {
                health: EtcdHealth::Managed {
                    members: managed.replicas,
                    ready,
                },
                secret_version: None,
            }))
        }
        EtcdMode::External(external) => {
            let r = &external.secret_ref;
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
            let Some(secret) = secrets.get_opt(&r.name).await? else {
                return Ok(Err(Blocked::new(
                    Reason::ExternalSecretMissing,
                    format!(
                        "Secret {} named by spec.etcd.external.secretRef does not exist",
                        r.name
                    ),
                )));
            };
            let raw = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok());
            let Some(raw) = raw else {
                return Ok(Err(Blocked::new(
                    Reason::ExternalSecretInvalid,
                    format!("Secret {} has no UTF-8 key {:?}", r.name, r.key),
                )));
            };
            // The URLs are not secret, but the message names only the problem, as for lockdb.
            if let Err(e) = parse_endpoints(&raw) {
                return Ok(Err(Blocked::new(
                    Reason::EtcdEndpointsInvalid,
                    format!(
                        "Secret {} key {:?} must hold etcd client URLs, comma-separated http://host:port: {e}",
                        r.name, r.key
                    ),
                )));
            }
            Ok(Ok(EtcdState {
                health: EtcdHealth::External,
                secret_version: secret.metadata.resource_version,
            }))
        }
    }
}
