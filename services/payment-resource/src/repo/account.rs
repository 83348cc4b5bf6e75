//! `account`: statement (a), the diagnostic read, creation and the recomputed-ledger read.

use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::model::{Account, AccountKind, AccountWithLedger, FenceAndBalance, Reserved};
use crate::sql;

/// Statement (a) (`stmt` is [`sql::Statements::account_debit`]): debit and advance the fence. `None`
/// is zero rows: fenced out *or* insufficient funds — the predicate conflates them.
pub async fn debit(
    conn: &mut PgConnection,
    stmt: &'static str,
    account_id: Uuid,
    currency: &str,
    amount_minor: i64,
    token: i64,
) -> Result<Option<FenceAndBalance>, sqlx::Error> {
    sqlx::query_as::<_, FenceAndBalance>(stmt)
        .bind(account_id)
        .bind(currency)
        .bind(amount_minor)
        .bind(token)
        .fetch_optional(conn)
        .await
}

/// The reservation (r) (`stmt` is [`sql::Statements::account_reserve`]). `None` is zero rows: the
/// account cannot cover the amount *or* a newer grant has written it — the caller classifies.
pub async fn reserve(
    conn: &mut PgConnection,
    stmt: &'static str,
    account_id: Uuid,
    currency: &str,
    amount_minor: i64,
    token: i64,
) -> Result<Option<Reserved>, sqlx::Error> {
    sqlx::query_as::<_, Reserved>(stmt)
        .bind(account_id)
        .bind(currency)
        .bind(amount_minor)
        .bind(token)
        .fetch_optional(conn)
        .await
}

/// Gives `amount_minor` of the account's holds back. `None`: no such account.
pub async fn release(
    conn: &mut PgConnection,
    account_id: Uuid,
    amount_minor: i64,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar::<_, i64>(sql::ACCOUNT_RELEASE)
        .bind(account_id)
        .bind(amount_minor)
        .fetch_optional(conn)
        .await
}

/// The diagnostic `SELECT fence, balance_minor`.
pub async fn fence_and_balance<'c>(
    ex: impl PgExecutor<'c>,
    account_id: Uuid,
) -> Result<Option<FenceAndBalance>, sqlx::Error> {
    sqlx::query_as::<_, FenceAndBalance>(sql::ACCOUNT_FENCE_AND_BALANCE)
        .bind(account_id)
        .fetch_optional(ex)
        .await
}

/// `None`: the id, or the currency's settlement account, already exists.
pub async fn insert<'c>(
    ex: impl PgExecutor<'c>,
    account_id: Uuid,
    currency: &str,
    opening_balance_minor: i64,
    kind: AccountKind,
) -> Result<Option<Account>, sqlx::Error> {
    sqlx::query_as::<_, Account>(sql::ACCOUNT_INSERT)
        .bind(account_id)
        .bind(currency)
        .bind(opening_balance_minor)
        .bind(kind.as_str())
        .fetch_optional(ex)
        .await
}

pub async fn by_id<'c>(ex: impl PgExecutor<'c>, account_id: Uuid) -> Result<Option<Account>, sqlx::Error> {
    sqlx::query_as::<_, Account>(sql::ACCOUNT_BY_ID)
        .bind(account_id)
        .fetch_optional(ex)
        .await
}

pub async fn with_ledger<'c>(
    ex: impl PgExecutor<'c>,
    account_id: Uuid,
) -> Result<Option<AccountWithLedger>, sqlx::Error> {
    sqlx::query_as::<_, AccountWithLedger>(sql::ACCOUNT_WITH_LEDGER)
        .bind(account_id)
        .fetch_optional(ex)
        .await
}

pub async fn settlement_id<'c>(ex: impl PgExecutor<'c>, currency: &str) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar::<_, Uuid>(sql::SETTLEMENT_ACCOUNT_ID)
        .bind(currency)
        .fetch_optional(ex)
        .await
}
