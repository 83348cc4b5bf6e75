//! Force-revoke, pinned to the fencing token recorded in status before anything is sent: a retry
//! after a crash can only ever name the recorded token, never a newer holder's.

use serde::Deserialize;

use super::{ActionInputs, ActionPlan, find};
use crate::crd::actions::{ActionPhase, ActionStatus, ActionStep, ActionType, RevokeRequest};
use crate::reasons::{EventNote, Reason};

/// What `GET /v1/locks/{key}` said.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockView {
    pub state: String,
    #[serde(default)]
    pub fencing_token: Option<i64>,
    #[serde(default)]
    pub owner_id: Option<String>,
}

impl LockView {
    pub fn live_token(&self) -> Option<i64> {
        (self.state == "HELD").then_some(self.fencing_token).flatten()
    }
}

/// lock-server's answer to a pinned revoke.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokeAnswer {
    pub outcome: String,
    #[serde(default)]
    pub previous_owner: Option<String>,
    #[serde(default)]
    pub previous_token: Option<i64>,
    #[serde(default)]
    pub current_token: Option<i64>,
}

/// The pinned revoke to send: key and the token recorded in status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeCall {
    pub id: String,
    pub key: String,
    pub token: i64,
    pub reason: String,
    pub requested_by: String,
}

/// The next step of a revoke: wait for lock-server, record the target token, send the pinned revoke
/// of the recorded token, or nothing once finished.
pub(super) fn plan(inputs: &ActionInputs, r: &RevokeRequest, out: &mut ActionPlan) {
    let existing = find(&inputs.actions, &r.id);
    if existing.is_some_and(|a| a.phase.is_final()) {
        return;
    }
    if let Some(a) = existing
        && a.phase == ActionPhase::Running
    {
        // The target token is persisted: send exactly that revoke (again, after a crash).
        if let Some(token) = a.target_token {
            out.busy = true;
            if inputs.lock_server_available {
                out.revoke = Some(RevokeCall {
                    id: r.id.clone(),
                    key: a.key.clone().unwrap_or_else(|| r.key.clone()),
                    token,
                    reason: r.reason.clone(),
                    requested_by: a.requested_by.clone().unwrap_or_else(|| r.requested_by.clone()),
                });
            }
            return;
        }
    }
    let mut s = existing
        .cloned()
        .unwrap_or_else(|| ActionStatus::new(&r.id, ActionType::Revoke, ActionPhase::Pending));
    s.key = Some(r.key.clone());
    s.requested_by = Some(r.requested_by.clone());
    s.started_at.get_or_insert_with(|| inputs.now.clone());
    out.busy = true;
    if !inputs.lock_server_available {
        let msg = if inputs.gate.is_some() {
            "waiting: lock traffic is gated by a restore fast-forward"
        } else {
            "waiting for lock-server to be available"
        };
        if existing.is_none() || s.message.as_deref() != Some(msg) {
            s.phase = ActionPhase::Pending;
            s.message = Some(msg.into());
            out.event(Reason::RevokeWaiting, format!("{}: {msg}", r.id));
            out.put(s);
        }
        return;
    }
    let Some(lock) = &inputs.lock else {
        // Not observed (the controller reads it only when lock-server is available): next time.
        return;
    };
    match lock.live_token() {
        Some(token) => {
            s.phase = ActionPhase::Running;
            s.step = Some(ActionStep::Revoke);
            s.target_token = Some(token);
            s.message = Some(format!(
                "revoking the grant with fencing token {token} on {} (owner {})",
                r.key,
                lock.owner_id.as_deref().unwrap_or("?")
            ));
            out.event(
                Reason::RevokeTargetRecorded,
                format!("{}: target token {token} on key {} recorded", r.id, r.key),
            );
        }
        None => {
            s.phase = ActionPhase::Succeeded;
            s.outcome = Some("NOT_HELD".into());
            s.message = Some(format!(
                "{} has no live grant ({}); nothing revoked",
                r.key, lock.state
            ));
            s.finished_at = Some(inputs.now.clone());
            out.event(
                Reason::RevokeSucceeded,
                format!("{}: {} is not held; nothing revoked", r.id, r.key),
            );
        }
    }
    out.put(s);
}

/// Records lock-server's answer to the pinned revoke of `running`.
pub fn outcome(running: &ActionStatus, answer: &RevokeAnswer, now: &str) -> (ActionStatus, EventNote) {
    let mut s = running.clone();
    let key = s.key.clone().unwrap_or_default();
    let token = s.target_token.unwrap_or_default();
    s.outcome = Some(answer.outcome.clone());
    s.previous_owner = answer.previous_owner.clone();
    s.previous_token = answer.previous_token;
    s.current_token = answer.current_token;
    s.finished_at = Some(now.to_owned());
    s.step = None;
    let (phase, reason, message) = match answer.outcome.as_str() {
        "REVOKED" => (
            ActionPhase::Succeeded,
            Reason::RevokeSucceeded,
            format!(
                "revoked the grant of {} with token {token} on {key}",
                answer.previous_owner.as_deref().unwrap_or("?")
            ),
        ),
        "ALREADY_REVOKED" => (
            ActionPhase::Succeeded,
            Reason::RevokeSucceeded,
            format!("token {token} on {key} had already been revoked (a retry); nothing else touched"),
        ),
        "NOT_HELD" => (
            ActionPhase::Succeeded,
            Reason::RevokeSucceeded,
            format!("token {token} on {key} was released before the revoke; nothing revoked"),
        ),
        "HELD_BY_OTHER_TOKEN" => (
            ActionPhase::Failed,
            Reason::RevokeFailed,
            format!(
                "token {token} on {key} is gone; the key is now held by token {}, which was left alone (request a new id to revoke it)",
                answer
                    .current_token
                    .map_or_else(|| "?".to_owned(), |t| t.to_string())
            ),
        ),
        other => (
            ActionPhase::Failed,
            Reason::RevokeFailed,
            format!("lock-server answered an unknown outcome {other:?}; nothing assumed"),
        ),
    };
    s.phase = phase;
    s.message = Some(message.clone());
    let warning = phase == ActionPhase::Failed;
    (
        s,
        EventNote {
            reason,
            warning,
            note: format!("{}: {message}", running.id),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{held, revoke_inputs, run};
    use super::*;

    #[test]
    fn revoke_records_the_target_before_it_acts_then_revokes_exactly_that_token() {
        let mut i = revoke_inputs();
        i.lock = Some(held(7));
        let p = run(&i);
        assert_eq!(p.revoke, None, "nothing is sent before the target is persisted");
        let a = &p.actions[0];
        assert_eq!(
            (a.phase, a.step, a.target_token),
            (ActionPhase::Running, Some(ActionStep::Revoke), Some(7))
        );
        assert_eq!(p.events[0].reason, Reason::RevokeTargetRecorded);

        // Next reconcile (or after a crash): the recorded token is revoked, whatever the key shows now.
        let mut i2 = revoke_inputs();
        i2.actions = p.actions.clone();
        i2.lock = Some(held(9));
        let p2 = run(&i2);
        let call = p2.revoke.clone().unwrap();
        assert_eq!(
            (call.token, call.key.as_str(), call.requested_by.as_str()),
            (7, "account:1", "alice")
        );
        assert!(p2.events.is_empty());

        // lock-server unavailable: nothing sent, still Running.
        i2.lock_server_available = false;
        assert_eq!(run(&i2).revoke, None);

        // The answers.
        let running = &p.actions[0];
        let ans = |outcome: &str, current: Option<i64>| RevokeAnswer {
            outcome: outcome.into(),
            previous_owner: Some("worker-a".into()),
            previous_token: Some(7),
            current_token: current,
        };
        let (done, ev) = outcome(running, &ans("REVOKED", None), "t");
        assert_eq!(
            (done.phase, done.previous_token, ev.warning),
            (ActionPhase::Succeeded, Some(7), false)
        );
        let (done, _) = outcome(running, &ans("ALREADY_REVOKED", None), "t");
        assert_eq!(done.phase, ActionPhase::Succeeded);
        let (done, ev) = outcome(running, &ans("HELD_BY_OTHER_TOKEN", Some(9)), "t");
        assert_eq!(
            (done.phase, done.current_token, ev.warning),
            (ActionPhase::Failed, Some(9), true)
        );
        assert!(done.message.unwrap().contains("left alone"));

        // Finished: never executed again, even if the key is held again.
        let mut i3 = revoke_inputs();
        i3.actions = vec![outcome(running, &ans("REVOKED", None), "t").0];
        i3.lock = Some(held(11));
        let p3 = run(&i3);
        assert_eq!(
            (p3.revoke, p3.actions, p3.busy),
            (None, i3.actions.clone(), false)
        );
    }

    #[test]
    fn revoke_of_a_free_key_succeeds_without_a_call_and_waits_for_lock_server() {
        let mut i = revoke_inputs();
        i.lock = Some(LockView {
            state: "EXPIRED".into(),
            fencing_token: Some(3),
            owner_id: None,
        });
        let p = run(&i);
        assert_eq!(p.revoke, None);
        assert_eq!(
            (p.actions[0].phase, p.actions[0].outcome.as_deref()),
            (ActionPhase::Succeeded, Some("NOT_HELD"))
        );

        let mut i = revoke_inputs();
        i.lock_server_available = false;
        let p = run(&i);
        assert_eq!(
            (p.actions[0].phase, p.revoke.clone()),
            (ActionPhase::Pending, None)
        );
        assert_eq!(p.events[0].reason, Reason::RevokeWaiting);
        // The same wait again: no new Event, no status change.
        let mut again = i.clone();
        again.actions = p.actions.clone();
        let p2 = run(&again);
        assert!(p2.events.is_empty());
        assert_eq!(p2.actions, p.actions);
    }
}
