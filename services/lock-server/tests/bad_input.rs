//! Bad input on every endpoint: each case gets its 4xx status and machine-readable code (never a
//! 500), and lockdb is unchanged afterwards — rows and the fencing sequence's position.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// One bad request and what it must get.
struct Case {
    name: &'static str,
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    /// Sent as-is with `Content-Type: application/json` unless `content_type` says otherwise.
    body: Option<String>,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
}

fn case(
    name: &'static str,
    method: Method,
    path: impl Into<String>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        name,
        method,
        path: path.into(),
        headers: Vec::new(),
        body: None,
        content_type: Some("application/json"),
        status,
        code,
    }
}

impl Case {
    fn body(mut self, body: impl Into<String>) -> Self {
        self.body = Some(body.into());
        self
    }
    fn json(self, v: Value) -> Self {
        self.body(v.to_string())
    }
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    fn content_type(mut self, ct: Option<&'static str>) -> Self {
        self.content_type = ct;
        self
    }
}

async fn send(api: &Api, c: &Case) -> Reply {
    let mut req = api.http.request(c.method.clone(), api.url(&c.path));
    if let Some(ct) = c.content_type {
        req = req.header("Content-Type", ct);
    }
    for (k, v) in &c.headers {
        req = req.header(*k, v.as_str());
    }
    if let Some(b) = &c.body {
        req = req.body(b.clone());
    }
    reply(req.send().await.unwrap()).await
}

fn token_cases(name: &'static str, path: &str, body: Option<&str>) -> Vec<Case> {
    let mut cases = Vec::new();
    let with_body = |c: Case| match body {
        Some(b) => c.body(b),
        None => c,
    };
    cases.push(with_body(case(name, Method::POST, path, 400, "INVALID_TOKEN")));
    for bad in [
        "",
        "abc",
        "0",
        "000",
        "-1",
        "-9223372036854775808",
        "9223372036854775808",
        "99999999999999999999999",
        "+1",
        "1.0",
        "1e3",
        "0x10",
        "1,2",
    ] {
        cases.push(with_body(
            case(name, Method::POST, path, 400, "INVALID_TOKEN").header("X-Fencing-Token", bad),
        ));
    }
    cases
}

#[tokio::test]
async fn every_bad_input_is_a_4xx_with_a_code_and_writes_nothing() {
    let db = lockdb().await;
    let srv = server(&db.db).await;
    let api = Api::new(&srv);

    // Something to aim at: a live session holding a live lock.
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let t = api.acquire("k", s, "holder", LONG_TTL_MS).await.token();
    let ok_acquire = json!({"sessionId": s, "ownerId": "w", "ttlMs": 1000});
    let long_key = "k".repeat(257);
    let long_owner = "o".repeat(129);

    let mut cases = vec![
        // POST /v1/sessions
        case(
            "session: no content type",
            Method::POST,
            "/v1/sessions",
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        )
        .content_type(None)
        .json(json!({"ownerId": "w", "ttlMs": 1000})),
        case(
            "session: text/plain",
            Method::POST,
            "/v1/sessions",
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        )
        .content_type(Some("text/plain"))
        .json(json!({"ownerId": "w", "ttlMs": 1000})),
        case(
            "session: no body",
            Method::POST,
            "/v1/sessions",
            400,
            "MALFORMED_JSON",
        ),
        case(
            "session: truncated JSON",
            Method::POST,
            "/v1/sessions",
            400,
            "MALFORMED_JSON",
        )
        .body("{"),
        case(
            "session: not JSON",
            Method::POST,
            "/v1/sessions",
            400,
            "MALFORMED_JSON",
        )
        .body("ownerId=w"),
        case(
            "session: array",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .body("[]"),
        case(
            "session: null",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .body("null"),
        case(
            "session: missing ttlMs",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ownerId": "w"})),
        case(
            "session: missing ownerId",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ttlMs": 1000})),
        case(
            "session: ttl as string",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ownerId": "w", "ttlMs": "1000"})),
        case(
            "session: ttl fractional",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .body(r#"{"ownerId":"w","ttlMs":1.5}"#),
        case(
            "session: ttl 1e30",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .body(r#"{"ownerId":"w","ttlMs":1e30}"#),
        case(
            "session: ttl > i64",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .body(r#"{"ownerId":"w","ttlMs":9223372036854775808}"#),
        case(
            "session: unknown field",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ownerId": "w", "ttlMs": 1000, "expiresAt": "2030-01-01T00:00:00Z"})),
        case(
            "session: owner as number",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ownerId": 7, "ttlMs": 1000})),
        case(
            "session: empty owner",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_OWNER_ID",
        )
        .json(json!({"ownerId": "", "ttlMs": 1000})),
        case(
            "session: owner leading space",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_OWNER_ID",
        )
        .json(json!({"ownerId": " w", "ttlMs": 1000})),
        case(
            "session: owner newline",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_OWNER_ID",
        )
        .json(json!({"ownerId": "a\nb", "ttlMs": 1000})),
        case(
            "session: owner NUL",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_OWNER_ID",
        )
        .json(json!({"ownerId": "a\u{0}b", "ttlMs": 1000})),
        case(
            "session: owner too long",
            Method::POST,
            "/v1/sessions",
            400,
            "INVALID_OWNER_ID",
        )
        .json(json!({"ownerId": long_owner, "ttlMs": 1000})),
        case(
            "session: body too large",
            Method::POST,
            "/v1/sessions",
            400,
            "MALFORMED_JSON",
        )
        .json(json!({"ownerId": "w".repeat(100_000), "ttlMs": 1000})),
        // POST /v1/sessions/{id}/heartbeat
        case(
            "heartbeat: bad uuid",
            Method::POST,
            "/v1/sessions/not-a-uuid/heartbeat",
            400,
            "INVALID_PATH",
        )
        .json(json!({"ttlMs": 1000})),
        case(
            "heartbeat: ttl 9",
            Method::POST,
            format!("/v1/sessions/{s}/heartbeat"),
            400,
            "INVALID_TTL",
        )
        .json(json!({"ttlMs": 9})),
        case(
            "heartbeat: ttl negative",
            Method::POST,
            format!("/v1/sessions/{s}/heartbeat"),
            400,
            "INVALID_TTL",
        )
        .json(json!({"ttlMs": -1000})),
        case(
            "heartbeat: no body",
            Method::POST,
            format!("/v1/sessions/{s}/heartbeat"),
            400,
            "MALFORMED_JSON",
        ),
        case(
            "heartbeat: unknown field",
            Method::POST,
            format!("/v1/sessions/{s}/heartbeat"),
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ttlMs": 1000, "sessionId": s})),
        // DELETE /v1/sessions/{id}
        case(
            "close: bad uuid",
            Method::DELETE,
            "/v1/sessions/nope",
            400,
            "INVALID_PATH",
        ),
        case(
            "close: uuid with suffix",
            Method::DELETE,
            format!("/v1/sessions/{s}x"),
            400,
            "INVALID_PATH",
        ),
        // POST /v1/locks/{key}/acquire
        case(
            "acquire: key too long",
            Method::POST,
            format!("/v1/locks/{long_key}/acquire"),
            400,
            "INVALID_LOCK_KEY",
        )
        .json(ok_acquire.clone()),
        case(
            "acquire: key newline",
            Method::POST,
            "/v1/locks/a%0Ab/acquire",
            400,
            "INVALID_LOCK_KEY",
        )
        .json(ok_acquire.clone()),
        case(
            "acquire: key leading space",
            Method::POST,
            "/v1/locks/%20a/acquire",
            400,
            "INVALID_LOCK_KEY",
        )
        .json(ok_acquire.clone()),
        case(
            "acquire: key NUL",
            Method::POST,
            "/v1/locks/a%00/acquire",
            400,
            "INVALID_LOCK_KEY",
        )
        .json(ok_acquire.clone()),
        case(
            "acquire: key not UTF-8",
            Method::POST,
            "/v1/locks/%FF/acquire",
            400,
            "INVALID_PATH",
        )
        .json(ok_acquire.clone()),
        case(
            "acquire: empty key",
            Method::POST,
            "/v1/locks//acquire",
            400,
            "INVALID_LOCK_KEY",
        )
        .json(ok_acquire.clone()),
        case(
            "acquire: session not a uuid",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"sessionId": "nope", "ownerId": "w", "ttlMs": 1000})),
        case(
            "acquire: missing session",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"ownerId": "w", "ttlMs": 1000})),
        case(
            "acquire: empty owner",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_OWNER_ID",
        )
        .json(json!({"sessionId": s, "ownerId": "", "ttlMs": 1000})),
        case(
            "acquire: ttl 0",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_TTL",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 0})),
        case(
            "acquire: ttl above a day",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_TTL",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 86_400_001})),
        case(
            "acquire: ttl i64::MAX",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_TTL",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": i64::MAX})),
        case(
            "acquire: client-sent token",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 1000, "fencingToken": 99})),
        case(
            "acquire: malformed",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "MALFORMED_JSON",
        )
        .body(r#"{"ttlMs": 10"#),
        // renew: bad key, bad ttl with a valid token (must not extend the lease)
        case(
            "renew: bad key",
            Method::POST,
            "/v1/locks/%0A/renew",
            400,
            "INVALID_LOCK_KEY",
        )
        .header("X-Fencing-Token", t.to_string())
        .json(json!({"ttlMs": 1000})),
        case(
            "renew: ttl 0 with the valid token",
            Method::POST,
            "/v1/locks/k/renew",
            400,
            "INVALID_TTL",
        )
        .header("X-Fencing-Token", t.to_string())
        .json(json!({"ttlMs": 0})),
        case(
            "renew: no body",
            Method::POST,
            "/v1/locks/k/renew",
            400,
            "MALFORMED_JSON",
        )
        .header("X-Fencing-Token", t.to_string()),
        // release: bad key
        case(
            "release: bad key",
            Method::POST,
            "/v1/locks/%20k/release",
            400,
            "INVALID_LOCK_KEY",
        )
        .header("X-Fencing-Token", t.to_string()),
        // GET /v1/locks/{key}
        case(
            "read: bad key",
            Method::GET,
            "/v1/locks/a%09b",
            400,
            "INVALID_LOCK_KEY",
        ),
        // admin revoke
        case(
            "revoke: no auth",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            401,
            "UNAUTHORIZED",
        )
        .json(json!({"operator": "a", "reason": "r"})),
        case(
            "revoke: wrong token",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            401,
            "UNAUTHORIZED",
        )
        .header("Authorization", "Bearer nope")
        .json(json!({"operator": "a", "reason": "r"})),
        case(
            "revoke: token as Basic",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            401,
            "UNAUTHORIZED",
        )
        .header("Authorization", format!("Basic {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r"})),
        case(
            "revoke: no space after scheme",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            401,
            "UNAUTHORIZED",
        )
        .header("Authorization", format!("Bearer{ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r"})),
        case(
            "revoke: no auth, bad body",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            401,
            "UNAUTHORIZED",
        )
        .body("{"),
        case(
            "revoke: token with a suffix",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            401,
            "UNAUTHORIZED",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}x"))
        .json(json!({"operator": "a", "reason": "r"})),
        case(
            "revoke: malformed",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "MALFORMED_JSON",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body("{"),
        case(
            "revoke: empty operator",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_FIELD",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "", "reason": "r"})),
        case(
            "revoke: blank reason",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_FIELD",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "  "})),
        case(
            "revoke: reason too long",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_FIELD",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r".repeat(1025)})),
        case(
            "revoke: missing reason",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_FIELD",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a"})),
        case(
            "revoke: bad request id",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_FIELD",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "requestId": ""})),
        case(
            "revoke: fencingToken zero",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": 0})),
        case(
            "revoke: fencingToken negative",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": -5})),
        case(
            "revoke: fencingToken fractional",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": 1.5})),
        case(
            "revoke: fencingToken null",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": null})),
        case(
            "revoke: fencingToken not a number",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": "abc"})),
        case(
            "revoke: fencingToken overflowing",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": "9223372036854775808"})),
        case(
            "revoke: fencingToken an object",
            Method::POST,
            "/v1/admin/locks/k/revoke",
            400,
            "INVALID_TOKEN",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r", "fencingToken": {"t": 1}})),
        case(
            "acquire: waitMs negative",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_WAIT",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 1000, "waitMs": -1})),
        case(
            "acquire: waitMs past the longest wait",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_WAIT",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 1000, "waitMs": 60_001})),
        case(
            "acquire: waitMs fractional",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 1000, "waitMs": 1.5})),
        case(
            "acquire: waitMs null",
            Method::POST,
            "/v1/locks/k2/acquire",
            400,
            "INVALID_FIELD",
        )
        .json(json!({"sessionId": s, "ownerId": "w", "ttlMs": 1000, "waitMs": null})),
        case("list: no bearer", Method::GET, "/v1/locks", 401, "UNAUTHORIZED"),
        case(
            "list: limit 0",
            Method::GET,
            "/v1/locks?limit=0",
            400,
            "INVALID_LIMIT",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        case(
            "list: limit 501",
            Method::GET,
            "/v1/locks?limit=501",
            400,
            "INVALID_LIMIT",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        case(
            "list: limit text",
            Method::GET,
            "/v1/locks?limit=x",
            400,
            "INVALID_QUERY",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        case(
            "list: unknown parameter",
            Method::GET,
            "/v1/locks?pfx=a",
            400,
            "INVALID_QUERY",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        case(
            "list: prefix with a control character",
            Method::GET,
            "/v1/locks?prefix=a%0A",
            400,
            "INVALID_PREFIX",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        case(
            "list: cursor not a key",
            Method::GET,
            "/v1/locks?after=%20a",
            400,
            "INVALID_CURSOR",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}")),
        case(
            "watch: key with a control character",
            Method::GET,
            "/v1/locks/a%0A/watch",
            400,
            "INVALID_LOCK_KEY",
        ),
        case(
            "revoke: bad key",
            Method::POST,
            "/v1/admin/locks/%0A/revoke",
            400,
            "INVALID_LOCK_KEY",
        )
        .header("Authorization", format!("Bearer {ADMIN_TOKEN}"))
        .json(json!({"operator": "a", "reason": "r"})),
        // routing
        case("unknown route", Method::GET, "/v1/nope", 404, "NOT_FOUND"),
        case("unknown root", Method::POST, "/", 404, "NOT_FOUND"),
        case(
            "wrong method",
            Method::GET,
            "/v1/locks/k/acquire",
            405,
            "METHOD_NOT_ALLOWED",
        ),
        case(
            "wrong method on sessions",
            Method::PUT,
            "/v1/sessions",
            405,
            "METHOD_NOT_ALLOWED",
        ),
        case(
            "wrong method on a lock",
            Method::DELETE,
            "/v1/locks/k",
            405,
            "METHOD_NOT_ALLOWED",
        ),
    ];
    cases.extend(token_cases(
        "renew: bad token",
        "/v1/locks/k/renew",
        Some(r#"{"ttlMs":1000}"#),
    ));
    cases.extend(token_cases("release: bad token", "/v1/locks/k/release", None));

    let before = snapshot(&db.admin).await;
    let mut failures = Vec::new();
    for c in &cases {
        let r = send(&api, c).await;
        let has_message = r.body["message"].as_str().is_some_and(|m| !m.is_empty());
        if r.status.as_u16() != c.status || r.code() != c.code || !has_message {
            failures.push(format!(
                "{} ({} {} {:?}): expected {} {}, got {r:?}",
                c.name, c.method, c.path, c.headers, c.status, c.code
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let after = snapshot(&db.admin).await;
    assert_eq!(after, before, "a rejected request wrote to lockdb");

    // The holder's grant is still good (nothing was renewed, released or revoked).
    let r = api.renew("k", t, LONG_TTL_MS).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    srv.shutdown().await.unwrap();
}

/// An acquire naming an unknown session reaches the database (the foreign key is the check), so the
/// sequence may move (nextval in VALUES is consumed on failure, C1 Warning 1); no row may appear.
#[tokio::test]
async fn unknown_session_on_acquire_is_410_and_writes_no_row() {
    let db = lockdb().await;
    let srv = server(&db.db).await;
    let api = Api::new(&srv);
    let before = snapshot(&db.admin).await;
    let r = api.acquire("k", uuid::Uuid::new_v4(), "w", 1000).await;
    assert_eq!((r.status, r.code()), (StatusCode::GONE, "SESSION_GONE"), "{r:?}");
    let after = snapshot(&db.admin).await;
    assert_eq!(
        (&after.sessions, &after.entries, &after.revocations),
        (&before.sessions, &before.entries, &before.revocations)
    );
    srv.shutdown().await.unwrap();
}
