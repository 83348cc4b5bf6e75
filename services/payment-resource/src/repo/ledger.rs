//! `ledger_entry`: statement (b), one call per leg. Append-only: payapp may not UPDATE or DELETE it.

use sqlx::PgConnection;
use uuid::Uuid;

use crate::model::Direction;

/// One leg to write.
#[derive(Debug, Clone, Copy)]
pub struct Leg {
    pub entry_id: Uuid,
    pub payout_id: Uuid,
    /// The account the leg sits on.
    pub account_id: Uuid,
    pub direction: Direction,
    pub amount_minor: i64,
    /// The grant writing the leg; stamped into `ledger_entry.fence` for attribution.
    pub token: i64,
    /// The debited account whose fence guards the leg.
    pub fenced_account_id: Uuid,
}

/// Statement (b) (`stmt` is [`crate::sql::Statements::ledger_leg`]). `None` is zero rows: the fence
/// moved past `token` since (a), i.e. we lost the lock.
pub async fn insert_leg(
    conn: &mut PgConnection,
    stmt: &'static str,
    leg: Leg,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar::<_, Uuid>(stmt)
        .bind(leg.entry_id)
        .bind(leg.payout_id)
        .bind(leg.account_id)
        .bind(leg.direction.as_str())
        .bind(leg.amount_minor)
        .bind(leg.token)
        .bind(leg.fenced_account_id)
        .fetch_optional(conn)
        .await
}
