//! `Engine::start_many`: many starts in one store call per batch, answered per item like
//! `start`, all-or-nothing when an item is bad, and through the run queue with a transport.

mod support;

use std::sync::Arc;

use durable_conformance::{Fault, FaultyStore, Method, TestEngine};
use durable_core::{RunFilter, RunId, RunStatus, Store};
use durable_runtime::{Engine, EngineEvent, Error, StartOptions, WorkflowCtx, WorkflowError};
use durable_store_memory::MemoryStore;
use durable_transport::QueueTransport;
use support::StoreFixture;

/// Registers `double`: one step that doubles its input.
fn register_double(engine: &Engine) {
    engine.register("double", 1, |ctx: WorkflowCtx, n: u64| async move {
        let out: u64 = ctx.step("double", move |_| async move { Ok(n * 2) }).await?;
        Ok::<_, WorkflowError>(out)
    });
}

/// A test engine on the fixture's store seen through a `FaultyStore`, to count store calls
/// and inject failures.
fn counted(s: &StoreFixture) -> (TestEngine, Arc<FaultyStore<dyn Store>>) {
    let faulty = Arc::new(FaultyStore::over(s.store.clone()));
    let t = TestEngine::with_store(faulty.clone());
    register_double(&t);
    (t, faulty)
}

/// 1,200 items (three batches), among them an id that existed before the call and one given
/// twice: one answer per item in order, each id created once, every created run started and
/// executed by exactly one turn — in one `create_runs` call per batch, no `create_run`.
async fn start_many_answers_each_item_like_start(s: StoreFixture) {
    let (t, faulty) = counted(&s);
    let before = t.start("double", &5000u64, StartOptions::id("d-5000")).await.expect("start");
    t.assert_output(&before.id, 10_000u64).await;
    faulty.reset_counts();
    let mut items: Vec<(&str, u64, StartOptions)> =
        (0..1_200u64).map(|i| ("double", i, StartOptions::id(format!("d-{i}")))).collect();
    items[10] = ("double", 5000, StartOptions::id("d-5000")); // exists
    items[300] = ("double", 3, StartOptions::id("d-3")); // given twice in one batch
    let started = t.start_many(items.clone()).await.expect("start_many");

    assert_eq!(faulty.calls(Method::CreateRuns), 3, "one store call per batch of 500");
    assert_eq!(faulty.calls(Method::CreateRun), 0);
    assert_eq!(started.len(), items.len(), "one answer per item");
    for (i, (item, s)) in items.iter().zip(&started).enumerate() {
        assert_eq!(Some(s.id.as_str()), item.2.id.as_deref(), "item {i}: answers in the order of the items");
        assert_eq!(s.run.id, s.id);
    }
    assert!(!started[10].created, "an existing id is returned as it is");
    assert_eq!(started[10].run.status, RunStatus::Completed);
    assert!(started[3].created && !started[300].created, "an id given twice is created by its first item");
    assert_eq!(started[300].run, started[3].run, "…and the second gets that run, as created");
    let created = started.iter().filter(|s| s.created).count();
    assert_eq!(created, 1_198);
    assert!(started.iter().filter(|s| s.created).all(|s| s.run.status == RunStatus::Pending));

    for s in &started {
        let n: u64 = s.id.as_str().trim_start_matches("d-").parse().expect("a number");
        t.assert_output(&s.id, n * 2).await;
    }
    let m = t.metrics();
    assert_eq!((m.turns, m.turns_without_progress), (1 + created as u64, 0), "one turn per run: {m:?}");
}

/// `RunCreated` is sent for each run the call created, not for an id that existed.
async fn run_created_is_sent_for_created_runs_only(s: StoreFixture) {
    let (t, _) = counted(&s);
    let old = t.start("double", &1u64, StartOptions::id("old")).await.expect("start");
    t.assert_output(&old.id, 2u64).await;
    let mut events = t.subscribe();
    let items = [("double", 2u64, StartOptions::id("new-a")), ("double", 1, StartOptions::id("old"))];
    let started = t.start_many(items.into_iter().chain([("double", 3, StartOptions::id("new-b"))])).await.expect("ok");
    assert_eq!(started.iter().map(|s| s.created).collect::<Vec<_>>(), [true, false, true]);
    // Sent during the call: all of them are queued before the runs settle.
    let mut created = Vec::new();
    let mut settled = 0;
    while settled < 2 {
        match events.recv().await.expect("events") {
            EngineEvent::RunCreated { run_id, .. } => created.push(run_id),
            EngineEvent::RunSettled { .. } => settled += 1,
            _ => {}
        }
    }
    while let Ok(e) = events.try_recv() {
        if let EngineEvent::RunCreated { run_id, .. } = e {
            created.push(run_id);
        }
    }
    assert_eq!(created, [RunId::from("new-a"), RunId::from("new-b")]);
}

/// An unknown workflow, an input the workflow cannot take or a bad id anywhere in the call
/// (here in its second batch) fails it naming the item, and nothing is started.
async fn a_bad_item_starts_nothing(s: StoreFixture) {
    let (t, faulty) = counted(&s);
    let good = |i: u64| ("double".to_string(), serde_json::json!(i), StartOptions::id(format!("g-{i}")));
    let cases: [(&str, serde_json::Value, StartOptions); 3] = [
        ("no-such-workflow", serde_json::json!(1), StartOptions::id("bad")),
        ("double", serde_json::json!("not a number"), StartOptions::id("bad")),
        ("double", serde_json::json!(1), StartOptions::id("")),
    ];
    for (workflow, input, options) in cases {
        let mut items: Vec<_> = (0..800).map(good).collect();
        items[700] = (workflow.to_string(), input, options);
        let err = t.start_many(items).await.expect_err("a bad item");
        match &err {
            Error::BadStart { index, workflow: w, .. } => assert_eq!((*index, w.as_str()), (700, workflow), "{err}"),
            other => panic!("expected BadStart, got {other:?}"),
        }
        assert!(err.to_string().contains("item 700"), "the message names the item: {err}");
    }
    assert_eq!(faulty.calls(Method::CreateRuns), 0, "nothing was written");
    let runs = t.list_runs(&RunFilter::default()).await.expect("list");
    assert!(runs.runs.is_empty(), "nothing was started: {:?}", runs.runs.first());
}

/// An id a run of another workflow holds is refused as `start` refuses it (`IdTaken`, naming
/// both workflows), naming the item: given by an earlier item of the call, before anything is
/// written; held in the store, once its batch is written (the batches up to it are started,
/// the run holding it is left as it is). The same workflow's id is idempotent as before.
async fn an_id_of_another_workflow_is_refused(s: StoreFixture) {
    let (t, faulty) = counted(&s);
    t.register("triple", 1, |_ctx: WorkflowCtx, n: u64| async move { Ok::<_, WorkflowError>(n * 3) });
    let held = t.start("triple", &1u64, StartOptions::id("held")).await.expect("start");
    t.assert_output(&held.id, 3u64).await;
    faulty.reset_counts();
    let items = |clash: (&'static str, &'static str)| {
        let mut items: Vec<(&str, u64, StartOptions)> =
            (0..800u64).map(|i| ("double", i, StartOptions::id(format!("x-{i}")))).collect();
        items[600] = (clash.0, 7, StartOptions::id(clash.1));
        items
    };
    // In the call: item 5 names `x-5` for `double`, item 600 for `triple`: nothing written.
    let err = t.start_many(items(("triple", "x-5"))).await.expect_err("x-5 given to two workflows");
    let Error::BadStart { index: 600, started: 0, source, .. } = &err else {
        panic!("expected BadStart at 600, nothing started, got {err:?}")
    };
    assert!(err.to_string().ends_with("nothing was started"), "{err}");
    assert!(
        matches!(&**source, Error::IdTaken { existing, requested, .. } if existing == "double" && requested == "triple"),
        "{err}"
    );
    assert_eq!(faulty.calls(Method::CreateRuns), 0, "nothing was written");
    // In the store: `held` is a run of `triple`. Item 600 is in the second batch (of 500):
    // both batches are written but for it, and `held` is left as it was.
    let err = t.start_many(items(("double", "held"))).await.expect_err("held by triple");
    let Error::BadStart { index: 600, started: 799, source, .. } = &err else {
        panic!("expected BadStart at 600 with 799 started, got {err:?}")
    };
    assert!(
        err.to_string().contains("799 items were started (those up to the end of this item's batch, but this one)"),
        "{err}"
    );
    assert!(
        matches!(&**source, Error::IdTaken { existing, requested, .. } if existing == "triple" && requested == "double"),
        "{err}"
    );
    assert_eq!(faulty.calls(Method::CreateRuns), 2);
    let all = RunFilter { limit: 1_000, ..RunFilter::default() };
    assert_eq!(t.list_runs(&all).await.expect("list").runs.len(), 800, "799 started, and `held`");
    assert_eq!(t.get_run(&"held".into()).await.unwrap().unwrap().workflow, "triple");
    // The same workflow's id: idempotent, as before.
    let started = t.start_many([("triple", 9u64, StartOptions::id("held"))]).await.expect("idempotent");
    assert!(!started[0].created && started[0].run.workflow == "triple");
}

/// A store failure in the second batch: the first batch is started (and runs), the rest is
/// not, and the error says how many were.
async fn a_store_failure_says_how_many_were_started(s: StoreFixture) {
    let (t, faulty) = counted(&s);
    faulty.arm(Fault::on(Method::CreateRuns).nth(2).times(1));
    let items = (0..1_200u64).map(|i| ("double", i, StartOptions::id(format!("p-{i}"))));
    match t.start_many(items).await {
        Err(Error::PartlyStarted { started, .. }) => assert_eq!(started, 500),
        other => panic!("expected PartlyStarted, got {other:?}"),
    }
    t.assert_output(&RunId::from("p-499"), 998u64).await;
    assert_eq!(t.get_run(&RunId::from("p-500")).await.expect("read"), None, "the failed batch wrote nothing");
    assert_eq!(t.get_run(&RunId::from("p-1199")).await.expect("read"), None);
}

on_every_store!(
    start_many_answers_each_item_like_start,
    run_created_is_sent_for_created_runs_only,
    a_bad_item_starts_nothing,
    an_id_of_another_workflow_is_refused,
    a_store_failure_says_how_many_were_started
);

/// With a transport, the started runs go through the run queue, in full batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_many_sends_the_runs_through_the_run_queue() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::builder()
        .shared_store(store.clone())
        .transport(QueueTransport::new(store.clone()))
        .config(durable_conformance::test_config())
        .build()
        .expect("engine");
    register_double(&engine);
    let started = engine
        .start_many((0..2_000u64).map(|i| ("double", i, StartOptions::id(format!("q-{i}")))))
        .await
        .expect("start_many");
    for (i, s) in started.iter().enumerate() {
        let out: u64 = engine.wait_for_run(&s.id).await.expect("wait").output().expect("output");
        assert_eq!(out, i as u64 * 2);
    }
    let m = engine.metrics();
    assert!(m.runs_sent >= 2_000, "every start goes through the queue: {m:?}");
    assert!(m.batches_sent * 100 < m.runs_sent, "the starts were not batched: {m:?}");
    assert_eq!(m.turns_without_progress, 0, "{m:?}");
}
