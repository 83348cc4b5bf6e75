//! A managed etcd cluster for a LockService with `backend: etcd`: a headless Service giving each
//! member a stable DNS name (the peers find each other through it before any is ready), a client
//! Service, a StatefulSet of an odd number of members that bootstrap one cluster from those names,
//! a PodDisruptionBudget keeping a quorum through voluntary evictions, and a NetworkPolicy admitting
//! only this LockService's lock-server pods and the members themselves.
//!
//! For an external cluster only the client URLs are checked here ([`parse_endpoints`]); lock-server
//! reads them from the Secret itself.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, HTTPGetAction, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::network_policies::Scraper;
use super::security::NONROOT_UID;
use super::{LOCK_SERVER, Owner};
use crate::crd::ManagedEtcd;

/// Component label of the members (and the suffix of their StatefulSet's name).
pub const ETCD: &str = "etcd";
pub const CLIENT_PORT: i32 = 2379;
pub const PEER_PORT: i32 = 2380;
/// etcd's `--listen-metrics-urls`: `/readyz` and `/livez` for the kubelet's probes.
pub const METRICS_PORT: i32 = 2381;
const DATA_MOUNT: &str = "/var/lib/etcd";

/// Names of a managed cluster's children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdNames {
    /// Headless Service (peer DNS) and StatefulSet: members are `<server>-0`, `<server>-1`, …
    pub server: String,
    /// ClusterIP Service in front of the ready members, for tools (etcdctl, the restore runbook).
    pub client: String,
}

pub fn names(owner: &Owner) -> EtcdNames {
    EtcdNames {
        server: owner.child(ETCD),
        client: owner.child("etcd-client"),
    }
}

/// `<server>-<i>.<server>.<ns>.svc`: member `i`'s stable name (through the headless Service).
fn member_host(owner: &Owner, i: i32) -> String {
    let server = names(owner).server;
    format!("{server}-{i}.{server}.{}.svc", owner.namespace)
}

/// The scheme of the members' client URLs: `https` when the owner serves HTTPS (`spec.tls`), with
/// the certificate the operator issues for the members ([`tls_names`]). Peers talk plain HTTP.
fn client_scheme(owner: &Owner) -> &'static str {
    if owner.https { "https" } else { "http" }
}

/// Every member's client URL, for lock-server's `--etcd-endpoints` (the etcd client balances over
/// them and moves on when one is down).
pub fn member_client_urls(owner: &Owner, replicas: i32) -> Vec<String> {
    let scheme = client_scheme(owner);
    (0..replicas)
        .map(|i| format!("{scheme}://{}:{CLIENT_PORT}", member_host(owner, i)))
        .collect()
}

/// The client Service's URL (status.endpoints.etcd).
pub fn client_url(owner: &Owner) -> String {
    format!(
        "{}://{}.{}.svc:{CLIENT_PORT}",
        client_scheme(owner),
        names(owner).client,
        owner.namespace
    )
}

/// The names the members' certificate carries: every member (one wildcard over the headless
/// Service: `<server>-<i>.<server>.<ns>.svc`) and the client Service.
pub fn tls_names(owner: &Owner) -> Vec<String> {
    let n = names(owner);
    let ns = &owner.namespace;
    vec![
        format!("*.{}.{ns}.svc", n.server),
        format!("*.{}.{ns}.svc.cluster.local", n.server),
        n.client.clone(),
        format!("{}.{ns}", n.client),
        format!("{}.{ns}.svc", n.client),
        format!("{}.{ns}.svc.cluster.local", n.client),
    ]
}

/// Where a member finds its certificate (Secret `<owner>-etcd-tls`).
const TLS_MOUNT: &str = "/etc/etcd/tls";

/// `--initial-cluster`: every member by name and peer URL.
pub fn initial_cluster(owner: &Owner, replicas: i32) -> String {
    let server = names(owner).server;
    (0..replicas)
        .map(|i| format!("{server}-{i}=http://{}:{PEER_PORT}", member_host(owner, i)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A majority of `members`: what the cluster needs to commit anything.
pub fn quorum(members: i32) -> i32 {
    members / 2 + 1
}

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        ..ServicePort::default()
    }
}

/// The headless Service behind the members' DNS names. `publishNotReadyAddresses`: a member is
/// ready only once it has found a quorum of its peers, so the names must resolve before that.
pub fn peer_service(owner: &Owner) -> Service {
    Service {
        metadata: owner.meta(names(owner).server, ETCD),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(owner.selector(ETCD)),
            ports: Some(vec![port("client", CLIENT_PORT), port("peer", PEER_PORT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The client Service: ready members only.
pub fn client_service(owner: &Owner) -> Service {
    Service {
        metadata: owner.meta(names(owner).client, ETCD),
        spec: Some(ServiceSpec {
            selector: Some(owner.selector(ETCD)),
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    }
}

/// The members: one pod each, named `<server>-<i>`, bootstrapping one cluster from the others'
/// DNS names. `Parallel`: with the default ordered start, member 0 would wait to be ready before
/// member 1 is created, and it cannot be ready without a quorum.
pub fn statefulset(owner: &Owner, spec: &ManagedEtcd) -> StatefulSet {
    let n = names(owner);
    let url = |scheme: &str, port: i32| {
        format!(
            "{scheme}://$(POD_NAME).{}.{}.svc:{port}",
            n.server, owner.namespace
        )
    };
    let client = client_scheme(owner);
    let mut args = vec![
        "--name=$(POD_NAME)".to_owned(),
        format!("--data-dir={DATA_MOUNT}/data"),
        format!("--listen-client-urls={client}://0.0.0.0:{CLIENT_PORT}"),
        format!("--advertise-client-urls={}", url(client, CLIENT_PORT)),
        format!("--listen-peer-urls=http://0.0.0.0:{PEER_PORT}"),
        format!("--initial-advertise-peer-urls={}", url("http", PEER_PORT)),
        format!("--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}"),
        format!("--initial-cluster={}", initial_cluster(owner, spec.replicas)),
        "--initial-cluster-state=new".to_owned(),
        // Unique per LockService (its uid), so members of two clusters never join each other.
        format!("--initial-cluster-token={}-{}", n.server, owner.owner_ref.uid),
        // Old revisions are history only (a grant's token is its key's current mod_revision):
        // compacting them keeps the database under its quota.
        "--auto-compaction-mode=periodic".to_owned(),
        "--auto-compaction-retention=1h".to_owned(),
    ];
    let mut mounts = vec![VolumeMount {
        name: "data".into(),
        mount_path: DATA_MOUNT.into(),
        ..VolumeMount::default()
    }];
    let mut tls_volume = None;
    if owner.https {
        args.push(format!("--cert-file={TLS_MOUNT}/tls.crt"));
        args.push(format!("--key-file={TLS_MOUNT}/tls.key"));
        mounts.push(VolumeMount {
            name: "tls".into(),
            mount_path: TLS_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        tls_volume = Some(Volume {
            name: "tls".into(),
            secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                secret_name: Some(owner.tls_secret(ETCD)),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Volume::default()
        });
    }
    let container_port = |name: &str, port: i32| ContainerPort {
        name: Some(name.into()),
        container_port: port,
        ..ContainerPort::default()
    };
    let container = Container {
        name: ETCD.into(),
        image: Some(spec.image.clone()),
        command: Some(vec!["etcd".into()]),
        args: Some(args),
        env: Some(vec![super::pod_name_env("POD_NAME")]),
        ports: Some(vec![
            container_port("client", CLIENT_PORT),
            container_port("peer", PEER_PORT),
            container_port("metrics", METRICS_PORT),
        ]),
        // /readyz: this member has a leader and serves linearizable reads.
        readiness_probe: Some(probe("/readyz")),
        // /livez: the process serves; generous, since a member without quorum is alive but waiting.
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(30),
            period_seconds: Some(10),
            failure_threshold: Some(8),
            ..probe("/livez")
        }),
        volume_mounts: Some(mounts),
        resources: spec.resources.clone(),
        ..Container::default()
    };
    let size = Quantity(spec.storage.size.clone());
    let (volumes, claims) = if spec.storage.empty_dir {
        let dir = Volume {
            name: "data".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(size),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        };
        (vec![dir], None)
    } else {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                labels: Some(owner.labels(ETCD)),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: spec.storage.storage_class_name.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".to_owned(), size)])),
                    ..VolumeResourceRequirements::default()
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        };
        (Vec::new(), Some(vec![claim]))
    };
    let volumes: Vec<Volume> = volumes.into_iter().chain(tls_volume).collect();
    let volumes = (!volumes.is_empty()).then_some(volumes);
    StatefulSet {
        metadata: owner.meta(n.server.clone(), ETCD),
        spec: Some(StatefulSetSpec {
            replicas: Some(spec.replicas),
            service_name: Some(n.server),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(owner.selector(ETCD)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(owner.labels(ETCD)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes,
                    termination_grace_period_seconds: Some(30),
                    // etcd's image runs as root unless told: the restricted standard admits no
                    // root, and etcd needs none (it writes only its data directory, which the
                    // fsGroup makes its own).
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(NONROOT_UID),
                        run_as_group: Some(NONROOT_UID),
                        fs_group: Some(NONROOT_UID),
                        ..PodSecurityContext::default()
                    }),
                    ..PodSpec::default()
                }),
            },
            volume_claim_templates: claims,
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// Voluntary evictions (a node drain) take at most as many members as leave a quorum standing.
pub fn disruption_budget(owner: &Owner, replicas: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: owner.meta(names(owner).server, ETCD),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(quorum(replicas))),
            selector: Some(LabelSelector {
                match_labels: Some(owner.selector(ETCD)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// Who may open a connection to the members: this LockService's lock-server pods (client port),
/// the members themselves (client and peer ports) and the scraper, when there is one (the metrics
/// port only). The kubelet's probes are not filtered.
pub fn network_policy(owner: &Owner, scraper: Option<&Scraper>) -> NetworkPolicy {
    let pods = |component: &str| NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(owner.selector(component)),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    let tcp = |port: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    };
    NetworkPolicy {
        metadata: owner.meta(names(owner).server, ETCD),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(owner.selector(ETCD)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(
                [
                    NetworkPolicyIngressRule {
                        from: Some(vec![pods(LOCK_SERVER)]),
                        ports: Some(vec![tcp(CLIENT_PORT)]),
                    },
                    NetworkPolicyIngressRule {
                        from: Some(vec![pods(ETCD)]),
                        ports: Some(vec![tcp(CLIENT_PORT), tcp(PEER_PORT)]),
                    },
                ]
                .into_iter()
                .chain(scraper.map(|s| s.rule(METRICS_PORT)))
                .collect(),
            ),
            egress: None,
        }),
    }
}

/// Why the client URLs of an external cluster cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    #[error("it is empty")]
    Empty,
    #[error("it holds whitespace (a trailing newline?); write the URLs comma-separated, nothing else")]
    Whitespace,
    /// Which entry (1-based); never the text, in case it carries userinfo.
    #[error("entry {0} is not an http:// or https:// URL with a host and no user")]
    NotHttp(usize),
    #[error(
        "entry {0} is in another scheme than entry 1: give every URL as https://, or every one as http://"
    )]
    MixedSchemes(usize),
}

/// The client URLs of an external cluster, as lock-server will read them (`DLOCK_ETCD_ENDPOINTS`,
/// split on commas, each `http://host[:port]` or `https://host[:port]`, all in one scheme, which
/// lock-server requires too). Checked here so that a bad Secret is a Degraded status naming the
/// problem, not a crash-looping lock-server.
pub fn parse_endpoints(raw: &str) -> Result<Endpoints, EndpointsError> {
    if raw.is_empty() {
        return Err(EndpointsError::Empty);
    }
    if raw.chars().any(char::is_whitespace) {
        return Err(EndpointsError::Whitespace);
    }
    let mut https = None;
    let urls = raw
        .split(',')
        .enumerate()
        .map(|(i, e)| {
            let scheme = url::Url::parse(e).ok().and_then(|u| {
                let usable = u.host_str().is_some_and(|h| !h.is_empty()) && u.username().is_empty();
                match u.scheme() {
                    "http" if usable && e.starts_with("http://") => Some(false),
                    "https" if usable && e.starts_with("https://") => Some(true),
                    _ => None,
                }
            });
            let this = scheme.ok_or(EndpointsError::NotHttp(i + 1))?;
            if *https.get_or_insert(this) != this {
                return Err(EndpointsError::MixedSchemes(i + 1));
            }
            Ok(e.to_owned())
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Endpoints {
        urls,
        https: https.unwrap_or(false),
    })
}

/// An external cluster's client URLs, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub urls: Vec<String>,
    /// Every URL is `https://` (lock-server then needs the cluster's CA).
    pub https: bool,
}
