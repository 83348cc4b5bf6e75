//! dlock's Kubernetes operator: the `LockService` and `PaymentStack` custom resources and their
//! controllers. Modules, one job each:
//!
//! - [`crd`]: the resource types (and so the CRD schemas, CEL rules included);
//! - [`builders`]: pure functions from a resource to the child objects it asks for;
//! - [`controller`]: the reconcilers (observe → plan → apply → status);
//! - [`metrics`], [`telemetry`]: what the operator reports about itself;
//! - [`startup`]: waiting for the CRDs, leader election;
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`.

pub mod builders;
pub mod controller;
pub mod crd;
pub mod http;
pub mod metrics;
pub mod reasons;
pub mod startup;
pub mod telemetry;
