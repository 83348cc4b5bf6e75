//! The paydb rows this service reads and writes, as typed values. Money is `i64` minor units.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use dlock_common::payout::PayoutState;
/// The bodies that are also rows are defined once, in the wire crate.
pub use dlock_wire::payment::{AccountKind, Payout};

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
