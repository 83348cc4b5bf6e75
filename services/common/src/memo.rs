//! A bounded memory of answers that never change once found (a grant text's verification, the
//! owner of a session or of a grant): past its bound it starts again empty, so it costs at most
//! that many entries and needs no eviction order. What is kept, and why it may be, is its user's to
//! say (`grant::TrustedKeys`, lock-server's `owners`).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

#[derive(Debug)]
pub struct Memo<K, V> {
    bound: usize,
    map: Mutex<HashMap<K, V>>,
}

impl<K: Hash + Eq, V: Clone> Memo<K, V> {
    pub fn new(bound: usize) -> Self {
        Memo {
            bound,
            map: Mutex::default(),
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map().get(key).cloned()
    }

    pub fn insert(&self, key: K, value: V) {
        let mut map = self.map();
        if map.len() >= self.bound {
            map.clear();
        }
        map.insert(key, value);
    }

    pub fn remove<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map().remove(key);
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn map(&self) -> MutexGuard<'_, HashMap<K, V>> {
        // Every change is one call on the map: a panic elsewhere while it was held leaves nothing
        // half-written.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_it_is_given_up_to_its_bound_then_starts_again() {
        let m: Memo<String, u32> = Memo::new(2);
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        assert_eq!((m.get("a"), m.get("b"), m.len()), (Some(1), Some(2), 2));
        m.insert("c".into(), 3);
        assert_eq!((m.get("a"), m.get("c"), m.len()), (None, Some(3), 1));
        m.remove("c");
        assert!(m.is_empty());
    }
}
