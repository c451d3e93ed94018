//! Acceptance (replay checks): a run's history is exported as a versioned document that
//! round-trips exactly, and `check_replay` / `assert_replayable` replay it against the current
//! code without executing or writing anything — passing when the code matches, failing with
//! the seq and both calls when it does not.

mod support;

use std::time::Duration;

use durable_conformance::replay::{assert_replayable, assert_replayable_dir, check_replayable};
use durable_conformance::{Counter, TestEngine};
use durable_core::{HistoryExport, ReplayMismatch, Replayed, RunEnd, RunId, RunStatus, StepKind, codes};
use durable_runtime::{Engine, EngineEvent, Error, ReplayError, StartOptions, WorkflowCtx, WorkflowError};
use serde_json::json;
use support::StoreFixture;

on_every_store!(
    an_export_round_trips_exactly_while_suspended_and_once_completed,
    checking_a_history_on_the_engine_that_holds_it_writes_and_emits_nothing,
    an_imported_run_continues_where_it_was_exported,
    an_imported_run_whose_remote_step_was_out_sends_it_again,
);

const HOUR: Duration = Duration::from_secs(3600);

/// A workflow using most primitives; every closure bumps `ran`.
fn register_tour(engine: &Engine, ran: &Counter) {
    let ran = ran.clone();
    engine.register("tour", 1, move |ctx: WorkflowCtx, n: u32| {
        let ran = ran.clone();
        async move {
            let r = ran.clone();
            let a: u32 = ctx
                .step("a", move |_| {
                    r.bump();
                    async move { Ok(n + 1) }
                })
                .await?;
            let r = ran.clone();
            let token: String = ctx
                .side_effect("token", move || {
                    r.bump();
                    "tok-1".to_string()
                })
                .await;
            let _id = ctx.uuid().await;
            ctx.set_state("progress", &json!({ "done": a, "of": 3 })).await;
            let paid: serde_json::Value = ctx.wait_for_event("paid", json!({ "order": n })).await?;
            ctx.sleep(HOUR).await;
            let go: String = ctx.wait_for_signal(&format!("go:{}", ctx.run_id())).await?;
            let r = ran.clone();
            let b: String = ctx
                .step("b", move |_| {
                    r.bump();
                    async { Ok("b".to_string()) }
                })
                .await?;
            Ok::<_, WorkflowError>(format!("{a} {token} {} {go} {b}", paid["amount"]))
        }
    });
}

/// An export of `run` while it is suspended. (A spare wake — a timer and a poller both finding
/// a run due — can run one more turn of a parked run, which replays and parks again.)
async fn export_parked(t: &TestEngine, run: &RunId) -> HistoryExport {
    loop {
        t.wait_until_suspended_or_terminal(run).await.unwrap();
        let export = t.export_history(run).await.unwrap();
        if export.run.status == RunStatus::Suspended {
            return export;
        }
    }
}

/// What a suspended run waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Parked {
    Timer,
    Delivery,
}

/// Waits until `run` suspends waiting for `what`. (Suspensions of another kind are skipped: a
/// spare wake can replay a parked run and park it again as it was.)
async fn parked_on(events: &mut tokio::sync::broadcast::Receiver<EngineEvent>, run: &RunId, what: Parked) {
    loop {
        if let EngineEvent::RunSuspended { run_id, wake_at } = events.recv().await.expect("events")
            && run_id == *run
            && (wake_at.is_some() == (what == Parked::Timer))
        {
            return;
        }
    }
}

fn assert_round_trips(export: &HistoryExport) {
    let json = export.to_json().unwrap();
    let back = HistoryExport::from_json(&json).unwrap();
    assert_eq!(&back, export, "the value read back differs");
    assert_eq!(back.to_json().unwrap(), json, "written again, the bytes differ");
}

async fn an_export_round_trips_exactly_while_suspended_and_once_completed(s: StoreFixture) {
    let t = s.engine();
    let ran = Counter::new();
    register_tour(&t, &ran);
    let id = t.start("tour", &7u32, StartOptions::id("tour-1")).await.unwrap().id;
    t.assert_settled_status(&id, RunStatus::Suspended).await;

    // Parked on the event: the export holds the run, its checkpoints, its waiter and its state.
    let parked = export_parked(&t, &id).await;
    assert_eq!(parked.format, 1);
    assert_eq!(parked.durable_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(parked.run, t.store().get_run(&id).await.unwrap().unwrap());
    assert_eq!(parked.checkpoints, t.checkpoints(&id).await);
    assert_eq!(parked.waiters, t.store().waiters(&id).await.unwrap());
    assert_eq!(parked.waiters.len(), 1, "the event wait");
    assert_eq!(parked.state["progress"].to_value(), json!({ "done": 8, "of": 3 }));
    assert_round_trips(&parked);

    let mut events = t.subscribe();
    t.publish_event("paid", &json!({ "order": 7, "amount": 12 })).await.unwrap();
    parked_on(&mut events, &id, Parked::Timer).await;
    t.advance(HOUR);
    parked_on(&mut events, &id, Parked::Delivery).await;
    t.signal("go:tour-1", &"yes").await.unwrap();
    t.assert_output(&id, "8 tok-1 12 yes b".to_string()).await;

    let done = t.export_history(&id).await.unwrap();
    assert_eq!(done.run.status, RunStatus::Completed);
    assert_eq!(done.checkpoints, t.checkpoints(&id).await);
    assert!(done.waiters.is_empty());
    assert_round_trips(&done);

    // Both replay against the code that wrote them, and nothing runs.
    let before = ran.get();
    assert_eq!(before, 3, "a, the side effect and b ran once each");
    let register = |e: &Engine| register_tour(e, &ran);
    assert_eq!(assert_replayable(register, &parked).await, Replayed::Parked { next_seq: 5 });
    assert_eq!(assert_replayable(register, &done).await, Replayed::Finished { status: RunStatus::Completed });
    assert_eq!(ran.get(), before, "the replay executed a closure");
    t.shutdown().await;
}

async fn checking_a_history_on_the_engine_that_holds_it_writes_and_emits_nothing(s: StoreFixture) {
    let t = s.engine();
    let ran = Counter::new();
    register_tour(&t, &ran);
    let id = t.start("tour", &1u32, StartOptions::id("tour-2")).await.unwrap().id;
    t.assert_settled_status(&id, RunStatus::Suspended).await;
    let export = t.export_history(&id).await.unwrap();

    // The code moved on: a call after the recorded ones. The replay stops there.
    // A client engine on the same store: it executes nothing, so only the check touches the run,
    // and any event on its bus would be the replay's (`t`'s own bus may still carry its turn's
    // events).
    let longer = Engine::builder().shared_store(s.second_handle()).client_only().build().unwrap();
    let mut events = longer.subscribe();
    longer.register("tour", 1, |ctx: WorkflowCtx, _: u32| async move {
        let _: u32 = ctx.step("a", |_| async { Ok(0) }).await?;
        let _: String = ctx.side_effect("token", || "never".to_string()).await;
        let _ = ctx.uuid().await;
        ctx.set_state("progress", &0).await;
        let _: serde_json::Value = ctx.wait_for_event("paid", json!({})).await?;
        Ok::<_, WorkflowError>(())
    });
    // Parked on the event: the code matches as far as the run went.
    assert_eq!(longer.check_replay(&export).await, Ok(Replayed::Parked { next_seq: 5 }));
    assert_eq!(t.check_replay(&export).await, Ok(Replayed::Parked { next_seq: 5 }));

    assert_eq!(ran.get(), 2, "only the first turn's step and side effect ran");
    assert_eq!(t.export_history(&id).await.unwrap(), export, "the replay wrote nothing");
    assert!(events.try_recv().is_err(), "the replay sent an event");
    longer.shutdown().await;
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporting_or_reading_an_unknown_run_is_run_not_found() {
    let t = TestEngine::new();
    let err = t.export_history(&RunId::from("nope")).await.unwrap_err();
    assert!(matches!(&err, Error::RunNotFound(id) if id.as_str() == "nope"), "{err:?}");
    assert_eq!(err.to_string(), "run nope not found");
    // So is reading its history: not an empty one, which a run with no checkpoint yet has.
    let err = t.history(&RunId::from("nope")).await.unwrap_err();
    assert!(matches!(&err, Error::RunNotFound(id) if id.as_str() == "nope"), "{err:?}");
    t.register("idle", 1, |_ctx: WorkflowCtx, _: ()| async { Ok::<_, WorkflowError>(()) });
    let later = StartOptions::id("fresh").delay(Duration::from_secs(3600));
    let run = t.start("idle", &(), later).await.unwrap();
    assert_eq!(t.history(&run.id).await.unwrap(), vec![], "started, not yet run");
}

/// Two steps in the given order, then a sleep; every closure bumps `ran`.
fn register_two_steps(engine: &Engine, ran: &Counter, swapped: bool) {
    let ran = ran.clone();
    engine.register("two_steps", 1, move |ctx: WorkflowCtx, _: ()| {
        let ran = ran.clone();
        async move {
            let (first, second) = if swapped { ("reserve", "charge") } else { ("charge", "reserve") };
            for name in [first, second] {
                let r = ran.clone();
                ctx.step(name, move |_| {
                    r.bump();
                    async { Ok(()) }
                })
                .await?;
            }
            ctx.sleep(HOUR).await;
            Ok::<_, WorkflowError>("done".to_string())
        }
    });
}

/// A recorded, completed run of `two_steps`.
async fn recorded_two_steps(ran: &Counter) -> HistoryExport {
    let t = TestEngine::new();
    register_two_steps(&t, ran, false);
    let id = t.start("two_steps", &(), StartOptions::id("order:42")).await.unwrap().id;
    t.assert_settled_status(&id, RunStatus::Suspended).await;
    t.advance(HOUR);
    t.assert_output(&id, "done".to_string()).await;
    let export = t.export_history(&id).await.unwrap();
    t.shutdown().await;
    export
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordering_two_steps_fails_naming_the_seq_and_both_calls() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    assert_eq!(ran.get(), 2);

    let err = check_replayable(|e: &Engine| register_two_steps(e, &ran, true), &history).await.unwrap_err();
    let ReplayError::Mismatch(ReplayMismatch::Call(nd)) = &err else { panic!("{err:?}") };
    assert_eq!((nd.run_id.as_str(), nd.seq), ("order:42", 0));
    assert_eq!(nd.expected, ("reserve".to_string(), StepKind::Step));
    assert_eq!(nd.recorded, ("charge".to_string(), StepKind::Step));

    // assert_replayable panics with the same message.
    let r = ran.clone();
    let panicked = tokio::spawn(async move {
        assert_replayable(move |e: &Engine| register_two_steps(e, &r, true), &history).await;
    })
    .await
    .unwrap_err()
    .into_panic();
    let message = panicked.downcast_ref::<String>().expect("a message");
    for part in [
        "the history does not replay against the current code: run order:42:",
        "seq 0",
        "the workflow code asked for step \"reserve\"",
        "history recorded step \"charge\"",
    ] {
        assert!(message.contains(part), "{part:?} is missing from: {message}");
    }
    assert_eq!(ran.get(), 2, "no closure ran during the replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_history_passes_without_running_a_closure() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let replayed = assert_replayable(|e: &Engine| register_two_steps(e, &ran, false), &history).await;
    assert_eq!(replayed, Replayed::Finished { status: RunStatus::Completed });
    assert_eq!(ran.get(), 2, "the steps ran when the run was recorded, never on replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_goes_further_replays_up_to_its_first_new_call() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let shipped = Counter::new();
    let register = |e: &Engine| {
        let shipped = shipped.clone();
        e.register("two_steps", 1, move |ctx: WorkflowCtx, _: ()| {
            let shipped = shipped.clone();
            async move {
                ctx.step("charge", |_| async { Ok(()) }).await?;
                ctx.step("reserve", |_| async { Ok(()) }).await?;
                ctx.sleep(HOUR).await;
                ctx.step("ship", move |_| {
                    shipped.bump();
                    async { Ok(()) }
                })
                .await?;
                Ok::<_, WorkflowError>("done".to_string())
            }
        });
    };
    let replayed = assert_replayable(register, &history).await;
    assert_eq!(replayed, Replayed::UpTo { seq: 3, name: "ship".into(), kind: StepKind::Step });
    assert_eq!(shipped.get(), 0, "the new step did not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_now_ends_otherwise_is_reported_with_both_ends() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let register = |e: &Engine| {
        e.register("two_steps", 1, |ctx: WorkflowCtx, _: ()| async move {
            ctx.step("charge", |_| async { Ok(()) }).await?;
            ctx.step("reserve", |_| async { Ok(()) }).await?;
            ctx.sleep(HOUR).await;
            Ok::<_, WorkflowError>("shipped".to_string())
        });
    };
    let err = check_replayable(register, &history).await.unwrap_err();
    let ReplayError::Mismatch(ReplayMismatch::End { recorded, replayed, .. }) = &err else { panic!("{err:?}") };
    assert_eq!(recorded.output.as_ref().map(|p| p.to_value()), Some(json!("done")));
    assert_eq!(
        replayed,
        &RunEnd {
            status: RunStatus::Completed,
            output: Some(durable_core::Payload::encode(&"shipped").unwrap()),
            error: None
        }
    );
    assert_eq!(
        err.to_string(),
        "run order:42: the recorded run ended completed with output \"done\", but the workflow code now ends it \
         completed with output \"shipped\""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_value_that_no_longer_decodes_fails_naming_the_seq() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let register = |e: &Engine| {
        e.register("two_steps", 1, |ctx: WorkflowCtx, _: ()| async move {
            // `charge` recorded `null`; the code now expects a number.
            let _: u64 = ctx.step("charge", |_| async { Ok(1) }).await?;
            Ok::<_, WorkflowError>("done".to_string())
        });
    };
    let err = check_replayable(register, &history).await.unwrap_err();
    let ReplayError::Mismatch(ReplayMismatch::Failed { error, .. }) = &err else { panic!("{err:?}") };
    assert_eq!(error.code(), Some(codes::BAD_PAYLOAD));
    let message = err.to_string();
    assert!(
        message.contains("run order:42") && message.contains("seq 0") && message.contains("\"charge\""),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_waiting_outside_the_ctx_is_reported_instead_of_hanging() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let register = |e: &Engine| {
        e.register("two_steps", 1, |ctx: WorkflowCtx, _: ()| async move {
            ctx.step("charge", |_| async { Ok(()) }).await?;
            std::future::pending::<()>().await;
            Ok::<_, WorkflowError>("done".to_string())
        });
    };
    let err = check_replayable(register, &history).await.unwrap_err();
    assert_eq!(
        err,
        ReplayError::Mismatch(ReplayMismatch::OutsideAwait { run_id: RunId::from("order:42"), next_seq: 1 })
    );
    assert!(err.to_string().contains("after seq 0"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_of_an_unregistered_version_says_what_to_register() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let register = |e: &Engine| {
        e.register("two_steps", 2, |_: WorkflowCtx, _: ()| async { Ok::<_, WorkflowError>(()) });
    };
    let err = check_replayable(register, &history).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "run order:42: workflow \"two_steps\" version 1 is not registered (registered versions: [2]); register the \
         code that runs it (engine.register(\"two_steps\", 1, ..)) before checking its history"
    );
}

async fn an_imported_run_continues_where_it_was_exported(s: StoreFixture) {
    // "Production": a run parked on its signal, and one that completed.
    let prod = TestEngine::new();
    let prod_ran = Counter::new();
    register_tour(&prod, &prod_ran);
    let parked_id = prod.start("tour", &3u32, StartOptions::id("tour-parked")).await.unwrap().id;
    let done_id = prod.start("tour", &4u32, StartOptions::id("tour-done")).await.unwrap().id;
    for id in [&parked_id, &done_id] {
        prod.assert_settled_status(id, RunStatus::Suspended).await;
    }
    let mut events = [prod.subscribe(), prod.subscribe()];
    prod.publish_event("paid", &json!({ "order": 3, "amount": 30 })).await.unwrap();
    prod.publish_event("paid", &json!({ "order": 4, "amount": 40 })).await.unwrap();
    for (events, id) in events.iter_mut().zip([&parked_id, &done_id]) {
        parked_on(events, id, Parked::Timer).await;
    }
    prod.advance(HOUR);
    for (events, id) in events.iter_mut().zip([&parked_id, &done_id]) {
        parked_on(events, id, Parked::Delivery).await;
    }
    prod.signal("go:tour-done", &"now").await.unwrap();
    prod.assert_output(&done_id, "5 tok-1 40 now b".to_string()).await;
    let parked = export_parked(&prod, &parked_id).await;
    let done = prod.export_history(&done_id).await.unwrap();
    prod.shutdown().await;

    // "Locally": imported as they were by a client engine, before any worker runs.
    let importer = Engine::builder().shared_store(s.store.clone()).client_only().build().unwrap();
    let run = importer.import_history(&done).await.unwrap();
    assert_eq!((run.status, &run.output), (RunStatus::Completed, &done.run.output));
    assert_eq!(importer.history(&done_id).await.unwrap(), done.checkpoints);
    let run = importer.import_history(&parked).await.unwrap();
    assert_eq!((run.status, run.wake_at, run.lease_owner), (RunStatus::Suspended, None, None));
    let imported = importer.export_history(&parked_id).await.unwrap();
    assert_eq!(
        (&imported.checkpoints, &imported.waiters, &imported.state),
        (&parked.checkpoints, &parked.waiters, &parked.state)
    );
    assert_eq!(
        importer.get_state::<serde_json::Value>(&parked_id, "progress").await.unwrap(),
        Some(json!({ "done": 4, "of": 3 }))
    );
    // The same id again is refused, naming the run.
    let err = importer.import_history(&done).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "could not import run tour-done: the store already holds a run with this id; delete it first"
    );
    importer.shutdown().await;

    // A local worker continues the parked run: only what follows the signal executes.
    let local = s.engine();
    let local_ran = Counter::new();
    register_tour(&local, &local_ran);
    local.signal("go:tour-parked", &"later").await.unwrap();
    local.assert_output(&parked_id, "4 tok-1 30 later b".to_string()).await;
    assert_eq!(local_ran.get(), 1, "only step b ran locally");
    assert_eq!(local.get_run(&done_id).await.unwrap().unwrap().output, done.run.output);
    // An engine that executes runs does not import: it could run one before its history lands.
    let mut other = done.clone();
    other.run.id = RunId::from("elsewhere");
    other.checkpoints.iter_mut().for_each(|c| c.run_id = RunId::from("elsewhere"));
    let err = local.import_history(&other).await.unwrap_err();
    assert!(matches!(&err, Error::Import { run_id, .. } if run_id.as_str() == "elsewhere"), "{err:?}");
    assert!(local.get_run(&other.run.id).await.unwrap().is_none(), "nothing was written");
    local.shutdown().await;
}

/// A run exported while its remote step's attempt was out (a task no worker answered) holds
/// no task in its export. Imported elsewhere, the attempt is recorded as re-dispatched and the
/// run made due: a worker of the new store gets the next attempt, and the run completes.
async fn an_imported_run_whose_remote_step_was_out_sends_it_again(s: StoreFixture) {
    let register = |t: &TestEngine| {
        t.register("charge", 1, |ctx: WorkflowCtx, n: u32| async move {
            let local: u32 = ctx.step("prepare", move |_| async move { Ok(n + 1) }).await?;
            let charged: u32 = ctx.remote_step("charge", &local).await?;
            Ok::<_, WorkflowError>(charged)
        });
    };
    // "Production": no worker serves `charge`, so the attempt stays out (the run suspends, and
    // may be marked `blocked` before the export reads it: both are imported the same way).
    let prod = TestEngine::new();
    register(&prod);
    let mut events = prod.subscribe();
    let id = prod.start("charge", &4u32, StartOptions::id("charge-1")).await.unwrap().id;
    let suspended = async {
        loop {
            if let EngineEvent::RunSuspended { run_id, .. } = events.recv().await.expect("events")
                && run_id == id
            {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), suspended).await.expect("a hang guard: the run suspends");
    let export = prod.export_history(&id).await.unwrap();
    assert!(matches!(export.run.status, RunStatus::Suspended | RunStatus::Blocked), "{:?}", export.run);
    prod.shutdown().await;
    let out = export.checkpoints.iter().find(|c| c.kind == StepKind::Remote).expect("the remote step's checkpoint");
    assert_eq!((out.seq, out.status, out.attempts), (1, durable_core::CheckpointStatus::Running, 1));
    assert_eq!(export.waiters.len(), 1, "the run waits for the step's result");

    // Imported: the attempt is ended as re-dispatched, its wait dropped, the run due now (on
    // the clock the local engine runs by).
    let clock = durable_runtime::VirtualClock::starting_2026();
    let importer = Engine::builder().shared_store(s.store.clone()).clock(clock.clone()).client_only().build().unwrap();
    let run = importer.import_history(&export).await.unwrap();
    assert_eq!(run.status, RunStatus::Suspended);
    assert!(run.wake_at.is_some_and(|at| at <= importer.clock().now()), "due now: {:?}", run.wake_at);
    let imported = importer.export_history(&id).await.unwrap();
    let cp = &imported.checkpoints[1];
    assert_eq!((cp.status, cp.attempts), (durable_core::CheckpointStatus::Waiting, 1));
    let error = cp.error.as_ref().expect("the ended attempt's error");
    assert_eq!(error.code(), Some(codes::REDISPATCH));
    assert!(error.message.contains("was out when run charge-1 was exported"), "{}", error.message);
    assert_eq!(imported.waiters, [], "no wait for a result that cannot come");
    // Exported while `blocked` (no worker had the capabilities): stored suspended, without the
    // reason it was blocked there (the blocked pass here judges it again).
    let mut blocked = export.clone();
    let other = RunId::from("charge-blocked");
    blocked.run.id = other.clone();
    blocked.run.status = RunStatus::Blocked;
    blocked.run.error = Some(durable_core::StepError::fatal("blocked: no compatible worker").with_code(codes::BLOCKED));
    blocked.checkpoints.iter_mut().for_each(|c| c.run_id = other.clone());
    blocked.waiters.iter_mut().for_each(|w| w.run_id = other.clone());
    let run = importer.import_history(&blocked).await.unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Suspended, None));
    importer.delete_run(&other).await.unwrap();
    importer.shutdown().await;

    // A worker of this store takes the next attempt; the local step is not run again.
    let local = TestEngine::with_parts(s.store.clone(), clock, durable_conformance::test_config());
    register(&local);
    let worker = durable_runtime::Worker::builder()
        .engine(local.engine())
        .handle("charge", |ctx, n: u32| async move { Ok::<_, durable_runtime::StepError>(n * 10 + ctx.attempt()) })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    let done = tokio::time::timeout(Duration::from_secs(30), local.wait_for_run(&id)).await.expect("a hang guard");
    assert_eq!(done.unwrap().output::<u32>().unwrap(), 52, "attempt 2 of charge(5)");
    let _ = stop.send(());
    running.await.unwrap();
    local.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_exports_is_checked_file_by_file_and_every_failure_is_listed() {
    let ran = Counter::new();
    let history = recorded_two_steps(&ran).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-good.json"), history.to_json().unwrap()).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not an export, and not a .json").unwrap();

    let r = ran.clone();
    let replayed = assert_replayable_dir(move |e: &Engine| register_two_steps(e, &r, false), dir.path()).await;
    assert_eq!(replayed, [(dir.path().join("a-good.json"), Replayed::Finished { status: RunStatus::Completed })]);

    // A file that does not load and a run that no longer replays: both named, in one panic.
    let mut newer = history.to_json().unwrap();
    newer = newer.replacen("\"format\": 1", "\"format\": 7", 1);
    std::fs::write(dir.path().join("b-newer.json"), newer).unwrap();
    let path = dir.path().to_path_buf();
    let r = ran.clone();
    let panicked = tokio::spawn(async move {
        assert_replayable_dir(move |e: &Engine| register_two_steps(e, &r, true), &path).await;
    })
    .await
    .unwrap_err()
    .into_panic();
    let message = panicked.downcast_ref::<String>().expect("a message");
    assert!(message.contains("a-good.json: run order:42: non-determinism at seq 0"), "{message}");
    assert!(message.contains("b-newer.json: this history export has format 7"), "{message}");
    assert_eq!(message.matches("b-newer.json").count(), 1, "the path once: {message}");

    // An empty directory (a mistyped path) does not pass.
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_path_buf();
    let panicked = tokio::spawn(async move { assert_replayable_dir(|_: &Engine| {}, &path).await })
        .await
        .unwrap_err()
        .into_panic();
    let message = panicked.downcast_ref::<String>().expect("a message");
    assert!(message.contains("holds no history export"), "{message}");
    assert_eq!(ran.get(), 2, "no closure ran");
}
