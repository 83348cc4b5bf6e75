//! Every HTTP call to lock-server, and nothing else: one method per route of the lock API
//! (docs/lock-api.md) over the wire types of `dlock_wire::lock` (the ones the server answers with),
//! and the mapping of each route's error answers.
//!
//! The methods are single attempts with no state: [`crate::Session`] and [`crate::LockHandle`]
//! build heartbeats, bounded waits and renewal on top of them. They are public for tools and tests
//! that need the raw calls.

use std::path::PathBuf;
use std::time::Duration;

use dlock_wire::lock::{AcquireRequest, CreateSessionRequest, TtlRequest};
pub use dlock_wire::lock::{
    LockEvent, LockEventType, LockGrant, LockList, LockListItem, LockReleased, LockRenewed, LockState,
    LockView, SessionClosed, SessionCreated, SessionHeartbeat,
};
use dlock_wire::{FENCING_TOKEN_HEADER, FencingToken};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::{ClientError, LossReason, error_from_body};

/// Timeouts of the underlying HTTP client, and the lock client's token.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Upper bound for any one request, start to end of body. Renewals and heartbeats are further
    /// bounded by their lease's own deadline.
    pub request_timeout: Duration,
    /// The lock client's bearer token, sent on every call (`Authorization: Bearer`), when
    /// lock-server has a clients file (docs/lock-api.md "Authentication"). `None`: no header.
    pub token: Option<BearerToken>,
    /// The CA that signs lock-server's certificate (PEM): the only root this client trusts.
    /// Needed for an `https://` URL (without it [`LockApi::new`] refuses with `CA_REQUIRED`);
    /// unused for `http://`.
    pub ca: Option<CaCerts>,
    /// For negative controls only: accept any server certificate (no CA, name or date check), so
    /// that a test can show its refusals come from the verification. Never set it elsewhere.
    pub unsafe_accept_any_certificate: bool,
    /// Connect here, whatever the URL's host resolves to (a port-forward to lock-server's
    /// Service): the certificate is still checked for the URL's host. `None`: DNS.
    pub connect_to: Option<std::net::SocketAddr>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            token: None,
            ca: None,
            unsafe_accept_any_certificate: false,
            connect_to: None,
        }
    }
}

/// Where the trusted CA certificates come from (PEM, one or more `CERTIFICATE` blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaCerts {
    /// A file, read when the client is built.
    File(PathBuf),
    /// The PEM text itself.
    Pem(Vec<u8>),
}

impl ClientConfig {
    /// Presents `token` (read from a file or the environment, never a command-line flag) on every
    /// call.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(BearerToken(token.into()));
        self
    }

    /// Trusts only the CA certificates in the PEM file at `path` for an `https://` lock-server.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(CaCerts::File(path.into()));
        self
    }

    /// Trusts only the CA certificates in `pem` for an `https://` lock-server.
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(CaCerts::Pem(pem.into()));
        self
    }

    /// Connects to `addr` for the URL's host (e.g. `https://locks-lock-server.shop.svc:41234`
    /// through a port-forward on 127.0.0.1:41234), still verifying the certificate for that host.
    pub fn with_connect_to(mut self, addr: std::net::SocketAddr) -> Self {
        self.connect_to = Some(addr);
        self
    }
}

/// The roots of the `reqwest` client: the CA certificates of `ca`, each named in its error.
fn root_certificates(ca: &CaCerts) -> Result<Vec<reqwest::Certificate>, ClientError> {
    let (pem, source) = match ca {
        CaCerts::File(path) => (
            std::fs::read(path).map_err(|e| ClientError::InvalidArgument {
                code: "INVALID_CA_FILE",
                message: format!("cannot read the CA file {}: {e}", path.display()),
            })?,
            format!("the CA file {}", path.display()),
        ),
        CaCerts::Pem(pem) => (pem.clone(), "the CA PEM".to_owned()),
    };
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ClientError::InvalidArgument {
        code: "INVALID_CA_FILE",
        message: format!("{source} is not PEM certificates: {e}"),
    })?;
    if certs.is_empty() {
        return Err(ClientError::InvalidArgument {
            code: "INVALID_CA_FILE",
            message: format!("{source} holds no -----BEGIN CERTIFICATE----- block"),
        });
    }
    Ok(certs)
}

/// A lock client's bearer token. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// The `Authorization` value of `token`, marked sensitive (HTTP/2 never indexes it, and its
/// `Debug` is `Sensitive`).
fn authorization(token: &BearerToken) -> Result<reqwest::header::HeaderValue, ClientError> {
    // The error must not quote the value: it is a secret.
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.0)).map_err(|_| {
        ClientError::InvalidArgument {
            code: "INVALID_CLIENT_TOKEN",
            message: "the lock client token must be visible ASCII characters".into(),
        }
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// `url` as the base of every call to the service `name` (e.g. `lock-server`): an absolute
/// `http`/`https` URL that can be a base; otherwise `INVALID_BASE_URL`, naming the service. Public:
/// the payout executor checks its resources' URLs with it.
pub fn base_url(name: &str, url: &str) -> Result<Url, ClientError> {
    let base = Url::parse(url).map_err(|e| ClientError::InvalidArgument {
        code: "INVALID_BASE_URL",
        message: format!("{name} URL {url:?} is not a URL: {e}"),
    })?;
    if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
        return Err(ClientError::InvalidArgument {
            code: "INVALID_BASE_URL",
            message: format!("{name} URL {url:?} is not an http(s) base URL"),
        });
    }
    Ok(base)
}

/// The raw lock-server API over one pooled reqwest client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LockApi {
    pub(crate) http: reqwest::Client,
    base: Url,
    request_timeout: Duration,
    /// The lock client's `Authorization`, on every call but the admin's listing.
    auth: Option<reqwest::header::HeaderValue>,
}

impl LockApi {
    /// A client built for `base_url` from `config`: its timeouts, its token, and for `https://`
    /// its CA, the only root it trusts.
    pub fn new(base_url: &str, config: &ClientConfig) -> Result<Self, ClientError> {
        let base = self::base_url("lock-server", base_url)?;
        let mut http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .use_rustls_tls()
            // Only the CA given below: no public roots, whatever features reqwest is built with.
            .tls_built_in_root_certs(false);
        match (&config.ca, base.scheme()) {
            (Some(ca), _) => {
                for cert in root_certificates(ca)? {
                    http = http.add_root_certificate(cert);
                }
            }
            (None, "https") if !config.unsafe_accept_any_certificate => {
                return Err(ClientError::InvalidArgument {
                    code: "CA_REQUIRED",
                    message: format!(
                        "{base_url:?} is https: give the CA that signs lock-server's certificate (a CA file)"
                    ),
                });
            }
            (None, _) => {}
        }
        if config.unsafe_accept_any_certificate {
            http = http.danger_accept_invalid_certs(true);
        }
        if let (Some(addr), Some(host)) = (config.connect_to, base.host_str()) {
            http = http.resolve(host, addr);
        }
        Self::from_parts(base, http.build()?, config)
    }

    /// A client over `http`, a `reqwest::Client` the caller built (a proxy, its own TLS roots or
    /// client certificate, its own connection pool). From `config` it takes the token and the
    /// request timeout (every call carries it, so no call waits longer whatever `http` says); the
    /// CA, `connect_to` and the unsafe switch are settings of the HTTP client, so they are refused
    /// here (`CUSTOM_CLIENT_CONFLICT`) rather than silently ignored: put them on `http`.
    pub fn with_http_client(
        base_url: &str,
        http: reqwest::Client,
        config: &ClientConfig,
    ) -> Result<Self, ClientError> {
        let base = self::base_url("lock-server", base_url)?;
        let conflicts: Vec<&str> = [
            (config.ca.is_some(), "ca"),
            (config.connect_to.is_some(), "connect_to"),
            (
                config.unsafe_accept_any_certificate,
                "unsafe_accept_any_certificate",
            ),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        if !conflicts.is_empty() {
            return Err(ClientError::InvalidArgument {
                code: "CUSTOM_CLIENT_CONFLICT",
                message: format!(
                    "{} configure the HTTP client; with a custom reqwest::Client set them on that client",
                    conflicts.join(", ")
                ),
            });
        }
        Self::from_parts(base, http, config)
    }

    fn from_parts(base: Url, http: reqwest::Client, config: &ClientConfig) -> Result<Self, ClientError> {
        Ok(Self {
            http,
            base,
            request_timeout: config.request_timeout,
            auth: config.token.as_ref().map(authorization).transpose()?,
        })
    }

    /// A call to lock-server: the configured timeout (a call may set a longer one after) and the
    /// lock client's token.
    pub(crate) fn request(&self, method: reqwest::Method, url: Url) -> reqwest::RequestBuilder {
        let request = self.http.request(method, url).timeout(self.request_timeout);
        match &self.auth {
            Some(auth) => request.header(reqwest::header::AUTHORIZATION, auth.clone()),
            None => request,
        }
    }

    /// `base` + the given path segments, each percent-encoded (a `/` in a key becomes `%2F`).
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // `new` checked that the base can be a base, so this branch always runs.
            path.pop_if_empty().extend(segments);
        }
        url
    }

    pub async fn open_session(&self, owner_id: &str, ttl_ms: i64) -> Result<SessionCreated, ClientError> {
        let response = self
            .request(reqwest::Method::POST, self.url(&["v1", "sessions"]))
            .json(&CreateSessionRequest {
                owner_id: owner_id.to_owned(),
                ttl_ms,
            })
            .send()
            .await?;
        read(response).await
    }

    /// 410 `SESSION_GONE` → [`ClientError::SessionGone`].
    pub async fn heartbeat(&self, session_id: Uuid, ttl_ms: i64) -> Result<SessionHeartbeat, ClientError> {
        let response = self
            .request(
                reqwest::Method::POST,
                self.url(&["v1", "sessions", &session_id.to_string(), "heartbeat"]),
            )
            .json(&TtlRequest { ttl_ms })
            .send()
            .await?;
        read(response).await.map_err(session_gone)
    }

    pub async fn close_session(&self, session_id: Uuid) -> Result<SessionClosed, ClientError> {
        let response = self
            .request(
                reqwest::Method::DELETE,
                self.url(&["v1", "sessions", &session_id.to_string()]),
            )
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
            .request(reqwest::Method::POST, self.url(&["v1", "locks", key, "acquire"]))
            .json(&AcquireRequest {
                session_id,
                owner_id: owner_id.to_owned(),
                ttl_ms,
                wait_ms: None,
            })
            .send()
            .await?;
        read(response).await.map_err(|e| acquire_error(key, e))
    }

    /// The blocking acquire: waits in the key's queue (granted in arrival order) for up to
    /// `wait_ms` (0..=60000). When the wait ends ungranted: [`ClientError::Contended`]. This one
    /// request may take the whole wait, so its timeout is the wait plus the configured one.
    pub async fn acquire_waiting(
        &self,
        key: &str,
        session_id: Uuid,
        owner_id: &str,
        ttl_ms: i64,
        wait_ms: i64,
    ) -> Result<LockGrant, ClientError> {
        let response = self
            .request(reqwest::Method::POST, self.url(&["v1", "locks", key, "acquire"]))
            .timeout(Duration::from_millis(wait_ms.unsigned_abs()) + self.request_timeout)
            .json(&AcquireRequest {
                session_id,
                owner_id: owner_id.to_owned(),
                ttl_ms,
                wait_ms: Some(wait_ms),
            })
            .send()
            .await?;
        read(response).await.map_err(|e| acquire_error(key, e))
    }

    /// `GET /v1/locks` (admin): one page of held keys starting with `prefix`, after the cursor
    /// `after`, with the admin bearer token `admin_token`.
    pub async fn list_locks(
        &self,
        admin_token: &str,
        prefix: &str,
        after: Option<&str>,
        limit: i64,
    ) -> Result<LockList, ClientError> {
        let mut url = self.url(&["v1", "locks"]);
        {
            let mut q = url.query_pairs_mut();
            if !prefix.is_empty() {
                q.append_pair("prefix", prefix);
            }
            if let Some(a) = after {
                q.append_pair("after", a);
            }
            q.append_pair("limit", &limit.to_string());
        }
        // The admin's token instead of the client's (not through `request`, which adds the client's).
        let response = self
            .http
            .get(url)
            .timeout(self.request_timeout)
            .bearer_auth(admin_token)
            .send()
            .await?;
        read(response).await
    }

    /// 410 `LEASE_EXPIRED` → [`ClientError::LockLost`] with [`LossReason::LeaseExpired`].
    pub async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        ttl_ms: i64,
    ) -> Result<LockRenewed, ClientError> {
        let response = self
            .request(reqwest::Method::POST, self.url(&["v1", "locks", key, "renew"]))
            .header(FENCING_TOKEN_HEADER, token.to_string())
            .json(&TtlRequest { ttl_ms })
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

    pub async fn release(&self, key: &str, token: FencingToken) -> Result<LockReleased, ClientError> {
        let response = self
            .request(reqwest::Method::POST, self.url(&["v1", "locks", key, "release"]))
            .header(FENCING_TOKEN_HEADER, token.to_string())
            .send()
            .await?;
        read(response).await
    }

    pub async fn lock_status(&self, key: &str) -> Result<LockView, ClientError> {
        let response = self
            .request(reqwest::Method::GET, self.url(&["v1", "locks", key]))
            .send()
            .await?;
        read(response).await
    }
}

/// 409 `CONTENDED` → [`ClientError::Contended`]; 410 `SESSION_GONE` → [`ClientError::SessionGone`].
fn acquire_error(key: &str, e: ClientError) -> ClientError {
    match e {
        ClientError::Api { status, code, .. } if status == StatusCode::CONFLICT && code == "CONTENDED" => {
            ClientError::Contended { key: key.to_owned() }
        }
        other => session_gone(other),
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
    fn the_token_is_never_shown() {
        let secret = "client-token-0123456789abcdef0123456789abcdef";
        let config = ClientConfig::default().with_token(secret);
        let api = LockApi::new("http://127.0.0.1:1/", &config).expect("api");
        for text in [format!("{config:?}"), format!("{api:?}")] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(
            matches!(
                LockApi::new("http://127.0.0.1:1/", &ClientConfig::default().with_token("a\nb")),
                Err(ClientError::InvalidArgument {
                    code: "INVALID_CLIENT_TOKEN",
                    ..
                })
            ),
            "a token that cannot be a header value is refused, not sent"
        );
    }

    #[test]
    fn https_needs_a_ca_and_a_bad_ca_is_refused_before_anything_is_sent() {
        let e = LockApi::new("https://127.0.0.1:1/", &ClientConfig::default()).unwrap_err();
        assert!(
            matches!(&e, ClientError::InvalidArgument { code: "CA_REQUIRED", message } if message.contains("https")),
            "{e:?}"
        );
        // Plain http needs none (and a CA given for it is simply unused).
        LockApi::new("http://127.0.0.1:1/", &ClientConfig::default()).expect("http without a CA");

        let missing = std::env::temp_dir().join(format!("dlock-client-no-ca-{}", std::process::id()));
        let e = LockApi::new(
            "https://127.0.0.1:1/",
            &ClientConfig::default().with_ca_file(&missing),
        )
        .unwrap_err();
        assert!(
            matches!(&e, ClientError::InvalidArgument { code: "INVALID_CA_FILE", message }
                if message.contains(&missing.display().to_string())),
            "{e:?}"
        );
        let e = LockApi::new(
            "https://127.0.0.1:1/",
            &ClientConfig::default().with_ca_pem(b"not a certificate".to_vec()),
        )
        .unwrap_err();
        assert!(
            matches!(
                &e,
                ClientError::InvalidArgument {
                    code: "INVALID_CA_FILE",
                    ..
                }
            ),
            "{e:?}"
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
