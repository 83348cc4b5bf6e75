//! The executor's HTTP clients against an HTTPS server (lock-server with `--tls-cert-file`, on a
//! real lockdb; the resource clients are the same code whichever server answers):
//!
//! - with the CA that signed the server's certificate (`--ca-file`) a resource client gets the
//!   server's answer; with another CA it is refused with [`ClientError::Certificate`]
//!   (`UnknownIssuer`), before anything is sent;
//! - a CA file that cannot be read stops the executor at start-up as bad configuration (exit 2).

use std::time::Duration;

use clap::Parser;
use dlock_client::{CertificateProblem, ClientError};
use dlock_common::serve::StartFailure;
use dlock_common::tls::TlsFiles;
use dlock_testkit::pg::TestCa;
use payout_executor::config::Cli;
use payout_executor::resources::{PaymentApi, authenticated_client};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn new_ca(label: &str) -> TestCa {
    TestCa::new(label).unwrap_or_else(|e| panic!("make a test CA (openssl): {e}"))
}

#[tokio::test]
async fn the_resource_clients_trust_only_the_given_ca() {
    let db = dlock_testkit::lockdb().await;
    let ca = new_ca("pe-https");
    let cert = ca
        .issue("server", &["127.0.0.1"])
        .unwrap_or_else(|e| panic!("issue a certificate (openssl): {e}"));
    let server = lock_server::spawn(
        lock_server::Config::new(db.app_url())
            .with_reaper_interval(None)
            .with_tls(TlsFiles {
                cert: cert.cert.clone(),
                key: cert.key.clone(),
            }),
    )
    .await
    .unwrap();
    let base = server.base_url();
    assert!(base.starts_with("https://"), "{base}");
    let timeout = Duration::from_secs(5);

    // The right CA: the request reaches the server, which answers (lock-server has no payout
    // routes, so a 404 answer: what matters is that it is an HTTP answer).
    let right = PaymentApi::new(
        authenticated_client(timeout, None, Some(ca.cert())).unwrap(),
        &base,
    )
    .unwrap();
    match right.get(Uuid::new_v4()).await {
        Err(ClientError::Api { status, .. }) => assert_eq!(status.as_u16(), 404),
        other => panic!("expected the server's 404 answer, got {other:?}"),
    }

    // Another CA: refused by the client's verification, named as such.
    let other = new_ca("pe-https-other");
    let wrong = PaymentApi::new(
        authenticated_client(timeout, None, Some(other.cert())).unwrap(),
        &base,
    )
    .unwrap();
    match wrong.get(Uuid::new_v4()).await {
        Err(ClientError::Certificate { problem, .. }) => {
            assert_eq!(problem, CertificateProblem::UnknownIssuer);
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }

    // No CA at all (no built-in roots either): refused too.
    let none = PaymentApi::new(authenticated_client(timeout, None, None).unwrap(), &base).unwrap();
    assert!(
        matches!(
            none.get(Uuid::new_v4()).await,
            Err(ClientError::Certificate { .. })
        ),
        "a client without a CA trusted the server"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unreadable_ca_file_is_bad_configuration() {
    let missing = "/nonexistent/dlock-ca.crt";
    let e = authenticated_client(Duration::from_secs(1), None, Some(missing.as_ref())).unwrap_err();
    assert!(
        matches!(&e, ClientError::InvalidArgument { code: "INVALID_CA_FILE", message } if message.contains(missing)),
        "{e:?}"
    );

    // The executor stops before it starts anything, as a configuration error (exit 2).
    let config = Cli::try_parse_from([
        "payout-executor",
        "--lock-server-url",
        "https://127.0.0.1:1",
        "--payment-resource-url",
        "https://127.0.0.1:2",
        "--rail-proxy-url",
        "https://127.0.0.1:3",
        "--ca-file",
        missing,
    ])
    .unwrap()
    .into_config_with_lock_token(None)
    .unwrap();
    let e = payout_executor::run(config, CancellationToken::new(), |_| {})
        .await
        .unwrap_err();
    assert!(e.is_config(), "{e:?}");
    assert!(e.to_string().contains(missing), "{e}");
}
