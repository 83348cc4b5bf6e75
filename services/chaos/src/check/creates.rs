//! Check 6, **creates**: one idempotency key, one payout.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use crate::history::F;
use crate::state::{FinalState, PayoutRow};

use super::ops::{Op, secs};
use super::report::{CheckResult, Violation};

pub(super) fn check_creates(ops: &[Op<'_>], state: &FinalState) -> CheckResult {
    let mut c = CheckResult::new("creates", "one idempotency key, one payout");
    let mut by_key: HashMap<&str, Vec<&PayoutRow>> = HashMap::new();
    for p in &state.payouts {
        by_key.entry(p.idempotency_key.as_str()).or_default().push(p);
    }
    let mut keys: Vec<&str> = by_key.keys().copied().collect();
    keys.sort_unstable();
    for k in &keys {
        let list = &by_key[k];
        if list.len() > 1 {
            let ids: Vec<String> = list.iter().map(|p| p.payout_id.to_string()).collect();
            c.push(
                Violation::new(
                    "DUPLICATE_KEY",
                    format!(
                        "idempotency key {k:?} is on {} payouts: {}",
                        list.len(),
                        ids.join(", ")
                    ),
                )
                .key(k),
            );
        }
    }

    // What each key's ok creates answered, in history order.
    let mut answered: BTreeMap<&str, Vec<(Uuid, u64)>> = BTreeMap::new();
    let mut no_key = 0;
    for o in ops.iter().filter(|o| o.f == F::Create && o.is_ok()) {
        let Some(k) = o.asked(|v| v.idempotency_key.as_deref()) else {
            no_key += 1;
            continue;
        };
        match o.answered(|v| v.payout) {
            Some(p) => answered.entry(k).or_default().push((p, o.end())),
            None => c.push(
                Violation::new(
                    "CREATE_WITHOUT_PAYOUT",
                    format!(
                        "create with key {k:?} answered ok at {} without a payout id",
                        secs(o.end())
                    ),
                )
                .key(k)
                .times(&[o.end()]),
            ),
        }
    }
    c.count("keys_created", answered.len() as u64);
    c.count("creates_without_key", no_key);
    for (k, list) in &answered {
        let first = list[0];
        if let Some(other) = list.iter().find(|(p, _)| *p != first.0) {
            c.push(
                Violation::new(
                    "RETRY_NEW_PAYOUT",
                    format!(
                        "key {k:?} answered payout {} at {} and payout {} at {}",
                        first.0,
                        secs(first.1),
                        other.0,
                        secs(other.1)
                    ),
                )
                .key(k)
                .payout(other.0)
                .times(&[first.1, other.1]),
            );
        }
        match by_key.get(k).map(Vec::as_slice) {
            None | Some([]) => c.push(
                Violation::new(
                    "CREATED_NOT_STORED",
                    format!(
                        "key {k:?} was answered payout {} but no payout has that key",
                        first.0
                    ),
                )
                .key(k)
                .payout(first.0),
            ),
            Some(stored) => {
                if !stored.iter().any(|p| p.payout_id == first.0) {
                    c.push(
                        Violation::new(
                            "KEY_STORED_ELSEWHERE",
                            format!(
                                "key {k:?} was answered payout {} but is stored on payout {}",
                                first.0, stored[0].payout_id
                            ),
                        )
                        .key(k)
                        .payout(first.0),
                    );
                }
            }
        }
    }
    c.finish()
}
