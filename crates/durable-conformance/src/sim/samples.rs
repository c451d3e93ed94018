//! The engine's sample workflows for simulation, a seed-chosen workload of them, and the
//! probe their steps call to check, as they execute, that no completed step runs again and
//! that no two executions of one step overlap.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use durable_core::{Backoff, RunId, StepError, Store, seed_for};
use durable_runtime::{Engine, StepContext, WorkflowCtx, WorkflowError};
use durable_store_memory::MemoryStore;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::driver::Log;
use super::{Invariant, Registration, Rng, Simulation};

/// The names of the sample workflows [`Simulation::samples`] registers.
pub const SAMPLE_WORKFLOWS: [&str; 6] =
    ["sim.chain", "sim.sleeper", "sim.signals", "sim.parent", "sim.saga", "sim.countdown"];

/// Watches step executions of the sample workflows.
pub(super) struct Probe {
    store: Arc<MemoryStore>,
    log: Arc<Log>,
    /// Executions in progress, by `(run, seq)`, with how many.
    active: Mutex<BTreeMap<(RunId, u32), u32>>,
}

impl Probe {
    pub(super) fn new(store: Arc<MemoryStore>, log: Arc<Log>) -> Self {
        Probe { store, log, active: Mutex::new(BTreeMap::new()) }
    }

    /// A step of a sample workflow begins executing: checks that its result is not
    /// committed already and that no other execution of it is in progress.
    fn enter(self: &Arc<Self>, sc: &StepContext, name: &str) -> Executing {
        let (run, seq) = (sc.run_id().clone(), sc.seq());
        if let Some(c) = self.committed(&run, seq) {
            self.log.violation(
                Invariant::StepReexecuted,
                format!(
                    "run {run} seq {seq}: step {name:?} executes (attempt {}) although its result is committed ({:?}, {} attempt(s))",
                    sc.attempt(),
                    c.status,
                    c.attempts
                ),
            );
        }
        let mut active = self.active.lock();
        let n = active.entry((run.clone(), seq)).or_insert(0);
        *n += 1;
        if *n > 1 {
            self.log.violation(
                Invariant::ConcurrentExecution,
                format!("run {run} seq {seq}: step {name:?} executes twice at once"),
            );
        }
        Executing { probe: self.clone(), key: (run, seq) }
    }

    /// The step's final checkpoint, if the store holds one. The memory store answers at
    /// once, so this reads it without yielding (a yield here would let the run move on).
    fn committed(&self, run: &RunId, seq: u32) -> Option<durable_core::Checkpoint> {
        let mut history = pin!(self.store.history(run));
        let Poll::Ready(history) = history.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            unreachable!("the memory store answers without waiting");
        };
        history.ok()?.into_iter().find(|c| c.seq == seq && c.is_final())
    }
}

/// One step execution in progress; dropping it (the step finished, or its turn vanished)
/// ends it.
struct Executing {
    probe: Arc<Probe>,
    key: (RunId, u32),
}

impl Drop for Executing {
    fn drop(&mut self) {
        let mut active = self.probe.active.lock();
        if let Some(n) = active.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                active.remove(&self.key);
            }
        }
    }
}

/// Some work inside a step: a few virtual milliseconds, the same for the same attempt.
async fn work(sc: &StepContext) {
    let ms = seed_for(sc.run_id().as_str(), sc.seq(), sc.attempt()) % 40;
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A step of a sample workflow: probed, working, then `f(attempt)`.
fn probed<T, F: FnOnce(u32) -> Result<T, StepError>>(
    probe: &Arc<Probe>,
    sc: StepContext,
    name: &'static str,
    f: F,
) -> impl Future<Output = Result<T, StepError>> + use<T, F> {
    let executing = probe.enter(&sc, name);
    async move {
        work(&sc).await;
        let result = f(sc.attempt());
        drop(executing);
        result
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Chain {
    /// Per step, how many attempts fail before one succeeds.
    fail: Vec<u32>,
    /// The retry backoff: under the engine's durable-retry threshold (1 s) the retry waits
    /// in memory, over it the run suspends.
    backoff_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Saga {
    fail: bool,
}

/// Registers every sample workflow on `engine`.
pub(super) fn register(engine: &Engine, probe: &Arc<Probe>) {
    let p = probe.clone();
    engine.register("sim.chain", 1, move |ctx: WorkflowCtx, input: Chain| {
        let p = p.clone();
        async move {
            let mut out = Vec::new();
            for (i, fail) in input.fail.iter().copied().enumerate() {
                let p = p.clone();
                let name = ["c0", "c1", "c2", "c3", "c4"][i.min(4)];
                let v: String = ctx
                    .step(name, move |sc| {
                        probed(&p, sc, name, move |attempt| {
                            if attempt <= fail {
                                Err(StepError::retryable(format!("{name}: attempt {attempt} fails on purpose")))
                            } else {
                                Ok(format!("{name}-ok"))
                            }
                        })
                    })
                    .retry(fail + 1, Backoff::Fixed(Duration::from_millis(input.backoff_ms)))
                    .await?;
                out.push(v);
            }
            Ok::<_, WorkflowError>(out)
        }
    });
    let p = probe.clone();
    engine.register("sim.sleeper", 1, move |ctx: WorkflowCtx, secs: u64| {
        let p = p.clone();
        async move {
            let p2 = p.clone();
            ctx.step("before", move |sc| probed(&p2, sc, "before", |_| Ok(()))).await?;
            ctx.sleep(Duration::from_secs(secs)).await;
            let slept: u64 = ctx.step("after", move |sc| probed(&p, sc, "after", move |_| Ok(secs))).await?;
            Ok::<_, WorkflowError>(slept)
        }
    });
    let p = probe.clone();
    engine.register("sim.signals", 1, move |ctx: WorkflowCtx, token: String| {
        let p = p.clone();
        async move {
            let got: Option<String> = ctx.wait_for_signal_timeout(&token, Duration::from_secs(24 * 3600)).await?;
            let never: Option<String> =
                ctx.wait_for_signal_timeout(&format!("{token}.never"), Duration::from_secs(600)).await?;
            let seen: String = ctx
                .step("record", move |sc| {
                    let got = got.clone();
                    probed(&p, sc, "record", move |_| Ok(got.unwrap_or_default()))
                })
                .await?;
            Ok::<_, WorkflowError>((seen, never.is_none()))
        }
    });
    engine.register("sim.parent", 1, move |ctx: WorkflowCtx, children: u32| async move {
        let handles: Vec<_> = (0..children)
            .map(|k| {
                let fail = (0..2).map(|i| (k + i) % 2).collect();
                ctx.spawn_child::<_, Vec<String>>("sim.chain", &Chain { fail, backoff_ms: 200 })
            })
            .collect();
        let mut total = 0;
        for handle in handles {
            total += handle.join().await?.len();
        }
        Ok::<_, WorkflowError>(total)
    });
    let p = probe.clone();
    engine.register("sim.saga", 1, move |ctx: WorkflowCtx, input: Saga| {
        let p = p.clone();
        async move {
            for what in ["flight", "hotel"] {
                let p = p.clone();
                ctx.step(what, move |sc| probed(&p, sc, what, move |_| Ok(format!("{what}-booking"))))
                    .compensate(|_booking: String| async { Ok(()) })
                    .await?;
            }
            let fail = input.fail;
            ctx.step("pay", move |sc| {
                probed(&p, sc, "pay", move |_| {
                    if fail { Err(StepError::fatal("card declined").with_code("declined")) } else { Ok(()) }
                })
            })
            .await?;
            Ok::<_, WorkflowError>("paid".to_string())
        }
    });
    let p = probe.clone();
    engine.register("sim.countdown", 1, move |ctx: WorkflowCtx, n: u32| {
        let p = p.clone();
        async move {
            ctx.step("tick", move |sc| probed(&p, sc, "tick", move |_| Ok(n))).await?;
            if n == 0 {
                return Ok("lift-off".to_string());
            }
            ctx.continue_as_new(&(n - 1)).await
        }
    });
}

/// Adds the samples, a seed-chosen workload of them and their signals to `sim`.
pub(super) fn add(mut sim: Simulation) -> Simulation {
    sim.registrations.push(Registration::Samples);
    let mut rng = Rng::new(sim.seed).fork(5);
    let runs = 3 + rng.below(4);
    for k in 0..runs {
        let id = format!("r{k}");
        sim = match rng.below(6) {
            0 => {
                let steps = 1 + rng.below(4);
                let fail = (0..steps).map(|_| u32::try_from(rng.below(3)).unwrap_or(0)).collect();
                let backoff_ms = if rng.chance(0.5) { 100 } else { 2_000 };
                sim.start("sim.chain", &id, &Chain { fail, backoff_ms })
            }
            1 => sim.start("sim.sleeper", &id, &(1 + rng.below(600))),
            2 => {
                let token = format!("tok-{id}");
                let after = rng.duration(Duration::from_secs(600));
                sim.start("sim.signals", &id, &token).signal(&token, &format!("sig-{id}"), after)
            }
            3 => sim.start("sim.parent", &id, &(1 + rng.below(3))),
            4 => sim.start("sim.saga", &id, &Saga { fail: rng.chance(0.5) }),
            _ => sim.start("sim.countdown", &id, &(rng.below(4))),
        };
    }
    sim
}
