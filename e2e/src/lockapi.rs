//! A minimal client of lock-server's HTTP API (docs/lock-api.md) for the cluster tests, which play
//! the lock holders themselves: sessions, acquire, release, read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use dlock_operator::actions::sequence::SequenceView;
use dlock_operator::crd::sequence::SequenceJump;
use serde_json::{Value, json};

/// How far a jump moves `fencing_token_seq` above what it finds, at least (lock-server's
/// `epoch::JUMP`; docs/design.md, "Never a reused token: every promotion is a restore"). Tokens are
/// therefore never 1, 2, 3: the first grant of a fresh lockdb is already above 2^48.
pub const JUMP: i64 = 1 << 32;

/// lock-server on a loopback port.
#[derive(Debug, Clone, Copy)]
pub struct LockApi {
    pub port: u16,
}

/// One grant.
#[derive(Debug, Clone)]
pub struct Grant {
    pub key: String,
    pub owner: String,
    pub session: String,
    pub token: i64,
}

impl LockApi {
    /// `(status, body)` of one request.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("connect lock-server on {}: {e}", self.port));
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let payload = body.map(Value::to_string).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\ncontent-length: {}\r\n",
            payload.len()
        );
        if body.is_some() {
            head.push_str("content-type: application/json\r\n");
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())
            .and_then(|()| s.write_all(payload.as_bytes()))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let mut buf = String::new();
        s.read_to_string(&mut buf)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path}: not HTTP: {buf:?}"));
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| serde_json::from_str(b).unwrap_or(Value::String(b.to_owned())))
            .unwrap_or(Value::Null);
        (status, body)
    }

    /// A session for `owner` and a grant of `key` under it (ttl in ms).
    pub fn acquire(&self, owner: &str, key: &str, ttl_ms: i64) -> Grant {
        let (st, sess) = self.call(
            "POST",
            "/v1/sessions",
            Some(&json!({"ownerId": owner, "ttlMs": 600_000})),
            &[],
        );
        assert_eq!(st, 201, "create session: {sess}");
        let session = sess["sessionId"].as_str().unwrap_or_default().to_owned();
        let (st, grant) = self.call(
            "POST",
            &format!("/v1/locks/{key}/acquire"),
            Some(&json!({"sessionId": session, "ownerId": owner, "ttlMs": ttl_ms})),
            &[],
        );
        assert_eq!(st, 200, "acquire {key} as {owner}: {grant}");
        Grant {
            key: key.to_owned(),
            owner: owner.to_owned(),
            session,
            token: grant["fencingToken"]
                .as_i64()
                .unwrap_or_else(|| panic!("no token in {grant}")),
        }
    }

    /// Releases a grant (compare-and-delete on its token).
    pub fn release(&self, g: &Grant) -> Value {
        let token = g.token.to_string();
        let (st, body) = self.call(
            "POST",
            &format!("/v1/locks/{}/release", g.key),
            None,
            &[("X-Fencing-Token", &token)],
        );
        assert_eq!(st, 200, "release: {body}");
        body
    }

    /// `GET /v1/sequence`: this process's last jump of the sequence, read with the operator's own
    /// type (what the operator puts in `status.sequence`).
    pub fn sequence(&self) -> SequenceView {
        let (st, body) = self.call("GET", "/v1/sequence", None, &[]);
        assert_eq!(st, 200, "GET /v1/sequence: {body}");
        serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("GET /v1/sequence: {e}: {body}"))
    }

    /// The last jump this process made, which must exist (on PostgreSQL every lock-server jumps
    /// before its first grant, and its readiness probe opens a granting connection).
    pub fn last_jump(&self) -> SequenceJump {
        let view = self.sequence();
        assert!(view.jumps_enabled, "lock-server runs with the jump off: {view:?}");
        match view.last_jump {
            Some(j) => j,
            None => panic!("lock-server reports no jump: backend {}", view.backend),
        }
    }

    /// `GET /v1/locks/{key}`.
    pub fn get(&self, key: &str) -> Value {
        let (st, body) = self.call("GET", &format!("/v1/locks/{key}"), None, &[]);
        assert_eq!(st, 200, "get {key}: {body}");
        body
    }
}
