//! Every promotion is a restore: lock-server grants nothing on a lockdb history it cannot vouch for
//! until it has moved `fencing_token_seq` above anything that history can have handed out
//! ([`sql::JUMP_SEQUENCE`]; docs/design.md, "Never a reused token").
//!
//! Replication narrows the gap but does not close it: an asynchronous standby, a cancelled
//! synchronous wait, a promoted lagging standby or a restored backup can each start a lockdb whose
//! sequence is behind tokens already handed out (C1 §1.7). As ZooKeeper starts a new epoch with
//! each leader, whatever the old leader lost, lock-server starts a new range of tokens whenever the
//! history behind its connections is one it has not vouched for:
//! - its own start (nothing vouched yet);
//! - a new system identifier or database (a fresh cluster, a logical restore, a database dropped and
//!   created again);
//! - a new timeline (a promotion, a restore with recovery, a `pg_rewind`);
//! - a postmaster that restarted under it (a crash, a restored file-system copy keeps the timeline).
//!
//! Only the batches' own connections grant ([`super::batch::own_pool`]), and each of them is checked
//! when it is opened, before any statement runs on it: a failover, a restart or a restore breaks
//! every connection, so the first grant on the new history waits for the jump. Until the jump is
//! done the connection is not handed out, and acquires answer 503 `UNAVAILABLE` when the pool's
//! wait ends. The pool retries with backoff, so a jump that failed (lockdb still in recovery) is
//! tried again.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use dlock_wire::lock::{JumpCause, SequenceJump};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sqlx::PgConnection;

use super::sql;

/// How far above the value it finds a jump moves the sequence: more tokens than any standby can lag
/// behind by. A BIGINT holds 2^31 such jumps.
pub const JUMP: i64 = 1 << 32;

/// Each timeline's tokens start at least at `timeline * TIMELINE_BAND`: 2^16 jumps fit in one band,
/// so a promoted standby's first token is above every token of the timeline it left, jumps it never
/// received included. Timelines are capped at 2^14 (the floor stays inside a BIGINT).
pub const TIMELINE_BAND: i64 = 1 << 48;

/// The floor rises by this many tokens per millisecond of the database clock (about a million a
/// second: more than any lockdb grants), so a history restored on the same timeline, later, jumps
/// above a jump it lacks.
pub const TOKENS_PER_MS: i64 = 1 << 10;

/// Where the floor's clock starts: 2026-01-01T00:00:00Z in Unix milliseconds.
pub const FLOOR_EPOCH_MS: i64 = 1_767_225_600_000;

/// The advisory lock every jump takes ("dlockseq" in ASCII): jumps of several replicas run one after
/// the other, never interleaved.
pub const JUMP_LOCK: i64 = 0x646c_6f63_6b73_6571;

/// The history a connection reached ([`sql::HISTORY`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct History {
    pub system_identifier: String,
    pub database_oid: i64,
    pub timeline: i64,
    pub postmaster_started: DateTime<Utc>,
}

/// Why lock-server could not vouch for a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Cause {
    /// This process had vouched for no history yet.
    start,
    /// Another cluster or database: a fresh initdb, a logical restore, a database dropped and
    /// created again from a backup.
    new_system,
    /// The same cluster on another timeline: a promotion, a restore with recovery, a rewind.
    new_timeline,
    /// The same timeline, another postmaster: a restart, a crash, a restored file-system copy.
    postmaster_restart,
}

impl Cause {
    /// Why `found` is not the history vouched for; `None`: it is.
    pub fn between(vouched: Option<&History>, found: &History) -> Option<Cause> {
        let Some(v) = vouched else {
            return Some(Cause::start);
        };
        if v.system_identifier != found.system_identifier || v.database_oid != found.database_oid {
            Some(Cause::new_system)
        } else if v.timeline != found.timeline {
            Some(Cause::new_timeline)
        } else if v.postmaster_started != found.postmaster_started {
            Some(Cause::postmaster_restart)
        } else {
            None
        }
    }

    /// As `GET /v1/sequence` says it.
    pub fn wire(self) -> JumpCause {
        match self {
            Cause::start => JumpCause::Start,
            Cause::new_system => JumpCause::NewSystem,
            Cause::new_timeline => JumpCause::NewTimeline,
            Cause::postmaster_restart => JumpCause::PostmasterRestart,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::start => "start",
            Cause::new_system => "new_system",
            Cause::new_timeline => "new_timeline",
            Cause::postmaster_restart => "postmaster_restart",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: Cause,
}

/// What this process vouches for, and its jumps.
#[derive(Debug)]
pub struct Epochs {
    /// `None`: the negative control's statements, which never jump (nothing is checked).
    jump: Option<&'static str>,
    /// The history every connection that grants was checked against. Held across the check and the
    /// jump, so connections opened together to a new history make one jump, not one each.
    vouched: tokio::sync::Mutex<Option<History>>,
    last: Mutex<Option<SequenceJump>>,
    jumps: Family<CauseLabels, Counter>,
}

impl Epochs {
    pub fn new(jump: Option<&'static str>) -> Self {
        let jumps = Family::<CauseLabels, Counter>::default();
        // Every cause exported from the start (as 0), so alerts need no special case.
        for cause in [
            Cause::start,
            Cause::new_system,
            Cause::new_timeline,
            Cause::postmaster_restart,
        ] {
            let _ = jumps.get_or_create(&CauseLabels { cause });
        }
        Self {
            jump,
            vouched: tokio::sync::Mutex::new(None),
            last: Mutex::new(None),
            jumps,
        }
    }

    /// Jumps counted by cause (`lock_sequence_jumps_total`).
    pub fn jumps(&self) -> &Family<CauseLabels, Counter> {
        &self.jumps
    }

    /// The last jump this process made.
    pub fn last(&self) -> Option<SequenceJump> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether this process jumps at all (false only for the negative control).
    pub fn enabled(&self) -> bool {
        self.jump.is_some()
    }

    /// Run on every new connection that will grant, before it is handed out: reads the history it
    /// reached and, if it is not the one vouched for, jumps the sequence on it first. An error
    /// leaves the history unvouched, so the next connection tries again.
    pub async fn vouch(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let Some(jump) = self.jump else {
            return Ok(());
        };
        let found: History = sqlx::query_as(sql::HISTORY).fetch_one(&mut *conn).await?;
        let mut vouched = self.vouched.lock().await;
        let Some(cause) = Cause::between(vouched.as_ref(), &found) else {
            return Ok(());
        };
        let (from, to): (i64, i64) = sqlx::query_as(jump)
            .bind(JUMP_LOCK)
            .bind(JUMP)
            .bind(TIMELINE_BAND)
            .bind(TOKENS_PER_MS)
            .bind(FLOOR_EPOCH_MS)
            .fetch_one(&mut *conn)
            .await?;
        tracing::warn!(
            event = "sequence_jumped",
            cause = cause.as_str(),
            found = from,
            jumped_to = to,
            system_identifier = %found.system_identifier,
            timeline = found.timeline,
            postmaster_started = %found.postmaster_started,
            "lockdb's history could not be vouched for: fencing_token_seq moved above anything it can have handed out before any grant"
        );
        self.jumps.get_or_create(&CauseLabels { cause }).inc();
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(SequenceJump {
            at: Utc::now(),
            cause: cause.wire(),
            found: from,
            jumped_to: to,
            system_identifier: found.system_identifier.clone(),
            timeline: found.timeline,
            postmaster_started: found.postmaster_started,
        });
        *vouched = Some(found);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(system: &str, timeline: i64, started_secs: i64) -> History {
        History {
            system_identifier: system.to_owned(),
            database_oid: 16384,
            timeline,
            postmaster_started: DateTime::from_timestamp(started_secs, 0).unwrap_or_default(),
        }
    }

    #[test]
    fn every_change_of_history_is_a_cause_and_the_same_history_is_none() {
        let h = history("7", 1, 100);
        assert_eq!(Cause::between(None, &h), Some(Cause::start));
        assert_eq!(Cause::between(Some(&h), &h), None);
        assert_eq!(
            Cause::between(Some(&h), &history("8", 1, 100)),
            Some(Cause::new_system)
        );
        let recreated = History {
            database_oid: 16999,
            ..h.clone()
        };
        assert_eq!(Cause::between(Some(&h), &recreated), Some(Cause::new_system));
        assert_eq!(
            Cause::between(Some(&h), &history("7", 2, 100)),
            Some(Cause::new_timeline)
        );
        assert_eq!(
            Cause::between(Some(&h), &history("7", 1, 101)),
            Some(Cause::postmaster_restart)
        );
    }

    #[test]
    fn the_bands_and_jumps_fit_a_bigint() {
        // 2^16 jumps per timeline band, 2^31 jumps in all.
        assert_eq!(TIMELINE_BAND / JUMP, 1 << 16);
        assert_eq!(i64::MAX / JUMP, (1 << 31) - 1);
        // The statement's largest timeline part (capped at 16383) leaves the clock part more than
        // 100,000 years.
        let timeline_part = 16383_i64 * TIMELINE_BAND;
        let ms_left = (i64::MAX - timeline_part) / TOKENS_PER_MS;
        assert!(ms_left / (365 * 24 * 3_600_000) > 100_000);
        // 2026-01-01T00:00:00Z.
        assert_eq!(
            DateTime::from_timestamp_millis(FLOOR_EPOCH_MS).map(|t| t.to_rfc3339()),
            Some("2026-01-01T00:00:00+00:00".to_owned())
        );
    }
}
