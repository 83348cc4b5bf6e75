//! Negative controls for the pause-and-takeover scenario: the same scenario that passes with the real
//! client against the contract's statements must report a violation when one piece is broken — the
//! client's local deadline, the takeover's fresh token, or the token in the release predicate.
//! If a broken variant passed, the scenario would prove nothing.

mod common;

use std::time::Duration;

use common::*;
use lock_server::Statements;

const SHORT: Duration = Duration::from_millis(300);

/// `c1` with `clause` removed (it must be there).
fn without(c1: &'static str, clause: &str) -> &'static str {
    assert!(c1.contains(clause), "clause {clause:?} not found in {c1}");
    Box::leak(c1.replacen(clause, "", 1).into_boxed_str())
}

/// C1's acquire without `fencing_token = nextval(...)` in DO UPDATE: a takeover keeps the old token.
fn acquire_without_nextval_in_update() -> Statements {
    Statements {
        acquire: without(
            lock_server::sql::ACQUIRE,
            "       fencing_token = nextval('fencing_token_seq'),\n",
        ),
        ..Statements::C1
    }
}

/// C1's release without the token in its predicate (the token is still bound, unused).
fn release_by_key_alone() -> Statements {
    Statements {
        release: without(lock_server::sql::RELEASE, "\n   AND fencing_token = $2"),
        ..Statements::C1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_local_deadline_still_believes_it_holds_the_lock() {
    let env = Env::start().await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;

    // Control: the real handle.
    let h1 = s1
        .acquire("account:real", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    pause_and_takeover(&env, h1, &s2, "account:real")
        .await
        .expect("the real client holds the invariant");

    // Broken: a holder that trusts its grant until a server answer says otherwise.
    let naive = naive_holder(&env, &s1, "account:naive", SHORT).await;
    let violation = pause_and_takeover(&env, naive, &s2, "account:naive")
        .await
        .expect_err("a client without a deadline must be caught believing in a lost lock");
    assert!(violation.contains("still believes it holds"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_without_nextval_in_do_update_hands_out_the_old_token() {
    let env = Env::start_with(acquire_without_nextval_in_update()).await;
    let s1 = env.session("paused").await;
    let s2 = env.session("successor").await;
    let h1 = s1
        .acquire("account:broken", SHORT, Duration::ZERO)
        .await
        .expect("granted");
    let violation = pause_and_takeover(&env, h1, &s2, "account:broken")
        .await
        .expect_err("the broken acquire must be caught");
    assert!(violation.contains("not strictly higher"), "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_by_key_alone_lets_the_stale_holder_delete_the_new_grant() {
    let env = Env::start_with(release_by_key_alone()).await;
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
