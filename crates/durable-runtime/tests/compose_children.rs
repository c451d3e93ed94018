//! Acceptance (composition): child runs and fan-out — on memory and SQLite.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use durable_conformance::TestEngine;
use durable_core::{RunStatus, StepError};
use durable_runtime::{Cancel, ChildFailed, EngineEvent, StartOptions, WorkflowCtx, WorkflowError};
use parking_lot::Mutex;
use support::StoreFixture;
use tokio::sync::watch;

on_every_store!(
    a_parent_waits_on_a_sleeping_child_across_a_restart,
    failed_cancelled_and_dead_children_surface_in_the_parent,
    a_fan_out_of_200_children_resumes_without_starting_any_twice,
    a_run_given_a_deleted_parents_id_waits_for_its_own_child,
);

fn register_family(t: &TestEngine) {
    t.register("nap", 1, |ctx: WorkflowCtx, minutes: u64| async move {
        ctx.sleep(Duration::from_secs(minutes * 60)).await;
        Ok::<_, WorkflowError>(minutes * 2)
    });
    t.register("parent", 1, |ctx: WorkflowCtx, minutes: u64| async move {
        let doubled: u64 = ctx.child("nap", &minutes).await?;
        Ok::<_, WorkflowError>(format!("child said {doubled}"))
    });
}

async fn a_parent_waits_on_a_sleeping_child_across_a_restart(s: StoreFixture) {
    let t = s.engine();
    register_family(&t);
    let parent = t.start("parent", &5u64, StartOptions::id("p")).await.unwrap();
    let child_id = parent.id.child(0);
    t.assert_settled_status(&parent.id, RunStatus::Suspended).await;
    t.assert_settled_status(&child_id, RunStatus::Suspended).await;
    let child = t.get_run(&child_id).await.unwrap().unwrap();
    assert_eq!(child.parent.as_ref().map(|p| (p.run_id.as_str(), p.seq)), Some(("p", 0)));

    let t = t.restart().await;
    register_family(&t);
    t.advance(Duration::from_secs(300));
    t.assert_output(&child_id, 10u64).await;
    t.assert_output(&parent.id, "child said 10".to_string()).await;
    assert_eq!(t.children(&parent.id).await.unwrap().len(), 1);
    assert!(t.store().waiters(&parent.id).await.unwrap().is_empty());
}

/// Run ids are the callers' idempotency keys, so a deleted parent's id may be started again:
/// the new run's child answers it, not the result of the deleted run's cancelled child (its
/// wait is at the same seq, on the same token).
async fn a_run_given_a_deleted_parents_id_waits_for_its_own_child(s: StoreFixture) {
    let t = s.engine();
    register_family(&t);
    let parent = t.start("parent", &5u64, StartOptions::id("order-7")).await.unwrap();
    let child_id = parent.id.child(0);
    t.assert_settled_status(&parent.id, RunStatus::Suspended).await;
    t.assert_settled_status(&child_id, RunStatus::Suspended).await;
    t.cancel(&parent.id).await.unwrap();
    t.assert_settled_status(&child_id, RunStatus::Cancelled).await;
    assert_eq!(t.delete_run(&parent.id).await.unwrap(), 2);

    t.start("parent", &1u64, StartOptions::id("order-7")).await.unwrap();
    t.assert_settled_status(&parent.id, RunStatus::Suspended).await;
    t.assert_settled_status(&child_id, RunStatus::Suspended).await;
    t.advance(Duration::from_secs(60));
    t.assert_output(&parent.id, "child said 2".to_string()).await;
}

async fn failed_cancelled_and_dead_children_surface_in_the_parent(s: StoreFixture) {
    let mut config = durable_conformance::test_config();
    config.max_recovery_attempts = 0;
    let t = TestEngine::with_parts(s.store.clone(), durable_runtime::VirtualClock::starting_2026(), config);
    let register = |t: &TestEngine| {
        t.register("fails", 1, |ctx: WorkflowCtx, _: ()| async move {
            ctx.step("boom", |_| async { Err::<(), _>(StepError::fatal("child broke").with_code("broke")) }).await?;
            Ok::<_, WorkflowError>(())
        });
        t.register("waits", 1, |ctx: WorkflowCtx, _: ()| async move {
            let _: () = ctx.wait_for_signal("never").await?;
            Ok::<_, WorkflowError>(())
        });
        // Hangs inside a step forever: the engine running it is killed and recovery gives up.
        t.register("hangs", 1, |ctx: WorkflowCtx, _: ()| async move {
            ctx.step("hang", |_| async { std::future::pending::<Result<(), StepError>>().await }).await?;
            Ok::<_, WorkflowError>(())
        });
        t.register("family", 1, |ctx: WorkflowCtx, kind: String| async move {
            let outcome = match ctx.child::<_, ()>(&kind, &()).await {
                Ok(()) => "ok".to_string(),
                Err(ChildFailed { status, error, .. }) => {
                    format!("{status}: {}", error.map(|e| e.message).unwrap_or_default())
                }
            };
            Ok::<_, WorkflowError>(outcome)
        });
    };
    register(&t);
    let mut events = t.subscribe();
    let failed = t.start("family", "fails", StartOptions::id("f")).await.unwrap();
    let cancelled = t.start("family", "waits", StartOptions::id("c")).await.unwrap();
    let dead = t.start("family", "hangs", StartOptions::id("d")).await.unwrap();

    let out: String = t.wait_for_run(&failed.id).await.unwrap().output().unwrap();
    assert!(out.starts_with("failed:") && out.contains("child broke"), "{out}");

    // The child exists once its parent parked on it.
    t.assert_settled_status(&cancelled.id, RunStatus::Suspended).await;
    t.assert_settled_status(&cancelled.id.child(0), RunStatus::Suspended).await;
    assert_eq!(t.cancel_with(&cancelled.id.child(0), Cancel::Abandon).await.unwrap(), RunStatus::Cancelled);
    let out: String = t.wait_for_run(&cancelled.id).await.unwrap().output().unwrap();
    assert!(out.starts_with("cancelled:"), "{out}");

    // Kill the engine while the child hangs in its step; the next engine recovers it once its
    // lease expired, finds it over the recovery limit, and dead-letters it.
    loop {
        if let EngineEvent::TurnStarted { run_id, .. } = events.recv().await.unwrap()
            && run_id == dead.id.child(0)
        {
            break;
        }
    }
    let t = t.crash();
    register(&t);
    t.advance(Duration::from_secs(31));
    t.assert_status(&dead.id.child(0), RunStatus::Dead).await;
    let out: String = t.wait_for_run(&dead.id).await.unwrap().output().unwrap();
    assert!(out.starts_with("dead:") && out.contains("recovered"), "{out}");
}

fn register_fan_out(t: &TestEngine, starts: &Arc<Mutex<BTreeMap<String, u32>>>, gate: watch::Receiver<bool>) {
    let starts = starts.clone();
    t.register("square", 1, move |ctx: WorkflowCtx, n: u64| {
        let (starts, gate) = (starts.clone(), gate.clone());
        async move {
            let id = ctx.run_id().to_string();
            let sq: u64 = ctx
                .step("square", move |_| {
                    *starts.lock().entry(id.clone()).or_default() += 1;
                    let mut gate = gate.clone();
                    async move {
                        // Children from 100 on wait for the gate: the crash lands mid fan-out.
                        if n >= 100 {
                            let _ = gate.wait_for(|open| *open).await;
                        }
                        Ok(n * n)
                    }
                })
                .await?;
            Ok::<_, WorkflowError>(sq)
        }
    });
    t.register("fan_out", 1, |ctx: WorkflowCtx, n: u64| async move {
        let children: Vec<_> = (0..n).map(|i| ctx.child::<_, u64>("square", &i)).collect();
        let mut out = Vec::new();
        for (i, r) in ctx.all(children).await.into_iter().enumerate() {
            out.push(r.map_err(|e| WorkflowError::new(format!("branch {i}: {e}")))?);
        }
        Ok::<_, WorkflowError>(out)
    });
}

async fn a_fan_out_of_200_children_resumes_without_starting_any_twice(s: StoreFixture) {
    let starts = Arc::new(Mutex::new(BTreeMap::new()));
    let (_closed, gate) = watch::channel(false);
    let t = s.engine();
    register_fan_out(&t, &starts, gate);
    let mut events = t.subscribe();
    let parent = t.start("fan_out", &200u64, StartOptions::id("fan")).await.unwrap();
    let mut settled = 0;
    while settled < 100 {
        if let EngineEvent::RunSettled { .. } = events.recv().await.unwrap() {
            settled += 1;
        }
    }
    // Half the children are done; the other half are inside their step. Tear the engine down.
    let t = t.restart().await;
    // The interrupted steps never committed: they start once more on the new engine. Steps
    // that committed must not. Forget the interrupted starts.
    let seq_of = |id: &String| id.rsplit('.').next().and_then(|s| s.parse::<u64>().ok());
    starts.lock().retain(|id, _| seq_of(id).is_some_and(|seq| seq < 100));
    let (_open, gate) = watch::channel(true);
    register_fan_out(&t, &starts, gate);
    let out: Vec<u64> = t.wait_for_run(&parent.id).await.unwrap().output().unwrap();
    assert_eq!(out, (0..200u64).map(|i| i * i).collect::<Vec<_>>(), "outputs in input order");
    assert_eq!(t.children(&parent.id).await.unwrap().len(), 200);
    let starts = starts.lock();
    assert_eq!(starts.len(), 200, "every child ran");
    assert!(starts.values().all(|n| *n == 1), "a child step started twice: {starts:?}");
}
