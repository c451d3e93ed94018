//! Warm runs on PostgreSQL: the store counts the claims that acquire a run (schema version 14),
//! so a suspended run woken on the engine that parked it continues its parked body instead of
//! replaying the history, and a claim by anyone else in between is seen by the count (the run
//! replays). Virtual clock; each wait is for an engine event, never a sleep. Each test runs on
//! scratch schemas of its own.
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test warm_postgres
//! ```

use std::sync::Arc;
use std::time::Duration;

use durable::{
    Checkpoint, Clock, EngineConfig, EngineEvent, Metrics, Run, RunStatus, StartOptions, VirtualClock, WorkflowCtx,
    WorkflowError,
};
use durable_conformance::{Counter, TestEngine, next_event, test_config};
use durable_core::{Claim, ClaimOutcome, Commit, Payload, Store, TurnEnd};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};

/// A hang guard for the waits below, not a timing assertion.
const WAIT: Duration = Duration::from_secs(20);

fn config(warm_runs: usize) -> EngineConfig {
    let mut c = test_config();
    c.warm_runs = warm_runs;
    c
}

/// Warm runs on, pollers quiet (hours on the real clock): only the run's in-memory timer wakes
/// it, and a wake deferred by a busy claim is looked at again after 5 ms.
fn quiet_config() -> EngineConfig {
    let mut c = config(16);
    c.poll_interval = Duration::from_secs(3600);
    c.orphan_poll_interval = Duration::from_secs(3600);
    c.recheck_interval = Duration::from_millis(5);
    c
}

/// Suspended with `n` checkpoints.
fn parked_at(n: usize) -> impl Fn(&Run, &[Checkpoint], &Metrics) -> bool {
    move |run, history, _| run.status == RunStatus::Suspended && history.len() == n
}

/// Runs `naps` (5 one-second sleeps; counts the body's entries) to completion on one engine on a
/// scratch schema of its own; returns the body's entries, the warm resumes and the history.
async fn five_naps(url: &str, warm_runs: usize) -> (u32, u64, Vec<Checkpoint>) {
    let scratch = ScratchSchema::new(url, "warm_naps").await.expect("scratch schema");
    let store: Arc<dyn Store> = Arc::new(scratch.connect().await.expect("connect"));
    let t = TestEngine::with_parts(store, VirtualClock::starting_2026(), config(warm_runs));
    let entries = Counter::new();
    let e = entries.clone();
    t.register("naps", 1, move |ctx: WorkflowCtx, n: u64| {
        e.bump();
        async move {
            for _ in 0..n {
                ctx.sleep(Duration::from_secs(1)).await;
            }
            Ok::<_, WorkflowError>(n)
        }
    });
    let mut events = t.subscribe();
    let run = t.start("naps", &5u64, StartOptions::id("naps")).await.unwrap();
    for k in 1..=5usize {
        t.until_run(&mut events, &run.id, parked_at(k)).await;
        t.advance(Duration::from_secs(1));
    }
    t.assert_output(&run.id, 5u64).await;
    let history = t.checkpoints(&run.id).await;
    let outcome = (entries.get(), t.metrics().warm_resumes, history);
    t.shutdown().await;
    outcome
}

/// A sleep workflow woken five times on the engine that parked it: each wake continues the
/// parked body (one entry, five resumes), and the history is the one the same script writes
/// with the cache off (where each wake replays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeps_resume_warm_on_postgres() {
    let Some(url) = url_or_skip("sleeps_resume_warm_on_postgres") else { return };
    let (entries, resumes, warm) = five_naps(&url, 16).await;
    assert_eq!(resumes, 5, "each of the five wakes resumed the turn kept in memory");
    assert_eq!(entries, 1, "the body was entered once: no wake replayed it");
    let (entries, resumes, cold) = five_naps(&url, 0).await;
    assert_eq!((entries, resumes), (6, 0), "warm_runs = 0: each of the five wakes replays the body");
    assert_eq!(warm, cold, "the histories differ with the cache on and off");
}

/// Between the engine's suspend and its next claim, another owner (a second `PostgresStore` on
/// the schema, as another process) claims the run and rewrites a checkpoint the parked call does
/// not look at. The engine's claim reads only from the parked seq on, so only the claim count
/// tells: it replays and returns the store's value, not the one in its memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_claim_in_between_is_caught_by_the_count_on_postgres() {
    let Some(url) = url_or_skip("another_claim_in_between_is_caught_by_the_count_on_postgres") else { return };
    let scratch = ScratchSchema::new(&url, "warm_claims").await.expect("scratch schema");
    let store: Arc<dyn Store> = Arc::new(scratch.connect().await.expect("connect"));
    let clock = VirtualClock::starting_2026();
    let a = TestEngine::with_parts(store, clock.clone(), quiet_config());
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
    a.until_run(&mut events, &run.id, parked_at(2)).await;
    let kept = a.get_run(&run.id).await.unwrap().expect("the run").claims;
    assert!(kept > 0, "PostgreSQL counts the claims that acquire a run");
    a.until_run(&mut events, &run.id, |_, _, m| m.warm_runs == 1).await;

    let other = scratch.connect().await.expect("a second handle");
    let now = clock.now();
    let claim = Claim { run_id: run.id.clone(), owner: "intruder".into(), lease_until: now + 60_000, now };
    let (claimed, history) = match other.claim_run(claim).await.unwrap() {
        ClaimOutcome::Acquired { run, history, .. } => (run, history),
        other => panic!("expected the intruder to claim run rewritten, got {other:?}"),
    };
    assert_eq!(claimed.claims, kept + 1, "the intruder's claim counts");
    let mut rewritten = history[0].clone();
    rewritten.output = Some(Payload::encode(&42u64).unwrap());
    let mut commit = Commit::new(run.id.clone(), "intruder", now);
    commit.checkpoints.push(rewritten);
    commit.end =
        Some(TurnEnd::Suspend { wake_at: claimed.wake_at.or(history[1].wake_at), seen_wake_gen: claimed.wake_gen });
    other.commit(commit).await.unwrap();

    clock.advance(Duration::from_secs(1));
    a.assert_output(&run.id, 42u64).await;
    let m = a.metrics();
    assert_eq!((m.warm_resumes, m.warm_dropped), (0, 1), "the count showed the other claim: the engine replayed");
    assert_eq!(entries.get(), 2);
    a.shutdown().await;
}

/// The engine's claim at the run's wake finds the row locked by another transaction (as a
/// poller's claim of due runs or a delivery holds it for an instant): PostgreSQL answers `busy`
/// with nobody's lease on the run. The turn kept in memory is put back, not dropped: once the
/// row is free, the re-check's claim is the run's next one and resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_busy_on_a_row_lock_keeps_the_turn_on_postgres() {
    let Some(url) = url_or_skip("a_claim_busy_on_a_row_lock_keeps_the_turn_on_postgres") else { return };
    let scratch = ScratchSchema::new(&url, "warm_locked").await.expect("scratch schema");
    let store: Arc<dyn Store> = Arc::new(scratch.connect().await.expect("connect"));
    let a = TestEngine::with_parts(store, VirtualClock::starting_2026(), quiet_config());
    let entries = Counter::new();
    let e = entries.clone();
    a.register("two_naps", 1, move |ctx: WorkflowCtx, _: ()| {
        e.bump();
        async move {
            ctx.sleep(Duration::from_secs(1)).await;
            ctx.sleep(Duration::from_secs(1)).await;
            Ok::<_, WorkflowError>(2u32)
        }
    });
    let mut events = a.subscribe();
    let run = a.start("two_naps", &(), StartOptions::id("locked")).await.unwrap();
    a.until_run(&mut events, &run.id, |r, h, m| parked_at(1)(r, h, m) && m.warm_runs == 1).await;

    let locker = scratch.client().await.expect("client");
    locker
        .batch_execute(&format!("BEGIN; SELECT 1 FROM \"{}\".runs WHERE id = 'locked' FOR UPDATE", scratch.name()))
        .await
        .expect("lock the run's row");
    a.advance(Duration::from_secs(1));
    next_event(&mut events, WAIT, |e| matches!(e, EngineEvent::WakeDeferred { run_id, .. } if *run_id == run.id)).await;
    // Put back, not dropped (while the row stays locked, the re-checks take it out for their
    // claims and put it back again, so whether it is in the cache at this instant is not said).
    assert_eq!(a.metrics().warm_dropped, 0, "the busy claim put the kept turn back");
    locker.batch_execute("COMMIT").await.expect("release the row");

    a.until_run(&mut events, &run.id, parked_at(2)).await;
    a.advance(Duration::from_secs(1));
    a.assert_output(&run.id, 2u32).await;
    let m = a.metrics();
    assert_eq!((m.warm_resumes, m.warm_dropped), (2, 0), "both wakes resumed the kept turn");
    assert_eq!(entries.get(), 1, "the body was entered once");
    a.shutdown().await;
}
