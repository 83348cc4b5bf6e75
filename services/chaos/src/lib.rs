//! dlock's fault campaign (`dlock-dev chaos`): the whole stack as real processes on loopback, a client
//! that creates payouts at a steady rate, randomized faults from a seed (pauses, kills, database and
//! etcd restarts, partitions, clock skew, a misbehaving rail), every operation recorded as a
//! Jepsen-style history, and a checker that reads the record and the final state.
//!
//! - [`history`]: the events; [`state`]: the final state read after the run.
//! - [`check`]: the checker (linear in the history) and its verdict.
//! - [`proxy`]: the recording HTTP links; [`tcp`]: the link a replicated database's clients reach
//!   its primary through (the failover nemesis re-points it).
//!
//! Dev-only, like the test kit it builds on: no shipped binary links it.

pub mod check;
pub mod history;
pub mod nemesis;
pub mod proxy;
pub mod report;
pub mod run;
pub mod state;
pub mod tcp;
