//! The reads and writes of the HTTPS step ([`super::plan`] decides): the namespace's CA Secret (read
//! only when the owner serves HTTPS: it holds the CA's key), its bundle ConfigMap, and the served
//! components' certificate Secrets. The CA is created, never overwritten; the bundle and the
//! certificates are applied.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;

use super::certs::Pair;
use super::{Observed, Served, TlsPlan, Write};
use crate::builders::tls::{CA_BUNDLE, CA_BUNDLE_KEY, CA_SECRET};
use crate::builders::{LABEL_MANAGED_BY, LABEL_PART_OF, MANAGED_BY, Owner};
use crate::context::Context;
use crate::controller::apply;
use crate::error::{Error, Result};
use crate::reasons::Reason;

const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const CA_CRT: &str = "ca.crt";

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok().filter(|t| !t.is_empty())
}

fn pair(secret: &Secret) -> Option<Pair> {
    Some(Pair {
        cert_pem: text(secret, TLS_CRT)?,
        key_pem: text(secret, TLS_KEY)?,
    })
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
    let ca = secrets
        .get_opt(CA_SECRET)
        .await
        .map_err(|e| Error::step("read the CA Secret", e))?
        .map(|s| pair(&s).ok_or_else(|| format!("it lacks {TLS_CRT} or {TLS_KEY}")));
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
