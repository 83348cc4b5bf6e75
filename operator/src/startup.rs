//! Start-up: wait (bounded) for the operator's CRDs to be Established, and leader election over a
//! coordination.k8s.io Lease so that of several replicas only one runs the controllers.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};

use crate::crd::{LockService, PaymentStack};

/// Names of the CRDs the controllers need.
pub fn crd_names() -> Vec<String> {
    vec![
        LockService::crd_name().to_owned(),
        PaymentStack::crd_name().to_owned(),
    ]
}

/// Waits up to `timeout` for every CRD to be Established; returns the ones that are not.
pub async fn wait_for_crds(client: &Client, timeout: Duration) -> Vec<String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    for name in crd_names() {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout_at(deadline, established).await {
            Ok(Ok(Some(_))) => tracing::info!(event = "crd_established", crd = %name),
            Ok(Ok(None)) | Err(_) => missing.push(name),
            Ok(Err(e)) => {
                tracing::warn!(event = "crd_check_failed", crd = %name, error = %e);
                missing.push(name);
            }
        }
    }
    missing
}

/// Leader-election parameters.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// Seconds a lease stays valid without renewal.
    pub duration_secs: u64,
    /// Seconds before expiry at which the holder renews.
    pub grace_secs: u64,
}

pub async fn lease_manager(client: Client, cfg: &LeaseConfig) -> Result<LeaseManager, LeaseManagerError> {
    LeaseManagerBuilder::new(client, &cfg.name)
        .with_namespace(&cfg.namespace)
        .with_identity(&cfg.identity)
        .with_duration(cfg.duration_secs)
        .with_grace(cfg.grace_secs)
        .build()
        .await
}
