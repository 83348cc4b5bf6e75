//! Waiting for a condition: poll with a deadline, report the last observation on timeout.

use std::time::{Duration, Instant};

/// How often conditions are polled.
pub const POLL: Duration = Duration::from_millis(250);

/// Polls `probe` until it returns `Ok`, or panics after `timeout` with `what` and the last `Err`.
pub fn eventually<T>(what: &str, timeout: Duration, probe: impl FnMut() -> Result<T, String>) -> T {
    eventually_or(what, timeout, probe, String::new)
}

/// Like [`eventually`], appending `context()` (e.g. the operator's log) to the timeout panic.
pub fn eventually_or<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
    context: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; last observation: {last}\n{}",
                    context()
                )
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}
