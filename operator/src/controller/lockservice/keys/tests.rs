use super::*;
use crate::actions::Request as Req;
use crate::crd::actions::parse_grant_keys;

fn key(id: &str) -> SigningKey {
    SigningKey::generate(KeyId::new(id).unwrap())
}

fn set(keys: &[&SigningKey]) -> PublicKeys {
    PublicKeys::new(keys.iter().map(|k| k.public_key()).collect()).unwrap()
}

fn ids(of: &[&str]) -> Option<Vec<String>> {
    Some(of.iter().map(|s| (*s).to_owned()).collect())
}

fn published(keys: PublicKeys, last: Option<&str>) -> Option<Result<Published, String>> {
    Some(Ok(Published {
        keys,
        last_request: last.map(str::to_owned),
        last_outcome: last.map(|_| "added k2".to_owned()),
    }))
}

fn request(raw: &str) -> Option<Req<GrantKeysRequest>> {
    super::request(Some(raw))
}

#[test]
fn the_signer_is_the_newest_key_every_reporting_stack_verifies() {
    let (k1, k2) = (key("k1"), key("k2"));
    let one = set(&[&k1]);
    let both = set(&[&k1, &k2]);
    let s = |keys: &PublicKeys, stacks: &[Option<Vec<String>>], current: Option<&str>| {
        signer(keys, stacks, current).map(|k| k.to_string())
    };
    assert_eq!(s(&one, &[], None).as_deref(), Some("k1"));
    // No stack: nothing to wait for.
    assert_eq!(s(&both, &[], Some("k1")).as_deref(), Some("k2"));
    // A stack still rolled out with k1 only holds the switch back; one that has not reported does not.
    assert_eq!(s(&both, &[ids(&["k1"]), None], Some("k1")).as_deref(), Some("k1"));
    assert_eq!(
        s(&both, &[ids(&["k1", "k2"]), None], Some("k1")).as_deref(),
        Some("k2")
    );
    assert_eq!(
        s(&both, &[ids(&["k1", "k2"]), ids(&["k1"])], Some("k1")).as_deref(),
        Some("k1"),
        "every stack must verify the new key"
    );
    // After k1 is retired: the stacks report k2 only.
    assert_eq!(
        s(&set(&[&k2]), &[ids(&["k2"])], Some("k2")).as_deref(),
        Some("k2")
    );
    // A report older than the set (nothing qualifies): the current signer stays.
    assert_eq!(s(&both, &[ids(&["k9"])], Some("k2")).as_deref(), Some("k2"));
    assert_eq!(s(&both, &[ids(&["k9"])], None).as_deref(), Some("k1"));
    assert_eq!(s(&PublicKeys::default(), &[], None), None);
}

#[test]
fn the_first_key_is_generated_before_lock_server_starts() {
    let p = plan(&GrantInputs::default());
    assert!(p.signer.is_none(), "lock-server waits for its key");
    match &p.write {
        Some(GrantWrite::Publish(k)) => {
            assert_eq!(k.id().as_str(), "k1");
            assert_eq!(p.keys_after, set(&[k]));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.status.key_ids, ["k1"]);
}

#[test]
fn an_added_key_is_published_and_signed_with_only_once_every_stack_verifies_it() {
    let k1 = key("k1");
    let mut inputs = GrantInputs {
        published: published(set(&[&k1]), None),
        request: request(r#"{"id":"rot-1","action":"add"}"#),
        stacks: vec![ids(&["k1"])],
        current_signer: Some("k1".into()),
        lock_server_signs_with: Some("k1".into()),
    };
    let p = plan(&inputs);
    let Some(GrantWrite::Add { request, key: k2 }) = &p.write else {
        panic!("{:?}", p.write)
    };
    assert_eq!((request.as_str(), k2.id().as_str()), ("rot-1", "k2"));
    assert_eq!(
        p.keys_after.ids().map(KeyId::as_str).collect::<Vec<_>>(),
        ["k1", "k2"]
    );
    assert_eq!(
        p.signer.as_ref().map(KeyId::as_str),
        Some("k1"),
        "still the old key"
    );
    assert_eq!(p.status.key_ids, ["k1", "k2"]);
    assert_eq!(p.status.last_request.as_deref(), Some("rot-1"));
    assert_eq!(p.status.last_outcome.as_deref(), Some("added k2"));
    assert!(p.rotating);

    // The next reconcile: handled already (the ConfigMap says so); the stack has not rolled yet.
    inputs.published = published(p.keys_after.clone(), Some("rot-1"));
    let waiting = plan(&inputs);
    assert!(waiting.write.is_none());
    assert_eq!(waiting.signer.as_ref().map(KeyId::as_str), Some("k1"));
    assert!(waiting.rotating);
    // Once the stack's resources run with both keys, lock-server switches to k2.
    inputs.stacks = vec![ids(&["k1", "k2"])];
    let switched = plan(&inputs);
    assert_eq!(switched.signer.as_ref().map(KeyId::as_str), Some("k2"));
    assert!(!switched.rotating);
    assert_eq!(switched.status.signing_key_id.as_deref(), Some("k2"));
}

#[test]
fn a_key_is_retired_only_when_nothing_signs_with_it() {
    let (k1, k2) = (key("k1"), key("k2"));
    let retire = request(r#"{"id":"ret-1","action":"retire","keyId":"k1"}"#);
    let base = GrantInputs {
        published: published(set(&[&k1, &k2]), Some("rot-1")),
        request: retire.clone(),
        stacks: vec![ids(&["k1", "k2"])],
        current_signer: Some("k1".into()),
        lock_server_signs_with: Some("k1".into()),
    };
    // The signer has switched to k2 in this plan, but lock-server still runs with k1: wait.
    let p = plan(&base);
    assert_eq!(p.signer.as_ref().map(KeyId::as_str), Some("k2"));
    assert!(p.write.is_none(), "{:?}", p.write);
    assert!(
        p.status.message.as_deref().is_some_and(|m| m.contains("waiting")),
        "{:?}",
        p.status
    );
    // lock-server rolled out with k2: k1 goes.
    let p = plan(&GrantInputs {
        lock_server_signs_with: Some("k2".into()),
        ..base.clone()
    });
    match &p.write {
        Some(GrantWrite::Retire { request, key_id }) => {
            assert_eq!((request.as_str(), key_id.as_str()), ("ret-1", "k1"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.keys_after, set(&[&k2]));
    assert_eq!(p.status.last_outcome.as_deref(), Some("retired k1"));

    // Refused, and recorded as handled: the signer, the only key, an unknown key.
    for (published_keys, stacks, raw, why) in [
        (
            set(&[&k1, &k2]),
            vec![ids(&["k1"])],
            r#"{"id":"r","action":"retire","keyId":"k1"}"#,
            "signs with",
        ),
        (
            set(&[&k1]),
            vec![],
            r#"{"id":"r","action":"retire","keyId":"k1"}"#,
            "only key",
        ),
        (
            set(&[&k1, &k2]),
            vec![],
            r#"{"id":"r","action":"retire","keyId":"k5"}"#,
            "not a published key",
        ),
    ] {
        let p = plan(&GrantInputs {
            published: published(published_keys.clone(), None),
            request: request(raw),
            stacks,
            current_signer: Some("k1".into()),
            lock_server_signs_with: Some("k1".into()),
        });
        match &p.write {
            Some(GrantWrite::Refuse { request, message }) => {
                assert_eq!(request, "r");
                assert!(message.contains(why), "{message}");
            }
            other => panic!("{raw}: {other:?}"),
        }
        assert_eq!(p.keys_after, published_keys, "{raw}");
    }
}

#[test]
fn bad_requests_are_refused_under_their_id_or_reported() {
    let k1 = key("k1");
    let with = |raw: &str| GrantInputs {
        published: published(set(&[&k1]), None),
        request: request(raw),
        ..GrantInputs::default()
    };
    let p = plan(&with(r#"{"id":"x-1","action":"rotate"}"#));
    assert!(
        matches!(&p.write, Some(GrantWrite::Refuse { request, .. }) if request == "x-1"),
        "{:?}",
        p.write
    );
    let p = plan(&with(r#"{"action":"add"}"#));
    assert!(p.write.is_none());
    assert!(
        p.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("dlock.dev/grant-keys")),
        "{:?}",
        p.status
    );
    for bad in [
        r#"{"id":"a","action":"add","keyId":"k1"}"#,
        r#"{"id":"a","action":"retire"}"#,
        r#"{"id":"a","action":"retire","keyId":"k 1"}"#,
        r#"{"id":"A","action":"add"}"#,
        r#"{"id":"a","action":"add","extra":1}"#,
    ] {
        assert!(parse_grant_keys(bad).is_err(), "{bad}");
    }
    assert!(parse_grant_keys(r#"{"id":"rot-2","action":"add"}"#).is_ok());
}

#[test]
fn a_hand_edited_key_set_blocks_instead_of_guessing() {
    for published in [Some(Err("bad key".to_owned())), Some(Ok(Published::default()))] {
        let p = plan(&GrantInputs {
            published,
            ..GrantInputs::default()
        });
        assert!(
            p.broken.is_some() && p.write.is_none() && p.signer.is_none(),
            "{p:?}"
        );
    }
}
