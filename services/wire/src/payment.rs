//! payment-resource's bodies. Money is `i64` minor units; currencies are `^[A-Z]{3}$`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::payout::PayoutState;

/// `account.kind` (V3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// `POST /v1/accounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateAccountRequest {
    /// Absent or `null` picks a fresh id.
    #[serde(default)]
    pub account_id: Option<Uuid>,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::currency))]
    pub currency: String,
    #[serde(deserialize_with = "crate::int::integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 9223372036854775807_i64))]
    pub opening_balance_minor: i64,
    /// Absent or `null` is `CUSTOMER`.
    #[serde(default)]
    pub kind: Option<AccountKind>,
}

/// An account as stored, beside what its ledger says it should be (docs/accounting.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub account_id: Uuid,
    pub currency: String,
    pub kind: AccountKind,
    pub balance_minor: i64,
    pub opening_balance_minor: i64,
    pub fence: i64,
    /// Held for payouts in flight (entered RAIL_SUBMITTED, not yet POSTED / FAILED / ABANDONED).
    pub reserved_minor: i64,
    /// `balanceMinor - reservedMinor`: what a new payout can still reserve.
    pub available_minor: i64,
    pub ledger_debit_minor: i64,
    pub ledger_credit_minor: i64,
    /// Customer: opening − Σ DEBIT + Σ CREDIT. Settlement: its opening balance (postings do not move
    /// it). `null` only if the sum overflows `i64`, which is itself inconsistent.
    pub expected_balance_minor: Option<i64>,
    /// Settlement accounts only: Σ amount of POSTED payouts in the currency, what the credits must
    /// equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub posted_payouts_minor: Option<i64>,
    pub consistent: bool,
}

/// `POST /v1/payouts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatePayoutRequest {
    pub account_id: Uuid,
    #[serde(deserialize_with = "crate::int::integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 9223372036854775807_i64))]
    pub amount_minor: i64,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::currency))]
    pub currency: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = payout_idempotency_key))]
    pub idempotency_key: String,
}

#[cfg(feature = "openapi")]
fn payout_idempotency_key() -> utoipa::openapi::schema::ObjectBuilder {
    crate::shape::described(
        crate::shape::idempotency_key(),
        "1..=128 characters, no control characters, no whitespace at either end.",
    )
}

/// A payout as payment-resource stores and returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[serde(rename_all = "camelCase")]
pub struct Payout {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    #[cfg_attr(feature = "sqlx", sqlx(try_from = "String"))]
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

/// The query of `GET /v1/payouts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct ListPayoutsQuery {
    /// `PENDING` (the default: the work queue) or an in-flight state; terminal states are refused.
    #[cfg_attr(feature = "openapi", param(value_type = Option<ListedState>))]
    pub state: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 500))]
    pub limit: Option<i64>,
    /// The `nextCursor` of the previous page.
    #[cfg_attr(feature = "openapi", param(pattern = "^v1\\.[0-9]{1,16}\\.[0-9a-fA-F]{32}$"))]
    pub after: Option<String>,
}

/// The states `GET /v1/payouts` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ListedState {
    Pending,
    Claimed,
    RailSubmitted,
    RailAcked,
    RailAmbiguous,
}

/// One page of payouts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub items: Vec<Payout>,
    /// Present when the page was full: pass it as `after` for the next page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/payouts/{payoutId}/claim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRequest {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::owner_id))]
    pub owner_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Claimed {
    pub payout: Payout,
    /// The payout was in flight under an older token and is now this holder's to finish.
    pub adopted: bool,
    /// This same grant had already claimed it; nothing changed.
    pub idempotent: bool,
}

/// `POST /v1/payouts/{payoutId}/transition`. Its schema lists exactly the edges
/// [`PayoutState::can_transition`] admits, so that a documented request is never
/// `UNSUPPORTED_TRANSITION`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransitionRequest {
    pub from: PayoutState,
    pub to: PayoutState,
    /// Why the payout ends FAILED or ABANDONED (a code such as RAIL_REJECTED); ignored otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TransitionRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, SchemaType, Type};
        let one_state = |states: Vec<&'static str>| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(states))
        };
        let mut edges = OneOfBuilder::new().description(Some(
            "One executor edge: `from` and the states it may move to. `reason` (`^[A-Z][A-Z0-9_]*$`, at most 64 characters) is recorded when the payout ends FAILED or ABANDONED.",
        ));
        for from in PayoutState::ALL {
            let to: Vec<&'static str> = PayoutState::ALL
                .into_iter()
                .filter(|to| PayoutState::can_transition(from, *to))
                .map(PayoutState::as_str)
                .collect();
            if to.is_empty() {
                continue;
            }
            edges = edges.item(
                ObjectBuilder::new()
                    .property("from", one_state(vec![from.as_str()]))
                    .required("from")
                    .property("to", one_state(to))
                    .required("to")
                    .property(
                        "reason",
                        ObjectBuilder::new()
                            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
                            .max_length(Some(64))
                            .pattern(Some(crate::pattern::CODE)),
                    )
                    .additional_properties(Some(AdditionalProperties::FreeForm(false))),
            );
        }
        edges.into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for TransitionRequest {
    fn name() -> std::borrow::Cow<'static, str> {
        "TransitionRequest".into()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Transitioned {
    pub payout: Payout,
    /// The payout was already in the target state; nothing changed.
    pub idempotent: bool,
}

/// A successful posting, or the idempotent answer for a payout some holder already posted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Posted {
    pub payout: Payout,
    /// The debited account's balance and fence after the posting (now, if idempotent).
    pub balance_minor: i64,
    pub fence: i64,
    /// True when nothing was posted because the payout was already POSTED.
    pub idempotent: bool,
}

/// The query of `GET /v1/reconciliation`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query, rename_all = "camelCase"))]
pub struct ReconciliationQuery {
    /// A payout in flight for longer than this is reported stuck (default 900).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 2592000))]
    pub stuck_after_seconds: Option<i64>,
    /// Rows read per page (default 500).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 5000))]
    pub page_size: Option<i64>,
}

/// The `{accountId}` of the account routes.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Path, rename_all = "camelCase"))]
pub struct AccountIdPath {
    pub account_id: Uuid,
}

/// The `{payoutId}` of the payout routes.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Path, rename_all = "camelCase"))]
pub struct PayoutIdPath {
    pub payout_id: Uuid,
}
