//! NetworkPolicies: who may open a connection to the stack's HTTP services.
//!
//! - payment-resource and rail-proxy: only the payout-executor pods of the same PaymentStack (the
//!   bearer credentials decide what a caller may do; these decide who can call at all);
//! - rail-stub: only the rail-proxy pods of the same PaymentStack (nothing else may pay);
//! - lock-server: only the payout-executor pods of the PaymentStacks that reference this
//!   LockService (labelled [`LABEL_LOCK_SERVICE`]) and the operator (its admin calls: force-revoke).
//!
//! Policies are additive in Kubernetes: whoever needs more (a payout-creating application, a
//! Prometheus in another namespace scraping `/metrics`) adds a policy of their own that selects the
//! same pods (docs/security.md). Probes come from the kubelet, which NetworkPolicy does not filter.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{HTTP_PORT, LABEL_LOCK_SERVICE, LABEL_MANAGED_BY, LABEL_NAME, MANAGED_BY, Owner};
use super::{LOCK_SERVER, PAYMENT_RESOURCE, PAYOUT_EXECUTOR, RAIL_PROXY, RAIL_STUB};

/// The operator's pods, as the chart labels them (`app.kubernetes.io/name`), in any namespace.
pub const OPERATOR_POD_NAME: &str = "dlock-operator";

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    }
}

/// Pods of one component of `owner` (the same labels its Deployment selects by).
fn pods_of(owner: &Owner, component: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(selector(owner.selector(component))),
        ..NetworkPolicyPeer::default()
    }
}

/// A policy admitting `from` (and only them) to the HTTP port of `component`'s pods.
fn ingress_only(owner: &Owner, component: &str, from: Vec<NetworkPolicyPeer>) -> NetworkPolicy {
    NetworkPolicy {
        metadata: owner.meta(owner.child(component), component),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(owner.selector(component))),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(HTTP_PORT)),
                    protocol: Some("TCP".into()),
                    ..NetworkPolicyPort::default()
                }]),
            }]),
            egress: None,
        }),
    }
}

/// payment-resource: only this stack's executors.
pub fn payment_resource(owner: &Owner) -> NetworkPolicy {
    ingress_only(owner, PAYMENT_RESOURCE, vec![pods_of(owner, PAYOUT_EXECUTOR)])
}

/// rail-proxy: only this stack's executors.
pub fn rail_proxy(owner: &Owner) -> NetworkPolicy {
    ingress_only(owner, RAIL_PROXY, vec![pods_of(owner, PAYOUT_EXECUTOR)])
}

/// rail-stub: only this stack's rail-proxy.
pub fn rail_stub(owner: &Owner) -> NetworkPolicy {
    ingress_only(owner, RAIL_STUB, vec![pods_of(owner, RAIL_PROXY)])
}

/// lock-server: the executors of the stacks that use this LockService, and the operator.
pub fn lock_server(owner: &Owner) -> NetworkPolicy {
    let executors = NetworkPolicyPeer {
        pod_selector: Some(selector(BTreeMap::from([
            (LABEL_NAME.into(), PAYOUT_EXECUTOR.into()),
            (LABEL_MANAGED_BY.into(), MANAGED_BY.into()),
            (LABEL_LOCK_SERVICE.into(), owner.name.clone()),
        ]))),
        ..NetworkPolicyPeer::default()
    };
    let operator = NetworkPolicyPeer {
        // Any namespace: the chart installs the operator in its own.
        namespace_selector: Some(LabelSelector::default()),
        pod_selector: Some(selector(BTreeMap::from([(
            LABEL_NAME.into(),
            OPERATOR_POD_NAME.into(),
        )]))),
        ..NetworkPolicyPeer::default()
    };
    ingress_only(owner, LOCK_SERVER, vec![executors, operator])
}
