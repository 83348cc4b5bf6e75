//! One error type for the service, mapped to HTTP once, at the edge.

use axum::http::StatusCode;
use dlock_common::ApiError;
use dlock_common::fencing::{FENCED_OUT, FencedOutDetails};
use dlock_common::grant::GrantRefused;
use uuid::Uuid;

use crate::model::PayoutState;

#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    /// Terminal, never retryable: a newer grant has already written this resource.
    #[error(
        "fenced out at {}: presented token {} but {} {} has already seen {}",
        .0.resource_type, .0.presented, .0.resource_type, .0.resource_id, .0.highest
    )]
    FencedOut(FencedOutDetails),

    /// A zero-row (a) that was not a fence: the account cannot cover the payout, which is now FAILED.
    #[error(
        "account {account_id} holds {balance_minor} minor units; payout {payout_id} needs {amount_minor}"
    )]
    InsufficientFunds {
        payout_id: Uuid,
        account_id: Uuid,
        balance_minor: i64,
        amount_minor: i64,
        payout_state: PayoutState,
    },

    /// The reservation (r) found that the account cannot cover the payout, which is now FAILED
    /// (`INSUFFICIENT_FUNDS`) without having reached the rail.
    #[error(
        "account {account_id} has {available_minor} minor units available; payout {payout_id} needs {amount_minor}"
    )]
    Unfunded {
        payout_id: Uuid,
        account_id: Uuid,
        available_minor: i64,
        amount_minor: i64,
        payout_state: PayoutState,
    },

    #[error("payout {payout_id} is {state}; only a RAIL_ACKED payout can be posted")]
    NotPostable { payout_id: Uuid, state: PayoutState },

    #[error("payout {payout_id} is {state} and can no longer be claimed")]
    NotClaimable { payout_id: Uuid, state: PayoutState },

    #[error("payout {payout_id} is {state}, not {from}; cannot move it to {to}")]
    InvalidTransition {
        payout_id: Uuid,
        from: PayoutState,
        to: PayoutState,
        state: PayoutState,
    },

    #[error("{from} -> {to} is not a transition this endpoint performs")]
    UnsupportedTransition { from: PayoutState, to: PayoutState },

    #[error("payout {0} has a rail attempt that rail-proxy has not abandoned; it may have been paid")]
    AttemptNotAbandoned(Uuid),

    #[error("no payout {0}")]
    UnknownPayout(Uuid),

    #[error("no account {0}")]
    UnknownAccount(Uuid),

    /// An account named in a request body does not exist (the request, not the URL, is wrong).
    #[error("the referenced account {0} does not exist")]
    ReferencedAccountMissing(Uuid),

    #[error("idempotency key {key:?} was already used for a different payout request")]
    IdempotencyConflict { key: String, payout_id: Uuid },

    #[error("account {account_id} holds {account_currency}; the request says {requested}")]
    CurrencyMismatch {
        account_id: Uuid,
        account_currency: String,
        requested: String,
    },

    #[error("account {0} is a settlement account; payouts debit customer accounts only")]
    NotCustomerAccount(Uuid),

    #[error("there is no settlement account for {0}")]
    NoSettlementAccount(String),

    #[error("account {0} already exists")]
    AccountExists(Uuid),

    #[error("a settlement account for {0} already exists")]
    SettlementExists(String),

    /// Bad input, with a machine-readable code.
    #[error("{message}")]
    Invalid { code: &'static str, message: String },

    /// The grant of the presented token does not authorize this write (403 `GRANT_*`); nothing
    /// was written.
    #[error(transparent)]
    GrantRefused(#[from] GrantRefused),

    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl dlock_common::grant::CarriesRefusal for PaymentError {
    fn refusal(&self) -> Option<&GrantRefused> {
        match self {
            PaymentError::GrantRefused(r) => Some(r),
            _ => None,
        }
    }
}

impl PaymentError {
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        PaymentError::Invalid {
            code,
            message: message.into(),
        }
    }
}

impl From<PaymentError> for ApiError {
    fn from(e: PaymentError) -> Self {
        let message = e.to_string();
        let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
        match e {
            PaymentError::FencedOut(d) => ApiError::conflict(FENCED_OUT, message)
                .with("presented", d.presented)
                .with("highest", d.highest)
                .with("resourceType", d.resource_type)
                .with("resourceId", d.resource_id)
                .with("ownerId", d.owner_id),
            PaymentError::InsufficientFunds {
                payout_id,
                account_id,
                balance_minor,
                amount_minor,
                payout_state,
            } => ApiError::new(unprocessable, "INSUFFICIENT_FUNDS", message)
                .with("payoutId", payout_id)
                .with("accountId", account_id)
                .with("balanceMinor", balance_minor)
                .with("amountMinor", amount_minor)
                .with("payoutState", payout_state),
            PaymentError::Unfunded {
                payout_id,
                account_id,
                available_minor,
                amount_minor,
                payout_state,
            } => ApiError::new(unprocessable, "INSUFFICIENT_FUNDS", message)
                .with("payoutId", payout_id)
                .with("accountId", account_id)
                .with("availableMinor", available_minor)
                .with("amountMinor", amount_minor)
                .with("payoutState", payout_state),
            PaymentError::NotPostable { payout_id, state } => ApiError::conflict("NOT_POSTABLE", message)
                .with("payoutId", payout_id)
                .with("state", state),
            PaymentError::NotClaimable { payout_id, state } => ApiError::conflict("NOT_CLAIMABLE", message)
                .with("payoutId", payout_id)
                .with("state", state),
            PaymentError::InvalidTransition { payout_id, state, .. } => {
                ApiError::conflict("INVALID_TRANSITION", message)
                    .with("payoutId", payout_id)
                    .with("state", state)
            }
            PaymentError::UnsupportedTransition { .. } => {
                ApiError::bad_request("UNSUPPORTED_TRANSITION", message)
            }
            PaymentError::AttemptNotAbandoned(payout_id) => {
                ApiError::conflict("ATTEMPT_NOT_ABANDONED", message).with("payoutId", payout_id)
            }
            PaymentError::UnknownPayout(_) => ApiError::not_found("UNKNOWN_PAYOUT", message),
            PaymentError::UnknownAccount(_) => ApiError::not_found("UNKNOWN_ACCOUNT", message),
            PaymentError::ReferencedAccountMissing(_) => {
                ApiError::new(unprocessable, "UNKNOWN_ACCOUNT", message)
            }
            PaymentError::IdempotencyConflict { payout_id, .. } => {
                ApiError::conflict("IDEMPOTENCY_CONFLICT", message).with("payoutId", payout_id)
            }
            PaymentError::CurrencyMismatch { .. } => {
                ApiError::new(unprocessable, "CURRENCY_MISMATCH", message)
            }
            PaymentError::NotCustomerAccount(_) => {
                ApiError::new(unprocessable, "NOT_A_CUSTOMER_ACCOUNT", message)
            }
            PaymentError::NoSettlementAccount(_) => {
                ApiError::new(unprocessable, "NO_SETTLEMENT_ACCOUNT", message)
            }
            PaymentError::AccountExists(_) => ApiError::conflict("ACCOUNT_EXISTS", message),
            PaymentError::SettlementExists(_) => ApiError::conflict("SETTLEMENT_EXISTS", message),
            PaymentError::Invalid { code, message } => ApiError::bad_request(code, message),
            PaymentError::GrantRefused(r) => ApiError::from(r),
            PaymentError::Database(db) if dlock_common::db::unavailable(&db) => ApiError::unavailable(db),
            PaymentError::Database(db) => ApiError::internal(db),
        }
    }
}
