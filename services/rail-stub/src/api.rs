//! HTTP edges of the stub. Routes are listed in [`ROUTES`], which a test matches against the
//! OpenAPI document served at `/openapi.yaml`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header::CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use dlock_common::{ApiError, ApiJson, ApiPath};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::config::Mode;
use crate::input::{self, BehaviourBody, PaymentBody};
use crate::ledger::{Decision, Payment, PaymentStatus};
use crate::stub::Stub;

/// The OpenAPI document of this service.
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/rail-stub.yaml");

/// Every (method, path) the router serves.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/payments"),
    ("GET", "/v1/payments/{idempotencyKey}"),
    ("GET", "/v1/received"),
    ("GET", "/v1/admin/behaviour"),
    ("PUT", "/v1/admin/behaviour"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.yaml"),
];

pub fn router(stub: Arc<Stub>, registry: Arc<Registry>) -> Router {
    let metrics = Router::new()
        .route("/metrics", get(dlock_common::metrics::handler))
        .with_state(registry);
    Router::new()
        .route("/v1/payments", axum::routing::post(post_payment))
        .route("/v1/payments/{idempotencyKey}", get(get_payment))
        .route("/v1/received", get(get_received))
        .route("/v1/admin/behaviour", get(get_behaviour).put(put_behaviour))
        .route("/healthz", get(dlock_common::serve::healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.yaml", get(openapi))
        .with_state(stub)
        .merge(metrics)
        .fallback(dlock_common::error::not_found_fallback)
}

/// No dependencies: once it serves, it is ready.
async fn readyz() -> &'static str {
    "ready"
}

async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}

fn answer(payment: &Payment, replayed: bool) -> Response {
    match payment.status {
        PaymentStatus::Acked => (
            StatusCode::OK,
            Json(json!({
                "status": "ACKED",
                "railReference": payment.rail_reference,
                "idempotencyKey": payment.idempotency_key,
                "replayed": replayed,
            })),
        )
            .into_response(),
        PaymentStatus::Rejected => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({
                "status": "REJECTED",
                "reason": payment.reason,
                "idempotencyKey": payment.idempotency_key,
                "replayed": replayed,
            })),
        )
            .into_response(),
    }
}

async fn post_payment(
    State(stub): State<Arc<Stub>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<PaymentBody>,
) -> Result<Response, ApiError> {
    let (outcome, latency_ms) = input::overrides(&headers, stub.test_mode)?;
    let req = input::payment(body)?;
    let receipt = stub.receive(req, outcome, latency_ms);
    stub.pause(Duration::from_millis(receipt.latency_ms)).await;
    match receipt.decision {
        Decision::First {
            payment,
            answer: Mode::Timeout,
        } => {
            // The money has moved; the caller is made to give up before hearing so.
            tracing::warn!(
                event = "rail_payment_timeout_simulated",
                idempotency_key = %payment.idempotency_key,
                payout_id = %payment.payout_id,
                hang_ms = stub.timeout_hang.as_millis() as u64,
                "paid, answering only after the hang"
            );
            stub.pause(stub.timeout_hang).await;
            Ok((
                StatusCode::GATEWAY_TIMEOUT,
                Json(json!({
                    "status": "TIMEOUT",
                    "code": "RAIL_TIMEOUT",
                    "message": "the rail did not answer in time; the outcome is unknown to the caller",
                    "idempotencyKey": payment.idempotency_key,
                })),
            )
                .into_response())
        }
        Decision::First { payment, .. } => Ok(answer(&payment, false)),
        Decision::Replay(payment) => Ok(answer(&payment, true)),
        Decision::Conflict(first) => {
            tracing::warn!(
                event = "idempotency_key_reused",
                idempotency_key = %first.idempotency_key,
                first_payout_id = %first.payout_id,
                "an idempotency key was reused for a different payment; nothing paid"
            );
            Err(ApiError::conflict(
                "IDEMPOTENCY_KEY_REUSED",
                "this idempotency key was first used for a different payment",
            )
            .with("idempotencyKey", &first.idempotency_key)
            .with("payoutId", first.payout_id))
        }
    }
}

async fn get_payment(
    State(stub): State<Arc<Stub>>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<Payment>, ApiError> {
    input::idempotency_key(&key)?;
    stub.payment(&key).map(Json).ok_or_else(|| {
        ApiError::not_found(
            "UNKNOWN_PAYMENT",
            "the rail has received no payment with this idempotency key",
        )
    })
}

async fn get_received(State(stub): State<Arc<Stub>>) -> Response {
    Json(stub.report()).into_response()
}

fn behaviour_body(stub: &Stub) -> Response {
    let b = stub.behaviour();
    Json(json!({
        "mode": b.mode,
        "latencyMs": b.latency_ms,
        "timeoutHangMs": stub.timeout_hang.as_millis() as u64,
        "testMode": stub.test_mode,
    }))
    .into_response()
}

async fn get_behaviour(State(stub): State<Arc<Stub>>) -> Response {
    behaviour_body(&stub)
}

async fn put_behaviour(
    State(stub): State<Arc<Stub>>,
    ApiJson(body): ApiJson<BehaviourBody>,
) -> Result<Response, ApiError> {
    if !stub.test_mode {
        return Err(input::test_mode_disabled());
    }
    stub.set_behaviour(input::behaviour(body)?);
    Ok(behaviour_body(&stub))
}
