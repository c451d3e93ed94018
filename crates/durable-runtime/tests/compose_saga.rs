//! Acceptance (composition): sagas with durable compensation — on memory and SQLite.

mod support;

use std::sync::Arc;
use std::time::Duration;

use durable_conformance::{Counter, TestEngine};
use durable_core::{CheckpointStatus, RunStatus, StepError, StepKind};
use durable_runtime::{Cancel, EngineEvent, StartOptions, WorkflowCtx, WorkflowError};
use parking_lot::Mutex;
use support::StoreFixture;
use tokio::sync::watch;

on_every_store!(
    undos_run_in_reverse_exactly_once_across_a_restart,
    a_failing_undo_is_recorded_and_skipped,
    cancel_with_compensation_runs_the_undos_then_cancels,
);

#[derive(Clone, Default)]
struct Undos {
    done: Arc<Mutex<Vec<String>>>,
    runs: [Counter; 3],
}

/// Three bookings with undos; the fourth step fails. Undo of the middle booking waits for
/// `gate` before it finishes.
fn register_trip(t: &TestEngine, undos: &Undos, gate: watch::Receiver<bool>) {
    let undos = undos.clone();
    t.register("trip", 1, move |ctx: WorkflowCtx, _: ()| {
        let (undos, gate) = (undos.clone(), gate.clone());
        async move {
            for (i, what) in ["flight", "hotel", "car"].into_iter().enumerate() {
                let (undos, gate) = (undos.clone(), gate.clone());
                ctx.step(what, move |_| async move { Ok(format!("{what}-booking")) })
                    .compensate(move |booking: String| {
                        let (undos, mut gate) = (undos.clone(), gate.clone());
                        async move {
                            if i == 1 {
                                let _ = gate.wait_for(|open| *open).await;
                            }
                            undos.runs[i].bump();
                            undos.done.lock().push(booking);
                            Ok(())
                        }
                    })
                    .await?;
            }
            ctx.step("pay", |_| async { Err::<(), _>(StepError::fatal("card declined").with_code("declined")) })
                .await?;
            Ok::<_, WorkflowError>(())
        }
    });
}

async fn undos_run_in_reverse_exactly_once_across_a_restart(s: StoreFixture) {
    let undos = Undos::default();
    let (_closed, gate) = watch::channel(false);
    let t = s.engine();
    register_trip(&t, &undos, gate);
    let mut events = t.subscribe();
    let run = t.start("trip", &(), StartOptions::id("trip")).await.unwrap();
    // The car's undo commits; the hotel's is in progress: tear the engine down.
    loop {
        if let EngineEvent::StepCompleted { name, .. } = events.recv().await.unwrap()
            && name == "undo:car"
        {
            break;
        }
    }
    let t = t.restart().await;
    let (_open, gate) = watch::channel(true);
    register_trip(&t, &undos, gate);
    let outcome = t.wait_for_run(&run.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    assert_eq!(outcome.error().unwrap().code(), Some("declined"), "the run carries the original error");
    assert_eq!(*undos.done.lock(), ["car-booking", "hotel-booking", "flight-booking"]);
    for (i, c) in undos.runs.iter().enumerate() {
        assert_eq!(c.get(), 1, "undo {i} ran {} times", c.get());
    }
    let history = t.checkpoints(&run.id).await;
    let tail: Vec<(&str, StepKind, CheckpointStatus)> =
        history.iter().skip(3).map(|c| (c.name.as_str(), c.kind, c.status)).collect();
    assert_eq!(
        tail,
        [
            ("pay", StepKind::Step, CheckpointStatus::Failed),
            ("undo:car", StepKind::Compensation, CheckpointStatus::Completed),
            ("undo:hotel", StepKind::Compensation, CheckpointStatus::Completed),
            ("undo:flight", StepKind::Compensation, CheckpointStatus::Completed),
        ]
    );
}

async fn a_failing_undo_is_recorded_and_skipped(s: StoreFixture) {
    let t = s.engine();
    let undone = Counter::new();
    let u = undone.clone();
    t.register("brittle", 1, move |ctx: WorkflowCtx, _: ()| {
        let u = u.clone();
        async move {
            let u2 = u.clone();
            ctx.step("a", |_| async { Ok(1u32) })
                .compensate(move |_| {
                    let u = u2.clone();
                    async move {
                        u.bump();
                        Ok(())
                    }
                })
                .await?;
            ctx.step("b", |_| async { Ok(2u32) })
                .compensate(|_| async { Err(StepError::fatal("refund API gone")) })
                .await?;
            ctx.step("c", |_| async { Err::<u32, _>(StepError::fatal("boom")) }).await?;
            Ok::<_, WorkflowError>(())
        }
    });
    let run = t.start("brittle", &(), StartOptions::id("brittle")).await.unwrap();
    let outcome = t.wait_for_run(&run.id).await.unwrap();
    assert_eq!(outcome.status(), RunStatus::Failed);
    assert!(outcome.error().unwrap().message.contains("boom"));
    assert_eq!(undone.get(), 1, "the undo after the failing one still ran");
    let history = t.checkpoints(&run.id).await;
    let undo_b = history.iter().find(|c| c.name == "undo:b").unwrap();
    assert_eq!(undo_b.status, CheckpointStatus::Failed);
    assert!(undo_b.error.as_ref().unwrap().message.contains("refund API gone"));
}

async fn cancel_with_compensation_runs_the_undos_then_cancels(s: StoreFixture) {
    let t = s.engine();
    let undone = Arc::new(Mutex::new(Vec::new()));
    let u = undone.clone();
    t.register("booking", 1, move |ctx: WorkflowCtx, _: ()| {
        let u = u.clone();
        async move {
            for what in ["flight", "hotel"] {
                let u = u.clone();
                ctx.step(what, move |_| async move { Ok(what.to_string()) })
                    .compensate(move |b: String| {
                        let u = u.clone();
                        async move {
                            u.lock().push(b);
                            Ok(())
                        }
                    })
                    .await?;
            }
            ctx.sleep(Duration::from_secs(86_400)).await;
            ctx.step("never", |_| async { Ok(()) }).await?;
            Ok::<_, WorkflowError>(())
        }
    });
    let run = t.start("booking", &(), StartOptions::id("booking")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    assert_eq!(t.cancel_with(&run.id, Cancel::Compensate).await.unwrap(), RunStatus::Suspended);
    t.assert_status(&run.id, RunStatus::Cancelled).await;
    assert_eq!(*undone.lock(), ["hotel", "flight"]);
    assert!(t.step_names(&run.id).await.iter().all(|n| n != "never"));
    // Cancelling again reports the terminal status and changes nothing.
    assert_eq!(t.cancel(&run.id).await.unwrap(), RunStatus::Cancelled);
}
