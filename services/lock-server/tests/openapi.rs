//! The OpenAPI document (docs/openapi/lock-server.yaml, served at /openapi.yaml) and the router agree:
//! every route the router serves is documented, every documented operation is served.

mod common;

use std::collections::BTreeSet;

use common::*;
use reqwest::{Method, StatusCode};
use serde_yaml::Value;

const HTTP_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn document() -> Value {
    serde_yaml::from_str(lock_server::api::OPENAPI_YAML).expect("the OpenAPI document is valid YAML")
}

/// (METHOD, path template) of every operation in the document.
fn documented() -> BTreeSet<(String, String)> {
    let doc = document();
    let paths = doc["paths"].as_mapping().expect("paths");
    let mut ops = BTreeSet::new();
    for (path, item) in paths {
        let path = path.as_str().unwrap();
        for (method, _) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap();
            if HTTP_METHODS.contains(&method) {
                ops.insert((method.to_uppercase(), path.to_owned()));
            }
        }
    }
    ops
}

fn served() -> BTreeSet<(String, String)> {
    lock_server::routes()
        .into_iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect()
}

#[test]
fn the_document_is_openapi_3_1_and_resolves_its_references() {
    let doc = document();
    assert_eq!(doc["openapi"].as_str(), Some("3.1.0"));
    // Every $ref points at something that exists.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    if k.as_str() == Some("$ref") {
                        out.push(v.as_str().unwrap().to_owned());
                    } else {
                        refs(v, out);
                    }
                }
            }
            Value::Sequence(s) => s.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let mut node = &doc;
        for part in r.trim_start_matches("#/").split('/') {
            node = &node[part];
        }
        assert!(!node.is_null(), "dangling $ref {r}");
    }
}

#[test]
fn every_served_route_is_documented_and_every_documented_route_is_served() {
    let served = served();
    let documented = documented();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in the OpenAPI document: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "in the OpenAPI document but not served: {unserved:?}"
    );
    assert_eq!(served.len(), 12);
}

/// The route table is what the router really serves: each documented operation, requested with
/// sample parameters, reaches a handler (not the 404/405 fallbacks).
#[tokio::test]
async fn every_documented_operation_reaches_a_handler() {
    let db = lockdb().await;
    let srv = server(&db.db).await;
    let api = Api::new(&srv);
    for (method, path) in documented() {
        let concrete = path
            .replace("{key}", "some-key")
            .replace("{sessionId}", "6f1d2a34-0b9e-4d7a-9c55-2f1e0f0b8a11");
        let r = reply(
            api.http
                .request(Method::from_bytes(method.as_bytes()).unwrap(), api.url(&concrete))
                .send()
                .await
                .unwrap(),
        )
        .await;
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
