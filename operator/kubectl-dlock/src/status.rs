//! `kubectl dlock status`: what the operator reports about one LockService or PaymentStack, read
//! from its status — conditions, the last actions, the fencing sequence against the paydbs'
//! high-water (a PaymentStack shows its LockService's), lock-server's last jump of the sequence.

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
    if let Some(q) = &s.sequence {
        match &q.last_jump {
            Some(j) => {
                let _ = writeln!(
                    out,
                    "Sequence jump: {} on timeline {} at {}: found {} -> {} (system {}, postmaster started {}){}",
                    j.cause,
                    j.timeline,
                    j.at,
                    j.found,
                    j.jumped_to,
                    j.system_identifier,
                    j.postmaster_started,
                    q.fencing_check
                        .as_deref()
                        .map(|c| format!("; fencing check {c} running"))
                        .unwrap_or_default(),
                );
            }
            None => {
                let _ = writeln!(out, "Sequence jump: none reported yet");
            }
        }
        if !q.jumps_enabled {
            let _ = writeln!(
                out,
                "Sequence jump: DISABLED in lock-server (a negative control): a promoted or restored lockdb can reuse tokens"
            );
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
    use dlock_operator::crd::{JumpCause, SequenceJump, SequenceStatus};

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
        s.sequence = Some(SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(SequenceJump {
                at: "2026-03-01T09:59:00Z".into(),
                cause: JumpCause::NewTimeline,
                found: 41,
                jumped_to: 562_949_953_421_312,
                system_identifier: "7345".into(),
                timeline: 2,
                postmaster_started: "2026-03-01T09:58:00Z".into(),
            }),
            fencing_check: Some("locks-fencing-check-1a2b".into()),
            restore: None,
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
            "Sequence jump: new_timeline on timeline 2 at 2026-03-01T09:59:00Z: found 41 -> 562949953421312",
            "fencing check locks-fencing-check-1a2b running",
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

    /// What lock-server serializes (`dlock_wire`) is what the operator reads into status and this
    /// command prints: the operator keeps its own mirror of the answer, held to the wire type here.
    #[test]
    fn lock_servers_sequence_answer_reads_into_the_status_and_prints() {
        use chrono::{TimeZone, Utc};
        use dlock_wire::lock as wire;
        let answer = wire::SequenceView {
            backend: "postgres".into(),
            jumps_enabled: true,
            last_jump: Some(wire::SequenceJump {
                at: Utc.with_ymd_and_hms(2026, 3, 1, 10, 0, 20).unwrap()
                    + chrono::Duration::nanoseconds(412_000_123),
                cause: wire::JumpCause::PostmasterRestart,
                found: 285_928_147_929_390,
                jumped_to: 568_206_780_723_200,
                system_identifier: "7345123456789012345".into(),
                timeline: 2,
                postmaster_started: Utc.with_ymd_and_hms(2026, 3, 1, 9, 59, 58).unwrap(),
            }),
        };
        let body = serde_json::to_string(&answer).unwrap();
        let read: dlock_operator::actions::sequence::SequenceView = serde_json::from_str(&body).unwrap();
        assert!(read.jumps_enabled && read.backend == "postgres");
        let j = read.last_jump.clone().unwrap();
        assert_eq!(j.cause, JumpCause::PostmasterRestart);
        assert_eq!(j.cause.as_str(), "postmaster_restart");
        assert_eq!(j.at, "2026-03-01T10:00:20.412000123Z");
        assert_eq!(j.postmaster_started, "2026-03-01T09:59:58Z");
        // Every cause lock-server can send has its counterpart.
        for cause in [
            wire::JumpCause::Start,
            wire::JumpCause::NewSystem,
            wire::JumpCause::NewTimeline,
            wire::JumpCause::PostmasterRestart,
        ] {
            let text = serde_json::to_value(cause).unwrap();
            let mine: JumpCause = serde_json::from_value(text.clone()).unwrap();
            assert_eq!(text, mine.as_str());
        }
        let mut s = status();
        s.sequence = Some(SequenceStatus {
            jumps_enabled: read.jumps_enabled,
            last_jump: read.last_jump,
            fencing_check: None,
            restore: None,
        });
        let text = render("LockService", "pay", "locks", Some(&s), None);
        assert!(
            text.contains("Sequence jump: postmaster_restart on timeline 2 at 2026-03-01T10:00:20.412000123Z: found 285928147929390 -> 568206780723200"),
            "{text}"
        );
        assert!(!text.contains("fencing check"), "{text}");
    }
}
