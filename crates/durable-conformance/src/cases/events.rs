//! Events: `publish_event` to every matching waiter, and the buffer of unmatched events.

use std::sync::Arc;

use durable_core::{CheckpointStatus, Delivery, Store};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// An event is delivered to every waiter on its name whose matcher (a JSON subset) accepts
/// the payload, as a signal is to one: checkpoint, `wake_gen`, due now. Waiters that do not
/// match, or wait on another name, are untouched.
pub async fn event_reaches_every_matching_waiter(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let waits = [
        ("exact", "order.paid", json!({"order": 1})),
        ("two-fields", "order.paid", json!({"order": 1, "region": "eu"})),
        ("nested", "order.paid", json!({"meta": {"channel": "web"}})),
        ("anything", "order.paid", json!({})),
        ("other-order", "order.paid", json!({"order": 2})),
        ("other-name", "order.shipped", json!({})),
    ];
    let mut parked = Vec::new();
    for (id, name, matcher) in &waits {
        parked.push(park(s, id, event_wait(id, 0, name, matcher.clone()), Some(T0 + 10 * LEASE)).await?);
    }
    let payload = json!({"order": 1, "region": "eu", "total": 5, "meta": {"channel": "web", "agent": "x"}});
    let now = T0 + 50;
    let deliveries = s.publish_event("order.paid", json(payload.clone()), now).await?;
    let mut reached: Vec<String> = deliveries
        .iter()
        .map(|d| match d {
            Delivery::Delivered { run_id, seq: 0 } => run_id.to_string(),
            other => panic!("unexpected delivery {other:?}"),
        })
        .collect();
    reached.sort();
    assert_eq!(reached, strings(&["anything", "exact", "nested", "two-fields"]), "every accepting waiter, once each");

    for (run, (id, _, _)) in parked.iter().zip(&waits) {
        let cp = checkpoint_at(s, id, 0).await?;
        let after = get(s, id).await?;
        if reached.iter().any(|r| r == id) {
            assert_eq!((cp.status, cp.output), (CheckpointStatus::Completed, Some(json(payload.clone()))), "{id}");
            assert_eq!((after.wake_gen, after.wake_at), (run.wake_gen + 1, Some(now)), "{id} is woken");
            assert_eq!(waiter_seqs(s, id).await?, Vec::<u32>::new());
        } else {
            assert_eq!(cp.status, CheckpointStatus::Waiting, "{id} does not match");
            assert_eq!(&after, run, "{id} is untouched");
            assert_eq!(waiter_seqs(s, id).await?, [0]);
        }
    }
    Ok(())
}

/// An event nobody accepts is buffered (the answer is empty) and later consumed exactly once,
/// by the first wait on its name whose matcher accepts it — oldest accepted event first; a
/// wait that matches no buffered event registers.
pub async fn unmatched_event_is_buffered_for_a_matching_wait(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for payload in [json!({"order": 7, "n": 1}), json!({"order": 8}), json!({"order": 7, "n": 2})] {
        assert_eq!(s.publish_event("order.paid", json(payload), T0).await?, vec![], "no waiter: buffered");
    }
    start(s, "r").await?;
    let waits = [
        ("order.paid", json!({"order": 9}), None),
        ("order.shipped", json!({}), None),
        ("order.paid", json!({"order": 8}), Some(json!({"order": 8}))),
        ("order.paid", json!({"order": 7}), Some(json!({"order": 7, "n": 1}))),
        ("order.paid", json!({"order": 7}), Some(json!({"order": 7, "n": 2}))),
        ("order.paid", json!({"order": 7}), None),
    ];
    for (seq, (name, matcher, expected)) in (0..).zip(waits) {
        register_wait(s, event_wait("r", seq, name, matcher.clone())).await?;
        let output = history(s, "r").await?.into_iter().find(|cp| cp.seq == seq).and_then(|cp| cp.output);
        assert_eq!(output, expected.map(json), "wait at seq {seq} on {name} matching {matcher}");
    }
    assert_eq!(waiter_seqs(s, "r").await?, [0, 1, 5]);
    Ok(())
}
