//! The history as the checks read it: invokes paired with their completions ([`Op`]), the
//! intervals that carry a token ([`Timed`]), and the index of the final state the checks share.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::history::{Event, F, Type, Value};
use crate::state::{FinalState, PayoutRow};

/// An invoke and its completion, paired by `op`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Op<'a> {
    pub(super) f: F,
    pub(super) invoke: Option<&'a Event>,
    pub(super) done: Option<&'a Event>,
}

impl<'a> Op<'a> {
    pub(super) fn is_ok(&self) -> bool {
        self.done.is_some_and(|e| e.kind == Type::Ok)
    }

    /// When it was invoked; an op whose invoke is missing from the record is taken to have begun
    /// at 0, which can only make it look concurrent with more, never ordered after more (sound).
    pub(super) fn start(&self) -> u64 {
        self.invoke.map_or(0, |e| e.time_ns)
    }

    pub(super) fn end(&self) -> u64 {
        self.done.map_or(u64::MAX, |e| e.time_ns)
    }

    /// A field as asked (the invoke), else as answered.
    pub(super) fn asked<T>(&self, get: impl Fn(&'a Value) -> Option<T>) -> Option<T> {
        self.invoke
            .and_then(|e| get(&e.value))
            .or_else(|| self.done.and_then(|e| get(&e.value)))
    }

    /// A field as answered (the completion), else as asked.
    pub(super) fn answered<T>(&self, get: impl Fn(&'a Value) -> Option<T>) -> Option<T> {
        self.done
            .and_then(|e| get(&e.value))
            .or_else(|| self.invoke.and_then(|e| get(&e.value)))
    }

    pub(super) fn op_id(&self) -> u64 {
        self.invoke.or(self.done).map_or(0, |e| e.op)
    }

    pub(super) fn process(&self) -> &'a str {
        self.invoke.or(self.done).map_or("?", |e| e.process.as_str())
    }
}

pub(super) fn pair(history: &[Event]) -> Vec<Op<'_>> {
    let mut ops: Vec<Op<'_>> = Vec::with_capacity(history.len() / 2 + 1);
    let mut open: HashMap<u64, usize> = HashMap::new();
    for e in history {
        if e.kind == Type::Invoke {
            open.insert(e.op, ops.len());
            ops.push(Op {
                f: e.f,
                invoke: Some(e),
                done: None,
            });
        } else {
            match open.remove(&e.op) {
                Some(i) => ops[i].done = Some(e),
                // A completion without its invoke (a truncated record): kept, start unknown.
                None => ops.push(Op {
                    f: e.f,
                    invoke: None,
                    done: Some(e),
                }),
            }
        }
    }
    ops
}

pub(super) fn f_name(f: F) -> String {
    serde_json::to_value(f)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{f:?}"))
}

/// Run-clock nanoseconds as seconds, for messages.
pub(super) fn secs(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

pub(super) fn ts(t: DateTime<Utc>) -> String {
    t.format("%H:%M:%S%.3f").to_string()
}

/// An interval of the run clock carrying a token: one accepted write or one grant.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timed {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) token: i64,
    /// Index into the caller's list of operations.
    pub(super) at: usize,
}

/// For each interval, the one with the highest token among those that ended strictly before it
/// began (its real-time predecessors). O(n log n): one sort by start, one by end, one sweep.
pub(super) fn highest_before(items: &[Timed]) -> Vec<Option<usize>> {
    let mut by_start: Vec<usize> = (0..items.len()).collect();
    by_start.sort_by_key(|&i| items[i].start);
    let mut by_end: Vec<usize> = (0..items.len()).collect();
    by_end.sort_by_key(|&i| items[i].end);
    let mut out = vec![None; items.len()];
    let mut best: Option<usize> = None;
    let mut p = 0;
    for &i in &by_start {
        while p < by_end.len() && items[by_end[p]].end < items[i].start {
            let j = by_end[p];
            if best.is_none_or(|b| items[j].token > items[b].token) {
                best = Some(j);
            }
            p += 1;
        }
        out[i] = best;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The final state, indexed

pub(super) struct Index<'a> {
    pub(super) payouts: HashMap<Uuid, &'a PayoutRow>,
    /// Currency → its settlement account(s).
    pub(super) settlement: HashMap<&'a str, Vec<Uuid>>,
    /// Payout → the fences of its ledger legs.
    pub(super) leg_fences: HashMap<Uuid, Vec<i64>>,
}

impl<'a> Index<'a> {
    pub(super) fn new(state: &'a FinalState) -> Self {
        let mut settlement: HashMap<&str, Vec<Uuid>> = HashMap::new();
        for a in state.accounts.iter().filter(|a| a.kind == "SETTLEMENT") {
            settlement
                .entry(a.currency.trim())
                .or_default()
                .push(a.account_id);
        }
        let mut leg_fences: HashMap<Uuid, Vec<i64>> = HashMap::new();
        for l in &state.ledger {
            leg_fences.entry(l.payout_id).or_default().push(l.fence);
        }
        Self {
            leg_fences,
            payouts: state.payouts.iter().map(|p| (p.payout_id, p)).collect(),
            settlement,
        }
    }

    pub(super) fn state_of(&self, p: Uuid) -> &str {
        self.payouts.get(&p).map_or("UNKNOWN", |p| p.state.as_str())
    }

    /// The account an operation wrote: as the answer said, else the payout's account.
    pub(super) fn account_of(&self, o: &Op<'_>) -> Option<Uuid> {
        o.answered(|v| v.account).or_else(|| {
            o.asked(|v| v.payout)
                .and_then(|p| self.payouts.get(&p))
                .map(|p| p.account_id)
        })
    }
}
