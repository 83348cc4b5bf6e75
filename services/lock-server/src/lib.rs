//! lock-server: the dlock lock service, sole writer of lockdb (C1 §1.1–1.4, §1.7; docs/lock-api.md).
//!
//! - [`store`]: the store behind the API, one folder per backend — [`store::postgres`] (lockdb, C1's
//!   statements) and [`store::etcd`] (`--backend etcd`) — and [`Backend`], the one the server runs;
//! - [`api`]: the HTTP handlers; [`routes`]: the router and its route table;
//! - [`error`]: the one error enum, mapped to HTTP; [`auth`]: the bearer tokens (the admin's, and
//!   the lock clients' of [`clients`], each with its key prefixes, owner prefixes and operations;
//!   [`owners`]: the owners of sessions and grants those checks read, remembered);
//! - [`signing`]: the signed grant of every acquire and renew (`LockGrant.grant`);
//! - [`queue`]: the blocking acquire, a FIFO queue per key in the store; [`watch`]: a key's changes
//!   as a stream;
//! - [`metrics`], [`reaper`], [`config`], [`server`] ([`spawn`] in-process, [`start`] for the binary, which
//!   [`dlock_common::serve::main`] runs until SIGTERM).
//!
//! Fencing tokens come from one global sequence and strictly increase for all time; the lock service
//! hands them out, the protected resources enforce them.

pub mod api;
pub mod auth;
pub mod clients;
pub mod config;
pub mod error;
pub mod metrics;
pub mod owners;
pub mod queue;
pub mod reaper;
pub mod routes;
pub mod server;
pub mod signing;
pub mod state;
pub mod store;
pub mod watch;

pub use clients::{Clients, ClientsError, Operation};
pub use config::{BackendConfig, Cli, Config, ConfigError, QueueFaults};
pub use error::Error;
pub use routes::{RouteSpec, app, routes};
pub use server::{RunningServer, StartError, spawn, spawn_with_backend, spawn_with_statements, start};
pub use signing::Signer;
pub use state::AppState;
// What the tests and tools of other crates wire a server up with (a backend, its negative-control
// faults) and the statement texts their negative controls alter.
pub use store::Backend;
pub use store::etcd::{EtcdFaults, EtcdRepo};
pub use store::postgres::{Repo, Statements, sql};
