//! The etcd backend's grant leases: a released grant's lease carries the same session's next grant
//! (so an acquire/release cycle costs etcd one transaction each way, as its own `concurrency.Mutex`
//! does), and yet every grant keeps a lease of its own — renewing one never keeps another alive —
//! and closing the session revokes the leases it had pooled, found by the index entry each lease
//! gets with its first grant (and again with its next, should etcd have lost it). The negative
//! controls pool a grant's lease while the grant still holds it (the per-grant lapse must catch it),
//! and trust a pooled lease's index entry unchecked (closing the session must then miss the grant).

mod common;

use std::time::{Duration, Instant};

use common::{ADMIN_TOKEN, Api, LONG_TTL_MS};
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::metrics::{metric_sum, scrape};
use etcd_client::GetOptions;
use lock_server::{Backend, Config, EtcdFaults, EtcdRepo, RunningServer};
use reqwest::StatusCode;
use uuid::Uuid;

/// A lease etcd keeps a little while without a keep-alive: two seconds.
const TTL_MS: i64 = 2_000;
const WAIT: Duration = Duration::from_secs(20);

struct Harness {
    cluster: EtcdCluster,
    repo: EtcdRepo,
    srv: RunningServer,
    api: Api,
}

impl Harness {
    async fn new(faults: EtcdFaults) -> Self {
        let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
        let good = EtcdRepo::connect(&cluster.endpoints(), "/dlock/").await.unwrap();
        let served = EtcdRepo::with_client(good.client(), "/dlock/", faults);
        let cfg = Config::etcd(cluster.endpoints(), "/dlock/")
            .with_admin_token(ADMIN_TOKEN)
            .with_reaper_interval(None);
        let srv = lock_server::spawn_with_backend(cfg, Backend::Etcd(served))
            .await
            .unwrap();
        let api = Api::new(&srv);
        Self {
            cluster,
            repo: good,
            srv,
            api,
        }
    }

    /// The lease the grant of `key` is written on, read from etcd.
    async fn lease_of(&self, key: &str) -> Option<i64> {
        let r = self
            .repo
            .client()
            .get(self.repo.lock_key(key), None)
            .await
            .unwrap();
        r.kvs().first().map(|kv| kv.lease())
    }

    async fn grant(&self, key: &str, session: Uuid, ttl_ms: i64) -> i64 {
        let g = self.api.acquire(key, session, "owner", ttl_ms).await;
        assert_eq!(g.status, StatusCode::OK, "acquire {key}: {g:?}");
        g.token()
    }

    /// The session's index entries (`P h/<session>/<lease>`): each one's lease and how many times
    /// it was written (etcd's per-key `version`).
    async fn index_of(&self, session: Uuid) -> Vec<(i64, i64)> {
        let r = self
            .repo
            .client()
            .get(self.index_prefix(session), Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        r.kvs().iter().map(|kv| (kv.lease(), kv.version())).collect()
    }

    /// Where the session's index entries live.
    fn index_prefix(&self, session: Uuid) -> String {
        format!("{}h/{session}/", self.repo.prefix())
    }

    async fn held(&self, key: &str) -> bool {
        self.api.get(&format!("/v1/locks/{key}")).await.body["state"] == "HELD"
    }

    /// etcd's count of calls started, by gRPC method (`grpc_server_started_total`; for a stream,
    /// streams opened).
    async fn started(&self, method: &str) -> f64 {
        self.etcd_count("grpc_server_started_total", method).await
    }

    /// etcd's count of messages received, by gRPC method (`grpc_server_msg_received_total`).
    async fn received(&self, method: &str) -> f64 {
        self.etcd_count("grpc_server_msg_received_total", method).await
    }

    async fn etcd_count(&self, metric: &str, method: &str) -> f64 {
        let text = scrape(&self.cluster.endpoint(0)).await.unwrap();
        metric_sum(&text, metric, &[("grpc_method", method)])
    }
}

/// Two grants of one session held at once, each with a 2 s lease, the first renewed every 300 ms:
/// the second (never renewed) must lapse on its own, and the first must stay. The session has given a
/// lease back first, so one of the two is a pooled lease.
async fn each_grant_lapses_on_its_own(h: &Harness) -> Result<(), String> {
    let s = h.api.open_session("owner", LONG_TTL_MS).await;
    let warm = h.grant("pooled", s, TTL_MS).await;
    let r = h.api.release("pooled", warm).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let a = h.grant("a", s, TTL_MS).await;
    h.grant("b", s, TTL_MS).await;
    let mut v = Vec::new();
    let (la, lb) = (h.lease_of("a").await, h.lease_of("b").await);
    if la == lb {
        v.push(format!("a and b are written on one lease ({la:?})"));
    }
    let started = Instant::now();
    loop {
        let renewed = h.api.renew("a", a, TTL_MS).await;
        if renewed.status != StatusCode::OK {
            v.push(format!("a, renewed every 300 ms, was lost: {renewed:?}"));
            break;
        }
        if !h.held("b").await {
            break;
        }
        if started.elapsed() > WAIT {
            v.push(format!(
                "b, never renewed, was still held {} s after its 2 s lease began: renewing a kept it",
                WAIT.as_secs()
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if !h.held("a").await {
        v.push("a is not held after b lapsed".into());
    }
    if v.is_empty() { Ok(()) } else { Err(v.join("; ")) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_grant_on_a_pooled_lease_lapses_on_its_own() {
    let h = Harness::new(EtcdFaults::NONE).await;
    each_grant_lapses_on_its_own(&h).await.unwrap();
    h.srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_pooling_a_lease_still_in_use_keeps_the_other_grant_alive() {
    let h = Harness::new(EtcdFaults {
        pool_leases_in_use: true,
        ..EtcdFaults::NONE
    })
    .await;
    let r = each_grant_lapses_on_its_own(&h).await;
    assert!(r.is_err(), "the broken pool went unnoticed");
    h.srv.shutdown().await.unwrap();
}

/// The lease of a released grant carries the session's next grant; a grant held at the same time
/// gets another, and so does another session's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_grants_lease_carries_the_sessions_next_grant_only() {
    let h = Harness::new(EtcdFaults::NONE).await;
    let (s, other) = (
        h.api.open_session("owner", LONG_TTL_MS).await,
        h.api.open_session("other", LONG_TTL_MS).await,
    );
    let t = h.grant("a", s, TTL_MS).await;
    let la = h.lease_of("a").await.expect("a's lease");
    assert_eq!(h.api.release("a", t).await.status, StatusCode::OK);
    h.grant("d", other, TTL_MS).await;
    assert_ne!(
        h.lease_of("d").await,
        Some(la),
        "another session's grant took the pooled lease"
    );
    h.grant("b", s, TTL_MS).await;
    assert_eq!(
        h.lease_of("b").await,
        Some(la),
        "the session's next grant did not reuse its lease"
    );
    h.grant("c", s, TTL_MS).await;
    assert_ne!(h.lease_of("c").await, Some(la), "two held grants share a lease");
    // A different TTL is a different lease: etcd cannot change a lease's TTL.
    let t = h.grant("e", s, 3 * TTL_MS).await;
    assert_ne!(h.lease_of("e").await, Some(la));
    assert_eq!(h.api.release("e", t).await.status, StatusCode::OK);
    h.srv.shutdown().await.unwrap();
}

/// Closing the session revokes every lease it had, the pooled ones too (they carry its index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_session_revokes_its_pooled_leases() {
    let h = Harness::new(EtcdFaults::NONE).await;
    let s = h.api.open_session("owner", LONG_TTL_MS).await;
    let t = h.grant("a", s, 60_000).await;
    let la = h.lease_of("a").await.expect("a's lease");
    assert_eq!(h.api.release("a", t).await.status, StatusCode::OK);
    let alive = h.repo.client().lease_time_to_live(la, None).await.unwrap();
    assert!(
        alive.ttl() > 0,
        "the pooled lease is alive before the close: {alive:?}"
    );
    assert_eq!(h.api.close_session(s).await.status, StatusCode::OK);
    match h.repo.client().lease_time_to_live(la, None).await {
        Ok(r) => assert!(
            r.ttl() <= 0,
            "the pooled lease outlived its session's close: {r:?}"
        ),
        Err(e) => assert!(lock_server::store::etcd::is_lease_not_found(&e), "{e:?}"),
    }
    h.srv.shutdown().await.unwrap();
}

/// The cost in etcd calls: after the session's first grant, each acquire/release cycle is one
/// keep-alive of the pooled lease and two transactions — no lease granted, none revoked — and the
/// keep-alives are messages on one stream, opened at the lease's first reuse and kept with it. The
/// grant transaction puts the grant alone: the lease's index entry was written with its first grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_is_two_transactions_and_one_keep_alive() {
    const CYCLES: u32 = 20;
    let h = Harness::new(EtcdFaults::NONE).await;
    let s = h.api.open_session("owner", LONG_TTL_MS).await;
    let t = h.grant("k", s, TTL_MS).await;
    assert_eq!(h.api.release("k", t).await.status, StatusCode::OK);
    let methods = ["LeaseGrant", "LeaseRevoke", "Txn", "LeaseKeepAlive"];
    let mut before = Vec::new();
    for m in methods {
        before.push(h.started(m).await);
    }
    let messages_before = h.received("LeaseKeepAlive").await;
    for _ in 0..CYCLES {
        let t = h.grant("k", s, TTL_MS).await;
        let r = h.api.release("k", t).await;
        assert_eq!(r.body["released"], true, "{r:?}");
    }
    let mut calls = Vec::new();
    for (m, b) in methods.iter().zip(before) {
        calls.push((*m, h.started(m).await - b));
    }
    let n = f64::from(CYCLES);
    assert_eq!(
        calls,
        vec![
            ("LeaseGrant", 0.0),
            ("LeaseRevoke", 0.0),
            ("Txn", 2.0 * n),
            ("LeaseKeepAlive", 1.0)
        ],
        "etcd calls (for LeaseKeepAlive: streams opened) in {CYCLES} cycles"
    );
    assert_eq!(
        h.received("LeaseKeepAlive").await - messages_before,
        n,
        "one keep-alive message per cycle"
    );
    assert_eq!(h.lease_of("k").await, None, "released");
    assert_eq!(
        h.index_of(s)
            .await
            .into_iter()
            .map(|(_, v)| v)
            .collect::<Vec<_>>(),
        vec![1],
        "the writes of the index entry of the session's one lease, after {CYCLES} grants on it"
    );
    h.srv.shutdown().await.unwrap();
}

/// A lease that an acquire of a held key gave back carries no grant and no index entry: the
/// session's next grant on it writes the entry, so closing the session still finds and revokes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_pooled_by_a_contended_acquire_is_indexed_by_its_first_grant() {
    let h = Harness::new(EtcdFaults::NONE).await;
    let (holder, s) = (
        h.api.open_session("holder", LONG_TTL_MS).await,
        h.api.open_session("owner", LONG_TTL_MS).await,
    );
    h.grant("a", holder, 60_000).await;
    let contended = h.api.acquire("a", s, "owner", 60_000).await;
    assert_eq!(contended.status, StatusCode::CONFLICT, "{contended:?}");
    assert_eq!(
        h.index_of(s).await,
        vec![],
        "a lease that carried nothing is indexed"
    );
    h.grant("z", s, 60_000).await;
    let lz = h.lease_of("z").await.expect("z's lease");
    assert_eq!(h.index_of(s).await, vec![(lz, 1)], "z's lease is not indexed");
    assert_eq!(h.api.close_session(s).await.status, StatusCode::OK);
    assert!(!h.held("z").await, "z outlived its session's close");
    h.srv.shutdown().await.unwrap();
}

/// A session's pooled lease whose index entry is gone (as in an etcd restored from a snapshot taken
/// before the lease's first grant) carries the session's next grant: that grant writes the entry
/// again, and closing the session revokes it.
async fn a_lease_that_lost_its_index_entry_is_indexed_again(h: &Harness) -> Result<(), String> {
    let s = h.api.open_session("owner", LONG_TTL_MS).await;
    let t = h.grant("k", s, 60_000).await;
    let lk = h.lease_of("k").await.expect("k's lease");
    assert_eq!(h.api.release("k", t).await.body["released"], true);
    h.repo
        .client()
        .delete(
            h.index_prefix(s),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    h.grant("j", s, 60_000).await;
    assert_eq!(h.lease_of("j").await, Some(lk), "j is not on k's pooled lease");
    let mut v = Vec::new();
    let index = h.index_of(s).await;
    if index != vec![(lk, 1)] {
        v.push(format!(
            "the session's index is {index:?}, not k's lease written once"
        ));
    }
    assert_eq!(h.api.close_session(s).await.status, StatusCode::OK);
    if h.held("j").await {
        v.push("j outlived its session's close".to_owned());
    }
    if v.is_empty() { Ok(()) } else { Err(v.join("; ")) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_lease_that_lost_its_index_entry_is_indexed_by_its_next_grant() {
    let h = Harness::new(EtcdFaults::NONE).await;
    a_lease_that_lost_its_index_entry_is_indexed_again(&h)
        .await
        .unwrap();
    h.srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_trusting_a_pooled_lease_s_index_entry_lets_its_grant_outlive_the_session() {
    let h = Harness::new(EtcdFaults {
        trust_pooled_index: true,
        ..EtcdFaults::NONE
    })
    .await;
    let r = a_lease_that_lost_its_index_entry_is_indexed_again(&h).await;
    assert!(r.is_err(), "the trusted index went unnoticed");
    h.srv.shutdown().await.unwrap();
}
