//! Check 4, **grants**: the lock service's tokens are unique and strictly increasing across all
//! keys, and no two sessions provably held one key at once.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::history::F;
use crate::state::FinalState;

use super::ops::{Op, Timed, highest_before, secs, ts};
use super::report::{CheckResult, Violation};

#[derive(Debug, Clone)]
pub(super) struct Grant<'a> {
    key: &'a str,
    token: i64,
    session: Option<Uuid>,
    owner: Option<&'a str>,
    acquired_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    start: u64,
    end: u64,
    process: &'a str,
}

pub(super) fn check_grants(ops: &[Op<'_>], state: &FinalState) -> CheckResult {
    let mut c = CheckResult::new(
        "grants",
        "tokens unique and increasing across all keys; no two sessions hold one key",
    );
    let mut grants: Vec<Grant<'_>> = Vec::new();
    // Lower bounds of each lease's and each session's end, on the lock service's clock.
    let mut lease_end: HashMap<(&str, i64), DateTime<Utc>> = HashMap::new();
    let mut session_end: HashMap<Uuid, DateTime<Utc>> = HashMap::new();
    // When a grant may first have stopped: its release, or its session's close, was invoked.
    let mut release_from: HashMap<(&str, i64), u64> = HashMap::new();
    let mut close_from: HashMap<Uuid, u64> = HashMap::new();
    let mut incomplete = 0;
    fn later(m: &mut Option<DateTime<Utc>>, t: Option<DateTime<Utc>>) {
        if let Some(t) = t
            && m.is_none_or(|m| t > m)
        {
            *m = Some(t);
        }
    }
    for o in ops {
        match o.f {
            F::Acquire if o.is_ok() => {
                let (Some(key), Some(token)) = (o.answered(|v| v.key.as_deref()), o.answered(|v| v.token))
                else {
                    incomplete += 1;
                    continue;
                };
                let g = Grant {
                    key,
                    token,
                    session: o.answered(|v| v.session),
                    owner: o.answered(|v| v.owner.as_deref()),
                    acquired_at: o.answered(|v| v.acquired_at),
                    expires_at: o.done.and_then(|e| e.value.expires_at),
                    start: o.start(),
                    end: o.end(),
                    process: o.process(),
                };
                let mut m = lease_end.get(&(key, token)).copied();
                later(&mut m, g.expires_at);
                if let Some(m) = m {
                    lease_end.insert((key, token), m);
                }
                grants.push(g);
            }
            F::Renew if o.is_ok() => {
                if let (Some(key), Some(token)) = (o.answered(|v| v.key.as_deref()), o.answered(|v| v.token))
                {
                    let mut m = lease_end.get(&(key, token)).copied();
                    later(&mut m, o.done.and_then(|e| e.value.expires_at));
                    if let Some(m) = m {
                        lease_end.insert((key, token), m);
                    }
                }
            }
            F::OpenSession | F::Heartbeat if o.is_ok() => {
                if let Some(s) = o.answered(|v| v.session) {
                    let mut m = session_end.get(&s).copied();
                    later(&mut m, o.done.and_then(|e| e.value.expires_at));
                    if let Some(m) = m {
                        session_end.insert(s, m);
                    }
                }
            }
            // Any release or close that was sent may have taken effect, whatever came back.
            F::Release => {
                if let (Some(key), Some(token), Some(inv)) =
                    (o.asked(|v| v.key.as_deref()), o.asked(|v| v.token), o.invoke)
                {
                    let e = release_from.entry((key, token)).or_insert(inv.time_ns);
                    *e = (*e).min(inv.time_ns);
                }
            }
            F::CloseSession => {
                if let (Some(s), Some(inv)) = (o.asked(|v| v.session), o.invoke) {
                    let e = close_from.entry(s).or_insert(inv.time_ns);
                    *e = (*e).min(inv.time_ns);
                }
            }
            _ => {}
        }
    }
    c.count("grants", grants.len() as u64);
    c.count("incomplete_grants", incomplete);

    // (i) One global sequence: no token granted twice, on any keys.
    let mut seen: HashMap<i64, usize> = HashMap::new();
    for (i, g) in grants.iter().enumerate() {
        if let Some(&j) = seen.get(&g.token) {
            let h = &grants[j];
            c.push(
                Violation::new(
                    "TOKEN_REISSUED",
                    format!(
                        "token {} granted twice: {} to {} ({}) at {} and {} to {} ({}) at {}",
                        g.token,
                        h.key,
                        h.owner.unwrap_or("?"),
                        h.process,
                        secs(h.end),
                        g.key,
                        g.owner.unwrap_or("?"),
                        g.process,
                        secs(g.end)
                    ),
                )
                .key(g.key)
                .tokens(&[g.token])
                .times(&[h.end, g.end]),
            );
        } else {
            seen.insert(g.token, i);
        }
    }
    // … and strictly increasing in real time: a grant answered before another was asked for has
    // the lower token (this is what a rewound sequence breaks).
    let timed: Vec<Timed> = grants
        .iter()
        .enumerate()
        .map(|(i, g)| Timed {
            start: g.start,
            end: g.end,
            token: g.token,
            at: i,
        })
        .collect();
    for (item, before) in timed.iter().zip(highest_before(&timed)) {
        let Some(b) = before.map(|b| &timed[b]) else {
            continue;
        };
        if item.token > b.token {
            continue;
        }
        let (g, h) = (&grants[item.at], &grants[b.at]);
        if g.token == h.token {
            continue; // already TOKEN_REISSUED
        }
        c.push(
            Violation::new(
                "TOKEN_NOT_INCREASING",
                format!(
                    "{} granted token {} on {} at {}..{}, after token {} on {} was granted by {}",
                    g.process,
                    g.token,
                    g.key,
                    secs(g.start),
                    secs(g.end),
                    h.token,
                    h.key,
                    secs(h.end)
                ),
            )
            .key(g.key)
            .tokens(&[g.token, h.token])
            .times(&[g.start, g.end, h.end]),
        );
    }

    // Per key, in token order.
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, g) in grants.iter().enumerate() {
        by_key.entry(g.key).or_default().push(i);
    }
    let mut keys: Vec<&str> = by_key.keys().copied().collect();
    keys.sort_unstable();
    let mut undecidable = 0;
    for key in keys {
        let mut list = by_key.remove(key).unwrap_or_default();
        list.sort_by_key(|&i| grants[i].token);
        for w in list.windows(2) {
            let (a, b) = (&grants[w[0]], &grants[w[1]]);
            if a.token == b.token {
                continue;
            }
            // acquiredAt is C1's now(): the *transaction's* start (§1.3, Warning 2), not the
            // instant of the grant. A batched acquire that waited on a row lock inside its
            // statement reports a now() from before the previous grant of the key, even though it
            // was granted after that grant's release. So the order of acquiredAt is owed only
            // where real time orders the two: B asked only after A was answered, so B's
            // transaction began after A's had committed.
            if let (Some(x), Some(y)) = (a.acquired_at, b.acquired_at)
                && y < x
                && b.start > a.end
            {
                c.push(
                    Violation::new(
                        "ACQUIRED_AT_OUT_OF_ORDER",
                        format!(
                            "{key}: token {} acquired at {} but the lower token {} at {}",
                            b.token,
                            ts(y),
                            a.token,
                            ts(x)
                        ),
                    )
                    .key(key)
                    .tokens(&[a.token, b.token])
                    .times(&[a.end, b.end]),
                );
            }
            // (ii) Mutual exclusion. A same-session re-entry ends the earlier grant itself.
            let (Some(sa), Some(sb)) = (a.session, b.session) else {
                undecidable += 1;
                continue;
            };
            if sa == sb {
                continue;
            }
            // A's release or its session's close may have reached the server before B's grant:
            // B's grant happened at some moment before B's answer, so only a stop sent after that
            // answer is certainly later.
            let stop = release_from
                .get(&(a.key, a.token))
                .copied()
                .into_iter()
                .chain(close_from.get(&sa).copied())
                .min();
            if stop.is_some_and(|s| s < b.end) {
                continue;
            }
            let (Some(lease), Some(session), Some(granted)) = (
                lease_end.get(&(a.key, a.token)),
                session_end.get(&sa),
                b.acquired_at,
            ) else {
                undecidable += 1;
                continue;
            };
            let known_end = (*lease).min(*session);
            if granted < known_end {
                c.push(
                    Violation::new(
                        "OVERLAPPING_GRANTS",
                        format!(
                            "{key}: token {} granted to {} (session {sb}) at {} while token {} of {} (session {sa}) held it until at least {} (lease {}, session {}); A's release {}",
                            b.token,
                            b.owner.unwrap_or("?"),
                            ts(granted),
                            a.token,
                            a.owner.unwrap_or("?"),
                            ts(known_end),
                            ts(*lease),
                            ts(*session),
                            match stop {
                                Some(s) => format!("sent at {}, after B's grant answered at {}", secs(s), secs(b.end)),
                                None => "never sent".to_owned(),
                            }
                        ),
                    )
                    .key(key)
                    .tokens(&[a.token, b.token])
                    .times(&[a.end, b.end]),
                );
            }
        }
    }
    c.count("undecidable_pairs", undecidable);

    // The sequence at the end is at or above every token anyone has seen (else it was rewound and
    // will hand out tokens the resources already hold).
    if let Some(seq) = state.lock_sequence {
        let seen_max = [
            grants.iter().map(|g| g.token).max(),
            state.accounts.iter().map(|a| a.fence).max(),
            state.rail_high_water.iter().map(|h| h.highest_token).max(),
        ];
        if let Some(max) = seen_max.into_iter().flatten().max()
            && max > seq
        {
            c.push(
                Violation::new(
                    "SEQUENCE_BEHIND",
                    format!("the lock sequence ends at {seq} but token {max} was granted or accepted"),
                )
                .tokens(&[seq, max]),
            );
        }
    }
    c.finish()
}
