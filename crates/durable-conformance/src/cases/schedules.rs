//! Things that start runs: stored schedules saved with compare-and-set together with their
//! fires, publishes with dedupe ids and trigger runs, gathering buffers, and delayed starts.

use std::sync::Arc;
use std::time::Duration;

use durable_core::{
    BufferAppend, CreateRun, Dedupe, DueQuery, Gather, Millis, NewRun, Overlap, Payload, Publish, Published, RunId,
    RunQuery, RunStatus, SaveOutcome, SaveSchedule, Schedule, ScheduleRecord, Store, TriggerBuffer,
};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// A schedule `key` of workflow `wf` in `default`, due at `due_at`.
fn record(key: &str, due_at: Option<Millis>) -> ScheduleRecord {
    let schedule = Schedule::cron("0 9 * * MON-FRI").timezone("Europe/Paris").overlap(Overlap::BufferOne);
    let mut r = ScheduleRecord::new(key, "default", "wf", json(json!({"report": key})), schedule, T0).expect("valid");
    r.due_at = due_at;
    r
}

fn save(record: ScheduleRecord, expected: Option<u64>) -> SaveSchedule {
    SaveSchedule { record, expected, start: Vec::new() }
}

fn query(now: Millis, limit: usize) -> DueQuery {
    DueQuery { namespace: None, workflows: None, now, limit }
}

fn keys(records: &[ScheduleRecord]) -> Vec<String> {
    records.iter().map(|r| r.key.clone()).collect()
}

/// `expected: None` creates a schedule once: a second create is `Stale` with the stored
/// record, which reads back whole (every field, revision 1).
pub async fn schedule_create_is_once_per_key(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let mut r = record("daily", Some(T0 + 60_000));
    r.state.last_run_id = Some(RunId::from("sched:daily:1"));
    r.state.buffered_fire = Some(T0 + 5);
    r.state.fires = 7;
    assert_eq!(s.save_schedule(save(r.clone(), None)).await?, SaveOutcome::Saved(1));
    let stored = ScheduleRecord { revision: 1, ..r.clone() };
    assert_eq!(s.get_schedule("daily").await?, Some(stored.clone()), "every field round-trips");
    let other = record("daily", None);
    assert_eq!(s.save_schedule(save(other, None)).await?, SaveOutcome::Stale(Some(Box::new(stored.clone()))));
    assert_eq!(s.get_schedule("daily").await?, Some(stored), "the loser wrote nothing");
    assert_eq!(s.get_schedule("missing").await?, None);
    Ok(())
}

/// `expected: Some(r)` replaces revision `r` only; a save of a missing key with an
/// expectation is `Stale(None)`.
pub async fn schedule_save_is_compare_and_set(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    s.save_schedule(save(record("k", Some(T0)), None)).await?;
    let mut next = record("k", Some(T0 + 1_000));
    next.state.fires = 1;
    assert_eq!(s.save_schedule(save(next.clone(), Some(1))).await?, SaveOutcome::Saved(2));
    let SaveOutcome::Stale(Some(current)) = s.save_schedule(save(record("k", None), Some(1))).await? else {
        panic!("a save against an old revision must be stale")
    };
    assert_eq!((current.revision, current.due_at, current.state.fires), (2, Some(T0 + 1_000), 1));
    assert_eq!(s.save_schedule(save(record("nope", None), Some(1))).await?, SaveOutcome::Stale(None));
    assert_eq!(s.get_schedule("nope").await?, None);
    Ok(())
}

/// The runs of a save are created in the same write: all of them when it applies (an id
/// that exists is left alone), none when it is stale.
pub async fn schedule_save_creates_its_fires_with_it(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let existing = create(s, new_run("sched:k:2")).await?;
    s.save_schedule(save(record("k", Some(T0)), None)).await?;
    let fires = vec![new_run("sched:k:1"), NewRun { input: json(json!("other")), ..new_run("sched:k:2") }];
    let applied = SaveSchedule { record: record("k", Some(T0 + 1)), expected: Some(1), start: fires.clone() };
    assert_eq!(s.save_schedule(applied).await?, SaveOutcome::Saved(2));
    assert_eq!(get(s, "sched:k:1").await?.status, RunStatus::Pending);
    assert_eq!(get(s, "sched:k:2").await?, existing, "an existing run is left alone");
    let stale =
        SaveSchedule { record: record("k", Some(T0 + 2)), expected: Some(1), start: vec![new_run("sched:k:3")] };
    assert!(matches!(s.save_schedule(stale).await?, SaveOutcome::Stale(Some(_))));
    assert_eq!(s.get_run(&RunId::from("sched:k:3")).await?, None, "a stale save creates nothing");
    Ok(())
}

/// Concurrent schedulers firing the same revision: exactly one save applies, and the fire's
/// run exists once.
pub async fn concurrent_fires_have_one_winner(store: Arc<dyn Store>) -> CaseResult {
    store.save_schedule(save(record("k", Some(T0)), None)).await?;
    let results = race(RACERS, |i| {
        let s = store.clone();
        async move {
            let mut r = record("k", Some(T0 + 60_000));
            r.state.fires = i as u64;
            let fire = SaveSchedule { record: r, expected: Some(1), start: vec![new_run("sched:k:60000")] };
            s.save_schedule(fire).await
        }
    })
    .await;
    let saved = results.iter().filter(|r| matches!(r, Ok(SaveOutcome::Saved(2)))).count();
    assert_eq!(saved, 1, "one winner: {results:?}");
    assert!(results.iter().all(|r| matches!(r, Ok(SaveOutcome::Saved(2) | SaveOutcome::Stale(Some(_))))));
    assert_eq!(store.get_schedule("k").await?.map(|r| r.revision), Some(2));
    assert_eq!(get(&*store, "sched:k:60000").await?.status, RunStatus::Pending);
    Ok(())
}

/// `save_schedules` applies each save on its own: a stale one in the middle does not stop
/// the others; answers come in order.
pub async fn save_schedules_answers_each_in_order(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    s.save_schedule(save(record("b", None), None)).await?;
    let saves = vec![
        SaveSchedule { record: record("a", Some(T0)), expected: None, start: vec![new_run("sched:a:1")] },
        SaveSchedule { record: record("b", Some(T0)), expected: Some(9), start: vec![new_run("sched:b:1")] },
        save(record("c", Some(T0)), None),
    ];
    let out = s.save_schedules(saves).await?;
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], SaveOutcome::Saved(1));
    assert!(matches!(&out[1], SaveOutcome::Stale(Some(r)) if r.key == "b" && r.revision == 1), "{:?}", out[1]);
    assert_eq!(out[2], SaveOutcome::Saved(1));
    assert!(s.get_run(&RunId::from("sched:a:1")).await?.is_some());
    assert_eq!(s.get_run(&RunId::from("sched:b:1")).await?, None);
    Ok(())
}

/// Due schedules: `due_at <= now` (never a record without one), earliest first then key,
/// at most `limit`, filtered by namespace and workflow; `now = MAX, limit = 1` is the next.
pub async fn due_schedules_are_due_earliest_first(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let mut other_ns = record("other-ns", Some(T0));
    other_ns.namespace = "billing".into();
    let mut other_wf = record("other-wf", Some(T0));
    other_wf.workflow = "report".into();
    for r in [
        record("late", Some(T0 + 500)),
        record("b-early", Some(T0 + 100)),
        record("a-early", Some(T0 + 100)),
        record("future", Some(T0 + 10_000)),
        record("paused", None),
        other_ns,
        other_wf,
    ] {
        s.save_schedule(save(r, None)).await?;
    }
    let due = s.due_schedules(&query(T0 + 500, 10)).await?;
    assert_eq!(keys(&due), strings(&["other-ns", "other-wf", "a-early", "b-early", "late"]));
    assert_eq!(keys(&s.due_schedules(&query(T0 + 500, 2)).await?), strings(&["other-ns", "other-wf"]));
    let narrowed =
        DueQuery { namespace: Some("default".into()), workflows: Some(vec!["wf".into()]), ..query(T0 + 500, 10) };
    assert_eq!(keys(&s.due_schedules(&narrowed).await?), strings(&["a-early", "b-early", "late"]));
    let next = DueQuery { now: Millis::MAX, limit: 1, ..narrowed };
    assert_eq!(keys(&s.due_schedules(&next).await?), strings(&["a-early"]));
    assert!(s.due_schedules(&query(T0 - 1, 10)).await?.is_empty());
    Ok(())
}

/// Schedules list by key, paged with `after`, filtered by namespace; delete says whether one
/// existed and leaves the runs it started.
pub async fn list_and_delete_schedules(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let mut billing = record("b", None);
    billing.namespace = "billing".into();
    for r in [record("c", None), record("a", None), billing, record("d", None)] {
        s.save_schedule(save(r, None)).await?;
    }
    let fire = SaveSchedule { record: record("a", Some(T0)), expected: Some(1), start: vec![new_run("sched:a:1")] };
    s.save_schedule(fire).await?;
    assert_eq!(keys(&s.list_schedules(None, None, 10).await?), strings(&["a", "b", "c", "d"]));
    assert_eq!(keys(&s.list_schedules(None, Some("a"), 2).await?), strings(&["b", "c"]));
    assert_eq!(keys(&s.list_schedules(Some("default"), None, 10).await?), strings(&["a", "c", "d"]));
    assert!(s.delete_schedule("a").await?);
    assert!(!s.delete_schedule("a").await?);
    assert_eq!(s.get_schedule("a").await?, None);
    assert!(s.get_run(&RunId::from("sched:a:1")).await?.is_some(), "its runs are kept");
    Ok(())
}

fn append(workflow: &str, key: &str, gather: Gather, batch_id: &str) -> BufferAppend {
    BufferAppend {
        workflow: workflow.into(),
        key: key.into(),
        gather,
        batch_id: batch_id.into(),
        run: NewRun { workflow: workflow.into(), ..new_run("unused") },
    }
}

fn started_ids(published: &Published) -> Vec<String> {
    match published {
        Published::Done { started, .. } => started.iter().map(|c| c.run().id.to_string()).collect(),
        Published::Duplicate => panic!("not a duplicate"),
    }
}

/// A publish with a dedupe id happens once while the id is remembered: the second is
/// `Duplicate` and delivers, buffers and starts nothing; once `keep_until` has passed the id
/// publishes again.
pub async fn publish_with_a_dedupe_id_happens_once(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parked = park(s, "w", event_wait("w", 0, "order.paid", json!({})), Some(T0 + 10 * LEASE)).await?;
    let event = |now, trig: &str| Publish {
        name: "order.paid".into(),
        payload: json(json!({"order": 1})),
        now,
        dedupe: Some(Dedupe { id: "evt-1".into(), keep_until: T0 + 1_000 }),
        start: vec![new_run(trig)],
        gather: vec![append("wf", "", Gather::Batch { max_items: 10, max_wait_ms: 5_000 }, "b1")],
    };
    let Published::Done { deliveries, started } = s.publish(event(T0, "trig:wf:evt-1")).await? else {
        panic!("a first publish is not a duplicate")
    };
    assert_eq!(deliveries.len(), 1);
    assert!(matches!(&started[..], [CreateRun::Created(r)] if r.id.as_str() == "trig:wf:evt-1"));
    assert_eq!(get(s, "w").await?.wake_gen, parked.wake_gen + 1);
    assert_eq!(s.publish(event(T0 + 10, "trig:wf:again")).await?, Published::Duplicate);
    assert_eq!(s.get_run(&RunId::from("trig:wf:again")).await?, None, "a duplicate starts nothing");
    let buffers = s.due_buffers(&query(Millis::MAX, 10)).await?;
    assert_eq!(buffers.len(), 1);
    assert_eq!(buffers[0].payloads.len(), 1, "a duplicate gathers nothing");
    // A plain publish of the same name is not deduplicated, and buffers when nobody waits.
    assert_eq!(s.publish_event("order.paid", json(json!({"order": 2})), T0 + 20).await?, vec![]);
    // Expired: it publishes again.
    assert!(matches!(s.publish(event(T0 + 1_001, "trig:wf:later")).await?, Published::Done { .. }));
    assert!(s.get_run(&RunId::from("trig:wf:later")).await?.is_some());
    Ok(())
}

/// A batch gathers payloads in order and starts its run (`trig:<workflow>:<batch_id>`, the
/// payloads as a JSON array) in the publish that fills it; the next event opens a new one.
pub async fn a_full_batch_starts_in_the_publish_that_fills_it(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let batch = Gather::Batch { max_items: 3, max_wait_ms: 5_000 };
    for (i, batch_id) in ["b1", "b2", "b3", "b4"].iter().enumerate() {
        let event = Publish {
            gather: vec![append("wf", "eu", batch, batch_id)],
            ..Publish::event("order", json(json!({"n": i})), T0 + i as Millis)
        };
        let started = started_ids(&s.publish(event).await?);
        let expected: &[&str] = if i == 2 { &["trig:wf:b1"] } else { &[] };
        assert_eq!(started, strings(expected), "event {i}");
    }
    let run = get(s, "trig:wf:b1").await?;
    assert_eq!(run.input.to_value(), json!([{"n": 0}, {"n": 1}, {"n": 2}]));
    assert_eq!((run.status, run.created_at), (RunStatus::Pending, T0 + 2));
    let open = s.due_buffers(&query(Millis::MAX, 10)).await?;
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].batch_id.as_str(), open[0].first_at, open[0].due_at), ("b4", T0 + 3, T0 + 5_003));
    assert_eq!(open[0].payloads, vec![json(json!({"n": 3}))]);
    Ok(())
}

/// Due buffers come earliest first, filtered by namespace and workflow; a flush with the
/// buffer's batch id deletes it and creates its run, once, if it is due; any other flush does
/// nothing.
pub async fn due_buffers_flush_once(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let debounce = Gather::Debounce { quiet_ms: 1_000 };
    for (i, (wf, key)) in [("wf", "a"), ("wf", "b"), ("other", "a")].iter().enumerate() {
        let event = Publish {
            gather: vec![append(wf, key, debounce, &format!("{wf}-{key}"))],
            ..Publish::event("e", json(json!({"i": i})), T0 + 10 * i as Millis)
        };
        s.publish(event).await?;
    }
    // A later event on ("wf", "a") moves its due time past ("wf", "b").
    let again = Publish {
        gather: vec![append("wf", "a", debounce, "unused")],
        ..Publish::event("e", json(json!({"i": 9})), T0 + 30)
    };
    s.publish(again).await?;
    let due = |buffers: Vec<TriggerBuffer>| -> Vec<(String, String)> {
        buffers.into_iter().map(|b| (b.workflow, b.key)).collect()
    };
    assert_eq!(due(s.due_buffers(&query(T0 + 1_009, 10)).await?), vec![]);
    let all = due(s.due_buffers(&query(T0 + 1_030, 10)).await?);
    assert_eq!(all, vec![("wf".into(), "b".into()), ("other".into(), "a".into()), ("wf".into(), "a".into())]);
    let only_wf = DueQuery { workflows: Some(vec!["wf".into()]), ..query(T0 + 1_030, 10) };
    assert_eq!(due(s.due_buffers(&only_wf).await?).len(), 2);
    assert_eq!(s.flush_buffer("wf", "a", "wrong-batch", T0 + 1_030, None).await?, None);
    // Read as due before the later event moved it: not flushed before its new due time.
    assert_eq!(s.flush_buffer("wf", "a", "wf-a", T0 + 1_029, None).await?, None, "not due yet");
    let flushed = s.flush_buffer("wf", "a", "wf-a", T0 + 1_031, None).await?.expect("flushed");
    let run = flushed.into_run();
    assert_eq!((run.id.as_str(), run.input.to_value()), ("trig:wf:wf-a", json!({"i": 9})), "the last payload");
    assert_eq!(s.flush_buffer("wf", "a", "wf-a", T0 + 1_032, None).await?, None, "once");
    assert_eq!(due(s.due_buffers(&query(Millis::MAX, 10)).await?).len(), 2);
    Ok(())
}

/// A run created with `start_at` is `pending` with `wake_at = start_at`: not among pending
/// runs, and among due runs from its start time on.
pub async fn a_delayed_start_is_due_at_its_time(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let at = T0 + Duration::from_secs(30 * 86_400).as_millis() as Millis;
    let run = create(s, NewRun { start_at: Some(at), ..new_run("later") }).await?;
    assert_eq!((run.status, run.wake_at), (RunStatus::Pending, Some(at)));
    create(s, new_run("now")).await?;
    let q = |now| RunQuery { namespace: None, workflows: None, now, limit: 10, leave_queued_since: None };
    assert_eq!(s.pending_runs(&q(at)).await?, vec![RunId::from("now")], "a delayed start is not pending work");
    assert_eq!(s.due_runs(&q(at - 1)).await?, Vec::<RunId>::new());
    assert_eq!(s.due_runs(&q(at)).await?, vec![RunId::from("later")]);
    assert_eq!(get(s, "later").await?.input, Payload::from_trusted(r#"{"run":"later"}"#));
    Ok(())
}
