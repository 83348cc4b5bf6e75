//! A real three-member etcd cluster on loopback: while workers acquire and release one key in a loop
//! through lock-server (`--backend etcd` over all three endpoints), the leader is killed and
//! restarted, then a follower. A history checker over the recorded grants then requires:
//!
//! - every granted token is distinct, and tokens follow real time: a grant whose answer arrived
//!   before another grant's request was sent carries the smaller token;
//! - no two workers believed they held the key at the same instant, unless the earlier grant's lease
//!   had run out by then (a worker's belief runs from the grant's answer to sending its release;
//!   its lease from sending the acquire plus the TTL).
//!
//! Progress between faults is awaited as a condition (so many more grants recorded), never slept.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Api;
use dlock_testkit::etcd::EtcdCluster;
use etcd_client::Client;
use reqwest::StatusCode;
use tokio::sync::Mutex;

const TTL_MS: i64 = 2000;
const WORKERS: usize = 4;

#[derive(Debug, Clone)]
struct Grant {
    worker: usize,
    token: i64,
    sent: Instant,
    granted: Instant,
    released: Instant,
}

/// The member that currently leads, asked of the members that answer.
async fn leader(cluster: &EtcdCluster) -> Option<usize> {
    for i in 0..cluster.len() {
        if !cluster.is_running(i) {
            continue;
        }
        let Ok(mut c) = Client::connect([cluster.endpoint(i)], None).await else {
            continue;
        };
        if let Ok(s) = c.status().await
            && let Some(h) = s.header()
            && s.leader() != 0
            && s.leader() == h.member_id()
        {
            return Some(i);
        }
    }
    None
}

async fn await_leader(cluster: &EtcdCluster) -> usize {
    let started = Instant::now();
    loop {
        if let Some(l) = leader(cluster).await {
            return l;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no etcd leader within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn await_more_grants(count: &AtomicUsize, more: usize, what: &str) {
    let target = count.load(Ordering::SeqCst) + more;
    let started = Instant::now();
    while count.load(Ordering::SeqCst) < target {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no progress {what}: {} of {target} grants",
            count.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn worker(
    api: Api,
    id: usize,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    out: Arc<Mutex<Vec<Grant>>>,
) {
    let owner = format!("w{id}");
    let mut session = None;
    while !stop.load(Ordering::SeqCst) {
        let s = match session {
            Some(s) => s,
            None => {
                let r = api
                    .post_json(
                        "/v1/sessions",
                        serde_json::json!({"ownerId": owner, "ttlMs": 600_000}),
                    )
                    .await;
                if r.status != StatusCode::CREATED {
                    continue; // the store is electing a leader; try again
                }
                let s = r.body["sessionId"].as_str().and_then(|s| s.parse().ok());
                session = s;
                continue;
            }
        };
        let sent = Instant::now();
        let r = api.acquire("hot", s, &owner, TTL_MS).await;
        match r.status {
            StatusCode::OK => {
                let granted = Instant::now();
                let token = r.token();
                let released = Instant::now();
                // The belief ends here: the release is on its way.
                let _ = api.release("hot", token).await;
                out.lock().await.push(Grant {
                    worker: id,
                    token,
                    sent,
                    granted,
                    released,
                });
                count.fetch_add(1, Ordering::SeqCst);
            }
            StatusCode::GONE => session = None,
            _ => {} // CONTENDED, or 503 while etcd elects: try again
        }
    }
}

fn check_history(mut grants: Vec<Grant>) -> Result<(), String> {
    let ttl = Duration::from_millis(TTL_MS as u64);
    grants.sort_by_key(|g| g.token);
    let mut problems = Vec::new();
    for w in grants.windows(2) {
        if w[0].token == w[1].token {
            problems.push(format!("token {} granted twice: {:?}", w[0].token, w));
        }
    }
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            // a.token < b.token
            if b.granted < a.sent {
                problems.push(format!(
                    "token order contradicts real time: {a:?} was asked after {b:?} was granted"
                ));
            }
            let a_lease_end = a.sent + ttl;
            let overlap = b.granted < a.released && b.granted < a_lease_end;
            if overlap && a.worker != b.worker {
                problems.push(format!("two holders at once: {a:?} and {b:?}"));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[test]
fn the_history_checker_catches_a_double_grant_and_a_token_out_of_order() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let g = |worker, token, sent, granted, released| Grant {
        worker,
        token,
        sent: ms(sent),
        granted: ms(granted),
        released: ms(released),
    };
    assert!(check_history(vec![g(0, 5, 0, 1, 2), g(1, 7, 2, 3, 4)]).is_ok());
    // Worker 1 was granted while worker 0 still held it, within its lease.
    assert!(check_history(vec![g(0, 5, 0, 1, 10), g(1, 7, 2, 3, 4)]).is_err());
    // Same token twice.
    assert!(check_history(vec![g(0, 5, 0, 1, 2), g(1, 5, 3, 4, 5)]).is_err());
    // The later grant carries the smaller token.
    assert!(check_history(vec![g(0, 9, 0, 1, 2), g(1, 7, 3, 4, 5)]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_then_a_follower_keeps_tokens_increasing_and_one_holder() {
    let mut cluster = EtcdCluster::three().expect("a three-member etcd cluster starts");
    let cfg = lock_server::Config::etcd(cluster.endpoints(), "/dlock/").with_reaper_interval(None);
    let srv = lock_server::spawn(cfg).await.unwrap();
    let api = Api::new(&srv);

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let history = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            tokio::spawn(worker(
                api.clone(),
                i,
                stop.clone(),
                count.clone(),
                history.clone(),
            ))
        })
        .collect();

    await_more_grants(&count, 30, "before any fault").await;

    let l = await_leader(&cluster).await;
    eprintln!("stopping the leader m{l}");
    cluster.stop(l);
    await_more_grants(&count, 30, "with the old leader down").await;
    cluster.restart(l).expect("the old leader restarts");
    await_more_grants(&count, 30, "after the old leader returned").await;

    let l = await_leader(&cluster).await;
    let f = (l + 1) % cluster.len();
    eprintln!("stopping the follower m{f} (leader m{l})");
    cluster.stop(f);
    await_more_grants(&count, 30, "with a follower down").await;
    cluster.restart(f).expect("the follower restarts");
    await_more_grants(&count, 30, "after the follower returned").await;

    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let grants = history.lock().await.clone();
    eprintln!("{} grants recorded", grants.len());
    assert!(grants.len() >= 150);
    check_history(grants).unwrap();
    srv.shutdown().await.unwrap();
}
