//! Time as the engine sees it: the real clock, or a virtual one tests move by hand.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_core::Millis;
use tokio::sync::Notify;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The engine's source of durable time: what `ctx.now()` records, what `wake_at` is measured
/// against, and what sleeps and retry backoffs wait on.
///
/// Infrastructure timing (poll intervals, lease renewal cadence) uses tokio's timer, not this.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now(&self) -> Millis;

    /// Resolves once `now() >= at`.
    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()>;
}

/// The wall clock, with tokio's timer for sleeps.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, durable_core::millis)
    }

    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()> {
        let now = self.now();
        Box::pin(async move {
            if at > now {
                tokio::time::sleep(Duration::from_millis(at - now)).await;
            }
        })
    }
}

/// A clock that only moves when told to: a 30-day sleep completes as soon as a test calls
/// [`VirtualClock::advance`] by 30 days. Clones share the same time.
///
/// Sleeps due at one advance wake in the order they began waiting (a `Notify`, not a `watch`
/// channel, which wakes its waiters in an order chosen at random).
#[derive(Clone)]
pub struct VirtualClock {
    time: Arc<VirtualTime>,
}

/// The time of a [`VirtualClock`] and its clones, and the sleeps waiting on it.
struct VirtualTime {
    now: AtomicU64,
    moved: Notify,
}

impl fmt::Debug for VirtualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualClock").field("now", &self.now()).finish()
    }
}

impl VirtualClock {
    /// A virtual clock starting at `start` (epoch milliseconds).
    pub fn new(start: Millis) -> Self {
        VirtualClock { time: Arc::new(VirtualTime { now: AtomicU64::new(start), moved: Notify::new() }) }
    }

    /// A virtual clock starting at 2026-01-01T00:00:00Z.
    pub fn starting_2026() -> Self {
        Self::new(1_767_225_600_000)
    }

    /// Moves time forward by `d` (saturating at the end of time), waking every sleep that is
    /// now due.
    pub fn advance(&self, d: Duration) {
        let _ = self
            .time
            .now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| Some(durable_core::millis_after(now, d)));
        self.time.moved.notify_waiters();
    }

    /// Sets the time (never backwards).
    pub fn set(&self, at: Millis) {
        self.time.now.fetch_max(at, Ordering::AcqRel);
        self.time.moved.notify_waiters();
    }
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self::starting_2026()
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Millis {
        self.time.now.load(Ordering::Acquire)
    }

    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()> {
        let time = self.time.clone();
        Box::pin(async move {
            loop {
                // Made before the check: a move between the check and the wait still wakes it.
                let moved = time.moved.notified();
                if time.now.load(Ordering::Acquire) >= at {
                    return;
                }
                moved.await;
            }
        })
    }
}

/// Durable time that follows tokio's clock: `now()` is `epoch` plus the time tokio's clock has
/// moved since the clock was made, and sleeps are tokio sleeps. With tokio's time paused
/// (`#[tokio::test(start_paused = true)]`, `Builder::start_paused`) durable time, the engine's
/// pollers and lease renewals all move together, skipping ahead whenever everything waits —
/// the clock of `durable_conformance::sim`. Must be made inside a tokio runtime.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: Millis,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `epoch` (milliseconds since the Unix epoch) now.
    pub fn starting_at(epoch: Millis) -> Self {
        TokioClock { epoch, start: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Millis {
        self.epoch.saturating_add(durable_core::millis(self.start.elapsed()))
    }

    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()> {
        let deadline = self.start + Duration::from_millis(at.saturating_sub(self.epoch));
        Box::pin(tokio::time::sleep_until(deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn virtual_sleep_fires_on_advance() {
        let clock = VirtualClock::new(1_000);
        let sleep = clock.sleep_until(1_000 + 86_400_000);
        let handle = tokio::spawn(sleep);
        tokio::task::yield_now().await;
        assert!(!handle.is_finished());
        clock.advance(Duration::from_secs(86_400));
        handle.await.unwrap();
        assert_eq!(clock.now(), 1_000 + 86_400_000);
    }
}
