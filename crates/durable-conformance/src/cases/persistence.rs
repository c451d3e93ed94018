//! Persistence: what a store keeps when it is dropped and opened again.
//!
//! Runs only for stores that declare `persistent` and whose factory reopens them
//! ([`StoreFactory::reopen`]).

use durable_core::{Checkpoint, ClaimOutcome, Delivery, Payload, Run, RunId, Store, Waiter};
use serde_json::json;

use super::fixtures::*;
use crate::{CaseError, CaseResult, Requirement, StoreFactory, TestStore};

/// What [`snapshot`] reads of one run.
type Snapshot = (Option<Run>, Vec<Checkpoint>, Vec<Waiter>, Option<Payload>);

/// Everything the suite can read back about `ids`: rows, histories, waiters, the state key
/// `k`.
async fn snapshot(s: &dyn Store, ids: &[&str]) -> CaseResult<Vec<Snapshot>> {
    let mut out = Vec::new();
    for id in ids {
        let run = RunId::from(*id);
        out.push((
            s.get_run(&run).await?,
            s.history(&run).await?,
            s.waiters(&run).await?,
            s.get_state(&run, "k").await?,
        ));
    }
    Ok(out)
}

/// Runs, checkpoints, waiters, state, leases and buffered signals and events survive dropping
/// every handle and reopening the store, and behave as before.
pub async fn data_survives_reopen(factory: &dyn StoreFactory, mut store: TestStore) -> CaseResult {
    let ids = ["done", "parked", "held"];
    let before = {
        let s = &**store.store();
        start(s, "done").await?;
        let mut c = commit("done", OWNER);
        c.checkpoints.push(completed("done", 0, json!("kept")));
        c.state.push(("k".into(), json(json!({"v": 1}))));
        c.end = complete(json!("output"));
        s.commit(c).await?;
        park_on_signal(s, "parked", 1, "tok", Some(T0 + 500)).await?;
        start(s, "held").await?;
        assert_eq!(s.send_signal("buffered", json(json!("waiting for you")), T0).await?, Delivery::Buffered);
        assert_eq!(s.publish_event("evt", json(json!({"n": 1})), T0).await?, vec![]);
        snapshot(s, &ids).await?
    };
    store.close();
    let Some(reopened) = factory.reopen(&store).await else {
        return Err(CaseError::Unsupported(Requirement::Reopen));
    };
    let reopened = reopened?;
    let s = &*reopened;

    assert_eq!(snapshot(s, &ids).await?, before, "the reopened store reads as before");
    assert!(matches!(s.claim_run(claim("held", OTHER, T0 + 1)).await?, ClaimOutcome::Busy(_)), "leases survive");
    let delivery = s.send_signal("tok", json(json!("go")), T0 + 2).await?;
    assert_eq!(delivery, Delivery::Delivered { run_id: RunId::from("parked"), seq: 1 }, "waiters survive");
    start(s, "fresh").await?;
    register_wait(s, signal_wait("fresh", 0, "buffered")).await?;
    register_wait(s, event_wait("fresh", 1, "evt", json!({"n": 1}))).await?;
    let outputs: Vec<_> = history(s, "fresh").await?.into_iter().map(|cp| cp.output).collect();
    assert_eq!(outputs, [Some(json(json!("waiting for you"))), Some(json(json!({"n": 1})))], "buffers survive");
    drop(reopened);
    factory.teardown(store).await?;
    Ok(())
}
