//! The HTTP handlers of docs/lock-api.md: validate input, run one repository call, turn the row
//! count into the contract's outcome (with its log event and counter), answer JSON.
//!
//! Every input is validated before any SQL runs, so a rejected request writes nothing.

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use dlock_common::{ApiError, ApiJson, ApiPath, FencingToken, validate};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Admin;
use crate::error::Error;
use crate::metrics::{AcquireResult, RevokeOutcome};
use crate::repo::Revocation;
use crate::state::AppState;

/// The OpenAPI 3.1 document of this API.
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/lock-server.yaml");

// ---- sessions ----------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSessionRequest {
    pub owner_id: String,
    pub ttl_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionCreated {
    pub session_id: Uuid,
    pub owner_id: String,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TtlRequest {
    pub ttl_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionHeartbeat {
    pub session_id: Uuid,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionClosed {
    pub session_id: Uuid,
    pub closed: bool,
}

pub async fn create_session(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CreateSessionRequest>,
) -> Result<(StatusCode, Json<SessionCreated>), ApiError> {
    validate::owner_id(&req.owner_id)?;
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    let s = state.repo().create_session(&req.owner_id, ttl).await?;
    tracing::info!(event = "session_opened", session_id = %s.session_id, owner_id = %s.owner_id);
    Ok((
        StatusCode::CREATED,
        Json(SessionCreated {
            session_id: s.session_id,
            owner_id: s.owner_id,
            expires_at: s.expires_at,
        }),
    ))
}

pub async fn heartbeat(
    State(state): State<AppState>,
    ApiPath(session_id): ApiPath<Uuid>,
    ApiJson(req): ApiJson<TtlRequest>,
) -> Result<Json<SessionHeartbeat>, ApiError> {
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    match state.repo().heartbeat(session_id, ttl).await? {
        Some(expires_at) => Ok(Json(SessionHeartbeat {
            session_id,
            expires_at,
        })),
        None => {
            // C1 §1.4: the session was reaped; every handle under it is void.
            state.metrics().session_lost.inc();
            tracing::warn!(event = "session_lost", %session_id, "heartbeat found no live session");
            Err(Error::SessionGone.into())
        }
    }
}

pub async fn close_session(
    State(state): State<AppState>,
    ApiPath(session_id): ApiPath<Uuid>,
) -> Result<Json<SessionClosed>, ApiError> {
    let closed = state.repo().close_session(session_id).await?;
    tracing::info!(event = "session_closed", %session_id, closed);
    Ok(Json(SessionClosed { session_id, closed }))
}

// ---- locks -------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcquireRequest {
    pub session_id: Uuid,
    pub owner_id: String,
    pub ttl_ms: i64,
}

/// `LockGrant` of docs/lock-api.md.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockGrant {
    pub lock_key: String,
    pub fencing_token: i64,
    pub owner_id: String,
    pub session_id: Uuid,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockRenewed {
    pub lock_key: String,
    pub fencing_token: i64,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockReleased {
    pub lock_key: String,
    pub fencing_token: i64,
    pub released: bool,
    pub stale: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockState {
    Free,
    Held,
    Expired,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    pub lock_key: String,
    pub state: LockState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

pub async fn acquire(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    ApiJson(req): ApiJson<AcquireRequest>,
) -> Result<Json<LockGrant>, ApiError> {
    validate::lock_key(&key)?;
    validate::owner_id(&req.owner_id)?;
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    match state
        .repo()
        .acquire(&key, &req.owner_id, req.session_id, ttl)
        .await?
    {
        Some(g) => {
            state.metrics().acquired(AcquireResult::granted);
            // Per-request events are debug: at info they would cost the hot path a JSON line each.
            tracing::debug!(
                event = "lock_granted",
                lock_key = %key,
                fencing_token = g.fencing_token,
                owner_id = %g.owner_id,
                session_id = %g.session_id,
            );
            Ok(Json(LockGrant {
                lock_key: key,
                fencing_token: g.fencing_token,
                owner_id: g.owner_id,
                session_id: g.session_id,
                acquired_at: g.acquired_at,
                expires_at: g.expires_at,
            }))
        }
        None => {
            state.metrics().acquired(AcquireResult::contended);
            tracing::debug!(event = "lock_contended", lock_key = %key, owner_id = %req.owner_id);
            Err(Error::Contended.into())
        }
    }
}

pub async fn renew(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<TtlRequest>,
) -> Result<Json<LockRenewed>, ApiError> {
    validate::lock_key(&key)?;
    let token = FencingToken::from_headers(&headers)?;
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    match state.repo().renew(&key, token.get(), ttl).await? {
        Some(r) => Ok(Json(LockRenewed {
            lock_key: key,
            fencing_token: r.fencing_token,
            expires_at: r.expires_at,
        })),
        None => {
            // C1 §1.4: the caller must abort its critical section; this is terminal.
            state.metrics().session_lost.inc();
            tracing::warn!(
                event = "lease_expired",
                lock_key = %key,
                fencing_token = token.get(),
                "renew found zero rows: lapsed, or taken over by a newer token"
            );
            Err(Error::LeaseExpired.into())
        }
    }
}

pub async fn release(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    headers: HeaderMap,
) -> Result<Json<LockReleased>, ApiError> {
    validate::lock_key(&key)?;
    let token = FencingToken::from_headers(&headers)?;
    let released = state.repo().release(&key, token.get()).await?;
    let stale = !released;
    state.metrics().released(stale);
    // C1 §1.4: a stale release is a success; it is logged, never retried with a wider predicate.
    if stale {
        tracing::info!(event = "lock_released", lock_key = %key, fencing_token = token.get(), stale);
    } else {
        tracing::debug!(event = "lock_released", lock_key = %key, fencing_token = token.get(), stale);
    }
    Ok(Json(LockReleased {
        lock_key: key,
        fencing_token: token.get(),
        released,
        stale,
    }))
}

pub async fn read_lock(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<LockView>, ApiError> {
    validate::lock_key(&key)?;
    let view = match state.repo().read(&key).await? {
        None => LockView {
            lock_key: key,
            state: LockState::Free,
            fencing_token: None,
            owner_id: None,
            acquired_at: None,
            expires_at: None,
        },
        Some(row) => LockView {
            lock_key: key,
            state: if row.expired {
                LockState::Expired
            } else {
                LockState::Held
            },
            fencing_token: Some(row.fencing_token),
            owner_id: Some(row.owner_id),
            acquired_at: Some(row.acquired_at),
            expires_at: Some(row.expires_at),
        },
    };
    Ok(Json(view))
}

// ---- admin -------------------------------------------------------------------------------------

/// Longest accepted revoke reason, in bytes.
pub const MAX_REASON_LEN: usize = 1024;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevokeRequest {
    pub operator: String,
    pub reason: String,
    #[serde(default)]
    pub request_id: Option<String>,
    /// The grant to remove. Kept as raw JSON so that a bad value is `INVALID_TOKEN` (as in the
    /// header), not a generic body error; see [`pinned_token`].
    #[serde(default, deserialize_with = "present")]
    pub fencing_token: Option<serde_json::Value>,
}

/// `Some` for any value that is present, `null` included: a `"fencingToken": null` must be refused,
/// not read as "unpinned" (which would remove whatever grant is live).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Revoked,
    AlreadyRevoked,
    HeldByOtherToken,
    NotHeld,
}

/// The force-revoke result record (`LockOutcome` in the contracts).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockOutcome {
    pub outcome: Outcome,
    pub lock_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_token: Option<i64>,
    /// With `HELD_BY_OTHER_TOKEN`: the token of the live grant that was left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_token: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

fn invalid_field(message: &str) -> ApiError {
    ApiError::bad_request("INVALID_FIELD", message)
}

fn validate_revoke(req: &RevokeRequest) -> Result<(), ApiError> {
    // Same shape as an owner id: it names a person or a controller in the audit row.
    validate::owner_id(&req.operator)
        .map_err(|_| invalid_field("operator must be 1..=128 printable bytes without surrounding spaces"))?;
    let reason = req.reason.trim();
    if reason.is_empty() || req.reason.len() > MAX_REASON_LEN || req.reason.chars().any(char::is_control) {
        return Err(invalid_field(
            "reason must be non-blank, at most 1024 bytes, without control characters",
        ));
    }
    if let Some(id) = &req.request_id {
        validate::owner_id(id).map_err(|_| {
            invalid_field("requestId must be 1..=128 printable bytes without surrounding spaces")
        })?;
    }
    Ok(())
}

/// `fencingToken` of a revoke body, judged as strictly as the `X-Fencing-Token` header: a JSON
/// integer > 0 (or its decimal string). `null` is refused too — absent is the only "unpinned".
fn pinned_token(raw: Option<&serde_json::Value>) -> Result<Option<FencingToken>, ApiError> {
    let Some(value) = raw else { return Ok(None) };
    FencingToken::deserialize(value)
        .map(Some)
        .map_err(|e| ApiError::bad_request("INVALID_TOKEN", format!("fencingToken: {e}")))
}

pub async fn revoke(
    _admin: Admin,
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    ApiJson(req): ApiJson<RevokeRequest>,
) -> Result<Json<LockOutcome>, ApiError> {
    validate::lock_key(&key)?;
    validate_revoke(&req)?;
    let pinned = pinned_token(req.fencing_token.as_ref())?;
    let revocation = match pinned {
        Some(token) => {
            state
                .repo()
                .revoke_pinned(&key, token.get(), &req.operator, &req.reason)
                .await?
        }
        // The unpinned form removes whatever is live now; the operator never uses it.
        None => match state.repo().revoke(&key, &req.operator, &req.reason).await? {
            Some(r) => Revocation::Revoked(r),
            None => Revocation::NotHeld,
        },
    };
    let pinned_token = pinned.map(FencingToken::get);
    let mut out = LockOutcome {
        outcome: Outcome::NotHeld,
        lock_key: key,
        previous_owner: None,
        previous_token: None,
        current_token: None,
        request_id: req.request_id,
    };
    let metric = match revocation {
        Revocation::Revoked(r) => {
            tracing::warn!(
                event = "lock_revoked",
                outcome = "revoked",
                lock_key = %out.lock_key,
                previous_owner = %r.owner_id,
                previous_token = r.fencing_token,
                pinned_token,
                operator = %req.operator,
                reason = %req.reason,
                request_id = out.request_id.as_deref(),
            );
            out.outcome = Outcome::Revoked;
            out.previous_owner = Some(r.owner_id);
            out.previous_token = Some(r.fencing_token);
            RevokeOutcome::revoked
        }
        Revocation::AlreadyRevoked(r) => {
            tracing::info!(
                event = "lock_revoked",
                outcome = "already_revoked",
                lock_key = %out.lock_key,
                previous_owner = %r.owner_id,
                previous_token = r.fencing_token,
                operator = %req.operator,
                request_id = out.request_id.as_deref(),
            );
            out.outcome = Outcome::AlreadyRevoked;
            out.previous_owner = Some(r.owner_id);
            out.previous_token = Some(r.fencing_token);
            RevokeOutcome::already_revoked
        }
        Revocation::HeldByOtherToken { current_token } => {
            tracing::info!(
                event = "lock_revoked",
                outcome = "held_by_other_token",
                lock_key = %out.lock_key,
                pinned_token,
                current_token,
                operator = %req.operator,
                request_id = out.request_id.as_deref(),
            );
            out.outcome = Outcome::HeldByOtherToken;
            out.current_token = Some(current_token);
            RevokeOutcome::held_by_other_token
        }
        Revocation::NotHeld => {
            tracing::info!(
                event = "lock_revoked",
                outcome = "not_held",
                lock_key = %out.lock_key,
                pinned_token,
                operator = %req.operator,
                request_id = out.request_id.as_deref(),
            );
            RevokeOutcome::not_held
        }
    };
    state.metrics().revoked(metric);
    Ok(Json(out))
}

// ---- operations --------------------------------------------------------------------------------

/// `/readyz`: lockdb answers `SELECT 1`.
pub async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state.repo().ping().await.map_err(ApiError::unavailable)?;
    Ok("ready")
}

pub async fn metrics(State(state): State<AppState>) -> axum::response::Response {
    dlock_common::metrics::handler(State(state.metrics().registry())).await
}

pub async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "METHOD_NOT_ALLOWED",
        "this endpoint does not accept that method",
    )
}
