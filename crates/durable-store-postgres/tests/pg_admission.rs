//! Flow control beyond the conformance suite: the server-side admission functions against
//! `durable_core::admission::AdmissionBook` (seeded scripts of acquires, releases, cancels,
//! deletes and keyed starts, compared step by step: every answer, every hand-off, the stats and
//! every run's records, and the wakes of the runs slots were handed to), a keyed bulk start
//! refused as a whole, a run waiting for its key read back as `GATED`, and slots taken and
//! handed on by commits across two handles at once.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{ScratchSchema, T0, new_run, url_or_skip};
use durable_core::admission::{
    Admission, AdmissionBook, Handoff, Limits, Order, PriorityOrder, Rate, SlotRequest, WaiterRecord,
};
use durable_core::{
    Claim, ClaimOutcome, Commit, CreateRun, Millis, RunId, RunPatch, RunStatus, Store, StoreError, TurnEnd, protocol,
    splitmix64,
};
use durable_store_postgres::PostgresStore;

/// A deterministic source of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }
}

const RUNS: &[&str] = &["r0", "r1", "r2", "r3", "r4", "r5"];
const KEYED: &[&str] = &["k0", "k1", "k2", "k3", "k4"];
const KEYS: &[&str] = &["", "a", "b", "c"];
const KEY_GATE: &str = "key:default:wf:acme";

/// The step queues of the scripts, each with limits of its own (`flip`: the other limits a
/// request may bring, replacing the stored ones).
fn gates() -> Vec<(&'static str, Limits, Limits)> {
    let fair = Limits { concurrency: Some(2), fairness: true, ..Limits::default() };
    let lifo = Limits {
        concurrency: Some(1),
        rate: Some(Rate::per(3, Duration::from_millis(500))),
        priority: PriorityOrder::LowestFirst,
        order: Order::Lifo,
        ..Limits::default()
    };
    let rate = Limits { rate: Some(Rate::per(2, Duration::from_millis(300))), ..Limits::default() };
    vec![
        ("queue:default:fair", fair, Limits { concurrency: Some(3), ..fair }),
        ("queue:default:lifo", lifo, Limits { fairness: true, ..lifo }),
        ("queue:default:rate", rate, Limits { concurrency: Some(1), ..rate }),
        ("queue:default:open", Limits::default(), Limits { concurrency: Some(2), ..Limits::default() }),
    ]
}

/// What the runs should look like: wake_gen per run, and whether it waits for its key.
#[derive(Default)]
struct Model {
    book: AdmissionBook,
    wake_gen: BTreeMap<String, u64>,
    gated: BTreeMap<String, bool>,
    /// How often each outcome came up (the scripts must reach every one).
    seen: BTreeMap<&'static str, usize>,
}

impl Model {
    fn saw(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    fn wake(&mut self, handed: &[Handoff]) {
        if !handed.is_empty() {
            self.saw("hand-off");
        }
        for h in handed {
            if let Some(g) = self.wake_gen.get_mut(h.run_id.as_str()) {
                *g += 1;
                self.gated.insert(h.run_id.to_string(), false);
            }
        }
    }
}

fn sorted_waits(mut w: Vec<WaiterRecord>) -> Vec<WaiterRecord> {
    w.sort_by(|a, b| (&a.gate, &a.holder).cmp(&(&b.gate, &b.holder)));
    w
}

/// Everything the store holds agrees with the model at `now`.
async fn check(store: &PostgresStore, model: &Model, now: Millis, step: &str) {
    assert_eq!(store.admission_stats(now).await.unwrap(), model.book.stats(now), "{step}: stats");
    let ids: Vec<RunId> = RUNS.iter().chain(KEYED).map(|r| RunId::from(*r)).collect();
    for id in &ids {
        let (slots, waits) = store.run_admission(id).await.unwrap();
        assert_eq!(slots, model.book.slots_of(id), "{step}: slots of {id}");
        assert_eq!(waits, sorted_waits(model.book.waits_of(id)), "{step}: waits of {id}");
    }
    let runs = store.get_runs(&ids).await.unwrap();
    assert_eq!(runs.len(), model.wake_gen.len(), "{step}: the runs that exist");
    for run in runs {
        assert_eq!(Some(&run.wake_gen), model.wake_gen.get(run.id.as_str()), "{step}: wake_gen of {}", run.id);
        let gated = run.status == RunStatus::Pending && run.wake_at == Some(protocol::GATED);
        assert_eq!(Some(&gated), model.gated.get(run.id.as_str()), "{step}: {} gated", run.id);
    }
}

async fn script(store: &PostgresStore, seed: u64, steps: usize) -> BTreeMap<&'static str, usize> {
    let mut rng = Rng(seed);
    let mut model = Model::default();
    let gates = gates();
    for id in RUNS {
        store.create_run(new_run(id)).await.unwrap();
        model.wake_gen.insert(id.to_string(), 0);
        model.gated.insert(id.to_string(), false);
    }
    let mut now = T0;
    for i in 0..steps {
        // Mostly forward, sometimes a little back (another process's clock): `touched` keeps
        // a gate's time from running backwards.
        now = if rng.chance(10) { now.saturating_sub(rng.below(60)) } else { now + rng.below(150) };
        let roll = rng.below(100);
        let step;
        if roll < 55 {
            let (gate, limits, flip) = rng.pick(&gates);
            let run = rng.pick(RUNS);
            let request = SlotRequest {
                gate: gate.into(),
                holder: format!("{run}:{}", rng.below(3)),
                run_id: RunId::from(run),
                priority: rng.pick(&[0, 0, 1, 5, -2]),
                fairness_key: rng.pick(KEYS).into(),
                limits: if rng.chance(10) { flip } else { limits },
                lease_until: rng.chance(50).then(|| now + 100 + rng.below(900)),
                max_waiting: rng.chance(20).then(|| rng.below(4) as u32),
                succeeds: None,
                now,
            };
            step = format!("step {i}: acquire {request:?}");
            let (want, handed) = model.book.acquire(&request);
            model.wake(&handed);
            model.saw(match want {
                Admission::Admitted => "admitted",
                Admission::Waiting { retry_at: None } => "waiting",
                Admission::Waiting { retry_at: Some(_) } => "waiting for the window",
                Admission::Full { .. } => "full",
            });
            assert_eq!(store.acquire_slot(&request).await.unwrap(), want, "{step}");
        } else if roll < 80 {
            let (gate, ..) = rng.pick(&gates);
            let holder = format!("{}:{}", rng.pick(RUNS), rng.below(3));
            step = format!("step {i}: release {gate} {holder} at {now}");
            let handed = model.book.release(gate, &holder, now);
            model.wake(&handed);
            let want: Vec<RunId> = handed.into_iter().map(|h| h.run_id).collect();
            assert_eq!(store.release_slot(gate, &holder, now).await.unwrap(), want, "{step}");
        } else if roll < 88 {
            let run = rng.pick(RUNS);
            step = format!("step {i}: cancel {run} at {now}");
            let handed = model.book.release_run(&RunId::from(run), now);
            model.wake(&handed);
            let patch = RunPatch { status: Some(RunStatus::Cancelled), now, ..RunPatch::default() };
            assert!(store.update_run_if(&RunId::from(run), &[], patch).await.unwrap(), "{step}");
        } else if roll < 92 {
            let run = rng.pick(RUNS.iter().chain(KEYED).copied().collect::<Vec<_>>().as_slice());
            step = format!("step {i}: delete {run}");
            let exists = model.wake_gen.remove(run).is_some();
            model.gated.remove(run);
            if exists {
                let handed = model.book.release_run(&RunId::from(run), 0);
                model.wake(&handed);
            }
            assert_eq!(store.delete_run(&RunId::from(run)).await.unwrap(), u64::from(exists), "{step}");
            if RUNS.contains(&run) {
                store.create_run(new_run(run)).await.unwrap();
                model.wake_gen.insert(run.to_string(), 0);
                model.gated.insert(run.to_string(), false);
            }
        } else {
            let id = rng.pick(KEYED);
            let mut run = new_run(id);
            let request = SlotRequest {
                gate: KEY_GATE.into(),
                holder: id.into(),
                run_id: RunId::from(id),
                priority: rng.pick(&[0, 3]),
                fairness_key: String::new(),
                limits: Limits { concurrency: Some(1), ..Limits::default() },
                lease_until: None,
                max_waiting: Some(2),
                succeeds: None,
                now,
            };
            run.admission = Some(request.clone());
            step = format!("step {i}: keyed start {id} at {now}");
            let answer = store.create_run(run).await;
            if model.wake_gen.contains_key(id) {
                assert!(matches!(answer, Ok(CreateRun::Existing(_))), "{step}: {answer:?}");
            } else {
                let (want, handed) = model.book.acquire(&request);
                model.wake(&handed);
                match (want, answer) {
                    (Admission::Full { held, waiting }, Err(StoreError::QueueFull { gate, held: h, waiting: w })) => {
                        model.saw("keyed start refused");
                        assert_eq!((gate.as_str(), h, w), (KEY_GATE, held, waiting), "{step}");
                    }
                    (want @ (Admission::Admitted | Admission::Waiting { .. }), Ok(CreateRun::Created(run))) => {
                        let gated = matches!(want, Admission::Waiting { .. });
                        model.saw(if gated { "keyed start waits" } else { "keyed start runs" });
                        assert_eq!(run.wake_at == Some(protocol::GATED), gated, "{step}");
                        model.wake_gen.insert(id.to_string(), 0);
                        model.gated.insert(id.to_string(), gated);
                    }
                    (want, answer) => panic!("{step}: expected {want:?}, got {answer:?}"),
                }
            }
        }
        check(store, &model, now, &step).await;
    }
    model.seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_on_the_server_follows_the_admission_book() {
    let Some(url) = url_or_skip("admission_on_the_server_follows_the_admission_book") else { return };
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in [1, 2, 3, 4] {
        let scratch = ScratchSchema::new(&url, "admission").await.unwrap();
        let store = scratch.connect().await.unwrap();
        for (what, n) in script(&store, seed, 300).await {
            *seen.entry(what).or_default() += n;
        }
        scratch.drop_now().await.unwrap();
    }
    let outcomes = [
        "admitted",
        "waiting",
        "waiting for the window",
        "full",
        "hand-off",
        "keyed start runs",
        "keyed start waits",
        "keyed start refused",
    ];
    for what in outcomes {
        assert!(seen.get(what).copied().unwrap_or(0) >= 3, "the scripts rarely reach {what:?}: {seen:?}");
    }
}

fn keyed(id: &str, max_waiting: u32) -> durable_core::NewRun {
    let mut run = new_run(id);
    run.admission = Some(SlotRequest {
        gate: KEY_GATE.into(),
        holder: id.into(),
        run_id: RunId::from(id),
        priority: 0,
        fairness_key: String::new(),
        limits: Limits { concurrency: Some(1), ..Limits::default() },
        lease_until: None,
        max_waiting: Some(max_waiting),
        succeeds: None,
        now: T0,
    });
    run
}

/// A bulk start with keyed starts is one transaction: a refused one undoes the others (their
/// runs and their admissions), and a start the batch could take runs as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_keyed_start_undoes_its_whole_batch() {
    let Some(url) = url_or_skip("a_refused_keyed_start_undoes_its_whole_batch") else { return };
    let scratch = ScratchSchema::new(&url, "keyed").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let batch = vec![new_run("plain"), keyed("a", 1), keyed("b", 1), keyed("c", 1)];
    match store.create_runs(batch).await {
        Err(StoreError::QueueFull { gate, held: 1, waiting: 1 }) => assert_eq!(gate, KEY_GATE),
        other => panic!("expected QueueFull, got {other:?}"),
    }
    for id in ["plain", "a", "b", "c"] {
        assert!(store.get_run(&RunId::from(id)).await.unwrap().is_none(), "{id} was not created");
    }
    assert!(store.admission_stats(T0).await.unwrap().is_empty(), "no gate was recorded: {:?}", {
        store.admission_stats(T0).await.unwrap()
    });

    let answers = store.create_runs(vec![new_run("plain"), keyed("a", 1), keyed("b", 1), keyed("a", 1)]).await;
    let answers = answers.unwrap();
    assert!(answers[0].created() && answers[1].created() && answers[2].created());
    assert!(matches!(answers[3], CreateRun::Existing(_)), "a given twice: the second is the first's");
    assert_eq!(answers[1].run().wake_at, None);
    assert_eq!(answers[2].run().wake_at, Some(protocol::GATED));
    let b = store.get_run(&RunId::from("b")).await.unwrap().unwrap();
    assert_eq!(b.wake_at, Some(protocol::GATED), "a run waiting for its key reads back as GATED");
    let claim = Claim { run_id: RunId::from("b"), owner: "me".into(), lease_until: T0 + 1_000, now: T0 };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Busy(_)));
}

/// Two handles (two processes) take slots of one gate at once through keyed starts, settle their
/// runs and take the slots handed on: the gate never holds more than its limit, every run
/// eventually holds its slot, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_hand_slots_on_across_handles() {
    let Some(url) = url_or_skip("commits_hand_slots_on_across_handles") else { return };
    let scratch = ScratchSchema::new(&url, "handoff").await.unwrap();
    let stores = [Arc::new(scratch.connect().await.unwrap()), Arc::new(scratch.connect().await.unwrap())];
    const LIMIT: u32 = 3;
    const N: usize = 24;
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = stores[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("run-{i}");
            let mut run = keyed(&id, u32::MAX);
            if let Some(r) = run.admission.as_mut() {
                r.limits.concurrency = Some(LIMIT);
                r.max_waiting = None;
            }
            store.create_run(run).await.unwrap();
            // Wait for the slot: a gated run is claimed once a settle hands it the slot.
            let claim =
                Claim { run_id: RunId::from(id.as_str()), owner: "me".into(), lease_until: T0 + 60_000, now: T0 };
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                match store.claim_run(claim.clone()).await.unwrap() {
                    ClaimOutcome::Acquired { .. } => break,
                    ClaimOutcome::Busy(_) => {
                        assert!(std::time::Instant::now() < deadline, "{id} never got its slot");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    other => panic!("{id}: {other:?}"),
                }
            }
            let stats = store.admission_stats(T0).await.unwrap();
            assert!(stats[0].held <= LIMIT, "{stats:?}");
            let mut c = Commit::new(RunId::from(id.as_str()), "me", T0 + 1);
            c.end = Some(TurnEnd::Settle { status: RunStatus::Completed, output: None, error: None });
            store.commit(c).await.unwrap().handed_off
        }));
    }
    let mut handed = 0;
    for t in tasks {
        handed += t.await.unwrap().len();
    }
    assert_eq!(handed, N - LIMIT as usize, "every run past the first {LIMIT} was handed a slot by a settle");
    let stats = stores[0].admission_stats(T0 + 1).await.unwrap();
    assert_eq!((stats[0].held, stats[0].waiting), (0, 0), "{stats:?}");
}
