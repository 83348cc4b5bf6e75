//! The wire types the executor reads from payment-resource and rail-proxy. Money is `i64` minor
//! units, tokens are `i64` as the services print them.

pub use dlock_common::payout::PayoutState;

/// The bodies of payment-resource and rail-proxy, defined once in the wire crate (the same types the
/// services answer with). Unknown fields are ignored, so the services may add to their answers.
pub use dlock_wire::payment::{Claimed, Page, Payout, Posted, Transitioned};
pub use dlock_wire::rail::{RailOutcome, Submission, SubmissionList};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_payout_and_ignores_extra_fields() {
        let p: Payout = serde_json::from_str(
            r#"{"payoutId":"00000000-0000-4000-8000-000000000001",
                "accountId":"00000000-0000-4000-8000-000000000002","amountMinor":250,"currency":"EUR",
                "state":"RAIL_ACKED","claimedBy":"w","claimToken":7,"idempotencyKey":"k","attemptCount":1,
                "createdAt":"2026-01-01T00:00:00Z","updatedAt":"2026-01-01T00:00:00Z","reservedMinor":0,
                "somethingNew":true}"#,
        )
        .unwrap();
        assert_eq!(p.state, PayoutState::RailAcked);
        assert_eq!(p.claim_token, Some(7));
        assert!(!p.state.is_terminal());
    }

    #[test]
    fn the_attempt_is_the_row_that_is_not_fenced() {
        let list: SubmissionList = serde_json::from_str(
            r#"{"payoutId":"00000000-0000-4000-8000-000000000001",
                "accountId":"00000000-0000-4000-8000-000000000002","submissions":[
              {"submissionId":"00000000-0000-4000-8000-000000000003","payoutId":"00000000-0000-4000-8000-000000000001",
               "idempotencyKey":"k","presentedToken":3,"outcome":"FENCED","railReference":null,
               "submittedAt":"2026-01-01T00:00:00Z"},
              {"submissionId":"00000000-0000-4000-8000-000000000004","payoutId":"00000000-0000-4000-8000-000000000001",
               "idempotencyKey":"k","presentedToken":9,"outcome":null,"railReference":null,
               "submittedAt":"2026-01-01T00:00:00Z"}]}"#,
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
