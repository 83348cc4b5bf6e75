//! Signed grants (builders/grant_keys.rs): the signing key, the public key set, and who rolls when
//! either changes.

use super::*;

fn configmap_ref(e: &EnvVar) -> (String, String) {
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{} is not read from a ConfigMap", e.name));
    (r.name.clone(), r.key.clone())
}

fn template_annotation(d: &Deployment, key: &str) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .cloned()
}

/// lock-server alone gets the private key (one, by id, from the Secret); payment-resource and
/// rail-proxy get the public key set from the ConfigMap, with verification on; nothing else
/// references either.
#[test]
fn the_signing_key_goes_to_lock_server_only_and_the_public_keys_to_the_resources() {
    use crate::builders::deployments::{GRANT_PUBLIC_KEYS_ENV, GRANT_SIGNING_KEY_ENV, LOCK_SERVICE_ID_ENV};
    use crate::builders::grant_keys::{PUBLIC_KEYS_ANNOTATION, SIGNING_KEY_ANNOTATION};
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    let lock_server = deployment(&d, "locks-lock-server");
    let c = &containers(&Child::Deployment(lock_server.clone()))[0];
    assert_eq!(
        secret_ref(env_of(c, GRANT_SIGNING_KEY_ENV).expect("signing key env")),
        ("locks-grant-signing-keys".to_owned(), "k1".to_owned())
    );
    assert_eq!(
        env_of(c, LOCK_SERVICE_ID_ENV).and_then(|e| e.value.as_deref()),
        Some("pay/locks")
    );
    assert_eq!(
        template_annotation(lock_server, SIGNING_KEY_ANNOTATION).as_deref(),
        Some("k1")
    );
    assert!(env_of(c, GRANT_PUBLIC_KEYS_ENV).is_none());

    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p = paymentstack::children::desired(&ps, &ps_owner, &ps_inputs(&JobState::Succeeded, Some(&view)))
        .unwrap();
    for (name, switch) in [
        ("shop-payment-resource", "PAYMENT_GRANT_VERIFICATION_ENABLED"),
        ("shop-rail-proxy", "RAIL_PROXY_GRANT_VERIFICATION_ENABLED"),
    ] {
        let dep = deployment(&p, name);
        let c = &containers(&Child::Deployment(dep.clone()))[0];
        assert_eq!(
            configmap_ref(env_of(c, GRANT_PUBLIC_KEYS_ENV).expect("public keys env")),
            ("locks-grant-public-keys".to_owned(), "keys".to_owned()),
            "{name}"
        );
        assert_eq!(
            env_of(c, switch).and_then(|e| e.value.as_deref()),
            Some("true"),
            "{name}"
        );
        assert_eq!(
            template_annotation(dep, PUBLIC_KEYS_ANNOTATION),
            Some(crate::builders::grant_keys::checksum(&PUBLISHED_KEYS.to_text())),
            "{name}"
        );
        assert!(env_of(c, GRANT_SIGNING_KEY_ENV).is_none(), "{name}");
    }
    // Nothing but lock-server references the signing-key Secret; the executor gets no key at all.
    for child in p.apply.iter().chain(d.apply.iter()) {
        for c in containers(child) {
            for e in c.env.iter().flatten() {
                let secret = e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref());
                if secret.is_some_and(|s| s.name == "locks-grant-signing-keys") {
                    assert_eq!(
                        child.name(),
                        "locks-lock-server",
                        "{} reads the signing key",
                        child.name()
                    );
                }
            }
        }
    }
    let executor = deployment(&p, "shop-payout-executor");
    let c = &containers(&Child::Deployment(executor.clone()))[0];
    assert!(env_of(c, GRANT_PUBLIC_KEYS_ENV).is_none() && env_of(c, GRANT_SIGNING_KEY_ENV).is_none());
}

/// A new key set rolls the resources (their template changes), not lock-server; a new signer rolls
/// lock-server, not the resources: resources first, signer after, each by its own annotation.
#[test]
fn a_changed_key_set_rolls_the_resources_and_a_new_signer_rolls_lock_server() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let before = ready_lock_service();
    let k2 = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k2").unwrap());
    let after = LockServiceView {
        grant_keys: Some(PUBLISHED_KEYS.clone().with(k2.public_key()).unwrap().to_text()),
        ..ready_lock_service()
    };
    let template = |view: &LockServiceView, name: &str| {
        let p = paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(view)))
            .unwrap();
        serde_json::to_value(&deployment(&p, name).spec.as_ref().unwrap().template).unwrap()
    };
    for name in ["shop-payment-resource", "shop-rail-proxy"] {
        assert_ne!(
            template(&before, name),
            template(&after, name),
            "{name} does not roll"
        );
    }
    assert_eq!(
        template(&before, "shop-payout-executor"),
        template(&after, "shop-payout-executor")
    );

    let ls = managed_ls();
    let ls_owner = Owner::of(&ls).unwrap();
    let lock_template = |key: &str| {
        let mut inputs = ls_inputs(&JobState::Succeeded);
        inputs.signing_key = Some(key);
        let d = lockservice::children::desired(&ls, &ls_owner, &inputs).unwrap();
        serde_json::to_value(
            &deployment(&d, "locks-lock-server")
                .spec
                .as_ref()
                .unwrap()
                .template,
        )
        .unwrap()
    };
    assert_eq!(lock_template("k1"), lock_template("k1"));
    assert_ne!(lock_template("k1"), lock_template("k2"));
}

/// Before its first key exists lock-server is held (an existing one left as it is); before the
/// LockService publishes its keys the resources are held.
#[test]
fn lock_server_waits_for_its_key_and_the_resources_for_the_public_keys() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let mut inputs = ls_inputs(&JobState::Succeeded);
    inputs.signing_key = None;
    let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
    assert!(d.find(ChildKind::Deployment, "locks-lock-server").is_none());
    assert!(
        d.wants(ChildKind::Deployment, "locks-lock-server"),
        "held, not deleted"
    );

    let ps = default_stack();
    let ps_owner = Owner::of(&ps).unwrap();
    let unpublished = LockServiceView {
        grant_keys: None,
        ..ready_lock_service()
    };
    let p = paymentstack::children::desired(
        &ps,
        &ps_owner,
        &ps_inputs(&JobState::Succeeded, Some(&unpublished)),
    )
    .unwrap();
    for name in ["shop-payment-resource", "shop-rail-proxy", "shop-payout-executor"] {
        assert!(p.find(ChildKind::Deployment, name).is_none(), "{name}");
        assert!(p.wants(ChildKind::Deployment, name), "{name} held, not deleted");
    }
}

/// `killSwitches.grantVerificationEnabled: false` (a rolling migration): the resources are told so
/// and get no keys.
#[test]
fn grant_verification_can_be_switched_off_per_stack() {
    let ps = stack(json!({
        "lockServiceRef": {"name": "locks"},
        "database": {"managed": {}},
        "railStub": {"enabled": true},
        "killSwitches": {"grantVerificationEnabled": false},
    }));
    let owner = Owner::of(&ps).unwrap();
    let view = ready_lock_service();
    let p =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&view))).unwrap();
    for (name, switch) in [
        ("shop-payment-resource", "PAYMENT_GRANT_VERIFICATION_ENABLED"),
        ("shop-rail-proxy", "RAIL_PROXY_GRANT_VERIFICATION_ENABLED"),
    ] {
        let c = &containers(&Child::Deployment(deployment(&p, name).clone()))[0];
        assert_eq!(
            env_of(c, switch).and_then(|e| e.value.as_deref()),
            Some("false"),
            "{name}"
        );
        assert!(
            env_of(c, crate::builders::deployments::GRANT_PUBLIC_KEYS_ENV).is_none(),
            "{name}"
        );
    }
}
