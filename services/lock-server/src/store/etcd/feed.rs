//! A key's watch on etcd: an etcd watch of the grant key from the revision of the first read; a
//! deletion's cause is read from etcd ([`EtcdRepo::why_deleted`]).

use chrono::Utc;
use dlock_wire::lock::LockEventType;
use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions, WatchStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{EtcdRepo, GrantValue, decode, ms_to_time};
use crate::error::Error;
use crate::store::{Cause, Item, LockRow, event, view_of};

impl EtcdRepo {
    /// Starts a watch of `key`: its state as read now, then an etcd watch of the grant key from the
    /// revision of that read.
    pub(crate) async fn watch(
        &self,
        key: String,
        tx: mpsc::Sender<Item>,
        ends: Instant,
    ) -> Result<(), Error> {
        let (row, rev) = self.read_at(&key).await?;
        let view = view_of(
            &key,
            row.as_ref().map(|r| (r.fencing_token, r.owner_id.clone(), false)),
        );
        let _ = tx.send(Item::State(view)).await;
        let repo = self.clone();
        let highest = row.map_or(0, |r| r.fencing_token);
        tokio::spawn(async move {
            if let Err(e) = feed(&repo, &key, rev, highest, &tx, ends).await {
                tracing::warn!(event = "watch_failed", lock_key = %key, error = %e);
            }
        });
        Ok(())
    }

    /// A watch of `key` from `rev` on ([`crate::watch`]).
    pub async fn watch_key(&self, key: &str, rev: i64) -> Result<(etcd_client::Watcher, WatchStream), Error> {
        self.client()
            .watch(
                self.lock_key(key),
                Some(WatchOptions::new().with_start_revision(rev).with_prev_key()),
            )
            .await
            .map_err(Error::etcd)
    }

    /// The key's grant as [`EtcdRepo::read`] sees it, and the revision of that read.
    pub async fn read_at(&self, key: &str) -> Result<(Option<LockRow>, i64), Error> {
        let r = self
            .client()
            .get(self.lock_key(key), None)
            .await
            .map_err(Error::etcd)?;
        let rev = r.header().map(|h| h.revision()).unwrap_or(0);
        let Some(kv) = r.kvs().first() else {
            return Ok((None, rev));
        };
        let g: GrantValue = decode(kv)?;
        Ok((
            Some(LockRow {
                fencing_token: self.token_of(kv),
                owner_id: g.owner_id,
                acquired_at: ms_to_time(g.acquired_at_ms),
                expires_at: Utc::now(),
                expired: false,
            }),
            rev,
        ))
    }

    /// A grant written at a watch's PUT: its token and owner.
    pub fn granted_by(&self, kv: &KeyValue) -> Result<(i64, String), Error> {
        let g: GrantValue = decode(kv)?;
        Ok((self.token_of(kv), g.owner_id))
    }

    /// Why the grant `prev` (as it was before a watch's DELETE at `rev`) went: revoked (its audit
    /// record exists), released (deleted while its lease lived: the index entry on the same lease was
    /// still there at `rev`), or with its lease: expired, or its session ended (the session key was
    /// gone at `rev`). A history etcd compacted away reads as released.
    pub async fn why_deleted(&self, key: &str, prev: &KeyValue, rev: i64) -> Result<Cause, Error> {
        let token = self.token_of(prev);
        if self.get_one(self.revocation_key(key, token)).await?.is_some() {
            return Ok(Cause::Revoked);
        }
        let g: GrantValue = decode(prev)?;
        let at = |k: String| {
            let mut c = self.client();
            async move { c.get(k, Some(GetOptions::new().with_revision(rev))).await }
        };
        // The index entry lives on the grant's lease: there at `rev`, the lease still was.
        let index_key = if g.lease_secs > 0 {
            self.index_key(g.session_id, prev.lease())
        } else {
            // A grant written before pooling: its index entry was per key.
            format!("{}{key}", self.held_prefix(g.session_id))
        };
        let Ok(index) = at(index_key).await else {
            return Ok(Cause::Released);
        };
        if !index.kvs().is_empty() {
            return Ok(Cause::Released);
        }
        let Ok(session) = at(self.session_key(g.session_id)).await else {
            return Ok(Cause::Expired);
        };
        Ok(if session.kvs().is_empty() {
            Cause::SessionEnded
        } else {
            Cause::Expired
        })
    }
}

/// Tokens strictly increase, so what the watch already reported (a grant seen at the first read)
/// is dropped.
async fn feed(
    repo: &EtcdRepo,
    key: &str,
    rev: i64,
    mut highest: i64,
    tx: &mpsc::Sender<Item>,
    ends: Instant,
) -> Result<(), Error> {
    let (_watcher, mut stream) = repo.watch_key(key, rev + 1).await?;
    loop {
        let msg = tokio::select! {
            () = tokio::time::sleep_until(ends) => return Ok(()),
            () = tx.closed() => return Ok(()),
            m = stream.message() => m.map_err(Error::etcd)?,
        };
        let Some(resp) = msg else { return Ok(()) };
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let change = match ev.event_type() {
                EventType::Put => {
                    let (token, owner) = repo.granted_by(kv)?;
                    if token <= highest {
                        continue;
                    }
                    highest = token;
                    event(key, LockEventType::Granted, token, Some(owner), None)
                }
                EventType::Delete => {
                    let Some(prev) = ev.prev_kv() else { continue };
                    let (token, owner) = repo.granted_by(prev)?;
                    let cause = repo.why_deleted(key, prev, kv.mod_revision()).await?;
                    event(key, cause.kind(), token, Some(owner), None)
                }
            };
            if let Some(c) = change
                && tx.send(Item::Change(c)).await.is_err()
            {
                return Ok(());
            }
        }
    }
}
