//! Shared test helpers: database waits by the lockdb clock, table snapshots, an HTTP client for an
//! in-process server, and the safety scenarios that both the C1 tests and the negative controls run.
//!
//! Each scenario returns `Err(violation)` when its safety invariant does not hold. The C1 tests assert
//! `Ok`; the negative controls run the same scenario with one clause removed from a statement and
//! assert `Err` — so the check provably can fail.

#![allow(dead_code)] // each test binary uses a different subset

use std::time::{Duration, Instant};

use dlock_testkit::TestDb;
use lock_server::{Config, Repo, RunningServer, Statements};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

pub const ADMIN_TOKEN: &str = "test-admin-token-7f3a";
/// Long enough never to lapse during a test.
pub const LONG_TTL_SECS: f64 = 600.0;
pub const LONG_TTL_MS: i64 = 600_000;
/// Short enough to lapse quickly; tests wait for the lapse by the database clock, never by sleeping.
pub const SHORT_TTL_SECS: f64 = 0.05;
pub const SHORT_TTL_MS: i64 = 50;

const WAIT_LIMIT: Duration = Duration::from_secs(20);

// ---- databases and waits -----------------------------------------------------------------------

pub struct Db {
    pub db: TestDb,
    /// As lockapp, like the server.
    pub app: PgPool,
    /// As postgres, for inspection (the sequence's last_value needs SELECT on it).
    pub admin: PgPool,
}

pub async fn lockdb() -> Db {
    let db = dlock_testkit::lockdb().await;
    let app = db.app_pool().await;
    let admin = db.admin_pool().await;
    Db { db, app, admin }
}

/// Polls `cond` (a boolean SQL query with one bind) until it is true, with a deadline.
async fn poll_until(pool: &PgPool, sql: &'static str, bind: BindValue, what: &str) {
    let started = Instant::now();
    loop {
        let q = sqlx::query_scalar::<_, Option<bool>>(sql);
        let q = match &bind {
            BindValue::Text(s) => q.bind(s.clone()),
            BindValue::Uuid(u) => q.bind(*u),
        };
        if q.fetch_optional(pool).await.unwrap().flatten() == Some(true) {
            return;
        }
        assert!(started.elapsed() < WAIT_LIMIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

enum BindValue {
    Text(String),
    Uuid(Uuid),
}

/// Waits until the key's lease has lapsed by the database clock (`now() > expires_at`).
pub async fn await_lease_lapsed(pool: &PgPool, key: &str) {
    poll_until(
        pool,
        "SELECT now() > expires_at FROM lock_entry WHERE lock_key = $1",
        BindValue::Text(key.to_owned()),
        &format!("the lease on {key} to lapse"),
    )
    .await;
}

/// Waits until the session has lapsed by the database clock.
pub async fn await_session_lapsed(pool: &PgPool, session_id: Uuid) {
    poll_until(
        pool,
        "SELECT now() > expires_at FROM lock_session WHERE session_id = $1",
        BindValue::Uuid(session_id),
        &format!("session {session_id} to lapse"),
    )
    .await;
}

/// Waits until the session row is gone (e.g. deleted by the reaper task).
pub async fn await_session_deleted(pool: &PgPool, session_id: Uuid) {
    poll_until(
        pool,
        "SELECT NOT EXISTS (SELECT 1 FROM lock_session WHERE session_id = $1)",
        BindValue::Uuid(session_id),
        &format!("session {session_id} to be deleted"),
    )
    .await;
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EntryRow {
    pub lock_key: String,
    pub owner_id: String,
    pub session_id: Uuid,
    pub fencing_token: i64,
    pub acquired_at: chrono::DateTime<chrono::Utc>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

pub async fn entry(pool: &PgPool, key: &str) -> Option<EntryRow> {
    sqlx::query_as(
        "SELECT lock_key, owner_id, session_id, fencing_token, acquired_at, expires_at \
         FROM lock_entry WHERE lock_key = $1",
    )
    .bind(key)
    .fetch_optional(pool)
    .await
    .unwrap()
}

pub async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Everything lockdb holds, including the sequence position: equal snapshots mean nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub sessions: String,
    pub entries: String,
    pub revocations: String,
    pub seq_last_value: i64,
    pub seq_is_called: bool,
}

pub async fn snapshot(admin: &PgPool) -> Snapshot {
    let rows = |sql: &'static str| async move {
        sqlx::query_scalar::<_, String>(sql)
            .fetch_one(admin)
            .await
            .unwrap()
    };
    let (seq_last_value, seq_is_called): (i64, bool) =
        sqlx::query_as("SELECT last_value, is_called FROM fencing_token_seq")
            .fetch_one(admin)
            .await
            .unwrap();
    Snapshot {
        sessions: rows("SELECT coalesce(json_agg(t ORDER BY session_id)::text, '[]') FROM lock_session t")
            .await,
        entries: rows("SELECT coalesce(json_agg(t ORDER BY lock_key)::text, '[]') FROM lock_entry t").await,
        revocations: rows("SELECT coalesce(json_agg(t ORDER BY id)::text, '[]') FROM lock_revocation t")
            .await,
        seq_last_value,
        seq_is_called,
    }
}

/// A statement set equal to C1 except for one field, built by deleting one clause from the C1 text.
/// Panics if the clause is not in the text, so a control cannot silently become a no-op.
pub fn without(c1: &'static str, clause: &str) -> &'static str {
    assert!(c1.contains(clause), "clause {clause:?} not found in {c1}");
    let broken = c1.replacen(clause, "", 1);
    assert_ne!(broken, c1);
    Box::leak(broken.into_boxed_str())
}

/// C1's acquire without `fencing_token = nextval(...)` in DO UPDATE (C1 Warning 1).
pub fn acquire_without_nextval_in_update() -> Statements {
    Statements {
        acquire: without(
            lock_server::sql::ACQUIRE,
            "       fencing_token = nextval('fencing_token_seq'),\n",
        ),
        ..Statements::C1
    }
}

/// Release by key alone: `DELETE FROM lock_entry WHERE lock_key = $1` (the token is bound but unused).
pub fn release_by_key_alone() -> Statements {
    Statements {
        release: without(lock_server::sql::RELEASE, "\n   AND fencing_token = $2"),
        ..Statements::C1
    }
}

/// Renew without `expires_at > now()`.
pub fn renew_without_expiry_check() -> Statements {
    Statements {
        renew: without(lock_server::sql::RENEW, "\n   AND expires_at    > now()"),
        ..Statements::C1
    }
}

// ---- safety scenarios at the repository level --------------------------------------------------

/// Opens a session for `owner` with a long TTL.
pub async fn session(repo: &Repo, owner: &str) -> Uuid {
    repo.create_session(owner, LONG_TTL_SECS)
        .await
        .unwrap()
        .session_id
}

/// Takeover of a genuinely expired lease must yield a strictly higher token (INV-04).
/// Returns the two tokens.
pub async fn scenario_takeover_token(repo: &Repo, key: &str) -> Result<(i64, i64), String> {
    let s1 = session(repo, "w1").await;
    let s2 = session(repo, "w2").await;
    let g1 = repo
        .acquire(key, "w1", s1, SHORT_TTL_SECS)
        .await
        .unwrap()
        .expect("w1 granted");
    await_lease_lapsed(repo.pool(), key).await;
    let g2 = repo
        .acquire(key, "w2", s2, LONG_TTL_SECS)
        .await
        .unwrap()
        .ok_or("w2 was not granted the expired lease")?;
    if g2.fencing_token > g1.fencing_token {
        Ok((g1.fencing_token, g2.fencing_token))
    } else {
        Err(format!(
            "takeover token {} is not strictly higher than the dead holder's {}",
            g2.fencing_token, g1.fencing_token
        ))
    }
}

/// A paused holder's release after a takeover must not touch the current holder's grant.
pub async fn scenario_stale_release(repo: &Repo, key: &str) -> Result<(), String> {
    let s1 = session(repo, "w1").await;
    let s2 = session(repo, "w2").await;
    let g1 = repo
        .acquire(key, "w1", s1, SHORT_TTL_SECS)
        .await
        .unwrap()
        .expect("w1 granted");
    await_lease_lapsed(repo.pool(), key).await;
    let g2 = repo
        .acquire(key, "w2", s2, LONG_TTL_SECS)
        .await
        .unwrap()
        .expect("w2 granted");
    let released = repo.release(key, g1.fencing_token).await.unwrap();
    let current = entry(repo.pool(), key).await;
    let intact = current
        .as_ref()
        .is_some_and(|e| e.fencing_token == g2.fencing_token && e.session_id == s2 && e.owner_id == "w2");
    match (released, intact) {
        (false, true) => Ok(()),
        _ => Err(format!(
            "stale release by token {} returned released={released}; current holder's grant (token {}) is now {current:?}",
            g1.fencing_token, g2.fencing_token
        )),
    }
}

/// Renew of a lease that lapsed (by the database clock, even by a millisecond) must fail and must not
/// resurrect the row.
pub async fn scenario_lapsed_renew(repo: &Repo, key: &str) -> Result<(), String> {
    let s1 = session(repo, "w1").await;
    let g1 = repo
        .acquire(key, "w1", s1, SHORT_TTL_SECS)
        .await
        .unwrap()
        .expect("w1 granted");
    await_lease_lapsed(repo.pool(), key).await;
    let renewed = repo.renew(key, g1.fencing_token, LONG_TTL_SECS).await.unwrap();
    let row = repo.read(key).await.unwrap();
    let still_expired = row
        .as_ref()
        .is_some_and(|r| r.expired && r.expires_at == g1.expires_at);
    match (&renewed, still_expired) {
        (None, true) => Ok(()),
        _ => Err(format!(
            "renew after lapse returned {renewed:?}; the row is now {row:?} (resurrected)"
        )),
    }
}

// ---- HTTP --------------------------------------------------------------------------------------

pub fn config(db: &TestDb) -> Config {
    Config::new(db.app_url())
        .with_admin_token(ADMIN_TOKEN)
        .with_reaper_interval(None)
}

pub async fn server(db: &TestDb) -> RunningServer {
    lock_server::spawn(config(db)).await.unwrap()
}

/// A thin HTTP client over one in-process server; every call returns (status, JSON body).
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

impl Reply {
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    pub fn token(&self) -> i64 {
        self.body["fencingToken"]
            .as_i64()
            .unwrap_or_else(|| panic!("no fencingToken in {self:?}"))
    }
}

pub async fn reply(resp: reqwest::Response) -> Reply {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status, body }
}

impl Api {
    pub fn new(server: &RunningServer) -> Self {
        Self {
            base: server.base_url(),
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn open_session(&self, owner: &str, ttl_ms: i64) -> Uuid {
        let r = self
            .post_json("/v1/sessions", json!({"ownerId": owner, "ttlMs": ttl_ms}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        r.body["sessionId"].as_str().unwrap().parse().unwrap()
    }

    pub async fn post_json(&self, path: &str, body: Value) -> Reply {
        reply(self.http.post(self.url(path)).json(&body).send().await.unwrap()).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        reply(self.http.get(self.url(path)).send().await.unwrap()).await
    }

    pub async fn acquire(&self, key: &str, session: Uuid, owner: &str, ttl_ms: i64) -> Reply {
        self.post_json(
            &format!("/v1/locks/{key}/acquire"),
            json!({"sessionId": session, "ownerId": owner, "ttlMs": ttl_ms}),
        )
        .await
    }

    /// A blocking acquire: waits in the key's queue up to `wait_ms`.
    pub async fn acquire_wait(
        &self,
        key: &str,
        session: Uuid,
        owner: &str,
        ttl_ms: i64,
        wait_ms: i64,
    ) -> Reply {
        self.post_json(
            &format!("/v1/locks/{key}/acquire"),
            json!({"sessionId": session, "ownerId": owner, "ttlMs": ttl_ms, "waitMs": wait_ms}),
        )
        .await
    }

    /// `GET /v1/locks` as the admin.
    pub async fn list(&self, query: &str) -> Reply {
        reply(
            self.http
                .get(self.url(&format!("/v1/locks{query}")))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// The queue length of `key` as the listing shows it (0 when the key is not held).
    pub async fn queued(&self, key: &str) -> i64 {
        let r = self.list(&format!("?prefix={key}")).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["lockKey"] == key)
            .map_or(0, |i| i["waiters"].as_i64().unwrap())
    }

    pub async fn renew(&self, key: &str, token: i64, ttl_ms: i64) -> Reply {
        let resp = self
            .http
            .post(self.url(&format!("/v1/locks/{key}/renew")))
            .header("X-Fencing-Token", token.to_string())
            .json(&json!({"ttlMs": ttl_ms}))
            .send()
            .await
            .unwrap();
        reply(resp).await
    }

    pub async fn release(&self, key: &str, token: i64) -> Reply {
        let resp = self
            .http
            .post(self.url(&format!("/v1/locks/{key}/release")))
            .header("X-Fencing-Token", token.to_string())
            .send()
            .await
            .unwrap();
        reply(resp).await
    }

    pub async fn heartbeat(&self, session: Uuid, ttl_ms: i64) -> Reply {
        self.post_json(
            &format!("/v1/sessions/{session}/heartbeat"),
            json!({"ttlMs": ttl_ms}),
        )
        .await
    }

    pub async fn close_session(&self, session: Uuid) -> Reply {
        reply(
            self.http
                .delete(self.url(&format!("/v1/sessions/{session}")))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn revoke(&self, key: &str, bearer: Option<&str>, body: Value) -> Reply {
        let mut req = self
            .http
            .post(self.url(&format!("/v1/admin/locks/{key}/revoke")))
            .json(&body);
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        reply(req.send().await.unwrap()).await
    }

    pub async fn metrics(&self) -> String {
        let resp = self.http.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.unwrap()
    }
}

/// The value of one sample in OpenMetrics text, e.g. `lock_acquire_total{result="granted"}`.
pub fn metric(text: &str, sample: &str) -> f64 {
    dlock_testkit::metrics::sample(text, sample).unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
}

/// The two-worker pause-and-return at the lock level, over HTTP. W1 acquires and "pauses" past its
/// TTL (no renew; we wait for the lapse by the database clock), W2 acquires, W1 returns. The
/// invariants: W2's token is strictly higher, W1's renew fails with LEASE_EXPIRED, W1's release is
/// stale, W2's grant is intact and renewable.
pub async fn scenario_pause_and_return(api: &Api, admin: &PgPool, key: &str) -> Result<(), String> {
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let g1 = api.acquire(key, s1, "w1", 100).await;
    assert_eq!(g1.status, StatusCode::OK, "{g1:?}");
    let t1 = g1.token();

    await_lease_lapsed(admin, key).await; // W1 is paused past its lease

    let g2 = api.acquire(key, s2, "w2", LONG_TTL_MS).await;
    assert_eq!(g2.status, StatusCode::OK, "{g2:?}");
    let t2 = g2.token();
    let mut violations = Vec::new();
    if t2 <= t1 {
        violations.push(format!("W2's token {t2} is not strictly higher than W1's {t1}"));
    }

    // W1 returns.
    let renew = api.renew(key, t1, LONG_TTL_MS).await;
    if renew.status != StatusCode::GONE || renew.code() != "LEASE_EXPIRED" {
        violations.push(format!("W1's renew with token {t1} did not fail: {renew:?}"));
    }
    let release = api.release(key, t1).await;
    if release.status != StatusCode::OK || release.body["stale"] != json!(true) {
        violations.push(format!("W1's release with token {t1} was not stale: {release:?}"));
    }

    let view = api.get(&format!("/v1/locks/{key}")).await;
    if view.body["state"] != "HELD" || view.body["ownerId"] != "w2" || view.body["fencingToken"] != json!(t2)
    {
        violations.push(format!("W2's grant (token {t2}) is not intact: {view:?}"));
    }
    let renew2 = api.renew(key, t2, LONG_TTL_MS).await;
    if renew2.status != StatusCode::OK {
        violations.push(format!("W2 cannot renew its own grant: {renew2:?}"));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}
