//! The NetworkPolicies (builders/network_policies.rs): who may call each service, and the scraper.

use super::*;

/// A pod: its namespace and labels.
type Pod = (&'static str, std::collections::BTreeMap<String, String>);

/// Whether `policy` (in namespace "pay") admits a connection from `from` to port 8080.
fn admits(policy: &k8s_openapi::api::networking::v1::NetworkPolicy, from: &Pod) -> bool {
    admits_on(policy, from, 8080)
}

/// Whether `policy` (in namespace "pay") admits a connection from `from` to `port`. A namespace
/// carries the label Kubernetes gives every namespace, `kubernetes.io/metadata.name`.
fn admits_on(policy: &k8s_openapi::api::networking::v1::NetworkPolicy, from: &Pod, port: i32) -> bool {
    let spec = policy.spec.as_ref().unwrap();
    spec.ingress.iter().flatten().any(|rule| {
        let port_ok = rule.ports.iter().flatten().any(|p| {
            p.port
                == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                    port,
                ))
        });
        let peer_ok = rule.from.iter().flatten().any(|peer| {
            assert!(peer.ip_block.is_none());
            // No namespaceSelector: the policy's own namespace only; `{}`: any namespace.
            let ns_ok = match &peer.namespace_selector {
                None => from.0 == "pay",
                Some(sel) => selects(
                    sel,
                    &[("kubernetes.io/metadata.name".to_owned(), from.0.to_owned())].into(),
                ),
            };
            ns_ok && peer.pod_selector.as_ref().is_none_or(|sel| selects(sel, &from.1))
        });
        port_ok && peer_ok
    })
}

fn policies(d: &Desired) -> Vec<&k8s_openapi::api::networking::v1::NetworkPolicy> {
    d.apply
        .iter()
        .filter_map(|c| match c {
            Child::NetworkPolicy(p) => Some(p),
            _ => None,
        })
        .collect()
}

#[test]
fn network_policies_admit_only_the_callers_each_service_needs() {
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let locks = lockservice::children::desired(&ls, &ls_owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let shop = default_stack();
    let shop_owner = Owner::of(&shop).unwrap();
    let view = ready_lock_service();
    let stack =
        paymentstack::children::desired(&shop, &shop_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
            .unwrap();
    // Another stack in the namespace that takes its locks from another LockService.
    let mut other = stack_named("other", "locks-2");
    other.spec.rail_stub.enabled = true;
    let other_owner = Owner::of(&other).unwrap();
    let other_d = paymentstack::children::desired(
        &other,
        &other_owner,
        &ps_inputs(&JobState::Succeeded, Some(&view)),
    )
    .unwrap();

    let executor: Pod = ("pay", pod_labels(&stack, "shop-payout-executor"));
    let rail_proxy: Pod = ("pay", pod_labels(&stack, "shop-rail-proxy"));
    let payment_resource: Pod = ("pay", pod_labels(&stack, "shop-payment-resource"));
    let rail_stub: Pod = ("pay", pod_labels(&stack, "shop-rail-stub"));
    let lock_server: Pod = ("pay", pod_labels(&locks, "locks-lock-server"));
    let other_executor: Pod = ("pay", pod_labels(&other_d, "other-payout-executor"));
    let other_rail_proxy: Pod = ("pay", pod_labels(&other_d, "other-rail-proxy"));
    let operator: Pod = (
        "dlock-system",
        [("app.kubernetes.io/name".to_owned(), "dlock-operator".to_owned())].into(),
    );
    let stranger: Pod = ("pay", [("app".to_owned(), "curl".to_owned())].into());
    let stranger_elsewhere: Pod = ("other-ns", executor.1.clone());
    let everyone = [
        ("executor", &executor),
        ("rail-proxy", &rail_proxy),
        ("payment-resource", &payment_resource),
        ("rail-stub", &rail_stub),
        ("lock-server", &lock_server),
        ("other-executor", &other_executor),
        ("other-rail-proxy", &other_rail_proxy),
        ("operator", &operator),
        ("stranger", &stranger),
        ("executor-labels-in-another-namespace", &stranger_elsewhere),
    ];

    // Who may connect to whom: exactly these, nobody else.
    let expected: [(&str, &Desired, &Pod, &[&str]); 4] = [
        ("shop-payment-resource", &stack, &payment_resource, &["executor"]),
        ("shop-rail-proxy", &stack, &rail_proxy, &["executor"]),
        ("shop-rail-stub", &stack, &rail_stub, &["rail-proxy"]),
        (
            "locks-lock-server",
            &locks,
            &lock_server,
            &["executor", "operator"],
        ),
    ];
    for (policy_name, desired, target, allowed) in expected {
        let policy = policies(desired)
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(policy_name))
            .unwrap_or_else(|| panic!("no NetworkPolicy {policy_name}"));
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_owned()][..]));
        assert!(
            selects(spec.pod_selector.as_ref().unwrap(), &target.1),
            "{policy_name} does not select its own pods"
        );
        // It selects no other pod of the namespace.
        for (who, pod) in everyone {
            if !std::ptr::eq(pod, target) && pod.0 == "pay" {
                assert!(
                    !selects(spec.pod_selector.as_ref().unwrap(), &pod.1),
                    "{policy_name} selects {who}"
                );
            }
        }
        let admitted: Vec<&str> = everyone
            .iter()
            .filter(|(_, pod)| admits(policy, pod))
            .map(|(who, _)| *who)
            .collect();
        assert_eq!(admitted, allowed, "{policy_name} admits {admitted:?}");
    }
}

#[test]
fn network_policies_exist_before_the_pods_they_protect() {
    // Behind the schema gate no Deployment is applied, but the policies are.
    let shop = default_stack();
    let owner = Owner::of(&shop).unwrap();
    let gated = paymentstack::children::desired(&shop, &owner, &ps_inputs(&JobState::Running, None)).unwrap();
    let names: Vec<&str> = policies(&gated)
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    assert_eq!(
        names,
        ["shop-payment-resource", "shop-rail-proxy", "shop-rail-stub"]
    );
    assert!(
        gated
            .deployments()
            .all(|d| d.metadata.name.as_deref() == Some("shop-rail-stub"))
    );
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let locks = lockservice::children::desired(&ls, &ls_owner, &ls_inputs(&JobState::Running)).unwrap();
    assert_eq!(policies(&locks).len(), 1);
    assert_eq!(locks.deployments().count(), 0);
}

fn stack_named(name: &str, lock_service: &str) -> PaymentStack {
    let mut ps = stack(json!({
        "lockServiceRef": {"name": lock_service},
        "database": {"managed": {}},
        "railStub": {"enabled": true},
    }));
    ps.metadata = meta(name);
    ps
}

fn prometheus() -> crate::builders::network_policies::Scraper {
    crate::builders::network_policies::Scraper::new(
        Some("kubernetes.io/metadata.name=monitoring"),
        Some("app.kubernetes.io/name=prometheus"),
    )
    .unwrap()
    .unwrap()
}

/// Every NetworkPolicy the operator builds (both kinds, etcd members included), each with the port
/// its pods serve `/metrics` on.
fn every_policy(scraper: Option<&crate::builders::network_policies::Scraper>) -> Vec<(String, i32, Desired)> {
    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let locks = lockservice::children::desired(
        &ls,
        &ls_owner,
        &lockservice::children::Inputs {
            scraper,
            ..ls_inputs(&JobState::Succeeded)
        },
    )
    .unwrap();
    let etcd = etcd_ls(json!({"managed": {"replicas": 3}}));
    let etcd_owner = Owner::of(&etcd).unwrap();
    let etcd_d = lockservice::children::desired(
        &etcd,
        &etcd_owner,
        &lockservice::children::Inputs {
            scraper,
            ..etcd_inputs(true)
        },
    )
    .unwrap();
    let shop = default_stack();
    let shop_owner = Owner::of(&shop).unwrap();
    let view = ready_lock_service();
    let stack = paymentstack::children::desired(
        &shop,
        &shop_owner,
        &paymentstack::children::Inputs {
            scraper,
            ..ps_inputs(&JobState::Succeeded, Some(&view))
        },
    )
    .unwrap();
    let mut out = Vec::new();
    for d in [locks, etcd_d, stack] {
        for p in policies(&d) {
            let name = p.metadata.name.clone().unwrap();
            let port = if name.ends_with("-etcd") {
                crate::builders::etcd_members::METRICS_PORT
            } else {
                8080
            };
            out.push((name, port, d.clone()));
        }
    }
    out
}

#[test]
fn network_policies_admit_the_named_prometheus_to_the_metrics_port_only() {
    let scraper = prometheus();
    let with = every_policy(Some(&scraper));
    let names: Vec<&str> = with.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "locks-lock-server",
            "locks-etcd",
            "locks-lock-server",
            "shop-payment-resource",
            "shop-rail-proxy",
            "shop-rail-stub"
        ]
    );
    let prometheus: Pod = (
        "monitoring",
        [("app.kubernetes.io/name".to_owned(), "prometheus".to_owned())].into(),
    );
    let grafana_beside_it: Pod = (
        "monitoring",
        [("app.kubernetes.io/name".to_owned(), "grafana".to_owned())].into(),
    );
    let prometheus_elsewhere: Pod = ("pay", prometheus.1.clone());
    for (name, metrics_port, d) in &with {
        let policy = policies(d)
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap();
        assert!(admits_on(policy, &prometheus, *metrics_port), "{name}");
        assert!(
            !admits_on(policy, &grafana_beside_it, *metrics_port),
            "{name} admits grafana"
        );
        assert!(
            !admits_on(policy, &prometheus_elsewhere, *metrics_port),
            "{name} admits a prometheus-labelled pod of another namespace"
        );
        // Any other port of the pods stays closed to it (etcd's client and peer ports).
        for port in [2379, 2380, 5432, 8080, 2381] {
            if port != *metrics_port {
                assert!(
                    !admits_on(policy, &prometheus, port),
                    "{name} admits it on {port}"
                );
            }
        }
        // Exactly one rule for it, naming one port.
        let rules = policy.spec.as_ref().unwrap().ingress.clone().unwrap();
        let scrape_rules: Vec<_> = rules
            .iter()
            .filter(|r| {
                r.from.iter().flatten().any(|p| {
                    p.namespace_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.as_ref())
                        .is_some_and(|l| l.contains_key("kubernetes.io/metadata.name"))
                })
            })
            .collect();
        assert_eq!(scrape_rules.len(), 1, "{name}: {rules:?}");
        assert_eq!(scrape_rules[0].ports.as_ref().unwrap().len(), 1, "{name}");
    }
    // Negative control: without a scraper named, the same pod is refused everywhere.
    for (name, metrics_port, d) in every_policy(None) {
        let policy = policies(&d)
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap();
        assert!(
            !admits_on(policy, &prometheus, metrics_port),
            "{name} admits an unnamed scraper"
        );
    }
}

#[test]
fn prometheus_selectors_are_checked_like_kubernetes_labels() {
    use crate::builders::network_policies::{Scraper, ScraperError};
    assert_eq!(Scraper::new(None, None), Ok(None));
    assert_eq!(Scraper::new(Some(""), Some(" ")), Ok(None));
    assert!(
        Scraper::new(Some("team=obs, kubernetes.io/metadata.name=monitoring"), None)
            .unwrap()
            .is_some()
    );
    assert!(
        Scraper::new(None, Some("app.kubernetes.io/name=prometheus,empty="))
            .unwrap()
            .is_some()
    );
    for (ns, pods, want) in [
        (Some("monitoring"), None, "not key=value"),
        (Some("-bad=x"), None, "label key"),
        (Some("Bad.Prefix/name=x"), None, "label key"),
        (None, Some("app=-x"), "label value"),
        (None, Some(&*format!("app={}", "a".repeat(64))), "label value"),
        (None, Some("app=a,app=b"), "twice"),
    ] {
        let e: ScraperError = Scraper::new(ns, pods).unwrap_err();
        assert!(e.to_string().contains(want), "{ns:?} {pods:?}: {e}");
    }
    let e = Scraper::new(None, Some("app=a,app=b")).unwrap_err().to_string();
    assert!(e.starts_with("--prometheus-pod-selector"), "{e}");
}
