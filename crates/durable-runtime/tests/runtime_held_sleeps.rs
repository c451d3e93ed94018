//! Held sleeps (`EngineConfig::hold_sleeps_under`): a body parked on short durable sleeps only
//! keeps its run `running` and waits in memory — one commit per sleep, no suspension, no claim
//! — and anything else still suspends. A crash mid-hold loses nothing durable; a cancel stops
//! the held turn. Virtual clock; each wait is for an engine event, never a sleep.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use durable_conformance::{Counter, TestEngine, test_config};
use durable_core::{Checkpoint, CheckpointStatus, Millis, Run, RunStatus, StepKind};
use durable_runtime::{
    Cancel, Clock, EngineConfig, Metrics, StartOptions, StepError, VirtualClock, WorkflowCtx, WorkflowError,
};
use support::StoreFixture;

/// Sleeps due within 2 s are held.
fn holding() -> EngineConfig {
    let mut c = test_config();
    c.hold_sleeps_under = Duration::from_secs(2);
    c
}

fn engine(store: &StoreFixture, config: EngineConfig) -> TestEngine {
    TestEngine::with_parts(store.store.clone(), VirtualClock::starting_2026(), config)
}

/// `naps`: `n` sleeps of `ms` each, then a step that counts its runs; counts the body's
/// entries (each replay enters it again).
fn register_naps(t: &TestEngine, entries: &Counter, after: &Arc<AtomicU64>) {
    let entries = entries.clone();
    let after = after.clone();
    t.register("naps", 1, move |ctx: WorkflowCtx, (n, ms): (u64, u64)| {
        entries.bump();
        let after = after.clone();
        async move {
            for _ in 0..n {
                ctx.sleep(Duration::from_millis(ms)).await;
            }
            let done = ctx
                .step("after", move |_| {
                    let after = after.clone();
                    async move { Ok(after.fetch_add(1, Ordering::SeqCst) + 1) }
                })
                .await?;
            Ok::<_, WorkflowError>((n, done))
        }
    });
}

/// Held (running) on the sleep at `seq`, its wake time recorded.
fn held_at(seq: u32) -> impl Fn(&Run, &[Checkpoint], &Metrics) -> bool {
    move |run, history, _| {
        run.status == RunStatus::Running
            && history
                .iter()
                .any(|c| c.seq == seq && c.kind == StepKind::Sleep && c.status == CheckpointStatus::Waiting)
    }
}

/// The sleeps' recorded wake times, by seq.
fn wake_times(history: &[Checkpoint]) -> Vec<Option<Millis>> {
    history.iter().filter(|c| c.kind == StepKind::Sleep).map(|c| c.wake_at).collect()
}

/// Three 1 s sleeps on one engine: each is held in the same turn (never suspended, never
/// claimed again), its wake time recorded before the wait, and the body is entered once.
async fn short_sleeps_are_held_in_one_turn(store: StoreFixture) {
    let t = engine(&store, holding());
    let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
    register_naps(&t, &entries, &after);
    let mut events = t.subscribe();
    let run = t.start("naps", &(3u64, 1_000u64), StartOptions::id("held")).await.unwrap();
    let start = t.clock().now();
    for seq in 0..3u32 {
        t.until_run(&mut events, &run.id, held_at(seq)).await;
        t.advance(Duration::from_secs(1));
    }
    t.assert_output(&run.id, (3u64, 1u64)).await;
    let history = t.checkpoints(&run.id).await;
    let expected: Vec<_> = (1..=3).map(|k| Some(start + 1_000 * k)).collect();
    assert_eq!(wake_times(&history), expected, "each sleep's wake time was recorded as it began");
    assert!(history.iter().all(|c| c.status == CheckpointStatus::Completed));
    assert_eq!(entries.get(), 1, "one turn ran the whole body");
    let m = t.metrics();
    assert_eq!((m.turns, m.warm_resumes), (1, 0), "no suspension, no second claim");
}

/// With holds off (the default), and for a sleep due beyond the hold, the run suspends.
async fn other_sleeps_suspend_the_run(store: StoreFixture) {
    for (config, ms) in [(test_config(), 1_000u64), (holding(), 2_001)] {
        let t = engine(&store, config);
        let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
        register_naps(&t, &entries, &after);
        let mut events = t.subscribe();
        let id = format!("cold-{ms}");
        let run = t.start("naps", &(1u64, ms), StartOptions::id(&id)).await.unwrap();
        t.until_run(&mut events, &run.id, |r, h, _| r.status == RunStatus::Suspended && h.len() == 1).await;
        t.advance(Duration::from_millis(ms));
        t.assert_output(&run.id, (1u64, 1u64)).await;
        assert!(t.metrics().turns >= 2, "{id}: the wake is a turn of its own");
        t.engine().shutdown().await;
    }
}

/// The engine is killed while it holds a sleep: the run stays `running` under the dead
/// engine's lease, and once that passes another engine recovers it. The sleep's wake time
/// was recorded, so the recovered sleep ends at it (long past) instead of starting over; the
/// next sleep is held by the new engine.
async fn a_crash_during_a_held_sleep_keeps_the_recorded_wake_time(store: StoreFixture) {
    let t = engine(&store, holding());
    let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
    register_naps(&t, &entries, &after);
    let mut events = t.subscribe();
    let run = t.start("naps", &(2u64, 1_000u64), StartOptions::id("crashed")).await.unwrap();
    let start = t.clock().now();
    t.until_run(&mut events, &run.id, held_at(0)).await;

    let t = t.crash();
    register_naps(&t, &entries, &after);
    let mut events = t.subscribe();
    t.advance(test_config().lease_ttl + Duration::from_secs(1));
    let recovered = t.clock().now();
    t.until_run(&mut events, &run.id, held_at(1)).await;
    t.advance(Duration::from_secs(1));
    t.assert_output(&run.id, (2u64, 1u64)).await;
    let history = t.checkpoints(&run.id).await;
    assert_eq!(
        wake_times(&history),
        vec![Some(start + 1_000), Some(recovered + 1_000)],
        "the first sleep kept the wake time recorded before the crash"
    );
    assert_eq!(entries.get(), 2, "the body was entered again once, by the recovery");
    assert_eq!(after.load(Ordering::SeqCst), 1, "the step after the sleeps ran once");
}

/// A cancel while a sleep is held stops the turn at once: the run settles `cancelled`, and
/// the engine drains without waiting for the sleep (which never comes due: the virtual clock
/// stands still); the body never goes past it.
async fn a_cancel_stops_a_held_sleep(store: StoreFixture) {
    let t = engine(&store, holding());
    let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
    register_naps(&t, &entries, &after);
    let mut events = t.subscribe();
    let run = t.start("naps", &(1u64, 1_000u64), StartOptions::id("cancelled")).await.unwrap();
    t.until_run(&mut events, &run.id, held_at(0)).await;
    t.cancel(&run.id).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Cancelled).await;
    // A hang guard on the real clock: the stopped turn lets the drain end at once.
    assert!(t.engine().drain(Duration::from_secs(30)).await, "the held turn stopped at the cancel");
    assert_eq!(after.load(Ordering::SeqCst), 0, "the body stopped at the held sleep");
}

/// A drain does not wait for held sleeps: the held turn suspends at once (the virtual clock
/// stands still, so a turn that went on holding would never finish), its wake time recorded.
async fn a_drain_suspends_a_held_sleep(store: StoreFixture) {
    // No lease renewal (which polls the driver too) within the guard below.
    let mut config = holding();
    config.lease_ttl = Duration::from_secs(3600);
    let t = engine(&store, config);
    let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
    register_naps(&t, &entries, &after);
    let mut events = t.subscribe();
    let run = t.start("naps", &(3u64, 1_000u64), StartOptions::id("drained")).await.unwrap();
    let start = t.clock().now();
    t.until_run(&mut events, &run.id, held_at(0)).await;
    // A hang guard on the real clock.
    assert!(t.engine().drain(Duration::from_secs(30)).await, "the held turn suspended for the drain");
    let stored = store.store.get_run(&run.id).await.unwrap().expect("the run");
    assert_eq!((stored.status, stored.wake_at), (RunStatus::Suspended, Some(start + 1_000)));
}

/// A cancel with compensation that reaches the store only (another engine, no shared control
/// plane) is seen by the first held sleep due a hold limit (2 s) after the holds began: the
/// engine reads the run before the body goes on, stops the turn, and the fresh claim runs the
/// undo.
async fn a_cancel_heard_only_through_the_store_stops_a_held_loop(store: StoreFixture) {
    let t = engine(&store, holding());
    let undos = Counter::new();
    let u = undos.clone();
    t.register("saga", 1, move |ctx: WorkflowCtx, _: ()| {
        let u = u.clone();
        async move {
            ctx.step("charge", |_| async { Ok(1u64) })
                .compensate(move |_| {
                    let u = u.clone();
                    async move {
                        u.bump();
                        Ok::<_, StepError>(())
                    }
                })
                .await?;
            for _ in 0..3 {
                ctx.sleep(Duration::from_secs(1)).await;
            }
            Ok::<_, WorkflowError>(())
        }
    });
    let mut events = t.subscribe();
    let run = t.start("saga", &(), StartOptions::id("saga")).await.unwrap();
    t.until_run(&mut events, &run.id, held_at(1)).await;
    let other = t.sibling();
    other.cancel_with(&run.id, Cancel::Compensate).await.unwrap();
    t.advance(Duration::from_secs(2));
    // A hang guard on the real clock: a turn that missed the cancel would hold on and never end.
    let outcome = t.engine().wait_for_run_timeout(&run.id, Duration::from_secs(20)).await.expect("settled");
    assert_eq!(outcome.status(), RunStatus::Cancelled);
    assert_eq!(undos.get(), 1, "the undo ran once");
    other.engine().shutdown().await;
}

/// A sleep is never held while no execution slot is free: with one slot, which the turn itself
/// takes, the run suspends as without holds.
async fn no_sleep_is_held_without_a_free_slot(store: StoreFixture) {
    let mut config = holding();
    config.max_concurrent_runs = 1;
    let t = engine(&store, config);
    let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
    register_naps(&t, &entries, &after);
    let mut events = t.subscribe();
    let run = t.start("naps", &(1u64, 1_000u64), StartOptions::id("one-slot")).await.unwrap();
    let start = t.clock().now();
    t.until_run(&mut events, &run.id, |run, _, _| run.status == RunStatus::Suspended).await;
    let stored = store.store.get_run(&run.id).await.unwrap().expect("the run");
    assert_eq!(stored.wake_at, Some(start + 1_000));
    t.advance(Duration::from_secs(1));
    t.assert_status(&run.id, RunStatus::Completed).await;
    assert_eq!(after.load(Ordering::SeqCst), 1);
}

/// A run that waits for an execution slot takes a held turn's: one held turn suspends at once
/// (its wake time recorded), without waiting for its sleep to end — here it never would: the
/// virtual clock stands still until the waiting run has completed — and the other held turn,
/// not needed, goes on holding.
async fn a_run_waiting_for_a_slot_takes_a_held_turns_slot(store: StoreFixture) {
    let mut config = holding();
    config.max_concurrent_runs = 3;
    // No lease renewal (which polls the driver too) within the guards below.
    config.lease_ttl = Duration::from_secs(3600);
    let t = engine(&store, config);
    let (entries, after) = (Counter::new(), Arc::new(AtomicU64::new(0)));
    register_naps(&t, &entries, &after);
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    t.register("blocker", 1, move |ctx: WorkflowCtx, _: ()| {
        let r = r.clone();
        async move {
            ctx.step("wait", move |_| {
                let r = r.clone();
                async move {
                    r.notified().await;
                    Ok(())
                }
            })
            .await?;
            Ok::<_, WorkflowError>(())
        }
    });
    t.register("quick", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.step("one", |_| async { Ok(1u64) }).await?;
        Ok::<_, WorkflowError>(())
    });
    let mut events = t.subscribe();
    let start = t.clock().now();
    let mut napping = Vec::new();
    for id in ["holder-a", "holder-b"] {
        let run = t.start("naps", &(1u64, 1_000u64), StartOptions::id(id)).await.unwrap();
        t.until_run(&mut events, &run.id, held_at(0)).await;
        napping.push(run.id);
    }
    // The third slot: a run busy in a step until released.
    let blocker = t.start("blocker", &(), StartOptions::id("blocker")).await.unwrap();
    t.until_run(&mut events, &blocker.id, |run, _, _| run.status == RunStatus::Running).await;

    let quick = t.start("quick", &(), StartOptions::id("quick")).await.unwrap();
    // A hang guard on the real clock: without the hand-over the quick run waits for a sleep.
    let outcome = t.engine().wait_for_run_timeout(&quick.id, Duration::from_secs(20)).await.expect("settled");
    assert_eq!(outcome.status(), RunStatus::Completed);
    let mut states = Vec::new();
    for id in &napping {
        let stored = store.store.get_run(id).await.unwrap().expect("the run");
        states.push((stored.status, stored.wake_at));
    }
    states.sort_by_key(|(status, _)| *status != RunStatus::Suspended);
    assert_eq!(
        states,
        [(RunStatus::Suspended, Some(start + 1_000)), (RunStatus::Running, None)],
        "one held turn gave its slot up, the other holds on"
    );

    release.notify_one();
    t.assert_status(&blocker.id, RunStatus::Completed).await;
    t.advance(Duration::from_secs(1));
    for id in &napping {
        t.assert_status(id, RunStatus::Completed).await;
    }
    assert_eq!(after.load(Ordering::SeqCst), 2, "the step after each sleep ran once");
}

on_every_store!(
    short_sleeps_are_held_in_one_turn,
    other_sleeps_suspend_the_run,
    a_crash_during_a_held_sleep_keeps_the_recorded_wake_time,
    a_cancel_stops_a_held_sleep,
    a_drain_suspends_a_held_sleep,
    a_cancel_heard_only_through_the_store_stops_a_held_loop,
    no_sleep_is_held_without_a_free_slot,
    a_run_waiting_for_a_slot_takes_a_held_turns_slot,
);
