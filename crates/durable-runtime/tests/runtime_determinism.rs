//! Acceptance: non-determinism is detected; `patched` lets new code branch safely, and
//! `deprecate_patch` retires the branch.

use std::time::Duration;

use durable_conformance::{Counter, TestEngine};
use durable_core::{RunId, RunStatus, StepKind, codes};
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

/// Code that makes fewer calls than history recorded, then returns: the run fails with
/// `non_determinism` naming the first recorded call it never asked for, and does not complete
/// (nor consume the signal its old code waited for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_without_the_calls_history_recorded_fails_the_run_loudly() {
    let t = TestEngine::new();
    t.register("shrinks", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.step("a", |_| async { Ok(1) }).await?;
        ctx.step("b", |_| async { Ok(2) }).await?;
        let go: u32 = ctx.wait_for_signal("go").await?;
        Ok::<_, WorkflowError>(go)
    });
    let run = t.start("shrinks", &(), StartOptions::id("shrunk")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;

    let t = t.restart().await;
    t.register("shrinks", 1, |ctx: WorkflowCtx, _: ()| async move {
        let a: u32 = ctx.step("a", |_| async { Ok(1) }).await?;
        Ok::<_, WorkflowError>(a)
    });
    t.engine().signal("go", &7u32).await.unwrap();
    let outcome = t.wait_for_run(&run.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    let error = outcome.error().unwrap();
    assert_eq!(error.code(), Some(codes::NON_DETERMINISM));
    for needle in ["shrunk", "seq 1", "step \"b\"", "ctx.patched"] {
        assert!(error.message.contains(needle), "{needle:?} missing in: {}", error.message);
    }
    t.assert_step_names(&run.id, &["a", "b"]).await;
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

/// The three stages of a patch's life. A pure change (`+vat`) is guarded, so a run that passed
/// the patch before it existed still lines up after it.
#[derive(Clone, Copy)]
enum Stage {
    /// Before the patch.
    Unpatched,
    /// `if ctx.patched("vat") { .. }`.
    Patched,
    /// `ctx.deprecate_patch("vat")`, the old branch deleted.
    Deprecated,
}

fn register_vat(t: &TestEngine, stage: Stage, ran: &Counter) {
    let ran = ran.clone();
    t.register("vat", 1, move |ctx: WorkflowCtx, _: ()| {
        let ran = ran.clone();
        async move {
            let step = |name: &'static str| {
                let ran = ran.clone();
                ctx.step(name, move |_| {
                    ran.bump();
                    async move { Ok(name.to_string()) }
                })
            };
            let mut path = vec![step("a").await?];
            let vat = match stage {
                Stage::Unpatched => false,
                Stage::Patched => ctx.patched("vat"),
                Stage::Deprecated => {
                    ctx.deprecate_patch("vat");
                    true
                }
            };
            path.push(step("b").await?);
            let _: () = ctx.wait_for_signal(&format!("go:{}", ctx.run_id())).await?;
            path.push(step("c").await?);
            if vat {
                path.push("vat".into());
            }
            Ok::<_, WorkflowError>(path.join(","))
        }
    });
}

fn kinds(history: &[durable_core::Checkpoint]) -> Vec<(String, StepKind)> {
    history.iter().map(|c| (c.name.clone(), c.kind)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprecate_patch_replays_runs_with_and_without_the_marker_and_still_records_it() {
    let ran = Counter::new();
    let t = TestEngine::new();
    register_vat(&t, Stage::Unpatched, &ran);
    let before = t.start("vat", &(), StartOptions::id("before")).await.unwrap().id;
    t.assert_settled_status(&before, RunStatus::Suspended).await;

    let t = t.restart().await;
    register_vat(&t, Stage::Patched, &ran);
    let patched = t.start("vat", &(), StartOptions::id("patched")).await.unwrap().id;
    t.assert_settled_status(&patched, RunStatus::Suspended).await;

    let t = t.restart().await;
    register_vat(&t, Stage::Deprecated, &ran);
    let deprecated = t.start("vat", &(), StartOptions::id("deprecated")).await.unwrap().id;
    t.assert_settled_status(&deprecated, RunStatus::Suspended).await;
    assert_eq!(ran.get(), 6, "a and b once per run");

    for id in [&before, &patched, &deprecated] {
        t.signal(&format!("go:{id}"), &()).await.unwrap();
        t.assert_output(id, "a,b,c,vat".to_string()).await;
    }
    assert_eq!(ran.get(), 9, "only c ran after the signals: nothing replayed ran again");
    let step = |name: &str| (name.to_string(), StepKind::Step);
    let go = |id: &RunId| (format!("go:{id}"), StepKind::Signal);
    let marker = ("vat".to_string(), StepKind::Patch);
    // A run that passed the patch before it existed carried on without a seq for it.
    assert_eq!(kinds(&t.checkpoints(&before).await), [step("a"), step("b"), go(&before), step("c")]);
    // A run with the marker consumed it; a new run still recorded it.
    for id in [&patched, &deprecated] {
        assert_eq!(kinds(&t.checkpoints(id).await), [step("a"), marker.clone(), step("b"), go(id), step("c")]);
    }

    // Rolled back to the code that still branches on the patch: a run the deprecated code
    // started takes the new path.
    let rolled = t.start("vat", &(), StartOptions::id("rolled-back")).await.unwrap().id;
    t.assert_settled_status(&rolled, RunStatus::Suspended).await;
    let t = t.restart().await;
    register_vat(&t, Stage::Patched, &ran);
    t.signal("go:rolled-back", &()).await.unwrap();
    t.assert_output(&rolled, "a,b,c,vat".to_string()).await;
}
