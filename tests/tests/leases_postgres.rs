//! Leases on PostgreSQL: a claim by the engine that already holds a run's lease, at an instant
//! when another transaction is writing the run's row.
//!
//! `claim_run` on PostgreSQL does not wait for a row another transaction holds (it is `busy`,
//! as last committed), so that an engine never queues behind another owner's writes. When that
//! row carries the claiming engine's own lease — left by a turn of it whose suspend was woken,
//! say — the engine must claim again at once, not wait for its own lease to expire: that wait
//! stalled runs for a whole lease period (30 s) in the broker benchmarks, where the completion
//! of a remote step and the claims of other engines write the row at the same moments.
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test leases_postgres
//! ```

use std::sync::Arc;
use std::time::Duration;

use durable::{
    Clock, Engine, EngineConfig, EngineEvent, RunStatus, StartOptions, SystemClock, WorkflowCtx, WorkflowError,
};
use durable_conformance::{FaultyStore, Method};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};

/// A hang guard for the waits below, not a timing assertion.
const WAIT: Duration = Duration::from_secs(20);

/// The engine's lease: far longer than the test may take, so waiting it out fails the test.
const LEASE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_our_own_lease_on_a_row_being_written_is_tried_again() {
    let Some(url) = url_or_skip("a_claim_of_our_own_lease_on_a_row_being_written_is_tried_again") else { return };
    let scratch = ScratchSchema::new(&url, "own_lease").await.expect("scratch schema");
    let faulty = Arc::new(FaultyStore::new(scratch.connect().await.expect("connect")));
    let mut config = EngineConfig::default();
    config.lease_ttl = LEASE;
    // Only the run's in-memory timer wakes it here.
    config.poll_interval = Duration::from_secs(3600);
    config.orphan_poll_interval = Duration::from_secs(3600);
    let engine = Engine::builder().shared_store(faulty.clone()).config(config).owner("own").build().expect("engine");
    engine.register("nap", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.sleep(Duration::from_secs(2)).await;
        Ok::<_, WorkflowError>(7u32)
    });
    let mut events = engine.subscribe();
    let id = engine.start("nap", &(), StartOptions::id("nap")).await.expect("start").id;
    tokio::time::timeout(WAIT, async {
        loop {
            if let EngineEvent::RunSuspended { run_id, .. } = events.recv().await.expect("events")
                && run_id == id
            {
                break;
            }
        }
    })
    .await
    .expect("the run never suspended");

    // As a turn whose suspend was woken leaves it: running, leased to this engine.
    let schema = scratch.name().to_string();
    let admin = scratch.client().await.expect("client");
    let until = SystemClock.now() + LEASE.as_millis() as u64;
    admin
        .batch_execute(&format!(
            "UPDATE \"{schema}\".runs SET status = 'running', lease_owner = 'own', lease_until = {until} WHERE id = 'nap'"
        ))
        .await
        .expect("lease the run to the engine");
    // Another transaction writes the row when the run's timer goes off and the engine claims it.
    let writer = scratch.client().await.expect("client");
    writer
        .batch_execute(&format!("BEGIN; SELECT 1 FROM \"{schema}\".runs WHERE id = 'nap' FOR UPDATE"))
        .await
        .expect("lock the row");
    let before = faulty.calls(Method::ClaimRun);
    tokio::time::timeout(WAIT, async {
        while faulty.calls(Method::ClaimRun) == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the timer never made the engine claim the run");
    // That claim found the row busy: the run is as the test left it.
    let row = admin
        .query_one(&format!("SELECT status, lease_owner FROM \"{schema}\".runs WHERE id = 'nap'"), &[])
        .await
        .expect("read the run");
    assert_eq!((row.get::<_, String>(0).as_str(), row.get::<_, String>(1).as_str()), ("running", "own"));
    writer.batch_execute("ROLLBACK").await.expect("unlock the row");

    // The engine claims again and finishes the run, long before its own lease would expire.
    let done = tokio::time::timeout(WAIT, engine.wait_for_run(&id)).await.expect("the run waited for its own lease");
    let done = done.expect("wait");
    assert_eq!(done.status(), RunStatus::Completed);
    assert_eq!(done.output::<u32>().expect("output"), 7);
    engine.shutdown().await;
}
