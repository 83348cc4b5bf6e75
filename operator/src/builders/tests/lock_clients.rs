//! Lock clients (builders/lock_clients.rs): each stack's token Secret and what its executors are
//! given, and the clients file a LockService builds from its stacks — checked by lock-server's own
//! parser, so that what the operator writes is what lock-server accepts and enforces.

use lock_server::clients::{Clients, Operation};

use super::*;
use crate::builders::lock_clients::{
    self, CLIENTS_ANNOTATION, CLIENTS_DIR, CLIENTS_FILE_ENV, CLIENTS_VOLUME, ClientToken, KEY_FILE,
    KEY_RESERVE, KEY_TOKEN, LOCK_TOKEN_ENV, OWNER_ID_ENV, POD_NAME_ENV, StackClient, clients_file,
};

fn client(stack: &str) -> StackClient {
    StackClient {
        stack: stack.into(),
        token: ClientToken::generate(),
    }
}

fn token_text(c: &StackClient) -> String {
    // The file is the one place a token appears: read it back from there.
    let file = clients_file(std::slice::from_ref(c), None, &ClientToken::generate()).unwrap();
    let v: serde_json::Value = serde_json::from_str(file.text()).unwrap();
    v["clients"][0]["token"].as_str().unwrap().to_owned()
}

/// An owner id an executor of `stack` would have: `<stack>/<pod name>`, worker `n`.
fn executor_owner(stack: &str, pod: &str, n: u32) -> String {
    let id = lock_clients::executor_owner_id(stack).replace(&format!("$({POD_NAME_ENV})"), pod);
    payout_executor::config::worker_owner_id(&id, n)
}

#[test]
fn the_clients_file_is_what_lock_server_accepts_and_each_stack_owns_only_its_own_owner_ids() {
    // `pay` is a prefix of every other name: with `<name>-` or bare names as owner prefixes they
    // would overlap, and lock-server would refuse the file.
    let stacks = ["pay", "pay-x", "pay.x", "payx", "p"].map(client);
    let file = clients_file(&stacks, None, &ClientToken::generate()).unwrap();
    let parsed = Clients::parse(file.text()).expect("lock-server accepts the file");
    assert_eq!(
        parsed.names().collect::<Vec<_>>(),
        [
            "paymentstack-p",
            "paymentstack-pay",
            "paymentstack-pay-x",
            "paymentstack-pay.x",
            "paymentstack-payx"
        ],
        "one client per stack, in name order"
    );
    assert_eq!(file.stacks, ["p", "pay", "pay-x", "pay.x", "payx"]);
    assert!(!file.reserved_only);
    for me in &stacks {
        let c = parsed
            .authenticate(token_text(me).as_bytes())
            .expect("each stack's token is its client's");
        assert_eq!(c.name(), format!("paymentstack-{}", me.stack));
        assert_eq!(c.owner_prefixes(), [format!("{}/", me.stack)]);
        // What the executors do, and nothing more.
        assert!(c.may(Operation::Lock));
        assert!(!c.may(Operation::Read) && !c.may(Operation::Watch) && !c.may(Operation::List));
        assert!(c.owns_key("account:00000000-0000-0000-0000-000000000001"));
        assert!(!c.owns_key("job:nightly") && !c.owns_key("accounts"));
        let pod = format!("{}-payout-executor-5d9c7b8f4-x2x9z", me.stack);
        for other in &stacks {
            let theirs = executor_owner(&other.stack, &pod, 3);
            assert_eq!(
                c.owns_owner(&theirs),
                other.stack == me.stack,
                "{} and the owner id {theirs}",
                me.stack
            );
        }
    }
}

#[test]
fn owner_prefixes_never_overlap_whatever_the_stack_names() {
    // Object names are DNS subdomains (a-z 0-9 - .): no name holds the separator, so `<a>/` is a
    // prefix of `<b>/` only when a == b.
    let names = [
        "pay", "pay-x", "pay-", "pa", "pay.x", "pay-x.y", "a", "a-b", "a.b", "ab", "payments",
    ];
    for a in names {
        for b in names {
            let (pa, pb) = (lock_clients::owner_prefix(a), lock_clients::owner_prefix(b));
            assert_eq!(
                pa.starts_with(&pb) || pb.starts_with(&pa),
                a == b,
                "{pa:?} / {pb:?}"
            );
        }
    }
}

#[test]
fn the_longest_owner_id_an_executor_can_have_is_one_lock_server_accepts() {
    // A stack name of 36 characters (the CRD's limit), a pod name of 63, the last of 64 workers.
    let stack = "s".repeat(36);
    let id = executor_owner(&stack, &"p".repeat(63), 64);
    dlock_common::validate::owner_id(&id).expect("within lock-server's owner id rules");
}

#[test]
fn without_any_client_the_file_has_a_placeholder_nobody_holds_and_it_stays_the_same() {
    let reserve = ClientToken::generate();
    let a = clients_file(&[], None, &reserve).unwrap();
    let b = clients_file(&[], None, &reserve).unwrap();
    assert!(a.reserved_only && a.stacks.is_empty());
    assert_eq!(
        a, b,
        "the kept placeholder token keeps the file, and lock-server, as they are"
    );
    let parsed = Clients::parse(a.text()).expect("lock-server accepts it (it refuses an empty file)");
    assert_eq!(parsed.names().collect::<Vec<_>>(), [lock_clients::RESERVE_CLIENT]);
    // A fresh placeholder is another file.
    assert_ne!(
        clients_file(&[], None, &ClientToken::generate())
            .unwrap()
            .checksum,
        a.checksum
    );
}

#[test]
fn the_hash_on_lock_servers_pod_template_changes_when_a_stack_is_added_or_its_token_changes() {
    let reserve = ClientToken::generate();
    let pay = client("pay");
    let one = clients_file(std::slice::from_ref(&pay), None, &reserve).unwrap();
    let two = clients_file(&[pay.clone(), client("pay-x")], None, &reserve).unwrap();
    let again = clients_file(std::slice::from_ref(&pay), None, &reserve).unwrap();
    let new_token = clients_file(&[client("pay")], None, &reserve).unwrap();
    assert_eq!(one.checksum, again.checksum, "the same clients, the same file");
    assert_ne!(one.checksum, two.checksum, "a stack added");
    assert_ne!(one.checksum, new_token.checksum, "a stack's Secret made anew");

    // As the LockService's children carry it.
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let annotation = |file: &lock_clients::ClientsFile| {
        let inputs = lockservice::children::Inputs {
            lock_clients: file,
            ..ls_inputs(&JobState::Succeeded)
        };
        let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
        deployment(&d, "locks-lock-server")
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(CLIENTS_ANNOTATION))
            .cloned()
            .expect("the clients file's hash")
    };
    assert_eq!(annotation(&one), one.checksum);
    assert_eq!(annotation(&two), two.checksum);
    assert_ne!(annotation(&one), annotation(&two));
}

#[test]
fn lock_server_mounts_the_clients_secret_written_before_it() {
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let d = lockservice::children::desired(&ls, &owner, &ls_inputs(&JobState::Succeeded)).unwrap();
    // The Secret first: a pod of the new template must find the file it names.
    let Some(Child::Secret(secret)) = d.apply.first() else {
        panic!("the clients Secret is not applied first: {:?}", d.apply);
    };
    let secret = &secret.0;
    assert_eq!(secret.metadata.name.as_deref(), Some("locks-lock-clients"));
    let data = secret.data.as_ref().unwrap();
    assert_eq!(data[KEY_FILE].0, LOCK_CLIENTS.text().as_bytes());
    assert!(data.contains_key(KEY_RESERVE));
    assert_eq!(
        secret.metadata.annotations.as_ref().unwrap()[CLIENTS_ANNOTATION],
        LOCK_CLIENTS.checksum
    );
    let refs = secret.metadata.owner_references.as_ref().unwrap();
    assert_eq!(refs[0].uid, "uid-locks", "deleted with its LockService");

    let dep = deployment(&d, "locks-lock-server");
    let pod = dep.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == CLIENTS_VOLUME)
        .expect("the clients volume");
    let source = volume.secret.as_ref().unwrap();
    assert_eq!(source.secret_name.as_deref(), Some("locks-lock-clients"));
    assert_eq!(source.default_mode, Some(0o440));
    assert!(
        pod.security_context.as_ref().and_then(|s| s.fs_group).is_some(),
        "its group reads the 0440 file"
    );
    let c = &pod.containers[0];
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == CLIENTS_VOLUME)
        .expect("mounted");
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        (CLIENTS_DIR, Some(true))
    );
    let path = env_of(c, CLIENTS_FILE_ENV).and_then(|e| e.value.clone());
    assert_eq!(path, Some(format!("{CLIENTS_DIR}/{KEY_FILE}")));
    assert_eq!(CLIENTS_FILE_ENV, lock_server::config::CLIENTS_FILE_ENV);
    // Never a token in the pod spec.
    let text = serde_json::to_string(dep).unwrap();
    let pay_token =
        serde_json::from_str::<serde_json::Value>(LOCK_CLIENTS.text()).unwrap()["clients"][0]["token"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(!text.contains(&pay_token));

    // With etcd too (the one lock-server of either backend).
    let etcd = etcd_ls(json!({"managed": {"replicas": 3}}));
    let owner = Owner::of(&etcd).unwrap();
    let d = lockservice::children::desired(&etcd, &owner, &etcd_inputs(true)).unwrap();
    let c = &containers(d.find(ChildKind::Deployment, "locks-lock-server").unwrap())[0];
    assert!(env_of(c, CLIENTS_FILE_ENV).is_some());
    // Held back (no quorum yet), the Secret is still written.
    let d = lockservice::children::desired(&etcd, &owner, &etcd_inputs(false)).unwrap();
    assert!(matches!(d.apply.first(), Some(Child::Secret(_))));
}

#[test]
fn executors_present_their_stacks_token_under_their_stacks_owner_prefix() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let ls = ready_lock_service();
    let d =
        paymentstack::children::desired(&ps, &owner, &ps_inputs(&JobState::Succeeded, Some(&ls))).unwrap();
    let c = &containers(d.find(ChildKind::Deployment, "shop-payout-executor").unwrap())[0];
    let token = env_of(c, LOCK_TOKEN_ENV).expect("the lock client token");
    assert_eq!(
        secret_ref(token),
        ("shop-lock-client".to_owned(), KEY_TOKEN.to_owned())
    );
    assert_eq!(LOCK_TOKEN_ENV, payout_executor::config::LOCK_TOKEN_ENV);
    let names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    let pod_name = names.iter().position(|n| *n == POD_NAME_ENV).expect("POD_NAME");
    let owner_id = names
        .iter()
        .position(|n| *n == OWNER_ID_ENV)
        .expect("the owner id");
    assert!(
        pod_name < owner_id,
        "the kubelet expands only variables defined before"
    );
    let field = env_of(c, POD_NAME_ENV)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|f| f.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(field.as_deref(), Some("metadata.name"));
    assert_eq!(
        env_of(c, OWNER_ID_ENV).and_then(|e| e.value.as_deref()),
        Some("shop/$(POD_NAME)")
    );
    // The executor's own argument parsing takes it.
    let args = c.args.clone().unwrap_or_default();
    let cli = <payout_executor::Cli as clap::Parser>::try_parse_from(
        std::iter::once("payout-executor".to_owned()).chain(args).chain([
            "--owner-id".to_owned(),
            "shop/shop-payout-executor-7f-abcde".to_owned(),
        ]),
    )
    .unwrap();
    assert!(cli.into_config_with_lock_token(Some("x".repeat(48))).is_ok());
}

#[test]
fn each_stack_gets_a_random_token_secret_of_its_own() {
    let ps = default_stack();
    let owner = Owner::of(&ps).unwrap();
    let a = lock_clients::client_secret(&owner);
    let b = lock_clients::client_secret(&owner);
    assert_eq!(a.metadata.name.as_deref(), Some("shop-lock-client"));
    assert_eq!(a.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-shop");
    let ta = ClientToken::from_secret(&a, KEY_TOKEN).expect("lock-server's shape");
    let tb = ClientToken::from_secret(&b, KEY_TOKEN).unwrap();
    assert_ne!(ta, tb, "random");
    let raw = &a.data.as_ref().unwrap()[KEY_TOKEN].0;
    assert!(raw.len() >= lock_server::clients::MIN_TOKEN_BYTES);
    // Too short, or not visible ASCII: not taken as a token.
    let mut short = a.clone();
    short
        .data
        .as_mut()
        .unwrap()
        .insert(KEY_TOKEN.into(), k8s_openapi::ByteString(b"short".to_vec()));
    assert!(ClientToken::from_secret(&short, KEY_TOKEN).is_none());
}

#[test]
fn own_clients_are_added_and_an_overlap_is_refused_naming_clients_never_tokens() {
    let pay = client("pay");
    let own = r#"{"clients": [{"name": "reports", "token": "reports-token-0123456789abcdef0123456789",
        "keyPrefixes": ["report:"], "ownerPrefixes": ["reports-"], "operations": ["read", "list"]}]}"#;
    let file = clients_file(std::slice::from_ref(&pay), Some(own), &ClientToken::generate()).unwrap();
    assert_eq!(file.own, ["reports"]);
    let parsed = Clients::parse(file.text()).unwrap();
    assert_eq!(
        parsed.names().collect::<Vec<_>>(),
        ["paymentstack-pay", "reports"]
    );
    // Only own clients: no placeholder.
    let only = clients_file(&[], Some(own), &ClientToken::generate()).unwrap();
    assert!(!only.reserved_only);
    assert_eq!(Clients::parse(only.text()).unwrap().names().count(), 1);

    let secret = token_text(&pay);
    for (own, words) in [
        (
            r#"{"clients": [{"name": "mine", "token": "t", "keyPrefixes": ["a"], "ownerPrefixes": ["pay"], "operations": ["lock"]}]}"#,
            &["\"pay\"", "\"mine\"", "\"pay/\"", "paymentstack-pay", "overlaps"][..],
        ),
        (
            // lock-server's default owner prefix is the name.
            r#"{"clients": [{"name": "p", "token": "t", "keyPrefixes": ["a"], "operations": ["lock"]}]}"#,
            &["\"p\"", "overlaps"][..],
        ),
        (
            r#"{"clients": [{"name": "paymentstack-pay", "token": "t", "keyPrefixes": ["a"], "ownerPrefixes": ["x-"], "operations": ["lock"]}]}"#,
            &["given twice"][..],
        ),
        ("[]", &["`clients` list"][..]),
        ("{\"clients\": [", &["not a clients file"][..]),
        (r#"{"clients": [{"token": "t"}]}"#, &["client #1", "no name"][..]),
    ] {
        let e = clients_file(std::slice::from_ref(&pay), Some(own), &ClientToken::generate())
            .expect_err(own)
            .to_string();
        assert!(!e.contains(&secret), "a token leaked: {e}");
        for w in words {
            assert!(e.contains(w), "{w:?} not in {e:?}");
        }
    }
}

#[test]
fn debug_never_shows_a_token() {
    let pay = client("pay");
    let secret = token_text(&pay);
    let file = clients_file(std::slice::from_ref(&pay), None, &ClientToken::generate()).unwrap();
    let ls = managed_ls();
    let owner = Owner::of(&ls).unwrap();
    let inputs = lockservice::children::Inputs {
        lock_clients: &file,
        ..ls_inputs(&JobState::Succeeded)
    };
    let d = lockservice::children::desired(&ls, &owner, &inputs).unwrap();
    for text in [format!("{pay:?}"), format!("{file:?}"), format!("{d:?}")] {
        assert!(!text.contains(&secret), "{text}");
    }
    assert!(format!("{d:?}").contains("locks-lock-clients"));
}
