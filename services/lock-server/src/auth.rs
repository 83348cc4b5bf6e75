//! The bearer tokens: the admin's, which guards `/v1/admin/*` and the listing, and the lock
//! clients' ([`crate::clients`]), which guard every lock and session route when a clients file is
//! configured ([`Caller`]).

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use uuid::Uuid;

use crate::clients::{Client, Operation, UNKNOWN_CLIENT, token_matches};
use crate::error::Error;
use crate::metrics::RefusalReason;
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

/// The operation a lock or session route needs of a client; `None` for the routes clients never
/// use (admin, operations). Every `/v1/sessions*` and `/v1/locks*` route has one (a unit test
/// checks the route table).
pub fn operation(method: &Method, route: &str) -> Option<Operation> {
    match (method.as_str(), route) {
        (_, r) if r == "/v1/sessions" || r.starts_with("/v1/sessions/") => Some(Operation::Lock),
        ("POST", "/v1/locks/{key}/acquire" | "/v1/locks/{key}/renew" | "/v1/locks/{key}/release") => {
            Some(Operation::Lock)
        }
        ("GET", "/v1/locks/{key}") => Some(Operation::Read),
        ("GET", "/v1/locks/{key}/watch") => Some(Operation::Watch),
        ("GET", "/v1/locks") => Some(Operation::List),
        _ => None,
    }
}

/// Who calls a lock or session route, and the checks of its rights. As an extractor it runs before
/// the body is read: a request without a client's token (401) or for an operation its client lacks
/// (403) learns nothing about body validation. Without a clients file every caller is let through
/// and every check passes (the lock API is open, as it was before clients existed).
///
/// Each refusal is counted (`lock_client_refusals_total{client, reason}`) and logged once
/// (`lock_client_refused`, WARN: the client, the route template and the reason; never the token).
#[derive(Debug, Clone)]
pub struct Caller {
    /// `None`: no clients file, or the admin on the listing.
    client: Option<Arc<Client>>,
    route: Arc<str>,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let route: Arc<str> = parts
            .extensions
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str)
            .into();
        let Some(clients) = state.clients() else {
            return Ok(Self { client: None, route });
        };
        // A route without an operation never takes a `Caller` (see `operation`'s test); refusing
        // is the safe answer if one ever does.
        let Some(op) = operation(&parts.method, &route) else {
            return Err(refuse(
                state,
                None,
                &route,
                RefusalReason::operation,
                Error::Forbidden("this route is not open to lock clients".into()),
            ));
        };
        let token = presented(&parts.headers);
        // The admin, who may list every key, may read one too (the operator reads the holder it
        // revokes); it is no client, so nothing else here admits it.
        if op == Operation::Read
            && let (Some(t), Some(admin)) = (token, state.admin_token())
            && token_matches(t, admin.as_bytes())
        {
            return Ok(Self { client: None, route });
        }
        let Some(client) = token.and_then(|t| clients.authenticate(t)).cloned() else {
            return Err(refuse(
                state,
                None,
                &route,
                RefusalReason::unauthenticated,
                Error::ClientUnauthorized,
            ));
        };
        let caller = Self {
            client: Some(client),
            route,
        };
        caller.may(state, op)?;
        Ok(caller)
    }
}

/// The caller of the listing (`GET /v1/locks`): a client with the `list` operation, or the admin
/// (exactly as without clients: its token, `ADMIN_DISABLED` when none is configured).
#[derive(Debug, Clone)]
pub struct Lister(pub Caller);

impl FromRequestParts<AppState> for Lister {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let a_client = state.clients().is_some_and(|c| {
            presented(&parts.headers)
                .and_then(|t| c.authenticate(t))
                .is_some()
        });
        if a_client {
            return Caller::from_request_parts(parts, state).await.map(Lister);
        }
        let route: Arc<str> = parts
            .extensions
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str)
            .into();
        match Admin::from_request_parts(parts, state).await {
            Ok(Admin) => Ok(Lister(Caller { client: None, route })),
            // With clients configured a refused listing is a refused client request too.
            Err(e) if state.clients().is_some() => {
                Err(refuse(state, None, &route, RefusalReason::unauthenticated, e))
            }
            Err(e) => Err(e),
        }
    }
}

/// Counts and logs a refusal, and returns the error to answer with.
fn refuse(
    state: &AppState,
    client: Option<&Client>,
    route: &str,
    reason: RefusalReason,
    error: Error,
) -> Error {
    let name = client.map_or(UNKNOWN_CLIENT, Client::name);
    state.metrics().client_refused(name, reason);
    tracing::warn!(
        event = "lock_client_refused",
        client = name,
        route,
        reason = ?reason,
        message = %error,
    );
    error
}

impl Caller {
    /// The authenticated client; `None` without a clients file (or for the admin on the listing).
    pub fn client(&self) -> Option<&Client> {
        self.client.as_deref()
    }

    fn refuse(&self, state: &AppState, reason: RefusalReason, message: String) -> Error {
        refuse(
            state,
            self.client(),
            &self.route,
            reason,
            Error::Forbidden(message),
        )
    }

    fn may(&self, state: &AppState, op: Operation) -> Result<(), Error> {
        match self.client() {
            Some(c) if !c.may(op) => {
                let granted: Vec<&str> = c.operations().map(Operation::as_str).collect();
                Err(self.refuse(
                    state,
                    RefusalReason::operation,
                    format!(
                        "client {:?} may not use operation \"{op}\" (its operations: {})",
                        c.name(),
                        granted.join(", ")
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// `key` lies within the client's key prefixes.
    pub fn key(&self, state: &AppState, key: &str) -> Result<(), Error> {
        match self.client() {
            Some(c) if !c.owns_key(key) => Err(self.refuse(
                state,
                RefusalReason::key,
                format!(
                    "client {:?} may not use key {key:?}: it is outside its key prefixes {:?}",
                    c.name(),
                    c.key_prefixes()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The listing's `prefix` lies within one of the client's key prefixes (so every key it can
    /// list is one of the client's).
    pub fn list_prefix(&self, state: &AppState, prefix: &str) -> Result<(), Error> {
        match self.client() {
            Some(c) if !c.owns_key(prefix) => Err(self.refuse(
                state,
                RefusalReason::key,
                format!(
                    "client {:?} may list only under its key prefixes {:?}; prefix {prefix:?} is not within one",
                    c.name(),
                    c.key_prefixes()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `owner_id` lies within the client's owner prefixes.
    pub fn owner(&self, state: &AppState, owner_id: &str) -> Result<(), Error> {
        match self.client() {
            Some(c) if !c.owns_owner(owner_id) => Err(self.refuse(
                state,
                RefusalReason::owner,
                format!(
                    "client {:?} may not act for ownerId {owner_id:?}: it is outside its owner prefixes {:?}",
                    c.name(),
                    c.owner_prefixes()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The session `session_id`, opened for `session_owner`, is the client's.
    pub fn session(&self, state: &AppState, session_id: Uuid, session_owner: &str) -> Result<(), Error> {
        match self.client() {
            Some(c) if !c.owns_owner(session_owner) => Err(self.refuse(
                state,
                RefusalReason::session,
                format!(
                    "session {session_id} belongs to another client, not to client {:?}",
                    c.name()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// An acquire under a session of this client names the session's own owner id: a grant's owner
    /// is its session's owner, as the signed grant tells the resources.
    pub fn session_owner_is(
        &self,
        state: &AppState,
        session_id: Uuid,
        session_owner: &str,
        owner_id: &str,
    ) -> Result<(), Error> {
        match self.client() {
            Some(_) if session_owner != owner_id => Err(self.refuse(
                state,
                RefusalReason::session,
                format!("session {session_id} was opened for ownerId {session_owner:?}, not {owner_id:?}"),
            )),
            _ => Ok(()),
        }
    }

    /// The grant at `key` and `token`, held by `grant_owner`, is the client's.
    pub fn grant(&self, state: &AppState, key: &str, token: i64, grant_owner: &str) -> Result<(), Error> {
        match self.client() {
            Some(c) if !c.owns_owner(grant_owner) => Err(self.refuse(
                state,
                RefusalReason::session,
                format!(
                    "the grant on key {key:?} with fencing token {token} belongs to another client's session, not to client {:?}",
                    c.name()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The bearer credentials of a request, if any.
fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    headers.get(AUTHORIZATION).and_then(|v| bearer(v.as_bytes()))
}

/// The credentials of `Authorization: Bearer <token>` (the scheme is case-insensitive, RFC 9110).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ")).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::{bearer, operation};
    use crate::clients::Operation;
    use crate::clients::token_matches;

    /// Every lock and session route needs an operation of a client, and no other route does: a new
    /// lock route cannot be left open to every client by forgetting it here.
    #[test]
    fn every_lock_and_session_route_needs_an_operation() {
        let mut seen = std::collections::BTreeSet::new();
        for r in crate::routes() {
            let guarded = r.path.starts_with("/v1/sessions") || r.path.starts_with("/v1/locks");
            let op = operation(&r.method, r.path);
            assert_eq!(op.is_some(), guarded, "{} {}", r.method, r.path);
            seen.extend(op);
        }
        assert_eq!(seen.len(), Operation::ALL.len(), "{seen:?}");
        assert_eq!(
            operation(&axum::http::Method::GET, "/v1/locks/{key}"),
            Some(Operation::Read)
        );
        assert_eq!(
            operation(&axum::http::Method::DELETE, "/v1/sessions/{sessionId}"),
            Some(Operation::Lock)
        );
    }

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
