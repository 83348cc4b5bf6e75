//! lock-server's jumps of `fencing_token_seq` (`GET /v1/sequence`, read by [`super::observe`]) in
//! `status.sequence`, each told once by an Event, and what the operator does when a jump shows a new
//! lockdb history (a promotion, a restore, a restart): the periodic fencing check ([`super::check`])
//! runs now instead of at its next interval, and when it finds the sequence behind a token a paydb
//! has seen, the restore action's fast-forward ([`super::restore`]) is started as if requested.
//! Nothing here moves the sequence.
//!
//! Each lock-server replica reports its own last jump, and the Service answers from any of them:
//! status keeps the newest jump read (by lock-server's time, then by the value it jumped to), so a
//! replica with an older jump changes nothing and each newer jump is told once, across reconciles
//! and operator restarts (the comparison is with the status already stored).

use std::fmt::Write;
use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::jobs::RestoreJobs;
use super::{ActionInputs, ActionPlan};
use crate::builders::{Owner, short_hash};
use crate::crd::actions::RestoreRequest;
use crate::crd::sequence::{JumpCause, SequenceJump};
use crate::reasons::Reason;

/// What `GET /v1/sequence` answers (`dlock_wire::lock::SequenceView`): one replica's last jump.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SequenceView {
    /// `postgres` or `etcd`.
    pub backend: String,
    pub jumps_enabled: bool,
    #[serde(default)]
    pub last_jump: Option<SequenceJump>,
}

/// `status.sequence` after this read: the newest jump, an Event when it is new, and the fencing
/// check a new lockdb history asks for. Without an answer the status stays as it is.
pub(super) fn plan(inputs: &ActionInputs, jobs: &RestoreJobs<'_>, out: &mut ActionPlan) {
    out.sequence = inputs.sequence.clone();
    let Some(read) = &inputs.sequence_read else {
        return;
    };
    let mut s = out.sequence.take().unwrap_or_default();
    s.jumps_enabled = read.jumps_enabled;
    if let Some(jump) = read
        .last_jump
        .as_ref()
        .filter(|j| is_newer(j, s.last_jump.as_ref()))
    {
        let check = new_history(jump, s.last_jump.as_ref()) && checks_possible(inputs);
        // Replicas report one promotion one after the other: one check covers them all.
        if check && s.fencing_check.is_none() {
            s.fencing_check = Some(check_job_name(jobs.owner, jump));
        }
        out.event(Reason::SequenceJumped, note(jump, s.last_jump.as_ref(), check));
        s.last_jump = Some(jump.clone());
    }
    out.sequence = Some(s);
}

/// After the check's planning: the check a jump asked for is done once its comparison is in
/// `status.fencing`, and dropped when no check can run (turned off, no PaymentStack to compare with).
///
/// When that check found the sequence behind a token a paydb has seen (the jump did not reach above
/// it: a logical restore into a fresh cluster, a lost history older than the paydbs), the restore
/// fast-forward is started from here, as if requested ([`auto_restore`]: it runs next reconcile,
/// from the status written now); it is forgotten once its action is finished.
pub(super) fn settle(inputs: &ActionInputs, out: &mut ActionPlan) {
    let Some(s) = out.sequence.as_mut() else {
        return;
    };
    let fencing = out.fencing.as_ref();
    let reported = fencing.and_then(|f| f.job_name.as_deref());
    if let Some(check) = s.fencing_check.clone()
        && (Some(check.as_str()) == reported || !checks_possible(inputs))
    {
        s.fencing_check = None;
        if Some(check.as_str()) == reported
            && fencing.is_some_and(|f| f.is_behind())
            && !inputs.etcd_backend
            && s.restore.is_none()
        {
            s.restore = Some(format!("promotion-{}", short_hash(check.as_bytes())));
        }
    }
    if let Some(id) = &s.restore
        && out.actions.iter().any(|a| &a.id == id && a.phase.is_final())
    {
        s.restore = None;
    }
}

/// The restore the operator started itself after a promotion, while it is not finished and no
/// requested restore (the annotation) is in the way.
pub(super) fn auto_restore(inputs: &ActionInputs) -> Option<RestoreRequest> {
    // A requested restore that is finished stays in its annotation: only a running one is in the way.
    if let Some(super::Request::Valid(r)) = &inputs.restore
        && inputs
            .actions
            .iter()
            .find(|a| a.id == r.id)
            .is_none_or(|a| !a.phase.is_final())
    {
        return None;
    }
    let id = inputs.sequence.as_ref()?.restore.clone()?;
    Some(RestoreRequest { id, margin: None })
}

/// The periodic check is on and there is a paydb to compare with.
fn checks_possible(inputs: &ActionInputs) -> bool {
    inputs.check_interval_secs.is_some_and(|i| i > 0) && !inputs.stacks.is_empty()
}

/// A jump lock-server made after the one stored (by its time, then by the value it jumped to); a
/// stored time that does not parse gives way.
pub fn is_newer(jump: &SequenceJump, stored: Option<&SequenceJump>) -> bool {
    let Some(stored) = stored else {
        return true;
    };
    if jump == stored {
        return false;
    }
    let at = |j: &SequenceJump| Timestamp::from_str(&j.at).ok();
    match (at(jump), at(stored)) {
        (Some(a), Some(b)) => (a, jump.jumped_to) > (b, stored.jumped_to),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The jump was made on a lockdb history the operator had not recorded: lock-server says so (any
/// cause but its own start), or a start found another system, timeline or postmaster than the last
/// jump recorded (lock-server restarted across a promotion). The first jump ever recorded with
/// cause `start` is not one: there is nothing to compare it with.
pub fn new_history(jump: &SequenceJump, stored: Option<&SequenceJump>) -> bool {
    jump.cause != JumpCause::Start || stored.is_some_and(|s| s.history() != jump.history())
}

/// The check Job a jump asks for: named after the jump, so a re-run finds the same one.
fn check_job_name(owner: &Owner, jump: &SequenceJump) -> String {
    let key = format!("jump {} {}", jump.at, jump.jumped_to);
    owner.child(&format!("fencing-check-{}", short_hash(key.as_bytes())))
}

/// The Event's note: the cause, found → jumped to, the timeline (and what changed).
pub fn note(jump: &SequenceJump, previous: Option<&SequenceJump>, check: bool) -> String {
    let mut n = format!(
        "lock-server jumped fencing_token_seq on lockdb timeline {}: {} ({}); found {} → {}",
        jump.timeline,
        jump.cause,
        jump.cause.describe(),
        jump.found,
        jump.jumped_to
    );
    if let Some(p) = previous {
        if p.system_identifier != jump.system_identifier {
            let _ = write!(n, "; system {} → {}", p.system_identifier, jump.system_identifier);
        } else if p.timeline != jump.timeline {
            let _ = write!(n, "; timeline {} → {}", p.timeline, jump.timeline);
        }
    }
    if check {
        n.push_str(
            "; a new lockdb history: the fencing check compares the sequence with the paydbs' high-water now",
        );
    }
    n
}

#[cfg(test)]
mod tests {
    use super::super::jobs::JobRun;
    use super::super::testing::{restore_inputs, run};
    use super::*;
    use crate::crd::actions::{ActionPhase, ActionStatus, ActionType, FencingStatus};
    use crate::crd::sequence::SequenceStatus;

    fn jump(at: &str, cause: JumpCause, timeline: i64, jumped_to: i64) -> SequenceJump {
        SequenceJump {
            at: at.into(),
            cause,
            found: 41,
            jumped_to,
            system_identifier: "7345123456789012345".into(),
            timeline,
            postmaster_started: "2026-03-01T09:00:00Z".into(),
        }
    }

    fn read(j: Option<SequenceJump>) -> Option<SequenceView> {
        Some(SequenceView {
            backend: "postgres".into(),
            jumps_enabled: true,
            last_jump: j,
        })
    }

    /// A LockService with two migrated PaymentStacks, the check on and just done (not due).
    fn inputs() -> ActionInputs {
        let mut i = restore_inputs();
        i.restore = None;
        i.schema_ready = true;
        i.check_interval_secs = Some(300);
        i.now = "2026-03-01T10:00:30Z".into();
        i.now_secs = 1_772_359_230;
        i.fencing = Some(FencingStatus {
            sequence: 281_474_976_710_700,
            high_water: 281_474_976_710_690,
            high_water_stack: Some("pay-a".into()),
            checked_at: "2026-03-01T10:00:00Z".into(),
            job_name: Some("locks-fencing-check-periodic".into()),
        });
        i
    }

    /// The next reconcile: what this one wrote to status is what the next one reads.
    fn then(p: &ActionPlan, mut next: ActionInputs) -> ActionInputs {
        next.sequence = p.sequence.clone();
        next.fencing = p.fencing.clone();
        next
    }

    const START: i64 = 281_474_976_710_657;

    #[test]
    fn a_new_jump_is_recorded_and_told_once() {
        let start = jump("2026-03-01T10:00:00.123456789Z", JumpCause::Start, 1, START);
        let mut i = inputs();
        i.sequence_read = read(Some(start.clone()));
        let p = run(&i);
        let s = p.sequence.clone().expect("status.sequence");
        assert_eq!(s.last_jump.as_ref(), Some(&start));
        assert!(s.jumps_enabled);
        assert_eq!(s.fencing_check, None, "lock-server's own start asks for no check");
        assert_eq!(p.events.len(), 1, "{:?}", p.events);
        let e = &p.events[0];
        assert_eq!(e.reason, Reason::SequenceJumped);
        assert!(!e.warning, "a jump is lock-server doing its job: Normal");
        for want in [
            "timeline 1",
            "start (lock-server started)",
            &format!("found 41 → {START}"),
        ] {
            assert!(e.note.contains(want), "{want:?} in {}", e.note);
        }
        assert!(p.check_job.is_none(), "the periodic check is not due");

        // The same jump again (the next reconcile, or a restarted operator reading its status):
        // the same status, no Event.
        let again = run(&then(&p, i.clone()));
        assert_eq!(again.sequence, p.sequence);
        assert!(again.events.is_empty(), "{:?}", again.events);
    }

    #[test]
    fn a_lock_server_that_does_not_answer_keeps_the_status() {
        let stored = SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(jump("2026-03-01T10:00:00Z", JumpCause::Start, 1, START)),
            fencing_check: Some("locks-fencing-check-abc".into()),
            restore: None,
        };
        let mut i = inputs();
        i.sequence = Some(stored.clone());
        i.sequence_read = None;
        let p = run(&i);
        assert_eq!(p.sequence.as_ref(), Some(&stored), "kept as it was");
        assert!(p.events.is_empty());
        // Never read, never written: a LockService on etcd (or before lock-server serves) has none.
        let mut none = inputs();
        none.sequence_read = None;
        assert_eq!(run(&none).sequence, None);
        // An answer without a jump yet keeps the last jump recorded.
        let mut empty = inputs();
        empty.sequence = Some(stored.clone());
        empty.sequence_read = read(None);
        let p = run(&empty);
        assert_eq!(p.sequence.and_then(|s| s.last_jump), stored.last_jump, "kept");
        assert!(p.events.is_empty());
    }

    #[test]
    fn the_newest_jump_of_any_replica_is_kept() {
        let a = jump("2026-03-01T10:00:00Z", JumpCause::Start, 1, START);
        let b = jump("2026-03-01T10:00:01Z", JumpCause::Start, 1, START + (1 << 32));
        let mut i = inputs();
        i.sequence_read = read(Some(b.clone()));
        let p = run(&i);
        // Replica a's older jump, read next through the Service: nothing changes, nothing is told.
        let mut older = then(&p, i.clone());
        older.sequence_read = read(Some(a.clone()));
        let p2 = run(&older);
        assert_eq!(p2.sequence.and_then(|s| s.last_jump), Some(b.clone()));
        assert!(p2.events.is_empty());
        // The other way round, b replaces a and is told.
        let mut i = inputs();
        i.sequence_read = read(Some(a));
        let p = run(&i);
        let mut newer = then(&p, i.clone());
        newer.sequence_read = read(Some(b.clone()));
        let p2 = run(&newer);
        assert_eq!(p2.sequence.and_then(|s| s.last_jump), Some(b));
        assert_eq!(p2.events.len(), 1);
        // Same time: the higher jump is the later one (they are serialised in lockdb).
        let x = jump("2026-03-01T10:00:00Z", JumpCause::Start, 1, 5);
        let y = jump("2026-03-01T10:00:00Z", JumpCause::Start, 1, 6);
        assert!(is_newer(&y, Some(&x)) && !is_newer(&x, Some(&y)) && !is_newer(&x, Some(&x)));
    }

    #[test]
    fn a_promotion_runs_the_fencing_check_now_once() {
        let before = jump("2026-03-01T09:00:00Z", JumpCause::Start, 1, START);
        let promoted = jump(
            "2026-03-01T10:00:20Z",
            JumpCause::NewTimeline,
            2,
            2 * 281_474_976_710_656,
        );
        let mut i = inputs();
        i.sequence = Some(SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(before.clone()),
            fencing_check: None,
            restore: None,
        });
        i.sequence_read = read(Some(promoted.clone()));
        let p = run(&i);
        let s = p.sequence.clone().unwrap();
        let name = s.fencing_check.clone().expect("a check is asked for");
        assert!(name.starts_with("locks-fencing-check-"), "{name}");
        let job = p
            .check_job
            .as_ref()
            .expect("the check Job, now, not in 5 minutes");
        assert_eq!(job.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(p.events.len(), 1);
        let note = &p.events[0].note;
        for want in [
            "new_timeline",
            "timeline 1 → 2",
            "found 41 → 562949953421312",
            "the fencing check",
        ] {
            assert!(note.contains(want), "{want:?} in {note}");
        }
        // No restore is started: no gate, no restore Job, no action.
        assert!(!p.gated() && p.jobs.is_empty() && p.actions.is_empty());

        // The second replica reports the same promotion: told, but the one check covers it.
        let second = jump(
            "2026-03-01T10:00:21Z",
            JumpCause::NewTimeline,
            2,
            2 * 281_474_976_710_656 + (1 << 32),
        );
        let mut running = then(&p, i.clone());
        running.sequence_read = read(Some(second.clone()));
        running.check_job = Some((name.clone(), JobRun::Running));
        let p2 = run(&running);
        assert_eq!(
            p2.sequence.as_ref().and_then(|s| s.fencing_check.as_deref()),
            Some(name.as_str())
        );
        assert_eq!(p2.keep_check.as_deref(), Some(name.as_str()));
        assert!(p2.check_job.is_none(), "one check Job at a time");
        assert_eq!(p2.events.len(), 1);
        assert!(!p2.events[0].note.contains("timeline 1 → 2"), "same timeline");

        // The check reports: status.fencing carries it, the jump's check is done.
        let mut done = then(&p2, i.clone());
        done.sequence_read = read(Some(second));
        done.check_job = Some((
            name.clone(),
            JobRun::Succeeded(Some(
                r#"{"sequence":562949953421400,"stacks":[{"name":"pay-a","railHighWater":281474976710690,"accountFence":0,"ledgerFence":0,"claimToken":0,"highest":281474976710690}]}"#.into(),
            )),
        ));
        let p3 = run(&done);
        assert_eq!(
            p3.fencing.as_ref().and_then(|f| f.job_name.as_deref()),
            Some(name.as_str())
        );
        assert_eq!(p3.sequence.as_ref().unwrap().fencing_check, None);
        assert!(p3.events.is_empty(), "not behind: nothing to say");
        // And nothing more: no further check before the interval.
        let mut later = then(&p3, done.clone());
        later.check_job = None;
        let quiet = run(&later);
        assert!(quiet.check_job.is_none() && quiet.events.is_empty());
    }

    #[test]
    fn a_promotion_found_behind_degrades_and_starts_the_restore_fast_forward() {
        let mut i = inputs();
        i.sequence = Some(SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(jump("2026-03-01T09:00:00Z", JumpCause::Start, 1, START)),
            fencing_check: Some("locks-fencing-check-x".into()),
            restore: None,
        });
        i.check_job = Some((
            "locks-fencing-check-x".into(),
            JobRun::Succeeded(Some(
                r#"{"sequence":10,"stacks":[{"name":"pay-b","railHighWater":99,"accountFence":0,"ledgerFence":0,"claimToken":0,"highest":99}]}"#.into(),
            )),
        ));
        let p = run(&i);
        assert_eq!(p.events[0].reason, Reason::FencingSequenceBehind);
        assert!(p.fencing.as_ref().unwrap().is_behind());
        let s = p.sequence.clone().unwrap();
        assert_eq!(s.fencing_check, None);
        // The restore fast-forward is asked for in status now, and starts from that status next
        // reconcile, as a requested one would (the gate closes first).
        let id = s.restore.clone().expect("the fast-forward is started");
        assert!(id.starts_with("promotion-"), "{id}");
        assert!(
            !p.gated() && p.jobs.is_empty(),
            "nothing acts before the status is written"
        );
        let mut next = then(&p, inputs());
        next.check_job = None;
        let p2 = run(&next);
        let action = p2
            .actions
            .iter()
            .find(|a| a.id == id)
            .expect("the restore action");
        assert_eq!(action.type_, ActionType::Restore);
        assert!(p2.gated(), "the fast-forward's gate closes: {:?}", p2.gate);
        // A requested restore comes first; the promotion's waits behind it.
        let mut requested = next.clone();
        requested.restore = Some(super::super::Request::Valid(RestoreRequest {
            id: "ff-user".into(),
            margin: None,
        }));
        let p3 = run(&requested);
        assert!(p3.actions.iter().all(|a| a.id != id), "{:?}", p3.actions);
        // A requested restore that is finished stays in its annotation, and is not in the way.
        let mut user_done = ActionStatus::new("ff-user", ActionType::Restore, ActionPhase::Succeeded);
        user_done.finished_at = Some("2026-03-01T09:00:00Z".into());
        requested.actions.push(user_done);
        let p5 = run(&requested);
        assert!(p5.actions.iter().any(|a| a.id == id), "{:?}", p5.actions);
        // Once its action is finished, status forgets it.
        let mut finished = then(&p2, inputs());
        let mut done = action.clone();
        done.phase = ActionPhase::Succeeded;
        finished.actions = vec![done];
        finished.gate = None;
        let p4 = run(&finished);
        assert_eq!(p4.sequence.and_then(|s| s.restore), None);
    }

    #[test]
    fn a_promotion_found_level_starts_no_restore() {
        let mut i = inputs();
        i.sequence = Some(SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(jump("2026-03-01T09:00:00Z", JumpCause::Start, 1, START)),
            fencing_check: Some("locks-fencing-check-y".into()),
            restore: None,
        });
        i.check_job = Some((
            "locks-fencing-check-y".into(),
            JobRun::Succeeded(Some(
                r#"{"sequence":1000,"stacks":[{"name":"pay-b","railHighWater":99,"accountFence":0,"ledgerFence":0,"claimToken":0,"highest":99}]}"#.into(),
            )),
        ));
        let p = run(&i);
        assert!(!p.fencing.as_ref().unwrap().is_behind());
        assert!(!p.gated());
        assert_eq!(p.sequence.unwrap().restore, None);
    }

    #[test]
    fn what_counts_as_a_new_history() {
        let start = jump("2026-03-01T09:00:00Z", JumpCause::Start, 1, START);
        // The first jump ever recorded, lock-server's own start: nothing to check against.
        assert!(!new_history(&start, None));
        // A rollout of lock-server on the same lockdb: no check.
        let restarted = jump("2026-03-01T09:30:00Z", JumpCause::Start, 1, START + (1 << 32));
        assert!(!new_history(&restarted, Some(&start)));
        // lock-server restarted across a promotion: its cause is `start`, the timeline tells.
        let across = jump("2026-03-01T09:40:00Z", JumpCause::Start, 2, START << 1);
        assert!(new_history(&across, Some(&start)));
        for cause in [
            JumpCause::NewSystem,
            JumpCause::NewTimeline,
            JumpCause::PostmasterRestart,
        ] {
            assert!(
                new_history(&jump("2026-03-01T09:50:00Z", cause, 1, 9), None),
                "{cause}"
            );
        }
    }

    #[test]
    fn no_check_is_asked_for_when_checks_cannot_run() {
        let mut i = inputs();
        i.sequence_read = read(Some(jump("2026-03-01T10:00:20Z", JumpCause::NewSystem, 1, START)));
        // Turned off (--fencing-check-secs 0): the jump is shown and told, no check.
        let mut off = i.clone();
        off.check_interval_secs = None;
        let p = run(&off);
        assert_eq!(p.events.len(), 1);
        assert!(!p.events[0].note.contains("fencing check"));
        assert_eq!(p.sequence.unwrap().fencing_check, None);
        assert!(p.check_job.is_none());
        // No PaymentStack: no high-water to compare with.
        let mut alone = i.clone();
        alone.stacks.clear();
        let p = run(&alone);
        assert_eq!(p.sequence.unwrap().fencing_check, None);
        // A restore in flight holds the check back; the request stays until the check can run.
        let mut restoring = i.clone();
        restoring.restore = restore_inputs().restore;
        let p = run(&restoring);
        assert!(p.gated() && p.check_job.is_none());
        assert!(p.sequence.unwrap().fencing_check.is_some());
    }

    #[test]
    fn the_wire_answer_parses_into_the_status_shape() {
        // As lock-server serializes dlock_wire::lock::SequenceView.
        let body = r#"{"backend":"postgres","jumpsEnabled":true,"lastJump":{"at":"2026-03-01T10:00:00.123456789Z","cause":"new_timeline","found":41,"jumpedTo":562949953421312,"systemIdentifier":"7345123456789012345","timeline":2,"postmasterStarted":"2026-03-01T09:00:00Z"}}"#;
        let v: SequenceView = serde_json::from_str(body).unwrap();
        let j = v.last_jump.unwrap();
        assert_eq!(
            (j.cause, j.timeline, j.jumped_to),
            (JumpCause::NewTimeline, 2, 562_949_953_421_312)
        );
        assert_eq!(j.at, "2026-03-01T10:00:00.123456789Z");
        let none: SequenceView =
            serde_json::from_str(r#"{"backend":"postgres","jumpsEnabled":false}"#).unwrap();
        assert!(!none.jumps_enabled && none.last_jump.is_none());
        // In status: camelCase, the cause as lock-server writes it.
        let s = serde_json::to_value(SequenceStatus {
            jumps_enabled: true,
            last_jump: Some(j),
            fencing_check: None,
            restore: None,
        })
        .unwrap();
        assert_eq!(s["lastJump"]["cause"], "new_timeline");
        assert_eq!(s["lastJump"]["jumpedTo"], 562_949_953_421_312_i64);
        assert!(s.get("fencingCheck").is_none());
    }
}
