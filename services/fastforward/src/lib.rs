//! Restore fast-forward (C1 §1.7). Restoring lockdb from a backup rewinds `fencing_token_seq`
//! below tokens the resources have already seen; every new grant is then fenced out (safe, but the
//! system is dead) until the sequence is moved past the highest token any resource accepted:
//! `max(rail_high_water.highest_token)`, `max(account.fence)`, `max(ledger_entry.fence)` and
//! `max(payout.claim_token)` of every paydb that uses the lock service.
//!
//! The operator runs [`read`] and [`advance`] as Jobs (`dlock-fastforward read|advance`), with the
//! database URLs from Secrets; the local drill (`dlock drill restore`) calls them directly.
//!
//! On the etcd backend the token is etcd's revision, and restoring an etcd snapshot rewinds the
//! revision exactly as restoring lockdb rewinds the sequence. A revision cannot be `setval`'d on a
//! running cluster; it can only be raised while the snapshot is restored (`etcdutl snapshot restore
//! --bump-revision N --mark-compacted`), so the etcd fast-forward is [`etcd_bump`], which computes
//! that `N` from the same high-water read (`dlock-fastforward etcd-bump`).

pub mod sql;

/// The margin added to the high-water mark when nobody names one: the tokens handed out but not
/// yet presented to any resource when the high-water was read (the operator's restore action takes
/// the same default).
pub const DEFAULT_MARGIN: i64 = 1_000;

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
    #[error("{what} must not be negative, got {value}")]
    Negative { what: &'static str, value: i64 },
    #[error("high-water {high_water} + margin {margin} does not fit a 64-bit etcd revision")]
    Overflow { high_water: i64, margin: i64 },
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
    // The common connect: the CA file of sslrootcert checked first, and a server certificate
    // that does not verify explained with the host and the CA file. Its messages name the server
    // (host:port/database) but never carry the URL's password.
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        dlock_common::db::connect(url, "dlock-fastforward"),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(db(e.to_string())),
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

/// How far an etcd snapshot's revision must be raised while it is restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBump {
    /// The revision the snapshot holds (`etcdutl snapshot status`'s REVISION).
    pub snapshot_revision: i64,
    /// The highest token any paydb has seen.
    pub high_water: i64,
    pub margin: i64,
    /// `--bump-revision` for `etcdutl snapshot restore` (0: the snapshot is already far enough).
    pub bump: i64,
    /// The revision of the restored member; the first grant after the restore is above it.
    pub restored_revision: i64,
}

/// `bump = max(0, high_water + margin - snapshot_revision)`: after `etcdutl snapshot restore
/// --bump-revision bump` the member's revision is `max(snapshot_revision, high_water + margin)`, so
/// the next grant's token (the next revision) is above every token a resource has seen plus the
/// margin. The margin covers what the read cannot see: tokens handed out but not yet presented to
/// any paydb, and the revisions etcd spent on sessions, leases and releases after the snapshot.
///
/// Never lowers: a snapshot that is already past the target needs no bump (0). Negative inputs are
/// refused rather than clamped (a negative revision or margin is a caller's mistake, and clamping
/// would hide it); so is a target beyond `i64::MAX`, the largest revision etcd can hold.
pub fn etcd_bump(snapshot_revision: i64, high_water: i64, margin: i64) -> Result<EtcdBump, Error> {
    for (what, value) in [
        ("the snapshot revision", snapshot_revision),
        ("the high-water", high_water),
        ("the margin", margin),
    ] {
        if value < 0 {
            return Err(Error::Negative { what, value });
        }
    }
    let target = high_water
        .checked_add(margin)
        .ok_or(Error::Overflow { high_water, margin })?;
    // Both are non-negative, so the difference cannot overflow.
    let bump = (target - snapshot_revision).max(0);
    Ok(EtcdBump {
        snapshot_revision,
        high_water,
        margin,
        bump,
        restored_revision: snapshot_revision.max(target),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bump_lifts_the_restored_revision_to_high_water_plus_margin() {
        let b = etcd_bump(120, 175, 1000).unwrap();
        assert_eq!((b.bump, b.restored_revision), (1055, 1175));
        assert_eq!(b.snapshot_revision + b.bump, b.high_water + b.margin);
        // Nothing seen beyond the snapshot: the margin alone.
        assert_eq!(etcd_bump(120, 120, 50).unwrap().bump, 50);
        // Margin 0 still puts the next grant above the high-water (it is restored + 1).
        let b = etcd_bump(120, 175, 0).unwrap();
        assert_eq!((b.bump, b.restored_revision), (55, 175));
        // A fresh cluster and empty paydbs.
        assert_eq!(etcd_bump(0, 0, 0).unwrap().bump, 0);
    }

    #[test]
    fn a_snapshot_already_past_the_target_is_never_lowered() {
        let b = etcd_bump(5000, 175, 1000).unwrap();
        assert_eq!((b.bump, b.restored_revision), (0, 5000));
        let b = etcd_bump(1175, 175, 1000).unwrap();
        assert_eq!((b.bump, b.restored_revision), (0, 1175));
        assert_eq!(etcd_bump(1174, 175, 1000).unwrap().bump, 1);
    }

    #[test]
    fn negative_inputs_are_refused() {
        for (r, h, m) in [(-1, 175, 1000), (120, -1, 1000), (120, 175, -1), (i64::MIN, 0, 0)] {
            let e = etcd_bump(r, h, m).unwrap_err();
            assert!(matches!(e, Error::Negative { .. }), "{r} {h} {m}: {e}");
        }
        assert_eq!(
            etcd_bump(1, 2, -3).unwrap_err().to_string(),
            "the margin must not be negative, got -3"
        );
    }

    #[test]
    fn targets_beyond_the_largest_revision_are_refused_not_wrapped() {
        let e = etcd_bump(0, i64::MAX, 1).unwrap_err();
        assert!(matches!(e, Error::Overflow { .. }), "{e}");
        assert!(etcd_bump(0, i64::MAX - 10, 11).is_err());
        // The largest representable target is fine, from any snapshot revision.
        let b = etcd_bump(0, i64::MAX - 10, 10).unwrap();
        assert_eq!((b.bump, b.restored_revision), (i64::MAX, i64::MAX));
        let b = etcd_bump(i64::MAX, i64::MAX, 0).unwrap();
        assert_eq!((b.bump, b.restored_revision), (0, i64::MAX));
    }
}
