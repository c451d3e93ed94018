//! Warm runs: a suspended run woken on the engine that parked it continues its parked body
//! (no replay), and on any doubt — another engine ran it, its lease is held elsewhere, a
//! cancel, eviction — it replays as it would without the cache. Virtual clock; each wait is
//! for an engine event, never a sleep.

mod support;

use std::sync::Arc;
use std::time::Duration;

use durable_conformance::{Counter, FaultyStore, Method, TestEngine, next_event, test_config};
use durable_core::{Checkpoint, Claim, Run, RunStatus, Store};
use durable_runtime::{
    Cancel, EngineConfig, EngineEvent, Metrics, StartOptions, StepError, VirtualClock, WorkflowCtx, WorkflowError,
};
use support::StoreFixture;

const WAIT: Duration = Duration::from_secs(20);

fn config(warm_runs: usize) -> EngineConfig {
    let mut c = test_config();
    c.warm_runs = warm_runs;
    c
}

/// A config whose pollers stay quiet during a test (hours on the real clock): a run executes
/// only where something wakes it (a timer here, or the engine that delivered a signal).
fn quiet_config(warm_runs: usize) -> EngineConfig {
    let mut c = config(warm_runs);
    c.poll_interval = Duration::from_secs(3600);
    c.orphan_poll_interval = Duration::from_secs(3600);
    c.recheck_interval = Duration::from_millis(5);
    c
}

fn engine(store: &Arc<dyn Store>, clock: &VirtualClock, config: EngineConfig) -> TestEngine {
    TestEngine::with_parts(store.clone(), clock.clone(), config)
}

/// `naps`: `n` one-second sleeps; counts the body's entries (each replay enters it again).
fn register_naps(t: &TestEngine, entries: &Counter) {
    let entries = entries.clone();
    t.register("naps", 1, move |ctx: WorkflowCtx, n: u64| {
        entries.bump();
        async move {
            let mut slept = 0u64;
            for _ in 0..n {
                ctx.sleep(Duration::from_secs(1)).await;
                slept += 1;
            }
            Ok::<_, WorkflowError>(slept)
        }
    });
}

/// `signals`: waits for `a` then `b` (tokens suffixed with the input), returns their sum;
/// counts the body's entries.
fn register_signals(t: &TestEngine, entries: &Counter) {
    let entries = entries.clone();
    t.register("signals", 1, move |ctx: WorkflowCtx, i: u64| {
        entries.bump();
        async move {
            let a: u64 = ctx.wait_for_signal(&format!("a-{i}")).await?;
            let b: u64 = ctx.wait_for_signal(&format!("b-{i}")).await?;
            Ok::<_, WorkflowError>(a + b)
        }
    });
}

/// Suspended with `n` checkpoints.
fn parked_at(n: usize) -> impl Fn(&Run, &[Checkpoint], &Metrics) -> bool {
    move |run, history, _| run.status == RunStatus::Suspended && history.len() == n
}

/// Suspended with a waiting wait at `seq` (registered, nothing delivered yet).
fn waiting_at(seq: u32) -> impl Fn(&Run, &[Checkpoint], &Metrics) -> bool {
    move |run, history, _| run.status == RunStatus::Suspended && history.iter().any(|c| c.seq == seq && !c.is_final())
}

/// [`waiting_at`] with `n` turns kept in memory.
fn kept_waiting_at(seq: u32, n: usize) -> impl Fn(&Run, &[Checkpoint], &Metrics) -> bool {
    move |run, history, m| waiting_at(seq)(run, history, m) && m.warm_runs == n
}

/// Runs `naps` with 5 sleeps to completion on one engine; returns the body's entries, the
/// warm resumes and the final history.
async fn five_naps(store: StoreFixture, warm_runs: usize) -> (u32, u64, Vec<Checkpoint>) {
    let t = engine(&store.store, &VirtualClock::starting_2026(), config(warm_runs));
    let entries = Counter::new();
    register_naps(&t, &entries);
    let mut events = t.subscribe();
    let run = t.start("naps", &5u64, StartOptions::id("naps")).await.unwrap();
    for k in 1..=5usize {
        t.until_run(&mut events, &run.id, parked_at(k)).await;
        t.advance(Duration::from_secs(1));
    }
    t.assert_output(&run.id, 5u64).await;
    let history = t.checkpoints(&run.id).await;
    (entries.get(), t.metrics().warm_resumes, history)
}

async fn woken_here_resumes_without_replay(store: StoreFixture) {
    let (entries, resumes, _) = five_naps(store, 16).await;
    assert_eq!(entries, 1, "the body was entered once: every wake continued the parked body");
    assert_eq!(resumes, 5, "each of the five wakes resumed the turn kept in memory");
}

async fn without_the_cache_every_wake_replays(store: StoreFixture) {
    let (entries, resumes, _) = five_naps(store, 0).await;
    assert_eq!(entries, 6, "warm_runs = 0: each of the five wakes replays the body");
    assert_eq!(resumes, 0);
}

/// The same workflows, the same script of wakes, with the cache on and off: the same outputs
/// and the same histories, checkpoint for checkpoint (the virtual clocks read the same).
async fn results_are_identical_with_the_cache_on_or_off(fixture: fn() -> StoreFixture) {
    let mut outcomes = Vec::new();
    for warm_runs in [1024, 0] {
        let store = fixture();
        let t = engine(&store.store, &VirtualClock::starting_2026(), config(warm_runs));
        let entries = Counter::new();
        register_mixed(&t, &entries);
        let mut events = t.subscribe();
        let run = t.start("mixed", &3u64, StartOptions::id("mixed")).await.unwrap();
        t.until_run(&mut events, &run.id, parked_at(2)).await;
        t.advance(Duration::from_secs(1));
        t.until_run(&mut events, &run.id, waiting_at(3)).await;
        t.signal("go-3", &10u64).await.unwrap();
        t.until_run(&mut events, &run.id, waiting_at(6)).await;
        t.advance(Duration::from_secs(1));
        t.until_run(&mut events, &run.id, |r, h, _| {
            r.status == RunStatus::Suspended && h.iter().any(|c| c.seq == 6 && c.is_final())
        })
        .await;
        t.advance(Duration::from_secs(1));
        let out: Vec<u64> = t.wait_for_run(&run.id).await.unwrap().output().unwrap();
        let entered = entries.get();
        let export = t.export_history(&run.id).await.unwrap();
        // The determinism check replays the warm-made history against the code.
        t.check_replay(&export).await.expect("the history replays against the code");
        let resumes = t.metrics().warm_resumes;
        outcomes.push((out, t.checkpoints(&run.id).await, entered, resumes));
    }
    let (warm, cold) = (&outcomes[0], &outcomes[1]);
    assert_eq!(warm.0, vec![6, 10, 7, 16]);
    assert_eq!(warm.0, cold.0, "outputs differ with the cache on and off");
    assert_eq!(warm.1, cold.1, "histories differ with the cache on and off");
    assert_eq!((warm.2, warm.3), (1, 4), "cache on: one entry of the body, four resumes");
    assert_eq!((cold.2, cold.3), (5, 0), "cache off: the body replays at each of the four wakes");
}

/// Steps, a sleep, a recorded time, a signal, a join of a sleep with a wait that times out.
fn register_mixed(t: &TestEngine, entries: &Counter) {
    let entries = entries.clone();
    t.register("mixed", 1, move |ctx: WorkflowCtx, n: u64| {
        entries.bump();
        async move {
            let a: u64 = ctx.step("a", move |_| async move { Ok(n * 2) }).await?;
            ctx.sleep(Duration::from_secs(1)).await;
            let _at = ctx.now().await;
            let s: u64 = ctx.wait_for_signal(&format!("go-{n}")).await?;
            let (_, late) = tokio::join!(
                ctx.sleep(Duration::from_secs(2)),
                ctx.wait_for_signal_timeout::<u64>(&format!("never-{n}"), Duration::from_secs(1))
            );
            let late = late?.unwrap_or(7);
            let b: u64 = ctx.step("b", move |_| async move { Ok(a + s) }).await?;
            Ok::<_, WorkflowError>(vec![a, s, late, b])
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_identical_with_the_cache_on_or_off_memory() {
    results_are_identical_with_the_cache_on_or_off(StoreFixture::memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_identical_with_the_cache_on_or_off_sqlite() {
    results_are_identical_with_the_cache_on_or_off(StoreFixture::sqlite).await;
}

/// Engine A parks the run (kept warm); engine B delivers `a`, so B runs the run's next turn;
/// then A delivers `b`: A's turn in memory is stale (the run was claimed elsewhere since), so
/// A replays — and the result is right.
async fn touched_by_another_engine_replays(store: StoreFixture) {
    let clock = VirtualClock::starting_2026();
    let a = engine(&store.store, &clock, quiet_config(16));
    // A's first look at the store, before anything is registered, finds nothing to look for:
    // it does not poll again within the test. (Run late, after B's delivery, it claimed the
    // woken run and resumed its turn, still the latest, where B was to run it: 1 in 20 under
    // load.)
    a.until_polled().await;
    let entries = Counter::new();
    register_signals(&a, &entries);
    let mut events = a.subscribe();
    let run = a.start("signals", &1u64, StartOptions::id("touched")).await.unwrap();
    a.until_run(&mut events, &run.id, kept_waiting_at(0, 1)).await;
    // B starts now (its first poll finds nothing to do).
    let b = engine(&store.second_handle(), &clock, quiet_config(16));
    register_signals(&b, &entries);

    let mut b_events = b.subscribe();
    b.signal("a-1", &2u64).await.unwrap();
    b.until_run(&mut b_events, &run.id, waiting_at(1)).await;
    assert_eq!(entries.get(), 2, "B replayed the run (its first turn there)");
    assert_eq!(b.metrics().turns, 1, "B ran the run's second turn");
    // B leaves (its pollers would otherwise race A for the next wake).
    b.shutdown().await;

    a.signal("b-1", &3u64).await.unwrap();
    a.assert_output(&run.id, 5u64).await;
    // A resumed its stale turn if and only if the body was not entered again here. (A's
    // start-up polls may run late, after B's delivery, and claim the run before B does: A then
    // resumes its turn, still the latest, and B's claim comes after; so A's resumes are not
    // counted, only what happened at the last wake.)
    assert_eq!(entries.get(), 3, "A replayed at the wake after B's turn: its turn in memory was stale");
    assert_eq!(a.metrics().warm_dropped, 1, "A dropped its stale turn at the claim");
}

/// Between A's suspend and its next claim, another owner claims the run and rewrites a
/// checkpoint the parked call does not look at (as a run retried and run again elsewhere may
/// come back with another value). A's claim reads only from the parked seq on, so only the
/// claim count tells: A replays and sees the store's value, not the one in its memory.
async fn another_claim_in_between_is_caught_by_the_count(store: StoreFixture) {
    let clock = VirtualClock::starting_2026();
    let a = engine(&store.store, &clock, quiet_config(16));
    let entries = Counter::new();
    let e = entries.clone();
    a.register("step_then_nap", 1, move |ctx: WorkflowCtx, _: ()| {
        e.bump();
        async move {
            let x: u64 = ctx.step("x", |_| async { Ok(1u64) }).await?;
            ctx.sleep(Duration::from_secs(1)).await;
            Ok::<_, WorkflowError>(x)
        }
    });
    let mut events = a.subscribe();
    let run = a.start("step_then_nap", &(), StartOptions::id("rewritten")).await.unwrap();
    a.until_run(&mut events, &run.id, |r, h, m| parked_at(2)(r, h, m) && m.warm_runs == 1).await;

    let other = store.second_handle();
    let now = durable_runtime::Clock::now(&clock);
    let claim = Claim { run_id: run.id.clone(), owner: "intruder".into(), lease_until: now + 60_000, now };
    let claimed = match other.claim_run(claim).await.unwrap() {
        durable_core::ClaimOutcome::Acquired { run, history, .. } => (run, history),
        other => panic!("expected the intruder to claim the run, got {other:?}"),
    };
    let mut rewritten = claimed.1[0].clone();
    rewritten.output = Some(durable_core::Payload::encode(&42u64).unwrap());
    let mut commit = durable_core::Commit::new(run.id.clone(), "intruder", now);
    commit.checkpoints.push(rewritten);
    commit.end = Some(durable_core::TurnEnd::Suspend {
        wake_at: claimed.0.wake_at.or(claimed.1[1].wake_at),
        seen_wake_gen: claimed.0.wake_gen,
    });
    other.commit(commit).await.unwrap();

    clock.advance(Duration::from_secs(1));
    a.assert_output(&run.id, 42u64).await;
    let m = a.metrics();
    assert_eq!((m.warm_resumes, m.warm_dropped), (0, 1), "the count showed the other claim: A replayed");
    assert_eq!(entries.get(), 2);
}

/// While A keeps the run warm, another owner takes its lease: A's wake finds the run busy and
/// drops its turn; once the lease is free, A runs the run again by replaying it.
async fn a_lease_held_elsewhere_drops_the_entry(store: StoreFixture) {
    let clock = VirtualClock::starting_2026();
    let a = engine(&store.store, &clock, quiet_config(16));
    let entries = Counter::new();
    register_signals(&a, &entries);
    let mut events = a.subscribe();
    let run = a.start("signals", &2u64, StartOptions::id("stolen")).await.unwrap();
    a.until_run(&mut events, &run.id, kept_waiting_at(0, 1)).await;

    let other = store.second_handle();
    let now = durable_runtime::Clock::now(&clock);
    let claim = Claim { run_id: run.id.clone(), owner: "intruder".into(), lease_until: now + 3_600_000, now };
    assert!(matches!(other.claim_run(claim).await.unwrap(), durable_core::ClaimOutcome::Acquired { .. }));

    a.signal("a-2", &4u64).await.unwrap();
    next_event(&mut events, WAIT, |e| matches!(e, EngineEvent::WakeDeferred { run_id, .. } if *run_id == run.id)).await;
    let m = a.metrics();
    assert_eq!((m.warm_runs, m.warm_dropped, m.warm_resumes), (0, 1, 0), "the busy claim dropped the entry");

    // The intruder goes away without a trace but its claim; A's re-check finds the run free.
    assert!(other.release_lease(&run.id, "intruder").await.unwrap());
    a.until_run(&mut events, &run.id, waiting_at(1)).await;
    assert_eq!(entries.get(), 2, "A replayed the run");
    a.signal("b-2", &5u64).await.unwrap();
    a.assert_output(&run.id, 9u64).await;
    assert_eq!(a.metrics().warm_resumes, 1, "the replayed turn was kept and resumed for b");
}

/// Past the capacity the least recently parked turn is dropped; that run replays, the others
/// resume.
async fn eviction_beyond_capacity(store: StoreFixture) {
    let a = engine(&store.store, &VirtualClock::starting_2026(), quiet_config(2));
    let entries = Counter::new();
    register_signals(&a, &entries);
    let mut events = a.subscribe();
    let mut ids = Vec::new();
    for i in 0..3u64 {
        let run = a.start("signals", &i, StartOptions::id(format!("lru-{i}"))).await.unwrap();
        let kept = (i + 1).min(2) as usize;
        let dropped = i.saturating_sub(1);
        a.until_run(&mut events, &run.id, |r, h, m| kept_waiting_at(0, kept)(r, h, m) && m.warm_dropped == dropped)
            .await;
        ids.push(run.id);
    }
    let m = a.metrics();
    assert_eq!((m.warm_runs, m.warm_dropped), (2, 1), "three parked, capacity two: the oldest dropped");
    assert_eq!(entries.get(), 3);
    // The kept ones first (a resumed turn is kept again, as the newest: waking the evicted
    // one first would evict the next oldest).
    for (i, id) in ids.iter().enumerate().rev() {
        a.signal(&format!("a-{i}"), &1u64).await.unwrap();
        a.until_run(&mut events, id, waiting_at(1)).await;
    }
    assert_eq!(entries.get(), 4, "only the evicted run (lru-0) replayed");
    assert_eq!(a.metrics().warm_resumes, 2);
}

/// Cancelling a run kept warm drops its turn: an abandon settles it at once; a cancel with
/// compensation replays it in cancel mode and runs its undo.
async fn cancel_of_a_parked_warm_run(store: StoreFixture) {
    let a = engine(&store.store, &VirtualClock::starting_2026(), quiet_config(16));
    let entries = Counter::new();
    let undos = Counter::new();
    register_signals(&a, &entries);
    let (e, u) = (entries.clone(), undos.clone());
    a.register("saga", 1, move |ctx: WorkflowCtx, _: ()| {
        e.bump();
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
            let _: u64 = ctx.wait_for_signal("never").await?;
            Ok::<_, WorkflowError>(())
        }
    });
    let mut events = a.subscribe();

    let plain = a.start("signals", &7u64, StartOptions::id("cancel-plain")).await.unwrap();
    a.until_run(&mut events, &plain.id, kept_waiting_at(0, 1)).await;
    a.cancel(&plain.id).await.unwrap();
    a.assert_settled_status(&plain.id, RunStatus::Cancelled).await;
    let m = a.metrics();
    assert_eq!((m.warm_runs, m.warm_dropped), (0, 1), "the cancel dropped the parked turn");

    let saga = a.start("saga", &(), StartOptions::id("cancel-saga")).await.unwrap();
    a.until_run(&mut events, &saga.id, kept_waiting_at(1, 1)).await;
    a.cancel_with(&saga.id, Cancel::Compensate).await.unwrap();
    assert_eq!(a.wait_for_run(&saga.id).await.unwrap().status(), RunStatus::Cancelled);
    assert_eq!(undos.get(), 1, "the undo ran once");
    let m = a.metrics();
    assert_eq!((m.warm_runs, m.warm_dropped, m.warm_resumes), (0, 2, 0), "no turn was resumed");
    assert_eq!(entries.get(), 3, "the saga replayed in cancel mode");
}

/// Shutting the engine down drops what it keeps in memory.
async fn shutdown_drops_the_entries(store: StoreFixture) {
    let a = engine(&store.store, &VirtualClock::starting_2026(), quiet_config(16));
    let entries = Counter::new();
    register_signals(&a, &entries);
    let mut events = a.subscribe();
    let run = a.start("signals", &9u64, StartOptions::id("shut")).await.unwrap();
    a.until_run(&mut events, &run.id, kept_waiting_at(0, 1)).await;
    a.shutdown().await;
    let m = a.metrics();
    assert_eq!((m.warm_runs, m.warm_dropped), (0, 1));
}

/// A child spawned and not joined yet keeps its spawn's checkpoint open: the child's settle
/// rewrites it, below the seq a kept turn would claim from. Such a turn is not kept: the
/// child's wake replays, and the join sees the child's output (a kept turn would have parked
/// the join on its stale copy, with nothing left to wake it).
async fn an_unjoined_child_keeps_the_parent_cold(store: StoreFixture) {
    let a = engine(&store.store, &VirtualClock::starting_2026(), quiet_config(16));
    let entries = Counter::new();
    a.register("kid", 1, |ctx: WorkflowCtx, _: ()| async move {
        let v: u64 = ctx.wait_for_signal("kid-go").await?;
        Ok::<_, WorkflowError>(v)
    });
    let e = entries.clone();
    a.register("parent", 1, move |ctx: WorkflowCtx, _: ()| {
        e.bump();
        async move {
            let kid = ctx.spawn_child::<_, u64>("kid", &());
            let go: u64 = ctx.wait_for_signal("parent-go").await?;
            let out = kid.join().await?;
            Ok::<_, WorkflowError>(out + go)
        }
    });
    let mut events = a.subscribe();
    let run = a.start("parent", &(), StartOptions::id("parent")).await.unwrap();
    a.until_run(&mut events, &run.id, waiting_at(1)).await;
    a.signal("kid-go", &7u64).await.unwrap();
    // The child's settle wakes the parent, which replays and waits again at seq 1.
    a.until_run(&mut events, &run.id, |r, h, _| {
        r.status == RunStatus::Suspended && h.iter().any(|c| c.seq == 0 && c.is_final()) && entries.get() == 2
    })
    .await;
    a.signal("parent-go", &1u64).await.unwrap();
    a.assert_output(&run.id, 8u64).await;
    // Once the child settled, nothing is open below the wait: that replay was kept and resumed.
    assert_eq!(entries.get(), 2, "kept only after the child settled");
}

/// A signal this engine sends to a run whose turn it keeps in memory claims the run in the
/// same store write (`send_signal_and_claim`): the wake resumes the turn without a claim of its
/// own. A signal to a token no kept turn waits on is sent the usual way.
async fn a_signal_here_claims_its_warm_run_in_the_same_write(store: StoreFixture) {
    let counted = Arc::new(FaultyStore::over(store.store.clone()));
    let a = engine(&(counted.clone() as Arc<dyn Store>), &VirtualClock::starting_2026(), quiet_config(16));
    let entries = Counter::new();
    register_signals(&a, &entries);
    let mut events = a.subscribe();
    let run = a.start("signals", &7u64, StartOptions::id("folded")).await.unwrap();
    a.until_run(&mut events, &run.id, kept_waiting_at(0, 1)).await;
    for (token, wait) in [("a-7", 1), ("b-7", 2)] {
        // The run's last drive has ended (a drive still under way, or queued, takes the
        // signal's wake instead: the signal is then sent alone).
        a.until_idle().await;
        counted.reset_counts();
        a.signal(token, &(wait as u64)).await.unwrap();
        if wait == 1 {
            a.until_run(&mut events, &run.id, kept_waiting_at(1, 1)).await;
        } else {
            a.assert_output(&run.id, 3u64).await;
        }
        let calls = counted.call_counts();
        let n = |m| calls.get(&m).copied().unwrap_or(0);
        assert_eq!((n(Method::SendSignalAndClaim), n(Method::SendSignal)), (1, 0), "signal {token}: {calls:?}");
        assert_eq!(n(Method::ClaimRun), 0, "signal {token}: the wake took the signal's claim: {calls:?}");
    }
    assert_eq!(entries.get(), 1, "never replayed");
    assert_eq!(a.metrics().warm_resumes, 2);

    // No turn kept for the token: a plain signal, buffered.
    counted.reset_counts();
    a.signal("c-7", &1u64).await.unwrap();
    let calls = counted.call_counts();
    assert_eq!((calls.get(&Method::SendSignal), calls.get(&Method::SendSignalAndClaim)), (Some(&1), None));
}

/// A signal sent here claims its warm run reading only the history from the parked wait on
/// (`send_signal_and_claim` with the turn's `from_seq`). When that claim shows another owner
/// ran the run in between (it rewrote the step's checkpoint the parked turn holds in memory),
/// the turn is stale: the engine reads the whole history and replays, and the run returns the
/// store's value, not the one in memory, nor a step executed again over the partial history.
async fn a_signal_claim_of_a_stale_warm_turn_replays_over_the_whole_history(store: StoreFixture) {
    let counted = Arc::new(FaultyStore::over(store.store.clone()));
    let clock = VirtualClock::starting_2026();
    let a = engine(&(counted.clone() as Arc<dyn Store>), &clock, quiet_config(16));
    let entries = Counter::new();
    let e = entries.clone();
    let executed = Counter::new();
    let x_runs = executed.clone();
    a.register("step_then_signal", 1, move |ctx: WorkflowCtx, _: ()| {
        e.bump();
        let x_runs = x_runs.clone();
        async move {
            let x: u64 = ctx
                .step("x", move |_| {
                    x_runs.bump();
                    async { Ok(1u64) }
                })
                .await?;
            let y: u64 = ctx.wait_for_signal("go").await?;
            Ok::<_, WorkflowError>(x + y)
        }
    });
    let mut events = a.subscribe();
    let run = a.start("step_then_signal", &(), StartOptions::id("stale-signal")).await.unwrap();
    a.until_run(&mut events, &run.id, kept_waiting_at(1, 1)).await;

    // Another owner claims the run, rewrites the step's checkpoint and suspends it again.
    let other = store.second_handle();
    let now = durable_runtime::Clock::now(&clock);
    let claim = Claim { run_id: run.id.clone(), owner: "intruder".into(), lease_until: now + 60_000, now };
    let (claimed, history) = match other.claim_run(claim).await.unwrap() {
        durable_core::ClaimOutcome::Acquired { run, history, .. } => (run, history),
        other => panic!("expected the intruder to claim the run, got {other:?}"),
    };
    let mut rewritten = history[0].clone();
    rewritten.output = Some(durable_core::Payload::encode(&42u64).unwrap());
    let mut commit = durable_core::Commit::new(run.id.clone(), "intruder", now);
    commit.checkpoints.push(rewritten);
    commit.end = Some(durable_core::TurnEnd::Suspend { wake_at: None, seen_wake_gen: claimed.wake_gen });
    other.commit(commit).await.unwrap();

    a.until_idle().await;
    counted.reset_counts();
    a.signal("go", &5u64).await.unwrap();
    a.assert_output(&run.id, 47u64).await;
    let calls = counted.call_counts();
    let n = |m| calls.get(&m).copied().unwrap_or(0);
    assert_eq!(n(Method::SendSignalAndClaim), 1, "the signal claimed the run: {calls:?}");
    assert_eq!(n(Method::History), 1, "the stale turn read the whole history: {calls:?}");
    let m = a.metrics();
    assert_eq!((m.warm_resumes, m.warm_dropped), (0, 1), "the claim count showed the other owner");
    assert_eq!(entries.get(), 2, "replayed once");
    assert_eq!(executed.get(), 1, "the step's checkpoint was replayed, not executed again");
}

on_every_store!(
    a_signal_claim_of_a_stale_warm_turn_replays_over_the_whole_history,
    a_signal_here_claims_its_warm_run_in_the_same_write,
    an_unjoined_child_keeps_the_parent_cold,
    woken_here_resumes_without_replay,
    without_the_cache_every_wake_replays,
    touched_by_another_engine_replays,
    another_claim_in_between_is_caught_by_the_count,
    a_lease_held_elsewhere_drops_the_entry,
    eviction_beyond_capacity,
    cancel_of_a_parked_warm_run,
    shutdown_drops_the_entries,
);
