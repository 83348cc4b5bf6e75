//! HTTPS for the owner's APIs (`spec.tls`), one step of the pipeline for both kinds: the namespace's
//! CA (made once, kept in Secret `dlock-ca`, published to the clients in ConfigMap
//! `dlock-ca-bundle`) and a certificate per served component, renewed [`certs::RENEW_BEFORE_DAYS`]
//! before it expires. [`plan`] decides purely; [`io`] reads and writes; the pods mount the result
//! ([`crate::builders::tls`]).
//!
//! A renewed certificate needs no rollout: the servers re-read their files when the kubelet updates
//! the mounted Secret, and the clients trust the CA, which is unchanged. A new CA (the Secret was
//! deleted) re-issues every certificate and restarts the clients through the bundle's hash.
//!
//! **The CA's own rotation** is clients first, servers after, as the grant keys' is: a year before
//! the CA ends a successor is made (kept beside it in `dlock-ca`, keys `next.crt`/`next.key`) and
//! published with it in the bundle, which rolls every client; once every Deployment of the
//! namespace that mounts the bundle runs with both and the overlap (`--ca-overlap-secs`, for the
//! clients outside the cluster that copied the bundle) has passed, each object's certificates are
//! re-issued by the new CA; once every object of the namespace reports its certificates signed by
//! it (`status.tls.signedBy`), the new CA replaces the old one and the bundle holds it alone. No
//! server ever presents a certificate a running client does not trust.

pub mod certs;
pub mod io;

use std::collections::BTreeMap;

use certs::{CertError, Pair};

use crate::builders::tls::{TlsWiring, dns_names};
use crate::builders::{Owner, short_hash};
use crate::crd::{CaRotationStatus, CertificateStatus, TlsStatus};

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
    /// The CA's successor, kept in the CA Secret during a rotation: `None` absent, `Some(Err)`
    /// incomplete.
    pub next: Option<Result<Pair, String>>,
    /// The CA Secret's resourceVersion: its rotation writes are made against it, so two reconciles
    /// never make two successors.
    pub ca_version: Option<String>,
    /// During a rotation: each Deployment of the namespace that mounts the bundle.
    pub clients: Vec<Client>,
    /// During a rotation: every other object of the namespace that serves HTTPS, with the
    /// `status.tls.signedBy` it reports.
    pub peers: Vec<Peer>,
    /// How long the successor is trusted before anything is signed by it (seconds).
    pub ca_overlap: i64,
}

/// A Deployment that trusts the bundle: the bundle hash in its pod template, and whether every
/// replica runs that template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub name: String,
    pub bundle: String,
    pub rolled_out: bool,
}

/// Another object of the namespace that serves HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// `Kind/name`.
    pub name: String,
    pub signed_by: Option<String>,
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
    /// The CA is due for rotation: its successor, added to the CA Secret (only if the Secret is
    /// still at `version`).
    NextCa { pair: Pair, version: String },
    /// Every certificate of the namespace is signed by the successor: it becomes the CA (only if
    /// the Secret is still at `version`).
    PromoteNext { pair: Pair, version: String },
    /// The bundle does not carry the CA's certificate (and its successor's, during a rotation).
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
    /// The CA certificate (PEM) that signs the plan's certificates (the successor's once a
    /// rotation moves them); `None` on plain HTTP or with a broken CA.
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

/// Why the certificate in `existing` must be replaced, or `None` to keep it. `accepted`: the CAs a
/// certificate may be signed by (two while a rotation has not moved the certificates yet);
/// `replaced`: the CA a rotation moves them away from.
fn replace_because(
    existing: Option<&Pair>,
    served: &Served,
    issuer: &Pair,
    accepted: &[&Pair],
    replaced: Option<&Pair>,
    now: i64,
) -> Option<String> {
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
    if !accepted
        .iter()
        .any(|ca| certs::signed_by(&pair.cert_pem, &ca.cert_pem))
    {
        return Some(
            if replaced.is_some_and(|old| certs::signed_by(&pair.cert_pem, &old.cert_pem)) {
                "was signed by the CA being replaced".into()
            } else {
                "signed by another CA".into()
            },
        );
    }
    let mut want = served.dns_names.clone();
    let mut have = facts.dns_names.clone();
    want.sort();
    have.sort();
    if want != have {
        return Some(format!("names {have:?}, not {want:?}"));
    }
    let renew_after = facts.not_after - certs::RENEW_BEFORE_DAYS * DAY;
    // A certificate cut short by its CA's end is renewed only when a new one would end later
    // (else every reconcile of the CA's last month would issue one).
    let would_end = certs::facts(&issuer.cert_pem)
        .map(|ca| (now + certs::LEAF_DAYS * DAY).min(ca.not_after))
        .unwrap_or(i64::MAX);
    (now >= renew_after && would_end > facts.not_after)
        .then(|| format!("expires {}", rfc3339(facts.not_after)))
}

/// Why `ca` cannot sign, or its facts.
fn usable(ca: &Pair, now: i64) -> Result<certs::Facts, String> {
    let f = certs::facts(&ca.cert_pem).map_err(|e| e.to_string())?;
    if !f.is_ca {
        Err("its certificate is not a CA".into())
    } else if f.not_after <= now {
        Err(format!("it expired {}", rfc3339(f.not_after)))
    } else if !certs::key_matches(ca) {
        Err("its key does not match its certificate".into())
    } else {
        Ok(f)
    }
}

/// The bundle's text: the CA's certificate, and its successor's during a rotation.
pub fn bundle_text(ca: &Pair, next: Option<&Pair>) -> String {
    let mut text = ca.cert_pem.clone();
    if let Some(next) = next {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&next.cert_pem);
    }
    text
}

/// Where a rotation stands, decided from what was observed.
struct Rotation {
    next: Pair,
    next_facts: certs::Facts,
    /// Certificates are signed by the successor from now on.
    moving: bool,
    waiting_for: Option<String>,
}

fn rotation(
    obs: &Observed,
    next: Pair,
    next_facts: certs::Facts,
    bundle_hash: &str,
    published: bool,
    now: i64,
) -> Rotation {
    let lagging: Vec<&str> = obs
        .clients
        .iter()
        .filter(|c| c.bundle != bundle_hash || !c.rolled_out)
        .map(|c| c.name.as_str())
        .collect();
    let move_after = next_facts.not_before + certs::BACKDATE + obs.ca_overlap;
    let waiting_for = if !published {
        Some("the bundle with both CAs to be published".to_owned())
    } else if !lagging.is_empty() {
        Some(format!(
            "Deployments {} to roll out with the bundle that has both CAs",
            lagging.join(", ")
        ))
    } else if now < move_after {
        Some(format!(
            "the overlap to pass ({}): clients outside the cluster fetch the bundle meanwhile",
            rfc3339(move_after)
        ))
    } else {
        None
    };
    Rotation {
        moving: waiting_for.is_none(),
        next,
        next_facts,
        waiting_for,
    }
}

/// Plans the step: the CA (and its rotation), the bundle, each served component's certificate, and
/// what the pods mount. `served` is empty when the owner serves nothing yet.
pub fn plan(obs: &Observed, served: &[Served], namespace: &str, now: i64) -> Result<TlsPlan, CertError> {
    let hash = |pem: &str| short_hash(pem.as_bytes());
    if !obs.https {
        // Plain HTTP here; clients of another owner's HTTPS still trust the namespace's CA.
        return Ok(TlsPlan {
            wiring: TlsWiring {
                https: false,
                bundle: obs.bundle.clone(),
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
        Some(Ok(ca)) => match usable(ca, now) {
            Ok(facts) => (ca.clone(), facts),
            Err(why) => return Ok(broken(&why)),
        },
        Some(Err(why)) => return Ok(broken(why)),
    };
    // The successor: kept, made when the CA is due, or broken (a human decides).
    let next = match (&obs.next, &obs.ca_version) {
        (Some(Ok(next)), _) => match usable(next, now) {
            Ok(facts) => Some((next.clone(), facts)),
            Err(why) => return Ok(broken_next(&why)),
        },
        (Some(Err(why)), _) => return Ok(broken_next(why)),
        (None, Some(version)) if now >= ca_facts.not_after - certs::CA_RENEW_BEFORE_DAYS * DAY => {
            let next = certs::make_ca(namespace, now)?;
            writes.push(Write::NextCa {
                pair: next.clone(),
                version: version.clone(),
            });
            let facts = certs::facts(&next.cert_pem)?;
            Some((next, facts))
        }
        (None, _) => None,
    };
    let bundle = bundle_text(&ca, next.as_ref().map(|(n, _)| n));
    let published = obs.bundle.as_deref() == Some(bundle.as_str());
    if !published {
        writes.push(Write::Bundle(bundle.clone()));
    }
    let rotation = next.map(|(n, f)| rotation(obs, n, f, &hash(&bundle), published, now));
    let (issuer, accepted, replaced): (&Pair, Vec<&Pair>, Option<&Pair>) = match &rotation {
        None => (&ca, vec![&ca], None),
        Some(r) if r.moving => (&r.next, vec![&r.next], Some(&ca)),
        // Both are trusted everywhere already, so a certificate the successor signed (a moment
        // when every client was rolled out) is kept rather than moved back.
        Some(r) => (&ca, vec![&ca, &r.next], None),
    };
    // A renew request not handled yet replaces every certificate, whatever its state.
    let renew = obs
        .renew_request
        .as_deref()
        .filter(|r| obs.renew_handled.as_deref() != Some(*r));
    let mut certificates = Vec::new();
    let mut signers = std::collections::BTreeSet::new();
    for s in served {
        let existing = obs.leaves.get(&s.secret).and_then(Option::as_ref);
        let why = match renew {
            Some(request) if existing.is_some() => Some(format!("was replaced on request {request:?}")),
            _ => replace_because(existing, s, issuer, &accepted, replaced, now),
        };
        let pair = match (existing, why) {
            (Some(pair), None) => pair.clone(),
            (_, why) => {
                let pair = certs::issue(issuer, &s.dns_names, now)?;
                writes.push(Write::Leaf {
                    component: s.component.clone(),
                    secret: s.secret.clone(),
                    pair: pair.clone(),
                    why: existing.and(why),
                });
                pair
            }
        };
        if let Some(ca) = accepted
            .iter()
            .find(|ca| certs::signed_by(&pair.cert_pem, &ca.cert_pem))
        {
            signers.insert(hash(&ca.cert_pem));
        }
        let not_after = certs::facts(&pair.cert_pem)?.not_after;
        certificates.push(CertificateStatus {
            component: s.component.clone(),
            secret: s.secret.clone(),
            not_after: rfc3339(not_after),
            renew_after: rfc3339(not_after - certs::RENEW_BEFORE_DAYS * DAY),
        });
    }
    let signed_by = match signers.len() {
        0 => Some(hash(&issuer.cert_pem)),
        1 => signers.into_iter().next(),
        _ => None,
    };
    let mut ca_not_after = ca_facts.not_after;
    let mut wiring_bundle = bundle;
    let mut ca_rotation = None;
    if let Some(r) = &rotation {
        let next_hash = hash(&r.next.cert_pem);
        let behind: Vec<&str> = obs
            .peers
            .iter()
            .filter(|p| p.signed_by.as_deref() != Some(next_hash.as_str()))
            .map(|p| p.name.as_str())
            .collect();
        match obs.ca_version.clone() {
            // Every certificate of the namespace is the successor's: it becomes the CA, and the
            // bundle drops the old one (the clients roll once more, to trust the new CA alone).
            Some(version)
                if r.moving && signed_by.as_deref() == Some(next_hash.as_str()) && behind.is_empty() =>
            {
                writes.push(Write::PromoteNext {
                    pair: r.next.clone(),
                    version,
                });
                writes.push(Write::Bundle(r.next.cert_pem.clone()));
                wiring_bundle = r.next.cert_pem.clone();
                ca_not_after = r.next_facts.not_after;
            }
            _ => {
                let waiting_for = r.waiting_for.clone().or_else(|| {
                    (!behind.is_empty()).then(|| {
                        format!(
                            "{} to have their certificates signed by the new CA",
                            behind.join(", ")
                        )
                    })
                });
                ca_rotation = Some(CaRotationStatus {
                    phase: if r.moving { "Moving" } else { "Trusting" }.into(),
                    next_ca_not_after: rfc3339(r.next_facts.not_after),
                    waiting_for,
                });
            }
        }
    }
    Ok(TlsPlan {
        writes,
        wiring: TlsWiring {
            https: true,
            bundle: Some(wiring_bundle),
        },
        status: Some(TlsStatus {
            ca_not_after: Some(rfc3339(ca_not_after)),
            certificates,
            // Handled once this plan's writes are made; status is written after them.
            last_handled_renew_request: obs.renew_request.clone().or_else(|| obs.renew_handled.clone()),
            signed_by,
            ca_rotation,
        }),
        ca_pem: Some(issuer.cert_pem.clone()),
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

fn broken_next(why: &str) -> TlsPlan {
    TlsPlan {
        broken: Some(format!(
            "the successor CA in Secret {} (keys next.crt, next.key) cannot be used: {why}. Remove \
             those two keys to have the operator make a new one",
            crate::builders::tls::CA_SECRET
        )),
        ..TlsPlan::default()
    }
}

#[cfg(test)]
mod tests;
