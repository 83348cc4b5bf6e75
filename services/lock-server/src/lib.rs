//! lock-server: the dlock lock service, sole writer of lockdb (C1 §1.1–1.4, §1.7; docs/lock-api.md).
//!
//! - [`sql`]: every lockdb statement, C1's text; [`sql::Statements`] is the swappable safety set;
//! - [`repo`]: one method per statement, zero rows as `None`/`false`, concurrent acquires and
//!   releases batched into one statement per round trip ([`batch`]); [`etcd`]: the same operations
//!   on etcd (`--backend etcd`), concurrent releases in one transaction ([`etcd_batch`]); [`backend`]: the one the server runs;
//! - [`api`]: the HTTP handlers; [`routes`]: the router and its route table;
//! - [`error`]: the one error enum, mapped to HTTP; [`auth`]: the admin bearer token;
//! - [`signing`]: the signed grant of every acquire and renew (`LockGrant.grant`);
//! - [`queue`]: the blocking acquire, a FIFO queue per key in the store; [`watch`]: a key's changes
//!   as a stream; [`hub`]: the PostgreSQL backend's one `LISTEN` connection per process feeding both;
//! - [`metrics`], [`reaper`], [`config`], [`server`] ([`spawn`] in-process, [`start`] for the binary, which
//!   [`dlock_common::serve::main`] runs until SIGTERM).
//!
//! Fencing tokens come from one global sequence and strictly increase for all time; the lock service
//! hands them out, the protected resources enforce them.

pub mod api;
pub mod auth;
pub mod backend;
pub mod batch;
pub mod config;
pub mod conns;
pub mod error;
pub mod etcd;
pub mod etcd_batch;
pub mod hub;
pub mod metrics;
pub mod queue;
pub mod reaper;
pub mod repo;
pub mod routes;
pub mod server;
pub mod signing;
pub mod sql;
pub mod state;
pub mod watch;

pub use backend::Backend;
pub use config::{BackendConfig, Cli, Config, ConfigError, QueueFaults};
pub use error::Error;
pub use etcd::{EtcdFaults, EtcdRepo};
pub use repo::Repo;
pub use routes::{RouteSpec, app, routes};
pub use server::{RunningServer, StartError, spawn, spawn_with_backend, spawn_with_statements, start};
pub use signing::Signer;
pub use sql::Statements;
pub use state::AppState;
