//! Failures of a long-lived loop (a consumer, a subscriber): counted, reported at most once a
//! minute, retried with a capped backoff.

use std::fmt;
use std::time::{Duration, Instant};

/// How often an ongoing outage is reported, at most.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// The first retry's delay; each failure in a row doubles it up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Counts the failures of one loop and says when to try again.
#[derive(Debug)]
pub(crate) struct Outage {
    /// What fails, for the report ("run consumer", "control plane subscriber").
    what: &'static str,
    since_report: u64,
    last_report: Option<Instant>,
    in_a_row: u32,
}

impl Outage {
    pub(crate) fn new(what: &'static str) -> Self {
        Outage { what, since_report: 0, last_report: None, in_a_row: 0 }
    }

    /// Records a failure (reported now if the last report is a minute old or there was
    /// none) and returns how long to wait before trying again.
    pub(crate) fn failed(&mut self, error: &dyn fmt::Display) -> Duration {
        self.since_report += 1;
        self.in_a_row = self.in_a_row.saturating_add(1);
        if self.last_report.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
            self.last_report = Some(Instant::now());
            let failures = std::mem::take(&mut self.since_report);
            tracing::warn!(
                error = %error,
                failures,
                "redis {}: {failures} failures since the last report; retrying",
                self.what
            );
        }
        self.backoff()
    }

    /// Records a success: the next failure starts the backoff over.
    pub(crate) fn ok(&mut self) {
        if self.in_a_row > 0 {
            tracing::info!("redis {}: working again after {} failures in a row", self.what, self.in_a_row);
            self.in_a_row = 0;
        }
    }

    fn backoff(&self) -> Duration {
        let doublings = self.in_a_row.saturating_sub(1).min(16);
        MIN_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_starts_over_after_a_success() {
        let mut outage = Outage::new("test");
        let waits: Vec<_> = (0..8).map(|_| outage.failed(&"down")).collect();
        assert_eq!(waits[0], MIN_BACKOFF);
        assert_eq!(waits[1], MIN_BACKOFF * 2);
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        outage.ok();
        assert_eq!(outage.failed(&"down"), MIN_BACKOFF);
    }

    #[test]
    fn failures_between_reports_are_counted_not_reported() {
        let mut outage = Outage::new("test");
        outage.failed(&"down"); // reported at once
        assert_eq!(outage.since_report, 0);
        for _ in 0..5 {
            outage.failed(&"down");
        }
        assert_eq!(outage.since_report, 5, "within the minute: counted for the next report");
    }
}
