//! Acceptance (composition): cancellation trees, continue-as-new, retry and delete — on
//! memory and SQLite.

mod support;

use std::time::Duration;

use durable_conformance::{Counter, FailFirst, TestEngine};
use durable_core::{RunStatus, StepError};
use durable_runtime::{StartOptions, WorkflowCtx, WorkflowError};
use support::StoreFixture;

on_every_store!(
    cancelling_a_parent_cancels_three_levels,
    continue_as_new_fifty_times_keeps_histories_small,
    retry_reruns_only_the_failed_step_and_what_follows,
    retry_with_input_and_delete_leave_the_rest_alone,
    deleting_an_active_child_tells_its_parent,
);

fn register_tree(t: &TestEngine) {
    t.register("level", 1, |ctx: WorkflowCtx, depth: u32| async move {
        if depth > 0 {
            let _: () = ctx.child("level", &(depth - 1)).await?;
        } else {
            let _: () = ctx.wait_for_signal("forever").await?;
        }
        Ok::<_, WorkflowError>(())
    });
}

async fn cancelling_a_parent_cancels_three_levels(s: StoreFixture) {
    let t = s.engine();
    register_tree(&t);
    let root = t.start("level", &2u32, StartOptions::id("root")).await.unwrap();
    let child = root.id.child(0);
    let grandchild = child.child(0);
    for id in [&root.id, &child, &grandchild] {
        t.assert_settled_status(id, RunStatus::Suspended).await;
    }
    assert_eq!(t.cancel(&root.id).await.unwrap(), RunStatus::Cancelled);
    for id in [&root.id, &child, &grandchild] {
        t.assert_status(id, RunStatus::Cancelled).await;
        assert!(t.store().waiters(id).await.unwrap().is_empty(), "{id} kept a waiter");
    }

    t.register("quick", 1, |_: WorkflowCtx, _: ()| async { Ok::<_, WorkflowError>(7u32) });
    let done = t.start("quick", &(), StartOptions::id("done")).await.unwrap();
    t.assert_output(&done.id, 7u32).await;
    let before = t.get_run(&done.id).await.unwrap();
    assert_eq!(t.cancel(&done.id).await.unwrap(), RunStatus::Completed);
    assert_eq!(t.get_run(&done.id).await.unwrap(), before, "cancelling a completed run changed it");
}

async fn continue_as_new_fifty_times_keeps_histories_small(s: StoreFixture) {
    let t = s.engine();
    t.register("counter", 1, |ctx: WorkflowCtx, n: u32| async move {
        let next: u32 = ctx.step("bump", move |_| async move { Ok(n + 1) }).await?;
        if next < 50 {
            return ctx.continue_as_new(&next).await;
        }
        Ok::<_, WorkflowError>(next)
    });
    let first = t.start("counter", &0u32, StartOptions::id("count").tag("chain")).await.unwrap();
    let outcome = t.wait_for_run_following(&first.id).await.unwrap();
    assert_eq!(outcome.output::<u32>().unwrap(), 50);
    assert_eq!(outcome.run.id.as_str(), "count~49");
    assert_eq!(outcome.run.tags, ["chain"]);
    // The first run's own outcome names its successor, and asking it for a u32 says so.
    let err = t.wait_for_run(&first.id).await.unwrap().output::<u32>().unwrap_err();
    assert!(
        matches!(&err, durable_runtime::Error::ContinuedAsNew { id, successor } if *id == first.id && successor.as_str() == "count~1"),
        "{err}"
    );
    assert!(err.to_string().contains("wait_for_run_following"), "{err}");
    for n in [0, 1, 25, 49] {
        let id = if n == 0 { first.id.clone() } else { format!("count~{n}").into() };
        assert_eq!(t.checkpoints(&id).await.len(), 1, "run {id} kept a long history");
    }
}

async fn retry_reruns_only_the_failed_step_and_what_follows(s: StoreFixture) {
    let t = s.engine();
    let (before, after) = (Counter::new(), Counter::new());
    let flaky = FailFirst::new(1);
    let (b, a, f) = (before.clone(), after.clone(), flaky.clone());
    t.register("fragile", 1, move |ctx: WorkflowCtx, _: ()| {
        let (b, a, f) = (b.clone(), a.clone(), f.clone());
        async move {
            ctx.step("before", move |_| {
                b.bump();
                async { Ok(()) }
            })
            .await?;
            let n: u32 = ctx
                .step("flaky", move |_| {
                    let r = f.call().map_err(|e| StepError::fatal(e.message));
                    async move { r }
                })
                .await?;
            ctx.step("after", move |_| {
                a.bump();
                async { Ok(()) }
            })
            .await?;
            Ok::<_, WorkflowError>(n)
        }
    });
    let run = t.start("fragile", &(), StartOptions::id("fragile")).await.unwrap();
    t.assert_status(&run.id, RunStatus::Failed).await;
    assert_eq!(t.retry(&run.id).await.unwrap(), RunStatus::Pending);
    t.assert_output(&run.id, 2u32).await;
    assert_eq!((before.get(), flaky.calls(), after.get()), (1, 2, 1));
    t.assert_attempts(&run.id, "flaky", 1).await;
    assert!(t.retry(&run.id).await.is_err(), "a completed run cannot be retried");
}

async fn retry_with_input_and_delete_leave_the_rest_alone(s: StoreFixture) {
    let t = s.engine();
    t.register("half", 1, |ctx: WorkflowCtx, n: i64| async move {
        if n % 2 != 0 {
            return Err(WorkflowError::new(format!("{n} is odd")));
        }
        if n > 100 {
            let _: i64 = ctx.child("half", &(n / 2)).await?;
        }
        ctx.sleep(Duration::from_secs(1)).await;
        Ok::<_, WorkflowError>(n / 2)
    });
    let odd = t.start("half", &3i64, StartOptions::id("odd")).await.unwrap();
    t.assert_status(&odd.id, RunStatus::Failed).await;
    let original = t.get_run(&odd.id).await.unwrap();
    let again = t.retry_with_input(&odd.id, &4i64).await.unwrap();
    assert_eq!(again.id.as_str(), "odd~retry~1");
    t.assert_settled_status(&again.id, RunStatus::Suspended).await;
    t.advance(Duration::from_secs(1));
    t.assert_output(&again.id, 2i64).await;
    assert_eq!(t.get_run(&odd.id).await.unwrap(), original, "the original run was touched");

    let tree = t.start("half", &400i64, StartOptions::id("tree")).await.unwrap();
    let keep = t.start("half", &6i64, StartOptions::id("keep")).await.unwrap();
    // Each level exists once its parent parked (the parent's suspension creates it).
    for id in [&tree.id, &tree.id.child(0), &tree.id.child(0).child(0)] {
        t.assert_settled_status(id, RunStatus::Suspended).await;
    }
    assert_eq!(t.delete_run(&tree.id).await.unwrap(), 3);
    for id in [&tree.id, &tree.id.child(0), &tree.id.child(0).child(0)] {
        assert!(t.get_run(id).await.unwrap().is_none());
        assert!(t.checkpoints(id).await.is_empty());
    }
    assert!(t.get_run(&keep.id).await.unwrap().is_some());
    assert!(t.get_run(&odd.id).await.unwrap().is_some());
    assert_eq!(t.delete_run(&tree.id).await.unwrap(), 0);
}

async fn deleting_an_active_child_tells_its_parent(s: StoreFixture) {
    let t = s.engine();
    register_tree(&t);
    t.register("watch", 1, |ctx: WorkflowCtx, _: ()| async move {
        let outcome: Result<(), _> = ctx.child("level", &0u32).await;
        Ok::<_, WorkflowError>(outcome.map_err(|e| e.to_string()).err())
    });
    let parent = t.start("watch", &(), StartOptions::id("watch")).await.unwrap();
    let child = parent.id.child(0);
    // The child exists once its parent parked (the parent's suspension creates it).
    for id in [&parent.id, &child] {
        t.assert_settled_status(id, RunStatus::Suspended).await;
    }
    assert_eq!(t.delete_run(&child).await.unwrap(), 1);
    assert!(t.get_run(&child).await.unwrap().is_none());
    // The parent hears of it as of a cancel, naming the deletion, instead of waiting forever.
    let settled = tokio::time::timeout(Duration::from_secs(30), t.wait_for_run(&parent.id)).await;
    let said: Option<String> = settled.expect("the parent settles").unwrap().output().unwrap();
    let said = said.expect("the child's call failed");
    assert!(said.contains("was deleted by an operator"), "{said}");
}
