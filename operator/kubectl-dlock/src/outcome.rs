//! How a command ended, as its exit code and its last lines.

use dlock_operator::crd::actions::{ActionPhase, ActionStatus};

/// Exit codes (clap's own usage errors are 2 as well).
pub const EXIT_OK: u8 = 0;
/// The action ended `Failed`.
pub const EXIT_ACTION_FAILED: u8 = 1;
/// The request could not be made: a bad argument, an object that does not exist.
pub const EXIT_USAGE: u8 = 2;
/// `--wait` ran out before the action ended (it goes on; `kubectl dlock status` follows it).
pub const EXIT_TIMED_OUT: u8 = 3;
/// Kubernetes or lock-server could not be reached, or answered an error.
pub const EXIT_ERROR: u8 = 4;

/// What a command achieved.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The request is written; nobody waited for it.
    Requested { id: String },
    /// The action ended (`Succeeded` or `Failed`).
    Finished(ActionStatus),
    /// `--wait` ran out; the last state seen, if any.
    TimedOut { id: String, last: Option<ActionStatus> },
    /// A read-only command printed what it read.
    Shown,
}

impl Outcome {
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Requested { .. } | Outcome::Shown => EXIT_OK,
            Outcome::Finished(a) if a.phase == ActionPhase::Succeeded => EXIT_OK,
            Outcome::Finished(_) => EXIT_ACTION_FAILED,
            Outcome::TimedOut { .. } => EXIT_TIMED_OUT,
        }
    }
}

/// One action, as a line and its details: `r-42 Revoke Succeeded (REVOKED) …`.
pub fn describe(a: &ActionStatus) -> String {
    let mut out = format!("{} {:?} {:?}", a.id, a.type_, a.phase);
    if let Some(step) = a.step.filter(|_| !a.phase.is_final()) {
        out.push_str(&format!(" at {step:?}"));
    }
    if let Some(o) = &a.outcome {
        out.push_str(&format!(" ({o})"));
    }
    let mut details = Vec::new();
    if let Some(k) = &a.key {
        details.push(format!("key {k}"));
    }
    if let Some(t) = a.target_token {
        details.push(format!("target token {t}"));
    }
    if let Some(o) = &a.previous_owner {
        details.push(format!("previous owner {o}"));
    }
    if let Some(t) = a.previous_token {
        details.push(format!("previous token {t}"));
    }
    if let Some(t) = a.current_token {
        details.push(format!("current holder's token {t}"));
    }
    if let Some(m) = a.margin {
        details.push(format!("margin {m}"));
    }
    for s in &a.stacks {
        details.push(format!("paydb of {}: high-water {}", s.name, s.highest));
    }
    if let (Some(b), Some(af)) = (a.sequence_before, a.sequence_after) {
        details.push(format!("sequence {b} -> {af}"));
    } else if let Some(b) = a.sequence_before {
        details.push(format!("sequence before {b}"));
    }
    if let Some(t) = a.target_sequence {
        details.push(format!("target sequence {t}"));
    }
    if let Some(f) = &a.finished_at {
        details.push(format!("finished {f}"));
    }
    if !details.is_empty() {
        out.push_str("\n  ");
        out.push_str(&details.join(", "));
    }
    if let Some(m) = &a.message {
        out.push_str("\n  ");
        out.push_str(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_operator::crd::actions::{ActionStep, ActionType};

    fn action(phase: ActionPhase) -> ActionStatus {
        ActionStatus::new("r-1", ActionType::Revoke, phase)
    }

    #[test]
    fn outcomes_map_to_exit_codes() {
        assert_eq!(Outcome::Finished(action(ActionPhase::Succeeded)).exit_code(), 0);
        assert_eq!(Outcome::Finished(action(ActionPhase::Failed)).exit_code(), 1);
        assert_eq!(
            Outcome::TimedOut {
                id: "r-1".into(),
                last: Some(action(ActionPhase::Running))
            }
            .exit_code(),
            3
        );
        assert_eq!(Outcome::Requested { id: "r-1".into() }.exit_code(), 0);
        assert_eq!(Outcome::Shown.exit_code(), 0);
    }

    #[test]
    fn a_failed_revoke_says_why() {
        let mut a = action(ActionPhase::Failed);
        a.outcome = Some("HELD_BY_OTHER_TOKEN".into());
        a.key = Some("account:7".into());
        a.target_token = Some(12);
        a.current_token = Some(15);
        a.message = Some("a newer holder has the key; it was left alone".into());
        let text = describe(&a);
        assert!(
            text.starts_with("r-1 Revoke Failed (HELD_BY_OTHER_TOKEN)"),
            "{text}"
        );
        assert!(
            text.contains("target token 12") && text.contains("current holder's token 15"),
            "{text}"
        );
        assert!(text.ends_with("left alone"), "{text}");
        let mut running = action(ActionPhase::Running);
        running.step = Some(ActionStep::Revoke);
        assert_eq!(describe(&running), "r-1 Revoke Running at Revoke");
    }
}
