//! Who owns a session and a grant, remembered. With a clients file every session-scoped request
//! reads its session's owner, and every renew and release its grant's owner, before anything is
//! written (docs/lock-api.md, "Authentication"): one more lockdb round trip per request, outside
//! the batched statements, which cost a third of a lock cycle's throughput (docs/benchmarks.md).
//!
//! Neither answer changes while its subject exists: a session is opened for one owner id and keeps
//! it, and a grant is one (key, token) for all time (a token is never handed out twice: the
//! sequence jumps on every new lockdb history, etcd's revisions only grow). So an owner once read
//! can be used again; a grant's owner is known from the moment it is granted here, so its renews
//! and release need no read at all. Only owners found are kept — a session or grant not there is
//! read afresh every time, so one made later is never judged by an old answer — and an entry that
//! outlives its session or grant lets no write through: the write after the check finds nothing, as it would after a read.
//! The one difference: an acquire under a session that lapsed (or was closed through another
//! replica) while its owner is remembered is answered SESSION_GONE by C1's acquire statement rather
//! than before it, as without a clients file, so it may draw a token that no grant gets — a gap,
//! which tokens have anyway (a contended acquire draws one too).

use dlock_common::memo::Memo;
use uuid::Uuid;

/// Owners kept of each kind; past it that memory starts again empty. Sessions and grants in use at
/// once are far fewer (a payout executor's worker holds one session and one grant at a time).
pub const KEPT: usize = 8192;

#[derive(Debug)]
pub struct Owners {
    sessions: Memo<Uuid, String>,
    grants: Memo<(String, i64), String>,
}

impl Default for Owners {
    fn default() -> Self {
        Owners {
            sessions: Memo::new(KEPT),
            grants: Memo::new(KEPT),
        }
    }
}

impl Owners {
    /// The owner id session `session_id` was opened for, if remembered.
    pub fn session(&self, session_id: Uuid) -> Option<String> {
        self.sessions.get(&session_id)
    }

    pub fn remember_session(&self, session_id: Uuid, owner: &str) {
        self.sessions.insert(session_id, owner.to_owned());
    }

    /// A session closed here is forgotten at once (one that lapsed, or was closed through another
    /// replica, is forgotten when the memory starts again).
    pub fn forget_session(&self, session_id: Uuid) {
        self.sessions.remove(&session_id);
    }

    /// The owner of the grant at `key` and `token`, if remembered.
    pub fn grant(&self, key: &str, token: i64) -> Option<String> {
        self.grants.get(&(key.to_owned(), token))
    }

    pub fn remember_grant(&self, key: &str, token: i64, owner: &str) {
        self.grants.insert((key.to_owned(), token), owner.to_owned());
    }

    /// How many owners are remembered, sessions and grants.
    pub fn remembered(&self) -> (usize, usize) {
        (self.sessions.len(), self.grants.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_kept_per_session_and_per_grant_and_bounded() {
        let o = Owners::default();
        let s = Uuid::new_v4();
        assert_eq!(o.session(s), None);
        o.remember_session(s, "payments-1");
        assert_eq!(o.session(s).as_deref(), Some("payments-1"));
        assert_eq!(o.session(Uuid::new_v4()), None);
        o.remember_grant("account:1", 7, "payments-1");
        assert_eq!(o.grant("account:1", 7).as_deref(), Some("payments-1"));
        // Another token of the same key is another grant.
        assert_eq!(o.grant("account:1", 8), None);
        for t in 0..KEPT as i64 {
            o.remember_grant("account:2", t, "w");
        }
        assert!(o.remembered().1 <= KEPT);
    }
}
