//! The etcd backend at the instant a lease lapses. etcd decides a lease's end by its own clock, but
//! its lessor revokes expired leases in rounds (every 500 ms): for a while the grant's key is still
//! there while its lease has run out, and a keep-alive sent then waits for the revocation and is
//! answered TTL 0 — which etcd-client reports as an error ("lease not found"). A renew (or heartbeat)
//! meeting that instant must answer what it means, 410 (`LEASE_EXPIRED` / `SESSION_GONE`), never a
//! 5xx.
//!
//! The sweeps give every time point its own grant (or session), because a renew that succeeds
//! restores the lease: the renews run at fixed offsets from their own acquire, across the lapse of a
//! 2 s lease. That is measurement over time points, not synchronisation.

mod common;

use std::time::{Duration, Instant};

use axum::http::StatusCode as HttpStatus;
use common::{ADMIN_TOKEN, Api, LONG_TTL_MS, Reply};
use dlock_common::ApiError;
use dlock_testkit::etcd::EtcdCluster;
use lock_server::store::etcd::{is_lease_not_found, keep_alive_outcome};
use lock_server::{Config, Error, RunningServer};
use reqwest::StatusCode;

/// The lease under test: 2 s, a whole number of seconds as etcd leases are.
const TTL_MS: i64 = 2_000;
/// The offsets of the renews from their acquire: from before the lease's nominal end to well past
/// etcd's revocation round after it.
const FIRST_MS: u64 = 1_700;
const LAST_MS: u64 = 3_300;
const STEP_MS: u64 = 20;

async fn server(cluster: &EtcdCluster) -> RunningServer {
    let cfg = Config::etcd(cluster.endpoints(), "/dlock/")
        .with_admin_token(ADMIN_TOKEN)
        .with_reaper_interval(None);
    lock_server::spawn(cfg).await.unwrap()
}

fn offsets() -> Vec<Duration> {
    (FIRST_MS..=LAST_MS)
        .step_by(STEP_MS as usize)
        .map(Duration::from_millis)
        .collect()
}

/// Checks a sweep's answers: each 200 or 410 with `gone_code`; the sweep crossed the lapse (some of
/// each). Returns the violations.
fn judge(answers: &[(Duration, Reply)], gone_code: &str) -> Vec<String> {
    let mut v = Vec::new();
    for (at, r) in answers {
        let fine = r.status == StatusCode::OK || (r.status == StatusCode::GONE && r.code() == gone_code);
        if !fine {
            v.push(format!("at +{} ms: {r:?}", at.as_millis()));
        }
    }
    let ok = answers.iter().filter(|(_, r)| r.status == StatusCode::OK).count();
    let gone = answers
        .iter()
        .filter(|(_, r)| r.status == StatusCode::GONE)
        .count();
    eprintln!(
        "{} answers: {ok} × 200, {gone} × 410, {} other",
        answers.len(),
        v.len()
    );
    if gone == 0 {
        v.push("no renew was late enough to find the lease gone: the sweep missed the lapse".into());
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renews_across_a_lease_lapse_answer_200_or_410_never_5xx() {
    let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
    let srv = server(&cluster).await;
    let api = Api::new(&srv);
    let session = api.open_session("sweeper", LONG_TTL_MS).await;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, at) in offsets().into_iter().enumerate() {
        let api = api.clone();
        tasks.spawn(async move {
            let key = format!("sweep-{i}");
            let sent = Instant::now();
            let g = api.acquire(&key, session, "sweeper", TTL_MS).await;
            assert_eq!(g.status, StatusCode::OK, "{g:?}");
            tokio::time::sleep_until((sent + at).into()).await;
            (at, api.renew(&key, g.token(), TTL_MS).await)
        });
    }
    let mut answers = tasks.join_all().await;
    answers.sort_by_key(|(at, _)| *at);
    let v = judge(&answers, "LEASE_EXPIRED");
    assert!(v.is_empty(), "renews at a lease's lapse: {}", v.join("; "));
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_across_a_session_lapse_answer_200_or_410_never_5xx() {
    let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
    let srv = server(&cluster).await;
    let api = Api::new(&srv);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, at) in offsets().into_iter().enumerate() {
        let api = api.clone();
        tasks.spawn(async move {
            let sent = Instant::now();
            let session = api.open_session(&format!("sweeper-{i}"), TTL_MS).await;
            tokio::time::sleep_until((sent + at).into()).await;
            (at, api.heartbeat(session, TTL_MS).await)
        });
    }
    let mut answers = tasks.join_all().await;
    answers.sort_by_key(|(at, _)| *at);
    let v = judge(&answers, "SESSION_GONE");
    assert!(v.is_empty(), "heartbeats at a session's lapse: {}", v.join("; "));
    srv.shutdown().await.unwrap();
}

fn status_of(e: Error) -> HttpStatus {
    ApiError::from(e).status
}

/// The mapping, fed the errors a real etcd makes etcd-client report for a lease that is gone, and
/// for an etcd that cannot be reached.
#[tokio::test]
async fn the_shapes_etcd_client_reports_for_a_gone_lease_are_not_found_and_transport_is_5xx() {
    let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let lease = client.lease_grant(5, None).await.unwrap().id();
    client.lease_revoke(lease).await.unwrap();

    // The keep-alive of a revoked lease: etcd answers TTL 0, etcd-client makes it an error.
    let e = client
        .lease_keep_alive(lease)
        .await
        .expect_err("a keep-alive of a revoked lease is an error in etcd-client");
    assert!(is_lease_not_found(&e), "{e:?}");
    assert!(matches!(keep_alive_outcome(Err(e)), Ok(None)));

    // Revoking it again: gRPC NOT_FOUND.
    let e = client.lease_revoke(lease).await.unwrap_err();
    assert!(
        // gRPC NOT_FOUND is code 5.
        matches!(e, etcd_client::Error::GRpcStatus(ref s) if s.code() as i32 == 5),
        "{e:?}"
    );
    assert!(is_lease_not_found(&e), "{e:?}");

    // etcd unreachable: a real failure, answered 503.
    let port = dlock_testkit::procs::free_port().unwrap();
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(300))
        .with_timeout(Duration::from_millis(300));
    let mut dead = etcd_client::Client::connect([format!("127.0.0.1:{port}")], Some(opts))
        .await
        .expect("etcd-client connects lazily");
    let e = tokio::time::timeout(Duration::from_secs(20), dead.lease_keep_alive(lease))
        .await
        .expect("the keep-alive to nowhere fails within its timeouts")
        .expect_err("no etcd there");
    assert!(!is_lease_not_found(&e), "{e:?}");
    match keep_alive_outcome(Err(e)) {
        Err(e) => assert_eq!(status_of(e), HttpStatus::SERVICE_UNAVAILABLE),
        Ok(v) => panic!("an unreachable etcd read as {v:?}"),
    }
}
