//! How a connection waits for the write lock of a file another connection (another process,
//! another store on the same file) holds: its busy handler.
//!
//! SQLite's own handler (`sqlite3_busy_timeout`) sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50,
//! 50, then 100 ms between tries. Against writers that commit every millisecond or so, a
//! connection that lost a few tries sleeps tens of milliseconds while the others take the lock
//! again and again: with three worker processes on one file, a burst of runs went 0 / 274 / 726
//! (`cargo xtask bench`, `chain --workers 3`), and one worker often executed nothing at all.
//! This handler tries again every 100–300 µs (jittered, so waiters do not retry in step)
//! until the busy timeout has passed since the first try, so a waiting process takes the lock
//! soon after it is released: the same burst went about 320 / 350 / 330.
//!
//! SQLite takes a plain function, with no state of its own, so the timeout is kept per thread:
//! every thread that runs statements (the opening thread, the writer, the readers) sets it
//! first with [`set_timeout`].

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// The busy timeout of the connections this thread runs statements on.
    static TIMEOUT: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
    /// When the current wait for a lock began (its first try).
    static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The shortest pause between two tries; each pause adds up to twice this again (jitter).
const PAUSE: Duration = Duration::from_micros(100);

/// Sets the busy timeout the handler keeps to on this thread.
pub(crate) fn set_timeout(timeout: Duration) {
    TIMEOUT.with(|t| t.set(timeout));
}

/// The busy handler: `count` is how many times SQLite already called it for this lock. Pauses
/// and returns `true` (try again) until the thread's timeout has passed since the first call;
/// then `false`, and the statement fails with `SQLITE_BUSY`.
pub(crate) fn wait(count: i32) -> bool {
    let now = Instant::now();
    let since = if count == 0 {
        SINCE.with(|s| s.set(Some(now)));
        now
    } else {
        SINCE.with(Cell::get).unwrap_or(now)
    };
    if now.duration_since(since) >= TIMEOUT.with(Cell::get) {
        return false;
    }
    // Jitter from the clock's low bits: 0–200 µs on top of the pause.
    let jitter =
        Duration::from_nanos(u64::from(now.duration_since(since).subsec_nanos() ^ count.unsigned_abs()) % 200_000);
    std::thread::sleep(PAUSE + jitter);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tries_again_until_the_timeout_has_passed_since_the_first_try() {
        set_timeout(Duration::from_millis(20));
        let start = Instant::now();
        let mut count = 0;
        while wait(count) {
            count += 1;
        }
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(20), "gave up after {waited:?}");
        assert!(count > 0);
        // A new wait starts its own clock.
        set_timeout(Duration::from_secs(5));
        assert!(wait(0));
    }

    #[test]
    fn a_zero_timeout_gives_up_at_once() {
        set_timeout(Duration::ZERO);
        assert!(!wait(0));
        set_timeout(Duration::from_secs(5));
    }
}
