//! Acceptance: the recovery limit counts consecutive recoveries without progress. A run whose
//! engine is killed again and again lives on as long as each recovered turn commits something;
//! a turn that kills its engine at the same step every time (a poison pill) is buried `dead`
//! once `max_recovery_attempts` recoveries in a row got nowhere — on memory and SQLite.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use durable_conformance::{TestEngine, test_config};
use durable_core::{RunId, RunStatus, StepError, codes};
use durable_runtime::{RunOutcome, StartOptions, WorkflowCtx, WorkflowError};
use support::StoreFixture;
use tokio::sync::mpsc;

on_every_store!(a_run_killed_after_each_of_20_steps_completes, a_step_that_kills_every_engine_goes_dead_once);

/// Long enough past the lease TTL for a crashed engine's leases to have expired.
fn past_the_lease() -> Duration {
    test_config().lease_ttl + Duration::from_secs(1)
}

/// The workflow `steps`: `n` steps `s0`, `s1`, … returning their index, summed. A step whose
/// index is `budget` or more never finishes: it reports its index on `hung` and stays pending,
/// as in a process that is about to be killed mid-step (the test kills the engine then).
fn register(t: &TestEngine, budget: &Arc<AtomicU32>, hung: &mpsc::UnboundedSender<u32>) {
    let (budget, hung) = (budget.clone(), hung.clone());
    t.register("steps", 1, move |ctx: WorkflowCtx, n: u32| {
        let (budget, hung) = (budget.clone(), hung.clone());
        async move {
            let mut sum = 0;
            for i in 0..n {
                let (budget, hung) = (budget.clone(), hung.clone());
                sum += ctx
                    .step(format!("s{i}"), move |_| {
                        let (budget, hung) = (budget.clone(), hung.clone());
                        async move {
                            if i >= budget.load(Ordering::SeqCst) {
                                let _ = hung.send(i);
                                std::future::pending::<()>().await;
                            }
                            Ok::<_, StepError>(i)
                        }
                    })
                    .await?;
            }
            Ok::<_, WorkflowError>(sum)
        }
    });
}

/// Runs `run` on engine after engine: each time a step hangs, its seq is recorded,
/// `next_budget(hangs so far)` is set and the engine is killed (`TestEngine::crash`); the next
/// engine recovers the run once the virtual clock passed the dead engine's lease. Ends when the
/// run is terminal, with the outcome, the seqs the run hung at (in order) and the last engine.
/// `setup` registers the workflow (and whatever else) on every engine.
async fn crash_at_every_hang(
    mut t: TestEngine,
    run: &RunId,
    hung: &mut mpsc::UnboundedReceiver<u32>,
    budget: &AtomicU32,
    next_budget: impl Fn(usize) -> u32,
    setup: impl Fn(&TestEngine),
) -> (RunOutcome, Vec<u32>, TestEngine) {
    let mut hangs = Vec::new();
    loop {
        tokio::select! {
            seq = hung.recv() => hangs.push(seq.expect("the hang channel is open")),
            outcome = t.wait_for_run(run) => return (outcome.expect("wait_for_run"), hangs, t),
        }
        budget.store(next_budget(hangs.len()), Ordering::SeqCst);
        t = t.crash();
        setup(&t);
        t.advance(past_the_lease());
    }
}

/// Killed 20 times over its life, each time right after it committed one more step (the next
/// step is running): every recovery made progress, so the run completes although 20 is past
/// the recovery limit (10). Counting every recovery of the run's life, it went `dead` at the
/// 11th.
async fn a_run_killed_after_each_of_20_steps_completes(s: StoreFixture) {
    const KILLS: u32 = 20;
    assert!(test_config().max_recovery_attempts < KILLS, "the test needs more kills than the recovery limit");
    let budget = Arc::new(AtomicU32::new(1));
    let (hung_tx, mut hung) = mpsc::unbounded_channel();
    let t = s.engine();
    register(&t, &budget, &hung_tx);
    let run = t.start("steps", &(KILLS + 1), StartOptions::id("long-lived")).await.unwrap();

    // Engine k lets steps 0..=k run: it commits step k and is killed in step k + 1.
    let (outcome, hangs, t) = crash_at_every_hang(
        t,
        &run.id,
        &mut hung,
        &budget,
        |kills| kills as u32 + 1,
        |t| register(t, &budget, &hung_tx),
    )
    .await;
    assert_eq!(outcome.status(), RunStatus::Completed, "after {} kills: {:?}", hangs.len(), outcome.run.error);
    assert_eq!(hangs, (1..=KILLS).collect::<Vec<_>>(), "killed once in each step after the first");
    assert_eq!(outcome.output::<u32>().unwrap(), (0..=KILLS).sum::<u32>());
    assert_eq!(t.step_names(&run.id).await.len(), KILLS as usize + 1, "every step committed once");
    assert_eq!(outcome.run.recovery_attempts, 0, "the last recovered turn made progress");
}

/// Twelve kills with progress (one more step each time), then step 12 kills every engine that
/// runs it: recovered 10 times in a row without progress it is run again, the 11th recovery
/// buries it `dead` with `max_recovery_attempts`, and the `on_dead` listeners fire once.
async fn a_step_that_kills_every_engine_goes_dead_once(s: StoreFixture) {
    const POISON: u32 = 12;
    let limit = test_config().max_recovery_attempts;
    assert!(POISON > limit, "the progress before the poison step alone would pass the limit");
    let budget = Arc::new(AtomicU32::new(1));
    let (hung_tx, mut hung) = mpsc::unbounded_channel();
    let (dead_tx, mut dead) = mpsc::unbounded_channel();
    let setup = {
        let (budget, hung_tx) = (budget.clone(), hung_tx.clone());
        move |t: &TestEngine| {
            register(t, &budget, &hung_tx);
            let dead_tx = dead_tx.clone();
            t.on_dead(move |run| {
                let _ = dead_tx.send(run.clone());
            });
        }
    };
    let t = s.engine();
    setup(&t);
    let run = t.start("steps", &(POISON + 1), StartOptions::id("poisoned")).await.unwrap();

    let (outcome, hangs, t) =
        crash_at_every_hang(t, &run.id, &mut hung, &budget, |kills| (kills as u32 + 1).min(POISON), &setup).await;
    assert_eq!(outcome.status(), RunStatus::Dead, "after {} kills: {:?}", hangs.len(), outcome.run.error);
    let error = outcome.run.error.as_ref().expect("a dead run has an error");
    assert_eq!(error.code(), Some(codes::MAX_RECOVERY_ATTEMPTS), "{error:?}");
    // Killed once in each of steps 1..=12 (each kill after progress), then in step 12 by the
    // turn that committed step 11 and by 10 recoveries that got nowhere.
    let expected: Vec<u32> = (1..=POISON).chain(std::iter::repeat_n(POISON, limit as usize)).collect();
    assert_eq!(hangs, expected, "where the engines were killed");
    assert_eq!(t.step_names(&run.id).await.len(), POISON as usize, "steps before the poison step committed once");
    assert_eq!(outcome.run.recovery_attempts, limit + 1, "the dead run keeps the count that buried it");

    let fired = dead.recv().await.expect("on_dead fired");
    assert_eq!((fired.id.as_str(), fired.status), ("poisoned", RunStatus::Dead));
    assert_eq!(fired.recovery_attempts, limit + 1);
    // Every engine gone (their listeners with them): the channel closes with nothing more in it.
    drop((t, setup));
    assert!(dead.recv().await.is_none(), "on_dead fired more than once");
}
