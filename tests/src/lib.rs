//! Cross-crate integration tests live in `tests/`; this library holds what the worker processes
//! in `src/bin/` share.

use std::io::Write;

pub mod broker;
pub mod control;
pub mod flow;
pub mod remote;

/// Prints one line to stdout and flushes it at once: the tests read the workers' lines as they
/// come (a line is an event the test waits for), and a worker may be killed right after.
pub fn out(line: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_fmt(line);
    let _ = stdout.write_all(b"\n");
    let _ = stdout.flush();
}

/// Calls `print` with every event of `events` until the engine stops. A receiver that fell
/// more than the channel's 4,096 events behind prints `lagged <n>` and goes on, so a test
/// waiting for a line that was lost fails on that line rather than waiting in silence.
pub async fn print_events(
    mut events: tokio::sync::broadcast::Receiver<durable::EngineEvent>,
    mut print: impl FnMut(durable::EngineEvent),
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(event) => print(event),
            Err(RecvError::Lagged(n)) => out(format_args!("lagged {n}")),
            Err(RecvError::Closed) => return,
        }
    }
}
