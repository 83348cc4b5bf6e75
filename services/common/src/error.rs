//! The one error body every dlock endpoint answers with, and extractors that map axum's rejections
//! to it, so that bad input is always a 4xx with a machine-readable `code` — never a 500.

use axum::Json;
use axum::extract::FromRequest;
use axum::extract::FromRequestParts;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::token::TokenError;
use crate::validate::Invalid;

/// `{"code": "...", "message": "...", ...details}` with an HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Map<String, Value>,
}

/// A validator's refusal is the caller's mistake: 400 with its code.
impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        Self::bad_request(e.code, e.message)
    }
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// A failure of ours (database down, bug). The message is generic; the cause goes to the log.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(event = "internal_error", error = %cause, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "internal error; see the service log",
        )
    }

    pub fn unavailable(cause: impl std::fmt::Display) -> Self {
        tracing::warn!(event = "dependency_unavailable", error = %cause, "dependency unavailable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "a dependency is unavailable; retry later",
        )
    }

    pub fn with(mut self, key: &str, value: impl Serialize) -> Self {
        self.details
            .insert(key.to_owned(), serde_json::to_value(value).unwrap_or(Value::Null));
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("code".into(), Value::from(self.code));
        body.insert("message".into(), Value::from(self.message));
        body.extend(self.details);
        (self.status, Json(Value::Object(body))).into_response()
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        ApiError::bad_request("INVALID_TOKEN", e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UNSUPPORTED_MEDIA_TYPE",
                "expected a body with Content-Type: application/json",
            ),
            JsonRejection::JsonDataError(e) => ApiError::bad_request("INVALID_FIELD", e.body_text()),
            other => ApiError::bad_request("MALFORMED_JSON", other.body_text()),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::bad_request("INVALID_PATH", r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::bad_request("INVALID_QUERY", r.body_text())
    }
}

/// `Json<T>` whose rejection is an [`ApiError`].
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `Path<T>` whose rejection is an [`ApiError`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `Query<T>` whose rejection is an [`ApiError`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// Fallback for unknown routes: a JSON 404 like every other error.
pub async fn not_found_fallback() -> ApiError {
    ApiError::not_found("NOT_FOUND", "no such endpoint")
}
