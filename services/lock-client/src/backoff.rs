//! Jittered exponential backoff for the bounded wait of `acquire`, so that waiters on one key do
//! not retry in lock-step.

use std::time::Duration;

use rand::Rng;

const FIRST: Duration = Duration::from_millis(10);
const CAP: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    ceiling: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self { ceiling: FIRST }
    }

    /// The next delay: uniform in `[ceiling / 2, ceiling]`, the ceiling doubling up to 250 ms.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = (ceiling * 2).min(CAP);
        let half = ceiling / 2;
        let jitter_ns = rand::rng().random_range(0..=half.as_nanos() as u64);
        half + Duration::from_nanos(jitter_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_stays_jittered_within_bounds() {
        let mut b = Backoff::new();
        let mut ceiling = FIRST;
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "{d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            ceiling = (ceiling * 2).min(CAP);
        }
        assert_eq!(b.ceiling, CAP);
    }
}
