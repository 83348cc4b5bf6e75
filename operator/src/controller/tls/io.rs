//! The reads and writes of the HTTPS step ([`super::plan`] decides): the namespace's CA Secret (read
//! only when the owner serves HTTPS: it holds the CA's key), its bundle ConfigMap, and the served
//! components' certificate Secrets; during a rotation of the CA, the namespace's Deployments that
//! trust the bundle and its other objects' `status.tls`. The CA is created, never overwritten but
//! by its rotation's two patches (made against the resourceVersion read); the bundle and the
//! certificates are applied.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::NamespaceResourceScope;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::certs::Pair;
use super::{Client, Observed, Peer, Served, TlsPlan, Write};
use crate::builders::tls::{CA_BUNDLE, CA_BUNDLE_ANNOTATION, CA_BUNDLE_KEY, CA_SECRET};
use crate::builders::{LABEL_MANAGED_BY, LABEL_PART_OF, MANAGED_BY, Owner};
use crate::context::Context;
use crate::controller::apply;
use crate::crd::{DlockStatus, LockService, PaymentStack};
use crate::error::{Error, Result};
use crate::reasons::Reason;

const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";
/// The CA's successor during a rotation, beside it in the CA Secret.
const NEXT_CRT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok().filter(|t| !t.is_empty())
}

fn pair(secret: &Secret) -> Option<Pair> {
    pair_at(secret, TLS_CRT, TLS_KEY)
}

fn pair_at(secret: &Secret, crt: &str, key: &str) -> Option<Pair> {
    Some(Pair {
        cert_pem: text(secret, crt)?,
        key_pem: text(secret, key)?,
    })
}

/// Every replica runs the Deployment's current template, and no old one is left.
fn rolled_out(d: &Deployment) -> bool {
    let health = crate::health::DeploymentHealth::of(d);
    let total = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    health.is_available() && total <= health.desired
}

/// The namespace's Deployments that mount the bundle (its hash is in their pod template).
async fn clients(ctx: &Context, ns: &str) -> Result<Vec<Client>> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let list = deployments
        .list(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")))
        .await
        .map_err(|e| Error::step("list the namespace's Deployments", e))?;
    Ok(list
        .items
        .iter()
        .filter_map(|d| {
            let annotations = d
                .spec
                .as_ref()?
                .template
                .metadata
                .as_ref()?
                .annotations
                .as_ref()?;
            Some(Client {
                name: d.name_any(),
                bundle: annotations.get(CA_BUNDLE_ANNOTATION)?.clone(),
                rolled_out: rolled_out(d),
            })
        })
        .collect())
}

/// The namespace's other objects that serve HTTPS, with what their status says signed them.
async fn peers(ctx: &Context, owner: &Owner) -> Result<Vec<Peer>> {
    let ns = &owner.namespace;
    let mut found = https_objects(ctx, ns, |o: &LockService| (o.spec.tls.https(), o.status.as_ref())).await?;
    found.extend(
        https_objects(ctx, ns, |o: &PaymentStack| {
            (o.spec.tls.https(), o.status.as_ref())
        })
        .await?,
    );
    let me = format!("{}/{}", owner.kind, owner.name);
    found.retain(|p| p.name != me);
    Ok(found)
}

/// The objects of kind `K` in `ns` that serve HTTPS (`view`: its `spec.tls` and its status), as
/// peers.
async fn https_objects<K>(
    ctx: &Context,
    ns: &str,
    view: impl Fn(&K) -> (bool, Option<&DlockStatus>),
) -> Result<Vec<Peer>>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::step("list the namespace's objects that serve HTTPS", e))?;
    Ok(list
        .items
        .iter()
        .filter_map(|o| {
            let (https, status) = view(o);
            https.then(|| Peer {
                name: format!("{}/{}", K::kind(&()), o.name_any()),
                signed_by: status
                    .and_then(|s| s.tls.as_ref())
                    .and_then(|t| t.signed_by.clone()),
            })
        })
        .collect())
}

/// What the plan needs: the CA (with `https` only), the bundle, each served component's Secret.
pub async fn observe(ctx: &Context, owner: &Owner, https: bool, served: &[Served]) -> Result<Observed> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let bundle = configmaps
        .get_opt(CA_BUNDLE)
        .await
        .map_err(|e| Error::step("read the CA bundle ConfigMap", e))?
        .and_then(|cm| cm.data?.remove(CA_BUNDLE_KEY));
    if !https {
        return Ok(Observed {
            bundle,
            ..Observed::default()
        });
    }
    let ca_secret = secrets
        .get_opt(CA_SECRET)
        .await
        .map_err(|e| Error::step("read the CA Secret", e))?;
    let ca = ca_secret
        .as_ref()
        .map(|s| pair(s).ok_or_else(|| format!("it lacks {TLS_CRT} or {TLS_KEY}")));
    let next = ca_secret.as_ref().and_then(|s| {
        let has = |k: &str| s.data.as_ref().is_some_and(|d| d.contains_key(k));
        (has(NEXT_CRT) || has(NEXT_KEY)).then(|| {
            pair_at(s, NEXT_CRT, NEXT_KEY).ok_or_else(|| format!("it lacks {NEXT_CRT} or {NEXT_KEY}"))
        })
    });
    // Only a rotation looks across the namespace.
    let (clients, peers) = if matches!(next, Some(Ok(_))) {
        (clients(ctx, &owner.namespace).await?, peers(ctx, owner).await?)
    } else {
        (Vec::new(), Vec::new())
    };
    let mut leaves = BTreeMap::new();
    for s in served {
        let found = secrets
            .get_opt(&s.secret)
            .await
            .map_err(|e| Error::step("read a certificate Secret", e))?;
        leaves.insert(s.secret.clone(), found.as_ref().and_then(pair));
    }
    Ok(Observed {
        https,
        ca,
        bundle,
        leaves,
        ca_version: ca_secret.and_then(|s| s.metadata.resource_version),
        next,
        clients,
        peers,
        ca_overlap: i64::try_from(ctx.settings.ca_overlap.as_secs()).unwrap_or(i64::MAX),
        ..Observed::default()
    })
}

fn namespace_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.into(), MANAGED_BY.into()),
        (LABEL_PART_OF.into(), "dlock".into()),
    ])
}

fn tls_secret(meta: ObjectMeta, pair: &Pair, ca_pem: Option<&str>) -> Secret {
    let mut data = BTreeMap::from([
        (TLS_CRT.to_owned(), ByteString(pair.cert_pem.clone().into_bytes())),
        (TLS_KEY.to_owned(), ByteString(pair.key_pem.clone().into_bytes())),
    ]);
    if let Some(ca) = ca_pem {
        data.insert(CA_CRT.into(), ByteString(ca.as_bytes().to_vec()));
    }
    Secret {
        metadata: meta,
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Makes the plan's writes in order, with an Event and a log line for each. A CA another reconcile
/// created meanwhile fails this one (retried): its certificates were signed by the CA that lost.
pub async fn write(ctx: &Context, owner: &Owner, regarding: &ObjectReference, plan: &TlsPlan) -> Result<()> {
    let ns = &owner.namespace;
    for w in &plan.writes {
        match w {
            Write::Ca(ca) => {
                let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
                let meta = ObjectMeta {
                    name: Some(CA_SECRET.into()),
                    namespace: Some(ns.clone()),
                    labels: Some(namespace_labels()),
                    ..ObjectMeta::default()
                };
                secrets
                    .create(&PostParams::default(), &tls_secret(meta, ca, None))
                    .await
                    .map_err(|e| Error::step("create the namespace's CA Secret", e))?;
                tracing::info!(event = "tls_ca_created", namespace = %ns, secret = CA_SECRET);
                ctx.publish(
                    regarding,
                    EventType::Normal,
                    Reason::CaCreated,
                    format!("made the namespace's CA (Secret {CA_SECRET}, public in ConfigMap {CA_BUNDLE})"),
                )
                .await;
            }
            Write::NextCa { pair, version } => {
                patch_ca(
                    ctx,
                    ns,
                    version,
                    serde_json::json!({ NEXT_CRT: bytes(&pair.cert_pem), NEXT_KEY: bytes(&pair.key_pem) }),
                )
                .await
                .map_err(|e| Error::step("add the successor to the namespace's CA Secret", e))?;
                let ends = super::certs::facts(&pair.cert_pem)
                    .map(|f| f.not_after)
                    .unwrap_or_default();
                tracing::info!(event = "tls_ca_rotation_started", namespace = %ns, secret = CA_SECRET);
                ctx.publish(
                    regarding,
                    EventType::Normal,
                    Reason::CaRotationStarted,
                    format!(
                        "the namespace's CA ends within a year: made its successor (until {}, Secret \
                         {CA_SECRET} keys {NEXT_CRT}/{NEXT_KEY}) and published it beside it in ConfigMap \
                         {CA_BUNDLE}; certificates move to it once every client trusts both",
                        super::rfc3339(ends)
                    ),
                )
                .await;
            }
            Write::PromoteNext { pair, version } => {
                patch_ca(
                    ctx,
                    ns,
                    version,
                    serde_json::json!({
                        TLS_CRT: bytes(&pair.cert_pem),
                        TLS_KEY: bytes(&pair.key_pem),
                        NEXT_CRT: null,
                        NEXT_KEY: null,
                    }),
                )
                .await
                .map_err(|e| Error::step("make the successor the namespace's CA", e))?;
                tracing::info!(event = "tls_ca_rotated", namespace = %ns, secret = CA_SECRET);
                ctx.publish(
                    regarding,
                    EventType::Normal,
                    Reason::CaRotated,
                    format!(
                        "every certificate of the namespace is signed by the new CA: it replaced the old \
                         one in Secret {CA_SECRET}, and ConfigMap {CA_BUNDLE} holds it alone"
                    ),
                )
                .await;
            }
            Write::Bundle(pem) => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(CA_BUNDLE.into()),
                        namespace: Some(ns.clone()),
                        labels: Some(namespace_labels()),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(CA_BUNDLE_KEY.to_owned(), pem.clone())])),
                    ..ConfigMap::default()
                };
                apply::apply(&ctx.client, ns, &cm)
                    .await
                    .map_err(crate::error::at("publish the CA bundle ConfigMap"))?;
                tracing::info!(event = "tls_ca_bundle_published", namespace = %ns, configmap = CA_BUNDLE);
            }
            Write::Leaf {
                component,
                secret,
                pair,
                why,
            } => {
                let meta = owner.meta(secret.clone(), component);
                apply::apply(&ctx.client, ns, &tls_secret(meta, pair, plan.ca_pem.as_deref()))
                    .await
                    .map_err(crate::error::at("write a certificate Secret"))?;
                let (reason, note) = match why {
                    None => (
                        Reason::CertificateIssued,
                        format!("issued the certificate of {component} (Secret {secret})"),
                    ),
                    Some(why) => (
                        Reason::CertificateRenewed,
                        format!(
                            "renewed the certificate of {component} (Secret {secret}): the old one {why}"
                        ),
                    ),
                };
                tracing::info!(event = "tls_certificate_issued", namespace = %ns, name = %owner.name, component = %component, secret = %secret, renewed = why.is_some(), reason = why.as_deref().unwrap_or("none yet"));
                ctx.publish(regarding, EventType::Normal, reason, note).await;
            }
        }
    }
    Ok(())
}

fn bytes(text: &str) -> serde_json::Value {
    serde_json::to_value(ByteString(text.as_bytes().to_vec())).unwrap_or_default()
}

/// A merge patch of the CA Secret's `data`, refused (409) unless the Secret is still at `version`:
/// two reconciles that read the same Secret make one successor, and a promotion never overwrites a
/// CA it did not read.
async fn patch_ca(ctx: &Context, ns: &str, version: &str, data: serde_json::Value) -> kube::Result<Secret> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({ "metadata": { "resourceVersion": version }, "data": data });
    secrets
        .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}
