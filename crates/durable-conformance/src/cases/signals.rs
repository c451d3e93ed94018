//! Signals: `send_signal` to waiters and into the per-token buffer, and races with waits.

use std::sync::Arc;

use durable_core::{
    BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, CheckpointStatus, ClaimOutcome, Delivery, Millis,
    RunId, RunQuery, RunStatus, Store,
};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// A signal to a token with a waiter is delivered atomically: the waiter is removed, the
/// payload recorded as the `completed` checkpoint at its seq, `wake_gen` incremented and the
/// suspended run made due now.
pub async fn signal_to_waiter_records_and_wakes(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parked = park_on_signal(s, "w", 2, "tok", Some(T0 + 10 * LEASE)).await?;
    let now = T0 + 50;
    let delivery = s.send_signal("tok", json(json!({"approved": true})), now).await?;
    assert_eq!(delivery, Delivery::Delivered { run_id: RunId::from("w"), seq: 2 });

    let cp = checkpoint_at(s, "w", 2).await?;
    assert_eq!((cp.seq, cp.status), (2, CheckpointStatus::Completed));
    assert_eq!(cp.output, Some(json(json!({"approved": true}))));
    let run = get(s, "w").await?;
    assert_eq!(run.wake_gen, parked.wake_gen + 1);
    assert_eq!((run.status, run.wake_at), (RunStatus::Suspended, Some(now)), "due now, for the timer poller");
    assert_eq!(waiter_seqs(s, "w").await?, Vec::<u32>::new(), "the waiter was taken");
    let due =
        s.due_runs(&RunQuery { namespace: None, workflows: None, now, limit: 10, leave_queued_since: None }).await?;
    assert_eq!(due, [RunId::from("w")]);
    assert_eq!(s.send_signal("tok", json(json!(2)), now).await?, Delivery::Buffered, "one waiter, one delivery");
    Ok(())
}

/// `send_signal_and_claim` delivers as `send_signal` does and claims the run it woke when it
/// is the claim's run, as `claim_run_from` claims it (history from the seq asked, the signal
/// included); delivered to another run, or buffered, it claims nothing and that run is only
/// woken.
pub async fn signal_and_claim_claims_the_run_it_wakes(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parked = park_on_signal(s, "w", 2, "tok", Some(T0 + 10 * LEASE)).await?;
    let now = T0 + 50;
    let (delivery, claimed) = s.send_signal_and_claim("tok", json(json!("yes")), claim("w", OTHER, now), 2).await?;
    assert_eq!(delivery, Delivery::Delivered { run_id: RunId::from("w"), seq: 2 });
    match claimed {
        Some(ClaimOutcome::Acquired { run, history, previous, recovered }) => {
            assert_eq!((previous, recovered), (RunStatus::Suspended, false));
            assert_eq!(
                history.iter().map(|cp| (cp.seq, cp.status)).collect::<Vec<_>>(),
                [(2, CheckpointStatus::Completed)]
            );
            assert_eq!(history[0].output, Some(json(json!("yes"))), "the claim reads the signal");
            assert_eq!(
                (run.status, run.lease_owner.as_deref(), run.lease_until),
                (RunStatus::Running, Some(OTHER), Some(now + LEASE))
            );
            assert_eq!(run.wake_gen, parked.wake_gen + 1, "woken by the delivery");
            assert_eq!(run.claims, parked.claims + 1, "one claim more");
            assert_eq!(get(s, "w").await?, run, "the claim's run is the stored one");
        }
        other => panic!("expected the signal to claim run w, got {other:?}"),
    }
    assert_eq!(waiter_seqs(s, "w").await?, Vec::<u32>::new(), "the waiter was taken");

    // Delivered to another run (the token's oldest wait is not the claim's run's): that run is
    // woken, nobody claims it, and the claim's run is untouched.
    let x = park_on_signal(s, "x", 0, "shared", None).await?;
    let y = park_on_signal(s, "y", 0, "shared", None).await?;
    let (delivery, claimed) = s.send_signal_and_claim("shared", json(json!(1)), claim("y", OTHER, now), 0).await?;
    assert_eq!((delivery, claimed), (Delivery::Delivered { run_id: RunId::from("x"), seq: 0 }, None));
    let woken = get(s, "x").await?;
    assert_eq!((woken.status, woken.wake_at, woken.lease_owner), (RunStatus::Suspended, Some(now), None));
    assert_eq!(woken.claims, x.claims, "not claimed");
    assert_eq!(get(s, "y").await?, y, "the claim's run is untouched");

    // Buffered: nothing claimed.
    let (delivery, claimed) = s.send_signal_and_claim("nobody", json(json!(2)), claim("y", OTHER, now), 0).await?;
    assert_eq!((delivery, claimed), (Delivery::Buffered, None));
    assert_eq!(get(s, "y").await?, y);
    Ok(())
}

/// Signals with no waiter are buffered FIFO per token, and consumed one per wait in order;
/// tokens do not share buffers.
pub async fn signals_are_buffered_fifo_per_token(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for (token, n) in [("a", 1), ("b", 1), ("a", 2), ("a", 3)] {
        let delivery = s.send_signal(token, json(json!(format!("{token}{n}"))), T0).await?;
        assert_eq!(delivery, Delivery::Buffered);
    }
    start(s, "r").await?;
    let waits = [("a", Some("a1")), ("b", Some("b1")), ("a", Some("a2")), ("b", None), ("a", Some("a3"))];
    for (seq, (token, expected)) in (0..).zip(waits) {
        register_wait(s, signal_wait("r", seq, token)).await?;
        let output = history(s, "r").await?.into_iter().find(|cp| cp.seq == seq).and_then(|cp| cp.output);
        assert_eq!(output, expected.map(|p| json(json!(p))), "wait at seq {seq} on {token}");
    }
    assert_eq!(waiter_seqs(s, "r").await?, [3], "only the wait on the empty buffer is registered");
    Ok(())
}

/// Of several runs waiting on one token, the oldest waiter is served first; waiters of
/// other tokens are untouched.
pub async fn oldest_waiter_is_served_first(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for id in ["r2", "r3", "r1"] {
        park_on_signal(s, id, 0, "tok", None).await?;
    }
    park_on_signal(s, "x", 0, "other", None).await?;
    for (n, expected) in [(1, "r2"), (2, "r3"), (3, "r1")] {
        let delivery = s.send_signal("tok", json(json!(n)), T0 + n).await?;
        assert_eq!(delivery, Delivery::Delivered { run_id: RunId::from(expected), seq: 0 }, "signal {n}");
        assert_eq!(checkpoint_at(s, expected, 0).await?.output, Some(json(json!(n))));
    }
    assert_eq!(s.send_signal("tok", json(json!(4)), T0 + 4).await?, Delivery::Buffered);
    assert_eq!(waiter_seqs(s, "x").await?, [0]);
    Ok(())
}

/// 50 concurrent `send_signal` calls race 50 waits registering on one token: every payload
/// is consumed exactly once — each wait ends up holding one, none is left in the buffer,
/// none is lost or duplicated — and every reported delivery points at the checkpoint holding
/// that payload.
pub async fn concurrent_signals_and_waits_lose_nothing(store: Arc<dyn Store>) -> CaseResult {
    signal_race(&[store]).await
}

/// How many signals and how many waits race in [`signal_race`].
const RACING: usize = 50;
/// The token they race on.
const CONTENDED: &str = "contended";

/// Racer `i` of [`signal_race`]: the first [`RACING`] send signal `i`, the others register
/// the wait of `waiter`.
async fn send_or_wait(store: Arc<dyn Store>, i: usize, waiter: String) -> CaseResult<Option<Delivery>> {
    if i < RACING {
        return Ok(Some(store.send_signal(CONTENDED, json(json!(i)), T0 + 1).await?));
    }
    register_wait(&*store, signal_wait(&waiter, 0, CONTENDED)).await?;
    Ok(None)
}

/// The race of [`concurrent_signals_and_waits_lose_nothing`], across `handles`.
pub(crate) async fn signal_race(handles: &[Arc<dyn Store>]) -> CaseResult {
    let s = &*handles[0];
    let racers: Vec<String> = (0..RACING).map(|i| format!("racer-{i}")).collect();
    for id in &racers {
        start(s, id).await?;
    }
    let results = race(2 * RACING, |i| send_or_wait(handle_for(handles, i), i, racers[i % RACING].clone())).await;

    // As many signals as waits: once the race is over, in a store where each call is atomic
    // every wait holds a payload (no waiter is left while a signal sits in the buffer).
    let mut consumed = Vec::new();
    for id in &racers {
        let cp = history(s, id).await?.into_iter().find(|cp| cp.seq == 0);
        let cp = cp.unwrap_or_else(|| panic!("{id} still waits, though as many signals as waits were sent"));
        assert_eq!(cp.status, CheckpointStatus::Completed, "{id}");
        assert_eq!(waiter_seqs(s, id).await?, Vec::<u32>::new(), "{id} received a signal and still waits");
        let payload = cp.output.unwrap_or_else(|| panic!("{id} received a signal without payload"));
        consumed.push(payload.decode::<usize>().unwrap_or_else(|e| panic!("{id}: bad payload: {e}")));
    }
    consumed.sort_unstable();
    assert_eq!(consumed, (0..RACING).collect::<Vec<_>>(), "every signal is consumed exactly once");

    // And nothing is left over: a fresh wait finds the buffer empty.
    start(s, "late").await?;
    register_wait(s, signal_wait("late", 0, CONTENDED)).await?;
    assert_eq!(waiter_seqs(s, "late").await?, [0], "a signal was buffered twice");

    for (i, result) in results.into_iter().enumerate() {
        if let Some(Delivery::Delivered { run_id, seq }) = result? {
            let cp = checkpoint_at(s, run_id.as_str(), seq).await?;
            assert_eq!(cp.output, Some(json(json!(i))), "signal {i} was reported delivered to {run_id}:{seq}");
        }
    }
    Ok(())
}

/// A summary of buffered deliveries, as [`Store::buffered`] lists them.
fn summary(kind: BufferedKind, key: &str, count: u64, oldest: Millis, newest: Millis) -> BufferedDeliveries {
    BufferedDeliveries { kind, key: key.to_string(), count, oldest_at: T0 + oldest, newest_at: T0 + newest }
}

/// Lists what [`Store::buffered`] answers for one query.
async fn buffered(
    s: &dyn Store,
    kind: Option<BufferedKind>,
    prefix: Option<&str>,
    oldest_before: Option<Millis>,
    limit: usize,
) -> CaseResult<Vec<BufferedDeliveries>> {
    let query = BufferedQuery { kind, prefix: prefix.map(str::to_string), oldest_before, limit };
    Ok(s.buffered(&query).await?)
}

/// Buffers the deliveries the buffer cases look at: signals on `b-2` (at +10 and +20), `a-1`
/// (+5), `Zed` (+30) and `delivered` (taken by its waiter), events `order.paid` (+7 and +9).
async fn buffer_some(s: &dyn Store) -> CaseResult {
    park_on_signal(s, "w", 0, "delivered", None).await?;
    for (token, at) in [("b-2", 10), ("a-1", 5), ("b-2", 20), ("Zed", 30), ("delivered", 40)] {
        s.send_signal(token, json(json!(format!("{token}@{at}"))), T0 + at).await?;
    }
    for (n, at) in [(1, 7), (2, 9)] {
        assert_eq!(s.publish_event("order.paid", json(json!({"n": n})), T0 + at).await?, vec![]);
    }
    Ok(())
}

/// Buffered signals and events are listed per token or event name — count, oldest and newest
/// buffering time — signals first, each kind in byte order of its keys (`Zed` before `a-1`);
/// a delivered signal is not listed, a consumed one no longer counts; the kind, prefix,
/// oldest-before and limit filters apply.
pub async fn buffered_deliveries_are_listed_per_key(store: Arc<dyn Store>) -> CaseResult {
    use BufferedKind::{Event, Signal};
    let s = &*store;
    assert_eq!(buffered(s, None, None, None, 100).await?, [], "nothing buffered yet");
    buffer_some(s).await?;
    let all = [
        summary(Signal, "Zed", 1, 30, 30),
        summary(Signal, "a-1", 1, 5, 5),
        summary(Signal, "b-2", 2, 10, 20),
        summary(Event, "order.paid", 2, 7, 9),
    ];
    assert_eq!(buffered(s, None, None, None, 100).await?, all, "every key, signals first, in byte order");
    assert_eq!(buffered(s, None, None, None, 2).await?, all[..2], "the limit");
    assert_eq!(buffered(s, None, None, None, 3).await?, all[..3], "the limit, across the kinds");
    assert_eq!(buffered(s, Some(Event), None, None, 100).await?, all[3..], "events only");
    assert_eq!(buffered(s, Some(Signal), None, None, 100).await?, all[..3], "signals only");
    assert_eq!(buffered(s, None, Some("b-"), None, 100).await?, all[2..3], "a prefix");
    assert_eq!(buffered(s, None, Some("order."), None, 100).await?, all[3..], "a prefix of an event name");
    assert_eq!(buffered(s, None, Some("nothing"), None, 100).await?, [], "a prefix of no key");
    assert_eq!(
        buffered(s, None, None, Some(T0 + 10), 100).await?,
        [all[1].clone(), all[3].clone()],
        "keys whose oldest was buffered before +10 (b-2's oldest is at +10)"
    );
    start(s, "r").await?;
    register_wait(s, signal_wait("r", 0, "b-2")).await?;
    assert_eq!(checkpoint_at(s, "r", 0).await?.output, Some(json(json!("b-2@10"))), "the oldest is consumed");
    assert_eq!(buffered(s, Some(Signal), Some("b-2"), None, 100).await?, [summary(Signal, "b-2", 1, 20, 20)]);
    Ok(())
}

/// [`Store::purge_buffered`] deletes the buffered deliveries of exactly one kind and key —
/// all of them, or those buffered before a time — and says how many; other keys, the other
/// kind and later deliveries are kept, and a wait on the key then takes what is left.
pub async fn purging_buffered_deliveries_deletes_only_those_asked(store: Arc<dyn Store>) -> CaseResult {
    use BufferedKind::{Event, Signal};
    let s = &*store;
    buffer_some(s).await?;
    let purge = |kind, key: &str, before: Option<Millis>| BufferedPurge {
        kind,
        key: key.to_string(),
        buffered_before: before.map(|b| T0 + b),
    };
    assert_eq!(s.purge_buffered(&purge(Signal, "b-2", Some(20))).await?, 1, "b-2's delivery at +10, not +20");
    assert_eq!(s.purge_buffered(&purge(Signal, "b-", None)).await?, 0, "a key is matched exactly");
    assert_eq!(s.purge_buffered(&purge(Event, "a-1", None)).await?, 0, "the kind counts");
    assert_eq!(s.purge_buffered(&purge(Signal, "unknown", None)).await?, 0);
    assert_eq!(s.purge_buffered(&purge(Signal, "Zed", None)).await?, 1, "all of Zed's");
    assert_eq!(s.purge_buffered(&purge(Event, "order.paid", Some(9))).await?, 1, "the event at +7");
    assert_eq!(
        buffered(s, None, None, None, 100).await?,
        [summary(Signal, "a-1", 1, 5, 5), summary(Signal, "b-2", 1, 20, 20), summary(Event, "order.paid", 1, 9, 9)]
    );
    start(s, "r").await?;
    register_wait(s, signal_wait("r", 0, "b-2")).await?;
    register_wait(s, signal_wait("r", 1, "Zed")).await?;
    register_wait(s, event_wait("r", 2, "order.paid", json!({}))).await?;
    assert_eq!(checkpoint_at(s, "r", 0).await?.output, Some(json(json!("b-2@20"))), "what was kept is taken");
    assert_eq!(checkpoint_at(s, "r", 2).await?.output, Some(json(json!({"n": 2}))));
    assert_eq!(waiter_seqs(s, "r").await?, [1], "nothing is left for Zed: its wait registers");
    Ok(())
}
