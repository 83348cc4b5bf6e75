//! The rail as rail-proxy sees it: one forward per attempt, and a lookup for ambiguous ones.
//!
//! Only a clear `200 ACKED` or `422 REJECTED` is an answer. Everything else — our timeout, a
//! connection error, a 5xx, a 504, an unexpected status or body — may or may not have moved money,
//! so it is recorded as TIMEOUT (ambiguous) and resolved later by asking, never by resubmitting.

use dlock_wire::stub::PaymentOrder;
use std::path::Path;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;

use crate::config::ConfigError;
use crate::sql::Payout;

#[derive(Debug, Clone)]
pub struct Rail {
    client: reqwest::Client,
    payments: Url,
    /// The bound on one forward (the client's whole-request timeout).
    timeout: Duration,
}

/// What one forward produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forwarded {
    Acked { rail_reference: String },
    Rejected { reason: String },
    Ambiguous { detail: String },
}

/// What asking the rail about an idempotency key produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Acked {
        rail_reference: String,
    },
    Rejected {
        reason: String,
    },
    /// The rail has no record of the key (yet): still unknown, nothing to record.
    Unknown,
    /// We could not get an answer at all.
    Unavailable {
        detail: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RailAnswer {
    status: String,
    rail_reference: Option<String>,
    reason: Option<String>,
}

impl RailAnswer {
    fn acked_reference(&self) -> Option<String> {
        (self.status == "ACKED")
            .then(|| self.rail_reference.clone())
            .flatten()
    }

    fn rejected_reason(&self) -> Option<String> {
        (self.status == "REJECTED").then(|| self.reason.clone().unwrap_or_default())
    }
}

impl Rail {
    /// A rail client that trusts the public roots (an `https://` rail is a payment provider with a
    /// public certificate unless a CA is given).
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, ConfigError> {
        Self::with_ca(base_url, timeout, None)
    }

    /// A rail client that trusts only the CA certificates (PEM) in `ca`; without one, the public
    /// roots (Mozilla's, as the webpki-roots crate carries them).
    pub fn with_ca(base_url: &str, timeout: Duration, ca: Option<&Path>) -> Result<Self, ConfigError> {
        let bad = || ConfigError::RailUrl(base_url.to_owned());
        let mut payments = Url::parse(base_url).map_err(|_| bad())?;
        if !matches!(payments.scheme(), "http" | "https") {
            return Err(bad());
        }
        payments
            .path_segments_mut()
            .map_err(|_| bad())?
            .pop_if_empty()
            .extend(["v1", "payments"]);
        let mut client = reqwest::Client::builder().timeout(timeout).use_rustls_tls();
        if let Some(path) = ca {
            // Only the CA given: a private rail's certificate is never checked against public roots.
            client = client.tls_built_in_root_certs(false);
            for cert in root_certificates(path)? {
                client = client.add_root_certificate(cert);
            }
        }
        let client = client.build().map_err(|_| bad())?;
        Ok(Self {
            client,
            payments,
            timeout,
        })
    }

    /// How long one forward can take at most: it has ended, one way or the other, by then.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Forwards the payout once. Never retried: a retry is a second submission.
    pub async fn forward(&self, payout: &Payout) -> Forwarded {
        // The rail's own body (dlock_wire::stub), the one the stub reads.
        let order = PaymentOrder {
            idempotency_key: payout.idempotency_key.clone(),
            payout_id: payout.payout_id.to_string(),
            account_id: payout.account_id.to_string(),
            amount_minor: payout.amount_minor.into(),
            currency: payout.currency.trim_end().to_owned(),
        };
        let response = match self.client.post(self.payments.clone()).json(&order).send().await {
            Ok(r) => r,
            Err(e) => {
                return Forwarded::Ambiguous { detail: describe(&e) };
            }
        };
        let status = response.status();
        let answer = response.json::<RailAnswer>().await.ok();
        let acked = answer.as_ref().and_then(RailAnswer::acked_reference);
        let rejected = answer.as_ref().and_then(RailAnswer::rejected_reason);
        match (status, acked, rejected) {
            (StatusCode::OK, Some(rail_reference), _) => Forwarded::Acked { rail_reference },
            (StatusCode::UNPROCESSABLE_ENTITY, _, Some(reason)) => Forwarded::Rejected { reason },
            (status, _, _) => Forwarded::Ambiguous {
                detail: format!("rail answered {status}"),
            },
        }
    }

    /// Asks the rail what became of an idempotency key. Never submits.
    pub async fn lookup(&self, idempotency_key: &str) -> Lookup {
        let mut url = self.payments.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.push(idempotency_key);
        }
        let response = match self.client.get(url).send().await {
            Ok(r) => r,
            Err(e) => {
                return Lookup::Unavailable { detail: describe(&e) };
            }
        };
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Lookup::Unknown;
        }
        match (status, response.json::<RailAnswer>().await.ok()) {
            (StatusCode::OK, Some(a)) => match (a.acked_reference(), a.rejected_reason()) {
                (Some(rail_reference), _) => Lookup::Acked { rail_reference },
                (None, Some(reason)) => Lookup::Rejected { reason },
                (None, None) => Lookup::Unavailable {
                    detail: format!("rail reported status {:?}", a.status),
                },
            },
            (status, _) => Lookup::Unavailable {
                detail: format!("rail answered {status}"),
            },
        }
    }
}

/// The CA certificates of the PEM file at `path`, each problem naming the file.
fn root_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, ConfigError> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| ConfigError::RailCa(format!("cannot read {shown}: {e}")))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| ConfigError::RailCa(format!("{shown} is not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(ConfigError::RailCa(format!(
            "{shown} holds no -----BEGIN CERTIFICATE----- block"
        )));
    }
    Ok(certs)
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer within the rail timeout".to_owned()
    } else if e.is_connect() {
        format!("cannot connect to the rail: {}", chain(e))
    } else {
        format!("rail request failed: {}", chain(e))
    }
}

/// The error and its causes: reqwest's own message ("error sending request") hides why, e.g. that
/// the rail's certificate was refused.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payments_url_is_appended_to_the_base_path() {
        let t = Duration::from_secs(1);
        for (base, want) in [
            ("http://rail:8090", "http://rail:8090/v1/payments"),
            ("http://rail:8090/", "http://rail:8090/v1/payments"),
            ("https://rail/prefix", "https://rail/prefix/v1/payments"),
            ("https://rail/prefix/", "https://rail/prefix/v1/payments"),
        ] {
            let rail = Rail::new(base, t).expect(base);
            assert_eq!(rail.payments.as_str(), want);
        }
        for bad in [
            "",
            "rail:8090",
            "ftp://rail",
            "mailto:ops@example.com",
            "not a url",
        ] {
            assert!(Rail::new(bad, t).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_clear_answer_is_an_answer() {
        let acked = RailAnswer {
            status: "ACKED".into(),
            rail_reference: Some("r1".into()),
            reason: None,
        };
        assert_eq!(acked.acked_reference().as_deref(), Some("r1"));
        assert_eq!(acked.rejected_reason(), None);
        let acked_without_reference = RailAnswer {
            status: "ACKED".into(),
            rail_reference: None,
            reason: None,
        };
        assert_eq!(acked_without_reference.acked_reference(), None);
        let other = RailAnswer {
            status: "PENDING".into(),
            rail_reference: Some("r2".into()),
            reason: Some("x".into()),
        };
        assert_eq!((other.acked_reference(), other.rejected_reason()), (None, None));
    }
}
