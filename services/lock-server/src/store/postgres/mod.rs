//! The PostgreSQL backend: lockdb, the statements of contract C1.
//!
//! - [`sql`]: every lockdb statement, C1's text; [`sql::Statements`] is the swappable safety set;
//! - [`repo`]: one method per statement, zero rows as `None`/`false`;
//! - [`batch`]: concurrent acquires and releases batched into one statement per round trip, on the
//!   batches' own connections ([`conns`]);
//! - [`epoch`]: every lockdb history it cannot vouch for (its own start, a promotion, a restore, a
//!   restarted postmaster) is treated as a restore: the sequence jumps before any grant;
//! - [`hub`]: the one `LISTEN` connection per process, which wakes the blocking acquires
//!   ([`wait`]) and feeds the watches ([`feed`]).

pub mod batch;
pub mod conns;
pub mod epoch;
pub mod feed;
pub mod hub;
pub mod repo;
pub mod sql;
pub mod wait;

pub use repo::Repo;
pub use sql::Statements;
