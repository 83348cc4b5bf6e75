//! HTTPS on lock-server's API (docs/lock-api.md "TLS"): with `--tls-cert-file` / `--tls-key-file`
//! the listen address serves HTTPS only, and `dlock-client` verifies it against the CA it is
//! given, and only that CA.
//!
//! - the lock cycle (session, acquire, release), `/healthz` and `/metrics` over HTTPS with the
//!   right CA, and HTTP/2 by ALPN;
//! - refusals, each a [`ClientError::Certificate`] naming its cause and the URL: a CA the client
//!   does not trust, a certificate for another name, an expired certificate; and plain `http://`
//!   against the TLS port fails. None of them writes anything to lockdb. The negative control: the
//!   same untrusted certificate with verification switched off is accepted, so the refusal comes
//!   from the verification;
//! - rotation: the files replaced in place with a new certificate of the same CA are served to new
//!   connections (the handshake's certificate is the new file's) without a restart, while a
//!   session opened before keeps working; a broken replacement keeps the last good pair; the
//!   binary logs `tls_certificate_reloaded` and `tls_certificate_reload_failed`;
//! - start-up (the binary): half a pair, a missing key file, a mismatched pair, an expired
//!   certificate, each refused with exit 2 and its message; neither a pair nor `--plaintext`
//!   refused; the `plaintext_http` WARN with `--plaintext`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dlock_client::{CertificateProblem, ClientConfig, ClientError, LockClient};
use dlock_common::tls::TlsFiles;
use dlock_testkit::pg::{ServerCert, TestCa};
use lock_server::RunningServer;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_lock-server");

fn new_ca(label: &str) -> TestCa {
    TestCa::new(label).unwrap_or_else(|e| panic!("make a test CA (openssl): {e}"))
}

fn issue(ca: &TestCa, stem: &str, names: &[&str]) -> ServerCert {
    ca.issue(stem, names)
        .unwrap_or_else(|e| panic!("issue a certificate (openssl): {e}"))
}

fn files(cert: &ServerCert) -> TlsFiles {
    TlsFiles {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
    }
}

async fn https_server(db: &Db, cert: &ServerCert) -> RunningServer {
    lock_server::spawn(config(&db.db).with_tls(files(cert)))
        .await
        .unwrap()
}

fn client(base: &str, ca: &TestCa) -> LockClient {
    LockClient::with_config(base, ClientConfig::default().with_ca_file(ca.cert())).unwrap()
}

/// A short name of a certificate for comparisons whose failure messages stay readable.
fn fingerprint(der: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    der.hash(&mut h);
    format!("{:016x} ({} bytes)", h.finish(), der.len())
}

/// The certificate the server presents to a new connection (a new client: nothing pooled).
async fn served_certificate(base: &str, ca: &TestCa) -> String {
    let pem = std::fs::read(ca.cert()).unwrap();
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .tls_info(true)
        .build()
        .unwrap();
    let resp = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(fingerprint)
        .expect("the handshake's certificate")
}

fn der_of(cert_file: &Path) -> String {
    fingerprint(&CertificateDer::from_pem_file(cert_file).unwrap())
}

fn certificate_problem(e: ClientError, base: &str) -> CertificateProblem {
    match e {
        ClientError::Certificate { url, problem } => {
            assert!(
                url.starts_with(base),
                "the error names the URL: {url} (base {base})"
            );
            problem
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_lock_cycle_over_https_with_the_right_ca() {
    let db = lockdb().await;
    let ca = new_ca("ls-https-cycle");
    let cert = issue(&ca, "server", &["127.0.0.1"]);
    let srv = https_server(&db, &cert).await;
    let base = srv.base_url();
    assert!(base.starts_with("https://"), "{base}");

    let client = client(&base, &ca);
    let session = client
        .open_session("tls-owner", Duration::from_secs(60))
        .await
        .unwrap();
    let lock = session
        .acquire("tls:key", Duration::from_secs(60), Duration::from_secs(2))
        .await
        .unwrap();
    let held = entry(&db.app, "tls:key").await.expect("the grant is in lockdb");
    assert_eq!(held.fencing_token, lock.token().get());
    lock.release().await.unwrap();
    assert_eq!(entry(&db.app, "tls:key").await, None);
    session.close().await.unwrap();
    // Health and metrics on the same listener, over HTTPS.
    assert_eq!(served_certificate(&base, &ca).await, der_of(&cert.cert));
    let pem = std::fs::read(ca.cert()).unwrap();
    let http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), reqwest::StatusCode::OK);
    assert_h2_by_alpn(srv.addr(), &ca).await;
    srv.shutdown().await.unwrap();
}

/// A client that offers only `h2` gets it, and the server answers the HTTP/2 preface with its
/// SETTINGS frame: HTTP/2 is served, not only negotiated.
async fn assert_h2_by_alpn(addr: SocketAddr, ca: &TestCa) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca.cert()).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(dlock_common::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::from(addr.ip());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut head = [0u8; 9];
    tls.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 0x4, "the server's first frame is SETTINGS: {head:?}");
}

/// A TLS endpoint serving `cert` whatever its dates (lock-server itself refuses to load an expired
/// certificate, see `an_expired_certificate_is_refused_at_start_up`): what a client meets when a
/// server's certificate expires under it.
async fn raw_tls_endpoint(cert: &ServerCert) -> SocketAddr {
    let chain = CertificateDer::pem_file_iter(&cert.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&cert.key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(dlock_common::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // The client refuses the certificate; the handshake's end is all there is.
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn refusals_name_their_cause_and_write_nothing() {
    let db = lockdb().await;
    let ca = new_ca("ls-https-refuse");
    let stranger = new_ca("ls-https-stranger");
    let good = issue(&ca, "server", &["127.0.0.1"]);
    let srv = https_server(&db, &good).await;
    let base = srv.base_url();
    let before = snapshot(&db.admin).await;

    // A CA the client does not trust.
    let e = client(&base, &stranger)
        .open_session("tls-owner", Duration::from_secs(60))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert_eq!(certificate_problem(e, &base), CertificateProblem::UnknownIssuer);
    assert!(text.contains("unknown CA") && text.contains(&base), "{text}");

    // A certificate of the right CA for another name.
    let other_name = issue(&ca, "other-name", &["lock-server.other.example"]);
    let misnamed = https_server(&db, &other_name).await;
    let e = client(&misnamed.base_url(), &ca)
        .open_session("tls-owner", Duration::from_secs(60))
        .await
        .unwrap_err();
    let text = e.to_string();
    match certificate_problem(e, &misnamed.base_url()) {
        CertificateProblem::WrongName { presented } => {
            assert!(
                presented.iter().any(|n| n.contains("lock-server.other.example")),
                "{presented:?}"
            );
        }
        other => panic!("expected a wrong name, got {other:?}"),
    }
    assert!(text.contains("wrong name"), "{text}");

    // An expired certificate of the right CA, for the right name.
    let expired = ca
        .issue_expired("expired", &["127.0.0.1"])
        .unwrap_or_else(|e| panic!("issue an expired certificate (openssl, faketime): {e}"));
    let addr = raw_tls_endpoint(&expired).await;
    let expired_base = format!("https://{addr}");
    let e = client(&expired_base, &ca)
        .open_session("tls-owner", Duration::from_secs(60))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert_eq!(certificate_problem(e, &expired_base), CertificateProblem::Expired);
    assert!(text.contains("expired"), "{text}");

    // Plain HTTP against the TLS port: no answer is an HTTP answer.
    let plain = base.replacen("https://", "http://", 1);
    let e = LockClient::new(&plain)
        .unwrap()
        .open_session("tls-owner", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Transport(_)), "{e:?}");

    // An https URL without a CA is refused before anything is sent.
    let e = LockClient::new(&base).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::InvalidArgument {
                code: "CA_REQUIRED",
                ..
            }
        ),
        "{e:?}"
    );

    assert_eq!(
        snapshot(&db.admin).await,
        before,
        "a refused connection writes nothing"
    );

    // The negative control: the stranger's client with verification switched off gets through to
    // the same server, so the refusal above was the verification's.
    let unverified = ClientConfig {
        unsafe_accept_any_certificate: true,
        ..ClientConfig::default().with_ca_file(stranger.cert())
    };
    let session = LockClient::with_config(&base, unverified)
        .unwrap()
        .open_session("tls-owner", Duration::from_secs(60))
        .await
        .expect("without verification the untrusted certificate is accepted");
    assert_ne!(snapshot(&db.admin).await, before, "and the session is written");
    session.close().await.unwrap();
    misnamed.shutdown().await.unwrap();
    srv.shutdown().await.unwrap();
}

/// Writes `from`'s content to `to` the way a renewal does: a new file renamed over the old one.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

fn mounted_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lock-server-tls-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn renewed_files_are_served_to_new_connections_without_a_restart() {
    let db = lockdb().await;
    let ca = new_ca("ls-https-rotate");
    let first = issue(&ca, "first", &["127.0.0.1"]);
    let second = issue(&ca, "second", &["127.0.0.1"]);
    let stranger = new_ca("ls-https-rotate-mismatch")
        .issue("stranger", &["127.0.0.1"])
        .unwrap();
    assert_ne!(der_of(&first.cert), der_of(&second.cert));

    // The files the server is given, as a mounted Secret's: replaced in place later.
    let dir = mounted_dir("rotate");
    let mounted = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    replace(&first.cert, &mounted.cert);
    replace(&first.key, &mounted.key);
    let srv = lock_server::spawn(config(&db.db).with_tls(mounted.clone()))
        .await
        .unwrap();
    let base = srv.base_url();
    assert_eq!(served_certificate(&base, &ca).await, der_of(&first.cert));

    let client = client(&base, &ca);
    let session = client
        .open_session("tls-rotate", Duration::from_secs(60))
        .await
        .unwrap();

    replace(&second.cert, &mounted.cert);
    replace(&second.key, &mounted.key);
    assert_eq!(
        served_certificate(&base, &ca).await,
        der_of(&second.cert),
        "a new connection gets the new certificate"
    );
    // The session opened before the renewal keeps working.
    let lock = session
        .acquire("tls:rotate", Duration::from_secs(60), Duration::from_secs(2))
        .await
        .unwrap();
    lock.release().await.unwrap();

    // A broken replacement (a key of another certificate) is not served: the last good pair is.
    replace(&stranger.key, &mounted.key);
    assert_eq!(served_certificate(&base, &ca).await, der_of(&second.cert));
    let lock = session
        .acquire("tls:rotate", Duration::from_secs(60), Duration::from_secs(2))
        .await
        .unwrap();
    lock.release().await.unwrap();
    session.close().await.unwrap();
    srv.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_expired_certificate_is_refused_at_start_up() {
    let db = lockdb().await;
    let ca = new_ca("ls-https-expired");
    let expired = ca
        .issue_expired("expired", &["127.0.0.1"])
        .unwrap_or_else(|e| panic!("issue an expired certificate (openssl, faketime): {e}"));
    let e = lock_server::spawn(config(&db.db).with_tls(files(&expired)))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&expired.cert.display().to_string()) && text.contains("expired at"),
        "{text}"
    );
    assert!(dlock_common::serve::StartFailure::is_config(&e), "{e:?}");
}

// ---- the binary ------------------------------------------------------------------------------

/// Runs the binary to its exit with `args` (no database is reached: its pool is lazy).
fn run_bin(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://lockapp@127.0.0.1:1/lockdb",
        ])
        .args(args)
        .env_remove("DLOCK_TLS_CERT_FILE")
        .env_remove("DLOCK_TLS_KEY_FILE")
        .env_remove("DLOCK_PLAINTEXT")
        .env_remove("DLOCK_LOG_FORMAT")
        .output()
        .unwrap()
}

fn refused_with(args: &[&str], words: &[&str]) {
    let out = run_bin(args);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("config_invalid"), "{stderr}");
    for w in words {
        assert!(stderr.contains(w), "{w:?} not in: {stderr}");
    }
}

#[test]
fn bad_tls_files_stop_the_binary_naming_the_file_and_the_problem() {
    let ca = new_ca("ls-https-bin");
    let good = issue(&ca, "server", &["127.0.0.1"]);
    let other = issue(&ca, "other", &["127.0.0.1"]);
    let cert = good.cert.to_str().unwrap();
    let missing = good.key.with_extension("missing");
    let missing = missing.to_str().unwrap();

    refused_with(&["--tls-cert-file", cert], &["the key file is not"]);
    refused_with(
        &["--tls-cert-file", cert, "--tls-key-file", missing],
        &[&format!("the TLS key file {missing}: cannot read it")],
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
    // A key where the certificate should be: not a certificate's PEM.
    refused_with(
        &[
            "--tls-cert-file",
            good.key.to_str().unwrap(),
            "--tls-key-file",
            good.key.to_str().unwrap(),
        ],
        &["the TLS certificate file", "not PEM"],
    );
    let expired = ca.issue_expired("expired", &["127.0.0.1"]).unwrap();
    refused_with(
        &[
            "--tls-cert-file",
            expired.cert.to_str().unwrap(),
            "--tls-key-file",
            expired.key.to_str().unwrap(),
        ],
        &["expired at"],
    );
}

/// The first of `names` the binary logs at start-up (before or as it says `listening`).
fn first_start_up_event(envs: &[(&str, &str)], names: &[&str]) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        "postgres://lockapp@127.0.0.1:1/lockdb",
    ])
    .env_remove("DLOCK_TLS_CERT_FILE")
    .env_remove("DLOCK_TLS_KEY_FILE")
    .env_remove("DLOCK_LOG_FORMAT")
    .stderr(Stdio::piped())
    .stdout(Stdio::null());
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
    // Neither a certificate nor --plaintext: refused, naming both ways out, nothing started.
    refused_with(&[], &["no TLS certificate", "--tls-cert-file", "--plaintext"]);
    let said = first_start_up_event(
        &[("DLOCK_PLAINTEXT", "true")],
        &["plaintext_http", "tls_enabled", "listening"],
    );
    assert_eq!(said["event"], "plaintext_http", "{said}");
    assert_eq!(said["level"], "WARN", "{said}");
    let message = said["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cleartext") && message.contains("bearer"),
        "{message}"
    );

    // Its control: with the files (from the environment) the same binary says TLS instead.
    let ca = new_ca("ls-https-warn");
    let cert = issue(&ca, "server", &["127.0.0.1"]);
    let said = first_start_up_event(
        &[
            ("DLOCK_TLS_CERT_FILE", cert.cert.to_str().unwrap()),
            ("DLOCK_TLS_KEY_FILE", cert.key.to_str().unwrap()),
        ],
        &["plaintext_http", "tls_enabled", "listening"],
    );
    assert_eq!(said["event"], "tls_enabled", "{said}");
}

/// The binary says when it picks up renewed files, and when it cannot (keeping the last good pair):
/// `tls_certificate_reloaded` (INFO), `tls_certificate_reload_failed` (ERROR, naming the file and
/// the reason).
#[tokio::test]
async fn the_binary_logs_each_reload_and_each_failed_one() {
    let ca = new_ca("ls-https-bin-reload");
    let first = issue(&ca, "first", &["127.0.0.1"]);
    let second = issue(&ca, "second", &["127.0.0.1"]);
    let stranger = new_ca("ls-https-bin-reload-other")
        .issue("stranger", &["127.0.0.1"])
        .unwrap();
    let dir = mounted_dir("bin-reload");
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    replace(&first.cert, &cert);
    replace(&first.key, &key);

    let mut child = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://lockapp@127.0.0.1:1/lockdb",
        ])
        .env("DLOCK_TLS_CERT_FILE", &cert)
        .env("DLOCK_TLS_KEY_FILE", &key)
        .env_remove("DLOCK_LOG_FORMAT")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && tx.send(v).is_err()
            {
                break;
            }
        }
    });
    let next_event = |names: &[&str]| loop {
        let v = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no {names:?} event: {e}"));
        if names.iter().any(|n| v["event"] == *n) {
            return v;
        }
    };
    let addr = next_event(&["listening"])["addr"].as_str().unwrap().to_owned();
    let base = format!("https://{addr}");
    assert_eq!(served_certificate(&base, &ca).await, der_of(&first.cert));

    replace(&second.cert, &cert);
    replace(&second.key, &key);
    assert_eq!(served_certificate(&base, &ca).await, der_of(&second.cert));
    let said = next_event(&["tls_certificate_reloaded", "tls_certificate_reload_failed"]);
    assert_eq!(said["event"], "tls_certificate_reloaded", "{said}");
    assert_eq!(said["level"], "INFO", "{said}");

    replace(&stranger.key, &key);
    assert_eq!(served_certificate(&base, &ca).await, der_of(&second.cert));
    let said = next_event(&["tls_certificate_reloaded", "tls_certificate_reload_failed"]);
    assert_eq!(said["event"], "tls_certificate_reload_failed", "{said}");
    assert_eq!(said["level"], "ERROR", "{said}");
    let error = said["error"].as_str().unwrap_or_default();
    assert!(error.contains("does not match the certificate"), "{said}");

    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
