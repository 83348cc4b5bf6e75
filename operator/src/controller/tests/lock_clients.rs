//! Lock clients through both reconcilers: a PaymentStack creates its lock client Secret once; its
//! LockService lists it in lock-server's clients file when (and only while) it exists, and
//! lock-server's pod template follows the file.

use k8s_openapi::api::core::v1::Secret;

use super::*;
use crate::builders::lock_clients::{CLIENTS_ANNOTATION, KEY_FILE, KEY_RESERVE, KEY_TOKEN};

fn secret(api: &FakeApi, name: &str) -> Option<Secret> {
    api.get(&format!("{SECRETS}{name}"))
        .map(|v| serde_json::from_value(v).unwrap())
}

fn data(s: &Secret, key: &str) -> String {
    String::from_utf8(s.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// The clients file as written: (client name, token, owner prefixes) of each client.
fn clients(api: &FakeApi) -> Vec<(String, String, Vec<String>)> {
    let s = secret(api, "locks-lock-clients").expect("the clients Secret");
    let file: Value = serde_json::from_str(&data(&s, KEY_FILE)).unwrap();
    file["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["token"].as_str().unwrap().to_owned(),
                serde_json::from_value(c["ownerPrefixes"].clone()).unwrap(),
            )
        })
        .collect()
}

/// (the hash on the clients Secret, the hash on lock-server's pod template).
fn hashes(api: &FakeApi) -> (String, Option<String>) {
    let s = secret(api, "locks-lock-clients").unwrap();
    let on_secret = s.metadata.annotations.unwrap()[CLIENTS_ANNOTATION].clone();
    let on_pods = api.get(&format!("{DEPLOYMENTS}locks-lock-server")).and_then(|d| {
        d["spec"]["template"]["metadata"]["annotations"][CLIENTS_ANNOTATION]
            .as_str()
            .map(str::to_owned)
    });
    (on_secret, on_pods)
}

fn store_stack(api: &FakeApi) {
    api.put(
        PS_KEY,
        json!({
            "apiVersion": "dlock.dev/v1alpha1", "kind": "PaymentStack",
            "metadata": {"name": "shop", "namespace": NS, "uid": "uid-shop", "generation": 1},
            "spec": {"lockServiceRef": {"name": "locks"}, "database": {"managed": {}},
                     "railStub": {"enabled": true}},
        }),
    );
}

#[tokio::test]
async fn a_stacks_lock_client_is_made_once_and_served_by_its_lock_service_while_it_exists() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"managed": {"replicas": 3}}, "lockServer": {"replicas": 2}}),
    );

    // No stack yet: the file has only the placeholder, written even while lock-server is held.
    reconcile_ls(&api, &ctx).await;
    assert!(api.keys(DEPLOYMENTS).is_empty());
    let placeholder = clients(&api);
    assert_eq!(placeholder.len(), 1);
    assert_eq!(placeholder[0].0, "reserved");
    let reserve = data(&secret(&api, "locks-lock-clients").unwrap(), KEY_RESERVE);
    assert_eq!(placeholder[0].1, reserve);

    // lock-server starts on it: mounted, named, its hash on the pod template.
    api.set_status(
        &format!("{STATEFULSETS}locks-etcd"),
        json!({"replicas": 3, "readyReplicas": 3}),
    );
    reconcile_ls(&api, &ctx).await;
    let (on_secret, on_pods) = hashes(&api);
    assert_eq!(on_pods.as_deref(), Some(on_secret.as_str()));
    let alone = on_secret;
    let dep = api.get(&format!("{DEPLOYMENTS}locks-lock-server")).unwrap();
    let env = dep["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains("DLOCK_CLIENTS_FILE"), "{env}");
    assert!(!env.contains(&reserve), "no token in the pod spec");

    // A stack appears, its Secret not yet: left out, nothing rolls.
    store_stack(&api);
    reconcile_ls(&api, &ctx).await;
    assert_eq!(clients(&api)[0].0, "reserved");
    assert_eq!(hashes(&api).1.as_deref(), Some(alone.as_str()));

    // The stack's reconcile makes its Secret, once.
    reconcile_ps(&api, &ctx).await;
    let made = secret(&api, "shop-lock-client").expect("the stack's lock client Secret");
    let token = data(&made, KEY_TOKEN);
    assert!(token.len() >= 32);
    let owner = &made.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.uid.as_str(), owner.controller), ("uid-shop", Some(true)));
    reconcile_ps(&api, &ctx).await;
    assert_eq!(
        data(&secret(&api, "shop-lock-client").unwrap(), KEY_TOKEN),
        token,
        "never rotated by reconcile"
    );

    // Now the LockService serves it, and lock-server rolls.
    reconcile_ls(&api, &ctx).await;
    assert_eq!(
        clients(&api),
        [(
            "paymentstack-shop".to_owned(),
            token.clone(),
            vec!["shop/".to_owned()]
        )]
    );
    let (on_secret, on_pods) = hashes(&api);
    assert_eq!(on_pods.as_deref(), Some(on_secret.as_str()));
    assert_ne!(on_secret, alone, "a new set of clients rolls lock-server");
    let ls = load_ls(&api);
    let status = serde_json::to_string(&ls.status).unwrap();
    assert!(!status.contains(&token), "no token in status");

    // Again: the same file.
    reconcile_ls(&api, &ctx).await;
    assert_eq!(hashes(&api).0, on_secret);

    // The stack goes: back to the placeholder, with the kept token, so the very first file.
    api.0.lock().unwrap().objects.remove(PS_KEY);
    reconcile_ls(&api, &ctx).await;
    assert_eq!(clients(&api)[0].0, "reserved");
    assert_eq!(hashes(&api), (alone.clone(), Some(alone)));
}

#[tokio::test]
async fn a_secret_of_the_expected_name_made_by_someone_else_is_no_stacks_client() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"managed": {"replicas": 1}}}),
    );
    store_stack(&api);
    api.put(
        &format!("{SECRETS}shop-lock-client"),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "shop-lock-client", "namespace": NS},
               "data": {"token": "c29tZW9uZS1lbHNlcy10b2tlbi0wMTIzNDU2Nzg5YWJjZGVm"}}),
    );
    reconcile_ls(&api, &ctx).await;
    assert_eq!(clients(&api)[0].0, "reserved");
}

#[tokio::test]
async fn own_clients_are_added_and_a_bad_set_degrades_without_writing() {
    let api = FakeApi::default();
    let ctx = context(&api);
    store_lock_service(
        &api,
        json!({"backend": "etcd", "etcd": {"managed": {"replicas": 1}},
               "lockServer": {"clientsSecretRef": {"name": "my-clients"}}}),
    );
    // The named Secret does not exist: Degraded, and no clients file is written.
    let ls = reconcile_ls(&api, &ctx).await;
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "LockClientsInvalid".into())
    );
    assert!(secret(&api, "locks-lock-clients").is_none());

    let own = |owner_prefix: &str| {
        let file = json!({"clients": [{"name": "reports", "token": "reports-token-0123456789abcdef0123456789",
            "keyPrefixes": ["report:"], "ownerPrefixes": [owner_prefix], "operations": ["read"]}]});
        secret_json("my-clients", None, &[("clients.json", &file.to_string())])
    };
    api.put(&format!("{SECRETS}my-clients"), own("reports-"));
    let ls = reconcile_ls(&api, &ctx).await;
    assert_ne!(phase_and_reason(ls.status).1, "LockClientsInvalid");
    let names: Vec<String> = clients(&api).into_iter().map(|c| c.0).collect();
    assert_eq!(names, ["reports"]);

    // A stack and an own client whose owner prefix covers the stack's: refused, the file kept.
    store_stack(&api);
    reconcile_ps(&api, &ctx).await;
    api.put(&format!("{SECRETS}my-clients"), own("sho"));
    let before = hashes(&api).0;
    let ls = reconcile_ls(&api, &ctx).await;
    let status = ls.status.clone().unwrap();
    assert_eq!(
        phase_and_reason(ls.status),
        (Phase::Degraded, "LockClientsInvalid".into())
    );
    let message = &status.condition("Ready").unwrap().message;
    assert!(
        message.contains("\"sho\"") && message.contains("paymentstack-shop"),
        "{message}"
    );
    assert!(!message.contains("reports-token"), "{message}");
    assert_eq!(hashes(&api).0, before);
}
