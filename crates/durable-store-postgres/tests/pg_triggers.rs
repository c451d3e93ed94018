//! What the conformance suite does not look at for schedules and triggers: the server-side
//! gathering against `durable_core::TriggerBuffer::gather` (a seeded script of publishes and
//! flushes, compared step by step), concurrent publishes and flushes of one buffer across two
//! store handles (nothing lost, nothing twice), concurrent duplicate publishes, the bounded pruning
//! of expired dedupe ids, and round trips per publish and per group of schedule saves.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{ScratchSchema, T0, new_run, url_or_skip};
use durable_core::{
    BufferAppend, CreateRun, Dedupe, DueQuery, Gather, Gathered, Millis, NewRun, ParentLink, Payload, Publish,
    Published, RunFilter, RunId, SaveOutcome, SaveSchedule, Schedule, ScheduleRecord, Store, TriggerBuffer, splitmix64,
};
use durable_store_postgres::PostgresStore;

/// Times past `i64::MAX` read back as `u64::MAX` (see the crate docs).
fn stored(t: Millis) -> Millis {
    if t > i64::MAX as u64 { u64::MAX } else { t }
}

fn all_due() -> DueQuery {
    DueQuery { namespace: None, workflows: None, now: Millis::MAX, limit: 1_000 }
}

/// A deterministic source of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    /// True once in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize].clone()
    }
}

const PAYLOADS: &[&str] =
    &[r#"{ "a" :1.0 }"#, r#""\u00e9 é""#, "[1, 2]", "1e2", "null", r#"{"n":18446744073709551615}"#];

fn template(rng: &mut Rng, workflow: &str) -> NewRun {
    let mut run = new_run("template");
    run.workflow = workflow.into();
    run.namespace = rng.pick(&["default".to_string(), "ns2".to_string()]);
    run.tags = rng.pick(&[vec![], vec!["b".to_string(), "a".to_string()]]);
    run.priority = rng.pick(&[0, -3, 7]);
    run.parent = rng.pick(&[None, Some(ParentLink { run_id: RunId::from("parent"), seq: 4 })]);
    run.start_at = rng.pick(&[None, Some(T0 + 99)]);
    run
}

fn gather(rng: &mut Rng) -> Gather {
    if rng.one_in(2) {
        Gather::Debounce { quiet_ms: rng.pick(&[0, 500, u64::MAX]) }
    } else {
        Gather::Batch { max_items: rng.pick(&[0, 1, 2, 3, 4]), max_wait_ms: rng.pick(&[0, 1_000, u64::MAX]) }
    }
}

/// The open buffers as due_buffers lists them.
fn listed(model: &BTreeMap<(String, String), TriggerBuffer>) -> Vec<TriggerBuffer> {
    let mut out: Vec<TriggerBuffer> =
        model.values().cloned().map(|b| TriggerBuffer { due_at: stored(b.due_at), ..b }).collect();
    out.sort_by(|a, b| (a.due_at, &a.workflow, &a.key).cmp(&(b.due_at, &b.workflow, &b.key)));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gathering_on_the_server_follows_trigger_buffer_gather() {
    let Some(url) = url_or_skip("gathering_on_the_server_follows_trigger_buffer_gather") else { return };
    let scratch = ScratchSchema::new(&url, "gather").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let mut rng = Rng(7);
    let mut model: BTreeMap<(String, String), TriggerBuffer> = BTreeMap::new();
    let mut now = T0;
    // How often each path was taken: flushes that started a run, full batches, appends to an
    // open buffer.
    let (mut flushes, mut full, mut appended) = (0, 0, 0);
    for step in 0..600 {
        now += rng.pick(&[0, 1, 300, 700]);
        if rng.one_in(4) && !model.is_empty() {
            // Flush an open buffer, with its batch id or a stale one, now or (mostly) once it
            // is due, if it ever is: only a due buffer is flushed.
            let keys: Vec<(String, String)> = model.keys().cloned().collect();
            let (workflow, key) = rng.pick(&keys);
            let due_at = model[&(workflow.clone(), key.clone())].due_at;
            if due_at < T0 * 2 && !rng.one_in(3) {
                now = now.max(due_at);
            }
            let right = !rng.one_in(3);
            let batch_id =
                if right { model[&(workflow.clone(), key.clone())].batch_id.clone() } else { "stale".into() };
            let due = due_at <= now;
            let expected = if right && due {
                flushes += 1;
                let buffer = model.remove(&(workflow.clone(), key.clone())).unwrap();
                Some(CreateRun::Created(buffer.into_run(now).into_run()))
            } else {
                None
            };
            let got = store.flush_buffer(&workflow, &key, &batch_id, now, None).await.unwrap();
            assert_eq!(got, expected, "step {step}: flush of ({workflow}, {key}) with {batch_id}");
        } else {
            let payload = Payload::from_trusted(rng.pick(PAYLOADS));
            let appends: Vec<BufferAppend> = (0..1 + rng.next() % 2)
                .map(|i| {
                    let workflow = rng.pick(&["w1".to_string(), "w2".to_string()]);
                    BufferAppend {
                        key: rng.pick(&[String::new(), "k".to_string(), "k2".to_string(), "k3".to_string()]),
                        gather: gather(&mut rng),
                        batch_id: format!("b{step}.{i}"),
                        run: template(&mut rng, &workflow),
                        workflow,
                    }
                })
                .collect();
            let mut expected = Vec::new();
            for append in &appends {
                let k = (append.workflow.clone(), append.key.clone());
                appended += usize::from(model.contains_key(&k));
                match TriggerBuffer::gather(model.remove(&k), append, payload.clone(), now) {
                    Gathered::Keep(buffer) => {
                        model.insert(k, buffer);
                    }
                    Gathered::Start(run) => {
                        full += 1;
                        expected.push(CreateRun::Created(run.into_run()));
                    }
                }
            }
            let event = Publish { gather: appends, ..Publish::event("e", payload, now) };
            match store.publish(event).await.unwrap() {
                Published::Done { started, .. } => assert_eq!(started, expected, "step {step}: runs started"),
                Published::Duplicate => panic!("no dedupe id, no duplicate"),
            }
        }
        assert_eq!(store.due_buffers(&all_due()).await.unwrap(), listed(&model), "step {step}: open buffers");
    }
    assert!(flushes > 20 && full > 20 && appended > 100, "the script covers every path: {flushes} {full} {appended}");
}

/// Two handles (two writers, so separate transactions) publish into one batch while a third
/// flushes whatever is due: every payload is in exactly one started run or the open buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_and_flushes_of_one_buffer_lose_nothing() {
    let Some(url) = url_or_skip("concurrent_publishes_and_flushes_of_one_buffer_lose_nothing") else { return };
    let scratch = ScratchSchema::new(&url, "gather_race").await.unwrap();
    let (a, b, c) =
        (scratch.connect().await.unwrap(), scratch.connect().await.unwrap(), scratch.connect().await.unwrap());
    const EACH: u64 = 40;
    let publisher = |store: PostgresStore, who: u64| {
        tokio::spawn(async move {
            for i in 0..EACH {
                let n = who * 1_000 + i;
                let append = BufferAppend {
                    workflow: "wf".into(),
                    key: "k".into(),
                    gather: Gather::Batch { max_items: 7, max_wait_ms: 0 },
                    batch_id: format!("batch-{n}"),
                    run: new_run("template"),
                };
                let event =
                    Publish { gather: vec![append], ..Publish::event("e", Payload::encode(&n).unwrap(), T0 + i) };
                store.publish(event).await.unwrap();
            }
        })
    };
    let publishers = [publisher(a.clone(), 1), publisher(b.clone(), 2)];
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for buffer in c.due_buffers(&all_due()).await.unwrap() {
                    c.flush_buffer(&buffer.workflow, &buffer.key, &buffer.batch_id, T0, None).await.unwrap();
                }
            }
        })
    };
    for p in publishers {
        p.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    flusher.await.unwrap();
    let mut seen: Vec<u64> = Vec::new();
    let runs = a.list_runs(&RunFilter { workflow: Some("wf".into()), limit: 1_000, ..RunFilter::default() }).await;
    for run in runs.unwrap().runs {
        assert!(run.id.as_str().starts_with("trig:wf:batch-"), "{}", run.id);
        seen.extend(run.input.decode::<Vec<u64>>().unwrap());
    }
    for buffer in a.due_buffers(&all_due()).await.unwrap() {
        seen.extend(buffer.payloads.iter().map(|p| p.decode::<u64>().unwrap()));
    }
    seen.sort_unstable();
    let mut all: Vec<u64> = (0..EACH).flat_map(|i| [1_000 + i, 2_000 + i]).collect();
    all.sort_unstable();
    assert_eq!(seen, all, "every payload once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_publish_once() {
    let Some(url) = url_or_skip("concurrent_duplicates_publish_once") else { return };
    let scratch = ScratchSchema::new(&url, "dedupe_race").await.unwrap();
    let (a, b) = (scratch.connect().await.unwrap(), scratch.connect().await.unwrap());
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let event = Publish {
                    dedupe: Some(Dedupe { id: "evt".into(), keep_until: T0 + 1_000 }),
                    start: vec![new_run(&format!("trig:{i}"))],
                    ..Publish::event("order", Payload::encode(&i).unwrap(), T0)
                };
                store.publish(event).await.unwrap()
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), Published::Done { .. }) {
            done += 1;
        }
    }
    assert_eq!(done, 1, "one of the duplicates publishes");
    let runs = a.list_runs(&RunFilter::default()).await.unwrap().runs;
    assert_eq!(runs.len(), 1, "and only its run starts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedupe_publish_prunes_a_bounded_number_of_expired_ids() {
    let Some(url) = url_or_skip("a_dedupe_publish_prunes_a_bounded_number_of_expired_ids") else { return };
    let scratch = ScratchSchema::new(&url, "dedupe_prune").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let admin = scratch.client().await.unwrap();
    let count = format!("SELECT count(*) FROM \"{}\".event_dedupe", scratch.name());
    let publish = |id: &str, keep_until: Millis, now: Millis| Publish {
        dedupe: Some(Dedupe { id: id.into(), keep_until }),
        ..Publish::event("e", Payload::null(), now)
    };
    for i in 0..100 {
        store.publish(publish(&format!("old-{i}"), T0 + i, T0)).await.unwrap();
    }
    assert_eq!(admin.query_one(&count, &[]).await.unwrap().get::<_, i64>(0), 100, "none expired yet");
    // All 100 have expired: a dedupe publish forgets some of them, not all at once.
    store.publish(publish("new", T0 + 10_000, T0 + 1_000)).await.unwrap();
    let left: i64 = admin.query_one(&count, &[]).await.unwrap().get(0);
    assert_eq!(left, 100 + 1 - 32);
    // A plain publish forgets nothing; expired ids are not duplicates.
    store.publish(Publish::event("e", Payload::null(), T0 + 1_000)).await.unwrap();
    assert_eq!(admin.query_one(&count, &[]).await.unwrap().get::<_, i64>(0), left);
    assert!(matches!(store.publish(publish("old-99", T0 + 5_000, T0 + 1_000)).await.unwrap(), Published::Done { .. }));
    assert_eq!(store.publish(publish("old-99", T0 + 5_000, T0 + 1_001)).await.unwrap(), Published::Duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_and_a_group_of_schedule_saves_are_one_round_trip_each() {
    let Some(url) = url_or_skip("a_publish_and_a_group_of_schedule_saves_are_one_round_trip_each") else { return };
    let scratch = ScratchSchema::new(&url, "sched_rtt").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let before = store.stats();
    let append = BufferAppend {
        workflow: "wf".into(),
        key: "k".into(),
        gather: Gather::Batch { max_items: 2, max_wait_ms: 1_000 },
        batch_id: "b".into(),
        run: new_run("template"),
    };
    let event = Publish {
        dedupe: Some(Dedupe { id: "x".into(), keep_until: T0 + 1 }),
        start: vec![new_run("started")],
        gather: vec![append],
        ..Publish::event("e", Payload::null(), T0)
    };
    store.publish(event).await.unwrap();
    assert_eq!(store.stats().batches - before.batches, 1, "dedupe, delivery, start and gather in one write");

    let record = |key: &str| {
        let schedule = Schedule::every(std::time::Duration::from_secs(60));
        ScheduleRecord::new(key, "default", "wf", Payload::null(), schedule, T0).unwrap()
    };
    let saves: Vec<SaveSchedule> = (0..50)
        .map(|i| SaveSchedule {
            record: record(&format!("s{i}")),
            expected: None,
            start: vec![new_run(&format!("sched:s{i}:1"))],
        })
        .collect();
    let before = store.stats();
    let answers = store.save_schedules(saves.clone()).await.unwrap();
    assert_eq!(store.stats().batches - before.batches, 1, "50 saves in one transaction, one round trip");
    assert!(answers.iter().all(|a| *a == SaveOutcome::Saved(1)));
    let again = store.save_schedules(saves).await.unwrap();
    assert!(again.iter().all(|a| matches!(a, SaveOutcome::Stale(Some(r)) if r.revision == 1)));
    assert_eq!(store.list_schedules(None, None, 100).await.unwrap().len(), 50);
}
