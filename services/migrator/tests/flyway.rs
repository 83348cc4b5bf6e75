//! dlock-migrate and the real Flyway (13.12.2, installed by scripts/flyway-tools.sh) on the same
//! histories, both ways, against real PostgreSQL 16 (C1 §1.8: the two histories are Flyway's):
//!
//! - Flyway validates the lockdb, paydb and harness (paydb + R__seed_synthetic_accounts) histories
//!   dlock-migrate wrote, and finds nothing to do;
//! - dlock-migrate continues a history Flyway started, and Flyway validates the result;
//! - the rows and the table are the ones Flyway writes, column by column;
//! - the checksums are Flyway's for every kind of line ending and BOM;
//! - an installation holding dlock-migrate's former checksums is corrected once, then Flyway accepts it;
//! - negative control: an applied migration edited afterwards is refused by both tools.
//!
//! Without the Flyway install the tests skip with a message, unless DLOCK_REQUIRE_FLYWAY=1 (the test
//! command sets it): then they fail.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dlock_migrate::{MigrateError, load_dirs, migrate};
use dlock_testkit::{History, TestDb, blank, demo_dirs, migrations_dir};
use sqlx::{Connection, PgConnection, Row};

/// The launcher scripts/flyway-tools.sh installs; `None` (test skipped) when it is not there.
fn flyway() -> Option<PathBuf> {
    let tools = std::env::var_os("DLOCK_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/dlock-tools".into());
    let run = PathBuf::from(tools).join("flyway/run");
    if run.is_file() {
        return Some(run);
    }
    let msg = format!(
        "Flyway is not installed ({} is missing): run scripts/flyway-tools.sh",
        run.display()
    );
    if std::env::var("DLOCK_REQUIRE_FLYWAY").as_deref() == Ok("1") {
        panic!("DLOCK_REQUIRE_FLYWAY=1: {msg}");
    }
    eprintln!("skipped: {msg}");
    None
}

/// Runs FlywayCheck (services/migrator/flyway/FlywayCheck.java) on `db` with `locations`.
fn run_flyway(run: &Path, db: &TestDb, command: &str, locations: &[&Path]) -> Output {
    let url = format!("jdbc:postgresql://127.0.0.1:{}/{}", db.port, db.name);
    let mut cmd = Command::new(run);
    cmd.args([url.as_str(), "postgres", "", "flyway_schema_history", command]);
    for l in locations {
        cmd.arg(l);
    }
    cmd.output().expect("run Flyway")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[track_caller]
fn assert_flyway_ok(out: &Output) {
    assert!(out.status.success(), "Flyway failed: {}", text(out));
}

/// Flyway refused, naming a checksum mismatch of the version of `script` (`V<n>__...`).
#[track_caller]
fn assert_flyway_refuses_edit(out: &Output, script: &str) {
    let version = script
        .strip_prefix('V')
        .and_then(|s| s.split_once("__"))
        .map(|(v, _)| v)
        .expect("a versioned script");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "Flyway accepted an edited migration: {}",
        text(out)
    );
    assert!(
        stderr.contains(&format!("checksum mismatch for migration version {version}\n")),
        "Flyway failed, but not for the edit of {script}: {}",
        text(out)
    );
}

/// One line of FlywayCheck's `info`.
#[derive(Debug)]
struct Info {
    version: String,
    script: String,
    checksum: Option<i32>,
    state: String,
}

fn info(run: &Path, db: &TestDb, locations: &[&Path]) -> Vec<Info> {
    let out = run_flyway(run, db, "info", locations);
    assert_flyway_ok(&out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("MIGRATION\t"))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 6, "info line {l:?}");
            Info {
                version: f[0].to_owned(),
                script: f[2].to_owned(),
                checksum: (!f[3].is_empty()).then(|| f[3].parse().expect("checksum")),
                state: f[4].to_owned(),
            }
        })
        .collect()
}

async fn conn(db: &TestDb) -> PgConnection {
    PgConnection::connect(&db.admin_url()).await.expect("connect")
}

/// installed_rank, version, description, type, script, checksum, installed_by, success.
type HistoryRow = (
    i32,
    Option<String>,
    String,
    String,
    String,
    Option<i32>,
    String,
    bool,
);

/// The history's rows, every column but the two that differ by nature (when, how long).
async fn rows(db: &TestDb) -> Vec<HistoryRow> {
    sqlx::query(
        "SELECT installed_rank, version, description, type, script, checksum, installed_by, success
           FROM flyway_schema_history ORDER BY installed_rank",
    )
    .fetch_all(&mut conn(db).await)
    .await
    .expect("history rows")
    .into_iter()
    .map(|r| {
        (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
            r.get(7),
        )
    })
    .collect()
}

/// The history table's shape: columns (name, type, nullable, default) and index definitions.
async fn table_shape(db: &TestDb) -> Vec<String> {
    let mut c = conn(db).await;
    let mut shape: Vec<String> = sqlx::query_scalar(
        "SELECT column_name || ' ' || data_type || coalesce('(' || character_maximum_length || ')', '')
                || ' ' || is_nullable || ' ' || coalesce(column_default, '')
           FROM information_schema.columns
          WHERE table_name = 'flyway_schema_history' ORDER BY ordinal_position",
    )
    .fetch_all(&mut c)
    .await
    .expect("columns");
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'flyway_schema_history' ORDER BY indexname",
    )
    .fetch_all(&mut c)
    .await
    .expect("indexes");
    shape.extend(indexes);
    shape
}

async fn dlock_migrate(db: &TestDb, dirs: &[&Path]) -> Result<dlock_migrate::Report, MigrateError> {
    let files = load_dirs(dirs).expect("load migrations");
    migrate(&mut conn(db).await, &files).await
}

/// A copy of `dirs` in one folder, keeping only the files `keep` accepts.
fn copy_of(dirs: &[&Path], keep: impl Fn(&str) -> bool) -> tempfile::TempDir {
    let out = tempfile::tempdir().expect("tempdir");
    for d in dirs {
        for e in fs::read_dir(d).expect("read migrations") {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if keep(&name) {
                fs::copy(e.path(), out.path().join(&name)).expect("copy");
            }
        }
    }
    out
}

/// Appends an innocent-looking comment to the file of `dir` whose name starts with `prefix`.
fn edit(dir: &Path, prefix: &str) -> String {
    let path = fs::read_dir(dir)
        .expect("read")
        .map(|e| e.expect("entry").path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .expect("file to edit");
    let before = fs::read_to_string(&path).expect("read");
    fs::write(&path, format!("{before}\n-- reviewed\n")).expect("edit");
    path.file_name().expect("name").to_string_lossy().into_owned()
}

#[tokio::test]
async fn flyway_validates_the_lockdb_paydb_and_harness_histories_dlock_migrate_wrote() {
    let Some(run) = flyway() else { return };
    let cases: Vec<(&str, History, Vec<PathBuf>)> = vec![
        ("lockdb", History::Lockdb, vec![migrations_dir(History::Lockdb)]),
        ("paydb", History::Paydb, vec![migrations_dir(History::Paydb)]),
        ("harness paydb", History::Paydb, demo_dirs(History::Paydb)),
    ];
    for (label, history, dirs) in cases {
        let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
        let db = blank(history).await;
        let report = dlock_migrate(&db, &dirs).await.expect("dlock-migrate");
        let files = load_dirs(&dirs).expect("load");
        assert_eq!(report.applied.len(), files.len(), "{label}: {report:?}");

        assert_flyway_ok(&run_flyway(&run, &db, "validate", &dirs));
        // Flyway sees every file applied, with the checksum dlock-migrate recorded, and nothing to do.
        let seen = info(&run, &db, &dirs);
        assert_eq!(seen.len(), files.len(), "{label}: {seen:?}");
        for (i, f) in seen.iter().zip(&files) {
            assert_eq!(i.script, f.script, "{label}");
            assert_eq!(i.state, "SUCCESS", "{label}: {i:?}");
            assert_eq!(i.checksum, Some(f.checksum), "{label}: {i:?}");
        }
        let migrated = run_flyway(&run, &db, "migrate", &dirs);
        assert_flyway_ok(&migrated);
        assert!(
            String::from_utf8_lossy(&migrated.stdout).contains("MIGRATED\t0"),
            "{label}: Flyway found something to apply: {}",
            text(&migrated)
        );
        if label == "harness paydb" {
            assert!(
                files.iter().any(|f| f.script == "R__seed_synthetic_accounts.sql"),
                "the harness history carries the seed"
            );
        }
    }
}

/// The negative control: V1 edited after dlock-migrate applied it is refused by Flyway and by
/// dlock-migrate; the unedited copy passes both (so the refusal is the edit's doing).
#[tokio::test]
async fn an_edited_applied_migration_is_refused_by_both_tools() {
    let Some(run) = flyway() else { return };
    let db = blank(History::Lockdb).await;
    let lockdb = migrations_dir(History::Lockdb);
    dlock_migrate(&db, &[&lockdb]).await.expect("dlock-migrate");

    let copy = copy_of(&[&lockdb], |_| true);
    assert_flyway_ok(&run_flyway(&run, &db, "validate", &[copy.path()]));
    dlock_migrate(&db, &[copy.path()])
        .await
        .expect("the unedited copy passes");

    let edited = edit(copy.path(), "V1__");
    assert_flyway_refuses_edit(&run_flyway(&run, &db, "validate", &[copy.path()]), &edited);
    let err = dlock_migrate(&db, &[copy.path()])
        .await
        .expect_err("dlock-migrate must refuse");
    assert!(
        matches!(err, MigrateError::ChecksumMismatch { ref script, .. } if *script == edited),
        "{err}"
    );
}

/// Flyway starts the history (V1, V2), dlock-migrate continues it to the end, Flyway validates the
/// whole; an edit of a file Flyway applied is then refused by both.
#[tokio::test]
async fn dlock_migrate_continues_and_validates_a_history_flyway_started() {
    let Some(run) = flyway() else { return };
    let db = blank(History::Lockdb).await;
    let lockdb = migrations_dir(History::Lockdb);
    let first_two = copy_of(&[&lockdb], |n| n.starts_with("V1__") || n.starts_with("V2__"));
    let started = run_flyway(&run, &db, "migrate", &[first_two.path()]);
    assert_flyway_ok(&started);
    assert!(
        String::from_utf8_lossy(&started.stdout).contains("MIGRATED\t2"),
        "{}",
        text(&started)
    );

    let report = dlock_migrate(&db, &[&lockdb])
        .await
        .expect("dlock-migrate continues");
    let all = load_dirs(&[&lockdb]).expect("load");
    let rest: Vec<&str> = all.iter().skip(2).map(|m| m.script.as_str()).collect();
    assert!(!rest.is_empty());
    assert_eq!(report.applied, rest);
    assert!(
        report.corrected.is_empty(),
        "Flyway's rows need no correction: {report:?}"
    );
    assert_flyway_ok(&run_flyway(&run, &db, "validate", &[&lockdb]));
    let again = dlock_migrate(&db, &[&lockdb]).await.expect("second run");
    assert!(again.applied.is_empty(), "{again:?}");

    let copy = copy_of(&[&lockdb], |_| true);
    let edited = edit(copy.path(), "V2__");
    assert_flyway_refuses_edit(&run_flyway(&run, &db, "validate", &[copy.path()]), &edited);
    let err = dlock_migrate(&db, &[copy.path()])
        .await
        .expect_err("dlock-migrate must refuse");
    assert!(
        matches!(err, MigrateError::ChecksumMismatch { ref script, .. } if *script == edited),
        "{err}"
    );
}

/// The harness history migrated by Flyway and by dlock-migrate, each into a database of its own:
/// the same table and the same rows, column by column (installed_on and execution_time aside).
#[tokio::test]
async fn dlock_migrate_writes_the_table_and_rows_flyway_writes() {
    let Some(run) = flyway() else { return };
    let dirs = demo_dirs(History::Paydb);
    let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let by_flyway = blank(History::Paydb).await;
    assert_flyway_ok(&run_flyway(&run, &by_flyway, "migrate", &dirs));
    let by_dlock = blank(History::Paydb).await;
    dlock_migrate(&by_dlock, &dirs).await.expect("dlock-migrate");

    let (f, d) = (rows(&by_flyway).await, rows(&by_dlock).await);
    assert!(!f.is_empty());
    assert_eq!(d, f, "dlock-migrate's rows differ from Flyway's");
    assert!(
        f.iter().any(|r| r.1.is_none() && r.3 == "SQL"),
        "the repeatable is recorded: {f:?}"
    );
    assert_eq!(table_shape(&by_dlock).await, table_shape(&by_flyway).await);
}

/// Flyway's own checksums of files with every kind of line ending, BOMs, blank lines and non-ASCII
/// text, compared with dlock-migrate's.
#[tokio::test]
async fn checksums_are_flyways_for_line_endings_boms_and_utf8() {
    let Some(run) = flyway() else { return };
    let texts = [
        "SELECT 1;\n",
        "SELECT 1;\r\nSELECT 2;\r\n",
        "SELECT 1;\rSELECT 2;\r",
        "SELECT 1;\nSELECT 2;",
        "\u{feff}SELECT 1;\nSELECT 2;\n",
        "\u{feff}\u{feff}SELECT 1;\n",
        "SELECT 1;\n\u{feff}SELECT 2;\n",
        "\n\u{feff}SELECT 1;\n",
        "\n\n\r\n\rSELECT 1;\n\n\n",
        "-- é ü 日本 🦀\nSELECT 'ß';\r\n",
        "   \t\nSELECT 1;   \n",
        "",
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let mut expected = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let name = format!("V{}__case_{}.sql", i + 1, i + 1);
        fs::write(dir.path().join(&name), t).expect("write");
        expected.push((name, dlock_migrate::checksum(t)));
    }
    let db = blank(History::Lockdb).await;
    let seen = info(&run, &db, &[dir.path()]);
    assert_eq!(seen.len(), texts.len(), "{seen:?}");
    for (name, ours) in expected {
        let theirs = seen
            .iter()
            .find(|i| i.script == name)
            .expect("Flyway lists the file");
        assert_eq!(theirs.state, "PENDING");
        assert_eq!(
            theirs.checksum,
            Some(ours),
            "{name}: Flyway {theirs:?}, dlock-migrate {ours}"
        );
        assert_eq!(theirs.version, name[1..name.find("__").expect("__")]);
    }
}

/// A harness paydb whose history holds the checksums dlock-migrate computed before it matched
/// Flyway: Flyway refuses it; dlock-migrate (the binary, as the Jobs run it) rewrites every row
/// once, logging each, and Flyway then validates it; the next run corrects nothing.
#[tokio::test]
async fn former_dlock_checksums_are_corrected_once_then_flyway_validates() {
    let Some(run) = flyway() else { return };
    let dirs = demo_dirs(History::Paydb);
    let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let db = blank(History::Paydb).await;
    dlock_migrate(&db, &dirs).await.expect("dlock-migrate");
    let files = load_dirs(&dirs).expect("load");
    let mut c = conn(&db).await;
    for f in &files {
        sqlx::query("UPDATE flyway_schema_history SET checksum = $1 WHERE script = $2")
            .bind(f.legacy_checksum)
            .bind(&f.script)
            .execute(&mut c)
            .await
            .expect("write a former checksum");
    }
    let refused = run_flyway(&run, &db, "validate", &dirs);
    assert!(!refused.status.success(), "{}", text(&refused));

    let cli = |db: &TestDb| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-migrate"));
        for d in &dirs {
            cmd.arg("--dir").arg(d);
        }
        cmd.env("DATABASE_URL", db.admin_url())
            .env("DLOCK_LOG_FORMAT", "text")
            .output()
            .expect("run dlock-migrate")
    };
    let out = cli(&db);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
    let scripts: Vec<&str> = files.iter().map(|f| f.script.as_str()).collect();
    assert_eq!(report["corrected"], serde_json::json!(scripts), "{report}");
    assert_eq!(
        report["applied"],
        serde_json::json!([]),
        "nothing is re-applied: {report}"
    );
    let logs = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        logs.matches("history_checksum_corrected").count(),
        files.len(),
        "one log line per corrected row: {logs}"
    );
    assert_flyway_ok(&run_flyway(&run, &db, "validate", &dirs));

    let again = cli(&db);
    assert!(again.status.success(), "{}", text(&again));
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).expect("json report");
    assert!(report.get("corrected").is_none(), "corrected twice: {report}");
}
