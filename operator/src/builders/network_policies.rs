//! NetworkPolicies: who may open a connection to the stack's HTTP services.
//!
//! - payment-resource and rail-proxy: only the payout-executor pods of the same PaymentStack (the
//!   bearer credentials decide what a caller may do; these decide who can call at all);
//! - rail-stub: only the rail-proxy pods of the same PaymentStack (nothing else may pay);
//! - lock-server: only the payout-executor pods of the PaymentStacks that reference this
//!   LockService (labelled [`LABEL_LOCK_SERVICE`]) and the operator (its admin calls: force-revoke).
//!
//! and, in each of them, the Prometheus the chart's values name ([`Scraper`], the operator's
//! `--prometheus-namespace-selector` / `--prometheus-pod-selector`) on the metrics port only — for
//! the dlock services that is the HTTP port, where `/metrics` is served beside the API, so the
//! bearer credentials still decide what a scraper could do there (nothing: it holds none).
//!
//! Policies are additive in Kubernetes: whoever needs more (a payout-creating application) adds a
//! policy of their own that selects the same pods (docs/security.md). Probes come from the kubelet,
//! which NetworkPolicy does not filter.

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

/// The Prometheus that scrapes the dlock pods, as the chart's `prometheus` values name it: its pods
/// (by labels) in the namespaces matching (by labels). An empty map selects every namespace (or
/// every pod) — never both: [`Scraper::new`] refuses a scraper that would admit everyone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scraper {
    namespace_labels: BTreeMap<String, String>,
    pod_labels: BTreeMap<String, String>,
}

/// Why the Prometheus selectors cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScraperError {
    #[error("{flag}: {entry:?} is not key=value")]
    NotKeyValue { flag: &'static str, entry: String },
    #[error("{flag}: {key:?} is not a label key ([prefix/]name, name 1-63 of A-Z a-z 0-9 - _ .)")]
    Key { flag: &'static str, key: String },
    #[error(
        "{flag}: the value of {key} is not a label value (0-63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)"
    )]
    Value { flag: &'static str, key: String },
    #[error("{flag}: {key} is given twice")]
    Duplicate { flag: &'static str, key: String },
}

/// Flag names, for the messages.
pub const NAMESPACE_SELECTOR_FLAG: &str = "--prometheus-namespace-selector";
pub const POD_SELECTOR_FLAG: &str = "--prometheus-pod-selector";

impl Scraper {
    /// From the two flags (`k=v,k=v`; empty or absent: no constraint). `None` when neither names
    /// anything: then no policy admits a scraper (the operator was not told who scrapes).
    pub fn new(
        namespace_selector: Option<&str>,
        pod_selector: Option<&str>,
    ) -> Result<Option<Scraper>, ScraperError> {
        let namespace_labels = parse_labels(NAMESPACE_SELECTOR_FLAG, namespace_selector.unwrap_or(""))?;
        let pod_labels = parse_labels(POD_SELECTOR_FLAG, pod_selector.unwrap_or(""))?;
        if namespace_labels.is_empty() && pod_labels.is_empty() {
            return Ok(None);
        }
        Ok(Some(Scraper {
            namespace_labels,
            pod_labels,
        }))
    }

    /// The scraper's pods, as a policy peer.
    fn peer(&self) -> NetworkPolicyPeer {
        NetworkPolicyPeer {
            namespace_selector: Some(selector(self.namespace_labels.clone())),
            pod_selector: Some(selector(self.pod_labels.clone())),
            ..NetworkPolicyPeer::default()
        }
    }

    /// The rule admitting the scraper to `port` (a metrics port) and nothing else.
    pub fn rule(&self, port: i32) -> NetworkPolicyIngressRule {
        NetworkPolicyIngressRule {
            from: Some(vec![self.peer()]),
            ports: Some(vec![tcp(port)]),
        }
    }
}

/// `k=v,k=v` as labels, each key and value checked as Kubernetes checks them.
fn parse_labels(flag: &'static str, raw: &str) -> Result<BTreeMap<String, String>, ScraperError> {
    let mut out = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(ScraperError::NotKeyValue {
                flag,
                entry: entry.to_owned(),
            });
        };
        let (key, value) = (key.trim(), value.trim());
        if !label_key(key) {
            return Err(ScraperError::Key {
                flag,
                key: key.to_owned(),
            });
        }
        if !label_value(value) {
            return Err(ScraperError::Value {
                flag,
                key: key.to_owned(),
            });
        }
        if out.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(ScraperError::Duplicate {
                flag,
                key: key.to_owned(),
            });
        }
    }
    Ok(out)
}

/// A label name segment or value: alphanumeric at both ends, `-_.` inside, at most 63.
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `[prefix/]name`, the prefix a DNS subdomain.
fn label_key(key: &str) -> bool {
    match key.split_once('/') {
        None => label_name(key),
        Some((prefix, name)) => {
            label_name(name)
                && !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|part| {
                    let b = part.as_bytes();
                    !b.is_empty()
                        && b.len() <= 63
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                        && b[0] != b'-'
                        && b[b.len() - 1] != b'-'
                })
        }
    }
}

fn label_value(value: &str) -> bool {
    value.is_empty() || label_name(value)
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

/// A policy admitting `from` (and only them) to the HTTP port of `component`'s pods, and the
/// scraper, when there is one, to that port as well: `/metrics` is served there.
fn ingress_only(
    owner: &Owner,
    component: &str,
    from: Vec<NetworkPolicyPeer>,
    scraper: Option<&Scraper>,
) -> NetworkPolicy {
    let mut rules = vec![NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(vec![tcp(HTTP_PORT)]),
    }];
    rules.extend(scraper.map(|s| s.rule(HTTP_PORT)));
    NetworkPolicy {
        metadata: owner.meta(owner.child(component), component),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(owner.selector(component))),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(rules),
            egress: None,
        }),
    }
}

/// payment-resource: only this stack's executors (and the scraper).
pub fn payment_resource(owner: &Owner, scraper: Option<&Scraper>) -> NetworkPolicy {
    ingress_only(
        owner,
        PAYMENT_RESOURCE,
        vec![pods_of(owner, PAYOUT_EXECUTOR)],
        scraper,
    )
}

/// rail-proxy: only this stack's executors (and the scraper).
pub fn rail_proxy(owner: &Owner, scraper: Option<&Scraper>) -> NetworkPolicy {
    ingress_only(owner, RAIL_PROXY, vec![pods_of(owner, PAYOUT_EXECUTOR)], scraper)
}

/// rail-stub: only this stack's rail-proxy (and the scraper).
pub fn rail_stub(owner: &Owner, scraper: Option<&Scraper>) -> NetworkPolicy {
    ingress_only(owner, RAIL_STUB, vec![pods_of(owner, RAIL_PROXY)], scraper)
}

/// lock-server: the executors of the stacks that use this LockService, and the operator (and the
/// scraper).
pub fn lock_server(owner: &Owner, scraper: Option<&Scraper>) -> NetworkPolicy {
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
    ingress_only(owner, LOCK_SERVER, vec![executors, operator], scraper)
}
