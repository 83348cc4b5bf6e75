use std::collections::BTreeMap;

use super::certs::{self, Pair};
use super::*;

const NOW: i64 = 1_800_000_000;
const NS: &str = "shop";

fn owner() -> Owner {
    Owner {
        name: "pay".into(),
        namespace: NS.into(),
        kind: "PaymentStack".into(),
        owner_ref: Default::default(),
        https: true,
    }
}

fn served() -> Vec<Served> {
    ["payment-resource", "rail-proxy"]
        .iter()
        .map(|c| Served::of(&owner(), c))
        .collect()
}

/// A namespace with a CA, its bundle, and each served component's certificate issued at `issued`.
fn settled(ca: &Pair, issued: i64) -> Observed {
    Observed {
        https: true,
        ca: Some(Ok(ca.clone())),
        bundle: Some(ca.cert_pem.clone()),
        leaves: served()
            .iter()
            .map(|s| {
                (
                    s.secret.clone(),
                    Some(certs::issue(ca, &s.dns_names, issued).unwrap()),
                )
            })
            .collect(),
        ..Observed::default()
    }
}

fn leaf_writes(p: &TlsPlan) -> Vec<(String, Option<String>)> {
    p.writes
        .iter()
        .filter_map(|w| match w {
            Write::Leaf { component, why, .. } => Some((component.clone(), why.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn plain_http_writes_nothing_but_still_mounts_an_existing_bundle_into_clients() {
    let p = plan(&Observed::default(), &served(), NS, NOW).unwrap();
    assert!(p.writes.is_empty());
    assert_eq!(p.wiring, TlsWiring::default());
    assert!(p.status.is_none());
    let with_bundle = Observed {
        bundle: Some("pem".into()),
        ..Observed::default()
    };
    let p = plan(&with_bundle, &served(), NS, NOW).unwrap();
    assert!(p.writes.is_empty());
    assert!(!p.wiring.https);
    assert_eq!(p.wiring.bundle, Some(short_hash(b"pem")));
}

#[test]
fn the_first_reconcile_makes_the_ca_publishes_it_and_issues_each_certificate() {
    let obs = Observed {
        https: true,
        ..Observed::default()
    };
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    let [Write::Ca(ca), Write::Bundle(bundle), ..] = p.writes.as_slice() else {
        panic!("CA and bundle first: {:?}", p.writes);
    };
    assert_eq!(bundle, &ca.cert_pem);
    let facts = certs::facts(&ca.cert_pem).unwrap();
    assert!(facts.is_ca);
    assert_eq!(facts.not_after, NOW + certs::CA_DAYS * 86_400);
    assert_eq!(
        leaf_writes(&p),
        vec![("payment-resource".into(), None), ("rail-proxy".into(), None)]
    );
    for w in &p.writes {
        if let Write::Leaf {
            component,
            secret,
            pair,
            ..
        } = w
        {
            assert_eq!(secret, &format!("pay-{component}-tls"));
            assert_eq!(p.ca_pem.as_ref(), Some(&ca.cert_pem));
            assert!(certs::signed_by(&pair.cert_pem, &ca.cert_pem));
            assert!(certs::key_matches(pair));
            let f = certs::facts(&pair.cert_pem).unwrap();
            assert!(!f.is_ca);
            assert_eq!(f.not_after, NOW + certs::LEAF_DAYS * 86_400);
            assert_eq!(
                f.dns_names,
                vec![
                    format!("pay-{component}"),
                    format!("pay-{component}.shop"),
                    format!("pay-{component}.shop.svc"),
                    format!("pay-{component}.shop.svc.cluster.local"),
                ]
            );
        }
    }
    assert!(p.wiring.https);
    assert_eq!(p.wiring.bundle, Some(short_hash(ca.cert_pem.as_bytes())));
    let status = p.status.unwrap();
    assert_eq!(status.certificates.len(), 2);
    assert_eq!(status.certificates[0].component, "payment-resource");
    // 2027-01-15T08:00:00Z + 90 days, renewed 30 days before.
    assert_eq!(status.certificates[0].not_after, "2027-04-15T08:00:00Z");
    assert_eq!(status.certificates[0].renew_after, "2027-03-16T08:00:00Z");
}

#[test]
fn a_settled_namespace_writes_nothing() {
    let ca = certs::make_ca(NS, NOW - 86_400).unwrap();
    let p = plan(&settled(&ca, NOW - 86_400), &served(), NS, NOW).unwrap();
    assert_eq!(p.writes, Vec::new());
    assert!(p.wiring.https);
}

/// Renewed from 30 days before the end, not a second earlier: issued 60 days ago (30 left) it is
/// replaced; issued a minute less than that ago it is kept.
#[test]
fn certificates_are_renewed_thirty_days_before_they_end() {
    let ca = certs::make_ca(NS, NOW - 100 * 86_400).unwrap();
    let due = plan(&settled(&ca, NOW - 60 * 86_400), &served(), NS, NOW).unwrap();
    let renewed = leaf_writes(&due);
    assert_eq!(renewed.len(), 2, "{renewed:?}");
    assert!(
        renewed[0].1.as_deref().unwrap().starts_with("expires "),
        "{renewed:?}"
    );
    // Nothing else is written: the CA and the bundle stay.
    assert_eq!(due.writes.len(), 2);
    let kept = plan(&settled(&ca, NOW - 60 * 86_400 + 60), &served(), NS, NOW).unwrap();
    assert_eq!(kept.writes, Vec::new());
}

/// A renew request replaces every certificate once, however fresh, and is echoed in status; the
/// same value again (handled) writes nothing, a new value renews again. The CA stays.
#[test]
fn a_renew_request_replaces_every_certificate_once() {
    let ca = certs::make_ca(NS, NOW).unwrap();
    let fresh = settled(&ca, NOW);
    assert_eq!(plan(&fresh, &served(), NS, NOW).unwrap().writes, Vec::new());
    let requested = Observed {
        renew_request: Some("2026-12-07T19:00:00Z".into()),
        ..fresh.clone()
    };
    let p = plan(&requested, &served(), NS, NOW).unwrap();
    let renewed = leaf_writes(&p);
    assert_eq!(renewed.len(), 2, "{renewed:?}");
    assert!(
        renewed
            .iter()
            .all(|(_, why)| why.as_deref() == Some("was replaced on request \"2026-12-07T19:00:00Z\"")),
        "{renewed:?}"
    );
    assert_eq!(
        p.writes.len(),
        2,
        "only the certificates: the CA and the bundle stay"
    );
    for w in &p.writes {
        let Write::Leaf { pair, .. } = w else {
            unreachable!()
        };
        assert!(certs::signed_by(&pair.cert_pem, &ca.cert_pem));
    }
    let status = p.status.unwrap();
    assert_eq!(
        status.last_handled_renew_request.as_deref(),
        Some("2026-12-07T19:00:00Z")
    );
    // Handled: the same value renews nothing more, and stays echoed.
    let handled = Observed {
        renew_handled: Some("2026-12-07T19:00:00Z".into()),
        ..requested.clone()
    };
    let p = plan(&handled, &served(), NS, NOW).unwrap();
    assert_eq!(p.writes, Vec::new());
    assert_eq!(
        p.status.unwrap().last_handled_renew_request.as_deref(),
        Some("2026-12-07T19:00:00Z")
    );
    // The annotation removed: the last handled value stays in status.
    let removed = Observed {
        renew_request: None,
        ..handled.clone()
    };
    let p = plan(&removed, &served(), NS, NOW).unwrap();
    assert_eq!(p.writes, Vec::new());
    assert_eq!(
        p.status.unwrap().last_handled_renew_request.as_deref(),
        Some("2026-12-07T19:00:00Z")
    );
    // A new value renews again.
    let again = Observed {
        renew_request: Some("2".into()),
        ..handled
    };
    assert_eq!(leaf_writes(&plan(&again, &served(), NS, NOW).unwrap()).len(), 2);
}

#[test]
fn renew_request_values_are_checked() {
    use crate::crd::tls::check_renew_request;
    for ok in ["1", "2026-12-07T19:00:00Z", "incident_42.b"] {
        assert_eq!(check_renew_request(ok), Ok(()), "{ok}");
    }
    for bad in ["", " 1", "a b", "now!", &"x".repeat(64)] {
        assert!(check_renew_request(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_certificate_of_another_ca_other_names_or_another_key_is_replaced() {
    let ca = certs::make_ca(NS, NOW).unwrap();
    let other_ca = certs::make_ca("elsewhere", NOW).unwrap();
    let s = served();
    let mut obs = settled(&ca, NOW);
    let other_key = certs::issue(&ca, &s[1].dns_names, NOW).unwrap().key_pem;
    obs.leaves.insert(
        s[0].secret.clone(),
        Some(certs::issue(&other_ca, &s[0].dns_names, NOW).unwrap()),
    );
    let mut mixed = obs.leaves[&s[1].secret].clone().unwrap();
    mixed.key_pem = other_key;
    obs.leaves.insert(s[1].secret.clone(), Some(mixed));
    let p = plan(&obs, &s, NS, NOW).unwrap();
    assert_eq!(
        leaf_writes(&p),
        vec![
            ("payment-resource".into(), Some("signed by another CA".into())),
            (
                "rail-proxy".into(),
                Some("its key does not match the certificate".into())
            ),
        ]
    );

    let mut renamed = settled(&ca, NOW);
    renamed.leaves.insert(
        s[0].secret.clone(),
        Some(certs::issue(&ca, &["old-name".to_owned()], NOW).unwrap()),
    );
    let p = plan(&renamed, &s, NS, NOW).unwrap();
    let why = leaf_writes(&p)[0].1.clone().unwrap();
    assert!(why.starts_with("names [\"old-name\"]"), "{why}");
}

#[test]
fn a_bundle_without_the_ca_is_republished() {
    let ca = certs::make_ca(NS, NOW).unwrap();
    let mut obs = settled(&ca, NOW);
    obs.bundle = Some("someone else's".into());
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    assert_eq!(p.writes, vec![Write::Bundle(ca.cert_pem.clone())]);
}

#[test]
fn an_unusable_ca_stops_the_step_with_what_is_wrong_and_writes_nothing() {
    let ca = certs::make_ca(NS, NOW).unwrap();
    let leaf = certs::issue(&ca, &["x".to_owned()], NOW).unwrap();
    let expired = certs::make_ca(NS, NOW - (certs::CA_DAYS + 1) * 86_400).unwrap();
    let mismatched = Pair {
        cert_pem: ca.cert_pem.clone(),
        key_pem: leaf.key_pem.clone(),
    };
    for (ca, want) in [
        (Err("it lacks tls.crt or tls.key".to_owned()), "it lacks tls.crt"),
        (Ok(leaf.clone()), "not a CA"),
        (Ok(expired), "it expired"),
        (Ok(mismatched), "its key does not match"),
        (
            Ok(Pair {
                cert_pem: "garbage".into(),
                key_pem: "garbage".into(),
            }),
            "not a PEM certificate",
        ),
    ] {
        let obs = Observed {
            https: true,
            ca: Some(ca),
            leaves: BTreeMap::new(),
            bundle: None,
            ..Observed::default()
        };
        let p = plan(&obs, &served(), NS, NOW).unwrap();
        let broken = p.broken.unwrap_or_default();
        assert!(
            broken.contains("Secret dlock-ca") && broken.contains(want),
            "{broken}"
        );
        assert!(p.writes.is_empty());
    }
}

#[test]
fn pair_debug_never_shows_the_key() {
    let ca = certs::make_ca(NS, NOW).unwrap();
    let shown = format!("{ca:?}");
    assert!(shown.contains("<redacted>"));
    assert!(!shown.contains("PRIVATE KEY"));
}

/// What the plan issues works end to end: the services' own HTTPS serves it, and a client that
/// trusts only the bundle accepts it for the Service's name — not for another name, and not without
/// the bundle.
#[tokio::test]
async fn an_issued_certificate_is_served_and_verified_for_the_service_name_only() {
    let now = chrono::Utc::now().timestamp();
    let obs = Observed {
        https: true,
        ..Observed::default()
    };
    let p = plan(&obs, &served(), NS, now).unwrap();
    let (Some(Write::Leaf { pair, .. }), Some(ca_pem)) = (p.writes.get(2), &p.ca_pem) else {
        panic!("{:?}", p.writes);
    };
    let dir = std::env::temp_dir().join(format!("dlock-operator-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = dlock_common::tls::TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, &pair.cert_pem).unwrap();
    std::fs::write(&files.key, &pair.key_pem).unwrap();
    let tls = dlock_common::tls::ServerTls::load(files).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/readyz", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move {
        dlock_common::serve::run_tls_until(listener, app, &tls, std::future::pending()).await
    });
    let client = |name: &str, ca: Option<&str>| {
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .tls_built_in_root_certs(false)
            .resolve(name, addr);
        if let Some(ca) = ca {
            b = b.add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap());
        }
        b.build().unwrap()
    };
    let get = |name: &'static str, ca: Option<&str>| {
        let c = client(name, ca);
        async move {
            c.get(format!("https://{name}:{}/readyz", addr.port()))
                .send()
                .await
        }
    };
    let ok = get("pay-payment-resource.shop.svc", Some(ca_pem)).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert!(
        get("pay-rail-proxy.shop.svc", Some(ca_pem)).await.is_err(),
        "another Service's name"
    );
    assert!(
        get("pay-payment-resource.shop.svc", None).await.is_err(),
        "without the bundle"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
