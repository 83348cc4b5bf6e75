//! The `lock-server` binary: configuration from flags and environment, JSON logs, readiness, and a
//! graceful exit on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_lock-server");

#[tokio::test]
async fn serves_with_env_config_and_exits_cleanly_on_sigterm() {
    let db = lockdb().await;
    let mut child = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--reaper-interval-ms",
            "50",
            "--db-pool-size",
            "4",
        ])
        .env("DATABASE_URL", db.db.app_url())
        .env("DLOCK_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();

    // Log lines arrive on a thread; the first `listening` event names the bound address.
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
    let next_event = |name: &str| loop {
        let v = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no {name} event: {e}"));
        if v["event"] == name {
            return v;
        }
    };
    let addr = next_event("listening")["addr"].as_str().unwrap().to_owned();
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();

    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), reqwest::StatusCode::OK);
    // The admin token came from the environment.
    let r = http
        .post(format!("{base}/v1/admin/locks/k/revoke"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"operator": "ops", "reason": "smoke"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["outcome"], "NOT_HELD");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    next_event("shutdown_requested");
    next_event("stopped");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn refuses_an_invalid_configuration_with_exit_code_2() {
    let out = Command::new(BIN)
        .args([
            "--database-url",
            "postgres://lockapp@127.0.0.1:1/lockdb",
            "--reaper-interval-ms",
            "5",
        ])
        .env_remove("DLOCK_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("config_invalid"));

    let out = Command::new(BIN)
        .args(["--database-url", "postgres://lockapp@127.0.0.1:1/lockdb"])
        .env("DLOCK_ADMIN_TOKEN", " ")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
