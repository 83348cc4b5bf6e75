//! HTTPS in the pods (`spec.tls.mode: Operator`): the names of the namespace's CA Secret, its public
//! bundle and each served component's certificate Secret, and the one pass over a finished set of
//! children ([`Desired::with_tls`]) that mounts them — a server its certificate and key, a client
//! the CA bundle — so no builder can forget a hop. The certificates themselves are made in
//! `controller::tls`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, KeyToPath, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::etcd_members::ETCD;
use super::postgres;
use super::{
    AppliedSecret, Child, Desired, HTTP_PORT_NAME, HTTPS_PORT_NAME, LOCK_SERVER, Owner, PAYMENT_RESOURCE,
    PAYOUT_EXECUTOR, RAIL_PROXY, RAIL_STUB, env,
};
use crate::crd::ExternalEtcd;

/// The namespace's CA (type `kubernetes.io/tls`: `tls.crt`, `tls.key`). Only the operator reads it.
pub const CA_SECRET: &str = "dlock-ca";
/// The CA's certificate, for the clients (a ConfigMap: nothing in it is secret).
pub const CA_BUNDLE: &str = "dlock-ca-bundle";
pub const CA_BUNDLE_KEY: &str = "ca.crt";
/// Pod-template annotation with a hash of the bundle: a new CA restarts the clients, which read the
/// bundle at start-up (the servers re-read their certificate files on their own).
pub const CA_BUNDLE_ANNOTATION: &str = "dlock.dev/ca-bundle";

/// The components that serve an HTTP API from a Deployment, and so get a certificate.
pub const SERVED: [&str; 4] = [LOCK_SERVER, PAYMENT_RESOURCE, RAIL_PROXY, RAIL_STUB];
/// A managed database on the StatefulSet engine (the component is its history's name).
pub const LOCKDB: &str = postgres::History::Lockdb.name();
pub const PAYDB: &str = postgres::History::Paydb.name();
/// Everything that gets a certificate: those, a managed etcd's members (their client URLs; the
/// StatefulSet mounts it itself, `etcd_members::statefulset`), and a managed PostgreSQL on the
/// StatefulSet engine ([`serve_postgres_tls`]; CloudNativePG makes its Clusters' own).
pub const CERTIFIED: [&str; 7] = [
    LOCK_SERVER,
    PAYMENT_RESOURCE,
    RAIL_PROXY,
    RAIL_STUB,
    ETCD,
    LOCKDB,
    PAYDB,
];
/// Where a managed PostgreSQL finds its certificate and its pg_hba.conf.
pub const PG_CERT_DIR: &str = "/etc/dlock/pg-tls";
pub const PG_HBA_DIR: &str = "/etc/dlock/pg-hba";

/// Where the pods find them, and the variables that name the files (each binary's config.rs).
pub const CERT_DIR: &str = "/etc/dlock/tls";
pub const CA_DIR: &str = "/etc/dlock/ca";
pub const TLS_CERT_FILE_ENV: &str = dlock_common::tls::TLS_CERT_FILE_ENV;
/// The server's `--plaintext`, set when the object's `spec.tls.mode` is `Disabled`.
pub const PLAINTEXT_ENV: &str = dlock_common::tls::PLAINTEXT_ENV;
pub const TLS_KEY_FILE_ENV: &str = dlock_common::tls::TLS_KEY_FILE_ENV;
/// payout-executor: the CA of the three servers it calls.
pub const CA_FILE_ENV: &str = "DLOCK_CA_FILE";
/// rail-proxy: the CA of the rail it forwards to (the in-cluster rail-stub's).
pub const RAIL_CA_FILE_ENV: &str = "DLOCK_RAIL_CA_FILE";
/// lock-server: the CA of a managed etcd's members, or of an external etcd's (its caSecretRef).
pub const ETCD_CA_FILE_ENV: &str = "DLOCK_ETCD_CA_FILE";
/// lock-server: the client certificate it presents to an external etcd.
pub const ETCD_CERT_FILE_ENV: &str = "DLOCK_ETCD_CERT_FILE";
pub const ETCD_KEY_FILE_ENV: &str = "DLOCK_ETCD_KEY_FILE";
/// Where lock-server finds an external etcd's CA and its client certificate.
pub const ETCD_CA_DIR: &str = "/etc/dlock/etcd-ca";
pub const ETCD_CLIENT_CERT_DIR: &str = "/etc/dlock/etcd-client";
const CERT_VOLUME: &str = "tls";
const CA_VOLUME: &str = "ca";
const ETCD_CA_VOLUME: &str = "etcd-ca";
const ETCD_CLIENT_CERT_VOLUME: &str = "etcd-client-cert";
const PG_CERT_VOLUME: &str = "pg-tls";
const PG_HBA_VOLUME: &str = "pg-hba";

/// The names a component's Service answers to inside the cluster (a managed etcd: its members and
/// its client Service).
pub fn dns_names(owner: &Owner, component: &str) -> Vec<String> {
    if component == ETCD {
        return super::etcd_members::tls_names(owner);
    }
    let svc = owner.child(component);
    let ns = &owner.namespace;
    vec![
        svc.clone(),
        format!("{svc}.{ns}"),
        format!("{svc}.{ns}.svc"),
        format!("{svc}.{ns}.svc.cluster.local"),
    ]
}

/// What [`Desired::with_tls`] mounts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsWiring {
    /// The owner's servers serve HTTPS with their certificate Secrets.
    pub https: bool,
    /// The bundle (PEM), when the namespace has one: every client that calls an `https://` URL
    /// mounts it (its pod template carries its hash), and a managed PostgreSQL's clients verify
    /// the server against it.
    pub bundle: Option<String>,
}

impl Desired {
    /// Each served component's Deployment serves HTTPS from its certificate Secret (probes too);
    /// each Deployment that calls an `https://` URL trusts the namespace's bundle.
    pub fn with_tls(mut self, owner: &Owner, wiring: &TlsWiring) -> Self {
        let bundle_hash = wiring
            .bundle
            .as_deref()
            .map(|pem| super::short_hash(pem.as_bytes()));
        for child in &mut self.apply {
            let Child::Deployment(d) = child else { continue };
            let Some(component) = component_of(&d.metadata).map(str::to_owned) else {
                continue;
            };
            let Some(template) = d.spec.as_mut().map(|s| &mut s.template) else {
                continue;
            };
            if SERVED.contains(&component.as_str()) {
                if wiring.https {
                    serve_https(template, &owner.tls_secret(&component));
                } else {
                    serve_plaintext(template);
                }
            }
            if let Some(hash) = &bundle_hash {
                trust_bundle(template, &component, hash);
            }
        }
        if let (true, Some(pem), Some(hash)) = (wiring.https, &wiring.bundle, &bundle_hash) {
            self.postgres_tls(owner, pem, hash);
        }
        self
    }

    /// A managed PostgreSQL on the StatefulSet engine serves TLS only ([`serve_postgres_tls`]), its
    /// CA bundle is written where its clients' URLs look for it (`<owner>-<db>-ca`, as
    /// [`postgres::mount_database_cas`] mounts it; applied first), and its clients' pod templates
    /// carry the bundle's hash, so a rotation of the CA waits for them.
    fn postgres_tls(&mut self, owner: &Owner, bundle: &str, bundle_hash: &str) {
        let mut secrets = Vec::new();
        let mut served = Vec::new();
        for child in &mut self.apply {
            let Child::StatefulSet(sts) = child else { continue };
            let Some(history) = component_of(&sts.metadata).and_then(history_of) else {
                continue;
            };
            let Some(template) = sts.spec.as_mut().map(|s| &mut s.template) else {
                continue;
            };
            serve_postgres_tls(
                template,
                &owner.tls_secret(history.name()),
                &postgres::hba_secret_name(owner, history),
            );
            secrets.push(Child::Secret(AppliedSecret(Box::new(
                postgres::database_ca_secret(owner, history, bundle),
            ))));
            secrets.push(Child::Secret(AppliedSecret(Box::new(postgres::hba_secret(
                owner, history,
            )))));
            served.push(postgres::names(owner, history).server);
        }
        for child in &mut self.apply {
            let Child::Deployment(d) = child else { continue };
            let Some(template) = d.spec.as_mut().map(|s| &mut s.template) else {
                continue;
            };
            let reads = template
                .spec
                .as_ref()
                .is_some_and(|pod| postgres::databases_read(pod).iter().any(|db| served.contains(db)));
            if reads {
                annotate(template, CA_BUNDLE_ANNOTATION, bundle_hash);
            }
        }
        // Before the database and the pods that mount them.
        self.apply.splice(0..0, secrets);
    }
}

fn component_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(super::LABEL_COMPONENT))
        .map(String::as_str)
}

fn history_of(component: &str) -> Option<postgres::History> {
    [postgres::History::Lockdb, postgres::History::Paydb]
        .into_iter()
        .find(|h| h.name() == component)
}

fn annotate(template: &mut PodTemplateSpec, key: &str, value: &str) {
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.to_owned());
}

/// A managed PostgreSQL with TLS: its certificate Secret and its pg_hba.conf (TLS only over TCP)
/// mounted read-only, `ssl=on` with those files. The key's file is root's, group the pod's fsGroup
/// (the postgres user's gid), mode 0440: what PostgreSQL accepts for a key file owned by root.
///
/// PostgreSQL reads its certificate at start-up and on a reload, never on its own; a renewed one
/// must not restart the database (its only instance), so a sidecar of the same image
/// ([`PG_RELOADER`]) watches the mounted files and runs `pg_ctl reload` when they change (the pod
/// shares its process namespace, and both run as the postgres user).
pub fn serve_postgres_tls(template: &mut PodTemplateSpec, cert_secret: &str, hba_secret: &str) {
    let Some((pod, i)) = container(template) else {
        return;
    };
    let pair = vec![
        key_to_path("tls.crt", "tls.crt"),
        key_to_path("tls.key", "tls.key"),
    ];
    mount(
        pod,
        i,
        secret_volume(PG_CERT_VOLUME, cert_secret, pair),
        PG_CERT_DIR,
    );
    mount(
        pod,
        i,
        secret_volume(
            PG_HBA_VOLUME,
            hba_secret,
            vec![key_to_path(postgres::HBA_KEY, postgres::HBA_KEY)],
        ),
        PG_HBA_DIR,
    );
    let server = &mut pod.containers[i];
    let args = server.args.get_or_insert_with(Vec::new);
    if args.is_empty() {
        // The images' entrypoints start the server for the argument `postgres`, passing it the rest.
        args.push("postgres".into());
    }
    for setting in [
        "ssl=on".to_owned(),
        format!("ssl_cert_file={PG_CERT_DIR}/tls.crt"),
        format!("ssl_key_file={PG_CERT_DIR}/tls.key"),
        format!("hba_file={PG_HBA_DIR}/{}", postgres::HBA_KEY),
    ] {
        args.push("-c".into());
        args.push(setting);
    }
    let quantity = |q: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(q.into());
    let reloader = Container {
        name: PG_RELOADER.into(),
        image: server.image.clone(),
        command: Some(vec!["sh".into(), "-c".into(), PG_RELOAD_SCRIPT.into()]),
        env: Some(
            server
                .env
                .iter()
                .flatten()
                .filter(|e| e.name == "PGDATA")
                .cloned()
                .collect(),
        ),
        volume_mounts: Some(
            server
                .volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == "data" || m.name == PG_CERT_VOLUME)
                .map(|m| VolumeMount {
                    read_only: Some(true),
                    ..m.clone()
                })
                .collect(),
        ),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity("5m")),
                ("memory".to_owned(), quantity("16Mi")),
            ])),
            limits: Some(BTreeMap::from([("memory".to_owned(), quantity("32Mi"))])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    if !pod.containers.iter().any(|c| c.name == PG_RELOADER) {
        pod.containers.push(reloader);
    }
    pod.share_process_namespace = Some(true);
    // The sidecar too meets "restricted" (the set was restricted before this pass).
    super::security::restrict(pod);
}

/// The sidecar of a managed PostgreSQL with TLS that reloads it when its certificate changes.
pub const PG_RELOADER: &str = "tls-reload";
/// Every 10 s, a checksum of the mounted pair; a change is a `pg_ctl reload` (tried again next
/// round if the server is not up). POSIX sh and coreutils: in the official image and in ours.
const PG_RELOAD_SCRIPT: &str = r#"files="/etc/dlock/pg-tls/tls.crt /etc/dlock/pg-tls/tls.key"
last=$(cat $files 2>/dev/null | cksum)
echo "tls-reload: watching $files"
while sleep 10; do
  now=$(cat $files 2>/dev/null | cksum)
  [ "$now" = "$last" ] && continue
  if pg_ctl reload -D "$PGDATA" >/dev/null; then
    echo "tls-reload: the certificate changed; postgres reloaded it"
    last=$now
  fi
done"#;

impl Desired {
    /// lock-server speaks TLS to an external etcd: the user's CA Secret key (and client certificate
    /// Secret, when named) mounted read-only and named by `DLOCK_ETCD_*_FILE`. The Secrets stay the
    /// user's; the resolve step has checked them and puts their resourceVersions in the pod
    /// template, since lock-server reads the files at start-up. URLs in `http://` need nothing here.
    pub fn with_external_etcd_tls(mut self, external: &ExternalEtcd) -> Self {
        let Some(ca) = &external.ca_secret_ref else {
            return self;
        };
        for child in &mut self.apply {
            let Child::Deployment(d) = child else { continue };
            if component_of(&d.metadata) != Some(LOCK_SERVER) {
                continue;
            }
            let Some((pod, i)) = d.spec.as_mut().and_then(|s| container(&mut s.template)) else {
                continue;
            };
            mount(
                pod,
                i,
                secret_volume(
                    ETCD_CA_VOLUME,
                    &ca.name,
                    vec![key_to_path(&ca.key, CA_BUNDLE_KEY)],
                ),
                ETCD_CA_DIR,
            );
            let mut envs = vec![env(ETCD_CA_FILE_ENV, format!("{ETCD_CA_DIR}/{CA_BUNDLE_KEY}"))];
            if let Some(cert) = &external.client_certificate_secret_ref {
                // The key's file belongs to the pod's fsGroup (mode 0440), as the server keys do.
                pod.security_context
                    .get_or_insert_with(Default::default)
                    .fs_group
                    .get_or_insert(super::security::NONROOT_UID);
                let pair = vec![
                    key_to_path("tls.crt", "tls.crt"),
                    key_to_path("tls.key", "tls.key"),
                ];
                mount(
                    pod,
                    i,
                    secret_volume(ETCD_CLIENT_CERT_VOLUME, &cert.name, pair),
                    ETCD_CLIENT_CERT_DIR,
                );
                envs.push(env(ETCD_CERT_FILE_ENV, format!("{ETCD_CLIENT_CERT_DIR}/tls.crt")));
                envs.push(env(ETCD_KEY_FILE_ENV, format!("{ETCD_CLIENT_CERT_DIR}/tls.key")));
            }
            pod.containers[i].env.get_or_insert_with(Vec::new).extend(envs);
        }
        self
    }
}

fn secret_volume(name: &str, secret: &str, items: Vec<KeyToPath>) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(items),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn key_to_path(key: &str, path: &str) -> KeyToPath {
    KeyToPath {
        key: key.into(),
        path: path.into(),
        mode: None,
    }
}

fn container(template: &mut PodTemplateSpec) -> Option<(&mut PodSpec, usize)> {
    let pod = template.spec.as_mut()?;
    (!pod.containers.is_empty()).then_some((pod, 0))
}

fn mount(pod: &mut PodSpec, i: usize, volume: Volume, path: &str) {
    let name = volume.name.clone();
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == name) {
        volumes.push(volume);
    }
    let c: &mut Container = &mut pod.containers[i];
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| m.name == name) {
        mounts.push(VolumeMount {
            name,
            mount_path: path.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
}

fn https_probe(probe: Option<&mut Probe>) {
    if let Some(get) = probe.and_then(|p| p.http_get.as_mut()) {
        get.scheme = Some("HTTPS".into());
        if get.port == IntOrString::String(HTTP_PORT_NAME.into()) {
            get.port = IntOrString::String(HTTPS_PORT_NAME.into());
        }
    }
}

fn serve_https(template: &mut PodTemplateSpec, secret: &str) {
    let Some((pod, i)) = container(template) else {
        return;
    };
    // The Secret's files belong to the pod's fsGroup (mode 0440): the image's user reads its key,
    // nobody else in the pod would.
    pod.security_context
        .get_or_insert_with(Default::default)
        .fs_group
        .get_or_insert(super::security::NONROOT_UID);
    mount(
        pod,
        i,
        Volume {
            name: CERT_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.into()),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        CERT_DIR,
    );
    let c = &mut pod.containers[i];
    let envs = c.env.get_or_insert_with(Vec::new);
    envs.push(env(TLS_CERT_FILE_ENV, format!("{CERT_DIR}/tls.crt")));
    envs.push(env(TLS_KEY_FILE_ENV, format!("{CERT_DIR}/tls.key")));
    // The port's name tells the chart's PodMonitor to scrape it over HTTPS.
    for port in c.ports.iter_mut().flatten() {
        if port.name.as_deref() == Some(HTTP_PORT_NAME) {
            port.name = Some(HTTPS_PORT_NAME.into());
        }
    }
    https_probe(c.readiness_probe.as_mut());
    https_probe(c.liveness_probe.as_mut());
}

/// `spec.tls.mode: Disabled`: the server is told plain HTTP in so many words (`--plaintext`), as
/// it requires when it has no certificate; it then WARNs at start-up.
fn serve_plaintext(template: &mut PodTemplateSpec) {
    let Some((pod, i)) = container(template) else {
        return;
    };
    let envs = pod.containers[i].env.get_or_insert_with(Vec::new);
    if !envs.iter().any(|e| e.name == PLAINTEXT_ENV) {
        envs.push(env(PLAINTEXT_ENV, "true"));
    }
}

/// The bundle into a client: payout-executor always (its three servers), rail-proxy when its rail
/// is the in-cluster rail-stub over HTTPS (a real rail is checked against the public roots),
/// lock-server when its etcd is the managed one over HTTPS.
fn trust_bundle(template: &mut PodTemplateSpec, component: &str, bundle_hash: &str) {
    let Some((pod, i)) = container(template) else {
        return;
    };
    let var = match component {
        PAYOUT_EXECUTOR => CA_FILE_ENV,
        RAIL_PROXY if rails_to_stub(&pod.containers[i]) => RAIL_CA_FILE_ENV,
        LOCK_SERVER if on_managed_etcd_over_https(&pod.containers[i]) => ETCD_CA_FILE_ENV,
        _ => return,
    };
    mount(
        pod,
        i,
        Volume {
            name: CA_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: CA_BUNDLE.into(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        CA_DIR,
    );
    pod.containers[i]
        .env
        .get_or_insert_with(Vec::new)
        .push(env(var, format!("{CA_DIR}/{CA_BUNDLE_KEY}")));
    annotate(template, CA_BUNDLE_ANNOTATION, bundle_hash);
}

/// `--etcd-endpoints` as flags (a managed etcd; an external one comes from a Secret) and https.
fn on_managed_etcd_over_https(c: &Container) -> bool {
    let args = c.args.as_deref().unwrap_or_default();
    args.windows(2)
        .any(|w| w[0] == "--etcd-endpoints" && w[1].starts_with("https://"))
}

fn rails_to_stub(c: &Container) -> bool {
    let args = c.args.as_deref().unwrap_or_default();
    args.windows(2).any(|w| {
        w[0] == "--rail-url" && w[1].starts_with("https://") && w[1].contains(&format!("-{RAIL_STUB}."))
    })
}
