//! Step 1 of both reconcilers: the store. A database ([`resolve_database`]): creates the credentials
//! Secret once, works out the connection URLs (managed: from the Service name; external: from the
//! referenced Secret's URL), applies the connection Secret, and reports whether the database can
//! take the migration. An etcd cluster of a LockService with `backend: etcd` ([`resolve_etcd`]), in
//! place of the database: how many managed members are ready, or whether the external cluster's
//! Secret names usable client URLs (and, for `https://` ones, whether its CA and client certificate
//! Secrets hold what lock-server will read).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};

use super::apply;
use super::verdict::{Blocked, EtcdHealth};
use crate::builders::Owner;
use crate::builders::cnpg::{self, Cluster, ClusterHealth};
use crate::builders::etcd_members::{self, parse_endpoints};
use crate::builders::postgres::{self, Credentials, History};
use crate::context::Context;
use crate::crd::{DatabaseEngine, DatabaseMode, DatabaseSpec, EtcdMode, EtcdSpec, ExternalEtcd};
use crate::error::Result;
use crate::reasons::Reason;

/// What the database step found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DatabaseState {
    /// Managed: the StatefulSet has a ready pod. External: assumed reachable (the Job will tell).
    pub ready: bool,
    /// resourceVersion of the connection Secret.
    pub secret_version: Option<String>,
    /// The credentials Secret was created by this reconcile.
    pub credentials_created: bool,
    /// Engine CloudNativePG: its Cluster as read.
    pub cluster: Option<ClusterHealth>,
}

/// `Ok(Err(blocked))` for problems a human must fix; `Err` for API failures worth a retry.
pub async fn resolve_database(
    ctx: &Context,
    owner: &Owner,
    history: History,
    spec: &DatabaseSpec,
) -> Result<Result<DatabaseState, Blocked>> {
    let Some(mode) = spec.mode() else {
        return Ok(Err(Blocked::new(
            Reason::InvalidSpec,
            "spec.database must set exactly one of managed or external",
        )));
    };
    let managed = matches!(mode, DatabaseMode::Managed(_));
    let names = postgres::names(owner, history);
    let client = &ctx.client;
    let ns = &owner.namespace;

    let fresh = postgres::credentials_secret(owner, history, &Credentials::generate(managed));
    let (stored, created) = apply::create_secret_once(client, ns, &fresh).await?;
    let Some(credentials) = Credentials::from_secret(&stored, managed) else {
        return Ok(Err(Blocked::new(
            Reason::CredentialsInvalid,
            format!(
                "Secret {} lacks a password key the database needs; restore it from a backup (it is never regenerated, since the database already uses it)",
                names.credentials_secret
            ),
        )));
    };

    let urls = match mode {
        DatabaseMode::Managed(m) => postgres::managed_urls(owner, history, m.engine, &credentials),
        DatabaseMode::External(external) => {
            let r = &external.secret_ref;
            let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
            let Some(secret) = secrets.get_opt(&r.name).await? else {
                return Ok(Err(Blocked::new(
                    Reason::ExternalSecretMissing,
                    format!(
                        "Secret {} named by spec.database.external.secretRef does not exist",
                        r.name
                    ),
                )));
            };
            let owner_url = secret_text(&secret, &r.key);
            let Some(owner_url) = owner_url else {
                return Ok(Err(Blocked::new(
                    Reason::ExternalSecretInvalid,
                    format!("Secret {} has no UTF-8 key {:?}", r.name, r.key),
                )));
            };
            let ca_file = match &external.ca_secret_ref {
                None => None,
                Some(ca) => {
                    let Some(pem) = secrets
                        .get_opt(&ca.name)
                        .await?
                        .and_then(|s| s.data?.remove(&ca.key))
                        .and_then(|v| String::from_utf8(v.0).ok())
                    else {
                        return Ok(Err(Blocked::new(
                            Reason::ExternalSecretMissing,
                            format!(
                                "spec.database.external.caSecretRef: Secret {} has no key {:?} (the PEM CA that signed the database server's certificate)",
                                ca.name, ca.key
                            ),
                        )));
                    };
                    if !postgres::is_pem_certificate(&pem) {
                        return Ok(Err(Blocked::new(
                            Reason::ExternalSecretInvalid,
                            format!(
                                "spec.database.external.caSecretRef: Secret {} key {:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                                ca.name, ca.key
                            ),
                        )));
                    }
                    // The copy the pods mount, beside the connection Secret that names it.
                    apply::apply(client, ns, &postgres::database_ca_secret(owner, history, &pem)).await?;
                    Some(postgres::ca_file(&names.server))
                }
            };
            match postgres::external_urls(&owner_url, history, &credentials, ca_file.as_deref()) {
                Ok(urls) => urls,
                Err(e) => {
                    return Ok(Err(Blocked::new(
                        Reason::ExternalUrlInvalid,
                        format!("Secret {} key {:?}: {e}", r.name, r.key),
                    )));
                }
            }
        }
    };
    let conn = apply::apply(client, ns, &postgres::connection_secret(owner, history, &urls)).await?;

    let (ready, cluster) = match mode {
        DatabaseMode::External(_) => (true, None),
        DatabaseMode::Managed(m) if m.engine == DatabaseEngine::CloudNativePg => {
            let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
            // A type the API server does not serve answers a bare 404 ("page not found"), which
            // `get_opt` returns as an error; a missing object of a served type is `None`.
            let found = match clusters.get_opt(&names.server).await {
                Ok(found) => found,
                Err(e) => return Ok(Err(engine_missing(e)?)),
            };
            // No Cluster yet: is the type served at all? (Some API servers answer a missing type
            // with a NotFound status, which `get_opt` reads as a missing object.)
            if found.is_none()
                && let Err(e) = clusters.list(&ListParams::default().limit(1)).await
            {
                return Ok(Err(engine_missing(e)?));
            }
            if let Some(secret) = cnpg::superuser_secret(owner, history, &credentials) {
                apply::apply(client, ns, &secret).await?;
            }
            let health = ClusterHealth {
                promotion: ctx.promotion(ns, &names.server),
                ..ClusterHealth::of(&names.server, m, found.as_ref())
            };
            (health.has_primary(), Some(health))
        }
        DatabaseMode::Managed(_) => {
            let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
            let ready = sts
                .get_opt(&names.server)
                .await?
                .and_then(|s| s.status)
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0)
                >= 1;
            (ready, None)
        }
    };
    Ok(Ok(DatabaseState {
        ready,
        secret_version: conn.metadata.resource_version,
        credentials_created: created,
        cluster,
    }))
}

/// A failed read of Clusters: CloudNativePG not installed (no such resource: 404) is for a human to
/// fix; anything else is retried.
fn engine_missing(e: kube::Error) -> Result<Blocked> {
    match &e {
        kube::Error::Api(s) if s.code == 404 => Ok(Blocked::new(
            Reason::DatabaseEngineMissing,
            format!(
                "database.managed.engine is CloudNativePG, but this cluster does not serve {}/v1 clusters: install CloudNativePG (docs/operations.md, \"Highly available databases\")",
                cnpg::GROUP
            ),
        )),
        _ => Err(e.into()),
    }
}

/// What the etcd step found.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdState {
    pub health: EtcdHealth,
    /// resourceVersion of the external cluster's Secret (lock-server reads it at start-up).
    pub secret_version: Option<String>,
}

/// `Ok(Err(blocked))` for problems a human must fix; `Err` for API failures worth a retry.
pub async fn resolve_etcd(
    ctx: &Context,
    owner: &Owner,
    spec: &EtcdSpec,
) -> Result<Result<EtcdState, Blocked>> {
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
                .get_opt(&etcd_members::names(owner).server)
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
            let raw = secret_text(&secret, &r.key);
            let Some(raw) = raw else {
                return Ok(Err(Blocked::new(
                    Reason::ExternalSecretInvalid,
                    format!("Secret {} has no UTF-8 key {:?}", r.name, r.key),
                )));
            };
            // The URLs are not secret, but the message names only the problem, as for lockdb.
            let endpoints = match parse_endpoints(&raw) {
                Ok(endpoints) => endpoints,
                Err(e) => {
                    return Ok(Err(Blocked::new(
                        Reason::EtcdEndpointsInvalid,
                        format!(
                            "Secret {} key {:?} must hold etcd client URLs, comma-separated http(s)://host:port: {e}",
                            r.name, r.key
                        ),
                    )));
                }
            };
            let mut versions = vec![secret.metadata.resource_version.unwrap_or_default()];
            match external_etcd_tls(&secrets, external, endpoints.https).await? {
                Ok(tls_versions) => versions.extend(tls_versions),
                Err(blocked) => return Ok(Err(blocked)),
            }
            Ok(Ok(EtcdState {
                health: EtcdHealth::External,
                // lock-server reads the URLs, the CA and its client certificate at start-up: a
                // change to any of the three Secrets restarts it.
                secret_version: Some(versions.join(",")),
            }))
        }
    }
}

/// An external etcd's TLS Secrets, checked as lock-server will read them: the CA when (and only
/// when) the URLs are `https://`, the client certificate's pair when one is named. Answers their
/// resourceVersions; `Ok(Err(_))` says what a human must fix, never a key's content.
async fn external_etcd_tls(
    secrets: &Api<Secret>,
    external: &ExternalEtcd,
    https: bool,
) -> Result<Result<Vec<String>, Blocked>> {
    let ca = match (&external.ca_secret_ref, https) {
        (None, false) => return Ok(Ok(Vec::new())),
        (Some(ca), true) => ca,
        (None, true) => {
            return Ok(Err(Blocked::new(
                Reason::EtcdEndpointsInvalid,
                format!(
                    "Secret {} holds https:// etcd URLs but spec.etcd.external.caSecretRef is not set: name the Secret key with the PEM CA that signs the etcd members' server certificates",
                    external.secret_ref.name
                ),
            )));
        }
        (Some(_), false) => {
            return Ok(Err(Blocked::new(
                Reason::EtcdEndpointsInvalid,
                format!(
                    "spec.etcd.external.caSecretRef is set but Secret {} holds http:// etcd URLs: write them as https://, or drop caSecretRef and clientCertificateSecretRef",
                    external.secret_ref.name
                ),
            )));
        }
    };
    let mut versions = Vec::new();
    let Some(ca_secret) = secrets.get_opt(&ca.name).await? else {
        return Ok(Err(Blocked::new(
            Reason::ExternalSecretMissing,
            format!(
                "Secret {} named by spec.etcd.external.caSecretRef does not exist",
                ca.name
            ),
        )));
    };
    let pem = secret_text(&ca_secret, &ca.key);
    if !pem.as_deref().is_some_and(postgres::is_pem_certificate) {
        return Ok(Err(Blocked::new(
            Reason::ExternalSecretInvalid,
            format!(
                "spec.etcd.external.caSecretRef: Secret {} key {:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----): the CA that signs the etcd members' server certificates",
                ca.name, ca.key
            ),
        )));
    }
    versions.push(ca_secret.metadata.resource_version.unwrap_or_default());
    if let Some(cert) = &external.client_certificate_secret_ref {
        let Some(pair) = secrets.get_opt(&cert.name).await? else {
            return Ok(Err(Blocked::new(
                Reason::ExternalSecretMissing,
                format!(
                    "Secret {} named by spec.etcd.external.clientCertificateSecretRef does not exist",
                    cert.name
                ),
            )));
        };
        let certificate = secret_text(&pair, "tls.crt");
        let key_present = secret_text(&pair, "tls.key").is_some_and(|k| k.contains("PRIVATE KEY-----"));
        if !certificate.as_deref().is_some_and(postgres::is_pem_certificate) || !key_present {
            return Ok(Err(Blocked::new(
                Reason::ExternalSecretInvalid,
                format!(
                    "spec.etcd.external.clientCertificateSecretRef: Secret {} must hold a PEM certificate in tls.crt and its PEM private key in tls.key (a kubernetes.io/tls Secret)",
                    cert.name
                ),
            )));
        }
        versions.push(pair.metadata.resource_version.unwrap_or_default());
    }
    Ok(Ok(versions))
}

/// A Secret key's value as UTF-8.
fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}
