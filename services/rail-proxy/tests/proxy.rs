//! rail-proxy against a real PostgreSQL 16 paydb (dlock-testkit) and an in-process rail-stub; at the
//! end, signed grants: every bad grant refused at submit and resolve with paydb untouched, and the
//! negative control with verification off (another account's token fences the holder out).
//!
//! Payouts are set up by inserting account and payout rows as the superuser; the proxy itself runs
//! as payapp, exactly as deployed.

use std::collections::BTreeSet;
use std::time::Duration;

use dlock_testkit::TestDb;
use rail_proxy::{Config, Fault, RailFence, RunningServer};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const TOKEN: &str = "X-Fencing-Token";
const GRANT: &str = "X-Fencing-Grant";
/// The executor's credential for the test proxies.
const EXECUTOR: &str = "test-rail-executor-credential";

fn credentials() -> dlock_common::auth::Credentials {
    use dlock_common::auth::{Credential, Credentials, Role};
    Credentials::new().with(Role::Executor, Credential::new("test", EXECUTOR).unwrap())
}

/// What lock-server would sign with; the test proxies trust it.
static GRANT_KEY: std::sync::LazyLock<dlock_grant::SigningKey> = std::sync::LazyLock::new(|| {
    dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("test-k1").unwrap())
});

fn grants() -> dlock_common::grant::GrantPolicy {
    let keys = dlock_grant::PublicKeys::new(vec![GRANT_KEY.public_key()]).unwrap();
    dlock_common::grant::GrantPolicy::new(true, keys, "TEST").unwrap()
}

/// The grant of `token` on `account:<account>`.
fn grant(account: Uuid, token: &str) -> Option<String> {
    let token = token.parse::<dlock_common::FencingToken>().ok()?.get();
    GRANT_KEY
        .sign(&dlock_grant::Claims {
            lock_service: "tests",
            lock_key: &dlock_common::grant::account_key(account),
            token,
            owner_id: "test-holder",
            session_id: Uuid::nil(),
        })
        .ok()
}

struct Harness {
    db: TestDb,
    admin: PgPool,
    stub: rail_stub::RunningServer,
    proxy: RunningServer,
    http: Client,
}

struct Payout {
    id: Uuid,
    key: String,
}

impl Harness {
    async fn start(fence: RailFence) -> Self {
        Self::start_with(fence, |_| {}).await
    }

    async fn start_with(fence: RailFence, tweak: impl FnOnce(&mut Config)) -> Self {
        let db = dlock_testkit::paydb().await;
        let admin = db.admin_pool().await;
        let stub = rail_stub::spawn(rail_stub::Config::for_tests())
            .await
            .expect("stub starts");
        let mut config = Config::new(db.app_url(), stub.url());
        config.fence = fence;
        config.max_connections = 4;
        config.credentials = credentials();
        config.grants = grants();
        tweak(&mut config);
        let proxy = rail_proxy::spawn(config).await.expect("proxy starts");
        Self {
            db,
            admin,
            stub,
            proxy,
            http: Client::new(),
        }
    }

    async fn stop(self) {
        self.proxy.shutdown().await.expect("proxy stops");
        self.stub.shutdown().await.expect("stub stops");
    }

    async fn account(&self) -> Uuid {
        let id = Uuid::new_v4();
        sqlx::query("INSERT INTO account (account_id, currency, balance_minor) VALUES ($1, 'EUR', 1000000)")
            .bind(id)
            .execute(&self.admin)
            .await
            .unwrap();
        id
    }

    /// A payout claimed by `owner` with `claim_token` and reserved (RAIL_SUBMITTED, its amount held
    /// on the account), as payment-resource leaves it for the rail.
    async fn payout(&self, account: Uuid, amount: i64, claim_token: i64, owner: &str) -> Payout {
        let p = self.claimed(account, amount, claim_token, owner).await;
        sqlx::query(
            "WITH p AS (UPDATE payout SET state = 'RAIL_SUBMITTED', reserved_minor = amount_minor,
                                          reserved_token = claim_token
                          WHERE payout_id = $1 RETURNING account_id, amount_minor)
             UPDATE account a SET reserved_minor = a.reserved_minor + p.amount_minor
               FROM p WHERE a.account_id = p.account_id",
        )
        .bind(p.id)
        .execute(&self.admin)
        .await
        .unwrap();
        p
    }

    /// A payout CLAIMED by `owner` with `claim_token`, not reserved.
    async fn claimed(&self, account: Uuid, amount: i64, claim_token: i64, owner: &str) -> Payout {
        let id = Uuid::new_v4();
        let key = format!("payout-{id}");
        sqlx::query(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency, state, claimed_by, claim_token, idempotency_key)
             VALUES ($1, $2, $3, 'EUR', 'CLAIMED', $4, $5, $6)",
        )
        .bind(id)
        .bind(account)
        .bind(amount)
        .bind(owner)
        .bind(claim_token)
        .bind(&key)
        .execute(&self.admin)
        .await
        .unwrap();
        Payout { id, key }
    }

    /// The account of a payout, for the grant its executor would hold (an unknown payout: some
    /// account; the proxy answers UNKNOWN_PAYOUT first).
    async fn account_of(&self, payout: &Value) -> Uuid {
        let id = payout.as_str().and_then(|s| s.parse::<Uuid>().ok());
        let found: Option<Uuid> = match id {
            Some(id) => sqlx::query_scalar("SELECT account_id FROM payout WHERE payout_id = $1")
                .bind(id)
                .fetch_optional(&self.admin)
                .await
                .unwrap(),
            None => None,
        };
        found.unwrap_or_else(Uuid::new_v4)
    }

    /// Every call carries the rightful grant of its token (these tests are about the proxy;
    /// tests/grants.rs is about wrong grants).
    /// An attempt of `payout` presented with `token` and never answered, written straight into
    /// paydb: what a request that recorded it and then crashed (or lost the reply) leaves behind.
    async fn unanswered_attempt(&self, payout: &Payout, token: i64) {
        sqlx::query(
            "INSERT INTO rail_submission (submission_id, payout_id, idempotency_key, presented_token)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(Uuid::new_v4())
        .bind(payout.id)
        .bind(&payout.key)
        .bind(token)
        .execute(&self.admin)
        .await
        .unwrap();
    }

    async fn submit_raw(&self, body: Value, token: Option<&str>) -> (StatusCode, Value) {
        let mut req = self
            .http
            .post(format!("{}/v1/submissions", self.proxy.url()))
            .bearer_auth(EXECUTOR)
            .json(&body);
        if let Some(t) = token {
            req = req.header(TOKEN, t);
            if let Some(g) = grant(self.account_of(&body["payoutId"]).await, t) {
                req = req.header(GRANT, g);
            }
        }
        let resp = req.send().await.unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    async fn submit(&self, payout: &Payout, token: i64) -> (StatusCode, Value) {
        self.submit_raw(json!({"payoutId": payout.id}), Some(&token.to_string()))
            .await
    }

    async fn resolve(&self, payout: Uuid, token: Option<&str>) -> (StatusCode, Value) {
        let mut req = self
            .http
            .post(format!("{}/v1/submissions/{payout}/resolve", self.proxy.url()))
            .bearer_auth(EXECUTOR);
        if let Some(t) = token {
            req = req.header(TOKEN, t);
            if let Some(g) = grant(self.account_of(&json!(payout)).await, t) {
                req = req.header(GRANT, g);
            }
        }
        let resp = req.send().await.unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    async fn list(&self, payout: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .get(format!("{}/v1/submissions/{payout}", self.proxy.url()))
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    /// The stub's ground truth.
    async fn rail(&self) -> Value {
        self.http
            .get(format!("{}/v1/received", self.stub.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn rail_requests(&self) -> usize {
        self.rail().await["requests"].as_array().map_or(0, Vec::len)
    }

    async fn stub_mode(&self, mode: &str) {
        let resp = self
            .http
            .put(format!("{}/v1/admin/behaviour", self.stub.url()))
            .json(&json!({"mode": mode, "latencyMs": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    async fn count(&self, table_sql: &'static str) -> i64 {
        sqlx::query_scalar(table_sql)
            .fetch_one(&self.admin)
            .await
            .unwrap()
    }

    async fn submissions_rows(&self) -> i64 {
        self.count("SELECT count(*) FROM rail_submission").await
    }

    async fn high_water_rows(&self) -> i64 {
        self.count("SELECT count(*) FROM rail_high_water").await
    }

    async fn high_water(&self, account: Uuid) -> Option<i64> {
        sqlx::query_scalar("SELECT highest_token FROM rail_high_water WHERE account_id = $1")
            .bind(account)
            .fetch_optional(&self.admin)
            .await
            .unwrap()
    }

    /// (outcome, resolved_at is set, presented_token, rail_reference) per row, oldest first.
    async fn rows_for(&self, payout: Uuid) -> Vec<(Option<String>, bool, i64, Option<String>)> {
        sqlx::query_as(
            "SELECT outcome, resolved_at IS NOT NULL, presented_token, rail_reference
               FROM rail_submission WHERE payout_id = $1 ORDER BY submitted_at, submission_id",
        )
        .bind(payout)
        .fetch_all(&self.admin)
        .await
        .unwrap()
    }

    async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.proxy.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of the series whose text before the value is exactly `series`.
    async fn metric(&self, series: &str) -> u64 {
        dlock_testkit::metrics::counter(&self.metrics().await, series).unwrap_or(0)
    }
}

const DUPLICATE: &str = "rail_duplicate_attempted_total";
const FENCED_RAIL: &str = "lock_fenced_out_total{resource=\"rail\"}";

#[tokio::test]
async fn first_submission_for_an_account_forwards_once_and_records_acked() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 2_500, 10, "worker-a").await;

    let (status, body) = h.submit(&p, 10).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "ACKED");
    assert_eq!(body["payoutId"], json!(p.id));
    assert_eq!(body["presentedToken"], 10);
    assert!(body["resolvedAt"].is_string());

    let rail = h.rail().await;
    assert_eq!(rail["requests"].as_array().map(Vec::len), Some(1));
    let sent = &rail["requests"][0];
    assert_eq!(sent["idempotencyKey"], json!(p.key));
    assert_eq!(sent["payoutId"], json!(p.id));
    assert_eq!(sent["accountId"], json!(account));
    assert_eq!(sent["amountMinor"], 2_500);
    assert_eq!(rail["perKey"][&p.key]["paid"], 1);
    assert_eq!(body["railReference"], rail_reference(&h, &p.key).await);

    assert_eq!(
        h.rows_for(p.id).await,
        vec![(
            Some("ACKED".to_owned()),
            true,
            10,
            body["railReference"].as_str().map(str::to_owned)
        )]
    );
    assert_eq!(h.high_water(account).await, Some(10));
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"acked\"}").await,
        1
    );
    assert_eq!(h.metric(FENCED_RAIL).await, 0);
    h.stop().await;
}

async fn rail_reference(h: &Harness, key: &str) -> Value {
    let p: Value = h
        .http
        .get(format!("{}/v1/payments/{key}", h.stub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    p["railReference"].clone()
}

#[tokio::test]
async fn a_lower_token_after_a_higher_one_is_fenced_recorded_and_not_forwarded() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let current = h.payout(account, 100, 10, "worker-new").await;
    let stale = h.payout(account, 200, 5, "worker-stale").await;
    assert_eq!(h.submit(&current, 10).await.0, StatusCode::OK);
    assert_eq!(h.rail_requests().await, 1);
    let (dup_before, fenced_before) = (h.metric(DUPLICATE).await, h.metric(FENCED_RAIL).await);
    assert_eq!((dup_before, fenced_before), (0, 0));

    let (status, body) = h.submit(&stale, 5).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "FENCED_OUT");
    assert_eq!(body["presented"], 5);
    assert_eq!(body["highest"], 10);
    assert_eq!(body["resourceType"], "rail");
    assert_eq!(body["resourceId"], json!(account.to_string()));
    assert_eq!(body["ownerId"], "worker-stale");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));

    assert_eq!(
        h.rail_requests().await,
        1,
        "the stale submission must not reach the rail"
    );
    assert_eq!(
        h.rows_for(stale.id).await,
        vec![(Some("FENCED".to_owned()), true, 5, None)]
    );
    assert_eq!(h.high_water(account).await, Some(10));
    assert_eq!(h.metric(DUPLICATE).await, dup_before + 1);
    assert_eq!(h.metric(FENCED_RAIL).await, fenced_before + 1);
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"fenced\"}").await,
        1
    );

    // The adopter's view lists the refusal.
    let (st, list) = h.list(&stale.id.to_string()).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(list["submissions"][0]["outcome"], "FENCED");
    assert_eq!(list["submissions"][0]["submissionId"], body["submissionId"]);
    h.stop().await;
}

/// What the equal-token scenario left behind.
struct EqualTokenEvidence {
    second: (StatusCode, Value),
    rail_requests: usize,
    fenced_rows: i64,
}

/// Two payouts of one account submitted with the same token: the second must be fenced (strict <).
async fn equal_token_scenario(fence: RailFence) -> EqualTokenEvidence {
    let h = Harness::start(fence).await;
    let account = h.account().await;
    let first = h.payout(account, 100, 7, "worker-a").await;
    let second = h.payout(account, 300, 7, "worker-a").await;
    assert_eq!(h.submit(&first, 7).await.0, StatusCode::OK);
    let second = h.submit(&second, 7).await;
    let evidence = EqualTokenEvidence {
        second,
        rail_requests: h.rail_requests().await,
        fenced_rows: h
            .count("SELECT count(*) FROM rail_submission WHERE outcome = 'FENCED'")
            .await,
    };
    h.stop().await;
    evidence
}

/// The invariants the equal-token test asserts, as a list of violations (empty = safe).
fn equal_token_violations(e: &EqualTokenEvidence) -> Vec<&'static str> {
    let mut v = Vec::new();
    if e.second.0 != StatusCode::CONFLICT || e.second.1["code"] != "FENCED_OUT" {
        v.push("the equal token was not refused with 409 FENCED_OUT");
    }
    if e.second.1["presented"] != 7 || e.second.1["highest"] != 7 {
        v.push("the refusal does not report presented = highest = 7");
    }
    if e.rail_requests != 1 {
        v.push("the equal token was forwarded to the rail");
    }
    if e.fenced_rows != 1 {
        v.push("no FENCED audit row was recorded");
    }
    v
}

#[tokio::test]
async fn an_equal_token_is_fenced_too() {
    let e = equal_token_scenario(RailFence::from_flag(true)).await;
    assert_eq!(equal_token_violations(&e), Vec::<&str>::new());
}

/// Negative control: (d) with `<=` instead of `<` (test code only) must make the test above fail.
#[tokio::test]
async fn negative_control_le_in_d_lets_the_equal_token_through() {
    let broken: &'static str = Box::leak(
        rail_proxy::sql::HIGH_WATER
            .replace(
                "rail_high_water.highest_token < EXCLUDED.highest_token",
                "rail_high_water.highest_token <= EXCLUDED.highest_token",
            )
            .into_boxed_str(),
    );
    assert_ne!(
        broken,
        rail_proxy::sql::HIGH_WATER,
        "the broken variant must differ"
    );
    let e = equal_token_scenario(RailFence::Enforced { statement: broken }).await;
    let violations = equal_token_violations(&e);
    assert!(
        violations.contains(&"the equal token was forwarded to the rail"),
        "{violations:?}"
    );
    assert_eq!(e.second.0, StatusCode::OK);
    assert_eq!(e.rail_requests, 2);
}

#[tokio::test]
async fn a_second_forwardable_attempt_is_blocked_by_the_index_even_with_a_higher_token() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 900, 10, "worker-a").await;
    let (_, first) = h.submit(&p, 10).await;
    assert_eq!(first["outcome"], "ACKED");

    let (status, body) = h.submit(&p, 11).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "DUPLICATE_ATTEMPT");
    assert_eq!(body["outcome"], "ACKED");
    assert_eq!(body["submissionId"], first["submissionId"]);
    assert_eq!(body["railReference"], first["railReference"]);
    assert_eq!(h.rail_requests().await, 1, "never forwarded twice");
    assert_eq!(h.rows_for(p.id).await.len(), 1);
    // (d) ran in its own transaction and passed: the higher token's mark stands.
    assert_eq!(h.high_water(account).await, Some(11));
    assert_eq!(
        h.metric(DUPLICATE).await,
        0,
        "an existing attempt is not a fencing refusal"
    );
    h.stop().await;
}

#[tokio::test]
async fn concurrent_submissions_for_one_payout_forward_exactly_once() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 50, 1, "worker-a").await;
    let results = futures::future::join_all((1..=8).map(|t| h.submit(&p, t))).await;
    let ok = results.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    let fenced = results
        .iter()
        .filter(|(s, b)| *s == StatusCode::CONFLICT && b["code"] == "FENCED_OUT")
        .count();
    let duplicate = results
        .iter()
        .filter(|(s, b)| *s == StatusCode::CONFLICT && b["code"] == "DUPLICATE_ATTEMPT")
        .count();
    assert_eq!(ok, 1, "{results:?}");
    assert_eq!(ok + fenced + duplicate, 8, "{results:?}");
    assert_eq!(h.rail_requests().await, 1);
    let rows = h.rows_for(p.id).await;
    assert_eq!(
        rows.iter().filter(|r| r.0.as_deref() != Some("FENCED")).count(),
        1
    );
    assert_eq!(
        rows.iter().filter(|r| r.0.as_deref() == Some("FENCED")).count(),
        fenced
    );
    assert_eq!(h.metric(DUPLICATE).await, fenced as u64);
    h.stop().await;
}

#[tokio::test]
async fn a_rail_rejection_is_recorded_rejected() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    h.stub_mode("reject").await;
    let account = h.account().await;
    let p = h.payout(account, 100, 3, "worker-a").await;
    let (status, body) = h.submit(&p, 3).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "REJECTED");
    assert_eq!(body["railReference"], Value::Null);
    assert_eq!(
        h.rows_for(p.id).await,
        vec![(Some("REJECTED".to_owned()), true, 3, None)]
    );
    assert_eq!(h.rail().await["perKey"][&p.key]["paid"], 0);
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"rejected\"}")
            .await,
        1
    );
    h.stop().await;
}

#[tokio::test]
async fn a_timeout_is_recorded_then_resolved_by_asking_without_resubmitting() {
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        c.rail_timeout = Duration::from_millis(500);
    })
    .await;
    h.stub_mode("timeout").await;
    let account = h.account().await;
    let p = h.payout(account, 4_200, 20, "worker-a").await;

    let (status, body) = h.submit(&p, 20).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "TIMEOUT");
    assert!(
        body["resolvedAt"].is_string(),
        "TIMEOUT is recorded with resolved_at"
    );
    assert_eq!(
        h.rows_for(p.id).await,
        vec![(Some("TIMEOUT".to_owned()), true, 20, None)]
    );
    // The money moved at the rail although we never heard.
    assert_eq!(h.rail().await["perKey"][&p.key]["paid"], 1);

    // Submitting again is refused, not forwarded.
    let (status, again) = h.submit(&p, 21).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(again["code"], "DUPLICATE_ATTEMPT");
    assert_eq!(again["outcome"], "TIMEOUT");

    let (status, resolved) = h.resolve(p.id, Some("21")).await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    assert_eq!(resolved["outcome"], "ACKED");
    assert_eq!(resolved["submissionId"], body["submissionId"]);
    assert_eq!(resolved["railReference"], rail_reference(&h, &p.key).await);
    assert!(resolved["railReference"].is_string());
    let rows = h.rows_for(p.id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].0.as_deref(), rows[0].1), (Some("ACKED"), true));

    // Resolving again changes nothing and asks nothing new of the rail.
    let (status, twice) = h.resolve(p.id, Some("21")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(twice, resolved);
    let rail = h.rail().await;
    assert_eq!(
        rail["requests"].as_array().map(Vec::len),
        Some(1),
        "received exactly once"
    );
    assert_eq!(rail["perKey"][&p.key]["paid"], 1);
    h.stop().await;
}

#[tokio::test]
async fn an_attempt_left_unanswered_by_a_crash_is_resolved_from_the_rail() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 700, 30, "worker-dead").await;
    // The proxy crashed after recording the attempt: outcome NULL, resolved_at NULL.
    h.unanswered_attempt(&p, 30).await;

    // The rail has no record yet: nothing is recorded, the attempt stays open.
    let (status, body) = h.resolve(p.id, Some("31")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "RAIL_OUTCOME_UNKNOWN");
    assert_eq!(h.rows_for(p.id).await, vec![(None, false, 30, None)]);

    // A new holder's submission does not forward either.
    let (status, dup) = h.submit(&p, 31).await;
    assert_eq!(
        (status, dup["code"].as_str()),
        (StatusCode::CONFLICT, Some("DUPLICATE_ATTEMPT"))
    );
    assert_eq!(dup["outcome"], Value::Null);
    assert_eq!(h.rail_requests().await, 0);

    // The crashed forward had in fact reached the rail.
    let resp = h
        .http
        .post(format!("{}/v1/payments", h.stub.url()))
        .json(&json!({
            "idempotencyKey": p.key, "payoutId": p.id, "accountId": account,
            "amountMinor": 700, "currency": "EUR",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    let (status, resolved) = h.resolve(p.id, Some("31")).await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    assert_eq!(resolved["outcome"], "ACKED");
    assert_eq!(resolved["railReference"], rail_reference(&h, &p.key).await);
    assert_eq!(h.rail_requests().await, 1);
    h.stop().await;
}

#[tokio::test]
async fn an_unreachable_rail_is_ambiguous_not_rejected() {
    // Port 1 on loopback: nothing listens there.
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        c.rail_url = "http://127.0.0.1:1".to_owned();
    })
    .await;
    let account = h.account().await;
    let p = h.payout(account, 100, 4, "worker-a").await;
    let (status, body) = h.submit(&p, 4).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "TIMEOUT");
    let (status, body) = h.resolve(p.id, Some("4")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["code"], "RAIL_UNAVAILABLE");
    assert_eq!(
        h.rows_for(p.id).await,
        vec![(Some("TIMEOUT".to_owned()), true, 4, None)]
    );
    h.stop().await;
}

/// The kill switch's evidence: with (d) skipped, the stale token reaches the rail.
#[tokio::test]
async fn kill_switch_off_forwards_the_stale_token() {
    let h = Harness::start(RailFence::from_flag(false)).await;
    let account = h.account().await;
    let current = h.payout(account, 100, 10, "worker-new").await;
    let stale = h.payout(account, 200, 5, "worker-stale").await;
    assert_eq!(h.submit(&current, 10).await.0, StatusCode::OK);
    let (status, body) = h.submit(&stale, 5).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "ACKED");

    let rail = h.rail().await;
    let keys: Vec<&str> = rail["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["idempotencyKey"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [current.key.as_str(), stale.key.as_str()],
        "the stale token was forwarded"
    );
    assert_eq!(h.high_water_rows().await, 0, "(d) is skipped entirely");
    assert_eq!(
        h.count("SELECT count(*) FROM rail_submission WHERE outcome = 'FENCED'")
            .await,
        0
    );
    assert_eq!(h.metric(DUPLICATE).await, 0);
    // The one-attempt index is not part of the kill switch.
    let (status, dup) = h.submit(&stale, 11).await;
    assert_eq!(
        (status, dup["code"].as_str()),
        (StatusCode::CONFLICT, Some("DUPLICATE_ATTEMPT"))
    );
    assert_eq!(h.rail_requests().await, 2);
    h.stop().await;
}

#[tokio::test]
async fn bad_input_is_a_4xx_with_a_code_and_writes_nothing() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 100, 5, "worker-a").await;
    let good = json!({"payoutId": p.id});

    for token in [
        None,
        Some(""),
        Some("0"),
        Some("-1"),
        Some("abc"),
        Some("1.5"),
        Some("+5"),
        Some("9223372036854775808"),
    ] {
        let (status, body) = h.submit_raw(good.clone(), token).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{token:?}");
        assert_eq!(body["code"], "INVALID_TOKEN", "{token:?}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    for (body, code) in [
        (json!({"payoutId": "nope"}), "INVALID_PAYOUT_ID"),
        (json!({"payoutId": 42}), "INVALID_FIELD"),
        (json!({}), "INVALID_FIELD"),
        (json!({"payoutId": p.id, "token": 5}), "INVALID_FIELD"),
    ] {
        let (status, resp) = h.submit_raw(body.clone(), Some("5")).await;
        assert_eq!(
            (status, resp["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{body}"
        );
    }
    let (status, body) = h.submit_raw(json!({"payoutId": Uuid::new_v4()}), Some("5")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("UNKNOWN_PAYOUT"))
    );
    let resp = h
        .http
        .post(format!("{}/v1/submissions", h.proxy.url()))
        .bearer_auth(EXECUTOR)
        .header(TOKEN, "5")
        .header("content-type", "application/json")
        .body("{\"payoutId\":")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "MALFORMED_JSON");
    let resp = h
        .http
        .post(format!("{}/v1/submissions", h.proxy.url()))
        .bearer_auth(EXECUTOR)
        .header(TOKEN, "5")
        .body(good.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // The other endpoints.
    let (status, body) = h.list("nope").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_PAYOUT_ID"))
    );
    let (status, body) = h.list(&Uuid::new_v4().to_string()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("UNKNOWN_PAYOUT"))
    );
    let (status, body) = h.resolve(p.id, None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_TOKEN"))
    );
    let (status, body) = h.resolve(p.id, Some("0")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_TOKEN"))
    );
    let (status, body) = h.resolve(Uuid::new_v4(), Some("5")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("UNKNOWN_PAYOUT"))
    );
    let (status, body) = h.resolve(p.id, Some("5")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("NO_ATTEMPT"))
    );
    let (status, body) = h.list(&p.id.to_string()).await;
    assert_eq!((status, body["submissions"].clone()), (StatusCode::OK, json!([])));

    assert_eq!(h.submissions_rows().await, 0);
    assert_eq!(h.high_water_rows().await, 0);
    assert_eq!(h.rail_requests().await, 0);
    assert_eq!(h.metric(FENCED_RAIL).await, 0);
    h.stop().await;
}

/// A connection paydb's administrator terminated (as a restore's `DROP DATABASE … WITH (FORCE)` or a
/// failover does) answers its next statement with SQLSTATE 57P01: paydb is unavailable — 503, for
/// the executor to retry — not an internal error.
#[tokio::test]
async fn a_statement_on_a_connection_an_administrator_terminated_is_answered_unavailable() {
    let db = dlock_testkit::paydb().await;
    let pool = db.one_unpinged_app_connection().await;
    let payout = Uuid::new_v4();
    let before = rail_proxy::sql::select_payout(&pool, payout).await;
    assert!(matches!(before, Ok(None)), "{before:?}");
    // The pool may, now and then, hand out a fresh connection instead of the terminated one (the
    // statement then succeeds and shows nothing): terminate again until a statement meets a
    // terminated connection, a bounded number of times.
    let mut attempts = 0;
    let err = loop {
        attempts += 1;
        db.terminate_app_connections().await;
        match rail_proxy::sql::select_payout(&pool, payout).await {
            Err(e) => break e,
            Ok(found) if attempts < 10 => assert!(found.is_none(), "{found:?}"),
            Ok(found) => panic!("10 statements after a termination all succeeded ({found:?})"),
        }
    };
    assert!(
        matches!(&err, sqlx::Error::Database(e) if e.code().as_deref() == Some("57P01")),
        "{err:?}"
    );
    let answer = dlock_common::ApiError::from(rail_proxy::error::ProxyError::Db(err));
    assert_eq!(
        (answer.status, answer.code),
        (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        "{}",
        answer.message
    );
}

#[tokio::test]
async fn health_readiness_and_an_unreachable_paydb() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    for (path, text) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let resp = h
            .http
            .get(format!("{}{path}", h.proxy.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.text().await.unwrap(), text);
    }
    let metrics = h.metrics().await;
    for series in [DUPLICATE, FENCED_RAIL] {
        assert!(
            metrics.lines().any(|l| l == format!("{series} 0")),
            "{series} in\n{metrics}"
        );
    }

    let mut down = Config::new("postgres://payapp@127.0.0.1:1/paydb", h.stub.url());
    down.db_acquire_timeout = Duration::from_millis(300);
    down.credentials = credentials();
    down.grants = grants();
    let proxy = rail_proxy::spawn(down)
        .await
        .expect("starts without the database");
    let resp = h
        .http
        .get(format!("{}/readyz", proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "UNAVAILABLE");
    let resp = h
        .http
        .post(format!("{}/v1/submissions", proxy.url()))
        .bearer_auth(EXECUTOR)
        .header(TOKEN, "5")
        .header(GRANT, grant(Uuid::new_v4(), "5").unwrap())
        .json(&json!({"payoutId": Uuid::new_v4()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    proxy.shutdown().await.unwrap();

    for bad in [
        Config::new("postgres://payapp@127.0.0.1:1/paydb", "not a url"),
        Config::new("postgres://payapp@127.0.0.1:1/paydb", "ftp://rail"),
        Config::new("mysql://nope", h.stub.url()),
        {
            let mut c = Config::new("postgres://payapp@127.0.0.1:1/paydb", h.stub.url());
            c.rail_timeout = Duration::ZERO;
            c
        },
    ] {
        let shown = format!("{} {}", bad.database_url, bad.rail_url);
        // Keys given: each is refused for its own fault, not for a missing key.
        assert!(
            rail_proxy::spawn(bad.with_grants(grants())).await.is_err(),
            "{shown}"
        );
    }
    h.stop().await;
}

/// `(METHOD, /path)` pairs under `paths:` of an OpenAPI document we write ourselves
/// (two-space indentation), enough to compare with the router without a YAML dependency.
fn openapi_routes(doc: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path: Option<String> = None;
    for line in doc.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            in_paths = line.trim_end() == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /") {
            path = Some(format!("/{}", p.trim_end().trim_end_matches(':')));
        } else if let Some(m) = line.strip_prefix("    ").and_then(|m| m.strip_suffix(':'))
            && ["get", "post", "put", "delete", "patch"].contains(&m)
        {
            out.insert((m.to_uppercase(), path.clone().expect("method before path")));
        }
    }
    out
}

#[tokio::test]
async fn the_openapi_document_matches_the_router() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let served = h
        .http
        .get(format!("{}/openapi.yaml", h.proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let documented = openapi_routes(&served.text().await.unwrap());
    let routed: BTreeSet<(String, String)> = rail_proxy::api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routed);
    for (method, path) in &routed {
        let url = format!("{}{}", h.proxy.url(), path.replace("{payoutId}", "probe"));
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let resp = h.http.request(method.clone(), url).send().await.unwrap();
        let status = resp.status();
        let code = resp.json::<Value>().await.ok().map(|v| v["code"].clone());
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(code, Some(json!("NOT_FOUND")), "{method} {path}");
    }
    let resp = h
        .http
        .get(format!("{}/v1/nothing", h.proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "NOT_FOUND");
    h.stop().await;
}

#[tokio::test]
async fn a_payout_without_its_funds_reservation_is_not_forwarded() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    // CLAIMED: payment-resource has not reserved it (the account was never shown to cover it).
    let p = h.claimed(account, 500, 7, "w").await;
    let before = h.submissions_rows().await;
    let (status, body) = h.submit(&p, 7).await;
    assert_eq!(
        (status, body["code"].as_str(), body["state"].as_str()),
        (StatusCode::CONFLICT, Some("NOT_RESERVED"), Some("CLAIMED")),
        "{body}"
    );
    assert_eq!(h.rail_requests().await, 0, "nothing reached the rail");
    assert_eq!(h.submissions_rows().await, before, "no attempt recorded");
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"not_reserved\"}")
            .await,
        1
    );
    // Reserved, the same payout goes through once.
    sqlx::query(
        "UPDATE payout SET state = 'RAIL_SUBMITTED', reserved_minor = amount_minor WHERE payout_id = $1",
    )
    .bind(p.id)
    .execute(&h.admin)
    .await
    .unwrap();
    sqlx::query("UPDATE account SET reserved_minor = 500 WHERE account_id = $1")
        .bind(account)
        .execute(&h.admin)
        .await
        .unwrap();
    let (status, body) = h.submit(&p, 8).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::OK, Some("ACKED")),
        "{body}"
    );
    assert_eq!(h.rail_requests().await, 1);
    h.stop().await;
}

/// Puts the payout in RAIL_SUBMITTED, claimed, holding `reserved_minor` (admin SQL: the state
/// payment-resource would never leave it in, which is what rail-proxy must not trust).
async fn submitted_holding(h: &Harness, payout: &Payout, reserved_minor: i64) {
    sqlx::query("UPDATE payout SET state = 'RAIL_SUBMITTED', reserved_minor = $2 WHERE payout_id = $1")
        .bind(payout.id)
        .bind(reserved_minor)
        .execute(&h.admin)
        .await
        .unwrap();
}

/// A submission that must be refused before the rail: 409 `NOT_RESERVED` naming the state, no
/// forwardable attempt (nor any other row) recorded, nothing sent to the rail.
async fn assert_refused_before_the_rail(h: &Harness, p: &Payout, token: i64, what: &str) {
    let rows_before = h.submissions_rows().await;
    let rail_before = h.rail_requests().await;
    let (status, body) = h.submit(p, token).await;
    assert_eq!(
        (status, body["code"].as_str(), body["state"].as_str()),
        (StatusCode::CONFLICT, Some("NOT_RESERVED"), Some("RAIL_SUBMITTED")),
        "{what}: {body}"
    );
    assert_eq!(h.rows_for(p.id).await, vec![], "{what}: an attempt was recorded");
    assert_eq!(h.submissions_rows().await, rows_before, "{what}");
    assert_eq!(h.rail_requests().await, rail_before, "{what}: the rail was asked");
    let (status, listed) = h.list(&p.id.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["submissions"], json!([]), "{what}: {listed}");
}

/// The state predicate alone is not the funds check: a payout that is RAIL_SUBMITTED and claimed
/// but holds no reservation (`reserved_minor = 0`) must not reach the rail. With paydb's CHECKs in
/// place this is the only reservation-less RAIL_SUBMITTED payout there can be
/// (`payout_reserved_ck`: `reserved_minor` is 0 or `amount_minor`; `payout_amount_ck`: the amount
/// is positive), and either predicate of the attempt insert refuses it; the next test takes each
/// predicate on its own.
#[tokio::test]
async fn a_submitted_payout_without_its_reservation_never_reaches_the_rail() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.claimed(account, 500, 7, "w").await;
    submitted_holding(&h, &p, 0).await;
    assert_refused_before_the_rail(&h, &p, 7, "RAIL_SUBMITTED holding 0").await;
    // A higher token changes nothing: the reservation is missing, not the grant.
    assert_refused_before_the_rail(&h, &p, 8, "RAIL_SUBMITTED holding 0, newer token").await;
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"not_reserved\"}")
            .await,
        2
    );
    assert_eq!(h.rail_requests().await, 0);
    h.stop().await;
}

/// Each of the attempt insert's two reservation predicates on its own: rail-proxy is an enforcement
/// point of its own and does not lean on payment-resource's schema, so in this test's private paydb
/// the two CHECKs that make the states below impossible are dropped first.
///
/// - holding part of the amount (0 < reserved < amount): only `reserved_minor = amount_minor`
///   refuses it;
/// - a zero amount "holding" all of it (reserved = amount = 0): only `reserved_minor > 0` refuses it.
#[tokio::test]
async fn each_reservation_predicate_refuses_on_its_own_without_the_schema_checks() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    sqlx::query("ALTER TABLE payout DROP CONSTRAINT payout_reserved_ck, DROP CONSTRAINT payout_amount_ck")
        .execute(&h.admin)
        .await
        .unwrap();
    let account = h.account().await;

    let partial = h.claimed(account, 500, 7, "w").await;
    submitted_holding(&h, &partial, 200).await;
    assert_refused_before_the_rail(&h, &partial, 7, "holding 200 of 500").await;

    let zero = h.claimed(account, 0, 8, "w").await;
    submitted_holding(&h, &zero, 0).await;
    assert_refused_before_the_rail(&h, &zero, 8, "a zero amount holding 0").await;

    assert_eq!(h.rail_requests().await, 0);
    h.stop().await;
}

#[tokio::test]
async fn an_attempt_the_rail_never_received_is_abandoned_only_after_the_deadline() {
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        c.rail_timeout = Duration::from_millis(200);
        c.abandon_after = Duration::from_secs(60);
    })
    .await;
    let account = h.account().await;
    let p = h.payout(account, 700, 30, "worker-dead").await;
    // The crash between recording the attempt and forwarding it: outcome NULL, the rail never saw it.
    h.unanswered_attempt(&p, 30).await;

    // Before the deadline: unknown, nothing recorded.
    let (status, body) = h.resolve(p.id, Some("31")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("RAIL_OUTCOME_UNKNOWN"))
    );
    assert_eq!(h.rows_for(p.id).await, vec![(None, false, 30, None)]);

    // Past the deadline (the attempt is dated back, by the database clock): abandoned, resolved.
    sqlx::query(
        "UPDATE rail_submission SET submitted_at = now() - interval '61 seconds' WHERE payout_id = $1",
    )
    .bind(p.id)
    .execute(&h.admin)
    .await
    .unwrap();
    let (status, body) = h.resolve(p.id, Some("31")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "TIMEOUT");
    assert!(body["abandonedAt"].is_string(), "{body}");
    assert!(body["resolvedAt"].is_string(), "{body}");
    assert_eq!(h.metric("rail_proxy_attempts_abandoned_total").await, 1);
    // Asking again answers the same, and nothing was ever forwarded.
    let (status, again) = h.resolve(p.id, Some("32")).await;
    assert_eq!(
        (status, &again["abandonedAt"]),
        (StatusCode::OK, &body["abandonedAt"])
    );
    assert_eq!(h.metric("rail_proxy_attempts_abandoned_total").await, 1);
    let (status, dup) = h.submit(&p, 33).await;
    assert_eq!(
        (status, dup["code"].as_str()),
        (StatusCode::CONFLICT, Some("DUPLICATE_ATTEMPT"))
    );
    assert_eq!(h.rail_requests().await, 0);

    // An attempt the rail did receive is never abandoned, however old: it is resolved from the rail.
    let q = h.payout(account, 300, 40, "w").await;
    h.stub_mode("timeout").await;
    let (_, first) = h.submit(&q, 40).await;
    assert_eq!(first["outcome"], "TIMEOUT", "{first}");
    sqlx::query("UPDATE rail_submission SET submitted_at = now() - interval '1 hour' WHERE payout_id = $1")
        .bind(q.id)
        .execute(&h.admin)
        .await
        .unwrap();
    let (status, resolved) = h.resolve(q.id, Some("41")).await;
    assert_eq!(
        (status, resolved["outcome"].as_str()),
        (StatusCode::OK, Some("ACKED")),
        "{resolved}"
    );
    assert!(resolved["abandonedAt"].is_null());
    h.stop().await;
}

#[tokio::test]
async fn writes_need_the_executor_credential_reads_and_probes_do_not() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 100, 5, "w").await;
    let before = (h.submissions_rows().await, h.high_water_rows().await);
    for (path, body) in [
        ("/v1/submissions".to_owned(), Some(json!({"payoutId": p.id}))),
        (format!("/v1/submissions/{}/resolve", p.id), None),
    ] {
        for auth in [
            None,
            Some("Bearer wrong-credential-wrong-credential"),
            Some("Basic eDp5"),
        ] {
            let mut req = h.http.post(format!("{}{path}", h.proxy.url())).header(TOKEN, "9");
            if let Some(b) = &body {
                req = req.json(b);
            }
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path} {auth:?}");
            assert_eq!(
                resp.headers()
                    .get("www-authenticate")
                    .map(|v| v.to_str().unwrap().to_owned()),
                Some("Bearer".to_owned())
            );
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["code"], "UNAUTHENTICATED");
        }
    }
    assert_eq!((h.submissions_rows().await, h.high_water_rows().await), before);
    assert_eq!(h.rail_requests().await, 0);
    for path in [
        format!("/v1/submissions/{}", p.id),
        "/healthz".into(),
        "/readyz".into(),
        "/metrics".into(),
        "/openapi.yaml".into(),
    ] {
        let resp = h
            .http
            .get(format!("{}{path}", h.proxy.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    h.stop().await;

    // The deadline must exceed the rail timeout.
    let mut bad = Config::new("postgres://payapp@127.0.0.1:1/paydb", "http://127.0.0.1:1");
    bad.abandon_after = bad.rail_timeout;
    assert!(rail_proxy::spawn(bad.with_grants(grants())).await.is_err());
}

// ---- a lost attempt reply ----------------------------------------------------------------------

/// The executor's default request timeout (payout-executor's `--http-timeout-ms`): a submission
/// not answered within it is dropped by the executor, its handler with it.
const EXECUTOR_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A submission as the executor sees it: the answer, or `None` when none came within its request
/// timeout (the request is then dropped).
async fn submit_as_executor(h: &Harness, payout: &Payout, token: i64) -> Option<(StatusCode, Value)> {
    tokio::time::timeout(EXECUTOR_REQUEST_TIMEOUT, h.submit(payout, token))
        .await
        .ok()
}

/// What a submission whose attempt INSERT committed but lost its reply left behind, and what the
/// executor's retry of it got (`None`: no answer within the executor's request timeout).
struct LostReplyEvidence {
    first: Option<(StatusCode, Value)>,
    rail_after_first: usize,
    rows: Vec<(Option<String>, bool, i64, Option<String>)>,
    retry: Option<(StatusCode, Value)>,
    rail_after_retry: usize,
    acked: u64,
}

/// One payout submitted with `fault` on (its attempt commits, the reply is lost or never comes, as
/// when paydb's primary dies with the reply in flight), then submitted again, as the executor
/// retries (that insert's reply is lost too: it finds the first request's attempt).
async fn lost_reply_scenario(fault: Fault) -> LostReplyEvidence {
    let h = Harness::start_with(RailFence::from_flag(true), |c| c.fault = Some(fault)).await;
    let account = h.account().await;
    let p = h.payout(account, 1_200, 10, "worker-a").await;
    let first = submit_as_executor(&h, &p, 10).await;
    let rail_after_first = h.rail_requests().await;
    let rows = h.rows_for(p.id).await;
    let retry = submit_as_executor(&h, &p, 11).await;
    let evidence = LostReplyEvidence {
        first,
        rail_after_first,
        rows,
        retry,
        rail_after_retry: h.rail_requests().await,
        acked: h.metric("rail_proxy_submissions_total{outcome=\"acked\"}").await,
    };
    h.stop().await;
    evidence
}

/// The invariants the lost-reply tests assert, as a list of violations (empty = as it should be).
fn lost_reply_violations(e: &LostReplyEvidence) -> Vec<&'static str> {
    let mut v = Vec::new();
    let Some(first) = &e.first else {
        return vec!["the submission whose reply was lost was not answered in time"];
    };
    if first.0 != StatusCode::OK || first.1["outcome"] != "ACKED" {
        v.push("the submission whose reply was lost was not forwarded");
    }
    if e.rail_after_first != 1 {
        v.push("the rail did not see exactly one forward");
    }
    let recorded = e.rows.len() == 1
        && e.rows[0].0.as_deref() == Some("ACKED")
        && e.rows[0].1
        && e.rows[0].3.is_some()
        && first.1["railReference"].as_str() == e.rows[0].3.as_deref();
    if !recorded {
        v.push("the attempt does not record the forward's outcome");
    }
    if !matches!(&e.retry, Some((StatusCode::CONFLICT, body)) if body["code"] == "DUPLICATE_ATTEMPT") {
        v.push("the retry was not refused DUPLICATE_ATTEMPT");
    }
    if e.rail_after_retry != e.rail_after_first {
        v.push("the retry reached the rail");
    }
    if e.acked != 1 {
        v.push("the forward was not counted acked");
    }
    v
}

/// The answers of a lost-reply scenario whose two submissions were both answered.
fn answers(e: &LostReplyEvidence) -> (&(StatusCode, Value), &(StatusCode, Value)) {
    match (&e.first, &e.retry) {
        (Some(first), Some(retry)) => (first, retry),
        _ => panic!(
            "unanswered within the executor's request timeout: {:?} {:?}",
            e.first, e.retry
        ),
    }
}

/// The failover bug: the attempt INSERT committed, its reply was lost, and the submission used to
/// answer 503 and never forward (the payout then waited out the abandonment deadline). The
/// submission reads its own attempt back and forwards it, once.
#[tokio::test]
async fn an_attempt_whose_insert_reply_was_lost_is_read_back_and_forwarded_once() {
    read_back_and_forwarded_once(Fault::LoseAttemptReply).await;
}

/// With `fault`, the attempt is read back and forwarded once; the retry finds it, answered.
async fn read_back_and_forwarded_once(fault: Fault) {
    let e = lost_reply_scenario(fault).await;
    assert_eq!(lost_reply_violations(&e), Vec::<&str>::new(), "{:?}", e.first);
    let (first, retry) = answers(&e);
    assert_eq!(e.rows[0].2, 10);
    assert_eq!(retry.1["submissionId"], first.1["submissionId"]);
    assert_eq!(retry.1["outcome"], "ACKED");
    assert_eq!(retry.1["railReference"], first.1["railReference"]);
}

/// Negative control: with the read-back skipped (test code only), the same lost reply answers 503
/// and the rail never hears of the payout, so the test above would fail without the read-back (as
/// the retry does: a lost reply that is not read back is a 503 whatever the insert did).
#[tokio::test]
async fn negative_control_without_the_read_back_a_lost_reply_is_never_forwarded() {
    let e = lost_reply_scenario(Fault::LoseAttemptReplyNoReadBack).await;
    let violations = lost_reply_violations(&e);
    assert!(
        violations.contains(&"the submission whose reply was lost was not forwarded")
            && violations.contains(&"the rail did not see exactly one forward"),
        "{violations:?}"
    );
    let (first, retry) = answers(&e);
    assert_eq!(
        (first.0, first.1["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("UNAVAILABLE")),
        "{}",
        first.1
    );
    assert_eq!((e.rail_after_first, e.rail_after_retry), (0, 0));
    // The attempt did commit: unanswered, left to resolution and, in the end, abandonment.
    assert_eq!(e.rows, vec![(None, false, 10, None)]);
    assert_eq!(retry.0, StatusCode::SERVICE_UNAVAILABLE, "{}", retry.1);
}

/// The kind tier's failover bug: paydb's primary vanished without a connection reset, so the
/// attempt INSERT committed (and reached the standby) but its reply never came, and the
/// submission waited until the executor's request timeout dropped it: the attempt was never
/// forwarded, and resolution abandoned the payout (RAIL_NEVER_RECEIVED). The INSERT's own bound
/// (`ATTEMPT_INSERT_TIMEOUT`) ends the wait as a lost reply: the attempt is read back on another
/// connection and forwarded once, within the executor's request timeout; the retry (whose insert
/// stalls too) finds it and answers DUPLICATE_ATTEMPT.
#[tokio::test]
async fn an_attempt_whose_insert_reply_never_comes_is_read_back_after_the_bound_and_forwarded_once() {
    read_back_and_forwarded_once(Fault::StallAttemptReply).await;
}

/// Negative control: the same stalled reply awaited without the bound (test code only) is never
/// answered within the executor's request timeout, and the attempt it committed is never forwarded
/// — what the kind tier saw — so the test above would fail without the bound.
#[tokio::test]
async fn negative_control_without_the_bound_a_stalled_reply_is_never_answered_nor_forwarded() {
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        c.fault = Some(Fault::StallAttemptReplyNoBound);
    })
    .await;
    let account = h.account().await;
    let p = h.payout(account, 1_200, 10, "worker-a").await;
    let first = submit_as_executor(&h, &p, 10).await;
    assert_eq!(first, None, "answered although its insert never replied");
    // The attempt did commit; the executor has given up on the request, and the rail never heard
    // of it: unanswered, left to resolution and, in the end, abandonment.
    assert_eq!(h.rows_for(p.id).await, vec![(None, false, 10, None)]);
    assert_eq!(h.rail_requests().await, 0);
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"acked\"}").await,
        0
    );
    // The executor dropped the request, and the stalled handler went with it: the proxy stops.
    dlock_testkit::wait::within("the proxy and the stub to stop", h.stop()).await;
}

/// Only the request that created an attempt forwards it: a lost reply read back that finds another
/// request's unanswered attempt (here one whose proxy crashed before forwarding) answers
/// DUPLICATE_ATTEMPT, and one that finds no attempt (the insert did not commit: the payout holds no
/// reservation) answers 503 as before. Neither reaches the rail.
#[tokio::test]
async fn a_lost_reply_read_back_forwards_only_its_own_attempt() {
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        c.fault = Some(Fault::LoseAttemptReply);
    })
    .await;
    let account = h.account().await;
    let p = h.payout(account, 700, 30, "worker-dead").await;
    h.unanswered_attempt(&p, 30).await;
    let (status, dup) = h.submit(&p, 31).await;
    assert_eq!(
        (status, dup["code"].as_str(), &dup["outcome"]),
        (StatusCode::CONFLICT, Some("DUPLICATE_ATTEMPT"), &Value::Null),
        "{dup}"
    );
    assert_eq!(h.rows_for(p.id).await, vec![(None, false, 30, None)]);

    let unreserved = h.claimed(account, 100, 32, "worker-a").await;
    let (status, body) = h.submit(&unreserved, 32).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("UNAVAILABLE")),
        "{body}"
    );
    assert_eq!(h.rows_for(unreserved.id).await, vec![]);
    assert_eq!(h.rail_requests().await, 0);
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"duplicate_attempt\"}")
            .await,
        1
    );
    h.stop().await;
}

/// Makes the attempts recorded from now on already `secs` old by the database clock (this test's
/// private paydb: the attempt insert takes `submitted_at` from its default), as if the failover had
/// lasted that long before the read-back.
async fn attempts_recorded_aged(h: &Harness, secs: u32) {
    // DDL takes no bind parameters; `secs` is a number.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE rail_submission ALTER COLUMN submitted_at SET DEFAULT now() - interval '{secs} seconds'"
    )))
    .execute(&h.admin)
    .await
    .unwrap();
}

/// The abandonment race: a resolution abandons an attempt the rail has never seen once it is past
/// the deadline, so a read-back must not forward an attempt that could be abandoned meanwhile. It
/// forwards only below half of what the deadline leaves after the rail timeout; an older attempt
/// answers 503 as before, and the executor's way on (retry, resolution) ends it without a payment.
#[tokio::test]
async fn a_lost_reply_attempt_past_half_the_abandonment_deadline_is_not_forwarded() {
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        c.fault = Some(Fault::LoseAttemptReply);
        c.rail_timeout = Duration::from_millis(200);
        c.abandon_after = Duration::from_secs(60);
    })
    .await;
    let account = h.account().await;

    // Past (60 s - 0.2 s) / 2 = 29.9 s, yet short of the deadline itself.
    attempts_recorded_aged(&h, 40).await;
    let old = h.payout(account, 500, 10, "worker-a").await;
    let (status, body) = h.submit(&old, 10).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("UNAVAILABLE")),
        "{body}"
    );
    assert_eq!(h.rail_requests().await, 0, "an aged attempt was forwarded");
    assert_eq!(h.rows_for(old.id).await, vec![(None, false, 10, None)]);
    let (status, dup) = h.submit(&old, 11).await;
    assert_eq!(
        (status, dup["code"].as_str()),
        (StatusCode::CONFLICT, Some("DUPLICATE_ATTEMPT"))
    );
    // Past the deadline the resolution abandons it (the rail never saw it), and nothing was paid.
    sqlx::query(
        "UPDATE rail_submission SET submitted_at = now() - interval '61 seconds' WHERE payout_id = $1",
    )
    .bind(old.id)
    .execute(&h.admin)
    .await
    .unwrap();
    let (status, resolved) = h.resolve(old.id, Some("11")).await;
    assert_eq!(
        (status, resolved["outcome"].as_str()),
        (StatusCode::OK, Some("TIMEOUT")),
        "{resolved}"
    );
    assert!(resolved["abandonedAt"].is_string(), "{resolved}");
    assert_eq!(h.rail_requests().await, 0);

    // Below the bound the same lost reply is forwarded: the guard is half the deadline, not "never".
    attempts_recorded_aged(&h, 20).await;
    let young = h.payout(account, 300, 12, "worker-a").await;
    let (status, body) = h.submit(&young, 12).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::OK, Some("ACKED")),
        "{body}"
    );
    assert_eq!(h.rail_requests().await, 1);
    assert_eq!(h.rail().await["requests"][0]["idempotencyKey"], json!(young.key));
    h.stop().await;
}

/// An attempt INSERT that failed for a reason that cannot have committed it (here a CHECK refusing
/// its token) is not read back: it answers 500 as before. The payout already has another request's
/// attempt, which PostgreSQL checks only after the CHECK: a read-back would have found that attempt
/// and answered 409 DUPLICATE_ATTEMPT.
#[tokio::test]
async fn a_refused_attempt_insert_is_not_read_back() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let p = h.payout(account, 700, 30, "worker-a").await;
    h.unanswered_attempt(&p, 30).await;
    sqlx::query(
        "ALTER TABLE rail_submission ADD CONSTRAINT test_refuse_ck CHECK (presented_token < 31) NOT VALID",
    )
    .execute(&h.admin)
    .await
    .unwrap();

    let (status, body) = h.submit(&p, 31).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, Some("INTERNAL")),
        "{body}"
    );
    assert_eq!(h.rows_for(p.id).await, vec![(None, false, 30, None)]);
    assert_eq!(h.rail_requests().await, 0);
    assert_eq!(
        h.metric("rail_proxy_submissions_total{outcome=\"duplicate_attempt\"}")
            .await,
        0
    );

    // The error itself, as the proxy met it: a constraint, not a lost reply.
    let payout = rail_proxy::sql::select_payout(&h.admin, p.id)
        .await
        .unwrap()
        .expect("the payout");
    let err = rail_proxy::sql::insert_attempt(&h.admin, &payout, 31, Uuid::new_v4())
        .await
        .expect_err("the CHECK refuses it");
    assert!(
        matches!(&err, sqlx::Error::Database(e) if e.code().as_deref() == Some("23514")),
        "{err:?}"
    );
    assert!(!rail_proxy::proxy::reply_may_be_lost(&err));
    h.stop().await;
}

// ---- signed grants ------------------------------------------------------------------------------

/// A fenced call with exactly this token and grant header (none when `None`): a submission of
/// `payout`, or (`resolve`) its resolution.
async fn fenced(
    h: &Harness,
    resolve: bool,
    payout: Uuid,
    token: i64,
    grant: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = if resolve {
        h.http
            .post(format!("{}/v1/submissions/{payout}/resolve", h.proxy.url()))
    } else {
        h.http
            .post(format!("{}/v1/submissions", h.proxy.url()))
            .json(&json!({"payoutId": payout}))
    };
    req = req.bearer_auth(EXECUTOR).header(TOKEN, token.to_string());
    if let Some(g) = grant {
        req = req.header(GRANT, g);
    }
    let resp = req.send().await.unwrap();
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

fn signed(key: &dlock_grant::SigningKey, lock_key: &str, token: i64) -> String {
    key.sign(&dlock_grant::Claims {
        lock_service: "tests",
        lock_key,
        token,
        owner_id: "test-holder",
        session_id: Uuid::nil(),
    })
    .unwrap()
}

#[tokio::test]
async fn submit_and_resolve_refuse_every_bad_grant_and_paydb_is_untouched() {
    let h = Harness::start(RailFence::from_flag(true)).await;
    let account = h.account().await;
    let key = dlock_common::grant::account_key(account);
    let p = h.payout(account, 100, 5, "holder").await;
    let stranger = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("stranger").unwrap());
    let rightful = |t: i64| grant(account, &t.to_string()).unwrap();
    let mut flipped = rightful(50).into_bytes();
    let at = flipped.len() - 5; // inside the signature
    flipped[at] ^= 0x01;
    let flipped = String::from_utf8(flipped).unwrap();
    let cases = [
        ("a forged integer with no grant", None, "GRANT_INVALID"),
        (
            "a grant for another account",
            grant(Uuid::new_v4(), "50"),
            "GRANT_WRONG_RESOURCE",
        ),
        (
            "a grant for a key that is no account",
            Some(signed(&GRANT_KEY, "bench:1", 50)),
            "GRANT_WRONG_RESOURCE",
        ),
        ("a grant with a flipped byte", Some(flipped), "GRANT_INVALID"),
        (
            "a grant by an unknown key",
            Some(signed(&stranger, &key, 50)),
            "GRANT_UNKNOWN_SIGNER",
        ),
        (
            "a grant whose token differs from the header",
            Some(rightful(51)),
            "GRANT_INVALID",
        ),
    ];
    for resolve in [false, true] {
        if resolve {
            // An attempt to resolve: the rightful submission first.
            let (status, body) = fenced(&h, false, p.id, 50, Some(&rightful(50))).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        for (what, grant_header, code) in &cases {
            let before = h.db.digest().await;
            let rail_before = h.rail_requests().await;
            let (status, body) = fenced(&h, resolve, p.id, 50, grant_header.as_deref()).await;
            assert_eq!(
                (status, body["code"].as_str()),
                (StatusCode::FORBIDDEN, Some(*code)),
                "resolve={resolve} with {what}: {body}"
            );
            assert_eq!(
                h.db.digest().await,
                before,
                "resolve={resolve} with {what} changed paydb"
            );
            assert_eq!(h.rail_requests().await, rail_before, "the rail heard of it");
        }
    }
    let (status, body) = fenced(&h, true, p.id, 50, Some(&rightful(50))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let metrics = h.metrics().await;
    for (code, n) in [
        ("GRANT_INVALID", 6),
        ("GRANT_WRONG_RESOURCE", 4),
        ("GRANT_UNKNOWN_SIGNER", 2),
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l == format!("grant_refused_total{{code=\"{code}\"}} {n}")),
            "{code} {n} in\n{metrics}"
        );
    }
    h.stop().await;
}

/// The attack at rail-proxy: the holder of `account:B` has two payouts of B reserved; an attacker
/// holding a higher token granted on `account:A` submits one of them; then the holder submits the
/// other. `Err` names the violation.
async fn cross_account_token_at_the_rail(verify: bool) -> Result<(), String> {
    let h = Harness::start_with(RailFence::from_flag(true), |c| {
        if !verify {
            c.grants = dlock_common::grant::GrantPolicy::Off;
        }
    })
    .await;
    let (a, b) = (h.account().await, h.account().await);
    let first = h.payout(b, 100, 5, "holder-b").await;
    let second = h.payout(b, 100, 5, "holder-b").await;
    let mut violations = Vec::new();
    let (status, body) = fenced(&h, false, first.id, 50, grant(a, "50").as_deref()).await;
    if status != StatusCode::FORBIDDEN {
        violations.push(format!(
            "account A's grant was accepted for B's payout: {status} {body}"
        ));
    }
    let (status, body) = fenced(&h, false, second.id, 5, grant(b, "5").as_deref()).await;
    if status != StatusCode::OK {
        violations.push(format!(
            "the rightful holder of account B was fenced out: {status} {}",
            body["code"]
        ));
    }
    h.stop().await;
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

#[tokio::test]
async fn another_accounts_token_cannot_raise_the_mark_of_the_holders_account() {
    cross_account_token_at_the_rail(true).await.unwrap();
}

#[tokio::test]
async fn negative_control_with_verification_off_another_accounts_token_fences_the_holder_out_at_the_rail() {
    let violation = cross_account_token_at_the_rail(false)
        .await
        .expect_err("with verification off, the attack must succeed");
    assert!(
        violation.contains("was accepted") && violation.contains("FENCED_OUT"),
        "{violation}"
    );
}
