//! The one error type of the client, and the mapping from an error response body to it.
//!
//! Every non-2xx answer from lock-server or a protected resource is `{"code", "message", ...}`.
//! [`error_from_body`] turns such a body into a [`ClientError`]; a 409 `FENCED_OUT` becomes the
//! terminal [`ClientError::FencedOut`] with its five details.

use std::fmt;

use dlock_wire::FencingToken;
use dlock_wire::fencing::{FENCED_OUT, FencedOutDetails};
use reqwest::StatusCode;
use serde::Deserialize;

/// Why a lock handle (or the session under it) is no longer valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// A renew answered 410 `LEASE_EXPIRED`: the lease lapsed, or a newer token owns the key.
    LeaseExpired,
    /// No renewal was confirmed before the lease's deadline minus the safety margin (the server
    /// could not be reached in time, or this process did not get to run).
    RenewalUnconfirmed,
    /// A heartbeat (or an acquire) answered 410 `SESSION_GONE`: the session was reaped or closed
    /// server-side, and every lock under it went with it.
    SessionGone,
    /// No heartbeat was confirmed before the session's deadline minus the safety margin.
    HeartbeatUnconfirmed,
    /// This process closed or dropped the session.
    SessionEnded,
    /// This process released or dropped the handle.
    Released,
    /// An operator force-revoked the grant (a watch of the key said so).
    Revoked,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::LeaseExpired => "the lease expired or was taken over (renew answered LEASE_EXPIRED)",
            LossReason::RenewalUnconfirmed => "no renewal could be confirmed before the lease deadline",
            LossReason::SessionGone => "the session is gone server-side (SESSION_GONE)",
            LossReason::HeartbeatUnconfirmed => "no heartbeat could be confirmed before the session deadline",
            LossReason::SessionEnded => "the session was closed or dropped by this process",
            LossReason::Released => "the lock was released or its handle dropped by this process",
            LossReason::Revoked => "an operator revoked the grant (REVOKED)",
        })
    }
}

/// A protected resource refused a write because it has already seen a higher (or equal) token.
///
/// The five details are those of [`FencedOutDetails`]: `presented`, `highest`, `resource_type`,
/// `resource_id`, `owner_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedOut {
    pub details: FencedOutDetails,
    /// The resource's human-readable message.
    pub message: String,
}

impl FencedOut {
    /// The token the caller presented.
    pub fn presented(&self) -> i64 {
        self.details.presented
    }
    /// The highest token the resource had already seen.
    pub fn highest(&self) -> i64 {
        self.details.highest
    }
    /// `account`, `ledger`, `payout` or `rail`.
    pub fn resource_type(&self) -> &str {
        &self.details.resource_type
    }
    pub fn resource_id(&self) -> &str {
        &self.details.resource_id
    }
    pub fn owner_id(&self) -> &str {
        &self.details.owner_id
    }
}

impl fmt::Display for FencedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.details;
        write!(
            f,
            "fenced out by {} {}: presented token {} but {} was already seen (owner {})",
            d.resource_type, d.resource_id, d.presented, d.highest, d.owner_id
        )
    }
}

/// Everything the client can fail with.
///
/// [`ClientError::LockLost`] and [`ClientError::FencedOut`] are **terminal**: the critical section
/// that got one must stop, and must never retry the write — not with the same token (it is stale)
/// and not with a fresh one (a newer holder may already have done the work). Nothing in this crate
/// retries them; [`ClientError::is_terminal`] says which errors they are.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The lock is no longer ours. Terminal.
    #[error("lock {key:?} (token {token}) is lost: {reason}")]
    LockLost {
        key: String,
        token: FencingToken,
        reason: LossReason,
    },
    /// A protected resource answered 409 `FENCED_OUT`. Terminal.
    #[error("{0}")]
    FencedOut(FencedOut),
    /// The key is held by a live, different holder (and stayed so for the whole bounded wait).
    #[error("lock {key:?} is held by another holder")]
    Contended { key: String },
    /// The session is gone (reaped, closed or lost); open a new one.
    #[error("the lock session is gone: {reason}")]
    SessionGone { reason: LossReason },
    /// Any other error answer: `{status, code, message}` from the body.
    #[error("{status} {code}: {message}")]
    Api {
        status: StatusCode,
        code: String,
        message: String,
    },
    /// The server's TLS certificate was refused: [`CertificateProblem`] says why, `url` where.
    /// Not retried by anything here: the same certificate will be refused again.
    #[error("the TLS certificate of {url} was refused: {problem}")]
    Certificate {
        url: String,
        problem: CertificateProblem,
    },
    /// The server could not be reached, timed out, or the body could not be read.
    #[error("transport error: {0}")]
    Transport(reqwest::Error),
    /// A success answer we cannot make sense of (e.g. a renew that reports another token).
    #[error("unexpected response from the server: {0}")]
    Protocol(String),
    /// Rejected before anything was sent; `code` is the one the server would use.
    #[error("{code}: {message}")]
    InvalidArgument { code: &'static str, message: String },
}

/// Why a server's TLS certificate was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateProblem {
    /// It is not signed by a CA this client trusts (its CA file).
    UnknownIssuer,
    /// It is not valid for the host name or address the client connected to.
    WrongName { presented: Vec<String> },
    /// It has expired.
    Expired,
    /// It is not valid yet.
    NotYetValid,
    /// Any other refusal, in the TLS library's words.
    Other(String),
}

impl fmt::Display for CertificateProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertificateProblem::UnknownIssuer => {
                f.write_str("unknown CA: it is not signed by the CA this client trusts (its CA file)")
            }
            CertificateProblem::WrongName { presented } if presented.is_empty() => {
                f.write_str("wrong name: it is not valid for the host name of the URL")
            }
            CertificateProblem::WrongName { presented } => write!(
                f,
                "wrong name: it is not valid for the host name of the URL (it is for {})",
                presented.join(", ")
            ),
            CertificateProblem::Expired => {
                f.write_str("expired: the certificate's validity period has ended")
            }
            CertificateProblem::NotYetValid => {
                f.write_str("not yet valid: the certificate's validity period has not begun")
            }
            CertificateProblem::Other(reason) => write!(f, "{reason}"),
        }
    }
}

impl CertificateProblem {
    fn from_rustls(e: &rustls::CertificateError) -> Self {
        use rustls::CertificateError as C;
        match e {
            C::UnknownIssuer => CertificateProblem::UnknownIssuer,
            C::NotValidForName => CertificateProblem::WrongName {
                presented: Vec::new(),
            },
            C::NotValidForNameContext { presented, .. } => CertificateProblem::WrongName {
                presented: presented.clone(),
            },
            C::Expired | C::ExpiredContext { .. } => CertificateProblem::Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => CertificateProblem::NotYetValid,
            other => CertificateProblem::Other(other.to_string()),
        }
    }
}

/// The certificate error under a transport error, if there is one. The chain passes through
/// `std::io::Error`, whose `source()` skips the error it wraps, so each link is also looked into.
fn certificate_error(e: &(dyn std::error::Error + 'static)) -> Option<CertificateProblem> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(rustls::Error::InvalidCertificate(c)) = err.downcast_ref::<rustls::Error>() {
            return Some(CertificateProblem::from_rustls(c));
        }
        if let Some(inner) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
            && let Some(found) = certificate_error(inner)
        {
            return Some(found);
        }
        next = err.source();
    }
    None
}

impl From<reqwest::Error> for ClientError {
    /// A refused server certificate becomes [`ClientError::Certificate`] (which one, and where);
    /// anything else stays a transport error.
    fn from(e: reqwest::Error) -> Self {
        match certificate_error(&e) {
            Some(problem) => ClientError::Certificate {
                url: e.url().map(|u| u.as_str().to_owned()).unwrap_or_default(),
                problem,
            },
            None => ClientError::Transport(e),
        }
    }
}

impl ClientError {
    /// `true` for [`ClientError::LockLost`] and [`ClientError::FencedOut`] (and for a `FENCED_OUT`
    /// answer whose details could not be read): stop the critical section, never retry.
    pub fn is_terminal(&self) -> bool {
        match self {
            ClientError::LockLost { .. } | ClientError::FencedOut(_) => true,
            ClientError::Api { code, .. } => code == FENCED_OUT,
            _ => false,
        }
    }

    pub(crate) fn invalid(e: dlock_wire::validate::Invalid) -> Self {
        ClientError::InvalidArgument {
            code: e.code,
            message: e.message,
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    code: String,
    #[serde(default)]
    message: String,
}

/// The five details, either at the top level of the body (how `ApiError::with` writes them) or
/// nested under `details`.
#[derive(Deserialize)]
struct FencedOutBody {
    #[serde(default)]
    message: String,
    #[serde(flatten)]
    top: Option<FencedOutDetails>,
    details: Option<FencedOutDetails>,
}

/// Reads a 409 `FENCED_OUT` body from any protected resource into [`FencedOut`].
///
/// `None` if the status is not 409, the code is not `FENCED_OUT`, or the five details are not all
/// there — a refusal without its details is still terminal (see [`ClientError::is_terminal`]) but
/// is reported as [`ClientError::Api`].
pub fn fenced_out_from_body(status: StatusCode, body: &[u8]) -> Option<FencedOut> {
    if status != StatusCode::CONFLICT {
        return None;
    }
    let head: ErrorBody = serde_json::from_slice(body).ok()?;
    if head.code != FENCED_OUT {
        return None;
    }
    let parsed: FencedOutBody = serde_json::from_slice(body).ok()?;
    let details = parsed.top.or(parsed.details)?;
    Some(FencedOut {
        details,
        message: parsed.message,
    })
}

/// Turns any error answer into a [`ClientError`]: 409 `FENCED_OUT` with details → `FencedOut`,
/// anything else → `Api { status, code, message }` (a body that is not the JSON error shape keeps
/// its text as the message, with code `UNKNOWN`).
pub fn error_from_body(status: StatusCode, body: &[u8]) -> ClientError {
    if let Some(f) = fenced_out_from_body(status, body) {
        return ClientError::FencedOut(f);
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => ClientError::Api {
            status,
            code: b.code,
            message: b.message,
        },
        Err(_) => ClientError::Api {
            status,
            code: "UNKNOWN".to_owned(),
            message: String::from_utf8_lossy(body).chars().take(512).collect(),
        },
    }
}

/// Reads a non-success `reqwest::Response` into a [`ClientError`] (see [`error_from_body`]).
/// For callers of protected resources, e.g. payment-resource and rail-proxy.
pub async fn error_from_response(response: reqwest::Response) -> ClientError {
    let status = response.status();
    match response.bytes().await {
        Ok(body) => error_from_body(status, &body),
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details() -> FencedOutDetails {
        FencedOutDetails {
            presented: 7,
            highest: 9,
            resource_type: "account".into(),
            resource_id: "3f1c".into(),
            owner_id: "worker-a".into(),
        }
    }

    #[test]
    fn fenced_out_top_level_details() {
        let body = br#"{"code":"FENCED_OUT","message":"stale","presented":7,"highest":9,
            "resourceType":"account","resourceId":"3f1c","ownerId":"worker-a"}"#;
        let e = error_from_body(StatusCode::CONFLICT, body);
        match &e {
            ClientError::FencedOut(f) => {
                assert_eq!(f.details, details());
                assert_eq!(f.presented(), 7);
                assert_eq!(f.highest(), 9);
                assert_eq!(f.resource_type(), "account");
                assert_eq!(f.resource_id(), "3f1c");
                assert_eq!(f.owner_id(), "worker-a");
                assert_eq!(f.message, "stale");
            }
            other => panic!("expected FencedOut, got {other:?}"),
        }
        assert!(e.is_terminal());
    }

    #[test]
    fn fenced_out_nested_details() {
        let body = br#"{"code":"FENCED_OUT","message":"m","details":{"presented":7,"highest":9,
            "resourceType":"account","resourceId":"3f1c","ownerId":"worker-a"}}"#;
        let f = fenced_out_from_body(StatusCode::CONFLICT, body).expect("parsed");
        assert_eq!(f.details, details());
    }

    #[test]
    fn not_fenced_out() {
        let full = br#"{"code":"FENCED_OUT","message":"m","presented":7,"highest":9,
            "resourceType":"account","resourceId":"3f1c","ownerId":"worker-a"}"#;
        // Right body, wrong status.
        assert!(fenced_out_from_body(StatusCode::BAD_REQUEST, full).is_none());
        // Another 409 code.
        let contended = br#"{"code":"CONTENDED","message":"held"}"#;
        assert!(fenced_out_from_body(StatusCode::CONFLICT, contended).is_none());
        let e = error_from_body(StatusCode::CONFLICT, contended);
        assert!(matches!(&e, ClientError::Api { code, .. } if code == "CONTENDED"));
        assert!(!e.is_terminal());
        // Not JSON at all.
        let e = error_from_body(StatusCode::BAD_GATEWAY, b"<html>oops</html>");
        assert!(matches!(&e, ClientError::Api { code, message, .. }
            if code == "UNKNOWN" && message.contains("oops")));
    }

    #[test]
    fn fenced_out_without_details_is_still_terminal() {
        let body = br#"{"code":"FENCED_OUT","message":"m","presented":7}"#;
        assert!(fenced_out_from_body(StatusCode::CONFLICT, body).is_none());
        let e = error_from_body(StatusCode::CONFLICT, body);
        assert!(matches!(&e, ClientError::Api { code, .. } if code == "FENCED_OUT"));
        assert!(e.is_terminal());
    }

    #[test]
    fn fenced_out_rejects_bad_numbers() {
        // A string token or a float is not a detail we can trust.
        let body = br#"{"code":"FENCED_OUT","message":"m","presented":"x","highest":9.5,
            "resourceType":"account","resourceId":"3f1c","ownerId":"w"}"#;
        assert!(fenced_out_from_body(StatusCode::CONFLICT, body).is_none());
    }

    #[test]
    fn certificate_errors_are_found_under_io_errors() {
        // How a handshake failure reaches reqwest: a rustls error inside an io::Error inside
        // another error, whose source() skips the io::Error's payload.
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("connect failed")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped = |c: rustls::CertificateError| {
            Outer(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(c),
            ))
        };
        assert_eq!(
            certificate_error(&wrapped(rustls::CertificateError::UnknownIssuer)),
            Some(CertificateProblem::UnknownIssuer)
        );
        assert_eq!(
            certificate_error(&wrapped(rustls::CertificateError::Expired)),
            Some(CertificateProblem::Expired)
        );
        assert_eq!(
            certificate_error(&wrapped(rustls::CertificateError::NotValidForName)),
            Some(CertificateProblem::WrongName { presented: vec![] })
        );
        let other = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(certificate_error(&other), None);
    }

    #[test]
    fn terminal_set() {
        let token = FencingToken::new(3).expect("positive");
        assert!(
            ClientError::LockLost {
                key: "k".into(),
                token,
                reason: LossReason::LeaseExpired
            }
            .is_terminal()
        );
        assert!(!ClientError::Contended { key: "k".into() }.is_terminal());
        assert!(
            !ClientError::SessionGone {
                reason: LossReason::SessionGone
            }
            .is_terminal()
        );
    }
}
