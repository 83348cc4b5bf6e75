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
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::ProxyError;
use crate::proxy::Proxy;
use crate::sql::Submission;

/// The OpenAPI document of this service.
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/rail-proxy.yaml");

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
        .with_state(proxy)
        .merge(metrics)
        .fallback(dlock_common::error::not_found_fallback)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SubmitBody {
    payout_id: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SubmissionList {
    payout_id: Uuid,
    account_id: Uuid,
    submissions: Vec<Submission>,
}

fn payout_id(text: &str) -> Result<Uuid, ProxyError> {
    Uuid::try_parse(text).map_err(|_| ProxyError::InvalidPayoutId)
}

async fn submit(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<SubmitBody>,
) -> Result<Json<Submission>, ApiError> {
    let token = FencingToken::from_headers(&headers)?;
    let payout_id = payout_id(&body.payout_id)?;
    Ok(Json(proxy.submit(payout_id, token).await?))
}

async fn list(
    State(proxy): State<Arc<Proxy>>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SubmissionList>, ApiError> {
    let (payout, submissions) = proxy.submissions(payout_id(&id)?).await?;
    Ok(Json(SubmissionList {
        payout_id: payout.payout_id,
        account_id: payout.account_id,
        submissions,
    }))
}

async fn resolve(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Submission>, ApiError> {
    let token = FencingToken::from_headers(&headers)?;
    Ok(Json(proxy.resolve(payout_id(&id)?, token).await?))
}

/// Ready when paydb answers.
async fn readyz(State(proxy): State<Arc<Proxy>>) -> Result<&'static str, ApiError> {
    proxy.ready().await.map_err(ApiError::unavailable)?;
    Ok("ready")
}

async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}
