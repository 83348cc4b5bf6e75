//! The router. Routes are added through [`Table`], which records each (method, path template) it
//! registers, so [`routes`] is exactly what the router serves (tests compare it with the OpenAPI
//! document).

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware;
use axum::routing::{delete, get, post};

use crate::api;
use crate::state::AppState;

/// Request bodies are a few small JSON fields.
const BODY_LIMIT_BYTES: usize = 64 * 1024;

/// One served route: its method and path template (axum and OpenAPI spell templates alike).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteSpec {
    pub method: Method,
    pub path: &'static str,
}

struct Table {
    router: Router<AppState>,
    routes: Vec<RouteSpec>,
}

impl Table {
    fn new() -> Self {
        Self {
            router: Router::new(),
            routes: Vec::new(),
        }
    }

    fn get<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Self {
        self.routes.push(RouteSpec {
            method: Method::GET,
            path,
        });
        self.router = self.router.route(path, get(h));
        self
    }

    fn post<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Self {
        self.routes.push(RouteSpec {
            method: Method::POST,
            path,
        });
        self.router = self.router.route(path, post(h));
        self
    }

    fn delete<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Self {
        self.routes.push(RouteSpec {
            method: Method::DELETE,
            path,
        });
        self.router = self.router.route(path, delete(h));
        self
    }
}

fn table() -> Table {
    Table::new()
        .post("/v1/sessions", api::create_session)
        .post("/v1/sessions/{sessionId}/heartbeat", api::heartbeat)
        .delete("/v1/sessions/{sessionId}", api::close_session)
        .post("/v1/locks/{key}/acquire", api::acquire)
        .post("/v1/locks/{key}/renew", api::renew)
        .post("/v1/locks/{key}/release", api::release)
        .get("/v1/locks/{key}", api::read_lock)
        .get("/v1/locks/{key}/watch", api::watch_lock)
        .get("/v1/locks", api::list_locks)
        .post("/v1/admin/locks/{key}/revoke", api::revoke)
        .get("/v1/sequence", api::sequence)
        .get("/healthz", dlock_common::serve::healthz)
        .get("/readyz", api::readyz)
        .get("/metrics", api::metrics)
        .get("/openapi.yaml", api::openapi)
}

/// Every (method, path template) the router serves.
pub fn routes() -> Vec<RouteSpec> {
    table().routes
}

/// The lock-server HTTP API over `state`.
pub fn app(state: AppState) -> Router {
    table()
        .router
        // route_layer: runs after routing, so the matched template is known (never the raw path,
        // which would put lock keys into a label).
        .route_layer(middleware::from_fn_with_state(
            state.metrics().http.clone(),
            dlock_common::metrics::observe_http,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .fallback(dlock_common::error::not_found_fallback)
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(state)
}
