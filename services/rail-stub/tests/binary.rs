//! The `rail-stub` binary: flags and environment, the loud test-mode warning, JSON logs, and a
//! graceful exit on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_rail-stub");

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
async fn serves_with_flags_and_env_warns_in_test_mode_and_exits_cleanly_on_sigterm() {
    let mut child = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["--listen", "127.0.0.1:0", "--test-mode"])
        .env("RAIL_STUB_MODE", "reject")
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let rx = events(&mut child);
    let warning = next_event(&rx, "rail_stub_test_mode");
    assert_eq!(warning["level"], "WARN");
    let addr = next_event(&rx, "listening")["addr"].as_str().unwrap().to_owned();
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();

    let resp = http
        .post(format!("{base}/v1/payments"))
        .json(&json!({
            "idempotencyKey": "bin-1",
            "payoutId": "6f1c2a56-8d0e-4f5e-9b7a-0a1b2c3d4e5f",
            "accountId": "0e0e0e0e-1111-4222-8333-444455556666",
            "amountMinor": 10,
            "currency": "USD",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "mode came from the env"
    );
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
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
}

#[test]
fn refuses_an_invalid_configuration_with_exit_code_2() {
    for args in [
        vec!["--listen", "127.0.0.1:0", "--timeout-hang-ms", "0"],
        vec!["--listen", "127.0.0.1:0", "--latency-ms", "600001"],
        vec!["--listen", "127.0.0.1:0", "--mode", "explode"],
    ] {
        let out = Command::new(BIN)
            .env("DLOCK_PLAINTEXT", "true")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["--listen", "127.0.0.1:0", "--timeout-hang-ms", "0"])
        .env_remove("DLOCK_LOG_FORMAT")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("config_invalid"));
}
