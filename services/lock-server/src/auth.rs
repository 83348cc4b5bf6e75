//! The admin bearer token that guards `/v1/admin/*`.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use crate::error::Error;
use crate::state::AppState;

/// Proof that the request carried the configured admin token. As an extractor it runs before the
/// body is read, so an unauthenticated request learns nothing about body validation.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let expected = state.admin_token().ok_or(Error::AdminDisabled)?;
        let presented = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .ok_or(Error::Unauthorized)?;
        if token_matches(presented, expected.as_bytes()) {
            Ok(Admin)
        } else {
            Err(Error::Unauthorized)
        }
    }
}

/// Constant-time in the token's contents (only a length mismatch returns early, which reveals the
/// length and nothing else).
fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    !expected.is_empty() && bool::from(presented.ct_eq(expected))
}

#[cfg(test)]
mod tests {
    use super::token_matches;

    #[test]
    fn matches_only_the_exact_token() {
        assert!(token_matches(b"s3cret", b"s3cret"));
        assert!(!token_matches(b"s3cre", b"s3cret"));
        assert!(!token_matches(b"s3cretx", b"s3cret"));
        assert!(!token_matches(b"S3cret", b"s3cret"));
        assert!(!token_matches(b"", b""));
    }
}
