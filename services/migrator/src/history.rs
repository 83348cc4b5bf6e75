//! `flyway_schema_history`: what was applied, and applying what is pending.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};

use crate::MigrateError;
use crate::files::{Kind, Migration};

/// Key of the session advisory lock held while migrating ("dlockmig").
const ADVISORY_LOCK_KEY: i64 = 0x646c_6f63_6b6d_6967;

/// The table exactly as Flyway's PostgreSQL support creates it (`PostgreSQLDatabase.getRawCreateScript`:
/// same columns, a primary key named `<table>_pk`, an index `<table>_s_idx` on `success`), so that a
/// history started by either tool is the other's.
const CREATE_HISTORY: &str = r#"
CREATE TABLE "flyway_schema_history" (
    "installed_rank" INT NOT NULL,
    "version" VARCHAR(50),
    "description" VARCHAR(200) NOT NULL,
    "type" VARCHAR(20) NOT NULL,
    "script" VARCHAR(1000) NOT NULL,
    "checksum" INTEGER,
    "installed_by" VARCHAR(100) NOT NULL,
    "installed_on" TIMESTAMP NOT NULL DEFAULT now(),
    "execution_time" INTEGER NOT NULL,
    "success" BOOLEAN NOT NULL
);
ALTER TABLE "flyway_schema_history" ADD CONSTRAINT "flyway_schema_history_pk" PRIMARY KEY ("installed_rank");
CREATE INDEX "flyway_schema_history_s_idx" ON "flyway_schema_history" ("success");
"#;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedRow {
    pub installed_rank: i32,
    pub version: Option<String>,
    pub script: String,
    pub checksum: Option<i32>,
    pub success: bool,
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Scripts applied by this run, in order.
    pub applied: Vec<String>,
    /// Highest versioned migration applied after this run.
    pub current_version: Option<i64>,
    /// Repeatables recorded as applied whose file is in none of the given locations: left as they
    /// are (their data stays), reported so that an operator sees it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
    /// Scripts whose history row held the checksum dlock-migrate recorded before it computed them as
    /// Flyway does, rewritten to Flyway's by this run (once: the next run finds them matching).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub corrected: Vec<String>,
}

/// Rows of the history table in installation order (empty if the table does not exist yet).
pub async fn applied(conn: &mut PgConnection) -> Result<Vec<AppliedRow>, MigrateError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('flyway_schema_history') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(
        "SELECT installed_rank, version, script, checksum, success
           FROM flyway_schema_history ORDER BY installed_rank",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| AppliedRow {
            installed_rank: r.get(0),
            version: r.get(1),
            script: r.get(2),
            checksum: r.get(3),
            success: r.get(4),
        })
        .collect())
}

/// How often a file (or a password change) is tried again when it lost a race on a catalog shared by
/// every database of the server.
///
/// Roles are one per server, not per database: two migrations of two databases on one server (two
/// LockServices on one external PostgreSQL, two PaymentStacks' paydbs, a test suite) can both see
/// no `lockapp` and both `CREATE ROLE` it; the second then fails with a unique violation on
/// `pg_authid` once the first commits, or `ALTER ROLE` fails with "tuple concurrently updated". The
/// advisory lock does not help: it is per database. Run again, the file finds the role made by the
/// other and succeeds, so such a failure is retried with backoff. Every other error ends the run at
/// once (the file's transaction is rolled back, as before), as does the last failed attempt: the
/// Job fails and is retried by its backoffLimit, then reported by the operator.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    /// The wait before the second attempt; doubled before each further one.
    pub first_backoff: Duration,
}

impl Retry {
    /// No retry: the first failure is the result.
    pub const NONE: Retry = Retry {
        attempts: 1,
        first_backoff: Duration::ZERO,
    };
}

impl Default for Retry {
    /// Six attempts, 50 ms to 800 ms apart (1.55 s of waiting in all): a racing migration holds
    /// its transaction for the length of one file.
    fn default() -> Self {
        Retry {
            attempts: 6,
            first_backoff: Duration::from_millis(50),
        }
    }
}

/// Whether `e` is a lost race on a server-wide catalog (or a serialization failure or deadlock),
/// which a second attempt of the same statements can win.
pub fn lost_catalog_race(e: &sqlx::Error) -> bool {
    let Some(db) = e.as_database_error() else {
        return false;
    };
    match db.code().as_deref() {
        // unique_violation on a catalog index (all named pg_*): two CREATE ROLE of one name.
        Some("23505") => db.constraint().is_some_and(|c| c.starts_with("pg_")),
        // serialization_failure, deadlock_detected.
        Some("40001") | Some("40P01") => true,
        // internal_error raised by a catalog update that lost to a concurrent one.
        Some("XX000") => {
            let m = db.message();
            m == "tuple concurrently updated" || m == "tuple concurrently deleted"
        }
        _ => false,
    }
}

/// The attempts of one file (or password change): after each failure, [`Attempts::again`] says
/// whether to try again, having logged `migration_retried` and waited.
struct Attempts<'a> {
    retry: Retry,
    what: &'a str,
    made: u32,
    backoff: Duration,
}

impl<'a> Attempts<'a> {
    fn new(retry: Retry, what: &'a str) -> Self {
        Attempts {
            retry,
            what,
            made: 1,
            backoff: retry.first_backoff,
        }
    }

    /// True (after the backoff) when `e` is a lost catalog race and attempts are left.
    async fn again(&mut self, e: &MigrateError) -> bool {
        if self.made >= self.retry.attempts || !raced(e) {
            return false;
        }
        tracing::warn!(
            event = "migration_retried",
            what = self.what,
            attempt = self.made,
            backoff_ms = u64::try_from(self.backoff.as_millis()).unwrap_or(u64::MAX),
            error = %e,
            "lost a race on a server-wide catalog to a concurrent migration; trying again"
        );
        tokio::time::sleep(self.backoff).await;
        self.backoff = self.backoff.saturating_mul(2);
        self.made += 1;
        true
    }
}

fn raced(e: &MigrateError) -> bool {
    match e {
        MigrateError::Failed { source, .. } | MigrateError::Database(source) => lost_catalog_race(source),
        _ => false,
    }
}

/// Validates the history against `migrations`, then applies what is pending.
pub async fn migrate(conn: &mut PgConnection, migrations: &[Migration]) -> Result<Report, MigrateError> {
    migrate_with(conn, migrations, Retry::default()).await
}

/// [`migrate`], with `retry` for files that lose a race on a server-wide catalog.
pub async fn migrate_with(
    conn: &mut PgConnection,
    migrations: &[Migration],
    retry: Retry,
) -> Result<Report, MigrateError> {
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(ADVISORY_LOCK_KEY)
        .execute(&mut *conn)
        .await?;
    let result = migrate_locked(conn, migrations, retry).await;
    // Released explicitly; the lock would also go with the connection.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(ADVISORY_LOCK_KEY)
        .execute(&mut *conn)
        .await?;
    result
}

async fn migrate_locked(
    conn: &mut PgConnection,
    migrations: &[Migration],
    retry: Retry,
) -> Result<Report, MigrateError> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('flyway_schema_history') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        // Several statements: the simple query protocol, in one transaction.
        let mut tx = conn.begin().await?;
        sqlx::raw_sql(CREATE_HISTORY).execute(&mut *tx).await?;
        tx.commit().await?;
    }
    let mut history = applied(conn).await?;

    if let Some(failed) = history.iter().find(|r| !r.success) {
        return Err(MigrateError::PreviousFailure {
            script: failed.script.clone(),
        });
    }

    // Validate every applied versioned migration before touching anything. A row holding the
    // checksum an older dlock-migrate computed for the very same file is not an edit: it is noted
    // for correction. Anything else that differs is refused, as Flyway refuses it.
    let mut corrections: Vec<Correction> = Vec::new();
    let mut latest: Option<i64> = None;
    for row in history.iter().filter(|r| r.version.is_some()) {
        let version = row.version.clone().unwrap_or_default();
        let file = migrations
            .iter()
            .find(|m| matches!(m.kind, Kind::Versioned(v) if v.to_string() == version));
        let Some(file) = file else {
            return Err(MigrateError::MissingFile {
                version,
                script: row.script.clone(),
            });
        };
        if row.checksum != Some(file.checksum) {
            if row.checksum != Some(file.legacy_checksum) {
                return Err(MigrateError::ChecksumMismatch {
                    version,
                    script: file.script.clone(),
                    recorded: row.checksum.unwrap_or_default(),
                    found: file.checksum,
                });
            }
            corrections.push(Correction::of(row, file));
        }
        if let Kind::Versioned(v) = file.kind {
            latest = latest.max(Some(v));
        }
    }
    // A repeatable's latest row with the former checksum of its current file: correcting it keeps
    // the file from being re-applied for a checksum change that is not a change. (Earlier rows of a
    // repeatable record earlier contents; Flyway does not validate them, and neither do we.)
    for m in migrations.iter().filter(|m| m.kind == Kind::Repeatable) {
        let last = history
            .iter()
            .rev()
            .find(|r| r.version.is_none() && r.script == m.script);
        if let Some(row) = last
            && row.checksum != Some(m.checksum)
            && row.checksum == Some(m.legacy_checksum)
        {
            corrections.push(Correction::of(row, m));
        }
    }
    // The rest of the checks see the history as corrected; the rows are written only once every
    // check has passed.
    for c in &corrections {
        if let Some(row) = history.iter_mut().find(|r| r.installed_rank == c.installed_rank) {
            row.checksum = Some(c.to);
        }
    }

    let mut pending = Vec::new();
    for m in migrations {
        match m.kind {
            Kind::Versioned(v) => {
                let done = history
                    .iter()
                    .any(|r| r.version.as_deref() == Some(&v.to_string()));
                if done {
                    continue;
                }
                if let Some(l) = latest.filter(|l| v < *l) {
                    return Err(MigrateError::OutOfOrder {
                        version: v,
                        script: m.script.clone(),
                        latest: l,
                    });
                }
                pending.push(m);
            }
            Kind::Repeatable => {
                // Re-applied when its latest recorded checksum differs (or it was never applied).
                let last = history
                    .iter()
                    .rev()
                    .find(|r| r.version.is_none() && r.script == m.script);
                if last.and_then(|r| r.checksum) != Some(m.checksum) {
                    pending.push(m);
                }
            }
        }
    }

    let mut retired: Vec<String> = Vec::new();
    for row in history.iter().filter(|r| r.version.is_none()) {
        if !migrations.iter().any(|m| m.script == row.script) && !retired.contains(&row.script) {
            tracing::warn!(
                event = "repeatable_retired",
                script = %row.script,
                "an applied repeatable migration is in none of the given locations; its data stays, it is no longer re-applied"
            );
            retired.push(row.script.clone());
        }
    }

    let corrected = correct_checksums(conn, &corrections).await?;
    let mut report = Report {
        applied: Vec::new(),
        current_version: latest,
        retired,
        corrected,
    };
    let mut rank = history.iter().map(|r| r.installed_rank).max().unwrap_or(0);
    for m in pending {
        rank += 1;
        // A failed attempt rolled back with its history row; we still hold the advisory lock, so
        // nobody else applied the file meanwhile.
        let mut attempts = Attempts::new(retry, &m.script);
        loop {
            match apply_one(conn, m, rank).await {
                Err(e) if attempts.again(&e).await => continue,
                result => break result?,
            }
        }
        tracing::info!(event = "migration_applied", script = %m.script, checksum = m.checksum);
        report.applied.push(m.script.clone());
        if let Kind::Versioned(v) = m.kind {
            report.current_version = report.current_version.max(Some(v));
        }
    }
    Ok(report)
}

/// A history row to rewrite from the former dlock checksum of its file to Flyway's.
struct Correction {
    installed_rank: i32,
    version: Option<String>,
    script: String,
    from: i32,
    to: i32,
}

impl Correction {
    fn of(row: &AppliedRow, file: &Migration) -> Self {
        Correction {
            installed_rank: row.installed_rank,
            version: row.version.clone(),
            script: row.script.clone(),
            from: file.legacy_checksum,
            to: file.checksum,
        }
    }
}

/// Rewrites the rows of `corrections` (after every check of the run passed), all in one transaction (all or none), each guarded by the
/// checksum it was validated with; logs `history_checksum_corrected` per row and returns the scripts.
async fn correct_checksums(
    conn: &mut PgConnection,
    corrections: &[Correction],
) -> Result<Vec<String>, MigrateError> {
    if corrections.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = conn.begin().await?;
    for c in corrections {
        let updated = sqlx::query(
            "UPDATE flyway_schema_history SET checksum = $1 WHERE installed_rank = $2 AND checksum = $3",
        )
        .bind(c.to)
        .bind(c.installed_rank)
        .bind(c.from)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated != 1 {
            // Someone changed the row since we read it under the advisory lock: not ours to guess.
            return Err(MigrateError::HistoryChanged {
                script: c.script.clone(),
            });
        }
    }
    tx.commit().await?;
    for c in corrections {
        tracing::warn!(
            event = "history_checksum_corrected",
            version = c.version.as_deref().unwrap_or(""),
            script = %c.script,
            from = c.from,
            to = c.to,
            "the history row held the checksum an older dlock-migrate computed for this unchanged file; rewritten to Flyway's"
        );
    }
    tracing::info!(
        event = "history_checksums_corrected",
        count = corrections.len(),
        "history checksums rewritten to Flyway's"
    );
    Ok(corrections.iter().map(|c| c.script.clone()).collect())
}

async fn apply_one(conn: &mut PgConnection, m: &Migration, rank: i32) -> Result<(), MigrateError> {
    let started = Instant::now();
    let mut tx = conn.begin().await?;
    // raw_sql: a file may hold several statements, so it goes over the simple query protocol.
    // The file is ours, reviewed and checksummed: it is the SQL to run.
    sqlx::raw_sql(sqlx::AssertSqlSafe(m.sql.as_str()))
        .execute(&mut *tx)
        .await
        .map_err(|source| MigrateError::Failed {
            script: m.script.clone(),
            source,
        })?;
    let elapsed = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
    let version = match m.kind {
        Kind::Versioned(v) => Some(v.to_string()),
        Kind::Repeatable => None,
    };
    sqlx::query(
        "INSERT INTO flyway_schema_history
             (installed_rank, version, description, type, script, checksum, installed_by, execution_time, success)
         VALUES ($1, $2, $3, 'SQL', $4, $5, current_user, $6, true)",
    )
    .bind(rank)
    .bind(version)
    .bind(&m.description)
    .bind(&m.script)
    .bind(m.checksum)
    .bind(elapsed)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Gives an application role its login password, quoting both on the server (`format('%I', '%L')`),
/// so the password never appears in a statement text we build.
pub async fn set_role_password(
    conn: &mut PgConnection,
    role: &str,
    password: &str,
) -> Result<(), MigrateError> {
    set_role_password_with(conn, role, password, Retry::default()).await
}

/// [`set_role_password`], with `retry` for an `ALTER ROLE` that loses to a concurrent one.
pub async fn set_role_password_with(
    conn: &mut PgConnection,
    role: &str,
    password: &str,
    retry: Retry,
) -> Result<(), MigrateError> {
    let mut attempts = Attempts::new(retry, "set role password");
    loop {
        match alter_role_password(conn, role, password).await {
            Err(e) if attempts.again(&e).await => continue,
            result => break result?,
        }
    }
    tracing::info!(event = "role_password_set", role);
    Ok(())
}

async fn alter_role_password(
    conn: &mut PgConnection,
    role: &str,
    password: &str,
) -> Result<(), MigrateError> {
    let stmt: String =
        sqlx::query_scalar("SELECT format('ALTER ROLE %I WITH LOGIN PASSWORD %L', $1::text, $2::text)")
            .bind(role)
            .bind(password)
            .fetch_one(&mut *conn)
            .await?;
    // Built by format(%I, %L) on the server: identifiers and literals are quoted there.
    sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
        .execute(&mut *conn)
        .await?;
    Ok(())
}
