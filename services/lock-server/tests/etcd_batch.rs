//! The etcd backend's release batches (`lock_server::store::etcd::batch`): concurrent releases
//! share one transaction, each call's compare-and-delete nested in it, and each caller gets its own
//! call's outcome — a stale token in a batch deletes nothing, whatever the others beside it
//! released. The negative control releases by key alone: batched, it must delete the live grants.
//!
//! The bursts run on one thread (the default test runtime), so what each call meets is not a matter
//! of timing: the first call of a burst finds nothing in flight and is sent at once, alone; every
//! other call is queued behind it, and the batch that follows carries them all.

use dlock_testkit::etcd::EtcdCluster;
use futures::future::join_all;
use lock_server::error::Error;
use lock_server::{EtcdFaults, EtcdRepo};
use uuid::Uuid;

const TTL_SECS: f64 = 60.0;

async fn cluster_and_repo(faults: EtcdFaults) -> (EtcdCluster, EtcdRepo) {
    let cluster = EtcdCluster::single().expect("etcd starts (scripts/cluster-tools.sh etcd installs it)");
    let good = EtcdRepo::connect(&cluster.endpoints(), "/dlock/").await.unwrap();
    (cluster, EtcdRepo::with_client(good.client(), "/dlock/", faults))
}

async fn grant(repo: &EtcdRepo, key: &str, session: Uuid, owner: &str) -> i64 {
    repo.acquire(key, owner, session, TTL_SECS)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{key} is free"))
        .fencing_token
}

/// `n` keys released by their old holder's token after a new holder took them, in one burst with
/// `n` other keys released by their holder's own token. `Err`: what went wrong, if a stale release
/// reported success or deleted the live grant (what the negative control must produce).
async fn scenario_stale_releases_in_a_batch(repo: &EtcdRepo, n: usize) -> Result<(), String> {
    let old = repo.create_session("old", TTL_SECS).await.unwrap().session_id;
    let live = repo.create_session("live", TTL_SECS).await.unwrap().session_id;
    let stale_keys: Vec<String> = (0..n).map(|i| format!("account:{i}")).collect();
    let own_keys: Vec<String> = (0..n).map(|i| format!("account:own:{i}")).collect();
    let mut stale = Vec::new();
    let mut current = Vec::new();
    for k in &stale_keys {
        let t = grant(repo, k, old, "old").await;
        assert!(repo.release(k, t).await.unwrap(), "{k}: its holder releases it");
        stale.push(t);
        current.push(grant(repo, k, live, "live").await);
    }
    let mut own = Vec::new();
    for k in &own_keys {
        own.push(grant(repo, k, live, "live").await);
    }
    let before = repo.release_batches();
    let calls = stale_keys
        .iter()
        .zip(&stale)
        .chain(own_keys.iter().zip(&own))
        .map(|(k, t)| repo.release(k, *t));
    let out: Vec<bool> = join_all(calls)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a release failed: {e}"))?;
    let after = repo.release_batches();
    assert_eq!(after.calls - before.calls, 2 * n as u64);
    assert_eq!(
        after.transactions - before.transactions,
        2,
        "the burst is the first call alone and one batch of the rest: {before:?} -> {after:?}"
    );
    assert_eq!(after.largest, 2 * n - 1);
    let mut violations = Vec::new();
    for (i, k) in stale_keys.iter().enumerate() {
        let row = repo.read(k).await.unwrap();
        let intact = row.as_ref().is_some_and(|r| r.fencing_token == current[i]);
        if out[i] || !intact {
            violations.push(format!(
                "{k}: stale release by token {} returned released={}; the live grant (token {}) is now {row:?}",
                stale[i], out[i], current[i]
            ));
        }
    }
    for (i, k) in own_keys.iter().enumerate() {
        assert!(out[n + i], "{k}: its holder's release in the batch");
        assert!(
            repo.read(k).await.unwrap().is_none(),
            "{k} is free after its release"
        );
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

#[tokio::test]
async fn each_release_in_a_batch_gets_its_own_outcome() {
    let (_cluster, repo) = cluster_and_repo(EtcdFaults::NONE).await;
    scenario_stale_releases_in_a_batch(&repo, 8)
        .await
        .expect("C1's release holds batched");
}

#[tokio::test]
async fn control_batched_release_by_key_alone_deletes_the_live_grants() {
    let (_cluster, repo) = cluster_and_repo(EtcdFaults {
        release_by_key_alone: true,
        ..EtcdFaults::NONE
    })
    .await;
    let violation = scenario_stale_releases_in_a_batch(&repo, 8)
        .await
        .expect_err("the broken release must delete the live grants when batched");
    eprintln!("negative control reported: {violation}");
    // Every stale key, the ones the batch carried too (all but the first, sent alone).
    assert_eq!(violation.matches("released=true").count(), 8, "{violation}");
    assert!(violation.contains("None"), "{violation}");
}

/// A lone release runs in its caller's task, holding the one slot; a release queued behind it is
/// still answered when that caller goes away mid-request (the slot is given back and the queue
/// kicked as the call is dropped), not left waiting for a caller that will never finish.
#[tokio::test]
async fn a_release_queued_behind_a_dropped_lone_release_is_still_answered() {
    let (_cluster, repo) = cluster_and_repo(EtcdFaults::NONE).await;
    let s = repo.create_session("o", TTL_SECS).await.unwrap().session_id;
    let first = grant(&repo, "first", s, "o").await;
    let second = grant(&repo, "second", s, "o").await;
    let mut lone = Box::pin(repo.release("first", first));
    assert!(futures::poll!(&mut lone).is_pending(), "sent, awaiting etcd");
    let mut queued = Box::pin(repo.release("second", second));
    assert!(futures::poll!(&mut queued).is_pending(), "queued behind it");
    drop(lone);
    let released = tokio::time::timeout(dlock_testkit::wait::WAIT_LIMIT, queued)
        .await
        .expect("the queued release is answered after the lone one's caller went away")
        .unwrap();
    assert!(released);
    assert!(repo.read("second").await.unwrap().is_none());
}

/// Two releases of one key never share a transaction: each goes in one of its own, and exactly one
/// of them finds the grant (which, etcd's order decides).
#[tokio::test]
async fn two_releases_of_one_key_go_in_two_transactions() {
    let (_cluster, repo) = cluster_and_repo(EtcdFaults::NONE).await;
    let s = repo.create_session("o", TTL_SECS).await.unwrap().session_id;
    let t = grant(&repo, "k", s, "o").await;
    let before = repo.release_batches();
    let mut out: Vec<bool> = join_all([repo.release("k", t), repo.release("k", t)])
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let after = repo.release_batches();
    out.sort();
    assert_eq!(out, [false, true]);
    assert_eq!(after.transactions - before.transactions, 2, "{after:?}");
}

/// etcd gone: every caller of the batch gets the error a lone release would (503 at the edge), none
/// an outcome.
#[tokio::test]
async fn a_batch_etcd_does_not_answer_fails_every_caller_as_unavailable() {
    let (mut cluster, repo) = cluster_and_repo(EtcdFaults::NONE).await;
    let s = repo.create_session("o", TTL_SECS).await.unwrap().session_id;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let mut tokens = Vec::new();
    for k in &keys {
        tokens.push(grant(&repo, k, s, "o").await);
    }
    cluster.stop(0);
    let out = join_all(keys.iter().zip(&tokens).map(|(k, t)| repo.release(k, *t))).await;
    for r in out {
        let e: Error = r.expect_err("no answer from etcd");
        let api = dlock_common::ApiError::from(e);
        assert_eq!((api.status.as_u16(), api.code), (503, "UNAVAILABLE"), "{api:?}");
    }
    // The first call alone, the other three in one batch.
    assert_eq!(repo.release_batches().largest, 3);
}
