//! A store that fails mid-turn: the turn aborts without partial state and the run completes
//! once the store recovers; a commit that applied but reported failure is not repeated.

use std::sync::Arc;

use durable_conformance::{Counter, Fault, FaultyStore, Method, TestEngine};
use durable_runtime::{EngineEvent, StartOptions, WorkflowCtx, WorkflowError};
use durable_store_memory::MemoryStore;

fn register(t: &TestEngine, counters: &[Counter; 3]) {
    let counters = counters.clone();
    t.register("three", 1, move |ctx: WorkflowCtx, _: ()| {
        let c = counters.clone();
        async move {
            let mut acc = Vec::new();
            for (i, counter) in c.iter().enumerate() {
                let counter = counter.clone();
                acc.push(
                    ctx.step(format!("s{i}"), move |_| {
                        counter.bump();
                        async move { Ok(i) }
                    })
                    .await?,
                );
            }
            Ok::<_, WorkflowError>(acc)
        }
    });
}

async fn aborted(events: &mut tokio::sync::broadcast::Receiver<EngineEvent>) -> String {
    loop {
        if let EngineEvent::TurnAborted { error, .. } = events.recv().await.unwrap() {
            return error;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_commit_leaves_no_partial_state_and_the_run_completes_after_recovery() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    // Every commit after the first fails until the faults are cleared.
    store.arm(Fault::on(Method::Commit).after(1));
    let t = TestEngine::with_store(store.clone());
    let counters: [Counter; 3] = Default::default();
    register(&t, &counters);
    let mut events = t.subscribe();
    let run = t.start("three", &(), StartOptions::id("faulty")).await.unwrap();
    let error = aborted(&mut events).await;
    assert!(error.contains("unavailable") || error.contains("commit"), "{error}");

    // Only the first step's commit landed: no trace of the second.
    let history = t.checkpoints(&run.id).await;
    assert_eq!(history.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["s0"]);
    // The run is retried while the store is down; wait for a second abort to see it.
    aborted(&mut events).await;

    store.clear_faults();
    t.assert_output(&run.id, vec![0usize, 1, 2]).await;
    assert_eq!(counters[0].get(), 1, "a committed step ran again");
    assert!(counters[1].get() >= 2, "the step whose commit failed ran again");
    assert_eq!(counters[2].get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_applied_but_reported_failure_is_not_repeated() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    // The second commit is written, then an error is returned (a lost acknowledgement).
    store.arm(Fault::on(Method::Commit).nth(2).times(1).after_apply());
    let t = TestEngine::with_store(store.clone());
    let counters: [Counter; 3] = Default::default();
    register(&t, &counters);
    let run = t.start("three", &(), StartOptions::id("lost-ack")).await.unwrap();
    t.assert_output(&run.id, vec![0usize, 1, 2]).await;
    assert_eq!(store.injected(), 1);
    for (i, c) in counters.iter().enumerate() {
        assert_eq!(c.get(), 1, "step s{i} ran {} times", c.get());
    }
}
