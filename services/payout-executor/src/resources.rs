//! Every HTTP call the executor makes to the two protected resources, and nothing else: one method
//! per route of payment-resource and rail-proxy. Single attempts, no retries; the fence (the token
//! and its signed grant) is always an explicit parameter and travels in `X-Fencing-Token` and
//! `X-Fencing-Grant` ([`Fence::apply`]).
//!
//! Error answers become [`ClientError`] through `dlock_client::error_from_body`, so a 409 `FENCED_OUT`
//! from either resource is the terminal [`ClientError::FencedOut`] with its five details.

use std::path::Path;
use std::time::Duration;

use dlock_client::api::base_url;
use dlock_client::{ClientError, Fence, error_from_body};
use dlock_common::auth::Credential;
use reqwest::Url;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use dlock_wire::payment::{ClaimRequest, TransitionRequest};
use dlock_wire::rail::SubmitRequest;

use crate::model::Payout;
use crate::model::{Claimed, Page, PayoutState, Posted, Submission, SubmissionList, Transitioned};

fn url(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        // `dlock_client::api::base_url` checked that the base can be a base, so this branch always runs.
        path.pop_if_empty().extend(segments);
    }
    url
}

/// A 2xx body as `T`; anything else as a [`ClientError`].
async fn read<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, ClientError> {
    let status = response.status();
    let body = response.bytes().await?;
    if !status.is_success() {
        return Err(error_from_body(status, &body));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ClientError::Protocol(format!("cannot read the {status} answer: {e}")))
}

/// One HTTP client for both resources (pooled connections).
pub fn http_client(request_timeout: Duration) -> Result<reqwest::Client, ClientError> {
    authenticated_client(request_timeout, None, None)
}

/// An HTTP client that presents `credential` as `Authorization: Bearer …` on every request (one per
/// resource: each has its own credential). The header value is marked sensitive. It trusts only the
/// CA certificates of the PEM file `ca` (for https servers), never built-in roots.
pub fn authenticated_client(
    request_timeout: Duration,
    credential: Option<&Credential>,
    ca: Option<&Path>,
) -> Result<reqwest::Client, ClientError> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(c) = credential {
        let value = c.header_value().ok_or_else(|| ClientError::InvalidArgument {
            code: "INVALID_CREDENTIAL",
            message: "the credential cannot be sent as a header".into(),
        })?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(request_timeout)
        .default_headers(headers)
        .use_rustls_tls()
        // Only the CA given: no public roots, whatever features reqwest is built with.
        .tls_built_in_root_certs(false);
    if let Some(path) = ca {
        for cert in root_certificates(path)? {
            builder = builder.add_root_certificate(cert);
        }
    }
    Ok(builder.build()?)
}

/// The CA certificates of the PEM file at `path`; a problem is a configuration error naming the
/// file (the codes of the lock client's own CA file).
fn root_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, ClientError> {
    let invalid = |message: String| ClientError::InvalidArgument {
        code: "INVALID_CA_FILE",
        message,
    };
    let pem = std::fs::read(path)
        .map_err(|e| invalid(format!("cannot read the CA file {}: {e}", path.display())))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        invalid(format!(
            "the CA file {} is not PEM certificates: {e}",
            path.display()
        ))
    })?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "the CA file {} holds no -----BEGIN CERTIFICATE----- block",
            path.display()
        )));
    }
    Ok(certs)
}

/// payment-resource (docs/openapi/payment-resource.yaml).
#[derive(Debug, Clone)]
pub struct PaymentApi {
    http: reqwest::Client,
    base: Url,
}

impl PaymentApi {
    pub fn new(http: reqwest::Client, base_url_text: &str) -> Result<Self, ClientError> {
        Ok(Self {
            http,
            base: base_url("payment-resource", base_url_text)?,
        })
    }

    /// `GET /v1/payouts?state=…&limit=…&after=…` (keyset paging).
    pub async fn list(
        &self,
        state: PayoutState,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page, ClientError> {
        let mut u = url(&self.base, &["v1", "payouts"]);
        {
            let mut q = u.query_pairs_mut();
            q.append_pair("state", state.as_str());
            q.append_pair("limit", &limit.to_string());
            if let Some(after) = after {
                q.append_pair("after", after);
            }
        }
        read(self.http.get(u).send().await?).await
    }

    /// `GET /v1/payouts/{id}`.
    pub async fn get(&self, payout_id: Uuid) -> Result<Payout, ClientError> {
        let u = url(&self.base, &["v1", "payouts", &payout_id.to_string()]);
        read(self.http.get(u).send().await?).await
    }

    /// `POST /v1/payouts/{id}/claim`: PENDING → CLAIMED, or adoption of a payout an older token left
    /// in flight.
    pub async fn claim(
        &self,
        payout_id: Uuid,
        owner_id: &str,
        fence: &Fence,
    ) -> Result<Claimed, ClientError> {
        let u = url(&self.base, &["v1", "payouts", &payout_id.to_string(), "claim"]);
        let request = self.http.post(u).json(&ClaimRequest {
            owner_id: owner_id.to_owned(),
        });
        read(fence.apply(request).send().await?).await
    }

    /// `POST /v1/payouts/{id}/transition`, fenced by `claim_token <= token`.
    pub async fn transition(
        &self,
        payout_id: Uuid,
        from: PayoutState,
        to: PayoutState,
        fence: &Fence,
        reason: Option<&str>,
    ) -> Result<Transitioned, ClientError> {
        let u = url(
            &self.base,
            &["v1", "payouts", &payout_id.to_string(), "transition"],
        );
        let request = self.http.post(u).json(&TransitionRequest {
            from,
            to,
            reason: reason.map(str::to_owned),
        });
        read(fence.apply(request).send().await?).await
    }

    /// `POST /v1/payouts/{id}/post`: (a)(b)(c) in one transaction with `token`.
    pub async fn post(&self, payout_id: Uuid, fence: &Fence) -> Result<Posted, ClientError> {
        let u = url(&self.base, &["v1", "payouts", &payout_id.to_string(), "post"]);
        let request = self.http.post(u);
        read(fence.apply(request).send().await?).await
    }
}

/// rail-proxy (docs/openapi/rail-proxy.yaml).
#[derive(Debug, Clone)]
pub struct RailApi {
    http: reqwest::Client,
    base: Url,
}

impl RailApi {
    pub fn new(http: reqwest::Client, base_url_text: &str) -> Result<Self, ClientError> {
        Ok(Self {
            http,
            base: base_url("rail-proxy", base_url_text)?,
        })
    }

    /// `POST /v1/submissions`: (d), then at most one forward per payout.
    pub async fn submit(&self, payout_id: Uuid, fence: &Fence) -> Result<Submission, ClientError> {
        let u = url(&self.base, &["v1", "submissions"]);
        let request = self.http.post(u).json(&SubmitRequest {
            payout_id: payout_id.to_string(),
        });
        read(fence.apply(request).send().await?).await
    }

    /// `GET /v1/submissions/{payoutId}`: the recorded attempt and any FENCED refusals.
    pub async fn submissions(&self, payout_id: Uuid) -> Result<SubmissionList, ClientError> {
        let u = url(&self.base, &["v1", "submissions", &payout_id.to_string()]);
        read(self.http.get(u).send().await?).await
    }

    /// `POST /v1/submissions/{payoutId}/resolve`: asks the rail what became of an ambiguous attempt.
    /// Never submits.
    pub async fn resolve(&self, payout_id: Uuid, fence: &Fence) -> Result<Submission, ClientError> {
        let u = url(
            &self.base,
            &["v1", "submissions", &payout_id.to_string(), "resolve"],
        );
        let request = self.http.post(u);
        read(fence.apply(request).send().await?).await
    }
}

/// `true` for an error answer with this status and code.
pub fn is_api_error(e: &ClientError, status: u16, code: &str) -> bool {
    matches!(e, ClientError::Api { status: s, code: c, .. } if s.as_u16() == status && c == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_a_path_prefix_and_encode_segments() {
        let http = http_client(Duration::from_secs(1)).unwrap();
        let api = PaymentApi::new(http.clone(), "http://h:1/pay/").unwrap();
        let id = Uuid::nil();
        assert_eq!(
            url(&api.base, &["v1", "payouts", &id.to_string(), "claim"]).as_str(),
            "http://h:1/pay/v1/payouts/00000000-0000-0000-0000-000000000000/claim"
        );
        assert!(RailApi::new(http.clone(), "not a url").is_err());
        assert!(RailApi::new(http, "mailto:a@b").is_err());
    }
}
