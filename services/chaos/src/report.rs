//! One row of docs/reliability.md's table of runs, from a run's outcome.

use std::collections::BTreeMap;

use crate::run::Outcome;

/// The header of the runs table (docs/reliability.md), matching [`row`].
pub const HEADER: &str = "| seed | backend | nemeses (faults) | payouts | s | ops ok / fail / info | posted / failed / abandoned | stale refused (account, ledger, payout, rail) | double paid | ledger breaks | non-monotone | stuck | verdict |\n\
| ---: | --- | --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- |";

/// `| seed | backend | … | verdict |` for one run.
pub fn row(o: &Outcome) -> String {
    let s = &o.verdict.summary;
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    for f in &o.state.run.faults {
        *faults.entry(f.nemesis.as_str()).or_default() += 1;
    }
    let faults = if faults.is_empty() {
        "none".to_owned()
    } else {
        faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let refused = |r: &str| s.fenced_out_by_resource.get(r).copied().unwrap_or(0);
    let mut verdict = if o.verdict.ok() {
        "PASS".to_owned()
    } else {
        format!("FAIL ({})", o.verdict.failed().join(", "))
    };
    if !o.state.run.payment_fencing || !o.state.run.rail_fencing {
        verdict.push_str(" · kill switches off");
    }
    if !o.state.run.sequence_jump {
        verdict.push_str(" · no sequence jump (negative control)");
    }
    // The databases that ran with a standby, and how it replicated.
    let mut backend = match (&o.state.run.replication, o.state.run.replicated.is_empty()) {
        (Some(mode), false) => format!(
            "{} ({} {mode} standby)",
            o.state.run.backend,
            o.state.run.replicated.join("+")
        ),
        _ => o.state.run.backend.clone(),
    };
    // How the HTTP hops ran: rows recorded before the campaign ran with TLS carry no mark.
    backend.push_str(if o.state.run.tls { ", TLS" } else { ", plain HTTP" });
    format!(
        "| {} | {} | {} | {} | {:.0} | {} / {} / {} | {} / {} / {} | {}, {}, {}, {} ({} FENCED rows) | {} | {} | {} | {} | {} |",
        o.state.run.seed,
        backend,
        faults,
        o.state.payouts.len(),
        o.duration.as_secs_f64(),
        s.operations.ok,
        s.operations.fail,
        s.operations.info + s.operations.unanswered,
        s.payouts_posted,
        s.payouts_failed,
        s.payouts_abandoned,
        refused("account"),
        refused("ledger"),
        refused("payout"),
        refused("rail"),
        s.rail_fenced_submissions,
        s.double_payments,
        s.ledger_breaks,
        s.non_monotone_tokens,
        s.stuck_payouts,
        verdict,
    )
}
