//! A key's watch on PostgreSQL: one feed per watched key per process, shared by all its watchers
//! here. A feed registers a `lock_watch` row (so that releases of the key are told, and grants of
//! it: see [`super::hub`]) and learns everything from the process's one listener; it reads lockdb
//! only when it starts, when its holder's lease is due to end (a lapse has no event; a renewed lease
//! is then waited for again), and after the listener reconnected. No watcher polls.
//!
//! Tokens strictly increase, so a feed drops what it already reported (a grant told after its own
//! release) and reports a grant it never heard of when its end arrives first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::Utc;
use dlock_wire::lock::{LockEvent, LockEventType, LockView};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Repo;
use super::hub::Note;
use super::repo::Watched;
use crate::error::Error;
use crate::store::{Cause, Item, event, view_of};

/// A feed's `lock_watch` row counts this long; the feed replaces it at half of it.
const WATCH_ROW: Duration = Duration::from_secs(600);
/// How long a new watch waits for the lockdb listener to be connected.
const READY_WAIT: Duration = Duration::from_secs(5);
/// How often a feed looks whether anyone still watches.
const PRUNE: Duration = Duration::from_secs(1);

/// The cause V3's triggers name.
fn cause_of_trigger(cause: &str) -> Cause {
    match cause {
        "revoked" => Cause::Revoked,
        "session_ended" => Cause::SessionEnded,
        _ => Cause::Released,
    }
}

/// The feeds of this process, one per watched key.
#[derive(Debug, Default)]
pub struct Feeds {
    map: tokio::sync::Mutex<HashMap<String, Arc<Feed>>>,
}

#[derive(Debug)]
struct Feed {
    shared: Mutex<Shared>,
}

#[derive(Debug)]
struct Shared {
    view: LockView,
    watchers: Vec<(mpsc::Sender<Item>, Instant)>,
    /// Set when the feed decided to stop (no watchers); a new watcher then starts a new feed.
    stopped: bool,
}

impl Feed {
    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `item` to every watcher, dropping those that left, fell behind, or whose stream is over.
    fn send(&self, item: Option<Item>) {
        let now = Instant::now();
        let mut s = self.shared();
        s.watchers.retain(|(tx, ends)| {
            *ends > now
                && match &item {
                    Some(i) => tx.try_send(i.clone()).is_ok(),
                    None => !tx.is_closed(),
                }
        });
    }
}

impl Feeds {
    /// Starts a watch of `key` on this process's feed of it, starting the feed if there is none.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        repo: &Repo,
        key: String,
        tx: mpsc::Sender<Item>,
        ends: Instant,
    ) -> Result<(), Error> {
        let hub = repo.hub();
        // Right after start, or while it reconnects, the listener may need a moment.
        let ready = tokio::time::timeout(READY_WAIT, hub.ready(&CancellationToken::new())).await;
        if !matches!(ready, Ok(true)) {
            return Err(Error::Unavailable("the lockdb listener is not connected"));
        }
        let mut map = self.map.lock().await;
        if let Some(feed) = map.get(&key) {
            let mut s = feed.shared();
            if !s.stopped {
                tx.try_send(Item::State(s.view.clone()))
                    .map_err(|_| Error::Cancelled)?;
                s.watchers.push((tx, ends));
                return Ok(());
            }
        }
        // Registered first, so that nothing told from here on is missed; then the row that makes
        // the key's changes told, then the state they change.
        let (notes_tx, notes) = mpsc::unbounded_channel();
        hub.register_feed(&key, notes_tx);
        let started = async {
            let id = repo.add_watch(&key, WATCH_ROW.as_secs_f64()).await?;
            match repo.watch_read(&key).await {
                Ok(row) => Ok((id, row)),
                Err(e) => {
                    let _ = repo.drop_watch(id).await;
                    Err(e)
                }
            }
        }
        .await;
        let (id, row) = match started {
            Ok(v) => v,
            Err(e) => {
                hub.unregister_feed(&key);
                return Err(e);
            }
        };
        let machine = Machine::new(&key, row.as_ref());
        let view = machine.view();
        tx.try_send(Item::State(view.clone()))
            .map_err(|_| Error::Cancelled)?;
        let feed = Arc::new(Feed {
            shared: Mutex::new(Shared {
                view,
                watchers: vec![(tx, ends)],
                stopped: false,
            }),
        });
        map.insert(key.clone(), feed.clone());
        let feeds = self.clone();
        let repo = repo.clone();
        tokio::spawn(async move {
            run_feed(&repo, &feeds, &key, &feed, machine, notes, id).await;
        });
        Ok(())
    }
}

/// What a feed knows of its key.
struct Machine {
    key: String,
    /// The grant as last reported: token, owner, whether its lapse was reported.
    holder: Option<(i64, String, bool)>,
    /// The highest token reported (granted or gone).
    highest: i64,
    /// When the holder's lease is due to end (local clock).
    lease_end: Option<Instant>,
}

impl Machine {
    fn new(key: &str, row: Option<&Watched>) -> Self {
        let mut m = Machine {
            key: key.to_owned(),
            holder: None,
            highest: 0,
            lease_end: None,
        };
        if let Some(r) = row {
            m.holder = Some((r.fencing_token, r.owner_id.clone(), r.expired));
            m.highest = r.fencing_token;
            m.arm(r.expired, r.left_secs);
        }
        m
    }

    fn view(&self) -> LockView {
        view_of(&self.key, self.holder.clone())
    }

    fn arm(&mut self, expired: bool, left_secs: f64) {
        self.lease_end = (!expired).then(|| {
            Instant::now()
                + Duration::try_from_secs_f64(left_secs.max(0.0)).unwrap_or(Duration::from_secs(86_400))
                + Duration::from_millis(2)
        });
    }

    fn granted(&mut self, token: i64, owner: String, lease_secs: f64, out: &mut Vec<LockEvent>) {
        if token <= self.highest {
            return;
        }
        self.highest = token;
        let expires = Utc::now() + chrono::Duration::milliseconds((lease_secs * 1000.0) as i64);
        out.extend(event(
            &self.key,
            LockEventType::Granted,
            token,
            Some(owner.clone()),
            Some(expires),
        ));
        self.holder = Some((token, owner, false));
        self.arm(false, lease_secs);
    }

    fn gone(&mut self, cause: Cause, token: i64, owner: String, out: &mut Vec<LockEvent>) {
        if token > self.highest {
            // Its grant was never told here (told late, or missed): report it first.
            self.highest = token;
            out.extend(event(
                &self.key,
                LockEventType::Granted,
                token,
                Some(owner.clone()),
                None,
            ));
            self.holder = Some((token, owner, false));
        }
        if let Some((t, o, lapsed)) = self.holder.take() {
            if t != token {
                self.holder = Some((t, o, lapsed));
                return;
            }
            // A grant whose lapse was reported has already gone for the watchers.
            if !lapsed {
                out.extend(event(&self.key, cause.kind(), token, Some(o), None));
            }
            self.lease_end = None;
        }
    }

    /// Brings the feed to what lockdb says now.
    fn read(&mut self, row: Option<Watched>, out: &mut Vec<LockEvent>) {
        match row {
            None => {
                if let Some((t, o, _)) = self.holder.clone() {
                    self.gone(Cause::Released, t, o, out);
                }
                self.lease_end = None;
            }
            Some(r) => {
                if r.fencing_token > self.highest {
                    if let Some((t, o, lapsed)) = self.holder.take()
                        && !lapsed
                    {
                        out.extend(event(&self.key, LockEventType::Expired, t, Some(o), None));
                    }
                    self.highest = r.fencing_token;
                    out.extend(event(
                        &self.key,
                        LockEventType::Granted,
                        r.fencing_token,
                        Some(r.owner_id.clone()),
                        Some(r.expires_at),
                    ));
                    self.holder = Some((r.fencing_token, r.owner_id, false));
                }
                if let Some((t, o, lapsed)) = &mut self.holder
                    && *t == r.fencing_token
                    && r.expired
                    && !*lapsed
                {
                    *lapsed = true;
                    out.extend(event(
                        &self.key,
                        LockEventType::Expired,
                        *t,
                        Some(o.clone()),
                        None,
                    ));
                }
                self.arm(r.expired, r.left_secs);
            }
        }
    }
}

async fn run_feed(
    repo: &Repo,
    feeds: &Arc<Feeds>,
    key: &str,
    feed: &Arc<Feed>,
    mut machine: Machine,
    mut notes: mpsc::UnboundedReceiver<Note>,
    mut watch_id: i64,
) {
    let mut prune = tokio::time::interval(PRUNE);
    let mut renew_row = Instant::now() + WATCH_ROW / 2;
    loop {
        let mut out = Vec::new();
        let lease_end = machine.lease_end;
        tokio::select! {
            note = notes.recv() => match note {
                Some(Note::Granted { token, owner, lease_secs }) => machine.granted(token, owner, lease_secs, &mut out),
                Some(Note::Freed { cause, token, owner }) => machine.gone(cause_of_trigger(&cause), token, owner, &mut out),
                Some(Note::Resync) => match repo.watch_read(key).await {
                    Ok(row) => machine.read(row, &mut out),
                    Err(e) => tracing::warn!(event = "watch_read_failed", lock_key = %key, error = %e),
                },
                None => break,
            },
            () = async {
                match lease_end {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => match repo.watch_read(key).await {
                Ok(row) => machine.read(row, &mut out),
                Err(e) => {
                    tracing::warn!(event = "watch_read_failed", lock_key = %key, error = %e);
                    machine.lease_end = Some(Instant::now() + PRUNE);
                }
            },
            _ = prune.tick() => {
                feed.send(None);
                let mut map = feeds.map.lock().await;
                let mut s = feed.shared();
                if s.watchers.is_empty() {
                    s.stopped = true;
                    if map.get(key).is_some_and(|f| Arc::ptr_eq(f, feed)) {
                        map.remove(key);
                        // Under the map's lock: no new feed of the key registers meanwhile.
                        repo.hub().unregister_feed(key);
                    }
                    break;
                }
            }
            () = tokio::time::sleep_until(renew_row) => {
                // A new row before the old one goes, so that the key never counts as unwatched.
                if let Ok(id) = repo.add_watch(key, WATCH_ROW.as_secs_f64()).await {
                    let _ = repo.drop_watch(watch_id).await;
                    watch_id = id;
                }
                renew_row = Instant::now() + WATCH_ROW / 2;
            }
        }
        if !out.is_empty() {
            // What a watcher arriving from now on starts from.
            feed.shared().view = machine.view();
            for e in out {
                feed.send(Some(Item::Change(e)));
            }
        }
    }
    if let Err(e) = repo.drop_watch(watch_id).await {
        tracing::warn!(event = "watch_drop_failed", lock_key = %key, error = %e);
    }
}
