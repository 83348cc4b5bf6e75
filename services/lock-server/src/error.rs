//! The one error type of lock-server's request path, mapped to HTTP at the edge.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dlock_common::ApiError;

/// SQLSTATE `foreign_key_violation`: acquire named a session that does not exist.
const FOREIGN_KEY_VIOLATION: &str = "23503";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Acquire found the key held by a live, different holder (zero rows). The holder is not named.
    #[error("the lock is held by another live holder")]
    Contended,
    /// The session does not exist (acquire hit the foreign key) or was reaped (heartbeat zero rows).
    #[error("the session does not exist or has expired; open a new session")]
    SessionGone,
    /// Renew found zero rows: the lease lapsed, or the row now belongs to a newer token.
    #[error("the lease has expired or was taken over; the lock is lost")]
    LeaseExpired,
    /// No admin token is configured, so admin endpoints are off.
    #[error("admin endpoints are disabled: no admin token is configured")]
    AdminDisabled,
    /// Missing or wrong admin bearer token.
    #[error("a valid admin bearer token is required")]
    Unauthorized,
    /// A clients file is configured and the request carried no client's token (docs/lock-api.md).
    #[error("a valid lock client bearer token is required (Authorization: Bearer <token>)")]
    ClientUnauthorized,
    /// The client's token is valid but its rights do not cover this: the message says which
    /// operation, key, owner id or session (never the token).
    #[error("{0}")]
    Forbidden(String),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The etcd backend's store did not answer, or answered an error.
    #[error("etcd error: {0}")]
    Etcd(#[source] Box<etcd_client::Error>),
    /// A value in etcd that this server did not write in that shape.
    #[error("unexpected data in the store: {0}")]
    Corrupt(String),
    /// Something the request needs is not up (e.g. the lockdb listener reconnecting).
    #[error("unavailable: {0}")]
    Unavailable(&'static str),
    /// The request went away before it was answered (never reaches a client).
    #[error("the request was cancelled")]
    Cancelled,
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some(FOREIGN_KEY_VIOLATION) => {
                Error::SessionGone
            }
            _ => Error::Database(e),
        }
    }
}

impl Error {
    pub fn etcd(e: etcd_client::Error) -> Self {
        Error::Etcd(Box::new(e))
    }

    /// The same failure for another caller of one batched request (the etcd backend's release
    /// batches): the same message and the same answer at the edge (503 or 500), whatever it was.
    pub fn shared(&self) -> Self {
        use etcd_client::Error as E;
        match self {
            Error::Etcd(e) => Error::etcd(match &**e {
                E::GRpcStatus(s) => E::GRpcStatus(s.clone()),
                e if etcd_unavailable(e) => E::IoError(std::io::Error::other(e.to_string())),
                // No other shape comes from a transaction that reached etcd-client's channel.
                e => E::InvalidArgs(e.to_string()),
            }),
            Error::Unavailable(m) => Error::Unavailable(m),
            Error::Cancelled => Error::Cancelled,
            other => Error::Corrupt(other.to_string()),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::Contended => ApiError::conflict("CONTENDED", message),
            Error::SessionGone => ApiError::new(StatusCode::GONE, "SESSION_GONE", message),
            Error::LeaseExpired => ApiError::new(StatusCode::GONE, "LEASE_EXPIRED", message),
            Error::AdminDisabled => ApiError::new(StatusCode::FORBIDDEN, "ADMIN_DISABLED", message),
            Error::Unauthorized | Error::ClientUnauthorized => {
                ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", message)
            }
            Error::Forbidden(_) => ApiError::new(StatusCode::FORBIDDEN, "FORBIDDEN", message),
            // Connection trouble is the database being unavailable, not a bug of ours.
            Error::Database(e) if dlock_common::db::unavailable(&e) => ApiError::unavailable(e),
            Error::Database(e) => ApiError::internal(e),
            // etcd unreachable, or no leader (during an election): the store is unavailable.
            Error::Etcd(e) if etcd_unavailable(&e) => ApiError::unavailable(e),
            Error::Etcd(e) => ApiError::internal(e),
            Error::Corrupt(m) => ApiError::internal(m),
            Error::Unavailable(m) => ApiError::unavailable(m),
            Error::Cancelled => ApiError::unavailable("the request was cancelled"),
        }
    }
}

fn etcd_unavailable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) => true,
        // A keep-alive stream that broke (its channel closed, or it ended unanswered). A lease that
        // is gone never gets here: the etcd backend maps that to "not found" (410).
        E::LeaseKeepAliveError(_) | E::WatchError(_) => true,
        // gRPC codes CANCELLED (1), UNKNOWN (2: a broken connection), DEADLINE_EXCEEDED (4) and
        // UNAVAILABLE (14, also etcd's "no leader" during an election).
        E::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 14),
        _ => false,
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}
