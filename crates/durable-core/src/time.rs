//! Durations to epoch milliseconds, saturating: a huge duration means "never", not "soon".
//!
//! Every duration a user can pass (a sleep, a wait's deadline, a step timeout, a backoff, a
//! lease, a poll interval) becomes milliseconds through these helpers and nowhere else, so
//! `Duration::MAX` or 584 million years can never wrap around into a deadline in the past.

use std::time::Duration;

use crate::Millis;

/// 9999-12-31T23:59:59.999Z: the latest time a run may be started at or a schedule may first
/// fire at. Times are printed with four-digit years (RFC 3339), and a later one is a mistake
/// (`start_at(u64::MAX)`, `delay(Duration::MAX)`, `every(Duration::MAX)`), not a plan.
pub const LATEST_START: Millis = 253_402_300_799_999;

/// `d` in whole milliseconds, saturating at [`Millis::MAX`].
pub fn millis(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

/// `now + d` in milliseconds, saturating at [`Millis::MAX`] ("never").
pub fn millis_after(now: Millis, d: Duration) -> Millis {
    now.saturating_add(millis(d))
}

/// `now - d` in milliseconds, saturating at 0 (the epoch).
pub fn millis_before(now: Millis, d: Duration) -> Millis {
    now.saturating_sub(millis(d))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn huge_durations_mean_never() {
        assert_eq!(millis(Duration::MAX), Millis::MAX);
        assert_eq!(millis_after(1_000, Duration::MAX), Millis::MAX);
        assert_eq!(millis_after(1_000, Duration::from_secs(18_446_744_073_709_552)), Millis::MAX);
        assert_eq!(millis_after(Millis::MAX, Duration::from_millis(1)), Millis::MAX);
        assert_eq!(millis_before(1_000, Duration::MAX), 0);
        assert_eq!(millis_after(5, Duration::from_micros(1_999)), 6, "sub-millisecond parts are dropped");
    }

    proptest! {
        #[test]
        fn never_wraps(now in any::<u64>(), secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            let after = millis_after(now, d);
            prop_assert!(after >= now, "a deadline is never before now");
            let exact = u128::from(now) + d.as_millis();
            prop_assert_eq!(u128::from(after), exact.min(u128::from(Millis::MAX)));
            prop_assert!(millis_before(now, d) <= now);
            prop_assert_eq!(u128::from(millis(d)), d.as_millis().min(u128::from(Millis::MAX)));
        }
    }
}
