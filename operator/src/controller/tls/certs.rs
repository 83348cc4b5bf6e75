//! The namespace's CA and the components' server certificates: made with rcgen (ECDSA P-256 on
//! ring, the crypto provider of the whole workspace) and read back with x509-parser. No API calls;
//! the time is a parameter, so every decision about them is testable.

use std::fmt;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData,
};
use time::OffsetDateTime;
use x509_parser::pem::parse_x509_pem;

/// How long the namespace's CA is valid, and how long before its end its successor is made and
/// published beside it (the rotation: [`super::plan`]). A year leaves room for a rotation that
/// waits on a client for weeks.
pub const CA_DAYS: i64 = 3650;
pub const CA_RENEW_BEFORE_DAYS: i64 = 365;
/// How long a component's certificate is valid, and how long before its end it is renewed.
pub const LEAF_DAYS: i64 = 90;
pub const RENEW_BEFORE_DAYS: i64 = 30;
const DAY: i64 = 86_400;
/// Certificates start a little in the past: a node whose clock runs behind still accepts them.
pub const BACKDATE: i64 = 300;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("cannot make a certificate: {0}")]
    Make(String),
    #[error("not a PEM certificate: {0}")]
    Parse(String),
}

/// A certificate and its private key, PEM. `Debug` shows the certificate only.
#[derive(Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pair")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a certificate says, as far as the renewal decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    pub dns_names: Vec<String>,
    pub is_ca: bool,
}

fn make(e: impl fmt::Display) -> CertError {
    CertError::Make(e.to_string())
}

fn at(unix: i64) -> Result<OffsetDateTime, CertError> {
    OffsetDateTime::from_unix_timestamp(unix).map_err(make)
}

/// A new CA for `namespace`, valid from `now` for [`CA_DAYS`].
pub fn make_ca(namespace: &str, now: i64) -> Result<Pair, CertError> {
    let key = KeyPair::generate().map_err(make)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "dlock");
    dn.push(DnType::CommonName, format!("dlock CA {namespace}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = at(now - BACKDATE)?;
    params.not_after = at(now + CA_DAYS * DAY)?;
    let cert = params.self_signed(&key).map_err(make)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A server certificate for `dns_names`, signed by `ca`, valid from `now` for [`LEAF_DAYS`] (never
/// beyond the CA's own end).
pub fn issue(ca: &Pair, dns_names: &[String], now: i64) -> Result<Pair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(make)?;
    let ca_end = facts(&ca.cert_pem)?.not_after;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(make)?;
    let key = KeyPair::generate().map_err(make)?;
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(make)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, dns_names.first().cloned().unwrap_or_default());
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = at(now - BACKDATE)?;
    params.not_after = at((now + LEAF_DAYS * DAY).min(ca_end))?;
    let cert = params.signed_by(&key, &issuer).map_err(make)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The dates, names and CA flag of a PEM certificate (the first one in `pem`).
pub fn facts(pem: &str) -> Result<Facts, CertError> {
    let (_, pem) = parse_x509_pem(pem.as_bytes()).map_err(|e| CertError::Parse(e.to_string()))?;
    let cert = pem.parse_x509().map_err(|e| CertError::Parse(e.to_string()))?;
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Facts {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        dns_names,
        is_ca: cert.is_ca(),
    })
}

/// `cert_pem`'s signature verifies with `ca_cert_pem`'s key.
pub fn signed_by(cert_pem: &str, ca_cert_pem: &str) -> bool {
    let (Ok((_, leaf)), Ok((_, ca))) = (
        parse_x509_pem(cert_pem.as_bytes()),
        parse_x509_pem(ca_cert_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok(leaf), Ok(ca)) = (leaf.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// The pair's private key is the key of its certificate.
pub fn key_matches(pair: &Pair) -> bool {
    let Ok(key) = KeyPair::from_pem(&pair.key_pem) else {
        return false;
    };
    let Ok((_, pem)) = parse_x509_pem(pair.cert_pem.as_bytes()) else {
        return false;
    };
    pem.parse_x509()
        .is_ok_and(|c| c.public_key().raw == key.subject_public_key_info().as_slice())
}
