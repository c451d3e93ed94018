//! Acceptance: runs stay pinned to the workflow version they started on.

use std::time::Duration;

use durable_conformance::TestEngine;
use durable_core::RunStatus;
use durable_runtime::{StartOptions, WorkflowCtx, WorkflowError};

const HOUR: Duration = Duration::from_secs(3600);

fn register_version(t: &TestEngine, version: u32) {
    t.register("greet", version, move |ctx: WorkflowCtx, name: String| async move {
        ctx.sleep(HOUR).await;
        let greeting = ctx
            .step("compose", move |_| {
                let name = name.clone();
                async move { Ok(format!("v{version}: hello {name}")) }
            })
            .await?;
        Ok::<_, WorkflowError>(greeting)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumes_on_the_version_it_started_on() {
    let t = TestEngine::new();
    register_version(&t, 1);
    let old = t.start("greet", &"ada", StartOptions::id("old")).await.unwrap();
    assert_eq!(old.run.version, 1);
    t.assert_settled_status(&old.id, RunStatus::Suspended).await;

    register_version(&t, 2);
    let new = t.start("greet", &"bob", StartOptions::id("new")).await.unwrap();
    assert_eq!(new.run.version, 2);
    t.assert_settled_status(&new.id, RunStatus::Suspended).await;
    t.advance(HOUR);
    t.assert_output(&old.id, "v1: hello ada".to_string()).await;
    t.assert_output(&new.id, "v2: hello bob".to_string()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_version_is_gone_is_left_untouched_with_a_clear_error() {
    let t = TestEngine::new();
    register_version(&t, 1);
    let orphan = t.start("greet", &"ada", StartOptions::id("v1-run")).await.unwrap();
    register_version(&t, 2);
    let fresh = t.start("greet", &"bob", StartOptions::id("v2-run")).await.unwrap();
    t.assert_settled_status(&orphan.id, RunStatus::Suspended).await;
    t.assert_settled_status(&fresh.id, RunStatus::Suspended).await;
    let history_before = t.checkpoints(&orphan.id).await;

    // A deploy that only has v2. Neither run has an in-memory timer on the new engine, so the
    // v2 run completing proves the due-timer poller looked at the store after the deadline —
    // and that same look passed over the v1 run.
    let t = t.restart().await;
    register_version(&t, 2);
    t.advance(HOUR);
    t.assert_output(&fresh.id, "v2: hello bob".to_string()).await;

    let run = t.get_run(&orphan.id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Suspended);
    let error = run.error.expect("a clear error explains why the run does not move");
    assert_eq!(error.code(), Some("version_not_registered"));
    assert!(error.message.contains("version 1") && error.message.contains("v1-run"), "{}", error.message);
    assert_eq!(t.checkpoints(&orphan.id).await, history_before);
    assert_eq!(t.store().get_run(&orphan.id).await.unwrap().unwrap().error, None, "nothing was written to the run");
}
