//! Check 3, **tokens**: every fenced resource accepted strictly increasing tokens, in the final
//! state and in the history, and every stale write was refused by a fence.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use crate::history::{F, Type};
use crate::state::FinalState;

use super::ops::{Index, Op, Timed, f_name, highest_before, secs};
use super::report::{CheckResult, Violation};

pub(super) fn check_tokens(ops: &[Op<'_>], state: &FinalState, ix: &Index<'_>) -> CheckResult {
    let mut c = CheckResult::new(
        "tokens",
        "each fenced resource accepted strictly increasing tokens",
    );

    // Final state, ledger: one grant debits one account once; the fence never regresses.
    let mut debit_fences: HashMap<Uuid, Vec<(i64, Uuid)>> = HashMap::new();
    for l in state.ledger.iter().filter(|l| l.direction == "DEBIT") {
        debit_fences
            .entry(l.account_id)
            .or_default()
            .push((l.fence, l.payout_id));
    }
    for a in state.accounts.iter().filter(|a| a.kind == "CUSTOMER") {
        let Some(mut fences) = debit_fences.remove(&a.account_id) else {
            continue;
        };
        fences.sort();
        for w in fences.windows(2) {
            if w[0].0 == w[1].0 {
                c.push(
                    Violation::new(
                        "DUPLICATE_GRANT",
                        format!(
                            "account {}: fence {} debited payouts {} and {}",
                            a.account_id, w[0].0, w[0].1, w[1].1
                        ),
                    )
                    .account(a.account_id)
                    .tokens(&[w[0].0]),
                );
            }
        }
        let max = fences.last().map_or(0, |f| f.0);
        if max > a.fence {
            let above: Vec<i64> = fences.iter().filter(|f| f.0 > a.fence).map(|f| f.0).collect();
            c.push(
                Violation::new(
                    "FENCE_REGRESSED",
                    format!(
                        "account {}: stored fence {} is below the legs' fences {:?}",
                        a.account_id, a.fence, above
                    ),
                )
                .account(a.account_id)
                .tokens(&[a.fence, max]),
            );
        } else if max < a.fence {
            c.push(
                Violation::new(
                    "FENCE_WITHOUT_LEG",
                    format!(
                        "account {}: stored fence {} but its highest DEBIT leg has fence {}",
                        a.account_id, a.fence, max
                    ),
                )
                .account(a.account_id)
                .tokens(&[a.fence, max]),
            );
        }
    }
    c.count(
        "ledger_accounts",
        state.accounts.iter().filter(|a| a.kind == "CUSTOMER").count() as u64,
    );

    // Final state, rail (d): the attempts (not the FENCED audit rows) of one account.
    let high: HashMap<Uuid, i64> = state
        .rail_high_water
        .iter()
        .map(|h| (h.account_id, h.highest_token))
        .collect();
    let mut attempts: HashMap<Uuid, Vec<(i64, Uuid)>> = HashMap::new();
    for s in state
        .rail_submissions
        .iter()
        .filter(|s| s.outcome.as_deref() != Some("FENCED"))
    {
        attempts
            .entry(s.account_id)
            .or_default()
            .push((s.presented_token, s.payout_id));
    }
    let mut accounts: Vec<_> = attempts.into_iter().collect();
    accounts.sort_by_key(|(a, _)| *a);
    for (account, mut toks) in accounts {
        toks.sort();
        for w in toks.windows(2) {
            if w[0].0 == w[1].0 {
                c.push(
                    Violation::new(
                        "RAIL_TOKEN_REUSED",
                        format!(
                            "account {account}: token {} forwarded to the rail for payouts {} and {}",
                            w[0].0, w[0].1, w[1].1
                        ),
                    )
                    .account(account)
                    .tokens(&[w[0].0]),
                );
            }
        }
        let max = toks.last().map_or(0, |t| t.0);
        if !state.run.rail_fencing {
            // rail.proxy.fencing.enabled=false: (d) is not run, so no mark is kept to compare.
            c.count("high_water_not_kept", 1);
            continue;
        }
        match high.get(&account) {
            Some(&h) if max <= h => {}
            h => c.push(
                Violation::new(
                    "RAIL_ABOVE_HIGH_WATER",
                    format!(
                        "account {account}: attempt with token {max} but the high-water mark is {}",
                        h.map_or("absent".to_owned(), |h| h.to_string())
                    ),
                )
                .account(account)
                .tokens(&[max]),
            ),
        }
    }

    // History. Writes that completed ok; indeterminate ones (info) may or may not have happened
    // and prove nothing. Resolve is not fenced at all (rail-proxy logs its token but does not
    // compare it: it records what the rail already did and cannot move money), so it is left out.
    let mut per_account_post: HashMap<Uuid, Vec<Timed>> = HashMap::new();
    let mut per_account_submit: HashMap<Uuid, Vec<Timed>> = HashMap::new();
    let mut per_payout: HashMap<Uuid, Vec<Timed>> = HashMap::new();
    let mut unattributed = 0;
    for (i, o) in ops.iter().enumerate() {
        if !o.is_ok() || !matches!(o.f, F::Claim | F::Transition | F::Post | F::Submit) {
            continue;
        }
        if !wrote(o, ix) {
            c.count("idempotent_oks", 1);
            continue;
        }
        let (Some(token), Some(payout)) = (o.asked(|v| v.token), o.asked(|v| v.payout)) else {
            unattributed += 1;
            continue;
        };
        c.count("accepted_writes", 1);
        let t = Timed {
            start: o.start(),
            end: o.end(),
            token,
            at: i,
        };
        match o.f {
            F::Claim | F::Transition => per_payout.entry(payout).or_default().push(t),
            F::Post => {
                // (c) fences the payout row too (`claim_token <= t`): a post is also a write to
                // the payout, besides (a)(b) to the account.
                per_payout.entry(payout).or_default().push(t);
                match ix.account_of(o) {
                    Some(a) => per_account_post.entry(a).or_default().push(t),
                    None => unattributed += 1,
                }
            }
            F::Submit => match ix.account_of(o) {
                Some(a) => per_account_submit.entry(a).or_default().push(t),
                None => unattributed += 1,
            },
            _ => {}
        }
    }
    c.count("unattributed_writes", unattributed);

    // Post and submit: (a) and (d) are strict, so each ok must carry a token above every ok that
    // preceded it on the account.
    let mut flagged: HashSet<u64> = HashSet::new();
    for (resource, groups) in [
        ("account (post)", &per_account_post),
        ("rail-proxy (submit)", &per_account_submit),
    ] {
        let mut keys: Vec<&Uuid> = groups.keys().collect();
        keys.sort();
        for account in keys {
            let items = &groups[account];
            for (item, before) in items.iter().zip(highest_before(items)) {
                let Some(b) = before.map(|b| &items[b]) else {
                    continue;
                };
                if item.token > b.token {
                    continue;
                }
                let (this, prev) = (&ops[item.at], &ops[b.at]);
                flagged.insert(this.op_id());
                let kind = if item.token < b.token {
                    "STALE_WRITE_ACCEPTED"
                } else {
                    "TOKEN_NOT_INCREASING"
                };
                c.push(write_violation(
                    kind, resource, *account, this, prev, item.token, b.token, true,
                ));
            }
        }
    }
    // Claim, transition, post on one payout row: fenced by `claim_token <= t`, so equal tokens are
    // the same grant continuing; only a lower token after a higher one is stale.
    let mut keys: Vec<&Uuid> = per_payout.keys().collect();
    keys.sort();
    for payout in keys {
        let items = &per_payout[payout];
        for (item, before) in items.iter().zip(highest_before(items)) {
            let Some(b) = before.map(|b| &items[b]) else {
                continue;
            };
            let this = &ops[item.at];
            if item.token >= b.token || flagged.contains(&this.op_id()) {
                continue;
            }
            c.push(write_violation(
                "STALE_WRITE_ACCEPTED",
                "payout",
                *payout,
                this,
                &ops[b.at],
                item.token,
                b.token,
                false,
            ));
        }
    }
    c.finish()
}

/// Every write that carried a lower token than one its resource had already accepted for the
/// account — a stale holder's post at (a)(b) or submission at (d) — was refused *by the fence*
/// (`FENCED_OUT`), or changed nothing (an idempotent answer). One stopped by anything else (C1's
/// unique indexes, a state predicate) is reported per payout: with the fences on that does not
/// happen, with the kill switches off it is what stood between the stale holder and the money.
pub(super) fn check_fences(ops: &[Op<'_>], ix: &Index<'_>) -> CheckResult {
    let mut c = CheckResult::new(
        "fences",
        "every stale post / rail submission was refused by the fence",
    );
    // Per account and resource: accepted writes (ok, wrote) and every attempt with a token.
    type Group = (Vec<Timed>, Vec<usize>);
    let mut groups: HashMap<(Uuid, F), Group> = HashMap::new();
    for (i, o) in ops.iter().enumerate() {
        if !matches!(o.f, F::Post | F::Submit) || o.invoke.is_none() {
            continue;
        }
        let (Some(token), Some(account)) = (o.asked(|v| v.token), ix.account_of(o)) else {
            continue;
        };
        let g = groups.entry((account, o.f)).or_default();
        if o.is_ok() && wrote(o, ix) {
            g.0.push(Timed {
                start: o.start(),
                end: o.end(),
                token,
                at: i,
            });
        }
        g.1.push(i);
    }
    let mut keys: Vec<&(Uuid, F)> = groups.keys().collect();
    keys.sort_by_key(|(a, f)| (*a, *f == F::Submit));
    for key in keys {
        let (accepted, attempts) = &groups[key];
        // Sweep: attempts by start, accepted writes by end; the highest token accepted before each
        // attempt began.
        let mut by_end: Vec<&Timed> = accepted.iter().collect();
        by_end.sort_by_key(|t| t.end);
        let mut order: Vec<usize> = attempts.clone();
        order.sort_by_key(|&i| ops[i].start());
        let (mut p, mut best): (usize, Option<&Timed>) = (0, None);
        for i in order {
            let o = &ops[i];
            while p < by_end.len() && by_end[p].end < o.start() {
                if best.is_none_or(|b| by_end[p].token > b.token) {
                    best = Some(by_end[p]);
                }
                p += 1;
            }
            let (Some(b), Some(token)) = (best, o.asked(|v| v.token)) else {
                continue;
            };
            if token >= b.token {
                continue;
            }
            c.count("stale_writes", 1);
            let done = o.done.map(|e| e.kind);
            let code = o.answered(|v| v.code.clone());
            match (done, code.as_deref()) {
                (Some(Type::Fail), Some("FENCED_OUT")) => c.count("refused_by_fence", 1),
                // Accepted and wrote: the tokens check reports it.
                (Some(Type::Ok), _) if wrote(o, ix) => c.count("accepted", 1),
                (Some(Type::Ok), _) => c.count("idempotent", 1),
                (Some(Type::Fail), code) => {
                    let code = code.unwrap_or("no code").to_owned();
                    let what = if o.f == F::Post { "post" } else { "rail submission" };
                    let (account, _) = key;
                    let mut v = Violation::new(
                        "STALE_NOT_FENCED",
                        format!(
                            "payout {}: a stale {what} with token {token} (account {account} had \
                             accepted {}) was not refused by the fence but stopped by {code}",
                            o.asked(|v| v.payout).map_or("?".to_owned(), |p| p.to_string()),
                            b.token
                        ),
                    )
                    .account(*account)
                    .tokens(&[token, b.token]);
                    if let Some(p) = o.asked(|v| v.payout) {
                        v = v.payout(p);
                    }
                    c.push(v);
                }
                // Indeterminate: it may or may not have reached the resource.
                _ => c.count("indeterminate", 1),
            }
        }
    }
    c.finish()
}

/// Whether an ok claim/transition/post/submit wrote anything. An idempotent answer changed
/// nothing — and an already-POSTED payout answers a post idempotently whatever the token, so a
/// stale holder's post after a newer holder's legitimately comes back ok. Where the recorder did
/// not capture the flag, a post wrote iff its payout's DEBIT leg carries its token (ledger_leg_uq:
/// only one post of a payout can ever write legs).
pub(super) fn wrote(o: &Op<'_>, ix: &Index<'_>) -> bool {
    match o.answered(|v| v.idempotent) {
        Some(idempotent) => !idempotent,
        None if o.f == F::Post => {
            let token = o.asked(|v| v.token);
            match o.asked(|v| v.payout) {
                // No legs at all (the books check reports that): nothing to tell by, count it.
                Some(p) => ix
                    .leg_fences
                    .get(&p)
                    .is_none_or(|f| token.is_some_and(|t| f.contains(&t))),
                None => true,
            }
        }
        None => true,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn write_violation(
    kind: &str,
    resource: &str,
    id: Uuid,
    this: &Op<'_>,
    prev: &Op<'_>,
    token: i64,
    prev_token: i64,
    by_account: bool,
) -> Violation {
    let payout = this.asked(|v| v.payout);
    let prev_payout = prev.asked(|v| v.payout);
    let v = Violation::new(
        kind,
        format!(
            "{resource} {id}: {} {} of payout {} with token {token} accepted at {}..{} after {} {} of payout {} with token {prev_token} completed at {}",
            this.process(),
            f_name(this.f),
            payout.map_or("?".to_owned(), |p| p.to_string()),
            secs(this.start()),
            secs(this.end()),
            prev.process(),
            f_name(prev.f),
            prev_payout.map_or("?".to_owned(), |p| p.to_string()),
            secs(prev.end()),
        ),
    )
    .tokens(&[token, prev_token])
    .times(&[this.start(), this.end(), prev.end()]);
    let v = if by_account { v.account(id) } else { v };
    match payout {
        Some(p) => v.payout(p),
        None => v,
    }
}
