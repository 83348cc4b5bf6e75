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
    assert_eq!(p.wiring.bundle.as_deref(), Some("pem"));
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
    assert_eq!(p.wiring.bundle.as_ref(), Some(&ca.cert_pem));
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

/// Serves `/readyz` over HTTPS with `pair` (the services' own server TLS) on a loopback port; the
/// files go to a folder of the test's own (`tag`; kept: the server re-reads them on a handshake).
async fn serve_https(pair: &Pair, tag: &str) -> std::net::SocketAddr {
    let dir = std::env::temp_dir().join(format!("dlock-operator-tls-{tag}-{}", std::process::id()));
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
    addr
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
    let addr = serve_https(pair, "issued").await;
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
}

// The CA's rotation: clients first, servers after.

const DAY: i64 = 86_400;

/// A CA that ends `left` days after NOW.
fn ca_ending_in(left: i64) -> Pair {
    certs::make_ca(NS, NOW - (certs::CA_DAYS - left) * DAY).unwrap()
}

fn client(name: &str, bundle: &str, rolled_out: bool) -> Client {
    Client {
        name: name.into(),
        bundle: short_hash(bundle.as_bytes()),
        rolled_out,
    }
}

/// A namespace mid-rotation: the old CA (ending in 200 days), its successor made 40 days ago, the
/// bundle with both, the certificates still the old CA's, every client rolled out with the bundle,
/// no overlap.
fn rotating(old: &Pair, next: &Pair) -> Observed {
    let bundle = bundle_text(old, Some(next));
    Observed {
        next: Some(Ok(next.clone())),
        ca_version: Some("41".into()),
        bundle: Some(bundle.clone()),
        clients: vec![client("pay-payout-executor", &bundle, true)],
        ..settled(old, NOW - DAY)
    }
}

fn successor() -> Pair {
    certs::make_ca(NS, NOW - 40 * DAY).unwrap()
}

#[test]
fn a_ca_within_a_year_of_its_end_gets_a_successor_published_beside_it_and_nothing_moves_yet() {
    let old = ca_ending_in(364);
    let obs = Observed {
        ca_version: Some("7".into()),
        ..settled(&old, NOW - DAY)
    };
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    let [Write::NextCa { pair, version }, Write::Bundle(bundle)] = p.writes.as_slice() else {
        panic!("the successor, then the bundle with both: {:?}", p.writes);
    };
    assert_eq!(version, "7", "made against the CA Secret as read");
    let facts = certs::facts(&pair.cert_pem).unwrap();
    assert!(facts.is_ca && certs::key_matches(pair));
    assert_eq!(facts.not_after, NOW + certs::CA_DAYS * DAY);
    assert_eq!(bundle, &bundle_text(&old, Some(pair)));
    assert_eq!(
        reqwest::Certificate::from_pem_bundle(bundle.as_bytes())
            .unwrap()
            .len(),
        2
    );
    // The clients roll to the bundle with both; the servers keep the old CA's certificates.
    assert_eq!(p.wiring.bundle.as_ref(), Some(bundle));
    assert_eq!(p.ca_pem.as_ref(), Some(&old.cert_pem));
    let rotation = p.status.unwrap().ca_rotation.unwrap();
    assert_eq!(rotation.phase, "Trusting");

    // A day more than a year before the end: nothing.
    let early = Observed {
        ca_version: Some("7".into()),
        ..settled(&ca_ending_in(366), NOW - DAY)
    };
    assert_eq!(plan(&early, &served(), NS, NOW).unwrap().writes, Vec::new());
}

/// The safety of the rotation: no certificate is signed by the successor while a client of the
/// namespace may not trust it — a Deployment still on the old bundle, or not rolled out, or the
/// bundle not yet published — nor before the overlap has passed. Each case is the broken variant of
/// the last one, which moves.
#[test]
fn certificates_move_to_the_successor_only_once_every_client_trusts_both_and_the_overlap_passed() {
    let (old, next) = (ca_ending_in(200), successor());
    let both = bundle_text(&old, Some(&next));
    type Change<'a> = Box<dyn Fn(&mut Observed) + 'a>;
    let cases: [(&str, Change, &str); 4] = [
        (
            "a Deployment on the old bundle",
            Box::new(|o| o.clients.push(client("pay-rail-proxy", &old.cert_pem, true))),
            "pay-rail-proxy",
        ),
        (
            "a Deployment rolling out",
            Box::new(|o| o.clients.push(client("pay-rail-proxy", &both, false))),
            "pay-rail-proxy",
        ),
        (
            "the bundle not published",
            Box::new(|o| o.bundle = Some(old.cert_pem.clone())),
            "published",
        ),
        (
            "the overlap not passed",
            Box::new(|o| o.ca_overlap = 41 * DAY),
            "overlap",
        ),
    ];
    for (case, change, named) in cases {
        let mut obs = rotating(&old, &next);
        change(&mut obs);
        let p = plan(&obs, &served(), NS, NOW).unwrap();
        assert_eq!(leaf_writes(&p), Vec::new(), "{case}: a certificate moved");
        assert_eq!(p.ca_pem.as_ref(), Some(&old.cert_pem), "{case}");
        let rotation = p.status.unwrap().ca_rotation.unwrap();
        assert_eq!(rotation.phase, "Trusting", "{case}");
        let waiting = rotation.waiting_for.unwrap_or_default();
        assert!(waiting.contains(named), "{case}: {waiting}");
    }

    let mut obs = rotating(&old, &next);
    obs.ca_overlap = 39 * DAY;
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    assert_eq!(
        leaf_writes(&p),
        vec![
            (
                "payment-resource".into(),
                Some("was signed by the CA being replaced".into())
            ),
            (
                "rail-proxy".into(),
                Some("was signed by the CA being replaced".into())
            ),
        ]
    );
    assert_eq!(p.ca_pem.as_ref(), Some(&next.cert_pem));
    for w in &p.writes {
        if let Write::Leaf { pair, .. } = w {
            assert!(certs::signed_by(&pair.cert_pem, &next.cert_pem));
        }
    }
    // No other object in the namespace: the promotion follows in the same plan, after every
    // certificate is written (a failed write stops the plan before it).
    let kinds: Vec<&str> = p
        .writes
        .iter()
        .map(|w| match w {
            Write::Leaf { .. } => "leaf",
            Write::PromoteNext { .. } => "promote",
            Write::Bundle(_) => "bundle",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["leaf", "leaf", "promote", "bundle"]);
    // With another object still on the old CA, this one says it is on the successor and waits.
    obs.peers = vec![Peer {
        name: "LockService/locks".into(),
        signed_by: None,
    }];
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    assert!(!p.writes.iter().any(|w| matches!(w, Write::PromoteNext { .. })));
    let status = p.status.unwrap();
    assert_eq!(status.signed_by, Some(short_hash(next.cert_pem.as_bytes())));
    assert_eq!(status.ca_rotation.unwrap().phase, "Moving");
}

/// The successor replaces the CA only when every object of the namespace reports its certificates
/// signed by it; then the bundle holds it alone (the clients roll once more).
#[test]
fn the_successor_replaces_the_ca_once_every_object_of_the_namespace_is_signed_by_it() {
    let (old, next) = (ca_ending_in(200), successor());
    let mut obs = rotating(&old, &next);
    obs.leaves = served()
        .iter()
        .map(|s| {
            (
                s.secret.clone(),
                Some(certs::issue(&next, &s.dns_names, NOW).unwrap()),
            )
        })
        .collect();
    obs.peers = vec![Peer {
        name: "LockService/locks".into(),
        signed_by: Some(short_hash(old.cert_pem.as_bytes())),
    }];
    let waiting = plan(&obs, &served(), NS, NOW).unwrap();
    assert_eq!(waiting.writes, Vec::new(), "a peer is still on the old CA");
    let rotation = waiting.status.unwrap().ca_rotation.unwrap();
    assert_eq!(rotation.phase, "Moving");
    assert!(
        rotation
            .waiting_for
            .unwrap_or_default()
            .contains("LockService/locks")
    );

    obs.peers[0].signed_by = Some(short_hash(next.cert_pem.as_bytes()));
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    let [Write::PromoteNext { pair, version }, Write::Bundle(bundle)] = p.writes.as_slice() else {
        panic!("the promotion, then the bundle: {:?}", p.writes);
    };
    assert_eq!((pair, version.as_str()), (&next, "41"));
    assert_eq!(bundle, &next.cert_pem);
    assert_eq!(p.wiring.bundle.as_ref(), Some(&next.cert_pem));
    let status = p.status.unwrap();
    assert_eq!(status.ca_rotation, None);
    assert_eq!(
        status.ca_not_after,
        Some(rfc3339(certs::facts(&next.cert_pem).unwrap().not_after))
    );

    // The next reconcile, with the successor as the CA: settled.
    let after = Observed {
        ca_version: Some("42".into()),
        ..settled(&next, NOW)
    };
    assert_eq!(plan(&after, &served(), NS, NOW).unwrap().writes, Vec::new());
}

/// A certificate the successor signed is kept when a client starts rolling again (a user's edit):
/// both CAs are trusted by every client that ran when it was signed, so nothing flips back.
#[test]
fn a_certificate_of_the_successor_is_kept_while_a_client_rolls_again() {
    let (old, next) = (ca_ending_in(200), successor());
    let mut obs = rotating(&old, &next);
    obs.clients[0].rolled_out = false;
    let first = &served()[0];
    obs.leaves.insert(
        first.secret.clone(),
        Some(certs::issue(&next, &first.dns_names, NOW).unwrap()),
    );
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    assert_eq!(p.writes, Vec::new());
    // Mixed signers: this object reports none, so the promotion waits for it.
    assert_eq!(p.status.unwrap().signed_by, None);
}

/// A certificate cut short by its CA's end is not re-issued on every reconcile of the CA's last
/// month (a new one could end no later) — a rotation that waits on a client does not churn.
#[test]
fn a_certificate_cut_short_by_its_ca_is_not_renewed_again_and_again() {
    let (old, next) = (ca_ending_in(20), successor());
    let mut obs = rotating(&old, &next);
    obs.clients[0].rolled_out = false;
    obs.leaves = served()
        .iter()
        .map(|s| {
            (
                s.secret.clone(),
                Some(certs::issue(&old, &s.dns_names, NOW - DAY).unwrap()),
            )
        })
        .collect();
    let p = plan(&obs, &served(), NS, NOW).unwrap();
    assert_eq!(p.writes, Vec::new());
}

#[test]
fn an_unusable_successor_stops_the_step_with_what_is_wrong() {
    let old = ca_ending_in(200);
    let leaf = certs::issue(&old, &["x".to_owned()], NOW).unwrap();
    for (next, want) in [
        (Err("it lacks next.crt or next.key".to_owned()), "lacks next.crt"),
        (Ok(leaf), "not a CA"),
    ] {
        let obs = Observed {
            next: Some(next),
            ca_version: Some("3".into()),
            ..settled(&old, NOW)
        };
        let p = plan(&obs, &served(), NS, NOW).unwrap();
        let broken = p.broken.unwrap_or_default();
        assert!(broken.contains("next.crt") && broken.contains(want), "{broken}");
        assert!(p.writes.is_empty());
    }
}

/// The bundle with both CAs, as the services' clients load it (reqwest's PEM bundle): a server whose
/// certificate either CA signed is accepted; with the old CA alone, the successor's is refused.
#[tokio::test]
async fn a_bundle_with_both_cas_verifies_certificates_of_either() {
    let now = chrono::Utc::now().timestamp();
    let old = certs::make_ca(NS, now - (certs::CA_DAYS - 200) * DAY).unwrap();
    let next = certs::make_ca(NS, now).unwrap();
    let name = "pay-payment-resource.shop.svc";
    let mut addrs = Vec::new();
    for (ca, tag) in [(&old, "old"), (&next, "next")] {
        let pair = certs::issue(ca, &[name.to_owned()], now).unwrap();
        addrs.push(serve_https(&pair, tag).await);
    }
    let get = |bundle: String, addr: std::net::SocketAddr| async move {
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .tls_built_in_root_certs(false)
            .resolve(name, addr);
        for c in reqwest::Certificate::from_pem_bundle(bundle.as_bytes()).unwrap() {
            b = b.add_root_certificate(c);
        }
        b.build()
            .unwrap()
            .get(format!("https://{name}:{}/readyz", addr.port()))
            .send()
            .await
    };
    let both = bundle_text(&old, Some(&next));
    for addr in &addrs {
        assert_eq!(get(both.clone(), *addr).await.unwrap().status(), 200);
    }
    assert!(
        get(old.cert_pem.clone(), addrs[1]).await.is_err(),
        "the old CA alone trusted the successor's"
    );
    assert_eq!(get(old.cert_pem.clone(), addrs[0]).await.unwrap().status(), 200);
}
