//! What a dlock server and its clients must agree on, defined once and nothing else: the fencing
//! token, the header names, the validators of lock keys, owner ids and TTLs, and the bodies of
//! every HTTP API. The servers answer with these types and the clients read them, so the two sides
//! cannot drift apart. No server dependency comes with it: a client depends on this crate and
//! `dlock-client`, not on axum or sqlx.
//!
//! With the `openapi` feature each type also derives its OpenAPI schema (utoipa), with the bounds
//! the services enforce (key patterns, lengths, integer ranges, enums), so that the documents in
//! docs/openapi/ — generated from these types and the handlers — say exactly what is accepted.
//!
//! - [`token`] — [`FencingToken`], strictly parsed (never coerced to 0), and `X-Fencing-Token`;
//! - [`validate`] — the bounds on lock keys, owner ids and TTLs;
//! - [`fencing`] — the details of a `FENCED_OUT` refusal;
//! - [`payout`] — the payout state machine both sides share;
//! - [`error`] — the one error body `{code, message, …details}`;
//! - [`lock`] — lock-server (docs/lock-api.md);
//! - [`payment`] — the bodies of payment-resource;
//! - [`rail`] — the bodies of rail-proxy;
//! - [`stub`] — the bodies of rail-stub;
//! - [`int`] — integers as the APIs read them (a JSON integer or its decimal text);
//! - [`pattern`] — the regular expressions the schemas use, each mirroring one validator;
//! - `shape` and `doc` (feature `openapi`) — each text field's schema, defined once, and the
//!   documents' shared parts.

#[cfg(feature = "openapi")]
pub mod doc;
pub mod error;
pub mod fencing;
pub mod int;
pub mod lock;
pub mod pattern;
pub mod payment;
pub mod payout;
pub mod rail;
#[cfg(feature = "openapi")]
pub mod shape;
pub mod stub;
pub mod token;
pub mod validate;

pub use error::ErrorBody;
pub use token::{FENCING_TOKEN_HEADER, FencingToken, TokenError};

/// The header that carries the signed grant of the presented token (lock-server's `LockGrant.grant`)
/// to a protected resource; a resource that verifies grants accepts a token only inside one.
pub const FENCING_GRANT_HEADER: &str = "X-Fencing-Grant";
