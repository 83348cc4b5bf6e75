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
}

pub async fn accounts<'c>(ex: impl PgExecutor<'c>) -> Result<Vec<Account>, sqlx::Error> {
    sqlx::query_as::<_, Account>(sql::RECON_ACCOUNTS)
        .fetch_all(ex)
        .await
}

pub async fn ledger_groups<'c>(ex: impl PgExecutor<'c>) -> Result<Vec<LedgerGroup>, sqlx::Error> {
    sqlx::query_as::<_, LedgerGroup>(sql::RECON_LEDGER_GROUPS)
        .fetch_all(ex)
        .await
}

pub async fn posted_by_currency<'c>(ex: impl PgExecutor<'c>) -> Result<Vec<PostedTotal>, sqlx::Error> {
    sqlx::query_as::<_, PostedTotal>(sql::RECON_POSTED_BY_CURRENCY)
        .fetch_all(ex)
        .await
}

pub async fn payout_legs<'c>(ex: impl PgExecutor<'c>) -> Result<Vec<PayoutLegs>, sqlx::Error> {
    sqlx::query_as::<_, PayoutLegs>(sql::RECON_PAYOUT_LEGS)
        .fetch_all(ex)
        .await
}
