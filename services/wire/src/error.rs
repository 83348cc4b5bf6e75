//! The error body every dlock endpoint answers with (`dlock_common::ApiError` writes it).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `{"code": "...", "message": "...", ...details}`. `code` is machine-readable and stable
/// (`INVALID_LOCK_KEY`, `FENCED_OUT`, …); `message` is for people; some codes carry details beside
/// them (a `FENCED_OUT` carries `presented`, `highest`, `resourceType`, `resourceId`, `ownerId`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::shape::code))]
    pub code: String,
    pub message: String,
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(additional_properties))]
    pub details: Map<String, Value>,
}
