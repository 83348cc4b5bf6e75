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
use dlock_wire::ErrorBody;
use dlock_wire::stub::{
    BehaviourRequest, BehaviourView, IdempotencyKeyPath, Mode as WireMode, PaymentAnswer, PaymentOrder,
    ReceivedReport,
};

/// The OpenAPI document as kept in docs/openapi/, generated from [`ApiDoc`] (a test fails when the
/// file is stale; `DLOCK_UPDATE_OPENAPI=1` rewrites it).
pub const OPENAPI_YAML: &str = include_str!("../../../docs/openapi/rail-stub.yaml");

/// The document, derived from the wire types and the handlers' annotations.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "dlock rail-stub",
        version = "1",
        description = "A stand-in for the external payment rail: idempotent by key (the first request for a key decides; repeats replay it, a different payment under a used key is refused), with a ground-truth record of every request. Test mode (--test-mode) enables the behaviour control and the per-request headers.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        post_payment, get_payment, get_received, get_behaviour, put_behaviour,
        dlock_wire::doc::healthz, readyz, dlock_wire::doc::metrics, openapi,
    ),
    components(schemas(ErrorBody)),
    tags((name = "payments"), (name = "ground truth"), (name = "admin"), (name = "operations")),
)]
pub struct ApiDoc;

/// The document rendered as YAML: what docs/openapi/rail-stub.yaml must contain.
pub fn openapi_yaml() -> String {
    dlock_wire::doc::to_yaml(&<ApiDoc as utoipa::OpenApi>::openapi())
}

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

#[utoipa::path(get, path = "/readyz", tag = "operations", operation_id = "readyz",
    responses(
        (status = 200, description = "Serving (no dependencies).", body = String, content_type = "text/plain", example = "ready"),
    ))]
/// No dependencies: once it serves, it is ready.
async fn readyz() -> &'static str {
    "ready"
}

#[utoipa::path(get, path = "/openapi.yaml", tag = "operations", operation_id = "openapi",
    responses(
        (status = 200, description = "This document.", body = Object, content_type = "application/yaml"),
    ))]
async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}

fn answer(payment: &Payment, replayed: bool) -> Response {
    let status = match payment.status {
        PaymentStatus::Acked => StatusCode::OK,
        PaymentStatus::Rejected => StatusCode::UNPROCESSABLE_ENTITY,
    };
    let body = PaymentAnswer {
        status: payment.status,
        rail_reference: payment.rail_reference.clone(),
        reason: payment.reason.clone(),
        idempotency_key: payment.idempotency_key.clone(),
        replayed,
    };
    (status, Json(body)).into_response()
}

#[utoipa::path(post, path = "/v1/payments", tag = "payments", operation_id = "createPayment",
    request_body = PaymentOrder,
    responses(
        (status = 200, description = "`ACKED`: paid (or a replay of a paid key: `replayed`, nothing paid again).", body = PaymentAnswer),
        (status = 400, description = "`INVALID_IDEMPOTENCY_KEY`, `INVALID_PAYOUT_ID`, `INVALID_ACCOUNT_ID`, `INVALID_AMOUNT`, `INVALID_CURRENCY`, `INVALID_OUTCOME`, `INVALID_LATENCY`, `INVALID_FIELD` or `MALFORMED_JSON`; nothing is recorded.", body = ErrorBody),
        (status = 403, description = "`TEST_MODE_DISABLED`: a test-mode header without --test-mode.", body = ErrorBody),
        (status = 409, description = "`IDEMPOTENCY_KEY_REUSED`: the key was first used for a different payment; nothing paid.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
        (status = 422, description = "`REJECTED`: not paid.", body = PaymentAnswer),
        (status = 504, description = "`RAIL_TIMEOUT` (mode `timeout`): paid, but answered only after the hang; the body also carries `status: TIMEOUT` and `idempotencyKey`.", body = ErrorBody),
    ))]
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

#[utoipa::path(get, path = "/v1/payments/{idempotencyKey}", tag = "payments", operation_id = "getPayment",
    params(IdempotencyKeyPath),
    responses(
        (status = 200, description = "What the rail decided for this key.", body = Payment),
        (status = 400, description = "`INVALID_IDEMPOTENCY_KEY`.", body = ErrorBody),
        (status = 404, description = "`UNKNOWN_PAYMENT`: nothing received under this key.", body = ErrorBody),
    ))]
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

#[utoipa::path(get, path = "/v1/received", tag = "ground truth", operation_id = "received",
    responses(
        (status = 200, description = "Every request, and what was paid per key and per payout.", body = ReceivedReport),
    ))]
async fn get_received(State(stub): State<Arc<Stub>>) -> Response {
    Json(stub.report()).into_response()
}

fn behaviour_body(stub: &Stub) -> Response {
    let b = stub.behaviour();
    Json(BehaviourView {
        mode: match b.mode {
            Mode::Ack => WireMode::Ack,
            Mode::Reject => WireMode::Reject,
            Mode::Timeout => WireMode::Timeout,
        },
        latency_ms: b.latency_ms,
        timeout_hang_ms: u64::try_from(stub.timeout_hang.as_millis()).unwrap_or(u64::MAX),
        test_mode: stub.test_mode,
    })
    .into_response()
}

#[utoipa::path(get, path = "/v1/admin/behaviour", tag = "admin", operation_id = "getBehaviour",
    responses(
        (status = 200, description = "The default behaviour.", body = BehaviourView),
    ))]
async fn get_behaviour(State(stub): State<Arc<Stub>>) -> Response {
    behaviour_body(&stub)
}

#[utoipa::path(put, path = "/v1/admin/behaviour", tag = "admin", operation_id = "setBehaviour",
    request_body = BehaviourRequest,
    responses(
        (status = 200, description = "Changed.", body = BehaviourView),
        (status = 400, description = "`INVALID_MODE`, `INVALID_LATENCY`, `INVALID_FIELD` or `MALFORMED_JSON`.", body = ErrorBody),
        (status = 403, description = "`TEST_MODE_DISABLED`: only with --test-mode.", body = ErrorBody),
        (status = 415, description = "`UNSUPPORTED_MEDIA_TYPE`.", body = ErrorBody),
    ))]
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
