//! Everything a rail-proxy request can end in besides success, mapped to HTTP at the edge.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dlock_common::fencing::{FENCED_OUT, FencedOutDetails};
use dlock_common::grant::GrantRefused;
use dlock_common::{ApiError, TokenError};
use uuid::Uuid;

use crate::sql::Submission;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    InvalidToken(#[from] TokenError),
    #[error("payoutId must be a UUID")]
    InvalidPayoutId,
    #[error("no payout {0}")]
    UnknownPayout(Uuid),
    /// (d) returned zero rows: a token at least as high already submitted for this account.
    #[error("fenced out: token {} is not above the rail high-water mark {}", .details.presented, .details.highest)]
    FencedOut {
        details: FencedOutDetails,
        submission: Box<Submission>,
    },
    /// `rail_submission_attempt_uidx` already holds the one forwardable attempt for this payout.
    #[error("payout {} already has a rail attempt", .0.payout_id)]
    DuplicateAttempt(Box<Submission>),
    /// The payout does not hold its reservation (not RAIL_SUBMITTED with its amount held): the
    /// account was never shown to cover it, so it is not forwarded.
    #[error("payout {payout_id} is {state} without a funds reservation; not forwarded")]
    NotReserved { payout_id: Uuid, state: String },
    #[error("payout {0} has no rail attempt to resolve")]
    NoAttempt(Uuid),
    #[error("the rail has no record of payout {}'s idempotency key", .0.payout_id)]
    RailOutcomeUnknown(Box<Submission>),
    #[error("the rail did not answer: {0}")]
    RailUnavailable(String),
    /// The grant of the presented token does not authorize this call (403 `GRANT_*`); nothing was
    /// recorded or forwarded.
    #[error(transparent)]
    GrantRefused(#[from] GrantRefused),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl dlock_common::grant::CarriesRefusal for ProxyError {
    fn refusal(&self) -> Option<&GrantRefused> {
        match self {
            ProxyError::GrantRefused(r) => Some(r),
            _ => None,
        }
    }
}

impl From<ProxyError> for ApiError {
    fn from(e: ProxyError) -> Self {
        let message = e.to_string();
        match e {
            ProxyError::InvalidToken(t) => t.into(),
            ProxyError::GrantRefused(r) => r.into(),
            ProxyError::InvalidPayoutId => ApiError::bad_request("INVALID_PAYOUT_ID", message),
            ProxyError::UnknownPayout(_) => ApiError::not_found("UNKNOWN_PAYOUT", message),
            ProxyError::FencedOut { details, submission } => ApiError::conflict(FENCED_OUT, message)
                .with("presented", details.presented)
                .with("highest", details.highest)
                .with("resourceType", &details.resource_type)
                .with("resourceId", &details.resource_id)
                .with("ownerId", &details.owner_id)
                .with("submissionId", submission.submission_id),
            ProxyError::DuplicateAttempt(existing) => ApiError::conflict("DUPLICATE_ATTEMPT", message)
                .with("submissionId", existing.submission_id)
                .with("outcome", &existing.outcome)
                .with("railReference", &existing.rail_reference)
                .with("attempt", &*existing),
            ProxyError::NoAttempt(_) => ApiError::not_found("NO_ATTEMPT", message),
            ProxyError::RailOutcomeUnknown(attempt) => {
                ApiError::conflict("RAIL_OUTCOME_UNKNOWN", message).with("attempt", &*attempt)
            }
            ProxyError::NotReserved { payout_id, state } => ApiError::conflict("NOT_RESERVED", message)
                .with("payoutId", payout_id)
                .with("state", state),
            ProxyError::RailUnavailable(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "RAIL_UNAVAILABLE", message)
            }
            ProxyError::Db(e) if dlock_common::db::unavailable(&e) => ApiError::unavailable(e),
            ProxyError::Db(e) => ApiError::internal(e),
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}
