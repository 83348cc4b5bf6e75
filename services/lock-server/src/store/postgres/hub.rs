//! The PostgreSQL backend's one listener per process: a `LISTEN dlock_lock` connection that hears
//! what migration V3's triggers (and [`super::sql::NOTIFY_GRANTED`]) say, and hands it out:
//!
//! - to the blocking acquires waiting here ([`super::wait`]): a freed key or a promotion names the
//!   one waiter to wake (the head of the key's queue, chosen by the database), so a release wakes one
//!   waiter, whichever replica serves it; a waiter whose session ended is told so;
//! - to the watch feeds of this process ([`super::feed`]), one per watched key, shared by every
//!   watcher of that key here: no watcher ever polls lockdb;
//! - to the acquire path, the set of keys watched anywhere ([`Hub::is_watched`]): only a grant of a
//!   watched key is told to the other replicas. With no watch open the check is one atomic load.
//!
//! When the connection breaks, notifications may have been missed: after reconnecting, every waiter
//! and every feed of this process re-reads where it stands (counted as `resync` wake-ups).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::sql;
use crate::config::QueueFaults;

/// Why a waiter was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Its key was freed (release, revoke, session end) while it was the head.
    Freed,
    /// The waiter ahead of it left: it may be the head now.
    Head,
    /// Its own queue row went with its session.
    Gone,
    /// The listener reconnected: notifications may have been missed.
    Resync,
}

/// What a watch feed is told about its key.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// A grant, from the replica that made it.
    Granted {
        token: i64,
        owner: String,
        /// The lease's TTL, in seconds, from the grant.
        lease_secs: f64,
    },
    /// The grant went: `cause` is `released`, `revoked` or `session_ended` (V3's trigger).
    Freed {
        cause: String,
        token: i64,
        owner: String,
    },
    /// The listener reconnected: re-read the key.
    Resync,
}

/// One notification as V3's triggers and [`super::sql::NOTIFY_GRANTED`] write it.
#[derive(Debug, Deserialize)]
struct Payload {
    e: String,
    k: String,
    /// The head waiter to wake (`freed`, `head`).
    h: Option<i64>,
    /// The waiter whose row went (`gone`).
    w: Option<i64>,
    /// A watch id (`watch`, `unwatch`).
    v: Option<i64>,
    /// The grant (`freed`, `granted`).
    t: Option<i64>,
    o: Option<String>,
    c: Option<String>,
    /// Lease seconds (`granted`).
    l: Option<f64>,
}

#[derive(Default)]
struct Inner {
    /// Waiters of this process by queue id, with their key.
    waiters: HashMap<i64, (String, mpsc::UnboundedSender<Wake>)>,
    /// Watch feeds of this process by key.
    feeds: HashMap<String, mpsc::UnboundedSender<Note>>,
    /// Open watches anywhere: id → key, and how many per key.
    watches: HashMap<i64, String>,
    watched: HashMap<String, usize>,
}

#[derive(Debug)]
pub struct Hub {
    pool: PgPool,
    inner: Mutex<Inner>,
    /// Keys watched anywhere (the acquire path's one atomic load when nothing is watched).
    watched_count: AtomicUsize,
    /// Listening now (the generation of the connection; 0 = not connected).
    ready: watch::Sender<u64>,
    faults: Mutex<QueueFaults>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("waiters", &self.waiters.len())
            .field("feeds", &self.feeds.len())
            .field("watches", &self.watches.len())
            .finish()
    }
}

impl Hub {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            inner: Mutex::new(Inner::default()),
            watched_count: AtomicUsize::new(0),
            ready: watch::channel(0).0,
            faults: Mutex::new(QueueFaults::NONE),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Plain maps, never left half-updated across a panic-prone call: a poisoned lock is fine.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn faults(&self) -> QueueFaults {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` is watched anywhere (so that its grants must be told).
    pub fn is_watched(&self, key: &str) -> bool {
        self.watched_count.load(Ordering::Relaxed) > 0 && self.inner().watched.contains_key(key)
    }

    /// Until the listener listens (`false`: `cancel` fired first).
    pub async fn ready(&self, cancel: &CancellationToken) -> bool {
        let mut rx = self.ready.subscribe();
        tokio::select! {
            r = rx.wait_for(|g| *g > 0) => r.is_ok(),
            () = cancel.cancelled() => false,
        }
    }

    /// Registers waiter `id` of `key`: its wake-ups arrive on the returned channel.
    pub fn register_waiter(&self, id: i64, key: &str) -> mpsc::UnboundedReceiver<Wake> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner().waiters.insert(id, (key.to_owned(), tx));
        rx
    }

    pub fn unregister_waiter(&self, id: i64) {
        self.inner().waiters.remove(&id);
    }

    /// Registers the watch feed of `key` in this process: notes about the key arrive on `tx`.
    pub(crate) fn register_feed(&self, key: &str, tx: mpsc::UnboundedSender<Note>) {
        self.inner().feeds.insert(key.to_owned(), tx);
    }

    pub(crate) fn unregister_feed(&self, key: &str) {
        self.inner().feeds.remove(key);
    }

    /// Starts the listener; it runs until `cancel` fires. `faults` is a negative control's broken
    /// queue (production: none).
    pub fn start(self: &Arc<Self>, faults: QueueFaults, cancel: CancellationToken) -> JoinHandle<()> {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
        let hub = self.clone();
        tokio::spawn(async move {
            let mut generation = 0u64;
            loop {
                generation += 1;
                let ended = tokio::select! {
                    () = cancel.cancelled() => return,
                    r = hub.listen(generation) => r,
                };
                hub.ready.send_replace(0);
                if let Err(e) = ended {
                    tracing::warn!(event = "listener_failed", error = %e, "lockdb listener down; reconnecting");
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
        })
    }

    /// One connection's life: LISTEN, load the open watches, resync everyone, then dispatch until
    /// the connection breaks.
    async fn listen(&self, generation: u64) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(sql::CHANNEL).await?;
        let open: Vec<(i64, String)> = sqlx::query_as(sql::WATCHES).fetch_all(&self.pool).await?;
        {
            let mut inner = self.inner();
            inner.watches = open.into_iter().collect();
            inner.watched = count(&inner.watches);
            self.watched_count.store(inner.watched.len(), Ordering::Relaxed);
        }
        self.ready.send_replace(generation);
        if generation > 1 {
            self.resync();
        }
        loop {
            match listener.try_recv().await? {
                Some(n) => self.dispatch(n.payload()),
                // The connection broke; what it carried meanwhile is lost.
                None => return Ok(()),
            }
        }
    }

    fn resync(&self) {
        let inner = self.inner();
        for (_, tx) in inner.waiters.values() {
            let _ = tx.send(Wake::Resync);
        }
        for tx in inner.feeds.values() {
            let _ = tx.send(Note::Resync);
        }
    }

    fn dispatch(&self, payload: &str) {
        let Ok(p) = serde_json::from_str::<Payload>(payload) else {
            tracing::warn!(
                event = "listener_bad_payload",
                payload,
                "a notification of an unknown shape"
            );
            return;
        };
        let mut inner = self.inner();
        match p.e.as_str() {
            "freed" => {
                self.wake_head(&inner, &p.k, p.h, Wake::Freed);
                if let (Some(tx), Some(token)) = (inner.feeds.get(&p.k), p.t) {
                    let _ = tx.send(Note::Freed {
                        cause: p.c.unwrap_or_default(),
                        token,
                        owner: p.o.unwrap_or_default(),
                    });
                }
            }
            "head" => self.wake_head(&inner, &p.k, p.h, Wake::Head),
            "gone" => {
                if let Some((_, tx)) = p.w.and_then(|w| inner.waiters.get(&w)) {
                    let _ = tx.send(Wake::Gone);
                }
            }
            "granted" => {
                if let (Some(tx), Some(token)) = (inner.feeds.get(&p.k), p.t) {
                    let _ = tx.send(Note::Granted {
                        token,
                        owner: p.o.unwrap_or_default(),
                        lease_secs: p.l.unwrap_or(0.0),
                    });
                }
            }
            "watch" => {
                if let Some(v) = p.v {
                    inner.watches.insert(v, p.k);
                    inner.watched = count(&inner.watches);
                    self.watched_count.store(inner.watched.len(), Ordering::Relaxed);
                }
            }
            "unwatch" => {
                if let Some(v) = p.v {
                    inner.watches.remove(&v);
                    inner.watched = count(&inner.watches);
                    self.watched_count.store(inner.watched.len(), Ordering::Relaxed);
                }
            }
            other => tracing::warn!(
                event = "listener_bad_payload",
                kind = other,
                "an unknown notification"
            ),
        }
    }

    /// Wakes the waiter the database named as the key's head, if it waits here. The negative
    /// controls route differently: every waiter of the key (a herd), or the newest (LIFO).
    fn wake_head(&self, inner: &Inner, key: &str, head: Option<i64>, why: Wake) {
        let faults = self.faults();
        if faults.wake_every_waiter || faults.lifo {
            let mine: BTreeMap<i64, &mpsc::UnboundedSender<Wake>> = inner
                .waiters
                .iter()
                .filter(|(_, (k, _))| k == key)
                .map(|(id, (_, tx))| (*id, tx))
                .collect();
            if faults.wake_every_waiter {
                for tx in mine.values() {
                    let _ = tx.send(why);
                }
            } else if let Some((_, tx)) = mine.last_key_value() {
                let _ = tx.send(why);
            }
            return;
        }
        if let Some((_, tx)) = head.and_then(|h| inner.waiters.get(&h)) {
            let _ = tx.send(why);
        }
    }
}

fn count(watches: &HashMap<i64, String>) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for key in watches.values() {
        *out.entry(key.clone()).or_insert(0) += 1;
    }
    out
}
