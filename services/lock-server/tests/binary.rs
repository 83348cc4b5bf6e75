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

static KEY: std::sync::LazyLock<dlock_grant::SigningKey> = std::sync::LazyLock::new(|| {
    dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("bin-k1").unwrap())
});

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
        .env("DLOCK_GRANT_SIGNING_KEY", KEY.expose_text())
        .env("DLOCK_LOCK_SERVICE_ID", "payments/locks")
        .env_remove("DLOCK_GRANT_SIGNING_KEY_FILE")
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
    let signing = next_event("grant_signing_enabled");
    assert_eq!(signing["key_id"], "bin-k1", "{signing}");
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
    // Grants are signed with the key from the environment, naming the lock service id given.
    let session: Value = http
        .post(format!("{base}/v1/sessions"))
        .json(&json!({"ownerId": "bin", "ttlMs": 60_000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let grant: Value = http
        .post(format!("{base}/v1/locks/bin-key/acquire"))
        .json(&json!({"sessionId": session["sessionId"], "ownerId": "bin", "ttlMs": 60_000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let keys = dlock_grant::PublicKeys::new(vec![KEY.public_key()]).unwrap();
    let signed = keys.verify(grant["grant"].as_str().unwrap()).unwrap();
    assert_eq!(signed.lock_service, "payments/locks");
    assert_eq!(Some(signed.token), grant["fencingToken"].as_i64());

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

/// The signing key comes from the environment or a file, one of the two, and must parse; anything
/// else refuses to start (exit 2) with a message that never repeats the key.
#[test]
fn a_bad_or_doubly_given_signing_key_is_a_configuration_error() {
    let dir = std::env::temp_dir().join(format!("lock-server-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("key");
    std::fs::write(&file, format!("{}\n", KEY.expose_text())).unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["--database-url", "postgres://lockapp@127.0.0.1:1/lockdb"])
            .env_remove("DLOCK_GRANT_SIGNING_KEY")
            .env_remove("DLOCK_GRANT_SIGNING_KEY_FILE")
            .env_remove("DLOCK_ADMIN_TOKEN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let secret = KEY.expose_text();
    let seed = secret.split_once('=').unwrap().1.to_owned();
    let both = run(&[
        ("DLOCK_GRANT_SIGNING_KEY", &secret),
        ("DLOCK_GRANT_SIGNING_KEY_FILE", file.to_str().unwrap()),
    ]);
    let malformed = format!("bin-k1={}", &seed[..20]);
    let bad = run(&[("DLOCK_GRANT_SIGNING_KEY", &malformed)]);
    for out in [both, bad] {
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("config_invalid") && err.contains("DLOCK_GRANT_SIGNING_KEY"),
            "{err}"
        );
        assert!(!err.contains(&seed[..20]), "the key leaked into the log: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
