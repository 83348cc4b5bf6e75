//! Client library for lock-server (docs/lock-api.md): sessions that heartbeat, locks that renew in
//! the background and say when they are lost, and the fence every protected write carries.
//!
//! A whole critical section — acquire, a fenced write, loss, release:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use dlock_client::{ClientConfig, ClientError, LockClient, error_from_response};
//!
//! # async fn pay_out() -> Result<(), ClientError> {
//! // The lock client's token from the environment or a file, never a flag; for an https://
//! // lock-server the CA that signs its certificate, and only that CA.
//! let token = std::env::var("DLOCK_CLIENT_TOKEN").unwrap_or_default();
//! let config = ClientConfig::default()
//!     .with_ca_file("/etc/dlock/ca/ca.crt")
//!     .with_token(token);
//! let client = LockClient::with_config("https://locks-lock-server.shop.svc:8080", config)?;
//! let session = client
//!     .open_session("payout-executor-1", Duration::from_secs(10))
//!     .await?;
//!
//! // Acquire: wait up to 2 s for the key; the 5 s lease renews in the background.
//! let lock = session
//!     .acquire("account:42", Duration::from_secs(5), Duration::from_secs(2))
//!     .await?;
//!
//! // The fenced write: the resource itself checks the token (and lock-server's signed grant)
//! // against the highest it has seen, so a holder that lost the lock cannot write after the next.
//! let resource = dlock_client::reqwest::Client::new();
//! let write = async {
//!     lock.ensure_held()?; // right before each write
//!     let request = resource
//!         .post("https://ledger.shop.svc/v1/accounts/42/debits")
//!         .json(&serde_json::json!({ "amountMinor": 100, "currency": "EUR" }));
//!     let response = lock.fence().apply(request).send().await?;
//!     if !response.status().is_success() {
//!         // A 409 FENCED_OUT is ClientError::FencedOut: a newer holder wrote. Terminal.
//!         return Err(error_from_response(response).await);
//!     }
//!     Ok(())
//! };
//! tokio::select! {
//!     // Loss: no renewal confirmed in time (or the session went). Stop at once; the next
//!     // holder's token fences out anything this one still sends.
//!     reason = lock.lost() => return Err(lock.lock_lost(reason)),
//!     written = write => written?,
//! }
//!
//! // Release at once rather than letting the lease lapse; Stale means it was not ours any more.
//! lock.release().await?;
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! A caller with its own `reqwest::Client` (a proxy, a client certificate, its own pool) passes it
//! to [`LockClient::with_http_client`]; the token and the request timeout still come from
//! [`ClientConfig`].
//!
//! With a clients file, lock-server wants a lock client's bearer token on every call:
//! `LockClient::with_config(url, ClientConfig::default().with_token(token))` (read the token from a
//! file or the environment; `Debug` never shows it).
//!
//! An `https://` lock-server is verified against a CA the caller names, and only that CA:
//! `ClientConfig::default().with_ca_file(path)` (or [`ClientConfig::with_ca_pem`]). An `https://`
//! URL without one is refused when the client is built (`CA_REQUIRED`) rather than trusting a
//! public root set: lock-servers carry certificates of a private CA. A refused certificate is
//! [`ClientError::Certificate`], saying which problem (unknown CA, wrong name, expired) and where.
//!
//! Modules, one job each:
//! - [`api`]: every HTTP call to lock-server (single attempts, wire types);
//! - [`error`]: [`ClientError`], and reading a 409 `FENCED_OUT` from any protected resource;
//! - `session` / `handle`: [`Session`] (heartbeats) and [`LockHandle`] (renewal, loss, release);
//! - `liveness` / `keepalive`: the local deadline arithmetic and the background loop both share;
//! - [`watch`]: a key's changes as a stream, and a handle's watch of its own grant
//!   ([`LockHandle::watch_grant`]).
//!
//! [`ClientError::LockLost`] and [`ClientError::FencedOut`] are terminal: nothing here retries
//! them, and a caller must abandon the critical section that got one.

pub mod api;
pub mod error;
mod handle;
mod keepalive;
mod liveness;
mod session;
pub mod watch;

use std::time::Duration;

pub use api::{
    BearerToken, CaCerts, ClientConfig, LockApi, LockEvent, LockEventType, LockGrant, LockList, LockListItem,
    LockState, LockView,
};
pub use dlock_wire::FencingToken;
pub use dlock_wire::fencing::FencedOutDetails;
pub use error::{
    CertificateProblem, ClientError, FencedOut, LossReason, error_from_body, error_from_response,
    fenced_out_from_body,
};
pub use handle::{Fence, LockHandle, ReleaseOutcome};
pub use session::Session;
pub use watch::{LockWatch, WatchItem};
/// The crates this API exposes, so that a caller uses the same versions.
pub use {dlock_wire, reqwest};

/// The entry point: one per process, cheap to clone.
#[derive(Debug, Clone)]
pub struct LockClient {
    api: LockApi,
}

impl LockClient {
    /// A client for the lock-server at `base_url` (e.g. `http://lock-server:8080`), with a 2 s
    /// connect timeout and a 5 s per-request timeout.
    pub fn new(base_url: &str) -> Result<Self, ClientError> {
        Self::with_config(base_url, ClientConfig::default())
    }

    pub fn with_config(base_url: &str, config: ClientConfig) -> Result<Self, ClientError> {
        Ok(Self {
            api: LockApi::new(base_url, &config)?,
        })
    }

    /// A client over a `reqwest::Client` the caller built (its proxy, TLS roots, client
    /// certificate, pool); `config` gives the token and the request timeout
    /// ([`LockApi::with_http_client`]).
    pub fn with_http_client(
        base_url: &str,
        http: reqwest::Client,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            api: LockApi::with_http_client(base_url, http, &config)?,
        })
    }

    /// Opens a session for `owner_id` that heartbeats every `session_ttl / 3` until closed,
    /// dropped, or lost. TTLs are whole milliseconds, 10 ms to one day.
    pub async fn open_session(&self, owner_id: &str, session_ttl: Duration) -> Result<Session, ClientError> {
        Session::open(self.api.clone(), owner_id, session_ttl).await
    }

    /// `GET /v1/locks/{key}`: who holds `key`, as the server sees it now.
    pub async fn lock_status(&self, key: &str) -> Result<LockView, ClientError> {
        dlock_wire::validate::lock_key(key).map_err(ClientError::invalid)?;
        self.api.lock_status(key).await
    }

    /// Watches `key`: its state, then each change of its holder, until the server ends the stream
    /// (then watch again: a new stream starts from the state).
    pub async fn watch(&self, key: &str) -> Result<LockWatch, ClientError> {
        dlock_wire::validate::lock_key(key).map_err(ClientError::invalid)?;
        self.api.watch(key, watch::MAX_STREAM).await
    }

    /// The raw single-attempt calls.
    pub fn api(&self) -> &LockApi {
        &self.api
    }
}
