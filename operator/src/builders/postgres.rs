//! The database a resource owns: its credentials, the connection URLs derived from them, and for
//! managed mode a headless Service plus a one-replica PostgreSQL StatefulSet with a data volume.
//!
//! Two Secrets per database, with different lifecycles:
//! - `<owner>-<db>-credentials`: random passwords, created once and never rewritten by reconcile;
//! - `<owner>-<db>-conn`: the URLs built from those passwords (and, for external mode, from the
//!   referenced Secret's URL), applied on every reconcile so they follow the external URL.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ExecAction, KeyToPath, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, Secret, SecretVolumeSource, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use rand::Rng;
use rand::distr::Alphanumeric;

use super::{Owner, POSTGRES_PORT, env, secret_env};
use crate::crd::{DatabaseEngine, ManagedDatabase, SecretKeyRef};

pub const KEY_APP_PASSWORD: &str = "app-password";
pub const KEY_POSTGRES_PASSWORD: &str = "postgres-password";
/// URL of the application role: what the services use.
pub const KEY_URL: &str = "url";
/// URL of the owner role (managed mode): what the migration Job uses.
pub const KEY_ADMIN_URL: &str = "admin-url";
const PASSWORD_LEN: usize = 32;
const DATA_MOUNT: &str = "/var/lib/postgresql/data";

pub use dlock_common::db::History;

/// Folder of the history inside the dlock image.
pub fn history_dir(history: History) -> String {
    format!("/migrations/{}", history.name())
}

/// The component label of a history's migration Job.
pub fn migration_component(history: History) -> String {
    format!("{}-migration", history.name())
}

/// Names of one database's children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbNames {
    /// Headless Service and StatefulSet (managed mode).
    pub server: String,
    pub credentials_secret: String,
    pub connection_secret: String,
}

/// The suffix of a connection Secret's name (`<owner>-<db>-conn`).
const CONN_SUFFIX: &str = "-conn";

pub fn names(owner: &Owner, history: History) -> DbNames {
    DbNames {
        server: owner.child(history.name()),
        credentials_secret: owner.child(&format!("{}-credentials", history.name())),
        connection_secret: owner.child(&format!("{}{CONN_SUFFIX}", history.name())),
    }
}

/// Generated passwords. Never logged, never in status or events: they only travel inside Secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub app_password: String,
    /// The managed server's superuser password; `None` for external databases.
    pub postgres_password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

impl Credentials {
    pub fn generate(managed: bool) -> Credentials {
        Credentials {
            app_password: random_password(),
            postgres_password: managed.then(random_password),
        }
    }

    /// Reads the passwords back from an existing credentials Secret. `None` when a key the mode
    /// needs is missing or not UTF-8 (the Secret was tampered with; the controller reports it).
    pub fn from_secret(secret: &Secret, managed: bool) -> Option<Credentials> {
        let data = secret.data.as_ref()?;
        let read = |key: &str| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .filter(|s| !s.is_empty())
        };
        let app_password = read(KEY_APP_PASSWORD)?;
        let postgres_password = if managed {
            Some(read(KEY_POSTGRES_PASSWORD)?)
        } else {
            None
        };
        Some(Credentials {
            app_password,
            postgres_password,
        })
    }
}

/// 32 alphanumeric characters (~190 bits), safe inside a URL without escaping.
fn random_password() -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(PASSWORD_LEN)
        .map(char::from)
        .collect()
}

/// The credentials Secret. Created once when absent; reconcile never rewrites it.
pub fn credentials_secret(owner: &Owner, history: History, credentials: &Credentials) -> Secret {
    let mut data = BTreeMap::from([(
        KEY_APP_PASSWORD.to_owned(),
        ByteString(credentials.app_password.clone().into_bytes()),
    )]);
    if let Some(pw) = &credentials.postgres_password {
        data.insert(
            KEY_POSTGRES_PASSWORD.to_owned(),
            ByteString(pw.clone().into_bytes()),
        );
    }
    Secret {
        metadata: owner.meta(names(owner, history).credentials_secret, history.name()),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The URLs a database is reached by.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionUrls {
    /// As the application role.
    pub app_url: String,
    /// As the owner role; only for managed mode (external mode's is the referenced Secret).
    pub admin_url: Option<String>,
}

impl std::fmt::Debug for ConnectionUrls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionUrls(<redacted>)")
    }
}

/// The Service CloudNativePG keeps pointed at the primary of the Cluster `<owner>-<db>`.
pub fn primary_service(owner: &Owner, history: History) -> String {
    format!("{}-rw", names(owner, history).server)
}

/// The host a managed database is reached at: the StatefulSet's headless Service, or the Service
/// CloudNativePG keeps pointed at the primary.
pub fn managed_host(owner: &Owner, history: History, engine: DatabaseEngine) -> String {
    let service = match engine {
        DatabaseEngine::StatefulSet => names(owner, history).server,
        DatabaseEngine::CloudNativePg => primary_service(owner, history),
    };
    format!("{service}.{}.svc", owner.namespace)
}

/// Where a pod finds the CA of the CloudNativePG Cluster `<cluster>`: the `ca.crt` of its
/// `<cluster>-ca` Secret, mounted by [`mount_database_cas`].
pub fn ca_file(cluster: &str) -> String {
    format!("{TLS_DIR}/{cluster}/ca.crt")
}

/// The uid and gid of the postgres user in the official image and in images/postgres.
pub const POSTGRES_UID: i64 = 999;

/// The emptyDir of PostgreSQL's socket directory, `/var/run/postgresql`.
const SOCKET_VOLUME: &str = "run";

/// The folder the databases' CA files are mounted under, one folder per database.
pub const TLS_DIR: &str = "/etc/dlock/tls";

/// The databases (`<owner>-<db>`, as [`DbNames::server`] names them) whose connection Secret a
/// container of `pod` reads, sorted, once each.
pub fn databases_read(pod: &PodSpec) -> Vec<String> {
    let mut databases: Vec<String> = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        .filter_map(|r| r.name.strip_suffix(CONN_SUFFIX).map(str::to_owned))
        .collect();
    databases.sort();
    databases.dedup();
    databases
}

/// Mounts, into every container that reads a database's connection Secret (`<owner>-<db>-conn`),
/// that database's CA (`<owner>-<db>-ca`, written by CloudNativePG) at [`ca_file`]. The Secret is
/// optional: a database on the StatefulSet engine has none, and the mount is an empty folder its
/// URLs never name. One rule for the Deployments, the migration Jobs and the restore Jobs (which
/// read several paydbs at once), so no container reaches a database over TLS without its CA.
pub fn mount_database_cas(pod: &mut PodSpec) {
    for db in databases_read(pod) {
        let volume = format!("tls-{db}");
        let volumes = pod.volumes.get_or_insert_with(Vec::new);
        if volumes.iter().any(|v| v.name == volume) {
            continue;
        }
        volumes.push(Volume {
            name: volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(format!("{db}-ca")),
                items: Some(vec![KeyToPath {
                    key: "ca.crt".into(),
                    path: "ca.crt".into(),
                    ..KeyToPath::default()
                }]),
                optional: Some(true),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        let conn = format!("{db}{CONN_SUFFIX}");
        for c in pod
            .containers
            .iter_mut()
            .chain(pod.init_containers.iter_mut().flatten())
        {
            let reads = c.env.iter().flatten().any(|e| {
                e.value_from
                    .as_ref()
                    .and_then(|v| v.secret_key_ref.as_ref())
                    .is_some_and(|r| r.name == conn)
            });
            if reads {
                c.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
                    name: volume.clone(),
                    mount_path: format!("{TLS_DIR}/{db}"),
                    read_only: Some(true),
                    ..VolumeMount::default()
                });
            }
        }
    }
}

/// URLs of a managed database, through the Service that leads to its primary.
pub fn managed_urls(
    owner: &Owner,
    history: History,
    engine: DatabaseEngine,
    credentials: &Credentials,
) -> ConnectionUrls {
    let host = managed_host(owner, history, engine);
    let db = history.name();
    // CloudNativePG serves TLS only (its Cluster refuses other connections) with a certificate for
    // the `-rw` Service from the Cluster's own CA; the StatefulSet engine with HTTPS on
    // (`spec.tls`), TLS only too, with a certificate from the namespace's CA for its Service
    // (`builders::tls::serve_postgres_tls`), the bundle written to `<owner>-<db>-ca`. Both verified
    // in full, name included.
    let verified = format!(
        "?sslmode=verify-full&sslrootcert={}",
        ca_file(&names(owner, history).server)
    );
    let tls = match engine {
        DatabaseEngine::StatefulSet if owner.https => verified,
        DatabaseEngine::StatefulSet => String::new(),
        DatabaseEngine::CloudNativePg => verified,
    };
    ConnectionUrls {
        app_url: format!(
            "postgres://{}:{}@{host}:{POSTGRES_PORT}/{db}{tls}",
            history.app_role(),
            credentials.app_password
        ),
        admin_url: credentials
            .postgres_password
            .as_ref()
            .map(|pw| format!("postgres://postgres:{pw}@{host}:{POSTGRES_PORT}/{db}{tls}")),
    }
}

/// Why an external URL cannot be used. Never carries the URL itself (it holds a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExternalUrlError {
    #[error("the URL in the referenced Secret is not a postgres:// or postgresql:// URL with a host")]
    NotPostgresUrl,
    #[error(
        "the URL names its own sslrootcert, and spec.database.external.caSecretRef names a CA too: leave sslrootcert out of the URL (the operator mounts the CA and names it)"
    )]
    RootCertTwice,
    #[error(
        "the URL says sslmode={0}, which does not check the server's certificate against caSecretRef's CA: use verify-full (or verify-ca), or leave sslmode out"
    )]
    CaUnchecked(String),
}

/// The URLs of an external database: the application role's is the owner URL with its user and
/// password replaced by the app role and the generated password (host, port, database, parameters
/// kept). With a CA (`ca_file`, where [`mount_database_cas`] puts it), both URLs name it as
/// `sslrootcert` and verify the server (`sslmode=verify-full` unless the URL says `verify-ca`),
/// and the owner URL is handed out too (`admin-url`), for the Jobs, which then read it from the
/// connection Secret (so that they get the CA mounted) instead of the user's.
pub fn external_urls(
    owner_url: &str,
    history: History,
    credentials: &Credentials,
    ca_file: Option<&str>,
) -> Result<ConnectionUrls, ExternalUrlError> {
    let mut url = url::Url::parse(owner_url.trim()).map_err(|_| ExternalUrlError::NotPostgresUrl)?;
    if !matches!(url.scheme(), "postgres" | "postgresql") || url.host_str().is_none_or(str::is_empty) {
        return Err(ExternalUrlError::NotPostgresUrl);
    }
    let mut admin_url = None;
    if let Some(ca_file) = ca_file {
        verify_with_ca(&mut url, ca_file)?;
        admin_url = Some(String::from(url.clone()));
    }
    url.set_username(history.app_role())
        .and_then(|()| url.set_password(Some(&credentials.app_password)))
        .map_err(|()| ExternalUrlError::NotPostgresUrl)?;
    Ok(ConnectionUrls {
        app_url: url.into(),
        admin_url,
    })
}

/// `sslrootcert=<ca_file>`, and `sslmode=verify-full` unless the URL asks for `verify-ca`; a URL
/// with its own `sslrootcert`, or with a mode that checks no certificate, is refused.
fn verify_with_ca(url: &mut url::Url, ca_file: &str) -> Result<(), ExternalUrlError> {
    let mut mode = None;
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "sslrootcert" => return Err(ExternalUrlError::RootCertTwice),
            "sslmode" => mode = Some(v.into_owned()),
            _ => {}
        }
    }
    match mode.as_deref() {
        Some("verify-full" | "verify-ca") => {}
        Some(other) => return Err(ExternalUrlError::CaUnchecked(other.to_owned())),
        None => {
            url.query_pairs_mut().append_pair("sslmode", "verify-full");
        }
    }
    url.query_pairs_mut().append_pair("sslrootcert", ca_file);
    Ok(())
}

/// The CA a database's clients verify it against, as [`mount_database_cas`] mounts it:
/// `<owner>-<db>-ca`, key `ca.crt` (the name CloudNativePG gives its own CA Secret, so one rule
/// mounts all three): an external database's CA (`caSecretRef`), or the namespace's bundle for a
/// managed PostgreSQL with TLS.
pub fn database_ca_secret(owner: &Owner, history: History, pem: &str) -> Secret {
    Secret {
        metadata: owner.meta(ca_secret_name(owner, history), history.name()),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            "ca.crt".to_owned(),
            ByteString(pem.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// The key of [`hba_secret`] (and its file's name).
pub const HBA_KEY: &str = "pg_hba.conf";

pub fn hba_secret_name(owner: &Owner, history: History) -> String {
    format!("{}-hba", names(owner, history).server)
}

/// TLS only over TCP, password (SCRAM) as before; trust on the pod's own socket only, which the
/// images' entrypoints use while they initialise the database.
pub const PG_HBA: &str = "# Written by the dlock operator (spec.tls): TCP connections must use TLS.\n\
    local all all trust\n\
    hostssl all all all scram-sha-256\n";

/// A managed PostgreSQL's pg_hba.conf with TLS ([`PG_HBA`]): a Secret, applied with the database
/// (`builders::tls` adds it), mounted where `hba_file` names it.
pub fn hba_secret(owner: &Owner, history: History) -> Secret {
    Secret {
        metadata: owner.meta(hba_secret_name(owner, history), history.name()),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            HBA_KEY.to_owned(),
            ByteString(PG_HBA.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// `<owner>-<db>-ca`: the Secret whose `ca.crt` is mounted for the database.
pub fn ca_secret_name(owner: &Owner, history: History) -> String {
    format!("{}-ca", names(owner, history).server)
}

/// A CA Secret's text is PEM with at least one certificate.
pub fn is_pem_certificate(text: &str) -> bool {
    text.contains("-----BEGIN CERTIFICATE-----") && text.contains("-----END CERTIFICATE-----")
}

/// The connection Secret, applied on every reconcile.
pub fn connection_secret(owner: &Owner, history: History, urls: &ConnectionUrls) -> Secret {
    let mut data = BTreeMap::from([(KEY_URL.to_owned(), ByteString(urls.app_url.clone().into_bytes()))]);
    if let Some(admin) = &urls.admin_url {
        data.insert(KEY_ADMIN_URL.to_owned(), ByteString(admin.clone().into_bytes()));
    }
    Secret {
        metadata: owner.meta(names(owner, history).connection_secret, history.name()),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Where the migration Job reads the owner-role URL from.
pub fn admin_url_source(owner: &Owner, history: History, external: Option<&SecretKeyRef>) -> SecretKeyRef {
    match external {
        Some(r) => r.clone(),
        None => SecretKeyRef {
            name: names(owner, history).connection_secret,
            key: KEY_ADMIN_URL.into(),
        },
    }
}

/// Headless Service giving the StatefulSet's pod a stable DNS name.
pub fn service(owner: &Owner, history: History) -> Service {
    let component = history.name();
    Service {
        metadata: owner.meta(names(owner, history).server, component),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(owner.selector(component)),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: POSTGRES_PORT,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// One PostgreSQL pod with a persistent volume; its superuser password from the credentials Secret.
pub fn statefulset(owner: &Owner, history: History, spec: &ManagedDatabase) -> StatefulSet {
    let component = history.name();
    let names = names(owner, history);
    let pg_isready = Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "pg_isready".into(),
                "-h".into(),
                "127.0.0.1".into(),
                "-U".into(),
                "postgres".into(),
                "-d".into(),
                history.name().into(),
            ]),
        }),
        period_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let container = Container {
        name: "postgres".into(),
        image: Some(spec.image.clone()),
        env: Some(vec![
            env("POSTGRES_DB", history.name()),
            env("POSTGRES_USER", "postgres"),
            secret_env(
                "POSTGRES_PASSWORD",
                &names.credentials_secret,
                KEY_POSTGRES_PASSWORD,
            ),
            // A subdirectory: the volume's root may hold lost+found, which initdb refuses.
            env("PGDATA", format!("{DATA_MOUNT}/pgdata")),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("postgres".into()),
            container_port: POSTGRES_PORT,
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(pg_isready.clone()),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(30),
            period_seconds: Some(10),
            failure_threshold: Some(6),
            ..pg_isready
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "data".into(),
                mount_path: DATA_MOUNT.into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: SOCKET_VOLUME.into(),
                mount_path: "/var/run/postgresql".into(),
                ..VolumeMount::default()
            },
        ]),
        resources: spec.resources.clone(),
        ..Container::default()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            labels: Some(owner.labels(component)),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: spec.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(spec.storage_size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    StatefulSet {
        metadata: owner.meta(names.server.clone(), component),
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(names.server),
            selector: LabelSelector {
                match_labels: Some(owner.selector(component)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(owner.labels(component)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    // The postgres image's uid/gid (the official image's and images/postgres'):
                    // it runs as that user from the start (the restricted standard admits no
                    // root), and owns the volume through the fsGroup. Its socket directory is an
                    // emptyDir: the root filesystem is read-only.
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(POSTGRES_UID),
                        run_as_group: Some(POSTGRES_UID),
                        fs_group: Some(POSTGRES_UID),
                        ..PodSecurityContext::default()
                    }),
                    volumes: Some(vec![super::security::empty_dir(SOCKET_VOLUME)]),
                    ..PodSpec::default()
                }),
            },
            volume_claim_templates: Some(vec![claim]),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}
