//! What every plan shares (builders/mod.rs): owner references and labels, orphans and held
//! children, specs refused rather than guessed, the stable hash in child names.

use super::*;
use crate::builders::postgres;
use crate::crd::DatabaseEngine;

#[test]
fn every_child_has_a_controller_owner_reference_and_the_standard_labels() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p = paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();
    let creds = Credentials::generate(true);
    let secrets: Vec<(String, ObjectMeta)> = [
        postgres::credentials_secret(&owner, History::Lockdb, &creds),
        postgres::connection_secret(
            &owner,
            History::Lockdb,
            &postgres::managed_urls(&owner, History::Lockdb, DatabaseEngine::StatefulSet, &creds),
        ),
    ]
    .into_iter()
    .map(|s: Secret| (s.metadata.name.clone().unwrap(), s.metadata))
    .collect();

    let mut checked = 0;
    for (owner, (name, m)) in all_children(&d)
        .map(|(n, m)| (("LockService", "locks"), (n.to_owned(), m)))
        .chain(all_children(&p).map(|(n, m)| (("PaymentStack", "shop"), (n.to_owned(), m))))
        .chain(secrets.into_iter().map(|s| (("LockService", "locks"), s)))
    {
        let refs = m.owner_references.unwrap_or_default();
        assert_eq!(refs.len(), 1, "{name}");
        let r = &refs[0];
        assert_eq!((r.kind.as_str(), r.name.as_str()), owner, "{name}");
        assert_eq!(r.api_version, "dlock.dev/v1alpha1");
        assert_eq!(r.uid, format!("uid-{}", owner.1));
        assert_eq!(r.controller, Some(true), "{name}");
        assert_eq!(m.namespace.as_deref(), Some("pay"));
        let labels = m.labels.unwrap_or_default();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "dlock-operator", "{name}");
        assert_eq!(labels["app.kubernetes.io/instance"], owner.1, "{name}");
        assert_eq!(labels["dlock.dev/owner-kind"], owner.0, "{name}");
        assert!(labels.contains_key("app.kubernetes.io/name"), "{name}");
        assert!(labels.contains_key("app.kubernetes.io/component"), "{name}");
        assert!(
            name.starts_with(&format!("{}-", owner.1)) && name.len() <= 63,
            "{name}"
        );
        checked += 1;
    }
    // lockdb svc+sts, Job, lock-server dep+svc+policy, 2 Secrets and lock-server's clients Secret;
    // paydb svc+sts, Job, rail-stub dep+svc+policy, payment-resource dep+svc+policy, rail-proxy
    // dep+svc+policy, payout-executor dep.
    assert_eq!(checked, 6 + 3 + 13);
}

#[test]
fn children_the_spec_drops_are_orphans_and_gated_ones_are_held() {
    let mut ps = default_stack();
    ps.spec.rail_proxy.rail_url = Some("https://rail.example".into());
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let with_stub =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    assert!(with_stub.find(ChildKind::Deployment, "shop-rail-stub").is_some());
    assert!(with_stub.find(ChildKind::Service, "shop-rail-stub").is_some());
    assert!(
        with_stub
            .find(ChildKind::NetworkPolicy, "shop-rail-stub")
            .is_some()
    );
    assert!(with_stub.endpoints.contains_key("railStub"));

    ps.spec.rail_stub.enabled = false;
    let without =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    for kind in [
        ChildKind::Deployment,
        ChildKind::Service,
        ChildKind::NetworkPolicy,
    ] {
        assert!(
            !without.wants(kind, "shop-rail-stub"),
            "{kind:?} of the stub is still wanted"
        );
    }
    assert!(!without.endpoints.contains_key("railStub"));
    // The dropped stub is an orphan even while the schema gate holds everything else back ...
    let gated =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Running, Some(&view))).unwrap();
    assert!(!gated.wants(ChildKind::Deployment, "shop-rail-stub"));
    // ... and what the gate holds back is kept as it is: held, not applied, not an orphan.
    for component in ["payment-resource", "rail-proxy", "payout-executor"] {
        let name = format!("shop-{component}");
        assert!(
            gated.find(ChildKind::Deployment, &name).is_none(),
            "{name} applied behind the gate"
        );
        assert!(
            gated.wants(ChildKind::Deployment, &name),
            "{name} would be swept behind the gate"
        );
    }
    // Nothing is both applied and held.
    for r in &gated.hold {
        assert!(gated.find(r.kind, &r.name).is_none(), "{r:?}");
    }
}

#[test]
fn specs_that_bypassed_cel_are_refused_not_guessed() {
    let mut ls = managed_ls();
    ls.spec.database.as_mut().unwrap().external = Some(crate::crd::ExternalDatabase {
        secret_ref: crate::crd::SecretKeyRef {
            name: "x".into(),
            key: "url".into(),
        },
        ca_secret_ref: None,
    });
    let owner = Owner::of(&ls).unwrap();
    assert_eq!(
        lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Absent)),
        Err(crate::builders::SpecError::DatabaseMode)
    );
    let mut ps = default_stack();
    ps.spec.rail_stub.enabled = false;
    let owner = Owner::of(&ps).unwrap();
    assert_eq!(
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Absent, None)),
        Err(crate::builders::SpecError::RailUrl)
    );
}

#[test]
fn short_hash_is_stable() {
    // Pinned: a change here renames every migration Job and re-runs the migrations.
    assert_eq!(short_hash(b""), "4fd0bfc1"); // FNV-1a offset basis, folded
    assert_eq!(short_hash(b"dlock"), short_hash(b"dlock"));
    assert_ne!(short_hash(b"dlock:1"), short_hash(b"dlock:2"));
    assert_eq!(short_hash(b"anything").len(), 8);
}
