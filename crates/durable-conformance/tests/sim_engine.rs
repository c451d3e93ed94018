//! The engine under seeded simulation (issue: determinism you can test).
//!
//! Every test here is deterministic: a simulation runs on its own paused-time runtime, and
//! one seed always does the same thing. `DURABLE_SIM_SEEDS=n` changes how many seeds the
//! big test runs (`cargo xtask sim --seeds 100000` is the nightly-size run).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use durable_conformance::sim::{Invariant, Simulation, run_samples};
use durable_runtime::{RunStatus, WorkflowCtx, WorkflowError};

fn seeds() -> u64 {
    std::env::var("DURABLE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000)
}

/// Acceptance 3: 1,000 seeds with 5% store faults (a fifth of them lost acknowledgements),
/// random crashes and restarts, one or two engines, duplicated and delayed deliveries: every
/// invariant holds and every run ends as in the fault-free run.
#[test]
fn a_thousand_seeds_of_the_samples_hold_every_invariant() {
    let reports = run_samples(0..seeds()).unwrap_or_else(|failure| panic!("{failure}"));
    // The simulation really did what it claims: faults, crashes, two engines, a run queue.
    let crashes: u32 = reports.iter().map(|r| r.crashes).sum();
    let faults: u64 = reports.iter().map(|r| r.store_faults).sum();
    let two_engines = reports.iter().filter(|r| r.engines == 2).count();
    let queued = reports.iter().filter(|r| r.trace.iter().any(|l| l.contains(" queue "))).count();
    let recovered = reports.iter().filter(|r| r.trace.iter().any(|l| l.contains("recovered: true"))).count();
    let workflows: BTreeSet<&str> = reports
        .iter()
        .flat_map(|r| r.trace.iter())
        .filter_map(|l| l.split_once(" (sim.").map(|(_, w)| w.trim_end_matches(')')))
        .collect();
    println!(
        "{} seeds: {crashes} crashes, {faults} store faults, {two_engines} with two engines, {queued} with \
         delivery faults, {recovered} with recovered runs, workflows {workflows:?}",
        reports.len()
    );
    assert!(crashes as usize > reports.len() / 2, "crashes happen ({crashes})");
    assert!(faults as usize > reports.len() * 10, "store faults happen ({faults})");
    assert!(two_engines > reports.len() / 4, "engines share the store ({two_engines})");
    assert!(queued > 0 && recovered > 0, "deliveries are disturbed ({queued}) and runs recovered ({recovered})");
    assert_eq!(workflows.len(), 6, "every sample workflow runs: {workflows:?}");
    for r in &reports {
        for (id, end) in &r.runs {
            assert!(end.status.is_terminal(), "seed {}: run {id} ended {:?}", r.seed, end.status);
        }
    }
}

/// Acceptance 4: with the lease check planted out of the store (claims take runs another
/// engine holds), some seed among the first 1,000 fails, and rerunning it fails identically.
#[test]
fn a_planted_lease_bug_is_found_and_its_seed_fails_identically_again() {
    let failure = (0..1_000)
        .find_map(|seed| Simulation::seeded(seed).samples().plant_lease_bug().run().err())
        .expect("some seed among the first 1,000 finds the planted bug");
    println!("{failure}");
    assert!(failure.to_string().contains(&format!("cargo xtask sim --seed {}", failure.seed)), "{failure}");
    assert!(
        matches!(
            failure.invariant,
            Invariant::ConcurrentExecution | Invariant::StepReexecuted | Invariant::DuplicateCompletion
        ),
        "the bug shows as two engines executing one run: {failure}"
    );
    let again = Simulation::seeded(failure.seed).samples().plant_lease_bug().run().expect_err("the seed fails again");
    assert_eq!((again.invariant, &again.message), (failure.invariant, &failure.message));
    assert_eq!(again.trace_hash, failure.trace_hash, "the same seed takes the same path to the failure");
    assert_eq!(again.trace, failure.trace);
    // Without the bug, the same seed passes.
    Simulation::seeded(failure.seed).samples().run().unwrap_or_else(|f| panic!("without the bug: {f}"));
}

/// Acceptance 5: two runs of one seed produce the same sequence of events; different seeds
/// do different things.
#[test]
fn one_seed_gives_one_trace() {
    let mut hashes = BTreeSet::new();
    for seed in [1, 2, 3, 42, 1_000_003] {
        let a = Simulation::seeded(seed).samples().run().unwrap_or_else(|f| panic!("{f}"));
        let b = Simulation::seeded(seed).samples().run().unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.trace_hash, b.trace_hash);
        hashes.insert(a.trace_hash);
    }
    assert_eq!(hashes.len(), 5, "each seed has its own trace");
}

/// Users simulate their own workflows: a correct one passes every seed.
#[test]
fn a_users_workflow_passes_under_simulation() {
    for seed in 0..50 {
        let report = Simulation::seeded(seed)
            .register(|engine| {
                engine.register("order", 1, |ctx: WorkflowCtx, qty: u32| async move {
                    let price: u32 = ctx.step("price", move |_| async move { Ok(qty * 3) }).await?;
                    let token = format!("paid-{qty}");
                    let paid: bool = ctx.wait_for_signal(&token).await?;
                    ctx.sleep(std::time::Duration::from_secs(60)).await;
                    let receipt: String =
                        ctx.step("receipt", move |_| async move { Ok(format!("{price}:{paid}")) }).await?;
                    Ok::<_, WorkflowError>(receipt)
                });
            })
            .start("order", "o1", &2u32)
            .start("order", "o2", &5u32)
            .signal("paid-2", &true, std::time::Duration::from_secs(10))
            .signal("paid-5", &false, std::time::Duration::from_secs(90))
            .run()
            .unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(report.runs["o1"].output.as_deref(), Some("\"6:true\""));
        assert_eq!(report.runs["o2"].output.as_deref(), Some("\"15:false\""));
    }
}

/// Users simulate their own workflows: one with a side effect outside its steps (the body
/// counts its own executions, which replay repeats) is caught by some seed, as an outcome
/// that differs from the fault-free run.
#[test]
fn a_users_side_effect_outside_a_step_is_caught() {
    let failure = (0..200)
        .find_map(|seed| {
            let bodies = Arc::new(AtomicU32::new(0));
            Simulation::seeded(seed)
                .register(move |engine| {
                    let bodies = bodies.clone();
                    engine.register("leaky", 1, move |ctx: WorkflowCtx, (): ()| {
                        let bodies = bodies.clone();
                        async move {
                            ctx.step("a", |_| async { Ok(()) }).await?;
                            ctx.sleep(std::time::Duration::from_secs(30)).await;
                            // Wrong: counted outside a step, so every replay counts again.
                            let n = bodies.fetch_add(1, Ordering::SeqCst);
                            ctx.step("b", move |_| async move { Ok(n) }).await?;
                            Ok::<_, WorkflowError>(n)
                        }
                    });
                })
                .start("leaky", "l1", &())
                .run()
                .err()
        })
        .expect("some seed catches the side effect");
    assert_eq!(failure.invariant, Invariant::OutcomeDiffers, "{failure}");
    assert!(failure.message.contains("run l1"), "{failure}");
}

/// A run the fault-free run cannot finish is reported as stuck, naming it.
#[test]
fn a_run_that_never_finishes_is_reported_stuck() {
    let failure = Simulation::seeded(5)
        .horizon(std::time::Duration::from_secs(3_600))
        .register(|engine| {
            engine.register("forever", 1, |ctx: WorkflowCtx, (): ()| async move {
                loop {
                    ctx.sleep(std::time::Duration::from_secs(600)).await;
                }
                #[allow(unreachable_code)]
                Ok::<(), WorkflowError>(())
            });
        })
        .start("forever", "f1", &())
        .run()
        .expect_err("a run that sleeps forever never settles");
    assert_eq!(failure.invariant, Invariant::Stuck, "{failure}");
    assert!(failure.message.contains("f1"), "{failure}");
    assert!(failure.to_string().contains("Simulation::seeded(5)"), "the failure says how to reproduce it");
    assert!(!failure.to_string().contains("xtask"), "a user's simulation is not the repository's samples");
}

/// A run waiting for a signal nobody sends is a legitimate wait, not a stuck run.
#[test]
fn a_run_waiting_for_a_signal_is_a_legitimate_wait() {
    let report = Simulation::seeded(11)
        .register(|engine| {
            engine.register("patient", 1, |ctx: WorkflowCtx, (): ()| async move {
                let v: u32 = ctx.wait_for_signal("never-sent").await?;
                Ok::<_, WorkflowError>(v)
            });
        })
        .start("patient", "p1", &())
        .run()
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.runs["p1"].status, RunStatus::Suspended);
}
