//! The checker's answer: one result per check ([`CheckResult`], its [`Violation`]s) and the
//! numbers the campaign report prints beside them ([`Summary`]), gathered into a [`Verdict`].

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use crate::history::Type;
use crate::state::FinalState;

use super::ops::{Op, f_name};

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
    pub(super) fn new(kind: &str, detail: String) -> Self {
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

    pub(super) fn payout(mut self, p: Uuid) -> Self {
        self.payout = Some(p);
        self
    }

    pub(super) fn account(mut self, a: Uuid) -> Self {
        self.account = Some(a);
        self
    }

    pub(super) fn key(mut self, k: &str) -> Self {
        self.key = Some(k.to_owned());
        self
    }

    pub(super) fn tokens(mut self, t: &[i64]) -> Self {
        self.tokens = t.to_vec();
        self
    }

    pub(super) fn times(mut self, t: &[u64]) -> Self {
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
    pub(super) fn new(name: &str, what: &str) -> Self {
        Self {
            name: name.to_owned(),
            what: what.to_owned(),
            passed: true,
            counts: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    pub(super) fn count(&mut self, name: &str, n: u64) {
        *self.counts.entry(name.to_owned()).or_default() += n;
    }

    pub(super) fn push(&mut self, v: Violation) {
        self.violations.push(v);
    }

    pub(super) fn finish(mut self) -> Self {
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
    pub(super) fn add(&mut self, o: &Op<'_>) {
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

pub(super) fn summarize(
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
