//! The store behind the HTTP API: PostgreSQL (C1's statements, [`Repo`]) or etcd ([`EtcdRepo`]).
//! Both give the same typed answers with the same meaning of "zero rows", so the handlers, error
//! codes and metrics are one implementation.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Error;
use crate::etcd::EtcdRepo;
use crate::repo::{Grant, ListedRow, LockRow, Renewed, Repo, Revocation, Revoked, Session};

#[derive(Debug, Clone)]
pub enum Backend {
    Postgres(Repo),
    Etcd(EtcdRepo),
}

macro_rules! delegate {
    ($self:ident, $name:ident ( $($arg:expr),* )) => {
        match $self {
            Backend::Postgres(r) => r.$name($($arg),*).await,
            Backend::Etcd(r) => r.$name($($arg),*).await,
        }
    };
}

impl Backend {
    /// The PostgreSQL repository, if that is the backend (tests inspect lockdb through it).
    pub fn postgres(&self) -> Option<&Repo> {
        match self {
            Backend::Postgres(r) => Some(r),
            Backend::Etcd(_) => None,
        }
    }

    pub fn etcd(&self) -> Option<&EtcdRepo> {
        match self {
            Backend::Etcd(r) => Some(r),
            Backend::Postgres(_) => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Postgres(_) => "postgres",
            Backend::Etcd(_) => "etcd",
        }
    }

    pub async fn create_session(&self, owner_id: &str, ttl_secs: f64) -> Result<Session, Error> {
        delegate!(self, create_session(owner_id, ttl_secs))
    }

    pub async fn heartbeat(&self, session_id: Uuid, ttl_secs: f64) -> Result<Option<DateTime<Utc>>, Error> {
        delegate!(self, heartbeat(session_id, ttl_secs))
    }

    pub async fn close_session(&self, session_id: Uuid) -> Result<bool, Error> {
        delegate!(self, close_session(session_id))
    }

    pub async fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
    ) -> Result<Option<Grant>, Error> {
        delegate!(self, acquire(key, owner_id, session_id, ttl_secs))
    }

    pub async fn renew(&self, key: &str, token: i64, ttl_secs: f64) -> Result<Option<Renewed>, Error> {
        delegate!(self, renew(key, token, ttl_secs))
    }

    pub async fn release(&self, key: &str, token: i64) -> Result<bool, Error> {
        delegate!(self, release(key, token))
    }

    pub async fn read(&self, key: &str) -> Result<Option<LockRow>, Error> {
        delegate!(self, read(key))
    }

    pub async fn revoke(&self, key: &str, operator: &str, reason: &str) -> Result<Option<Revoked>, Error> {
        delegate!(self, revoke(key, operator, reason))
    }

    pub async fn revoke_pinned(
        &self,
        key: &str,
        token: i64,
        operator: &str,
        reason: &str,
    ) -> Result<Revocation, Error> {
        delegate!(self, revoke_pinned(key, token, operator, reason))
    }

    /// One page of held keys starting with `prefix`, after `after` (`""`: the first page).
    pub async fn list(&self, prefix: &str, after: &str, limit: i64) -> Result<Vec<ListedRow>, Error> {
        delegate!(self, list(prefix, after, limit))
    }

    pub async fn reap(&self) -> Result<u64, Error> {
        delegate!(self, reap())
    }

    pub async fn ping(&self) -> Result<(), Error> {
        delegate!(self, ping())
    }

    /// Closes the PostgreSQL pools; the etcd channel closes when the last clone drops.
    pub async fn close(&self) {
        if let Backend::Postgres(r) = self {
            r.close().await;
        }
    }
}
