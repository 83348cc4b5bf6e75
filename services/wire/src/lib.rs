//! The bodies of every dlock HTTP API, defined once: the servers answer with these types and the
//! clients read them, so the two sides cannot drift apart. Each type also derives its OpenAPI schema
//! (utoipa), with the bounds the services enforce (key patterns, lengths, integer ranges, enums),
//! so that the documents in docs/openapi/ — generated from these types and the handlers — say
//! exactly what is accepted.
//!
//! - [`error`] — the one error body `{code, message, …details}`;
//! - [`lock`] — lock-server (docs/lock-api.md);
//! - [`payment`] — the bodies of payment-resource;
//! - [`rail`] — the bodies of rail-proxy;
//! - [`stub`] — the bodies of rail-stub;
//! - [`pattern`] — the regular expressions the schemas use, each mirroring one validator;
//! - [`shape`] — each text field's schema (lengths and pattern), defined once.

pub mod doc;
pub mod error;
pub mod int;
pub mod lock;
pub mod pattern;
pub mod payment;
pub mod rail;
pub mod shape;
pub mod stub;

pub use error::ErrorBody;
