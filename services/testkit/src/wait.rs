//! Waiting for a condition instead of sleeping for a guess: poll, and fail naming what was awaited.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long the tests wait for something that should happen promptly before calling it a failure.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// How often [`eventually`] probes.
const EVERY: Duration = Duration::from_millis(25);

/// Polls `probe` every 25 ms until it yields a value; an error naming `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(limit, EVERY, async || probe().await.ok_or(()))
        .await
        .map_err(|()| anyhow::anyhow!("timed out after {}s waiting for {what}", limit.as_secs()))
}

/// Probes every `every` until `probe` returns `Ok`; after `limit`, the last `Err` (what was last
/// observed, for the caller's message). The probe may borrow mutably what it drives between probes.
pub async fn poll<T, E>(
    limit: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let started = Instant::now();
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(last) if started.elapsed() > limit => return Err(last),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// [`eventually`] for a yes/no condition in a test: panics naming `what` after [`WAIT_LIMIT`].
pub async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if let Err(e) = eventually(what, WAIT_LIMIT, || {
        let fut = cond();
        async move { fut.await.then_some(()) }
    })
    .await
    {
        panic!("{e}");
    }
}

/// `fut`, or a test failure naming `what` after [`WAIT_LIMIT`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT_LIMIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_and_times_out_naming_the_condition() {
        let mut n = 0;
        let v = eventually("n reaches 3", WAIT_LIMIT, || {
            n += 1;
            let now = n;
            async move { (now >= 3).then_some(now) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
        let e = eventually("never", Duration::from_millis(50), || async { None::<()> })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("waiting for never"), "{e}");
    }

    #[tokio::test]
    async fn poll_hands_back_the_last_observation_when_the_limit_passes() {
        let mut n = 0;
        let last = poll(Duration::from_millis(50), Duration::from_millis(5), async || {
            n += 1;
            Err::<(), _>(n)
        })
        .await
        .unwrap_err();
        assert!(last > 1, "probed more than once: {last}");
        assert_eq!(last, n, "the last observation, not an earlier one");
    }
}
