//! Restore fast-forward (C1 §1.7). Restoring lockdb from a backup rewinds `fencing_token_seq`
//! below tokens the resources have already seen; every new grant is then fenced out (safe, but the
//! system is dead) until the sequence is moved past the highest token any resource accepted:
//! `max(rail_high_water.highest_token)`, `max(account.fence)`, `max(ledger_entry.fence)` and
//! `max(payout.claim_token)` of every paydb that uses the lock service.
//!
//! The operator runs [`read`] and [`advance`] as Jobs (`dlock-fastforward read|advance`), with the
//! database URLs from Secrets; the local drill (`dlock drill restore`) calls them directly.

pub mod sql;

use std::time::Duration;

use serde::Serialize;
use sqlx::{Connection, PgConnection};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One database could not be read or written. `what` names it (e.g. "paydb of PaymentStack
    /// payments"); the URL is never part of the message (it may hold a password).
    #[error("{what}: {message}")]
    Database { what: String, message: String },
    #[error("--at-least must be a positive integer, got {0}")]
    Target(i64),
}

/// The highest tokens one paydb has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HighWater {
    pub rail_high_water: i64,
    pub account_fence: i64,
    pub ledger_fence: i64,
    pub claim_token: i64,
    pub highest: i64,
}

async fn connect(what: &str, url: &str) -> Result<PgConnection, Error> {
    let db = |message: String| Error::Database {
        what: what.to_owned(),
        message,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(db(format!("cannot connect: {}", redact(&e)))),
        Err(_) => Err(db(format!(
            "cannot connect within {}s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// sqlx errors do not carry the URL, but a configuration error could: keep only the database's words.
fn redact(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.message().to_owned(),
        sqlx::Error::Configuration(_) => "invalid connection URL".to_owned(),
        other => other.to_string(),
    }
}

/// Reads one paydb's high-water marks. `what` names it in errors.
pub async fn read_high_water(what: &str, url: &str) -> Result<HighWater, Error> {
    let mut c = connect(what, url).await?;
    let (rail, account, ledger, claim): (i64, i64, i64, i64) = sqlx::query_as(sql::PAYDB_HIGH_WATER)
        .fetch_one(&mut c)
        .await
        .map_err(|e| Error::Database {
            what: what.to_owned(),
            message: redact(&e),
        })?;
    let _ = c.close().await;
    Ok(HighWater {
        rail_high_water: rail,
        account_fence: account,
        ledger_fence: ledger,
        claim_token: claim,
        highest: rail.max(account).max(ledger).max(claim),
    })
}

/// The highest token lockdb's sequence has handed out.
pub async fn read_sequence(url: &str) -> Result<i64, Error> {
    let mut c = connect("lockdb", url).await?;
    let v: i64 = sqlx::query_scalar(sql::SEQUENCE_ISSUED)
        .fetch_one(&mut c)
        .await
        .map_err(|e| Error::Database {
            what: "lockdb".into(),
            message: redact(&e),
        })?;
    let _ = c.close().await;
    Ok(v)
}

/// Before and after of one advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Advanced {
    pub before: i64,
    pub after: i64,
}

/// Moves the sequence so that it has handed out at least `at_least` (the next token is above it);
/// never lowers it. Idempotent: running it twice changes nothing the second time.
pub async fn advance(url: &str, at_least: i64) -> Result<Advanced, Error> {
    if at_least < 1 {
        return Err(Error::Target(at_least));
    }
    let mut c = connect("lockdb", url).await?;
    let db = |e: sqlx::Error| Error::Database {
        what: "lockdb".into(),
        message: redact(&e),
    };
    let before: i64 = sqlx::query_scalar(sql::SEQUENCE_ISSUED)
        .fetch_one(&mut c)
        .await
        .map_err(db)?;
    let after: i64 = sqlx::query_scalar(sql::ADVANCE)
        .bind(at_least)
        .fetch_one(&mut c)
        .await
        .map_err(db)?;
    let _ = c.close().await;
    Ok(Advanced { before, after })
}
