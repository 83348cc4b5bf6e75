//! TLS to PostgreSQL, against a real PostgreSQL 16 that accepts TLS connections only (the test
//! kit's TLS mode: `ssl=on`, a certificate from a test CA, `hostnossl … reject`).
//!
//! - `sslmode=verify-full&sslrootcert=<CA>` connects, over TLS, both as the one-shot programs do
//!   (`dlock_common::db::connect`) and as the services' pool does (`lazy_pool`);
//! - the negative control: the same server refuses a connection without TLS, so the server really
//!   requires it;
//! - a CA that did not sign the server's certificate, and a host name the certificate does not
//!   carry, are refused with a message that names TLS verification, the host and the CA file —
//!   each next to the same server accepting the right CA, or the same CA under verify-ca;
//! - a CA file that is missing or holds no certificate is a configuration error before any
//!   connection;
//! - the `dlock-migrate` binary migrates a database over verify-full, and with the wrong CA exits
//!   non-zero, saying why, without touching the database.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use dlock_common::db::{self, ConnectError, Failure, UrlError};
use dlock_testkit::pg::{PgServer, TestCa};
use dlock_testkit::{History, migrations_dir};
use sqlx::{Connection, PgConnection};

/// A server whose certificate names `localhost` and `127.0.0.1`.
fn tls_server() -> &'static PgServer {
    static S: OnceLock<PgServer> = OnceLock::new();
    S.get_or_init(|| PgServer::start_tls("tls").unwrap_or_else(|e| panic!("start a TLS PostgreSQL 16: {e}")))
}

/// A server whose certificate names another host only: every URL of the test kit reaches it at
/// 127.0.0.1, which its certificate does not name.
fn misnamed_server() -> &'static PgServer {
    static S: OnceLock<PgServer> = OnceLock::new();
    S.get_or_init(|| {
        PgServer::start_tls_for("tls-misnamed", &["db.internal.example"], &[])
            .unwrap_or_else(|e| panic!("start a TLS PostgreSQL 16: {e}"))
    })
}

/// A CA that signed nothing either server presents.
fn other_ca() -> &'static TestCa {
    static C: OnceLock<TestCa> = OnceLock::new();
    C.get_or_init(|| TestCa::new("other").unwrap_or_else(|e| panic!("make a test CA: {e}")))
}

fn with_ca(server: &PgServer, db: &str, sslmode: &str, ca: &Path) -> String {
    format!(
        "{}?sslmode={sslmode}&sslrootcert={}",
        server.url("postgres", db),
        ca.display()
    )
}

/// Whether this session's connection is encrypted, as the server sees it.
async fn encrypted(c: &mut PgConnection) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(c)
        .await
        .expect("read pg_stat_ssl")
}

fn refused(result: Result<PgConnection, ConnectError>, url: &str) -> ConnectError {
    match result {
        Ok(_) => panic!("{url} must be refused, and connected"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn verify_full_with_the_right_ca_connects_over_tls() {
    let srv = tls_server();
    let url = srv.tls_url("postgres", "postgres", "verify-full");

    let mut c = db::connect(&url, "tls-test")
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(encrypted(&mut c).await, "the session must be encrypted");
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut c).await.unwrap();
    assert_eq!(one, 1);
    c.close().await.unwrap();

    // The pool every service opens (lock-server, payment-resource, rail-proxy) takes the same URL.
    let pool = db::lazy_pool(&url, "tls-test-pool", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let mut c = pool.acquire().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(encrypted(&mut c).await, "the pool's session must be encrypted");
}

#[tokio::test]
async fn the_server_refuses_a_connection_without_tls() {
    let srv = tls_server();
    let plain = format!("{}?sslmode=disable", srv.url("postgres", "postgres"));
    let e = refused(db::connect(&plain, "tls-test").await, &plain);
    assert_eq!(e.failure(), Some(Failure::TlsRequiredByServer), "{e}");
    let message = e.to_string();
    assert!(message.contains("without TLS"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{}", srv.port)), "{message}");
    match &e {
        ConnectError::Failed {
            cause: sqlx::Error::Database(d),
            ..
        } => assert_eq!(d.code().as_deref(), Some("28000"), "{message}"),
        other => panic!("the server itself must refuse: {other:?}"),
    }

    // The same server, the same URL with TLS (encrypted, nothing verified) is admitted: what was
    // refused is the lack of TLS alone.
    let encrypted_url = format!("{}?sslmode=require", srv.url("postgres", "postgres"));
    let mut c = db::connect(&encrypted_url, "tls-test")
        .await
        .unwrap_or_else(|e| panic!("{encrypted_url}: {e}"));
    assert!(encrypted(&mut c).await);
}

#[tokio::test]
async fn a_ca_that_did_not_sign_the_server_certificate_is_refused() {
    let srv = tls_server();
    let own_ca = &srv.tls().expect("a TLS server").ca;

    // The control: this server with its own CA, under each mode that checks the CA.
    for mode in ["verify-full", "verify-ca", "require"] {
        let url = with_ca(srv, "postgres", mode, own_ca.cert());
        let mut c = db::connect(&url, "tls-test")
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(encrypted(&mut c).await, "{url}");
    }

    // `require` with a CA file verifies the CA too (libpq's rule), so it is refused as well.
    for mode in ["verify-full", "verify-ca", "require"] {
        let url = with_ca(srv, "postgres", mode, other_ca().cert());
        let e = refused(db::connect(&url, "tls-test").await, &url);
        assert_eq!(e.failure(), Some(Failure::UntrustedCertificate), "{mode}: {e}");
        let message = e.to_string();
        for part in [
            "TLS verification failed".to_owned(),
            format!("127.0.0.1:{}", srv.port),
            format!("sslrootcert={}", other_ca().cert().display()),
            "not signed by a CA".to_owned(),
        ] {
            assert!(
                message.contains(&part),
                "{mode}: {part:?} missing from: {message}"
            );
        }
        assert!(e.is_config(), "{mode}: a CA to fix, not a server to wait for");
    }

    // The services' pool meets the same refusal at first use; explain() words it the same way.
    let url = with_ca(srv, "postgres", "verify-full", other_ca().cert());
    let pool = db::lazy_pool(&url, "tls-test-pool", 1, Duration::from_secs(10)).unwrap();
    let cause = pool.acquire().await.expect_err("the pool must be refused too");
    let (_, target) = db::connect_options(&url, "tls-test-pool").unwrap();
    let e = db::explain(cause, &target);
    assert_eq!(e.failure(), Some(Failure::UntrustedCertificate), "{e}");
}

#[tokio::test]
async fn a_host_name_the_certificate_does_not_carry_is_refused_under_verify_full() {
    let srv = misnamed_server();
    let ca = srv.tls().expect("a TLS server").ca.cert();

    let url = with_ca(srv, "postgres", "verify-full", ca);
    let e = refused(db::connect(&url, "tls-test").await, &url);
    assert_eq!(e.failure(), Some(Failure::HostNameMismatch), "{e}");
    let message = e.to_string();
    for part in [
        "TLS verification failed".to_owned(),
        "not valid for the host name \"127.0.0.1\"".to_owned(),
        format!("127.0.0.1:{}", srv.port),
        format!("sslrootcert={}", ca.display()),
    ] {
        assert!(message.contains(&part), "{part:?} missing from: {message}");
    }

    // The control: the same server and CA under verify-ca, which does not check the name.
    let url = with_ca(srv, "postgres", "verify-ca", ca);
    let mut c = db::connect(&url, "tls-test")
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(encrypted(&mut c).await);
}

#[tokio::test]
async fn a_missing_or_unusable_ca_file_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ca.crt");
    let not_pem = dir.path().join("not-a-certificate.crt");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    // Nothing listens on port 1: the CA file is refused before any connection is tried.
    let url = |ca: &Path| {
        format!(
            "postgres://u:hunter2@127.0.0.1:1/db?sslmode=verify-full&sslrootcert={}",
            ca.display()
        )
    };

    for (ca, reason) in [(&missing, "cannot read it"), (&not_pem, "holds no certificate")] {
        let e = db::lazy_pool(&url(ca), "tls-test", 1, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, UrlError::RootCert { .. }), "{e:?}");
        let message = e.to_string();
        assert!(message.contains(&ca.display().to_string()), "{message}");
        assert!(message.contains(reason), "{message}");
        assert!(!message.contains("hunter2"), "{message}");

        let e = refused(db::connect(&url(ca), "tls-test").await, &url(ca));
        assert!(matches!(e, ConnectError::Url(UrlError::RootCert { .. })), "{e:?}");
        assert!(e.is_config());
    }

    // The control: a real CA file passes the same check (the pool is lazy: nothing connects).
    let pool = db::lazy_pool(&url(other_ca().cert()), "tls-test", 1, Duration::from_secs(1));
    assert!(pool.is_ok(), "{:?}", pool.err());
}

/// `dlock-migrate` as the operator's migration Job runs it, `DATABASE_URL` from the environment.
fn dlock_migrate(database_url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dlock-migrate"))
        .env("DATABASE_URL", database_url)
        .arg("--dir")
        .arg(migrations_dir(History::Lockdb))
        .output()
        .expect("run dlock-migrate")
}

#[tokio::test]
async fn the_migrator_migrates_over_verify_full_and_refuses_the_wrong_ca() {
    let srv = tls_server();
    srv.sql("postgres", "CREATE DATABASE migrated_over_tls").unwrap();
    let history = "SELECT count(*) FROM flyway_schema_history WHERE success";

    // The wrong CA first: the binary fails, says why, and the database stays empty.
    let out = dlock_migrate(&with_ca(
        srv,
        "migrated_over_tls",
        "verify-full",
        other_ca().cert(),
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {stderr}");
    for part in [
        "TLS verification failed".to_owned(),
        format!("127.0.0.1:{}/migrated_over_tls", srv.port),
        format!("sslrootcert={}", other_ca().cert().display()),
    ] {
        assert!(stderr.contains(&part), "{part:?} missing from: {stderr}");
    }
    let tables = srv
        .sql(
            "migrated_over_tls",
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
        )
        .unwrap();
    assert_eq!(tables, "0", "nothing may be applied over a refused connection");

    // The right CA: migrated, over TLS.
    let url = srv.tls_url("postgres", "migrated_over_tls", "verify-full");
    let out = dlock_migrate(&url);
    assert!(
        out.status.success(),
        "dlock-migrate over verify-full: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = dlock_migrate::load_dir(&migrations_dir(History::Lockdb)).unwrap();
    let mut c = db::connect(&url, "tls-test").await.unwrap();
    let applied: i64 = sqlx::query_scalar(history).fetch_one(&mut c).await.unwrap();
    assert_eq!(applied, files.len() as i64, "every lockdb migration applied");
    let sequence: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_class WHERE relname = 'fencing_token_seq'")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(sequence, 1, "the lockdb schema is there");
}
