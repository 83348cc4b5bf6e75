//! The payout state machine both sides of the wire share: payment-resource stores it, the executor
//! drives it.

use serde::{Deserialize, Serialize};

/// The `payout_state_ck` set (C1 §1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PayoutState {
    Pending,
    Claimed,
    RailSubmitted,
    RailAcked,
    RailAmbiguous,
    Posted,
    Failed,
    Abandoned,
}

impl PayoutState {
    /// States a payout is left in while some holder drives it; a dead holder leaves it here, and a
    /// newer grant adopts it.
    pub const IN_FLIGHT: [PayoutState; 4] = [
        PayoutState::Claimed,
        PayoutState::RailSubmitted,
        PayoutState::RailAcked,
        PayoutState::RailAmbiguous,
    ];

    pub const ALL: [PayoutState; 8] = [
        PayoutState::Pending,
        PayoutState::Claimed,
        PayoutState::RailSubmitted,
        PayoutState::RailAcked,
        PayoutState::RailAmbiguous,
        PayoutState::Posted,
        PayoutState::Failed,
        PayoutState::Abandoned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PayoutState::Pending => "PENDING",
            PayoutState::Claimed => "CLAIMED",
            PayoutState::RailSubmitted => "RAIL_SUBMITTED",
            PayoutState::RailAcked => "RAIL_ACKED",
            PayoutState::RailAmbiguous => "RAIL_AMBIGUOUS",
            PayoutState::Posted => "POSTED",
            PayoutState::Failed => "FAILED",
            PayoutState::Abandoned => "ABANDONED",
        }
    }

    /// No transition leaves these states.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            PayoutState::Posted | PayoutState::Failed | PayoutState::Abandoned
        )
    }

    /// The edges the executor may request through the transition endpoint. `RAIL_ACKED → POSTED`
    /// is not here: it only happens inside the posting transaction, statement (c).
    pub fn can_transition(from: PayoutState, to: PayoutState) -> bool {
        use PayoutState::*;
        matches!(
            (from, to),
            (Claimed, RailSubmitted)
                | (RailSubmitted, RailAcked)
                | (RailSubmitted, RailAmbiguous)
                | (RailAmbiguous, RailAcked)
                | (RailAmbiguous, Abandoned)
                | (RailSubmitted, Failed)
                | (RailAmbiguous, Failed)
                | (Claimed, Failed)
                | (Claimed, Abandoned)
        )
    }
}

impl std::fmt::Display for PayoutState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for PayoutState {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        PayoutState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown payout state {s:?}"))
    }
}
