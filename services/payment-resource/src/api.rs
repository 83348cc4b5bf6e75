//! The HTTP API (docs/openapi/payment-resource.yaml, also served at `GET /openapi.yaml`). Handlers only
//! parse, call one service method and shape the answer; errors become [`ApiError`] here, once.

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use dlock_common::auth::{self, Credentials, Gate, Role};
use dlock_common::error::not_found_fallback;
use dlock_common::{ApiError, ApiJson, ApiPath, ApiQuery, FencingToken};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::accounts::{AccountView, Accounts, NewAccount};
use crate::model::{AccountKind, Payout, PayoutState};
use crate::payouts::{Claimed, NewPayout, Page, Payouts, Transitioned};
use crate::posting::{Posted, Posting};
use crate::reconcile::{self, Report};
use crate::sql;

/// The OpenAPI document, compiled in so the binary serves exactly what the repository documents.
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/payment-resource.yaml");

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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateAccountBody {
    account_id: Option<Uuid>,
    currency: String,
    opening_balance_minor: i64,
    kind: Option<AccountKind>,
}

async fn create_account(
    State(s): State<AppState>,
    ApiJson(body): ApiJson<CreateAccountBody>,
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

async fn get_account(State(s): State<AppState>, ApiPath(id): ApiPath<Uuid>) -> ApiResult<Json<AccountView>> {
    Ok(Json(s.accounts.get(id).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreatePayoutBody {
    account_id: Uuid,
    amount_minor: i64,
    currency: String,
    idempotency_key: String,
}

async fn create_payout(
    State(s): State<AppState>,
    ApiJson(body): ApiJson<CreatePayoutBody>,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    limit: Option<i64>,
    after: Option<String>,
}

async fn list_payouts(State(s): State<AppState>, ApiQuery(q): ApiQuery<ListQuery>) -> ApiResult<Json<Page>> {
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

async fn get_payout(State(s): State<AppState>, ApiPath(id): ApiPath<Uuid>) -> ApiResult<Json<Payout>> {
    Ok(Json(s.payouts.get(id).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimBody {
    owner_id: String,
}

async fn claim_payout(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<Uuid>,
    Token(token): Token,
    ApiJson(body): ApiJson<ClaimBody>,
) -> ApiResult<Json<Claimed>> {
    Ok(Json(s.payouts.claim(id, &body.owner_id, token).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransitionBody {
    from: PayoutState,
    to: PayoutState,
    /// Why the payout ends FAILED or ABANDONED (a code such as RAIL_REJECTED); ignored otherwise.
    reason: Option<String>,
}

async fn transition_payout(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<Uuid>,
    Token(token): Token,
    ApiJson(body): ApiJson<TransitionBody>,
) -> ApiResult<Json<Transitioned>> {
    Ok(Json(
        s.payouts
            .transition_with_reason(id, body.from, body.to, token, body.reason.as_deref())
            .await?,
    ))
}

async fn post_payout(
    State(s): State<AppState>,
    ApiPath(id): ApiPath<Uuid>,
    Token(token): Token,
) -> ApiResult<Json<Posted>> {
    Ok(Json(s.posting.post(id, token).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReconQuery {
    stuck_after_seconds: Option<i64>,
    page_size: Option<i64>,
}

async fn reconciliation(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ReconQuery>,
) -> ApiResult<Json<Report>> {
    let options = reconcile::Options::checked(q.stuck_after_seconds, q.page_size)?;
    let report = reconcile::run_with(&s.pool, &options)
        .await
        .map_err(crate::error::PaymentError::from)?;
    s.metrics.set_stuck(report.break_count(reconcile::STUCK));
    Ok(Json(report))
}

async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}

/// Ready when paydb answers.
async fn readyz(State(s): State<AppState>) -> ApiResult<&'static str> {
    sqlx::query(sql::PING)
        .execute(&s.pool)
        .await
        .map(|_| "ready")
        .map_err(ApiError::unavailable)
}
