//! Support for dlock's cluster tier: tests against a real kube-apiserver + etcd started by
//! `scripts/cluster-up.sh` (no kubelet, no controller-manager).
//!
//! - [`env`]: whether the tier is enabled (`DLOCK_E2E=1`), and where the repository, the tools and
//!   the workspace binaries are.
//! - [`k8s`]: the cluster as typed objects (`kube::Client`, `Api<K>` of k8s-openapi's kinds and the
//!   operator's own CRD types), server-side apply, owner references, waits on watches. Both tiers
//!   read and write the cluster through it.
//! - [`kubectl`]: the `kubectl` binary, only where a user's own command line is the point of a check.
//! - [`helm`]: rendering the chart (`helm template`, read as typed objects) and linting it.
//! - [`crds`]: installing the generated CRDs, and comparing the chart's copy with `crds/`.
//! - [`rbac`]: a namespace with the chart's RBAC, a ServiceAccount-token kubeconfig, and access
//!   reviews of what that identity may do.
//! - [`operator`]: the `dlock-operator` binary as a process, started with the chart's own args.
//! - [`kubelet`]: the stand-in for the kubelet and the controllers that are not running: runs a
//!   migration Job's own command against a local PostgreSQL 16 and writes workload status.
//! - [`lockdb`]: lockdb read directly (holder, revocations, the sequence) as the actions' ground truth.
//! - [`specs`]: the LockServices, PaymentStacks and Secrets the tests create, as typed objects.
//! - [`stage`]: one operator test's namespace, operator, stand-in kubelet, and waits that drive it.
//! - [`monitoring`]: the chart's alerting rules and dashboard, promtool over them, and the metric
//!   names their queries read.
//! - [`kind`]: the kind tier's steps after `e2e/kind/run.sh`'s setup (`tests/kind.rs`): typed
//!   objects, watches, the ledger over sqlx, the services over reqwest.

pub mod crds;
pub mod env;
pub mod helm;
pub mod k8s;
pub mod kind;
pub mod kubectl;
pub mod kubelet;
pub mod lockapi;
pub mod lockdb;
pub mod monitoring;
pub mod operator;
pub mod payouts;
pub mod proxy;
pub mod rbac;
pub mod specs;
pub mod stage;

pub use env::{Cluster, cluster};
pub use kubectl::Kubectl;

/// Returns from the calling (async) test with a clear message when the cluster tier is not enabled.
#[macro_export]
macro_rules! require_cluster {
    ($test:expr) => {
        match $crate::cluster($test).await {
            Some(c) => c,
            None => return,
        }
    };
}
