//! The wire types the executor reads from payment-resource and rail-proxy. Only the fields it uses;
//! unknown fields are ignored so that the services can add to their answers. Money is `i64` minor
//! units, tokens are `i64` as the services print them.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use dlock_common::payout::PayoutState;

/// A payout as payment-resource returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Payout {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub state: PayoutState,
    pub claimed_by: Option<String>,
    pub claim_token: Option<i64>,
    pub idempotency_key: String,
    #[serde(default)]
    pub attempt_count: i32,
    /// Why it ended FAILED or ABANDONED.
    #[serde(default)]
    pub failure_reason: Option<String>,
    /// What it holds against its account (from RAIL_SUBMITTED until it ends).
    #[serde(default)]
    pub reserved_minor: i64,
}

/// `GET /v1/payouts` page.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    pub items: Vec<Payout>,
    pub next_cursor: Option<String>,
}

/// `POST /v1/payouts/{id}/claim` answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claimed {
    pub payout: Payout,
    #[serde(default)]
    pub adopted: bool,
    #[serde(default)]
    pub idempotent: bool,
}

/// `POST /v1/payouts/{id}/transition` answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transitioned {
    pub payout: Payout,
    #[serde(default)]
    pub idempotent: bool,
}

/// `POST /v1/payouts/{id}/post` answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Posted {
    pub payout: Payout,
    pub balance_minor: i64,
    pub fence: i64,
    #[serde(default)]
    pub idempotent: bool,
}

/// What the rail did with one attempt, as rail-proxy records it in `rail_submission.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RailOutcome {
    Acked,
    Rejected,
    /// Ambiguous: the rail did not answer in time. Resolved by asking the rail, never by resubmitting.
    Timeout,
    /// Refused by the high-water mark (d); never forwarded. Not the payout's attempt.
    Fenced,
}

/// One `rail_submission` row. `outcome` is `None` while the forward is in flight (or after a crash
/// mid-forward): as ambiguous as a TIMEOUT.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Submission {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    pub presented_token: i64,
    pub outcome: Option<RailOutcome>,
    pub rail_reference: Option<String>,
    /// Set when rail-proxy gave the attempt up: the rail, asked after the deadline, had never
    /// received it.
    #[serde(default)]
    pub abandoned_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Submission {
    /// The one forwardable attempt (`rail_submission_attempt_uidx`), as opposed to a FENCED audit row.
    pub fn is_attempt(&self) -> bool {
        self.outcome != Some(RailOutcome::Fenced)
    }
}

/// `GET /v1/submissions/{payoutId}` answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionList {
    pub payout_id: Uuid,
    pub submissions: Vec<Submission>,
}

impl SubmissionList {
    pub fn attempt(&self) -> Option<&Submission> {
        self.submissions.iter().find(|s| s.is_attempt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_payout_and_ignores_extra_fields() {
        let p: Payout = serde_json::from_str(
            r#"{"payoutId":"00000000-0000-4000-8000-000000000001",
                "accountId":"00000000-0000-4000-8000-000000000002","amountMinor":250,"currency":"EUR",
                "state":"RAIL_ACKED","claimedBy":"w","claimToken":7,"idempotencyKey":"k","attemptCount":1,
                "createdAt":"2026-01-01T00:00:00Z","somethingNew":true}"#,
        )
        .unwrap();
        assert_eq!(p.state, PayoutState::RailAcked);
        assert_eq!(p.claim_token, Some(7));
        assert!(!p.state.is_terminal());
    }

    #[test]
    fn the_attempt_is_the_row_that_is_not_fenced() {
        let list: SubmissionList = serde_json::from_str(
            r#"{"payoutId":"00000000-0000-4000-8000-000000000001","submissions":[
              {"submissionId":"00000000-0000-4000-8000-000000000003","payoutId":"00000000-0000-4000-8000-000000000001",
               "presentedToken":3,"outcome":"FENCED","railReference":null},
              {"submissionId":"00000000-0000-4000-8000-000000000004","payoutId":"00000000-0000-4000-8000-000000000001",
               "presentedToken":9,"outcome":null,"railReference":null}]}"#,
        )
        .unwrap();
        let attempt = list.attempt().unwrap();
        assert_eq!(attempt.presented_token, 9);
        assert_eq!(attempt.outcome, None);
    }

    #[test]
    fn unknown_states_are_refused() {
        assert!(serde_json::from_str::<PayoutState>(r#""DONE""#).is_err());
        assert!(
            PayoutState::IN_FLIGHT
                .iter()
                .all(|s| !s.is_terminal() && *s != PayoutState::Pending)
        );
    }
}
