use super::*;

fn owner() -> Owner {
    Owner {
        name: "locks".into(),
        namespace: "pay".into(),
        kind: "LockService".into(),
        owner_ref: Default::default(),
        https: false,
    }
}

fn key(id: &str) -> SigningKey {
    SigningKey::generate(KeyId::new(id).unwrap())
}

fn set(keys: &[&SigningKey]) -> PublicKeys {
    PublicKeys::new(keys.iter().map(|k| k.public_key()).collect()).unwrap()
}

#[test]
fn key_ids_count_up_from_k1() {
    assert_eq!(next_key_id(&PublicKeys::default()).as_str(), "k1");
    assert_eq!(next_key_id(&set(&[&key("k1"), &key("k2")])).as_str(), "k3");
    assert_eq!(next_key_id(&set(&[&key("k7"), &key("other")])).as_str(), "k8");
}

#[test]
fn the_secret_holds_the_private_key_by_id_and_the_configmap_only_public_keys() {
    let o = owner();
    let k1 = key("k1");
    let secret = signing_secret(&o, &k1);
    assert_eq!(secret.metadata.name.as_deref(), Some("locks-grant-signing-keys"));
    let data = secret.data.unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["k1"]);
    let text = String::from_utf8(data["k1"].0.clone()).unwrap();
    assert_eq!(SigningKey::parse(&text).unwrap().public_key(), k1.public_key());

    let cm = public_keys_configmap(&o, &set(&[&k1]), Some(("rot-1", "added k1")));
    assert_eq!(cm.metadata.name.as_deref(), Some("locks-grant-public-keys"));
    let back = Published::of(&cm).unwrap();
    assert_eq!(back.keys, set(&[&k1]));
    assert_eq!(back.last_request.as_deref(), Some("rot-1"));
    let seed = text.split_once('=').unwrap().1;
    assert!(
        !serde_json::to_string(&cm).unwrap().contains(seed),
        "a private key in the ConfigMap"
    );
    assert_eq!(lock_service_id(&o), "pay/locks");
    assert_ne!(
        checksum(&set(&[&k1]).to_text()),
        checksum(&set(&[&k1, &key("k2")]).to_text())
    );
}
