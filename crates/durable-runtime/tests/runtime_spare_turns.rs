//! One turn per wake: the pollers never queue a run that is already queued or executing on
//! this engine, so a bulk start or a burst of due timers executes each run exactly once per
//! wake (`Metrics::turns_without_progress` stays 0) — and the metric does count a spare turn
//! when one is forced.

mod support;

use std::sync::Arc;
use std::time::Duration;

use durable_core::{RunId, RunPatch, RunStatus};
use durable_runtime::{Clock, StartOptions, WorkflowCtx, WorkflowError};
use support::StoreFixture;

/// How many runs the bulk tests start.
const RUNS: usize = 10_000;
/// Starts in flight at once, as a service starting runs in bulk has.
const IN_FLIGHT: usize = 256;

/// Registers `napper`: a step, a one-hour sleep, a step. Its first turn suspends it and its
/// second completes it: two turns per run, both with progress.
fn register_napper(t: &durable_conformance::TestEngine) {
    t.register("napper", 1, |ctx: WorkflowCtx, i: u64| async move {
        let a: u64 = ctx.step("before", move |_| async move { Ok(i) }).await?;
        ctx.sleep(Duration::from_secs(3600)).await;
        let b: u64 = ctx.step("after", move |_| async move { Ok(a + 1) }).await?;
        Ok::<_, WorkflowError>(b)
    });
}

/// Starts `runs` napper runs, `IN_FLIGHT` `start` calls at a time.
async fn start_in_bulk(engine: &durable_runtime::Engine, runs: usize) -> Vec<RunId> {
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut starts = tokio::task::JoinSet::new();
    for i in 0..runs {
        let permit = slots.clone().acquire_owned().await.expect("open");
        let engine = engine.clone();
        starts.spawn(async move {
            let started = engine.start("napper", &(i as u64), StartOptions::id(format!("nap-{i}"))).await;
            drop(permit);
            started.expect("start").id
        });
    }
    let mut ids = Vec::with_capacity(runs);
    while let Some(id) = starts.join_next().await {
        ids.push(id.expect("start task"));
    }
    ids
}

async fn a_bulk_start_executes_no_spare_turn(s: StoreFixture) {
    let t = s.engine();
    register_napper(&t);
    let ids = start_in_bulk(&t, RUNS).await;
    for id in &ids {
        t.assert_settled_status(id, RunStatus::Suspended).await;
    }
    let parked = t.metrics();
    t.advance(Duration::from_secs(3600));
    for id in &ids {
        t.assert_status(id, RunStatus::Completed).await;
    }
    let m = t.metrics();
    let share = parked.turns_without_progress as f64 / RUNS as f64;
    eprintln!("bulk start: {parked:?}; spare-turn share while parking {:.2}%; at the end {m:?}", share * 100.0);
    assert_eq!(m.turns_without_progress, 0, "spare turns: {m:?}");
    assert_eq!(m.turns, 2 * RUNS as u64, "one turn per start and one per wake: {m:?}");
}

async fn a_burst_of_due_timers_executes_no_spare_turn(s: StoreFixture) {
    let t = s.engine();
    register_napper(&t);
    // Parked one by one, so the burst alone is measured.
    let mut ids = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        ids.push(t.start("napper", &(i as u64), StartOptions::id(format!("nap-{i}"))).await.expect("start").id);
    }
    for id in &ids {
        t.assert_settled_status(id, RunStatus::Suspended).await;
    }
    let parked = t.metrics();
    assert_eq!(parked.turns, RUNS as u64, "{parked:?}");
    // Every timer comes due at once: the in-memory timers, the due poller and (the clock
    // jumped past every lease) the orphan poller all look at the same runs.
    t.advance(Duration::from_secs(3600));
    for id in &ids {
        t.assert_status(id, RunStatus::Completed).await;
    }
    let m = t.metrics();
    eprintln!("timer burst: {m:?}");
    assert_eq!(m.turns_without_progress, 0, "spare turns: {m:?}");
    assert_eq!(m.turns, 2 * RUNS as u64, "one turn per start and one per timer: {m:?}");
}

/// The metric can fail: a run made to look due although its sleep is not (as a store whose
/// due index lied would) is executed by the due poller, replays, finds nothing to do and
/// suspends again — one turn without progress.
async fn a_forced_spare_turn_is_counted(s: StoreFixture) {
    let t = s.engine();
    register_napper(&t);
    let run = t.start("napper", &1u64, StartOptions::id("nap")).await.expect("start");
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    assert_eq!(t.metrics().turns_without_progress, 0);
    let mut events = t.subscribe();
    let now = t.clock().now();
    let patch = RunPatch { wake_at: Some(Some(now)), now, ..Default::default() };
    assert!(t.store().update_run_if(&run.id, &[RunStatus::Suspended], patch).await.expect("patch"));
    t.poll_now();
    support::turn_started(&mut events, &run.id).await;
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    let m = t.metrics();
    assert_eq!((m.turns, m.turns_without_progress), (2, 1), "{m:?}");
    // The real wake still makes progress.
    t.advance(Duration::from_secs(3600));
    t.assert_output(&run.id, 2u64).await;
    let m = t.metrics();
    assert_eq!((m.turns, m.turns_without_progress), (3, 1), "{m:?}");
}

on_every_store!(
    a_bulk_start_executes_no_spare_turn,
    a_burst_of_due_timers_executes_no_spare_turn,
    a_forced_spare_turn_is_counted
);

/// With a run queue, what the pollers find goes to the outbox — unless the run is queued or
/// executing here: a bulk start and a burst of due timers through the queue execute no spare
/// turn either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_run_queue_a_bulk_start_executes_no_spare_turn() {
    const RUNS: usize = 2_000;
    let store = Arc::new(durable_store_memory::MemoryStore::new());
    let clock = durable_runtime::VirtualClock::starting_2026();
    let engine = durable_runtime::Engine::builder()
        .shared_store(store.clone())
        .transport(durable_transport::QueueTransport::new(store.clone()))
        .clock(clock.clone())
        .config(durable_conformance::test_config())
        .build()
        .expect("engine");
    engine.register("napper", 1, |ctx: WorkflowCtx, i: u64| async move {
        let a: u64 = ctx.step("before", move |_| async move { Ok(i) }).await?;
        ctx.sleep(Duration::from_secs(3600)).await;
        let b: u64 = ctx.step("after", move |_| async move { Ok(a + 1) }).await?;
        Ok::<_, WorkflowError>(b)
    });
    let ids = start_in_bulk(&engine, RUNS).await;
    for id in &ids {
        let run = engine.wait_until_suspended_or_terminal(id).await.expect("wait");
        assert_eq!(run.status(), RunStatus::Suspended);
    }
    clock.advance(Duration::from_secs(3600));
    engine.poll_now();
    for id in &ids {
        assert_eq!(engine.wait_for_run(id).await.expect("wait").status(), RunStatus::Completed);
    }
    let m = engine.metrics();
    eprintln!("through a run queue: {m:?}");
    assert_eq!(m.turns_without_progress, 0, "spare turns: {m:?}");
    assert_eq!(m.turns, 2 * RUNS as u64, "one turn per start and one per wake: {m:?}");
}
