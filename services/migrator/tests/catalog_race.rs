//! Two databases of one server migrated at once: roles are one per server, so a migration that
//! creates its application role can lose a race to another database's migration creating the same
//! role (a unique violation on `pg_authid` once the other commits), and `ALTER ROLE … PASSWORD` can
//! lose to a concurrent one ("tuple concurrently updated"). Each scene makes the race happen for
//! certain: a transaction in another database holds the role change uncommitted until the
//! migrator's statement is seen waiting on it, then commits. With the default [`Retry`] the
//! migrator wins on its next attempt; with [`Retry::NONE`] (the negative control) the same scene
//! fails.

use std::fs;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_migrate::{MigrateError, Retry, lost_catalog_race, migrate_with, set_role_password_with};
use dlock_testkit::wait::{WAIT_LIMIT, poll};
use dlock_testkit::{History, TestDb, blank};
use sqlx::{Connection, PgConnection};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A role name no other test (or run) uses, so that each scene starts without it.
fn role_name() -> String {
    format!(
        "race_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn conn(db: &TestDb) -> PgConnection {
    PgConnection::connect(&db.admin_url()).await.expect("connect")
}

/// Runs `work` (on `ours`) while a transaction in `other` holds `held` (a change of a role)
/// uncommitted; commits it once a backend of `ours` is seen waiting on a lock (`work`'s statement,
/// blocked by it), and returns `work`'s output. `watcher` reads `pg_stat_activity`.
async fn while_held<T: Send + 'static>(
    watcher: &mut PgConnection,
    other: &TestDb,
    ours: &TestDb,
    held: &str,
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    let mut holder = conn(other).await;
    sqlx::raw_sql("BEGIN").execute(&mut holder).await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(held.to_owned()))
        .execute(&mut holder)
        .await
        .unwrap_or_else(|e| panic!("the other database: {held}: {e}"));
    let run = tokio::spawn(work);
    poll(WAIT_LIMIT, Duration::from_millis(10), async || {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock')",
        )
        .bind(&ours.name)
        .fetch_one(&mut *watcher)
        .await
        .expect("read pg_stat_activity");
        if waiting { Ok(()) } else { Err(()) }
    })
    .await
    .unwrap_or_else(|()| {
        panic!(
            "the work on {} never waited on the other database's {held}",
            ours.name
        )
    });
    sqlx::raw_sql("COMMIT")
        .execute(&mut holder)
        .await
        .expect("commit");
    run.await.expect("the work's task")
}

async fn drop_role(c: &mut PgConnection, role: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
        .execute(c)
        .await
        .expect("drop the scene's role");
}

/// One migration of `ours` (a file that creates `role` if it is missing, as V2 of both histories
/// does, then a table) while another database of the same server creates `role` in a transaction
/// it commits only once the migration waits on it. Returns the migration's result and `ours`'s
/// applied scripts.
async fn create_role_race(retry: Retry) -> (Result<(), MigrateError>, Vec<String>) {
    let role = role_name();
    let other = blank(History::Lockdb).await;
    let ours = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(
        dir.path().join("V1__create_role_and_t.sql"),
        format!(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN \
             CREATE ROLE {role} LOGIN; END IF; END $$;\nCREATE TABLE t (a INT);"
        ),
    )
    .expect("write migration");
    let files = dlock_migrate::load_dir(dir.path()).expect("load");

    let mut c = conn(&ours).await;
    let mut watcher = conn(&other).await;
    let migration = async move {
        let r = migrate_with(&mut c, &files, retry).await.map(|_| ());
        (r, c)
    };
    let (result, mut c) = while_held(
        &mut watcher,
        &other,
        &ours,
        &format!("CREATE ROLE {role} LOGIN"),
        migration,
    )
    .await;
    let applied = dlock_migrate::applied(&mut c)
        .await
        .expect("history")
        .into_iter()
        .map(|r| r.script)
        .collect();
    // The role is the server's: gone after the scene, or the next run of a test with this
    // pid/counter would start with it.
    drop_role(&mut watcher, &role).await;
    (result, applied)
}

#[tokio::test]
async fn a_file_that_loses_a_create_role_race_is_run_again_and_applied_once() {
    let (result, applied) = create_role_race(Retry::default()).await;
    result.expect("the second attempt finds the role and succeeds");
    assert_eq!(applied, ["V1__create_role_and_t.sql"]);
}

#[tokio::test]
async fn negative_control_without_retry_the_create_role_race_fails_the_migration() {
    let (result, applied) = create_role_race(Retry::NONE).await;
    match result {
        Err(MigrateError::Failed {
            ref script,
            ref source,
        }) => {
            assert_eq!(script, "V1__create_role_and_t.sql");
            assert!(lost_catalog_race(source), "a catalog race: {source}");
        }
        other => panic!("expected the file to fail on the race, got {other:?}"),
    }
    assert!(
        applied.is_empty(),
        "the failed file left no history row: {applied:?}"
    );
}

/// `set_role_password` on `role` while another database's transaction has altered the same role
/// and commits once the password change waits on it.
async fn alter_role_race(retry: Retry) -> Result<(), MigrateError> {
    let role = role_name();
    let other = blank(History::Lockdb).await;
    let ours = blank(History::Lockdb).await;
    let mut watcher = conn(&other).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
        .execute(&mut watcher)
        .await
        .expect("create the role");

    let mut c = conn(&ours).await;
    let task_role = role.clone();
    let change = async move { set_role_password_with(&mut c, &task_role, "not-a-real-secret", retry).await };
    let result = while_held(
        &mut watcher,
        &other,
        &ours,
        &format!("ALTER ROLE {role} CONNECTION LIMIT 5"),
        change,
    )
    .await;
    drop_role(&mut watcher, &role).await;
    result
}

#[tokio::test]
async fn a_password_change_that_loses_to_a_concurrent_alter_role_is_made_again() {
    alter_role_race(Retry::default())
        .await
        .expect("the second attempt sets the password");
}

#[tokio::test]
async fn negative_control_without_retry_the_alter_role_race_fails() {
    let err = alter_role_race(Retry::NONE)
        .await
        .expect_err("the first attempt loses the race");
    match err {
        MigrateError::Database(ref source) => assert!(lost_catalog_race(source), "a catalog race: {source}"),
        other => panic!("expected a database error, got {other:?}"),
    }
}
