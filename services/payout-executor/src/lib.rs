//! payout-executor: drives payouts PENDING → CLAIMED → RAIL_SUBMITTED → RAIL_ACKED → POSTED over HTTP
//! only. It holds no database credentials (C1 §1.1): the lock comes from lock-server, the writes go
//! to payment-resource and rail-proxy, each carrying the grant's fencing token, and those resources
//! enforce the fences themselves.
//!
//! Modules, one job each:
//! - [`config`]: the command line and the checked settings;
//! - [`model`]: the wire types read from the resources; [`resources`]: every HTTP call to them;
//! - [`critical`]: the critical section of one payout under one grant (the state machine);
//! - [`worker`]: the loop (discovery, bounded acquire, attempt, release) and what is tracked;
//! - [`executor`]: the process (workers, `/metrics`, `/healthz`, `/readyz`, shutdown);
//! - [`fault`]: the SIGSTOP fault injection behind `--enable-fault-injection` (cargo feature
//!   `fault-injection`, off in the release image);
//! - [`metrics`]: counters and histograms.
//!
//! The whole stack as processes on loopback (the proof tests, the demo) is `dlock_testkit::stack`
//! (the dev-only test kit), which this crate's binary does not link.

pub mod config;
pub mod critical;
pub mod executor;
pub mod fault;
pub mod metrics;
pub mod model;
pub mod resources;
pub mod worker;

pub use config::{Cli, Config};
pub use executor::{Report, run};
