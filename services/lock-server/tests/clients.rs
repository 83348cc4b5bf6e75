//! Lock clients (docs/lock-api.md "Authentication"): with a clients file every lock and session
//! route needs a client's bearer token (401 `UNAUTHORIZED`, before the body is read) and the
//! client's rights (403 `FORBIDDEN`: operation, key, owner id, another client's session or grant).
//! Every refusal writes nothing — lockdb's tables and sequence, or etcd's revision, are the same
//! after it — and is counted in `lock_client_refusals_total{client, reason}`.
//!
//! The negative control runs the same attacks of one client on another's session and grant against
//! the same store served without a clients file: there each of them succeeds, so the refusals come
//! from the authentication.

mod common;

use std::time::Duration;

use common::*;
use dlock_testkit::etcd::EtcdCluster;
use lock_server::{Clients, Config, RunningServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

const PAYMENTS: &str = "payments-client-token-5b0d9c1e2f3a4b5c6d7e8f90";
const BATCH: &str = "batch-client-token-0a1b2c3d4e5f60718293a4b5c6";
const REPORTS: &str = "reports-client-token-99aa88bb77cc66dd55ee44ff";
/// A token of the right shape that no client has.
const STRANGER: &str = "stranger-token-00000000000000000000000000000";

/// payments and batch lock under the same key space (so one could reach the other's grants if
/// nothing stopped it); reports only reads and lists.
fn clients() -> Clients {
    Clients::parse(
        &json!({"clients": [
            {"name": "payments", "token": PAYMENTS, "keyPrefixes": ["account:"],
             "ownerPrefixes": ["payments-"], "operations": ["lock", "read", "watch"]},
            {"name": "batch", "token": BATCH, "keyPrefixes": ["account:"],
             "ownerPrefixes": ["batch-"], "operations": ["lock", "read"]},
            {"name": "reports", "token": REPORTS, "keyPrefixes": ["account:", "report:"],
             "operations": ["read", "list"]},
        ]})
        .to_string(),
    )
    .unwrap()
}

// ---- the store, and what "nothing written" means on it -----------------------------------------

enum Store {
    Postgres(Db),
    Etcd(EtcdCluster),
}

impl Store {
    async fn postgres() -> Self {
        Store::Postgres(lockdb().await)
    }

    fn etcd() -> Self {
        Store::Etcd(EtcdCluster::single().expect("etcd starts (scripts/setup.sh installs it)"))
    }

    fn config(&self) -> Config {
        match self {
            Store::Postgres(db) => config(&db.db),
            Store::Etcd(c) => Config::etcd(c.endpoints(), "/dlock/")
                .with_admin_token(ADMIN_TOKEN)
                .with_reaper_interval(None),
        }
    }

    async fn serve(&self, with_clients: bool) -> RunningServer {
        let config = if with_clients {
            self.config().with_clients(clients())
        } else {
            self.config()
        };
        lock_server::spawn(config).await.unwrap()
    }

    /// Everything the store holds: lockdb's tables and the sequence position; etcd's revision
    /// (any write moves it) and every key. Equal states mean nothing was written.
    async fn state(&self) -> String {
        match self {
            Store::Postgres(db) => format!("{:?}", snapshot(&db.admin).await),
            Store::Etcd(c) => {
                let mut client = etcd_client::Client::connect(c.endpoints(), None).await.unwrap();
                let all = client
                    .get("", Some(etcd_client::GetOptions::new().with_all_keys()))
                    .await
                    .unwrap();
                let keys: Vec<String> = all
                    .kvs()
                    .iter()
                    .map(|kv| format!("{}@{}", kv.key_str().unwrap_or("?"), kv.mod_revision()))
                    .collect();
                format!("revision {} {keys:?}", all.header().map_or(0, |h| h.revision()))
            }
        }
    }
}

// ---- requests as a client ----------------------------------------------------------------------

/// Requests to one server with one bearer token (`None`: no Authorization header).
#[derive(Clone)]
struct As {
    api: Api,
    token: Option<&'static str>,
}

impl As {
    fn new(srv: &RunningServer, token: Option<&'static str>) -> Self {
        Self {
            api: Api::new(srv),
            token,
        }
    }

    async fn send(&self, method: Method, path: &str, token: Option<i64>, body: Option<Value>) -> Reply {
        let mut req = self.api.http.request(method, self.api.url(path));
        if let Some(t) = self.token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = token {
            req = req.header("X-Fencing-Token", t.to_string());
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        if resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "text/event-stream")
        {
            // A watch that was let through: its head is the answer.
            return Reply {
                status: resp.status(),
                body: Value::Null,
            };
        }
        reply(resp).await
    }

    async fn open(&self, owner: &str) -> Reply {
        self.send(
            Method::POST,
            "/v1/sessions",
            None,
            Some(json!({"ownerId": owner, "ttlMs": LONG_TTL_MS})),
        )
        .await
    }

    async fn session(&self, owner: &str) -> Uuid {
        let r = self.open(owner).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        r.body["sessionId"].as_str().unwrap().parse().unwrap()
    }

    async fn acquire(&self, key: &str, session: Uuid, owner: &str) -> Reply {
        self.send(
            Method::POST,
            &format!("/v1/locks/{key}/acquire"),
            None,
            Some(json!({"sessionId": session, "ownerId": owner, "ttlMs": LONG_TTL_MS})),
        )
        .await
    }

    async fn renew(&self, key: &str, token: i64) -> Reply {
        self.send(
            Method::POST,
            &format!("/v1/locks/{key}/renew"),
            Some(token),
            Some(json!({"ttlMs": LONG_TTL_MS})),
        )
        .await
    }

    async fn release(&self, key: &str, token: i64) -> Reply {
        self.send(
            Method::POST,
            &format!("/v1/locks/{key}/release"),
            Some(token),
            None,
        )
        .await
    }

    async fn heartbeat(&self, session: Uuid) -> Reply {
        self.send(
            Method::POST,
            &format!("/v1/sessions/{session}/heartbeat"),
            None,
            Some(json!({"ttlMs": LONG_TTL_MS})),
        )
        .await
    }

    async fn close(&self, session: Uuid) -> Reply {
        self.send(Method::DELETE, &format!("/v1/sessions/{session}"), None, None)
            .await
    }

    async fn read(&self, key: &str) -> Reply {
        self.send(Method::GET, &format!("/v1/locks/{key}"), None, None)
            .await
    }

    async fn watch(&self, key: &str) -> Reply {
        self.send(Method::GET, &format!("/v1/locks/{key}/watch"), None, None)
            .await
    }

    async fn list(&self, prefix: &str) -> Reply {
        self.send(Method::GET, &format!("/v1/locks?prefix={prefix}"), None, None)
            .await
    }
}

fn refusals(metrics: &str, client: &str, reason: &str) -> f64 {
    metric(
        metrics,
        &format!("lock_client_refusals_total{{client=\"{client}\",reason=\"{reason}\"}}"),
    )
}

/// Runs `request`, which must be refused with `status` and `code`, counted once under
/// (`client`, `reason`), with the message naming `names` and never a token, and nothing written.
async fn assert_refused<F: Future<Output = Reply>>(
    store: &Store,
    api: &Api,
    (client, reason): (&str, &str),
    (status, code, names): (StatusCode, &str, &str),
    request: F,
) {
    let before = store.state().await;
    let counted = refusals(&api.metrics().await, client, reason);
    let r = request.await;
    assert_eq!((r.status, r.code()), (status, code), "{r:?}");
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(names), "{names:?} not in {message:?}");
    for secret in [PAYMENTS, BATCH, REPORTS, STRANGER] {
        assert!(!message.contains(secret), "a token in {message:?}");
    }
    assert_eq!(store.state().await, before, "a refused request ({r:?}) wrote");
    assert_eq!(
        refusals(&api.metrics().await, client, reason),
        counted + 1.0,
        "{client}/{reason} not counted once for {r:?}"
    );
}

// ---- 401 ---------------------------------------------------------------------------------------

/// Every lock and session route of the router, without a token, with a token no client has and with
/// the admin's (which is no client's): 401, nothing written. The body is never read first: a
/// malformed one is still 401.
#[tokio::test]
async fn every_lock_and_session_route_needs_a_client_token() {
    let store = Store::postgres().await;
    let srv = store.serve(true).await;
    let anon = As::new(&srv, None);
    let session = Uuid::new_v4().to_string();
    let guarded: Vec<_> = lock_server::routes()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/sessions") || r.path.starts_with("/v1/locks"))
        .collect();
    assert_eq!(guarded.len(), 9, "{guarded:?}");
    for token in [None, Some(STRANGER), Some(ADMIN_TOKEN)] {
        let caller = As {
            token,
            ..anon.clone()
        };
        for r in &guarded {
            if token == Some(ADMIN_TOKEN) && r.method == Method::GET && !r.path.ends_with("/watch") {
                continue; // the admin's listing, as without clients, and its read of one key
            }
            let path = r
                .path
                .replace("{key}", "account:1")
                .replace("{sessionId}", &session);
            let body = (r.method == Method::POST).then(|| json!({"ownerId": "payments-1", "ttlMs": 1000}));
            assert_refused(
                &store,
                &anon.api,
                ("unknown", "unauthenticated"),
                (StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "bearer token"),
                caller.send(r.method.clone(), &path, Some(1), body),
            )
            .await;
        }
    }
    // Not a body problem first: the malformed body of an unauthenticated acquire is never read.
    let r = reply(
        anon.api
            .http
            .post(anon.api.url("/v1/locks/account:1/acquire"))
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
        "{r:?}"
    );
    // The admin token still works where it did.
    let admin = As::new(&srv, Some(ADMIN_TOKEN));
    assert_eq!(admin.list("").await.status, StatusCode::OK);
    assert_eq!(admin.read("account:1").await.body["state"], "FREE");
    let r = admin
        .send(
            Method::POST,
            "/v1/admin/locks/account:1/revoke",
            None,
            Some(json!({"operator": "ops", "reason": "check"})),
        )
        .await;
    assert_eq!(r.body["outcome"], "NOT_HELD", "{r:?}");
    srv.shutdown().await.unwrap();
}

// ---- 403, one per right ------------------------------------------------------------------------

#[tokio::test]
async fn each_right_is_enforced_and_a_refusal_writes_nothing() {
    let store = Store::postgres().await;
    let srv = store.serve(true).await;
    let api = Api::new(&srv);
    let payments = As::new(&srv, Some(PAYMENTS));
    let reports = As::new(&srv, Some(REPORTS));
    let s = payments.session("payments-1").await;
    let held = payments.acquire("account:1", s, "payments-1").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let forbidden = |names| (StatusCode::FORBIDDEN, "FORBIDDEN", names);

    // operation
    assert_refused(
        &store,
        &api,
        ("reports", "operation"),
        forbidden("\"lock\""),
        reports.open("reports-1"),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("reports", "operation"),
        forbidden("\"watch\""),
        reports.watch("account:1"),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("payments", "operation"),
        forbidden("\"list\""),
        payments.list("account:"),
    )
    .await;
    // key
    assert_refused(
        &store,
        &api,
        ("payments", "key"),
        forbidden("report:1"),
        payments.acquire("report:1", s, "payments-1"),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("payments", "key"),
        forbidden("report:1"),
        payments.read("report:1"),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("payments", "key"),
        forbidden("other:1"),
        payments.watch("other:1"),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("payments", "key"),
        forbidden("report:1"),
        payments.renew("report:1", held.token()),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("payments", "key"),
        forbidden("report:1"),
        payments.release("report:1", held.token()),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("reports", "key"),
        forbidden("prefix \"\""),
        reports.list(""),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("reports", "key"),
        forbidden("\"acc\""),
        reports.list("acc"),
    )
    .await;
    // owner
    assert_refused(
        &store,
        &api,
        ("payments", "owner"),
        forbidden("batch-1"),
        payments.open("batch-1"),
    )
    .await;
    assert_refused(
        &store,
        &api,
        ("payments", "owner"),
        forbidden("batch-1"),
        payments.acquire("account:2", s, "batch-1"),
    )
    .await;
    // session: the session was opened for another owner id of the same client
    let other = payments.session("payments-2").await;
    assert_refused(
        &store,
        &api,
        ("payments", "session"),
        forbidden("payments-2"),
        payments.acquire("account:2", other, "payments-1"),
    )
    .await;

    // What the rights allow still works.
    assert_eq!(reports.read("account:1").await.body["ownerId"], "payments-1");
    let listed = reports.list("account:").await;
    assert_eq!(listed.body["items"][0]["lockKey"], "account:1", "{listed:?}");
    assert_eq!(payments.watch("account:1").await.status, StatusCode::OK);
    assert_eq!(
        payments.renew("account:1", held.token()).await.status,
        StatusCode::OK
    );
    // A release of a grant that is gone is stale, for a client as for anyone, and writes nothing.
    let before = store.state().await;
    let stale = payments.release("account:1", held.token() + 1_000).await;
    assert_eq!(
        (stale.status, &stale.body["stale"]),
        (StatusCode::OK, &json!(true)),
        "{stale:?}"
    );
    assert_eq!(store.state().await, before);
    let gone = payments.acquire("account:3", Uuid::new_v4(), "payments-1").await;
    assert_eq!(
        (gone.status, gone.code()),
        (StatusCode::GONE, "SESSION_GONE"),
        "{gone:?}"
    );
    assert_eq!(
        store.state().await,
        before,
        "an acquire under no session drew a token"
    );
    let released = payments.release("account:1", held.token()).await;
    assert_eq!(released.body["released"], true, "{released:?}");

    // The owners read by these checks are remembered; what is remembered outlives neither its
    // session nor its grant. The released grant, whose owner the renew above read: a renew is
    // LEASE_EXPIRED and a second release stale, writing nothing. The session, whose owner every call
    // above read: once closed, a heartbeat is SESSION_GONE and an acquire under it draws no token.
    let before = store.state().await;
    let renewed = payments.renew("account:1", held.token()).await;
    assert_eq!(
        (renewed.status, renewed.code()),
        (StatusCode::GONE, "LEASE_EXPIRED"),
        "{renewed:?}"
    );
    let again = payments.release("account:1", held.token()).await;
    assert_eq!(again.body["stale"], true, "{again:?}");
    assert_eq!(
        store.state().await,
        before,
        "a gone grant's remembered owner let a write through"
    );
    assert_eq!(payments.close(s).await.body["closed"], true);
    let before = store.state().await;
    let beat = payments.heartbeat(s).await;
    assert_eq!(beat.status, StatusCode::GONE, "{beat:?}");
    let under = payments.acquire("account:4", s, "payments-1").await;
    assert_eq!(
        (under.status, under.code()),
        (StatusCode::GONE, "SESSION_GONE"),
        "{under:?}"
    );
    assert_eq!(
        store.state().await,
        before,
        "a closed session's remembered owner let a write through"
    );
    srv.shutdown().await.unwrap();
}

// ---- another client's session and grant ----------------------------------------------------------

/// What batch tries against payments' session and grant, and whether each attempt got through
/// (`true`: it succeeded against payments).
async fn attacks(store: &Store, srv: &RunningServer, attacker: &As) -> Vec<(&'static str, bool)> {
    // payments, as itself: a session and a grant. Without a clients file its token is simply ignored.
    let payments = As::new(srv, Some(PAYMENTS));
    let victim = payments.session("payments-1").await;
    let grant = payments.acquire("account:7", victim, "payments-1").await;
    assert_eq!(grant.status, StatusCode::OK, "{grant:?}");
    let token = grant.token();
    let own = attacker.session("batch-1").await;

    let mut out = Vec::new();
    let before = store.state().await;
    let r = attacker.acquire("account:8", victim, "batch-1").await;
    out.push(("acquire under payments' session", r.status == StatusCode::OK));
    let r = attacker.acquire("account:9", own, "payments-1").await;
    out.push(("acquire as payments' owner id", r.status == StatusCode::OK));
    let r = attacker.renew("account:7", token).await;
    out.push(("renew payments' grant", r.status == StatusCode::OK));
    let r = attacker.heartbeat(victim).await;
    out.push(("heartbeat payments' session", r.status == StatusCode::OK));
    let r = attacker.release("account:7", token).await;
    out.push(("release payments' grant", r.body["released"] == true));
    let r = attacker.close(victim).await;
    out.push(("close payments' session", r.body["closed"] == true));
    if out.iter().all(|(_, got_through)| !got_through) {
        assert_eq!(store.state().await, before, "refused attacks wrote");
        // payments' session and grant are intact.
        assert_eq!(payments.renew("account:7", token).await.status, StatusCode::OK);
        assert_eq!(payments.heartbeat(victim).await.status, StatusCode::OK);
        assert_eq!(payments.release("account:7", token).await.body["released"], true);
        assert_eq!(payments.close(victim).await.body["closed"], true);
    }
    out
}

async fn one_client_cannot_touch_another_clients_session_or_grant(store: Store) {
    let srv = store.serve(true).await;
    let api = Api::new(&srv);
    let before = api.metrics().await;
    let got_through = attacks(&store, &srv, &As::new(&srv, Some(BATCH))).await;
    assert!(got_through.iter().all(|(_, g)| !g), "{got_through:?}");
    let after = api.metrics().await;
    assert_eq!(
        refusals(&after, "batch", "session") - refusals(&before, "batch", "session"),
        5.0,
        "{got_through:?}"
    );
    assert_eq!(
        refusals(&after, "batch", "owner") - refusals(&before, "batch", "owner"),
        1.0
    );
    srv.shutdown().await.unwrap();

    // The negative control: the same store served without a clients file. Every attack gets
    // through, so it is the authentication that stopped them above.
    let open = store.serve(false).await;
    let got_through = attacks(&store, &open, &As::new(&open, Some(BATCH))).await;
    assert!(got_through.iter().all(|(_, g)| *g), "{got_through:?}");
    open.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_client_cannot_touch_another_clients_session_or_grant_on_postgres() {
    one_client_cannot_touch_another_clients_session_or_grant(Store::postgres().await).await;
}

#[tokio::test]
async fn one_client_cannot_touch_another_clients_session_or_grant_on_etcd() {
    one_client_cannot_touch_another_clients_session_or_grant(Store::etcd()).await;
}

// ---- the client library ------------------------------------------------------------------------

/// The allowed calls end to end through `dlock-client` with its token; the same calls without a
/// token are refused with the server's code.
#[tokio::test]
async fn allowed_calls_work_through_the_client_library_with_its_token() {
    let store = Store::postgres().await;
    let srv = store.serve(true).await;
    let client = dlock_client::LockClient::with_config(
        &srv.base_url(),
        dlock_client::ClientConfig::default().with_token(PAYMENTS),
    )
    .unwrap();
    assert!(!format!("{client:?}").contains(PAYMENTS), "{client:?}");
    let session = client
        .open_session("payments-lib", Duration::from_secs(30))
        .await
        .unwrap();
    let lock = session
        .acquire("account:lib", Duration::from_secs(30), Duration::from_secs(1))
        .await
        .unwrap();
    lock.ensure_held().unwrap();
    let status = client.lock_status("account:lib").await.unwrap();
    assert_eq!(status.fencing_token, Some(lock.token()));
    let mut watch = client.watch("account:lib").await.unwrap();
    assert!(
        matches!(watch.next().await, Ok(Some(_))),
        "the watch starts with the key's state"
    );
    lock.release().await.unwrap();
    session.close().await.unwrap();

    let anonymous = dlock_client::LockClient::new(&srv.base_url()).unwrap();
    match anonymous
        .open_session("payments-lib", Duration::from_secs(30))
        .await
    {
        Err(dlock_client::ClientError::Api { status, code, .. }) => {
            assert_eq!(
                (status, code.as_str()),
                (StatusCode::UNAUTHORIZED, "UNAUTHORIZED")
            );
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let outside = dlock_client::LockClient::with_config(
        &srv.base_url(),
        dlock_client::ClientConfig::default().with_token(PAYMENTS),
    )
    .unwrap();
    match outside.lock_status("report:1").await {
        Err(dlock_client::ClientError::Api {
            status,
            code,
            message,
        }) => {
            assert_eq!((status, code.as_str()), (StatusCode::FORBIDDEN, "FORBIDDEN"));
            assert!(message.contains("report:1"), "{message}");
        }
        other => panic!("expected 403, got {other:?}"),
    }
    srv.shutdown().await.unwrap();
}
