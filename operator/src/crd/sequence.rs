//! `status.sequence` of a LockService with backend postgres: the last jump of `fencing_token_seq`
//! lock-server made (`GET /v1/sequence`). lock-server jumps the sequence before the first grant on
//! a lockdb history it cannot vouch for — its own start, a new system identifier, a new timeline (a
//! promotion), a restarted postmaster — above anything that history can have handed out
//! (docs/design.md, "Never a reused token: every promotion is a restore").
//!
//! The jump's fields deserialize straight from lock-server's answer (`dlock_wire::lock::SequenceJump`,
//! camelCase, times as RFC 3339 text), so what status shows is what lock-server said.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why lock-server jumped the sequence (lock-server's own words: `snake_case`, as in its log event
/// `sequence_jumped` and the counter `lock_sequence_jumps_total{cause}`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JumpCause {
    /// The lock-server process had vouched for no history yet (it started).
    Start,
    /// Another cluster or database: a fresh initdb, a logical restore, a database dropped and
    /// created again from a backup.
    NewSystem,
    /// The same cluster on another timeline: a promotion, a restore with recovery, a rewind.
    NewTimeline,
    /// The same timeline, another postmaster: a restart, a crash, a restored file-system copy.
    PostmasterRestart,
}

impl JumpCause {
    /// As lock-server writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            JumpCause::Start => "start",
            JumpCause::NewSystem => "new_system",
            JumpCause::NewTimeline => "new_timeline",
            JumpCause::PostmasterRestart => "postmaster_restart",
        }
    }

    /// What happened under lock-server, in a few words (for the Event).
    pub fn describe(self) -> &'static str {
        match self {
            JumpCause::Start => "lock-server started",
            JumpCause::NewSystem => {
                "a new lockdb cluster or database: a fresh initdb, a logical restore, a database created again"
            }
            JumpCause::NewTimeline => {
                "a new timeline of lockdb: a promotion, a restore with recovery or a rewind"
            }
            JumpCause::PostmasterRestart => {
                "lockdb's postmaster restarted: a crash, a restart or a restored file-system copy"
            }
        }
    }
}

impl std::fmt::Display for JumpCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One jump of `fencing_token_seq`, as lock-server reported it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SequenceJump {
    /// When lock-server jumped (RFC 3339, lock-server's clock).
    pub at: String,
    pub cause: JumpCause,
    /// What `nextval` found: above every token the history had handed out.
    pub found: i64,
    /// What the sequence was set to: every later token is above it.
    pub jumped_to: i64,
    /// The lockdb history jumped on: the cluster's system identifier, the timeline it writes on,
    /// when its postmaster started (RFC 3339).
    pub system_identifier: String,
    pub timeline: i64,
    pub postmaster_started: String,
}

impl SequenceJump {
    /// The lockdb history the jump was made on: a promotion or a restore changes it.
    pub fn history(&self) -> (&str, i64, &str) {
        (&self.system_identifier, self.timeline, &self.postmaster_started)
    }
}

/// `status.sequence`: the newest jump lock-server reported, and the fencing check it asked for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct SequenceStatus {
    /// `false` only for a lock-server run with the jump switched off (a negative control).
    pub jumps_enabled: bool,
    /// The newest jump any lock-server replica reported (each replica reports its own last one;
    /// the operator keeps the newest it has read). Absent until the first grant's connection made
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_jump: Option<SequenceJump>,
    /// The fencing check Job a jump on a new lockdb history (a promotion, a restore, a restart)
    /// asked for, until its comparison of the sequence with the paydbs' high-water is in
    /// `status.fencing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_check: Option<String>,
    /// The restore fast-forward the operator started itself (request id `promotion-<hash>`, in
    /// `status.actions` like a requested one) because that check found the sequence behind a token
    /// a paydb has seen, until it is finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<String>,
}
