//! rail-proxy's bodies.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `POST /v1/submissions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubmitRequest {
    /// Read as text so that a malformed id is `INVALID_PAYOUT_ID`, not a generic body error.
    #[cfg_attr(feature = "openapi", schema(value_type = Uuid))]
    pub payout_id: String,
}

/// What the rail did with one attempt, as rail-proxy records it in `rail_submission.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RailOutcome {
    Acked,
    Rejected,
    /// Ambiguous: the rail did not answer in time. Resolved by asking the rail, never by resubmitting.
    Timeout,
    /// Refused by the high-water mark (d); never forwarded. Not the payout's attempt.
    Fenced,
}

impl RailOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RailOutcome::Acked => "ACKED",
            RailOutcome::Rejected => "REJECTED",
            RailOutcome::Timeout => "TIMEOUT",
            RailOutcome::Fenced => "FENCED",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Self::Acked, Self::Rejected, Self::Timeout, Self::Fenced]
            .into_iter()
            .find(|o| o.as_str() == text)
    }
}

/// One `rail_submission` row, as the API returns it. `outcome` is `null` while the forward is in
/// flight (or after a crash mid-forward): as ambiguous as a `TIMEOUT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Submission {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    pub idempotency_key: String,
    pub presented_token: i64,
    pub outcome: Option<RailOutcome>,
    pub rail_reference: Option<String>,
    pub submitted_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    /// Set when the attempt was given up: the rail, asked after the deadline, had never received it.
    pub abandoned_at: Option<DateTime<Utc>>,
}

impl Submission {
    /// The one forwardable attempt (`rail_submission_attempt_uidx`), as opposed to a FENCED audit row.
    pub fn is_attempt(&self) -> bool {
        self.outcome != Some(RailOutcome::Fenced)
    }
}

/// `200` of `GET /v1/submissions/{payoutId}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SubmissionList {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub submissions: Vec<Submission>,
}

impl SubmissionList {
    pub fn attempt(&self) -> Option<&Submission> {
        self.submissions.iter().find(|s| s.is_attempt())
    }
}

/// The `{payoutId}` of the submission routes (read as text: a malformed id is `INVALID_PAYOUT_ID`).
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Path, rename_all = "camelCase"))]
pub struct PayoutIdPath {
    #[cfg_attr(feature = "openapi", param(value_type = Uuid))]
    pub payout_id: String,
}
