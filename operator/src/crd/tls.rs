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
