//! Pieces every dlock service shares. Each module has one job:
//!
//! - [`token`], [`validate`], [`fencing`], [`payout`]: re-exported from `dlock-wire`, where the
//!   clients share them: strict parsing of `X-Fencing-Token` (never coerced to 0), the bounds on
//!   lock keys, owner ids and TTLs, the `FENCED_OUT` details, the payout state machine;
//! - [`error`]: the JSON error body and the extractors that turn bad input into 4xx;
//! - [`telemetry`]: tracing set-up (JSON lines by default);
//! - [`metrics`]: the `/metrics` handler over a prometheus-client registry;
//! - [`serve`]: the server kit — a binary's life ([`serve::main`]: config, signals, start, drain,
//!   [`serve::exit`] codes), health endpoints, serving in the background, in HTTP or HTTPS;
//! - [`tls`]: the certificate and key files of an HTTPS API, checked, and re-read when renewed;
//! - [`db`]: the database pool and its flags, one name for each setting;
//! - [`auth`]: bearer credentials per role, from env or files, redacted in `Debug`;
//! - [`grant`]: signed grants at a resource: `X-Fencing-Grant`, verification, refusal codes.

pub mod auth;
pub mod db;
pub mod error;
pub mod grant;
pub mod memo;
pub mod metrics;
pub mod serve;
pub mod telemetry;
pub mod tls;

pub use dlock_wire::{fencing, payout, token, validate};

pub use error::{ApiError, ApiJson, ApiPath, ApiQuery};
pub use grant::FENCING_GRANT_HEADER;
pub use token::{FENCING_TOKEN_HEADER, FencingToken, TokenError};
