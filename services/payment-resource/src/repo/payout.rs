//! `payout`: creation, reads, keyset listing, claim/adopt, transitions and statement (c).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::model::{Payout, PayoutState};
use crate::sql;

/// A new PENDING payout. `None`: the idempotency key is taken (the caller reads that payout).
pub async fn insert<'c>(
    ex: impl PgExecutor<'c>,
    payout_id: Uuid,
    account_id: Uuid,
    amount_minor: i64,
    currency: &str,
    idempotency_key: &str,
) -> Result<Option<Payout>, sqlx::Error> {
    sqlx::query_as::<_, Payout>(sql::PAYOUT_INSERT)
        .bind(payout_id)
        .bind(account_id)
        .bind(amount_minor)
        .bind(currency)
        .bind(idempotency_key)
        .fetch_optional(ex)
        .await
}

pub async fn by_id<'c>(ex: impl PgExecutor<'c>, payout_id: Uuid) -> Result<Option<Payout>, sqlx::Error> {
    sqlx::query_as::<_, Payout>(sql::PAYOUT_BY_ID)
        .bind(payout_id)
        .fetch_optional(ex)
        .await
}

pub async fn by_idempotency_key<'c>(
    ex: impl PgExecutor<'c>,
    key: &str,
) -> Result<Option<Payout>, sqlx::Error> {
    sqlx::query_as::<_, Payout>(sql::PAYOUT_BY_IDEMPOTENCY_KEY)
        .bind(key)
        .fetch_optional(ex)
        .await
}

/// Reads and row-locks the payout inside a transaction that changes its hold.
pub async fn for_update(conn: &mut PgConnection, payout_id: Uuid) -> Result<Option<Payout>, sqlx::Error> {
    sqlx::query_as::<_, Payout>(sql::PAYOUT_FOR_UPDATE)
        .bind(payout_id)
        .fetch_optional(conn)
        .await
}

/// Claim (PENDING) or adopt (in flight under an older token). `account`: the account a verified
/// grant was for — only a payout of that account is claimed (the statement variant with the
/// predicate); `None` when no grant was verified. `None` back: nothing applied.
pub async fn claim<'c>(
    ex: impl PgExecutor<'c>,
    payout_id: Uuid,
    owner_id: &str,
    token: i64,
    account: Option<Uuid>,
) -> Result<Option<Payout>, sqlx::Error> {
    let query = match account {
        Some(a) => sqlx::query_as::<_, Payout>(sql::PAYOUT_CLAIM_FOR_ACCOUNT)
            .bind(payout_id)
            .bind(owner_id)
            .bind(token)
            .bind(a),
        None => sqlx::query_as::<_, Payout>(sql::PAYOUT_CLAIM)
            .bind(payout_id)
            .bind(owner_id)
            .bind(token),
    };
    query.fetch_optional(ex).await
}

/// `from → to` if the payout is in `from` and `claim_token <= token` (and, with `account`, belongs
/// to that account, as in [`claim`]). `None`: it is not.
pub async fn transition<'c>(
    ex: impl PgExecutor<'c>,
    payout_id: Uuid,
    from: PayoutState,
    to: PayoutState,
    token: i64,
    account: Option<Uuid>,
) -> Result<Option<Payout>, sqlx::Error> {
    let stmt = match account {
        Some(_) => sql::PAYOUT_TRANSITION_FOR_ACCOUNT,
        None => sql::PAYOUT_TRANSITION,
    };
    let query = sqlx::query_as::<_, Payout>(stmt)
        .bind(payout_id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(token);
    match account {
        Some(a) => query.bind(a),
        None => query,
    }
    .fetch_optional(ex)
    .await
}

/// Statement (c) (`stmt` is [`crate::sql::Statements::payout_post`]). `None` is zero rows: not
/// RAIL_ACKED, or a newer holder has claimed it.
pub async fn mark_posted(
    conn: &mut PgConnection,
    stmt: &'static str,
    payout_id: Uuid,
    token: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar::<_, String>(stmt)
        .bind(payout_id)
        .bind(token)
        .fetch_optional(conn)
        .await
}

/// CLAIMED → RAIL_SUBMITTED with the hold, after (r). `None`: not CLAIMED, or a newer claim.
pub async fn mark_reserved(
    conn: &mut PgConnection,
    payout_id: Uuid,
    token: i64,
) -> Result<Option<Payout>, sqlx::Error> {
    sqlx::query_as::<_, Payout>(sql::PAYOUT_MARK_RESERVED)
        .bind(payout_id)
        .bind(token)
        .fetch_optional(conn)
        .await
}

/// `from → to` (FAILED or ABANDONED), dropping the hold and recording `reason`. `None`: not in
/// `from`, or a newer claim.
pub async fn end(
    conn: &mut PgConnection,
    payout_id: Uuid,
    from: PayoutState,
    to: PayoutState,
    token: i64,
    reason: &str,
) -> Result<Option<Payout>, sqlx::Error> {
    sqlx::query_as::<_, Payout>(sql::PAYOUT_END)
        .bind(payout_id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(token)
        .bind(reason)
        .fetch_optional(conn)
        .await
}

/// `true`: a rail attempt exists that rail-proxy has not abandoned.
pub async fn has_live_attempt(conn: &mut PgConnection, payout_id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar::<_, bool>(sql::PAYOUT_HAS_LIVE_ATTEMPT)
        .bind(payout_id)
        .fetch_one(conn)
        .await
}

/// Inside the posting transaction: the payout's hold becomes the debit.
pub async fn clear_reservation(conn: &mut PgConnection, payout_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(sql::PAYOUT_CLEAR_RESERVATION)
        .bind(payout_id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Keyset position: the last (created_at, payout_id) of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct After {
    pub created_at: DateTime<Utc>,
    pub payout_id: Uuid,
}

/// PENDING payouts, oldest first, `limit` at most, strictly after `after`.
/// Payouts in one in-flight state (not PENDING, not terminal), keyset-paged.
pub async fn list_in_state<'c>(
    ex: impl PgExecutor<'c>,
    state: &str,
    after: Option<After>,
    limit: i64,
) -> Result<Vec<Payout>, sqlx::Error> {
    match after {
        None => {
            sqlx::query_as::<_, Payout>(sql::PAYOUT_LIST_IN_STATE_FIRST)
                .bind(state)
                .bind(limit)
                .fetch_all(ex)
                .await
        }
        Some(a) => {
            sqlx::query_as::<_, Payout>(sql::PAYOUT_LIST_IN_STATE_AFTER)
                .bind(state)
                .bind(a.created_at)
                .bind(a.payout_id)
                .bind(limit)
                .fetch_all(ex)
                .await
        }
    }
}

pub async fn list_pending<'c>(
    ex: impl PgExecutor<'c>,
    after: Option<After>,
    limit: i64,
) -> Result<Vec<Payout>, sqlx::Error> {
    match after {
        None => {
            sqlx::query_as::<_, Payout>(sql::PAYOUT_LIST_PENDING_FIRST)
                .bind(limit)
                .fetch_all(ex)
                .await
        }
        Some(a) => {
            sqlx::query_as::<_, Payout>(sql::PAYOUT_LIST_PENDING_AFTER)
                .bind(a.created_at)
                .bind(a.payout_id)
                .bind(limit)
                .fetch_all(ex)
                .await
        }
    }
}

/// The payouts of one state that is not terminal: how many, and the age of the oldest.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OpenStats {
    #[sqlx(try_from = "String")]
    pub state: PayoutState,
    pub payouts: i64,
    /// Seconds since the oldest of them last changed.
    pub oldest_age_seconds: i64,
}

/// [`OpenStats`] of every state that has payouts (states without any are absent).
pub async fn open_stats<'c>(ex: impl PgExecutor<'c>) -> Result<Vec<OpenStats>, sqlx::Error> {
    sqlx::query_as::<_, OpenStats>(sql::PAYOUT_OPEN_STATS)
        .fetch_all(ex)
        .await
}
