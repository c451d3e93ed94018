//! Acceptance: flow control — concurrency keys and singletons, step queues with concurrency,
//! rate limits, priority and fairness, a dead holder's slot reclaimed. On the memory store and
//! the virtual clock; the multi-process SQLite and PostgreSQL versions live in `tests/`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use durable_conformance::{FaultyStore, Method, TestEngine};
use durable_core::{RunId, RunStatus, protocol};
use durable_runtime::{Clock, Error, QueueOptions, StartOptions, WorkflowCtx, WorkflowError, WorkflowOptions};
use durable_store_memory::MemoryStore;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    key: String,
    n: u32,
}

/// In-process record of what executed: concurrency per key now and at most, and the order.
#[derive(Default)]
struct Ledger {
    inner: Mutex<LedgerInner>,
}

#[derive(Default)]
struct LedgerInner {
    now: BTreeMap<String, u32>,
    max: BTreeMap<String, u32>,
    order: Vec<String>,
}

impl Ledger {
    fn begin(&self, key: &str, who: String) {
        let mut l = self.inner.lock();
        let n = {
            let n = l.now.entry(key.to_string()).or_default();
            *n += 1;
            *n
        };
        let m = l.max.entry(key.to_string()).or_default();
        *m = (*m).max(n);
        l.order.push(who);
    }

    fn end(&self, key: &str) {
        *self.inner.lock().now.get_mut(key).expect("began") -= 1;
    }

    fn max(&self, key: &str) -> u32 {
        self.inner.lock().max.get(key).copied().unwrap_or(0)
    }

    fn order(&self) -> Vec<String> {
        self.inner.lock().order.clone()
    }
}

/// A keyed workflow: a step marks its start, it waits for the signal `go:<n>`, a step marks
/// its end.
fn register_keyed(t: &TestEngine, ledger: &Arc<Ledger>, options: WorkflowOptions) {
    let ledger = ledger.clone();
    t.register_with("sync", 1, options, move |ctx: WorkflowCtx, job: Job| {
        let ledger = ledger.clone();
        async move {
            let (l1, l2) = (ledger.clone(), ledger.clone());
            let key = job.key.clone();
            ctx.step("begin", move |_| {
                let (l1, key, n) = (l1.clone(), key.clone(), job.n);
                async move {
                    l1.begin(&key, format!("{key}{n}"));
                    Ok(())
                }
            })
            .await?;
            let _: () = ctx.wait_for_signal(&format!("go:{}", job.n)).await?;
            let key = job.key.clone();
            ctx.step("end", move |_| {
                let (l2, key) = (l2.clone(), key.clone());
                async move {
                    l2.end(&key);
                    Ok(())
                }
            })
            .await?;
            Ok::<_, WorkflowError>(job.n)
        }
    });
}

fn job(key: &str, n: u32) -> Job {
    Job { key: key.into(), n }
}

async fn status(t: &TestEngine, id: &str) -> RunStatus {
    t.get_run(&RunId::from(id)).await.unwrap().unwrap().status
}

/// Until `id` is suspended (its signal wait reached) or completed.
async fn parked(t: &TestEngine, id: &str) {
    t.wait_until_suspended_or_terminal(&RunId::from(id)).await.unwrap();
}

/// Until the gate `gate` has `n` waiting (a failure after 30 s: they never queued).
async fn until_waiting(t: &TestEngine, gate: &str, n: u32) {
    let wait = async {
        loop {
            let stats = t.admission_stats().await.unwrap();
            if stats.iter().any(|g| g.gate == gate && g.waiting == n) {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), wait).await.is_err() {
        panic!("{gate} never had {n} waiting: {:?}", t.admission_stats().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_singleton_refuses_the_start_with_queue_full_and_persists_nothing() {
    let t = TestEngine::new();
    let ledger = Arc::new(Ledger::default());
    register_keyed(&t, &ledger, WorkflowOptions::default().singleton(|j: &Job| j.key.clone()).max_queue_depth(1));
    t.start("sync", &job("acme", 1), StartOptions::id("s1")).await.unwrap();
    parked(&t, "s1").await;
    let second = t.start("sync", &job("acme", 2), StartOptions::id("s2")).await.unwrap();
    assert_eq!(second.run.wake_at, Some(protocol::GATED), "the second waits for the key");
    let err = t.start("sync", &job("acme", 3), StartOptions::id("s3")).await.unwrap_err();
    assert_eq!(err.code(), Some("queue_full"));
    match &err {
        Error::QueueFull { workflow, key, held, waiting } => {
            assert_eq!((workflow.as_str(), key.as_str(), *held, *waiting), ("sync", "acme", 1, 1));
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("queue_full") && msg.contains("\"sync\"") && msg.contains("\"acme\""), "{msg}");
    assert!(t.get_run(&RunId::from("s3")).await.unwrap().is_none(), "a refused start persists nothing");
    // The same through start_many: the batch is refused whole, as `start` refuses.
    let many = t.start_many((3..6).map(|n| ("sync", job("acme", n), StartOptions::id(format!("m{n}"))))).await;
    match many.unwrap_err() {
        Error::QueueFull { workflow, key, .. } => assert_eq!((workflow.as_str(), key.as_str()), ("sync", "acme")),
        other => panic!("expected QueueFull from start_many, got {other:?}"),
    }
    assert!(t.get_run(&RunId::from("m3")).await.unwrap().is_none(), "a refused batch persists nothing");
    // Another key is not held back, and the engine keeps running.
    t.start("sync", &job("other", 4), StartOptions::id("o4")).await.unwrap();
    parked(&t, "o4").await;
    assert_eq!(status(&t, "o4").await, RunStatus::Suspended);
    // The waiting run shows what it waits for.
    let (slots, waits) = t.run_admission(&RunId::from("s2")).await.unwrap();
    assert!(slots.is_empty());
    assert_eq!(waits[0].gate, protocol::key_gate("default", "sync", "acme"));
    // The holder finishes: the waiter runs at once.
    t.signal("go:1", &()).await.unwrap();
    t.assert_output(&RunId::from("s1"), 1u32).await;
    parked(&t, "s2").await;
    assert_eq!(status(&t, "s2").await, RunStatus::Suspended, "s2 got the key and reached its wait");
    t.signal("go:2", &()).await.unwrap();
    t.assert_output(&RunId::from("s2"), 2u32).await;
    assert_eq!(ledger.max("acme"), 1);
}

/// A key is per workflow, whatever `:` the names hold: `w:x` with key `y` and `w` with key
/// `x:y` (one gate name before the names were escaped) each hold a slot of their own, and a
/// refusal names the workflow and the key as given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_two_workflows_never_share_a_gate() {
    let t = TestEngine::new();
    for (workflow, key) in [("w:x", "y"), ("w", "x:y")] {
        let options = WorkflowOptions::default().singleton(move |_: &u32| key.to_string()).max_queue_depth(0);
        t.register_with(workflow, 1, options, |ctx: WorkflowCtx, n: u32| async move {
            ctx.wait_for_signal::<()>(&format!("go:{}", ctx.run_id())).await?;
            Ok::<_, WorkflowError>(n)
        });
    }
    t.start("w:x", &1u32, StartOptions::id("a")).await.unwrap();
    t.start("w", &2u32, StartOptions::id("b")).await.unwrap();
    parked(&t, "a").await;
    parked(&t, "b").await;
    assert_eq!((status(&t, "a").await, status(&t, "b").await), (RunStatus::Suspended, RunStatus::Suspended));
    let stats = t.admission_stats().await.unwrap();
    assert_eq!(stats.iter().filter(|g| g.held == 1).count(), 2, "two gates, one slot each: {stats:?}");
    match t.start("w:x", &3u32, StartOptions::id("c")).await.unwrap_err() {
        Error::QueueFull { workflow, key, .. } => assert_eq!((workflow.as_str(), key.as_str()), ("w:x", "y")),
        other => panic!("expected QueueFull, got {other:?}"),
    }
    for id in ["a", "b"] {
        t.signal(&format!("go:{id}"), &()).await.unwrap();
    }
    t.assert_output(&RunId::from("a"), 1u32).await;
    t.assert_output(&RunId::from("b"), 2u32).await;
}

/// A run the scheduler creates later (a schedule's fire, a debounce's run) would start
/// without a key no store can keep: the schedule and the publish are refused instead, with
/// `BadKey`, and nothing is saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_or_a_debounce_whose_runs_could_not_take_their_key_is_refused() {
    let t = TestEngine::new();
    let keyed = WorkflowOptions::default()
        .concurrency(|key: &String| key.clone(), 1)
        .on_event("tick", serde_json::json!({}))
        .debounce(Duration::from_secs(1));
    t.register_with(
        "keyed",
        1,
        keyed,
        |_ctx: WorkflowCtx, key: String| async move { Ok::<_, WorkflowError>(key.len()) },
    );
    let long = "k".repeat(protocol::MAX_NAME_BYTES + 1);
    let every = durable_runtime::Schedule::every(Duration::from_secs(60));
    let refused = t.schedule("long", every.clone(), "keyed", &long).await;
    assert!(
        matches!(&refused, Err(Error::BadKey { workflow, reason }) if workflow == "keyed" && reason.contains("1025 bytes")),
        "{refused:?}"
    );
    assert!(t.list_schedules().await.unwrap().is_empty(), "nothing saved");
    let refused = t.publish_event("tick", &long).await;
    assert!(matches!(&refused, Err(Error::BadKey { .. })), "{refused:?}");
    // A key that fits: both go on.
    t.schedule("short", every, "keyed", &"acme").await.unwrap();
    t.publish_event("tick", &"acme").await.unwrap();
}

/// A key function that panics refuses the start (and a publish whose event would start a run)
/// with `BadKey`, naming why: the caller is not unwound by another workflow's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_function_that_panics_refuses_the_start() {
    let t = TestEngine::new();
    let keyed = WorkflowOptions::default()
        .concurrency(
            |key: &String| {
                assert!(key != "boom", "no key for boom");
                key.clone()
            },
            1,
        )
        .on_event("tick", serde_json::json!({}));
    t.register_with(
        "keyed",
        1,
        keyed,
        |_ctx: WorkflowCtx, key: String| async move { Ok::<_, WorkflowError>(key.len()) },
    );
    for (input, says) in [("boom", "the key function panicked: no key for boom")] {
        let refused = t.start("keyed", &input, StartOptions::id(format!("k-{input}"))).await;
        let Err(e @ Error::BadKey { reason, .. }) = &refused else { panic!("{input:?}: {refused:?}") };
        assert!(reason.contains(says), "{reason}");
        assert_eq!(e.code(), Some("bad_key"));
        assert!(t.get_run(&RunId::from(format!("k-{input}").as_str())).await.unwrap().is_none(), "nothing saved");
        let refused = t.publish_event("tick", &input).await;
        assert!(matches!(&refused, Err(Error::BadKey { reason, .. }) if reason.contains(says)), "{refused:?}");
    }
    t.start("keyed", &"acme", StartOptions::id("k-acme")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_key_runs_at_most_its_limit_and_hands_each_slot_to_the_next_waiter() {
    let t = TestEngine::new();
    let ledger = Arc::new(Ledger::default());
    register_keyed(&t, &ledger, WorkflowOptions::default().concurrency(|j: &Job| j.key.clone(), 2));
    for n in 1..=6 {
        t.start("sync", &job("acme", n), StartOptions::id(format!("a{n}"))).await.unwrap();
    }
    for n in 7..=8 {
        t.start("sync", &job("other", n), StartOptions::id(format!("b{n}"))).await.unwrap();
    }
    for id in ["a1", "a2", "b7", "b8"] {
        parked(&t, id).await;
        assert_eq!(status(&t, id).await, RunStatus::Suspended);
    }
    for n in 3..=6 {
        assert_eq!(status(&t, &format!("a{n}")).await, RunStatus::Pending, "a{n} waits for the key");
    }
    // Release them one at a time: each release admits exactly the next (FIFO).
    for n in 1..=6u32 {
        t.signal(&format!("go:{n}"), &()).await.unwrap();
        t.assert_output(&RunId::from(format!("a{n}").as_str()), n).await;
        if n + 2 <= 6 {
            parked(&t, &format!("a{}", n + 2)).await;
        }
    }
    assert_eq!(ledger.max("acme"), 2, "never more than 2 with one key");
    let mut acme: Vec<String> = ledger.order().into_iter().filter(|w| w.starts_with("acme")).collect();
    // The first two start together, in either order; the waiters are admitted in turn.
    acme[..2].sort();
    assert_eq!(acme, ["acme1", "acme2", "acme3", "acme4", "acme5", "acme6"], "first come, first served");
}

/// The settle that releases a key claims the run it hands the key to in the same store call
/// (`commit_and_claim_handed`), so that run's first turn starts without a claim of its own:
/// of three runs through a singleton, only the first claims alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_here_claims_the_run_it_hands_its_key_to_in_the_same_store_call() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let t = TestEngine::with_store(store.clone());
    let ledger = Arc::new(Ledger::default());
    // The first run's step holds the key until the others wait for it.
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let (l, h) = (ledger.clone(), hold.clone());
    t.register_with("one", 1, WorkflowOptions::default().singleton(|_: &u32| "k".to_string()), move |ctx, n: u32| {
        let (l, h) = (l.clone(), h.clone());
        async move {
            ctx.step("work", move |_| {
                let (l, h) = (l.clone(), h.clone());
                async move {
                    l.begin("k", format!("k{n}"));
                    if n == 1 {
                        h.acquire().await.expect("open").forget();
                    }
                    l.end("k");
                    Ok(n)
                }
            })
            .await?;
            Ok::<_, WorkflowError>(n)
        }
    });
    for n in 1..=3u32 {
        t.start("one", &n, StartOptions::id(format!("r{n}"))).await.unwrap();
    }
    until_waiting(&t, &protocol::key_gate("default", "one", "k"), 2).await;
    hold.add_permits(1);
    for n in 1..=3u32 {
        t.assert_output(&RunId::from(format!("r{n}").as_str()), n).await;
    }
    assert_eq!(ledger.order(), ["k1", "k2", "k3"], "in order, one at a time");
    assert_eq!(ledger.max("k"), 1);
    let calls = store.call_counts();
    assert_eq!(calls.get(&Method::CommitAndClaimHanded), Some(&3), "every settle: {calls:?}");
    assert_eq!(calls.get(&Method::ClaimRun), Some(&1), "only the first run claims alone: {calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_key_goes_to_the_highest_priority_waiter() {
    let t = TestEngine::new();
    let ledger = Arc::new(Ledger::default());
    register_keyed(&t, &ledger, WorkflowOptions::default().singleton(|j: &Job| j.key.clone()));
    t.start("sync", &job("k", 0), StartOptions::id("holder")).await.unwrap();
    parked(&t, "holder").await;
    for (n, priority) in [(1, 1), (2, 9), (3, 5)] {
        let mut options = StartOptions::id(format!("p{n}"));
        options.priority = priority;
        t.start("sync", &job("k", n), options).await.unwrap();
    }
    for n in 0..=3u32 {
        t.signal(&format!("go:{n}"), &()).await.unwrap();
    }
    for id in ["holder", "p1", "p2", "p3"] {
        t.wait_for_run(&RunId::from(id)).await.unwrap();
    }
    assert_eq!(ledger.order(), ["k0", "k2", "k3", "k1"], "priority 9, then 5, then 1");
}

/// A workflow with one step through the queue `api`, recorded in the ledger under `api`.
fn register_queued(t: &TestEngine, ledger: &Arc<Ledger>, gate: Option<Arc<tokio::sync::Semaphore>>) {
    let ledger = ledger.clone();
    t.register("call", 1, move |ctx: WorkflowCtx, job: Job| {
        let (ledger, gate) = (ledger.clone(), gate.clone());
        async move {
            let who = format!("{}{}", job.key, job.n);
            ctx.step("call-api", move |_| {
                let (ledger, who, gate) = (ledger.clone(), who.clone(), gate.clone());
                async move {
                    ledger.begin("api", who);
                    if let Some(gate) = gate {
                        gate.acquire().await.expect("open").forget();
                    } else {
                        tokio::task::yield_now().await;
                    }
                    ledger.end("api");
                    Ok(())
                }
            })
            .queue("api")
            .fairness_key(job.key.clone())
            .priority(i32::try_from(job.n % 3).unwrap_or(0))
            .await?;
            Ok::<_, WorkflowError>(())
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_queue_caps_concurrency_across_two_engines() {
    let a = TestEngine::new();
    let b = a.sibling();
    let ledger = Arc::new(Ledger::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    for t in [&a, &b] {
        t.register_queue("api", QueueOptions::default().concurrency(2)).unwrap();
        register_queued(t, &ledger, Some(gate.clone()));
    }
    let mut ids = Vec::new();
    for n in 0..12u32 {
        let t = if n % 2 == 0 { &a } else { &b };
        ids.push(t.start("call", &job("t", n), StartOptions::default()).await.unwrap().id);
    }
    let g = protocol::queue_gate("default", "api");
    until_waiting(&a, &g, 10).await;
    assert_eq!(ledger.order().len(), 2, "two steps execute, ten wait");
    gate.add_permits(100);
    for id in &ids {
        a.wait_for_run(id).await.unwrap();
    }
    assert_eq!(ledger.order().len(), 12);
    assert_eq!(ledger.max("api"), 2, "never more than the queue's concurrency, across both engines");
    let stats = a.admission_stats().await.unwrap();
    let api = stats.iter().find(|s| s.gate == g).unwrap();
    assert_eq!((api.held, api.waiting), (0, 0), "every slot was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fairness_serves_a_key_with_one_waiter_within_one_slot_turn() {
    let t = TestEngine::new();
    let ledger = Arc::new(Ledger::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    t.register_queue("api", QueueOptions::default().concurrency(1).fair()).unwrap();
    register_queued(&t, &ledger, Some(gate.clone()));
    let g = protocol::queue_gate("default", "api");
    let mut ids = Vec::new();
    // Priorities differ by n % 3: use n multiple of 3 so every job has priority 0.
    for n in 0..10u32 {
        ids.push(t.start("call", &job("big", n * 3), StartOptions::default()).await.unwrap().id);
        until_waiting(&t, &g, n).await;
    }
    ids.push(t.start("call", &job("small", 0), StartOptions::default()).await.unwrap().id);
    until_waiting(&t, &g, 10).await;
    gate.add_permits(100);
    for id in &ids {
        t.wait_for_run(id).await.unwrap();
    }
    let order = ledger.order();
    let small = order.iter().position(|w| w == "small0").unwrap();
    assert!(small <= 2, "the small key is served within one turn of the slot: {order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_queue_never_admits_more_than_its_rate_in_a_window() {
    let t = TestEngine::new();
    t.register_queue("api", QueueOptions::default().rate(5, Duration::from_secs(1))).unwrap();
    let times = Arc::new(Mutex::new(Vec::<u64>::new()));
    let (times2, clock) = (times.clone(), t.clock().clone());
    t.register("ping", 1, move |ctx: WorkflowCtx, n: u32| {
        let (times, clock) = (times2.clone(), clock.clone());
        async move {
            for i in 0..2 {
                let (times, clock) = (times.clone(), clock.clone());
                ctx.step(format!("ping-{i}"), move |_| {
                    let (times, clock) = (times.clone(), clock.clone());
                    async move {
                        times.lock().push(clock.now());
                        Ok(())
                    }
                })
                .queue("api")
                .await?;
            }
            Ok::<_, WorkflowError>(n)
        }
    });
    let mut ids = Vec::new();
    for n in 0..15u32 {
        ids.push(t.start("ping", &n, StartOptions::default()).await.unwrap().id);
    }
    // Drive virtual time until every run is done (30 executions at 5 per second: 6 windows).
    let done = async {
        for id in &ids {
            t.wait_for_run(id).await.unwrap();
        }
    };
    tokio::pin!(done);
    loop {
        tokio::select! {
            () = &mut done => break,
            () = tokio::time::sleep(Duration::from_millis(5)) => t.advance(Duration::from_millis(100)),
        }
    }
    let times = times.lock().clone();
    assert_eq!(times.len(), 30);
    let mut per_window: BTreeMap<u64, u32> = BTreeMap::new();
    for at in times {
        *per_window.entry(at / 1_000).or_default() += 1;
    }
    assert!(per_window.values().all(|n| *n <= 5), "at most 5 per one-second window: {per_window:?}");
    assert!(per_window.len() >= 6, "30 executions need at least 6 windows: {per_window:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_engines_step_slot_is_reclaimed_after_its_lease() {
    let t = TestEngine::new();
    let ledger = Arc::new(Ledger::default());
    // The first engine's step never finishes: it holds the queue's only slot when it dies.
    let stuck = Arc::new(tokio::sync::Semaphore::new(0));
    t.register_queue("api", QueueOptions::default().concurrency(1)).unwrap();
    register_queued(&t, &ledger, Some(stuck.clone()));
    let first = t.start("call", &job("x", 0), StartOptions::id("first")).await.unwrap().id;
    while ledger.order().is_empty() {
        tokio::task::yield_now().await;
    }
    let t = t.crash();
    t.register_queue("api", QueueOptions::default().concurrency(1)).unwrap();
    register_queued(&t, &ledger, None);
    let second = t.start("call", &job("y", 3), StartOptions::id("second")).await.unwrap().id;
    let g = protocol::queue_gate("default", "api");
    until_waiting(&t, &g, 1).await;
    // Past the lease (30 s) the slot no longer counts; the waiter's recheck (15 s) takes it,
    // and the first run is recovered and runs its step again after it.
    let done = async {
        t.wait_for_run(&second).await.unwrap();
        t.wait_for_run(&first).await.unwrap();
    };
    tokio::pin!(done);
    loop {
        tokio::select! {
            () = &mut done => break,
            () = tokio::time::sleep(Duration::from_millis(5)) => t.advance(Duration::from_secs(1)),
        }
    }
    assert_eq!(ledger.order(), ["x0", "y3", "x0"], "the dead step, then the waiter, then the recovered step");
    let stats = t.admission_stats().await.unwrap();
    let api = stats.iter().find(|s| s.gate == g).unwrap();
    assert_eq!((api.held, api.waiting), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_step_through_a_registered_queue_holds_its_slot_until_its_result() {
    use durable_runtime::{StepError, TaskContext, Worker};
    let t = TestEngine::new();
    t.register_queue("render", QueueOptions::default().concurrency(1)).unwrap();
    t.register("job", 1, |ctx: WorkflowCtx, n: u32| async move {
        let out: u32 = ctx.remote_step("render", &n).await?;
        Ok::<_, WorkflowError>(out)
    });
    let ledger = Arc::new(Ledger::default());
    let l = ledger.clone();
    let worker = Worker::builder()
        .engine(t.engine())
        .concurrency(4)
        .handle("render", move |_ctx: TaskContext, n: u32| {
            let l = l.clone();
            async move {
                l.begin("render", format!("r{n}"));
                tokio::task::yield_now().await;
                l.end("render");
                Ok::<_, StepError>(n * 10)
            }
        })
        .build();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let w = tokio::spawn(async move {
        worker
            .run(async {
                let _ = rx.await;
            })
            .await
    });
    let mut ids = Vec::new();
    for n in 0..6u32 {
        ids.push(t.start("job", &n, StartOptions::default()).await.unwrap().id);
    }
    for (n, id) in ids.iter().enumerate() {
        t.assert_output(id, n as u32 * 10).await;
    }
    assert_eq!(ledger.max("render"), 1, "one attempt out at a time, though the worker takes 4");
    let stats = t.admission_stats().await.unwrap();
    let g = stats.iter().find(|s| s.gate == protocol::queue_gate("default", "render")).unwrap();
    assert_eq!((g.held, g.waiting), (0, 0), "each result released its slot");
    let _ = stop.send(());
    w.await.unwrap();
}

/// Limits that would admit nothing, or a rate window under a millisecond, are refused when the
/// queue is registered, naming it; nothing is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_that_could_not_work_are_refused_at_registration() {
    let t = TestEngine::new();
    for (options, says) in [
        (QueueOptions::default().concurrency(0), "concurrency of 0"),
        (QueueOptions::default().rate(0, Duration::from_secs(1)), "rate of 0"),
        (QueueOptions::default().rate(1, Duration::ZERO), "at least 1 ms"),
        (QueueOptions::default().rate(5, Duration::from_micros(500)), "at least 1 ms"),
        (QueueOptions::default().rate(5, Duration::from_micros(1500)), "whole number of milliseconds, not 1.5ms"),
    ] {
        let e = t.register_queue("api", options).expect_err("refused");
        let Error::BadQueue { name, reason } = &e else { panic!("{options:?}: expected BadQueue, got {e:?}") };
        assert_eq!(name, "api");
        assert!(reason.contains(says), "{reason}");
        assert_eq!(e.code(), Some("bad_queue"));
        // The queue is named once.
        assert_eq!(e.to_string().matches("api").count(), 1, "{e}");
    }
    // A name too long to keep is quoted once, cut.
    let e = t.register_queue(&"q".repeat(2000), QueueOptions::default().concurrency(1)).expect_err("too long");
    assert!(e.to_string().starts_with("step queue \"qqq") && !e.to_string().contains("\\\""), "{e}");
    assert!(e.to_string().contains("(2000 bytes)"), "{e}");
    t.register_queue("api", QueueOptions::default().rate(1, Duration::from_millis(1))).unwrap();
}
