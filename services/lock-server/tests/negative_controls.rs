//! Negative controls (NFR-07): each safety scenario is run twice, once with C1's statements (the
//! invariant holds) and once with one clause deleted from one statement (the invariant must be
//! reported violated). If a broken variant passed, the scenario would prove nothing.

mod common;

use common::*;
use lock_server::{Repo, Statements};

async fn repos(broken: Statements) -> (Db, Repo, Repo) {
    let db = lockdb().await;
    let good = Repo::new(db.app.clone());
    let bad = Repo::with_statements(db.app.clone(), broken);
    (db, good, bad)
}

#[test]
fn broken_variants_differ_from_c1_in_exactly_the_named_field() {
    let a = acquire_without_nextval_in_update();
    assert_ne!(a.acquire, Statements::C1.acquire);
    assert_eq!(
        Statements {
            acquire: Statements::C1.acquire,
            ..a
        },
        Statements::C1
    );
    // The VALUES branch still draws from the sequence: only the DO UPDATE one is gone.
    assert_eq!(a.acquire.matches("nextval('fencing_token_seq')").count(), 1);

    let r = release_by_key_alone();
    assert_eq!(
        Statements {
            release: Statements::C1.release,
            ..r
        },
        Statements::C1
    );
    assert!(!r.release.contains("fencing_token ="));

    let n = renew_without_expiry_check();
    assert_eq!(
        Statements {
            renew: Statements::C1.renew,
            ..n
        },
        Statements::C1
    );
    assert!(!n.renew.contains("> now()"));
}

/// (i) Acquire without `fencing_token = nextval(...)` in DO UPDATE: the takeover keeps the dead
/// holder's token.
#[tokio::test]
async fn control_acquire_without_nextval_in_do_update_breaks_strictly_higher_takeover_tokens() {
    let (_db, good, bad) = repos(acquire_without_nextval_in_update()).await;
    let (t1, t2) = scenario_takeover_token(&good, "account:c1")
        .await
        .expect("C1 holds");
    assert!(t2 > t1);
    let violation = scenario_takeover_token(&bad, "account:broken")
        .await
        .expect_err("the broken acquire must violate strictly-higher takeover tokens");
    eprintln!("negative control reported: {violation}");
    assert!(violation.contains("not strictly higher"), "{violation}");
}

/// (ii) Release by key alone: a paused holder's stale release deletes the current holder's grant.
#[tokio::test]
async fn control_release_by_key_alone_deletes_the_current_holders_grant() {
    let (_db, good, bad) = repos(release_by_key_alone()).await;
    scenario_stale_release(&good, "account:c1")
        .await
        .expect("C1 holds");
    let violation = scenario_stale_release(&bad, "account:broken")
        .await
        .expect_err("the broken release must delete the current holder's grant");
    eprintln!("negative control reported: {violation}");
    assert!(
        violation.contains("released=true") && violation.contains("None"),
        "{violation}"
    );
}

/// (iii) Renew without `expires_at > now()`: a lapsed lease is renewed (resurrected).
#[tokio::test]
async fn control_renew_without_expiry_check_resurrects_a_lapsed_lease() {
    let (_db, good, bad) = repos(renew_without_expiry_check()).await;
    scenario_lapsed_renew(&good, "account:c1")
        .await
        .expect("C1 holds");
    let violation = scenario_lapsed_renew(&bad, "account:broken")
        .await
        .expect_err("the broken renew must resurrect the lapsed lease");
    eprintln!("negative control reported: {violation}");
    assert!(violation.contains("Some("), "{violation}");
}

/// (i) again, end to end: the two-worker pause-and-return over HTTP against a server running the
/// broken acquire. With equal tokens the returning W1 can renew and then release W2's grant.
#[tokio::test]
async fn control_pause_and_return_over_http_fails_with_the_broken_acquire() {
    let db = lockdb().await;
    let good = lock_server::spawn(config(&db.db)).await.unwrap();
    scenario_pause_and_return(&Api::new(&good), &db.admin, "account:c1")
        .await
        .expect("C1 holds");
    good.shutdown().await.unwrap();

    let bad = lock_server::spawn_with_statements(config(&db.db), acquire_without_nextval_in_update())
        .await
        .unwrap();
    let violation = scenario_pause_and_return(&Api::new(&bad), &db.admin, "account:broken")
        .await
        .expect_err("the broken acquire must let the returning holder through");
    eprintln!("negative control reported: {violation}");
    assert!(violation.contains("not strictly higher"), "{violation}");
    assert!(violation.contains("W1's renew"), "{violation}");
    bad.shutdown().await.unwrap();
}

/// (ii) again, end to end over HTTP: the returning holder's release takes W2's grant away.
#[tokio::test]
async fn control_pause_and_return_over_http_fails_with_release_by_key_alone() {
    let db = lockdb().await;
    let bad = lock_server::spawn_with_statements(config(&db.db), release_by_key_alone())
        .await
        .unwrap();
    let violation = scenario_pause_and_return(&Api::new(&bad), &db.admin, "account:broken")
        .await
        .expect_err("the broken release must delete W2's grant");
    eprintln!("negative control reported: {violation}");
    assert!(violation.contains("W2's grant"), "{violation}");
    bad.shutdown().await.unwrap();
}
