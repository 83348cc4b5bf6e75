//! The checker: reads a run's history ([`crate::history`]) and its final state ([`crate::state`])
//! and decides whether the run kept every promise the project makes.
//!
//! Six checks, each able to fail on its own:
//!
//! 1. **rail** — the rail paid every payout at most once, and paid exactly the payouts that ended
//!    POSTED (rail-stub's ground truth against paydb).
//! 2. **books** — per account, the balance is the opening balance minus the debits plus the credits
//!    and minus the posted payouts; reservations add up; every POSTED payout has its two legs and no
//!    other payout has any.
//! 3. **tokens** — every fenced resource accepted strictly increasing tokens: the ledger's fences
//!    and rail-proxy's attempts in the final state, and in the history no `ok` write after (in real
//!    time) an `ok` write with a higher token to the same resource.
//! 4. **grants** — the lock service's tokens are unique and strictly increasing across all keys,
//!    and no two sessions provably held one key at once.
//! 5. **ends** — every payout ended (POSTED, FAILED, ABANDONED), soon enough after the last fault
//!    healed, and payment-resource's own reconciliation is clean.
//! 6. **creates** — one idempotency key, one payout.
//!
//! Every check is sound: a violation is reported only when the record proves it. Indeterminate
//! operations (`info`) never count as writes, and a lower bound of the truth is used wherever the
//! history cannot see everything (unseen renews only extend a lease). The work is linear in the
//! history plus one sort per group (n log n).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::history::{Event, F, Type, Value};
use crate::state::{FinalState, PayoutRow};

/// Payout states in which the payout holds its reservation (docs/accounting.md).
const RESERVING: [&str; 3] = ["RAIL_SUBMITTED", "RAIL_ACKED", "RAIL_AMBIGUOUS"];
/// Payout states a payout never leaves.
const TERMINAL: [&str; 3] = ["POSTED", "FAILED", "ABANDONED"];

/// How many violations of each check [`Verdict`]'s `Display` prints before "… and N more".
pub const SHOWN_PER_CHECK: usize = 10;

/// One broken promise, naming everything involved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Violation {
    /// Machine-readable kind (`PAID_TWICE`, `STALE_WRITE_ACCEPTED`, `OVERLAPPING_GRANTS`, …).
    pub kind: String,
    /// Human-readable: what happened, with the ids, tokens and times.
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payout: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<i64>,
    /// Run-clock times (history `time_ns`) of the events involved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub times_ns: Vec<u64>,
}

impl Violation {
    fn new(kind: &str, detail: String) -> Self {
        Self {
            kind: kind.to_owned(),
            detail,
            payout: None,
            account: None,
            key: None,
            tokens: Vec::new(),
            times_ns: Vec::new(),
        }
    }

    fn payout(mut self, p: Uuid) -> Self {
        self.payout = Some(p);
        self
    }

    fn account(mut self, a: Uuid) -> Self {
        self.account = Some(a);
        self
    }

    fn key(mut self, k: &str) -> Self {
        self.key = Some(k.to_owned());
        self
    }

    fn tokens(mut self, t: &[i64]) -> Self {
        self.tokens = t.to_vec();
        self
    }

    fn times(mut self, t: &[u64]) -> Self {
        self.times_ns = t.to_vec();
        self
    }
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    /// `rail`, `books`, `tokens`, `grants`, `ends`, `creates`.
    pub name: String,
    /// What the check promises, one line.
    pub what: String,
    pub passed: bool,
    /// What was looked at and what was found, by name.
    pub counts: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
}

impl CheckResult {
    fn new(name: &str, what: &str) -> Self {
        Self {
            name: name.to_owned(),
            what: what.to_owned(),
            passed: true,
            counts: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    fn count(&mut self, name: &str, n: u64) {
        *self.counts.entry(name.to_owned()).or_default() += n;
    }

    fn push(&mut self, v: Violation) {
        self.violations.push(v);
    }

    fn finish(mut self) -> Self {
        self.passed = self.violations.is_empty();
        self.counts
            .insert("violations".to_owned(), self.violations.len() as u64);
        self
    }
}

/// Operations counted by how they completed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    pub invoked: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
    /// Invoked, never completed in the record (the run ended, or the recorder lost it): as
    /// indeterminate as `info`.
    pub unanswered: u64,
}

impl OpCounts {
    fn add(&mut self, o: &Op<'_>) {
        if o.invoke.is_some() {
            self.invoked += 1;
        }
        match o.done.map(|e| e.kind) {
            Some(Type::Ok) => self.ok += 1,
            Some(Type::Fail) => self.fail += 1,
            Some(Type::Info) => self.info += 1,
            // Two invokes for one op id: the recorder's bug, counted as unanswered, not a result.
            Some(Type::Invoke) | None => self.unanswered += 1,
        }
    }
}

/// The numbers the campaign report prints beside the checks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub operations: OpCounts,
    /// Keyed by the operation's `f` in its history spelling (`acquire`, `post`, …).
    pub operations_by_f: BTreeMap<String, OpCounts>,
    /// Every final payout state and how many payouts are in it.
    pub payouts_by_state: BTreeMap<String, u64>,
    pub payouts_posted: u64,
    pub payouts_failed: u64,
    pub payouts_abandoned: u64,
    /// Anything not terminal at the end (PENDING, CLAIMED, RAIL_*).
    pub payouts_in_flight: u64,
    /// `fail` completions with code `FENCED_OUT`, by the refusing `resource` (`account`, `ledger`,
    /// `payout`, `rail`; `unknown` when the answer did not say).
    pub fenced_out_by_resource: BTreeMap<String, u64>,
    /// rail_submission rows with outcome FENCED: refusals by (d) as rail-proxy recorded them.
    pub rail_fenced_submissions: u64,
    /// Payouts the rail paid more than once.
    pub double_payments: u64,
    /// Violations of the books check.
    pub ledger_breaks: u64,
    /// Violations of the tokens check.
    pub non_monotone_tokens: u64,
    /// Stale posts / rail submissions stopped by something other than the fence (the fences check).
    pub stale_not_fenced: u64,
    /// Violations of the grants check.
    pub grant_violations: u64,
    /// Payouts not terminal at the end.
    pub stuck_payouts: u64,
    /// Terminal payouts whose last write came later than the settle bound allows.
    pub slow_payouts: u64,
    pub reconciliation_clean: bool,
}

/// The checker's answer: one result per check and the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub checks: Vec<CheckResult>,
    pub summary: Summary,
}

impl Verdict {
    /// True only when every check passed.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The named check's result.
    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Names of the checks that failed.
    pub fn failed(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// The verdict table (one row per check) and the first `shown` violations of each failed check.
    pub fn table(&self, shown: usize) -> String {
        let mut out = String::new();
        let width = self.checks.iter().map(|c| c.what.len()).max().unwrap_or(0);
        for c in &self.checks {
            let counts: Vec<String> = c.counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!(
                "{:<4}  {:<8} {:<width$}  {}\n",
                if c.passed { "PASS" } else { "FAIL" },
                c.name,
                c.what,
                counts.join(" "),
            ));
        }
        let s = &self.summary;
        out.push_str(&format!(
            "operations: {} invoked, {} ok, {} fail, {} info, {} unanswered\n",
            s.operations.invoked,
            s.operations.ok,
            s.operations.fail,
            s.operations.info,
            s.operations.unanswered
        ));
        out.push_str(&format!(
            "payouts: {} posted, {} failed, {} abandoned, {} in flight\n",
            s.payouts_posted, s.payouts_failed, s.payouts_abandoned, s.payouts_in_flight
        ));
        let refused: Vec<String> = s
            .fenced_out_by_resource
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!(
            "stale tokens refused: {} (FENCED rail submissions: {})\n",
            if refused.is_empty() {
                "none".to_owned()
            } else {
                refused.join(" ")
            },
            s.rail_fenced_submissions
        ));
        out.push_str(&format!(
            "double payments {}, ledger breaks {}, non-monotone tokens {}, stale writes past the fence {}, grant violations {}, stuck {}, slow {}, reconciliation {}\n",
            s.double_payments,
            s.ledger_breaks,
            s.non_monotone_tokens,
            s.stale_not_fenced,
            s.grant_violations,
            s.stuck_payouts,
            s.slow_payouts,
            if s.reconciliation_clean { "clean" } else { "NOT clean" },
        ));
        out.push_str(if self.ok() {
            "verdict: PASS\n"
        } else {
            "verdict: FAIL\n"
        });
        for c in self.checks.iter().filter(|c| !c.passed) {
            out.push_str(&format!("\n{} — {} violation(s):\n", c.name, c.violations.len()));
            for v in c.violations.iter().take(shown) {
                out.push_str(&format!("  [{}] {}\n", v.kind, v.detail));
            }
            if c.violations.len() > shown {
                out.push_str(&format!("  … and {} more\n", c.violations.len() - shown));
            }
        }
        out
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table(SHOWN_PER_CHECK))
    }
}

/// Reads a history file: one [`Event`] a line (blank lines skipped).
pub fn read_history(path: &Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut events = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Event = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a history event", path.display(), n + 1))?;
        events.push(e);
    }
    Ok(events)
}

/// Reads a final-state file (one [`FinalState`] JSON document).
pub fn read_final_state(path: &Path) -> anyhow::Result<FinalState> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a final state", path.display()))
}

/// Reads both files and checks them.
pub fn check_files(history: &Path, state: &Path) -> anyhow::Result<Verdict> {
    Ok(check(&read_history(history)?, &read_final_state(state)?))
}

/// Checks a run.
pub fn check(history: &[Event], state: &FinalState) -> Verdict {
    let ops = pair(history);
    let ix = Index::new(state);
    let rail = check_rail(state, &ix);
    let books = check_books(state, &ix);
    let tokens = check_tokens(&ops, state, &ix);
    let fences = check_fences(&ops, &ix);
    let grants = check_grants(&ops, state);
    let ends = check_ends(&ops, state);
    let creates = check_creates(&ops, state);
    let mut summary = summarize(&ops, state, &rail, &books, &tokens, &grants, &ends);
    summary.stale_not_fenced = fences.violations.len() as u64;
    Verdict {
        checks: vec![rail, books, tokens, fences, grants, ends, creates],
        summary,
    }
}

// ---------------------------------------------------------------------------------------------
// The history as operations

/// An invoke and its completion, paired by `op`.
#[derive(Debug, Clone, Copy)]
struct Op<'a> {
    f: F,
    invoke: Option<&'a Event>,
    done: Option<&'a Event>,
}

impl<'a> Op<'a> {
    fn is_ok(&self) -> bool {
        self.done.is_some_and(|e| e.kind == Type::Ok)
    }

    /// When it was invoked; an op whose invoke is missing from the record is taken to have begun
    /// at 0, which can only make it look concurrent with more, never ordered after more (sound).
    fn start(&self) -> u64 {
        self.invoke.map_or(0, |e| e.time_ns)
    }

    fn end(&self) -> u64 {
        self.done.map_or(u64::MAX, |e| e.time_ns)
    }

    /// A field as asked (the invoke), else as answered.
    fn asked<T>(&self, get: impl Fn(&'a Value) -> Option<T>) -> Option<T> {
        self.invoke
            .and_then(|e| get(&e.value))
            .or_else(|| self.done.and_then(|e| get(&e.value)))
    }

    /// A field as answered (the completion), else as asked.
    fn answered<T>(&self, get: impl Fn(&'a Value) -> Option<T>) -> Option<T> {
        self.done
            .and_then(|e| get(&e.value))
            .or_else(|| self.invoke.and_then(|e| get(&e.value)))
    }

    fn op_id(&self) -> u64 {
        self.invoke.or(self.done).map_or(0, |e| e.op)
    }

    fn process(&self) -> &'a str {
        self.invoke.or(self.done).map_or("?", |e| e.process.as_str())
    }
}

fn pair(history: &[Event]) -> Vec<Op<'_>> {
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

fn f_name(f: F) -> String {
    serde_json::to_value(f)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{f:?}"))
}

/// Run-clock nanoseconds as seconds, for messages.
fn secs(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

fn ts(t: DateTime<Utc>) -> String {
    t.format("%H:%M:%S%.3f").to_string()
}

/// An interval of the run clock carrying a token: one accepted write or one grant.
#[derive(Debug, Clone, Copy)]
struct Timed {
    start: u64,
    end: u64,
    token: i64,
    /// Index into the caller's list of operations.
    at: usize,
}

/// For each interval, the one with the highest token among those that ended strictly before it
/// began (its real-time predecessors). O(n log n): one sort by start, one by end, one sweep.
fn highest_before(items: &[Timed]) -> Vec<Option<usize>> {
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

struct Index<'a> {
    payouts: HashMap<Uuid, &'a PayoutRow>,
    /// Currency → its settlement account(s).
    settlement: HashMap<&'a str, Vec<Uuid>>,
    /// Payout → the fences of its ledger legs.
    leg_fences: HashMap<Uuid, Vec<i64>>,
}

impl<'a> Index<'a> {
    fn new(state: &'a FinalState) -> Self {
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

    fn state_of(&self, p: Uuid) -> &str {
        self.payouts.get(&p).map_or("UNKNOWN", |p| p.state.as_str())
    }

    /// The account an operation wrote: as the answer said, else the payout's account.
    fn account_of(&self, o: &Op<'_>) -> Option<Uuid> {
        o.answered(|v| v.account).or_else(|| {
            o.asked(|v| v.payout)
                .and_then(|p| self.payouts.get(&p))
                .map(|p| p.account_id)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// 1. rail

fn check_rail(state: &FinalState, ix: &Index<'_>) -> CheckResult {
    let mut c = CheckResult::new("rail", "each payout paid at most once, exactly the POSTED ones");
    let rail = &state.rail;
    c.count("rail_requests", rail.requests.len() as u64);
    c.count(
        "payouts_paid",
        rail.per_payout.values().filter(|p| p.paid > 0).count() as u64,
    );

    // Paid more than once: by the per-payout count, or listed by the stub itself.
    let mut twice: BTreeSet<Uuid> = rail
        .per_payout
        .iter()
        .filter(|(_, n)| n.paid > 1)
        .map(|(p, _)| *p)
        .collect();
    twice.extend(rail.paid_twice.iter().copied());
    for p in &twice {
        let n = rail.paid(*p);
        let keys = rail
            .per_payout
            .get(p)
            .map(|c| c.keys.join(", "))
            .unwrap_or_default();
        let mut v = Violation::new(
            "PAID_TWICE",
            format!(
                "payout {p} paid {n} times by the rail (keys: {keys}; state {})",
                ix.state_of(*p)
            ),
        )
        .payout(*p);
        if let Some(row) = ix.payouts.get(p) {
            v = v.account(row.account_id);
        }
        c.push(v);
    }
    c.count("paid_twice", twice.len() as u64);

    // Paid, but not POSTED: the money left and the books do not say so.
    for (p, n) in rail.per_payout.iter().filter(|(_, n)| n.paid > 0) {
        let posted = ix.payouts.get(p).is_some_and(|r| r.state == "POSTED");
        if !posted {
            let mut v = Violation::new(
                "PAID_NOT_RECORDED",
                format!(
                    "payout {p} paid {} time(s) by the rail but {} at the end",
                    n.paid,
                    ix.state_of(*p)
                ),
            )
            .payout(*p);
            if let Some(row) = ix.payouts.get(p) {
                v = v
                    .account(row.account_id)
                    .tokens(&row.claim_token.into_iter().collect::<Vec<_>>());
            }
            c.push(v);
            c.count("paid_not_recorded", 1);
        }
    }

    // POSTED, but the rail never paid it.
    for p in state.payouts.iter().filter(|p| p.state == "POSTED") {
        c.count("posted", 1);
        if rail.paid(p.payout_id) == 0 {
            c.push(
                Violation::new(
                    "RECORDED_NOT_PAID",
                    format!(
                        "payout {} ({} {}) is POSTED but the rail never paid it (received {})",
                        p.payout_id,
                        p.amount_minor,
                        p.currency,
                        rail.received(p.payout_id)
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id),
            );
            c.count("recorded_not_paid", 1);
        }
    }
    c.finish()
}

// ---------------------------------------------------------------------------------------------
// 2. books

fn check_books(state: &FinalState, ix: &Index<'_>) -> CheckResult {
    let mut c = CheckResult::new(
        "books",
        "balance = opening - debits + credits = opening - posted; reservations; two legs per POSTED",
    );

    // Sums in i128: a sum of i64 amounts cannot overflow it, so a break is a break, not a wrap.
    #[derive(Default)]
    struct Sums {
        debit: i128,
        credit: i128,
        posted: i128,
        reserved: i128,
    }
    let mut sums: HashMap<Uuid, Sums> = HashMap::new();
    let mut posted_by_currency: HashMap<&str, i128> = HashMap::new();
    for l in &state.ledger {
        let s = sums.entry(l.account_id).or_default();
        match l.direction.as_str() {
            "DEBIT" => s.debit += i128::from(l.amount_minor),
            "CREDIT" => s.credit += i128::from(l.amount_minor),
            other => c.push(
                Violation::new(
                    "BAD_LEG",
                    format!("ledger entry {} has direction {other}", l.entry_id),
                )
                .payout(l.payout_id)
                .account(l.account_id),
            ),
        }
    }
    for p in &state.payouts {
        let s = sums.entry(p.account_id).or_default();
        if p.state == "POSTED" {
            s.posted += i128::from(p.amount_minor);
            *posted_by_currency.entry(p.currency.trim()).or_default() += i128::from(p.amount_minor);
        }
        if RESERVING.contains(&p.state.as_str()) {
            s.reserved += i128::from(p.reserved_minor);
        } else if p.reserved_minor != 0 {
            c.push(
                Violation::new(
                    "RESERVATION_LEFT",
                    format!(
                        "payout {} is {} but still holds {} reserved (token {:?})",
                        p.payout_id, p.state, p.reserved_minor, p.reserved_token
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .tokens(&p.reserved_token.into_iter().collect::<Vec<_>>()),
            );
        }
    }

    for a in &state.accounts {
        let s = sums.remove(&a.account_id).unwrap_or_default();
        let opening = i128::from(a.opening_balance_minor);
        let balance = i128::from(a.balance_minor);
        if a.kind == "SETTLEMENT" {
            c.count("settlement_accounts", 1);
            let posted = posted_by_currency
                .get(a.currency.trim())
                .copied()
                .unwrap_or_default();
            if s.credit != posted || s.debit != 0 || balance != opening {
                c.push(
                    Violation::new(
                        "SETTLEMENT_MISMATCH",
                        format!(
                            "settlement account {} ({}): credits {} vs posted payouts {}, debits {}, balance {} vs opening {}",
                            a.account_id, a.currency, s.credit, posted, s.debit, balance, opening
                        ),
                    )
                    .account(a.account_id),
                );
            }
            continue;
        }
        c.count("customer_accounts", 1);
        let by_legs = opening - s.debit + s.credit;
        if balance != by_legs {
            c.push(
                Violation::new(
                    "BALANCE_MISMATCH",
                    format!(
                        "account {}: balance {} but opening {} - debits {} + credits {} = {} (off by {})",
                        a.account_id,
                        balance,
                        opening,
                        s.debit,
                        s.credit,
                        by_legs,
                        balance - by_legs
                    ),
                )
                .account(a.account_id),
            );
        }
        let by_payouts = opening - s.posted;
        if balance != by_payouts {
            c.push(
                Violation::new(
                    "POSTED_MISMATCH",
                    format!(
                        "account {}: balance {} but opening {} - posted payouts {} = {} (off by {})",
                        a.account_id,
                        balance,
                        opening,
                        s.posted,
                        by_payouts,
                        balance - by_payouts
                    ),
                )
                .account(a.account_id),
            );
        }
        if balance < 0 {
            c.push(
                Violation::new(
                    "NEGATIVE_BALANCE",
                    format!("account {}: balance {balance}", a.account_id),
                )
                .account(a.account_id),
            );
        }
        if i128::from(a.reserved_minor) != s.reserved {
            c.push(
                Violation::new(
                    "RESERVATION_MISMATCH",
                    format!(
                        "account {}: reserved {} but its payouts in flight hold {}",
                        a.account_id, a.reserved_minor, s.reserved
                    ),
                )
                .account(a.account_id),
            );
        }
        if a.reserved_minor < 0 || a.reserved_minor > a.balance_minor {
            c.push(
                Violation::new(
                    "RESERVATION_OUT_OF_RANGE",
                    format!(
                        "account {}: reserved {} outside 0..=balance {}",
                        a.account_id, a.reserved_minor, a.balance_minor
                    ),
                )
                .account(a.account_id),
            );
        }
    }
    // Legs on accounts the state does not list.
    for (id, _) in sums.into_iter().filter(|(_, s)| s.debit != 0 || s.credit != 0) {
        c.push(
            Violation::new(
                "LEG_ON_UNKNOWN_ACCOUNT",
                format!("ledger legs on account {id}, which is not in the account table"),
            )
            .account(id),
        );
    }

    // Per payout: its legs.
    let mut legs: HashMap<Uuid, Vec<&crate::state::LedgerRow>> = HashMap::new();
    for l in &state.ledger {
        legs.entry(l.payout_id).or_default().push(l);
    }
    for p in &state.payouts {
        let mine = legs.remove(&p.payout_id).unwrap_or_default();
        let fences: Vec<i64> = mine.iter().map(|l| l.fence).collect();
        if p.state != "POSTED" {
            if !mine.is_empty() {
                c.push(
                    Violation::new(
                        "UNEXPECTED_LEGS",
                        format!(
                            "payout {} is {} but has {} ledger leg(s), fences {:?}",
                            p.payout_id,
                            p.state,
                            mine.len(),
                            fences
                        ),
                    )
                    .payout(p.payout_id)
                    .account(p.account_id)
                    .tokens(&fences),
                );
            }
            continue;
        }
        let debits: Vec<_> = mine.iter().filter(|l| l.direction == "DEBIT").collect();
        let credits: Vec<_> = mine.iter().filter(|l| l.direction == "CREDIT").collect();
        if mine.is_empty() {
            c.push(
                Violation::new(
                    "MISSING_LEGS",
                    format!("payout {} is POSTED but has no ledger legs", p.payout_id),
                )
                .payout(p.payout_id)
                .account(p.account_id),
            );
            continue;
        }
        if debits.len() > 1 {
            let f: Vec<i64> = debits.iter().map(|l| l.fence).collect();
            c.push(
                Violation::new(
                    "DOUBLE_POSTING",
                    format!(
                        "payout {} has {} DEBIT legs (fences {:?}): posted more than once",
                        p.payout_id,
                        debits.len(),
                        f
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .tokens(&f),
            );
            continue;
        }
        let settlement = ix
            .settlement
            .get(p.currency.trim())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let well_formed = mine.len() == 2
            && debits.len() == 1
            && credits.len() == 1
            && debits[0].account_id == p.account_id
            && settlement.contains(&credits[0].account_id)
            && debits[0].amount_minor == p.amount_minor
            && credits[0].amount_minor == p.amount_minor
            && debits[0].fence == credits[0].fence;
        if !well_formed {
            let shape: Vec<String> = mine
                .iter()
                .map(|l| {
                    format!(
                        "{} {} on {} fence {}",
                        l.direction, l.amount_minor, l.account_id, l.fence
                    )
                })
                .collect();
            c.push(
                Violation::new(
                    "MALFORMED_LEGS",
                    format!(
                        "payout {} (POSTED, {} {} from {}): legs [{}], want one DEBIT on the account and one CREDIT on the {} settlement account, same amount, same fence",
                        p.payout_id,
                        p.amount_minor,
                        p.currency,
                        p.account_id,
                        shape.join("; "),
                        p.currency
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .tokens(&fences),
            );
        }
    }
    for (p, l) in legs {
        c.push(
            Violation::new(
                "LEG_FOR_UNKNOWN_PAYOUT",
                format!(
                    "{} ledger leg(s) for payout {p}, which is not in the payout table",
                    l.len()
                ),
            )
            .payout(p),
        );
    }
    c.count("ledger_legs", state.ledger.len() as u64);
    c.finish()
}

// ---------------------------------------------------------------------------------------------
// 3. tokens

fn check_tokens(ops: &[Op<'_>], state: &FinalState, ix: &Index<'_>) -> CheckResult {
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
fn check_fences(ops: &[Op<'_>], ix: &Index<'_>) -> CheckResult {
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
fn wrote(o: &Op<'_>, ix: &Index<'_>) -> bool {
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
fn write_violation(
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

// ---------------------------------------------------------------------------------------------
// 4. grants

#[derive(Debug, Clone)]
struct Grant<'a> {
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

fn check_grants(ops: &[Op<'_>], state: &FinalState) -> CheckResult {
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

// ---------------------------------------------------------------------------------------------
// 5. ends

fn check_ends(ops: &[Op<'_>], state: &FinalState) -> CheckResult {
    let mut c = CheckResult::new(
        "ends",
        "every payout ended, in time after the last heal; reconciliation clean",
    );
    for p in &state.payouts {
        if TERMINAL.contains(&p.state.as_str()) {
            continue;
        }
        c.count("stuck", 1);
        c.push(
            Violation::new(
                "STUCK",
                format!(
                    "payout {} ({} {}, account {}) is {} at the end: reserved {}, claim token {}",
                    p.payout_id,
                    p.amount_minor,
                    p.currency,
                    p.account_id,
                    p.state,
                    p.reserved_minor,
                    p.claim_token.map_or("none".to_owned(), |t| t.to_string())
                ),
            )
            .payout(p.payout_id)
            .account(p.account_id)
            .tokens(&p.claim_token.into_iter().collect::<Vec<_>>()),
        );
    }

    // Slow to end: a terminal payout's last accepted write is due within the settle bound after
    // the last heal — or after it was created, for one created later than that.
    let mut created: HashMap<Uuid, u64> = HashMap::new();
    let mut last_write: HashMap<Uuid, u64> = HashMap::new();
    for o in ops {
        match o.f {
            F::Create => {
                if let (Some(p), Some(inv)) = (o.answered(|v| v.payout), o.invoke) {
                    let e = created.entry(p).or_insert(inv.time_ns);
                    *e = (*e).min(inv.time_ns);
                }
            }
            F::Claim | F::Transition | F::Post | F::Submit | F::Resolve if o.is_ok() => {
                if let Some(p) = o.asked(|v| v.payout) {
                    let e = last_write.entry(p).or_insert(0);
                    *e = (*e).max(o.end());
                }
            }
            _ => {}
        }
    }
    let run = &state.run;
    for p in state
        .payouts
        .iter()
        .filter(|p| TERMINAL.contains(&p.state.as_str()))
    {
        let Some(&last) = last_write.get(&p.payout_id) else {
            continue;
        };
        let from = run
            .last_heal_ns
            .max(created.get(&p.payout_id).copied().unwrap_or(0));
        let due = from.saturating_add(run.settle_bound_ns);
        if last > due {
            c.count("slow", 1);
            c.push(
                Violation::new(
                    "SLOW_TO_END",
                    format!(
                        "payout {} ended {} with its last write at {}, after {} (= {} + settle bound {})",
                        p.payout_id,
                        p.state,
                        secs(last),
                        secs(due),
                        secs(from),
                        secs(run.settle_bound_ns)
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .times(&[last, due]),
            );
        }
    }

    let r = &state.reconciliation;
    if r.get("clean").and_then(serde_json::Value::as_bool) != Some(true) {
        c.push(Violation::new(
            "RECONCILIATION_NOT_CLEAN",
            format!("payment-resource's reconciliation is not clean: {}", brief(r)),
        ));
    }
    c.finish()
}

/// The reconciliation report in a line: its break counts and the start of each non-empty list.
fn brief(r: &serde_json::Value) -> String {
    const MAX: usize = 300;
    let mut parts = Vec::new();
    if let Some(counts) = r.get("breakCounts") {
        parts.push(format!("breakCounts {counts}"));
    }
    if let Some(obj) = r.as_object() {
        for (k, v) in obj {
            if let Some(list) = v.as_array()
                && !list.is_empty()
            {
                let mut text = serde_json::Value::Array(list.clone()).to_string();
                if text.len() > MAX {
                    let cut = (0..=MAX).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                    text.truncate(cut);
                    text.push('…');
                }
                parts.push(format!("{k} ({}): {text}", list.len()));
            }
        }
    }
    if parts.is_empty() {
        let mut text = r.to_string();
        if text.len() > MAX {
            let cut = (0..=MAX).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            text.truncate(cut);
            text.push('…');
        }
        parts.push(text);
    }
    parts.join("; ")
}

// ---------------------------------------------------------------------------------------------
// 6. creates

fn check_creates(ops: &[Op<'_>], state: &FinalState) -> CheckResult {
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

// ---------------------------------------------------------------------------------------------
// The summary

fn summarize(
    ops: &[Op<'_>],
    state: &FinalState,
    rail: &CheckResult,
    books: &CheckResult,
    tokens: &CheckResult,
    grants: &CheckResult,
    ends: &CheckResult,
) -> Summary {
    let mut s = Summary::default();
    for o in ops {
        s.operations.add(o);
        s.operations_by_f.entry(f_name(o.f)).or_default().add(o);
        if let Some(done) = o.done
            && done.kind == Type::Fail
            && done.value.code.as_deref() == Some("FENCED_OUT")
        {
            let resource = done
                .value
                .resource
                .clone()
                .unwrap_or_else(|| "unknown".to_owned());
            *s.fenced_out_by_resource.entry(resource).or_default() += 1;
        }
    }
    for p in &state.payouts {
        *s.payouts_by_state.entry(p.state.clone()).or_default() += 1;
        match p.state.as_str() {
            "POSTED" => s.payouts_posted += 1,
            "FAILED" => s.payouts_failed += 1,
            "ABANDONED" => s.payouts_abandoned += 1,
            _ => s.payouts_in_flight += 1,
        }
    }
    s.rail_fenced_submissions = state
        .rail_submissions
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("FENCED"))
        .count() as u64;
    s.double_payments = rail.counts.get("paid_twice").copied().unwrap_or(0);
    s.ledger_breaks = books.violations.len() as u64;
    s.non_monotone_tokens = tokens.violations.len() as u64;
    s.grant_violations = grants.violations.len() as u64;
    s.stuck_payouts = ends.counts.get("stuck").copied().unwrap_or(0);
    s.slow_payouts = ends.counts.get("slow").copied().unwrap_or(0);
    s.reconciliation_clean = state
        .reconciliation
        .get("clean")
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    s
}
