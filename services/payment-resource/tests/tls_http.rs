//! payment-resource over HTTPS (`--tls-cert-file` / `--tls-key-file`), on a real paydb:
//!
//! - with the CA that signed its certificate a client reads an account and `/readyz` (which asks
//!   paydb); a client that trusts another CA is refused with the certificate error (`UnknownIssuer`),
//!   and a plain-HTTP request to the HTTPS port gets no answer;
//! - the binary refuses half a pair (exit 2, naming the missing file) and a key that does not
//!   match, before it starts anything, and neither a pair nor `--plaintext`; with `--plaintext` it
//!   says `plaintext_http` (WARN), and with the
//!   files from the environment `tls_enabled` instead (the control).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use dlock_common::tls::TlsFiles;
use dlock_testkit::pg::{ServerCert, TestCa};
use payment_resource::config::Schedule;
use payment_resource::{Config, RunningServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_payment-resource");

fn new_ca(label: &str) -> TestCa {
    TestCa::new(label).unwrap_or_else(|e| panic!("make a test CA (openssl): {e}"))
}

fn issue(ca: &TestCa, stem: &str) -> ServerCert {
    ca.issue(stem, &["127.0.0.1"])
        .unwrap_or_else(|e| panic!("issue a certificate (openssl): {e}"))
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

async fn https_server(db: &dlock_testkit::TestDb, cert: &ServerCert) -> RunningServer {
    let config = Config::ephemeral(db.app_url())
        .with_credentials(common::credentials())
        .with_grants(common::grants())
        .with_monitor(Schedule::off())
        .with_tls(TlsFiles {
            cert: cert.cert.clone(),
            key: cert.key.clone(),
        });
    payment_resource::spawn(config).await.expect("starts with TLS")
}

#[tokio::test]
async fn https_with_the_right_ca_and_refused_with_another() {
    let db = dlock_testkit::paydb().await;
    let ca = new_ca("pr-https");
    let server = https_server(&db, &issue(&ca, "payment-resource")).await;
    let base = server.url();
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");

    let http = client_trusting(&ca);
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(
        ready.status(),
        reqwest::StatusCode::OK,
        "paydb answers over the HTTPS API"
    );
    let account = http
        .get(format!("{base}/v1/accounts/{}", common::EUR_SETTLEMENT))
        .bearer_auth(common::CLIENT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(account.status(), reqwest::StatusCode::OK);
    let body: Value = account.json().await.unwrap();
    assert_eq!(body["accountId"], common::EUR_SETTLEMENT.to_string(), "{body}");

    // Another CA: the handshake is refused by the client, naming the reason.
    let other = new_ca("pr-https-other");
    let e = client_trusting(&other)
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap_err();
    let said = chain(&e);
    assert!(said.contains("UnknownIssuer"), "{said}");

    // Plain HTTP to the HTTPS port: no HTTP answer at all.
    let plain = format!("http://{}/healthz", server.addr());
    assert!(
        reqwest::get(&plain).await.is_err(),
        "{plain} answered in plaintext"
    );

    server.shutdown().await.unwrap();
}

// ---- the binary ------------------------------------------------------------------------------

fn serve_cmd() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        // Never reached: the pool is lazy.
        "--database-url",
        "postgres://payapp@127.0.0.1:1/paydb",
        "--grant-verification-enabled",
        "false",
        "--reconcile-interval-secs",
        "0",
        "--payout-stats-interval-secs",
        "0",
    ])
    .env_remove("DLOCK_TLS_CERT_FILE")
    .env_remove("DLOCK_TLS_KEY_FILE")
    .env_remove("DLOCK_PLAINTEXT")
    .env_remove("DLOCK_LOG_FORMAT");
    cmd
}

fn refused_with(args: &[&str], words: &[&str]) {
    let out = serve_cmd().args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for w in words {
        assert!(stderr.contains(w), "{w:?} not in: {stderr}");
    }
}

#[test]
fn half_a_pair_or_a_bad_pair_stops_the_binary() {
    let ca = new_ca("pr-https-bin");
    let good = issue(&ca, "server");
    let other = issue(&ca, "other");
    let cert = good.cert.to_str().unwrap();
    refused_with(&["--tls-cert-file", cert], &["the key file is not"]);
    refused_with(
        &["--tls-key-file", good.key.to_str().unwrap()],
        &["the certificate file is not"],
    );
    refused_with(
        &[
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            other.key.to_str().unwrap(),
        ],
        &["does not match the certificate", cert],
    );
}

/// The first of `names` the binary logs at start-up.
fn first_start_up_event(envs: &[(&str, &str)], names: &[&str]) -> Value {
    let mut cmd = serve_cmd();
    cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let said = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
        .find(|v| names.iter().any(|n| v["event"] == *n));
    let _ = child.kill();
    let _ = child.wait();
    said.expect("a start-up event")
}

#[test]
fn plain_http_must_be_asked_for_and_is_warned_at_start_up() {
    // Neither a certificate nor --plaintext: refused before anything starts.
    refused_with(&[], &["no TLS certificate", "--plaintext"]);
    let names = ["plaintext_http", "tls_enabled", "listening"];
    let said = first_start_up_event(&[("DLOCK_PLAINTEXT", "true")], &names);
    assert_eq!(said["event"], "plaintext_http", "{said}");
    assert_eq!(said["level"], "WARN", "{said}");

    // The control: with the files (from the environment) the same binary says TLS instead.
    let ca = new_ca("pr-https-warn");
    let cert = issue(&ca, "server");
    let said = first_start_up_event(
        &[
            ("DLOCK_TLS_CERT_FILE", cert.cert.to_str().unwrap()),
            ("DLOCK_TLS_KEY_FILE", cert.key.to_str().unwrap()),
        ],
        &names,
    );
    assert_eq!(said["event"], "tls_enabled", "{said}");
}
