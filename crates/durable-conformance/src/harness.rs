//! The workflow test harness: an engine on a virtual clock, step helpers that fail on
//! purpose, and assertions on runs and their histories.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use durable_core::{Checkpoint, RunId, RunStatus, StepError, StepKind, Store};
use durable_runtime::{Engine, EngineConfig, RunOutcome, VirtualClock};
use durable_store_memory::MemoryStore;
use serde::de::DeserializeOwned;

/// An [`Engine`] on a [`VirtualClock`]: a 30-day sleep completes as soon as the test calls
/// [`TestEngine::advance`]. Derefs to the engine, so `register`, `start`, `wait_for_run`, …
/// are called on it directly.
///
/// ```
/// use std::time::Duration;
/// use durable_conformance::TestEngine;
/// use durable_runtime::{RunStatus, StartOptions, WorkflowCtx, WorkflowError};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let t = TestEngine::new();
/// t.register("month", 1, |ctx: WorkflowCtx, _: ()| async move {
///     ctx.sleep(Duration::from_secs(30 * 86_400)).await;
///     Ok::<_, WorkflowError>("done")
/// });
/// let run = t.start("month", &(), StartOptions::id("m")).await.unwrap();
/// t.assert_settled_status(&run.id, RunStatus::Suspended).await;
/// t.advance(Duration::from_secs(30 * 86_400));
/// t.assert_output(&run.id, "done".to_string()).await;
/// # }
/// ```
pub struct TestEngine {
    engine: Engine,
    clock: VirtualClock,
    store: Arc<dyn Store>,
    config: EngineConfig,
}

impl fmt::Debug for TestEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestEngine").field("engine", &self.engine).field("clock", &self.clock).finish()
    }
}

impl Deref for TestEngine {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.engine
    }
}

/// The harness's engine configuration: fast polling, so runs parked by an earlier engine are
/// found at once; everything else at its default.
pub fn test_config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.poll_interval = Duration::from_millis(20);
    config.orphan_poll_interval = Duration::from_millis(100);
    config.wait_poll_interval = Duration::from_millis(20);
    config.store_retry_backoff = Duration::from_millis(10);
    config
}

impl TestEngine {
    /// A test engine on a fresh [`MemoryStore`], with the clock at 2026-01-01.
    pub fn new() -> Self {
        Self::with_store(Arc::new(MemoryStore::new()))
    }

    /// A test engine on the given store.
    pub fn with_store(store: Arc<dyn Store>) -> Self {
        Self::with_parts(store, VirtualClock::starting_2026(), test_config())
    }

    /// A test engine on the given store, clock and configuration.
    pub fn with_parts(store: Arc<dyn Store>, clock: VirtualClock, config: EngineConfig) -> Self {
        let engine = Engine::builder()
            .shared_store(store.clone())
            .clock(clock.clone())
            .config(config.clone())
            .build()
            .expect("a store is set");
        TestEngine { engine, clock, store, config }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The virtual clock.
    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// The store.
    pub fn shared_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Moves virtual time forward by `d`: timers that come due fire, and the pollers look for
    /// due runs parked by other engines on the same store.
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.engine.poll_now();
    }

    /// Shuts this engine down (turns dropped, leases released) and builds a new one on the
    /// same store and clock — a process restart. Register the workflows again on the result.
    pub async fn restart(self) -> TestEngine {
        self.engine.shutdown().await;
        Self::with_parts(self.store, self.clock, self.config)
    }

    /// Drops this engine without any cleanup — its turns vanish mid-flight and their leases
    /// stay held until they expire, as after `kill -9` — and builds a new one on the same store
    /// and clock. Advance the clock past the lease TTL for the new engine to recover the runs.
    pub fn crash(self) -> TestEngine {
        let TestEngine { engine, clock, store, config } = self;
        drop(engine);
        Self::with_parts(store, clock, config)
    }

    /// A second engine on the same store and clock (another process sharing the store).
    pub fn sibling(&self) -> TestEngine {
        Self::with_parts(self.store.clone(), self.clock.clone(), self.config.clone())
    }

    /// The run's checkpoints as the store holds them: none for a run deleted or never created
    /// (panics if the store fails).
    pub async fn checkpoints(&self, id: &RunId) -> Vec<Checkpoint> {
        self.store.history(id).await.expect("history")
    }

    /// Waits, on the engine's events and never sleeping, until `ok` holds of run `id`, its
    /// history and the engine's metrics: checked now and after each event of the run (panics
    /// when no event of the run comes within 20 s). A condition on state the engine changes
    /// before announcing it (a turn kept in memory before its suspension is announced) holds
    /// by the event that follows.
    pub async fn until_run(
        &self,
        events: &mut tokio::sync::broadcast::Receiver<durable_runtime::EngineEvent>,
        id: &RunId,
        ok: impl Fn(&durable_core::Run, &[Checkpoint], &durable_runtime::Metrics) -> bool,
    ) {
        loop {
            let run = self.engine.get_run(id).await.expect("get_run").expect("the run exists");
            if ok(&run, &self.checkpoints(id).await, &self.engine.metrics()) {
                return;
            }
            next_event(events, Duration::from_secs(20), |e| e.run_id() == Some(id)).await;
        }
    }

    /// Names of the run's recorded `step` checkpoints, by seq.
    pub async fn step_names(&self, id: &RunId) -> Vec<String> {
        self.checkpoints(id).await.into_iter().filter(|c| c.kind == StepKind::Step).map(|c| c.name).collect()
    }

    /// Attempts recorded for the step named `name` (panics if there is none).
    pub async fn attempts(&self, id: &RunId, name: &str) -> u32 {
        self.checkpoints(id)
            .await
            .into_iter()
            .find(|c| matches!(c.kind, StepKind::Step | StepKind::Remote) && c.name == name)
            .unwrap_or_else(|| panic!("run {id} has no step named {name:?}"))
            .attempts
    }

    /// Waits for the run to be terminal and asserts its status.
    pub async fn assert_status(&self, id: &RunId, status: RunStatus) {
        let outcome = self.settled(id, Settled::Terminal, SETTLE_LIMIT).await;
        assert_eq!(outcome.status(), status, "run {id}: {:?}", outcome.run.error);
    }

    /// Waits for the run to be terminal or suspended and asserts its status.
    pub async fn assert_settled_status(&self, id: &RunId, status: RunStatus) {
        let outcome = self.settled(id, Settled::SuspendedOrTerminal, SETTLE_LIMIT).await;
        assert_eq!(outcome.status(), status, "run {id}: {:?}", outcome.run.error);
    }

    /// Waits for the run to complete and asserts its output.
    pub async fn assert_output<O: DeserializeOwned + PartialEq + fmt::Debug>(&self, id: &RunId, expected: O) {
        let outcome = self.settled(id, Settled::Terminal, SETTLE_LIMIT).await;
        let output: O = outcome.output().unwrap_or_else(|e| panic!("run {id}: {e}"));
        assert_eq!(output, expected, "run {id}");
    }

    /// The run once it is terminal (or suspended, as `until` says); panics when it is not
    /// within `limit` of tokio's time (real time, except under a paused tokio clock, where
    /// waiting on a store's own threads lets it jump ahead), saying where it stands: a run asleep past the virtual
    /// clock's time waits for [`TestEngine::advance`], which a test calls too early when it
    /// advances before the run's first turn parked it.
    async fn settled(&self, id: &RunId, until: Settled, limit: Duration) -> RunOutcome {
        let wait = async {
            match until {
                Settled::Terminal => self.engine.wait_for_run(id).await,
                Settled::SuspendedOrTerminal => self.engine.wait_until_suspended_or_terminal(id).await,
            }
        };
        match tokio::time::timeout(limit, wait).await {
            Ok(outcome) => outcome.unwrap_or_else(|e| panic!("run {id}: {e}")),
            Err(_) => panic!("{}", self.unsettled(id, until, limit).await),
        }
    }

    /// Why the run did not settle: its status and, if it sleeps past the clock, until when.
    async fn unsettled(&self, id: &RunId, until: Settled, limit: Duration) -> String {
        let goal = match until {
            Settled::Terminal => "end",
            Settled::SuspendedOrTerminal => "park or end",
        };
        let run = match self.engine.get_run(id).await {
            Ok(Some(run)) => run,
            Ok(None) => return format!("run {id} does not exist"),
            Err(e) => return format!("run {id} did not {goal} within {limit:?}, and reading it failed: {e}"),
        };
        let mut why = format!("run {id} did not {goal} within {limit:?} (real time): it is {}", run.status);
        let now = durable_runtime::Clock::now(&self.clock);
        if let Some(at) = run.wake_at.filter(|at| *at > now) {
            why.push_str(&format!(
                ", waiting until {} ms past the virtual clock's time; advance the clock after the run \
                 parks (`assert_settled_status(&id, RunStatus::Suspended)` waits for that): an advance \
                 made before its first turn reached the wait moves the wait's deadline along with it",
                at - now
            ));
        } else if run.status == RunStatus::Suspended {
            why.push_str(", waiting for something to arrive (a signal, an event, a child, a remote step's result)");
        }
        why
    }

    /// Asserts the run's recorded step names, in seq order.
    pub async fn assert_step_names(&self, id: &RunId, expected: &[&str]) {
        assert_eq!(self.step_names(id).await, expected, "run {id}");
    }

    /// Asserts the attempts recorded for a step.
    pub async fn assert_attempts(&self, id: &RunId, step: &str, expected: u32) {
        assert_eq!(self.attempts(id, step).await, expected, "run {id}, step {step:?}");
    }
}

impl Default for TestEngine {
    fn default() -> Self {
        Self::new()
    }
}

/// How long the assertions wait for a run before they fail, saying where it stands (on
/// tokio's clock: a test on a paused one, `start_paused`, with a store doing I/O on its own
/// threads waits with `wait_for_run` instead).
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// What [`TestEngine::settled`] waits for.
#[derive(Clone, Copy)]
enum Settled {
    Terminal,
    SuspendedOrTerminal,
}

/// A step helper that fails its first `n` calls with a retryable error, then succeeds with the
/// call number. Clones share the count.
///
/// ```
/// let flaky = durable_conformance::FailFirst::new(2);
/// assert!(flaky.call().is_err());
/// assert!(flaky.call().is_err());
/// assert_eq!(flaky.call().unwrap(), 3);
/// assert_eq!(flaky.calls(), 3);
/// ```
#[derive(Debug, Clone)]
pub struct FailFirst {
    failures: u32,
    calls: Arc<AtomicU32>,
}

impl FailFirst {
    /// Fails the first `n` calls.
    pub fn new(n: u32) -> Self {
        FailFirst { failures: n, calls: Arc::new(AtomicU32::new(0)) }
    }

    /// One call: `Err` (retryable) for the first `n`, then `Ok(call number)`.
    pub fn call(&self) -> Result<u32, StepError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.failures {
            Err(StepError::retryable(format!("planned failure {n} of {}", self.failures)))
        } else {
            Ok(n)
        }
    }

    /// How many times it was called.
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Counts executions, e.g. of a step closure, so a test can assert "exactly once".
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU32>);

impl Counter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one; returns the new count.
    pub fn bump(&self) -> u32 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The count.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The next event of `events` that `matches`, waiting at most `within` (events that do not
/// match are skipped, and so is a lag); panics when none came in time or the stream closed.
/// For tests that wait for something an engine reports, instead of sleeping.
///
/// ```no_run
/// # async fn demo(engine: durable_runtime::Engine, run: durable_core::RunId) {
/// use std::time::Duration;
/// use durable_runtime::EngineEvent;
///
/// let mut events = engine.subscribe();
/// // … start or signal something …
/// let settled = durable_conformance::next_event(&mut events, Duration::from_secs(30), |e| {
///     matches!(e, EngineEvent::RunSettled { run_id, .. } if *run_id == run)
/// })
/// .await;
/// # let _ = settled;
/// # }
/// ```
pub async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<durable_runtime::EngineEvent>,
    within: Duration,
    matches: impl Fn(&durable_runtime::EngineEvent) -> bool,
) -> durable_runtime::EngineEvent {
    use tokio::sync::broadcast::error::RecvError;
    let next = async {
        loop {
            match events.recv().await {
                Ok(e) if matches(&e) => return e,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("the engine's event stream closed"),
            }
        }
    };
    tokio::time::timeout(within, next).await.unwrap_or_else(|_| panic!("no matching event within {within:?}"))
}

#[cfg(test)]
mod tests {
    use durable_runtime::{StartOptions, WorkflowCtx, WorkflowError};

    use super::*;

    fn sleeper() -> TestEngine {
        let t = TestEngine::new();
        t.register("nap", 1, |ctx: WorkflowCtx, _: ()| async move {
            ctx.sleep(Duration::from_secs(3600)).await;
            Ok::<_, WorkflowError>(())
        });
        t
    }

    #[tokio::test]
    #[should_panic(
        expected = "run nap did not end within 100ms (real time): it is suspended, waiting until 3600000 ms"
    )]
    async fn an_assertion_on_a_run_asleep_past_the_clock_fails_saying_so_instead_of_hanging() {
        let t = sleeper();
        let run = t.start("nap", &(), StartOptions::id("nap")).await.unwrap();
        t.assert_settled_status(&run.id, RunStatus::Suspended).await;
        t.settled(&run.id, Settled::Terminal, Duration::from_millis(100)).await;
    }

    #[tokio::test]
    async fn an_advance_after_the_run_parked_wakes_it() {
        let t = sleeper();
        let run = t.start("nap", &(), StartOptions::id("nap")).await.unwrap();
        t.assert_settled_status(&run.id, RunStatus::Suspended).await;
        t.advance(Duration::from_secs(3600));
        t.assert_status(&run.id, RunStatus::Completed).await;
    }
}
