//! `kubectl dlock status`: what the operator reports about one LockService or PaymentStack, read
//! from its status — conditions, the last actions, the fencing sequence against the paydbs'
//! high-water (a PaymentStack shows its LockService's).

use std::fmt::Write;

use dlock_operator::crd::DlockStatus;

use crate::outcome::describe;

/// The lines for one object. `fencing_of` is the LockService whose fencing check applies (the
/// object itself for a LockService, the referenced one for a PaymentStack), with its status.
pub fn render(
    kind: &str,
    namespace: &str,
    name: &str,
    status: Option<&DlockStatus>,
    fencing_of: Option<(&str, Option<&DlockStatus>)>,
) -> String {
    let mut out = String::new();
    let Some(s) = status else {
        let _ = writeln!(
            out,
            "{kind} {namespace}/{name}: no status yet (is the operator running?)"
        );
        return out;
    };
    let _ = writeln!(out, "{kind} {namespace}/{name}: {}", s.phase);
    let _ = writeln!(out, "Conditions:");
    for c in &s.conditions {
        let _ = writeln!(
            out,
            "  {:<12} {:<6} {:<24} {} (since {})",
            c.type_, c.status, c.reason, c.message, c.last_transition_time.0
        );
    }
    if let Some(g) = &s.gate {
        let _ = writeln!(
            out,
            "Gate: CLOSED by restore {} since {}: {}",
            g.action_id, g.since, g.message
        );
    }
    if let Some((ls_name, ls_status)) = fencing_of {
        match ls_status.and_then(|st| st.fencing.as_ref()) {
            Some(f) => {
                let verdict = if f.is_behind() {
                    "BEHIND: every new grant is fenced out, run `kubectl dlock restore`"
                } else {
                    "ok"
                };
                let _ = writeln!(
                    out,
                    "Fencing (LockService {ls_name}): sequence {} vs high-water {}{} checked {}: {verdict}",
                    f.sequence,
                    f.high_water,
                    f.high_water_stack
                        .as_deref()
                        .map(|s| format!(" (PaymentStack {s})"))
                        .unwrap_or_default(),
                    f.checked_at,
                );
            }
            None => {
                let _ = writeln!(out, "Fencing (LockService {ls_name}): not checked yet");
            }
        }
    }
    if let Some(m) = &s.migration {
        let _ = writeln!(
            out,
            "Migration: {} {} (schema {}){}",
            m.history,
            if m.succeeded { "applied" } else { "not applied" },
            m.applied_version.map_or("?".to_owned(), |v| v.to_string()),
            m.job_name
                .as_deref()
                .map(|j| format!(", Job {j}"))
                .unwrap_or_default()
        );
    }
    if let Some(e) = &s.etcd {
        let _ = writeln!(out, "etcd: {} ({})", e.ready, e.mode);
    }
    for (component, url) in &s.endpoints {
        let _ = writeln!(out, "Endpoint {component}: {url}");
    }
    if !s.actions.is_empty() {
        let _ = writeln!(out, "Actions (most recent last):");
        for a in &s.actions {
            for line in describe(a).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_operator::crd::actions::{ActionPhase, ActionStatus, ActionType, FencingStatus};

    fn status() -> DlockStatus {
        serde_json::from_value(serde_json::json!({
            "phase": "Degraded",
            "conditions": [{"type": "Degraded", "status": "True", "reason": "FencingSequenceBehind",
                            "message": "fencing_token_seq is at 3", "lastTransitionTime": "2026-03-01T10:00:00Z"}],
            "endpoints": {"lockServer": "http://locks-lock-server.pay.svc:8080"},
        }))
        .unwrap()
    }

    #[test]
    fn a_lock_service_shows_conditions_actions_and_the_sequence_against_the_high_water() {
        let mut s = status();
        s.fencing = Some(FencingStatus {
            sequence: 3,
            high_water: 9,
            high_water_stack: Some("shop".into()),
            checked_at: "2026-03-01T10:00:00Z".into(),
            job_name: None,
        });
        let mut a = ActionStatus::new("ff-1", ActionType::Restore, ActionPhase::Succeeded);
        a.sequence_before = Some(3);
        a.sequence_after = Some(1009);
        s.actions.push(a);
        let text = render("LockService", "pay", "locks", Some(&s), Some(("locks", Some(&s))));
        for want in [
            "LockService pay/locks: Degraded",
            "Degraded     True   FencingSequenceBehind",
            "sequence 3 vs high-water 9 (PaymentStack shop)",
            "BEHIND",
            "Endpoint lockServer: http://locks-lock-server.pay.svc:8080",
            "ff-1 Restore Succeeded",
            "sequence 3 -> 1009",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        let none = render("PaymentStack", "pay", "shop", None, None);
        assert!(none.contains("no status yet"), "{none}");
        let unchecked = render(
            "PaymentStack",
            "pay",
            "shop",
            Some(&status()),
            Some(("locks", None)),
        );
        assert!(
            unchecked.contains("Fencing (LockService locks): not checked yet"),
            "{unchecked}"
        );
    }
}
