//! The etcd backend promises no more lease than etcd keeps. etcd starts a lease's clock when it
//! grants the lease, somewhere between lock-server's call and its answer; an `expiresAt` measured
//! from after the answer would tell the holder its lease lasts longer than etcd lets it, by the
//! call's latency — the fault campaign saw the next holder granted inside a lease lock-server had
//! reported as live (docs/reliability.md, anomaly 5).
//!
//! Here every answer from etcd to lock-server is delivered late (a proxy on loopback holds each
//! chunk etcd sends for `DELAY`), while requests reach etcd at once: a lease's end must then be
//! measured from before the call, so the reported end stays within `ttl + SLACK` of the moment the
//! test asked, and never carries the delay.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{ADMIN_TOKEN, Api, LONG_TTL_MS};
use dlock_testkit::etcd::EtcdCluster;
use lock_server::Config;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DELAY: Duration = Duration::from_millis(400);
/// lock-server's own work before its first etcd call (well under the delay).
const SLACK: Duration = Duration::from_millis(200);
const TTL_MS: i64 = 2_000;

/// A TCP proxy to `upstream` that passes requests at once and holds every chunk of the answers for
/// `delay`. Returns its `http://` URL.
async fn slow_answers(upstream: String, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    tokio::time::sleep(delay).await;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

fn expires_at(body: &serde_json::Value) -> DateTime<Utc> {
    body["expiresAt"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no expiresAt in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_end_is_measured_from_before_etcd_started_the_lease() {
    let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
    let upstream = cluster.endpoint(0).trim_start_matches("http://").to_owned();
    let proxy = slow_answers(upstream, DELAY).await;
    let cfg = Config::etcd(vec![proxy], "/dlock/")
        .with_admin_token(ADMIN_TOKEN)
        .with_reaper_interval(None);
    let srv = lock_server::spawn(cfg).await.expect("lock-server on etcd");
    let api = Api::new(&srv);
    let ttl = chrono::Duration::milliseconds(TTL_MS);
    let slack = chrono::Duration::from_std(SLACK).expect("slack");

    // A session: its lease is granted by the first etcd call.
    let asked = Utc::now();
    let s = api
        .post_json(
            "/v1/sessions",
            // Long enough to outlive the delayed answers that follow.
            serde_json::json!({"ownerId": "lease-end", "ttlMs": LONG_TTL_MS}),
        )
        .await;
    assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    let session_end = expires_at(&s.body);
    let session_ttl = chrono::Duration::milliseconds(LONG_TTL_MS);
    assert!(
        session_end <= asked + session_ttl + slack,
        "the session's lease is reported to end at {session_end}, {} ms after asked + ttl: \
         measured from after etcd's answer",
        (session_end - (asked + session_ttl)).num_milliseconds()
    );

    // A grant: its lease, too.
    let session: uuid::Uuid = s.body["sessionId"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("sessionId");
    let asked = Utc::now();
    let g = api.acquire("lease-end", session, "lease-end", TTL_MS).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let grant_end = expires_at(&g.body);
    assert!(
        grant_end <= asked + ttl + slack,
        "the grant's lease is reported to end at {grant_end}, {} ms after asked + ttl: measured \
         from after etcd's answer",
        (grant_end - (asked + ttl)).num_milliseconds()
    );
    srv.shutdown().await.expect("shutdown");
}
