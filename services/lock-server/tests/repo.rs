//! C1 §1.2–1.4 and §1.7 at the SQL level: lock-server's repository against a real PostgreSQL 16
//! lockdb, connected as lockapp. Each test gets a fresh migrated database.

mod common;

use common::*;
use lock_server::store::{Revocation, Revoked};
use lock_server::{Error, Repo};
use uuid::Uuid;

async fn repo() -> (Db, Repo) {
    let db = lockdb().await;
    let repo = Repo::new(db.app.clone());
    (db, repo)
}

// ---- acquire: every row of C1 §1.3's table -----------------------------------------------------

#[tokio::test]
async fn acquire_free_key_is_granted() {
    let (db, repo) = repo().await;
    let s = session(&repo, "w1").await;
    let g = repo
        .acquire("account:1", "w1", s, LONG_TTL_SECS)
        .await
        .unwrap()
        .expect("granted");
    assert!(g.fencing_token > 0);
    assert_eq!((g.owner_id.as_str(), g.session_id), ("w1", s));
    assert!(g.expires_at > g.acquired_at);
    let row = entry(&db.app, "account:1").await.unwrap();
    assert_eq!(row.fencing_token, g.fencing_token);
}

#[tokio::test]
async fn acquire_takes_over_a_genuinely_expired_lease_with_a_strictly_higher_token() {
    let (db, repo) = repo().await;
    let (t1, t2) = scenario_takeover_token(&repo, "account:1").await.unwrap();
    assert!(t2 > t1);
    let row = entry(&db.app, "account:1").await.unwrap();
    assert_eq!((row.owner_id.as_str(), row.fencing_token), ("w2", t2));
}

#[tokio::test]
async fn acquire_same_session_reentry_is_granted_with_a_new_higher_token() {
    let (db, repo) = repo().await;
    let s = session(&repo, "w1").await;
    let g1 = repo.acquire("k", "w1", s, LONG_TTL_SECS).await.unwrap().unwrap();
    let g2 = repo
        .acquire("k", "w1", s, LONG_TTL_SECS)
        .await
        .unwrap()
        .expect("re-entry granted");
    assert!(g2.fencing_token > g1.fencing_token);
    assert_eq!(entry(&db.app, "k").await.unwrap().fencing_token, g2.fencing_token);
    // The old token is void: renew with it fails, release with it is stale.
    assert!(
        repo.renew("k", g1.fencing_token, LONG_TTL_SECS)
            .await
            .unwrap()
            .is_none()
    );
    assert!(!repo.release("k", g1.fencing_token).await.unwrap());
}

#[tokio::test]
async fn acquire_held_by_a_live_different_holder_is_contended_and_changes_nothing() {
    let (db, repo) = repo().await;
    let s1 = session(&repo, "w1").await;
    let s2 = session(&repo, "w2").await;
    let g1 = repo.acquire("k", "w1", s1, LONG_TTL_SECS).await.unwrap().unwrap();
    let before = entry(&db.app, "k").await.unwrap();
    // A different session, and the same owner id in a different session: both contended.
    assert!(
        repo.acquire("k", "w2", s2, LONG_TTL_SECS)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        repo.acquire("k", "w1", s2, LONG_TTL_SECS)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(entry(&db.app, "k").await.unwrap(), before);
    assert_eq!(before.fencing_token, g1.fencing_token);
}

#[tokio::test]
async fn acquire_with_an_unknown_session_is_session_gone() {
    let (db, repo) = repo().await;
    let r = repo.acquire("k", "w1", Uuid::new_v4(), LONG_TTL_SECS).await;
    assert!(matches!(r, Err(Error::SessionGone)), "{r:?}");
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, 0);
}

// ---- renew / release / heartbeat: every row of C1 §1.4's table ---------------------------------

#[tokio::test]
async fn renew_of_a_live_lease_extends_it() {
    let (db, repo) = repo().await;
    let s = session(&repo, "w1").await;
    let g = repo.acquire("k", "w1", s, 30.0).await.unwrap().unwrap();
    let r = repo
        .renew("k", g.fencing_token, LONG_TTL_SECS)
        .await
        .unwrap()
        .expect("renewed");
    assert_eq!(r.fencing_token, g.fencing_token);
    assert!(r.expires_at > g.expires_at);
    assert_eq!(entry(&db.app, "k").await.unwrap().expires_at, r.expires_at);
}

#[tokio::test]
async fn renew_fails_when_the_lease_lapsed_by_a_millisecond_and_does_not_resurrect_it() {
    let (_db, repo) = repo().await;
    scenario_lapsed_renew(&repo, "k").await.unwrap();
}

#[tokio::test]
async fn renew_by_an_older_token_after_takeover_fails_and_leaves_the_new_grant_alone() {
    let (db, repo) = repo().await;
    let s1 = session(&repo, "w1").await;
    let s2 = session(&repo, "w2").await;
    let g1 = repo
        .acquire("k", "w1", s1, SHORT_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    await_lease_lapsed(&db.app, "k").await;
    let g2 = repo.acquire("k", "w2", s2, LONG_TTL_SECS).await.unwrap().unwrap();
    let before = entry(&db.app, "k").await.unwrap();
    assert!(
        repo.renew("k", g1.fencing_token, LONG_TTL_SECS)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(entry(&db.app, "k").await.unwrap(), before);
    assert_eq!(before.fencing_token, g2.fencing_token);
}

#[tokio::test]
async fn release_by_the_holder_deletes_the_grant() {
    let (db, repo) = repo().await;
    let s = session(&repo, "w1").await;
    let g = repo.acquire("k", "w1", s, LONG_TTL_SECS).await.unwrap().unwrap();
    assert!(repo.release("k", g.fencing_token).await.unwrap());
    assert!(entry(&db.app, "k").await.is_none());
    // Releasing again is stale, not an error.
    assert!(!repo.release("k", g.fencing_token).await.unwrap());
}

#[tokio::test]
async fn stale_release_does_not_remove_the_current_holders_grant() {
    let (_db, repo) = repo().await;
    scenario_stale_release(&repo, "k").await.unwrap();
}

#[tokio::test]
async fn release_with_a_token_of_another_key_is_stale() {
    let (db, repo) = repo().await;
    let s = session(&repo, "w1").await;
    let a = repo.acquire("a", "w1", s, LONG_TTL_SECS).await.unwrap().unwrap();
    let b = repo.acquire("b", "w1", s, LONG_TTL_SECS).await.unwrap().unwrap();
    assert!(!repo.release("b", a.fencing_token).await.unwrap());
    assert_eq!(entry(&db.app, "b").await.unwrap().fencing_token, b.fencing_token);
}

#[tokio::test]
async fn heartbeat_extends_a_live_session() {
    let (db, repo) = repo().await;
    let s = repo.create_session("w1", 30.0).await.unwrap();
    let e = repo
        .heartbeat(s.session_id, LONG_TTL_SECS)
        .await
        .unwrap()
        .expect("extended");
    assert!(e > s.expires_at);
    let stored: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM lock_session WHERE session_id = $1")
            .bind(s.session_id)
            .fetch_one(&db.app)
            .await
            .unwrap();
    assert_eq!(stored, e);
}

#[tokio::test]
async fn heartbeat_on_a_reaped_session_finds_zero_rows() {
    let (db, repo) = repo().await;
    let s = repo
        .create_session("w1", SHORT_TTL_SECS)
        .await
        .unwrap()
        .session_id;
    await_session_lapsed(&db.app, s).await;
    // Lapsed but not yet reaped: already zero rows (expires_at > now() is false).
    assert!(repo.heartbeat(s, LONG_TTL_SECS).await.unwrap().is_none());
    assert_eq!(repo.reap().await.unwrap(), 1);
    assert!(repo.heartbeat(s, LONG_TTL_SECS).await.unwrap().is_none());
    assert!(
        repo.heartbeat(Uuid::new_v4(), LONG_TTL_SECS)
            .await
            .unwrap()
            .is_none()
    );
}

// ---- tokens: one global sequence (C1 §1.7) -----------------------------------------------------

#[tokio::test]
async fn tokens_strictly_increase_across_release_reacquire_and_across_keys() {
    let (_db, repo) = repo().await;
    let s1 = session(&repo, "w1").await;
    let s2 = session(&repo, "w2").await;
    let mut seen = Vec::new();
    for round in 0..5 {
        for (key, s, owner) in [("a", s1, "w1"), ("b", s2, "w2"), ("a", s2, "w2"), ("c", s1, "w1")] {
            let g = repo
                .acquire(key, owner, s, LONG_TTL_SECS)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: {key} not granted"));
            assert!(repo.release(key, g.fencing_token).await.unwrap());
            seen.push((key, g.fencing_token));
        }
    }
    for pair in seen.windows(2) {
        assert!(pair[1].1 > pair[0].1, "tokens not strictly increasing: {seen:?}");
    }
}

// ---- sessions: close cascades, the reaper ------------------------------------------------------

#[tokio::test]
async fn closing_a_session_releases_its_locks_by_cascade() {
    let (db, repo) = repo().await;
    let s1 = session(&repo, "w1").await;
    let s2 = session(&repo, "w2").await;
    repo.acquire("a", "w1", s1, LONG_TTL_SECS).await.unwrap().unwrap();
    repo.acquire("b", "w1", s1, LONG_TTL_SECS).await.unwrap().unwrap();
    let other = repo.acquire("c", "w2", s2, LONG_TTL_SECS).await.unwrap().unwrap();
    assert!(repo.close_session(s1).await.unwrap());
    assert!(entry(&db.app, "a").await.is_none());
    assert!(entry(&db.app, "b").await.is_none());
    assert_eq!(
        entry(&db.app, "c").await.unwrap().fencing_token,
        other.fencing_token
    );
    assert!(
        !repo.close_session(s1).await.unwrap(),
        "second close finds nothing"
    );
}

#[tokio::test]
async fn the_reaper_deletes_expired_sessions_and_their_locks_only() {
    let (db, repo) = repo().await;
    let short = repo
        .create_session("w1", SHORT_TTL_SECS)
        .await
        .unwrap()
        .session_id;
    let long = session(&repo, "w2").await;
    repo.acquire("a", "w1", short, LONG_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    let kept = repo
        .acquire("b", "w2", long, LONG_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    await_session_lapsed(&db.app, short).await;
    assert_eq!(repo.reap().await.unwrap(), 1);
    assert!(
        entry(&db.app, "a").await.is_none(),
        "the lapsed session's lock went with it"
    );
    assert_eq!(
        entry(&db.app, "b").await.unwrap().fencing_token,
        kept.fencing_token
    );
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_session").await, 1);
    assert_eq!(repo.reap().await.unwrap(), 0);
}

// ---- mutual exclusion under concurrency --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_acquirers_of_one_key_get_exactly_one_grant() {
    let (db, repo) = repo().await;
    let mut sessions = Vec::new();
    for i in 0..32 {
        sessions.push((format!("w{i}"), session(&repo, &format!("w{i}")).await));
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = sessions
        .into_iter()
        .map(|(owner, s)| {
            let repo = repo.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                repo.acquire("hot", &owner, s, LONG_TTL_SECS)
                    .await
                    .unwrap()
                    .map(|g| (owner, g))
            })
        })
        .collect();
    let mut grants = Vec::new();
    for t in futures::future::join_all(tasks).await {
        if let Some(g) = t.unwrap() {
            grants.push(g);
        }
    }
    assert_eq!(grants.len(), 1, "exactly one grant: {grants:?}");
    let row = entry(&db.app, "hot").await.unwrap();
    assert_eq!(
        (row.owner_id.as_str(), row.fencing_token),
        (grants[0].0.as_str(), grants[0].1.fencing_token)
    );
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_entry").await, 1);
}

// ---- force-revoke ------------------------------------------------------------------------------

#[tokio::test]
async fn revoke_deletes_the_live_grant_and_appends_one_audit_row() {
    let (db, repo) = repo().await;
    let s = session(&repo, "w1").await;
    let g = repo.acquire("k", "w1", s, LONG_TTL_SECS).await.unwrap().unwrap();
    let r = repo
        .revoke("k", "ops@example", "stuck holder")
        .await
        .unwrap()
        .expect("revoked");
    assert_eq!((r.owner_id.as_str(), r.fencing_token), ("w1", g.fencing_token));
    assert!(entry(&db.app, "k").await.is_none());
    let audit: (String, String, i64, String, String) =
        sqlx::query_as("SELECT lock_key, prev_owner, prev_token, operator, reason FROM lock_revocation")
            .fetch_one(&db.app)
            .await
            .unwrap();
    assert_eq!(
        audit,
        (
            "k".into(),
            "w1".into(),
            g.fencing_token,
            "ops@example".into(),
            "stuck holder".into()
        )
    );
    // The revoked holder's renew fails; a second revoke finds nothing and writes nothing.
    assert!(
        repo.renew("k", g.fencing_token, LONG_TTL_SECS)
            .await
            .unwrap()
            .is_none()
    );
    assert!(repo.revoke("k", "ops", "again").await.unwrap().is_none());
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 1);
}

#[tokio::test]
async fn revoke_of_a_free_or_lapsed_key_is_not_held_and_writes_nothing() {
    let (db, repo) = repo().await;
    assert!(repo.revoke("free", "ops", "r").await.unwrap().is_none());
    let s = session(&repo, "w1").await;
    repo.acquire("lapsed", "w1", s, SHORT_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    await_lease_lapsed(&db.app, "lapsed").await;
    assert!(repo.revoke("lapsed", "ops", "r").await.unwrap().is_none());
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 0);
}

// ---- force-revoke pinned to a token ------------------------------------------------------------

#[tokio::test]
async fn pinned_revoke_answers_each_outcome_and_writes_only_when_it_revokes() {
    let (db, repo) = repo().await;
    assert_eq!(
        repo.revoke_pinned("free", 7, "ops", "r").await.unwrap(),
        Revocation::NotHeld
    );
    let s1 = session(&repo, "w1").await;
    let g1 = repo.acquire("k", "w1", s1, LONG_TTL_SECS).await.unwrap().unwrap();
    // Another token than the live one: the holder is left alone.
    assert_eq!(
        repo.revoke_pinned("k", g1.fencing_token + 1000, "ops", "r")
            .await
            .unwrap(),
        Revocation::HeldByOtherToken {
            current_token: g1.fencing_token
        }
    );
    assert_eq!(entry(&db.app, "k").await.unwrap().fencing_token, g1.fencing_token);
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 0);

    let want = Revoked {
        owner_id: "w1".into(),
        fencing_token: g1.fencing_token,
    };
    assert_eq!(
        repo.revoke_pinned("k", g1.fencing_token, "ops", "stuck")
            .await
            .unwrap(),
        Revocation::Revoked(want.clone())
    );
    assert!(entry(&db.app, "k").await.is_none());
    // The same request again (a retry): recognised from the audit row, nothing more written.
    assert_eq!(
        repo.revoke_pinned("k", g1.fencing_token, "ops", "stuck")
            .await
            .unwrap(),
        Revocation::AlreadyRevoked(want)
    );
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 1);

    // A lapsed grant at that very token is nobody's: NOT_HELD, nothing written.
    let g2 = repo
        .acquire("lapsed", "w1", s1, SHORT_TTL_SECS)
        .await
        .unwrap()
        .unwrap();
    await_lease_lapsed(&db.app, "lapsed").await;
    assert_eq!(
        repo.revoke_pinned("lapsed", g2.fencing_token, "ops", "r")
            .await
            .unwrap(),
        Revocation::NotHeld
    );
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 1);
}

/// How a revoke is retried in [`scenario_revoke_retried_after_a_crash`].
#[derive(Clone, Copy)]
enum RetryForm {
    Pinned,
    /// The unsafe form: "whatever is live now".
    Unpinned,
}

/// An operator revokes w1's grant, crashes before recording that it did, w2 acquires the key, and the
/// operator retries the same request. Err when the retry removed w2's newer grant.
async fn scenario_revoke_retried_after_a_crash(db: &Db, repo: &Repo, retry: RetryForm) -> Result<(), String> {
    let s1 = session(repo, "w1").await;
    let t1 = repo
        .acquire("account:3", "w1", s1, LONG_TTL_SECS)
        .await
        .unwrap()
        .unwrap()
        .fencing_token;
    // The operator read t1 and revoked exactly that grant; then it died.
    let first = repo.revoke_pinned("account:3", t1, "ops", "stuck").await.unwrap();
    assert!(matches!(first, Revocation::Revoked(_)), "{first:?}");
    let s2 = session(repo, "w2").await;
    let t2 = repo
        .acquire("account:3", "w2", s2, LONG_TTL_SECS)
        .await
        .unwrap()
        .unwrap()
        .fencing_token;
    match retry {
        RetryForm::Pinned => {
            let again = repo.revoke_pinned("account:3", t1, "ops", "stuck").await.unwrap();
            assert!(matches!(again, Revocation::AlreadyRevoked(_)), "{again:?}");
        }
        RetryForm::Unpinned => {
            repo.revoke("account:3", "ops", "stuck").await.unwrap();
        }
    }
    match entry(&db.app, "account:3").await {
        Some(row) if row.fencing_token == t2 => Ok(()),
        other => Err(format!(
            "the retry removed the newer holder's grant {t2}: {other:?}"
        )),
    }
}

#[tokio::test]
async fn a_pinned_revoke_retried_after_a_crash_leaves_the_newer_holder_alone() {
    let (db, repo) = repo().await;
    scenario_revoke_retried_after_a_crash(&db, &repo, RetryForm::Pinned)
        .await
        .unwrap();
    assert_eq!(count(&db.app, "SELECT count(*) FROM lock_revocation").await, 1);
}

/// Negative control: the same scenario with the unpinned delete revokes the newer holder.
#[tokio::test]
async fn negative_control_an_unpinned_retry_revokes_the_newer_holder() {
    let (db, repo) = repo().await;
    let r = scenario_revoke_retried_after_a_crash(&db, &repo, RetryForm::Unpinned).await;
    assert!(r.is_err(), "the unpinned retry left the newer holder alone");
}

// ---- the operator read -------------------------------------------------------------------------

#[tokio::test]
async fn read_reports_expired_rows_by_the_database_clock() {
    let (db, repo) = repo().await;
    assert!(repo.read("k").await.unwrap().is_none());
    let s = session(&repo, "w1").await;
    let g = repo.acquire("k", "w1", s, SHORT_TTL_SECS).await.unwrap().unwrap();
    // Read right after acquire may or may not see the 50 ms lease live; after the lapse it must be expired.
    await_lease_lapsed(&db.app, "k").await;
    let row = repo.read("k").await.unwrap().unwrap();
    assert!(row.expired);
    assert_eq!(row.fencing_token, g.fencing_token);
    let live = repo.acquire("k2", "w1", s, LONG_TTL_SECS).await.unwrap().unwrap();
    let row = repo.read("k2").await.unwrap().unwrap();
    assert!(!row.expired);
    assert_eq!(row.fencing_token, live.fencing_token);
}

// ---- lockdb going away -------------------------------------------------------------------------

/// A connection an administrator terminated (as a restore's `DROP DATABASE … WITH (FORCE)` does)
/// answers its next statement with SQLSTATE 57P01: lockdb is unavailable — 503, for the client to
/// retry — not an internal error.
#[tokio::test]
async fn a_statement_on_a_connection_an_administrator_terminated_is_answered_unavailable() {
    let db = lockdb().await;
    let repo = Repo::new(db.db.one_unpinged_app_connection().await);
    let s = session(&repo, "w1").await;
    db.db.terminate_app_connections().await;

    let err = repo.heartbeat(s, LONG_TTL_SECS).await.unwrap_err();
    assert!(
        matches!(&err, Error::Database(sqlx::Error::Database(e)) if e.code().as_deref() == Some("57P01")),
        "{err:?}"
    );
    let answer = dlock_common::ApiError::from(err);
    assert_eq!(
        answer.status,
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.message
    );
    assert_eq!(answer.code, "UNAVAILABLE");
}
