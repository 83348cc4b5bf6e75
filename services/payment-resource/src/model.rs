//! The paydb rows this service reads and writes, as typed values. Money is `i64` minor units.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use dlock_common::payout::PayoutState;

/// `account.kind` (V3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccountKind {
    Customer,
    Settlement,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::Customer => "CUSTOMER",
            AccountKind::Settlement => "SETTLEMENT",
        }
    }
}

impl TryFrom<String> for AccountKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "CUSTOMER" => Ok(AccountKind::Customer),
            "SETTLEMENT" => Ok(AccountKind::Settlement),
            _ => Err(format!("unknown account kind {s:?}")),
        }
    }
}

/// `ledger_entry.direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Direction {
    Debit,
    Credit,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Debit => "DEBIT",
            Direction::Credit => "CREDIT",
        }
    }
}

impl TryFrom<String> for Direction {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "DEBIT" => Ok(Direction::Debit),
            "CREDIT" => Ok(Direction::Credit),
            _ => Err(format!("unknown direction {s:?}")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Payout {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    #[sqlx(try_from = "String")]
    pub state: PayoutState,
    pub claimed_by: Option<String>,
    pub claim_token: Option<i64>,
    pub idempotency_key: String,
    pub attempt_count: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The amount this payout holds against its account (V4): its amount from RAIL_SUBMITTED until
    /// it is POSTED (the hold became the debit), FAILED or ABANDONED (released); 0 otherwise.
    pub reserved_minor: i64,
    /// The grant that made the reservation (kept after release, for the audit trail).
    pub reserved_token: Option<i64>,
    /// Why the payout ended FAILED or ABANDONED (e.g. INSUFFICIENT_FUNDS, RAIL_REJECTED,
    /// RAIL_NEVER_RECEIVED).
    pub failure_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Account {
    pub account_id: Uuid,
    pub currency: String,
    #[sqlx(try_from = "String")]
    pub kind: AccountKind,
    pub balance_minor: i64,
    pub opening_balance_minor: i64,
    pub fence: i64,
    /// Σ of the holds of this account's payouts in flight (V4); `balance_minor - reserved_minor` is
    /// what a new reservation may take.
    pub reserved_minor: i64,
}

/// An account with its ledger sums recomputed from `ledger_entry` (the P5 read).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AccountWithLedger {
    #[sqlx(flatten)]
    pub account: Account,
    pub ledger_debit_minor: i64,
    pub ledger_credit_minor: i64,
    /// Σ amount of POSTED payouts in this currency; what a SETTLEMENT account's credits must equal.
    pub posted_payouts_minor: i64,
}

/// What the reservation (r) returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Reserved {
    pub balance_minor: i64,
    pub reserved_minor: i64,
    pub fence: i64,
}

/// The result of the diagnostic read `SELECT fence, balance_minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct FenceAndBalance {
    pub fence: i64,
    pub balance_minor: i64,
}
