//! The migrator against real PostgreSQL 16: ordering, checksums, refusal of edited files,
//! repeatables, idempotence, and the CLI the migration Jobs run.

use std::fs;
use std::path::Path;
use std::process::Command;

use dlock_migrate::{MigrateError, load_dir, migrate};
use dlock_testkit::{History, TestDb, blank};
use sqlx::{Connection, PgConnection};

async fn conn(db: &TestDb) -> PgConnection {
    PgConnection::connect(&db.admin_url()).await.expect("connect")
}

fn write(dir: &Path, name: &str, sql: &str) {
    fs::write(dir.join(name), sql).expect("write migration");
}

async fn scripts(c: &mut PgConnection) -> Vec<String> {
    dlock_migrate::applied(c)
        .await
        .expect("history")
        .into_iter()
        .map(|r| r.script)
        .collect()
}

async fn table_exists(c: &mut PgConnection, name: &str) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(c)
        .await
        .expect("to_regclass")
}

#[tokio::test]
async fn applies_in_version_order_records_checksums_and_is_a_noop_the_second_time() {
    let db = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    // V10 depends on V2: numeric (not lexical) order is required.
    write(dir.path(), "V10__add_c.sql", "ALTER TABLE t ADD COLUMN c INT;");
    write(dir.path(), "V2__add_b.sql", "ALTER TABLE t ADD COLUMN b INT;");
    write(dir.path(), "V1__create_t.sql", "CREATE TABLE t (a INT);");
    let files = load_dir(dir.path()).expect("load");
    let mut c = conn(&db).await;

    let first = migrate(&mut c, &files).await.expect("first run");
    assert_eq!(
        first.applied,
        ["V1__create_t.sql", "V2__add_b.sql", "V10__add_c.sql"]
    );
    assert_eq!(first.current_version, Some(10));
    let recorded = dlock_migrate::applied(&mut c).await.expect("history");
    for (row, file) in recorded.iter().zip(&files) {
        assert_eq!(row.checksum, Some(file.checksum), "{}", file.script);
        assert!(row.success);
    }

    let second = migrate(&mut c, &files).await.expect("second run");
    assert!(
        second.applied.is_empty(),
        "second run applied {:?}",
        second.applied
    );
    assert_eq!(second.current_version, Some(10));
    assert_eq!(scripts(&mut c).await.len(), 3);
}

#[tokio::test]
async fn an_edited_applied_migration_is_refused_and_nothing_is_applied() {
    let db = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "V1__create_t.sql", "CREATE TABLE t (a INT);");
    let mut c = conn(&db).await;
    migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect("first run");

    write(dir.path(), "V1__create_t.sql", "CREATE TABLE t (a BIGINT);");
    write(dir.path(), "V2__create_u.sql", "CREATE TABLE u (a INT);");
    let err = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect_err("must refuse");
    assert!(
        matches!(err, MigrateError::ChecksumMismatch { ref script, .. } if script == "V1__create_t.sql"),
        "{err}"
    );
    assert!(err.to_string().contains("edited after it was applied"), "{err}");
    assert!(
        !table_exists(&mut c, "u").await,
        "V2 must not run when validation fails"
    );
    assert_eq!(scripts(&mut c).await, ["V1__create_t.sql"]);
}

#[tokio::test]
async fn a_repeatable_is_reapplied_only_when_its_checksum_changes() {
    let db = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "V1__create_t.sql",
        "CREATE TABLE t (a INT PRIMARY KEY);",
    );
    write(
        dir.path(),
        "R__seed_t.sql",
        "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING;",
    );
    let mut c = conn(&db).await;
    let r1 = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect("run 1");
    assert_eq!(r1.applied, ["V1__create_t.sql", "R__seed_t.sql"]);
    let r2 = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect("run 2");
    assert!(r2.applied.is_empty());

    write(
        dir.path(),
        "R__seed_t.sql",
        "INSERT INTO t VALUES (1), (2) ON CONFLICT DO NOTHING;",
    );
    let r3 = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect("run 3");
    assert_eq!(r3.applied, ["R__seed_t.sql"]);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&mut c)
        .await
        .expect("count");
    assert_eq!(n, 2);
    let r4 = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect("run 4");
    assert!(r4.applied.is_empty());
}

#[tokio::test]
async fn a_missing_file_or_an_out_of_order_version_is_refused() {
    let db = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "V1__create_t.sql", "CREATE TABLE t (a INT);");
    write(dir.path(), "V3__create_v.sql", "CREATE TABLE v (a INT);");
    let mut c = conn(&db).await;
    migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect("first run");

    write(dir.path(), "V2__create_u.sql", "CREATE TABLE u (a INT);");
    let err = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect_err("out of order");
    assert!(
        matches!(err, MigrateError::OutOfOrder { version: 2, .. }),
        "{err}"
    );
    assert!(!table_exists(&mut c, "u").await);

    fs::remove_file(dir.path().join("V2__create_u.sql")).expect("rm");
    fs::remove_file(dir.path().join("V3__create_v.sql")).expect("rm");
    let err = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect_err("missing");
    assert!(matches!(err, MigrateError::MissingFile { .. }), "{err}");
}

#[tokio::test]
async fn a_failing_migration_rolls_back_with_its_history_row() {
    let db = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "V1__create_t.sql", "CREATE TABLE t (a INT);");
    write(
        dir.path(),
        "V2__broken.sql",
        "CREATE TABLE w (a INT); SELECT * FROM no_such_table;",
    );
    let mut c = conn(&db).await;
    let err = migrate(&mut c, &load_dir(dir.path()).expect("load"))
        .await
        .expect_err("V2 fails");
    assert!(
        matches!(err, MigrateError::Failed { ref script, .. } if script == "V2__broken.sql"),
        "{err}"
    );
    assert!(
        !table_exists(&mut c, "w").await,
        "the failed file's statements are rolled back"
    );
    assert_eq!(scripts(&mut c).await, ["V1__create_t.sql"]);
}

#[tokio::test]
async fn bad_file_names_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "V1__create_t.sql", "CREATE TABLE t (a INT);");
    write(dir.path(), "V2-add-things.sql", "SELECT 1;");
    assert!(matches!(load_dir(dir.path()), Err(MigrateError::BadName { .. })));
}

fn migrate_cli(db: &TestDb, dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dlock-migrate"))
        .args(["--dir", dir.to_str().expect("utf8 path")])
        .env("DATABASE_URL", db.admin_url())
        .env("DLOCK_LOG_FORMAT", "text")
        .output()
        .expect("run dlock-migrate")
}

#[tokio::test]
async fn the_cli_applies_a_real_history_then_is_a_noop_and_refuses_an_edit() {
    let db = blank(History::Paydb).await;
    let real = dlock_testkit::migrations_dir(History::Paydb);
    let out = migrate_cli(&db, &real);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert!(
        report["applied"].as_array().is_some_and(|a| !a.is_empty()),
        "{report}"
    );

    let again = migrate_cli(&db, &real);
    assert!(again.status.success());
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).expect("json report");
    assert_eq!(report["applied"], serde_json::json!([]));

    // An edited copy of the applied history is refused with a non-zero exit and a clear message.
    let edited = tempfile::tempdir().expect("tempdir");
    for e in fs::read_dir(&real).expect("read migrations") {
        let e = e.expect("entry");
        fs::copy(e.path(), edited.path().join(e.file_name())).expect("copy");
    }
    let v1 = fs::read_dir(edited.path())
        .expect("read")
        .map(|e| e.expect("entry").path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("V1__"))
        })
        .expect("V1 file");
    let text = fs::read_to_string(&v1).expect("read V1");
    fs::write(&v1, format!("{text}\n-- an innocent-looking edit\n")).expect("edit V1");
    let refused = migrate_cli(&db, edited.path());
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("edited after it was applied"));
}

fn migrate_cli_dirs(db: &TestDb, dirs: &[&Path]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-migrate"));
    for d in dirs {
        cmd.args(["--dir", d.to_str().expect("utf8 path")]);
    }
    cmd.env("DATABASE_URL", db.admin_url())
        .env("DLOCK_LOG_FORMAT", "text")
        .output()
        .expect("run dlock-migrate")
}

async fn accounts(db: &TestDb) -> i64 {
    let mut c = conn(db).await;
    sqlx::query_scalar("SELECT count(*) FROM account")
        .fetch_one(&mut c)
        .await
        .expect("count accounts")
}

/// The production paydb history is schema only: a freshly migrated production paydb has no account.
#[tokio::test]
async fn a_freshly_migrated_production_paydb_has_zero_accounts() {
    let db = blank(History::Paydb).await;
    let out = migrate_cli(&db, &dlock_testkit::migrations_dir(History::Paydb));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(accounts(&db).await, 0);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert!(
        report["applied"]
            .as_array()
            .expect("applied")
            .iter()
            .all(|s| s.as_str().is_some_and(|s| s.starts_with('V'))),
        "the production history applied a repeatable: {report}"
    );
}

/// The seed is a second location; a database seeded once keeps working (and keeps its rows) when it
/// is later migrated with the production history alone: the seed is reported as retired.
#[tokio::test]
async fn the_seed_is_a_separate_location_and_a_retired_seed_does_not_break_a_seeded_database() {
    let db = blank(History::Paydb).await;
    let prod = dlock_testkit::migrations_dir(History::Paydb);
    let seed = dlock_testkit::seed_dir(History::Paydb).expect("paydb has a seed location");
    let out = migrate_cli_dirs(&db, &[&prod, &seed]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(accounts(&db).await, 23, "20 customers and 3 settlement accounts");

    let prod_only = migrate_cli(&db, &prod);
    assert!(
        prod_only.status.success(),
        "{}",
        String::from_utf8_lossy(&prod_only.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&prod_only.stdout).expect("json report");
    assert_eq!(report["applied"], serde_json::json!([]));
    assert_eq!(
        report["retired"],
        serde_json::json!(["R__seed_synthetic_accounts.sql"])
    );
    assert_eq!(accounts(&db).await, 23, "retiring the seed deletes nothing");

    // A version present in two locations is refused before anything runs.
    let dup = tempfile::tempdir().expect("tempdir");
    write(dup.path(), "V1__again.sql", "SELECT 1;");
    let refused = migrate_cli_dirs(&db, &[&prod, dup.path()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("two migration files claim version 1"));
}

/// A history written by an older dlock-migrate holds its former checksums: each row whose checksum
/// is the former one of the unchanged file is rewritten to Flyway's once; a row that matches neither
/// is an edit and refused, and then nothing is corrected.
#[tokio::test]
async fn former_checksums_are_corrected_once_and_anything_else_is_refused() {
    let db = blank(History::Lockdb).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "V1__create_t.sql",
        "CREATE TABLE t (a INT PRIMARY KEY);\n",
    );
    write(dir.path(), "V2__create_u.sql", "CREATE TABLE u (a INT);\r\n");
    write(
        dir.path(),
        "R__seed_t.sql",
        "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING;\n",
    );
    let files = load_dir(dir.path()).expect("load");
    let mut c = conn(&db).await;
    migrate(&mut c, &files).await.expect("first run");
    let set = |script: &'static str, checksum: i32| {
        sqlx::query("UPDATE flyway_schema_history SET checksum = $1 WHERE script = $2")
            .bind(checksum)
            .bind(script)
    };
    let legacy = |script: &str| {
        files
            .iter()
            .find(|f| f.script == script)
            .expect("file")
            .legacy_checksum
    };

    // V1 and the repeatable as an older dlock-migrate recorded them; V2 edited (matches neither).
    set("V1__create_t.sql", legacy("V1__create_t.sql"))
        .execute(&mut c)
        .await
        .expect("v1");
    set("R__seed_t.sql", legacy("R__seed_t.sql"))
        .execute(&mut c)
        .await
        .expect("r");
    set("V2__create_u.sql", 12345).execute(&mut c).await.expect("v2");
    let err = migrate(&mut c, &files).await.expect_err("V2 is an edit");
    assert!(
        matches!(err, MigrateError::ChecksumMismatch { ref script, .. } if script == "V2__create_u.sql"),
        "{err}"
    );
    let v1: Option<i32> =
        sqlx::query_scalar("SELECT checksum FROM flyway_schema_history WHERE script = 'V1__create_t.sql'")
            .fetch_one(&mut c)
            .await
            .expect("v1 row");
    assert_eq!(
        v1,
        Some(legacy("V1__create_t.sql")),
        "nothing is corrected when validation fails"
    );

    set("V2__create_u.sql", legacy("V2__create_u.sql"))
        .execute(&mut c)
        .await
        .expect("v2");
    let report = migrate(&mut c, &files).await.expect("correcting run");
    assert_eq!(
        report.corrected,
        ["V1__create_t.sql", "V2__create_u.sql", "R__seed_t.sql"]
    );
    assert!(
        report.applied.is_empty(),
        "the repeatable is not re-applied: {report:?}"
    );
    let recorded = dlock_migrate::applied(&mut c).await.expect("history");
    for (row, file) in recorded.iter().zip(&files) {
        assert_eq!(row.checksum, Some(file.checksum), "{}", file.script);
    }
    let again = migrate(&mut c, &files).await.expect("next run");
    assert!(
        again.corrected.is_empty() && again.applied.is_empty(),
        "{again:?}"
    );
}
