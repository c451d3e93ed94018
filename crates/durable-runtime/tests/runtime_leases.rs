//! Keeping a turn's lease: a long step renews it at half-life; a turn whose renewals keep
//! failing stops before the lease it holds runs out (so no other engine can take the run while
//! it still executes), and one failed renewal is tried again instead of stopping the turn.
//!
//! These run on paused tokio time with a `TokioClock`, so lease times (on the engine's clock)
//! and renewal waits (tokio's) move together, skipping ahead whenever everything waits.

use std::sync::Arc;
use std::time::Duration;

use durable_conformance::{Counter, Fault, FaultyStore, Method};
use durable_core::{Millis, RunId, Store};
use durable_runtime::{
    Clock, Engine, EngineConfig, EngineEvent, RunStatus, StartOptions, TokioClock, WorkflowCtx, WorkflowError,
};
use durable_store_memory::MemoryStore;
use parking_lot::Mutex;
use tokio::sync::watch;

const TTL: Duration = Duration::from_secs(10);

/// When the step's execution ended (its future completed or was dropped), on the engine clock.
#[derive(Clone, Default)]
struct Ended(Arc<Mutex<Vec<Millis>>>);

struct OnDrop(Ended, TokioClock);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.0.lock().push(self.1.now());
    }
}

/// A workflow whose one step waits until `open` says so.
fn engine(
    store: Arc<FaultyStore<MemoryStore>>,
    clock: TokioClock,
    open: watch::Receiver<bool>,
) -> (Engine, Counter, Ended) {
    let mut config = EngineConfig::default();
    config.lease_ttl = TTL;
    config.store_retry_backoff = Duration::from_millis(500);
    config.orphan_poll_interval = Duration::from_secs(5);
    let engine = Engine::builder().shared_store(store).clock(clock).config(config).owner("leases").build().unwrap();
    let (runs, ended) = (Counter::new(), Ended::default());
    let (r, e) = (runs.clone(), ended.clone());
    engine.register("long", 1, move |ctx: WorkflowCtx, (): ()| {
        let (runs, ended, open) = (r.clone(), e.clone(), open.clone());
        async move {
            ctx.step("work", move |_| {
                runs.bump();
                let (guard, mut open) = (OnDrop(ended.clone(), clock), open.clone());
                async move {
                    let _guard = guard;
                    let _ = open.wait_for(|o| *o).await;
                    Ok(())
                }
            })
            .await?;
            Ok::<_, WorkflowError>(())
        }
    });
    (engine, runs, ended)
}

async fn turn_started(events: &mut tokio::sync::broadcast::Receiver<EngineEvent>) {
    while !matches!(events.recv().await.unwrap(), EngineEvent::TurnStarted { .. }) {}
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_long_step_keeps_its_lease_through_one_failed_renewal() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let clock = TokioClock::starting_at(1_767_225_600_000);
    let (tx, open) = watch::channel(false);
    let (engine, runs, _) = engine(store.clone(), clock, open);
    let mut events = engine.subscribe();
    store.arm(Fault::on(Method::RenewLease).times(1));
    let run = engine.start("long", &(), StartOptions::id("long")).await.unwrap();
    turn_started(&mut events).await;
    // Ten lease lifetimes of work: renewed at every half-life, the first renewal failing once.
    tokio::time::sleep(TTL * 10).await;
    assert!(store.calls(Method::RenewLease) >= 19, "renewed every half-life ({})", store.calls(Method::RenewLease));
    let held = store.inner().get_run(&run.id).await.unwrap().unwrap();
    assert_eq!(held.lease_owner.as_deref(), Some("leases"));
    assert!(held.lease_until.unwrap() > clock.now(), "the lease is still live");
    tx.send_replace(true);
    let done = engine.wait_for_run(&run.id).await.unwrap();
    assert_eq!(done.status(), RunStatus::Completed);
    assert_eq!(runs.get(), 1, "the step ran once: one failed renewal did not stop the turn");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_turn_whose_renewals_keep_failing_stops_before_its_lease_runs_out() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let clock = TokioClock::starting_at(1_767_225_600_000);
    let (tx, open) = watch::channel(false);
    let (engine, runs, ended) = engine(store.clone(), clock, open);
    let mut events = engine.subscribe();
    store.arm(Fault::on(Method::RenewLease));
    let id = RunId::from("doomed");
    engine.start("long", &(), StartOptions::id("doomed")).await.unwrap();
    turn_started(&mut events).await;
    let lease_until = store.inner().get_run(&id).await.unwrap().unwrap().lease_until.unwrap();
    // The turn stops by itself (the step's future is dropped) while its lease still holds.
    for _ in 0..1_000 {
        if !ended.0.lock().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!ended.0.lock().is_empty(), "the turn never stopped although its lease could not be renewed");
    let stopped_at = ended.0.lock()[0];
    assert!(stopped_at < lease_until, "stopped at {stopped_at}, lease until {lease_until}");
    assert!(
        stopped_at + 2_000 >= lease_until,
        "but not long before: stopped at {stopped_at}, lease until {lease_until}"
    );
    // Once the store answers again, the run is recovered after its lease and completes.
    store.clear_faults();
    tx.send_replace(true);
    let done = engine.wait_for_run(&id).await.unwrap();
    assert_eq!(done.status(), RunStatus::Completed);
    assert_eq!(runs.get(), 2, "the cut-off step ran again (it was never committed)");
}
