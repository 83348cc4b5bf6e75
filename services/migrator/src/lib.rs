//! A migrator with Flyway's rules, for two independent histories (C1 §1.8):
//!
//! - files are `V<n>__<snake_case>.sql` (versioned, applied once, in order) and
//!   `R__<snake_case>.sql` (repeatable, re-applied whenever its checksum changes, after versioned);
//! - every applied file is recorded in `flyway_schema_history` exactly as Flyway records it (the same
//!   table, columns and checksum, [`checksum`]), so that Flyway validates and continues a history
//!   dlock-migrate wrote and the other way round (tests/flyway.rs runs the real Flyway);
//! - a row holding the checksum dlock-migrate recorded before it matched Flyway
//!   ([`legacy_checksum`]) for the unchanged file is rewritten to Flyway's once, logged
//!   (`history_checksum_corrected`) and reported in [`Report::corrected`]; any other mismatch is an
//!   edit and refused;
//! - an applied versioned file that was edited (or removed) is refused with a clear error, and
//!   nothing is applied;
//! - a repeatable that was applied but whose file is no longer in any location is *retired*: its
//!   rows stay (a migrator never deletes data it did not write in this run), nothing fails, and the
//!   run reports it in [`Report::retired`] and logs `repeatable_retired`. This is how a paydb that was
//!   once seeded with the synthetic accounts keeps working under the production history, which no
//!   longer carries the seed (docs/accounting.md, "Synthetic seed");
//! - each file runs in its own transaction together with its history row, under an advisory lock so
//!   that two migration Jobs cannot interleave; a second run is a no-op;
//! - a file that loses a race on a server-wide catalog (two databases of one server creating the
//!   same role at once) is run again with backoff ([`Retry`]); any other failure ends the run.

mod files;
mod history;

pub use files::{Kind, Migration, checksum, legacy_checksum, load_dir, load_dirs, parse_name};
pub use history::{
    AppliedRow, Report, Retry, applied, lost_catalog_race, migrate, migrate_with, set_role_password,
    set_role_password_with,
};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot read migrations from {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{file}: not a migration file name; expected V<n>__<snake_case>.sql or R__<snake_case>.sql")]
    BadName { file: String },
    #[error("two migration files claim version {version}: {first} and {second}")]
    DuplicateVersion {
        version: i64,
        first: String,
        second: String,
    },
    #[error("two repeatable migrations share the description {description:?}")]
    DuplicateRepeatable { description: String },
    #[error(
        "migration {script} (version {version}) was edited after it was applied: recorded checksum {recorded}, file checksum {found}. Applied migrations are immutable; revert the edit and add V<n+1> instead"
    )]
    ChecksumMismatch {
        version: String,
        script: String,
        recorded: i32,
        found: i32,
    },
    #[error("migration version {version} ({script}) is recorded as applied but its file is missing")]
    MissingFile { version: String, script: String },
    #[error(
        "migration {script} (version {version}) is older than the applied version {latest} and was never applied; migrations must be added with increasing versions"
    )]
    OutOfOrder {
        version: i64,
        script: String,
        latest: i64,
    },
    #[error("migration {script} failed: {source}")]
    Failed { script: String, source: sqlx::Error },
    #[error(
        "a previous run of {script} failed and is recorded so; repair the database by hand before migrating again"
    )]
    PreviousFailure { script: String },
    #[error(
        "the history row of {script} changed while its checksum was being corrected (another migrator outside dlock-migrate's lock?); nothing was corrected, run again"
    )]
    HistoryChanged { script: String },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
