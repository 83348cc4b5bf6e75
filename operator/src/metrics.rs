//! The operator's own metrics, on `/metrics`:
//! - `dlock_operator_reconciliations_total{kind}`
//! - `dlock_operator_reconcile_failures_total{kind,reason}`
//! - `dlock_operator_reconcile_duration_seconds{kind}` (histogram)
//! - `dlock_operator_fencing_sequence_behind{namespace,name}`: 1 while a LockService's
//!   `fencing_token_seq` is below the highest token its paydbs have seen (C1 §1.7), else 0;
//!   `dlock_operator_fencing_sequence{…}` and `dlock_operator_fencing_high_water{…}`: the two numbers;
//! - `dlock_operator_replicas_desired{namespace,name,kind,component}` and
//!   `dlock_operator_replicas_available{…}`: each Deployment the operator applied (lock-server,
//!   payment-resource, rail-proxy, payout-executor, rail-stub), as its status said at the last
//!   reconcile — the readiness alerts compare the two;
//! - `dlock_operator_migration_failed{namespace,name,kind}`: 1 while the current migration Job has
//!   failed (`Degraded/MigrationFailed`), else 0.
//!
//! Series of objects that no longer exist are removed ([`Metrics::retain`]), so an alert never
//! fires for a deleted LockService or PaymentStack.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::health::{DeploymentHealth, JobState};

/// The `kind` label values.
pub const LOCK_SERVICE: &str = "LockService";
pub const PAYMENT_STACK: &str = "PaymentStack";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub kind: &'static str,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OwnerLabels {
    pub namespace: String,
    pub name: String,
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ComponentLabels {
    pub namespace: String,
    pub name: String,
    pub kind: &'static str,
    pub component: String,
}

type HistogramFamily = Family<KindLabel, Histogram, fn() -> Histogram>;

/// An object the per-object series are about: (kind, namespace, name).
pub type ObjectKey = (&'static str, String, String);

#[derive(Debug, Clone)]
pub struct Metrics {
    reconciliations: Family<KindLabel, Counter>,
    failures: Family<FailureLabels, Counter>,
    duration: HistogramFamily,
    behind: Family<ObjectLabels, Gauge>,
    sequence: Family<ObjectLabels, Gauge>,
    high_water: Family<ObjectLabels, Gauge>,
    replicas_desired: Family<ComponentLabels, Gauge>,
    replicas_available: Family<ComponentLabels, Gauge>,
    migration_failed: Family<OwnerLabels, Gauge>,
    /// The components exported per object, so that [`Metrics::retain`] can remove their series
    /// (a family cannot be listed).
    exported: Arc<Mutex<BTreeMap<ObjectKey, BTreeSet<String>>>>,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~20 s: a reconcile is a handful of API calls.
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            reconciliations: Family::default(),
            failures: Family::default(),
            duration: HistogramFamily::new_with_constructor(duration_histogram),
            behind: Family::default(),
            sequence: Family::default(),
            high_water: Family::default(),
            replicas_desired: Family::default(),
            replicas_available: Family::default(),
            migration_failed: Family::default(),
            exported: Arc::default(),
        };
        registry.register(
            "dlock_operator_replicas_desired",
            "Replicas a Deployment the operator applied asks for, by owner and component",
            m.replicas_desired.clone(),
        );
        registry.register(
            "dlock_operator_replicas_available",
            "Available (ready for minReadySeconds) replicas of that Deployment at the last reconcile",
            m.replicas_available.clone(),
        );
        registry.register(
            "dlock_operator_migration_failed",
            "1 while the current migration Job of a LockService or PaymentStack has failed",
            m.migration_failed.clone(),
        );
        registry.register(
            "dlock_operator_fencing_sequence_behind",
            "1 while the LockService's fencing sequence is below a token its resources have seen",
            m.behind.clone(),
        );
        registry.register(
            "dlock_operator_fencing_sequence",
            "Last checked value of the LockService's fencing_token_seq",
            m.sequence.clone(),
        );
        registry.register(
            "dlock_operator_fencing_high_water",
            "Highest token any paydb of the LockService's PaymentStacks has seen, when last checked",
            m.high_water.clone(),
        );
        registry.register(
            "dlock_operator_reconciliations",
            "Reconciliations run, by kind",
            m.reconciliations.clone(),
        );
        registry.register(
            "dlock_operator_reconcile_failures",
            "Reconciliations that failed, by kind and reason",
            m.failures.clone(),
        );
        registry.register(
            "dlock_operator_reconcile_duration_seconds",
            "Duration of one reconciliation, by kind",
            m.duration.clone(),
        );
        m
    }

    /// Counts a reconciliation and times it until [`ReconcileTimer`] drops.
    pub fn reconcile_started(&self, kind: &'static str) -> ReconcileTimer {
        self.reconciliations.get_or_create(&KindLabel { kind }).inc();
        ReconcileTimer {
            start: Instant::now(),
            histogram: self.duration.get_or_create(&KindLabel { kind }).clone(),
        }
    }

    /// Exports the last fencing check of one LockService.
    pub fn fencing_observed(
        &self,
        namespace: &str,
        name: &str,
        f: Option<&crate::crd::actions::FencingStatus>,
    ) {
        let Some(f) = f else { return };
        self.exported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((LOCK_SERVICE, namespace.to_owned(), name.to_owned()))
            .or_default();
        let labels = ObjectLabels {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.behind.get_or_create(&labels).set(i64::from(f.is_behind()));
        self.sequence.get_or_create(&labels).set(f.sequence);
        self.high_water.get_or_create(&labels).set(f.high_water);
    }

    /// Exports what one reconcile saw of an object's Deployments and migration Job (`None`: it has
    /// no schema, or the reconcile stopped before looking).
    pub fn workloads_observed(
        &self,
        key: &ObjectKey,
        deployments: &[DeploymentHealth],
        migration: Option<&JobState>,
    ) {
        let (kind, namespace, name) = (key.0, &key.1, &key.2);
        let prefix = format!("{name}-");
        let mut exported = self
            .exported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let components = exported.entry(key.clone()).or_default();
        for d in deployments {
            let component = d.name.strip_prefix(&prefix).unwrap_or(&d.name).to_owned();
            let labels = ComponentLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                kind,
                component: component.clone(),
            };
            self.replicas_desired
                .get_or_create(&labels)
                .set(i64::from(d.desired));
            self.replicas_available
                .get_or_create(&labels)
                .set(i64::from(d.available));
            components.insert(component);
        }
        if let Some(state) = migration {
            let labels = OwnerLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                kind,
            };
            self.migration_failed
                .get_or_create(&labels)
                .set(i64::from(matches!(state, JobState::Failed(_))));
        }
    }

    /// Removes every per-object series of the objects not in `existing` (deleted since).
    pub fn retain(&self, existing: &BTreeSet<ObjectKey>) {
        let mut exported = self
            .exported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let gone: Vec<ObjectKey> = exported
            .keys()
            .filter(|k| !existing.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            let components = exported.remove(&key).unwrap_or_default();
            let (kind, namespace, name) = key;
            for component in components {
                let labels = ComponentLabels {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    kind,
                    component,
                };
                self.replicas_desired.remove(&labels);
                self.replicas_available.remove(&labels);
            }
            self.migration_failed.remove(&OwnerLabels {
                namespace: namespace.clone(),
                name: name.clone(),
                kind,
            });
            let object = ObjectLabels { namespace, name };
            if kind == LOCK_SERVICE {
                self.behind.remove(&object);
                self.sequence.remove(&object);
                self.high_water.remove(&object);
            }
        }
    }

    pub fn reconcile_failed(&self, kind: &'static str, reason: &'static str) {
        self.failures.get_or_create(&FailureLabels { kind, reason }).inc();
    }
}

pub struct ReconcileTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    fn health(name: &str, desired: i32, available: i32) -> DeploymentHealth {
        DeploymentHealth {
            name: name.into(),
            desired,
            available,
            updated: available,
            observed: true,
        }
    }

    #[test]
    fn workloads_and_migration_are_exported_per_object_and_removed_with_it() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let shop: ObjectKey = (PAYMENT_STACK, "pay".into(), "shop".into());
        let locks: ObjectKey = (LOCK_SERVICE, "pay".into(), "locks".into());
        m.workloads_observed(
            &shop,
            &[
                health("shop-payment-resource", 2, 1),
                health("shop-rail-proxy", 2, 2),
            ],
            Some(&JobState::Succeeded),
        );
        m.workloads_observed(
            &locks,
            &[health("locks-lock-server", 2, 0)],
            Some(&JobState::Failed("boom".into())),
        );
        m.fencing_observed(
            "pay",
            "locks",
            Some(&crate::crd::actions::FencingStatus {
                sequence: 3,
                high_water: 9,
                high_water_stack: None,
                checked_at: "now".into(),
                job_name: None,
            }),
        );
        let t = text(&registry);
        for line in [
            r#"dlock_operator_replicas_desired{namespace="pay",name="shop",kind="PaymentStack",component="payment-resource"} 2"#,
            r#"dlock_operator_replicas_available{namespace="pay",name="shop",kind="PaymentStack",component="payment-resource"} 1"#,
            r#"dlock_operator_replicas_available{namespace="pay",name="locks",kind="LockService",component="lock-server"} 0"#,
            r#"dlock_operator_migration_failed{namespace="pay",name="shop",kind="PaymentStack"} 0"#,
            r#"dlock_operator_migration_failed{namespace="pay",name="locks",kind="LockService"} 1"#,
            r#"dlock_operator_fencing_sequence_behind{namespace="pay",name="locks"} 1"#,
        ] {
            assert!(t.contains(line), "{line}\n{t}");
        }
        // The LockService is deleted: its series go, the stack's stay.
        m.retain(&[shop.clone()].into());
        let t = text(&registry);
        assert!(!t.contains(r#"name="locks""#), "{t}");
        assert!(t.contains(r#"component="rail-proxy""#), "{t}");
        m.retain(&BTreeSet::new());
        assert!(!text(&registry).contains(r#"name="shop""#));
    }
}
