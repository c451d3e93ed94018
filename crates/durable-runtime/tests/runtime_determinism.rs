//! Acceptance: non-determinism is detected; `patched` lets new code branch safely.

use std::time::Duration;

use durable_conformance::TestEngine;
use durable_core::{RunStatus, codes};
use durable_runtime::{StartOptions, WorkflowCtx, WorkflowError};

const HOUR: Duration = Duration::from_secs(3600);

fn register_two_steps(t: &TestEngine, swapped: bool) {
    t.register("two_steps", 1, move |ctx: WorkflowCtx, _: ()| async move {
        let (first, second) = if swapped { ("reserve", "charge") } else { ("charge", "reserve") };
        ctx.step(first, |_| async { Ok(()) }).await?;
        ctx.step(second, |_| async { Ok(()) }).await?;
        ctx.sleep(HOUR).await;
        Ok::<_, WorkflowError>(())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_two_steps_under_a_running_run_fails_it_loudly() {
    let t = TestEngine::new();
    register_two_steps(&t, false);
    let run = t.start("two_steps", &(), StartOptions::id("nd")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;

    let t = t.restart().await;
    register_two_steps(&t, true);
    t.advance(HOUR);
    let outcome = t.wait_for_run(&run.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    let error = outcome.error().unwrap();
    assert_eq!(error.code(), Some(codes::NON_DETERMINISM));
    for needle in ["seq 0", "\"reserve\"", "\"charge\"", "nd"] {
        assert!(error.message.contains(needle), "{needle:?} missing in: {}", error.message);
    }
    // The recorded history was not rewritten.
    t.assert_step_names(&run.id, &["charge", "reserve"]).await;
}

fn register_patchable(t: &TestEngine, with_patch: bool) {
    t.register("patchable", 1, move |ctx: WorkflowCtx, _: ()| async move {
        let mut path = vec!["a"];
        ctx.step("a", |_| async { Ok(()) }).await?;
        if with_patch && ctx.patched("audit") {
            ctx.step("audit", |_| async { Ok(()) }).await?;
            path.push("audit");
        }
        ctx.step("b", |_| async { Ok(()) }).await?;
        path.push("b");
        ctx.sleep(HOUR).await;
        ctx.step("c", |_| async { Ok(()) }).await?;
        path.push("c");
        Ok::<_, WorkflowError>(path.join(","))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patched_lets_new_code_branch_while_old_runs_keep_their_path() {
    let t = TestEngine::new();
    register_patchable(&t, false);
    let old = t.start("patchable", &(), StartOptions::id("old")).await.unwrap();
    t.assert_settled_status(&old.id, RunStatus::Suspended).await;

    let t = t.restart().await;
    register_patchable(&t, true);
    let new = t.start("patchable", &(), StartOptions::id("new")).await.unwrap();
    t.assert_settled_status(&new.id, RunStatus::Suspended).await;
    t.advance(HOUR);
    t.assert_output(&old.id, "a,b,c".to_string()).await;
    t.assert_output(&new.id, "a,audit,b,c".to_string()).await;
    t.assert_step_names(&old.id, &["a", "b", "c"]).await;
    t.assert_step_names(&new.id, &["a", "audit", "b", "c"]).await;
}
