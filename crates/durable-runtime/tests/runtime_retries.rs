//! Acceptance: retries, fatal errors, handled step errors and durable backoff.

use std::time::{Duration, Instant};

use durable_conformance::{FailFirst, TestEngine};
use durable_core::{Backoff, RunStatus, StepError};
use durable_runtime::{Clock, StartOptions, StepOptions, WorkflowCtx, WorkflowError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_step_is_retried_until_it_succeeds() {
    let t = TestEngine::new();
    let flaky = FailFirst::new(2);
    let f = flaky.clone();
    t.register("flaky", 1, move |ctx: WorkflowCtx, _: ()| {
        let f = f.clone();
        async move {
            let n: u32 = ctx
                .step_with("call", StepOptions::retries(3, Backoff::None), move |_| {
                    let r = f.call();
                    async move { r }
                })
                .await?;
            Ok::<_, WorkflowError>(n)
        }
    });
    let run = t.start("flaky", &(), StartOptions::id("flaky")).await.unwrap();
    t.assert_output(&run.id, 3u32).await;
    t.assert_attempts(&run.id, "call", 3).await;
    assert_eq!(flaky.calls(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_is_not_retried_and_fails_the_run_with_its_message_and_code() {
    let t = TestEngine::new();
    let calls = durable_conformance::Counter::new();
    let c = calls.clone();
    t.register("fatal", 1, move |ctx: WorkflowCtx, _: ()| {
        let c = c.clone();
        async move {
            ctx.step_with("charge", StepOptions::retries(5, Backoff::None), move |_| {
                c.bump();
                async { Err::<(), _>(StepError::fatal("card declined").with_code("declined")) }
            })
            .await?;
            Ok::<_, WorkflowError>(())
        }
    });
    let run = t.start("fatal", &(), StartOptions::id("fatal")).await.unwrap();
    let outcome = t.wait_for_run(&run.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    let error = outcome.error().unwrap();
    assert_eq!(error.code(), Some("declined"));
    assert!(error.message.contains("card declined"), "{}", error.message);
    assert_eq!(calls.get(), 1);
    t.assert_attempts(&run.id, "charge", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_that_handles_a_step_error_continues() {
    let t = TestEngine::new();
    t.register("handles", 1, |ctx: WorkflowCtx, _: ()| async move {
        let first = ctx.step("primary", |_| async { Err::<String, _>(StepError::fatal("primary down")) }).await;
        let used = match first {
            Ok(v) => v,
            Err(failed) => {
                assert_eq!(failed.name, "primary");
                ctx.step("fallback", |_| async { Ok("fallback".to_string()) }).await?
            }
        };
        Ok::<_, WorkflowError>(used)
    });
    let run = t.start("handles", &(), StartOptions::id("handles")).await.unwrap();
    t.assert_output(&run.id, "fallback".to_string()).await;
    t.assert_step_names(&run.id, &["primary", "fallback"]).await;
}

fn register_hourly_retry(t: &TestEngine, flaky: &FailFirst) {
    let f = flaky.clone();
    t.register("backoff", 1, move |ctx: WorkflowCtx, _: ()| {
        let f = f.clone();
        async move {
            let opts = StepOptions::retries(3, Backoff::Fixed(Duration::from_secs(3600)));
            let n: u32 = ctx
                .step_with("remote", opts, move |_| {
                    let r = f.call();
                    async move { r }
                })
                .await?;
            Ok::<_, WorkflowError>(n)
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_backoff_is_a_durable_wait() {
    let real = Instant::now();
    let t = TestEngine::new();
    let flaky = FailFirst::new(1);
    register_hourly_retry(&t, &flaky);
    let start = t.clock().now();
    let run = t.start("backoff", &(), StartOptions::id("backoff")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    let parked = t.get_run(&run.id).await.unwrap().unwrap();
    assert_eq!(parked.wake_at, Some(start + 3_600_000));
    assert_eq!(t.attempts(&run.id, "remote").await, 1);

    // Restarting between attempts neither resets nor repeats them.
    let t = t.restart().await;
    register_hourly_retry(&t, &flaky);
    t.advance(Duration::from_secs(3600));
    t.assert_output(&run.id, 2u32).await;
    t.assert_attempts(&run.id, "remote", 2).await;
    assert_eq!(flaky.calls(), 2);
    // An hour of backoff took (far) less than a minute of real time.
    assert!(real.elapsed() < Duration::from_secs(60));
}
