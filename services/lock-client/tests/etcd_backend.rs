//! The client's safety scenarios against lock-server's etcd backend (a real etcd member): the same
//! `pause_and_takeover` the PostgreSQL tests run (tests/common), with the real client, and its
//! negative controls on a deliberately broken etcd backend.

mod common;

use std::time::Duration;

use common::*;
use lock_server::EtcdFaults;

/// Rounds up to etcd's 1 s lease minimum on the server; the client's own deadline is still 300 ms,
/// which is the safe direction (the client gives up before the server would).
const SHORT: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_paused_holder_is_told_and_the_successor_gets_a_higher_token() {
    let env = Env::start_etcd(EtcdFaults::NONE).await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h1 = s1
        .acquire("account:pause", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    let h2 = pause_and_takeover(&env, h1, &s2, "account:pause")
        .await
        .expect("the invariant holds with the real client on etcd");
    assert!(h2.ensure_held().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_background_renewal_keeps_the_lock_past_several_ttls() {
    let env = Env::start_etcd(EtcdFaults::NONE).await;
    let s = env.session("renewer").await;
    let s2 = env.session("other").await;
    let h = s
        .acquire("account:renew", Duration::from_millis(1000), Duration::ZERO)
        .await
        .expect("granted");
    let t = h.token();
    // Wait (as a condition) until the grant has outlived three of its TTLs, then check it is still
    // ours and contended for others.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    wait_until("three TTLs", || async { tokio::time::Instant::now() >= until }).await;
    assert!(h.ensure_held().is_ok(), "renewal kept the lock");
    assert_eq!(env.holder_token("account:renew").await, Some(t));
    assert!(matches!(
        s2.try_acquire("account:renew", LONG).await,
        Err(dlock_client::ClientError::Contended { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_control_token_from_version_hands_out_the_old_token() {
    let env = Env::start_etcd(EtcdFaults {
        token_from_version: true,
        ..EtcdFaults::NONE
    })
    .await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h1 = s1
        .acquire("account:broken", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    let violation = pause_and_takeover(&env, h1, &s2, "account:broken")
        .await
        .expect_err("tokens from the per-key version must be caught");
    assert!(violation.contains("not strictly higher"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_control_release_by_key_alone_deletes_the_new_grant() {
    let env = Env::start_etcd(EtcdFaults {
        release_by_key_alone: true,
        ..EtcdFaults::NONE
    })
    .await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h1 = s1
        .acquire("account:broken", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    let violation = pause_and_takeover(&env, h1, &s2, "account:broken")
        .await
        .expect_err("the broken release must be caught");
    assert!(
        violation.contains("release was Released") && violation.contains("holder None"),
        "{violation}"
    );
}
