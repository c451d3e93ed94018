//! Acceptance: a body that awaits something outside its ctx (a `tokio::time::sleep`, a channel
//! receive) fails its run with `non_ctx_await` once the virtual clock passes the grace; ctx work
//! that takes longer than the grace (a long step) never does.
//!
//! Synchronisation without real sleeps: a test waits for the `StepCompleted` event of the step
//! before the foreign await, then advances the clock. The driver read the clock before that
//! event was sent, so the grace it started counts from no later than the event, and an advance by
//! the grace always covers it.

mod support;

use std::time::Duration;

use durable_conformance::{TestEngine, test_config};
use durable_core::{RunId, RunStatus, StepError, codes, millis_after};
use durable_runtime::{Clock, EngineConfig, RunOutcome, StartOptions, VirtualClock, WorkflowCtx, WorkflowError};
use support::StoreFixture;
use tokio::sync::{mpsc, oneshot, watch};

on_every_store!(
    a_tokio_sleep_in_the_body_fails_the_run_once_the_grace_passes,
    a_step_running_far_longer_than_the_grace_does_not_fail_the_run
);

const GRACE: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3_600);

/// Waits for the step at `seq` of `run` to be committed (bounded like [`ended`]).
async fn committed(events: &mut tokio::sync::broadcast::Receiver<durable_runtime::EngineEvent>, run: &RunId, seq: u32) {
    let wait = support::step_committed(events, run, seq);
    tokio::time::timeout(Duration::from_secs(10), wait).await.expect("the step commits promptly");
}

/// Waits for the run to end. It ends within milliseconds of the advance (the driver's timer
/// on the virtual clock fires at once); the bound on real time fails a regression rather than
/// hanging, and is shorter than the lease renewal (every 15 s) that would poll the turn again
/// without that timer.
async fn ended(t: &TestEngine, id: &RunId) -> RunOutcome {
    t.wait_for_run_timeout(id, Duration::from_secs(10)).await.expect("the run ends promptly")
}

/// Asserts the run failed with `non_ctx_await` and a message naming it and saying what to do.
fn assert_non_ctx_await(outcome: &RunOutcome) -> StepError {
    assert_eq!(outcome.status(), RunStatus::Failed, "{:?}", outcome.error());
    let e = outcome.error().expect("an error").clone();
    assert_eq!(e.code(), Some(codes::NON_CTX_AWAIT), "{e:?}");
    let id = format!("run {}", outcome.run.id);
    for part in [id.as_str(), "outside its WorkflowCtx", "ctx.step", "ctx.sleep", "ctx.wait_for_signal"] {
        assert!(e.message.contains(part), "{part:?} not in {:?}", e.message);
    }
    e
}

/// The workflow `sleepy`: a step, then an hour of `tokio::time::sleep` (never reached: the
/// tokio timer runs on real time).
fn register_sleepy(t: &TestEngine) {
    t.register("sleepy", 1, |ctx: WorkflowCtx, _: ()| async move {
        let before: u32 = ctx.step("before", |_| async { Ok(1) }).await?;
        tokio::time::sleep(HOUR).await;
        Ok::<_, WorkflowError>(before)
    });
}

async fn a_tokio_sleep_in_the_body_fails_the_run_once_the_grace_passes(s: StoreFixture) {
    let t = s.engine();
    register_sleepy(&t);
    let mut events = t.subscribe();
    let run = t.start("sleepy", &(), StartOptions::id("sleepy:1")).await.unwrap();
    committed(&mut events, &run.id, 0).await;
    assert_eq!(t.get_run(&run.id).await.unwrap().unwrap().status, RunStatus::Running);
    t.advance(GRACE);
    let outcome = ended(&t, &run.id).await;
    let e = assert_non_ctx_await(&outcome);
    assert!(e.message.contains("for 1s"), "{:?}", e.message);
    // What the run did before it is kept: an operator can fix the code and retry it.
    let cps = t.checkpoints(&run.id).await;
    assert_eq!(cps.len(), 1);
    assert_eq!((cps[0].name.as_str(), cps[0].status.as_str()), ("before", "completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_is_engine_configuration() {
    let mut config: EngineConfig = test_config();
    config.non_ctx_await_grace = HOUR;
    let t = TestEngine::with_parts(StoreFixture::memory().store, VirtualClock::starting_2026(), config);
    register_sleepy(&t);
    let mut events = t.subscribe();
    let run = t.start("sleepy", &(), StartOptions::id("sleepy:2")).await.unwrap();
    committed(&mut events, &run.id, 0).await;
    t.advance(HOUR);
    let e = assert_non_ctx_await(&ended(&t, &run.id).await);
    assert!(e.message.contains("for 3600s"), "the configured grace is the one applied: {:?}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_receive_that_never_fires_fails_the_run() {
    let t = TestEngine::new();
    t.register("oneshot", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.step("before", |_| async { Ok(()) }).await?;
        // The sender stays alive: the receive never completes.
        let (_tx, rx) = oneshot::channel::<u32>();
        let got = rx.await.unwrap_or(0);
        Ok::<_, WorkflowError>(got)
    });
    t.register("mpsc", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.step("before", |_| async { Ok(()) }).await?;
        let (_tx, mut rx) = mpsc::channel::<u32>(1);
        let got = rx.recv().await.unwrap_or(0);
        Ok::<_, WorkflowError>(got)
    });
    let mut events = t.subscribe();
    let a = t.start("oneshot", &(), StartOptions::id("oneshot:1")).await.unwrap();
    committed(&mut events, &a.id, 0).await;
    let mut events = t.subscribe();
    let b = t.start("mpsc", &(), StartOptions::id("mpsc:1")).await.unwrap();
    committed(&mut events, &b.id, 0).await;
    t.advance(GRACE);
    assert_non_ctx_await(&ended(&t, &a.id).await);
    assert_non_ctx_await(&ended(&t, &b.id).await);
}

/// The next progress report of the step (bounded like [`ended`]).
async fn report(reports: &mut mpsc::UnboundedReceiver<&'static str>) -> &'static str {
    let next = tokio::time::timeout(Duration::from_secs(10), reports.recv()).await;
    next.expect("the step reports promptly").expect("the step's sender lives as long as the engine")
}

/// The workflow `long_step`: one step whose closure reports it started, sleeps an hour on the
/// engine's (virtual) clock, reports that, then waits until the test releases it.
fn register_long_step(t: &TestEngine, progress: mpsc::UnboundedSender<&'static str>, release: watch::Receiver<bool>) {
    let clock = t.clock().clone();
    t.register("long_step", 1, move |ctx: WorkflowCtx, _: ()| {
        let (clock, progress, release) = (clock.clone(), progress.clone(), release.clone());
        async move {
            let out: u32 = ctx
                .step("long", move |_| {
                    let (clock, progress, mut release) = (clock.clone(), progress.clone(), release.clone());
                    async move {
                        // The deadline is read before the test hears of the start (and advances).
                        let until = millis_after(clock.now(), HOUR);
                        let _ = progress.send("started");
                        clock.sleep_until(until).await;
                        let _ = progress.send("an hour later");
                        let _ = release.wait_for(|r| *r).await;
                        Ok::<_, StepError>(7)
                    }
                })
                .await?;
            Ok::<_, WorkflowError>(out)
        }
    });
}

async fn a_step_running_far_longer_than_the_grace_does_not_fail_the_run(s: StoreFixture) {
    let t = s.engine();
    let (progress, mut reports) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    register_long_step(&t, progress, released);
    let run = t.start("long_step", &(), StartOptions::id("long:1")).await.unwrap();
    assert_eq!(report(&mut reports).await, "started");
    t.advance(HOUR);
    // The closure woke after the advance, inside a poll of the turn whose clock reading is past
    // the grace; that poll asks the core once the closure is pending again. A step in flight
    // never counts as idle, so the run is still running when the test lets the step finish.
    assert_eq!(report(&mut reports).await, "an hour later");
    t.advance(HOUR);
    release.send_replace(true);
    let outcome = ended(&t, &run.id).await;
    assert_eq!(outcome.status(), RunStatus::Completed, "{:?}", outcome.error());
    assert_eq!(outcome.output::<u32>().unwrap(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_await_outside_the_ctx_between_calls_is_tolerated() {
    let t = TestEngine::new();
    t.register("brief", 1, |ctx: WorkflowCtx, _: ()| async move {
        let a: u32 = ctx.step("a", |_| async { Ok(1) }).await?;
        // An in-memory hand-off that resolves at once: no failure, whatever the clock does.
        tokio::task::yield_now().await;
        let (tx, rx) = oneshot::channel::<u32>();
        tokio::spawn(async move { tx.send(2) });
        let b = rx.await.unwrap_or(0);
        ctx.sleep(HOUR).await;
        Ok::<_, WorkflowError>(a + b)
    });
    let run = t.start("brief", &(), StartOptions::id("brief:1")).await.unwrap();
    // Parked on the durable sleep: a suspend, not an idle body.
    let parked = t.wait_until_suspended_or_terminal_timeout(&run.id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(parked.status(), RunStatus::Suspended, "{:?}", parked.error());
    t.advance(HOUR);
    let outcome = ended(&t, &run.id).await;
    assert_eq!(outcome.output::<u32>().unwrap(), 3);
}
