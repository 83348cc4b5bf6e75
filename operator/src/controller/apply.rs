//! The controllers' writes: server-side apply of children (one field manager, forced), deletes of
//! children the spec no longer asks for, create-once Secrets, and status patches.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::builders::cnpg::Cluster;
use crate::builders::{Child, ChildKind, ChildRef, Desired, FIELD_MANAGER, Owner};
use crate::error::{Error, Result};

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Server-side apply of one namespaced object; returns the object as stored (status included).
pub async fn apply<K>(client: &Client, namespace: &str, obj: &K) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let name = obj.meta().name.clone().ok_or(Error::MissingObjectKey)?;
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    Ok(api.patch(&name, &apply_params(), &Patch::Apply(obj)).await?)
}

/// The stored result of applying one child; Deployments are kept for their availability.
pub enum Applied {
    Deployment(Box<Deployment>),
    Other,
}

pub async fn apply_child(client: &Client, namespace: &str, child: &Child) -> Result<Applied> {
    Ok(match child {
        Child::Service(o) => apply(client, namespace, o).await.map(|_| Applied::Other)?,
        Child::StatefulSet(o) => apply(client, namespace, o).await.map(|_| Applied::Other)?,
        Child::Job(o) => apply(client, namespace, o).await.map(|_| Applied::Other)?,
        Child::Deployment(o) => Applied::Deployment(Box::new(apply(client, namespace, o).await?)),
        Child::NetworkPolicy(o) => apply(client, namespace, o).await.map(|_| Applied::Other)?,
        Child::PodDisruptionBudget(o) => apply(client, namespace, o).await.map(|_| Applied::Other)?,
        Child::PostgresCluster(o) => apply(client, namespace, o.as_ref())
            .await
            .map(|_| Applied::Other)?,
        Child::Secret(o) => apply(client, namespace, o.0.as_ref())
            .await
            .map(|_| Applied::Other)?,
    })
}

/// Deletes a child if it exists; `true` when something was deleted. Background propagation, so a
/// Job's or Deployment's pods go with it.
pub async fn delete_child(client: &Client, namespace: &str, child: &ChildRef) -> Result<bool> {
    match child.kind {
        ChildKind::Service => delete::<Service>(client, namespace, &child.name).await,
        ChildKind::StatefulSet => delete::<StatefulSet>(client, namespace, &child.name).await,
        ChildKind::Job => delete::<Job>(client, namespace, &child.name).await,
        ChildKind::Deployment => delete::<Deployment>(client, namespace, &child.name).await,
        ChildKind::NetworkPolicy => delete::<NetworkPolicy>(client, namespace, &child.name).await,
        ChildKind::PodDisruptionBudget => delete::<PodDisruptionBudget>(client, namespace, &child.name).await,
        ChildKind::PostgresCluster => delete::<Cluster>(client, namespace, &child.name).await,
        ChildKind::Secret => delete::<Secret>(client, namespace, &child.name).await,
    }
}

/// Names of the owner's children of one kind, found by the owner's labels and kept only when their
/// controller reference is this very owner (a namesake's children are not ours to delete).
async fn children_of<K>(client: &Client, owner: &Owner) -> Result<Vec<String>>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), &owner.namespace);
    let list = api
        .list(&ListParams::default().labels(&owner.owner_selector()))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|o| {
            o.meta()
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.uid == owner.owner_ref.uid && r.controller == Some(true))
        })
        .filter_map(|o| o.meta().name.clone())
        .collect())
}

/// The orphans: the owner's children of the swept kinds (by label) that `desired` neither applies
/// nor holds. Pure apart from the reads; the caller deletes them.
pub async fn orphans(client: &Client, owner: &Owner, desired: &Desired) -> Result<Vec<ChildRef>> {
    let mut out = Vec::new();
    for kind in ChildKind::SWEPT {
        let names = match kind {
            ChildKind::NetworkPolicy => children_of::<NetworkPolicy>(client, owner).await?,
            ChildKind::Deployment => children_of::<Deployment>(client, owner).await?,
            ChildKind::Service => children_of::<Service>(client, owner).await?,
            ChildKind::StatefulSet => children_of::<StatefulSet>(client, owner).await?,
            ChildKind::PodDisruptionBudget => children_of::<PodDisruptionBudget>(client, owner).await?,
            ChildKind::Job | ChildKind::PostgresCluster | ChildKind::Secret => continue,
        };
        out.extend(
            names
                .into_iter()
                .filter(|n| !desired.wants(kind, n))
                .map(|name| ChildRef { kind, name }),
        );
    }
    Ok(out)
}

async fn delete<K>(client: &Client, namespace: &str, name: &str) -> Result<bool>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Deletes every Job matching `selector` (the owner's Jobs of one component, found by label) except
/// those named in `keep`; returns the names deleted.
pub async fn delete_stale_jobs(
    client: &Client,
    namespace: &str,
    selector: &str,
    keep: &[&str],
) -> Result<Vec<String>> {
    let api: Api<Job> = Api::namespaced(client.clone(), namespace);
    let jobs = api.list(&ListParams::default().labels(selector)).await?;
    let mut deleted = Vec::new();
    for job in jobs.items {
        let Some(name) = job.metadata.name else { continue };
        if !keep.contains(&name.as_str()) && delete::<Job>(client, namespace, &name).await? {
            deleted.push(name);
        }
    }
    Ok(deleted)
}

/// Creates `secret` unless a Secret of that name exists; returns the stored one and whether it was
/// created now. Never updates an existing Secret: generated passwords are not rotated by reconcile.
pub async fn create_secret_once(client: &Client, namespace: &str, secret: &Secret) -> Result<(Secret, bool)> {
    let name = secret.metadata.name.clone().ok_or(Error::MissingObjectKey)?;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(existing) = api.get_opt(&name).await? {
        return Ok((existing, false));
    }
    match api.create(&PostParams::default(), secret).await {
        Ok(created) => Ok((created, true)),
        // Lost a race with ourselves (a previous leader): keep whatever is there.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok((api.get(&name).await?, false)),
        Err(e) => Err(e.into()),
    }
}

/// Server-side apply of `.status` only.
pub async fn patch_status<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &impl Serialize,
) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(name, &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(())
}
