//! The cluster as typed objects, for both tiers: a `kube::Client` from a kubeconfig file, `Api<K>`
//! reads that name what is missing, server-side apply and merge patches, owner references, and waits
//! on watches (`await_condition` under a deadline).

use std::fmt::Debug;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, PodTemplateSpec, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Api, Client, Config, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The field manager of everything the tests write.
pub const FIELD_MANAGER: &str = "dlock-e2e";

/// What `Api<K>` needs of a kind here: typed, readable, printable.
pub trait Kind:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + 'static
{
}
impl<K> Kind for K where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + 'static
{
}

/// A client of the cluster in this kubeconfig file (not `$KUBECONFIG`, which may name another
/// cluster).
pub async fn client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("read kubeconfig {}: {e}", kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", kubeconfig.display()));
    Client::try_from(config).unwrap_or_else(|e| panic!("kube client: {e}"))
}

/// Waits on a watch of `name` until `cond` holds, at most `timeout`; panics naming `what`.
pub async fn wait_until<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    cond: impl Condition<K>,
) -> K
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => panic!("waiting for {what}: {name} does not exist"),
        Ok(Err(e)) => panic!("waiting for {what}: watching {name}: {e}"),
        Err(_) => panic!("timed out after {}s waiting for {what}", timeout.as_secs()),
    }
}

/// `Kind/name`, for messages.
pub fn describe<K: Kind>(obj: &K) -> String {
    format!("{}/{}", K::kind(&()), obj.name_any())
}

/// One object, or `None` when it does not exist.
pub async fn get<K: Kind>(api: &Api<K>, name: &str) -> Option<K> {
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {}/{name}: {e}", K::kind(&())))
}

/// One object that must exist.
pub async fn must_get<K: Kind>(api: &Api<K>, name: &str) -> K {
    get(api, name)
        .await
        .unwrap_or_else(|| panic!("{}/{name} does not exist", K::kind(&())))
}

/// Every object the `Api` sees.
pub async fn list<K: Kind>(api: &Api<K>) -> Vec<K> {
    api.list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("list {}: {e}", K::plural(&())))
        .items
}

/// Server-side apply as [`FIELD_MANAGER`], taking over conflicting fields: creates the object or
/// brings the fields it sets to its values (`kubectl apply --server-side --force-conflicts`).
pub async fn apply<K: Kind>(api: &Api<K>, obj: &K) -> K {
    let name = obj.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {}: {e}", describe(obj)))
}

/// A JSON merge patch on the object (what `kubectl patch --type merge` sends); the API server's
/// refusal is the `Err`.
pub async fn patch<K: Kind>(api: &Api<K>, name: &str, patch: &serde_json::Value) -> Result<K, kube::Error> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// `metadata.annotations[key] = value` (what `kubectl annotate --overwrite` sets).
pub async fn annotate<K: Kind>(api: &Api<K>, name: &str, key: &str, value: &str) {
    let body = serde_json::json!({"metadata": {"annotations": {key: value}}});
    patch(api, name, &body)
        .await
        .unwrap_or_else(|e| panic!("annotate {}/{name} {key}: {e}", K::kind(&())));
}

/// The cluster-wide `Api<K>` of a cluster-scoped kind.
pub fn cluster_api<K>(client: &Client) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope>,
{
    Api::all(client.clone())
}

/// Creates namespace `name` (idempotent).
pub async fn namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    apply(&cluster_api::<Namespace>(client), &ns).await;
}

/// The owner reference with `controller: true`, if any.
pub fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// True when the object is controlled by the object with this uid.
pub fn controlled_by(meta: &ObjectMeta, owner_uid: &str) -> bool {
    controller_ref(meta).is_some_and(|r| r.uid == owner_uid)
}

/// The objects of kind `K` in `ns` that the object with uid `owner_uid` controls.
pub async fn owned<K>(client: &Client, ns: &str, owner_uid: &str) -> Vec<K>
where
    K: Kind + Resource<Scope = NamespaceResourceScope>,
{
    list(&Api::<K>::namespaced(client.clone(), ns))
        .await
        .into_iter()
        .filter(|o| controlled_by(o.meta(), owner_uid))
        .collect()
}

/// One object of any kind the operator creates: its kind, its metadata, and the object as JSON text
/// (for "is this value wired anywhere" checks).
#[derive(Debug, Clone)]
pub struct Child {
    pub kind: &'static str,
    pub meta: ObjectMeta,
    pub text: String,
}

impl Child {
    fn of<K: Kind>(obj: &K) -> Child {
        Child {
            kind: kind_name::<K>(),
            meta: obj.meta().clone(),
            text: serde_json::to_string(obj).unwrap_or_else(|e| panic!("serialize {}: {e}", describe(obj))),
        }
    }

    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    /// `Kind/name`, for messages.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.kind, self.name())
    }
}

/// `K::KIND` as a `'static` str (k8s-openapi's kinds are constants).
fn kind_name<K: Kind>() -> &'static str {
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(k) => k,
        std::borrow::Cow::Owned(k) => panic!("kind {k} is not a constant"),
    }
}

/// Every object the operator may create (Deployments, StatefulSets, Jobs, Services, ConfigMaps,
/// Secrets, NetworkPolicies, PodDisruptionBudgets) in `ns` that `owner_uid` controls.
pub async fn children(client: &Client, ns: &str, owner_uid: &str) -> Vec<Child> {
    async fn of<K: Kind + Resource<Scope = NamespaceResourceScope>>(
        client: &Client,
        ns: &str,
        owner_uid: &str,
    ) -> Vec<Child> {
        owned::<K>(client, ns, owner_uid)
            .await
            .iter()
            .map(Child::of)
            .collect()
    }
    let mut all = of::<Deployment>(client, ns, owner_uid).await;
    all.extend(of::<StatefulSet>(client, ns, owner_uid).await);
    all.extend(of::<Job>(client, ns, owner_uid).await);
    all.extend(of::<Service>(client, ns, owner_uid).await);
    all.extend(of::<ConfigMap>(client, ns, owner_uid).await);
    all.extend(of::<Secret>(client, ns, owner_uid).await);
    all.extend(of::<NetworkPolicy>(client, ns, owner_uid).await);
    all.extend(of::<PodDisruptionBudget>(client, ns, owner_uid).await);
    all
}

/// `spec.replicas` of a Deployment, defaulting to 1 as the API server does.
pub fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// `spec.replicas` of a StatefulSet, defaulting to 1 as the API server does.
pub fn sts_replicas(s: &StatefulSet) -> i32 {
    s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// Every image a pod template uses (init containers included).
pub fn images(template: &PodTemplateSpec) -> Vec<String> {
    let Some(spec) = &template.spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter_map(|c| c.image.clone())
        .collect()
}

/// The first container of a pod template (Deployment, StatefulSet, Job).
pub fn container<'a>(template: &'a PodTemplateSpec, owner: &str) -> &'a Container {
    template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .unwrap_or_else(|| panic!("{owner} has no container"))
}

/// A container's `command` followed by its `args`.
pub fn argv(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}
