//! The engine's reads of single runs (`wait_for_run`'s looks, a dispatch's check, a handed
//! run's re-read) are folded into batches: runs read at the same time cost one
//! `Store::get_runs`, and a batch that fails costs its readers a read each, not an error.

use std::sync::Arc;
use std::time::Duration;

use durable_conformance::{Fault, FaultyStore, Method};
use durable_runtime::{Engine, EngineConfig, StartOptions, WorkflowCtx, WorkflowError};
use durable_store_memory::MemoryStore;

/// An engine on `store` whose waiters never poll (each reads on its first look and when
/// this engine settles its run), running `one`: one step adding 1 to the input.
fn engine(store: &Arc<FaultyStore<MemoryStore>>) -> Engine {
    let mut config = EngineConfig::default();
    config.wait_poll_interval = Duration::from_secs(3_600);
    let engine = Engine::builder().shared_store(store.clone()).config(config).build().unwrap();
    engine.register("one", 1, |ctx: WorkflowCtx, n: u64| async move {
        let out: u64 = ctx.step("add", move |_| async move { Ok(n + 1) }).await?;
        Ok::<_, WorkflowError>(out)
    });
    engine
}

/// Starts `runs` runs of `one` (input = index).
async fn start(engine: &Engine, runs: u64) -> Vec<durable_runtime::Started> {
    engine.start_many((0..runs).map(|i| ("one", i, StartOptions::id(format!("one-{i}"))))).await.unwrap()
}

/// Waits for each run from a task of its own; checks every output.
async fn wait_all(engine: &Engine, started: Vec<durable_runtime::Started>) {
    let waits: Vec<_> = started
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let engine = engine.clone();
            tokio::spawn(async move { (i as u64, engine.wait_for_run(&s.id).await) })
        })
        .collect();
    for wait in waits {
        let (i, outcome) = wait.await.unwrap();
        assert_eq!(outcome.unwrap().output::<u64>().unwrap(), i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_read_at_the_same_time_are_read_in_one_batch() {
    const RUNS: u64 = 100;
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    // Each batch takes a while, so the reads asked meanwhile gather for the next one.
    store.set_method_latency(Method::GetRuns, Duration::from_millis(20));
    let engine = engine(&store);
    let started = start(&engine, RUNS).await;
    store.reset_counts();
    wait_all(&engine, started).await;
    // Every waiter read its run at least once (its first look), all through batches.
    assert_eq!(store.calls(Method::GetRun), 0, "a single-run read bypassed the batches");
    let batches = store.calls(Method::GetRuns);
    assert!(batches > 0);
    assert!(batches * 2 <= RUNS, "{batches} batches for at least {RUNS} reads: the reads were not folded");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_batch_leaves_each_reader_to_read_its_run_alone() {
    const RUNS: u64 = 10;
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let engine = engine(&store);
    let started = start(&engine, RUNS).await;
    store.reset_counts();
    store.arm(Fault::on(Method::GetRuns));
    wait_all(&engine, started).await;
    assert!(store.calls(Method::GetRuns) > 0, "no batch was tried");
    assert!(store.calls(Method::GetRun) >= RUNS, "each waiter read its run alone after its batch failed");
    engine.shutdown().await;
}

/// A store out of reach for a moment (retryable errors on every read) does not end a wait: it
/// looks again until the store answers, and returns the run's outcome. An error that will not
/// pass ends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_rides_out_a_store_outage_and_stops_at_an_error_that_stays() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let mut config = EngineConfig::default();
    config.wait_poll_interval = Duration::from_millis(5);
    let engine = Engine::builder().shared_store(store.clone()).config(config).build().unwrap();
    engine.register("approve", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.wait_for_signal("ok").await?;
        Ok::<_, WorkflowError>(v)
    });
    let run = engine.start("approve", &(), StartOptions::id("a")).await.unwrap().id;
    engine.wait_until_suspended_or_terminal(&run).await.unwrap();
    // Every read of a run fails (retryable) until the fault is cleared.
    let reads = || Fault::when(|c| matches!(c.method, Method::GetRun | Method::GetRuns));
    store.arm(reads());
    let waiter = tokio::spawn({
        let (engine, run) = (engine.clone(), run.clone());
        async move { engine.wait_for_run(&run).await }
    });
    while store.injected() < 3 && !waiter.is_finished() {
        tokio::task::yield_now().await;
    }
    assert!(!waiter.is_finished(), "the wait ended on a retryable error");
    store.clear_faults();
    engine.signal("ok", &7u32).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("a hang guard").unwrap();
    assert_eq!(outcome.unwrap().output::<u32>().unwrap(), 7);

    // Not retryable: the wait ends with it.
    let run = engine.start("approve", &(), StartOptions::id("b")).await.unwrap().id;
    engine.wait_until_suspended_or_terminal(&run).await.unwrap();
    store.arm(
        reads().error(|_| durable_core::StoreError::Unavailable { message: "disk gone".into(), retryable: false }),
    );
    let e = engine.wait_for_run(&run).await.unwrap_err();
    assert!(e.to_string().contains("disk gone"), "{e}");
    engine.shutdown().await;
}
