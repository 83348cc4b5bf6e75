//! The five details of a fenced-out refusal (C3 #ct3-pay): what a protected resource answers with a
//! 409, and what a client turns into its terminal `FencedOut` error.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct FencedOutDetails {
    /// The token the caller presented.
    pub presented: i64,
    /// The highest token the resource had already seen (its fence / high-water mark).
    pub highest: i64,
    /// `account`, `ledger`, `payout` or `rail`.
    pub resource_type: String,
    pub resource_id: String,
    pub owner_id: String,
}

/// The error code of a fenced-out 409.
pub const FENCED_OUT: &str = "FENCED_OUT";
