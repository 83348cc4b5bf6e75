//! Signed grants on both backends: every acquire and every renew answers the grant signed for
//! exactly that grant (lock service id, key id, lock key, token, owner, session); a renew is signed
//! with the key of the server that answers it (what a key rotation relies on); a server without a key
//! answers without `grant`.

mod common;

use common::*;
use dlock_grant::{GrantError, KeyId, PublicKeys, SigningKey};
use dlock_testkit::etcd::EtcdCluster;
use lock_server::{Config, RunningServer};
use reqwest::StatusCode;
use uuid::Uuid;

const SERVICE_ID: &str = "tests/locks";

fn key(id: &str) -> SigningKey {
    SigningKey::generate(KeyId::new(id).unwrap())
}

fn keys(of: &[&SigningKey]) -> PublicKeys {
    PublicKeys::new(of.iter().map(|k| k.public_key()).collect()).unwrap()
}

/// One store, and servers over it with the signing keys given (`None`: no key).
enum Store {
    Pg(Db),
    Etcd(EtcdCluster),
}

impl Store {
    async fn new(etcd: bool) -> Store {
        if etcd {
            Store::Etcd(
                EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)"),
            )
        } else {
            Store::Pg(lockdb().await)
        }
    }

    async fn server(&self, signing: Option<&SigningKey>) -> RunningServer {
        let config = match self {
            Store::Pg(db) => config(&db.db),
            Store::Etcd(c) => Config::etcd(c.endpoints(), "/dlock/").with_reaper_interval(None),
        };
        lock_server::spawn(
            config
                .with_lock_service_id(SERVICE_ID)
                .with_signing_key(signing.cloned()),
        )
        .await
        .unwrap()
    }
}

fn account() -> String {
    dlock_common::grant::account_key(Uuid::new_v4())
}

fn grant_of(reply: &Reply) -> &str {
    reply.body["grant"]
        .as_str()
        .unwrap_or_else(|| panic!("no grant in {reply:?}"))
}

async fn acquire_and_renew_answer_the_grant_signed_for_exactly_that_grant(etcd: bool) {
    let store = Store::new(etcd).await;
    let k1 = key("k1");
    let srv = store.server(Some(&k1)).await;
    let api = Api::new(&srv);
    let trusted = keys(&[&k1]);
    let key = account();
    let session = api.open_session("holder-1", LONG_TTL_MS).await;
    let granted = api.acquire(&key, session, "holder-1", LONG_TTL_MS).await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let g = trusted.verify(grant_of(&granted)).unwrap();
    assert_eq!(g.lock_service, SERVICE_ID);
    assert_eq!(g.key_id.as_str(), "k1");
    assert_eq!(g.lock_key, key);
    assert_eq!(g.token, granted.token());
    assert_eq!(g.owner_id, "holder-1");
    assert_eq!(g.session_id, session);

    let renewed = api.renew(&key, granted.token(), LONG_TTL_MS).await;
    assert_eq!(renewed.status, StatusCode::OK, "{renewed:?}");
    assert_eq!(
        trusted.verify(grant_of(&renewed)).unwrap(),
        g,
        "a renew re-signs the same grant"
    );

    // Another holder's grant is its own: a different token, a different signature.
    let other_key = account();
    let other = api.acquire(&other_key, session, "holder-1", LONG_TTL_MS).await;
    let o = trusted.verify(grant_of(&other)).unwrap();
    assert_eq!(
        (o.lock_key.as_str(), o.token),
        (other_key.as_str(), other.token())
    );
    assert_ne!(grant_of(&other), grant_of(&granted));
    srv.shutdown().await.unwrap();
}

/// The rotation, at the lock service: a server started with the new key re-signs a grant another
/// server (the old key) issued, with the same claims; a resource trusting both keys accepts both, one
/// trusting only the new key refuses the old signature.
async fn a_renew_is_signed_with_the_key_of_the_server_that_answers_it(etcd: bool) {
    let store = Store::new(etcd).await;
    let (old, new) = (key("k1"), key("k2"));
    let before = store.server(Some(&old)).await;
    let after = store.server(Some(&new)).await;
    let (a, b) = (Api::new(&before), Api::new(&after));
    let key = account();
    let session = a.open_session("holder", LONG_TTL_MS).await;
    let granted = a.acquire(&key, session, "holder", LONG_TTL_MS).await;
    let renewed = b.renew(&key, granted.token(), LONG_TTL_MS).await;
    assert_eq!(renewed.status, StatusCode::OK, "{renewed:?}");

    let both = keys(&[&old, &new]);
    let by_old = both.verify(grant_of(&granted)).unwrap();
    let by_new = both.verify(grant_of(&renewed)).unwrap();
    assert_eq!((by_old.key_id.as_str(), by_new.key_id.as_str()), ("k1", "k2"));
    assert_eq!(
        (
            &by_new.lock_key,
            by_new.token,
            &by_new.owner_id,
            by_new.session_id
        ),
        (
            &by_old.lock_key,
            by_old.token,
            &by_old.owner_id,
            by_old.session_id
        )
    );
    let only_new = keys(&[&new]);
    assert!(only_new.verify(grant_of(&renewed)).is_ok());
    assert_eq!(
        only_new.verify(grant_of(&granted)),
        Err(GrantError::UnknownSigner("k1".into()))
    );
    before.shutdown().await.unwrap();
    after.shutdown().await.unwrap();
}

async fn without_a_key_answers_carry_no_grant(etcd: bool) {
    let store = Store::new(etcd).await;
    let srv = store.server(None).await;
    let api = Api::new(&srv);
    let key = account();
    let session = api.open_session("holder", LONG_TTL_MS).await;
    let granted = api.acquire(&key, session, "holder", LONG_TTL_MS).await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.body.get("grant").is_none(), "{granted:?}");
    let renewed = api.renew(&key, granted.token(), LONG_TTL_MS).await;
    assert!(renewed.body.get("grant").is_none(), "{renewed:?}");
    srv.shutdown().await.unwrap();
}

dlock_testkit::on_both_backends!(
    postgres: false, etcd: true;
    acquire_and_renew_answer_the_grant_signed_for_exactly_that_grant,
    a_renew_is_signed_with_the_key_of_the_server_that_answers_it,
    without_a_key_answers_carry_no_grant,
);
