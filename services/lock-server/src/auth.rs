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
            .and_then(|v| bearer(v.as_bytes()))
            .ok_or(Error::Unauthorized)?;
        if token_matches(presented, expected.as_bytes()) {
            Ok(Admin)
        } else {
            Err(Error::Unauthorized)
        }
    }
}

/// The credentials of `Authorization: Bearer <token>` (the scheme is case-insensitive, RFC 9110).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ")).then_some(rest)
}

/// Constant-time in the token's contents (only a length mismatch returns early, which reveals the
/// length and nothing else).
fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    !expected.is_empty() && bool::from(presented.ct_eq(expected))
}

#[cfg(test)]
mod tests {
    use super::{bearer, token_matches};

    #[test]
    fn bearer_scheme() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn matches_only_the_exact_token() {
        assert!(token_matches(b"s3cret", b"s3cret"));
        assert!(!token_matches(b"s3cre", b"s3cret"));
        assert!(!token_matches(b"s3cretx", b"s3cret"));
        assert!(!token_matches(b"S3cret", b"s3cret"));
        assert!(!token_matches(b"", b""));
    }
}
