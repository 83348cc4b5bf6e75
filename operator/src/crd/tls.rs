//! `spec.tls` of both kinds: who makes the certificates of the HTTPS APIs the object's workloads
//! serve, and `status.tls`, what the operator issued.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the object's HTTP APIs are served (docs/security.md, "HTTPS").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// `Operator` (the default): HTTPS on every API the object serves, with a certificate per
    /// component signed by the namespace's CA, which the operator keeps (Secret `dlock-ca`) and
    /// publishes to the clients (ConfigMap `dlock-ca-bundle`); certificates are renewed 30 days
    /// before they expire and the servers pick the new files up without a restart. `Disabled`:
    /// plain HTTP — bearer credentials and signed grants cross the network in cleartext, and every
    /// server logs a `plaintext_http` WARN at start-up.
    #[serde(default)]
    pub mode: TlsMode,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum TlsMode {
    #[default]
    Operator,
    Disabled,
}

impl TlsSpec {
    /// The object's APIs are served over HTTPS.
    pub fn https(&self) -> bool {
        self.mode == TlsMode::Operator
    }
}

/// Annotation asking for every certificate of the object to be renewed now, before its time (a
/// suspected key leak, a drill): each new value is one request, handled once and echoed in
/// `status.tls.lastHandledRenewRequest`, as Flux echoes `reconcile.fluxcd.io/requestedAt`.
///
/// ```text
/// kubectl annotate lsvc payments-locks --overwrite dlock.dev/renew-certificates="$(date -u +%FT%TZ)"
/// ```
pub const ANNOTATION_RENEW_CERTIFICATES: &str = "dlock.dev/renew-certificates";

/// A renew request's value: 1-63 characters of letters, digits, `-`, `.`, `_` and `:` (a
/// timestamp, a counter, a ticket id). Anything else is refused with this message.
pub fn check_renew_request(value: &str) -> Result<(), &'static str> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    if ok {
        Ok(())
    } else {
        Err("must be 1-63 characters of letters, digits, '-', '.', '_' and ':' (e.g. a timestamp)")
    }
}

/// `status.tls`: the CA and the certificates the operator issued for this object. Names and
/// dates only: no key is ever in status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsStatus {
    /// When the namespace's CA expires (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_not_after: Option<String>,
    /// One entry per served component.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<CertificateStatus>,
    /// The last `dlock.dev/renew-certificates` value handled: every certificate was re-issued then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_renew_request: Option<String>,
    /// A short hash of the CA certificate that signed every certificate of this object (absent
    /// while a rotation has them signed by two). The other objects of the namespace read it: the
    /// new CA replaces the old once every object's certificates are signed by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// The namespace's CA is being replaced (from a year before it ends): where that stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_rotation: Option<CaRotationStatus>,
}

/// A rotation of the namespace's CA, as this object sees it. `Trusting`: the new CA is published
/// beside the old one in `dlock-ca-bundle` and the clients roll out with both; certificates are
/// still signed by the old one. `Moving`: every client trusts both and the overlap has passed, so
/// certificates are re-issued by the new CA; once every object's are, the new CA replaces the old
/// one and the bundle holds it alone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaRotationStatus {
    /// `Trusting` or `Moving`.
    pub phase: String,
    /// When the new CA expires (RFC 3339).
    pub next_ca_not_after: String,
    /// What the next step waits for, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    pub component: String,
    /// The Secret (type `kubernetes.io/tls`) the component's pods mount.
    pub secret: String,
    /// RFC 3339.
    pub not_after: String,
    /// When the operator renews it (RFC 3339).
    pub renew_after: String,
}
