//! Concurrent acquires and releases batched into one statement per round trip
//! (`lock_server::store::postgres::batch`), against a real PostgreSQL 16 lockdb: every caller gets
//! exactly its own row's outcome, two calls for one key never share a statement, one bad call does
//! not decide the others, and the negative controls' broken statements fail the same checks when
//! they run batched.
//!
//! Each burst is started in one poll of `join_all` on the test's single-threaded runtime, so every
//! call is queued before the first batch is taken: the bursts below are batched by construction, and
//! each test also asserts from the batcher's counters that a statement carried more than one call.

mod common;

use std::collections::HashSet;

use common::*;
use futures::future::join_all;
use lock_server::store::Grant;
use lock_server::store::postgres::batch::{BatchFaults, BatchStats, MAX_BATCH, MAX_IN_FLIGHT};
use lock_server::{Error, Repo, Statements};
use serde_json::json;
use uuid::Uuid;

async fn repo(stmts: Statements) -> (Db, Repo) {
    let db = lockdb().await;
    let repo = Repo::with_statements(db.app.clone(), stmts);
    (db, repo)
}

async fn sessions(repo: &Repo, prefix: &str, n: usize) -> Vec<(String, Uuid)> {
    let mut out = Vec::new();
    for i in 0..n {
        let owner = format!("{prefix}{i}");
        let s = session(repo, &owner).await;
        out.push((owner, s));
    }
    out
}

/// Acquires `keys[i]` for `holders[i]`, all at once.
async fn burst_acquire(
    repo: &Repo,
    keys: &[String],
    holders: &[(String, Uuid)],
    ttl_secs: f64,
) -> Vec<Result<Option<Grant>, Error>> {
    join_all(
        keys.iter()
            .zip(holders)
            .map(|(k, (owner, s))| repo.acquire(k, owner, *s, ttl_secs)),
    )
    .await
}

/// The grants of a burst in which every acquire must be granted; panics naming the first that was
/// not.
fn all_granted(outcomes: Vec<Result<Option<Grant>, Error>>) -> Vec<Grant> {
    outcomes
        .into_iter()
        .enumerate()
        .map(|(i, g)| match g {
            Ok(Some(g)) => g,
            other => panic!("acquire {i} of the burst: {other:?}"),
        })
        .collect()
}

/// Releases `keys[i]` with `grants[i]`'s token, all at once.
async fn burst_release(repo: &Repo, keys: &[String], grants: &[Grant]) -> Vec<Result<bool, Error>> {
    join_all(
        keys.iter()
            .zip(grants)
            .map(|(k, g)| repo.release(k, g.fencing_token)),
    )
    .await
}

/// `n` sessions (`holders`), each holding one of the keys `held` (its grant in `grants`), and `n`
/// keys nobody holds (`fresh`): `(holders, held, fresh, grants)`.
async fn held_and_fresh(
    repo: &Repo,
    n: usize,
) -> (Vec<(String, Uuid)>, Vec<String>, Vec<String>, Vec<Grant>) {
    let holders = sessions(repo, "w", n).await;
    let held: Vec<String> = (0..n).map(|i| format!("account:held:{i}")).collect();
    let fresh: Vec<String> = (0..n).map(|i| format!("account:fresh:{i}")).collect();
    let grants = all_granted(burst_acquire(repo, &held, &holders, LONG_TTL_SECS).await);
    (holders, held, fresh, grants)
}

/// The batches between `before` and `after` ran as the `unnest` statement, none refused (a refused
/// batch is re-run call by call, which would pass every check above without testing the batch).
fn assert_unnested_without_fallback(before: BatchStats, after: BatchStats) {
    assert!(after.unnested > before.unnested, "no unnest batch: {after:?}");
    assert_eq!(
        after.fallbacks, before.fallbacks,
        "a batch was refused: {after:?}"
    );
}

fn batched_since(before: BatchStats, after: BatchStats) -> String {
    format!(
        "{} calls in {} statements, largest {}",
        after.calls - before.calls,
        after.statements - before.statements,
        after.largest
    )
}

#[tokio::test]
async fn concurrent_acquires_on_distinct_keys_each_get_their_own_row_with_distinct_rising_tokens() {
    let (db, repo) = repo(Statements::C1).await;
    let n = MAX_BATCH + MAX_BATCH / 2; // more than one batch's worth
    let holders = sessions(&repo, "w", n).await;
    let keys: Vec<String> = (0..n).map(|i| format!("account:{i}")).collect();

    let before = repo.acquire_batches();
    let first = burst_acquire(&repo, &keys, &holders, LONG_TTL_SECS).await;
    let after = repo.acquire_batches();
    assert!(after.largest > 1, "{}", batched_since(before, after));
    assert!(
        after.statements - before.statements < n as u64,
        "{}",
        batched_since(before, after)
    );
    assert_unnested_without_fallback(before, after);

    let mut tokens = HashSet::new();
    let mut first_tokens = Vec::new();
    for (i, g) in first.into_iter().enumerate() {
        let g = g
            .unwrap()
            .unwrap_or_else(|| panic!("{} was not granted", keys[i]));
        // The caller's own row: its key's row, with its owner, session and token.
        assert_eq!(
            (g.owner_id.as_str(), g.session_id),
            (holders[i].0.as_str(), holders[i].1)
        );
        let row = entry(&db.app, &keys[i]).await.unwrap();
        assert_eq!(
            (
                row.owner_id.as_str(),
                row.session_id,
                row.fencing_token,
                row.expires_at
            ),
            (g.owner_id.as_str(), g.session_id, g.fencing_token, g.expires_at)
        );
        assert!(
            tokens.insert(g.fencing_token),
            "token {} handed out twice",
            g.fencing_token
        );
        first_tokens.push(g.fencing_token);
    }

    // A second burst, after the first was answered: every token is higher than every earlier one,
    // and each key's re-entry grant replaces its own earlier grant.
    let second = burst_acquire(&repo, &keys, &holders, LONG_TTL_SECS).await;
    let first_max = first_tokens.iter().copied().max().unwrap();
    let mut second_tokens = HashSet::new();
    for (i, g) in second.into_iter().enumerate() {
        let g = g.unwrap().expect("re-entry granted");
        assert!(g.fencing_token > first_max, "{} ≤ {first_max}", g.fencing_token);
        assert!(second_tokens.insert(g.fencing_token));
        assert_eq!(
            entry(&db.app, &keys[i]).await.unwrap().fencing_token,
            g.fencing_token
        );
        // The first grant's token is void.
        assert!(!repo.release(&keys[i], first_tokens[i]).await.unwrap());
    }
    // A lone acquire afterwards is higher still.
    let (owner, s) = &holders[0];
    let alone = repo
        .acquire("account:alone", owner, *s, LONG_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    assert!(second_tokens.iter().all(|t| alone.fencing_token > *t));
}

#[tokio::test]
async fn each_call_of_a_batch_gets_its_own_ttl_on_a_fresh_key_and_on_re_entry() {
    let (db, repo) = repo(Statements::C1).await;
    let holders = sessions(&repo, "w", 12).await;
    let keys: Vec<String> = (0..12).map(|i| format!("account:{i}")).collect();
    // Whole seconds: `expires_at - acquired_at` is then exact.
    let ttl = |round: usize, i: usize| (60 * (round + 1) + i) as f64;
    for round in 0..2 {
        // Round 0 inserts; round 1 is every session re-entering its key (the `DO UPDATE` branch,
        // whose TTL is the same call's, looked up by key).
        let before = repo.acquire_batches();
        let out = join_all(
            keys.iter()
                .zip(&holders)
                .enumerate()
                .map(|(i, (k, (owner, s)))| repo.acquire(k, owner, *s, ttl(round, i))),
        )
        .await;
        let after = repo.acquire_batches();
        assert!(after.largest > 1, "{}", batched_since(before, after));
        assert_unnested_without_fallback(before, after);
        for (i, g) in out.into_iter().enumerate() {
            let g = g.unwrap().expect("granted");
            let lease = (g.expires_at - g.acquired_at).num_milliseconds();
            assert_eq!(lease as f64, ttl(round, i) * 1000.0, "round {round}, {}", keys[i]);
            let row = entry(&db.app, &keys[i]).await.unwrap();
            assert_eq!(
                (row.fencing_token, row.expires_at),
                (g.fencing_token, g.expires_at)
            );
        }
    }
}

#[tokio::test]
async fn two_acquires_for_one_key_in_one_burst_are_one_grant_and_the_rest_contended() {
    let (db, repo) = repo(Statements::C1).await;
    let holders = sessions(&repo, "w", 16).await;
    // Eight different sessions want `hot`; the other eight want a key each.
    let keys: Vec<String> = (0..16)
        .map(|i| {
            if i % 2 == 0 {
                "account:hot".to_owned()
            } else {
                format!("account:{i}")
            }
        })
        .collect();
    let before = repo.acquire_batches();
    let out = burst_acquire(&repo, &keys, &holders, LONG_TTL_SECS).await;
    let after = repo.acquire_batches();
    assert!(after.largest > 1, "{}", batched_since(before, after));

    let mut winners = Vec::new();
    for (i, r) in out.into_iter().enumerate() {
        let r = r.unwrap();
        if keys[i] == "account:hot" {
            if let Some(g) = r {
                winners.push((i, g));
            }
        } else {
            let g = r.unwrap_or_else(|| panic!("{} was not granted", keys[i]));
            assert_eq!(g.session_id, holders[i].1);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one grant for one key: {winners:?}");
    let (i, g) = &winners[0];
    let row = entry(&db.app, "account:hot").await.unwrap();
    assert_eq!(
        (row.session_id, row.fencing_token),
        (holders[*i].1, g.fencing_token)
    );
}

#[tokio::test]
async fn one_session_acquiring_one_key_twice_in_one_burst_gets_two_grants_the_later_one_current() {
    let (db, repo) = repo(Statements::C1).await;
    let s = session(&repo, "w1").await;
    let out = join_all((0..2).map(|_| repo.acquire("account:1", "w1", s, LONG_TTL_SECS))).await;
    let tokens: Vec<i64> = out
        .into_iter()
        .map(|g| g.unwrap().expect("re-entry granted").fencing_token)
        .collect();
    assert_ne!(tokens[0], tokens[1]);
    // Never one statement (ON CONFLICT cannot touch one row twice): the second ran after the first,
    // so the row holds the higher token and the lower one is void.
    let current = entry(&db.app, "account:1").await.unwrap().fencing_token;
    assert_eq!(current, tokens[0].max(tokens[1]));
    assert!(!repo.release("account:1", tokens[0].min(tokens[1])).await.unwrap());
}

#[tokio::test]
async fn one_bad_call_in_a_batch_gets_its_own_error_and_the_others_their_grants() {
    let (db, repo) = repo(Statements::C1).await;
    let mut holders = sessions(&repo, "w", 8).await;
    let mut keys: Vec<String> = (0..8).map(|i| format!("account:{i}")).collect();
    // An unknown session (the foreign key refuses its row) and a key PostgreSQL refuses to store.
    holders.push(("ghost".to_owned(), Uuid::new_v4()));
    keys.push("account:ghost".to_owned());
    holders.push(holders[0].clone());
    keys.push("account:\0".to_owned());

    let before = repo.acquire_batches();
    let out = burst_acquire(&repo, &keys, &holders, LONG_TTL_SECS).await;
    let after = repo.acquire_batches();
    assert!(after.largest > 1, "{}", batched_since(before, after));
    assert!(
        after.fallbacks > before.fallbacks,
        "the batch was not refused: {after:?}"
    );

    let mut out = out.into_iter();
    for i in 0..8 {
        let g = out.next().unwrap().unwrap().expect("granted");
        assert_eq!(g.session_id, holders[i].1);
        assert_eq!(
            entry(&db.app, &keys[i]).await.unwrap().fencing_token,
            g.fencing_token
        );
    }
    let ghost = out.next().unwrap();
    assert!(matches!(ghost, Err(Error::SessionGone)), "{ghost:?}");
    let nul = out.next().unwrap();
    assert!(matches!(nul, Err(Error::Database(_))), "{nul:?}");
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, 8);
}

#[tokio::test]
async fn concurrent_releases_each_get_their_own_outcome() {
    let (db, repo) = repo(Statements::C1).await;
    let holders = sessions(&repo, "w", 16).await;
    let keys: Vec<String> = (0..16).map(|i| format!("account:{i}")).collect();
    let grants: Vec<Grant> = all_granted(burst_acquire(&repo, &keys, &holders, LONG_TTL_SECS).await);
    // Key 3 is released with key 4's token: stale, and key 3's grant stays.
    let tokens: Vec<i64> = (0..16)
        .map(|i| grants[if i == 3 { 4 } else { i }].fencing_token)
        .collect();
    let before = repo.release_batches();
    let released = join_all(keys.iter().zip(&tokens).map(|(k, t)| repo.release(k, *t))).await;
    let after = repo.release_batches();
    assert!(after.largest > 1, "{}", batched_since(before, after));
    assert_unnested_without_fallback(before, after);
    for (i, r) in released.into_iter().enumerate() {
        assert_eq!(r.unwrap(), i != 3, "{}", keys[i]);
    }
    assert_eq!(
        entry(&db.app, "account:3").await.unwrap().fencing_token,
        grants[3].fencing_token
    );
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, 1);
}

/// Acquires and releases share one bound on statements in flight. The burst queues every acquire
/// before any release, so the acquires' first calls take every slot and the releases' calls find
/// none: they run only because a slot taken for one kind also serves the other's queue (in a paired
/// statement, or offered on when given back); a batcher that looked only at its own queue would
/// leave them waiting for ever, and this test would time out.
#[tokio::test]
async fn releases_queued_while_acquires_hold_every_slot_run_and_both_kinds_share_the_bound() {
    let (db, repo) = repo(Statements::C1).await;
    let n = 16;
    let (holders, held, fresh, grants) = held_and_fresh(&repo, n).await;

    let (acquired, released) = tokio::time::timeout(
        dlock_testkit::wait::WAIT_LIMIT,
        futures::future::join(
            burst_acquire(&repo, &fresh, &holders, LONG_TTL_SECS),
            burst_release(&repo, &held, &grants),
        ),
    )
    .await
    .expect("every call answered");

    for (i, g) in acquired.into_iter().enumerate() {
        assert!(g.unwrap().is_some(), "{} not granted", fresh[i]);
    }
    for (i, r) in released.into_iter().enumerate() {
        assert!(r.unwrap(), "{} not released", held[i]);
    }
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, n as i64);
    let most = repo.most_batches_in_flight();
    assert!(
        (2..=MAX_IN_FLIGHT).contains(&most),
        "{most} statements in flight at once, bound {MAX_IN_FLIGHT}"
    );
    assert!(repo.release_batches().largest > 1, "{:?}", repo.release_batches());
}

#[tokio::test]
async fn batches_run_on_connections_of_their_own_while_every_shared_connection_is_taken() {
    let db = lockdb().await;
    // A shared pool of one connection, taken for the whole burst below (as by a slow admin read):
    // acquires and releases must not need it.
    let shared = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.db.app_url())
        .await
        .unwrap();
    let repo = Repo::with_statements(shared.clone(), Statements::C1);
    let n = 16;
    let holders = sessions(&repo, "w", n).await;
    let sides: [Vec<String>; 2] =
        ["a", "b"].map(|side| (0..n).map(|i| format!("account:{side}:{i}")).collect());
    let taken = shared.acquire().await.unwrap();

    let rounds = async {
        let mut held: Vec<Grant> =
            all_granted(burst_acquire(&repo, &sides[0], &holders, LONG_TTL_SECS).await);
        // Each round releases one side's keys while acquiring the other's: an acquire statement
        // and a release statement in flight at once, on two connections at least.
        for round in 0..4 {
            let (from, to) = (&sides[round % 2], &sides[(round + 1) % 2]);
            let (acquired, released) = futures::future::join(
                burst_acquire(&repo, to, &holders, LONG_TTL_SECS),
                burst_release(&repo, from, &held),
            )
            .await;
            assert!(released.into_iter().all(|r| r.unwrap()), "round {round}");
            held = all_granted(acquired);
        }
    };
    tokio::time::timeout(dlock_testkit::wait::WAIT_LIMIT, rounds)
        .await
        .expect("acquires and releases answered while the shared pool had no free connection");
    drop(taken);

    let (shared_open, own) = repo.connections();
    assert_eq!(shared_open, 1);
    // A batch's connection is kept for the next statement (lock_server::store::postgres::conns),
    // so the batches open no more connections than they ever had statements in flight at once.
    let most = repo.most_batches_in_flight();
    assert!(
        own >= 1 && own as usize <= most && most <= MAX_IN_FLIGHT,
        "{own} connections of the batches' own, {most} statements in flight at most, bound {MAX_IN_FLIGHT}"
    );
}

#[tokio::test]
async fn concurrent_acquires_over_http_are_each_answered_with_their_own_grant() {
    let db = lockdb().await;
    let server = server(&db.db).await;
    let api = Api::new(&server);
    let mut holders = Vec::new();
    for i in 0..24 {
        let owner = format!("w{i}");
        holders.push((owner.clone(), api.open_session(&owner, LONG_TTL_MS).await));
    }
    let keys: Vec<String> = (0..holders.len()).map(|i| format!("account:{i}")).collect();
    let replies = join_all(
        keys.iter()
            .zip(&holders)
            .map(|(k, (owner, s))| api.acquire(k, *s, owner, LONG_TTL_MS)),
    )
    .await;
    let mut tokens = HashSet::new();
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r.status, reqwest::StatusCode::OK, "{r:?}");
        assert_eq!(r.body["lockKey"], json!(format!("account:{i}")));
        assert_eq!(r.body["sessionId"], json!(holders[i].1));
        assert!(tokens.insert(r.token()));
        assert_eq!(
            entry(&db.app, &format!("account:{i}"))
                .await
                .unwrap()
                .fencing_token,
            r.token()
        );
    }
    server.shutdown().await.unwrap();
}

/// Releases and acquires queued together go to lockdb as one statement (`batch::Pair`), and each
/// caller still gets exactly its own outcome: a stale release is refused, a contended acquire is not
/// granted, and lockdb ends as the calls run one by one would leave it.
#[tokio::test]
async fn releases_and_acquires_queued_together_share_statements_and_each_gets_its_own_outcome() {
    let (db, repo) = repo(Statements::C1).await;
    assert!(repo.pairs_batches());
    let n = 16;
    let (holders, held, fresh, grants) = held_and_fresh(&repo, n).await;
    // fresh[5] is held by another session: its acquire in the burst is contended.
    let other = sessions(&repo, "other", 1).await;
    let blocker = repo
        .acquire(&fresh[5], &other[0].0, other[0].1, LONG_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    // held[3] is released with held[4]'s token: stale, and held[3]'s grant stays.
    let mut tokens = grants.clone();
    tokens[3] = grants[4].clone();

    let (before_a, before_r) = (repo.acquire_batches(), repo.release_batches());
    let (released, acquired) = futures::future::join(
        burst_release(&repo, &held, &tokens),
        burst_acquire(&repo, &fresh, &holders, LONG_TTL_SECS),
    )
    .await;
    let (after_a, after_r) = (repo.acquire_batches(), repo.release_batches());
    assert!(
        after_r.paired > before_r.paired,
        "no paired statement: {after_r:?}"
    );
    assert_eq!(after_a.paired - before_a.paired, after_r.paired - before_r.paired);
    assert_unnested_without_fallback(before_a, after_a);
    assert_unnested_without_fallback(before_r, after_r);

    for (i, r) in released.into_iter().enumerate() {
        assert_eq!(r.unwrap(), i != 3, "{}", held[i]);
    }
    let mut tokens_seen = HashSet::new();
    for (i, g) in acquired.into_iter().enumerate() {
        match g.unwrap() {
            None => assert_eq!(i, 5, "{} not granted", fresh[i]),
            Some(g) => {
                assert_ne!(i, 5, "{} granted over a live holder", fresh[i]);
                assert_eq!(
                    (g.owner_id.as_str(), g.session_id),
                    (holders[i].0.as_str(), holders[i].1)
                );
                assert!(g.fencing_token > blocker.fencing_token);
                assert!(
                    tokens_seen.insert(g.fencing_token),
                    "token {} twice",
                    g.fencing_token
                );
                let row = entry(&db.app, &fresh[i]).await.unwrap();
                assert_eq!(row.fencing_token, g.fencing_token, "{}", fresh[i]);
            }
        }
    }
    assert_eq!(
        entry(&db.app, &held[3]).await.unwrap().fencing_token,
        grants[3].fencing_token
    );
    assert_eq!(
        entry(&db.app, &fresh[5]).await.unwrap().fencing_token,
        blocker.fencing_token
    );
    // held[3], fresh[5] (the other session's) and the 15 fresh keys granted.
    assert_eq!(
        count(&db.app, "SELECT count(*) FROM lock_entry").await,
        1 + 1 + 15
    );
}

/// Backends of this test's lockdb waiting for a row lock.
async fn lock_waits(db: &Db) -> i64 {
    count(
        &db.admin,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await
}

/// Two paired statements whose keys cross: the first acquires B and C and releases A, and stops in
/// flight after it took B's row (C's row is locked from outside); then an acquire of A and a release
/// of B are queued. Paired at once, they would take A's row and wait for B's, while the first, once
/// C is let go, waits for A's: a deadlock, which PostgreSQL breaks after `deadlock_timeout` by
/// refusing one statement (its calls are then run alone, a fallback). The rule — a paired
/// statement never shares a key with a statement in flight — keeps the second burst queued until
/// the first statement ends. `Err` names the deadlock.
async fn scenario_crossing_pairs(db: &Db, repo: &Repo) -> Result<(), String> {
    let s = sessions(repo, "x", 5).await;
    let [a, b, c] = ["account:a", "account:b", "account:c"].map(str::to_owned);
    let mut grants = Vec::new();
    for (key, (owner, session)) in [&a, &b, &c].into_iter().zip(&s) {
        grants.push(
            repo.acquire(key, owner, *session, LONG_TTL_SECS)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let mut outside = db.app.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM lock_entry WHERE lock_key = $1 FOR UPDATE")
        .bind(&c)
        .execute(&mut *outside)
        .await
        .unwrap();

    let before = repo.release_batches();
    let (r, (b1, c1, s3)) = (repo.clone(), (b.clone(), c.clone(), s[3].clone()));
    let (a1, token_a) = (a.clone(), grants[0].fencing_token);
    let first = tokio::spawn(async move {
        futures::future::join3(
            r.acquire(&b1, &s3.0, s3.1, LONG_TTL_SECS),
            r.acquire(&c1, &s3.0, s3.1, LONG_TTL_SECS),
            r.release(&a1, token_a),
        )
        .await
    });
    dlock_testkit::wait::wait_until("the first paired statement waiting for C's row", || async {
        lock_waits(db).await == 1
    })
    .await;
    assert_eq!(repo.release_batches().paired, before.paired + 1);

    let queued = repo.acquire_batches();
    let (r, (a2, b2, s4)) = (repo.clone(), (a.clone(), b.clone(), s[4].clone()));
    let token_b = grants[1].fencing_token;
    let second = tokio::spawn(async move {
        futures::future::join(
            r.acquire(&a2, &s4.0, s4.1, LONG_TTL_SECS),
            r.release(&b2, token_b),
        )
        .await
    });
    // Either a slot took the second burst (into a statement of its own), or it found its keys held
    // and left it queued.
    dlock_testkit::wait::wait_until("the second burst taken or left queued", || async {
        let now = repo.acquire_batches();
        now.calls > queued.calls || now.blocked > queued.blocked
    })
    .await;
    if repo.acquire_batches().calls > queued.calls {
        dlock_testkit::wait::wait_until("the second statement waiting for B's row", || async {
            lock_waits(db).await == 2
        })
        .await;
    }
    outside.rollback().await.unwrap();

    let (acquired_b, acquired_c, released_a) = first.await.unwrap();
    let (acquired_a, released_b) = second.await.unwrap();
    let after = repo.release_batches();
    if after.fallbacks > before.fallbacks {
        // The refused statement's calls ran after the other's: another order, as valid, so its
        // outcomes are not checked below.
        return Err(format!(
            "deadlock: {} statement(s) refused and run again call by call ({after:?})",
            after.fallbacks - before.fallbacks
        ));
    }
    // The first statement, then the second: B and C held by others when acquired, A released;
    // then A free and B released by its holder.
    assert!(acquired_b.unwrap().is_none() && acquired_c.unwrap().is_none());
    assert!(released_a.unwrap() && released_b.unwrap());
    assert!(acquired_a.unwrap().is_some());
    Ok(())
}

#[tokio::test]
async fn a_paired_statement_never_shares_a_key_with_a_statement_in_flight() {
    let (db, repo) = repo(Statements::C1).await;
    scenario_crossing_pairs(&db, &repo).await.expect("no deadlock");
    assert!(repo.acquire_batches().blocked > 0, "{:?}", repo.acquire_batches());
}

#[tokio::test]
async fn control_pairs_over_held_keys_deadlock() {
    let db = lockdb().await;
    let bad = Repo::with_batch_faults(
        db.app.clone(),
        BatchFaults {
            pair_over_held_keys: true,
        },
    );
    let violation = scenario_crossing_pairs(&db, &bad)
        .await
        .expect_err("paired statements over held keys must deadlock");
    eprintln!("negative control reported: {violation}");
    assert!(violation.contains("deadlock"), "{violation}");
}

// ---- negative controls, batched ----------------------------------------------------------------

/// `n` keys held with a short lease by one set of sessions, lapsed by the database clock, then taken
/// over in one burst by another: every takeover token must be strictly higher than the dead one.
async fn scenario_batched_takeover(repo: &Repo, n: usize) -> Result<(), String> {
    let dead = sessions(repo, "dead", n).await;
    let live = sessions(repo, "live", n).await;
    let keys: Vec<String> = (0..n).map(|i| format!("account:{i}")).collect();
    let old: Vec<Grant> = all_granted(burst_acquire(repo, &keys, &dead, SHORT_TTL_SECS).await);
    for k in &keys {
        await_lease_lapsed(repo.pool(), k).await;
    }
    let before = repo.acquire_batches();
    let new = burst_acquire(repo, &keys, &live, LONG_TTL_SECS).await;
    let after = repo.acquire_batches();
    assert!(after.largest > 1, "{}", batched_since(before, after));
    assert_unnested_without_fallback(before, after);
    let mut violations = Vec::new();
    for (i, g) in new.into_iter().enumerate() {
        let g = g.unwrap().ok_or(format!("{} was not taken over", keys[i]))?;
        if g.fencing_token <= old[i].fencing_token {
            violations.push(format!(
                "{}: takeover token {} is not strictly higher than the dead holder's {}",
                keys[i], g.fencing_token, old[i].fencing_token
            ));
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

/// As [`scenario_batched_takeover`], then the dead holders release in one burst: every release must
/// be stale and every live grant intact. `alongside`: the live holders acquire as many other keys in
/// the same burst, so that the releases run in statements paired with acquires.
async fn scenario_batched_stale_release(repo: &Repo, n: usize, alongside: bool) -> Result<(), String> {
    let dead = sessions(repo, "dead", n).await;
    let live = sessions(repo, "live", n).await;
    let keys: Vec<String> = (0..n).map(|i| format!("account:{i}")).collect();
    let old: Vec<Grant> = all_granted(burst_acquire(repo, &keys, &dead, SHORT_TTL_SECS).await);
    for k in &keys {
        await_lease_lapsed(repo.pool(), k).await;
    }
    let new: Vec<Grant> = burst_acquire(repo, &keys, &live, LONG_TTL_SECS)
        .await
        .into_iter()
        .map(|g| g.unwrap().expect("taken over"))
        .collect();
    let before = repo.release_batches();
    let released = if alongside {
        let others: Vec<String> = (0..n).map(|i| format!("account:other:{i}")).collect();
        let (released, acquired) = futures::future::join(
            burst_release(repo, &keys, &old),
            burst_acquire(repo, &others, &live, LONG_TTL_SECS),
        )
        .await;
        assert!(acquired.into_iter().all(|g| g.unwrap().is_some()));
        let after = repo.release_batches();
        assert!(after.paired > before.paired, "no paired statement: {after:?}");
        released
    } else {
        burst_release(repo, &keys, &old).await
    };
    let after = repo.release_batches();
    assert!(after.largest > 1, "{}", batched_since(before, after));
    assert_unnested_without_fallback(before, after);
    let mut violations = Vec::new();
    for (i, r) in released.into_iter().enumerate() {
        let released = r.unwrap();
        let current = entry(repo.pool(), &keys[i]).await;
        let intact = current
            .as_ref()
            .is_some_and(|e| e.fencing_token == new[i].fencing_token && e.session_id == live[i].1);
        if released || !intact {
            violations.push(format!(
                "{}: stale release by token {} returned released={released}; the live grant (token {}) is now {current:?}",
                keys[i], old[i].fencing_token, new[i].fencing_token
            ));
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

#[tokio::test]
async fn control_batched_acquire_without_nextval_in_do_update_breaks_strictly_higher_takeover_tokens() {
    let (_db, good) = repo(Statements::C1).await;
    scenario_batched_takeover(&good, 8)
        .await
        .expect("C1 holds batched");
    let (_db, bad) = repo(acquire_without_nextval_in_update()).await;
    let violation = scenario_batched_takeover(&bad, 8)
        .await
        .expect_err("the broken acquire must violate strictly-higher takeover tokens when batched");
    eprintln!("negative control reported: {violation}");
    assert!(violation.contains("not strictly higher"), "{violation}");
}

#[tokio::test]
async fn control_batched_release_by_key_alone_deletes_the_live_grants() {
    for alongside in [false, true] {
        let (_db, good) = repo(Statements::C1).await;
        scenario_batched_stale_release(&good, 8, alongside)
            .await
            .expect("C1 holds batched");
        let (_db, bad) = repo(release_by_key_alone()).await;
        let violation = scenario_batched_stale_release(&bad, 8, alongside)
            .await
            .expect_err("the broken release must delete the live grants when batched");
        eprintln!("negative control reported (paired with acquires: {alongside}): {violation}");
        assert!(
            violation.contains("released=true") && violation.contains("None"),
            "{violation}"
        );
    }
}

/// A batch's connection, given back after its statement, serves the next statement (the same
/// PostgreSQL backend, with no pool in between) and a caller already waiting for the pool's only
/// connection: a kept connection is out of the pool's sight, so without the wake-up that caller
/// would wait until the pool's acquire timeout, here longer than the test's limit.
#[tokio::test]
async fn a_kept_connection_serves_the_next_statement_and_a_caller_waiting_on_the_pool() {
    use lock_server::store::postgres::conns::Conns;
    use std::sync::Arc;
    let db = lockdb().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(dlock_testkit::wait::WAIT_LIMIT * 2)
        .connect(&db.db.app_url())
        .await
        .unwrap();
    let conns = Arc::new(Conns::new(pool));
    let backend = "SELECT pg_backend_pid()";
    let mut first = conns.take().await.unwrap();
    let pid: i32 = sqlx::query_scalar(backend).fetch_one(first.conn()).await.unwrap();
    conns.give_back(first);
    let mut again = conns.take().await.unwrap();
    let same: i32 = sqlx::query_scalar(backend).fetch_one(again.conn()).await.unwrap();
    assert_eq!(same, pid, "the next statement ran on another connection");

    let waiting = tokio::spawn({
        let conns = conns.clone();
        async move { conns.take().await }
    });
    // The waiter is parked on the pool (its only connection is out) before this one comes back.
    tokio::task::yield_now().await;
    conns.give_back(again);
    let mut theirs = tokio::time::timeout(dlock_testkit::wait::WAIT_LIMIT, waiting)
        .await
        .expect("the waiting caller got the kept connection")
        .unwrap()
        .unwrap();
    let theirs_pid: i32 = sqlx::query_scalar(backend)
        .fetch_one(theirs.conn())
        .await
        .unwrap();
    assert_eq!(theirs_pid, pid);
    conns.give_back(theirs);
    tokio::time::timeout(dlock_testkit::wait::WAIT_LIMIT, conns.close())
        .await
        .expect("close gave the kept connection back to the pool");
}
