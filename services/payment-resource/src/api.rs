//! The HTTP API (docs/openapi/payment-resource.yaml, also served at `GET /openapi.yaml`). Handlers only
//! parse, call one service method and shape the answer; errors become [`ApiError`] here, once.

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use dlock_common::auth::{self, Credentials, Gate, Role};
use dlock_common::error::not_found_fallback;
use dlock_common::grant::GrantGate;
use dlock_common::{ApiError, ApiJson, ApiPath, ApiQuery, FencingToken};
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use uuid::Uuid;

use crate::accounts::{AccountView, Accounts, NewAccount};
use crate::model::{AccountKind, Payout, PayoutState};
use crate::payouts::{Claimed, NewPayout, Page, Payouts, Transitioned};
use crate::posting::{Posted, Posting};
use crate::reconcile::{self, Report};
use crate::sql;
use dlock_wire::ErrorBody;
use dlock_wire::doc::{BearerAuth, FencingGrantHeader, FencingTokenHeader};
use dlock_wire::payment::{
    AccountIdPath, ClaimRequest, CreateAccountRequest, CreatePayoutRequest, ListPayoutsQuery, PayoutIdPath,
    ReconciliationQuery, TransitionRequest,
};

/// The OpenAPI document as kept in docs/openapi/, generated from [`ApiDoc`] (a test fails when the
/// file is stale; `DLOCK_UPDATE_OPENAPI=1` rewrites it), compiled in so the binary serves it.
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/payment-resource.yaml");

/// The document, derived from the wire types and the handlers' annotations.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "dlock payment-resource",
        version = "1",
        description = "The protected resource over paydb: accounts, payouts and the ledger, with the fenced writes (a)(b)(c) in one transaction. Money is integer minor units; the fencing token travels in `X-Fencing-Token`, the grant lock-server signed for it in `X-Fencing-Grant` (verified before anything is read: it must be for `account:<the payout's account>`). Writes need a bearer credential of the right role (docs/security.md): `admin` for accounts and reconciliation, `client` to create payouts, `executor` for claim, transition and post. A rejected request writes nothing.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        create_account, get_account, create_payout, list_payouts, get_payout, claim_payout,
        transition_payout, post_payout, reconciliation, openapi, dlock_wire::doc::healthz, readyz,
        dlock_wire::doc::metrics,
    ),
    components(schemas(ErrorBody, dlock_wire::payment::ListedState)),
    modifiers(&BearerAuth),
    tags(
        (name = "accounts"), (name = "payouts"),
        (name = "executor", description = "The executor's fenced calls (role `executor`)."),
        (name = "admin", description = "Reconciliation (role `admin`)."), (name = "operations"),
    ),
)]
pub struct ApiDoc;

/// The document rendered as YAML: what docs/openapi/payment-resource.yaml must contain.
pub fn openapi_yaml() -> String {
    dlock_wire::doc::to_yaml(&<ApiDoc as utoipa::OpenApi>::openapi())
}

/// Every route this router serves, as (method, path): the OpenAPI document must list the same set.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/accounts"),
    ("GET", "/v1/accounts/{accountId}"),
    ("POST", "/v1/payouts"),
    ("GET", "/v1/payouts"),
    ("GET", "/v1/payouts/{payoutId}"),
    ("POST", "/v1/payouts/{payoutId}/claim"),
    ("POST", "/v1/payouts/{payoutId}/transition"),
    ("POST", "/v1/payouts/{payoutId}/post"),
    ("GET", "/v1/reconciliation"),
    ("GET", "/openapi.yaml"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
];

/// Who may call each protected route (docs/security.md). Reads of payouts and accounts, health,
/// readiness, metrics and this document stay open.
pub const ADMIN: &[Role] = &[Role::Admin];
pub const EXECUTOR: &[Role] = &[Role::Executor];
pub const CLIENT: &[Role] = &[Role::Client];

/// Every protected (method, path) and the roles it admits; the OpenAPI document must mark the same
/// set with its security requirement.
pub const PROTECTED: &[(&str, &str, &[Role])] = &[
    ("POST", "/v1/accounts", ADMIN),
    ("POST", "/v1/payouts", CLIENT),
    ("POST", "/v1/payouts/{payoutId}/claim", EXECUTOR),
    ("POST", "/v1/payouts/{payoutId}/transition", EXECUTOR),
    ("POST", "/v1/payouts/{payoutId}/post", EXECUTOR),
    ("GET", "/v1/reconciliation", ADMIN),
];

/// Everything the handlers need, passed explicitly.
#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub credentials: Arc<Credentials>,
    /// Signed-grant verification of the executor's fenced calls, and its refusal counter.
    pub grants: GrantGate,
    pub accounts: Accounts,
    pub payouts: Payouts,
    pub posting: Posting,
}

pub fn router(state: AppState, registry: Arc<Registry>) -> Router {
    let metrics = Router::new()
        .route("/metrics", get(dlock_common::metrics::handler))
        .with_state(registry);
    let creds = state.credentials.clone();
    let gate =
        |allowed: &'static [Role]| from_fn_with_state(Gate::new(creds.clone(), allowed), auth::require);
    Router::new()
        .route("/v1/accounts", post(create_account).route_layer(gate(ADMIN)))
        .route("/v1/accounts/{accountId}", get(get_account))
        .route(
            "/v1/payouts",
            post(create_payout).route_layer(gate(CLIENT)).get(list_payouts),
        )
        .route("/v1/payouts/{payoutId}", get(get_payout))
        .route(
            "/v1/payouts/{payoutId}/claim",
            post(claim_payout).route_layer(gate(EXECUTOR)),
        )
        .route(
            "/v1/payouts/{payoutId}/transition",
            post(transition_payout).route_layer(gate(EXECUTOR)),
        )
        .route(
            "/v1/payouts/{payoutId}/post",
            post(post_payout).route_layer(gate(EXECUTOR)),
        )
        .route("/v1/reconciliation", get(reconciliation).route_layer(gate(ADMIN)))
        .route("/openapi.yaml", get(openapi))
        .route("/healthz", get(dlock_common::serve::healthz))
        .route("/readyz", get(readyz))
        .route_layer(from_fn_with_state(
            state.metrics.http.clone(),
            dlock_common::metrics::observe_http,
        ))
        .with_state(state)
        .merge(metrics)
        .fallback(not_found_fallback)
}

/// `X-Fencing-Token`, parsed strictly: missing, empty, non-numeric, zero, negative or overflowing is
/// 400 INVALID_TOKEN, never 0.
#[derive(Debug, Clone, Copy)]
pub struct Token(pub FencingToken);

impl<S: Send + Sync> FromRequestParts<S> for Token {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        FencingToken::from_headers(&parts.headers)
            .map(Token)
            .map_err(ApiError::from)
    }
}

type ApiResult<T> = Result<T, ApiError>;

#[utoipa::path(post, path = "/v1/accounts", tag = "accounts", operation_id = "createAccount",
    request_body = CreateAccountRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created.", body = AccountView),
        (status = 400, description = "Bad input, with a machine-readable code (`INVALID_*`, `MALFORMED_JSON`); nothing is written.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role.", body = ErrorBody),
        (status = 409, description = "`ACCOUNT_EXISTS`, or `SETTLEMENT_EXISTS` (one settlement account per currency).", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn create_account(
    State(s): State<AppState>,
    ApiJson(body): ApiJson<CreateAccountRequest>,
) -> ApiResult<(StatusCode, Json<AccountView>)> {
    let view = s
        .accounts
        .create(NewAccount {
            account_id: body.account_id,
            currency: body.currency,
            opening_balance_minor: body.opening_balance_minor,
            kind: body.kind.unwrap_or(AccountKind::Customer),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(view)))
}

#[utoipa::path(get, path = "/v1/accounts/{accountId}", tag = "accounts", operation_id = "getAccount",
    params(AccountIdPath),
    responses(
        (status = 200, description = "The account beside what its ledger says it should be.", body = AccountView),
        (status = 400, description = "`INVALID_PATH`: the id is not a UUID.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_ACCOUNT`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn get_account(State(s): State<AppState>, ApiPath(id): ApiPath<Uuid>) -> ApiResult<Json<AccountView>> {
    Ok(Json(s.accounts.get(id).await?))
}

#[utoipa::path(post, path = "/v1/payouts", tag = "payouts", operation_id = "createPayout",
    request_body = CreatePayoutRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A replay of the same request under the same idempotency key: the same payout.", body = Payout),
        (status = 201, description = "Created, PENDING.", body = Payout),
        (status = 400, description = "Bad input, with a machine-readable code (`INVALID_*`, `MALFORMED_JSON`); nothing is written.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role.", body = ErrorBody),
        (status = 409, description = "`IDEMPOTENCY_CONFLICT`: the key was used for a different payout.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.", body = ErrorBody),
        (status = 422, description = "`UNKNOWN_ACCOUNT`, `NOT_A_CUSTOMER_ACCOUNT`, `CURRENCY_MISMATCH` or `NO_SETTLEMENT_ACCOUNT`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn create_payout(
    State(s): State<AppState>,
    ApiJson(body): ApiJson<CreatePayoutRequest>,
) -> ApiResult<(StatusCode, Json<Payout>)> {
    let (payout, created) = s
        .payouts
        .create(NewPayout {
            account_id: body.account_id,
            amount_minor: body.amount_minor,
            currency: body.currency,
            idempotency_key: body.idempotency_key,
        })
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(payout)))
}

#[utoipa::path(get, path = "/v1/payouts", tag = "payouts", operation_id = "listPayouts",
    params(ListPayoutsQuery),
    responses(
        (status = 200, description = "One page, oldest first (keyset paging).", body = Page),
        (status = 400, description = "`INVALID_STATE`, `INVALID_LIMIT`, `INVALID_CURSOR` or `INVALID_QUERY`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn list_payouts(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListPayoutsQuery>,
) -> ApiResult<Json<Page>> {
    // The executor's work queue (PENDING) and the in-flight states a new holder resumes from.
    let state = match q.state.as_deref() {
        None => PayoutState::Pending,
        Some(text) => PayoutState::ALL
            .into_iter()
            .find(|st| st.as_str() == text)
            .ok_or_else(|| {
                ApiError::bad_request("INVALID_STATE", format!("unknown payout state {text:?}"))
            })?,
    };
    Ok(Json(s.payouts.list(state, q.after.as_deref(), q.limit).await?))
}

#[utoipa::path(get, path = "/v1/payouts/{payoutId}", tag = "payouts", operation_id = "getPayout",
    params(PayoutIdPath),
    responses(
        (status = 200, description = "The payout.", body = Payout),
        (status = 400, description = "`INVALID_PATH`: the id is not a UUID.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn get_payout(State(s): State<AppState>, ApiPath(id): ApiPath<Uuid>) -> ApiResult<Json<Payout>> {
    Ok(Json(s.payouts.get(id).await?))
}

#[utoipa::path(post, path = "/v1/payouts/{payoutId}/claim", tag = "executor", operation_id = "claimPayout",
    params(PayoutIdPath, FencingTokenHeader, FencingGrantHeader), request_body = ClaimRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Claimed (PENDING → CLAIMED), adopted from an older token, or the same grant again (`idempotent`).", body = Claimed),
        (status = 400, description = "Bad input, with a machine-readable code (`INVALID_*`, `MALFORMED_JSON`); nothing is written.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role; or the grant does not authorize the token here: `GRANT_INVALID` (none, malformed, forged, or for another token), `GRANT_UNKNOWN_SIGNER`, `GRANT_WRONG_RESOURCE` (for another lock than the payout's account). Nothing is written.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT`.", body = ErrorBody),
        (status = 409, description = "`FENCED_OUT` (a newer grant holds it; terminal) or `NOT_CLAIMABLE`.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn claim_payout(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<Uuid>,
    Token(token): Token,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ClaimRequest>,
) -> ApiResult<Json<Claimed>> {
    let claimed = s
        .grants
        .fenced("claim", id, token, &headers, |p| {
            s.payouts.claim(id, &body.owner_id, p)
        })
        .await?;
    Ok(Json(claimed))
}

#[utoipa::path(post, path = "/v1/payouts/{payoutId}/transition", tag = "executor", operation_id = "transitionPayout",
    params(PayoutIdPath, FencingTokenHeader, FencingGrantHeader), request_body = TransitionRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Moved along one executor edge, or already there (`idempotent`).", body = Transitioned),
        (status = 400, description = "Bad input (`INVALID_TOKEN`, `UNSUPPORTED_TRANSITION`, `INVALID_REASON`, …).", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role; or the grant does not authorize the token here: `GRANT_INVALID` (none, malformed, forged, or for another token), `GRANT_UNKNOWN_SIGNER`, `GRANT_WRONG_RESOURCE` (for another lock than the payout's account). Nothing is written.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT`.", body = ErrorBody),
        (status = 409, description = "`FENCED_OUT`, `INVALID_TRANSITION` or `ATTEMPT_NOT_ABANDONED`.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`: the body is not `application/json`.", body = ErrorBody),
        (status = 422, description = "`INSUFFICIENT_FUNDS`: the reservation found the account short; the payout is now FAILED.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn transition_payout(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<Uuid>,
    Token(token): Token,
    headers: HeaderMap,
    ApiJson(body): ApiJson<TransitionRequest>,
) -> ApiResult<Json<Transitioned>> {
    let moved = s
        .grants
        .fenced("transition", id, token, &headers, |p| {
            s.payouts
                .transition_with_reason(id, body.from, body.to, p, body.reason.as_deref())
        })
        .await?;
    Ok(Json(moved))
}

#[utoipa::path(post, path = "/v1/payouts/{payoutId}/post", tag = "executor", operation_id = "postPayout",
    params(PayoutIdPath, FencingTokenHeader, FencingGrantHeader),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Posted: (a)(b)(c) in one transaction; or already POSTED (`idempotent`).", body = Posted),
        (status = 400, description = "`INVALID_PATH` or `INVALID_TOKEN`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role; or the grant does not authorize the token here: `GRANT_INVALID` (none, malformed, forged, or for another token), `GRANT_UNKNOWN_SIGNER`, `GRANT_WRONG_RESOURCE` (for another lock than the payout's account). Nothing is written.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT`.", body = ErrorBody),
        (status = 409, description = "`FENCED_OUT` or `NOT_POSTABLE`.", body = ErrorBody),
        (status = 422, description = "`INSUFFICIENT_FUNDS`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn post_payout(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<Uuid>,
    Token(token): Token,
    headers: HeaderMap,
) -> ApiResult<Json<Posted>> {
    let posted = s
        .grants
        .fenced("post", id, token, &headers, |p| s.posting.post(id, p))
        .await?;
    Ok(Json(posted))
}

#[utoipa::path(get, path = "/v1/reconciliation", tag = "admin", operation_id = "reconcile",
    params(ReconciliationQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The reconciliation report.", body = Report),
        (status = 400, description = "`INVALID_STUCK_AFTER`, `INVALID_LIMIT` or `INVALID_QUERY`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn reconciliation(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ReconciliationQuery>,
) -> ApiResult<Json<Report>> {
    let options = reconcile::Options::checked(q.stuck_after_seconds, q.page_size)?;
    let report = reconcile::run_with(&s.pool, &options)
        .await
        .map_err(crate::error::PaymentError::from)?;
    s.metrics.set_stuck(report.break_count(reconcile::STUCK));
    Ok(Json(report))
}

#[utoipa::path(get, path = "/openapi.yaml", tag = "operations", operation_id = "openapi",
    responses(
        (status = 200, description = "This document.", body = Object, content_type = "application/yaml"),
    ))]
async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}

#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz",
    responses(
        (status = 200, description = "paydb answers.", body = String, content_type = "text/plain", example = "ready"),
        (status = 503, description = "`UNAVAILABLE`: paydb does not answer.", body = ErrorBody),
    ))]
/// Ready when paydb answers.
async fn readyz(State(s): State<AppState>) -> ApiResult<&'static str> {
    sqlx::query(sql::PING)
        .execute(&s.pool)
        .await
        .map(|_| "ready")
        .map_err(ApiError::unavailable)
}
