//! The store operations on etcd: sessions, acquire, renew, read, revoke, reap, list (the release is
//! the release batcher's: [`super::batch`]).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use uuid::Uuid;

use super::{
    EtcdRepo, GrantValue, RevocationValue, SessionValue, decode, encode, first_get, is_lease_not_found,
    lease_end, lease_secs, lookup_ok, ms_to_time, prefix_end,
};
use crate::error::Error;
use crate::store::{Grant, ListedRow, LockRow, Renewed, Revocation, Revoked, Session};

impl EtcdRepo {
    pub async fn create_session(&self, owner_id: &str, ttl_secs: f64) -> Result<Session, Error> {
        let secs = lease_secs(ttl_secs);
        let before = Utc::now();
        let lease = self.client().lease_grant(secs, None).await.map_err(Error::etcd)?;
        let session_id = Uuid::new_v4();
        let value = encode(&SessionValue {
            owner_id: owner_id.to_owned(),
        });
        self.client()
            .put(
                self.session_key(session_id),
                value,
                Some(PutOptions::new().with_lease(lease.id())),
            )
            .await
            .map_err(Error::etcd)?;
        Ok(Session {
            session_id,
            owner_id: owner_id.to_owned(),
            expires_at: lease_end(before, lease.ttl()),
        })
    }

    /// `None`: the session's lease is gone (closed, or lapsed by etcd's clock).
    pub async fn heartbeat(&self, session_id: Uuid, _ttl_secs: f64) -> Result<Option<DateTime<Utc>>, Error> {
        let Some(kv) = self.get_one(self.session_key(session_id)).await? else {
            return Ok(None);
        };
        // A keep-alive restores the TTL the lease was granted with; etcd cannot change a lease's TTL.
        let before = Utc::now();
        Ok(self
            .keep_alive_once(kv.lease())
            .await?
            .map(|ttl| lease_end(before, ttl)))
    }

    /// `false`: no such session. Revoking the session's lease first makes every later acquire under
    /// it fail; then every grant it still holds goes with its own lease (the cascade).
    pub async fn close_session(&self, session_id: Uuid) -> Result<bool, Error> {
        let Some(kv) = self.get_one(self.session_key(session_id)).await? else {
            return Ok(false);
        };
        lookup_ok(self.client().lease_revoke(kv.lease()).await)?;
        self.revoke_grants_of(&[session_id]).await?;
        self.pool().forget(session_id);
        Ok(true)
    }

    async fn revoke_grants_of(&self, sessions: &[Uuid]) -> Result<(), Error> {
        for s in sessions {
            let held = self
                .client()
                .get(
                    self.held_prefix(*s),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
                .map_err(Error::etcd)?;
            let leases: BTreeSet<i64> = held.kvs().iter().map(|kv| kv.lease()).collect();
            for lease in leases {
                lookup_ok(self.client().lease_revoke(lease).await)?;
            }
        }
        Ok(())
    }

    /// C1 §1.3's acquire as one etcd transaction, on the grant's own lease ([`EtcdRepo::lease_for`]).
    /// `None`: held by a live, different holder (CONTENDED).
    pub async fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
    ) -> Result<Option<Grant>, Error> {
        let secs = lease_secs(ttl_secs);
        let mut lease = self.lease_for(session_id, secs).await?;
        let now_ms = Utc::now().timestamp_millis();
        let lkey = self.lock_key(key);
        let skey = self.session_key(session_id);
        let value = encode(&GrantValue {
            owner_id: owner_id.to_owned(),
            session_id,
            acquired_at_ms: now_ms,
            lease_secs: secs,
        });
        // One transaction: the session must be alive, and the key absent (never written, released,
        // or its lease lapsed — a key goes with its lease), or still the grant this very session
        // holds (re-entry, pinned to the mod_revision we saw, so it cannot overwrite a newer holder).
        let mut pinned: Option<(i64, i64, i64)> = None; // (mod_revision, lease, lease secs) of our own grant
        let mut lapsed_leases = 0;
        let mut attempts = 0;
        while attempts < 3 {
            let key_cmp = match pinned {
                None => Compare::create_revision(lkey.clone(), CompareOp::Equal, 0),
                Some((rev, _, _)) => Compare::mod_revision(lkey.clone(), CompareOp::Equal, rev),
            };
            // The index entry is written with the first grant a lease carries, and stays on it until
            // the lease goes, so close and the reaper find the lease, pooled or not; a reused lease
            // that carried a grant has it already (one put per cycle, as etcd's Mutex does). That is
            // not taken on trust: the transaction also compares that the entry is there on this very
            // lease (etcd restored from a snapshot older than the lease's first grant would not have
            // it), and writes it again, once, if not.
            let ikey = self.index_key(session_id, lease.id);
            let mut when = vec![
                Compare::create_revision(skey.clone(), CompareOp::Greater, 0),
                key_cmp,
            ];
            let mut or_else = vec![TxnOp::get(lkey.clone(), None), TxnOp::get(skey.clone(), None)];
            if lease.indexed && !self.faults.trust_pooled_index {
                when.push(Compare::lease(ikey.clone(), CompareOp::Equal, lease.id));
                or_else.push(TxnOp::get(ikey.clone(), None));
            }
            let mut write = vec![TxnOp::put(
                lkey.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease.id)),
            )];
            if !lease.indexed {
                write.push(TxnOp::put(
                    ikey.clone(),
                    "",
                    Some(PutOptions::new().with_lease(lease.id)),
                ));
            }
            write.push(TxnOp::get(lkey.clone(), None));
            let written = write.len() - 1;
            let txn = Txn::new().when(when).and_then(write).or_else(or_else);
            let resp = match self.kv().txn(txn).await {
                Ok(resp) => resp,
                // The pooled lease went between its keep-alive and the transaction (its session
                // was closed on another replica): nothing was written; a new lease, once.
                Err(e) if is_lease_not_found(&e) && lapsed_leases == 0 => {
                    lapsed_leases += 1;
                    lease = self.lease_for(session_id, secs).await?;
                    continue;
                }
                Err(e) => return Err(Error::etcd(e)),
            };
            attempts += 1;
            let ops = resp.op_responses();
            if resp.succeeded() {
                if let Some((_, old, old_secs)) = pinned.filter(|(_, old, _)| *old != lease.id) {
                    // Re-entry moved the grant to the new lease: the old one carries nothing now.
                    self.give_back(session_id, old_secs, old, true);
                }
                if self.faults.pool_leases_in_use {
                    self.give_back(session_id, secs, lease.id, true);
                }
                let kv =
                    first_get(&ops, written).ok_or_else(|| Error::Corrupt("acquire wrote nothing".into()))?;
                let held = ms_to_time(now_ms);
                return Ok(Some(Grant {
                    fencing_token: self.token_of(&kv),
                    owner_id: owner_id.to_owned(),
                    session_id,
                    acquired_at: held,
                    expires_at: lease.end,
                }));
            }
            if first_get(&ops, 1).is_none() {
                self.revoke_lease_later(lease.id);
                return Err(Error::SessionGone);
            }
            if lease.indexed
                && !self.faults.trust_pooled_index
                && first_get(&ops, 2).is_none_or(|kv| kv.lease() != lease.id)
            {
                // The lease lost its index entry: the same transaction again, writing it.
                lease.indexed = false;
                attempts -= 1;
                continue;
            }
            pinned = match first_get(&ops, 0) {
                // Released or lapsed since: the free-key branch again.
                None => None,
                Some(current) => {
                    let g: GrantValue = decode(&current)?;
                    if g.session_id != session_id || g.owner_id != owner_id {
                        self.give_back(session_id, secs, lease.id, lease.indexed);
                        return Ok(None);
                    }
                    Some((current.mod_revision(), current.lease(), g.lease_secs))
                }
            };
        }
        // The key kept changing hands under us: report it as held by someone else.
        self.give_back(session_id, secs, lease.id, lease.indexed);
        Ok(None)
    }

    /// C1 §1.4 renew. `None`: the grant at `token` is gone (released, revoked, lapsed, taken over).
    pub async fn renew(&self, key: &str, token: i64, _ttl_secs: f64) -> Result<Option<Renewed>, Error> {
        let lkey = self.lock_key(key);
        let Some(kv) = self.get_one(lkey.clone()).await? else {
            return Ok(None);
        };
        if !self.faults.renew_ignores_token && self.token_of(&kv) != token {
            return Ok(None);
        }
        let before = Utc::now();
        let Some(ttl) = self.keep_alive_once(kv.lease()).await? else {
            return Ok(None);
        };
        // The lease was alive when extended; the grant must still be the one at `token` *after*
        // that, or the lease we extended may already carry nothing of ours.
        if !self.faults.renew_ignores_token {
            let still = self
                .client()
                .txn(Txn::new().when([Compare::mod_revision(lkey, CompareOp::Equal, kv.mod_revision())]))
                .await
                .map_err(Error::etcd)?;
            if !still.succeeded() {
                return Ok(None);
            }
        }
        // The grant's own value names its holder (for the re-signed grant): the key was at `token`
        // when read and still is, so this is that grant's value.
        let holder: GrantValue = decode(&kv)?;
        Ok(Some(Renewed {
            fencing_token: token,
            expires_at: lease_end(before, ttl),
            owner_id: holder.owner_id,
            session_id: holder.session_id,
        }))
    }

    /// The owner id the session was opened for; `None`: its lease is gone (closed, or lapsed by
    /// etcd's clock). One read of the session key.
    pub async fn session_owner(&self, session_id: Uuid) -> Result<Option<String>, Error> {
        let Some(kv) = self.get_one(self.session_key(session_id)).await? else {
            return Ok(None);
        };
        let s: SessionValue = decode(&kv)?;
        Ok(Some(s.owner_id))
    }

    /// The owner of the grant at `key` and `token`; `None`: the key holds no grant at that token.
    /// One read of the grant key.
    pub async fn grant_owner(&self, key: &str, token: i64) -> Result<Option<String>, Error> {
        let Some(kv) = self.get_one(self.lock_key(key)).await? else {
            return Ok(None);
        };
        if self.token_of(&kv) != token {
            return Ok(None);
        }
        let g: GrantValue = decode(&kv)?;
        Ok(Some(g.owner_id))
    }

    pub async fn read(&self, key: &str) -> Result<Option<LockRow>, Error> {
        let Some(kv) = self.get_one(self.lock_key(key)).await? else {
            return Ok(None);
        };
        let g: GrantValue = decode(&kv)?;
        let ttl = self
            .client()
            .lease_time_to_live(kv.lease(), None)
            .await
            .map_err(Error::etcd)?
            .ttl();
        // The key exists, so etcd has not revoked its lease: it is held. (TimeToLive truncates to
        // whole seconds, so 0 only means "under a second left", never "expired".)
        Ok(Some(LockRow {
            fencing_token: self.token_of(&kv),
            owner_id: g.owner_id,
            acquired_at: ms_to_time(g.acquired_at_ms),
            expires_at: Utc::now() + ChronoDuration::seconds(ttl.max(0)),
            expired: false,
        }))
    }

    /// Unpinned force-revoke: revokes whatever live grant holds the key. `None`: nothing held.
    pub async fn revoke(&self, key: &str, operator: &str, reason: &str) -> Result<Option<Revoked>, Error> {
        let Some(kv) = self.get_one(self.lock_key(key)).await? else {
            return Ok(None);
        };
        match self
            .revoke_pinned(key, kv.mod_revision(), operator, reason)
            .await?
        {
            Revocation::Revoked(r) => Ok(Some(r)),
            _ => Ok(None),
        }
    }

    /// Token-pinned force-revoke: one transaction deletes the grant only if its `mod_revision` is
    /// `token` and appends the audit record (which must not exist yet: append-only).
    pub async fn revoke_pinned(
        &self,
        key: &str,
        token: i64,
        operator: &str,
        reason: &str,
    ) -> Result<Revocation, Error> {
        let lkey = self.lock_key(key);
        let rkey = self.revocation_key(key, token);
        let current = self.get_one(lkey.clone()).await?;
        if let Some(kv) = current.as_ref().filter(|kv| kv.mod_revision() == token) {
            let g: GrantValue = decode(kv)?;
            let record = encode(&RevocationValue {
                lock_key: key.to_owned(),
                prev_owner: g.owner_id.clone(),
                prev_token: token,
                operator: operator.to_owned(),
                reason: reason.to_owned(),
            });
            let resp = self
                .client()
                .txn(
                    Txn::new()
                        .when([
                            Compare::mod_revision(lkey.clone(), CompareOp::Equal, token),
                            Compare::create_revision(rkey.clone(), CompareOp::Equal, 0),
                        ])
                        .and_then([
                            TxnOp::delete(lkey.clone(), None),
                            TxnOp::put(rkey.clone(), record, None),
                        ]),
                )
                .await
                .map_err(Error::etcd)?;
            if resp.succeeded() {
                self.revoke_lease_later(kv.lease());
                return Ok(Revocation::Revoked(Revoked {
                    owner_id: g.owner_id,
                    fencing_token: token,
                }));
            }
        }
        if let Some(r) = self.get_one(rkey).await? {
            let r: RevocationValue = decode(&r)?;
            return Ok(Revocation::AlreadyRevoked(Revoked {
                owner_id: r.prev_owner,
                fencing_token: r.prev_token,
            }));
        }
        Ok(match self.get_one(lkey).await? {
            Some(kv) if kv.mod_revision() != token => Revocation::HeldByOtherToken {
                current_token: kv.mod_revision(),
            },
            _ => Revocation::NotHeld,
        })
    }

    /// The reaper: grants indexed under a session whose lease is gone are revoked (the cascade that
    /// PostgreSQL's foreign key does). Returns how many dead sessions still held grants.
    pub async fn reap(&self) -> Result<u64, Error> {
        let keys_only = || Some(GetOptions::new().with_prefix().with_keys_only());
        let live: BTreeSet<String> = self
            .client()
            .get(format!("{}s/", self.prefix), keys_only())
            .await
            .map_err(Error::etcd)?
            .kvs()
            .iter()
            .filter_map(|kv| {
                kv.key_str()
                    .ok()
                    .and_then(|k| k.rsplit('/').next())
                    .map(str::to_owned)
            })
            .collect();
        let held_root = format!("{}h/", self.prefix);
        let held = self
            .client()
            .get(held_root.clone(), keys_only())
            .await
            .map_err(Error::etcd)?;
        let mut dead: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
        for kv in held.kvs() {
            let Some(rest) = kv.key_str().ok().and_then(|k| k.strip_prefix(held_root.as_str())) else {
                continue;
            };
            let session = rest.split('/').next().unwrap_or_default();
            if !live.contains(session) {
                dead.entry(session.to_owned()).or_default().insert(kv.lease());
            }
        }
        for (session, leases) in &dead {
            for lease in leases {
                lookup_ok(self.client().lease_revoke(*lease).await)?;
            }
            // What this replica pooled or kept open for the session goes with it.
            if let Ok(session) = session.parse::<Uuid>() {
                self.pool().forget(session);
            }
        }
        Ok(dead.len() as u64)
    }

    pub async fn ping(&self) -> Result<(), Error> {
        self.client().status().await.map_err(Error::etcd)?;
        Ok(())
    }

    /// One page of held keys after `after`, in key order, with their queue lengths.
    pub async fn list(&self, prefix: &str, after: &str, limit: i64) -> Result<Vec<ListedRow>, Error> {
        let from = if after.is_empty() {
            self.lock_key(prefix)
        } else {
            // The smallest key after `after`.
            format!("{}\u{0}", self.lock_key(after))
        };
        let end = prefix_end(self.lock_key(prefix).into_bytes());
        let page = self
            .client()
            .get(from, Some(GetOptions::new().with_range(end).with_limit(limit)))
            .await
            .map_err(Error::etcd)?;
        let root = self.lock_key("");
        let mut out = Vec::with_capacity(page.kvs().len());
        for kv in page.kvs() {
            let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(root.as_str())) else {
                continue;
            };
            let g: GrantValue = decode(kv)?;
            let ttl = self
                .client()
                .lease_time_to_live(kv.lease(), None)
                .await
                .map_err(Error::etcd)?
                .ttl();
            let waiters = self.queue_len(key).await?;
            out.push(ListedRow {
                lock_key: key.to_owned(),
                fencing_token: self.token_of(kv),
                owner_id: g.owner_id,
                session_id: g.session_id,
                acquired_at: ms_to_time(g.acquired_at_ms),
                expires_at: Utc::now() + ChronoDuration::seconds(ttl.max(0)),
                expired: false,
                waiters,
            });
        }
        Ok(out)
    }
}
