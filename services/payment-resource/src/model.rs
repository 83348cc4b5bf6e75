//! The paydb rows this service reads and writes, as typed values. Money is `i64` minor units.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The `payout_state_ck` set (C1 §1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PayoutState {
    Pending,
    Claimed,
    RailSubmitted,
    RailAcked,
    RailAmbiguous,
    Posted,
    Failed,
    Abandoned,
}

impl PayoutState {
    pub const ALL: [PayoutState; 8] = [
        PayoutState::Pending,
        PayoutState::Claimed,
        PayoutState::RailSubmitted,
        PayoutState::RailAcked,
        PayoutState::RailAmbiguous,
        PayoutState::Posted,
        PayoutState::Failed,
        PayoutState::Abandoned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PayoutState::Pending => "PENDING",
            PayoutState::Claimed => "CLAIMED",
            PayoutState::RailSubmitted => "RAIL_SUBMITTED",
            PayoutState::RailAcked => "RAIL_ACKED",
            PayoutState::RailAmbiguous => "RAIL_AMBIGUOUS",
            PayoutState::Posted => "POSTED",
            PayoutState::Failed => "FAILED",
            PayoutState::Abandoned => "ABANDONED",
        }
    }

    /// No transition leaves these states.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            PayoutState::Posted | PayoutState::Failed | PayoutState::Abandoned
        )
    }

    /// The edges the executor may request through the transition endpoint. `RAIL_ACKED → POSTED`
    /// is not here: it only happens inside the posting transaction, statement (c).
    pub fn can_transition(from: PayoutState, to: PayoutState) -> bool {
        use PayoutState::*;
        matches!(
            (from, to),
            (Claimed, RailSubmitted)
                | (RailSubmitted, RailAcked)
                | (RailSubmitted, RailAmbiguous)
                | (RailAmbiguous, RailAcked)
                | (RailSubmitted, Failed)
                | (RailAmbiguous, Failed)
                | (Claimed, Failed)
                | (Claimed, Abandoned)
        )
    }
}

impl std::fmt::Display for PayoutState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for PayoutState {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        PayoutState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown payout state {s:?}"))
    }
}

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

/// The result of the diagnostic read `SELECT fence, balance_minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct FenceAndBalance {
    pub fence: i64,
    pub balance_minor: i64,
}
