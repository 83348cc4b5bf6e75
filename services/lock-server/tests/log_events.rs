//! The contract's log events (docs/lock-api.md): each outcome logs its `event` with the fields an
//! operator needs. One test in this binary, because it installs the process-wide subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn events(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The events named `name` (the `event` field, as lock-server logs it).
    fn named(&self, name: &str) -> Vec<Value> {
        self.events().into_iter().filter(|e| e["event"] == name).collect()
    }
}

#[tokio::test]
async fn each_outcome_logs_its_contract_event() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .init();

    let db = lockdb().await;
    let srv = server(&db.db).await;
    let api = Api::new(&srv);

    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let t1 = api.acquire("k", s1, "w1", SHORT_TTL_MS).await.token();
    await_lease_lapsed(&db.admin, "k").await;
    let t2 = api.acquire("k", s2, "w2", LONG_TTL_MS).await.token();
    api.acquire("k", s1, "w1", LONG_TTL_MS).await; // contended
    api.renew("k", t1, LONG_TTL_MS).await; // lease_expired
    api.release("k", t1).await; // stale
    api.release("k", t2).await; // not stale
    let gone = api.open_session("w3", SHORT_TTL_MS).await;
    await_session_lapsed(&db.admin, gone).await;
    lock_server::reaper::reap_once(srv.state()).await.unwrap();
    api.heartbeat(gone, LONG_TTL_MS).await; // session_lost
    let t3 = api.acquire("r", s1, "w1", LONG_TTL_MS).await.token();
    api.revoke(
        "r",
        Some(ADMIN_TOKEN),
        json!({"operator": "ops", "reason": "test", "requestId": "q1"}),
    )
    .await;
    srv.shutdown().await.unwrap();

    let granted = captured.named("lock_granted");
    assert!(
        granted
            .iter()
            .any(|e| e["lock_key"] == "k" && e["fencing_token"] == t2),
        "{granted:?}"
    );
    let contended = captured.named("lock_contended");
    assert!(contended.iter().any(|e| e["lock_key"] == "k"), "{contended:?}");
    assert!(
        contended.iter().all(|e| !e.to_string().contains(&s2.to_string())),
        "the holder's session leaked into the contended log: {contended:?}"
    );

    let expired = captured.named("lease_expired");
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(
        (&expired[0]["lock_key"], &expired[0]["fencing_token"]),
        (&json!("k"), &json!(t1))
    );
    assert_eq!(expired[0]["level"], "WARN");

    let released = captured.named("lock_released");
    assert!(
        released
            .iter()
            .any(|e| e["fencing_token"] == t1 && e["stale"] == true),
        "{released:?}"
    );
    assert!(
        released
            .iter()
            .any(|e| e["fencing_token"] == t2 && e["stale"] == false),
        "{released:?}"
    );

    let reaped = captured.named("sessions_reaped");
    assert!(reaped.iter().any(|e| e["deleted"] == 1), "{reaped:?}");
    let lost = captured.named("session_lost");
    assert!(
        lost.iter().any(|e| e["session_id"] == gone.to_string()),
        "{lost:?}"
    );

    let revoked = captured.named("lock_revoked");
    assert!(
        revoked.iter().any(|e| e["lock_key"] == "r"
            && e["previous_owner"] == "w1"
            && e["previous_token"] == t3
            && e["operator"] == "ops"
            && e["request_id"] == "q1"),
        "{revoked:?}"
    );
}
