//! The HTTP handlers of docs/lock-api.md: validate input, run one repository call, turn the row
//! count into the contract's outcome (with its log event and counter), answer JSON.
//!
//! Every input is validated before any SQL runs, so a rejected request writes nothing.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use dlock_common::{ApiError, ApiJson, ApiPath, ApiQuery, FencingToken, validate};
use dlock_wire::ErrorBody;
use dlock_wire::doc::BearerAuth;
use dlock_wire::int::JsonInt;
pub use dlock_wire::lock::{
    AcquireRequest, CreateSessionRequest, ListLocksQuery, LockEvent, LockGrant, LockList, LockListItem,
    LockOutcome, LockReleased, LockRenewed, LockState, LockView, RevokeOutcome as Outcome, RevokeRequest,
    SequenceView, SessionClosed, SessionCreated, SessionHeartbeat, TtlRequest, WatchMessage,
};
use dlock_wire::lock::{LockKeyPath, MAX_LIST_PAGE, MAX_WAIT_MS, SessionIdPath};
use uuid::Uuid;

use crate::auth::{Admin, Caller, Lister};
use crate::error::Error;
use crate::metrics::{AcquireResult, RevokeOutcome};
use crate::queue::{self, Waiter};
use crate::state::AppState;
use crate::store::{Grant, Revocation};
use crate::watch::{self, Item};

/// The OpenAPI 3.1 document of this API as kept in docs/openapi/, generated from [`ApiDoc`] (a test
/// fails when the file is stale and rewrites it with `DLOCK_UPDATE_OPENAPI=1`).
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/lock-server.yaml");

/// The document, derived from the wire types and the handlers' annotations.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "dlock lock-server",
        version = "1",
        description = "Sessions, lock acquire / renew / release with fencing tokens, force-revoke, health and metrics. The prose contract is docs/lock-api.md; the SQL behind each endpoint is C1 §1.3–1.4.\n\n- Bodies are JSON with camelCase fields; every error is `{\"code\": \"...\", \"message\": \"...\"}`.\n- All times come from the backend's clock; clients send TTLs in milliseconds, never times.\n- Fencing tokens are strictly positive 64-bit integers that strictly increase across keys and across release / re-acquire of the same key. Gaps are normal.\n- Lock keys go in the path percent-encoded (`/` as `%2F`).\n- A rejected request writes nothing.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        create_session, heartbeat, close_session, acquire, renew, release, read_lock, watch_lock,
        list_locks, revoke, sequence,
        dlock_wire::doc::healthz, readyz, metrics, openapi,
    ),
    components(schemas(ErrorBody, LockEvent, LockView)),
    modifiers(&BearerAuth),
    tags(
        (name = "sessions"), (name = "locks"), (name = "admin", description = "Bearer-protected (`LOCK_SERVER_ADMIN_TOKEN`)."),
        (name = "operations"),
    ),
)]
pub struct ApiDoc;

/// The document rendered as YAML: what docs/openapi/lock-server.yaml must contain.
pub fn openapi_yaml() -> String {
    dlock_wire::doc::to_yaml(&<ApiDoc as utoipa::OpenApi>::openapi())
}

/// A token read back from the backend, where it is always > 0; anything else is a corrupt row.
fn stored(token: i64) -> Result<FencingToken, ApiError> {
    FencingToken::new(token).map_err(ApiError::internal)
}

/// The signed grant of an answer (acquire and renew): `None` when lock-server has no signing key.
/// Every field was validated or read back from the store, so a failure here is a bug (500).
fn signed(
    state: &AppState,
    key: &str,
    token: FencingToken,
    owner_id: &str,
    session_id: Uuid,
) -> Result<Option<String>, ApiError> {
    state
        .signer()
        .map(|s| s.sign(key, token.get(), owner_id, session_id))
        .transpose()
        .map_err(ApiError::internal)
}

// ---- sessions ----------------------------------------------------------------------------------

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", operation_id = "createSession",
    request_body = CreateSessionRequest,
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Session opened.", body = SessionCreated),
        (status = 400, description = "A field is missing, malformed or out of bounds (`INVALID_OWNER_ID`, `INVALID_TTL`, `INVALID_FIELD`, `MALFORMED_JSON`); nothing is written.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the ownerId lies outside the client's owner prefixes, or the client lacks the `lock` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: the backend cannot be reached; retry later.", body = ErrorBody),
    ))]
pub async fn create_session(
    caller: Caller,
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CreateSessionRequest>,
) -> Result<(StatusCode, Json<SessionCreated>), ApiError> {
    validate::owner_id(&req.owner_id)?;
    caller.owner(&state, &req.owner_id)?;
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

#[utoipa::path(post, path = "/v1/sessions/{sessionId}/heartbeat", tag = "sessions", operation_id = "heartbeatSession",
    params(SessionIdPath), request_body = TtlRequest,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Session extended.", body = SessionHeartbeat),
        (status = 400, description = "Bad path or body (`INVALID_PATH`, `INVALID_TTL`, `INVALID_FIELD`, `MALFORMED_JSON`).", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the session belongs to another client, or the client lacks the `lock` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 410, description = "`SESSION_GONE`: the session was reaped or has expired; every lock under it is void.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn heartbeat(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(session_id): ApiPath<Uuid>,
    ApiJson(req): ApiJson<TtlRequest>,
) -> Result<Json<SessionHeartbeat>, ApiError> {
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    own_session(&caller, &state, session_id).await?;
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

#[utoipa::path(delete, path = "/v1/sessions/{sessionId}", tag = "sessions", operation_id = "closeSession",
    params(SessionIdPath),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Closed; `closed: false` if the session was already gone. Its locks are released by the cascade.", body = SessionClosed),
        (status = 400, description = "`INVALID_PATH`: the session id is not a UUID.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the session belongs to another client, or the client lacks the `lock` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn close_session(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(session_id): ApiPath<Uuid>,
) -> Result<Json<SessionClosed>, ApiError> {
    own_session(&caller, &state, session_id).await?;
    let closed = state.repo().close_session(session_id).await?;
    state.owners().forget_session(session_id);
    tracing::info!(event = "session_closed", %session_id, closed);
    Ok(Json(SessionClosed { session_id, closed }))
}

/// With a clients file: the session must be the caller's before anything is written to it (one
/// read of its owner, remembered after: a session id belongs to one owner for all time,
/// [`crate::owners`]). A session that is gone passes: the write then finds nothing, as it would
/// for anyone (session ids are random UUIDs the store draws, so none appears after this read).
/// Returns the session's owner.
async fn own_session(
    caller: &Caller,
    state: &AppState,
    session_id: Uuid,
) -> Result<Option<String>, ApiError> {
    if caller.client().is_none() {
        return Ok(None);
    }
    let owner = match state.owners().session(session_id) {
        Some(owner) => Some(owner),
        None => {
            let owner = state.repo().session_owner(session_id).await?;
            if let Some(owner) = &owner {
                state.owners().remember_session(session_id, owner);
            }
            owner
        }
    };
    if let Some(owner) = &owner {
        caller.session(state, session_id, owner)?;
    }
    Ok(owner)
}

/// With a clients file: the grant at `key` and `token` must be the caller's before renew or
/// release writes (one read of its owner, remembered after: one key and token is one grant for all
/// time, [`crate::owners`]). `false`: no grant is at that token, so the write would find zero
/// rows; the caller answers that without writing (the token may not be issued yet, and a grant
/// made after this read must not be touched by a request that was never checked against it).
async fn own_grant(caller: &Caller, state: &AppState, key: &str, token: i64) -> Result<bool, ApiError> {
    if caller.client().is_none() {
        return Ok(true);
    }
    let owner = match state.owners().grant(key, token) {
        Some(owner) => Some(owner),
        None => {
            let owner = state.repo().grant_owner(key, token).await?;
            if let Some(owner) = &owner {
                state.owners().remember_grant(key, token, owner);
            }
            owner
        }
    };
    match owner {
        Some(owner) => {
            caller.grant(state, key, token, &owner)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

// ---- locks -------------------------------------------------------------------------------------

#[utoipa::path(post, path = "/v1/locks/{key}/acquire", tag = "locks", operation_id = "acquireLock",
    params(LockKeyPath), request_body = AcquireRequest,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "GRANTED: a free key, a genuinely expired lease taken over, or the same session re-entering; always a new, higher token, and (with a signing key) its signed grant. With `waitMs`: granted in the key's queue, in arrival order.", body = LockGrant),
        (status = 400, description = "Bad key or body (`INVALID_LOCK_KEY`, `INVALID_OWNER_ID`, `INVALID_TTL`, `INVALID_WAIT`, `INVALID_FIELD`, `MALFORMED_JSON`).", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the key or ownerId lies outside the client's prefixes, the session belongs to another client (or another ownerId), or the client lacks the `lock` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 409, description = "`CONTENDED`: held by a live, different holder (with `waitMs`: still so when the wait ended).", body = ErrorBody),
        (status = 410, description = "`SESSION_GONE`: the session does not exist.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn acquire(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    ApiJson(req): ApiJson<AcquireRequest>,
) -> Result<Json<LockGrant>, ApiError> {
    validate::lock_key(&key)?;
    caller.key(&state, &key)?;
    validate::owner_id(&req.owner_id)?;
    caller.owner(&state, &req.owner_id)?;
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    if caller.client().is_some() {
        // Only under the client's own session, and as that session's owner. A session known to be
        // gone is answered here as the foreign key would answer it, without drawing a token (one
        // that lapsed while its owner was remembered is answered by the statement: crate::owners).
        match own_session(&caller, &state, req.session_id).await? {
            Some(owner) => caller.session_owner_is(&state, req.session_id, &owner, &req.owner_id)?,
            None => return Err(Error::SessionGone.into()),
        }
    }
    if let Some(wait_ms) = req.wait_ms {
        return acquire_waiting(&state, key, req, ttl, wait_ms).await;
    }
    match state
        .repo()
        .acquire(&key, &req.owner_id, req.session_id, ttl)
        .await?
    {
        Some(g) => {
            state.metrics().acquired(AcquireResult::granted);
            granted(&state, key, g)
        }
        None => {
            state.metrics().acquired(AcquireResult::contended);
            tracing::debug!(event = "lock_contended", lock_key = %key, owner_id = %req.owner_id);
            Err(Error::Contended.into())
        }
    }
}

/// The answer to a grant, however it was obtained (at once or after waiting in the queue).
fn granted(state: &AppState, key: String, g: Grant) -> Result<Json<LockGrant>, ApiError> {
    // Per-request events are debug: at info they would cost the hot path a JSON line each.
    tracing::debug!(
        event = "lock_granted",
        lock_key = %key,
        fencing_token = g.fencing_token,
        owner_id = %g.owner_id,
        session_id = %g.session_id,
    );
    let fencing_token = stored(g.fencing_token)?;
    if state.clients().is_some() {
        // Its renews and its release check this owner: known now, no read needed then.
        state.owners().remember_grant(&key, g.fencing_token, &g.owner_id);
    }
    let grant = signed(state, &key, fencing_token, &g.owner_id, g.session_id)?;
    Ok(Json(LockGrant {
        lock_key: key,
        fencing_token,
        owner_id: g.owner_id,
        session_id: g.session_id,
        acquired_at: g.acquired_at,
        expires_at: g.expires_at,
        grant,
    }))
}

/// `waitMs` given: wait in the key's queue ([`crate::queue`]).
async fn acquire_waiting(
    state: &AppState,
    key: String,
    req: AcquireRequest,
    ttl_secs: f64,
    wait_ms: i64,
) -> Result<Json<LockGrant>, ApiError> {
    if !(0..=MAX_WAIT_MS).contains(&wait_ms) {
        return Err(ApiError::bad_request(
            "INVALID_WAIT",
            format!("waitMs must be between 0 and {MAX_WAIT_MS} milliseconds, got {wait_ms}"),
        ));
    }
    let waiter = Waiter {
        key: key.clone(),
        owner_id: req.owner_id,
        session_id: req.session_id,
        ttl_secs,
        wait: Duration::from_millis(wait_ms.unsigned_abs()),
    };
    match queue::acquire(state, waiter).await? {
        Some(g) => granted(state, key, g),
        None => {
            tracing::debug!(event = "lock_contended", lock_key = %key, waited_ms = wait_ms);
            Err(Error::Contended.into())
        }
    }
}

#[utoipa::path(get, path = "/v1/locks/{key}/watch", tag = "locks", operation_id = "watchLock",
    params(LockKeyPath),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Server-sent events: first `state` (its data a `LockView`: the key as it is), then one `change` (its data a `LockEvent`) per change of its holder, in order: `GRANTED`, `RELEASED`, `REVOKED`, `EXPIRED`, `SESSION_ENDED`. The server ends the stream after its watch lifetime (`--watch-max-ms`); reconnect, and the new stream starts from the state again.", body = WatchMessage, content_type = "text/event-stream"),
        (status = 400, description = "`INVALID_LOCK_KEY`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the key lies outside the client's key prefixes, or the client lacks the `watch` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn watch_lock(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
) -> Result<Sse<impl futures::Stream<Item = Result<Event, Infallible>>>, ApiError> {
    validate::lock_key(&key)?;
    caller.key(&state, &key)?;
    let rx = watch::open(&state, key).await?;
    let closing = state.closing().clone();
    let open = Watcher::new(state.clone());
    let stream = futures::stream::unfold((rx, closing, open), |(mut rx, closing, open)| async move {
        let item = tokio::select! {
            item = rx.recv() => item?,
            () = closing.cancelled() => return None,
        };
        let event = match &item {
            Item::State(view) => Event::default().event("state").json_data(view),
            Item::Change(change) => Event::default().event("change").json_data(change),
        };
        // Serialising these plain structs cannot fail; if it did, the stream ends and the client
        // reconnects.
        event.ok().map(|e| (Ok(e), (rx, closing, open)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// One open watch stream, counted in `lock_watchers` while it lives.
struct Watcher(AppState);

impl Watcher {
    fn new(state: AppState) -> Self {
        state.metrics().watchers.inc();
        Self(state)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.metrics().watchers.dec();
    }
}

#[utoipa::path(get, path = "/v1/locks", tag = "admin", operation_id = "listLocks",
    params(ListLocksQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One page of held keys in key order (keyset paging), each with its holder, token, lease and queue length.", body = LockList),
        (status = 400, description = "`INVALID_PREFIX`, `INVALID_CURSOR`, `INVALID_LIMIT` or `INVALID_QUERY`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: neither the admin's bearer token nor (with a clients file) a client's.", body = ErrorBody),
        (status = 403, description = "`ADMIN_DISABLED`: no admin token is configured (and the token is no client's); `FORBIDDEN`: the client lacks the `list` operation, or `prefix` is not within one of its key prefixes.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn list_locks(
    Lister(caller): Lister,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListLocksQuery>,
) -> Result<Json<LockList>, ApiError> {
    let prefix = q.prefix.unwrap_or_default();
    if prefix.chars().count() > validate::MAX_KEY_LEN || prefix.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "INVALID_PREFIX",
            "prefix must be at most 256 characters without control characters",
        ));
    }
    caller.list_prefix(&state, &prefix)?;
    let after = match q.after {
        Some(after) if validate::lock_key(&after).is_ok() => after,
        Some(_) => {
            return Err(ApiError::bad_request(
                "INVALID_CURSOR",
                "after must be the nextCursor of a previous page (a lock key)",
            ));
        }
        None => String::new(),
    };
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIST_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            "INVALID_LIMIT",
            format!("limit must be between 1 and {MAX_LIST_PAGE}, got {limit}"),
        ));
    }
    let rows = state.repo().list(&prefix, &after, limit).await?;
    let full = i64::try_from(rows.len()).is_ok_and(|n| n == limit);
    let next_cursor = full.then(|| rows.last().map(|r| r.lock_key.clone())).flatten();
    let items = rows
        .into_iter()
        .map(|r| {
            Ok(LockListItem {
                state: if r.expired {
                    LockState::Expired
                } else {
                    LockState::Held
                },
                fencing_token: stored(r.fencing_token)?,
                lock_key: r.lock_key,
                owner_id: r.owner_id,
                session_id: r.session_id,
                acquired_at: r.acquired_at,
                expires_at: r.expires_at,
                waiters: r.waiters,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(LockList { items, next_cursor }))
}

#[utoipa::path(post, path = "/v1/locks/{key}/renew", tag = "locks", operation_id = "renewLock",
    params(LockKeyPath, dlock_wire::doc::FencingTokenHeader), request_body = TtlRequest,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Renewed; the grant signed again with the current signing key.", body = LockRenewed),
        (status = 400, description = "Bad key, token or body (`INVALID_LOCK_KEY`, `INVALID_TOKEN`, `INVALID_TTL`, `INVALID_FIELD`, `MALFORMED_JSON`).", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the key lies outside the client's key prefixes, the grant belongs to another client's session, or the client lacks the `lock` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 410, description = "`LEASE_EXPIRED`: the lease lapsed (even by 1 ms) or the key now belongs to a newer token; abort the critical section.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn renew(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<TtlRequest>,
) -> Result<Json<LockRenewed>, ApiError> {
    validate::lock_key(&key)?;
    caller.key(&state, &key)?;
    let token = FencingToken::from_headers(&headers)?;
    let ttl = validate::ttl_ms("ttlMs", req.ttl_ms)?;
    let renewed = if own_grant(&caller, &state, &key, token.get()).await? {
        state.repo().renew(&key, token.get(), ttl).await?
    } else {
        None
    };
    match renewed {
        Some(r) => {
            let fencing_token = stored(r.fencing_token)?;
            let grant = signed(&state, &key, fencing_token, &r.owner_id, r.session_id)?;
            Ok(Json(LockRenewed {
                lock_key: key,
                fencing_token,
                expires_at: r.expires_at,
                grant,
            }))
        }
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

#[utoipa::path(post, path = "/v1/locks/{key}/release", tag = "locks", operation_id = "releaseLock",
    params(LockKeyPath, dlock_wire::doc::FencingTokenHeader),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Released, or stale (`released: false, stale: true`): the grant was already gone. Never retried with a wider predicate.", body = LockReleased),
        (status = 400, description = "`INVALID_LOCK_KEY` or `INVALID_TOKEN`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries no client's bearer token; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the key lies outside the client's key prefixes, the grant belongs to another client's session, or the client lacks the `lock` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn release(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    headers: HeaderMap,
) -> Result<Json<LockReleased>, ApiError> {
    validate::lock_key(&key)?;
    caller.key(&state, &key)?;
    let token = FencingToken::from_headers(&headers)?;
    let released = own_grant(&caller, &state, &key, token.get()).await?
        && state.repo().release(&key, token.get()).await?;
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
        fencing_token: token,
        released,
        stale,
    }))
}

#[utoipa::path(get, path = "/v1/locks/{key}", tag = "locks", operation_id = "readLock",
    params(LockKeyPath),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The key's state: `FREE`, `HELD`, or `EXPIRED` (lapsed, not yet reaped).", body = LockView),
        (status = 400, description = "`INVALID_LOCK_KEY`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: a clients file is configured and the request carries neither a client's bearer token nor the admin's; nothing is read or written.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN` (with a clients file): the key lies outside the client's key prefixes, or the client lacks the `read` operation; the message says which. Nothing is written.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
pub async fn read_lock(
    caller: Caller,
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<LockView>, ApiError> {
    validate::lock_key(&key)?;
    caller.key(&state, &key)?;
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
            fencing_token: Some(stored(row.fencing_token)?),
            owner_id: Some(row.owner_id),
            acquired_at: Some(row.acquired_at),
            expires_at: Some(row.expires_at),
        },
    };
    Ok(Json(view))
}

// ---- admin -------------------------------------------------------------------------------------

/// Longest accepted revoke reason, in characters.
pub const MAX_REASON_LEN: usize = 1024;

fn invalid_field(message: &str) -> ApiError {
    ApiError::bad_request("INVALID_FIELD", message)
}

fn validate_revoke(req: &RevokeRequest) -> Result<(), ApiError> {
    // Same shape as an owner id: it names a person or a controller in the audit row.
    validate::owner_id(&req.operator).map_err(|_| {
        invalid_field("operator must be 1..=128 printable characters without surrounding spaces")
    })?;
    let reason = req.reason.trim();
    if reason.is_empty()
        || req.reason.chars().count() > MAX_REASON_LEN
        || req.reason.chars().any(char::is_control)
    {
        return Err(invalid_field(
            "reason must be non-blank, at most 1024 characters, without control characters",
        ));
    }
    if let Some(id) = &req.request_id {
        validate::owner_id(id).map_err(|_| {
            invalid_field("requestId must be 1..=128 printable characters without surrounding spaces")
        })?;
    }
    Ok(())
}

/// `fencingToken` of a revoke body, read as every integer field is (`7`, `7.0` and `7e0` are 7,
/// exactly), or its decimal text as the `X-Fencing-Token` header is; > 0. `null` is refused too —
/// absent is the only "unpinned".
fn pinned_token(raw: Option<&JsonInt>) -> Result<Option<FencingToken>, ApiError> {
    let Some(value) = raw else { return Ok(None) };
    value
        .fencing_token("fencingToken")
        .map(Some)
        .map_err(|m| ApiError::bad_request("INVALID_TOKEN", m))
}

#[utoipa::path(post, path = "/v1/admin/locks/{key}/revoke", tag = "admin", operation_id = "revokeLock",
    params(LockKeyPath), request_body = RevokeRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The outcome: `REVOKED`, `ALREADY_REVOKED`, `HELD_BY_OTHER_TOKEN` (pinned to a token that is no longer live; nothing removed) or `NOT_HELD`.", body = LockOutcome),
        (status = 400, description = "Bad key or body (`INVALID_LOCK_KEY`, `INVALID_FIELD`, `INVALID_TOKEN`, `MALFORMED_JSON`).", body = ErrorBody),
        (status = 401, description = "`UNAUTHORIZED`: no valid admin bearer token.", body = ErrorBody),
        (status = 403, description = "`ADMIN_DISABLED`: no admin token is configured.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`.", body = ErrorBody),
    ))]
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

#[utoipa::path(get, path = "/v1/sequence", tag = "operations", operation_id = "readSequence",
    responses(
        (status = 200, description = "This replica's last jump of `fencing_token_seq`: before any grant on a lockdb history it could not vouch for (its own start, a new system or timeline, a restarted postmaster), the sequence moved above anything that history can have handed out. Absent until the first grant's connection made one; never on etcd.", body = SequenceView),
    ))]
/// `GET /v1/sequence`: the last jump (the operator shows it in the LockService's status).
pub async fn sequence(State(state): State<AppState>) -> Json<SequenceView> {
    let repo = state.repo();
    let (jumps_enabled, last_jump) = repo.sequence_jumps();
    Json(SequenceView {
        backend: repo.name().to_owned(),
        jumps_enabled,
        last_jump,
    })
}

#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz",
    responses(
        (status = 200, description = "The backend answers.", body = String, content_type = "text/plain", example = "ready"),
        (status = 503, description = "`UNAVAILABLE`: the backend does not answer.", body = ErrorBody),
    ))]
/// `/readyz`: lockdb answers `SELECT 1`.
pub async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state.repo().ping().await.map_err(ApiError::unavailable)?;
    Ok("ready")
}

#[utoipa::path(get, path = "/metrics", tag = "operations", operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text exposition (OpenMetrics).", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
    ))]
pub async fn metrics(State(state): State<AppState>) -> axum::response::Response {
    dlock_common::metrics::handler(State(state.metrics().registry())).await
}

#[utoipa::path(get, path = "/openapi.yaml", tag = "operations", operation_id = "openapi",
    responses(
        (status = 200, description = "This document.", body = Object, content_type = "application/yaml"),
    ))]
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
