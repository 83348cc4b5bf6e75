//! A PostgreSQL 16 server of its own holding one migrated database, named after its history
//! (`lockdb`, `paydb`): what the demo, the drill, the benchmarks and the fault campaign run their
//! stacks on. Tests share one server per history instead and clone a migrated template
//! ([`crate::lockdb`], [`crate::paydb`]).
//!
//! The database carries the synthetic seed ([`crate::demo_dirs`]), as every database outside
//! production does. Errors are returned, not panicked on: the developer commands report them.

use anyhow::{Context, Result};
use dlock_common::db::History;
use dlock_migrate::Report;
use sqlx::{Connection, PgConnection};

use crate::pg::PgServer;

/// The setup commits locally: a primary started with `synchronous_standby_names` and no standby
/// yet would otherwise wait for one at every commit (the standby's base backup, taken later,
/// carries everything set up here). On a server without one it changes nothing.
const LOCAL_COMMIT: &str = "SET synchronous_commit = local";

/// Starts a server (`label` names its data folder; `settings` are extra `-c name=value`) and
/// creates `history`'s database on it, migrated. The server is started off the async runtime:
/// initdb and the start wait on processes.
pub async fn start(label: &str, settings: &[(&str, &str)], history: History) -> Result<(PgServer, Report)> {
    let label = label.to_owned();
    let settings: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let server = tokio::task::spawn_blocking(move || {
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        PgServer::start_with(&label, &settings)
    })
    .await
    .context("start postgres")?
    .with_context(|| format!("start PostgreSQL 16 for {}", history.name()))?;
    let report = create(&server, history).await?;
    Ok((server, report))
}

/// Creates `history`'s database on `server` as the superuser and applies its history and seed.
pub async fn create(server: &PgServer, history: History) -> Result<Report> {
    let mut admin = connect(&server.url("postgres", "postgres")).await?;
    // The name is one of the two history names, not input.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {}", history.name())))
        .execute(&mut admin)
        .await
        .with_context(|| format!("create the database {}", history.name()))?;
    let _ = admin.close().await;
    let mut db = connect(&server.url("postgres", history.name())).await?;
    let files = dlock_migrate::load_dirs(&crate::demo_dirs(history))
        .with_context(|| format!("load the {} migrations", history.name()))?;
    let report = dlock_migrate::migrate(&mut db, &files)
        .await
        .with_context(|| format!("migrate {} on port {}", history.name(), server.port))?;
    let _ = db.close().await;
    Ok(report)
}

/// A superuser connection whose commits are local (see [`LOCAL_COMMIT`]).
async fn connect(url: &str) -> Result<PgConnection> {
    let mut conn = PgConnection::connect(url)
        .await
        .with_context(|| format!("connect {url}"))?;
    sqlx::raw_sql(LOCAL_COMMIT).execute(&mut conn).await?;
    Ok(conn)
}
