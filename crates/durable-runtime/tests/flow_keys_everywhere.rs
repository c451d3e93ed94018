//! Acceptance: a workflow's concurrency key holds for every run of it, not only for the ones a
//! caller starts — children, runs continued as new, runs started by an event, a schedule or a
//! debounce — and a run continued as new keeps its key's slot for its successor. On the memory
//! store and on a SQLite file, on the virtual clock.

mod support;

use std::time::Duration;

use durable_conformance::TestEngine;
use durable_core::{RunId, RunStatus, protocol};
use durable_runtime::{
    ChildOptions, EngineEvent, PublishOptions, Schedule, StartOptions, WorkflowCtx, WorkflowError, WorkflowOptions,
};
use serde::{Deserialize, Serialize};
use support::StoreFixture;
use tokio::sync::broadcast;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    key: String,
    n: u32,
    /// How many times the run continues as new before it returns.
    #[serde(default)]
    chain: u32,
}

fn job(key: &str, n: u32) -> Job {
    Job { key: key.into(), n, chain: 0 }
}

/// One run per key at a time.
fn singleton() -> WorkflowOptions {
    WorkflowOptions::default().singleton(|j: &Job| j.key.clone())
}

/// `sync`: waits for the signal `go:<n>`, then continues as new with `n + 1` while `chain`
/// lasts, else returns `n`.
fn register_sync(t: &TestEngine, options: WorkflowOptions) {
    t.register_with("sync", 1, options, |ctx: WorkflowCtx, job: Job| async move {
        ctx.wait_for_signal::<()>(&format!("go:{}", job.n)).await?;
        if job.chain > 0 {
            let next = Job { n: job.n + 1, chain: job.chain - 1, ..job };
            return ctx.continue_as_new(&next).await;
        }
        Ok::<_, WorkflowError>(job.n)
    });
}

fn gate() -> String {
    protocol::key_gate("default", "sync", "acme")
}

async fn status(t: &TestEngine, id: &RunId) -> RunStatus {
    t.get_run(id).await.unwrap().unwrap_or_else(|| panic!("run {id} exists")).status
}

/// Until `id` reached its signal wait (it holds the key), then asserts it is suspended.
async fn holds_the_key(t: &TestEngine, id: &RunId) {
    // 30 s: far past a turn, so a failure means the run never got the key.
    if let Err(e) = t.wait_until_suspended_or_terminal_timeout(id, Duration::from_secs(30)).await {
        panic!("{id} never reached its wait ({e}): {:?}", t.admission_stats().await.unwrap());
    }
    assert_eq!(status(t, id).await, RunStatus::Suspended, "{id} got the key and reached its wait");
}

/// Until the key's gate has `n` runs waiting, then asserts each of `ids` is one of them
/// (`pending`, never executed).
async fn wait_for_the_key(t: &TestEngine, n: u32, ids: &[&RunId]) {
    let gate = gate();
    let queued = async {
        loop {
            let stats = t.admission_stats().await.unwrap();
            if stats.iter().any(|g| g.gate == gate && g.waiting == n) {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), queued).await.is_err() {
        panic!("{gate} never had {n} waiting: {:?}", t.admission_stats().await.unwrap());
    }
    for id in ids {
        assert_eq!(status(t, id).await, RunStatus::Pending, "{id} waits for the key");
    }
}

/// Asserts that no run waited for its key by re-checking the store: a run waiting for its key
/// is woken by the release that hands it over, not polled (a claim it lost is not retried).
fn no_rechecks(rx: &mut broadcast::Receiver<EngineEvent>) {
    loop {
        match rx.try_recv() {
            Ok(EngineEvent::WakeDeferred { run_id, holder }) => {
                panic!("run {run_id} was re-checked while waiting for its key (holder {holder:?})")
            }
            Ok(_) => {}
            Err(broadcast::error::TryRecvError::Lagged(n)) => panic!("{n} events lost: the test cannot tell"),
            Err(_) => return,
        }
    }
}

async fn created(rx: &mut broadcast::Receiver<EngineEvent>) -> RunId {
    loop {
        if let EngineEvent::RunCreated { run_id, .. } = rx.recv().await.expect("event stream open") {
            return run_id;
        }
    }
}

/// Children of a keyed workflow take the key: one runs, its siblings wait, each is handed the
/// key in turn. A child whose key cannot be computed is not started, and says why.
async fn children_take_their_key(store: StoreFixture) {
    let t = store.engine();
    register_sync(&t, singleton());
    t.register("parent", 1, |ctx: WorkflowCtx, _: ()| async move {
        let kids: Vec<_> = (1..=3)
            .map(|n| ctx.spawn_child_with::<_, u32>("sync", &job("acme", n), ChildOptions::id(format!("c{n}"))))
            .collect();
        let mut sum = 0;
        for kid in kids {
            sum += kid.join().await?;
        }
        // An input the key function cannot read: the child is not started.
        let bad = ctx.child_with::<_, u32>("sync", &"not a job", ChildOptions::id("bad")).await;
        let reason = bad.expect_err("not started").to_string();
        assert!(reason.contains("concurrency key could not be computed"), "{reason}");
        Ok::<_, WorkflowError>(sum)
    });
    let mut events = t.subscribe();
    let parent = t.start("parent", &(), StartOptions::id("p")).await.unwrap().id;
    let c = |n: u32| RunId::new(format!("c{n}"));
    // The parent's first turn creates the children and parks on the first.
    t.wait_until_suspended_or_terminal(&parent).await.unwrap();
    holds_the_key(&t, &c(1)).await;
    wait_for_the_key(&t, 2, &[&c(2), &c(3)]).await;
    for n in 1..=3 {
        t.signal(&format!("go:{n}"), &()).await.unwrap();
        t.assert_output(&c(n), n).await;
        if n < 3 {
            holds_the_key(&t, &c(n + 1)).await;
        }
    }
    t.assert_output(&parent, 6u32).await;
    assert!(t.get_run(&RunId::from("bad")).await.unwrap().is_none(), "nothing created");
    no_rechecks(&mut events);
}

/// A run continued as new hands its key to its successor: a run started meanwhile with the
/// same key waits until the whole chain is done, and the chain never runs beside it.
async fn a_chain_continued_as_new_keeps_its_key(store: StoreFixture) {
    let t = store.engine();
    register_sync(&t, singleton());
    let first = RunId::from("r");
    let mut events = t.subscribe();
    t.start("sync", &Job { chain: 2, ..job("acme", 1) }, StartOptions::id("r")).await.unwrap();
    holds_the_key(&t, &first).await;
    let other = t.start("sync", &job("acme", 10), StartOptions::id("other")).await.unwrap().id;
    wait_for_the_key(&t, 1, &[&other]).await;
    let mut run = first;
    for n in 1..=2 {
        t.signal(&format!("go:{n}"), &()).await.unwrap();
        t.wait_for_run(&run).await.unwrap();
        run = protocol::successor_id(&run);
        holds_the_key(&t, &run).await;
        wait_for_the_key(&t, 1, &[&other]).await;
    }
    t.signal("go:3", &()).await.unwrap();
    t.assert_output(&run, 3u32).await;
    holds_the_key(&t, &other).await;
    t.signal("go:10", &()).await.unwrap();
    t.assert_output(&other, 10u32).await;
    no_rechecks(&mut events);
}

/// The holder `h` (job 1) finishes: the key goes to `run` (job 2), which runs to its end; no
/// run was re-checked while it waited.
async fn the_holder_hands_over(t: &TestEngine, run: &RunId, events: &mut broadcast::Receiver<EngineEvent>) {
    t.signal("go:1", &()).await.unwrap();
    t.assert_output(&RunId::from("h"), 1u32).await;
    holds_the_key(t, run).await;
    t.signal("go:2", &()).await.unwrap();
    t.assert_output(run, 2u32).await;
    no_rechecks(events);
}

/// A run an event starts takes the key.
async fn an_events_run_takes_its_key(store: StoreFixture) {
    let t = store.engine();
    register_sync(&t, singleton().on_event("job.created", serde_json::json!({})));
    let mut events = t.subscribe();
    let holder = t.start("sync", &job("acme", 1), StartOptions::id("h")).await.unwrap().id;
    holds_the_key(&t, &holder).await;
    let started = t.publish("job.created", &job("acme", 2), PublishOptions::default()).await.unwrap().started;
    let [run] = &started[..] else { panic!("one run started: {started:?}") };
    wait_for_the_key(&t, 1, &[run]).await;
    the_holder_hands_over(&t, run, &mut events).await;
}

/// A run a schedule fires takes the key.
async fn a_schedules_run_takes_its_key(store: StoreFixture) {
    let t = store.engine();
    register_sync(&t, singleton());
    let mut events = t.subscribe();
    let holder = t.start("sync", &job("acme", 1), StartOptions::id("h")).await.unwrap().id;
    holds_the_key(&t, &holder).await;
    t.schedule("hourly", Schedule::every(Duration::from_secs(3600)), "sync", &job("acme", 2)).await.unwrap();
    let fired = t.trigger_schedule("hourly").await.unwrap();
    wait_for_the_key(&t, 1, &[&fired]).await;
    the_holder_hands_over(&t, &fired, &mut events).await;
}

/// The run a debounce starts once its events go quiet takes the key.
async fn a_debounced_run_takes_its_key(store: StoreFixture) {
    let t = store.engine();
    register_sync(&t, singleton().on_event("job.changed", serde_json::json!({})).debounce(Duration::from_secs(1)));
    let holder = t.start("sync", &job("acme", 1), StartOptions::id("h")).await.unwrap().id;
    holds_the_key(&t, &holder).await;
    let mut rx = t.subscribe();
    t.publish_event("job.changed", &job("acme", 2)).await.unwrap();
    t.advance(Duration::from_secs(1));
    let run = created(&mut rx).await;
    wait_for_the_key(&t, 1, &[&run]).await;
    the_holder_hands_over(&t, &run, &mut rx).await;
}

on_every_store!(
    children_take_their_key,
    a_chain_continued_as_new_keeps_its_key,
    an_events_run_takes_its_key,
    a_schedules_run_takes_its_key,
    a_debounced_run_takes_its_key,
);

/// A batch trigger cannot feed a keyed workflow: a full batch starts its run inside the
/// publish, where the key cannot be computed. Registration says so.
#[tokio::test]
async fn a_batch_trigger_on_a_keyed_workflow_is_refused_at_registration() {
    let t = TestEngine::new();
    let options = singleton().on_event("job.created", serde_json::json!({})).batch(10, Duration::from_secs(1));
    let panic =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| register_sync(&t, options))).expect_err("refused");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("\"sync\"") && message.contains("batch trigger"), "{message}");
    assert!(message.contains("debounce") && message.contains("step queue"), "says what to do instead: {message}");
}
