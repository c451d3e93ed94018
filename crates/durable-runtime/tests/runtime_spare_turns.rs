//! `Metrics::turns_without_progress` counts spare turns: turns that claimed a run and got
//! nowhere.

mod support;

use std::time::Duration;

use durable_core::{RunPatch, RunStatus};
use durable_runtime::{Clock, StartOptions, WorkflowCtx, WorkflowError};
use support::StoreFixture;

/// Registers `napper`: a step, a one-hour sleep, a step. Its first turn suspends it and its
/// second completes it: two turns per run, both with progress.
fn register_napper(t: &durable_conformance::TestEngine) {
    t.register("napper", 1, |ctx: WorkflowCtx, i: u64| async move {
        let a: u64 = ctx.step("before", move |_| async move { Ok(i) }).await?;
        ctx.sleep(Duration::from_secs(3600)).await;
        let b: u64 = ctx.step("after", move |_| async move { Ok(a + 1) }).await?;
        Ok::<_, WorkflowError>(b)
    });
}

/// The metric can fail: a run made to look due although its sleep is not (as a store whose
/// due index lied would) is executed by the due poller, replays, finds nothing to do and
/// suspends again — one turn without progress.
async fn a_forced_spare_turn_is_counted(s: StoreFixture) {
    let t = s.engine();
    register_napper(&t);
    let run = t.start("napper", &1u64, StartOptions::id("nap")).await.expect("start");
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    assert_eq!(t.metrics().turns_without_progress, 0);
    let mut events = t.subscribe();
    let now = t.clock().now();
    let patch = RunPatch { wake_at: Some(Some(now)), now, ..Default::default() };
    assert!(t.store().update_run_if(&run.id, &[RunStatus::Suspended], patch).await.expect("patch"));
    t.poll_now();
    support::turn_started(&mut events, &run.id).await;
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;
    // Every turn after the first got nowhere (the pollers may queue the run more than once).
    let m = t.metrics();
    assert!(m.turns_without_progress >= 1 && m.turns == 1 + m.turns_without_progress, "{m:?}");
    // The real wake still makes progress.
    t.advance(Duration::from_secs(3600));
    t.assert_output(&run.id, 2u64).await;
    let after = t.metrics();
    assert_eq!(after.turns_without_progress, m.turns_without_progress, "{after:?}");
}

on_every_store!(a_forced_spare_turn_is_counted);
