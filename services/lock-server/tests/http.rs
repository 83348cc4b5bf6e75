//! docs/lock-api.md over HTTP: the server runs in-process on 127.0.0.1:0 against a real PostgreSQL 16
//! lockdb (as lockapp), driven with reqwest.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

async fn setup() -> (Db, lock_server::RunningServer, Api) {
    let db = lockdb().await;
    let srv = server(&db.db).await;
    let api = Api::new(&srv);
    (db, srv, api)
}

// ---- acquire -----------------------------------------------------------------------------------

#[tokio::test]
async fn acquire_grants_a_free_key_with_a_lock_grant_body() {
    let (db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let r = api.acquire("account:42", s, "w1", LONG_TTL_MS).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["lockKey"], "account:42");
    assert_eq!(r.body["ownerId"], "w1");
    assert_eq!(r.body["sessionId"], json!(s));
    assert!(r.token() > 0);
    for f in ["acquiredAt", "expiresAt"] {
        let t = r.body[f].as_str().unwrap();
        assert!(chrono::DateTime::parse_from_rfc3339(t).is_ok(), "{f}: {t}");
    }
    assert_eq!(
        entry(&db.app, "account:42").await.unwrap().fencing_token,
        r.token()
    );
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn acquire_takeover_reentry_and_contention() {
    let (db, srv, api) = setup().await;
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;

    // Takeover of a genuinely expired lease: strictly higher token.
    let t1 = api.acquire("k", s1, "w1", SHORT_TTL_MS).await.token();
    await_lease_lapsed(&db.admin, "k").await;
    let t2 = api.acquire("k", s2, "w2", LONG_TTL_MS).await.token();
    assert!(t2 > t1);

    // Same-session re-entry: GRANTED with a new, higher token.
    let t3 = api.acquire("k", s2, "w2", LONG_TTL_MS).await.token();
    assert!(t3 > t2);

    // Contended: 409, and the holder's session id is not revealed.
    let before = snapshot(&db.admin).await;
    let r = api.acquire("k", s1, "w1", LONG_TTL_MS).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "CONTENDED"), "{r:?}");
    let text = r.body.to_string();
    assert!(!text.contains(&s2.to_string()), "holder's session leaked: {text}");
    let after = snapshot(&db.admin).await;
    assert_eq!(after.entries, before.entries);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn acquire_with_an_unknown_session_is_410_session_gone_not_500() {
    let (db, srv, api) = setup().await;
    let r = api.acquire("k", Uuid::new_v4(), "w1", LONG_TTL_MS).await;
    assert_eq!((r.status, r.code()), (StatusCode::GONE, "SESSION_GONE"), "{r:?}");
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, 0);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn keys_with_slashes_and_spaces_round_trip_percent_encoded() {
    let (db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let r = api
        .acquire("tenant%2Faccount%3A7%20x", s, "w1", LONG_TTL_MS)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["lockKey"], "tenant/account:7 x");
    assert!(entry(&db.app, "tenant/account:7 x").await.is_some());
    let v = api.get("/v1/locks/tenant%2Faccount%3A7%20x").await;
    assert_eq!(v.body["state"], "HELD");
    srv.shutdown().await.unwrap();
}

// ---- renew / release / heartbeat ---------------------------------------------------------------

#[tokio::test]
async fn renew_extends_a_live_lease() {
    let (_db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let g = api.acquire("k", s, "w1", 30_000).await;
    let r = api.renew("k", g.token(), LONG_TTL_MS).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["lockKey"], "k");
    assert_eq!(r.token(), g.token());
    let old: chrono::DateTime<chrono::Utc> = g.body["expiresAt"].as_str().unwrap().parse().unwrap();
    let new: chrono::DateTime<chrono::Utc> = r.body["expiresAt"].as_str().unwrap().parse().unwrap();
    assert!(new > old);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn renew_after_lapse_is_lease_expired_counts_session_lost_and_does_not_resurrect() {
    let (db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let t = api.acquire("k", s, "w1", SHORT_TTL_MS).await.token();
    await_lease_lapsed(&db.admin, "k").await;
    let before = entry(&db.app, "k").await.unwrap();
    assert_eq!(metric(&api.metrics().await, "lock_session_lost_total"), 0.0);

    let r = api.renew("k", t, LONG_TTL_MS).await;
    assert_eq!((r.status, r.code()), (StatusCode::GONE, "LEASE_EXPIRED"), "{r:?}");
    assert_eq!(
        entry(&db.app, "k").await.unwrap(),
        before,
        "the lapsed row was not touched"
    );
    assert_eq!(api.get("/v1/locks/k").await.body["state"], "EXPIRED");
    assert_eq!(metric(&api.metrics().await, "lock_session_lost_total"), 1.0);
    assert_eq!(srv.state().metrics().session_lost.get(), 1);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn release_then_stale_release_is_200_stale_true() {
    let (db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let t = api.acquire("k", s, "w1", LONG_TTL_MS).await.token();
    let r = api.release("k", t).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.body,
        json!({"lockKey": "k", "fencingToken": t, "released": true, "stale": false})
    );
    assert!(entry(&db.app, "k").await.is_none());
    let r = api.release("k", t).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.body,
        json!({"lockKey": "k", "fencingToken": t, "released": false, "stale": true})
    );
    let m = api.metrics().await;
    assert_eq!(metric(&m, "lock_release_total{stale=\"false\"}"), 1.0);
    assert_eq!(metric(&m, "lock_release_total{stale=\"true\"}"), 1.0);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn heartbeat_extends_then_is_session_gone_once_reaped() {
    let (db, srv, api) = setup().await;
    let s = api.open_session("w1", SHORT_TTL_MS).await;
    let r = api.heartbeat(s, LONG_TTL_MS).await;
    // The 50 ms session may already have lapsed on a slow machine; both outcomes are legal here.
    if r.status == StatusCode::OK {
        assert_eq!(r.body["sessionId"], json!(s));
    }
    let s = api.open_session("w2", SHORT_TTL_MS).await;
    await_session_lapsed(&db.admin, s).await;
    assert_eq!(lock_server::reaper::reap_once(srv.state()).await.unwrap(), 1);
    let lost_before = srv.state().metrics().session_lost.get();
    let r = api.heartbeat(s, LONG_TTL_MS).await;
    assert_eq!((r.status, r.code()), (StatusCode::GONE, "SESSION_GONE"), "{r:?}");
    assert_eq!(srv.state().metrics().session_lost.get(), lost_before + 1);

    let live = api.open_session("w3", LONG_TTL_MS).await;
    let r = api.heartbeat(live, LONG_TTL_MS).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["sessionId"], json!(live));
    srv.shutdown().await.unwrap();
}

// ---- tokens ------------------------------------------------------------------------------------

#[tokio::test]
async fn tokens_strictly_increase_across_release_and_reacquire_and_across_keys() {
    let (_db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let mut last = 0;
    for i in 0..12 {
        let key = ["a", "b", "a", "c"][i % 4];
        let t = api.acquire(key, s, "w1", LONG_TTL_MS).await.token();
        assert!(t > last, "token {t} after {last}");
        assert_eq!(api.release(key, t).await.body["released"], true);
        last = t;
    }
    srv.shutdown().await.unwrap();
}

// ---- sessions, cascade, reaper -----------------------------------------------------------------

#[tokio::test]
async fn closing_a_session_cascades_to_its_locks() {
    let (db, srv, api) = setup().await;
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let t = api.acquire("a", s, "w1", LONG_TTL_MS).await.token();
    api.acquire("b", s, "w1", LONG_TTL_MS).await.token();
    let r = api.close_session(s).await;
    assert_eq!(r.body, json!({"sessionId": s, "closed": true}));
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        api.get("/v1/locks/a").await.body,
        json!({"lockKey": "a", "state": "FREE"})
    );
    let r = api.close_session(s).await;
    assert_eq!(r.body, json!({"sessionId": s, "closed": false}));
    // The void handle: renew fails, release is stale.
    assert_eq!(api.renew("a", t, LONG_TTL_MS).await.code(), "LEASE_EXPIRED");
    assert_eq!(api.release("a", t).await.body["stale"], true);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_reaper_task_deletes_expired_sessions_and_their_locks() {
    let db = lockdb().await;
    let srv = lock_server::spawn(config(&db.db).with_reaper_interval(Some(Duration::from_millis(20))))
        .await
        .unwrap();
    let api = Api::new(&srv);
    let short = api.open_session("w1", SHORT_TTL_MS).await;
    let long = api.open_session("w2", LONG_TTL_MS).await;
    // The session may be reaped before the acquire on a slow machine; then acquire says SESSION_GONE.
    let a = api.acquire("a", short, "w1", LONG_TTL_MS).await;
    assert!(a.status == StatusCode::OK || a.code() == "SESSION_GONE", "{a:?}");
    let kept = api.acquire("b", long, "w2", LONG_TTL_MS).await.token();
    await_session_deleted(&db.admin, short).await;
    assert!(entry(&db.app, "a").await.is_none());
    assert_eq!(entry(&db.app, "b").await.unwrap().fencing_token, kept);
    assert!(metric(&api.metrics().await, "lock_reaper_sessions_deleted_total") >= 1.0);
    srv.shutdown().await.unwrap();
}

// ---- concurrency -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_http_acquirers_get_exactly_one_grant() {
    let (db, srv, api) = setup().await;
    let mut sessions = Vec::new();
    for i in 0..32 {
        sessions.push(api.open_session(&format!("w{i}"), LONG_TTL_MS).await);
    }
    let replies = join_all(sessions.iter().enumerate().map(|(i, s)| {
        let api = api.clone();
        let s = *s;
        async move { api.acquire("hot", s, &format!("w{i}"), LONG_TTL_MS).await }
    }))
    .await;
    let granted: Vec<_> = replies.iter().filter(|r| r.status == StatusCode::OK).collect();
    let contended = replies.iter().filter(|r| r.code() == "CONTENDED").count();
    assert_eq!(granted.len(), 1, "{replies:?}");
    assert_eq!(contended, 31, "{replies:?}");
    let row = entry(&db.app, "hot").await.unwrap();
    assert_eq!(row.fencing_token, granted[0].token());
    let m = api.metrics().await;
    assert_eq!(metric(&m, "lock_acquire_total{result=\"granted\"}"), 1.0);
    assert_eq!(metric(&m, "lock_acquire_total{result=\"contended\"}"), 31.0);
    srv.shutdown().await.unwrap();
}

// ---- the two-worker pause-and-return at the lock level -----------------------------------------

#[tokio::test]
async fn pause_and_return_the_returning_holder_changes_nothing() {
    let (db, srv, api) = setup().await;
    scenario_pause_and_return(&api, &db.admin, "account:7")
        .await
        .unwrap();
    srv.shutdown().await.unwrap();
}

// ---- force-revoke ------------------------------------------------------------------------------

#[tokio::test]
async fn force_revoke_requires_the_bearer_token_and_reports_the_outcome() {
    let (db, srv, api) = setup().await;
    let body = json!({"operator": "alice", "reason": "stuck payout", "requestId": "req-1"});
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let t = api.acquire("account:9", s, "w1", LONG_TTL_MS).await.token();

    for bearer in [None, Some("wrong"), Some("test-admin-token-7f3"), Some("")] {
        let r = api.revoke("account:9", bearer, body.clone()).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            "{bearer:?}"
        );
    }
    let r = reply(
        api.http
            .post(api.url("/v1/admin/locks/account:9/revoke"))
            .header("Authorization", format!("Basic {ADMIN_TOKEN}"))
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 0);
    assert_eq!(entry(&db.app, "account:9").await.unwrap().fencing_token, t);

    let r = api.revoke("account:9", Some(ADMIN_TOKEN), body.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        r.body,
        json!({"outcome": "REVOKED", "lockKey": "account:9", "previousOwner": "w1",
               "previousToken": t, "requestId": "req-1"})
    );
    let audit: (String, String, i64, String, String) =
        sqlx::query_as("SELECT lock_key, prev_owner, prev_token, operator, reason FROM lock_revocation")
            .fetch_one(&db.app)
            .await
            .unwrap();
    assert_eq!(
        audit,
        (
            "account:9".into(),
            "w1".into(),
            t,
            "alice".into(),
            "stuck payout".into()
        )
    );

    // The revoked holder's renew fails.
    assert_eq!(
        api.renew("account:9", t, LONG_TTL_MS).await.code(),
        "LEASE_EXPIRED"
    );

    // NOT_HELD when free; nothing appended.
    let r = api.revoke("account:9", Some(ADMIN_TOKEN), body.clone()).await;
    assert_eq!(
        r.body,
        json!({"outcome": "NOT_HELD", "lockKey": "account:9", "requestId": "req-1"})
    );
    let r = api
        .revoke(
            "never",
            Some(ADMIN_TOKEN),
            json!({"operator": "a", "reason": "r"}),
        )
        .await;
    assert_eq!(r.body, json!({"outcome": "NOT_HELD", "lockKey": "never"}));
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 1);

    let m = api.metrics().await;
    assert_eq!(metric(&m, "lock_revoke_total{outcome=\"revoked\"}"), 1.0);
    assert_eq!(metric(&m, "lock_revoke_total{outcome=\"not_held\"}"), 2.0);
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn force_revoke_pinned_to_a_token_answers_each_outcome() {
    let (db, srv, api) = setup().await;
    let admin = Some(ADMIN_TOKEN);
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let t1 = api.acquire("account:4", s1, "w1", LONG_TTL_MS).await.token();
    let body = |token: i64| json!({"operator": "alice", "reason": "stuck", "fencingToken": token});

    let r = api.revoke("account:4", admin, body(t1 + 500)).await;
    assert_eq!(
        r.body,
        json!({"outcome": "HELD_BY_OTHER_TOKEN", "lockKey": "account:4", "currentToken": t1})
    );
    let r = api.revoke("account:4", admin, body(t1)).await;
    assert_eq!(
        r.body,
        json!({"outcome": "REVOKED", "lockKey": "account:4", "previousOwner": "w1", "previousToken": t1})
    );
    // The retry of the same request, after a newer holder took the key: it is left alone.
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let t2 = api.acquire("account:4", s2, "w2", LONG_TTL_MS).await.token();
    let r = api.revoke("account:4", admin, body(t1)).await;
    assert_eq!(
        r.body,
        json!({"outcome": "ALREADY_REVOKED", "lockKey": "account:4", "previousOwner": "w1", "previousToken": t1})
    );
    assert_eq!(entry(&db.app, "account:4").await.unwrap().fencing_token, t2);
    assert_eq!(
        api.renew("account:4", t2, LONG_TTL_MS).await.status,
        StatusCode::OK
    );
    // A decimal string is the same token; a free key is NOT_HELD.
    let r = api
        .revoke(
            "free",
            admin,
            json!({"operator": "a", "reason": "r", "fencingToken": "12"}),
        )
        .await;
    assert_eq!(r.body, json!({"outcome": "NOT_HELD", "lockKey": "free"}));
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 1);

    let m = api.metrics().await;
    for (outcome, n) in [
        ("revoked", 1.0),
        ("already_revoked", 1.0),
        ("held_by_other_token", 1.0),
        ("not_held", 1.0),
    ] {
        assert_eq!(
            metric(&m, &format!("lock_revoke_total{{outcome=\"{outcome}\"}}")),
            n,
            "{outcome}"
        );
    }
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn force_revoke_without_a_configured_token_is_403_admin_disabled() {
    let db = lockdb().await;
    let mut cfg = config(&db.db);
    cfg.admin_token = None;
    let srv = lock_server::spawn(cfg).await.unwrap();
    let api = Api::new(&srv);
    let s = api.open_session("w1", LONG_TTL_MS).await;
    api.acquire("k", s, "w1", LONG_TTL_MS).await.token();
    for bearer in [None, Some(ADMIN_TOKEN), Some("")] {
        let r = api
            .revoke("k", bearer, json!({"operator": "a", "reason": "r"}))
            .await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::FORBIDDEN, "ADMIN_DISABLED"),
            "{r:?}"
        );
    }
    assert!(entry(&db.app, "k").await.is_some());
    srv.shutdown().await.unwrap();
}

// ---- read, health, metrics ---------------------------------------------------------------------

#[tokio::test]
async fn read_reports_free_held_and_expired_without_the_session_id() {
    let (db, srv, api) = setup().await;
    assert_eq!(
        api.get("/v1/locks/k").await.body,
        json!({"lockKey": "k", "state": "FREE"})
    );
    let s = api.open_session("w1", LONG_TTL_MS).await;
    let t = api.acquire("k", s, "w1", LONG_TTL_MS).await.token();
    let v = api.get("/v1/locks/k").await;
    assert_eq!(
        (v.body["state"].as_str(), v.body["fencingToken"].as_i64()),
        (Some("HELD"), Some(t))
    );
    assert_eq!(v.body["ownerId"], "w1");
    assert!(v.body.get("sessionId").is_none());
    let t2 = api.acquire("e", s, "w1", SHORT_TTL_MS).await.token();
    await_lease_lapsed(&db.admin, "e").await;
    let v = api.get("/v1/locks/e").await;
    assert_eq!(
        (v.body["state"].as_str(), v.body["fencingToken"].as_i64()),
        (Some("EXPIRED"), Some(t2))
    );
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn healthz_readyz_metrics_and_openapi_are_served() {
    let (_db, srv, api) = setup().await;
    let h = api.http.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(
        (h.status(), h.text().await.unwrap().as_str()),
        (StatusCode::OK, "ok")
    );
    let r = api.http.get(api.url("/readyz")).send().await.unwrap();
    assert_eq!(
        (r.status(), r.text().await.unwrap().as_str()),
        (StatusCode::OK, "ready")
    );
    let o = api.http.get(api.url("/openapi.yaml")).send().await.unwrap();
    assert_eq!(o.status(), StatusCode::OK);
    assert!(o.text().await.unwrap().starts_with("openapi: 3.1"));

    let s = api.open_session("w1", LONG_TTL_MS).await;
    api.acquire("k", s, "w1", LONG_TTL_MS).await.token();
    api.acquire("k", api.open_session("w2", LONG_TTL_MS).await, "w2", LONG_TTL_MS)
        .await;
    let m = api.metrics().await;
    assert_eq!(metric(&m, "lock_acquire_total{result=\"granted\"}"), 1.0);
    assert_eq!(metric(&m, "lock_acquire_total{result=\"contended\"}"), 1.0);
    assert_eq!(metric(&m, "lock_session_lost_total"), 0.0);
    assert_eq!(metric(&m, "lock_reaper_sessions_deleted_total"), 0.0);
    // The histogram is labelled by route template, never by the raw path (which holds the key).
    let acquire_count = "http_request_duration_seconds_count{method=\"POST\",route=\"/v1/locks/{key}/acquire\",status=\"200\"}";
    assert_eq!(metric(&m, acquire_count), 1.0);
    assert!(
        !m.contains("route=\"/v1/locks/k/"),
        "raw path used as a label:\n{m}"
    );
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn readyz_is_503_when_lockdb_does_not_answer() {
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = lock_server::Config::new(format!("postgres://lockapp@127.0.0.1:{port}/lockdb"));
    cfg.pool_acquire_timeout = Duration::from_millis(500);
    cfg.reaper_interval = None;
    let srv = lock_server::spawn(cfg).await.unwrap();
    let api = Api::new(&srv);
    let r = api.get("/readyz").await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        "{r:?}"
    );
    assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
    // A request that needs the database is 503 too, not 500.
    let r = api
        .post_json("/v1/sessions", json!({"ownerId": "w", "ttlMs": 1000}))
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        "{r:?}"
    );
    srv.shutdown().await.unwrap();
}

/// A pinned revoke's `fencingToken` is read as every integer field is: `T.0` and `Te0` are T (JSON
/// Schema integers); a bad value says what is wrong, not a parser's internals.
#[tokio::test]
async fn a_revoke_token_written_as_an_integral_number_is_that_token() {
    let (_db, srv, api) = setup().await;
    let s = api.open_session("w", LONG_TTL_MS).await;
    for (key, spelling) in [("k1", ".0"), ("k2", "e0"), ("k3", "0e-1")] {
        let t = api.acquire(key, s, "w", LONG_TTL_MS).await.token();
        let text = if spelling == "0e-1" {
            format!("{t}0e-1")
        } else {
            format!("{t}{spelling}")
        };
        let resp = api
            .http
            .post(api.url(&format!("/v1/admin/locks/{key}/revoke")))
            .bearer_auth(ADMIN_TOKEN)
            .header("Content-Type", "application/json")
            .body(format!(
                r#"{{"operator": "ops", "reason": "stuck", "fencingToken": {text}}}"#
            ))
            .send()
            .await
            .unwrap();
        let r = reply(resp).await;
        assert_eq!(r.status, StatusCode::OK, "{text}: {r:?}");
        assert_eq!(r.body["outcome"], "REVOKED", "{text}: {r:?}");
        assert_eq!(r.body["previousToken"], json!(t));
    }
    let r = api
        .revoke(
            "k1",
            Some(ADMIN_TOKEN),
            json!({"operator": "ops", "reason": "r", "fencingToken": 1.5}),
        )
        .await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "INVALID_TOKEN"));
    let message = r.body["message"].as_str().unwrap();
    assert!(
        message.contains("fencingToken must be an integer") && message.contains("1.5"),
        "{message}"
    );
    assert!(!message.contains("untagged"), "{message}");
    srv.shutdown().await.unwrap();
}
