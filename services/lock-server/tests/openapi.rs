//! The OpenAPI document (generated from the wire types and the handlers; kept in
//! docs/openapi/lock-server.yaml and served at /openapi.yaml) and the router agree: every route the
//! router serves is documented, every documented operation is served, and the admin routes are the
//! ones marked bearer-protected (the lock and session routes optionally: a lock client's token,
//! when a clients file is configured).

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use dlock_testkit::openapi;
use reqwest::{Method, StatusCode};

fn served() -> BTreeSet<openapi::Operation> {
    lock_server::routes()
        .into_iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect()
}

#[test]
fn the_kept_document_is_the_generated_one() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi/lock-server.yaml");
    openapi::assert_fresh(&lock_server::api::openapi_yaml(), &file);
}

#[test]
fn the_document_is_openapi_3_1_and_resolves_its_references() {
    openapi::assert_well_formed(&lock_server::api::openapi_yaml());
}

#[test]
fn every_served_route_is_documented_and_every_documented_route_is_served() {
    let served = served();
    openapi::assert_matches_routes(&lock_server::api::openapi_yaml(), &served);
    assert_eq!(served.len(), 15);
}

#[test]
fn the_admin_routes_are_the_ones_that_require_the_bearer_token() {
    let yaml = lock_server::api::openapi_yaml();
    let admin = openapi::operations([("POST", "/v1/admin/locks/{key}/revoke"), ("GET", "/v1/locks")]);
    // The lock and session routes take a lock client's token when a clients file is configured,
    // and none without one: documented as bearer or nothing (`security: [{}, {bearer: []}]`).
    let clients = openapi::operations([
        ("POST", "/v1/sessions"),
        ("POST", "/v1/sessions/{sessionId}/heartbeat"),
        ("DELETE", "/v1/sessions/{sessionId}"),
        ("POST", "/v1/locks/{key}/acquire"),
        ("POST", "/v1/locks/{key}/renew"),
        ("POST", "/v1/locks/{key}/release"),
        ("GET", "/v1/locks/{key}"),
        ("GET", "/v1/locks/{key}/watch"),
    ]);
    openapi::assert_protected(&yaml, &admin.union(&clients).cloned().collect());
    let doc: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    for (method, path) in &clients {
        let security = &doc["paths"][path.as_str()][method.to_lowercase().as_str()]["security"];
        let optional = security
            .as_sequence()
            .is_some_and(|reqs| reqs.iter().any(|r| r.as_mapping().is_some_and(|m| m.is_empty())));
        assert!(
            optional,
            "{method} {path}: the bearer must stay optional: {security:?}"
        );
    }
    for (method, path) in &admin {
        let security = &doc["paths"][path.as_str()][method.to_lowercase().as_str()]["security"];
        assert_eq!(security.as_sequence().map(Vec::len), Some(1), "{method} {path}");
    }
}

/// The route table is what the router really serves: each documented operation, requested with
/// sample parameters, reaches a handler (not the 404/405 fallbacks).
#[tokio::test]
async fn every_documented_operation_reaches_a_handler() {
    let db = lockdb().await;
    let srv = server(&db.db).await;
    let api = Api::new(&srv);
    for (method, path) in openapi::documented(lock_server::api::OPENAPI_YAML) {
        let concrete = path
            .replace("{key}", "some-key")
            .replace("{sessionId}", "6f1d2a34-0b9e-4d7a-9c55-2f1e0f0b8a11");
        let resp = api
            .http
            .request(Method::from_bytes(method.as_bytes()).unwrap(), api.url(&concrete))
            .send()
            .await
            .unwrap();
        if concrete.ends_with("/watch") {
            // A stream that stays open: its head is the answer.
            assert_eq!(resp.status(), StatusCode::OK, "{method} {path}");
            assert_eq!(resp.headers()["content-type"], "text/event-stream");
            continue;
        }
        let r = reply(resp).await;
        assert!(
            r.code() != "NOT_FOUND" && r.status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} is documented but not served: {r:?}"
        );
    }
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_served_document_is_the_file() {
    let db = lockdb().await;
    let srv = server(&db.db).await;
    let resp = reqwest::get(format!("{}/openapi.yaml", srv.base_url()))
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/yaml");
    assert_eq!(resp.text().await.unwrap(), lock_server::api::OPENAPI_YAML);
    srv.shutdown().await.unwrap();
}
