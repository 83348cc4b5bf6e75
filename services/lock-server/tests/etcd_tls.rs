//! TLS to etcd, against a real etcd whose client URL speaks HTTPS only (the test kit's
//! [`EtcdCluster::single_tls`]: a certificate for 127.0.0.1 and localhost from a test CA, and
//! `--client-cert-auth` with that CA as `--trusted-ca-file`).
//!
//! - with the CA and a client certificate of etcd's CA, sessions and locks work, and tokens increase;
//! - refusals: no client certificate, a client certificate from another CA, a CA file that did not
//!   sign etcd's certificate. Each: lock-server starts (its etcd connection is lazy, as its lockdb
//!   pool is), `/readyz` answers 503, a session is refused with 503, nothing is written under the
//!   prefix (read by an admin client holding the right certificates), and the reason, in an
//!   operator's words, says which certificate (`EtcdRepo::connection_problem`, which the binary
//!   logs as `etcd_connect_failed`, ERROR — checked on the binary for the wrong CA);
//! - the negative control: the same client without a certificate, against an etcd started without
//!   `--client-cert-auth`, gets in and writes: so the refusal above is etcd's, and the test can
//!   tell;
//! - the binary refuses a CA file that is missing, or not PEM, with exit 2 naming the file.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Api, LONG_TTL_MS};
use dlock_common::tls::TlsFiles;
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::pg::TestCa;
use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};
use lock_server::config::EtcdTlsFiles;
use lock_server::{Backend, Config, RunningServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_lock-server");
const PREFIX: &str = "/dlock-tls/";

fn cluster(label: &str, client_cert_auth: bool) -> EtcdCluster {
    EtcdCluster::single_tls(label, client_cert_auth).unwrap_or_else(|e| panic!("start etcd with TLS: {e}"))
}

fn tls(cluster: &EtcdCluster) -> &dlock_testkit::etcd::EtcdTls {
    cluster.tls().expect("a TLS cluster")
}

/// The files lock-server is given: etcd's CA, and the cluster's own client certificate.
fn right_files(cluster: &EtcdCluster) -> EtcdTlsFiles {
    let t = tls(cluster);
    EtcdTlsFiles {
        ca: t.ca().cert().to_owned(),
        client: Some(TlsFiles {
            cert: t.client().cert.clone(),
            key: t.client().key.clone(),
        }),
    }
}

async fn server(cluster: &EtcdCluster, files: EtcdTlsFiles) -> RunningServer {
    lock_server::spawn(Config::etcd(cluster.endpoints(), PREFIX).with_etcd_tls(files))
        .await
        .expect("lock-server starts (its etcd connection is lazy)")
}

/// An etcd client with the right CA and client certificate, to look at what lock-server wrote.
async fn admin(cluster: &EtcdCluster) -> Client {
    let t = tls(cluster);
    let read = |p: &Path| std::fs::read(p).unwrap();
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(t.ca().cert())));
    if t.client_cert_auth() {
        options = options.identity(Identity::from_pem(read(&t.client().cert), read(&t.client().key)));
    }
    Client::connect(
        cluster.endpoints(),
        Some(
            ConnectOptions::new()
                .with_tls(options)
                .with_timeout(Duration::from_secs(5)),
        ),
    )
    .await
    .expect("admin client")
}

/// How many keys lock-server's prefix holds (read by the admin client, which must get through).
async fn keys_under_prefix(cluster: &EtcdCluster) -> i64 {
    admin(cluster)
        .await
        .get(PREFIX, Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .expect("the admin client reads etcd")
        .count()
}

fn repo(server: &RunningServer) -> &lock_server::EtcdRepo {
    match server.state().repo() {
        Backend::Etcd(r) => r,
        other => panic!("not the etcd backend: {other:?}"),
    }
}

/// What lock-server does with `files` against `cluster`: whether it is ready and can open a session,
/// its reason when it cannot, and how many keys the prefix then holds.
struct Outcome {
    ready: StatusCode,
    session: StatusCode,
    problem: Option<String>,
    keys: i64,
}

async fn try_cluster(cluster: &EtcdCluster, files: EtcdTlsFiles) -> Outcome {
    let srv = server(cluster, files).await;
    let api = Api::new(&srv);
    let ready = api.get("/readyz").await.status;
    let session = api
        .post_json(
            "/v1/sessions",
            json!({"ownerId": "tls-test", "ttlMs": LONG_TTL_MS}),
        )
        .await
        .status;
    let problem = repo(&srv).connection_problem().await.map(|p| {
        assert!(p.tls, "a TLS refusal is a configuration to fix: {}", p.message);
        p.message
    });
    srv.shutdown().await.expect("shutdown");
    Outcome {
        ready,
        session,
        problem,
        keys: keys_under_prefix(cluster).await,
    }
}

/// Refused: not ready, no session, nothing written, and a reason that says `words`.
fn assert_refused(o: &Outcome, words: &[&str]) {
    assert_eq!(o.ready, StatusCode::SERVICE_UNAVAILABLE, "/readyz");
    assert_eq!(o.session, StatusCode::SERVICE_UNAVAILABLE, "open a session");
    assert_eq!(o.keys, 0, "nothing may be written under {PREFIX}");
    let problem = o.problem.as_deref().expect("a reason");
    for w in words {
        assert!(problem.contains(w), "{w:?} not in: {problem}");
    }
}

#[tokio::test]
async fn over_https_with_a_client_certificate_sessions_and_locks_work() {
    let cluster = cluster("ok", true);
    assert!(cluster.endpoint(0).starts_with("https://"));
    let srv = server(&cluster, right_files(&cluster)).await;
    let api = Api::new(&srv);
    assert_eq!(api.get("/readyz").await.status, StatusCode::OK);
    assert!(repo(&srv).connection_problem().await.is_none());

    let session = api.open_session("tls-owner", LONG_TTL_MS).await;
    let first = api.acquire("tls-a", session, "tls-owner", LONG_TTL_MS).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    // Written in etcd, as the admin client sees it.
    assert!(
        keys_under_prefix(&cluster).await >= 2,
        "the session and the grant"
    );
    let released = api.release("tls-a", first.token()).await;
    assert_eq!(released.status, StatusCode::OK, "{released:?}");
    let second = api.acquire("tls-a", session, "tls-owner", LONG_TTL_MS).await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    assert!(
        second.token() > first.token(),
        "{} then {}",
        first.token(),
        second.token()
    );
    let released = api.release("tls-a", second.token()).await;
    assert_eq!(released.status, StatusCode::OK, "{released:?}");
    srv.shutdown().await.unwrap();
}

/// No client certificate: etcd (`--client-cert-auth`) refuses the handshake.
#[tokio::test]
async fn without_a_client_certificate_etcd_refuses_and_nothing_is_written() {
    let cluster = cluster("no-client-cert", true);
    let files = EtcdTlsFiles {
        client: None,
        ..right_files(&cluster)
    };
    let o = try_cluster(&cluster, files).await;
    assert_refused(
        &o,
        &[
            "requires a client certificate",
            "none is configured (--etcd-cert-file",
        ],
    );
}

/// The negative control of the test above: the same cert-less client, with etcd started without
/// `--client-cert-auth`, gets in and writes.
#[tokio::test]
async fn negative_control_without_client_cert_auth_the_certless_client_gets_in() {
    let cluster = cluster("open", false);
    let files = EtcdTlsFiles {
        client: None,
        ..right_files(&cluster)
    };
    let o = try_cluster(&cluster, files).await;
    assert_eq!(o.ready, StatusCode::OK, "{:?}", o.problem);
    assert_eq!(o.session, StatusCode::CREATED);
    assert_eq!(o.problem, None);
    assert!(o.keys > 0, "the session is written");
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let cluster = cluster("foreign-client", true);
    let other = TestCa::new("foreign-client-ca").unwrap();
    let foreign = other.issue_client("lock-server", "lock-server").unwrap();
    let files = EtcdTlsFiles {
        client: Some(TlsFiles {
            cert: foreign.cert.clone(),
            key: foreign.key.clone(),
        }),
        ..right_files(&cluster)
    };
    let o = try_cluster(&cluster, files).await;
    assert_refused(
        &o,
        &[
            "the client certificate in --etcd-cert-file",
            &foreign.cert.display().to_string(),
        ],
    );
}

#[tokio::test]
async fn an_etcd_ca_file_that_did_not_sign_etcds_certificate_is_refused() {
    let cluster = cluster("wrong-ca", true);
    let other = TestCa::new("another-ca").unwrap();
    let files = EtcdTlsFiles {
        ca: other.cert().to_owned(),
        ..right_files(&cluster)
    };
    let o = try_cluster(&cluster, files).await;
    assert_refused(
        &o,
        &[
            "TLS verification failed",
            "certificate is not signed by the CA in --etcd-ca-file",
            &other.cert().display().to_string(),
        ],
    );
}

/// The binary with a CA that did not sign etcd's certificate: it starts (as with a lockdb that
/// refuses it), and logs why, as an ERROR naming the CA file; the control, the right CA, logs
/// `etcd_connected`.
#[test]
fn the_binary_logs_a_refused_etcd_certificate_naming_the_ca_file() {
    let cluster = cluster("bin", true);
    let other = TestCa::new("bin-other-ca").unwrap();
    let t = tls(&cluster);
    let first_etcd_event = |ca: &Path| -> Value {
        let mut child = Command::new(BIN)
            .env("DLOCK_PLAINTEXT", "true")
            .args(["--listen", "127.0.0.1:0", "--backend", "etcd"])
            .env("DLOCK_ETCD_ENDPOINTS", cluster.endpoint(0))
            .env("DLOCK_ETCD_PREFIX", PREFIX)
            .env("DLOCK_ETCD_CA_FILE", ca)
            .env("DLOCK_ETCD_CERT_FILE", &t.client().cert)
            .env("DLOCK_ETCD_KEY_FILE", &t.client().key)
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
            .find(|v| v["event"] == "etcd_connect_failed" || v["event"] == "etcd_connected");
        let _ = child.kill();
        let _ = child.wait();
        said.expect("an etcd event from lock-server")
    };
    let refused = first_etcd_event(other.cert());
    assert_eq!(refused["event"], "etcd_connect_failed", "{refused}");
    assert_eq!(refused["level"], "ERROR", "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    for words in [
        "certificate is not signed by the CA in --etcd-ca-file",
        &other.cert().display().to_string(),
        &cluster.endpoint(0),
    ] {
        assert!(message.contains(words), "{words:?} not in: {message}");
    }
    let reached = first_etcd_event(t.ca().cert());
    assert_eq!(reached["event"], "etcd_connected", "{reached}");
}

/// A CA file that cannot be used stops the binary before it starts: exit 2, the file named, and
/// the client key's content never printed.
#[test]
fn the_binary_refuses_a_missing_or_non_pem_ca_file_with_exit_2() {
    let dir = std::env::temp_dir().join(format!("lock-server-etcd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_pem = dir.join("not-pem.crt");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let missing = dir.join("missing.crt");
    for (ca, words) in [(&missing, "cannot read it"), (&not_pem, "not PEM")] {
        let out = Command::new(BIN)
            .env("DLOCK_PLAINTEXT", "true")
            .args(["--listen", "127.0.0.1:0", "--backend", "etcd"])
            .args(["--etcd-endpoints", "https://127.0.0.1:1"])
            .arg("--etcd-ca-file")
            .arg(ca)
            .env_remove("DLOCK_LOG_FORMAT")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("config_invalid")
                && stderr.contains(&ca.display().to_string())
                && stderr.contains(words),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
