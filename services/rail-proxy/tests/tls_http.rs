//! rail-proxy over HTTPS, and its client to an HTTPS rail (rail-stub with `--tls-cert-file`), on a
//! real paydb:
//!
//! - the executor reaches the proxy with the proxy's CA and the proxy forwards to the rail with the
//!   rail's CA (`--rail-ca-file`): the payout is ACKED and the rail received it once; a client that
//!   trusts another CA is refused with the certificate error;
//! - the negative control: a proxy given the wrong CA for the rail never reaches it (the rail
//!   receives nothing) and records the attempt as TIMEOUT (ambiguous, resolved by asking later),
//!   naming the refused certificate;
//! - start-up: half a pair, and a rail CA file that cannot be read, are refused (exit 2).

use std::process::Command;

use dlock_common::tls::TlsFiles;
use dlock_testkit::pg::{ServerCert, TestCa};
use rail_proxy::{Config, RunningServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_rail-proxy");
const EXECUTOR: &str = "test-rail-executor-credential";

static GRANT_KEY: std::sync::LazyLock<dlock_grant::SigningKey> = std::sync::LazyLock::new(|| {
    dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("test-k1").unwrap())
});

fn new_ca(label: &str) -> TestCa {
    TestCa::new(label).unwrap_or_else(|e| panic!("make a test CA (openssl): {e}"))
}

fn issue(ca: &TestCa, stem: &str) -> ServerCert {
    ca.issue(stem, &["127.0.0.1"])
        .unwrap_or_else(|e| panic!("issue a certificate (openssl): {e}"))
}

fn files(cert: &ServerCert) -> TlsFiles {
    TlsFiles {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
    }
}

/// A client that trusts only `ca`.
fn client_trusting(ca: &TestCa) -> reqwest::Client {
    let pem = std::fs::read(ca.cert()).unwrap();
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

/// An error and all its causes (reqwest's own message hides the TLS reason).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

fn proxy_config(db: &dlock_testkit::TestDb, rail_url: String) -> Config {
    use dlock_common::auth::{Credential, Credentials, Role};
    let keys = dlock_grant::PublicKeys::new(vec![GRANT_KEY.public_key()]).unwrap();
    let mut config = Config::new(db.app_url(), rail_url)
        .with_grants(dlock_common::grant::GrantPolicy::new(true, keys, "TEST").unwrap());
    config.max_connections = 4;
    config.credentials = Credentials::new().with(Role::Executor, Credential::new("test", EXECUTOR).unwrap());
    config
}

/// A payout reserved for the rail (RAIL_SUBMITTED, claimed with `token`), as payment-resource
/// leaves it, on a fresh account.
async fn reserved_payout(admin: &PgPool, token: i64) -> (Uuid, Uuid) {
    let account = Uuid::new_v4();
    sqlx::query("INSERT INTO account (account_id, currency, balance_minor) VALUES ($1, 'EUR', 1000000)")
        .bind(account)
        .execute(admin)
        .await
        .unwrap();
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO payout (payout_id, account_id, amount_minor, currency, state, claimed_by, claim_token, idempotency_key,
                             reserved_minor, reserved_token)
         VALUES ($1, $2, 100, 'EUR', 'RAIL_SUBMITTED', 'test-holder', $3, $4, 100, $3)",
    )
    .bind(id)
    .bind(account)
    .bind(token)
    .bind(format!("payout-{id}"))
    .execute(admin)
    .await
    .unwrap();
    sqlx::query("UPDATE account SET reserved_minor = reserved_minor + 100 WHERE account_id = $1")
        .bind(account)
        .execute(admin)
        .await
        .unwrap();
    (id, account)
}

/// Submits `payout` to `proxy` with the rightful grant of `token`.
async fn submit(
    http: &reqwest::Client,
    proxy: &RunningServer,
    payout: Uuid,
    account: Uuid,
    token: i64,
) -> (StatusCode, Value) {
    let grant = GRANT_KEY
        .sign(&dlock_grant::Claims {
            lock_service: "tests",
            lock_key: &dlock_common::grant::account_key(account),
            token,
            owner_id: "test-holder",
            session_id: Uuid::nil(),
        })
        .unwrap();
    let resp = http
        .post(format!("{}/v1/submissions", proxy.url()))
        .bearer_auth(EXECUTOR)
        .header("X-Fencing-Token", token.to_string())
        .header("X-Fencing-Grant", grant)
        .json(&json!({"payoutId": payout}))
        .send()
        .await
        .unwrap();
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

async fn rail_requests(http: &reqwest::Client, rail: &rail_stub::RunningServer) -> usize {
    let received: Value = http
        .get(format!("{}/v1/received", rail.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    received["requests"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn https_end_to_end_and_the_wrong_rail_ca_never_reaches_the_rail() {
    let db = dlock_testkit::paydb().await;
    let admin = db.admin_pool().await;
    let rail_ca = new_ca("rp-rail");
    let proxy_ca = new_ca("rp-proxy");
    let rail = rail_stub::spawn(rail_stub::Config::for_tests().with_tls(files(&issue(&rail_ca, "rail"))))
        .await
        .expect("the stub starts with TLS");
    assert!(rail.url().starts_with("https://"), "{}", rail.url());
    let rail_http = client_trusting(&rail_ca);

    let proxy = rail_proxy::spawn(
        proxy_config(&db, rail.url())
            .with_rail_ca(rail_ca.cert())
            .with_tls(files(&issue(&proxy_ca, "proxy"))),
    )
    .await
    .expect("the proxy starts with TLS and a rail CA");
    assert!(proxy.url().starts_with("https://"), "{}", proxy.url());
    let http = client_trusting(&proxy_ca);

    let (payout, account) = reserved_payout(&admin, 7).await;
    let (status, body) = submit(&http, &proxy, payout, account, 7).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "ACKED", "{body}");
    assert_eq!(rail_requests(&rail_http, &rail).await, 1);

    // A client that trusts another CA is refused by its own verification.
    let e = client_trusting(&new_ca("rp-other"))
        .get(format!("{}/healthz", proxy.url()))
        .send()
        .await
        .unwrap_err();
    assert!(chain(&e).contains("UnknownIssuer"), "{}", chain(&e));
    proxy.shutdown().await.unwrap();

    // The negative control: the proxy trusts another CA than the rail's. It starts, but its one
    // forward is refused at the handshake: nothing reaches the rail and the attempt is ambiguous.
    let wrong = new_ca("rp-wrong-rail");
    let proxy = rail_proxy::spawn(proxy_config(&db, rail.url()).with_rail_ca(wrong.cert()))
        .await
        .expect("the proxy starts");
    let (payout, account) = reserved_payout(&admin, 8).await;
    let (status, body) = submit(&reqwest::Client::new(), &proxy, payout, account, 8).await;
    assert_eq!(body["outcome"], "TIMEOUT", "{status} {body}");
    assert_eq!(
        rail_requests(&rail_http, &rail).await,
        1,
        "the rail received nothing more"
    );
    proxy.shutdown().await.unwrap();
    rail.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_rail_client_verifies_the_rail_with_its_ca() {
    use rail_proxy::rail::{Lookup, Rail};
    let ca = new_ca("rp-rail-client");
    let rail = rail_stub::spawn(rail_stub::Config::for_tests().with_tls(files(&issue(&ca, "rail"))))
        .await
        .unwrap();
    let timeout = std::time::Duration::from_secs(5);
    let right = Rail::with_ca(&rail.url(), timeout, Some(ca.cert())).unwrap();
    assert_eq!(right.lookup("never-sent").await, Lookup::Unknown);
    let other = new_ca("rp-rail-client-other");
    let wrong = Rail::with_ca(&rail.url(), timeout, Some(other.cert())).unwrap();
    match wrong.lookup("never-sent").await {
        Lookup::Unavailable { detail } => assert!(detail.contains("UnknownIssuer"), "{detail}"),
        other => panic!("expected the certificate refused, got {other:?}"),
    }
    // Without a rail CA the public roots are trusted, and a private CA is none of them.
    let public = Rail::with_ca(&rail.url(), timeout, None).unwrap();
    match public.lookup("never-sent").await {
        Lookup::Unavailable { detail } => assert!(detail.contains("UnknownIssuer"), "{detail}"),
        other => panic!("expected the certificate refused by the public roots, got {other:?}"),
    }
    rail.shutdown().await.unwrap();
}

// ---- the binary ------------------------------------------------------------------------------

fn refused_with(args: &[&str], words: &[&str]) {
    let out = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://payapp@127.0.0.1:1/paydb",
            "--grant-verification-enabled",
            "false",
        ])
        .args(args)
        .env_remove("DLOCK_TLS_CERT_FILE")
        .env_remove("DLOCK_TLS_KEY_FILE")
        .env_remove("DLOCK_RAIL_CA_FILE")
        .env_remove("DLOCK_PLAINTEXT")
        .env_remove("DLOCK_LOG_FORMAT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for w in words {
        assert!(stderr.contains(w), "{w:?} not in: {stderr}");
    }
}

#[test]
fn half_a_pair_and_an_unreadable_rail_ca_are_refused() {
    let ca = new_ca("rp-bin");
    let cert = issue(&ca, "server");
    let http_rail = ["--rail-url", "http://127.0.0.1:1"];
    refused_with(
        &[&http_rail[..], &["--tls-cert-file", cert.cert.to_str().unwrap()]].concat(),
        &["the key file is not"],
    );
    refused_with(
        &[&http_rail[..], &["--tls-key-file", cert.key.to_str().unwrap()]].concat(),
        &["the certificate file is not"],
    );
    refused_with(
        &[
            "--rail-url",
            "https://127.0.0.1:1",
            "--rail-ca-file",
            "/nonexistent/rail-ca.crt",
            "--plaintext",
        ],
        &["/nonexistent/rail-ca.crt"],
    );
}
