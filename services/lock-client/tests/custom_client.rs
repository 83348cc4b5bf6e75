//! A caller's own `reqwest::Client` (`LockClient::with_http_client`): the lock client's token still
//! goes on every call, the configured request timeout still bounds every call whatever the caller's
//! client says, and the settings that belong to the HTTP client are refused rather than ignored.
//!
//! Against a real lock-server over a real lockdb, with a clients file: the custom client with the
//! token holds a lock through the whole life of a handle. Negative control: the same custom
//! client without the token is refused (401) by the same server, so the acceptance comes from the
//! token the library adds.

use std::time::Duration;

use dlock_client::{ClientConfig, ClientError, LockClient, ReleaseOutcome};
use lock_server::{Clients, Config};
use serde_json::json;

const TOKEN: &str = "custom-client-token-4f3e2d1c0b9a88776655443322";

async fn server_with_clients() -> (dlock_testkit::TestDb, lock_server::RunningServer) {
    let db = dlock_testkit::lockdb().await;
    let clients = Clients::parse(
        &json!({"clients": [
            {"name": "payments", "token": TOKEN, "keyPrefixes": ["account:"],
             "ownerPrefixes": ["payments-"], "operations": ["lock", "read"]},
        ]})
        .to_string(),
    )
    .expect("clients file");
    let config = Config::new(db.app_url())
        .with_admin_token("custom-client-admin-token")
        .with_clients(clients);
    let server = lock_server::spawn(config).await.expect("lock-server starts");
    (db, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_http_client_carries_the_token_on_every_call() {
    let (_db, server) = server_with_clients().await;
    // A client of the caller's, with settings the library does not make (its own user agent, no
    // timeout at all).
    let http = reqwest::Client::builder()
        .user_agent("payments/7.1")
        .build()
        .expect("reqwest client");
    let client = LockClient::with_http_client(
        &server.base_url(),
        http.clone(),
        ClientConfig::default().with_token(TOKEN),
    )
    .expect("client");
    let session = client
        .open_session("payments-1", Duration::from_secs(30))
        .await
        .expect("a session, with the token");
    let lock = session
        .try_acquire("account:7", Duration::from_secs(30))
        .await
        .expect("a grant, with the token");
    let view = client.lock_status("account:7").await.expect("the lock's state");
    assert_eq!(view.fencing_token, Some(lock.token()));
    assert_eq!(lock.release().await.expect("release"), ReleaseOutcome::Released);
    assert!(session.close().await.expect("close"));

    // Negative control: the same client without the token is refused by the same server.
    let anonymous =
        LockClient::with_http_client(&server.base_url(), http, ClientConfig::default()).expect("client");
    match anonymous
        .open_session("payments-1", Duration::from_secs(30))
        .await
    {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status.as_u16(), code.as_str()), (401, "UNAUTHORIZED"));
        }
        other => panic!("a call without the token was not refused: {other:?}"),
    }
}

/// A server that accepts connections and never answers: only the library's timeout ends a call.
#[tokio::test]
async fn the_request_timeout_bounds_a_call_on_a_client_without_one() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let config = ClientConfig {
        request_timeout: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let client = LockClient::with_http_client(&format!("http://{addr}"), reqwest::Client::new(), config)
        .expect("client");
    // The outer bound only keeps a broken library from hanging the test; the call ends long before.
    let call = tokio::time::timeout(Duration::from_secs(30), client.lock_status("account:7"))
        .await
        .expect("the call ended: the request timeout applies to the caller's client");
    match call {
        Err(ClientError::Transport(e)) => assert!(e.is_timeout(), "{e}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    silent.abort();
}

#[test]
fn settings_of_the_http_client_are_refused_with_a_custom_one() {
    let cases = [
        ClientConfig::default().with_ca_pem(b"-----BEGIN CERTIFICATE-----".to_vec()),
        ClientConfig::default().with_connect_to("127.0.0.1:1".parse().expect("addr")),
        ClientConfig {
            unsafe_accept_any_certificate: true,
            ..ClientConfig::default()
        },
    ];
    for config in cases {
        match LockClient::with_http_client("https://lock-server:8080", reqwest::Client::new(), config.clone())
        {
            Err(ClientError::InvalidArgument { code, message }) => {
                assert_eq!(code, "CUSTOM_CLIENT_CONFLICT", "{message}");
            }
            other => panic!("{config:?} accepted with a custom client: {other:?}"),
        }
    }
    // The token and the timeouts are not HTTP-client settings: accepted.
    assert!(
        LockClient::with_http_client(
            "https://lock-server:8080",
            reqwest::Client::new(),
            ClientConfig::default().with_token(TOKEN),
        )
        .is_ok()
    );
}
