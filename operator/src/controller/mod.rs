//! The reconcilers, one per kind ([`lockservice`], [`paymentstack`]), the pipeline they share
//! ([`pipeline`] over [`steps`]: [`store`], [`schema`], [`tls`], [`apply`], [`verdict`]), the error policy
//! with per-object exponential backoff, instrumentation (metrics, Warning events) and the run loops.
//!
//! Each reconcile is level-based: observe the cluster, compute the desired children with the pure
//! builders, server-side apply them, delete what the spec no longer asks for, write status.

pub mod apply;
pub mod lockservice;
pub mod paymentstack;
pub mod pipeline;
pub mod schema;
pub mod steps;
pub mod store;
pub mod tls;
pub mod verdict;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

pub use crate::context::{Context, Settings};
pub use crate::error::{Error, Result};

use crate::builders::cnpg::Cluster;
use crate::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use crate::crd::{LockService, PaymentStack};
use crate::metrics::{LOCK_SERVICE, ObjectKey, PAYMENT_STACK};
use crate::reasons::Reason;

const BACKOFF_BASE: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Exponential backoff: 2 s, 4 s, 8 s … capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(1u32 << exp).min(BACKOFF_MAX)
}

fn key_of<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

fn reference_of<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    obj.object_ref(&())
}

/// Runs one reconcile of a possibly malformed object with metrics, logs and Warning events. A
/// malformed object is reported and skipped; it never stops the watch.
async fn instrumented<K, F, Fut>(guard: Arc<DeserializeGuard<K>>, ctx: Arc<Context>, run: F) -> Result<Action>
where
    K: Resource<DynamicType = ()> + Clone,
    F: FnOnce(K, Arc<Context>) -> Fut,
    Fut: std::future::Future<Output = Result<Action>>,
{
    let kind: &'static str = if K::kind(&()) == LOCK_SERVICE {
        LOCK_SERVICE
    } else {
        PAYMENT_STACK
    };
    let _timer = ctx.metrics.reconcile_started(kind);
    let obj = match &guard.0 {
        Ok(obj) => obj.clone(),
        Err(invalid) => {
            tracing::warn!(
                event = "invalid_object",
                kind,
                namespace = invalid.metadata.namespace.as_deref().unwrap_or_default(),
                name = invalid.metadata.name.as_deref().unwrap_or_default(),
                error = %invalid.error,
                "cannot read the object; skipping it until it changes"
            );
            ctx.metrics.reconcile_failed(kind, "invalid_object");
            let regarding = ObjectReference {
                api_version: Some(K::api_version(&()).into_owned()),
                kind: Some(kind.into()),
                name: invalid.metadata.name.clone(),
                namespace: invalid.metadata.namespace.clone(),
                uid: invalid.metadata.uid.clone(),
                ..ObjectReference::default()
            };
            ctx.publish(
                &regarding,
                EventType::Warning,
                Reason::InvalidObject,
                invalid.error.clone(),
            )
            .await;
            return Ok(Action::await_change());
        }
    };
    let key = key_of(&obj);
    let regarding = reference_of(&obj);
    let name = obj.name_any();
    let namespace = obj.namespace().unwrap_or_default();
    let result = run(obj, ctx.clone()).await;
    match &result {
        Ok(_) => ctx.record_success(&key),
        Err(e) => {
            ctx.metrics.reconcile_failed(kind, e.metric_label());
            tracing::warn!(event = "reconcile_failed", kind, namespace, name, error = %e);
            ctx.publish(
                &regarding,
                EventType::Warning,
                Reason::ReconcileFailed,
                e.to_string(),
            )
            .await;
        }
    }
    result
}

/// The error policy of both controllers: retry with per-object exponential backoff.
fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<DeserializeGuard<K>>,
    _error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let key = match &obj.0 {
        Ok(o) => key_of(o),
        Err(_) => return Action::await_change(),
    };
    Action::requeue(backoff(ctx.record_failure(&key)))
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = ()>,
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Only the operator's own children are watched.
fn children() -> watcher::Config {
    watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
}

fn log_outcome<K: Resource, E: std::fmt::Display>(res: std::result::Result<(ObjectRef<K>, Action), E>) {
    match res {
        Ok((obj, _)) => tracing::debug!(event = "reconciled", object = %obj),
        // Reconcile errors were logged where they happened; these are watch/queue errors.
        Err(e) => tracing::debug!(event = "controller_error", error = %e),
    }
}

/// How often the metrics of deleted objects are removed.
const METRICS_PRUNE_INTERVAL: Duration = Duration::from_secs(30);

/// (kind, namespace, name) of every object in a controller's store, readable or not.
fn object_keys<K: Resource<DynamicType = ()>>(
    kind: &'static str,
    objects: &[Arc<DeserializeGuard<K>>],
) -> impl Iterator<Item = ObjectKey> {
    objects
        .iter()
        .filter_map(|g| {
            let meta = match &g.0 {
                Ok(o) => o.meta(),
                Err(invalid) => &invalid.metadata,
            };
            Some((meta.namespace.clone()?, meta.name.clone()?))
        })
        .map(move |(namespace, name)| (kind, namespace, name))
        .collect::<Vec<_>>()
        .into_iter()
}

/// Whether this API server serves CloudNativePG's Clusters (and the operator may list them).
async fn cnpg_served(client: &Client, ns: Option<&str>) -> bool {
    let served = api::<Cluster>(client, ns)
        .list(&kube::api::ListParams::default().limit(1))
        .await;
    match &served {
        Ok(_) => tracing::info!(event = "cloudnativepg_detected", watched = true),
        Err(e) => tracing::info!(event = "cloudnativepg_detected", watched = false, reason = %e),
    }
    served.is_ok()
}

/// Runs both controllers until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let client = ctx.client.clone();
    let ns = ctx.settings.namespace.clone();
    let ns = ns.as_deref();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // CloudNativePG's Clusters are watched where CloudNativePG is installed (a watch on a type the
    // API server does not serve would only fail, for ever). Installed later: restart the operator;
    // until then the Clusters it creates are still looked at by the periodic requeue.
    let cnpg = cnpg_served(&client, ns).await;
    let lock_services = Controller::new(
        api::<DeserializeGuard<LockService>>(&client, ns),
        watcher::Config::default(),
    );
    let lock_service_store = lock_services.store();
    let lock_services = if cnpg {
        lock_services.owns(api::<Cluster>(&client, ns), children())
    } else {
        lock_services
    };
    let lock_services = lock_services
        .owns(api::<StatefulSet>(&client, ns), children())
        .owns(api::<Service>(&client, ns), children())
        .owns(api::<Job>(&client, ns), children())
        .owns(api::<Deployment>(&client, ns), children())
        .owns(api::<NetworkPolicy>(&client, ns), children())
        .owns(api::<PodDisruptionBudget>(&client, ns), children())
        // The grant public keys it publishes.
        .owns(api::<ConfigMap>(&client, ns), children())
        // A PaymentStack's status (the grant keys its resources are rolled out with) decides which
        // key its LockService signs with: a change re-reconciles that LockService.
        .watches(
            api::<DeserializeGuard<PaymentStack>>(&client, ns),
            watcher::Config::default(),
            |ps| {
                let ps = ps.0.as_ref().ok()?;
                Some(ObjectRef::new(&ps.spec.lock_service_ref.name).within(&ps.namespace()?))
            },
        )
        .graceful_shutdown_on(stop(rx.clone()))
        .run(
            |obj, ctx| {
                instrumented(obj, ctx, |ls: LockService, ctx| async move {
                    pipeline::reconcile(&ls, &ctx).await
                })
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|res| async move { log_outcome(res) });

    let stacks = Controller::new(
        api::<DeserializeGuard<PaymentStack>>(&client, ns),
        watcher::Config::default(),
    );
    let store = stacks.store();
    let stack_store = store.clone();
    let stacks = if cnpg {
        stacks.owns(api::<Cluster>(&client, ns), children())
    } else {
        stacks
    };
    let stacks = stacks
        .owns(api::<StatefulSet>(&client, ns), children())
        .owns(api::<Service>(&client, ns), children())
        .owns(api::<Job>(&client, ns), children())
        .owns(api::<Deployment>(&client, ns), children())
        .owns(api::<NetworkPolicy>(&client, ns), children())
        // A LockService change (e.g. it became Ready) re-reconciles the stacks that reference it.
        .watches(
            api::<DeserializeGuard<LockService>>(&client, ns),
            watcher::Config::default(),
            move |ls| {
                let name = ls.meta().name.clone();
                let namespace = ls.meta().namespace.clone();
                store
                    .state()
                    .iter()
                    .filter_map(|ps| ps.0.as_ref().ok())
                    .filter(|ps| {
                        Some(&ps.spec.lock_service_ref.name) == name.as_ref()
                            && ps.meta().namespace == namespace
                    })
                    .map(|ps| ObjectRef::new(&ps.name_any()).within(&ps.namespace().unwrap_or_default()))
                    .collect::<Vec<ObjectRef<DeserializeGuard<PaymentStack>>>>()
            },
        )
        .graceful_shutdown_on(stop(rx.clone()))
        .run(
            |obj, ctx| {
                instrumented(obj, ctx, |ps: PaymentStack, ctx| async move {
                    pipeline::reconcile(&ps, &ctx).await
                })
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|res| async move { log_outcome(res) });

    // Every change of the Clusters, for the promotions under way: a promotion's phase lasts
    // seconds and a reconcile looks once, so the kind of a change of primary is taken from here.
    let promotions = {
        let ctx = ctx.clone();
        let watched = cnpg.then(|| api::<Cluster>(&client, ns));
        let mut rx = rx.clone();
        async move {
            let Some(clusters) = watched else { return };
            let seen = watcher(clusters, children())
                .default_backoff()
                .touched_objects()
                .for_each(|c| {
                    match c {
                        Ok(c) => ctx.observe_cluster(&c),
                        Err(e) => tracing::debug!(event = "cluster_watch_error", error = %e),
                    }
                    std::future::ready(())
                });
            tokio::select! {
                () = seen => {}
                _ = rx.wait_for(|s| *s) => {}
            }
        }
    };

    // Series of deleted objects go, so that no alert fires for what no longer exists.
    let prune = {
        let metrics = ctx.metrics.clone();
        let mut rx = rx;
        async move {
            loop {
                let existing: BTreeSet<ObjectKey> = object_keys(LOCK_SERVICE, &lock_service_store.state())
                    .chain(object_keys(PAYMENT_STACK, &stack_store.state()))
                    .collect();
                metrics.retain(&existing);
                tokio::select! {
                    () = tokio::time::sleep(METRICS_PRUNE_INTERVAL) => {}
                    _ = rx.wait_for(|s| *s) => return,
                }
            }
        }
    };

    tracing::info!(event = "controllers_started");
    let signal = async move {
        shutdown.await;
        let _ = tx.send(true);
    };
    tokio::join!(lock_services, stacks, prune, promotions, signal);
    tracing::info!(event = "controllers_stopped");
}

#[cfg(test)]
mod tests;
