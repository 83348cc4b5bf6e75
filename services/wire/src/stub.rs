//! rail-stub's bodies: the external rail's `POST /v1/payments` as rail-proxy calls it, and the
//! stub's test and ground-truth endpoints.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
#[cfg(feature = "openapi")]
use utoipa::IntoParams;
#[cfg(feature = "openapi")]
use utoipa::openapi::path::{Parameter, ParameterIn};
#[cfg(feature = "openapi")]
use utoipa::openapi::schema::ObjectBuilder;
use uuid::Uuid;

#[cfg(feature = "openapi")]
use crate::shape;

/// `POST /v1/payments`. Ids and the amount are read raw so that each bad value gets its own code
/// (`INVALID_PAYOUT_ID`, `INVALID_AMOUNT`, …) rather than a generic decoding error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentOrder {
    #[cfg_attr(feature = "openapi", schema(schema_with = order_idempotency_key))]
    pub idempotency_key: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Uuid))]
    pub payout_id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Uuid))]
    pub account_id: String,
    /// A JSON integer of minor units, > 0.
    #[cfg_attr(feature = "openapi", schema(value_type = i64, minimum = 1, maximum = 9223372036854775807_i64))]
    pub amount_minor: crate::int::JsonInt,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::currency))]
    pub currency: String,
}

#[cfg(feature = "openapi")]
fn order_idempotency_key() -> ObjectBuilder {
    shape::described(
        shape::rail_idempotency_key(),
        "1..=200 characters without control characters.",
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PaymentStatus {
    Acked,
    Rejected,
}

/// `200` (`ACKED`) or `422` (`REJECTED`) of `POST /v1/payments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PaymentAnswer {
    pub status: PaymentStatus,
    /// With `ACKED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_reference: Option<String>,
    /// With `REJECTED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub idempotency_key: String,
    /// A repeat of an earlier request: the recorded outcome again, nothing paid.
    pub replayed: bool,
}

/// What the rail decided for one idempotency key; decided once, by the first request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Payment {
    pub idempotency_key: String,
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub status: PaymentStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub rail_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub reason: Option<String>,
    /// The first answer for this key was a timeout: the money moved, the caller never heard.
    pub timed_out: bool,
    pub received_at: DateTime<Utc>,
}

/// One request as it arrived, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Received {
    pub seq: u64,
    pub idempotency_key: String,
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub presented_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct KeyCount {
    pub payout_id: Uuid,
    pub received: u64,
    pub paid: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PayoutCount {
    pub received: u64,
    pub paid: u64,
    pub keys: Vec<String>,
}

/// `GET /v1/received`: every request, and what was paid per key and per payout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReceivedReport {
    pub requests: Vec<Received>,
    pub per_key: BTreeMap<String, KeyCount>,
    pub per_payout: BTreeMap<Uuid, PayoutCount>,
    /// Payout ids paid more than once (under one key or several): must be empty.
    pub paid_twice: Vec<Uuid>,
}

impl ReceivedReport {
    /// Requests the rail received for this payout.
    pub fn received(&self, payout_id: Uuid) -> u64 {
        self.per_payout.get(&payout_id).map_or(0, |c| c.received)
    }

    /// Times the rail paid this payout.
    pub fn paid(&self, payout_id: Uuid) -> u64 {
        self.per_payout.get(&payout_id).map_or(0, |c| c.paid)
    }
}

/// `PUT /v1/admin/behaviour` (test mode only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BehaviourRequest {
    /// `ack`, `reject` or `timeout`, in any case.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^([aA][cC][kK]|[rR][eE][jJ][eE][cC][tT]|[tT][iI][mM][eE][oO][uU][tT])$")
    )]
    pub mode: String,
    /// Added to every answer, 0..=600000 ms.
    #[cfg_attr(feature = "openapi", schema(value_type = u64, minimum = 0, maximum = 600000))]
    pub latency_ms: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Pay and answer 200 ACKED.
    Ack,
    /// Do not pay; answer 422 REJECTED.
    Reject,
    /// Pay, then hang past the caller's timeout: the ambiguous case.
    Timeout,
}

/// `200` of `GET`/`PUT /v1/admin/behaviour`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BehaviourView {
    pub mode: Mode,
    pub latency_ms: u64,
    pub timeout_hang_ms: u64,
    pub test_mode: bool,
}

/// The `{idempotencyKey}` of `GET /v1/payments/{idempotencyKey}`.
#[derive(Debug, Clone, Deserialize)]
pub struct IdempotencyKeyPath {
    pub idempotency_key: String,
}

#[cfg(feature = "openapi")]
impl IntoParams for IdempotencyKeyPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![shape::path_param(
            "idempotencyKey",
            None,
            shape::rail_idempotency_key(),
        )]
    }
}
