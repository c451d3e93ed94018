//! The workflows of the control-plane tests, shared by the worker process
//! (`src/bin/control_pg_worker.rs`) and the tests that run engines in the test process.

use std::sync::Arc;
use std::time::Duration;

use durable::{Engine, EngineConfig, RunId, WorkflowCtx, WorkflowError};

/// What the workflows tell the test (the process prints it; a test in-process collects it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A step of `loop` started (its index).
    Step(RunId, u32),
    /// The undo of a step of `loop` ran (the step's index).
    Undo(RunId, u32),
    /// A turn of `loop` ended: its body was dropped.
    Stopped(RunId),
}

/// Receives the reports, on the task that made them: hand them on quickly.
pub type Reporter = Arc<dyn Fn(Report) + Send + Sync>;

/// The input of `loop`: how many steps, how long each takes (ms), whether each has an undo.
pub type LoopInput = (u32, u64, bool);

/// Engine settings: pollers that find a client's start quickly.
pub fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.poll_interval = Duration::from_millis(20);
    config.wait_poll_interval = Duration::from_millis(50);
    config
}

/// Drops with a body of `loop`: its turn ended.
struct BodyGuard(RunId, Reporter);

impl Drop for BodyGuard {
    fn drop(&mut self) {
        (self.1)(Report::Stopped(self.0.clone()));
    }
}

/// Registers `greet` (one step: `"hello <name>"`) and `loop` (see [`LoopInput`]).
pub fn register(engine: &Engine, report: Reporter) {
    engine.register("greet", 1, |ctx: WorkflowCtx, name: String| async move {
        let greeting: String = ctx
            .step("compose", move |_| {
                let name = name.clone();
                async move { Ok(format!("hello {name}")) }
            })
            .await?;
        Ok::<_, WorkflowError>(greeting)
    });
    engine.register("loop", 1, move |ctx: WorkflowCtx, (steps, step_ms, undo): LoopInput| {
        let report = report.clone();
        async move {
            let run = ctx.run_id().clone();
            let _guard = BodyGuard(run.clone(), report.clone());
            for i in 0..steps {
                let (r, id) = (report.clone(), run.clone());
                let step = ctx.step("tick", move |_| {
                    let (r, id) = (r.clone(), id.clone());
                    async move {
                        r(Report::Step(id, i));
                        tokio::time::sleep(Duration::from_millis(step_ms)).await;
                        Ok(i)
                    }
                });
                if undo {
                    let (r, id) = (report.clone(), run.clone());
                    step.compensate(move |i: u32| {
                        let (r, id) = (r.clone(), id.clone());
                        async move {
                            r(Report::Undo(id, i));
                            Ok(())
                        }
                    })
                    .await?;
                } else {
                    step.await?;
                }
            }
            Ok::<_, WorkflowError>(())
        }
    });
}
