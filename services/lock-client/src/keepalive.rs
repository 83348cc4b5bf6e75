//! The background loop shared by session heartbeats and lock renewals: confirm the lease every
//! `ttl / 3`, retry quickly on transient failures, and declare it lost on a 410 or when the
//! deadline passes without a confirmation.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::error::{ClientError, LossReason};
use crate::liveness::Liveness;

/// How a loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The owner stopped it (released, closed, dropped).
    Stopped,
    /// The lease was lost, for this reason.
    Lost(LossReason),
}

/// Renewals are due every `ttl / 3`, leaving two more chances before the deadline.
fn interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// After a transient failure: soon, but not in a tight loop.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

/// Runs until stopped or lost. `confirm` makes one attempt and returns the server's new expiry;
/// it answers `LockLost` / `SessionGone` when the server says the lease is gone.
///
/// `suspended` (fault injection) holds back new attempts while `true`; the deadline keeps running.
pub(crate) async fn run<F, Fut>(
    live: Arc<Liveness>,
    stop: CancellationToken,
    mut suspended: watch::Receiver<bool>,
    mut confirm: F,
) -> Ended
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<DateTime<Utc>, ClientError>>,
{
    let ttl = live.ttl();
    let lost = live.lost_token();
    let mut next = live.last_sent() + interval(ttl);
    loop {
        let deadline = live.deadline();
        let due = async {
            sleep_until(next).await;
            if suspended.wait_for(|s| !*s).await.is_err() {
                // The owner is gone; `stop` fires with it.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ended::Stopped,
            _ = lost.cancelled() => return ended_lost(&live),
            _ = sleep_until(deadline) => {
                live.lose(live.unconfirmed_reason());
                return ended_lost(&live);
            }
            _ = due => {}
        }

        let sent = Instant::now();
        // An answer after the deadline would be too late to matter: stop waiting for it there.
        let outcome = tokio::select! {
            biased;
            _ = stop.cancelled() => return Ended::Stopped,
            _ = lost.cancelled() => return ended_lost(&live),
            r = timeout_at(deadline, confirm()) => r,
        };
        match outcome {
            Ok(Ok(expires_at)) => {
                live.confirm(sent, expires_at);
                next = sent + interval(ttl);
            }
            Ok(Err(ClientError::LockLost { reason, .. } | ClientError::SessionGone { reason })) => {
                live.lose(reason);
                return ended_lost(&live);
            }
            Ok(Err(e)) => {
                tracing::warn!(event = "keepalive_failed", error = %e, "could not confirm a lease; retrying");
                next = Instant::now() + retry_delay(ttl);
            }
            // The deadline passed; the top of the loop declares the loss.
            Err(_elapsed) => next = Instant::now(),
        }
    }
}

fn ended_lost(live: &Liveness) -> Ended {
    Ended::Lost(live.reason().unwrap_or(live.unconfirmed_reason()))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn lease(ttl_ms: u64) -> Arc<Liveness> {
        Arc::new(Liveness::new(
            Duration::from_millis(ttl_ms),
            Instant::now(),
            Utc::now(),
            LossReason::RenewalUnconfirmed,
            None,
        ))
    }

    #[tokio::test]
    async fn keeps_confirming_until_stopped() {
        let live = lease(1_000);
        let stop = CancellationToken::new();
        let (_tx, rx) = watch::channel(false);
        let calls = Arc::new(AtomicU32::new(0));
        let task = tokio::spawn(run(live.clone(), stop.clone(), rx, {
            let calls = calls.clone();
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok(Utc::now()) }
            }
        }));
        // Five confirmations span more than one TTL: without them the lease would be gone.
        let give_up = Instant::now() + Duration::from_secs(20);
        while calls.load(Ordering::SeqCst) < 5 {
            assert!(
                Instant::now() < give_up,
                "only {} confirmations",
                calls.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(live.check().is_ok());
        stop.cancel();
        assert_eq!(task.await.expect("join"), Ended::Stopped);
    }

    #[tokio::test]
    async fn a_gone_answer_is_lost_at_once() {
        // Last confirmed 25 s into a 60 s lease: the next attempt is due at once, the deadline far.
        let live = Arc::new(Liveness::new(
            Duration::from_secs(60),
            Instant::now() - Duration::from_secs(25),
            Utc::now(),
            LossReason::HeartbeatUnconfirmed,
            None,
        ));
        let (_tx, rx) = watch::channel(false);
        let ended = run(live.clone(), CancellationToken::new(), rx, || async {
            Err(ClientError::SessionGone {
                reason: LossReason::SessionGone,
            })
        });
        let ended = tokio::time::timeout(Duration::from_secs(30), ended)
            .await
            .expect("ended");
        assert_eq!(ended, Ended::Lost(LossReason::SessionGone));
        assert_eq!(live.check(), Err(LossReason::SessionGone));
    }

    #[tokio::test]
    async fn transient_failures_until_the_deadline_are_a_loss() {
        let live = lease(100);
        let deadline = live.deadline();
        let (_tx, rx) = watch::channel(false);
        let calls = Arc::new(AtomicU32::new(0));
        let ended = run(live.clone(), CancellationToken::new(), rx, {
            let calls = calls.clone();
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(ClientError::Protocol("down".into())) }
            }
        })
        .await;
        assert_eq!(ended, Ended::Lost(LossReason::RenewalUnconfirmed));
        assert!(Instant::now() >= deadline);
        assert!(calls.load(Ordering::SeqCst) >= 1);
    }

    #[tokio::test]
    async fn a_hanging_request_is_cut_at_the_deadline() {
        let live = lease(100);
        let (_tx, rx) = watch::channel(false);
        let ended = run(live.clone(), CancellationToken::new(), rx, || {
            std::future::pending::<Result<DateTime<Utc>, ClientError>>()
        })
        .await;
        assert_eq!(ended, Ended::Lost(LossReason::RenewalUnconfirmed));
        assert!(live.check().is_err());
    }

    #[tokio::test]
    async fn suspended_means_no_attempts_and_a_loss_at_the_deadline() {
        let live = lease(100);
        let (_tx, rx) = watch::channel(true);
        let calls = Arc::new(AtomicU32::new(0));
        let ended = run(live.clone(), CancellationToken::new(), rx, {
            let calls = calls.clone();
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok(Utc::now()) }
            }
        })
        .await;
        assert_eq!(ended, Ended::Lost(LossReason::RenewalUnconfirmed));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_outside_loss_ends_the_loop() {
        let live = lease(60_000);
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(run(live.clone(), CancellationToken::new(), rx, || async {
            Ok(Utc::now())
        }));
        live.lose(LossReason::SessionEnded);
        let ended = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("ended");
        assert_eq!(ended.expect("join"), Ended::Lost(LossReason::SessionEnded));
    }
}
