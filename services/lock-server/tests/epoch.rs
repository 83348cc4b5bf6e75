//! Every promotion is a restore (docs/design.md, "Never a reused token"): lock-server grants nothing
//! on a lockdb history it cannot vouch for until it has jumped `fencing_token_seq` above anything
//! that history can have handed out.
//!
//! Each scene runs on PostgreSQL servers of its own (a primary and a streaming standby, a restored
//! base backup, a restored file-system copy) and returns the highest token handed out before and
//! the first one after. With C1's statements the first is above the highest; each negative control
//! runs the same scene without the jump ([`Statements::NO_JUMP`]), or with a jump that lacks one of
//! its parts, and the old token comes back.

mod common;

use std::time::{Duration, Instant};

use dlock_testkit::{History, PgServer, migrated_on};
use dlock_wire::lock::JumpCause;
use lock_server::store::postgres::epoch::{Cause, JUMP, JUMP_LOCK, TIMELINE_BAND};
use lock_server::{Config, Error, Repo, Statements};
use sqlx::PgPool;
use uuid::Uuid;

const TTL_SECS: f64 = 600.0;

/// `c1` with `part` replaced (binds kept), for the controls; panics if `part` is not there.
fn replaced(c1: &'static str, part: &str, by: &str) -> &'static str {
    assert!(c1.contains(part), "{part:?} not in {c1}");
    Box::leak(c1.replacen(part, by, 1).into_boxed_str())
}

/// A lock-server's repository on `url` (what the binary runs: the lazy pool, the batches' own
/// connections vouched for when opened), answering within a second when no connection can be had.
fn repo(url: &str, stmts: Statements) -> Repo {
    let mut config = Config::new(url);
    config.pool_acquire_timeout = Duration::from_secs(1);
    let pool = lock_server::server::pool(&config).expect("pool");
    Repo::with_statements(pool, stmts)
}

fn app_url(server: &PgServer) -> String {
    server.url("lockapp", "lockdb")
}

/// Grants `n` fresh keys (`<prefix>-<i>`) in one session; returns the highest token.
async fn grant_many(repo: &Repo, prefix: &str, n: usize) -> i64 {
    let session = granted(repo.create_session("epoch-test", TTL_SECS).await).session_id;
    let mut highest = 0;
    for i in 0..n {
        let grant = granted(
            repo.acquire(&format!("{prefix}-{i}"), "epoch-test", session, TTL_SECS)
                .await,
        )
        .expect("a fresh key is granted");
        assert!(grant.fencing_token > highest, "tokens rise within one history");
        highest = grant.fencing_token;
    }
    highest
}

fn granted<T>(r: Result<T, Error>) -> T {
    r.unwrap_or_else(|e| panic!("lockdb refused: {e}"))
}

/// Whether lock-server would answer 503 for this failure (lockdb going away or not ready).
fn unavailable(e: &Error) -> bool {
    matches!(e, Error::Database(db) if dlock_common::db::unavailable(db))
}

/// The first grant after lockdb came back: retried while lock-server answers 503 (its connections
/// to the old server are broken, or the jump is not done yet), as a client retries.
async fn first_grant_after(repo: &Repo, key: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = async {
            let session = repo.create_session("epoch-test", TTL_SECS).await?.session_id;
            repo.acquire(key, "epoch-test", session, TTL_SECS).await
        };
        match attempt.await {
            Ok(Some(grant)) => return grant.fencing_token,
            Ok(None) => panic!("{key} is fresh, yet contended"),
            Err(e) if unavailable(&e) && Instant::now() < deadline => {
                // Each failed attempt drops one broken connection; the next opens a new one.
            }
            Err(e) => panic!("no grant after lockdb came back: {e}"),
        }
    }
}

/// The scene: a primary and a streaming standby; the standby stops receiving; lock-server
/// starts on the primary and grants 40 keys; the primary dies; a lock-server pointed at the standby
/// answers 503 while it is in recovery, and grants once it is promoted.
async fn promoted_standby(stmts: Statements) -> (i64, i64, Option<JumpCause>) {
    let mut primary = PgServer::start("epoch-primary").expect("primary");
    migrated_on(&primary, History::Lockdb).await;
    let standby = PgServer::start_standby(&primary, "epoch-standby", &[]).expect("standby");
    standby.hold_behind().expect("hold the standby behind");

    let on_primary = repo(&app_url(&primary), stmts);
    let before = grant_many(&on_primary, "account:before", 40).await;
    on_primary.close().await;

    let on_standby = repo(&app_url(&standby), stmts);
    // In recovery: nothing may be granted, and the answer is 503, not a token.
    let session = on_standby.create_session("epoch-test", TTL_SECS).await;
    let refused = match session {
        Ok(s) => on_standby
            .acquire("account:during", "epoch-test", s.session_id, TTL_SECS)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    let err = refused.expect_err("a standby in recovery grants nothing");
    assert!(unavailable(&err), "503, not {err}");

    primary.crash();
    standby.promote().expect("promote");
    let after = first_grant_after(&on_standby, "account:after").await;
    let cause = on_standby.epochs().last().map(|j| j.cause);
    on_standby.close().await;
    (before, after, cause)
}

#[tokio::test]
async fn a_promoted_standby_that_lacked_the_last_grants_grants_above_them() {
    let (before, after, cause) = promoted_standby(Statements::C1).await;
    assert!(
        after > before,
        "first grant after the promotion {after} <= {before}"
    );
    assert_eq!(
        cause,
        Some(Cause::start.wire()),
        "the standby's lock-server jumped at its start"
    );
    // The promoted standby writes on timeline 2: its tokens start in that timeline's band.
    assert!(after > 2 * TIMELINE_BAND, "{after}");
}

#[tokio::test]
async fn control_without_the_jump_a_promoted_standby_hands_out_token_1_again() {
    let (before, after, cause) = promoted_standby(Statements::NO_JUMP).await;
    assert!(
        after <= before,
        "without the jump the old tokens come back: {after} > {before}"
    );
    assert_eq!(after, 1, "the standby never saw a grant");
    assert_eq!(cause, None);
}

/// Why a floor at all: the primary's own lock-server started after the standby fell behind, so the
/// standby lacks that jump too, and 2^32 above what the standby finds (the jump alone, with neither
/// the timeline's band nor the clock) lands among the primary's tokens.
#[tokio::test]
async fn control_a_jump_of_2_32_above_what_it_finds_alone_lands_among_the_lost_jumps_tokens() {
    let floorless = Statements {
        jump: Some(replaced(
            lock_server::sql::JUMP_SEQUENCE,
            "timeline * $3 + ms * $4",
            "$3 * 0 + $4 * 0",
        )),
        ..Statements::C1
    };
    let (before, after, _) = promoted_standby(floorless).await;
    assert!(after <= before, "{after} > {before}");
}

/// The timeline's band alone covers a promotion: with no help from the clock (a new primary whose
/// clock is behind the old one's), the promoted standby's first token is still above the lost ones.
#[tokio::test]
async fn a_promoted_standby_grants_above_a_lost_jump_by_its_timeline_alone() {
    let clockless = Statements {
        jump: Some(replaced(lock_server::sql::JUMP_SEQUENCE, "ms * $4", "$4 * 0")),
        ..Statements::C1
    };
    let (before, after, _) = promoted_standby(clockless).await;
    assert!(after > before, "{after} <= {before}");
}

/// A lockdb restored from a base backup taken after 10 grants, 100 grants later, under one running
/// lock-server: its connections break, the new ones find a restarted postmaster, and it jumps.
async fn restored_base_backup(stmts: Statements) -> (i64, i64, Option<JumpCause>) {
    let mut primary = PgServer::start("epoch-backup").expect("server");
    migrated_on(&primary, History::Lockdb).await;
    let repo = repo(&app_url(&primary), stmts);
    grant_many(&repo, "account:early", 10).await;
    let backup = primary.base_backup("epoch-base-backup").expect("base backup");
    let before = grant_many(&repo, "account:late", 100).await;
    let (after, cause) = restore_under(&mut primary, &backup, repo).await;
    (before, after, cause)
}

/// Puts `from` back as `primary`'s PGDATA under the running `repo` (shut down, restore, restart),
/// then takes the first grant on the restored history: its token and the cause of the last jump.
async fn restore_under(
    primary: &mut PgServer,
    from: &std::path::Path,
    repo: Repo,
) -> (i64, Option<JumpCause>) {
    primary.shutdown().expect("shutdown");
    primary.restore_pgdata(from).expect("restore");
    primary.restart().expect("restart");
    let after = first_grant_after(&repo, "account:after").await;
    let cause = repo.epochs().last().map(|j| j.cause);
    repo.close().await;
    (after, cause)
}

#[tokio::test]
async fn a_lockdb_restored_from_a_base_backup_grants_above_every_earlier_token() {
    let (before, after, cause) = restored_base_backup(Statements::C1).await;
    assert!(after > before, "{after} <= {before}");
    assert_eq!(cause, Some(Cause::postmaster_restart.wire()));
    assert!(
        after >= before + JUMP - 200,
        "a jump of 2^32: {after} after {before}"
    );
}

#[tokio::test]
async fn control_without_the_jump_a_restored_base_backup_reissues_tokens() {
    let (before, after, _) = restored_base_backup(Statements::NO_JUMP).await;
    assert!(after <= before, "{after} > {before}");
}

/// A file-system copy of lockdb taken while it was shut down, restored after 100 more grants.
async fn restored_copy(stmts: Statements) -> (i64, i64, Option<JumpCause>) {
    let mut primary = PgServer::start("epoch-copy").expect("server");
    migrated_on(&primary, History::Lockdb).await;
    primary.shutdown().expect("shutdown");
    let copy = primary.copy_pgdata("epoch-fs-copy").expect("copy");
    primary.restart().expect("restart");
    let repo = repo(&app_url(&primary), stmts);
    let before = grant_many(&repo, "account:before", 100).await;
    let (after, cause) = restore_under(&mut primary, &copy, repo).await;
    (before, after, cause)
}

#[tokio::test]
async fn a_lockdb_restored_from_a_file_system_copy_grants_above_every_earlier_token() {
    let (before, after, cause) = restored_copy(Statements::C1).await;
    assert!(after > before, "{after} <= {before}");
    assert_eq!(
        cause,
        Some(Cause::postmaster_restart.wire()),
        "same system, same timeline: the restarted postmaster gives it away"
    );
}

/// Why the floor's clock: the copy was taken before lock-server's first jump, so the restored copy
/// lacks that jump; on the same timeline only the time since then lifts the next jump above it.
#[tokio::test]
async fn control_a_jump_without_the_clock_floor_lands_among_the_lost_jumps_tokens() {
    let clockless = Statements {
        jump: Some(replaced(lock_server::sql::JUMP_SEQUENCE, "ms * $4", "$4 * 0")),
        ..Statements::C1
    };
    let (before, after, _) = restored_copy(clockless).await;
    assert!(after <= before, "{after} > {before}");
}

#[tokio::test]
async fn control_without_the_jump_a_restored_file_system_copy_reissues_tokens() {
    let (before, after, _) = restored_copy(Statements::NO_JUMP).await;
    assert!(after <= before, "{after} > {before}");
}

/// lock-server restarting on the same healthy primary: grants above everything before, by a jump
/// (its start is a history it cannot vouch for: it cannot know what happened while it was away).
async fn restarted_lock_server(stmts: Statements) -> (i64, i64) {
    let db = dlock_testkit::lockdb().await;
    let first = repo(&db.app_url(), stmts);
    let before = grant_many(&first, "account:before", 5).await;
    first.close().await;
    let second = repo(&db.app_url(), stmts);
    let after = first_grant_after(&second, "account:after").await;
    second.close().await;
    (before, after)
}

#[tokio::test]
async fn a_restarted_lock_server_on_a_healthy_primary_jumps_before_its_first_grant() {
    let (before, after) = restarted_lock_server(Statements::C1).await;
    assert!(after > before + JUMP, "{after} after {before}");
}

#[tokio::test]
async fn control_without_the_jump_a_restarted_lock_server_does_not_jump() {
    let (before, after) = restarted_lock_server(Statements::NO_JUMP).await;
    assert!(after <= before + JUMP, "{after} after {before}");
}

/// Several replicas jumping at once: each jump takes the advisory lock, so one that read the
/// sequence can never set it back below tokens granted after another's jump. Here the lock is held
/// elsewhere: a starting lock-server's first grant waits for it, and goes through once it is free.
async fn jump_while_the_lock_is_held(stmts: Statements) -> bool {
    let db = dlock_testkit::lockdb().await;
    let admin: PgPool = db.admin_pool().await;
    let mut holder = admin.acquire().await.expect("connection");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(JUMP_LOCK)
        .execute(&mut *holder)
        .await
        .expect("take the jump's lock");

    let repo = repo(&db.app_url(), stmts);
    let session: Uuid = granted(repo.create_session("epoch-test", TTL_SECS).await).session_id;
    let acquiring = {
        let repo = repo.clone();
        tokio::spawn(async move { repo.acquire("account:x", "epoch-test", session, TTL_SECS).await })
    };
    // Wait until either the acquire is done or a session of this database waits on an advisory lock.
    let deadline = Instant::now() + Duration::from_secs(20);
    let waited = loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
              WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory')",
        )
        .fetch_one(&admin)
        .await
        .expect("pg_stat_activity");
        if waiting {
            break true;
        }
        if acquiring.is_finished() {
            break false;
        }
        assert!(Instant::now() < deadline, "neither waited nor granted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(JUMP_LOCK)
        .execute(&mut *holder)
        .await
        .expect("free the lock");
    let grant = acquiring.await.expect("task");
    // The pool gives up after a second; then the next attempt goes through.
    if let Err(e) = &grant {
        assert!(unavailable(e), "{e}");
        first_grant_after(&repo, "account:y").await;
    }
    repo.close().await;
    waited
}

#[tokio::test]
async fn a_jump_waits_for_any_other_jump_of_the_same_lockdb() {
    assert!(jump_while_the_lock_is_held(Statements::C1).await);
}

#[tokio::test]
async fn control_a_jump_without_the_advisory_lock_does_not_wait() {
    let unserialised = Statements {
        jump: Some(replaced(
            lock_server::sql::JUMP_SEQUENCE,
            "pg_advisory_xact_lock($1)",
            "$1::bigint",
        )),
        ..Statements::C1
    };
    assert!(!jump_while_the_lock_is_held(unserialised).await);
}

#[test]
fn the_controls_differ_from_c1_in_the_jump_alone() {
    assert_eq!(
        Statements {
            jump: Statements::C1.jump,
            ..Statements::NO_JUMP
        },
        Statements::C1
    );
    assert!(Statements::NO_JUMP.jump.is_none());
}
