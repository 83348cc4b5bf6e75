//! Read-only queries for reconciliation. The rules live in [`crate::reconcile`]; these only fetch.

use sqlx::PgExecutor;
use uuid::Uuid;

use crate::model::{Account, Direction, PayoutState};
use crate::sql;

/// Ledger legs of one account written by one grant in one direction.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LedgerGroup {
    pub account_id: Uuid,
    pub fence: i64,
    #[sqlx(try_from = "String")]
    pub direction: Direction,
    pub legs: i64,
    pub amount_minor: i64,
    pub payout_ids: Vec<Uuid>,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PostedTotal {
    pub currency: String,
    pub amount_minor: i64,
}

/// An account with the sum of the holds its payouts carry.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReconAccount {
    #[sqlx(flatten)]
    pub account: Account,
    pub held_minor: i64,
}

/// One payout and the shape of its legs.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PayoutLegs {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub currency: String,
    pub amount_minor: i64,
    #[sqlx(try_from = "String")]
    pub state: PayoutState,
    pub legs: i64,
    pub matching_debits: i64,
    pub matching_credits: i64,
    pub fences: Vec<i64>,
    /// Its rail attempts the rail acknowledged (0 or 1: one forwardable attempt per payout).
    pub acked_submissions: i64,
    /// Not terminal and unchanged for longer than the run's threshold.
    pub stuck: bool,
    pub claim_token: Option<i64>,
}

/// One keyset page of accounts after `after`.
pub async fn accounts_page<'c>(
    ex: impl PgExecutor<'c>,
    after: Uuid,
    limit: i64,
) -> Result<Vec<ReconAccount>, sqlx::Error> {
    sqlx::query_as::<_, ReconAccount>(sql::RECON_ACCOUNTS_PAGE)
        .bind(after)
        .bind(limit)
        .fetch_all(ex)
        .await
}

/// The ledger groups of the given accounts.
pub async fn ledger_groups<'c>(
    ex: impl PgExecutor<'c>,
    accounts: &[Uuid],
) -> Result<Vec<LedgerGroup>, sqlx::Error> {
    sqlx::query_as::<_, LedgerGroup>(sql::RECON_LEDGER_GROUPS)
        .bind(accounts)
        .fetch_all(ex)
        .await
}

pub async fn posted_by_currency<'c>(ex: impl PgExecutor<'c>) -> Result<Vec<PostedTotal>, sqlx::Error> {
    sqlx::query_as::<_, PostedTotal>(sql::RECON_POSTED_BY_CURRENCY)
        .fetch_all(ex)
        .await
}

/// One keyset page of payouts after `after`, with legs and rail attempts.
pub async fn payouts_page<'c>(
    ex: impl PgExecutor<'c>,
    after: Uuid,
    limit: i64,
    stuck_after_seconds: i64,
) -> Result<Vec<PayoutLegs>, sqlx::Error> {
    sqlx::query_as::<_, PayoutLegs>(sql::RECON_PAYOUTS_PAGE)
        .bind(after)
        .bind(limit)
        .bind(stuck_after_seconds)
        .fetch_all(ex)
        .await
}
