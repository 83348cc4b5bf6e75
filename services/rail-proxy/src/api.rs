//! HTTP edges of rail-proxy. Routes are listed in [`ROUTES`], which a test matches against the
//! OpenAPI document served at `/openapi.yaml`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, header::CONTENT_TYPE};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dlock_common::auth::{self, Credentials, Gate, Role};
use dlock_common::{ApiError, ApiJson, ApiPath, FencingToken};
use dlock_wire::ErrorBody;
use dlock_wire::doc::{BearerAuth, FencingGrantHeader, FencingTokenHeader};
use dlock_wire::rail::{PayoutIdPath, RailOutcome, Submission, SubmissionList, SubmitRequest};
use prometheus_client::registry::Registry;
use uuid::Uuid;

use crate::error::ProxyError;
use crate::proxy::Proxy;
use crate::sql;

/// The OpenAPI document as kept in docs/openapi/, generated from [`ApiDoc`] (a test fails when the
/// file is stale; `DLOCK_UPDATE_OPENAPI=1` rewrites it).
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/rail-proxy.yaml");

/// The document, derived from the wire types and the handlers' annotations.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "dlock rail-proxy",
        version = "1",
        description = "The fenced gateway to the payment rail: (d) records each payout's one attempt under the account's high-water mark and forwards it at most once, for a token presented with the grant lock-server signed for it on the payout's account (`X-Fencing-Grant`); ambiguous attempts are resolved by asking the rail, never by resubmitting. Submissions and resolutions need the executor's bearer credential (docs/security.md).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(submit, list, resolve, dlock_wire::doc::healthz, readyz, dlock_wire::doc::metrics, openapi),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    tags((name = "submissions"), (name = "operations")),
)]
pub struct ApiDoc;

/// The document rendered as YAML: what docs/openapi/rail-proxy.yaml must contain.
pub fn openapi_yaml() -> String {
    dlock_wire::doc::to_yaml(&<ApiDoc as utoipa::OpenApi>::openapi())
}

/// Every (method, path) the router serves.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/submissions"),
    ("GET", "/v1/submissions/{payoutId}"),
    ("POST", "/v1/submissions/{payoutId}/resolve"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.yaml"),
];

/// Who may call the protected routes: only the executor submits and resolves (docs/security.md).
pub const EXECUTOR: &[Role] = &[Role::Executor];

/// Every protected (method, path) and the roles it admits.
pub const PROTECTED: &[(&str, &str, &[Role])] = &[
    ("POST", "/v1/submissions", EXECUTOR),
    ("POST", "/v1/submissions/{payoutId}/resolve", EXECUTOR),
];

pub fn router(proxy: Arc<Proxy>, registry: Arc<Registry>, credentials: Arc<Credentials>) -> Router {
    let metrics = Router::new()
        .route("/metrics", get(dlock_common::metrics::handler))
        .with_state(registry);
    let gate = || from_fn_with_state(Gate::new(credentials.clone(), EXECUTOR), auth::require);
    Router::new()
        .route("/v1/submissions", post(submit).route_layer(gate()))
        .route("/v1/submissions/{payoutId}", get(list))
        .route(
            "/v1/submissions/{payoutId}/resolve",
            post(resolve).route_layer(gate()),
        )
        .route("/healthz", get(dlock_common::serve::healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.yaml", get(openapi))
        .route_layer(from_fn_with_state(
            proxy.metrics.http.clone(),
            dlock_common::metrics::observe_http,
        ))
        .with_state(proxy)
        .merge(metrics)
        .fallback(dlock_common::error::not_found_fallback)
}

/// A recorded row as the API answers it: the outcome as the wire enum (`rail_outcome_ck` keeps
/// the column to those values, so anything else is a corrupt row).
fn wire(row: sql::Submission) -> Result<Submission, ApiError> {
    let outcome = match row.outcome.as_deref() {
        None => None,
        Some(text) => Some(RailOutcome::parse(text).ok_or_else(|| {
            ApiError::internal(format!(
                "rail_submission {} has outcome {text:?}",
                row.submission_id
            ))
        })?),
    };
    Ok(Submission {
        submission_id: row.submission_id,
        payout_id: row.payout_id,
        idempotency_key: row.idempotency_key,
        presented_token: row.presented_token,
        outcome,
        rail_reference: row.rail_reference,
        submitted_at: row.submitted_at,
        resolved_at: row.resolved_at,
        abandoned_at: row.abandoned_at,
    })
}

fn payout_id(text: &str) -> Result<Uuid, ProxyError> {
    Uuid::try_parse(text).map_err(|_| ProxyError::InvalidPayoutId)
}

#[utoipa::path(post, path = "/v1/submissions", tag = "submissions", operation_id = "submit",
    params(FencingTokenHeader, FencingGrantHeader), request_body = SubmitRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The payout's one attempt: recorded under the high-water mark (d) and forwarded at most once; its outcome, or `null`/`TIMEOUT` when the rail did not answer in time.", body = Submission),
        (status = 400, description = "`INVALID_TOKEN`, `INVALID_PAYOUT_ID`, `INVALID_FIELD` or `MALFORMED_JSON`; nothing is recorded.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role; or the grant does not authorize the token here: `GRANT_INVALID` (none, malformed, forged, or for another token), `GRANT_UNKNOWN_SIGNER`, `GRANT_WRONG_RESOURCE` (for another lock than the payout's account). Nothing is recorded or forwarded.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT`.", body = ErrorBody),
        (status = 409, description = "`FENCED_OUT` (a newer token reached the account; terminal), `DUPLICATE_ATTEMPT` or `NOT_RESERVED`.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
        (status = 502, description = "`RAIL_UNAVAILABLE`: the rail could not be reached.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn submit(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SubmitRequest>,
) -> Result<Json<Submission>, ApiError> {
    let token = FencingToken::from_headers(&headers)?;
    let payout_id = payout_id(&body.payout_id)?;
    let attempt = proxy
        .grants
        .fenced("submit", payout_id, token, &headers, |p| {
            proxy.submit(payout_id, p)
        })
        .await?;
    Ok(Json(wire(attempt)?))
}

#[utoipa::path(get, path = "/v1/submissions/{payoutId}", tag = "submissions", operation_id = "listSubmissions",
    params(PayoutIdPath),
    responses(
        (status = 200, description = "The recorded attempt and any FENCED refusals.", body = SubmissionList),
        (status = 400, description = "`INVALID_PAYOUT_ID`.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn list(
    State(proxy): State<Arc<Proxy>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SubmissionList>, ApiError> {
    let (payout, submissions) = proxy.submissions(payout_id(&id)?).await?;
    Ok(Json(SubmissionList {
        payout_id: payout.payout_id,
        account_id: payout.account_id,
        submissions: submissions.into_iter().map(wire).collect::<Result<_, _>>()?,
    }))
}

#[utoipa::path(post, path = "/v1/submissions/{payoutId}/resolve", tag = "submissions", operation_id = "resolveSubmission",
    params(PayoutIdPath, FencingTokenHeader, FencingGrantHeader),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "What became of the attempt, asked of the rail (never a resubmission).", body = Submission),
        (status = 400, description = "`INVALID_TOKEN` or `INVALID_PAYOUT_ID`.", body = ErrorBody),
        (status = 401, description = "`UNAUTHENTICATED`: no valid bearer credential.", body = ErrorBody),
        (status = 403, description = "`FORBIDDEN`: the credential belongs to another role; or the grant does not authorize the token here: `GRANT_INVALID` (none, malformed, forged, or for another token), `GRANT_UNKNOWN_SIGNER`, `GRANT_WRONG_RESOURCE` (for another lock than the payout's account). Nothing is recorded or forwarded.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYOUT` or `NO_ATTEMPT`.", body = ErrorBody),
        (status = 409, description = "`FENCED_OUT` or `RAIL_OUTCOME_UNKNOWN`.", body = ErrorBody),
        (status = 502, description = "`RAIL_UNAVAILABLE`.", body = ErrorBody),
        (status = 503, description = "`UNAVAILABLE`: paydb cannot be reached; retry later.", body = ErrorBody),
    ))]
async fn resolve(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Submission>, ApiError> {
    let token = FencingToken::from_headers(&headers)?;
    let payout_id = payout_id(&id)?;
    let attempt = proxy
        .grants
        .fenced("resolve", payout_id, token, &headers, |p| {
            proxy.resolve(payout_id, p)
        })
        .await?;
    Ok(Json(wire(attempt)?))
}

#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz",
    responses(
        (status = 200, description = "paydb answers.", body = String, content_type = "text/plain", example = "ready"),
        (status = 503, description = "`UNAVAILABLE`: paydb does not answer.", body = ErrorBody),
    ))]
/// Ready when paydb answers.
async fn readyz(State(proxy): State<Arc<Proxy>>) -> Result<&'static str, ApiError> {
    proxy.ready().await.map_err(ApiError::unavailable)?;
    Ok("ready")
}

#[utoipa::path(get, path = "/openapi.yaml", tag = "operations", operation_id = "openapi",
    responses(
        (status = 200, description = "This document.", body = Object, content_type = "application/yaml"),
    ))]
async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}
