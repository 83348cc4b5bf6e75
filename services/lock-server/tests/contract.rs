//! The lock contract, once, run against both backends: PostgreSQL (C1's statements on a real lockdb)
//! and etcd (a real etcd process). Every scenario is a function over a [`Harness`]; the
//! `contract_tests!` macro instantiates it for each backend, and the negative controls run the same
//! scenarios against a deliberately broken variant of each backend and require a violation.
//!
//! Waits are conditions on the store's own clock (the server's read of the key, the session key
//! disappearing in etcd, `now()` in lockdb), never sleeps.

mod common;

use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use common::*;
use dlock_client::{LockClient, LossReason, WatchItem};
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::wait::{eventually, wait_until, within};
use lock_server::{Backend, Config, EtcdFaults, EtcdRepo, QueueFaults, RunningServer, Statements};
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

enum Store {
    Pg(Db),
    // Kept for its Drop (the process), and for direct reads.
    Etcd(#[allow(dead_code)] EtcdCluster, EtcdRepo),
}

struct Harness {
    store: Store,
    srv: RunningServer,
    api: Api,
}

const WAIT: Duration = Duration::from_secs(30);

impl Harness {
    async fn pg(stmts: Statements) -> Self {
        Self::pg_with(stmts, QueueFaults::NONE).await
    }

    async fn pg_with(stmts: Statements, queue: QueueFaults) -> Self {
        let db = lockdb().await;
        let mut cfg = config(&db.db)
            .with_admin_token(ADMIN_TOKEN)
            .with_reaper_interval(None);
        cfg.queue_faults = queue;
        let srv = lock_server::spawn_with_statements(cfg, stmts).await.unwrap();
        let api = Api::new(&srv);
        Self {
            store: Store::Pg(db),
            srv,
            api,
        }
    }

    async fn etcd(faults: EtcdFaults) -> Self {
        Self::etcd_with(faults, QueueFaults::NONE).await
    }

    async fn etcd_with(faults: EtcdFaults, queue: QueueFaults) -> Self {
        let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
        let good = EtcdRepo::connect(&cluster.endpoints(), "/dlock/").await.unwrap();
        let repo = EtcdRepo::with_client(good.client(), "/dlock/", faults);
        let mut cfg = Config::etcd(cluster.endpoints(), "/dlock/")
            .with_admin_token(ADMIN_TOKEN)
            .with_reaper_interval(None);
        cfg.queue_faults = queue;
        let srv = lock_server::spawn_with_backend(cfg, Backend::Etcd(repo))
            .await
            .unwrap();
        let api = Api::new(&srv);
        Self {
            store: Store::Etcd(cluster, good),
            srv,
            api,
        }
    }

    /// A lock TTL that lapses soon: 50 ms in lockdb; in etcd a lease is whole seconds, at least the
    /// cluster's minimum TTL (1 s with the test kit's 500 ms election timeout).
    fn short_ttl_ms(&self) -> i64 {
        match self.store {
            Store::Pg(_) => SHORT_TTL_MS,
            Store::Etcd(..) => 1000,
        }
    }

    /// Until the store no longer counts the key as held (lockdb: `expires_at <= now()`; etcd: the
    /// lease lapsed and took the key with it).
    async fn await_not_held(&self, key: &str) {
        let started = Instant::now();
        loop {
            let v = self.api.get(&format!("/v1/locks/{key}")).await;
            if v.body["state"] != "HELD" {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "timed out waiting for {key} to lapse: {v:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Until the session has lapsed by the store's clock.
    async fn await_session_lapsed(&self, session: Uuid) {
        match &self.store {
            Store::Pg(db) => common::await_session_lapsed(&db.app, session).await,
            Store::Etcd(_, repo) => {
                let key = format!("{}s/{session}", repo.prefix());
                let started = Instant::now();
                loop {
                    let r = repo.client().get(key.clone(), None).await.unwrap();
                    if r.kvs().is_empty() {
                        return;
                    }
                    assert!(
                        started.elapsed() < WAIT,
                        "timed out waiting for session {session} to lapse"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    async fn reap(&self) -> u64 {
        lock_server::reaper::reap_once(self.srv.state()).await.unwrap()
    }

    /// A second lock-server on the same store (lockdb or etcd): another replica.
    async fn replica(&self) -> RunningServer {
        let cfg = match &self.store {
            Store::Pg(db) => config(&db.db),
            Store::Etcd(cluster, _) => Config::etcd(cluster.endpoints(), "/dlock/")
                .with_admin_token(ADMIN_TOKEN)
                .with_reaper_interval(None),
        };
        lock_server::spawn(cfg).await.unwrap()
    }

    /// A waiter of `key` written straight into the store, as a replica queues one, that keeps its
    /// turn for `lasts`: what a newcomer finds while the head is being handed a freed key.
    async fn queue_a_waiter(&self, key: &str, session: Uuid, owner: &str, lasts: Duration) {
        match &self.store {
            Store::Pg(db) => {
                sqlx::query(
                    "INSERT INTO lock_waiter (lock_key, session_id, owner_id, queued_at, expires_at) \
                     VALUES ($1, $2, $3, now(), now() + make_interval(secs => $4))",
                )
                .bind(key)
                .bind(session)
                .bind(owner)
                .bind(lasts.as_secs_f64())
                .execute(&db.app)
                .await
                .unwrap();
            }
            Store::Etcd(_, repo) => {
                let deadline_ms =
                    chrono::Utc::now().timestamp_millis() + i64::try_from(lasts.as_millis()).unwrap();
                let value = json!({"ownerId": owner, "sessionId": session, "deadlineMs": deadline_ms});
                repo.client()
                    .put(
                        format!("{}{}", repo.queue_prefix(key), Uuid::new_v4()),
                        value.to_string(),
                        None,
                    )
                    .await
                    .unwrap();
            }
        }
    }

    /// Everything of every queue the store holds: rows of lock_waiter, or waiter keys in etcd.
    async fn queue_entries(&self) -> i64 {
        match &self.store {
            Store::Pg(db) => count(&db.app, "SELECT count(*) FROM lock_waiter").await,
            Store::Etcd(_, repo) => repo
                .client()
                .get(
                    format!("{}q/", repo.prefix()),
                    Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
                )
                .await
                .unwrap()
                .count(),
        }
    }
}

/// `lock_wait_wakeups_total` of one reason, summed over servers.
async fn wakeups(apis: &[&Api], reason: &str) -> f64 {
    let mut n = 0.0;
    for api in apis {
        n += metric(
            &api.metrics().await,
            &format!("lock_wait_wakeups_total{{reason=\"{reason}\"}}"),
        );
    }
    n
}

/// Blocking acquires asleep in a queue, summed over servers.
async fn asleep(apis: &[&Api]) -> f64 {
    let mut n = 0.0;
    for api in apis {
        n += metric(&api.metrics().await, "lock_waiting");
    }
    n
}

/// Queues `n` blocking acquires of `key` one after the other (each seen in the queue before the
/// next is sent), alternating over `apis`; each, when granted, records its index and token and
/// keeps the lock. Returns the tasks once every waiter is asleep.
async fn queue_up(
    key: &'static str,
    apis: &[&Api],
    n: usize,
    order: &Arc<Mutex<Vec<(usize, i64)>>>,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let api = apis[i % apis.len()].clone();
        let s = api.open_session(&format!("q{i}"), LONG_TTL_MS).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let r = api
                .acquire_wait(key, s, &format!("q{i}"), LONG_TTL_MS, 30_000)
                .await;
            if r.status == StatusCode::OK {
                order.lock().unwrap().push((i, r.token()));
            }
            r
        }));
        let first = apis[0].clone();
        wait_until(&format!("waiter {i} of {key} queued"), || {
            let first = first.clone();
            async move { first.queued(key).await == i as i64 + 1 }
        })
        .await;
    }
    wait_until(
        "every waiter asleep",
        || async move { asleep(apis).await == n as f64 },
    )
    .await;
    tasks
}

/// Releases the holder's `token`, then each waiter's grant as it comes. With `settle`, each release
/// waits until the queue is at rest: the next waiter has been told it is the head (a `head`
/// wake-up) and every waiter still queued is asleep — so that each release finds the next waiter
/// asleep, and the `freed` wake-ups it causes can be counted. (A broken queue may never come to
/// rest: the wait is bounded and then the release goes ahead.) Returns the order of the grants and
/// the `freed` wake-ups counted after each release, cumulated.
async fn drain(
    key: &'static str,
    apis: &[&Api],
    token: i64,
    n: usize,
    order: &Arc<Mutex<Vec<(usize, i64)>>>,
    settle: bool,
) -> (Vec<usize>, Vec<f64>) {
    let base = wakeups(apis, "freed").await;
    let heads = wakeups(apis, "head").await;
    let mut freed = Vec::new();
    apis[0].release(key, token).await;
    for i in 0..n {
        wait_until(&format!("grant {i} of {key}"), || async move {
            order.lock().unwrap().len() > i
        })
        .await;
        if settle {
            let promoted = i + 1 == n || wakeups(apis, "head").await >= heads + (i + 1) as f64;
            let _ = eventually("the queue at rest", Duration::from_secs(5), || async move {
                let promoted = promoted || wakeups(apis, "head").await >= heads + (i + 1) as f64;
                (promoted && asleep(apis).await == (n - 1 - i) as f64).then_some(())
            })
            .await;
        }
        freed.push(wakeups(apis, "freed").await - base);
        let t = order.lock().unwrap()[i].1;
        apis[i % apis.len()].release(key, t).await;
    }
    let order = order.lock().unwrap().iter().map(|(i, _)| *i).collect();
    (order, freed)
}

fn check(violations: Vec<String>) -> Result<(), String> {
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

// ---- scenarios: Err(violation) when the contract does not hold ----------------------------------

/// Free key → GRANTED; another live holder → CONTENDED (409); the holder's own session → re-entry
/// with a strictly higher token.
async fn grant_contend_reenter(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let mut v = Vec::new();
    let g = api.acquire("k", s1, "w1", LONG_TTL_MS).await;
    if g.status != StatusCode::OK || g.body["ownerId"] != "w1" || g.body["lockKey"] != "k" {
        return Err(format!("free key not granted: {g:?}"));
    }
    let t1 = g.token();
    let c = api.acquire("k", s2, "w2", LONG_TTL_MS).await;
    if c.status != StatusCode::CONFLICT || c.code() != "CONTENDED" {
        v.push(format!("a live holder's key was not CONTENDED: {c:?}"));
    }
    let r = api.acquire("k", s1, "w1", LONG_TTL_MS).await;
    if r.status != StatusCode::OK || r.token() <= t1 {
        v.push(format!("re-entry did not grant a higher token than {t1}: {r:?}"));
    }
    check(v)
}

/// Unknown session → 410 SESSION_GONE; closed session → SESSION_GONE on acquire and heartbeat.
async fn session_gone_rows(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let mut v = Vec::new();
    let r = api.acquire("k", Uuid::new_v4(), "w", LONG_TTL_MS).await;
    if r.status != StatusCode::GONE || r.code() != "SESSION_GONE" {
        v.push(format!("unknown session: {r:?}"));
    }
    let s = api.open_session("w", LONG_TTL_MS).await;
    let hb = api.heartbeat(s, LONG_TTL_MS).await;
    if hb.status != StatusCode::OK {
        v.push(format!("heartbeat of a live session: {hb:?}"));
    }
    let c = api.close_session(s).await;
    if !c.status.is_success() {
        v.push(format!("close: {c:?}"));
    }
    let hb = api.heartbeat(s, LONG_TTL_MS).await;
    if hb.status != StatusCode::GONE || hb.code() != "SESSION_GONE" {
        v.push(format!("heartbeat after close: {hb:?}"));
    }
    let r = api.acquire("k", s, "w", LONG_TTL_MS).await;
    if r.status != StatusCode::GONE || r.code() != "SESSION_GONE" {
        v.push(format!("acquire after close: {r:?}"));
    }
    check(v)
}

/// A session that lapses by the store's clock: heartbeat → SESSION_GONE, and (after the reaper)
/// its locks are free.
async fn session_lapse_and_reap(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("w", h.short_ttl_ms()).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let g = api.acquire("k", s, "w", LONG_TTL_MS).await;
    if g.status != StatusCode::OK {
        return Err(format!("acquire: {g:?}"));
    }
    h.await_session_lapsed(s).await;
    let mut v = Vec::new();
    let hb = api.heartbeat(s, LONG_TTL_MS).await;
    if hb.status != StatusCode::GONE || hb.code() != "SESSION_GONE" {
        v.push(format!("heartbeat of a lapsed session: {hb:?}"));
    }
    let reaped = h.reap().await;
    if reaped != 1 {
        v.push(format!("the reaper removed {reaped} sessions, not 1"));
    }
    let g2 = api.acquire("k", s2, "w2", LONG_TTL_MS).await;
    if g2.status != StatusCode::OK || g2.token() <= g.token() {
        v.push(format!(
            "the reaped session's lock was not free with a higher token: {g2:?}"
        ));
    }
    check(v)
}

/// Renew extends a live grant and keeps its token; release then stale release; tokens strictly
/// increase across release and re-acquire of the same key, and across keys.
async fn renew_release_and_token_order(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("w", LONG_TTL_MS).await;
    let mut v = Vec::new();
    let t1 = api.acquire("k", s, "w", LONG_TTL_MS).await.token();
    let r = api.renew("k", t1, LONG_TTL_MS).await;
    if r.status != StatusCode::OK || r.token() != t1 {
        v.push(format!("renew of a live grant: {r:?}"));
    }
    let rel = api.release("k", t1).await;
    if rel.body != json!({"lockKey": "k", "fencingToken": t1, "released": true, "stale": false}) {
        v.push(format!("release: {rel:?}"));
    }
    let rel = api.release("k", t1).await;
    if rel.body != json!({"lockKey": "k", "fencingToken": t1, "released": false, "stale": true}) {
        v.push(format!("second release not stale: {rel:?}"));
    }
    let t2 = api.acquire("k", s, "w", LONG_TTL_MS).await.token();
    let t3 = api.acquire("other", s, "w", LONG_TTL_MS).await.token();
    if !(t1 < t2 && t2 < t3) {
        v.push(format!(
            "tokens not strictly increasing: {t1}, {t2} (same key again), {t3} (another key)"
        ));
    }
    let m = api.metrics().await;
    if metric(&m, "lock_release_total{stale=\"true\"}") != 1.0 {
        v.push("lock_release_total{stale=\"true\"} is not 1".into());
    }
    check(v)
}

/// Closing a session releases its locks (the cascade): another session gets the key.
async fn cascade_on_close(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let t1 = api.acquire("a", s1, "w1", LONG_TTL_MS).await.token();
    api.acquire("b", s1, "w1", LONG_TTL_MS).await.token();
    let c = api.close_session(s1).await;
    let mut v = Vec::new();
    if !c.status.is_success() {
        v.push(format!("close: {c:?}"));
    }
    for key in ["a", "b"] {
        let view = api.get(&format!("/v1/locks/{key}")).await;
        if view.body["state"] != "FREE" {
            v.push(format!("{key} not free after its session closed: {view:?}"));
        }
        let g = api.acquire(key, s2, "w2", LONG_TTL_MS).await;
        if g.status != StatusCode::OK || g.token() <= t1 {
            v.push(format!("{key} not granted to another session: {g:?}"));
        }
    }
    check(v)
}

/// N concurrent acquirers of one key, each with its own session: exactly one grant.
async fn n_concurrent_one_grant(h: &Harness) -> Result<(), String> {
    let mut sessions = Vec::new();
    for i in 0..16 {
        sessions.push(h.api.open_session(&format!("w{i}"), LONG_TTL_MS).await);
    }
    let replies = futures::future::join_all(sessions.iter().enumerate().map(|(i, s)| {
        let api = h.api.clone();
        let s = *s;
        async move { api.acquire("hot", s, &format!("w{i}"), LONG_TTL_MS).await }
    }))
    .await;
    let granted = replies.iter().filter(|r| r.status == StatusCode::OK).count();
    let contended = replies
        .iter()
        .filter(|r| r.status == StatusCode::CONFLICT && r.code() == "CONTENDED")
        .count();
    if granted == 1 && contended == 15 {
        Ok(())
    } else {
        Err(format!(
            "{granted} grants, {contended} CONTENDED of 16: {replies:?}"
        ))
    }
}

/// W1 acquires with a short lease and pauses past it; W2 takes over; W1 returns. W2's token is
/// strictly higher, W1's renew is LEASE_EXPIRED, W1's release is stale, W2's grant is intact.
async fn pause_and_return(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let s3 = api.open_session("w3", LONG_TTL_MS).await;
    let g1 = api.acquire("k", s1, "w1", h.short_ttl_ms()).await;
    if g1.status != StatusCode::OK {
        return Err(format!("W1's acquire: {g1:?}"));
    }
    let t1 = g1.token();
    h.await_not_held("k").await;
    let g2 = api.acquire("k", s2, "w2", LONG_TTL_MS).await;
    if g2.status != StatusCode::OK {
        return Err(format!("W2's takeover: {g2:?}"));
    }
    let t2 = g2.token();
    let mut v = Vec::new();
    if t2 <= t1 {
        v.push(format!("W2's token {t2} is not strictly higher than W1's {t1}"));
    }
    let renew = api.renew("k", t1, LONG_TTL_MS).await;
    if renew.status != StatusCode::GONE || renew.code() != "LEASE_EXPIRED" {
        v.push(format!("W1's renew with token {t1} did not fail: {renew:?}"));
    }
    let release = api.release("k", t1).await;
    if release.status != StatusCode::OK || release.body["stale"] != json!(true) {
        v.push(format!("W1's release with token {t1} was not stale: {release:?}"));
    }
    let view = api.get("/v1/locks/k").await;
    if view.body["state"] != "HELD" || view.body["ownerId"] != "w2" || view.body["fencingToken"] != json!(t2)
    {
        v.push(format!("W2's grant (token {t2}) is not intact: {view:?}"));
    }
    let c = api.acquire("k", s3, "w3", LONG_TTL_MS).await;
    if c.status != StatusCode::CONFLICT {
        v.push(format!("a third worker got W2's key: {c:?}"));
    }
    let renew2 = api.renew("k", t2, LONG_TTL_MS).await;
    if renew2.status != StatusCode::OK {
        v.push(format!("W2 cannot renew its own grant: {renew2:?}"));
    }
    check(v)
}

/// A lease that lapsed is not resurrected by renew, even before anyone takes the key over.
async fn lapsed_renew_is_lease_expired(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("w", LONG_TTL_MS).await;
    let t = api.acquire("k", s, "w", h.short_ttl_ms()).await.token();
    h.await_not_held("k").await;
    let r = api.renew("k", t, LONG_TTL_MS).await;
    let mut v = Vec::new();
    if r.status != StatusCode::GONE || r.code() != "LEASE_EXPIRED" {
        v.push(format!("renew of a lapsed lease: {r:?}"));
    }
    let view = api.get("/v1/locks/k").await;
    if view.body["state"] == "HELD" {
        v.push(format!("the lapsed grant was resurrected: {view:?}"));
    }
    check(v)
}

/// Token-pinned force-revoke: REVOKED, then ALREADY_REVOKED on retry, HELD_BY_OTHER_TOKEN for a
/// newer holder (left alone), NOT_HELD for a free key; the revoked holder's renew is LEASE_EXPIRED.
async fn pinned_revoke_outcomes(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let t1 = api.acquire("k", s1, "w1", LONG_TTL_MS).await.token();
    let body = |t: i64| json!({"operator": "ops", "reason": "stuck", "fencingToken": t});
    let mut v = Vec::new();
    let r = api.revoke("k", Some(ADMIN_TOKEN), body(t1)).await;
    if r.status != StatusCode::OK || r.body["outcome"] != "REVOKED" {
        v.push(format!("first revoke: {r:?}"));
    }
    let r = api.revoke("k", Some(ADMIN_TOKEN), body(t1)).await;
    if r.status != StatusCode::OK || r.body["outcome"] != "ALREADY_REVOKED" {
        v.push(format!("retried revoke: {r:?}"));
    }
    let renew = api.renew("k", t1, LONG_TTL_MS).await;
    if renew.code() != "LEASE_EXPIRED" {
        v.push(format!("the revoked holder renewed: {renew:?}"));
    }
    let t2 = api.acquire("k", s2, "w2", LONG_TTL_MS).await.token();
    let r = api.revoke("k", Some(ADMIN_TOKEN), body(t2 + 1000)).await;
    if r.body["outcome"] != "HELD_BY_OTHER_TOKEN" {
        v.push(format!("revoke pinned to another token: {r:?}"));
    }
    let still = api.renew("k", t2, LONG_TTL_MS).await;
    if still.status != StatusCode::OK {
        v.push(format!("the newer holder was disturbed: {still:?}"));
    }
    let r = api.revoke("free", Some(ADMIN_TOKEN), body(t2)).await;
    if r.body["outcome"] != "NOT_HELD" {
        v.push(format!("revoke of a free key: {r:?}"));
    }
    check(v)
}

// ---- the blocking acquire, the watch and the listing --------------------------------------------

/// N blocking waiters queued one after the other behind a holder are granted in arrival order.
async fn fifo_order_under_n_waiters(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let t = api.acquire("q", s, "holder", LONG_TTL_MS).await.token();
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_up("q", &[api], 5, &order).await;
    let (order, _) = drain("q", &[api], t, 5, &order, false).await;
    for task in tasks {
        within("a waiter's answer", task).await.unwrap();
    }
    if order == vec![0, 1, 2, 3, 4] {
        Ok(())
    } else {
        Err(format!("granted in the order {order:?}, not in arrival order"))
    }
}

/// Every release wakes exactly one waiter: N waiters asleep behind a holder; each release (the
/// holder's, then each waiter's in turn, while the rest are asleep) adds exactly one `freed`
/// wake-up. A herd would wake every waiter still queued.
async fn one_wakeup_per_release(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let t = api.acquire("q", s, "holder", LONG_TTL_MS).await.token();
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_up("q", &[api], 5, &order).await;
    let (_, freed) = drain("q", &[api], t, 5, &order, true).await;
    for task in tasks {
        within("a waiter's answer", task).await.unwrap();
    }
    let mut v = Vec::new();
    if freed != vec![1.0, 2.0, 3.0, 4.0, 5.0] {
        v.push(format!(
            "the freed wake-ups after each of 5 releases, cumulated: {freed:?} (one per release is 1, 2, 3, 4, 5)"
        ));
    }
    if h.queue_entries().await != 0 {
        v.push("queue entries left behind".into());
    }
    check(v)
}

/// A waiter whose request goes away (the client disconnects) leaves the queue, and nothing of it
/// remains: no queue entry, no grant when the key is freed.
async fn cancelled_waiter_leaves_no_trace(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let t = api.acquire("q", s, "holder", LONG_TTL_MS).await.token();
    let w = api.open_session("gone", LONG_TTL_MS).await;
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move { api.acquire_wait("q", w, "gone", LONG_TTL_MS, 30_000).await })
    };
    wait_until("the waiter queued", || async move { api.queued("q").await == 1 }).await;
    waiting.abort();
    let mut v = Vec::new();
    wait_until("the cancelled waiter left the queue", || async move {
        h.queue_entries().await == 0
    })
    .await;
    wait_until("the cancelled wait counted", || async move {
        metric(&api.metrics().await, "lock_wait_total{result=\"cancelled\"}") == 1.0
    })
    .await;
    api.release("q", t).await;
    let view = api.get("/v1/locks/q").await;
    if view.body["state"] != "FREE" {
        v.push(format!("the cancelled waiter got the key: {view:?}"));
    }
    check(v)
}

/// A waiter whose session ends is answered SESSION_GONE and skipped: the one behind it is granted.
async fn dead_session_waiter_is_skipped(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let t = api.acquire("q", s, "holder", LONG_TTL_MS).await.token();
    let s1 = api.open_session("w1", LONG_TTL_MS).await;
    let s2 = api.open_session("w2", LONG_TTL_MS).await;
    let w1 = {
        let api = api.clone();
        tokio::spawn(async move { api.acquire_wait("q", s1, "w1", LONG_TTL_MS, 30_000).await })
    };
    wait_until("w1 queued", || async move { api.queued("q").await == 1 }).await;
    let w2 = {
        let api = api.clone();
        tokio::spawn(async move { api.acquire_wait("q", s2, "w2", LONG_TTL_MS, 30_000).await })
    };
    wait_until("w2 queued", || async move { api.queued("q").await == 2 }).await;
    api.close_session(s1).await;
    let mut v = Vec::new();
    let r1 = within("w1's answer", w1).await.unwrap();
    if r1.status != StatusCode::GONE || r1.code() != "SESSION_GONE" {
        v.push(format!("the waiter whose session ended: {r1:?}"));
    }
    api.release("q", t).await;
    let r2 = within("w2's answer", w2).await.unwrap();
    if r2.status != StatusCode::OK || r2.body["ownerId"] != "w2" {
        v.push(format!("the waiter behind it: {r2:?}"));
    }
    if h.queue_entries().await != 0 {
        v.push("queue entries left behind".into());
    }
    check(v)
}

/// A blocking acquire of a free key is granted at once; one that waits out its `waitMs` behind a
/// live holder is CONTENDED and leaves nothing queued.
async fn wait_ends_contended(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let w = api.open_session("w", LONG_TTL_MS).await;
    let mut v = Vec::new();
    let g = api.acquire_wait("q", s, "holder", LONG_TTL_MS, 1000).await;
    if g.status != StatusCode::OK {
        v.push(format!("a free key with waitMs: {g:?}"));
    }
    // Nobody was queued: granted without joining the queue.
    let free = metric(&api.metrics().await, "lock_wait_total{result=\"free\"}");
    if free != 1.0 {
        v.push(format!(
            "lock_wait_total{{result=\"free\"}} is {free} after one grant of a free key"
        ));
    }
    let c = api.acquire_wait("q", w, "w", LONG_TTL_MS, 200).await;
    if c.status != StatusCode::CONFLICT || c.code() != "CONTENDED" {
        v.push(format!("a wait that ended: {c:?}"));
    }
    let gone = api.acquire_wait("q", Uuid::new_v4(), "w", LONG_TTL_MS, 200).await;
    if gone.status != StatusCode::GONE || gone.code() != "SESSION_GONE" {
        v.push(format!("a wait with an unknown session: {gone:?}"));
    }
    if h.queue_entries().await != 0 {
        v.push("queue entries left behind".into());
    }
    check(v)
}

/// A blocking acquire of a free key that someone is queued for joins the queue behind them: the
/// key is free only while the head is being handed it (here a waiter whose replica holds its turn
/// for minutes, written straight into the store), and a newcomer must not take it out of turn.
async fn free_key_with_a_queue_is_not_taken_out_of_turn(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let head = api.open_session("head", LONG_TTL_MS).await;
    h.queue_a_waiter("q", head, "head", Duration::from_secs(600))
        .await;
    let s = api.open_session("newcomer", LONG_TTL_MS).await;
    let mut v = Vec::new();
    let r = api.acquire_wait("q", s, "newcomer", LONG_TTL_MS, 200).await;
    if r.status != StatusCode::CONFLICT || r.code() != "CONTENDED" {
        v.push(format!(
            "a newcomer's blocking acquire of a free key with a waiter queued: {r:?}"
        ));
    }
    let free = metric(&api.metrics().await, "lock_wait_total{result=\"free\"}");
    if free != 0.0 {
        v.push(format!("{free} blocking acquires granted at once past the queue"));
    }
    check(v)
}

/// Two lock-server replicas on one store serve one queue: waiters alternate between them and are
/// granted in arrival order, one wake-up per release across both.
async fn two_replicas_one_queue(h: &Harness) -> Result<(), String> {
    let second = h.replica().await;
    let api2 = Api::new(&second);
    let api = &h.api;
    let s = api.open_session("holder", LONG_TTL_MS).await;
    let t = api.acquire("q", s, "holder", LONG_TTL_MS).await.token();
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_up("q", &[api, &api2], 4, &order).await;
    let (order, freed) = drain("q", &[api, &api2], t, 4, &order, true).await;
    for task in tasks {
        within("a waiter's answer", task).await.unwrap();
    }
    second.shutdown().await.unwrap();
    let mut v = Vec::new();
    if order != vec![0, 1, 2, 3] {
        v.push(format!("granted in the order {order:?} across two replicas"));
    }
    if freed != vec![1.0, 2.0, 3.0, 4.0] {
        v.push(format!(
            "freed wake-ups after each release across two replicas: {freed:?}"
        ));
    }
    check(v)
}

/// A revoked holder learns it at once: its key's watch reports REVOKED, and a handle that watches
/// its grant is lost with reason Revoked, without waiting for a renewal.
async fn revoked_holder_watch_and_handle_report_it(h: &Harness) -> Result<(), String> {
    let client = LockClient::new(&h.api.base).unwrap();
    let session = client
        .open_session("holder", Duration::from_secs(600))
        .await
        .unwrap();
    let handle = session.try_acquire("w", Duration::from_secs(600)).await.unwrap();
    let token = handle.token();
    handle.watch_grant();
    let mut watch = client.watch("w").await.unwrap();
    let mut v = Vec::new();
    match within("the watch's state", watch.next()).await {
        Ok(Some(WatchItem::State(view))) if view.fencing_token == Some(token) => {}
        other => v.push(format!("the watch did not start with the holder: {other:?}")),
    }
    wait_until("both watches open", || async move {
        metric(&h.api.metrics().await, "lock_watchers") == 2.0
    })
    .await;
    let r = h
        .api
        .revoke(
            "w",
            Some(ADMIN_TOKEN),
            json!({"operator": "ops", "reason": "stuck", "fencingToken": token.get()}),
        )
        .await;
    if r.body["outcome"] != "REVOKED" {
        return Err(format!("revoke: {r:?}"));
    }
    match within("the watch's next event", watch.next()).await {
        Ok(Some(WatchItem::Change(e)))
            if e.kind == dlock_client::LockEventType::Revoked && e.fencing_token == token => {}
        other => v.push(format!("the watch did not report the revocation: {other:?}")),
    }
    // Renewals are 200 s apart here: only the watch can tell the handle this soon.
    let reason = within("the handle to learn of the revocation", handle.lost()).await;
    if reason != LossReason::Revoked {
        v.push(format!("the handle was lost for {reason:?}, not Revoked"));
    }
    check(v)
}

/// The listing: held keys under a prefix in key order, keyset-paged, with holder, token and queue
/// length; admin only.
async fn list_pages_held_keys(h: &Harness) -> Result<(), String> {
    let api = &h.api;
    let s = api.open_session("w", LONG_TTL_MS).await;
    let mut tokens = Vec::new();
    for k in ["ls:b", "ls:a", "ls:c", "other"] {
        tokens.push(api.acquire(k, s, "w", LONG_TTL_MS).await.token());
    }
    let mut v = Vec::new();
    let first = api.list("?prefix=ls:&limit=2").await;
    let keys = |r: &Reply| -> Vec<String> {
        r.body["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["lockKey"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    if keys(&first) != ["ls:a", "ls:b"] || first.body["nextCursor"] != "ls:b" {
        v.push(format!("first page: {first:?}"));
    }
    let item = &first.body["items"][0];
    if item["ownerId"] != "w"
        || item["fencingToken"] != json!(tokens[1])
        || item["state"] != "HELD"
        || item["waiters"] != 0
    {
        v.push(format!("an item: {item}"));
    }
    let second = api.list("?prefix=ls:&limit=2&after=ls:b").await;
    if keys(&second) != ["ls:c"] || second.body.get("nextCursor").is_some() {
        v.push(format!("second page: {second:?}"));
    }
    let anon = api.get("/v1/locks").await;
    if anon.status != StatusCode::UNAUTHORIZED {
        v.push(format!("the listing without the admin token: {anon:?}"));
    }
    let bad = api.list("?limit=0").await;
    if bad.status != StatusCode::BAD_REQUEST || bad.code() != "INVALID_LIMIT" {
        v.push(format!("limit 0: {bad:?}"));
    }
    check(v)
}

macro_rules! contract_tests {
    ($($scenario:ident),* $(,)?) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let h = Harness::pg(Statements::C1).await;
                    super::$scenario(&h).await.unwrap();
                    h.srv.shutdown().await.unwrap();
                }
            )*
        }
        mod etcd {
            use super::*;
            $(
                #[tokio::test]
                async fn $scenario() {
                    let h = Harness::etcd(EtcdFaults::NONE).await;
                    super::$scenario(&h).await.unwrap();
                    h.srv.shutdown().await.unwrap();
                }
            )*
        }
    };
}

contract_tests!(
    grant_contend_reenter,
    free_key_with_a_queue_is_not_taken_out_of_turn,
    session_gone_rows,
    session_lapse_and_reap,
    renew_release_and_token_order,
    cascade_on_close,
    n_concurrent_one_grant,
    pause_and_return,
    lapsed_renew_is_lease_expired,
    pinned_revoke_outcomes,
    fifo_order_under_n_waiters,
    one_wakeup_per_release,
    cancelled_waiter_leaves_no_trace,
    dead_session_waiter_is_skipped,
    wait_ends_contended,
    two_replicas_one_queue,
    revoked_holder_watch_and_handle_report_it,
    list_pages_held_keys,
);

// ---- negative controls: the same scenarios against a broken backend must report a violation ------

/// Runs `scenario` on a deliberately broken backend and requires it to report a violation.
macro_rules! must_fail {
    ($harness:expr, $scenario:ident, $what:expr) => {{
        let h = $harness;
        let violation = $scenario(&h)
            .await
            .expect_err(concat!("the suite did not catch ", $what));
        eprintln!("{}: caught: {violation}", $what);
        h.srv.shutdown().await.unwrap();
    }};
}

#[tokio::test]
async fn control_etcd_token_from_per_key_version_reissues_tokens() {
    let faults = EtcdFaults {
        token_from_version: true,
        ..EtcdFaults::NONE
    };
    must_fail!(
        Harness::etcd(faults).await,
        renew_release_and_token_order,
        "tokens from `version`"
    );
}

#[tokio::test]
async fn control_etcd_token_from_per_key_version_breaks_takeover_order() {
    let faults = EtcdFaults {
        token_from_version: true,
        ..EtcdFaults::NONE
    };
    must_fail!(
        Harness::etcd(faults).await,
        pause_and_return,
        "tokens from `version`"
    );
}

#[tokio::test]
async fn control_etcd_release_by_key_alone_deletes_the_new_holder() {
    let faults = EtcdFaults {
        release_by_key_alone: true,
        ..EtcdFaults::NONE
    };
    must_fail!(
        Harness::etcd(faults).await,
        pause_and_return,
        "release by key alone"
    );
}

#[tokio::test]
async fn control_etcd_renew_ignoring_the_token_renews_the_new_holder() {
    let faults = EtcdFaults {
        renew_ignores_token: true,
        ..EtcdFaults::NONE
    };
    must_fail!(
        Harness::etcd(faults).await,
        pause_and_return,
        "renew ignoring the token"
    );
}

#[tokio::test]
async fn control_postgres_release_by_key_alone_deletes_the_new_holder() {
    must_fail!(
        Harness::pg(release_by_key_alone()).await,
        pause_and_return,
        "release by key alone"
    );
}

#[tokio::test]
async fn control_postgres_acquire_without_nextval_keeps_the_dead_holders_token() {
    must_fail!(
        Harness::pg(acquire_without_nextval_in_update()).await,
        pause_and_return,
        "acquire without nextval in DO UPDATE"
    );
}

#[tokio::test]
async fn control_postgres_renew_without_expiry_check_resurrects_a_lapsed_lease() {
    must_fail!(
        Harness::pg(renew_without_expiry_check()).await,
        lapsed_renew_is_lease_expired,
        "renew without the expiry check"
    );
}

#[tokio::test]
async fn control_postgres_queue_waking_every_waiter_is_a_herd() {
    let faults = QueueFaults {
        wake_every_waiter: true,
        ..QueueFaults::NONE
    };
    must_fail!(
        Harness::pg_with(Statements::C1, faults).await,
        one_wakeup_per_release,
        "a queue that wakes every waiter"
    );
}

#[tokio::test]
async fn control_etcd_queue_waking_every_waiter_is_a_herd() {
    let faults = QueueFaults {
        wake_every_waiter: true,
        ..QueueFaults::NONE
    };
    must_fail!(
        Harness::etcd_with(EtcdFaults::NONE, faults).await,
        one_wakeup_per_release,
        "a queue that wakes every waiter"
    );
}

#[tokio::test]
async fn control_postgres_lifo_queue_is_unfair() {
    let faults = QueueFaults {
        lifo: true,
        ..QueueFaults::NONE
    };
    must_fail!(
        Harness::pg_with(Statements::C1, faults).await,
        fifo_order_under_n_waiters,
        "a LIFO queue"
    );
}

#[tokio::test]
async fn control_etcd_lifo_queue_is_unfair() {
    let faults = QueueFaults {
        lifo: true,
        ..QueueFaults::NONE
    };
    must_fail!(
        Harness::etcd_with(EtcdFaults::NONE, faults).await,
        fifo_order_under_n_waiters,
        "a LIFO queue"
    );
}

#[tokio::test]
async fn control_postgres_blocking_acquire_barging_past_the_queue() {
    let faults = QueueFaults {
        barge: true,
        ..QueueFaults::NONE
    };
    must_fail!(
        Harness::pg_with(Statements::C1, faults).await,
        free_key_with_a_queue_is_not_taken_out_of_turn,
        "a blocking acquire that takes a free key past the queue"
    );
}

#[tokio::test]
async fn control_etcd_blocking_acquire_barging_past_the_queue() {
    let faults = QueueFaults {
        barge: true,
        ..QueueFaults::NONE
    };
    must_fail!(
        Harness::etcd_with(EtcdFaults::NONE, faults).await,
        free_key_with_a_queue_is_not_taken_out_of_turn,
        "a blocking acquire that takes a free key past the queue"
    );
}
