//! The shapes of the bodies' text fields, each defined once: type, length bounds in characters, and
//! the [`crate::pattern`] that states its validator's rule. Fields name theirs with
//! `#[schema(schema_with = …)]` (attributes take string literals only, so a shape written as
//! attributes would be a copy per field); path parameters build theirs with the same functions.
//! A field whose schema carries a description adds it with [`described`].

use utoipa::openapi::Required;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};

use crate::pattern;

fn text(min: usize, max: usize, pattern: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(min))
        .max_length(Some(max))
        .pattern(Some(pattern))
}

/// A shape with a description (what a doc comment on the field would have said).
pub fn described(shape: ObjectBuilder, description: &str) -> ObjectBuilder {
    shape.description(Some(description))
}

/// The same shape where `null` is allowed too (an optional field).
pub fn or_null(shape: ObjectBuilder) -> ObjectBuilder {
    shape.schema_type(SchemaType::from_iter([Type::String, Type::Null]))
}

/// An owner id (`crate::validate::owner_id`): 1..=128 printable characters without
/// surrounding spaces. Also the shape of a revoke's operator and request id.
pub fn owner_id() -> ObjectBuilder {
    text(1, 128, pattern::PRINTABLE)
}

/// A lock key (`crate::validate::lock_key`): 1..=256 printable characters without
/// surrounding spaces.
pub fn lock_key() -> ObjectBuilder {
    text(1, 256, pattern::PRINTABLE)
}

/// A revoke reason: 1..=1024 characters, no control characters, not only whitespace.
pub fn revoke_reason() -> ObjectBuilder {
    text(1, 1024, pattern::REASON_TEXT)
}

/// payment-resource's idempotency key: 1..=128 characters, no control characters, no whitespace at
/// either end.
pub fn idempotency_key() -> ObjectBuilder {
    text(1, 128, pattern::TRIMMED)
}

/// rail-stub's idempotency key: 1..=200 characters without control characters.
pub fn rail_idempotency_key() -> ObjectBuilder {
    text(1, 200, pattern::NO_CONTROL)
}

/// An ISO 4217 currency code.
pub fn currency() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern::CURRENCY))
}

/// A machine-readable code (an error code).
pub fn code() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern::CODE))
}

/// A signed grant (`X-Fencing-Grant`, `LockGrant.grant`): at most `dlock_grant::MAX_WIRE_LEN`
/// characters of [`pattern::SIGNED_GRANT`].
pub fn signed_grant() -> ObjectBuilder {
    text(88, 4096, pattern::SIGNED_GRANT)
}

/// A required path parameter of `shape` (derived parameters cannot take a shape by name).
pub fn path_param(name: &str, description: Option<&str>, shape: ObjectBuilder) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .description(description)
        .required(Required::True)
        .schema(Some(shape))
        .build()
}
