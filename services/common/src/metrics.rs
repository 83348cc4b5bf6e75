//! `/metrics` in the Prometheus/OpenMetrics text format over a prometheus-client registry.
//! Counter names follow the contracts in Prometheus form: `lock.fenced.out` → `lock_fenced_out_total`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
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

/// `route` is the matched route template (`/v1/locks/{key}/renew`), never the raw path (which would
/// put lock keys and payout ids into a label).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

type HttpHistograms = Family<HttpLabels, Histogram, fn() -> Histogram>;

fn http_histogram() -> Histogram {
    // 0.5 ms … ~16 s: most calls are one round trip to a database.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// `http_request_duration_seconds` by method, matched route and status: what every server answers,
/// and (its `_count`) how many requests of each route a workload makes — the bench's requests per
/// payout read it.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    duration: HttpHistograms,
}

impl Default for HttpMetrics {
    /// Unregistered (a struct's `Default` before [`HttpMetrics::register`] replaces it).
    fn default() -> Self {
        Self {
            duration: Family::new_with_constructor(http_histogram),
        }
    }
}

impl HttpMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "http_request_duration_seconds",
            "HTTP request duration by matched route",
            m.duration.clone(),
        );
        m
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.duration
            .get_or_create(&HttpLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status,
            })
            .observe(elapsed.as_secs_f64());
    }
}

/// Middleware timing each request under its matched route. Add it with `route_layer` so that it
/// runs after routing and the template is known.
pub async fn observe_http(State(metrics): State<HttpMetrics>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(req).await;
    metrics.observe(
        method.as_str(),
        &route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}
