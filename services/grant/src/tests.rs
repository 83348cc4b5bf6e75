use super::*;

fn id(s: &str) -> KeyId {
    KeyId::new(s).expect("key id")
}

fn claims(token: i64) -> Claims<'static> {
    Claims {
        lock_service: "payments/locks",
        lock_key: "account:7f2c0e5e-9c4e-4f39-9d0b-6d2f3c1a0b11",
        token,
        owner_id: "payout-executor-1",
        session_id: Uuid::from_u128(0x1234),
    }
}

fn set(keys: &[&SigningKey]) -> PublicKeys {
    PublicKeys::new(keys.iter().map(|k| k.public_key()).collect()).expect("set")
}

#[test]
fn a_signed_grant_verifies_and_states_what_was_signed() {
    let k = SigningKey::generate(id("k1"));
    let wire = k.sign(&claims(42)).unwrap();
    let g = set(&[&k]).verify(&wire).unwrap();
    assert_eq!(
        g,
        Grant {
            lock_service: "payments/locks".into(),
            key_id: id("k1"),
            lock_key: "account:7f2c0e5e-9c4e-4f39-9d0b-6d2f3c1a0b11".into(),
            token: 42,
            owner_id: "payout-executor-1".into(),
            session_id: Uuid::from_u128(0x1234),
        }
    );
    // Ed25519 is deterministic: the same claims, the same grant.
    assert_eq!(k.sign(&claims(42)).unwrap(), wire);
    assert_ne!(k.sign(&claims(43)).unwrap(), wire);
}

#[test]
fn every_flipped_bit_of_the_wire_form_is_refused() {
    let k = SigningKey::generate(id("k1"));
    let keys = set(&[&k]);
    let wire = k.sign(&claims(7)).unwrap();
    for i in 0..wire.len() {
        for bit in [1u8, 2, 4, 8, 16, 32, 64] {
            let mut bytes = wire.clone().into_bytes();
            bytes[i] ^= bit;
            let Ok(altered) = String::from_utf8(bytes) else {
                continue;
            };
            assert!(
                keys.verify(&altered).is_err(),
                "altered at {i} (bit {bit}) and still accepted: {altered}"
            );
        }
    }
}

#[test]
fn every_altered_payload_byte_is_a_bad_signature_or_malformed() {
    let k = SigningKey::generate(id("k1"));
    let keys = set(&[&k]);
    let wire = k.sign(&claims(7)).unwrap();
    let (p, s) = wire.split_once('.').unwrap();
    let payload = URL_SAFE_NO_PAD.decode(p).unwrap();
    for i in 0..payload.len() {
        let mut altered = payload.clone();
        altered[i] ^= 0x01;
        let forged = format!("{}.{s}", URL_SAFE_NO_PAD.encode(&altered));
        match keys.verify(&forged) {
            Err(GrantError::BadSignature(_) | GrantError::Malformed(_) | GrantError::UnknownSigner(_)) => {}
            Ok(g) => panic!("byte {i} altered and accepted: {g:?}"),
        }
    }
}

#[test]
fn a_grant_by_a_key_outside_the_set_is_an_unknown_signer_or_a_bad_signature() {
    let trusted = SigningKey::generate(id("k1"));
    let other = SigningKey::generate(id("k2"));
    let keys = set(&[&trusted]);
    assert_eq!(
        keys.verify(&other.sign(&claims(1)).unwrap()),
        Err(GrantError::UnknownSigner("k2".into()))
    );
    // Another key that calls itself k1: the id is known, the signature is not its.
    let impostor = SigningKey::generate(id("k1"));
    assert_eq!(
        keys.verify(&impostor.sign(&claims(1)).unwrap()),
        Err(GrantError::BadSignature("k1".into()))
    );
}

#[test]
fn a_rotated_set_accepts_both_keys_and_a_removed_key_is_refused() {
    let old = SigningKey::generate(id("k1"));
    let new = SigningKey::generate(id("k2"));
    let both = set(&[&old, &new]);
    assert!(both.verify(&old.sign(&claims(1)).unwrap()).is_ok());
    assert!(both.verify(&new.sign(&claims(2)).unwrap()).is_ok());
    let after = set(&[&new]);
    assert_eq!(
        after.verify(&old.sign(&claims(1)).unwrap()),
        Err(GrantError::UnknownSigner("k1".into()))
    );
}

#[test]
fn the_wire_form_is_parsed_strictly() {
    let k = SigningKey::generate(id("k1"));
    let keys = set(&[&k]);
    let wire = k.sign(&claims(9)).unwrap();
    let (p, s) = wire.split_once('.').unwrap();
    for bad in [
        String::new(),
        "nodot".into(),
        format!("{p}."),
        format!(".{s}"),
        format!("{p}.{s}.x"),
        format!("{p}=.{s}"),
        format!("{p}.{s}=="),
        format!("{p} .{s}"),
        format!("+{}.{s}", &p[1..]),
        format!("{p}.{}/", &s[..s.len() - 1]),
        format!("{p}.{}", &s[..s.len() - 1]),
        format!("{p}.{s}{s}"),
        "a".repeat(MAX_WIRE_LEN + 1),
    ] {
        assert!(
            matches!(keys.verify(&bad), Err(GrantError::Malformed(_))),
            "{bad:?}: {:?}",
            keys.verify(&bad)
        );
    }
}

fn signed_payload(k: &SigningKey, payload: &[u8]) -> String {
    let sig = k.key.sign(&signed_message(payload));
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(payload),
        URL_SAFE_NO_PAD.encode(sig.to_bytes())
    )
}

#[test]
fn a_validly_signed_payload_of_the_wrong_shape_is_still_malformed() {
    let k = SigningKey::generate(id("k1"));
    let keys = set(&[&k]);
    let good = Grant {
        lock_service: "s".into(),
        key_id: id("k1"),
        lock_key: "account:x".into(),
        token: 5,
        owner_id: "o".into(),
        session_id: Uuid::nil(),
    }
    .encode()
    .unwrap();
    assert!(keys.verify(&signed_payload(&k, &good)).is_ok());

    let mut trailing = good.clone();
    trailing.push(0);
    let mut version = good.clone();
    version[0] = 2;
    let mut truncated = good.clone();
    truncated.pop();
    // The token's 8 bytes follow version, three length-prefixed fields: 1 + (2+1) + (2+2) + (2+9).
    let mut zero_token = good.clone();
    zero_token[19..27].copy_from_slice(&0i64.to_be_bytes());
    let mut negative_token = good.clone();
    negative_token[19..27].copy_from_slice(&(-5i64).to_be_bytes());
    let mut empty_field = good.clone();
    empty_field[1..3].copy_from_slice(&0u16.to_be_bytes());
    for (what, bad) in [
        ("trailing byte", trailing),
        ("version 2", version),
        ("truncated", truncated),
        ("token 0", zero_token),
        ("negative token", negative_token),
        ("empty lock service", empty_field),
        ("empty", Vec::new()),
    ] {
        assert!(
            matches!(
                keys.verify(&signed_payload(&k, &bad)),
                Err(GrantError::Malformed(_))
            ),
            "{what}"
        );
    }
}

#[test]
fn signing_refuses_fields_the_payload_cannot_carry() {
    let k = SigningKey::generate(id("k1"));
    let long_key = "x".repeat(MAX_LOCK_KEY_BYTES + 1);
    for c in [
        Claims {
            token: 0,
            ..claims(1)
        },
        Claims {
            lock_key: "",
            ..claims(1)
        },
        Claims {
            owner_id: "",
            ..claims(1)
        },
        Claims {
            lock_key: &long_key,
            ..claims(1)
        },
    ] {
        assert!(k.sign(&c).is_err(), "{c:?}");
    }
}

#[test]
fn keys_round_trip_through_their_text_and_never_show_in_debug_or_errors() {
    let k = SigningKey::generate(id("k-2026.1_a"));
    let text = k.expose_text();
    let again = SigningKey::parse(&format!("{text}\n")).unwrap();
    assert_eq!(again.public_key(), k.public_key());
    let seed = text.split_once('=').unwrap().1;
    assert!(!format!("{k:?}").contains(seed), "{k:?}");
    let bad = format!("k1={}", &seed[..seed.len() - 2]);
    let err = SigningKey::parse(&bad).unwrap_err().to_string();
    assert!(!err.contains(&seed[..20]), "{err}");

    let keys = PublicKeys::parse(&k.public_key().to_text()).unwrap();
    assert_eq!(PublicKeys::parse(&keys.to_text()).unwrap(), keys);
}

#[test]
fn key_sets_are_parsed_strictly() {
    let a = SigningKey::generate(id("k1")).public_key().to_text();
    let b = SigningKey::generate(id("k2")).public_key().to_text();
    let two = PublicKeys::parse(&format!(" {a},\n{b}\n")).unwrap();
    assert_eq!(two.ids().map(KeyId::as_str).collect::<Vec<_>>(), ["k1", "k2"]);
    assert!(PublicKeys::parse("").unwrap().is_empty());
    assert!(matches!(
        PublicKeys::parse(&format!("{a},{a}")),
        Err(KeyError::Duplicate { .. })
    ));
    // The identity point: small order, verifies what it never signed.
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let weak = format!("k9={}", URL_SAFE_NO_PAD.encode(identity));
    assert!(matches!(PublicKeys::parse(&weak), Err(KeyError::Unusable { .. })));
    for bad in [
        "k1",
        "=abc",
        "k 1=AAAA",
        "k1=AAAA",
        "k1=!!!!",
        &format!("{}=", "k".repeat(40)),
    ] {
        assert!(PublicKeys::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn key_ids_are_short_plain_names() {
    assert!(KeyId::new("k1").is_some());
    assert!(KeyId::new("2026-05.rot_2").is_some());
    for bad in ["", "k 1", "k=1", "k,1", "ключ", &"k".repeat(33)] {
        assert!(KeyId::new(bad).is_none(), "{bad:?}");
    }
}
