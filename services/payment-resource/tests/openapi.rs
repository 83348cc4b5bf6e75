//! docs/openapi/payment-resource.yaml is what the wire types and the handlers generate; it is
//! OpenAPI 3.1 with no dangling reference, lists exactly `api::ROUTES`, and marks exactly
//! `api::PROTECTED` with the bearer requirement. (tests/api.rs checks the router serves it.)

use std::path::Path;

use dlock_testkit::openapi;
use payment_resource::api;

#[test]
fn the_kept_document_is_the_generated_one() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi/payment-resource.yaml");
    openapi::assert_fresh(&api::openapi_yaml(), &file);
}

#[test]
fn the_document_is_well_formed_and_matches_the_routes_and_their_guards() {
    let doc = api::openapi_yaml();
    openapi::assert_well_formed(&doc);
    openapi::assert_matches_routes(&doc, &openapi::operations(api::ROUTES.iter().copied()));
    openapi::assert_protected(
        &doc,
        &openapi::operations(api::PROTECTED.iter().map(|(m, p, _)| (*m, *p))),
    );
}
