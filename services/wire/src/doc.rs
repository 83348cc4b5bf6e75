//! What the four OpenAPI documents share: the bearer security scheme, the common responses, and the
//! YAML rendering that docs/openapi/ keeps.

use utoipa::Modify;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

/// The name of the bearer scheme in `components.securitySchemes`.
pub const BEARER: &str = "bearer";

/// Adds the `bearer` scheme: `Authorization: Bearer <credential>` (docs/security.md).
#[derive(Debug, Clone, Copy)]
pub struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A credential from the service's environment or a mounted file; 401 \
                         UNAUTHENTICATED without a valid one, 403 when it belongs to another role.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document as YAML, as served at `/openapi.yaml` and kept in docs/openapi/.
pub fn to_yaml(doc: &OpenApi) -> String {
    // Rendering a document built from types cannot fail; an error here is a bug in a schema.
    doc.to_yaml()
        .unwrap_or_else(|e| format!("# cannot render the document: {e}\n"))
}

/// The `X-Fencing-Token` request header of the fenced routes: the decimal token, strictly parsed
/// (missing, empty, non-numeric, zero, negative or overflowing is 400 `INVALID_TOKEN`).
#[derive(Debug, Clone, Copy)]
pub struct FencingTokenHeader;

impl utoipa::IntoParams for FencingTokenHeader {
    fn into_params(
        _parameter_in: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::Required;
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        vec![
            ParameterBuilder::new()
                .name(crate::FENCING_TOKEN_HEADER)
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(
                    "The fencing token of the caller's grant: a decimal integer in 1..=9223372036854775807.",
                ))
                .schema(Some(crate::FencingToken::text_schema()))
                .build(),
        ]
    }
}

/// The `X-Fencing-Grant` request header of the fenced routes: the grant lock-server signed for the
/// presented token (`LockGrant.grant`). Required while the resource verifies grants (the default);
/// refused with 403 `GRANT_INVALID`, `GRANT_UNKNOWN_SIGNER` or `GRANT_WRONG_RESOURCE`.
#[derive(Debug, Clone, Copy)]
pub struct FencingGrantHeader;

impl utoipa::IntoParams for FencingGrantHeader {
    fn into_params(
        _parameter_in: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::Required;
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        vec![
            ParameterBuilder::new()
                .name(crate::FENCING_GRANT_HEADER)
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(
                    "The signed grant of the presented token, as lock-server answered it (`LockGrant.grant`): it must verify under a public key the resource trusts, state the same token, and be for `account:<the payout's account>`.",
                ))
                .schema(Some(crate::shape::signed_grant()))
                .build(),
        ]
    }
}

/// Liveness: the process is up (`dlock_common::serve::healthz`, served by every service).
#[utoipa::path(get, path = "/healthz", tag = "operations", operation_id = "healthz",
    responses(
        (status = 200, description = "The process is up and serving.", body = String, content_type = "text/plain", example = "ok"),
    ))]
pub fn healthz() {}

/// The service's metrics, in the Prometheus/OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text exposition (OpenMetrics).", body = String, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
    ))]
pub fn metrics() {}
