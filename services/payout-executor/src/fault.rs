//! Fault injection for the proof and the demo: a real stop-the-world pause of this whole process at
//! one step of the critical section, after the last lock check and right before the write.
//!
//! At the chosen step, the first payout that reaches it logs `fault_pause` and the process sends
//! itself SIGSTOP. Every thread stops, background lease renewals included, so the lease lapses on the
//! server: exactly the hazard fencing exists for. Whoever resumes it (SIGCONT) lets the worker go on
//! with the write it had already decided to make, without checking the lock again — that gap between
//! check and write is the point. Only available behind `--enable-fault-injection`, and only in a build
//! with the cargo feature `fault-injection` (the tests and the demo enable it through the dev-only
//! test kit; the release image is built without it, so there the pause below is not even compiled).

use std::sync::atomic::{AtomicBool, Ordering};

use dlock_client::FencingToken;
use uuid::Uuid;

/// The steps at which the process can be paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Step {
    /// Lock granted, before claiming the payout.
    BeforeClaim,
    /// After the RAIL_SUBMITTED transition and the last `ensure_held()`, before the rail submit.
    BeforeRailSubmit,
    /// After RAIL_ACKED and the last `ensure_held()`, before the post request.
    BeforePost,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::BeforeClaim => "before_claim",
            Step::BeforeRailSubmit => "before_rail_submit",
            Step::BeforePost => "before_post",
        }
    }
}

/// The process's fault plan: at most one pause, shared by every worker.
#[derive(Debug, Default)]
pub struct Faults {
    pause_at: Option<Step>,
    fired: AtomicBool,
}

impl Faults {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn pause_at(step: Step) -> Self {
        Self {
            pause_at: Some(step),
            fired: AtomicBool::new(false),
        }
    }

    /// At `step`: stops the process if this is the planned step and it has not fired yet. Returns
    /// `true` once the process has been stopped and resumed (SIGCONT received).
    pub async fn at(&self, step: Step, payout_id: Uuid, token: FencingToken) -> bool {
        if self.pause_at != Some(step) || self.fired.swap(true, Ordering::SeqCst) {
            return false;
        }
        stop_this_process(step, payout_id, token).await
    }
}

/// Without the feature there is no way to plan a pause (the config refuses the flag), and no code
/// that stops the process.
#[cfg(not(feature = "fault-injection"))]
async fn stop_this_process(_step: Step, _payout_id: Uuid, _token: FencingToken) -> bool {
    false
}

#[cfg(feature = "fault-injection")]
async fn stop_this_process(step: Step, payout_id: Uuid, token: FencingToken) -> bool {
    let pid = std::process::id();
    // Listen for SIGCONT before stopping: a SIGSTOP sent by another process (`kill`) takes effect
    // on our threads a little after `kill` returns, so only the SIGCONT proves that the stop
    // happened and is over. Without this wait the write could slip out before the stop.
    let mut resumed = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(
        libc::SIGCONT,
    )) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(event = "fault_pause_failed", error = %e, "cannot listen for SIGCONT; not paused");
            return false;
        }
    };
    tracing::warn!(
        event = "fault_pause",
        step = step.as_str(),
        payout_id = %payout_id,
        fencing_token = token.get(),
        pid,
        "FAULT INJECTION: stopping this whole process with SIGSTOP; resume it with SIGCONT"
    );
    match std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
    {
        Ok(status) if status.success() => {}
        Ok(status) => {
            tracing::error!(event = "fault_pause_failed", %status, "kill -STOP failed; not paused");
            return false;
        }
        Err(e) => {
            tracing::error!(event = "fault_pause_failed", error = %e, "cannot run kill; not paused");
            return false;
        }
    }
    resumed.recv().await;
    tracing::warn!(
        event = "fault_resumed",
        step = step.as_str(),
        payout_id = %payout_id,
        fencing_token = token.get(),
        "resumed after SIGSTOP; going on with the write WITHOUT re-checking the lock"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn other_steps_and_no_plan_never_pause() {
        let token = FencingToken::new(1).unwrap();
        let none = Faults::none();
        assert!(!none.at(Step::BeforePost, Uuid::nil(), token).await);
        let plan = Faults::pause_at(Step::BeforePost);
        assert!(!plan.at(Step::BeforeClaim, Uuid::nil(), token).await);
        assert!(!plan.at(Step::BeforeRailSubmit, Uuid::nil(), token).await);
        assert!(!plan.fired.load(Ordering::SeqCst));
    }

    #[test]
    fn step_names_are_the_flag_values() {
        use clap::ValueEnum;
        for step in Step::value_variants() {
            let value = step.to_possible_value().unwrap();
            assert_eq!(value.get_name(), step.as_str());
        }
    }
}
