//! Acceptance (signals): delivery in every order, FIFO, races, timeouts, signal-with-start,
//! bad payloads and a crash in between — on memory and SQLite.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use durable_conformance::TestEngine;
use durable_core::{Delivery, RunStatus};
use durable_runtime::{SignalError, StartOptions, WorkflowCtx, WorkflowError};
use support::StoreFixture;

on_every_store!(
    signal_before_and_after_the_wait_both_deliver,
    two_signals_are_consumed_in_order,
    a_signal_for_a_finished_run_is_buffered_harmlessly,
    concurrent_signals_and_waits_consume_every_payload_once,
    a_timed_out_wait_resumes_with_none_and_leaves_no_waiter,
    signal_with_start_converges_on_one_run,
    a_bad_payload_is_a_typed_error_the_workflow_handles,
    a_buffered_signal_survives_an_engine_teardown,
);

fn register_waiter(t: &TestEngine) {
    t.register("wait_one", 1, |ctx: WorkflowCtx, token: String| async move {
        let got: String = ctx.wait_for_signal(&token).await?;
        Ok::<_, WorkflowError>(got)
    });
}

async fn signal_before_and_after_the_wait_both_deliver(s: StoreFixture) {
    let t = s.engine();
    register_waiter(&t);
    // Before: the signal is buffered, the wait takes it.
    assert_eq!(t.signal("early", "hello").await.unwrap(), Delivery::Buffered);
    let a = t.start("wait_one", "early", StartOptions::id("a")).await.unwrap();
    t.assert_output(&a.id, "hello".to_string()).await;
    // After: the run parks, the signal is recorded at its seq and wakes it.
    let b = t.start("wait_one", "late", StartOptions::id("b")).await.unwrap();
    t.assert_settled_status(&b.id, RunStatus::Suspended).await;
    assert_eq!(t.signal("late", "world").await.unwrap(), Delivery::Delivered { run_id: b.id.clone(), seq: 0 });
    t.assert_output(&b.id, "world".to_string()).await;
    let cp = &t.checkpoints(&b.id).await[0];
    assert_eq!(cp.output.as_ref().unwrap().decode::<String>().unwrap(), "world");
}

async fn two_signals_are_consumed_in_order(s: StoreFixture) {
    let t = s.engine();
    t.register("wait_two", 1, |ctx: WorkflowCtx, _: ()| async move {
        let first: u32 = ctx.wait_for_signal("tok").await?;
        let second: u32 = ctx.wait_for_signal("tok").await?;
        Ok::<_, WorkflowError>((first, second))
    });
    t.signal("tok", &1u32).await.unwrap();
    t.signal("tok", &2u32).await.unwrap();
    let run = t.start("wait_two", &(), StartOptions::id("two")).await.unwrap();
    t.assert_output(&run.id, (1u32, 2u32)).await;
}

async fn a_signal_for_a_finished_run_is_buffered_harmlessly(s: StoreFixture) {
    let t = s.engine();
    register_waiter(&t);
    let run = t.start("wait_one", "done-tok", StartOptions::id("done")).await.unwrap();
    t.signal("done-tok", "first").await.unwrap();
    t.assert_output(&run.id, "first".to_string()).await;
    assert_eq!(t.signal("done-tok", "late").await.unwrap(), Delivery::Buffered);
    t.assert_output(&run.id, "first".to_string()).await;
    assert!(t.store().waiters(&run.id).await.unwrap().is_empty());
}

async fn concurrent_signals_and_waits_consume_every_payload_once(s: StoreFixture) {
    // Two engines on two store handles (two SQLite connections on one file), racing.
    let a = s.engine();
    let b = TestEngine::with_parts(s.second_handle(), a.clock().clone(), durable_conformance::test_config());
    register_waiter(&a);
    register_waiter(&b);
    const RUNS: usize = 100;
    const TOKENS: usize = 10;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2 * RUNS));
    let mut tasks = Vec::new();
    for i in 0..RUNS {
        let (engine, gate) = (if i % 2 == 0 { a.engine().clone() } else { b.engine().clone() }, barrier.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            engine
                .start("wait_one", &format!("race-{}", i % TOKENS), StartOptions::id(format!("race-run-{i}")))
                .await
                .unwrap();
        }));
        let (engine, gate) = (if i % 2 == 0 { b.engine().clone() } else { a.engine().clone() }, barrier.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            engine.signal(&format!("race-{}", i % TOKENS), &format!("payload-{i}")).await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut received = Vec::new();
    for i in 0..RUNS {
        let out: String = a.wait_for_run(&format!("race-run-{i}").into()).await.unwrap().output().unwrap();
        // Each run received a payload sent to its own token.
        let sent_to: usize = out.trim_start_matches("payload-").parse().unwrap();
        assert_eq!(sent_to % TOKENS, i % TOKENS, "run {i} got {out}");
        received.push(out);
    }
    let unique: BTreeSet<_> = received.iter().cloned().collect();
    assert_eq!(unique.len(), RUNS, "a payload was delivered twice");
    let expected: BTreeSet<_> = (0..RUNS).map(|i| format!("payload-{i}")).collect();
    assert_eq!(unique, expected, "a payload was lost");
}

async fn a_timed_out_wait_resumes_with_none_and_leaves_no_waiter(s: StoreFixture) {
    let t = s.engine();
    t.register("approval", 1, |ctx: WorkflowCtx, _: ()| async move {
        let answer: Option<bool> = ctx.wait_for_signal_timeout("approve", Duration::from_secs(3 * 86_400)).await?;
        Ok::<_, WorkflowError>(answer)
    });
    let run = t.start("approval", &(), StartOptions::id("approval")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    assert_eq!(t.store().waiters(&run.id).await.unwrap().len(), 1);
    t.advance(Duration::from_secs(86_400));
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    t.advance(Duration::from_secs(2 * 86_400));
    t.assert_output(&run.id, None::<bool>).await;
    assert!(t.store().waiters(&run.id).await.unwrap().is_empty(), "a stray waiter was left");
    assert_eq!(t.signal("approve", &true).await.unwrap(), Delivery::Buffered);
    t.assert_output(&run.id, None::<bool>).await;
}

async fn signal_with_start_converges_on_one_run(s: StoreFixture) {
    let t = s.engine();
    t.register("collect", 1, |ctx: WorkflowCtx, n: usize| async move {
        let mut got = Vec::new();
        for _ in 0..n {
            got.push(ctx.wait_for_signal::<u32>("collect-tok").await?);
        }
        Ok::<_, WorkflowError>(got)
    });
    let mut tasks = Vec::new();
    for i in 0..10u32 {
        let engine = t.engine().clone();
        tasks.push(tokio::spawn(async move {
            engine
                .signal_with_start("collect", &10usize, StartOptions::id("collector"), "collect-tok", &i)
                .await
                .unwrap()
        }));
    }
    let mut created = 0;
    for task in tasks {
        created += usize::from(task.await.unwrap().0.created);
    }
    assert_eq!(created, 1);
    let got: Vec<u32> = t.wait_for_run(&"collector".into()).await.unwrap().output().unwrap();
    let unique: BTreeSet<u32> = got.iter().copied().collect();
    assert_eq!(unique, (0..10).collect::<BTreeSet<u32>>(), "got {got:?}");
    assert_eq!(t.list_runs(&Default::default()).await.unwrap().runs.len(), 1);

    // Sequential senders are received in the order sent.
    let ordered = t.start("collect", &3usize, StartOptions::id("ordered")).await.unwrap();
    for i in [7u32, 3, 9] {
        t.signal("collect-tok", &i).await.unwrap();
    }
    t.assert_output(&ordered.id, vec![7u32, 3, 9]).await;
}

async fn a_bad_payload_is_a_typed_error_the_workflow_handles(s: StoreFixture) {
    let t = s.engine();
    t.register("typed", 1, |ctx: WorkflowCtx, _: ()| async move {
        let outcome = match ctx.wait_for_signal::<u64>("amount").await {
            Ok(n) => format!("amount {n}"),
            Err(SignalError { name, seq, payload, .. }) => {
                // Handled: ask again.
                let n: u64 = ctx.wait_for_signal("amount").await?;
                format!("rejected {payload} on {name}@{seq}, then amount {n}")
            }
        };
        Ok::<_, WorkflowError>(outcome)
    });
    let run = t.start("typed", &(), StartOptions::id("typed")).await.unwrap();
    t.signal("amount", "lots").await.unwrap();
    t.signal("amount", &12u64).await.unwrap();
    t.assert_output(&run.id, r#"rejected "lots" on amount@0, then amount 12"#.to_string()).await;
}

fn register_late_wait(t: &TestEngine) {
    t.register("late_wait", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.sleep(Duration::from_secs(60)).await;
        let got: String = ctx.wait_for_signal("crash-tok").await?;
        Ok::<_, WorkflowError>(got)
    });
}

async fn a_buffered_signal_survives_an_engine_teardown(s: StoreFixture) {
    // Buffered before the run waits; the engine goes away before the run wakes.
    let t = s.engine();
    register_late_wait(&t);
    register_waiter(&t);
    let run = t.start("late_wait", &(), StartOptions::id("late")).await.unwrap();
    let parked = t.start("wait_one", "parked-tok", StartOptions::id("parked")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    t.assert_settled_status(&parked.id, RunStatus::Suspended).await;
    assert_eq!(t.signal("crash-tok", "kept").await.unwrap(), Delivery::Buffered);
    t.shutdown().await;
    // Delivered to a waiter while no engine runs: recorded, but nobody wakes the run yet.
    assert!(matches!(t.signal("parked-tok", "recorded").await.unwrap(), Delivery::Delivered { .. }));

    let t = t.restart().await;
    register_late_wait(&t);
    register_waiter(&t);
    t.advance(Duration::from_secs(60));
    t.assert_output(&run.id, "kept".to_string()).await;
    t.assert_output(&parked.id, "recorded".to_string()).await;
}
