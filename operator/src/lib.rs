//! dlock's Kubernetes operator: the `LockService` and `PaymentStack` custom resources and their
//! controllers. Modules, one job each:
//!
//! - [`crd`]: the resource types (and so the CRD schemas, CEL rules included);
//! - [`builders`]: pure functions building the child objects, one module per object built;
//! - [`actions`]: the LockService actions (force-revoke, restore fast-forward, the periodic fencing
//!   check) as a state machine planned purely, and the reads and lock-server calls around it;
//! - [`controller`]: the reconcilers (observe → plan → apply → status), [`context`] and [`error`]
//!   what they share, [`health`] what they read off their children;
//! - [`metrics`], [`telemetry`]: what the operator reports about itself;
//! - [`startup`]: waiting for the CRDs, leader election;
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`.

pub mod actions;
pub mod builders;
pub mod context;
pub mod controller;
pub mod crd;
pub mod error;
pub mod health;
pub mod http;
pub mod metrics;
pub mod reasons;
pub mod startup;
pub mod telemetry;
