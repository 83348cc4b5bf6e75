//! lock-server's bodies (docs/lock-api.md). Keys and owner ids follow
//! [`crate::validate`]; TTLs are integers of milliseconds in 10..=86 400 000.

use crate::FencingToken;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
#[cfg(feature = "openapi")]
use utoipa::IntoParams;
#[cfg(feature = "openapi")]
use utoipa::openapi::path::{Parameter, ParameterIn};
#[cfg(feature = "openapi")]
use utoipa::openapi::schema::ObjectBuilder;
use uuid::Uuid;

#[cfg(feature = "openapi")]
use crate::shape;

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSessionRequest {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::owner_id))]
    pub owner_id: String,
    #[serde(deserialize_with = "crate::int::integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 10, maximum = 86400000))]
    pub ttl_ms: i64,
}

/// `201` of `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionCreated {
    pub session_id: Uuid,
    pub owner_id: String,
    pub expires_at: DateTime<Utc>,
}

/// The body of a heartbeat or a renew: the new TTL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TtlRequest {
    #[serde(deserialize_with = "crate::int::integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 10, maximum = 86400000))]
    pub ttl_ms: i64,
}

/// `200` of `POST /v1/sessions/{sessionId}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionHeartbeat {
    pub session_id: Uuid,
    pub expires_at: DateTime<Utc>,
}

/// `200` of `DELETE /v1/sessions/{sessionId}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionClosed {
    pub session_id: Uuid,
    /// `false` if the session was already gone.
    pub closed: bool,
}

/// Longest blocking acquire a request may ask for (`waitMs`), in milliseconds.
pub const MAX_WAIT_MS: i64 = 60_000;

/// `POST /v1/locks/{key}/acquire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcquireRequest {
    pub session_id: Uuid,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::owner_id))]
    pub owner_id: String,
    #[serde(deserialize_with = "crate::int::integral")]
    #[cfg_attr(feature = "openapi", schema(minimum = 10, maximum = 86400000))]
    pub ttl_ms: i64,
    /// Wait for the lock: join the key's queue and answer when granted (in arrival order), or
    /// `CONTENDED` when this many milliseconds have passed. Absent: do not wait (one attempt).
    #[serde(
        default,
        deserialize_with = "crate::int::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 60000, nullable = false))]
    pub wait_ms: Option<i64>,
}

/// `200` of `POST /v1/locks/{key}/acquire` (GRANTED).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockGrant {
    pub lock_key: String,
    pub fencing_token: FencingToken,
    pub owner_id: String,
    pub session_id: Uuid,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The grant signed by the lock service (lock service id, key id, lock key, token, owner,
    /// session): present it in `X-Fencing-Grant` beside `X-Fencing-Token`. Absent when lock-server
    /// has no signing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = signed_grant))]
    pub grant: Option<String>,
}

/// `200` of `POST /v1/locks/{key}/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockRenewed {
    pub lock_key: String,
    pub fencing_token: FencingToken,
    pub expires_at: DateTime<Utc>,
    /// The same grant signed again, with the key lock-server signs with now (after a key rotation,
    /// the new one): use it from here on. Absent when lock-server has no signing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = signed_grant))]
    pub grant: Option<String>,
}

#[cfg(feature = "openapi")]
fn signed_grant() -> ObjectBuilder {
    shape::signed_grant()
}

/// `200` of `POST /v1/locks/{key}/release`; a stale release (`released: false, stale: true`) is a
/// success too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockReleased {
    pub lock_key: String,
    pub fencing_token: FencingToken,
    pub released: bool,
    pub stale: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockState {
    Free,
    Held,
    Expired,
}

/// Why lock-server jumped `fencing_token_seq`: the lockdb history behind it was one it could not
/// vouch for (docs/design.md, "Never a reused token").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JumpCause {
    /// The process had vouched for no history yet.
    Start,
    /// Another cluster or database: a fresh initdb, a logical restore, a database dropped and
    /// created again from a backup.
    NewSystem,
    /// The same cluster on another timeline: a promotion, a restore with recovery, a rewind.
    NewTimeline,
    /// The same timeline, another postmaster: a restart, a crash, a restored file-system copy.
    PostmasterRestart,
}

/// One jump of the sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SequenceJump {
    pub at: DateTime<Utc>,
    pub cause: JumpCause,
    /// What `nextval` found: above every token the history had handed out.
    pub found: i64,
    /// What the sequence was set to: the next token is above it.
    pub jumped_to: i64,
    /// The history jumped on: the cluster's system identifier, its timeline, when its postmaster
    /// started.
    pub system_identifier: String,
    pub timeline: i64,
    pub postmaster_started: DateTime<Utc>,
}

/// `200` of `GET /v1/sequence`: this replica's last jump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SequenceView {
    /// `postgres` or `etcd` (etcd's revision never goes back on a live cluster: no jumps there).
    pub backend: String,
    /// `false` only for a negative control run with the jump switched off.
    pub jumps_enabled: bool,
    /// Absent until the first jump (on PostgreSQL, the first grant's connection makes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub last_jump: Option<SequenceJump>,
}

/// `200` of `GET /v1/locks/{key}`. The grant's fields are absent when the key is `FREE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    pub lock_key: String,
    pub state: LockState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<FencingToken>, nullable = false))]
    pub fencing_token: Option<FencingToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub owner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub acquired_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub expires_at: Option<DateTime<Utc>>,
}

/// `POST /v1/admin/locks/{key}/revoke`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevokeRequest {
    #[cfg_attr(feature = "openapi", schema(schema_with = operator))]
    pub operator: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::revoke_reason))]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = request_id))]
    pub request_id: Option<String>,
    /// The grant to remove (an integer > 0, or its decimal text); absent removes whatever grant is
    /// live. Kept as its JSON text (read by [`crate::int::JsonInt::fencing_token`]) so that a bad
    /// value is `INVALID_TOKEN`, as in the header; `null` is refused, not read as "unpinned".
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(schema_with = token_input))]
    pub fencing_token: Option<crate::int::JsonInt>,
}

#[cfg(feature = "openapi")]
fn token_input() -> utoipa::openapi::schema::Schema {
    FencingToken::input_schema()
}

#[cfg(feature = "openapi")]
fn operator() -> ObjectBuilder {
    shape::described(
        shape::owner_id(),
        "Who revokes: a person or a controller, recorded in the audit row.",
    )
}

#[cfg(feature = "openapi")]
fn request_id() -> ObjectBuilder {
    shape::or_null(shape::owner_id())
}

/// `Some` for any value that is present, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<crate::int::JsonInt>, D::Error> {
    crate::int::JsonInt::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RevokeOutcome {
    Revoked,
    AlreadyRevoked,
    HeldByOtherToken,
    NotHeld,
}

/// The force-revoke result record (`LockOutcome` in the contracts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockOutcome {
    pub outcome: RevokeOutcome,
    pub lock_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub previous_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<FencingToken>, nullable = false))]
    pub previous_token: Option<i64>,
    /// With `HELD_BY_OTHER_TOKEN`: the token of the live grant that was left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<FencingToken>, nullable = false))]
    pub current_token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub request_id: Option<String>,
}

/// What happened to a key's grant, as a watch reports it (`GET /v1/locks/{key}/watch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockEventType {
    /// A new grant: a free key taken, an expired lease taken over, or a re-entry. Any earlier grant
    /// of the key is gone.
    Granted,
    /// The holder released it.
    Released,
    /// An operator force-revoked it.
    Revoked,
    /// Its lease lapsed (by the store's clock) before anyone took the key over.
    Expired,
    /// Its session ended (closed, or reaped after it lapsed), and the grant with it.
    SessionEnded,
}

/// One change of a key's holder (the `change` events of a watch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockEvent {
    #[serde(rename = "type")]
    pub kind: LockEventType,
    pub lock_key: String,
    /// The grant the event is about.
    pub fencing_token: FencingToken,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub owner_id: Option<String>,
    /// With `GRANTED`: the lease's end as the grant reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub expires_at: Option<DateTime<Utc>>,
}

/// One server-sent event of a watch, as it is on the wire (its `event:` and `data:` lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WatchMessage {
    pub event: WatchMessageKind,
    /// JSON text: a `LockView` for `state`, a `LockEvent` for `change`.
    pub data: String,
}

/// The `event:` of a watch's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum WatchMessageKind {
    /// The key as it is: the first message of every stream.
    State,
    /// A change of its holder.
    Change,
}

/// Largest page of `GET /v1/locks`.
pub const MAX_LIST_PAGE: i64 = 500;

/// The query of `GET /v1/locks`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ListLocksQuery {
    /// Only keys that start with this text (default: every key).
    #[cfg_attr(
        feature = "openapi",
        param(max_length = 256, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")
    )]
    pub prefix: Option<String>,
    /// The `nextCursor` of the previous page: keys after it, in the store's key order.
    #[cfg_attr(
        feature = "openapi",
        param(
            min_length = 1,
            max_length = 256,
            pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
        )
    )]
    pub after: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 500))]
    pub limit: Option<i64>,
}

/// One held key of `GET /v1/locks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockListItem {
    pub lock_key: String,
    /// `HELD`, or `EXPIRED` (lapsed, not yet taken over or reaped; PostgreSQL only).
    pub state: LockState,
    pub fencing_token: FencingToken,
    pub owner_id: String,
    pub session_id: Uuid,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Blocking acquires queued for the key.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub waiters: i64,
}

/// `200` of `GET /v1/locks`: one page, in key order (keyset paging).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LockList {
    pub items: Vec<LockListItem>,
    /// Present when the page was full: pass it as `after` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub next_cursor: Option<String>,
}

/// The `{key}` of the lock routes: percent-encoded in the path (`/` as `%2F`).
#[derive(Debug, Clone, Deserialize)]
pub struct LockKeyPath {
    pub key: String,
}

#[cfg(feature = "openapi")]
impl IntoParams for LockKeyPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![shape::path_param(
            "key",
            Some("1..=256 printable characters without surrounding spaces."),
            shape::lock_key(),
        )]
    }
}

/// The `{sessionId}` of the session routes.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Path, rename_all = "camelCase"))]
pub struct SessionIdPath {
    pub session_id: Uuid,
}

#[cfg(all(test, feature = "openapi"))]
mod tests {
    use super::*;
    use crate::pattern;

    /// The schemas use the patterns of [`crate::pattern`] (through [`crate::shape`]).
    #[test]
    fn the_schemas_use_the_shared_patterns() {
        let doc = serde_json::to_string(&<AcquireRequest as utoipa::PartialSchema>::schema()).expect("json");
        assert!(doc.contains(&serde_json::to_string(pattern::PRINTABLE).expect("json")[1..]));
        let doc = serde_json::to_string(&<RevokeRequest as utoipa::PartialSchema>::schema()).expect("json");
        assert!(doc.contains(&serde_json::to_string(pattern::REASON_TEXT).expect("json")[1..]));
    }
}
