//! Every duration, payload, name and id a user can pass, tried from outside as a user would:
//! huge durations mean "never" (not "soon"), every payload the engine writes is held to
//! `max_payload_bytes`, a wait on a name no message can reach fails its run at once, and a run
//! the engine means to create is never silently replaced by an unrelated run holding its id.

use std::time::{Duration, UNIX_EPOCH};

use durable::testing::{TestEngine, test_config};
use durable::{
    Backoff, ChildOptions, MemoryStore, RunId, RunStatus, StartOptions, StepError, StepOptions, VirtualClock,
    WorkflowCtx, WorkflowError, WorkflowOptions, codes,
};

const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// The durations every API taking one is tried with.
fn durations() -> [(Duration, &'static str); 5] {
    [
        (Duration::ZERO, "0"),
        (Duration::from_millis(1), "1 ms"),
        (YEAR, "a year"),
        (Duration::from_millis(u64::MAX), "u64::MAX ms"),
        (Duration::MAX, "Duration::MAX"),
    ]
}

/// Whether `d` is long enough that ten virtual years do not reach it.
fn never(d: Duration) -> bool {
    d > 10 * YEAR
}

fn id(s: &str) -> StartOptions {
    StartOptions::id(s)
}

async fn status(t: &TestEngine, run: &RunId) -> RunStatus {
    t.wait_until_suspended_or_terminal(run).await.expect("the run exists").status()
}

/// The run's `wake_at`, which must be "never" for a huge duration: ten virtual years later.
async fn wakes_never(t: &TestEngine, run: &RunId) {
    let r = t.get_run(run).await.unwrap().expect("the run exists");
    assert_eq!(r.status, RunStatus::Suspended, "{run}");
    let wake_at = r.wake_at.expect("a timer is set");
    let far = durable::Clock::now(t.clock()).saturating_add(10 * 365 * 86_400_000);
    assert!(wake_at > far, "run {run} wakes at {wake_at}, within ten years: the duration wrapped");
}

/// Moves virtual time on (ten years at a time) whenever the run is parked, until it settles.
async fn run_to_end(t: &TestEngine, run: &RunId) -> RunStatus {
    for _ in 0..200 {
        let status = status(t, run).await;
        if status.is_terminal() {
            return status;
        }
        t.advance(10 * YEAR);
        tokio::task::yield_now().await;
    }
    panic!("run {run} did not settle");
}

async fn error_code(t: &TestEngine, run: &RunId) -> Option<String> {
    let r = t.get_run(run).await.unwrap().expect("the run exists");
    r.error.and_then(|e| e.code)
}

#[tokio::test]
async fn sleeps_of_every_length_wake_when_due_and_huge_ones_never() {
    for (d, what) in durations() {
        let t = TestEngine::new();
        t.register("sleep", 1, move |ctx: WorkflowCtx, _: ()| async move {
            ctx.sleep(d).await;
            Ok::<_, WorkflowError>(())
        });
        let run = t.start("sleep", &(), id("s")).await.unwrap().id;
        if d.is_zero() {
            t.assert_status(&run, RunStatus::Completed).await;
            continue;
        }
        assert_eq!(status(&t, &run).await, RunStatus::Suspended, "{what}");
        if never(d) {
            wakes_never(&t, &run).await;
        } else {
            t.advance(10 * YEAR);
            t.assert_status(&run, RunStatus::Completed).await;
        }
    }
}

#[tokio::test]
async fn sleep_until_a_far_future_time_waits() {
    let t = TestEngine::new();
    let far = UNIX_EPOCH + Duration::from_secs(1 << 40); // about 34,000 years after 1970
    t.register("until", 1, move |ctx: WorkflowCtx, _: ()| async move {
        ctx.sleep_until(far).await;
        Ok::<_, WorkflowError>(())
    });
    let run = t.start("until", &(), id("u")).await.unwrap().id;
    assert_eq!(status(&t, &run).await, RunStatus::Suspended);
    wakes_never(&t, &run).await;
    let wake_at = t.get_run(&run).await.unwrap().unwrap().wake_at.unwrap();
    assert_eq!(UNIX_EPOCH + Duration::from_millis(wake_at), far);
}

#[tokio::test]
async fn wait_deadlines_of_every_length_time_out_only_when_due() {
    for (d, what) in durations() {
        let t = TestEngine::new();
        t.register("wait", 1, move |ctx: WorkflowCtx, _: ()| async move {
            let got: Option<u32> = ctx.wait_for_signal_timeout("go", d).await?;
            let ev: Option<serde_json::Value> = ctx.wait_for_event_timeout("ev", serde_json::json!({}), d).await?;
            Ok::<_, WorkflowError>((got, ev))
        });
        let run = t.start("wait", &(), id("w")).await.unwrap().id;
        if never(d) {
            assert_eq!(status(&t, &run).await, RunStatus::Suspended, "{what}");
            wakes_never(&t, &run).await;
            t.signal("go", &7u32).await.unwrap();
            assert_eq!(status(&t, &run).await, RunStatus::Suspended, "{what}");
            t.publish_event("ev", &serde_json::json!({"n": 8})).await.unwrap();
            t.assert_output(&run, (Some(7u32), Some(serde_json::json!({"n": 8})))).await;
        } else {
            assert_eq!(run_to_end(&t, &run).await, RunStatus::Completed, "{what}");
            t.assert_output(&run, (None::<u32>, None::<serde_json::Value>)).await;
        }
    }
}

#[tokio::test]
async fn step_timeouts_and_backoffs_of_every_length() {
    for (d, what) in durations() {
        // Every backoff above zero is durable here, so a waiting retry shows as a suspended run.
        let mut config = test_config();
        config.durable_retry_threshold = Duration::ZERO;
        let t = TestEngine::with_parts(std::sync::Arc::new(MemoryStore::new()), VirtualClock::default(), config);
        // A timeout bounds an attempt: huge ones never fire.
        t.register("timeout", 1, move |ctx: WorkflowCtx, _: ()| async move {
            let options = StepOptions { timeout: Some(d), ..Default::default() };
            Ok::<u32, WorkflowError>(ctx.step_with("s", options, |_| async { Ok(5u32) }).await?)
        });
        // A backoff delays a retry: huge ones park the run instead of retrying at once.
        t.register("backoff", 1, move |ctx: WorkflowCtx, _: ()| async move {
            let options = StepOptions::retries(2, Backoff::Fixed(d));
            let out = ctx
                .step_with("flaky", options, |s| async move {
                    if s.attempt() == 1 { Err(StepError::retryable("first attempt fails")) } else { Ok(s.attempt()) }
                })
                .await?;
            Ok::<u32, WorkflowError>(out)
        });
        // A zero timeout races the attempt against a deadline due at once: not asserted.
        if !d.is_zero() {
            let run = t.start("timeout", &(), id("t")).await.unwrap().id;
            t.assert_output(&run, 5u32).await;
        }
        let run = t.start("backoff", &(), id("b")).await.unwrap().id;
        if never(d) {
            assert_eq!(status(&t, &run).await, RunStatus::Suspended, "{what}");
            wakes_never(&t, &run).await;
        } else {
            assert_eq!(run_to_end(&t, &run).await, RunStatus::Completed, "{what}");
            t.assert_output(&run, 2u32).await;
        }
    }
}

#[tokio::test]
async fn execution_timeouts_client_waits_and_the_clock_accept_any_duration() {
    for (d, what) in durations() {
        let t = TestEngine::new();
        t.register_with("quick", 1, WorkflowOptions::execution_timeout(d), |ctx: WorkflowCtx, _: ()| async move {
            ctx.sleep(Duration::from_secs(60)).await;
            Ok::<_, WorkflowError>(1u32)
        });
        let run = t.start("quick", &(), id("q")).await.unwrap().id;
        assert_eq!(status(&t, &run).await, RunStatus::Suspended);
        // A huge timeout must not wrap into a small one: the poller leaves the run alone.
        t.poll_now();
        t.advance(Duration::from_secs(61));
        let outcome = t.wait_for_run(&run).await.unwrap();
        if d > Duration::from_secs(61) {
            assert_eq!(outcome.status(), RunStatus::Completed, "execution timeout {what}");
        }
        // A client wait of any length returns what is there (a zero one may time out first).
        if !d.is_zero() {
            assert_eq!(t.wait_for_run_timeout(&run, d).await.unwrap().run.id, run);
        }
        assert!(t.drain(d.max(Duration::from_millis(1))).await || d < Duration::from_secs(1));
        // Moving a virtual clock by any duration saturates instead of wrapping.
        let clock = VirtualClock::new(1_000);
        clock.advance(d);
        clock.advance(d);
        assert!(durable::Clock::now(&clock) >= 1_000);
    }
}

#[tokio::test]
async fn an_engine_configured_with_huge_durations_still_runs() {
    let mut config = test_config();
    config.lease_ttl = Duration::MAX;
    config.durable_retry_threshold = Duration::MAX;
    config.store_retry_backoff = Duration::MAX;
    config.recheck_interval = Duration::MAX;
    config.drain_timeout = Duration::MAX;
    let t = TestEngine::with_parts(std::sync::Arc::new(MemoryStore::new()), VirtualClock::default(), config);
    t.register("w", 1, |ctx: WorkflowCtx, _: ()| async move {
        let a: u32 = ctx
            .step_with("s", StepOptions::retries(1, Backoff::None), |s| async move {
                if s.attempt() == 1 { Err(StepError::retryable("again")) } else { Ok(3u32) }
            })
            .await?;
        ctx.sleep(Duration::from_secs(1)).await;
        Ok::<_, WorkflowError>(a)
    });
    let run = t.start("w", &(), id("huge-config")).await.unwrap().id;
    assert_eq!(run_to_end(&t, &run).await, RunStatus::Completed);
    t.assert_output(&run, 3u32).await;
    assert_eq!(t.config().lease_ttl, Duration::MAX);
}

// ---- payloads ----

const LIMIT: usize = 1024;

fn small_engine() -> TestEngine {
    let mut config = test_config();
    config.max_payload_bytes = LIMIT;
    TestEngine::with_parts(std::sync::Arc::new(MemoryStore::new()), VirtualClock::default(), config)
}

fn big() -> String {
    "x".repeat(LIMIT + 1)
}

#[tokio::test]
async fn oversized_payloads_from_callers_are_refused_and_nothing_is_written() {
    let t = small_engine();
    t.register("echo", 1, |ctx: WorkflowCtx, _: String| async move {
        let s: String = ctx.wait_for_signal("sig").await?;
        Ok::<_, WorkflowError>(s)
    });
    let too_large = |e: durable::Error| matches!(e, durable::Error::PayloadTooLarge { .. });
    assert!(too_large(t.start("echo", &big(), id("big-input")).await.unwrap_err()));
    assert!(t.get_run(&RunId::from("big-input")).await.unwrap().is_none(), "nothing persisted");
    let run = t.start("echo", &"ok".to_string(), id("e")).await.unwrap().id;
    assert!(too_large(t.signal("sig", &big()).await.unwrap_err()));
    assert!(too_large(t.publish_event("ev", &big()).await.unwrap_err()));
    assert!(too_large(t.update(&run, "u", &big()).await.unwrap_err()));
    assert!(too_large(t.complete_task(&run, "task", &big()).await.unwrap_err()));
    assert_eq!(status(&t, &run).await, RunStatus::Suspended, "the run was not touched");
}

#[tokio::test]
async fn oversized_payloads_a_workflow_writes_fail_it_with_payload_too_large() {
    let t = small_engine();
    t.register("output", 1, |_: WorkflowCtx, _: ()| async move { Ok::<_, WorkflowError>(big()) });
    t.register("step", 1, |ctx: WorkflowCtx, _: ()| async move {
        Ok::<String, WorkflowError>(ctx.step("s", |_| async { Ok(big()) }).await?)
    });
    t.register("side", 1, |ctx: WorkflowCtx, _: ()| async move {
        Ok::<String, WorkflowError>(ctx.side_effect("v", big).await)
    });
    t.register("state", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.set_state("k", &big()).await;
        Ok::<_, WorkflowError>(())
    });
    t.register("next", 1, |ctx: WorkflowCtx, n: u32| async move {
        if n == 0 {
            return ctx.continue_as_new::<_, ()>(&big()).await;
        }
        Ok::<_, WorkflowError>(())
    });
    t.register("kid", 1, |_: WorkflowCtx, _: String| async move { Ok::<_, WorkflowError>(()) });
    t.register("parent", 1, |ctx: WorkflowCtx, _: ()| async move {
        let r: Result<(), _> = ctx.child("kid", &big()).await;
        Ok::<_, WorkflowError>(r.map_err(|e| e.error.and_then(|e| e.code)).err().flatten())
    });
    for wf in ["output", "step", "side", "state"] {
        let run = t.start(wf, &(), id(wf)).await.unwrap().id;
        t.assert_status(&run, RunStatus::Failed).await;
        let r = t.get_run(&run).await.unwrap().unwrap();
        let e = r.error.unwrap();
        assert_eq!(e.code(), Some(codes::PAYLOAD_TOO_LARGE), "{wf}: {e:?}");
        assert!(e.message.contains(wf) && e.message.contains("1024"), "{wf}: {}", e.message);
        assert!(r.output.is_none());
    }
    let run = t.start("next", &0u32, id("next")).await.unwrap().id;
    t.assert_status(&run, RunStatus::Failed).await;
    assert_eq!(error_code(&t, &run).await.as_deref(), Some(codes::PAYLOAD_TOO_LARGE));
    assert!(t.get_run(&RunId::from("next~1")).await.unwrap().is_none(), "no successor");
    let run = t.start("parent", &(), id("parent")).await.unwrap().id;
    t.assert_output(&run, Some(codes::CHILD_FAILED.to_string())).await;
    assert!(t.children(&run).await.unwrap().is_empty(), "no child created");
}

// ---- names ----

#[tokio::test]
async fn a_wait_on_an_empty_name_fails_its_run_at_once() {
    let t = TestEngine::new();
    let dispatched = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    t.register("signal", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.wait_for_signal("").await?;
        Ok::<_, WorkflowError>(v)
    });
    t.register("event", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.wait_for_event("", serde_json::json!({})).await?;
        Ok::<_, WorkflowError>(v)
    });
    t.register("update", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.on_update("").await?;
        Ok::<_, WorkflowError>(v)
    });
    let flag = dispatched.clone();
    t.register("task", 1, move |ctx: WorkflowCtx, _: ()| {
        let flag = flag.clone();
        async move {
            let v: u32 = ctx
                .task("", move |_| {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    async { Ok(()) }
                })
                .await?;
            Ok::<_, WorkflowError>(v)
        }
    });
    for wf in ["signal", "event", "update", "task"] {
        let run = t.start(wf, &(), id(wf)).await.unwrap().id;
        t.assert_status(&run, RunStatus::Failed).await;
        let e = t.get_run(&run).await.unwrap().unwrap().error.unwrap();
        assert_eq!(e.code(), Some(codes::INVALID_NAME), "{wf}: {e:?}");
        assert!(e.message.contains("seq"), "{}", e.message);
    }
    assert!(!dispatched.load(std::sync::atomic::Ordering::SeqCst), "a task nobody can complete is not handed out");
    // The sending side refuses the same names.
    assert!(matches!(t.signal("", &1).await, Err(durable::Error::InvalidName { .. })));
}

#[tokio::test]
async fn a_call_named_with_a_control_character_fails_its_run_before_it_runs() {
    let t = TestEngine::new();
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    t.register("nul_step", 1, move |ctx: WorkflowCtx, _: ()| {
        let flag = flag.clone();
        async move {
            let v: u32 = ctx
                .step("st\0ep", move |_| {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    async { Ok(1) }
                })
                .await?;
            Ok::<_, WorkflowError>(v)
        }
    });
    t.register("nul_wait", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.wait_for_signal("bad\0tok").await?;
        Ok::<_, WorkflowError>(v)
    });
    for wf in ["nul_step", "nul_wait"] {
        let run = t.start(wf, &(), id(wf)).await.unwrap().id;
        t.assert_status(&run, RunStatus::Failed).await;
        let e = t.get_run(&run).await.unwrap().unwrap().error.unwrap();
        assert_eq!(e.code(), Some(codes::INVALID_NAME), "{wf}: {e:?}");
        assert!(e.message.contains("seq 0") && e.message.contains("control character"), "{wf}: {}", e.message);
        assert!(t.checkpoints(&run).await.is_empty(), "{wf}: nothing recorded");
    }
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "the step never ran");
}

#[tokio::test]
async fn signals_to_bad_or_reserved_tokens_are_refused_with_what_to_do() {
    let t = TestEngine::new();
    t.register("order", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u32 = ctx.on_update("set_quantity").await?;
        Ok::<_, WorkflowError>(v)
    });
    let run = t.start("order", &(), id("u1")).await.unwrap().id;
    t.wait_until_suspended_or_terminal(&run).await.unwrap();
    for token in [" ", "a\0b", "line\nbreak"] {
        let e = t.signal(token, &1).await.unwrap_err();
        assert!(matches!(&e, durable::Error::InvalidName { .. }), "{token:?}: {e}");
    }
    // The engine's own tokens: an update's (around its validator), a child's, a task's, a
    // remote step's result.
    for token in ["update:u1:set_quantity", "child:u1:0", "task:u1:review", "remote:u1:0"] {
        let e = t.signal(token, &100).await.unwrap_err();
        let message = e.to_string();
        assert!(matches!(&e, durable::Error::InvalidName { .. }), "{token}: {e}");
        assert!(message.contains(token) && message.contains("Engine::update"), "{message}");
        let e = t.signal_with_start("order", &(), id("u2"), token, &1).await.unwrap_err();
        assert!(matches!(&e, durable::Error::InvalidName { .. }), "{token}: {e}");
    }
    assert!(t.get_run(&RunId::from("u2")).await.unwrap().is_none(), "a refused signal_with_start starts nothing");
    assert_eq!(status(&t, &run).await, RunStatus::Suspended, "nothing reached the run");
    assert!(t.checkpoints(&run).await.iter().all(|c| c.status != durable::CheckpointStatus::Completed));
}

// ---- ids of runs the engine creates ----

#[tokio::test]
async fn retry_ids_and_continue_as_new_ids_never_collide() {
    let t = TestEngine::new();
    t.register("counter", 1, |ctx: WorkflowCtx, n: u32| async move {
        if n == 0 {
            return Err(WorkflowError::new("needs a start value"));
        }
        if n < 3 {
            return ctx.continue_as_new(&(n + 1)).await;
        }
        Ok::<_, WorkflowError>(n * 10)
    });
    let r1 = t.start("counter", &0u32, id("r1")).await.unwrap().id;
    t.assert_status(&r1, RunStatus::Failed).await;
    let first = t.retry_with_input(&r1, &1u32).await.unwrap().id;
    let second = t.retry_with_input(&r1, &2u32).await.unwrap().id;
    assert_eq!((first.as_str(), second.as_str()), ("r1~retry~1", "r1~retry~2"));
    // r1~retry~1 continues twice: its successors are its own, never r1~retry~2.
    let out: u32 = t.wait_for_run_following(&first).await.unwrap().output().unwrap();
    assert_eq!(out, 30);
    let out: u32 = t.wait_for_run_following(&second).await.unwrap().output().unwrap();
    assert_eq!(out, 30);
    assert!(t.get_run(&RunId::from("r1~retry~1~1")).await.unwrap().is_some());
}

#[tokio::test]
async fn a_successor_or_child_id_held_by_an_unrelated_run_is_an_error_not_adopted() {
    let t = TestEngine::new();
    t.register("other", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.wait_for_signal::<()>("never").await?;
        Ok::<_, WorkflowError>(())
    });
    t.register("chain", 1, |ctx: WorkflowCtx, n: u32| async move {
        if n == 0 {
            return ctx.continue_as_new(&1u32).await;
        }
        Ok::<_, WorkflowError>(n)
    });
    t.register("kid", 1, |_: WorkflowCtx, _: ()| async move { Ok::<_, WorkflowError>(1u32) });
    t.register("parent", 1, |ctx: WorkflowCtx, _: ()| async move {
        let r: Result<u32, _> = ctx.child_with("kid", &(), ChildOptions::id("taken")).await;
        Ok::<_, WorkflowError>(r.map_err(|e| e.error.and_then(|e| e.code)).err().flatten())
    });
    // An unrelated run already holds the successor id `x~1`.
    t.start("other", &(), id("x~1")).await.unwrap();
    let x = t.start("chain", &0u32, id("x")).await.unwrap().id;
    t.assert_status(&x, RunStatus::Failed).await;
    let e = t.get_run(&x).await.unwrap().unwrap().error.unwrap();
    assert_eq!(e.code(), Some(codes::ID_TAKEN));
    assert!(e.message.contains("x~1"), "{}", e.message);
    let other = t.get_run(&RunId::from("x~1")).await.unwrap().unwrap();
    assert_eq!((other.workflow.as_str(), other.status), ("other", RunStatus::Suspended), "left alone");
    // A child id held by an unrelated run: the child call fails; the run is not adopted.
    t.start("other", &(), id("taken")).await.unwrap();
    let p = t.start("parent", &(), id("p")).await.unwrap().id;
    t.assert_output(&p, Some(codes::CHILD_FAILED.to_string())).await;
    let taken = t.get_run(&RunId::from("taken")).await.unwrap().unwrap();
    assert!(taken.parent.is_none());
    assert!(t.children(&p).await.unwrap().is_empty());
}
