//! The final state of a run, read once every fault has healed and the stack has drained: paydb's
//! tables as they are, the rail's ground truth (rail-stub's `GET /v1/received`), payment-resource's
//! reconciliation report, and the lock store's sequence. Together with the history
//! ([`crate::history`]) it is everything the checker ([`crate::check`]) reads.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use dlock_wire::stub::ReceivedReport;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct AccountRow {
    pub account_id: Uuid,
    /// `CUSTOMER` or `SETTLEMENT`.
    pub kind: String,
    pub currency: String,
    pub opening_balance_minor: i64,
    pub balance_minor: i64,
    pub reserved_minor: i64,
    pub fence: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct PayoutRow {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub state: String,
    pub claim_token: Option<i64>,
    pub reserved_minor: i64,
    pub reserved_token: Option<i64>,
    pub failure_reason: Option<String>,
    pub idempotency_key: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct LedgerRow {
    pub entry_id: Uuid,
    pub payout_id: Uuid,
    pub account_id: Uuid,
    /// `DEBIT` or `CREDIT`.
    pub direction: String,
    pub amount_minor: i64,
    pub fence: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RailSubmissionRow {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    /// The payout's account (joined), so tokens can be grouped per account as (d) groups them.
    pub account_id: Uuid,
    pub presented_token: i64,
    /// `ACKED`, `REJECTED`, `TIMEOUT`, `FENCED`, or none yet.
    pub outcome: Option<String>,
    pub submitted_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub abandoned_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct HighWaterRow {
    pub account_id: Uuid,
    pub highest_token: i64,
}

/// One fault the nemesis applied, as scheduled from the seed and as it actually ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// `pause`, `kill`, `database`, `partition`, `clock`, `rail`, `failover`.
    pub nemesis: String,
    /// What exactly (`SIGSTOP executor-2 for 2.4 s`, `pg_ctl stop -m immediate paydb`, …).
    pub what: String,
    pub target: String,
    pub start_ns: u64,
    pub healed_ns: u64,
}

/// How the run went, beside the tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub seed: u64,
    /// `postgres` or `etcd`.
    pub backend: String,
    pub nemeses: Vec<String>,
    pub faults: Vec<FaultRecord>,
    /// When the last fault healed (run clock).
    pub last_heal_ns: u64,
    /// When the final state was read (run clock).
    pub ended_ns: u64,
    /// Every payout must have ended within this long after `last_heal_ns`.
    pub settle_bound_ns: u64,
    /// The kill switches, as the stack ran (a positive control turns them off).
    pub payment_fencing: bool,
    pub rail_fencing: bool,
    /// The replicated databases (`lockdb`, `paydb`: a primary with a streaming standby, for the
    /// failover nemesis) and their mode (`sync`, `async`); empty when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicated: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<String>,
    /// False when lock-server ran with `DLOCK_UNSAFE_NO_SEQUENCE_JUMP=true` (a negative control: no
    /// sequence jump on a lockdb history it cannot vouch for).
    #[serde(default = "yes")]
    pub sequence_jump: bool,
    /// Every HTTP hop served HTTPS under the run's CA, checked at the start (a plain request to a
    /// link and a client without the CA to a service both refused). False for a `--plaintext` run,
    /// and for records made before the campaign ran with TLS.
    #[serde(default)]
    pub tls: bool,
}

fn yes() -> bool {
    true
}

/// Everything read at the end of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalState {
    pub run: RunInfo,
    pub accounts: Vec<AccountRow>,
    pub payouts: Vec<PayoutRow>,
    pub ledger: Vec<LedgerRow>,
    pub rail_submissions: Vec<RailSubmissionRow>,
    pub rail_high_water: Vec<HighWaterRow>,
    /// The rail's own record of what it was asked and what it paid.
    pub rail: ReceivedReport,
    /// payment-resource's `GET /v1/reconciliation` (with the rail comparison); `clean` must be true.
    pub reconciliation: serde_json::Value,
    /// lockdb's `fencing_token_seq` last value, or etcd's cluster revision, at the end.
    pub lock_sequence: Option<i64>,
}

/// The statements that read the final state (superuser, after the run; never on a hot path).
pub mod sql {
    pub const ACCOUNTS: &str = "SELECT account_id, kind, currency::text AS currency, opening_balance_minor, \
        balance_minor, reserved_minor, fence FROM account ORDER BY account_id";
    pub const PAYOUTS: &str = "SELECT payout_id, account_id, amount_minor, currency::text AS currency, state, \
        claim_token, reserved_minor, reserved_token, failure_reason, idempotency_key, created_at, updated_at \
        FROM payout ORDER BY created_at, payout_id";
    pub const LEDGER: &str = "SELECT entry_id, payout_id, account_id, direction, amount_minor, fence, created_at \
        FROM ledger_entry ORDER BY account_id, fence, entry_id";
    pub const RAIL_SUBMISSIONS: &str = "SELECT s.submission_id, s.payout_id, p.account_id, s.presented_token, \
        s.outcome, s.submitted_at, s.resolved_at, s.abandoned_at \
        FROM rail_submission s JOIN payout p ON p.payout_id = s.payout_id \
        ORDER BY p.account_id, s.submitted_at, s.submission_id";
    pub const HIGH_WATER: &str = "SELECT account_id, highest_token FROM rail_high_water ORDER BY account_id";
}
