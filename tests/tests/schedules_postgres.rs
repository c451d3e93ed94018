//! Schedules, delayed starts and gathering triggers through the engine on PostgreSQL: two
//! engines, each with its own connection pool on one scratch schema (as two processes would
//! have), on one virtual clock.
//!
//! The server comes from `DURABLE_PG_URL`; without it every test prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test schedules_postgres
//! ```

use std::sync::Arc;
use std::time::Duration;

use durable::{
    Clock, EngineEvent, PublishOptions, RunFilter, RunId, RunStatus, Schedule, StartOptions, VirtualClock, WorkflowCtx,
    WorkflowError, WorkflowOptions,
};
use durable_conformance::{TestEngine, test_config};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
use serde_json::json;
use tokio::sync::broadcast;

const MIN: Duration = Duration::from_secs(60);

/// Two test engines on one scratch schema and one virtual clock, each with its own store.
async fn two_engines(schema: &ScratchSchema) -> (TestEngine, TestEngine) {
    let clock = VirtualClock::starting_2026();
    let mut engines = Vec::new();
    for _ in 0..2 {
        let store = Arc::new(schema.connect().await.expect("connect"));
        let t = TestEngine::with_parts(store, clock.clone(), test_config());
        t.register("echo", 1, |_ctx: WorkflowCtx, v: serde_json::Value| async move { Ok::<_, WorkflowError>(v) });
        t.register_with(
            "bulk",
            1,
            WorkflowOptions::default().on_event("order", json!({})).batch(10, Duration::from_secs(5)),
            |_ctx: WorkflowCtx, orders: Vec<u32>| async move { Ok::<_, WorkflowError>(orders) },
        );
        engines.push(t);
    }
    let b = engines.pop().expect("two");
    (engines.pop().expect("two"), b)
}

/// Waits for the next `ScheduleAdvanced` of `key` on either engine; returns the runs fired.
async fn advanced(a: &mut broadcast::Receiver<EngineEvent>, b: &mut broadcast::Receiver<EngineEvent>) -> Vec<RunId> {
    async fn next(rx: &mut broadcast::Receiver<EngineEvent>) -> Vec<RunId> {
        loop {
            if let EngineEvent::ScheduleAdvanced { fired, .. } = rx.recv().await.expect("event stream open") {
                return fired;
            }
        }
    }
    tokio::select! {
        fired = next(a) => fired,
        fired = next(b) => fired,
    }
}

/// Waits for the creation of a `bulk` run; returns its id.
async fn bulk_created(rx: &mut broadcast::Receiver<EngineEvent>) -> RunId {
    loop {
        if let EngineEvent::RunCreated { run_id, workflow } = rx.recv().await.expect("event stream open")
            && workflow == "bulk"
        {
            return run_id;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_on_postgres_fire_each_fire_once() {
    let Some(url) = url_or_skip("two_engines_on_postgres_fire_each_fire_once") else { return };
    let schema = ScratchSchema::new(&url, "sched").await.expect("a scratch schema");
    let (a, b) = two_engines(&schema).await;
    let t0 = a.clock().now();
    let (mut rx_a, mut rx_b) = (a.subscribe(), b.subscribe());
    a.schedule("minutely", Schedule::every(MIN), "echo", &json!("tick")).await.unwrap();
    // Declaring it on the second engine too changes nothing.
    let again = b.schedule("minutely", Schedule::every(MIN), "echo", &json!("tick")).await.unwrap();
    assert_eq!(again.revision, 1);
    for m in 1..=10u64 {
        a.advance(MIN);
        let id = RunId::new(format!("sched:minutely:{}", t0 + m * 60_000));
        assert_eq!(advanced(&mut rx_a, &mut rx_b).await, vec![id.clone()], "minute {m}");
        assert_eq!(a.wait_for_run(&id).await.unwrap().output::<String>().unwrap(), "tick");
    }
    let filter = RunFilter { tag: Some("schedule:minutely".into()), limit: 100, ..Default::default() };
    assert_eq!(b.list_runs(&filter).await.unwrap().runs.len(), 10);
    let record = b.get_schedule("minutely").await.unwrap().expect("stored");
    assert_eq!((record.state.fires, record.state.missed), (10, 0));
    a.shutdown().await;
    b.shutdown().await;
    schema.drop_now().await.expect("drop the scratch schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_gathered_from_two_engines_on_postgres_lose_nothing() {
    let Some(url) = url_or_skip("batches_gathered_from_two_engines_on_postgres_lose_nothing") else { return };
    let schema = ScratchSchema::new(&url, "batch").await.expect("a scratch schema");
    let (a, b) = two_engines(&schema).await;
    // 25 orders published alternately by the two engines, each with a dedupe id; every fifth
    // is published twice (a retrying publisher): the duplicate gathers nothing.
    let mut started = Vec::new();
    for i in 0..25u32 {
        let engine = if i % 2 == 0 { &a } else { &b };
        let p = engine.publish("order", &i, PublishOptions::dedupe(format!("order-{i}"))).await.unwrap();
        assert!(!p.duplicate);
        started.extend(p.started);
        if i % 5 == 0 {
            let other = if i % 2 == 0 { &b } else { &a };
            let again = other.publish("order", &i, PublishOptions::dedupe(format!("order-{i}"))).await.unwrap();
            assert!(again.duplicate && again.started.is_empty(), "{again:?}");
        }
    }
    assert_eq!(started.len(), 2, "the publishes that filled a batch started it");
    // The last, partial batch is started by one of the two schedulers when it comes due.
    let (mut rx_a, mut rx_b) = (a.subscribe(), b.subscribe());
    a.advance(Duration::from_secs(5));
    started.push(tokio::select! {
        id = bulk_created(&mut rx_a) => id,
        id = bulk_created(&mut rx_b) => id,
    });
    let mut batches = Vec::new();
    for id in &started {
        batches.push(a.wait_for_run(id).await.unwrap().output::<Vec<u32>>().unwrap());
    }
    let filter = RunFilter { workflow: Some("bulk".into()), limit: 10, ..Default::default() };
    assert_eq!(a.list_runs(&filter).await.unwrap().runs.len(), 3);
    batches.sort();
    let mut all: Vec<u32> = batches.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..25).collect::<Vec<_>>(), "every order in exactly one batch: {batches:?}");
    let mut sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![5, 10, 10]);
    a.shutdown().await;
    b.shutdown().await;
    schema.drop_now().await.expect("drop the scratch schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_start_on_postgres_waits_then_runs() {
    let Some(url) = url_or_skip("a_delayed_start_on_postgres_waits_then_runs") else { return };
    let schema = ScratchSchema::new(&url, "delay").await.expect("a scratch schema");
    let (a, b) = two_engines(&schema).await;
    let start = a.clock().now();
    let run = a.start("echo", &json!(1), StartOptions::id("later").delay(MIN)).await.unwrap();
    assert_eq!((run.run.status, run.run.wake_at), (RunStatus::Pending, Some(start + 60_000)));
    // The engine that started it goes away: the other one's due poller starts it at its time.
    a.shutdown().await;
    b.advance(MIN);
    assert_eq!(b.wait_for_run(&run.id).await.unwrap().output::<i32>().unwrap(), 1);
    b.shutdown().await;
    schema.drop_now().await.expect("drop the scratch schema");
}
