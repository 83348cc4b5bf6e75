//! The history of one campaign run: every operation of the client and of the executors, as
//! Jepsen-style `invoke` / `ok` / `fail` / `info` events, one JSON object a line.
//!
//! The executors' operations are recorded by the recording proxies that stand between each executor
//! and each service ([`crate::proxy`]), so the record needs no cooperation from the code under
//! test and every event is timed on one clock (the run's monotonic clock, immune to the clock
//! nemesis, which skews only the executors). `invoke` is written before a request is forwarded,
//! its completion after the answer: `ok` (2xx), `fail` (an answer that says the operation did not
//! happen: 4xx), `info` (indeterminate: no answer, a 5xx, a dropped connection — the operation may
//! or may not have taken effect).
//!
//! Server times (`acquiredAt`, `expiresAt`) are the lock service's own clock, copied from its
//! answers; the checker compares them only with each other, never with `time_ns`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What kind of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Type {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// The operation, named after the route it went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum F {
    /// client → payment-resource `POST /v1/payouts` (idempotent by key; retried now and then).
    Create,
    /// executor → lock-server `POST /v1/sessions`.
    OpenSession,
    /// executor → lock-server `POST /v1/sessions/{id}/heartbeat`.
    Heartbeat,
    /// executor → lock-server `DELETE /v1/sessions/{id}`.
    CloseSession,
    /// executor → lock-server `POST /v1/locks/{key}/acquire`.
    Acquire,
    /// executor → lock-server `POST /v1/locks/{key}/renew`.
    Renew,
    /// executor → lock-server `POST /v1/locks/{key}/release`.
    Release,
    /// executor → payment-resource `POST /v1/payouts/{id}/claim` (fenced).
    Claim,
    /// executor → payment-resource `POST /v1/payouts/{id}/transition` (fenced).
    Transition,
    /// executor → payment-resource `POST /v1/payouts/{id}/post`: (a)(b)(c).
    Post,
    /// executor → rail-proxy `POST /v1/submissions`: (d), then the rail.
    Submit,
    /// executor → rail-proxy `POST /v1/submissions/{id}/resolve`.
    Resolve,
}

/// One event. `value` holds the operation's details: on `invoke` what was asked, on completion
/// what was answered (see [`Value`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history file (0, 1, 2, …).
    pub index: u64,
    /// Nanoseconds since the run began, on the run's monotonic clock.
    pub time_ns: u64,
    /// `client`, or the executor the request came from (`executor-3`).
    pub process: String,
    #[serde(rename = "type")]
    pub kind: Type,
    pub f: F,
    /// Pairs an invoke with its completion (unique in the run).
    pub op: u64,
    #[serde(default)]
    pub value: Value,
}

/// Everything an event may carry; absent fields are omitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Value {
    /// The lock key (lock operations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The fencing token presented (`X-Fencing-Token`, renew/release bodies) or granted (acquire ok).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Lock-service clock: when the grant began (acquire ok).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<DateTime<Utc>>,
    /// Lock-service clock: the lease's (acquire/renew ok) or the session's (open/heartbeat ok) end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payout: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    /// The idempotency key of a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// A transition's `from` and `to`; a payout's state in an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// rail-proxy's outcome of a submit / resolve (`ACKED`, `REJECTED`, `TIMEOUT`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Release answer: `released`, `stale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<bool>,
    /// The `idempotent` flag of a claim / transition / post answer: nothing was written (the same
    /// grant claimed again, the payout was already in the target state, or already POSTED — the
    /// last one answered to any token). The checker does not count such an `ok` as a write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// The HTTP status of a completion (absent on `info` without an answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The machine-readable error code of a `fail` (`FENCED_OUT`, `CONTENDED`, `LEASE_EXPIRED`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// FENCED_OUT details: which resource refused, and the highest token it had accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest: Option<i64>,
    /// Why an `info` is indeterminate (`timeout`, `connection closed`, `partition`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
