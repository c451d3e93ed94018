//! The remote-step workflow the multi-process remote tests share: the tests' engines and the
//! worker processes that also execute runs (`remote_worker broker …`) register the same code.

use std::time::Duration;

use durable::{Engine, WorkflowCtx, WorkflowError};

/// Remote steps per run, one after the other.
pub const STEPS: u32 = 5;

/// The worker's step, as `remote_worker` computes it.
pub fn work(n: u64) -> u64 {
    2 * n + 1
}

/// The output of a run of `remote5` with input `i`: [`work`] applied [`STEPS`] times.
pub fn expected(i: u64) -> u64 {
    (0..STEPS).fold(i, |x, _| work(x))
}

/// Registers `remote5`: [`STEPS`] remote steps `work` in a row, each with the heartbeat lease
/// `lease` (a killed worker's task goes to another worker that long after its claim; so does a
/// live worker's whose result took longer to be recorded).
pub fn register(engine: &Engine, lease: Duration) {
    engine.register("remote5", 1, move |ctx: WorkflowCtx, n: u64| async move {
        let mut x = n;
        for _ in 0..STEPS {
            x = ctx.remote_step("work", &x).heartbeat_timeout(lease).await?;
        }
        Ok::<_, WorkflowError>(x)
    });
}
