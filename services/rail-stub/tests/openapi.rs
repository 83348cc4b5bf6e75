//! docs/openapi/rail-stub.yaml is what the wire types and the handlers generate; it is OpenAPI 3.1
//! with no dangling reference and lists exactly `api::ROUTES`. (tests/stub.rs checks the router
//! serves it.)

use std::path::Path;

use dlock_testkit::openapi;
use rail_stub::api;

#[test]
fn the_kept_document_is_the_generated_one() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi/rail-stub.yaml");
    openapi::assert_fresh(&api::openapi_yaml(), &file);
}

#[test]
fn the_document_is_well_formed_and_matches_the_routes() {
    let doc = api::openapi_yaml();
    openapi::assert_well_formed(&doc);
    openapi::assert_matches_routes(&doc, &openapi::operations(api::ROUTES.iter().copied()));
    openapi::assert_protected(&doc, &openapi::operations([]));
}
