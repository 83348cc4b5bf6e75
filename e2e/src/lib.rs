//! Support for dlock's cluster tier: tests against a real kube-apiserver + etcd started by
//! `scripts/cluster-up.sh` (no kubelet, no controller-manager).
//!
//! - [`env`]: whether the tier is enabled (`DLOCK_E2E=1`), and where the repository, the tools and
//!   the workspace binaries are.
//! - [`kubectl`]: a thin, typed wrapper over the `kubectl` binary (JSON in, JSON out).
//! - [`wait`]: polling a condition with a deadline (never a bare sleep).
//! - [`helm`]: rendering the chart (`helm template`) and linting it.
//! - [`crds`]: installing the generated CRDs, and comparing the chart's copy with `crds/`.
//! - [`rbac`]: a namespace with the chart's RBAC and a ServiceAccount-token kubeconfig.
//! - [`operator`]: the `dlock-operator` binary as a process, started with the chart's own args.
//! - [`kubelet`]: the stand-in for the kubelet and the controllers that are not running: runs a
//!   migration Job's own command against a local PostgreSQL 16 and writes workload status.
//! - [`objects`]: reading owner references, labels and conditions out of JSON objects.
//! - [`kind`]: the kind tier's steps after `e2e/kind/run.sh`'s setup (`tests/kind.rs`): typed
//!   objects, watches, the ledger over sqlx, the services over reqwest.

pub mod crds;
pub mod env;
pub mod helm;
pub mod kind;
pub mod kubectl;
pub mod kubelet;
pub mod lockapi;
pub mod objects;
pub mod operator;
pub mod proxy;
pub mod rbac;
pub mod wait;

pub use env::{Cluster, cluster};
pub use kubectl::Kubectl;
pub use wait::eventually;

/// Returns from the calling test with a clear message when the cluster tier is not enabled.
#[macro_export]
macro_rules! require_cluster {
    ($test:expr) => {
        match $crate::cluster($test) {
            Some(c) => c,
            None => return,
        }
    };
}
