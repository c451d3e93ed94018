//! Flow control: admission slots held in the store, taken and released atomically, handed to
//! the next waiter by priority, fairness and arrival, reclaimed when a holder's lease passes.

use std::sync::Arc;
use std::time::Duration;

use durable_core::admission::{Admission, Limits, Order, PriorityOrder, Rate, SlotRequest};
use durable_core::{
    ClaimOutcome, CreateRun, Millis, RunId, RunPatch, RunQuery, RunStatus, Store, StoreError, StoreErrorKind, protocol,
};

use super::fixtures::*;
use crate::CaseResult;

/// The step queue most cases use.
const GATE: &str = "queue:default:api";

/// A request of the step `<run>:<seq>` to pass [`GATE`] at `now`, with no lease.
fn step_request(run: &str, seq: u32, limits: Limits, now: Millis) -> SlotRequest {
    SlotRequest {
        gate: GATE.into(),
        holder: protocol::step_id(&RunId::from(run), seq),
        run_id: RunId::from(run),
        priority: 0,
        fairness_key: String::new(),
        limits,
        lease_until: None,
        max_waiting: None,
        succeeds: None,
        now,
    }
}

/// A new run `id` started under the concurrency key `gate` of limit 1, with at most
/// `max_waiting` waiting for it.
fn keyed_run(gate: &str, id: &str, max_waiting: Option<u32>) -> durable_core::NewRun {
    let mut run = new_run(id);
    run.admission = Some(SlotRequest {
        gate: gate.into(),
        holder: id.into(),
        run_id: RunId::from(id),
        priority: 0,
        fairness_key: String::new(),
        limits: concurrency(1),
        lease_until: None,
        max_waiting,
        succeeds: None,
        now: T0,
    });
    run
}

fn concurrency(n: u32) -> Limits {
    Limits { concurrency: Some(n), ..Limits::default() }
}

async fn ask(store: &dyn Store, request: &SlotRequest) -> CaseResult<Admission> {
    Ok(store.acquire_slot(request).await?)
}

/// `(held, waiting)` of [`GATE`] at `now`.
async fn counts(store: &dyn Store, now: Millis) -> CaseResult<(u32, u32)> {
    let stats = store.admission_stats(now).await?;
    let g = stats.iter().find(|g| g.gate == GATE).unwrap_or_else(|| panic!("no stats for {GATE}: {stats:?}"));
    Ok((g.held, g.waiting))
}

/// Parks run `id` (created, claimed, suspended with no wake time): a run whose step waits.
async fn parked(store: &dyn Store, id: &str) -> CaseResult {
    let run = start(store, id).await?;
    let mut c = commit(id, OWNER);
    c.end = suspend(&run, None);
    store.commit(c).await?;
    Ok(())
}

async fn due(store: &dyn Store, now: Millis) -> CaseResult<Vec<String>> {
    let due = store
        .due_runs(&RunQuery { namespace: None, workflows: None, now, limit: 100, leave_queued_since: None })
        .await?;
    Ok(due.iter().map(|r| r.to_string()).collect())
}

/// Releases the slot of `holder` (a step of a run [`OWNER`] holds) in a commit; returns the
/// runs the commit says it handed the slot to.
async fn release_in_commit(store: &dyn Store, run: &str, seq: u32, now: Millis) -> CaseResult<Vec<String>> {
    let mut c = commit(run, OWNER);
    c.now = now;
    c.release_slots.push((GATE.into(), protocol::step_id(&RunId::from(run), seq)));
    let out = store.commit(c).await?;
    Ok(out.handed_off.iter().map(|r| r.to_string()).collect())
}

/// A concurrency limit admits that many holders; the rest wait (and stay waiting when they
/// ask again), a holder asking again is still admitted, and the stats count both.
pub async fn caps_concurrency(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let l = concurrency(2);
    assert_eq!(ask(s, &step_request("a", 1, l, T0)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("b", 1, l, T0)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("c", 1, l, T0)).await?, Admission::Waiting { retry_at: None });
    assert_eq!(ask(s, &step_request("a", 1, l, T0 + 1)).await?, Admission::Admitted, "a holder is admitted again");
    assert_eq!(ask(s, &step_request("c", 1, l, T0 + 1)).await?, Admission::Waiting { retry_at: None });
    assert_eq!(counts(s, T0 + 1).await?, (2, 1));
    let (slots, waits) = s.run_admission(&RunId::from("c")).await?;
    assert!(slots.is_empty());
    assert_eq!(waits.iter().map(|w| w.holder.as_str()).collect::<Vec<_>>(), ["c:1"]);
    let (slots, _) = s.run_admission(&RunId::from("a")).await?;
    assert_eq!(slots.iter().map(|s| s.gate.as_str()).collect::<Vec<_>>(), [GATE]);
    Ok(())
}

/// A fixed-window rate admits its limit per window, tells the rest to retry at the window's
/// end, and in the next window admits the queued requests before a newcomer.
pub async fn fixed_window_rate(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let l = Limits { rate: Some(Rate::per(2, Duration::from_secs(1))), ..Limits::default() };
    let w = T0 - T0 % 1_000;
    assert_eq!(ask(s, &step_request("a", 1, l, w + 100)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("b", 1, l, w + 200)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("c", 1, l, w + 300)).await?, Admission::Waiting { retry_at: Some(w + 1_000) });
    assert_eq!(ask(s, &step_request("d", 1, l, w + 400)).await?, Admission::Waiting { retry_at: Some(w + 1_000) });
    let next = w + 1_000;
    assert_eq!(
        ask(s, &step_request("e", 1, l, next + 1)).await?,
        Admission::Waiting { retry_at: Some(next + 1_000) },
        "two wait ahead of the newcomer"
    );
    assert_eq!(ask(s, &step_request("d", 1, l, next + 2)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("c", 1, l, next + 3)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("e", 1, l, next + 4)).await?, Admission::Waiting { retry_at: Some(next + 1_000) });
    Ok(())
}

/// Serves waiters in the order `holders` asked, after a holder `h` (priorities in `prios`),
/// by releasing each in turn; returns the order the slot went round.
async fn served_order(store: &dyn Store, l: Limits, waiters: &[(&str, i32, &str)]) -> CaseResult<Vec<String>> {
    assert_eq!(ask(store, &step_request("h", 1, l, T0)).await?, Admission::Admitted);
    for (i, (run, priority, key)) in waiters.iter().enumerate() {
        let mut r = step_request(run, 1, l, T0 + 1 + i as Millis);
        r.priority = *priority;
        r.fairness_key = key.to_string();
        assert!(matches!(ask(store, &r).await?, Admission::Waiting { .. }));
    }
    let mut order = Vec::new();
    let mut last = "h".to_string();
    for i in 0..waiters.len() {
        let handed = store.release_slot(GATE, &format!("{last}:1"), T0 + 100 + i as Millis).await?;
        assert_eq!(handed.len(), 1, "one slot freed, one waiter served: {handed:?}");
        last = handed[0].to_string();
        order.push(last.clone());
    }
    Ok(order)
}

/// A freed slot goes to the highest priority first (or the lowest, when configured).
pub async fn highest_priority_first(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let order = served_order(s, concurrency(1), &[("low", 1, ""), ("high", 9, ""), ("mid", 5, "")]).await?;
    assert_eq!(order, strings(&["high", "mid", "low"]));
    let lowest = Limits { priority: PriorityOrder::LowestFirst, ..concurrency(1) };
    let mut r = step_request("x", 1, lowest, T0);
    r.gate = "queue:default:other".into();
    assert_eq!(ask(s, &r).await?, Admission::Admitted);
    for (run, p) in [("p5", 5), ("p1", 1)] {
        let mut w = step_request(run, 1, lowest, T0 + 1);
        w.gate = r.gate.clone();
        w.priority = p;
        ask(s, &w).await?;
    }
    let handed = s.release_slot(&r.gate, "x:1", T0 + 2).await?;
    assert_eq!(handed, [RunId::from("p1")]);
    Ok(())
}

/// Among equal priorities, first come first served by default.
pub async fn fifo_by_default(store: Arc<dyn Store>) -> CaseResult {
    let order = served_order(&*store, concurrency(1), &[("a", 0, ""), ("b", 0, ""), ("c", 0, "")]).await?;
    assert_eq!(order, strings(&["a", "b", "c"]));
    Ok(())
}

/// With `Order::Lifo`, last come first served.
pub async fn lifo_when_configured(store: Arc<dyn Store>) -> CaseResult {
    let l = Limits { order: Order::Lifo, ..concurrency(1) };
    let order = served_order(&*store, l, &[("a", 0, ""), ("b", 0, ""), ("c", 0, "")]).await?;
    assert_eq!(order, strings(&["c", "b", "a"]));
    Ok(())
}

/// With fairness, keys are served round robin: a key with many waiters does not hold back a
/// key with one, which is served within one turn of the slot.
pub async fn round_robin_across_fairness_keys(store: Arc<dyn Store>) -> CaseResult {
    let l = Limits { fairness: true, ..concurrency(1) };
    let waiters = [("a1", 0, "a"), ("a2", 0, "a"), ("a3", 0, "a"), ("b1", 0, "b"), ("c1", 0, "c"), ("b2", 0, "b")];
    let order = served_order(&*store, l, &waiters).await?;
    assert_eq!(order, strings(&["a1", "b1", "c1", "a2", "b2", "a3"]));
    Ok(())
}

/// A gate with neither a concurrency nor a rate limit admits everything.
pub async fn an_ungated_queue_admits_everything(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for i in 0..20 {
        assert_eq!(ask(s, &step_request(&format!("r{i}"), 1, Limits::default(), T0)).await?, Admission::Admitted);
    }
    Ok(())
}

/// A leased slot whose holder stops renewing is reclaimed once its lease passes and handed to
/// the next waiter, whose run is woken; a renewal of the holder's run lease keeps it.
pub async fn a_dead_holders_slot_is_reclaimed(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let l = concurrency(1);
    start(s, "dead").await?;
    let mut held = step_request("dead", 1, l, T0);
    held.lease_until = Some(T0 + LEASE);
    assert_eq!(ask(s, &held).await?, Admission::Admitted);
    parked(s, "waiter").await?;
    let mut w = step_request("waiter", 2, l, T0 + 1);
    w.lease_until = Some(T0 + 1 + LEASE);
    assert_eq!(ask(s, &w).await?, Admission::Waiting { retry_at: None });
    // The engine renews the run's lease, and with it the slot's.
    assert!(s.renew_lease(&RunId::from("dead"), OWNER, T0 + 2 * LEASE).await?);
    assert_eq!(ask(s, &step_request("probe", 1, l, T0 + LEASE + 1)).await?, Admission::Waiting { retry_at: None });
    assert_eq!(counts(s, T0 + LEASE + 1).await?.0, 1, "the renewed slot still counts");
    // Past the renewed lease it no longer counts, and the next call hands it on.
    let after = T0 + 2 * LEASE + 1;
    assert_eq!(counts(s, after).await?.0, 0, "an expired slot does not count");
    assert!(matches!(ask(s, &step_request("probe", 1, l, after)).await?, Admission::Waiting { .. }));
    let (slots, waits) = s.run_admission(&RunId::from("waiter")).await?;
    assert_eq!((slots.len(), waits.len()), (1, 0), "the waiter holds the reclaimed slot");
    assert_eq!(slots[0].lease_until, Some(after + LEASE), "its lease runs from the hand-off");
    assert!(due(s, after).await?.contains(&"waiter".to_string()), "the waiter's run is woken");
    Ok(())
}

/// A commit that releases a slot hands it to the next waiter in the same write: the waiter's
/// suspended run is due at once and named in `handed_off`.
pub async fn a_release_in_a_commit_hands_the_slot_on(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let l = concurrency(1);
    start(s, "holder").await?;
    assert_eq!(ask(s, &step_request("holder", 3, l, T0)).await?, Admission::Admitted);
    parked(s, "next").await?;
    assert!(matches!(ask(s, &step_request("next", 1, l, T0 + 1)).await?, Admission::Waiting { .. }));
    assert!(due(s, T0 + 5).await?.is_empty());
    assert_eq!(release_in_commit(s, "holder", 3, T0 + 5).await?, ["next"]);
    assert_eq!(due(s, T0 + 5).await?, ["next"]);
    assert_eq!(ask(s, &step_request("next", 1, l, T0 + 6)).await?, Admission::Admitted, "the slot is next's");
    assert_eq!(counts(s, T0 + 6).await?, (1, 0));
    // A hand-off to a run in the middle of a turn makes its suspension report woken.
    let run = get(s, "holder").await?;
    assert!(matches!(ask(s, &step_request("holder", 4, l, T0 + 7)).await?, Admission::Waiting { .. }));
    s.release_slot(GATE, "next:1", T0 + 8).await?;
    let mut c = commit("holder", OWNER);
    c.end = suspend(&run, None);
    assert!(s.commit(c).await?.woken, "the slot handed mid-turn wakes the suspension");
    Ok(())
}

/// Settling a run releases every slot and queued request it has; so do a cancel through
/// `update_run_if` and a deletion, each handing the slot on.
pub async fn settling_cancelling_or_deleting_a_run_releases_its_slots(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let l = concurrency(1);
    start(s, "a").await?;
    assert_eq!(ask(s, &step_request("a", 1, l, T0)).await?, Admission::Admitted);
    for id in ["b", "c", "d"] {
        parked(s, id).await?;
        assert!(matches!(ask(s, &step_request(id, 1, l, T0 + 1)).await?, Admission::Waiting { .. }));
    }
    let mut c = commit("a", OWNER);
    c.end = complete(serde_json::json!(1));
    let out = s.commit(c).await?;
    assert_eq!(out.handed_off, [RunId::from("b")], "settling a hands its slot to b");
    let patch = RunPatch { status: Some(RunStatus::Cancelled), now: T0 + 2, ..RunPatch::default() };
    assert!(s.update_run_if(&RunId::from("b"), &[], patch).await?);
    assert_eq!(s.run_admission(&RunId::from("c")).await?.0.len(), 1, "cancelling b hands its slot to c");
    assert!(due(s, T0 + 2).await?.contains(&"c".to_string()));
    assert_eq!(s.delete_run(&RunId::from("c")).await?, 1);
    assert_eq!(s.run_admission(&RunId::from("d")).await?.0.len(), 1, "deleting c hands its slot to d");
    assert!(due(s, T0 + 3).await?.contains(&"d".to_string()));
    assert!(s.run_admission(&RunId::from("a")).await?.0.is_empty());
    Ok(())
}

/// A run started under a concurrency key: admitted ones are created as usual; one over the
/// limit is created `pending` but never due nor claimable until a release hands it the slot;
/// a start past `max_waiting` is refused with `QueueFull` and writes nothing.
pub async fn a_keyed_start_waits_for_its_slot_or_is_refused(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let gate = protocol::key_gate("default", "wf", "acme");
    let keyed = |id: &str| keyed_run(&gate, id, Some(1));
    assert!(matches!(s.create_run(keyed("k1")).await?, CreateRun::Created(ref r) if r.wake_at.is_none()));
    let k2 = s.create_run(keyed("k2")).await?;
    assert_eq!(k2.run().wake_at, Some(protocol::GATED), "k2 waits for the key");
    assert_eq!(get(s, "k2").await?.wake_at, Some(protocol::GATED), "and reads back as waiting for it");
    match s.create_run(keyed("k3")).await {
        Err(StoreError::QueueFull { gate: g, held: 1, waiting: 1 }) => assert_eq!(g, gate),
        other => panic!("expected QueueFull for k3, got {other:?}"),
    }
    assert!(s.get_run(&RunId::from("k3")).await?.is_none(), "a refused start persists nothing");
    assert!(matches!(s.create_run(keyed("k2")).await?, CreateRun::Existing(_)), "an existing id is not decided again");
    let q = RunQuery { namespace: None, workflows: None, now: T0 + 10, limit: 10, leave_queued_since: None };
    assert_eq!(ids_of(&s.pending_runs(&q).await?), ["k1"], "a waiting start is not pending work");
    assert!(due(s, T0 + 10).await?.is_empty());
    assert!(matches!(s.claim_run(claim("k2", OWNER, T0 + 10)).await?, ClaimOutcome::Busy(_)));
    // k1 runs and completes: the key goes to k2, due at once.
    acquire(s, claim("k1", OWNER, T0 + 10)).await?;
    let mut c = commit("k1", OWNER);
    c.now = T0 + 20;
    c.end = complete(serde_json::json!("done"));
    assert_eq!(s.commit(c).await?.handed_off, [RunId::from("k2")]);
    assert_eq!(due(s, T0 + 20).await?, ["k2"]);
    acquire(s, claim("k2", OWNER, T0 + 21)).await?;
    assert_eq!(s.create_run(keyed("k4")).await?.run().wake_at, Some(protocol::GATED), "k4 waits behind k2");
    assert_kind(s.create_run(keyed("k5")).await, StoreErrorKind::QueueFull);
    Ok(())
}

/// The runs a store creates with no caller to refuse — a commit's children, a publish's and a
/// schedule's starts, a flushed buffer's run — take their concurrency key as a start does, but
/// are never refused however many wait (`max_waiting` is dropped): over the limit, they wait
/// `pending` for the key and are handed it in turn.
pub async fn runs_a_store_creates_take_their_key_and_are_never_refused(store: Arc<dyn Store>) -> CaseResult {
    use durable_core::{Gather, Payload, Publish, SaveSchedule, Schedule, ScheduleRecord};

    let s = &*store;
    let gate = protocol::key_gate("default", "wf", "acme");
    // `max_waiting: 0`: a start over the limit would be refused.
    let keyed = |id: &str| keyed_run(&gate, id, Some(0));
    s.create_run(keyed("holder")).await?;
    assert_kind(s.create_run(keyed("refused")).await, StoreErrorKind::QueueFull);
    // A parent's commit creates a keyed child: it waits for the key.
    let parent = start(s, "parent").await?;
    let mut c = commit("parent", OWNER);
    c.children.push(keyed("child"));
    c.end = suspend(&parent, None);
    s.commit(c).await?;
    assert_eq!(get(s, "child").await?.wake_at, Some(protocol::GATED), "the child waits for the key");
    // A publish's start.
    let event = Publish { start: vec![keyed("evt:wf:1")], ..Publish::event("e", Payload::null(), T0 + 2) };
    s.publish(event).await?;
    assert_eq!(get(s, "evt:wf:1").await?.wake_at, Some(protocol::GATED), "the event's run waits for the key");
    // A schedule's fire.
    let schedule = Schedule::every(Duration::from_secs(60));
    let record = ScheduleRecord::new("every", "default", "wf", Payload::null(), schedule, T0).expect("valid");
    s.save_schedule(SaveSchedule { record, expected: None, start: vec![keyed("sched:every:1")] }).await?;
    assert_eq!(get(s, "sched:every:1").await?.wake_at, Some(protocol::GATED), "the fire waits for the key");
    // A flushed buffer's run, with the key the engine computed for it.
    let debounce = Gather::Debounce { quiet_ms: 10 };
    let gathered = Publish {
        gather: vec![durable_core::BufferAppend {
            workflow: "wf".into(),
            key: "".into(),
            gather: debounce,
            batch_id: "b1".into(),
            run: new_run("unused"),
        }],
        ..Publish::event("e", Payload::null(), T0 + 3)
    };
    s.publish(gathered).await?;
    let request = keyed("trig:wf:b1").admission;
    let flushed = s.flush_buffer("wf", "", "b1", T0 + 20, request).await?.expect("flushed");
    assert_eq!(flushed.run().wake_at, Some(protocol::GATED), "the buffer's run waits for the key");
    assert_eq!(get(s, "trig:wf:b1").await?.wake_at, Some(protocol::GATED));
    let stats = s.admission_stats(T0 + 20).await?;
    let g = stats.iter().find(|g| g.gate == gate).expect("the key's gate");
    assert_eq!((g.held, g.waiting), (1, 4), "one holder, four waiting: none was refused");
    // The holder settles: the key goes to the first waiter, the child.
    acquire(s, claim("holder", OWNER, T0 + 30)).await?;
    let mut settle = commit("holder", OWNER);
    settle.now = T0 + 31;
    settle.end = complete(serde_json::json!("done"));
    assert_eq!(s.commit(settle).await?.handed_off, [RunId::from("child")]);
    Ok(())
}

/// A commit that settles its run and creates a run whose request `succeeds` it (a run
/// continued as new) passes the run's slot at that gate to the new run: admitted at once,
/// ahead of the runs waiting for the key, which keep waiting. A `succeeds` naming a run that
/// holds no slot there is decided as any request.
pub async fn a_successor_takes_over_its_predecessors_key(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let gate = protocol::key_gate("default", "wf", "acme");
    let keyed = |id: &str| keyed_run(&gate, id, None);
    s.create_run(keyed("r")).await?;
    s.create_run(keyed("w")).await?;
    acquire(s, claim("r", OWNER, T0 + 1)).await?;
    let mut successor = keyed("r~1");
    if let Some(a) = successor.admission.as_mut() {
        a.succeeds = Some("r".into());
    }
    let mut c = commit("r", OWNER);
    c.now = T0 + 2;
    c.children.push(successor);
    c.end = complete(serde_json::json!({"continued_as": "r~1"}));
    let out = s.commit(c).await?;
    assert!(out.settled);
    assert!(out.handed_off.is_empty(), "nothing freed: the slot passed on ({:?})", out.handed_off);
    assert_eq!(get(s, "r~1").await?.wake_at, None, "the successor holds the key, due at once");
    assert_eq!(get(s, "w").await?.wake_at, Some(protocol::GATED), "the waiter keeps waiting");
    let (slots, _) = s.run_admission(&RunId::from("r~1")).await?;
    assert_eq!(slots.iter().map(|s| s.gate.as_str()).collect::<Vec<_>>(), [gate.as_str()]);
    assert!(s.run_admission(&RunId::from("r")).await?.0.is_empty(), "the predecessor holds nothing");
    let stats = s.admission_stats(T0 + 2).await?;
    let g = stats.iter().find(|g| g.gate == gate).expect("the key's gate");
    assert_eq!((g.held, g.waiting), (1, 1));
    // The successor settles: the key goes to the waiter.
    acquire(s, claim("r~1", OWNER, T0 + 3)).await?;
    let mut settle = commit("r~1", OWNER);
    settle.now = T0 + 4;
    settle.end = complete(serde_json::json!("done"));
    assert_eq!(s.commit(settle).await?.handed_off, [RunId::from("w")]);
    // A stray `succeeds`: decided as any request (the key is w's now, so it waits).
    let mut stray = keyed("x");
    if let Some(a) = stray.admission.as_mut() {
        a.succeeds = Some("r".into());
    }
    assert_eq!(s.create_run(stray).await?.run().wake_at, Some(protocol::GATED));
    Ok(())
}

/// `commit_and_claim_handed`: the commit is applied as `commit` applies it, and the first run
/// its releases handed a slot to is claimed for the committing owner as `claim_run` claims
/// it (a run that waited for its key: pending, never run); nothing handed → no claim; a
/// refused commit claims nothing.
pub async fn a_settle_claims_the_run_it_hands_its_key_to(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let gate = protocol::key_gate("default", "wf", "acme");
    let keyed = |id: &str| keyed_run(&gate, id, None);
    for id in ["k1", "k2", "k3"] {
        s.create_run(keyed(id)).await?;
    }
    acquire(s, claim("k1", OWNER, T0 + 1)).await?;
    // A commit that hands nothing on claims nothing.
    let mut step = commit("k1", OWNER);
    step.now = T0 + 2;
    let (out, claimed) = s.commit_and_claim_handed(step, T0 + 2 + LEASE).await?;
    assert!(out.handed_off.is_empty() && claimed.is_none(), "nothing handed, nothing claimed: {out:?} {claimed:?}");
    // A refused commit (another owner's) writes nothing and claims nothing.
    let mut zombie = commit("k1", OTHER);
    zombie.end = complete(serde_json::json!("zombie"));
    assert_kind(s.commit_and_claim_handed(zombie, T0 + LEASE).await, StoreErrorKind::LeaseLost);
    assert_eq!(get(s, "k2").await?.wake_at, Some(protocol::GATED), "k2 still waits");
    // k1 settles: the key goes to k2, claimed for the owner in the same call.
    let mut settle = commit("k1", OWNER);
    settle.now = T0 + 20;
    settle.end = complete(serde_json::json!("done"));
    let (out, claimed) = s.commit_and_claim_handed(settle, T0 + 20 + LEASE).await?;
    assert!(out.settled);
    assert_eq!(out.handed_off, [RunId::from("k2")], "the key goes to k2, which stays in handed_off");
    let claimed_run = match claimed {
        Some(ClaimOutcome::Acquired { run, history, previous, recovered }) => {
            assert_eq!(run.id, RunId::from("k2"));
            assert_eq!((run.status, previous, recovered), (RunStatus::Running, RunStatus::Pending, false));
            assert_eq!((run.lease_owner.as_deref(), run.lease_until), (Some(OWNER), Some(T0 + 20 + LEASE)));
            assert!(history.is_empty());
            // It counts as any acquiring claim does (k1's own claim tells whether the store counts).
            let counts = get(s, "k1").await?.claims > 0;
            assert_eq!(run.claims, u64::from(counts), "k2's first claim, made by the settle");
            // Woken, then claimed: as a wake and a claim would leave it.
            assert_eq!(run.wake_at, Some(T0 + 20), "the hand-off's wake is the settle's time");
            run
        }
        other => panic!("expected k2 claimed with the settle, got {other:?}"),
    };
    let k2 = get(s, "k2").await?;
    assert_eq!((k2.status, k2.lease_owner.as_deref()), (RunStatus::Running, Some(OWNER)), "the claim is stored");
    assert_eq!(k2, claimed_run, "the claim's answer is the stored row");
    assert_eq!(get(s, "k1").await?.status, RunStatus::Completed);
    assert_eq!(get(s, "k3").await?.wake_at, Some(protocol::GATED), "k3 still waits behind k2");
    assert!(matches!(s.claim_run(claim("k2", OTHER, T0 + 21)).await?, ClaimOutcome::Busy(_)), "k2's lease is live");
    // The claim holds the key as an ordinary claim does: k2's settle hands it to k3.
    let mut settle = commit("k2", OWNER);
    settle.now = T0 + 30;
    settle.end = complete(serde_json::json!("done"));
    let (out, claimed) = s.commit_and_claim_handed(settle, T0 + 30 + LEASE).await?;
    assert_eq!(out.handed_off, [RunId::from("k3")]);
    assert!(matches!(claimed, Some(ClaimOutcome::Acquired { ref run, .. }) if run.id == RunId::from("k3")));
    Ok(())
}

/// `commit_and_claim_handed` when the first run a commit hands a slot to did not wait for its
/// key (a step's slot, handed to a suspended run) and more than one slot is handed on: that
/// run is woken, then claimed as `claim_run` claims it; the others are woken, not claimed.
pub async fn a_settle_claims_a_suspended_run_handed_a_step_slot(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let key = protocol::key_gate("default", "wf", "acme");
    for id in ["k1", "k2"] {
        s.create_run(keyed_run(&key, id, None)).await?;
    }
    acquire(s, claim("k1", OWNER, T0 + 1)).await?;
    parked(s, "b").await?;
    // k1's step holds the queue's one slot; b's step waits for it.
    assert_eq!(ask(s, &step_request("k1", 1, concurrency(1), T0 + 2)).await?, Admission::Admitted);
    assert_eq!(ask(s, &step_request("b", 1, concurrency(1), T0 + 2)).await?, Admission::Waiting { retry_at: None });
    // k1 releases its step's slot and settles: the slot goes to b, then the key to k2.
    let mut settle = commit("k1", OWNER);
    settle.now = T0 + 20;
    settle.release_slots.push((GATE.into(), protocol::step_id(&RunId::from("k1"), 1)));
    settle.end = complete(serde_json::json!("done"));
    let (out, claimed) = s.commit_and_claim_handed(settle, T0 + 20 + LEASE).await?;
    assert!(out.settled);
    assert_eq!(out.handed_off, [RunId::from("b"), RunId::from("k2")]);
    let Some(ClaimOutcome::Acquired { run, previous, recovered, .. }) = claimed else {
        panic!("expected b claimed with the settle, got {claimed:?}");
    };
    assert_eq!(
        (run.id.as_str(), run.status, previous, recovered),
        ("b", RunStatus::Running, RunStatus::Suspended, false)
    );
    assert_eq!((run.lease_owner.as_deref(), run.lease_until), (Some(OWNER), Some(T0 + 20 + LEASE)));
    assert_eq!(get(s, "b").await?, run, "the claim's answer is the stored row");
    let k2 = get(s, "k2").await?;
    assert_eq!(
        (k2.status, k2.wake_at, k2.lease_owner),
        (RunStatus::Pending, Some(T0 + 20), None),
        "k2 is woken, not claimed"
    );
    Ok(())
}

fn ids_of(ids: &[RunId]) -> Vec<String> {
    ids.iter().map(|r| r.to_string()).collect()
}

/// Concurrent requests, however many, never hold more slots than the limit.
pub async fn concurrent_requests_never_exceed_the_limit(store: Arc<dyn Store>) -> CaseResult {
    let answers = race(RACERS, |i| {
        let store = store.clone();
        async move { store.acquire_slot(&step_request(&format!("r{i}"), 1, concurrency(3), T0)).await }
    })
    .await;
    let admitted = answers.into_iter().map(|a| a.map(|a| a == Admission::Admitted)).collect::<Result<Vec<_>, _>>()?;
    assert_eq!(admitted.iter().filter(|a| **a).count(), 3, "exactly the limit is admitted");
    assert_eq!(counts(&*store, T0).await?, (3, RACERS as u32 - 3));
    Ok(())
}

/// The same across two handles on one store (two processes).
pub async fn concurrent_requests_across_handles_never_exceed_the_limit(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) -> CaseResult {
    let handles = [a, b];
    let answers = race(RACERS, |i| {
        let store = handle_for(&handles, i);
        async move { store.acquire_slot(&step_request(&format!("r{i}"), 1, concurrency(3), T0)).await }
    })
    .await;
    let admitted = answers.into_iter().map(|a| a.map(|a| a == Admission::Admitted)).collect::<Result<Vec<_>, _>>()?;
    assert_eq!(admitted.iter().filter(|a| **a).count(), 3, "exactly the limit is admitted across handles");
    Ok(())
}

/// A gated remote step holds its slot while its attempt is out: the accepted result releases
/// it (in the same atomic call) and hands it to the next waiter, whose run is woken.
pub async fn a_remote_steps_result_releases_its_slot(store: Arc<dyn Store>) -> CaseResult {
    use super::tasks::{done, parked_on, task};
    let s = &*store;
    let l = concurrency(1);
    assert_eq!(ask(s, &step_request("r", 1, l, T0)).await?, Admission::Admitted);
    parked_on(s, "r", task("r", 1, 1)).await?;
    parked(s, "w").await?;
    assert!(matches!(ask(s, &step_request("w", 1, l, T0 + 1)).await?, Admission::Waiting { .. }));
    let answer = s.complete_task(done("r", 1, 1, "worker-1", Ok(serde_json::json!(7)), T0 + 5)).await?;
    assert_eq!(answer, durable_core::task::TaskCompletion::Accepted);
    assert!(s.run_admission(&RunId::from("r")).await?.0.is_empty(), "the result released r's slot");
    assert_eq!(s.run_admission(&RunId::from("w")).await?.0.len(), 1, "and handed it to w");
    let due = due(s, T0 + 5).await?;
    assert!(due.contains(&"w".to_string()) && due.contains(&"r".to_string()), "both are woken: {due:?}");
    Ok(())
}
