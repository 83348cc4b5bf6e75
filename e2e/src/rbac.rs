//! The operator's identity in a test: the chart's own RBAC (rendered with `helm template`, applied
//! as typed objects) and a kubeconfig holding a token of the chart's ServiceAccount (a
//! TokenRequest, what `kubectl create token` asks for). The operator under test therefore has
//! exactly the rights the chart grants, not the admin's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::api::PostParams;
use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use kube::{Api, Client, Resource, ResourceExt};

use crate::k8s::{self, Kind};
use crate::{Cluster, helm};

/// The chart templates that make up the operator's identity and rights.
pub const RBAC_TEMPLATES: &[&str] = &[
    "templates/serviceaccount.yaml",
    "templates/clusterrole.yaml",
    "templates/clusterrolebinding.yaml",
    "templates/role.yaml",
];

#[derive(Debug, Clone)]
pub struct Identity {
    /// The namespace the operator is "installed" in and watches (`watchNamespace`).
    pub namespace: String,
    /// The helm release name the chart was rendered with.
    pub release: String,
    pub service_account: String,
    /// `system:serviceaccount:<ns>:<sa>`.
    pub user: String,
    /// A kubeconfig authenticating with the ServiceAccount's token.
    pub kubeconfig: PathBuf,
}

/// Creates `ns`, applies the chart's RBAC rendered for release `release` with `watchNamespace=ns`,
/// and writes a token kubeconfig into `dir`.
pub async fn install(cluster: &Cluster, helm_bin: &Path, ns: &str, release: &str, dir: &Path) -> Identity {
    let client = &cluster.client;
    k8s::namespace(client, ns).await;
    let mut extra = Vec::new();
    for t in RBAC_TEMPLATES {
        extra.extend(["--show-only", *t]);
    }
    let yaml = helm::template(helm_bin, release, ns, &[("watchNamespace", ns)], &extra);
    let applied = apply_namespaced::<ServiceAccount>(client, ns, &yaml).await
        + apply_namespaced::<Role>(client, ns, &yaml).await
        + apply_namespaced::<RoleBinding>(client, ns, &yaml).await
        + apply_cluster_wide::<ClusterRole>(client, &yaml).await
        + apply_cluster_wide::<ClusterRoleBinding>(client, &yaml).await;
    let kinds = helm::kinds(&yaml);
    assert_eq!(applied, kinds.len(), "a rendered kind was not applied: {kinds:?}");

    let sa = helm::rendered::<ServiceAccount>(&yaml);
    assert_eq!(sa.len(), 1, "the chart renders one ServiceAccount");
    let service_account = sa[0].name_any();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(2 * 3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(&service_account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token of ServiceAccount {service_account}: {e}"))
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    assert!(!token.is_empty(), "the TokenRequest returned no token");

    let user = format!("system:serviceaccount:{ns}:{service_account}");
    let id = Identity {
        namespace: ns.to_owned(),
        release: release.to_owned(),
        user,
        service_account,
        kubeconfig: dir.join("operator.kubeconfig"),
    };
    // The RBAC authorizer works from a watch cache: wait until the new bindings are in effect.
    let subject = id.subject();
    let settled =
        dlock_testkit::wait::poll(Duration::from_secs(30), Duration::from_millis(250), async || {
            if can_i(client, &subject, "watch", "lockservices.dlock.dev", Some(ns)).await
                && can_i(
                    client,
                    &subject,
                    "get",
                    "customresourcedefinitions.apiextensions.k8s.io",
                    None,
                )
                .await
            {
                Ok(())
            } else {
                Err(format!("{} not yet authorized", id.user))
            }
        })
        .await;
    if let Err(last) = settled {
        panic!("timed out waiting for the chart's RBAC to take effect: {last}");
    }
    write_token_kubeconfig(
        cluster,
        &token,
        &format!("{ns}-{}", id.service_account),
        &id.kubeconfig,
    );
    id
}

/// Applies the rendered objects of a namespaced kind `K`, each in its own namespace (else `ns`);
/// how many.
async fn apply_namespaced<K>(client: &Client, ns: &str, yaml: &str) -> usize
where
    K: Kind + Resource<Scope = NamespaceResourceScope>,
{
    let objects = helm::rendered::<K>(yaml);
    for o in &objects {
        let api = Api::namespaced(client.clone(), o.namespace().as_deref().unwrap_or(ns));
        k8s::apply(&api, o).await;
    }
    objects.len()
}

/// Applies the rendered objects of a cluster-scoped kind `K`; how many.
async fn apply_cluster_wide<K>(client: &Client, yaml: &str) -> usize
where
    K: Kind + Resource<Scope = ClusterResourceScope>,
{
    let objects = helm::rendered::<K>(yaml);
    for o in &objects {
        k8s::apply(&k8s::cluster_api(client), o).await;
    }
    objects.len()
}

/// Who an access review asks about.
#[derive(Debug, Clone)]
pub struct Subject {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// The operator as its token authenticates it: the ServiceAccount's user and the groups every
    /// ServiceAccount token carries.
    pub fn subject(&self) -> Subject {
        Subject {
            user: self.user.clone(),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{}", self.namespace),
                "system:authenticated".to_owned(),
            ],
        }
    }
}

/// Whether `subject` may `verb` the `resource`, as the API server's authorizer answers a
/// SubjectAccessReview (what `kubectl auth can-i --as` asks). `resource` is written as `kubectl
/// auth can-i` takes it: `plural[.group][/name]`, and a subresource as `…#sub` (e.g.
/// `lockservices.dlock.dev#status`, `pods#log`).
pub async fn can_i(client: &Client, subject: &Subject, verb: &str, resource: &str, ns: Option<&str>) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(subject.user.clone()),
            groups: Some(subject.groups.clone()),
            resource_attributes: Some(attributes(verb, resource, ns)),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SubjectAccessReview {verb} {resource} as {}: {e}", subject.user));
    answer.status.is_some_and(|s| s.allowed)
}

/// `plural[.group][/name][#sub]` as resource attributes.
fn attributes(verb: &str, resource: &str, ns: Option<&str>) -> ResourceAttributes {
    let (resource, subresource) = match resource.split_once('#') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let (resource, name) = match resource.split_once('/') {
        Some((r, n)) => (r, Some(n.to_owned())),
        None => (resource, None),
    };
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    ResourceAttributes {
        verb: Some(verb.to_owned()),
        group: Some(group.to_owned()),
        resource: Some(plural.to_owned()),
        subresource,
        name,
        namespace: ns.map(str::to_owned),
        ..ResourceAttributes::default()
    }
}

/// A kubeconfig for the test cluster (server and CA from the admin kubeconfig) with a bearer token.
pub fn write_token_kubeconfig(cluster: &Cluster, token: &str, user: &str, path: &Path) {
    let admin = Kubeconfig::read_from(&cluster.kubeconfig)
        .unwrap_or_else(|e| panic!("read {}: {e}", cluster.kubeconfig.display()));
    let context = admin
        .contexts
        .iter()
        .find(|c| Some(&c.name) == admin.current_context.as_ref())
        .and_then(|c| c.context.as_ref())
        .unwrap_or_else(|| panic!("the admin kubeconfig has no current context"));
    let server = admin
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .filter(|c| c.server.is_some() && c.certificate_authority_data.is_some())
        .unwrap_or_else(|| panic!("admin kubeconfig lacks server/CA data"));
    let config = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "dlock-e2e".to_owned(),
            cluster: Some(kube::config::Cluster {
                server: server.server,
                certificate_authority_data: server.certificate_authority_data,
                ..kube::config::Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_owned(),
            auth_info: Some(AuthInfo {
                token: Some(token.to_owned().into()),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: user.to_owned(),
            context: Some(Context {
                cluster: "dlock-e2e".to_owned(),
                user: Some(user.to_owned()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(user.to_owned()),
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        ..Kubeconfig::default()
    };
    let text = serde_yaml::to_string(&config).unwrap_or_else(|e| panic!("kubeconfig as YAML: {e}"));
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
