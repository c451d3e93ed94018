//! Acceptance: remote steps executed by workers — results, durable retries, timeouts, cancels,
//! capabilities and `blocked` runs, lost wakes, re-dispatch. On the memory store and the
//! virtual clock; the multi-process and SQLite/PostgreSQL versions live in `tests/`.

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use durable_conformance::{Fault, FaultyStore, Method, TestEngine, test_config};
use durable_core::task::{TaskCompletion, TaskDone};
use durable_core::{Backoff, CheckpointStatus, RunId, RunPatch, RunStatus, StepError, StepKind, Store, TaskFilter};
use durable_runtime::{
    Clock, Engine, EngineEvent, RunOutcome, StartOptions, TaskContext, Worker, WorkerBuilder, WorkerReport,
    WorkflowCtx, WorkflowError,
};
use durable_store_memory::MemoryStore;
use durable_transport::QueueTransport;
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

/// A running worker and the way to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<WorkerReport>,
}

impl Running {
    async fn stop(self) -> WorkerReport {
        let _ = self.stop.send(());
        self.handle.await.expect("worker task")
    }
}

fn spawn(builder: WorkerBuilder) -> Running {
    let (stop, rx) = oneshot::channel::<()>();
    let worker = builder.drain_timeout(Duration::from_secs(10)).build();
    let handle = tokio::spawn(async move {
        worker
            .run(async {
                let _ = rx.await;
            })
            .await
    });
    Running { stop, handle }
}

fn register_pipeline(t: &TestEngine) {
    t.register("pipeline", 1, pipeline);
}

async fn pipeline(ctx: WorkflowCtx, n: u32) -> Result<u32, WorkflowError> {
    let doubled: u32 = ctx.remote_step("double", &n).await?;
    let plus: u32 = ctx.remote_step("add_one", &doubled).await?;
    Ok(plus)
}

fn math_worker(t: &TestEngine) -> WorkerBuilder {
    Worker::builder()
        .engine(t.engine())
        .handle("double", |_ctx, n: u32| async move { Ok::<_, StepError>(n * 2) })
        .handle("add_one", |_ctx, n: u32| async move { Ok::<_, StepError>(n + 1) })
}

async fn until<F: Fn(&EngineEvent) -> bool>(rx: &mut broadcast::Receiver<EngineEvent>, f: F) -> EngineEvent {
    loop {
        let e = rx.recv().await.expect("event stream open");
        if f(&e) {
            return e;
        }
    }
}

/// Until a worker has published its descriptor.
async fn until_live(t: &TestEngine) {
    while t.worker_health().await.unwrap().workers.is_empty() {
        tokio::task::yield_now().await;
    }
}

async fn settled(t: &TestEngine, id: &RunId) -> RunOutcome {
    t.wait_for_run(id).await.expect("run settles")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_steps_run_on_a_worker_and_their_results_are_checkpointed() {
    let t = TestEngine::new();
    register_pipeline(&t);
    let w = spawn(math_worker(&t));
    let run = t.start("pipeline", &20u32, StartOptions::id("p1")).await.unwrap();
    t.assert_output(&run.id, 41u32).await;
    let history = t.checkpoints(&run.id).await;
    assert_eq!(history.len(), 2);
    for (cp, name) in history.iter().zip(["double", "add_one"]) {
        assert_eq!(
            (cp.kind, cp.status, cp.name.as_str(), cp.attempts),
            (StepKind::Remote, CheckpointStatus::Completed, name, 1)
        );
    }
    let tasks = t.store().list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..Default::default() }).await.unwrap();
    assert_eq!(tasks.len(), 2);
    assert!(tasks.iter().all(|t| t.outcome.as_deref() == Some("completed")), "{tasks:?}");
    let report = w.stop().await;
    assert_eq!((report.claimed, report.completed, report.dropped), (2, 2, 0));
}

/// Eager dispatch: a worker beside the engine with a free slot gets each task straight from
/// the commit that dispatches it, claimed by it there (no claim of its own), and only up to
/// its free slots: with one slot, of two steps dispatched in one commit, one is handed over and
/// the other is queued and claimed once the slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_beside_the_engine_gets_tasks_from_the_dispatching_commit_up_to_its_free_slots() {
    let t = TestEngine::new();
    register_pipeline(&t);
    let w = spawn(math_worker(&t).id("beside"));
    // Registered with the engine before it publishes its descriptor.
    until_live(&t).await;
    let run = t.start("pipeline", &20u32, StartOptions::id("p1")).await.unwrap();
    t.assert_output(&run.id, 41u32).await;
    let tasks = t.store().list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..Default::default() }).await.unwrap();
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    for task in &tasks {
        assert_eq!((task.worker.as_deref(), task.claims), (Some("beside"), 1), "{task:?}");
        assert_eq!(task.claimed_at, Some(task.task.created_at), "claimed in its dispatch: {task:?}");
    }
    let report = w.stop().await;
    assert_eq!((report.claimed, report.eager, report.completed, report.dropped), (2, 2, 2, 0), "{report:?}");

    // Two steps in one commit, one slot.
    t.register("both", 1, |ctx: WorkflowCtx, n: u32| async move {
        let (a, b) = tokio::join!(
            ctx.remote_step::<u32, _>("double", &n).into_future(),
            ctx.remote_step::<u32, _>("add_one", &n).into_future()
        );
        Ok::<_, WorkflowError>(a? + b?)
    });
    let w = spawn(math_worker(&t).concurrency(1));
    until_live(&t).await;
    let run = t.start("both", &5u32, StartOptions::id("b1")).await.unwrap();
    t.assert_output(&run.id, 16u32).await;
    let report = w.stop().await;
    assert_eq!((report.claimed, report.eager, report.completed), (2, 1, 2), "{report:?}");
}

/// An eager task is handed over once the run's drive here has ended and freed its slot: a
/// handler that returns at once still records its result and claims the woken run in one
/// store call, as in the test below, without waiting for anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eager_task_whose_handler_returns_at_once_records_its_result_with_the_claim() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let t = TestEngine::with_store(store.clone());
    register_pipeline(&t);
    let w = spawn(math_worker(&t));
    until_live(&t).await;
    let run = t.start("pipeline", &20u32, StartOptions::id("p1")).await.unwrap();
    t.assert_output(&run.id, 41u32).await;
    let calls = store.call_counts();
    assert_eq!(calls.get(&Method::CompleteTaskAndClaim), Some(&2), "{calls:?}");
    assert_eq!(calls.get(&Method::CompleteTask), None, "{calls:?}");
    let report = w.stop().await;
    assert_eq!((report.eager, report.completed), (2, 2), "{report:?}");
}

/// A commit that settles the run hands no task to a worker beside the engine: when the body
/// fails in the turn that dispatches a remote step (a race it loses at once), the run fails in
/// the commit that also carries (and finishes) the step's task, whose handler never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_settles_the_run_hands_over_none_of_its_tasks() {
    let t = TestEngine::new();
    t.register("doomed", 1, |ctx: WorkflowCtx, n: u32| async move {
        let step = ctx.remote_step::<u32, _>("double", &n).into_future();
        tokio::select! {
            biased;
            a = step => Ok::<_, WorkflowError>(a?),
            e = std::future::ready(WorkflowError::new("doomed")) => Err(e),
        }
    });
    let ran = Arc::new(AtomicU32::new(0));
    let counted = ran.clone();
    let worker = Worker::builder().engine(t.engine()).handle("double", move |_ctx, n: u32| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, StepError>(n * 2) }
    });
    let w = spawn(worker);
    until_live(&t).await;
    let run = t.start("doomed", &5u32, StartOptions::id("d1")).await.unwrap();
    let outcome = settled(&t, &run.id).await;
    assert_eq!(outcome.status(), RunStatus::Failed, "{outcome:?}");
    let report = w.stop().await;
    assert_eq!((report.claimed, report.eager), (0, 0), "{report:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler of a finished task ran");
    // The settle carried the task, and finished it.
    let tasks = t.store().list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..Default::default() }).await.unwrap();
    let states: Vec<_> = tasks.iter().map(|t| t.state).collect();
    assert_eq!(states, [durable_core::task::TaskState::Finished], "{tasks:?}");
}

/// A commit with a task for a worker beside the engine that the store applied but answered
/// with an error (a lost acknowledgement) hands the task back to the queue: the worker claims
/// it at once instead of waiting out the lease the commit gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_a_commit_answered_with_an_error_goes_back_to_the_queue() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    store.arm(Fault::on(Method::Commit).nth(1).after_apply());
    let t = TestEngine::with_store(store.clone());
    t.register("one", 1, |ctx: WorkflowCtx, n: u32| async move {
        Ok::<_, WorkflowError>(ctx.remote_step::<u32, _>("double", &n).await?)
    });
    let w = spawn(math_worker(&t).id("beside"));
    until_live(&t).await;
    let run = t.start("one", &4u32, StartOptions::id("o1")).await.unwrap();
    // The lease the commit gave the task is 30 s of a clock that stands still: only the hand
    // back lets the run finish.
    tokio::time::timeout(Duration::from_secs(30), t.assert_output(&run.id, 8u32)).await.expect("the run finished");
    assert_eq!(store.injected(), 1);
    let tasks = t.store().list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..Default::default() }).await.unwrap();
    assert_eq!(tasks.iter().map(|t| t.claims).collect::<Vec<_>>(), [2], "claimed in the commit, then by a claim");
    let report = w.stop().await;
    assert_eq!((report.claimed, report.eager, report.completed), (1, 0, 1), "{report:?}");
}

/// A worker beside the engine hands its result to the engine, which, with a slot free and no
/// run waiting for one, records it and claims the woken run in one store call
/// (`complete_task_and_claim`): the run's next turn starts without a claim of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_from_a_worker_beside_the_engine_claims_the_woken_run_in_the_same_store_call() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let t = TestEngine::with_store(store.clone());
    register_pipeline(&t);
    result_claims_the_run(t.engine(), &store).await;
}

/// The same with a run queue shared with other engines: the woken run executes beside the
/// worker that took its task (the task queue spread the work already) instead of going
/// through the run queue — no enqueue, queue claim and ack before the same claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_run_queue_a_result_beside_the_engine_still_claims_the_woken_run_in_the_same_store_call() {
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::over(memory.clone()));
    let engine = Engine::builder()
        .shared_store(store.clone())
        // The run queue in the same data, past the counting wrapper (which has no queue).
        .transport(QueueTransport::new(memory))
        .config(test_config())
        .build()
        .unwrap();
    engine.register("pipeline", 1, pipeline);
    // Through the run queue, each wake would be a `complete_task`, then a queue item and a
    // `claim_run` of its own.
    result_claims_the_run(&engine, &store).await;
}

/// Runs `pipeline` (two remote steps) with a worker beside `engine` and checks that both
/// results claimed the run they woke.
async fn result_claims_the_run(engine: &Engine, store: &FaultyStore<MemoryStore>) {
    // Each handler returns once the turn that dispatched its step has ended here, so the
    // woken run is free to take a slot at once.
    let quiet = {
        let engine = engine.clone();
        move || {
            let engine = engine.clone();
            async move {
                while engine.metrics().turns_in_flight > 0 {
                    tokio::task::yield_now().await;
                }
            }
        }
    };
    let (q1, q2) = (quiet.clone(), quiet);
    let worker = Worker::builder()
        .engine(engine)
        .handle("double", move |_ctx, n: u32| {
            let quiet = q1();
            async move {
                quiet.await;
                Ok::<_, StepError>(n * 2)
            }
        })
        .handle("add_one", move |_ctx, n: u32| {
            let quiet = q2();
            async move {
                quiet.await;
                Ok::<_, StepError>(n + 1)
            }
        });
    let w = spawn(worker);
    let run = engine.start("pipeline", &20u32, StartOptions::id("p1")).await.unwrap();
    assert_eq!(engine.wait_for_run(&run.id).await.unwrap().output::<u32>().unwrap(), 41);
    let calls = store.call_counts();
    assert_eq!(calls.get(&Method::CompleteTaskAndClaim), Some(&2), "{calls:?}");
    assert_eq!(calls.get(&Method::CompleteTask), None, "{calls:?}");
    assert_eq!(calls.get(&Method::ClaimRun), Some(&1), "only the first turn claims the run alone: {calls:?}");
    let report = w.stop().await;
    assert_eq!((report.claimed, report.completed, report.dropped), (2, 2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_waits_its_durable_backoff_and_the_count_survives_a_restart() {
    let t = TestEngine::new();
    let reg = |t: &TestEngine| {
        t.register("flaky", 1, |ctx: WorkflowCtx, _: ()| async move {
            let v: String = ctx.remote_step("flaky", &()).retry(2, Backoff::Fixed(Duration::from_secs(60))).await?;
            Ok::<_, WorkflowError>(v)
        })
    };
    reg(&t);
    let calls = Arc::new(AtomicU32::new(0));
    let worker = |t: &TestEngine, calls: Arc<AtomicU32>| {
        Worker::builder().engine(t.engine()).handle("flaky", move |ctx: TaskContext, _: ()| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                assert_eq!(ctx.attempt(), n, "the attempt number is the durable count");
                if n == 1 { Err(StepError::retryable("flaky backend")) } else { Ok(format!("ok on {}", ctx.step_id())) }
            }
        })
    };
    let mut rx = t.subscribe();
    let w = spawn(worker(&t, calls.clone()));
    // The worker is live before the run starts, so the blocked routing never sees its step
    // without one (the run would show `blocked` rather than `suspended` in between).
    until_live(&t).await;
    let run = t.start("flaky", &(), StartOptions::id("flaky")).await.unwrap();
    // Attempt 1 fails; the run suspends with its backoff as wake_at.
    let backoff_over = t.clock().now() + 60_000;
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { wake_at: Some(at), .. } if *at == backoff_over)).await;
    let stored = t.store().get_run(&run.id).await.unwrap().unwrap();
    assert_eq!((stored.status, stored.wake_at), (RunStatus::Suspended, Some(backoff_over)));
    let cp = &t.checkpoints(&run.id).await[0];
    assert_eq!((cp.status, cp.attempts, cp.wake_at), (CheckpointStatus::Waiting, 1, stored.wake_at));
    w.stop().await;
    // A restart between the attempts: the new engine resumes from the checkpoint.
    let t = t.restart().await;
    reg(&t);
    let w = spawn(worker(&t, calls.clone()));
    t.advance(Duration::from_secs(61));
    t.assert_output(&run.id, "ok on flaky:0".to_string()).await;
    t.assert_attempts(&run.id, "flaky", 2).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_fails_the_step_at_once() {
    let t = TestEngine::new();
    t.register("charge", 1, |ctx: WorkflowCtx, _: ()| async move {
        let r: Result<(), _> = ctx.remote_step("charge", &()).retry(5, Backoff::None).await;
        let e = r.expect_err("the step fails");
        Ok::<_, WorkflowError>((e.attempts, e.error.code().map(str::to_string)))
    });
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let w = spawn(Worker::builder().engine(t.engine()).handle("charge", move |_ctx, _: ()| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), _>(StepError::fatal("card declined").with_code("declined")) }
    }));
    let run = t.start("charge", &(), StartOptions::id("charge")).await.unwrap();
    t.assert_output(&run.id, (1u32, Some("declined".to_string()))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    w.stop().await;
}

/// A handler that panics fails its attempt like an error (code `panic`, retryable): the retry
/// policy runs the next attempt, and once the attempts are spent the step fails. (The panic
/// used to leave the task in flight on the worker, claimed again at each lease expiry and never
/// run: the run waited forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_attempt_and_the_retry_policy_decides() {
    let t = TestEngine::new();
    t.register("shaky", 1, |ctx: WorkflowCtx, retries: u32| async move {
        let r: Result<u32, _> = ctx.remote_step("shaky", &()).retry(retries, Backoff::None).await;
        Ok::<_, WorkflowError>(r.map_err(|e| (e.attempts, e.error.code().map(str::to_string), e.error.message)))
    });
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let w = spawn(Worker::builder().engine(t.engine()).handle("shaky", move |ctx: TaskContext, _: ()| {
        c.fetch_add(1, Ordering::SeqCst);
        // Run "once" panics on its first attempt only; run "always" on every one.
        let panics = ctx.run_id().as_str() == "always" || ctx.attempt() == 1;
        async move {
            assert!(!panics, "handler boom on attempt {}", ctx.attempt());
            Ok::<_, StepError>(ctx.attempt())
        }
    }));
    let once = t.start("shaky", &1u32, StartOptions::id("once")).await.unwrap();
    // A hang guard, not a timing assertion: without the fix the run never settles.
    let settled = tokio::time::timeout(Duration::from_secs(60), t.wait_for_run(&once.id)).await;
    let out = settled.expect("run once settles").unwrap().output::<Result<u32, (u32, Option<String>, String)>>();
    assert_eq!(out.unwrap(), Ok(2));
    t.assert_attempts(&once.id, "shaky", 2).await;
    let always = t.start("shaky", &1u32, StartOptions::id("always")).await.unwrap();
    let out = t.wait_for_run(&always.id).await.unwrap().output::<Result<u32, (u32, Option<String>, String)>>().unwrap();
    let (attempts, code, message) = out.expect_err("every attempt panicked");
    assert_eq!((attempts, code.as_deref()), (2, Some("panic")));
    assert!(message.contains("handler boom on attempt 2") && message.contains("shaky"), "{message}");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let report = w.stop().await;
    assert_eq!((report.claimed, report.completed, report.dropped), (4, 4, 0));
}

/// A worker that takes a task from a queue it serves but has no handler for the step (a
/// rolling deploy) fails the attempt retryable, code `no_handler`: the step's policy retries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_without_a_handler_on_its_worker_fails_its_attempt_retryable() {
    let t = TestEngine::new();
    t.register("deploy", 1, |ctx: WorkflowCtx, _: ()| async move {
        let r: Result<u32, _> = ctx.remote_step("resize", &()).queue("shared").retry(1, Backoff::None).await;
        let e = r.expect_err("no worker has the handler");
        Ok::<_, WorkflowError>((e.attempts, e.error.code().map(str::to_string), e.error.retryable, e.error.message))
    });
    let w = spawn(
        Worker::builder()
            .engine(t.engine())
            .queue("shared")
            .handle("thumbnail", |_ctx, _: ()| async { Ok::<_, StepError>(0u32) }),
    );
    let run = t.start("deploy", &(), StartOptions::id("deploy")).await.unwrap();
    let (attempts, code, retryable, message): (u32, Option<String>, bool, String) =
        t.wait_for_run(&run.id).await.unwrap().output().unwrap();
    assert_eq!((attempts, code.as_deref(), retryable), (2, Some("no_handler"), true));
    assert!(message.contains(r#"has no handler for remote step "resize""#), "{message}");
    w.stop().await;
}

/// A handler's output over the worker's payload limit fails the attempt at once, fatal, with
/// code `payload_too_large`, as a local step's does; the output is never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_over_the_payload_limit_fails_the_step_and_is_not_stored() {
    let t = TestEngine::new();
    t.register("big", 1, |ctx: WorkflowCtx, len: usize| async move {
        let r: Result<String, _> = ctx.remote_step("big", &len).retry(3, Backoff::None).await;
        Ok::<_, WorkflowError>(r.map_err(|e| (e.attempts, e.error.code().map(str::to_string), e.error.message)))
    });
    let w = spawn(
        Worker::builder()
            .engine(t.engine())
            .max_payload_bytes(64)
            .handle("big", |_ctx, len: usize| async move { Ok::<_, StepError>("x".repeat(len)) }),
    );
    let small = t.start("big", &10usize, StartOptions::id("small")).await.unwrap();
    t.assert_output(&small.id, Ok::<String, (u32, Option<String>, String)>("x".repeat(10))).await;
    let big = t.start("big", &100usize, StartOptions::id("big")).await.unwrap();
    let out = t.wait_for_run(&big.id).await.unwrap().output::<Result<String, (u32, Option<String>, String)>>().unwrap();
    let (attempts, code, message) = out.expect_err("102 bytes of JSON are over 64");
    assert_eq!((attempts, code.as_deref()), (1, Some("payload_too_large")));
    assert!(message.contains("is 102 bytes, over the 64-byte payload limit") && message.contains("big:0"), "{message}");
    let cp = &t.checkpoints(&big.id).await[0];
    assert_eq!((cp.status, cp.output.is_none()), (CheckpointStatus::Failed, true), "{cp:?}");
    w.stop().await;
}

/// A remote step's input over the engine's payload limit fails that step (fatal,
/// `payload_too_large`), as a local step's output over it does: the workflow handles it, and
/// no task is written (it used to fail the whole run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_over_the_payload_limit_fails_the_step_and_dispatches_nothing() {
    let mut config = test_config();
    config.max_payload_bytes = 300;
    let store = Arc::new(MemoryStore::new());
    let t = TestEngine::with_parts(store.clone(), durable_runtime::VirtualClock::starting_2026(), config);
    t.register("send", 1, |ctx: WorkflowCtx, len: usize| async move {
        let r: Result<u32, _> = ctx.remote_step("big", &"x".repeat(len)).retry(3, Backoff::None).await;
        Ok::<_, WorkflowError>(r.map_err(|e| (e.attempts, e.error.code().map(str::to_string), e.error.message)))
    });
    let run = t.start("send", &400usize, StartOptions::id("send")).await.unwrap();
    let out = settled(&t, &run.id).await.output::<Result<u32, (u32, Option<String>, String)>>().unwrap();
    let (attempts, code, message) = out.expect_err("402 bytes of JSON are over 300");
    assert_eq!((attempts, code.as_deref()), (1, Some("payload_too_large")));
    assert!(message.contains(r#"the input of remote step "big" (seq 0) of run send is 402 bytes"#), "{message}");
    let tasks = store.list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..TaskFilter::default() }).await.unwrap();
    assert!(tasks.is_empty(), "nothing dispatched: {tasks:?}");
}

/// A zero heartbeat timeout would make every claim lapse at once (each attempt run by several
/// workers): the option refuses it, failing the run with a message naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_under_a_millisecond_fails_the_run_naming_the_option() {
    let t = TestEngine::new();
    t.register("zero", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.remote_step("resize", &()).heartbeat_timeout(Duration::ZERO).await?;
        Ok::<_, WorkflowError>(v)
    });
    let run = t.start("zero", &(), StartOptions::id("zero")).await.unwrap();
    let outcome = settled(&t, &run.id).await;
    assert_eq!(outcome.status(), RunStatus::Failed);
    let message = &outcome.error().unwrap().message;
    assert!(message.contains("remote step option heartbeat_timeout(0ns) is under a millisecond"), "{message}");
    let tasks = t.shared_store().list_tasks(&TaskFilter::default()).await.unwrap();
    assert!(tasks.is_empty(), "nothing dispatched: {tasks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_timeout_is_cancelled_and_retried_after_its_backoff() {
    let t = TestEngine::new();
    t.register("slow", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx
            .remote_step("slow", &())
            .timeout(Duration::from_secs(10))
            .retry(1, Backoff::Fixed(Duration::from_secs(30)))
            .await?;
        Ok::<_, WorkflowError>(v)
    });
    let (cancelled_tx, mut cancelled) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let mut rx = t.subscribe();
    let w = spawn(Worker::builder().engine(t.engine()).handle("slow", move |ctx: TaskContext, _: ()| {
        let (c, s) = (cancelled_tx.clone(), started_tx.clone());
        async move {
            let _ = s.send(ctx.attempt());
            if ctx.attempt() == 1 {
                ctx.cancelled().await; // hangs until the attempt's deadline
                let _ = c.send(ctx.attempt());
                return Ok(0);
            }
            Ok(7)
        }
    }));
    let run = t.start("slow", &(), StartOptions::id("slow")).await.unwrap();
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    // Wait for the handler before moving time: the timeout runs from the claim, which may be
    // the dispatching commit itself (a worker beside the engine), and a handler handed its
    // task only once the lease has passed on this clock would not run it.
    assert_eq!(started.recv().await, Some(1));
    t.advance(Duration::from_secs(11));
    until(&mut rx, |e| matches!(e, EngineEvent::RemoteStepTimedOut { attempt: 1, .. })).await;
    // The expiry is a failed attempt: the run waits out its durable backoff.
    let backoff_over = t.clock().now() + 30_000;
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { wake_at: Some(at), .. } if *at == backoff_over)).await;
    let cp = &t.checkpoints(&run.id).await[0];
    assert_eq!((cp.status, cp.attempts), (CheckpointStatus::Waiting, 1));
    assert_eq!(cp.error.as_ref().and_then(|e| e.code()), Some("remote_timeout"));
    t.advance(Duration::from_secs(31));
    t.assert_output(&run.id, 7u32).await;
    assert_eq!(cancelled.recv().await, Some(1), "the first attempt's handler saw cancelled()");
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_a_task_runs_reaches_the_handler_and_its_late_result_is_dropped() {
    let t = TestEngine::new();
    t.register("long", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.remote_step("long", &()).await?;
        Ok::<_, WorkflowError>(v)
    });
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (seen_tx, seen_rx) = oneshot::channel::<()>();
    let started_tx = Arc::new(parking_lot::Mutex::new(Some((started_tx, seen_tx))));
    let w = spawn(Worker::builder().engine(t.engine()).handle("long", move |ctx: TaskContext, _: ()| {
        let channels = started_tx.lock().take();
        async move {
            let (started, seen) = channels.expect("one attempt");
            let _ = started.send(());
            ctx.heartbeat(&"working").await;
            ctx.cancelled().await;
            let _ = seen.send(());
            Ok(1) // a late result
        }
    }));
    let run = t.start("long", &(), StartOptions::id("long")).await.unwrap();
    started_rx.await.unwrap();
    t.cancel(&run.id).await.unwrap();
    // The worker looks at its tasks' runs every poll interval.
    t.advance(Duration::from_secs(2));
    seen_rx.await.expect("the handler saw the cancel");
    let report = w.stop().await;
    assert_eq!(settled(&t, &run.id).await.status(), RunStatus::Cancelled);
    assert_eq!((report.completed, report.dropped), (0, 1), "{report:?}");
    let cps = t.checkpoints(&run.id).await;
    assert_ne!(cps[0].status, CheckpointStatus::Completed, "the late result was not recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_no_live_worker_can_take_blocks_the_run_until_one_appears() {
    let t = TestEngine::new();
    t.register("render", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: String = ctx.remote_step("render", &()).requires(["gpu", "cuda12"]).await?;
        let url: String = ctx.remote_step("upload", &v).requires(["s3"]).await?;
        Ok::<_, WorkflowError>(url)
    });
    let mut rx = t.subscribe();
    // A worker without the capabilities is live: it does not count.
    let cpu = spawn(
        Worker::builder()
            .engine(t.engine())
            .handle("render", |_ctx, _: ()| async { Ok::<_, StepError>("cpu".to_string()) }),
    );
    let run = t.start("render", &(), StartOptions::id("render")).await.unwrap();
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    t.advance(t.config().blocked_poll);
    match until(&mut rx, |e| matches!(e, EngineEvent::RunBlocked { .. })).await {
        EngineEvent::RunBlocked { message, .. } => {
            assert_eq!(message, "blocked: no compatible worker (requires gpu, cuda12)")
        }
        _ => unreachable!(),
    }
    let blocked = t.store().get_run(&run.id).await.unwrap().unwrap();
    assert_eq!(blocked.status, RunStatus::Blocked);
    assert_eq!(blocked.error.unwrap().message, "blocked: no compatible worker (requires gpu, cuda12)");
    // The worker takes the task at once: its result wakes the run out of `blocked` before
    // the engine's next pass would unblock it, and the claim drops the stale reason.
    let gpu = spawn(
        Worker::builder()
            .engine(t.engine())
            .handle("render", |_ctx, _: ()| async { Ok::<_, StepError>("gpu".to_string()) })
            .capabilities(["gpu", "cuda12", "avx"]),
    );
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    // No stale reason: suspended without one, or (a pass of the engine, prompted by the new
    // worker, came first) blocked again for its next step.
    let parked = t.store().get_run(&run.id).await.unwrap().unwrap();
    assert!(parked.error.as_ref().is_none_or(|e| e.message.contains("requires s3")), "{parked:?}");
    // So its next step, which no worker can take, blocks it again, with its own reason.
    t.advance(t.config().blocked_poll);
    match until(&mut rx, |e| matches!(e, EngineEvent::RunBlocked { .. })).await {
        EngineEvent::RunBlocked { message, .. } => assert_eq!(message, "blocked: no compatible worker (requires s3)"),
        _ => unreachable!(),
    }
    let s3 = spawn(
        Worker::builder()
            .engine(t.engine())
            .handle("upload", |_ctx, v: String| async move { Ok::<_, StepError>(format!("s3://{v}")) })
            .capabilities(["s3"]),
    );
    t.assert_output(&run.id, "s3://gpu".to_string()).await;
    cpu.stop().await;
    gpu.stop().await;
    s3.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wake_is_healed_by_the_reconcile_interval() {
    let store = Arc::new(MemoryStore::new());
    let t = TestEngine::with_store(store.clone());
    let register = |t: &TestEngine| {
        t.register("one", 1, |ctx: WorkflowCtx, _: ()| async move {
            let v: u32 = ctx.remote_step("one", &()).await?;
            Ok::<_, WorkflowError>(v)
        })
    };
    register(&t);
    let mut rx = t.subscribe();
    let run = t.start("one", &(), StartOptions::id("one")).await.unwrap();
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    let parked = store.get_run(&run.id).await.unwrap().unwrap();
    let reconcile_at = parked.wake_at.expect("a run parked on a remote step has a reconcile time");
    assert_eq!(reconcile_at, t.clock().now() + t.config().reconcile_interval.as_millis() as u64);
    // A restart: the new engine has nothing registered yet, so nothing of it looks at the run
    // while the fault is injected.
    let t = t.restart().await;
    // A worker's result whose wake is lost: the checkpoint is written, the wake undone.
    let task = store.list_tasks(&TaskFilter::default()).await.unwrap().remove(0);
    let done = TaskDone {
        run_id: run.id.clone(),
        seq: 0,
        attempt: task.task.attempt,
        worker: Some("w".into()),
        result: Ok(durable_core::Payload::encode(&5u32).unwrap()),
        logs: Vec::new(),
        now: t.clock().now(),
    };
    assert_eq!(store.complete_task(done).await.unwrap(), TaskCompletion::Accepted);
    let patch = RunPatch { wake_at: Some(Some(reconcile_at)), now: t.clock().now(), ..RunPatch::default() };
    assert!(store.update_run_if(&run.id, &[RunStatus::Suspended, RunStatus::Blocked], patch).await.unwrap());
    assert_eq!(store.history(&run.id).await.unwrap()[0].status, CheckpointStatus::Completed);
    register(&t);
    t.advance(t.config().reconcile_interval);
    t.assert_output(&run.id, 5u32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redispatch_pending_resends_with_the_same_step_id_and_the_next_attempt() {
    let t = TestEngine::new();
    t.register("stuck", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: String = ctx.remote_step("stuck", &()).retry(0, Backoff::None).await?;
        Ok::<_, WorkflowError>(v)
    });
    let mut rx = t.subscribe();
    let run = t.start("stuck", &(), StartOptions::id("stuck")).await.unwrap();
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    let first = t.store().list_tasks(&TaskFilter::default()).await.unwrap().remove(0);
    assert_eq!(first.task.attempt, 1);
    assert_eq!(t.redispatch_pending(&run.id).await.unwrap(), 1);
    // The run dispatches attempt 2 (outside its policy of no retries).
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    let second = t.store().list_tasks(&TaskFilter::default()).await.unwrap().remove(0);
    assert_eq!((second.task.step_id(), second.task.attempt), (first.task.step_id(), 2));
    // The first attempt's late result is dropped.
    let late = TaskDone {
        run_id: run.id.clone(),
        seq: 0,
        attempt: 1,
        worker: Some("old".into()),
        result: Ok(durable_core::Payload::encode(&"late").unwrap()),
        logs: Vec::new(),
        now: t.clock().now(),
    };
    assert_eq!(t.store().complete_task(late).await.unwrap(), TaskCompletion::Duplicate);
    let w = spawn(Worker::builder().engine(t.engine()).handle("stuck", |ctx: TaskContext, _: ()| async move {
        Ok::<_, StepError>(format!("{} attempt {}", ctx.step_id(), ctx.attempt()))
    }));
    t.assert_output(&run.id, "stuck:0 attempt 2".to_string()).await;
    w.stop().await;
    // Nothing pending any more: nothing re-sent. An unknown run is named.
    assert_eq!(t.redispatch_pending(&run.id).await.unwrap(), 0);
    let unknown = t.redispatch_pending(&"no-such-run".into()).await.unwrap_err();
    assert!(matches!(&unknown, durable_runtime::Error::RunNotFound(id) if id.as_str() == "no-such-run"), "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redispatch_pending_resends_every_pending_step_of_a_wide_fan_out() {
    let t = TestEngine::new();
    t.register("wide", 1, |ctx: WorkflowCtx, n: u32| async move {
        let steps: Vec<_> =
            (0..n).map(|i| ctx.remote_step::<_, u32>("wide", &i).retry(0, Backoff::None).into_future()).collect();
        let outs = ctx.all(steps).await;
        Ok::<_, WorkflowError>(outs.into_iter().collect::<Result<Vec<u32>, _>>()?.len() as u32)
    });
    let mut rx = t.subscribe();
    // More pending steps than one page of the run's tasks.
    let run = t.start("wide", &250u32, StartOptions::id("wide")).await.unwrap();
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    assert_eq!(t.redispatch_pending(&run.id).await.unwrap(), 250);
    let w = spawn(Worker::builder().engine(t.engine()).concurrency(64).handle(
        "wide",
        |ctx: TaskContext, i: u32| async move {
            assert_eq!(ctx.attempt(), 2, "step {i} runs its re-sent attempt");
            Ok::<_, StepError>(i)
        },
    ));
    t.assert_output(&run.id, 250u32).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redispatched_attempt_still_running_is_told_to_stop_and_frees_its_slot() {
    // One slot: attempt 2 runs here only once attempt 1's handler gave it up.
    redispatched_while_running(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redispatched_attempt_runs_beside_the_one_it_replaces_on_the_same_worker() {
    // Two slots: attempt 2 runs here at once, beside attempt 1, which is still told to stop.
    redispatched_while_running(2).await;
}

async fn redispatched_while_running(slots: usize) {
    let t = TestEngine::new();
    t.register("stuck", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.remote_step("stuck", &()).retry(0, Backoff::None).await?;
        Ok::<_, WorkflowError>(v)
    });
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let (stopped_tx, mut stopped) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let builder = Worker::builder().engine(t.engine()).concurrency(slots);
    let w = spawn(builder.handle("stuck", move |ctx: TaskContext, _: ()| {
        let (started, stopped) = (started_tx.clone(), stopped_tx.clone());
        async move {
            let _ = started.send(ctx.attempt());
            if ctx.attempt() == 1 {
                // Stuck without heartbeats until told to stop; then a late result.
                ctx.cancelled().await;
                let _ = stopped.send(ctx.attempt());
            }
            Ok::<_, StepError>(ctx.attempt())
        }
    }));
    let run = t.start("stuck", &(), StartOptions::id("stuck")).await.unwrap();
    assert_eq!(started.recv().await, Some(1));
    assert_eq!(t.redispatch_pending(&run.id).await.unwrap(), 1);
    if slots > 1 {
        assert_eq!(started.recv().await, Some(2), "attempt 2 starts in the free slot");
        t.assert_output(&run.id, 2u32).await;
    }
    // The worker looks, every 10 s, whether attempts running that long ended in the store.
    t.advance(Duration::from_secs(11));
    assert_eq!(stopped.recv().await, Some(1), "attempt 1's handler was told to stop");
    if slots == 1 {
        // Its late result is dropped; attempt 2 runs in the slot it freed.
        t.advance(Duration::from_secs(1));
        assert_eq!(started.recv().await, Some(2));
        t.assert_output(&run.id, 2u32).await;
    }
    let report = w.stop().await;
    assert_eq!((report.completed, report.dropped), (1, 1), "{report:?}");
}

/// The engine's clock, counting the worker's sleeps: those until a time already past (each
/// a turn of a busy loop) and the latest one into the future.
#[derive(Debug)]
struct WatchedClock {
    inner: Arc<dyn Clock>,
    past: AtomicU32,
    latest: parking_lot::Mutex<u64>,
    slept: tokio::sync::Notify,
}

impl Clock for WatchedClock {
    fn now(&self) -> u64 {
        self.inner.now()
    }

    fn sleep_until(&self, at: u64) -> durable_runtime::BoxFuture<'static, ()> {
        if at <= self.inner.now() {
            self.past.fetch_add(1, Ordering::SeqCst);
        } else {
            let mut latest = self.latest.lock();
            *latest = (*latest).max(at);
        }
        self.slept.notify_waiters();
        self.inner.sleep_until(at)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_every_slot_taken_sleeps_until_its_next_poll() {
    let t = TestEngine::new();
    t.register("busy", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.remote_step("busy", &()).await?;
        Ok::<_, WorkflowError>(v)
    });
    let clock = Arc::new(WatchedClock {
        inner: Arc::new(t.clock().clone()),
        past: AtomicU32::new(0),
        latest: parking_lot::Mutex::new(0),
        slept: tokio::sync::Notify::new(),
    });
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let channels = Arc::new(parking_lot::Mutex::new(Some((started_tx, release_rx))));
    let poll = Duration::from_millis(500);
    let builder = Worker::builder().engine(t.engine()).clock(clock.clone()).concurrency(1).poll_interval(poll);
    let w = spawn(builder.handle("busy", move |_ctx, _: ()| {
        let channels = channels.lock().take();
        async move {
            let (started, release) = channels.expect("one attempt");
            let _ = started.send(());
            let _ = release.await;
            Ok::<_, StepError>(9u32)
        }
    }));
    let run = t.start("busy", &(), StartOptions::id("busy")).await.unwrap();
    started_rx.await.unwrap();
    // Its one slot taken, the worker passes its poll time: it must sleep until the next one,
    // not loop on the time already past.
    let after = t.clock().now() + 2 * poll.as_millis() as u64;
    t.advance(2 * poll);
    loop {
        let slept = clock.slept.notified();
        if *clock.latest.lock() > after || clock.past.load(Ordering::SeqCst) >= 1_000 {
            break;
        }
        slept.await;
    }
    let past = clock.past.load(Ordering::SeqCst);
    assert!(past < 10, "the worker slept {past} times until a time already past: a busy loop");
    release_tx.send(()).unwrap();
    t.assert_output(&run.id, 9u32).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_cancelled_by_a_shutdown_runs_its_cleanup_and_its_task_goes_back() {
    let t = TestEngine::new();
    t.register("long", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.remote_step("long", &()).await?;
        Ok::<_, WorkflowError>(v)
    });
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (cleaned_tx, mut cleaned_rx) = oneshot::channel::<()>();
    let channels = Arc::new(parking_lot::Mutex::new(Some((started_tx, cleaned_tx))));
    let worker = Worker::builder().engine(t.engine()).drain_timeout(Duration::ZERO).handle(
        "long",
        move |ctx: TaskContext, _: ()| {
            let channels = channels.lock().take();
            async move {
                let (started, cleaned) = channels.expect("one attempt here");
                let _ = started.send(());
                ctx.cancelled().await;
                // Cleanup that takes a moment (closing a connection, say).
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = cleaned.send(());
                // What a handler returns once told to stop by a shutdown is not its attempt's
                // result: the task goes back to the store.
                Err::<u32, _>(StepError::fatal("stopped"))
            }
        },
    );
    let (stop, stop_rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(worker.run(async {
        let _ = stop_rx.await;
    }));
    let run = t.start("long", &(), StartOptions::id("long")).await.unwrap();
    started_rx.await.unwrap();
    stop.send(()).unwrap();
    let report = handle.await.unwrap();
    assert!(cleaned_rx.try_recv().is_ok(), "the handler's cancelled() branch ran before the worker stopped");
    assert_eq!((report.completed, report.handed_back), (0, 1), "{report:?}");
    // Another worker runs the attempt; the fatal error was not recorded.
    let w =
        spawn(Worker::builder().engine(t.engine()).handle("long", |_ctx, _: ()| async { Ok::<_, StepError>(5u32) }));
    t.assert_output(&run.id, 5u32).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_health_lists_queues_and_live_workers() {
    let t = TestEngine::new();
    t.register("one", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.remote_step("nobody", &()).await?;
        Ok::<_, WorkflowError>(v)
    });
    let mut rx = t.subscribe();
    let w = spawn(
        Worker::builder()
            .engine(t.engine())
            .id("w-1")
            .capabilities(["gpu"])
            .handle("double", |_c, n: u32| async move { Ok::<_, StepError>(n * 2) }),
    );
    t.start("one", &(), StartOptions::id("h")).await.unwrap();
    until(&mut rx, |e| matches!(e, EngineEvent::RunSuspended { .. })).await;
    let health = loop {
        let h = t.worker_health().await.unwrap();
        if !h.workers.is_empty() {
            break h;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(health.workers[0].id, "w-1");
    assert_eq!(health.workers[0].capabilities, vec!["gpu".to_string()]);
    let nobody = health.queues.iter().find(|q| q.queue == "nobody").expect("the waiting queue");
    assert_eq!((nobody.depth, nobody.claimed, nobody.workers.len()), (1, 0, 0));
    let double = health.queues.iter().find(|q| q.queue == "double").expect("the served queue");
    assert_eq!(double.workers, vec!["w-1".to_string()]);
    w.stop().await;
}

/// Which workers count live is each engine's own view (its `worker_ttl`): an engine with a
/// short one does not make the store forget workers another engine still counts live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_worker_ttl_hides_no_worker_from_other_engines() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = durable_runtime::VirtualClock::starting_2026();
    let mut short = test_config();
    short.worker_ttl = Duration::from_secs(3);
    let brief = TestEngine::with_parts(store.clone(), clock.clone(), short);
    let patient = TestEngine::with_parts(store.clone(), clock.clone(), test_config());
    let now = clock.now();
    store
        .register_worker(&durable_core::task::WorkerInfo {
            id: "w-cpu".into(),
            queues: vec!["resize".into()],
            capabilities: vec![],
            protocol_min: 1,
            protocol_max: 1,
            concurrency: 4,
            started_at: now - 60_000,
            heartbeat_at: now - 10_000,
        })
        .await
        .unwrap();
    let live = |h: durable_runtime::WorkerHealth| h.workers.into_iter().map(|w| w.id).collect::<Vec<_>>();
    assert!(live(brief.worker_health().await.unwrap()).is_empty(), "10 s silent is gone for a 3 s ttl");
    assert_eq!(live(patient.worker_health().await.unwrap()), ["w-cpu"], "and live for a 30 s one");
    // Forgotten once it is an hour old (by the next look of any engine: here, ours).
    clock.advance(Duration::from_secs(3600));
    assert!(live(patient.worker_health().await.unwrap()).is_empty());
    assert!(store.workers(0).await.unwrap().is_empty(), "forgotten");
}

/// A worker that stalled past its lease and finds out from a heartbeat (`false`) stops with an
/// error, as the docs show: that error is dropped, not recorded, so the worker that took the
/// attempt over finishes it (recorded, it failed the attempt under that worker and, with no
/// retry left, the step).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_a_worker_whose_attempt_was_taken_over_is_dropped() {
    let t = TestEngine::new();
    t.register("stall", 1, |ctx: WorkflowCtx, _: ()| async move {
        let r: Result<String, _> =
            ctx.remote_step("stall", &()).heartbeat_timeout(Duration::from_secs(10)).retry(0, Backoff::None).await;
        Ok::<_, WorkflowError>(r.map_err(|e| e.error.message))
    });
    let (said, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (go_a, go_a_rx) = tokio::sync::watch::channel(false);
    let (go_b, go_b_rx) = tokio::sync::watch::channel(false);
    let said_a = said.clone();
    // One slot, held by the stalled handler: A cannot claim its own lapsed task back.
    let a = spawn(Worker::builder().engine(t.engine()).id("a").concurrency(1).handle(
        "stall",
        move |ctx: TaskContext, _: ()| {
            let (said, mut go) = (said_a.clone(), go_a_rx.clone());
            async move {
                let _ = said.send("a started".into());
                let _ = go.wait_for(|g| *g).await;
                let kept = ctx.heartbeat(&()).await;
                let _ = said.send(format!("a kept the lease: {kept}"));
                Err::<String, _>(StepError::retryable("heartbeat said stop"))
            }
        },
    ));
    // A hang guard on each wait for a handler's word, not a timing assertion.
    let mut next = async || tokio::time::timeout(Duration::from_secs(60), heard.recv()).await.expect("in time");
    let run = t.start("stall", &(), StartOptions::id("stall")).await.unwrap();
    assert_eq!(next().await.as_deref(), Some("a started"));
    let b = spawn(Worker::builder().engine(t.engine()).id("b").handle("stall", move |_ctx: TaskContext, _: ()| {
        let (said, mut go) = (said.clone(), go_b_rx.clone());
        async move {
            let _ = said.send("b started".into());
            let _ = go.wait_for(|g| *g).await;
            Ok::<_, StepError>("b".to_string())
        }
    }));
    // Past A's lease, B takes the same attempt over.
    t.advance(Duration::from_secs(11));
    assert_eq!(next().await.as_deref(), Some("b started"));
    go_a.send_replace(true);
    assert_eq!(next().await.as_deref(), Some("a kept the lease: false"));
    // A has ended (its result handled) before B returns.
    let report = a.stop().await;
    assert_eq!((report.completed, report.dropped), (0, 1), "{report:?}");
    go_b.send_replace(true);
    t.assert_output(&run.id, Ok::<String, String>("b".into())).await;
    let tasks = t.store().list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..Default::default() }).await.unwrap();
    assert_eq!((tasks[0].claims, tasks[0].task.attempt, tasks[0].worker.as_deref()), (2, 1, Some("b")));
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_two_minute_step_alive_and_a_silent_worker_loses_its_task() {
    let t = TestEngine::new();
    t.register("long", 1, |ctx: WorkflowCtx, kind: String| async move {
        let v: String = ctx.remote_step("long", &kind).heartbeat_timeout(Duration::from_secs(10)).await?;
        Ok::<_, WorkflowError>(v)
    });
    let (beat_tx, mut beats) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let clock = t.clock().clone();
    // Worker A: beats every 5 s of (virtual) time for two minutes; or, for "silent", beats
    // once and then never again.
    let a =
        spawn(Worker::builder().engine(t.engine()).id("a").handle("long", move |ctx: TaskContext, kind: String| {
            let (beat_tx, clock) = (beat_tx.clone(), clock.clone());
            async move {
                for i in 0..24 {
                    assert!(ctx.heartbeat(&i).await, "the lease holds while beating");
                    // The next beat is due 5 s after this one, whenever the test moves time.
                    let next = clock.now() + 5_000;
                    let _ = beat_tx.send(i);
                    if kind == "silent" {
                        ctx.cancelled().await;
                        return Ok("a, late".to_string());
                    }
                    clock.sleep_until(next).await;
                }
                Ok("a".to_string())
            }
        }));
    let run = t.start("long", &"beating".to_string(), StartOptions::id("beating")).await.unwrap();
    for i in 0..24 {
        assert_eq!(beats.recv().await, Some(i));
        t.advance(Duration::from_secs(5));
    }
    t.assert_output(&run.id, "a".to_string()).await;
    let tasks = t.store().list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..Default::default() }).await.unwrap();
    assert_eq!((tasks[0].claims, tasks[0].worker.as_deref()), (1, Some("a")), "never redelivered");

    // A's next task goes silent after its first beat, and A dies (its loop and handler
    // vanish, as in a crash); worker B comes up.
    let silent = t.start("long", &"silent".to_string(), StartOptions::id("silent")).await.unwrap();
    assert_eq!(beats.recv().await, Some(0));
    a.handle.abort();
    let _ = a.handle.await;
    let b =
        spawn(Worker::builder().engine(t.engine()).id("b").handle("long", |ctx: TaskContext, _: String| async move {
            Ok::<_, StepError>(format!("b, attempt {}", ctx.attempt()))
        }));
    // Past the lease, B takes the same attempt over.
    t.advance(Duration::from_secs(11));
    t.assert_output(&silent.id, "b, attempt 1".to_string()).await;
    let tasks =
        t.store().list_tasks(&TaskFilter { run_id: Some(silent.id.clone()), ..Default::default() }).await.unwrap();
    assert_eq!((tasks[0].claims, tasks[0].task.attempt, tasks[0].worker.as_deref()), (2, 1, Some("b")));
    b.stop().await;
}
