//! Bearer credentials for the payment services' writes (payment-resource, rail-proxy) and the
//! client side the executor presents.
//!
//! - Credentials come from the environment or from files (a mounted Secret), never from a flag:
//!   `<PREFIX>_<ROLE>_TOKEN` or `<PREFIX>_<ROLE>_TOKEN_FILE` (both set is an error). They are
//!   redacted in `Debug` and never logged.
//! - Each protected route names the roles it admits; a request without a valid credential is 401
//!   `UNAUTHENTICATED`, a valid credential of another role is 403 `FORBIDDEN`. Health, readiness,
//!   metrics and the OpenAPI document stay open.
//! - The presented token is compared with every configured credential in constant time (`subtle`),
//!   so timing reveals neither which role nor how much of a token matched.
//! - A role with no credential configured admits nobody (fail closed).

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::ApiError;

/// Shortest accepted credential, in bytes: long enough that guessing is not an option.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest accepted credential, in bytes.
pub const MAX_TOKEN_LEN: usize = 512;

/// Who a caller is, by the credential it presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Operators' tools: accounts, reconciliation.
    Admin,
    /// payout-executor: claims, transitions, postings, rail submissions and resolutions.
    Executor,
    /// A system that creates payouts on behalf of customers.
    Client,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Executor, Role::Client];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Executor => "executor",
            Role::Client => "client",
        }
    }

    fn env_part(self) -> &'static str {
        match self {
            Role::Admin => "ADMIN",
            Role::Executor => "EXECUTOR",
            Role::Client => "CLIENT",
        }
    }
}

/// A secret bearer token. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("{name}: a credential must be {MIN_TOKEN_LEN}..={MAX_TOKEN_LEN} visible ASCII characters")]
    Malformed { name: String },
    #[error("both {name} and {name}_FILE are set; set one")]
    Both { name: String },
    #[error("{name}_FILE: cannot read {path}: {error}")]
    File {
        name: String,
        path: String,
        error: String,
    },
}

impl Credential {
    /// Checks the shape: visible ASCII, no spaces, within the length bounds. `name` is the
    /// setting's name, for the error message (the value never appears in it).
    pub fn new(name: &str, value: impl Into<String>) -> Result<Self, CredentialError> {
        let value = value.into();
        let ok = (MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&value.len())
            && value.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(Self(value))
        } else {
            Err(CredentialError::Malformed {
                name: name.to_owned(),
            })
        }
    }

    /// `NAME` from the environment, or the contents of the file `NAME_FILE` names (one trailing
    /// newline ignored). `Ok(None)` when neither is set.
    pub fn from_env(name: &str) -> Result<Option<Self>, CredentialError> {
        let file_var = format!("{name}_FILE");
        match (std::env::var(name).ok(), std::env::var(&file_var).ok()) {
            (Some(_), Some(_)) => Err(CredentialError::Both {
                name: name.to_owned(),
            }),
            (Some(v), None) => Self::new(name, v).map(Some),
            (None, Some(path)) => Self::from_file(name, Path::new(&path)).map(Some),
            (None, None) => Ok(None),
        }
    }

    fn from_file(name: &str, path: &Path) -> Result<Self, CredentialError> {
        let text = std::fs::read_to_string(path).map_err(|e| CredentialError::File {
            name: name.to_owned(),
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        let value = text.strip_suffix('\n').unwrap_or(&text);
        let value = value.strip_suffix('\r').unwrap_or(value);
        Self::new(&format!("{name}_FILE"), value)
    }

    /// The secret, for the `Authorization` header of an outgoing request only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `Bearer <token>` as a header value, marked sensitive (hyper never logs it).
    pub fn header_value(&self) -> Option<HeaderValue> {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", self.0)).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

/// The credentials a service accepts, one per role at most.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    entries: Vec<(Role, Credential)>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer …`, or a token that matches no configured credential.
    Unauthenticated,
    /// A valid credential whose role this route does not admit.
    Forbidden(Role),
}

impl Credentials {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the credential of `role`.
    pub fn with(mut self, role: Role, credential: Credential) -> Self {
        self.entries.retain(|(r, _)| *r != role);
        self.entries.push((role, credential));
        self
    }

    /// `<prefix>_<ROLE>_TOKEN` / `…_TOKEN_FILE` for each of `roles`.
    pub fn from_env(prefix: &str, roles: &[Role]) -> Result<Self, CredentialError> {
        let mut out = Self::new();
        for role in roles {
            if let Some(c) = Credential::from_env(&format!("{prefix}_{}_TOKEN", role.env_part()))? {
                out = out.with(*role, c);
            }
        }
        Ok(out)
    }

    /// The env name a role's credential is read from (for messages and documentation).
    pub fn env_name(prefix: &str, role: Role) -> String {
        format!("{prefix}_{}_TOKEN", role.env_part())
    }

    pub fn has(&self, role: Role) -> bool {
        self.entries.iter().any(|(r, _)| *r == role)
    }

    /// Logs a WARN for each of `roles` that has no credential (its routes then admit nobody).
    pub fn warn_missing(&self, service: &str, prefix: &str, roles: &[Role]) {
        for role in roles.iter().filter(|r| !self.has(**r)) {
            tracing::warn!(
                event = "credential_missing",
                service,
                role = role.as_str(),
                setting = %Self::env_name(prefix, *role),
                "no credential configured for this role: its endpoints refuse every request (401)"
            );
        }
    }

    /// The role of the request's bearer token, compared in constant time with every credential.
    pub fn identify(&self, headers: &HeaderMap) -> Option<Role> {
        let presented = headers.get(AUTHORIZATION).and_then(|v| bearer(v.as_bytes()))?;
        let mut found = None;
        // Every credential is compared, whatever matched before, so the time taken does not depend
        // on which role (if any) the token belongs to.
        for (role, cred) in &self.entries {
            let expected = cred.0.as_bytes();
            let equal = presented.len() == expected.len() && bool::from(presented.ct_eq(expected));
            if equal && found.is_none() {
                found = Some(*role);
            }
        }
        found
    }

    /// Admits the request if its credential's role is one of `allowed`.
    pub fn authorize(&self, headers: &HeaderMap, allowed: &[Role]) -> Result<Role, AuthError> {
        match self.identify(headers) {
            None => Err(AuthError::Unauthenticated),
            Some(role) if allowed.contains(&role) => Ok(role),
            Some(role) => Err(AuthError::Forbidden(role)),
        }
    }
}

/// The credentials of `Authorization: Bearer <token>` (the scheme is case-insensitive, RFC 9110).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !rest.is_empty()).then_some(rest)
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "this endpoint needs Authorization: Bearer <credential>",
            ),
            AuthError::Forbidden(role) => ApiError::new(
                StatusCode::FORBIDDEN,
                "FORBIDDEN",
                format!("the {} role may not call this endpoint", role.as_str()),
            ),
        }
    }
}

/// What one protected route admits: the service's credentials and the roles.
#[derive(Debug, Clone)]
pub struct Gate {
    pub credentials: Arc<Credentials>,
    pub allowed: &'static [Role],
}

impl Gate {
    pub fn new(credentials: Arc<Credentials>, allowed: &'static [Role]) -> Self {
        Self { credentials, allowed }
    }
}

/// Middleware for `route_layer(axum::middleware::from_fn_with_state(gate, auth::require))`: runs
/// before any extractor of the handler, so an unauthenticated caller learns nothing about body or
/// token validation and nothing is read or written.
pub async fn require(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    match gate.credentials.authorize(request.headers(), gate.allowed) {
        Ok(role) => {
            tracing::debug!(event = "request_authorized", role = role.as_str());
            next.run(request).await
        }
        Err(e) => {
            tracing::info!(
                event = "request_refused",
                reason = match e {
                    AuthError::Unauthenticated => "unauthenticated",
                    AuthError::Forbidden(_) => "forbidden",
                },
                path = %request.uri().path(),
            );
            let mut response = ApiError::from(e).into_response();
            if e == AuthError::Unauthenticated {
                response
                    .headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(s: &str) -> Credential {
        Credential::new("T", s).unwrap()
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let c = cred("s3cret-s3cret-s3cret");
        assert!(!format!("{c:?}").contains("s3cret"));
        let all = Credentials::new().with(Role::Admin, c);
        assert!(!format!("{all:?}").contains("s3cret"));
    }

    #[test]
    fn shapes() {
        assert!(Credential::new("T", "short").is_err());
        assert!(Credential::new("T", "has a space in it....").is_err());
        assert!(Credential::new("T", "x".repeat(MAX_TOKEN_LEN + 1)).is_err());
        assert!(Credential::new("T", "a".repeat(MIN_TOKEN_LEN)).is_ok());
        let err = Credential::new("MY_TOKEN", "nope").unwrap_err().to_string();
        assert!(err.contains("MY_TOKEN") && !err.contains("nope"), "{err}");
    }

    #[test]
    fn roles_and_refusals() {
        let creds = Credentials::new()
            .with(Role::Admin, cred("admin-admin-admin-1"))
            .with(Role::Executor, cred("exec-exec-exec-exec-2"));
        let exec = headers("Bearer exec-exec-exec-exec-2");
        assert_eq!(creds.authorize(&exec, &[Role::Executor]), Ok(Role::Executor));
        assert_eq!(
            creds.authorize(&exec, &[Role::Admin]),
            Err(AuthError::Forbidden(Role::Executor))
        );
        assert_eq!(
            creds.authorize(&headers("bearer exec-exec-exec-exec-2"), &[Role::Executor]),
            Ok(Role::Executor)
        );
        for bad in [
            "Bearer exec-exec-exec-exec-",
            "Bearer exec-exec-exec-exec-22",
            "Basic exec-exec-exec-exec-2",
            "Bearer ",
            "exec-exec-exec-exec-2",
        ] {
            assert_eq!(
                creds.authorize(&headers(bad), &[Role::Executor]),
                Err(AuthError::Unauthenticated),
                "{bad}"
            );
        }
        assert_eq!(
            creds.authorize(&HeaderMap::new(), &[Role::Executor]),
            Err(AuthError::Unauthenticated)
        );
        // A role without a credential admits nobody.
        assert_eq!(
            Credentials::new().authorize(&exec, &[Role::Executor]),
            Err(AuthError::Unauthenticated)
        );
    }

    #[test]
    fn files_lose_one_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("dlock-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "file-token-file-token\n").unwrap();
        let c = Credential::from_file("T", &path).unwrap();
        assert_eq!(c.expose(), "file-token-file-token");
        assert!(Credential::from_file("T", &dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
