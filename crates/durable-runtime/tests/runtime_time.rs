//! Acceptance: durable sleeps under the virtual clock.

mod support;

use std::time::Duration;

use durable_conformance::TestEngine;
use durable_core::{RunPatch, RunStatus};
use durable_runtime::{Clock, StartOptions, WorkflowCtx, WorkflowError};

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thirty_day_sleep_completes_under_the_virtual_clock() {
    let t = TestEngine::new();
    t.register("month", 1, move |ctx: WorkflowCtx, _: ()| async move {
        let before: u64 = ctx.step("before", |_| async { Ok(1) }).await?;
        ctx.sleep(30 * DAY).await;
        let after: u64 = ctx.step("after", |_| async { Ok(2) }).await?;
        Ok::<_, WorkflowError>(before + after)
    });
    let start = t.clock().now();
    let run = t.start("month", &(), StartOptions::id("month")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    let wake_at = start + 30 * 86_400_000;
    assert_eq!(t.get_run(&run.id).await.unwrap().unwrap().wake_at, Some(wake_at));
    let sleep = &t.checkpoints(&run.id).await[1];
    assert_eq!((sleep.name.as_str(), sleep.wake_at), ("sleep", Some(wake_at)));

    // Resuming early (the run is made to look due on day 10) re-suspends on the recorded time.
    t.advance(10 * DAY);
    let now = t.clock().now();
    let patch = RunPatch { wake_at: Some(Some(now)), now, ..Default::default() };
    assert!(t.store().update_run_if(&run.id, &[RunStatus::Suspended], patch).await.unwrap());
    let mut events = t.subscribe();
    t.poll_now();
    support::turn_started(&mut events, &run.id).await;
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    let parked = t.get_run(&run.id).await.unwrap().unwrap();
    assert_eq!(parked.wake_at, Some(wake_at), "an early turn must re-park on the recorded wake time");

    t.advance(20 * DAY);
    t.assert_output(&run.id, 3u64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_until_a_past_time_does_not_suspend() {
    let t = TestEngine::new();
    t.register("past", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.sleep_until(std::time::UNIX_EPOCH).await;
        ctx.sleep(Duration::ZERO).await;
        Ok::<_, WorkflowError>("ok")
    });
    let run = t.start("past", &(), StartOptions::id("past")).await.unwrap();
    t.assert_output(&run.id, "ok".to_string()).await;
}
