//! Failures reported at most once a minute, with a count, and a backoff for retrying.

use std::time::{Duration, Instant};

/// How often a failing loop may report.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Counts failures between reports, at most one report a minute.
#[derive(Debug, Default)]
pub(crate) struct Reporter {
    since_report: u64,
    last_report: Option<Instant>,
    /// Failing now (the last attempt failed).
    failing: bool,
}

impl Reporter {
    /// Counts one failure; `Some(failures since the last report)` when a report is due now.
    pub(crate) fn failed(&mut self) -> Option<u64> {
        self.failed_at(Instant::now())
    }

    fn failed_at(&mut self, now: Instant) -> Option<u64> {
        self.failing = true;
        self.since_report += 1;
        if self.last_report.is_none_or(|t| now.duration_since(t) >= REPORT_EVERY) {
            self.last_report = Some(now);
            Some(std::mem::take(&mut self.since_report))
        } else {
            None
        }
    }

    /// Records a success; `true` if it ends a run of failures (worth saying so).
    pub(crate) fn succeeded(&mut self) -> bool {
        std::mem::replace(&mut self.failing, false)
    }
}

/// Exponential backoff from 100 ms up to 5 s.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        Backoff { next: Self::FIRST }
    }

    /// The wait before the next attempt (doubling each time, capped).
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        wait
    }

    /// Back to the first wait, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_at_most_once_a_minute_with_the_count_since_the_last() {
        let mut r = Reporter::default();
        let t0 = Instant::now();
        assert_eq!(r.failed_at(t0), Some(1));
        assert_eq!(r.failed_at(t0 + Duration::from_secs(1)), None);
        assert_eq!(r.failed_at(t0 + Duration::from_secs(59)), None);
        assert_eq!(r.failed_at(t0 + Duration::from_secs(60)), Some(3));
        assert!(r.succeeded());
        assert!(!r.succeeded());
    }

    #[test]
    fn backoff_doubles_up_to_five_seconds() {
        let mut b = Backoff::new();
        let waits: Vec<_> = (0..8).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_wait().as_millis(), 100);
    }
}
