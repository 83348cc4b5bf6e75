//! rail-stub over real HTTP, in process.

use std::collections::BTreeSet;
use std::time::Duration;

use rail_stub::{Config, Mode, RunningServer};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

async fn start(config: Config) -> (RunningServer, Client) {
    let server = rail_stub::spawn(config).await.expect("stub starts");
    (server, Client::new())
}

fn payment(key: &str) -> Value {
    json!({
        "idempotencyKey": key,
        "payoutId": Uuid::new_v4(),
        "accountId": Uuid::new_v4(),
        "amountMinor": 1250,
        "currency": "EUR",
    })
}

async fn post(
    client: &Client,
    s: &RunningServer,
    body: &Value,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut req = client.post(format!("{}/v1/payments", s.url())).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("send");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn received(client: &Client, s: &RunningServer) -> Value {
    client
        .get(format!("{}/v1/received", s.url()))
        .send()
        .await
        .expect("received")
        .json()
        .await
        .expect("json")
}

async fn metric(client: &Client, s: &RunningServer, name: &str) -> u64 {
    let text = client
        .get(format!("{}/metrics", s.url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    dlock_testkit::metrics::counter(&text, name).unwrap_or_else(|| panic!("{name} not in metrics:\n{text}"))
}

#[tokio::test]
async fn a_repeat_returns_the_first_outcome_and_pays_once() {
    let (s, c) = start(Config::for_tests()).await;
    let body = payment("payout-1");
    let (st1, first) = post(&c, &s, &body, &[]).await;
    assert_eq!(st1, StatusCode::OK);
    assert_eq!(first["status"], "ACKED");
    assert_eq!(first["replayed"], false);
    // The repeat asks for a rejection; the first request already decided.
    let (st2, second) = post(&c, &s, &body, &[("X-Rail-Stub-Outcome", "reject")]).await;
    assert_eq!(st2, StatusCode::OK);
    assert_eq!(second["status"], "ACKED");
    assert_eq!(second["replayed"], true);
    assert_eq!(second["railReference"], first["railReference"]);

    let r = received(&c, &s).await;
    assert_eq!(r["requests"].as_array().map(Vec::len), Some(2));
    assert_eq!(r["perKey"]["payout-1"]["received"], 2);
    assert_eq!(r["perKey"]["payout-1"]["paid"], 1);
    assert_eq!(r["perPayout"][body["payoutId"].as_str().unwrap()]["paid"], 1);
    assert_eq!(r["paidTwice"], json!([]));
    assert_eq!(metric(&c, &s, "rail_stub_payments_received_total").await, 2);
    assert_eq!(metric(&c, &s, "rail_stub_payments_paid_total").await, 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn received_lists_every_request_in_order_and_flags_a_payout_paid_under_two_keys() {
    let (s, c) = start(Config::for_tests()).await;
    let a = payment("k-a");
    let mut b = payment("k-b");
    b["payoutId"] = a["payoutId"].clone();
    let other = payment("k-c");
    for body in [&a, &other, &b] {
        assert_eq!(post(&c, &s, body, &[]).await.0, StatusCode::OK);
    }
    let r = received(&c, &s).await;
    let keys: Vec<&str> = r["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["idempotencyKey"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["k-a", "k-c", "k-b"]);
    let first = &r["requests"][0];
    assert_eq!(first["seq"], 1);
    assert_eq!(first["payoutId"], a["payoutId"]);
    assert_eq!(first["accountId"], a["accountId"]);
    assert_eq!(first["amountMinor"], 1250);
    assert!(first["presentedAt"].as_str().is_some_and(|t| t.contains('T')));
    assert_eq!(r["paidTwice"], json!([a["payoutId"]]));
    assert_eq!(r["perPayout"][a["payoutId"].as_str().unwrap()]["paid"], 2);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn per_request_outcomes_in_test_mode() {
    let (s, c) = start(Config::for_tests()).await;
    let (st, body) = post(&c, &s, &payment("rej"), &[("X-Rail-Stub-Outcome", "reject")]).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["status"], "REJECTED");
    assert!(body["reason"].as_str().is_some());
    let (st, _) = post(
        &c,
        &s,
        &payment("slow"),
        &[("X-Rail-Stub-Outcome", "ACK"), ("X-Rail-Stub-Latency-Ms", "30")],
    )
    .await;
    assert_eq!(st, StatusCode::OK);

    let r = received(&c, &s).await;
    assert_eq!(r["perKey"]["rej"]["paid"], 0);
    assert_eq!(r["perKey"]["slow"]["paid"], 1);
    let looked_up: Value = c
        .get(format!("{}/v1/payments/rej", s.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(looked_up["status"], "REJECTED");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_timeout_pays_then_hangs_past_the_caller_and_the_lookup_says_acked() {
    let (s, c) = start(Config::for_tests()).await;
    let impatient = Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let key = "payout/7 timeout";
    let err = impatient
        .post(format!("{}/v1/payments", s.url()))
        .header("X-Rail-Stub-Outcome", "timeout")
        .json(&payment(key))
        .send()
        .await
        .expect_err("the caller must time out");
    assert!(err.is_timeout(), "{err}");

    let mut url = reqwest::Url::parse(&s.url()).unwrap();
    url.path_segments_mut().unwrap().extend(["v1", "payments", key]);
    let resp = c.get(url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["status"], "ACKED");
    assert_eq!(p["timedOut"], true);
    assert!(p["railReference"].as_str().is_some());
    assert_eq!(received(&c, &s).await["perKey"][key]["paid"], 1);
    assert_eq!(metric(&c, &s, "rail_stub_payments_paid_total").await, 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_a_hung_timeout_answer() {
    let mut config = Config::for_tests();
    config.timeout_hang_ms = rail_stub::config::MAX_TIMEOUT_HANG_MS;
    let (s, c) = start(config).await;
    let url = format!("{}/v1/payments", s.url());
    let hung = tokio::spawn({
        let c = c.clone();
        async move {
            c.post(url)
                .header("X-Rail-Stub-Outcome", "timeout")
                .json(&payment("hang"))
                .send()
                .await
        }
    });
    // Wait until the stub has the request, then stop it: the hang must end, not hold shutdown.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while received(&c, &s).await["requests"].as_array().map(Vec::len) != Some(1) {
        assert!(tokio::time::Instant::now() < deadline, "request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(20), s.shutdown())
        .await
        .expect("shutdown must not wait for the hang")
        .unwrap();
    let resp = hung.await.unwrap().expect("the hung request gets an answer");
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "TIMEOUT");
}

#[tokio::test]
async fn the_default_mode_comes_from_config_and_the_admin_endpoint_in_test_mode() {
    let mut config = Config::for_tests();
    config.mode = Mode::Reject;
    let (s, c) = start(config).await;
    assert_eq!(
        post(&c, &s, &payment("a"), &[]).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let resp = c
        .put(format!("{}/v1/admin/behaviour", s.url()))
        .json(&json!({"mode": "ack", "latencyMs": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let b: Value = resp.json().await.unwrap();
    assert_eq!(
        (b["mode"].clone(), b["latencyMs"].clone()),
        (json!("ack"), json!(5))
    );
    assert_eq!(post(&c, &s, &payment("b"), &[]).await.0, StatusCode::OK);

    for (bad, code) in [
        (json!({"mode": "explode", "latencyMs": 0}), "INVALID_MODE"),
        (json!({"mode": "ack", "latencyMs": -1}), "INVALID_LATENCY"),
        (json!({"mode": "ack", "latencyMs": 1.5}), "INVALID_LATENCY"),
        (json!({"mode": "ack"}), "INVALID_FIELD"),
    ] {
        let resp = c
            .put(format!("{}/v1/admin/behaviour", s.url()))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(resp.json::<Value>().await.unwrap()["code"], code, "{bad}");
    }
    let now: Value = c
        .get(format!("{}/v1/admin/behaviour", s.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(now["mode"], "ack", "a rejected change changes nothing");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn test_controls_are_forbidden_outside_test_mode() {
    let mut config = Config::for_tests();
    config.test_mode = false;
    let (s, c) = start(config).await;
    let (st, body) = post(&c, &s, &payment("x"), &[("X-Rail-Stub-Outcome", "reject")]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(body["code"], "TEST_MODE_DISABLED");
    let (st, _) = post(&c, &s, &payment("y"), &[("X-Rail-Stub-Latency-Ms", "5")]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let resp = c
        .put(format!("{}/v1/admin/behaviour", s.url()))
        .json(&json!({"mode": "reject", "latencyMs": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "TEST_MODE_DISABLED");

    assert_eq!(
        received(&c, &s).await["requests"],
        json!([]),
        "refused requests record nothing"
    );
    // The default still applies and is unchanged.
    assert_eq!(post(&c, &s, &payment("z"), &[]).await.0, StatusCode::OK);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_a_4xx_with_a_code_and_records_nothing() {
    let (s, c) = start(Config::for_tests()).await;
    let good = payment("good");
    let with = |field: &str, value: Value| {
        let mut b = good.clone();
        b[field] = value;
        b
    };
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("currency");
    let cases = [
        (with("amountMinor", json!(0)), "INVALID_AMOUNT"),
        (with("amountMinor", json!(-5)), "INVALID_AMOUNT"),
        (with("amountMinor", json!(12.5)), "INVALID_AMOUNT"),
        (with("amountMinor", json!("100")), "INVALID_AMOUNT"),
        (
            with("amountMinor", json!(9_223_372_036_854_775_808u64)),
            "INVALID_AMOUNT",
        ),
        (with("currency", json!("eur")), "INVALID_CURRENCY"),
        (with("currency", json!("EURO")), "INVALID_CURRENCY"),
        (with("payoutId", json!("not-a-uuid")), "INVALID_PAYOUT_ID"),
        (with("accountId", json!("")), "INVALID_ACCOUNT_ID"),
        (with("idempotencyKey", json!("")), "INVALID_IDEMPOTENCY_KEY"),
        (
            with("idempotencyKey", json!("k".repeat(201))),
            "INVALID_IDEMPOTENCY_KEY",
        ),
        (
            with("idempotencyKey", json!("a\u{7}b")),
            "INVALID_IDEMPOTENCY_KEY",
        ),
        (with("extra", json!(1)), "INVALID_FIELD"),
        (missing, "INVALID_FIELD"),
    ];
    for (body, code) in cases {
        let (st, resp) = post(&c, &s, &body, &[]).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(resp["code"], code, "{body}");
        assert!(resp["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    for (name, value, code) in [
        ("X-Rail-Stub-Outcome", "maybe", "INVALID_OUTCOME"),
        ("X-Rail-Stub-Latency-Ms", "fast", "INVALID_LATENCY"),
        ("X-Rail-Stub-Latency-Ms", "600001", "INVALID_LATENCY"),
    ] {
        let (st, resp) = post(&c, &s, &good, &[(name, value)]).await;
        assert_eq!((st, resp["code"].as_str()), (StatusCode::BAD_REQUEST, Some(code)));
    }
    let resp = c
        .post(format!("{}/v1/payments", s.url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "MALFORMED_JSON");
    let resp = c
        .post(format!("{}/v1/payments", s.url()))
        .body(good.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let r = received(&c, &s).await;
    assert_eq!(r["requests"], json!([]));
    assert_eq!(r["perKey"], json!({}));
    assert_eq!(metric(&c, &s, "rail_stub_payments_received_total").await, 0);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn lookups_and_key_reuse() {
    let (s, c) = start(Config::for_tests()).await;
    let resp = c
        .get(format!("{}/v1/payments/nope", s.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "UNKNOWN_PAYMENT");

    let first = payment("shared");
    assert_eq!(post(&c, &s, &first, &[]).await.0, StatusCode::OK);
    let mut other = payment("shared");
    other["amountMinor"] = json!(99);
    let (st, body) = post(&c, &s, &other, &[]).await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(body["code"], "IDEMPOTENCY_KEY_REUSED");
    let r = received(&c, &s).await;
    assert_eq!(r["perKey"]["shared"]["received"], 2);
    assert_eq!(r["perKey"]["shared"]["paid"], 1);
    s.shutdown().await.unwrap();
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
    let (s, c) = start(Config::for_tests()).await;
    let served = c.get(format!("{}/openapi.yaml", s.url())).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    let doc = served.text().await.unwrap();
    let documented = openapi_routes(&doc);
    let routed: BTreeSet<(String, String)> = rail_stub::api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routed);
    // Every listed route is really served (not the 404 fallback, not 405).
    for (method, path) in &routed {
        let url = format!("{}{}", s.url(), path.replace("{idempotencyKey}", "probe"));
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let resp = c.request(method.clone(), url).send().await.unwrap();
        let status = resp.status();
        let code = resp.json::<Value>().await.ok().map(|v| v["code"].clone());
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(code, Some(json!("NOT_FOUND")), "{method} {path}");
    }
    let resp = c.get(format!("{}/v1/nothing", s.url())).send().await.unwrap();
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], "NOT_FOUND");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_and_bad_config() {
    let (s, c) = start(Config::for_tests()).await;
    for (path, text) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let resp = c.get(format!("{}{path}", s.url())).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.text().await.unwrap(), text);
    }
    s.shutdown().await.unwrap();
    let mut bad = Config::for_tests();
    bad.timeout_hang_ms = 0;
    assert!(rail_stub::spawn(bad).await.is_err());
    let mut bad = Config::for_tests();
    bad.latency_ms = rail_stub::config::MAX_LATENCY_MS + 1;
    assert!(rail_stub::spawn(bad).await.is_err());
}
