//! `kubectl dlock status`: what the operator reports about one LockService or PaymentStack, read
//! from its status — conditions, the last actions, the fencing sequence against the paydbs'
//! high-water (a PaymentStack shows its LockService's), lock-server's last jump of the sequence.

use std::fmt::Write;

use dlock_operator::crd::DlockStatus;

use crate::outcome::describe;

/// One object as `status` shows it.
#[derive(Debug, Clone)]
pub struct View {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub status: Option<DlockStatus>,
    /// The LockService whose fencing check applies, with its status (see [`render`]).
    pub fencing_of: Option<(String, Option<DlockStatus>)>,
}

impl View {
    /// The lines for people.
    pub fn render(&self) -> String {
        render(
            self.kind,
            &self.namespace,
            &self.name,
            self.status.as_ref(),
            self.fencing_of.as_ref().map(|(n, s)| (n.as_str(), s.as_ref())),
        )
    }

    /// The object for `-o json`: its `status` exactly as the CRD's (camelCase; `null` before the
    /// operator wrote one) and the fencing verdict the table prints, as data.
    pub fn to_json(&self) -> serde_json::Value {
        let fencing = self.fencing_of.as_ref().map(|(ls, st)| {
            let f = st.as_ref().and_then(|s| s.fencing.as_ref());
            serde_json::json!({
                "lockService": ls,
                "checked": f.is_some(),
                "behind": f.map(|f| f.is_behind()),
                "sequence": f.map(|f| f.sequence),
                "highWater": f.map(|f| f.high_water),
                "highWaterStack": f.and_then(|f| f.high_water_stack.clone()),
                "checkedAt": f.map(|f| f.checked_at.clone()),
            })
        });
        serde_json::json!({
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.status.as_ref().map(|s| s.phase.to_string()),
            "fencing": fencing,
            "status": self.status,
        })
    }
}

/// `-o json`: `{"items": [...]}`, one item per object shown (a bare NAME can name both kinds).
pub fn json(views: &[View]) -> String {
    let items: Vec<serde_json::Value> = views.iter().map(View::to_json).collect();
    serde_json::to_string_pretty(&serde_json::json!({ "items": items }))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

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

    #[test]
    fn json_has_the_status_as_the_crd_names_it_and_the_fencing_verdict() {
        let mut s = status();
        s.fencing = Some(FencingStatus {
            sequence: 3,
            high_water: 9,
            high_water_stack: Some("shop".into()),
            checked_at: "2026-03-01T10:00:00Z".into(),
            job_name: None,
        });
        let views = [
            View {
                kind: "LockService",
                namespace: "pay".into(),
                name: "locks".into(),
                status: Some(s.clone()),
                fencing_of: Some(("locks".into(), Some(s.clone()))),
            },
            View {
                kind: "PaymentStack",
                namespace: "pay".into(),
                name: "shop".into(),
                status: None,
                fencing_of: Some(("locks".into(), None)),
            },
        ];
        let doc: serde_json::Value = serde_json::from_str(&json(&views)).unwrap();
        let items = doc["items"].as_array().unwrap();
        assert_eq!(items.len(), 2);
        let ls = &items[0];
        assert_eq!(
            (ls["kind"].as_str(), ls["name"].as_str()),
            (Some("LockService"), Some("locks"))
        );
        assert_eq!(ls["phase"], "Degraded");
        assert_eq!(ls["status"]["conditions"][0]["reason"], "FencingSequenceBehind");
        assert_eq!(
            ls["status"]["conditions"][0]["lastTransitionTime"],
            "2026-03-01T10:00:00Z"
        );
        assert_eq!(
            ls["status"]["endpoints"]["lockServer"],
            "http://locks-lock-server.pay.svc:8080"
        );
        assert_eq!(ls["status"]["fencing"]["highWater"], 9);
        let f = &ls["fencing"];
        assert_eq!(f["lockService"], "locks");
        assert_eq!(
            (f["checked"].as_bool(), f["behind"].as_bool()),
            (Some(true), Some(true))
        );
        assert_eq!(
            (f["sequence"].as_i64(), f["highWater"].as_i64()),
            (Some(3), Some(9))
        );
        assert_eq!(f["highWaterStack"], "shop");
        // The status round-trips into the CRD's own type.
        let back: DlockStatus = serde_json::from_value(ls["status"].clone()).unwrap();
        assert_eq!(back, s);
        let ps = &items[1];
        assert!(ps["status"].is_null() && ps["phase"].is_null(), "{ps}");
        assert_eq!(
            (
                ps["fencing"]["checked"].as_bool(),
                ps["fencing"]["behind"].is_null()
            ),
            (Some(false), true)
        );
    }
}
