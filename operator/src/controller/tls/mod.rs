//! HTTPS for the owner's APIs (`spec.tls`), one step of the pipeline for both kinds: the namespace's
//! CA (made once, kept in Secret `dlock-ca`, published to the clients in ConfigMap
//! `dlock-ca-bundle`) and a certificate per served component, renewed [`certs::RENEW_BEFORE_DAYS`]
//! before it expires. [`plan`] decides purely; [`io`] reads and writes; the pods mount the result
//! ([`crate::builders::tls`]).
//!
//! A renewed certificate needs no rollout: the servers re-read their files when the kubelet updates
//! the mounted Secret, and the clients trust the CA, which is unchanged. A new CA (the Secret was
//! deleted) re-issues every certificate and restarts the clients through the bundle's hash.

pub mod certs;
pub mod io;

use std::collections::BTreeMap;

use certs::{CertError, Pair};

use crate::builders::tls::{TlsWiring, dns_names};
use crate::builders::{Owner, short_hash};
use crate::crd::{CertificateStatus, TlsStatus};

/// What the step read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// `spec.tls` asks for HTTPS.
    pub https: bool,
    /// The CA Secret (read only with `https`): `None` absent, `Some(Err)` incomplete.
    pub ca: Option<Result<Pair, String>>,
    /// The bundle ConfigMap's certificate.
    pub bundle: Option<String>,
    /// Each served component's certificate Secret, by Secret name (`None`: absent or incomplete).
    pub leaves: BTreeMap<String, Option<Pair>>,
    /// A valid `dlock.dev/renew-certificates` value, and the last one handled (status).
    pub renew_request: Option<String>,
    pub renew_handled: Option<String>,
}

/// One component that needs a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub component: String,
    pub secret: String,
    pub dns_names: Vec<String>,
}

impl Served {
    pub fn of(owner: &Owner, component: &str) -> Served {
        Served {
            component: component.into(),
            secret: owner.tls_secret(component),
            dns_names: dns_names(owner, component),
        }
    }
}

/// A write the step makes, in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// The namespace has no CA yet: this one is created (only if still absent).
    Ca(Pair),
    /// The bundle does not carry the CA's certificate.
    Bundle(String),
    /// A component's certificate, new or renewed (`why`: what was wrong with the one there),
    /// signed by the plan's CA ([`TlsPlan::ca_pem`], written beside it as `ca.crt`).
    Leaf {
        component: String,
        secret: String,
        pair: Pair,
        why: Option<String>,
    },
}

/// The step's decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsPlan {
    pub writes: Vec<Write>,
    /// The CA's certificate (PEM) every certificate of the plan is checked against and signed by;
    /// `None` on plain HTTP or with a broken CA.
    pub ca_pem: Option<String>,
    pub wiring: TlsWiring,
    pub status: Option<TlsStatus>,
    /// The CA Secret exists but cannot be used: a human decides (deleting it makes a new CA).
    pub broken: Option<String>,
}

fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

const DAY: i64 = 86_400;

/// Why the certificate in `existing` must be replaced, or `None` to keep it.
fn replace_because(existing: Option<&Pair>, served: &Served, ca: &Pair, now: i64) -> Option<String> {
    let Some(pair) = existing else {
        return Some("none yet".into());
    };
    let facts = match certs::facts(&pair.cert_pem) {
        Ok(f) => f,
        Err(e) => return Some(format!("unreadable ({e})")),
    };
    if !certs::key_matches(pair) {
        return Some("its key does not match the certificate".into());
    }
    if !certs::signed_by(&pair.cert_pem, &ca.cert_pem) {
        return Some("signed by another CA".into());
    }
    let mut want = served.dns_names.clone();
    let mut have = facts.dns_names.clone();
    want.sort();
    have.sort();
    if want != have {
        return Some(format!("names {have:?}, not {want:?}"));
    }
    let renew_after = facts.not_after - certs::RENEW_BEFORE_DAYS * DAY;
    (now >= renew_after).then(|| format!("expires {}", rfc3339(facts.not_after)))
}

/// Plans the step: the CA, the bundle, each served component's certificate, and what the pods
/// mount. `served` is empty when the owner serves nothing yet.
pub fn plan(obs: &Observed, served: &[Served], namespace: &str, now: i64) -> Result<TlsPlan, CertError> {
    let bundle_hash = |pem: &str| short_hash(pem.as_bytes());
    if !obs.https {
        // Plain HTTP here; clients of another owner's HTTPS still trust the namespace's CA.
        return Ok(TlsPlan {
            wiring: TlsWiring {
                https: false,
                bundle: obs.bundle.as_deref().map(bundle_hash),
            },
            ..TlsPlan::default()
        });
    }
    let mut writes = Vec::new();
    // The CA and its certificate's facts, read once for the whole plan.
    let (ca, ca_facts) = match &obs.ca {
        None => {
            let ca = certs::make_ca(namespace, now)?;
            let facts = certs::facts(&ca.cert_pem)?;
            writes.push(Write::Ca(ca.clone()));
            (ca, facts)
        }
        Some(Ok(ca)) => {
            let usable = certs::facts(&ca.cert_pem)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    if !f.is_ca {
                        Err("its certificate is not a CA".into())
                    } else if f.not_after <= now {
                        Err(format!("it expired {}", rfc3339(f.not_after)))
                    } else if !certs::key_matches(ca) {
                        Err("its key does not match its certificate".into())
                    } else {
                        Ok(f)
                    }
                });
            match usable {
                Ok(facts) => (ca.clone(), facts),
                Err(why) => return Ok(broken(&why)),
            }
        }
        Some(Err(why)) => return Ok(broken(why)),
    };
    if obs.bundle.as_deref() != Some(ca.cert_pem.as_str()) {
        writes.push(Write::Bundle(ca.cert_pem.clone()));
    }
    // A renew request not handled yet replaces every certificate, whatever its state.
    let renew = obs
        .renew_request
        .as_deref()
        .filter(|r| obs.renew_handled.as_deref() != Some(*r));
    let mut certificates = Vec::new();
    for s in served {
        let existing = obs.leaves.get(&s.secret).and_then(Option::as_ref);
        let why = match renew {
            Some(request) if existing.is_some() => Some(format!("was replaced on request {request:?}")),
            _ => replace_because(existing, s, &ca, now),
        };
        let pair = match (existing, why) {
            (Some(pair), None) => pair.clone(),
            (_, why) => {
                let pair = certs::issue(&ca, &s.dns_names, now)?;
                writes.push(Write::Leaf {
                    component: s.component.clone(),
                    secret: s.secret.clone(),
                    pair: pair.clone(),
                    why: existing.and(why),
                });
                pair
            }
        };
        let not_after = certs::facts(&pair.cert_pem)?.not_after;
        certificates.push(CertificateStatus {
            component: s.component.clone(),
            secret: s.secret.clone(),
            not_after: rfc3339(not_after),
            renew_after: rfc3339(not_after - certs::RENEW_BEFORE_DAYS * DAY),
        });
    }
    Ok(TlsPlan {
        writes,
        wiring: TlsWiring {
            https: true,
            bundle: Some(bundle_hash(&ca.cert_pem)),
        },
        status: Some(TlsStatus {
            ca_not_after: Some(rfc3339(ca_facts.not_after)),
            certificates,
            // Handled once this plan's writes are made; status is written after them.
            last_handled_renew_request: obs.renew_request.clone().or_else(|| obs.renew_handled.clone()),
        }),
        ca_pem: Some(ca.cert_pem),
        broken: None,
    })
}

fn broken(why: &str) -> TlsPlan {
    TlsPlan {
        broken: Some(format!(
            "Secret {} cannot be used as the namespace's CA: {why}. Restore it, or delete it to have \
             the operator make a new CA (every certificate is then re-issued and the clients restarted)",
            crate::builders::tls::CA_SECRET
        )),
        ..TlsPlan::default()
    }
}

#[cfg(test)]
mod tests;
