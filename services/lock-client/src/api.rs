//! Every HTTP call to lock-server, and nothing else: one method per route of the lock API
//! (docs/lock-api.md), the wire types, and the mapping of each route's error answers.
//!
//! The methods are single attempts with no state: [`crate::Session`] and [`crate::LockHandle`]
//! build heartbeats, bounded waits and renewal on top of them. They are public for tools and tests
//! that need the raw calls.

use std::time::Duration;

use chrono::{DateTime, Utc};
use dlock_common::{FENCING_TOKEN_HEADER, FencingToken};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{ClientError, LossReason, error_from_body};

/// Timeouts of the underlying HTTP client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Upper bound for any one request, start to end of body. Renewals and heartbeats are further
    /// bounded by their lease's own deadline.
    pub request_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// `201` of `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOpened {
    pub session_id: Uuid,
    pub owner_id: String,
    pub expires_at: DateTime<Utc>,
}

/// `200` of `POST /v1/sessions/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub session_id: Uuid,
    pub expires_at: DateTime<Utc>,
}

/// `200` of `DELETE /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionClosed {
    pub session_id: Uuid,
    /// `false` if the session was already gone.
    pub closed: bool,
}

/// `200` of `POST /v1/locks/{key}/acquire`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockGrant {
    pub lock_key: String,
    pub fencing_token: FencingToken,
    pub owner_id: String,
    pub session_id: Uuid,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// `200` of `POST /v1/locks/{key}/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Renewed {
    pub lock_key: String,
    pub fencing_token: FencingToken,
    pub expires_at: DateTime<Utc>,
}

/// `200` of `POST /v1/locks/{key}/release` (a stale release is still a 200).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Released {
    pub lock_key: String,
    pub fencing_token: FencingToken,
    pub released: bool,
    pub stale: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockState {
    Free,
    Held,
    Expired,
}

/// `200` of `GET /v1/locks/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    pub lock_key: String,
    pub state: LockState,
    pub fencing_token: Option<FencingToken>,
    pub owner_id: Option<String>,
    pub acquired_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OpenSessionBody<'a> {
    owner_id: &'a str,
    ttl_ms: i64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TtlBody {
    ttl_ms: i64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AcquireBody<'a> {
    session_id: Uuid,
    owner_id: &'a str,
    ttl_ms: i64,
}

/// The raw lock-server API over one pooled reqwest client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LockApi {
    http: reqwest::Client,
    base: Url,
}

impl LockApi {
    pub fn new(base_url: &str, config: &ClientConfig) -> Result<Self, ClientError> {
        let base = Url::parse(base_url).map_err(|e| ClientError::InvalidArgument {
            code: "INVALID_BASE_URL",
            message: format!("{base_url:?} is not a URL: {e}"),
        })?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(ClientError::InvalidArgument {
                code: "INVALID_BASE_URL",
                message: format!("{base_url:?} is not an http(s) base URL"),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .build()?;
        Ok(Self { http, base })
    }

    /// `base` + the given path segments, each percent-encoded (a `/` in a key becomes `%2F`).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // `new` checked that the base can be a base, so this branch always runs.
            path.pop_if_empty().extend(segments);
        }
        url
    }

    pub async fn open_session(&self, owner_id: &str, ttl_ms: i64) -> Result<SessionOpened, ClientError> {
        let response = self
            .http
            .post(self.url(&["v1", "sessions"]))
            .json(&OpenSessionBody { owner_id, ttl_ms })
            .send()
            .await?;
        read(response).await
    }

    /// 410 `SESSION_GONE` → [`ClientError::SessionGone`].
    pub async fn heartbeat(&self, session_id: Uuid, ttl_ms: i64) -> Result<Heartbeat, ClientError> {
        let response = self
            .http
            .post(self.url(&["v1", "sessions", &session_id.to_string(), "heartbeat"]))
            .json(&TtlBody { ttl_ms })
            .send()
            .await?;
        read(response).await.map_err(session_gone)
    }

    pub async fn close_session(&self, session_id: Uuid) -> Result<SessionClosed, ClientError> {
        let response = self
            .http
            .delete(self.url(&["v1", "sessions", &session_id.to_string()]))
            .send()
            .await?;
        read(response).await
    }

    /// 409 `CONTENDED` → [`ClientError::Contended`]; 410 `SESSION_GONE` → [`ClientError::SessionGone`].
    pub async fn acquire(
        &self,
        key: &str,
        session_id: Uuid,
        owner_id: &str,
        ttl_ms: i64,
    ) -> Result<LockGrant, ClientError> {
        let response = self
            .http
            .post(self.url(&["v1", "locks", key, "acquire"]))
            .json(&AcquireBody {
                session_id,
                owner_id,
                ttl_ms,
            })
            .send()
            .await?;
        read(response).await.map_err(|e| match e {
            ClientError::Api { status, code, .. }
                if status == StatusCode::CONFLICT && code == "CONTENDED" =>
            {
                ClientError::Contended { key: key.to_owned() }
            }
            other => session_gone(other),
        })
    }

    /// 410 `LEASE_EXPIRED` → [`ClientError::LockLost`] with [`LossReason::LeaseExpired`].
    pub async fn renew(&self, key: &str, token: FencingToken, ttl_ms: i64) -> Result<Renewed, ClientError> {
        let response = self
            .http
            .post(self.url(&["v1", "locks", key, "renew"]))
            .header(FENCING_TOKEN_HEADER, token.to_string())
            .json(&TtlBody { ttl_ms })
            .send()
            .await?;
        read(response).await.map_err(|e| match e {
            ClientError::Api { status, code, .. }
                if status == StatusCode::GONE && code == "LEASE_EXPIRED" =>
            {
                ClientError::LockLost {
                    key: key.to_owned(),
                    token,
                    reason: LossReason::LeaseExpired,
                }
            }
            other => other,
        })
    }

    pub async fn release(&self, key: &str, token: FencingToken) -> Result<Released, ClientError> {
        let response = self
            .http
            .post(self.url(&["v1", "locks", key, "release"]))
            .header(FENCING_TOKEN_HEADER, token.to_string())
            .send()
            .await?;
        read(response).await
    }

    pub async fn lock_status(&self, key: &str) -> Result<LockStatus, ClientError> {
        let response = self.http.get(self.url(&["v1", "locks", key])).send().await?;
        read(response).await
    }
}

/// A 2xx body as `T`; anything else through [`error_from_body`].
async fn read<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, ClientError> {
    let status = response.status();
    let body = response.bytes().await?;
    if !status.is_success() {
        return Err(error_from_body(status, &body));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ClientError::Protocol(format!("cannot read the {status} answer: {e}")))
}

fn session_gone(e: ClientError) -> ClientError {
    match e {
        ClientError::Api { status, code, .. } if status == StatusCode::GONE && code == "SESSION_GONE" => {
            ClientError::SessionGone {
                reason: LossReason::SessionGone,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_percent_encoded_as_one_segment() {
        let api = LockApi::new("http://127.0.0.1:1/", &ClientConfig::default()).expect("url");
        let url = api.url(&["v1", "locks", "account:a/b c%", "acquire"]);
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:1/v1/locks/account:a%2Fb%20c%25/acquire"
        );
        // A base with a path prefix keeps it.
        let api = LockApi::new("http://h:1/lock", &ClientConfig::default()).expect("url");
        assert_eq!(
            api.url(&["v1", "sessions"]).as_str(),
            "http://h:1/lock/v1/sessions"
        );
    }

    #[test]
    fn bad_base_urls_are_rejected() {
        for bad in ["", "not a url", "mailto:x@y", "ftp://h/"] {
            assert!(
                matches!(
                    LockApi::new(bad, &ClientConfig::default()),
                    Err(ClientError::InvalidArgument {
                        code: "INVALID_BASE_URL",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }
}
