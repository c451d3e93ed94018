//! Retry policy and backoff. Jitter comes from a seed the caller passes in, never from a
//! random source of the core's own, so a decision can be replayed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::StepError;

/// How long to wait between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    /// Retry at once.
    None,
    /// The same delay before every retry.
    Fixed(Duration),
    /// `initial × factor^(attempt-1)`, capped at `max`.
    Exponential {
        /// Delay before the first retry.
        initial: Duration,
        /// Growth factor per attempt (≥ 1).
        factor: f64,
        /// Upper bound of any delay.
        max: Duration,
    },
}

impl Backoff {
    /// Exponential backoff doubling from `initial`, capped at `max`.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        Backoff::Exponential { initial, factor: 2.0, max }
    }

    /// The delay after the `attempt`-th failed attempt (1-based), before jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        match *self {
            Backoff::None => Duration::ZERO,
            Backoff::Fixed(d) => d,
            Backoff::Exponential { initial, factor, max } => {
                let exp = attempt.saturating_sub(1).min(1_000) as i32;
                let secs = initial.as_secs_f64() * factor.max(1.0).powi(exp);
                if !secs.is_finite() || secs >= max.as_secs_f64() { max } else { Duration::from_secs_f64(secs) }
            }
        }
    }
}

/// When and how often a failing step is retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Retries after the first attempt: at most `retries + 1` attempts.
    pub retries: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
    /// Fraction of each delay (0.0–1.0) randomized away: a delay `d` becomes a value in
    /// `[d × (1 − jitter), d]`, derived from the seed passed to [`RetryPolicy::after_failure`].
    pub jitter: f64,
}

impl Default for RetryPolicy {
    /// No retries.
    fn default() -> Self {
        RetryPolicy { retries: 0, backoff: Backoff::None, jitter: 0.0 }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again after this delay.
    RetryAfter(Duration),
    /// Record the failure: the error is fatal or the attempts are used up.
    GiveUp,
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self::default()
    }

    /// `retries` retries with the given backoff and no jitter.
    pub fn new(retries: u32, backoff: Backoff) -> Self {
        RetryPolicy { retries, backoff, jitter: 0.0 }
    }

    /// Sets the jitter fraction (clamped to 0.0–1.0).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter.clamp(0.0, 1.0);
        self
    }

    /// Decides what follows the failed `attempt` (1-based). `seed` feeds the jitter; pass a value
    /// derived from the run, seq and attempt so the same failure always gets the same delay.
    pub fn after_failure(&self, attempt: u32, error: &StepError, seed: u64) -> RetryDecision {
        if !error.retryable || attempt > self.retries {
            return RetryDecision::GiveUp;
        }
        let delay = self.backoff.delay(attempt);
        if self.jitter <= 0.0 || delay.is_zero() {
            return RetryDecision::RetryAfter(delay);
        }
        let unit = (splitmix64(seed) >> 11) as f64 / (1u64 << 53) as f64;
        // Through f64 a delay near `Duration::MAX` can round above it: such a delay stays as is.
        let scaled = Duration::try_from_secs_f64(delay.as_secs_f64() * (1.0 - self.jitter * unit)).unwrap_or(delay);
        RetryDecision::RetryAfter(scaled.min(delay))
    }
}

/// One step of the SplitMix64 generator: a good 64-bit mix of `seed`.
pub fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable seed for `(run, seq, attempt)` (FNV-1a over the id, mixed with seq and attempt).
pub fn seed_for(run_id: &str, seq: u32, attempt: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in run_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix64(h ^ (u64::from(seq) << 32) ^ u64::from(attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_grows_and_caps() {
        let b = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn gives_up_after_retries_or_on_fatal() {
        let p = RetryPolicy::new(2, Backoff::Fixed(Duration::from_secs(3)));
        let e = StepError::retryable("x");
        assert_eq!(p.after_failure(1, &e, 0), RetryDecision::RetryAfter(Duration::from_secs(3)));
        assert_eq!(p.after_failure(2, &e, 0), RetryDecision::RetryAfter(Duration::from_secs(3)));
        assert_eq!(p.after_failure(3, &e, 0), RetryDecision::GiveUp);
        assert_eq!(p.after_failure(1, &StepError::fatal("x"), 0), RetryDecision::GiveUp);
    }

    #[test]
    fn huge_delays_never_panic_or_wrap() {
        let e = StepError::retryable("x");
        for backoff in [
            Backoff::Fixed(Duration::MAX),
            Backoff::Exponential { initial: Duration::MAX, factor: 2.0, max: Duration::MAX },
            Backoff::Exponential { initial: Duration::from_secs(1), factor: 1e300, max: Duration::MAX },
        ] {
            for jitter in [0.0, 0.5, 1.0] {
                let p = RetryPolicy::new(u32::MAX, backoff).with_jitter(jitter);
                for attempt in [1, 2, 64, u32::MAX - 1] {
                    let RetryDecision::RetryAfter(d) = p.after_failure(attempt, &e, 7) else { panic!() };
                    assert!(d <= Duration::MAX);
                }
            }
        }
    }

    #[test]
    fn jitter_is_bounded_and_seeded() {
        let p = RetryPolicy::new(5, Backoff::Fixed(Duration::from_secs(10))).with_jitter(0.5);
        let e = StepError::retryable("x");
        let d = |seed| match p.after_failure(1, &e, seed) {
            RetryDecision::RetryAfter(d) => d,
            RetryDecision::GiveUp => panic!("gave up"),
        };
        assert_eq!(d(7), d(7));
        let all: Vec<_> = (0..100).map(d).collect();
        assert!(all.iter().all(|d| *d >= Duration::from_secs(5) && *d <= Duration::from_secs(10)));
        assert!(all.iter().any(|x| *x != all[0]));
        assert_ne!(seed_for("a", 1, 1), seed_for("a", 1, 2));
    }
}
