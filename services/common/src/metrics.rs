//! `/metrics` in the Prometheus/OpenMetrics text format over a prometheus-client registry.
//! Counter names follow the contracts in Prometheus form: `lock.fenced.out` → `lock_fenced_out_total`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::registry::Registry;

use crate::error::ApiError;

/// The `resource` label of `lock_fenced_out_total`: which enforcement point refused a token.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Resource {
    account,
    ledger,
    payout,
    rail,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: Resource,
}

pub async fn handler(State(registry): State<Arc<Registry>>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (
            [(
                CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}
