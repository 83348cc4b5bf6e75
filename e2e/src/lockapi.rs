//! A minimal client of lock-server's HTTP API (docs/lock-api.md) for the cluster tests, which play
//! the lock holders themselves: sessions, acquire, release, read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use dlock_operator::actions::sequence::SequenceView;
use dlock_operator::crd::sequence::SequenceJump;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

/// How far a jump moves `fencing_token_seq` above what it finds, at least (lock-server's
/// `epoch::JUMP`; docs/design.md, "Never a reused token: every promotion is a restore"). Tokens are
/// therefore never 1, 2, 3: the first grant of a fresh lockdb is already above 2^48.
pub const JUMP: i64 = 1 << 32;

/// The tests' own lock client: lock-server in a cluster always has a clients file, so the tests that
/// play lock holders are a client too, added to every LockService they make through
/// `spec.lockServer.clientsSecretRef` (the Secret [`TEST_CLIENTS_SECRET`], key `clients.json`; the
/// kind tier's copy is `e2e/kind/samples/lock-clients.yaml`). Test-only: the token is no secret.
pub const TEST_CLIENTS_SECRET: &str = "e2e-lock-clients";
pub const TEST_CLIENT_TOKEN: &str = "e2e-lock-holders-0123456789abcdef0123456789abcdef";

/// That Secret's clients file: keys `account:`, `job:` and `kind:`, owners `worker…` and `kind-…`
/// (what the tests lock, under which owner ids); every operation but the listing, which the tests
/// (as `kubectl dlock`) do with the admin token.
pub fn test_clients_file() -> String {
    json!({"clients": [{
        "name": "e2e-lock-holders",
        "token": TEST_CLIENT_TOKEN,
        "keyPrefixes": ["account:", "job:", "kind:"],
        "ownerPrefixes": ["worker", "kind-"],
        "operations": ["lock", "read", "watch"],
    }]})
    .to_string()
}

/// lock-server on a loopback port: plain HTTP (the cluster tier's stand-in pods), or HTTPS verified
/// against the namespace's CA for the Service's name (the kind tier, through a port-forward).
#[derive(Debug, Clone)]
pub struct LockApi {
    pub port: u16,
    tls: Option<LockTls>,
    /// The bearer token of every call ([`TEST_CLIENT_TOKEN`]) unless the call names its own
    /// `Authorization`; `None`: calls without one.
    token: Option<String>,
}

/// The client side of HTTPS: the CA to trust and the name the certificate must carry.
#[derive(Clone)]
struct LockTls {
    config: Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for LockTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LockTls({:?})", self.name)
    }
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
    /// Plain HTTP on `port`.
    pub fn plain(port: u16) -> Self {
        Self {
            port,
            tls: None,
            token: Some(TEST_CLIENT_TOKEN.to_owned()),
        }
    }

    /// The same server, called without any credential (what lock-server refuses on its lock
    /// routes: 401).
    pub fn anonymous(&self) -> Self {
        Self {
            token: None,
            ..self.clone()
        }
    }

    /// HTTPS on `port`, trusting only the CA certificates of `ca_pem`, for server name `name`.
    pub fn https(port: u16, ca_pem: &str, name: &str) -> Self {
        let config = trusting(ca_pem).unwrap_or_else(|e| panic!("{e}"));
        let name = rustls::pki_types::ServerName::try_from(name.to_owned())
            .unwrap_or_else(|e| panic!("server name {name}: {e}"));
        Self {
            port,
            tls: Some(LockTls { config, name }),
            token: Some(TEST_CLIENT_TOKEN.to_owned()),
        }
    }

    /// Sends `request` (one HTTP/1.0 exchange) and reads the whole answer.
    fn exchange(&self, what: &str, request: &[u8]) -> String {
        let tcp = TcpStream::connect(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("connect lock-server on {}: {e}", self.port));
        tcp.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut buf = Vec::new();
        let read = match &self.tls {
            None => {
                let mut s = tcp;
                s.write_all(request).unwrap_or_else(|e| panic!("{what}: {e}"));
                s.read_to_end(&mut buf)
            }
            Some(tls) => {
                let conn = rustls::ClientConnection::new(tls.config.clone(), tls.name.clone())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut s = rustls::StreamOwned::new(conn, tcp);
                s.write_all(request)
                    .and_then(|()| s.flush())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                s.read_to_end(&mut buf)
            }
        };
        match read {
            Ok(_) => {}
            // A server that closes without TLS's close_notify after a complete answer (HTTP/1.0
            // ends the body with the connection) has said everything.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
            Err(e) => panic!("{what}: {e}"),
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// `(status, body)` of one request.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
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
        let own_credential = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        if let Some(token) = self.token.as_deref().filter(|_| !own_credential) {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&payload);
        let buf = self.exchange(&format!("{method} {path}"), head.as_bytes());
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

/// A TLS client configuration that trusts the CA certificates of `ca_pem` (every one of a bundle)
/// and nothing else.
pub fn trusting(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| format!("the CA bundle: {e}"))?)
            .map_err(|e| format!("the CA bundle: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    /// The kind tier's copy of the tests' lock client is this one.
    #[test]
    fn the_kind_tiers_lock_client_is_the_cluster_tiers() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/kind/samples/lock-clients.yaml");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let secret: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(
            secret["metadata"]["name"].as_str(),
            Some(super::TEST_CLIENTS_SECRET)
        );
        let file = secret["stringData"]["clients.json"].as_str().unwrap();
        let kind: serde_json::Value = serde_json::from_str(file).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&super::test_clients_file()).unwrap();
        assert_eq!(kind, ours);
    }
}
