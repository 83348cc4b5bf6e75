//! The `rail-proxy` binary: flags and environment, the kill-switch warnings (fencing, grant
//! verification), JSON logs, readiness, and a graceful exit on SIGTERM; grant verification on by
//! default and refused without keys.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_rail-proxy");

/// JSON log lines of `child`'s stderr, read on a thread.
fn events(child: &mut Child) -> mpsc::Receiver<Value> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && tx.send(v).is_err()
            {
                break;
            }
        }
    });
    rx
}

fn next_event(rx: &mpsc::Receiver<Value>, name: &str) -> Value {
    loop {
        let v = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no {name} event: {e}"));
        if v["event"] == name {
            return v;
        }
    }
}

#[tokio::test]
async fn serves_warns_when_fencing_is_off_and_exits_cleanly_on_sigterm() {
    let db = dlock_testkit::paydb().await;
    let stub = rail_stub::spawn(rail_stub::Config::for_tests()).await.unwrap();
    let mut child = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["--listen", "127.0.0.1:0", "--rail-url", &stub.url()])
        .env("DATABASE_URL", db.app_url())
        .env("RAIL_PROXY_FENCING_ENABLED", "false")
        .env("RAIL_PROXY_GRANT_VERIFICATION_ENABLED", "false")
        .env_remove("DLOCK_GRANT_PUBLIC_KEYS")
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let rx = events(&mut child);
    let warning = next_event(&rx, "rail_fencing_disabled");
    assert_eq!(warning["level"], "WARN");
    assert_eq!(warning["key"], "rail.proxy.fencing.enabled");
    let grants_off = next_event(&rx, "grant_verification_disabled");
    assert_eq!(grants_off["level"], "WARN");
    assert_eq!(grants_off["key"], "RAIL_PROXY_GRANT_VERIFICATION_ENABLED");
    let addr = next_event(&rx, "listening")["addr"].as_str().unwrap().to_owned();
    let started = next_event(&rx, "rail_proxy_started");
    assert_eq!(started["fencing_enabled"], false);
    assert_eq!(started["grant_verification_enabled"], false);

    let http = reqwest::Client::new();
    let ready = http.get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), reqwest::StatusCode::OK);

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    next_event(&rx, "shutdown_requested");
    next_event(&rx, "stopped");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    stub.shutdown().await.unwrap();
}

fn public_keys() -> String {
    let key = dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("k1").unwrap());
    key.public_key().to_text()
}

#[tokio::test]
async fn fencing_and_grant_verification_are_on_by_default() {
    let mut child = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--rail-url",
            "http://127.0.0.1:1",
            "--database-url",
            "postgres://payapp@127.0.0.1:1/paydb",
        ])
        .env_remove("RAIL_PROXY_FENCING_ENABLED")
        .env_remove("RAIL_PROXY_GRANT_VERIFICATION_ENABLED")
        .env("DLOCK_GRANT_PUBLIC_KEYS", public_keys())
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let rx = events(&mut child);
    let on = next_event(&rx, "grant_verification_enabled");
    assert_eq!(on["key_ids"], "k1");
    let started = next_event(&rx, "rail_proxy_started");
    assert_eq!(started["fencing_enabled"], true);
    assert_eq!(started["grant_verification_enabled"], true);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success());
}

#[test]
fn refuses_an_invalid_configuration_with_exit_code_2() {
    let base = [
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        "postgres://payapp@127.0.0.1:1/paydb",
    ];
    let keys = public_keys();
    for extra in [
        vec!["--rail-url", "http://127.0.0.1:1", "--rail-timeout-ms", "0"],
        vec!["--rail-url", "not a url"],
        vec!["--rail-url", "http://127.0.0.1:1", "--fencing-enabled", "maybe"],
        vec![],
        vec![
            "--rail-url",
            "http://127.0.0.1:1",
            "--grant-public-keys",
            "k1=not-a-key",
        ],
    ] {
        let out = Command::new(BIN)
            .env("DLOCK_PLAINTEXT", "true")
            .args(base)
            .args(&extra)
            .env_remove("RAIL_PROXY_RAIL_URL")
            // Valid keys: each case is refused for its own fault.
            .env("DLOCK_GRANT_PUBLIC_KEYS", &keys)
            .env_remove("DLOCK_GRANT_PUBLIC_KEYS_FILE")
            .env_remove("DLOCK_LOG_FORMAT")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {out:?}");
    }
}

/// Verification on (the default) with no public key configured: the service refuses to start with a
/// message that says which settings to give, rather than refusing every write.
#[test]
fn grant_verification_without_keys_refuses_to_start() {
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://payapp@127.0.0.1:1/paydb",
            "--rail-url",
            "http://127.0.0.1:1",
        ])
        .env_remove("DLOCK_GRANT_PUBLIC_KEYS")
        .env_remove("DLOCK_GRANT_PUBLIC_KEYS_FILE")
        .env_remove("RAIL_PROXY_GRANT_VERIFICATION_ENABLED")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config_invalid")
            && err.contains("DLOCK_GRANT_PUBLIC_KEYS")
            && err.contains("RAIL_PROXY_GRANT_VERIFICATION_ENABLED=false"),
        "{err}"
    );
}
