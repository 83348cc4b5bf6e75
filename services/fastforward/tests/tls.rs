//! The fast-forward Job's reads and advance over TLS, against a real PostgreSQL 16 that accepts
//! TLS connections only (the test kit's TLS mode): verify-full with the server's CA works, a CA
//! that did not sign the server's certificate is refused with a message naming TLS verification,
//! the server and the CA file, and a refused advance moves nothing.

use dlock_fastforward::{advance, read_high_water, read_sequence};
use dlock_testkit::pg::{PgServer, TestCa};
use dlock_testkit::{History, migrated_on};

#[tokio::test]
async fn reads_and_advances_over_verify_full_and_refuses_a_ca_that_did_not_sign_the_server() {
    let lock_server = PgServer::start_tls("ff-tls-lockdb").expect("start a TLS PostgreSQL 16");
    let pay_server = PgServer::start_tls("ff-tls-paydb").expect("start a TLS PostgreSQL 16");
    let lockdb = migrated_on(&lock_server, History::Lockdb).await;
    let paydb = migrated_on(&pay_server, History::Paydb).await;
    let lockdb_url = lock_server.tls_url("postgres", &lockdb.name, "verify-full");
    let paydb_url = pay_server.tls_url("postgres", &paydb.name, "verify-full");

    let high = read_high_water("paydb", &paydb_url)
        .await
        .unwrap_or_else(|e| panic!("{paydb_url}: {e}"));
    assert_eq!(high.highest, 0, "a fresh paydb has seen no token");
    let before = read_sequence(&lockdb_url)
        .await
        .unwrap_or_else(|e| panic!("{lockdb_url}: {e}"));
    let target = before + 1_000;
    let moved = advance(&lockdb_url, target)
        .await
        .unwrap_or_else(|e| panic!("{lockdb_url}: {e}"));
    assert!(moved.after >= target, "{moved:?}");

    // The other CA: each step is refused and says why; the sequence stays where it was.
    let other = TestCa::new("ff-other").expect("make a test CA");
    let wrong = |server: &PgServer, db: &str| {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            server.url("postgres", db),
            other.cert().display()
        )
    };
    let refusals = [
        read_high_water("paydb", &wrong(&pay_server, &paydb.name))
            .await
            .map(|_| ())
            .expect_err("a read with the wrong CA must be refused"),
        advance(&wrong(&lock_server, &lockdb.name), target + 1_000_000)
            .await
            .map(|_| ())
            .expect_err("an advance with the wrong CA must be refused"),
    ];
    for (e, port) in refusals.iter().zip([pay_server.port, lock_server.port]) {
        let message = e.to_string();
        for part in [
            "TLS verification failed".to_owned(),
            format!("127.0.0.1:{port}"),
            format!("sslrootcert={}", other.cert().display()),
        ] {
            assert!(message.contains(&part), "{part:?} missing from: {message}");
        }
    }
    assert_eq!(
        read_sequence(&lockdb_url).await.unwrap(),
        moved.after,
        "a refused advance moves nothing"
    );
}
