//! The HTTP API against a server spawned in-process on an ephemeral port, over a real paydb:
//! document/router agreement, idempotent creation, keyset paging, claim/adopt/transition fencing,
//! posting outcomes, and bad input on every endpoint (4xx with a code, nothing written).

mod common;

use std::collections::BTreeSet;

use common::{EUR_SETTLEMENT, Fixture, fixture};
use dlock_common::ApiError;
use payment_resource::accounts::Accounts;
use payment_resource::api::{OPENAPI_YAML, ROUTES};
use payment_resource::error::PaymentError;
use payment_resource::{Config, Fencing, RunningServer};
use reqwest::{Client, Method};
use serde_json::{Value, json};
use uuid::Uuid;

struct Api {
    server: RunningServer,
    client: Client,
}

impl Api {
    async fn start(f: &Fixture, fencing: Fencing) -> Api {
        let server = payment_resource::spawn(
            Config::ephemeral(f.db.app_url())
                .with_fencing(fencing)
                .with_credentials(common::credentials())
                .with_grants(common::grants()),
        )
        .await
        .expect("spawn");
        Api {
            server,
            client: Client::new(),
        }
    }

    /// Sends a request; a body is sent as `application/json` text exactly as given.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let auth = common::token_for(method.as_str(), path);
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.server.url()));
        if let Some(a) = auth {
            req = req.bearer_auth(a);
        }
        if let Some(t) = token {
            req = req.header("X-Fencing-Token", t);
            if let Some(g) = self.grant_for(path, t).await {
                req = req.header("X-Fencing-Grant", g);
            }
        }
        if let Some(b) = body {
            req = req.header("Content-Type", "application/json").body(b.to_owned());
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    /// The grant an executor holding `account:<the payout's account>` at token `t` presents with an
    /// executor call on `path` (`None` for other paths and for a token that is not one): these
    /// tests are about the API, so every fenced call carries its rightful grant (tests/grants.rs
    /// is about the wrong ones). An unknown payout gets a grant for some account: the service
    /// answers UNKNOWN_PAYOUT first.
    async fn grant_for(&self, path: &str, t: &str) -> Option<String> {
        let token = t.parse::<dlock_common::FencingToken>().ok()?;
        let rest = path.strip_prefix("/v1/payouts/")?;
        let (id, op) = rest.split_once('/')?;
        if !matches!(op, "claim" | "transition" | "post") {
            return None;
        }
        let id: Uuid = id.parse().ok()?;
        let account = match self
            .client
            .get(format!("{}/v1/payouts/{id}", self.server.url()))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r
                .json::<Value>()
                .await
                .ok()
                .and_then(|v| v["accountId"].as_str().and_then(|a| a.parse().ok())),
            _ => None,
        };
        Some(common::grant(account.unwrap_or_else(Uuid::new_v4), token.get()))
    }

    async fn post(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.call(Method::POST, path, token, Some(&body.to_string()))
            .await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(Method::GET, path, None, None).await
    }

    async fn account(&self, opening: i64, currency: &str) -> String {
        let (s, v) = self
            .post(
                "/v1/accounts",
                None,
                json!({"currency": currency, "openingBalanceMinor": opening}),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        v["accountId"].as_str().unwrap().to_owned()
    }

    async fn payout(&self, account: &str, amount: i64) -> String {
        let (s, v) = self
            .post(
                "/v1/payouts",
                None,
                json!({"accountId": account, "amountMinor": amount, "currency": "EUR",
                       "idempotencyKey": Uuid::new_v4().to_string()}),
            )
            .await;
        assert_eq!(s, 201, "{v}");
        v["payoutId"].as_str().unwrap().to_owned()
    }

    async fn claim(&self, payout: &str, token: i64, owner: &str) -> (u16, Value) {
        self.post(
            &format!("/v1/payouts/{payout}/claim"),
            Some(&token.to_string()),
            json!({"ownerId": owner}),
        )
        .await
    }

    async fn transition(&self, payout: &str, token: i64, from: &str, to: &str) -> (u16, Value) {
        self.post(
            &format!("/v1/payouts/{payout}/transition"),
            Some(&token.to_string()),
            json!({"from": from, "to": to}),
        )
        .await
    }

    async fn post_payout(&self, payout: &str, token: i64) -> (u16, Value) {
        self.call(
            Method::POST,
            &format!("/v1/payouts/{payout}/post"),
            Some(&token.to_string()),
            None,
        )
        .await
    }

    /// Claim with `token` and walk to RAIL_ACKED.
    async fn acked(&self, account: &str, amount: i64, token: i64) -> String {
        let p = self.payout(account, amount).await;
        assert_eq!(self.claim(&p, token, &format!("w{token}")).await.0, 200);
        assert_eq!(
            self.transition(&p, token, "CLAIMED", "RAIL_SUBMITTED").await.0,
            200
        );
        assert_eq!(
            self.transition(&p, token, "RAIL_SUBMITTED", "RAIL_ACKED").await.0,
            200
        );
        p
    }

    async fn metrics(&self) -> String {
        let (s, v) = self.get("/metrics").await;
        assert_eq!(s, 200);
        v.as_str().unwrap().to_owned()
    }
}

fn metric(text: &str, series: &str) -> u64 {
    dlock_testkit::metrics::counter(text, series).unwrap_or(0)
}

/// (METHOD, path) of every operation in the OpenAPI document, read line by line: paths are the
/// two-space-indented keys under `paths:`, operations the four-space-indented method keys.
fn documented_operations(doc: &str) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for line in doc.lines() {
        if !line.starts_with(' ') {
            in_paths = line.trim_end() == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /") {
            path = Some(format!("/{}", p.trim_end().trim_end_matches(':')));
        } else if let Some(m) = line.strip_prefix("    ")
            && !m.starts_with(' ')
        {
            let m = m.trim_end().trim_end_matches(':');
            if ["get", "post", "put", "patch", "delete"].contains(&m)
                && let Some(p) = &path
            {
                ops.insert((m.to_uppercase(), p.clone()));
            }
        }
    }
    ops
}

#[tokio::test]
async fn openapi_document_and_router_match() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;

    let documented = documented_operations(OPENAPI_YAML);
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented, routed,
        "docs/openapi/payment-resource.yaml and api::ROUTES differ"
    );

    // Every listed route is really served (not the JSON 404 fallback, not 405), and other methods
    // on the same paths are 405.
    let paths: BTreeSet<&str> = ROUTES.iter().map(|(_, p)| *p).collect();
    let concrete = |p: &str| {
        p.replace("{accountId}", &Uuid::new_v4().to_string())
            .replace("{payoutId}", &Uuid::new_v4().to_string())
    };
    for path in paths {
        for method in ["GET", "POST", "PUT", "DELETE"] {
            let (s, v) = api
                .call(
                    Method::from_bytes(method.as_bytes()).unwrap(),
                    &concrete(path),
                    None,
                    None,
                )
                .await;
            if routed.contains(&(method.to_owned(), path.to_owned())) {
                assert!(s != 405 && v["code"] != "NOT_FOUND", "{method} {path}: {s} {v}");
            } else {
                assert_eq!(s, 405, "{method} {path} should not be routed: {v}");
            }
        }
    }
    let (s, v) = api.get("/v1/nope").await;
    assert_eq!((s, v["code"].as_str()), (404, Some("NOT_FOUND")));

    // The served document is the repository's.
    let resp = api
        .client
        .get(format!("{}/openapi.yaml", api.server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), OPENAPI_YAML);
    api.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_readiness_and_metrics_are_served() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    assert_eq!(api.get("/healthz").await, (200, Value::String("ok".into())));
    assert_eq!(api.get("/readyz").await, (200, Value::String("ready".into())));
    let text = api.metrics().await;
    assert!(text.contains("# TYPE lock_fenced_out counter"), "{text}");
    assert!(text.contains("# TYPE payment_posting counter"), "{text}");
    // The must-be-zero series exist (at 0) before anything was fenced out.
    for resource in ["account", "ledger", "payout"] {
        assert!(
            text.contains(&format!("lock_fenced_out_total{{resource=\"{resource}\"}} 0")),
            "{text}"
        );
    }
    api.server.shutdown().await.unwrap();

    // Readiness follows the database: a server pointed at a closed port answers 503.
    let dead = payment_resource::spawn(
        Config::ephemeral("postgres://payapp@127.0.0.1:1/paydb").with_grants(common::grants()),
    )
    .await
    .unwrap();
    let (s, v) = Api {
        server: dead,
        client: Client::new(),
    }
    .get("/readyz")
    .await;
    assert_eq!((s, v["code"].as_str()), (503, Some("UNAVAILABLE")));
}

/// A connection paydb's administrator terminated (as a restore's `DROP DATABASE … WITH (FORCE)`
/// or a failover does) answers its next statement with SQLSTATE 57P01: paydb is unavailable — 503,
/// for the client to retry — not an internal error.
#[tokio::test]
async fn a_statement_on_a_connection_an_administrator_terminated_is_answered_unavailable() {
    let f = fixture().await;
    let account = f.customer(1_000).await;
    let accounts = Accounts::new(f.db.one_unpinged_app_connection().await);
    accounts.get(account).await.expect("read before");
    f.db.terminate_app_connections().await;

    let err = accounts.get(account).await.unwrap_err();
    assert!(
        matches!(&err, PaymentError::Database(sqlx::Error::Database(e)) if e.code().as_deref() == Some("57P01")),
        "{err:?}"
    );
    let answer = ApiError::from(err);
    assert_eq!(
        (answer.status.as_u16(), answer.code),
        (503, "UNAVAILABLE"),
        "{}",
        answer.message
    );
}

#[tokio::test]
async fn seeded_accounts_are_present_and_consistent() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let (s, v) = api.get("/v1/accounts/00000000-0000-4000-8000-000000000001").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["kind"], "CUSTOMER");
    assert_eq!(v["currency"], "EUR");
    assert_eq!(v["balanceMinor"], 100_000);
    assert_eq!(v["consistent"], true);
    let (s, v) = api.get(&format!("/v1/accounts/{EUR_SETTLEMENT}")).await;
    assert_eq!((s, &v["kind"]), (200, &json!("SETTLEMENT")));
    let (s, v) = api.get("/v1/reconciliation").await;
    assert_eq!(s, 200);
    assert_eq!(v["clean"], true, "{v}");
    assert_eq!(v["accountsChecked"], 23);
}

#[tokio::test]
async fn accounts_are_created_once_and_read_back_with_their_ledger() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let id = Uuid::new_v4();
    let body = json!({"accountId": id, "currency": "EUR", "openingBalanceMinor": 5_000});
    let (s, v) = api.post("/v1/accounts", None, body.clone()).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        v,
        json!({"accountId": id, "currency": "EUR", "kind": "CUSTOMER", "balanceMinor": 5_000,
               "openingBalanceMinor": 5_000, "fence": 0, "reservedMinor": 0, "availableMinor": 5_000,
               "ledgerDebitMinor": 0, "ledgerCreditMinor": 0,
               "expectedBalanceMinor": 5_000, "consistent": true})
    );
    assert_eq!(api.get(&format!("/v1/accounts/{id}")).await, (200, v));

    let before = f.snapshot().await;
    let (s, v) = api.post("/v1/accounts", None, body).await;
    assert_eq!((s, v["code"].as_str()), (409, Some("ACCOUNT_EXISTS")));
    let (s, v) = api
        .post(
            "/v1/accounts",
            None,
            json!({"currency": "EUR", "openingBalanceMinor": 0, "kind": "SETTLEMENT"}),
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (409, Some("SETTLEMENT_EXISTS")));
    assert_eq!(f.snapshot().await, before);

    let (s, v) = api
        .post(
            "/v1/accounts",
            None,
            json!({"currency": "CHF", "openingBalanceMinor": 0, "kind": "SETTLEMENT"}),
        )
        .await;
    assert_eq!((s, &v["kind"]), (201, &json!("SETTLEMENT")), "{v}");
}

#[tokio::test]
async fn payout_creation_is_idempotent_by_key() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(10_000, "EUR").await;
    let body = json!({"accountId": acct, "amountMinor": 250, "currency": "EUR", "idempotencyKey": "order-1"});
    let (s, first) = api.post("/v1/payouts", None, body.clone()).await;
    assert_eq!(s, 201, "{first}");
    assert_eq!(first["state"], "PENDING");
    assert_eq!(first["attemptCount"], 0);
    let (s, again) = api.post("/v1/payouts", None, body).await;
    assert_eq!((s, &again), (200, &first));

    let (s, v) = api
        .post(
            "/v1/payouts",
            None,
            json!({"accountId": acct, "amountMinor": 251, "currency": "EUR", "idempotencyKey": "order-1"}),
        )
        .await;
    assert_eq!((s, v["code"].as_str()), (409, Some("IDEMPOTENCY_CONFLICT")));
    assert_eq!(v["payoutId"], first["payoutId"]);
    assert_eq!(f.snapshot().await.payouts, 1);
    let (s, v) = api
        .get(&format!("/v1/payouts/{}", first["payoutId"].as_str().unwrap()))
        .await;
    assert_eq!((s, v), (200, first));
}

#[tokio::test]
async fn keyset_paging_has_no_duplicates_or_gaps() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(1_000_000, "EUR").await;
    let mut created = BTreeSet::new();
    for _ in 0..23 {
        created.insert(api.payout(&acct, 10).await);
    }
    // Two claimed payouts leave the PENDING queue.
    let claimed: Vec<String> = created.iter().take(2).cloned().collect();
    for p in &claimed {
        assert_eq!(api.claim(p, 3, "w").await.0, 200);
    }

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &after {
            Some(c) => format!("/v1/payouts?state=PENDING&limit=5&after={c}"),
            None => "/v1/payouts?state=PENDING&limit=5".to_owned(),
        };
        let (s, v) = api.get(&path).await;
        assert_eq!(s, 200, "{v}");
        pages += 1;
        let items = v["items"].as_array().unwrap();
        assert!(items.len() <= 5);
        for it in items {
            assert_eq!(it["state"], "PENDING");
            seen.push((
                it["createdAt"].as_str().unwrap().to_owned(),
                it["payoutId"].as_str().unwrap().to_owned(),
            ));
        }
        match v["nextCursor"].as_str() {
            Some(c) => after = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 10, "paging does not terminate");
    }
    let ids: Vec<&String> = seen.iter().map(|(_, id)| id).collect();
    let unique: BTreeSet<String> = ids.iter().map(|s| (*s).clone()).collect();
    assert_eq!(ids.len(), unique.len(), "duplicates across pages");
    let expected: BTreeSet<String> = created
        .difference(&claimed.into_iter().collect())
        .cloned()
        .collect();
    assert_eq!(unique, expected, "gaps or strays across pages");
    // Oldest first, on (createdAt, payoutId).
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| {
        let ta = chrono::DateTime::parse_from_rfc3339(&a.0).unwrap();
        let tb = chrono::DateTime::parse_from_rfc3339(&b.0).unwrap();
        ta.cmp(&tb).then(a.1.cmp(&b.1))
    });
    assert_eq!(seen, sorted);
    assert_eq!(pages, 5, "21 items in pages of 5");
}

#[tokio::test]
async fn claim_adopt_and_transition_are_fenced() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(10_000, "EUR").await;
    let p = api.payout(&acct, 1_000).await;

    let (s, v) = api.claim(&p, 5, "w1").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            &v["payout"]["state"],
            &v["payout"]["claimToken"],
            &v["adopted"],
            &v["idempotent"]
        ),
        (&json!("CLAIMED"), &json!(5), &json!(false), &json!(false))
    );
    // The same grant again: nothing changes.
    let (s, v) = api.claim(&p, 5, "w1").await;
    assert_eq!(
        (s, &v["idempotent"], &v["payout"]["attemptCount"]),
        (200, &json!(true), &json!(1))
    );
    // An equal token from someone else, and a lower one: fenced out.
    let (s, v) = api.claim(&p, 5, "w2").await;
    assert_eq!((s, v["code"].as_str()), (409, Some("FENCED_OUT")));
    let (s, v) = api.claim(&p, 4, "w2").await;
    assert_eq!(s, 409);
    assert_eq!(
        v,
        json!({"code": "FENCED_OUT", "message": v["message"], "presented": 4, "highest": 5,
               "resourceType": "payout", "resourceId": p, "ownerId": "w1"})
    );

    assert_eq!(api.transition(&p, 5, "CLAIMED", "RAIL_SUBMITTED").await.0, 200);
    // A newer holder adopts the in-flight payout and resumes from its state.
    let (s, v) = api.claim(&p, 9, "w2").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            &v["adopted"],
            &v["payout"]["state"],
            &v["payout"]["attemptCount"],
            &v["payout"]["claimedBy"]
        ),
        (&json!(true), &json!("RAIL_SUBMITTED"), &json!(2), &json!("w2"))
    );
    // The old holder can no longer move it.
    let (s, v) = api.transition(&p, 5, "RAIL_SUBMITTED", "RAIL_ACKED").await;
    assert_eq!(
        (s, v["code"].as_str(), &v["highest"]),
        (409, Some("FENCED_OUT"), &json!(9))
    );
    let (s, v) = api.transition(&p, 9, "RAIL_SUBMITTED", "RAIL_ACKED").await;
    assert_eq!(
        (s, &v["payout"]["state"], &v["idempotent"]),
        (200, &json!("RAIL_ACKED"), &json!(false))
    );
    let (s, v) = api.transition(&p, 9, "RAIL_SUBMITTED", "RAIL_ACKED").await;
    assert_eq!((s, &v["idempotent"]), (200, &json!(true)));
    let (s, v) = api.transition(&p, 9, "CLAIMED", "RAIL_SUBMITTED").await;
    assert_eq!(
        (s, v["code"].as_str(), &v["state"]),
        (409, Some("INVALID_TRANSITION"), &json!("RAIL_ACKED"))
    );
    let (s, v) = api.transition(&p, 9, "RAIL_ACKED", "POSTED").await;
    assert_eq!((s, v["code"].as_str()), (400, Some("UNSUPPORTED_TRANSITION")));

    let (s, v) = api.post_payout(&p, 9).await;
    assert_eq!((s, &v["payout"]["state"]), (200, &json!("POSTED")), "{v}");
    let (s, v) = api.claim(&p, 12, "w3").await;
    assert_eq!(
        (s, v["code"].as_str(), &v["state"]),
        (409, Some("NOT_CLAIMABLE"), &json!("POSTED"))
    );

    let m = api.metrics().await;
    assert_eq!(metric(&m, "lock_fenced_out_total{resource=\"payout\"}"), 3, "{m}");
    assert_eq!(
        metric(&m, "lock_fenced_out_total{resource=\"account\"}"),
        0,
        "{m}"
    );
}

#[tokio::test]
async fn posting_outcomes_map_to_http() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(10_000, "EUR").await;

    let stale = api.acked(&acct, 700, 5).await;
    let newer = api.acked(&acct, 1_200, 9).await;
    let (s, v) = api.post_payout(&newer, 9).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (&v["balanceMinor"], &v["fence"], &v["idempotent"]),
        (&json!(8_800), &json!(9), &json!(false))
    );
    let (s, v) = api.post_payout(&newer, 9).await;
    assert_eq!(
        (s, &v["idempotent"], &v["balanceMinor"]),
        (200, &json!(true), &json!(8_800))
    );

    let before = f.snapshot().await;
    let (s, v) = api.post_payout(&stale, 5).await;
    assert_eq!(s, 409);
    assert_eq!(
        v,
        json!({"code": "FENCED_OUT", "message": v["message"], "presented": 5, "highest": 9,
               "resourceType": "account", "resourceId": acct, "ownerId": "w5"})
    );
    assert_eq!(f.snapshot().await, before);

    let pending = api.payout(&acct, 100).await;
    let (s, v) = api.post_payout(&pending, 11).await;
    assert_eq!(
        (s, v["code"].as_str(), &v["state"]),
        (409, Some("NOT_POSTABLE"), &json!("PENDING"))
    );

    // With reservations an account that cannot cover a payout refuses it as it enters
    // RAIL_SUBMITTED, before anything reaches the rail …
    let refused = api.payout(&acct, 50_000).await;
    assert_eq!(api.claim(&refused, 12, "w12").await.0, 200);
    let (s, v) = api.transition(&refused, 12, "CLAIMED", "RAIL_SUBMITTED").await;
    assert_eq!(
        (s, v["code"].as_str(), &v["payoutState"], &v["availableMinor"]),
        (422, Some("INSUFFICIENT_FUNDS"), &json!("FAILED"), &json!(8_100)),
        "{v}"
    );
    let (_, v) = api.get(&format!("/v1/payouts/{refused}")).await;
    assert_eq!(
        (&v["state"], &v["failureReason"]),
        (&json!("FAILED"), &json!("INSUFFICIENT_FUNDS"))
    );
    // … so (a) meets an unfunded payout only when one reached RAIL_ACKED without a reservation.
    let acct_id: Uuid = acct.parse().unwrap();
    let big = f
        .acked_unreserved(acct_id, 50_000, 13)
        .await
        .payout_id
        .to_string();
    let (s, v) = api.post_payout(&big, 13).await;
    assert_eq!(
        (s, v["code"].as_str(), &v["payoutState"]),
        (422, Some("INSUFFICIENT_FUNDS"), &json!("FAILED"))
    );
    assert_eq!(api.get(&format!("/v1/payouts/{big}")).await.1["state"], "FAILED");

    let m = api.metrics().await;
    assert_eq!(
        metric(&m, "lock_fenced_out_total{resource=\"account\"}"),
        1,
        "{m}"
    );
    assert_eq!(metric(&m, "payment_posting_total{outcome=\"posted\"}"), 1, "{m}");
    assert_eq!(
        metric(&m, "payment_posting_total{outcome=\"insufficient_funds\"}"),
        1,
        "{m}"
    );
    let (_, v) = api.get(&format!("/v1/accounts/{acct}")).await;
    assert_eq!(
        (&v["balanceMinor"], &v["consistent"]),
        (&json!(8_800), &json!(true))
    );
}

#[tokio::test]
async fn kill_switch_off_server_accepts_the_stale_token() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Disabled).await;
    let acct = api.account(10_000, "EUR").await;
    let stale = api.acked(&acct, 700, 5).await;
    let newer = api.acked(&acct, 1_200, 9).await;
    assert_eq!(api.post_payout(&newer, 9).await.0, 200);
    let (s, v) = api.post_payout(&stale, 5).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((&v["balanceMinor"], &v["fence"]), (&json!(8_100), &json!(5)));
}

/// (name, method, path, X-Fencing-Token, JSON body, expected status, expected code)
type Case = (
    String,
    Method,
    String,
    Option<String>,
    Option<String>,
    u16,
    &'static str,
);

/// Bad input on every endpoint: a 4xx with the expected code and a message, and nothing written.
#[tokio::test]
async fn bad_input_on_every_endpoint_is_rejected_with_a_code_and_writes_nothing() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(10_000, "EUR").await;
    let chf = api.account(10_000, "CHF").await; // no CHF settlement account exists
    let pending = api.payout(&acct, 100).await;
    let acked = api.acked(&acct, 100, 4).await;
    let unknown = Uuid::new_v4().to_string();
    let before = f.snapshot().await;

    let payout_body = |account: &str, amount: &str, currency: &str, key: &str| {
        format!(
            r#"{{"accountId":"{account}","amountMinor":{amount},"currency":"{currency}","idempotencyKey":"{key}"}}"#
        )
    };
    let ok_key = "fresh-key";
    let mut cases: Vec<Case> = vec![
        // POST /v1/accounts
        (
            "malformed json".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some("{".into()),
            400,
            "MALFORMED_JSON",
        ),
        (
            "currency shape".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"eur","openingBalanceMinor":1}"#.into()),
            400,
            "INVALID_CURRENCY",
        ),
        (
            "negative opening".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"EUR","openingBalanceMinor":-1}"#.into()),
            400,
            "INVALID_AMOUNT",
        ),
        (
            "float opening".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"EUR","openingBalanceMinor":10.5}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        (
            "string opening".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"EUR","openingBalanceMinor":"100"}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        (
            "overflowing opening".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"EUR","openingBalanceMinor":9223372036854775808}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        (
            "bad account id".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"accountId":"nope","currency":"EUR","openingBalanceMinor":1}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        (
            "bad kind".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"EUR","openingBalanceMinor":1,"kind":"GOLD"}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        (
            "unknown field".into(),
            Method::POST,
            "/v1/accounts".into(),
            None,
            Some(r#"{"currency":"EUR","openingBalanceMinor":1,"balance":5}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        // GET /v1/accounts/{id}
        (
            "account path".into(),
            Method::GET,
            "/v1/accounts/not-a-uuid".into(),
            None,
            None,
            400,
            "INVALID_PATH",
        ),
        (
            "unknown account".into(),
            Method::GET,
            format!("/v1/accounts/{unknown}"),
            None,
            None,
            404,
            "UNKNOWN_ACCOUNT",
        ),
        // POST /v1/payouts
        (
            "payout malformed".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(r#"{"accountId":"#.into()),
            400,
            "MALFORMED_JSON",
        ),
        (
            "payout missing field".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(format!(
                r#"{{"accountId":"{acct}","amountMinor":5,"currency":"EUR"}}"#
            )),
            400,
            "INVALID_FIELD",
        ),
        (
            "lowercase currency".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "5", "eur", ok_key)),
            400,
            "INVALID_CURRENCY",
        ),
        (
            "long currency".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "5", "EURO", ok_key)),
            400,
            "INVALID_CURRENCY",
        ),
        (
            "digit currency".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "5", "E1R", ok_key)),
            400,
            "INVALID_CURRENCY",
        ),
        (
            "zero amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "0", "EUR", ok_key)),
            400,
            "INVALID_AMOUNT",
        ),
        (
            "negative amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "-5", "EUR", ok_key)),
            400,
            "INVALID_AMOUNT",
        ),
        (
            "float amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "10.5", "EUR", ok_key)),
            400,
            "INVALID_FIELD",
        ),
        (
            // `1e3` is the integer 1000 (JSON Schema's `type: integer`, read exactly); an exponent
            // that leaves a fraction is not an integer.
            "exponent amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "15e-1", "EUR", ok_key)),
            400,
            "INVALID_FIELD",
        ),
        (
            "string amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "\"100\"", "EUR", ok_key)),
            400,
            "INVALID_FIELD",
        ),
        (
            "overflowing amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "9223372036854775808", "EUR", ok_key)),
            400,
            "INVALID_FIELD",
        ),
        (
            "huge amount".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "99999999999999999999999", "EUR", ok_key)),
            400,
            "INVALID_FIELD",
        ),
        (
            "bad uuid".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body("123", "5", "EUR", ok_key)),
            400,
            "INVALID_FIELD",
        ),
        (
            "empty key".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "5", "EUR", "")),
            400,
            "INVALID_IDEMPOTENCY_KEY",
        ),
        (
            "unknown account".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&unknown, "5", "EUR", ok_key)),
            422,
            "UNKNOWN_ACCOUNT",
        ),
        (
            "currency mismatch".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&acct, "5", "USD", ok_key)),
            422,
            "CURRENCY_MISMATCH",
        ),
        (
            "settlement account".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&EUR_SETTLEMENT.to_string(), "5", "EUR", ok_key)),
            422,
            "NOT_A_CUSTOMER_ACCOUNT",
        ),
        (
            "no settlement".into(),
            Method::POST,
            "/v1/payouts".into(),
            None,
            Some(payout_body(&chf, "5", "CHF", ok_key)),
            422,
            "NO_SETTLEMENT_ACCOUNT",
        ),
        // GET /v1/payouts
        (
            "list state".into(),
            Method::GET,
            "/v1/payouts?state=POSTED".into(),
            None,
            None,
            400,
            "INVALID_STATE",
        ),
        (
            "list limit 0".into(),
            Method::GET,
            "/v1/payouts?limit=0".into(),
            None,
            None,
            400,
            "INVALID_LIMIT",
        ),
        (
            "list limit big".into(),
            Method::GET,
            "/v1/payouts?limit=501".into(),
            None,
            None,
            400,
            "INVALID_LIMIT",
        ),
        (
            "list limit text".into(),
            Method::GET,
            "/v1/payouts?limit=ten".into(),
            None,
            None,
            400,
            "INVALID_QUERY",
        ),
        (
            "list cursor".into(),
            Method::GET,
            "/v1/payouts?after=garbage".into(),
            None,
            None,
            400,
            "INVALID_CURSOR",
        ),
        // GET /v1/payouts/{id}
        (
            "payout path".into(),
            Method::GET,
            "/v1/payouts/xyz".into(),
            None,
            None,
            400,
            "INVALID_PATH",
        ),
        (
            "unknown payout".into(),
            Method::GET,
            format!("/v1/payouts/{unknown}"),
            None,
            None,
            404,
            "UNKNOWN_PAYOUT",
        ),
    ];
    // claim / transition / post: tokens, bodies, paths, unknown payouts.
    let claim_ok = r#"{"ownerId":"w9"}"#.to_owned();
    let transition_ok = r#"{"from":"RAIL_SUBMITTED","to":"RAIL_ACKED"}"#.to_owned();
    for (op, target, body) in [
        ("claim", &pending, Some(claim_ok.clone())),
        ("transition", &acked, Some(transition_ok.clone())),
        ("post", &acked, None),
    ] {
        let path = format!("/v1/payouts/{target}/{op}");
        // (Surrounding whitespace in a header value is stripped by HTTP itself, so " 7" is "7".)
        for bad in [
            "",
            "0",
            "-1",
            "abc",
            "1.5",
            "+7",
            "7x",
            "0x7",
            "99999999999999999999",
        ] {
            cases.push((
                format!("{op} token {bad:?}"),
                Method::POST,
                path.clone(),
                Some(bad.into()),
                body.clone(),
                400,
                "INVALID_TOKEN",
            ));
        }
        cases.push((
            format!("{op} no token"),
            Method::POST,
            path.clone(),
            None,
            body.clone(),
            400,
            "INVALID_TOKEN",
        ));
        cases.push((
            format!("{op} bad path"),
            Method::POST,
            format!("/v1/payouts/nope/{op}"),
            Some("9".into()),
            body.clone(),
            400,
            "INVALID_PATH",
        ));
        let status = 404;
        cases.push((
            format!("{op} unknown payout"),
            Method::POST,
            format!("/v1/payouts/{unknown}/{op}"),
            Some("9".into()),
            body.clone(),
            status,
            "UNKNOWN_PAYOUT",
        ));
        if body.is_some() {
            cases.push((
                format!("{op} malformed"),
                Method::POST,
                path.clone(),
                Some("9".into()),
                Some("{".into()),
                400,
                "MALFORMED_JSON",
            ));
        }
    }
    cases.extend([
        (
            "claim empty owner".into(),
            Method::POST,
            format!("/v1/payouts/{pending}/claim"),
            Some("9".into()),
            Some(r#"{"ownerId":""}"#.into()),
            400,
            "INVALID_OWNER_ID",
        ),
        (
            "claim control owner".into(),
            Method::POST,
            format!("/v1/payouts/{pending}/claim"),
            Some("9".into()),
            Some("{\"ownerId\":\"a\\nb\"}".into()),
            400,
            "INVALID_OWNER_ID",
        ),
        (
            "transition unknown state".into(),
            Method::POST,
            format!("/v1/payouts/{acked}/transition"),
            Some("9".into()),
            Some(r#"{"from":"RAIL_ACKED","to":"DONE"}"#.into()),
            400,
            "INVALID_FIELD",
        ),
        (
            "transition unsupported".into(),
            Method::POST,
            format!("/v1/payouts/{acked}/transition"),
            Some("9".into()),
            Some(r#"{"from":"RAIL_ACKED","to":"PENDING"}"#.into()),
            400,
            "UNSUPPORTED_TRANSITION",
        ),
    ]);

    for (name, method, path, token, body, status, code) in &cases {
        let (s, v) = api
            .call(method.clone(), path, token.as_deref(), body.as_deref())
            .await;
        assert_eq!(
            (s, v["code"].as_str()),
            (*status, Some(*code)),
            "{name}: {method} {path} answered {s} {v}"
        );
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}: no message in {v}"
        );
    }
    // Without a JSON content type.
    let resp = api
        .client
        .post(format!("{}/v1/payouts", api.server.url()))
        .bearer_auth(common::CLIENT_TOKEN)
        .body(payout_body(&acct, "5", "EUR", ok_key))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);

    assert_eq!(f.snapshot().await, before, "a rejected request wrote something");
    let m = api.metrics().await;
    assert_eq!(metric(&m, "lock_fenced_out_total{resource=\"payout\"}"), 0, "{m}");
    assert!(cases.len() > 60, "{} cases", cases.len());
}

#[tokio::test]
async fn in_flight_payouts_are_listed_by_state_for_a_new_holder_to_resume() {
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(10_000, "EUR").await;
    let pending = api.payout(&acct, 100).await;
    let claimed = api.payout(&acct, 200).await;
    assert_eq!(api.claim(&claimed, 7, "w7").await.0, 200);
    let acked = api.acked(&acct, 300, 8).await;

    let ids = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["payoutId"].as_str().unwrap().to_owned())
            .collect()
    };
    let (s, v) = api.get("/v1/payouts?state=CLAIMED").await;
    assert_eq!((s, ids(&v)), (200, vec![claimed.clone()]));
    let (s, v) = api.get("/v1/payouts?state=RAIL_ACKED").await;
    assert_eq!((s, ids(&v)), (200, vec![acked.clone()]));
    let (s, v) = api.get("/v1/payouts?state=RAIL_SUBMITTED").await;
    assert_eq!((s, ids(&v)), (200, Vec::<String>::new()));
    let (_, v) = api.get("/v1/payouts?state=PENDING&limit=500").await;
    assert!(ids(&v).contains(&pending) && !ids(&v).contains(&claimed));
    let (s, v) = api.get("/v1/payouts?state=NOPE").await;
    assert_eq!((s, v["code"].as_str()), (400, Some("INVALID_STATE")));
}

/// Sends `method path` with exactly the given Authorization (none when `None`) and a body.
async fn raw(api: &Api, method: &str, path: &str, auth: Option<&str>) -> (u16, Value, Option<String>) {
    let mut req = api
        .client
        .request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", api.server.url()),
        )
        .header("X-Fencing-Token", "7");
    if let Some(a) = auth {
        req = req.header("Authorization", a);
    }
    if method == "POST" {
        req = req.header("Content-Type", "application/json").body("{}");
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let www = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        www,
    )
}

#[tokio::test]
async fn every_write_and_admin_endpoint_needs_its_role_and_reads_and_probes_stay_open() {
    use dlock_common::auth::Role;
    let f = fixture().await;
    let api = Api::start(&f, Fencing::Enabled).await;
    let acct = api.account(1_000, "EUR").await;
    let payout = api.payout(&acct, 100).await;
    let before = f.snapshot().await;
    let concrete = |p: &str| p.replace("{payoutId}", &payout);
    let token = |r: Role| match r {
        Role::Admin => common::ADMIN_TOKEN,
        Role::Executor => common::EXECUTOR_TOKEN,
        Role::Client => common::CLIENT_TOKEN,
    };
    for (method, path, allowed) in payment_resource::api::PROTECTED {
        let path = concrete(path);
        let (s, v, www) = raw(&api, method, &path, None).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (401, Some("UNAUTHENTICATED")),
            "{method} {path}: {v}"
        );
        assert_eq!(www.as_deref(), Some("Bearer"), "{method} {path}");
        for bad in [
            "Bearer not-a-credential-of-this-service",
            "Basic dXNlcjpwYXNz",
            "Bearer",
        ] {
            let (s, v, _) = raw(&api, method, &path, Some(bad)).await;
            assert_eq!(s, 401, "{method} {path} with {bad:?}: {v}");
        }
        for role in Role::ALL.into_iter().filter(|r| !allowed.contains(r)) {
            let (s, v, _) = raw(&api, method, &path, Some(&format!("Bearer {}", token(role)))).await;
            assert_eq!(
                (s, v["code"].as_str()),
                (403, Some("FORBIDDEN")),
                "{method} {path} as {}: {v}",
                role.as_str()
            );
        }
        // The admitted role gets past authentication (here: to body validation, or to the grant
        // check: `raw` sends no grant).
        let (s, v, _) = raw(
            &api,
            method,
            &path,
            Some(&format!("Bearer {}", token(allowed[0]))),
        )
        .await;
        assert!(s != 401 && v["code"] != "FORBIDDEN", "{method} {path}: {s} {v}");
    }
    // Refused requests wrote nothing (the admitted ones above had invalid bodies).
    assert_eq!(f.snapshot().await, before);

    // Probes, the document and reads need no credential.
    for path in [
        "/healthz".to_owned(),
        "/readyz".to_owned(),
        "/metrics".to_owned(),
        "/openapi.yaml".to_owned(),
        "/v1/payouts".to_owned(),
        format!("/v1/payouts/{payout}"),
        format!("/v1/accounts/{acct}"),
    ] {
        let (s, v, _) = raw(&api, "GET", &path, None).await;
        assert_eq!(s, 200, "GET {path}: {v}");
    }
    api.server.shutdown().await.unwrap();

    // A server without credentials admits nobody (fail closed).
    let bare = payment_resource::spawn(Config::ephemeral(f.db.app_url()).with_grants(common::grants()))
        .await
        .unwrap();
    let bare = Api {
        server: bare,
        client: Client::new(),
    };
    let (s, _, _) = raw(
        &bare,
        "POST",
        "/v1/accounts",
        Some(&format!("Bearer {}", common::ADMIN_TOKEN)),
    )
    .await;
    assert_eq!(s, 401);
    assert!(!format!("{:?}", common::credentials()).contains(common::ADMIN_TOKEN));
}
