//! The batches' own lockdb connections ([`super::batch::own_pool`]), kept between statements.
//!
//! sqlx tests every connection given back to a pool with a round trip to the database (a `Sync`,
//! answered `ReadyForQuery`). Out of a pool, every batch statement therefore cost lockdb two round
//! trips and lock-server two writes and their reads (docs/benchmarks.md counts them). A batch's
//! connection is instead handed here after a statement that went through, and the next statement
//! takes it back without the pool, while it is fresh:
//! - given back less than [`PING_WHEN_IDLE_FOR`] ago (`dlock_common::db`'s ping window), the span in
//!   which the pool itself hands a connection out unpinged, so no connection skips a test the pool
//!   would have made;
//! - first taken from the pool less than [`HOLD_FOR`] ago, so a connection in constant use still goes
//!   back to the pool once in a while, for its test and its lifetime limit.
//!
//! Anything else goes back to the pool (tested there as before): a stale connection when it is next
//! looked at, and a connection whose statement failed at once (it may be broken or mid-reply).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dlock_common::db::PING_WHEN_IDLE_FOR;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::Notify;

/// How long a connection is used from here before it goes back to the pool once.
pub const HOLD_FOR: Duration = Duration::from_secs(1);

/// A connection one statement runs on.
#[derive(Debug)]
pub struct Taken {
    conn: PoolConnection<Postgres>,
    /// When it came out of the pool.
    since: Instant,
}

impl Taken {
    pub fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.conn
    }
}

/// A connection given back after a statement that went through.
#[derive(Debug)]
struct Kept {
    taken: Taken,
    at: Instant,
}

/// May the next statement run, at `now`, on a connection first taken from the pool at `since` and
/// given back at `at`, without the pool's test?
fn fresh(since: Instant, at: Instant, now: Instant) -> bool {
    now.saturating_duration_since(at) < PING_WHEN_IDLE_FOR && now.saturating_duration_since(since) < HOLD_FOR
}

/// The batches' pool and the connections kept from it.
#[derive(Debug)]
pub struct Conns {
    pool: PgPool,
    kept: Mutex<Vec<Kept>>,
    /// Signalled when a connection is kept: a caller waiting on the pool looks again.
    returned: Notify,
}

impl Conns {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            kept: Mutex::new(Vec::new()),
            returned: Notify::new(),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // Never held across an await; a poisoned list is still a list of connections.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection a statement just gave back, if it is fresh, else one from the pool —
    /// whichever comes first while waiting: a kept connection is out of the pool's sight, so a
    /// caller waiting on the pool alone could wait for one that is kept here.
    pub async fn take(&self) -> Result<Taken, sqlx::Error> {
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            // Registered before looking, so a connection given back after the look wakes it.
            returned.as_mut().enable();
            if let Some(taken) = self.fresh_one() {
                return Ok(taken);
            }
            tokio::select! {
                conn = self.pool.acquire() => {
                    return Ok(Taken { conn: conn?, since: Instant::now() });
                }
                () = &mut returned => {}
            }
        }
    }

    /// A fresh kept connection, the most recently given back first (the likeliest to be fresh);
    /// stale ones looked at on the way go back to the pool (dropped: the pool tests them).
    fn fresh_one(&self) -> Option<Taken> {
        let now = Instant::now();
        let mut kept = self.kept();
        while let Some(k) = kept.pop() {
            if fresh(k.taken.since, k.at, now) {
                return Some(k.taken);
            }
        }
        None
    }

    /// After a statement that went through: kept for the next one.
    pub fn give_back(&self, taken: Taken) {
        self.kept().push(Kept {
            taken,
            at: Instant::now(),
        });
        self.returned.notify_one();
    }

    /// The connections open now, kept ones included.
    pub fn size(&self) -> u32 {
        self.pool.size()
    }

    /// Gives every kept connection back to the pool, then closes it (a pool waits for its
    /// connections to come back before it closes).
    pub async fn close(&self) {
        let kept: Vec<Kept> = std::mem::take(&mut *self.kept());
        drop(kept);
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_connection_is_fresh_inside_both_windows_only() {
        let since = Instant::now();
        let ms = Duration::from_millis;
        // Given back 100 ms after it was taken: fresh until the ping window has passed since then.
        let at = since + ms(100);
        assert!(fresh(since, at, at));
        assert!(fresh(since, at, at + PING_WHEN_IDLE_FOR - ms(1)));
        assert!(!fresh(since, at, at + PING_WHEN_IDLE_FOR));
        // In constant use: fresh until it has been out of the pool for HOLD_FOR.
        let late = since + HOLD_FOR - ms(1);
        assert!(fresh(since, late, late));
        assert!(!fresh(since, late, since + HOLD_FOR));
    }
}
