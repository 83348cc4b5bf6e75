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

/// The JSON log events of `child`'s stderr, as they arrive (read on a thread).
fn log_events(child: &mut std::process::Child) -> mpsc::Receiver<Value> {
    let stderr = child.stderr.take().expect("stderr is piped");
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

static KEY: std::sync::LazyLock<dlock_grant::SigningKey> = std::sync::LazyLock::new(|| {
    dlock_grant::SigningKey::generate(dlock_grant::KeyId::new("bin-k1").unwrap())
});

#[tokio::test]
async fn serves_with_env_config_and_exits_cleanly_on_sigterm() {
    let db = lockdb().await;
    let mut child = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
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
    let rx = log_events(&mut child);
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
    // Its start was a history it could not vouch for: the sequence jumped before the first grant,
    // said once in the log, the counter and `GET /v1/sequence`.
    let jumped = next_event("sequence_jumped");
    assert_eq!(jumped["cause"], "start", "{jumped}");
    let sequence: Value = http
        .get(format!("{base}/v1/sequence"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sequence["lastJump"]["cause"], "start", "{sequence}");
    assert_eq!(
        sequence["lastJump"]["jumpedTo"], jumped["jumped_to"],
        "{sequence}"
    );
    assert!(
        sequence["lastJump"]["jumpedTo"].as_i64() < grant["fencingToken"].as_i64(),
        "{sequence} {grant}"
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("lock_sequence_jumps_total{cause=\"start\"} 1"),
        "{metrics}"
    );

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

/// A database whose certificate the configured CA did not sign: lock-server still starts (its pool
/// is lazy; `/readyz` says 503), and its own log says, in an operator's words, which server, which
/// sslmode and which CA file refused it (`database_connect_failed`, ERROR), not only the TLS
/// library's `UnknownIssuer`. Its control: the right CA, and the same server is reached
/// (`database_connected`).
#[test]
fn a_refused_database_certificate_is_logged_naming_the_ca_file() {
    use dlock_testkit::pg::{PgServer, TestCa};
    let server =
        PgServer::start_tls("ls-bin-tls").unwrap_or_else(|e| panic!("start a TLS PostgreSQL 16: {e}"));
    let other = TestCa::new("ls-bin-other").unwrap_or_else(|e| panic!("make a test CA: {e}"));
    let first_db_event = |ca: &std::path::Path| -> Value {
        let url = format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            server.url("postgres", "postgres"),
            ca.display()
        );
        let mut child = Command::new(BIN)
            .env("DLOCK_PLAINTEXT", "true")
            .args(["--listen", "127.0.0.1:0"])
            .env("DATABASE_URL", url)
            .env("DLOCK_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("DLOCK_GRANT_SIGNING_KEY", KEY.expose_text())
            .env("DLOCK_LOCK_SERVICE_ID", "payments/locks")
            .env_remove("DLOCK_GRANT_SIGNING_KEY_FILE")
            .env_remove("DLOCK_LOG_FORMAT")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let rx = log_events(&mut child);
        let said = loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(v) if v["event"] == "database_connect_failed" || v["event"] == "database_connected" => {
                    break Ok(v);
                }
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        let _ = child.kill();
        let _ = child.wait();
        said.unwrap_or_else(|e| panic!("no database event from lock-server: {e}"))
    };
    let refused = first_db_event(other.cert());
    assert_eq!(refused["event"], "database_connect_failed", "{refused}");
    assert_eq!(refused["level"], "ERROR", "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    for words in [
        "TLS verification failed (sslmode=verify-full)",
        "not signed by a CA in the CA file sslrootcert=",
        &other.cert().display().to_string(),
        "127.0.0.1",
    ] {
        assert!(message.contains(words), "{words:?} not in: {message}");
    }
    let reached = first_db_event(server.tls().expect("a TLS server").ca.cert());
    assert_eq!(reached["event"], "database_connected", "{reached}");
}

/// The jump's switch is for negative controls only: set as the variable (`1`), it is said at start-up
/// as an ERROR.
#[test]
fn switching_the_sequence_jump_off_is_an_error_at_start_up() {
    let mut child = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://lockapp@127.0.0.1:1/lockdb",
        ])
        .env("DLOCK_UNSAFE_NO_SEQUENCE_JUMP", "1")
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let said = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
        .find(|v| v["event"] == "sequence_jump_disabled" || v["event"] == "listening");
    let _ = child.kill();
    let _ = child.wait();
    let said = said.expect("a start-up event");
    assert_eq!(said["event"], "sequence_jump_disabled", "{said}");
    assert_eq!(said["level"], "ERROR", "{said}");
}

#[test]
fn refuses_an_invalid_configuration_with_exit_code_2() {
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
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
        .env("DLOCK_PLAINTEXT", "true")
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
        cmd.env("DLOCK_PLAINTEXT", "true");
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

/// Lock clients at the binary: without a clients file the open lock API is said at start-up
/// (`lock_clients_unauthenticated`, WARN); with one, each refusal is logged once as
/// `lock_client_refused` (client, route template, reason), and no log line carries a token.
#[tokio::test]
async fn lock_clients_are_said_at_start_up_and_each_refusal_is_logged() {
    let start = |clients_file: Option<&std::path::Path>| {
        let mut cmd = Command::new(BIN);
        cmd.env("DLOCK_PLAINTEXT", "true");
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://lockapp@127.0.0.1:1/lockdb",
        ])
        .env_remove("DLOCK_CLIENTS_FILE")
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
        if let Some(f) = clients_file {
            cmd.env("DLOCK_CLIENTS_FILE", f);
        }
        cmd.spawn().unwrap()
    };
    let until = |rx: &mpsc::Receiver<Value>, name: &str, seen: &mut Vec<Value>| loop {
        let v = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no {name} event: {e}"));
        seen.push(v.clone());
        if v["event"] == name {
            return v;
        }
    };

    let mut open = start(None);
    let rx = log_events(&mut open);
    let mut seen = Vec::new();
    let listening = until(&rx, "listening", &mut seen);
    let _ = open.kill();
    let _ = open.wait();
    let warned = seen
        .iter()
        .find(|v| v["event"] == "lock_clients_unauthenticated")
        .unwrap_or_else(|| panic!("no lock_clients_unauthenticated before {listening}: {seen:?}"));
    assert_eq!(warned["level"], "WARN", "{warned}");
    assert!(
        warned["message"]
            .as_str()
            .is_some_and(|m| m.contains("open to any client")),
        "{warned}"
    );

    let token = "binary-payments-token-8c1f2e3d4c5b6a79887766554433";
    let dir = std::env::temp_dir().join(format!("lock-server-clients-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clients.json");
    std::fs::write(
        &file,
        json!({"clients": [{"name": "payments", "token": token, "keyPrefixes": ["account:"],
                            "ownerPrefixes": ["payments-"], "operations": ["lock"]}]})
        .to_string(),
    )
    .unwrap();
    let mut guarded = start(Some(&file));
    let rx = log_events(&mut guarded);
    let mut seen = Vec::new();
    let addr = until(&rx, "listening", &mut seen)["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        seen.iter().all(|v| v["event"] != "lock_clients_unauthenticated"),
        "{seen:?}"
    );
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/sessions");
    let body = json!({"ownerId": "batch-1", "ttlMs": 60_000});
    let r = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED);
    let refused = until(&rx, "lock_client_refused", &mut seen);
    assert_eq!(
        (
            &refused["level"],
            &refused["client"],
            &refused["route"],
            &refused["reason"]
        ),
        (
            &json!("WARN"),
            &json!("unknown"),
            &json!("/v1/sessions"),
            &json!("unauthenticated")
        ),
        "{refused}"
    );
    let r = http
        .post(&url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::FORBIDDEN);
    let refused = until(&rx, "lock_client_refused", &mut seen);
    assert_eq!(
        (&refused["client"], &refused["reason"]),
        (&json!("payments"), &json!("owner")),
        "{refused}"
    );
    let _ = guarded.kill();
    let _ = guarded.wait();
    for v in &seen {
        assert!(!v.to_string().contains(token), "a token in the log: {v}");
    }

    // A bad clients file stops the start (exit 2), naming the client and the field, never the token.
    std::fs::write(
        &file,
        json!({"clients": [{"name": "payments", "token": token, "keyPrefixes": [],
                            "operations": ["lock"]}]})
        .to_string(),
    )
    .unwrap();
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["--database-url", "postgres://lockapp@127.0.0.1:1/lockdb"])
        .env("DLOCK_CLIENTS_FILE", &file)
        .env_remove("DLOCK_LOG_FORMAT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config_invalid") && err.contains("\\\"payments\\\"") && err.contains("keyPrefixes"),
        "{err}"
    );
    assert!(!err.contains(token), "the token leaked: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
