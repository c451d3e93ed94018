//! Differential test: random sequences of store calls run on `MemoryStore` (the reference
//! implementation) and on `SqliteStore`; every answer must be the same (errors compared by kind).

mod common;

use durable_core::admission::{Limits, Order, PriorityOrder, Rate, SlotRequest};
use durable_core::{
    BufferAppend, Checkpoint, CheckpointStatus, Claim, Commit, Dedupe, DueQuery, Gather, NewRun, OutgoingSignal,
    ParentLink, Payload, Publish, RunFilter, RunId, RunPatch, RunQuery, RunStatus, SaveSchedule, Schedule,
    ScheduleRecord, StepError, StepKind, Store, StoreErrorKind, StoreResult, TurnEnd, WaitKind, Waiter, protocol,
    splitmix64,
};
use durable_store_memory::MemoryStore;
use serde_json::json;

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
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const RUNS: &[&str] = &["r0", "r1", "r2", "r3", "r4", "r0.child.1", "r0.child.1.child.2"];
const OWNERS: &[&str] = &["a", "b"];
const TOKENS: &[&str] = &["t0", "t1", "t2"];
const EVENTS: &[&str] = &["e0", "e1"];
const TAGS: &[&str] = &["red", "blue"];
const NAMESPACES: &[&str] = &["default", "other"];
const SCHEDULES: &[&str] = &["s0", "s1", "s2"];
const DEDUPE_IDS: &[&str] = &["d0", "d1"];
const GATHER_KEYS: &[&str] = &["", "k"];
/// The step queues the admission calls ask at.
const QUEUE_GATES: &[&str] = &["queue:default:a", "queue:default:b", "queue:other:c"];
/// The concurrency key of the keyed starts (its slots are the runs', never leased).
const KEY_GATE: &str = "key:default:wf:k";
const FAIRNESS_KEYS: &[&str] = &["", "x", "y"];

fn run_id(rng: &mut Rng) -> RunId {
    RunId::from(*rng.pick(RUNS))
}

fn status(rng: &mut Rng) -> RunStatus {
    *rng.pick(&RunStatus::ALL)
}

fn payload(rng: &mut Rng) -> Payload {
    Payload::encode(&json!({"k": rng.below(3), "n": rng.below(1000)})).unwrap()
}

fn matcher(rng: &mut Rng) -> Payload {
    match rng.below(3) {
        0 => Payload::encode(&json!({})).unwrap(),
        _ => Payload::encode(&json!({"k": rng.below(3)})).unwrap(),
    }
}

fn step_error(rng: &mut Rng) -> Option<StepError> {
    match rng.below(3) {
        0 => None,
        1 => Some(StepError::retryable(format!("boom {}", rng.below(10)))),
        _ => Some(StepError::fatal("fatal").with_code("bad")),
    }
}

fn new_run(rng: &mut Rng, now: u64) -> NewRun {
    let id = run_id(rng);
    let parent = if rng.chance(30) { Some(ParentLink { run_id: run_id(rng), seq: rng.below(4) as u32 }) } else { None };
    let parent = match id.as_str() {
        "r0.child.1" => Some(ParentLink { run_id: RunId::from("r0"), seq: 1 }),
        "r0.child.1.child.2" => Some(ParentLink { run_id: RunId::from("r0.child.1"), seq: 2 }),
        // Parents come earlier in RUNS: no cycles (MemoryStore's delete_run would loop on one).
        _ => parent.filter(|p| {
            let pos = |r: &str| RUNS.iter().position(|x| *x == r);
            pos(p.run_id.as_str()) < pos(id.as_str())
        }),
    };
    let mut tags = Vec::new();
    for t in TAGS {
        if rng.chance(40) {
            tags.push(t.to_string());
        }
    }
    NewRun {
        trace_context: None,
        admission: None,
        id,
        workflow: if rng.chance(70) { "wf".into() } else { "other".into() },
        version: 1 + rng.below(2) as u32,
        namespace: rng.pick(NAMESPACES).to_string(),
        input: payload(rng),
        tags,
        priority: rng.below(3) as i32 - 1,
        parent,
        created_at: now,
        start_at: if rng.chance(15) { Some(now + rng.below(40)) } else { None },
    }
}

/// A gate's limits: mostly the gate's own (so its queue builds up), sometimes others (a
/// request replaces the stored limits).
fn limits(rng: &mut Rng, gate: &str) -> Limits {
    let home = match gate {
        "queue:default:a" => Limits { concurrency: Some(2), fairness: true, ..Limits::default() },
        "queue:default:b" => Limits {
            concurrency: Some(1),
            rate: Some(Rate { limit: 2, period_ms: 30 }),
            priority: PriorityOrder::LowestFirst,
            order: Order::Lifo,
            ..Limits::default()
        },
        _ => Limits { rate: Some(Rate { limit: 1, period_ms: 40 }), fairness: true, ..Limits::default() },
    };
    if rng.chance(85) {
        return home;
    }
    Limits {
        concurrency: rng.chance(70).then(|| 1 + rng.below(3) as u32),
        rate: rng.chance(40).then(|| Rate { limit: 1 + rng.below(3) as u32, period_ms: 10 + rng.below(40) }),
        priority: if rng.chance(50) { PriorityOrder::HighestFirst } else { PriorityOrder::LowestFirst },
        fairness: rng.chance(50),
        order: if rng.chance(70) { Order::Fifo } else { Order::Lifo },
    }
}

/// A step's request to pass one of the queues.
fn slot_request(rng: &mut Rng, now: u64) -> SlotRequest {
    let gate = rng.pick(QUEUE_GATES).to_string();
    let run = run_id(rng);
    SlotRequest {
        holder: protocol::step_id(&run, rng.below(3) as u32),
        run_id: run,
        priority: rng.below(3) as i32,
        fairness_key: rng.pick(FAIRNESS_KEYS).to_string(),
        limits: limits(rng, &gate),
        lease_until: rng.chance(50).then(|| now + rng.below(60)),
        max_waiting: rng.chance(30).then(|| rng.below(4) as u32),
        succeeds: None,
        gate,
        now,
    }
}

/// `new` started under [`KEY_GATE`] (one at a time).
fn keyed(rng: &mut Rng, mut new: NewRun, now: u64) -> NewRun {
    new.admission = Some(SlotRequest {
        gate: KEY_GATE.into(),
        holder: String::new(),
        run_id: RunId::from(""),
        priority: rng.below(3) as i32,
        fairness_key: String::new(),
        limits: Limits { concurrency: Some(1), ..Limits::default() },
        lease_until: None,
        max_waiting: rng.chance(60).then(|| rng.below(3) as u32),
        // A successor of a run that may hold the key (continue-as-new).
        succeeds: rng.chance(25).then(|| run_id(rng).to_string()),
        now,
    });
    new
}

fn workflow(rng: &mut Rng) -> String {
    if rng.chance(70) { "wf".into() } else { "other".into() }
}

/// A schedule record to save: a key, a namespace, a workflow and a due time (or none).
fn schedule(rng: &mut Rng, now: u64) -> ScheduleRecord {
    let every = Schedule::every(std::time::Duration::from_millis(10 + rng.below(50)));
    let (key, namespace, workflow) = (*rng.pick(SCHEDULES), *rng.pick(NAMESPACES), workflow(rng));
    let mut r = ScheduleRecord::new(key, namespace, &workflow, payload(rng), every, now).expect("a valid schedule");
    r.due_at = if rng.chance(80) { Some(now + rng.below(40)) } else { None };
    r.state.fires = rng.below(5);
    r
}

/// A save: create or replace a likely (or unlikely) revision, with fires to start.
fn save(rng: &mut Rng, now: u64) -> SaveSchedule {
    let expected = match rng.below(4) {
        0 => None,
        _ => Some(1 + rng.below(4)),
    };
    let start = (0..rng.below(3)).map(|_| new_run(rng, now)).collect();
    SaveSchedule { record: schedule(rng, now), expected, start }
}

/// A publish with (maybe) a dedupe id, trigger runs and gathering triggers.
fn publish(rng: &mut Rng, now: u64) -> Publish {
    let dedupe =
        rng.chance(50).then(|| Dedupe { id: rng.pick(DEDUPE_IDS).to_string(), keep_until: now + rng.below(60) });
    let start = (0..rng.below(2)).map(|_| new_run(rng, now)).collect();
    let gather = (0..rng.below(3))
        .map(|_| {
            let gather = if rng.chance(50) {
                Gather::Debounce { quiet_ms: 1 + rng.below(30) }
            } else {
                Gather::Batch { max_items: 1 + rng.below(4) as u32, max_wait_ms: rng.below(40) }
            };
            let run = new_run(rng, now);
            BufferAppend {
                workflow: run.workflow.clone(),
                key: rng.pick(GATHER_KEYS).to_string(),
                gather,
                batch_id: format!("b{}", rng.next() % 1_000_000),
                run,
            }
        })
        .collect();
    Publish { name: rng.pick(EVENTS).to_string(), payload: payload(rng), now, dedupe, start, gather }
}

fn due_query(rng: &mut Rng, now: u64) -> DueQuery {
    DueQuery {
        namespace: if rng.chance(50) { Some(rng.pick(NAMESPACES).to_string()) } else { None },
        workflows: match rng.below(4) {
            0 => Some(vec!["wf".into()]),
            1 => Some(vec!["wf".into(), "other".into()]),
            2 => Some(vec![]),
            _ => None,
        },
        now,
        limit: rng.below(5) as usize,
    }
}

fn checkpoint(rng: &mut Rng, run: &RunId, now: u64) -> Checkpoint {
    let kinds = [StepKind::Step, StepKind::Sleep, StepKind::Signal, StepKind::Event, StepKind::Child];
    let statuses = CheckpointStatus::ALL;
    let mut cp = Checkpoint::new(run.clone(), rng.below(6) as u32, "s", *rng.pick(&kinds), *rng.pick(&statuses), now);
    if rng.chance(50) {
        cp.output = Some(payload(rng));
    }
    if rng.chance(20) {
        cp.input = Some(payload(rng));
    }
    cp.error = step_error(rng);
    cp.attempts = rng.below(4) as u32;
    if rng.chance(30) {
        cp.wake_at = Some(now + rng.below(50));
    }
    cp
}

fn waiter(rng: &mut Rng, run: &RunId, now: u64) -> Waiter {
    let kind = if rng.chance(60) {
        WaitKind::Signal { token: rng.pick(TOKENS).to_string() }
    } else {
        WaitKind::Event { name: rng.pick(EVENTS).to_string(), matcher: matcher(rng) }
    };
    Waiter { run_id: run.clone(), seq: rng.below(6) as u32, name: "w".into(), kind, created_at: now }
}

fn query(rng: &mut Rng, now: u64) -> RunQuery {
    RunQuery {
        namespace: if rng.chance(50) { Some(rng.pick(NAMESPACES).to_string()) } else { None },
        workflows: match rng.below(4) {
            0 => Some(vec![("wf".into(), 1)]),
            1 => Some(vec![("wf".into(), 1), ("other".into(), 2)]),
            2 => Some(vec![]),
            _ => None,
        },
        now,
        limit: rng.below(5) as usize,
        leave_queued_since: None,
    }
}

fn filter(rng: &mut Rng, now: u64) -> RunFilter {
    RunFilter {
        workflow: if rng.chance(30) { Some("wf".into()) } else { None },
        statuses: (0..rng.below(3)).map(|_| status(rng)).collect(),
        namespace: if rng.chance(30) { Some(rng.pick(NAMESPACES).to_string()) } else { None },
        tag: if rng.chance(30) { Some(rng.pick(TAGS).to_string()) } else { None },
        parent: if rng.chance(20) { Some(run_id(rng)) } else { None },
        created_after: if rng.chance(20) { Some(now.saturating_sub(rng.below(100))) } else { None },
        created_before: if rng.chance(20) { Some(now.saturating_sub(rng.below(100))) } else { None },
        limit: rng.below(4) as usize,
        cursor: None,
    }
}

/// One store call.
#[derive(Debug, Clone)]
enum Op {
    Create(NewRun),
    CreateRuns(Vec<NewRun>),
    Acquire(SlotRequest),
    /// `release_slot(gate, holder, now)`.
    ReleaseSlot(String, String, u64),
    /// `admission_stats(now)` and `run_admission(run)`.
    Admission(RunId, u64),
    Claim(Claim),
    Renew(RunId, String, u64),
    Release(RunId, String),
    Commit(Commit),
    Update(RunId, Vec<RunStatus>, RunPatch),
    Signal(String, Payload, u64),
    Publish(String, Payload, u64),
    PublishFull(Publish),
    Delete(RunId),
    SaveSchedule(SaveSchedule),
    SaveSchedules(Vec<SaveSchedule>),
    DeleteSchedule(String),
    /// `flush_buffer(workflow, key, batch_id, now)`.
    Flush(String, String, String, u64),
    Poll(RunQuery),
    /// `claim_due_runs(query, until)`.
    ClaimDue(RunQuery, u64),
    Due(DueQuery),
    List(RunFilter),
    Inspect(RunId, String),
}

impl Op {
    fn is_write(&self) -> bool {
        !matches!(self, Op::Poll(_) | Op::Due(_) | Op::List(_) | Op::Inspect(..) | Op::Admission(..))
    }
}

/// An answer, comparable across stores: the `Debug` text of the value, or the error kind.
type Answer = Result<String, StoreErrorKind>;

fn answer<T: std::fmt::Debug>(r: StoreResult<T>) -> Answer {
    r.map(|v| format!("{v:?}")).map_err(|e| e.kind())
}

/// Applies one call; several answers for the reads that page or look at several things.
async fn apply(store: &dyn Store, op: Op) -> Vec<Answer> {
    match op {
        Op::Create(n) => vec![answer(store.create_run(n).await)],
        Op::CreateRuns(runs) => vec![answer(store.create_runs(runs).await)],
        Op::Acquire(request) => vec![answer(store.acquire_slot(&request).await)],
        Op::ReleaseSlot(gate, holder, now) => vec![answer(store.release_slot(&gate, &holder, now).await)],
        Op::Admission(id, now) => {
            vec![answer(store.admission_stats(now).await), answer(store.run_admission(&id).await)]
        }
        Op::Claim(c) => vec![answer(store.claim_run(c).await)],
        Op::Renew(id, owner, until) => vec![answer(store.renew_lease(&id, &owner, until).await)],
        Op::Release(id, owner) => vec![answer(store.release_lease(&id, &owner).await)],
        Op::Commit(c) => vec![answer(store.commit(c).await)],
        Op::Update(id, expected, patch) => vec![answer(store.update_run_if(&id, &expected, patch).await)],
        Op::Signal(token, p, now) => vec![answer(store.send_signal(&token, p, now).await)],
        Op::Publish(name, p, now) => vec![answer(store.publish_event(&name, p, now).await)],
        Op::PublishFull(p) => vec![answer(store.publish(p).await)],
        Op::Delete(id) => vec![answer(store.delete_run(&id).await)],
        Op::SaveSchedule(save) => vec![answer(store.save_schedule(save).await)],
        Op::SaveSchedules(saves) => vec![answer(store.save_schedules(saves).await)],
        Op::DeleteSchedule(key) => vec![answer(store.delete_schedule(&key).await)],
        Op::Flush(workflow, key, batch_id, now) => {
            vec![answer(store.flush_buffer(&workflow, &key, &batch_id, now, None).await)]
        }
        Op::Due(q) => vec![
            answer(store.due_schedules(&q).await),
            answer(store.due_buffers(&q).await),
            answer(store.list_schedules(q.namespace.as_deref(), None, q.limit).await),
            answer(store.list_schedules(None, Some("s0"), 10).await),
            answer(store.get_schedule(SCHEDULES[q.limit % SCHEDULES.len()]).await),
        ],
        Op::ClaimDue(q, until) => {
            // In no particular order: compared sorted.
            let mut claimed = store.claim_due_runs(&q, until).await;
            if let Ok(ids) = &mut claimed {
                ids.sort();
            }
            vec![answer(claimed)]
        }
        Op::Poll(q) => vec![
            answer(store.pending_runs(&q).await),
            answer(store.due_runs(&q).await),
            answer(store.orphaned_runs(&q).await),
        ],
        Op::List(mut f) => {
            // Page through with the cursor.
            let mut pages = Vec::new();
            for _ in 0..20 {
                let page = store.list_runs(&f).await;
                let next = page.as_ref().ok().and_then(|p| p.next_cursor.clone());
                pages.push(answer(page));
                match next {
                    Some(c) => f.cursor = Some(c),
                    None => break,
                }
            }
            pages
        }
        Op::Inspect(id, key) => vec![
            answer(store.get_run(&id).await),
            answer(store.history(&id).await),
            answer(store.waiters(&id).await),
            answer(store.get_state(&id, &key).await),
        ],
    }
}

/// Generates the next call. `mem` is read only to pick a realistic `seen_wake_gen` and a
/// buffer to flush.
async fn gen_op(rng: &mut Rng, now: u64, mem: &MemoryStore) -> Op {
    match rng.below(31) {
        0 | 1 => {
            let new = new_run(rng, now);
            Op::Create(if rng.chance(30) { keyed(rng, new, now) } else { new })
        }
        2 | 3 => Op::Claim(Claim {
            run_id: run_id(rng),
            owner: rng.pick(OWNERS).to_string(),
            lease_until: now + rng.below(60),
            now,
        }),
        4 => Op::Renew(run_id(rng), rng.pick(OWNERS).to_string(), now + rng.below(60)),
        5 => Op::Release(run_id(rng), rng.pick(OWNERS).to_string()),
        6..=9 => {
            let id = run_id(rng);
            let mut c = Commit::new(id.clone(), *rng.pick(OWNERS), now);
            for _ in 0..rng.below(3) {
                c.checkpoints.push(checkpoint(rng, &id, now));
            }
            for _ in 0..rng.below(3) {
                c.waits.push(waiter(rng, &id, now));
            }
            for _ in 0..rng.below(2) {
                c.expire_waits.push(rng.below(6) as u32);
            }
            if rng.chance(30) {
                c.state.push((format!("key{}", rng.below(2)), payload(rng)));
            }
            if rng.chance(20) {
                let mut child = new_run(rng, now);
                let pos = |r: &RunId| RUNS.iter().position(|x| *x == r.as_str());
                if pos(&id) < pos(&child.id) {
                    child.parent = Some(ParentLink { run_id: id.clone(), seq: 1 });
                }
                c.children.push(if rng.chance(40) { keyed(rng, child, now) } else { child });
            }
            for _ in 0..rng.below(2) {
                c.signals.push(OutgoingSignal { token: rng.pick(TOKENS).to_string(), payload: payload(rng) });
            }
            if rng.chance(25) {
                let r = slot_request(rng, now);
                // Mostly a slot of this run's own steps.
                let holder = if rng.chance(70) { protocol::step_id(&id, rng.below(3) as u32) } else { r.holder };
                c.release_slots.push((r.gate, holder));
            }
            c.end = match rng.below(3) {
                0 => None,
                1 => {
                    let seen = match mem.get_run(&id).await.unwrap() {
                        Some(r) if rng.chance(80) => r.wake_gen,
                        _ => rng.below(3),
                    };
                    let wake_at = if rng.chance(60) { Some(now + rng.below(40)) } else { None };
                    Some(TurnEnd::Suspend { wake_at, seen_wake_gen: seen })
                }
                _ => Some(TurnEnd::Settle {
                    status: status(rng),
                    output: if rng.chance(50) { Some(payload(rng)) } else { None },
                    error: step_error(rng),
                }),
            };
            Op::Commit(c)
        }
        10 => {
            let id = run_id(rng);
            let expected: Vec<RunStatus> = (0..rng.below(3)).map(|_| status(rng)).collect();
            let patch = RunPatch {
                status: if rng.chance(70) { Some(status(rng)) } else { None },
                output: match rng.below(3) {
                    0 => None,
                    1 => Some(None),
                    _ => Some(Some(payload(rng))),
                },
                error: match rng.below(3) {
                    0 => None,
                    1 => Some(None),
                    _ => Some(step_error(rng)),
                },
                wake_at: match rng.below(3) {
                    0 => None,
                    1 => Some(None),
                    _ => Some(Some(now + rng.below(30))),
                },
                release_lease: rng.chance(40),
                reset_recovery: rng.chance(30),
                truncate_history_from: if rng.chance(20) { Some(rng.below(6) as u32) } else { None },
                wake: rng.chance(30),
                signals: (0..rng.below(2))
                    .map(|_| OutgoingSignal { token: rng.pick(TOKENS).to_string(), payload: payload(rng) })
                    .collect(),
                now,
            };
            Op::Update(id, expected, patch)
        }
        11 => Op::Signal(rng.pick(TOKENS).to_string(), payload(rng), now),
        12 => Op::Publish(rng.pick(EVENTS).to_string(), payload(rng), now),
        13 if rng.chance(30) => Op::Delete(run_id(rng)),
        14 => {
            let at = now + rng.below(40);
            if rng.chance(30) { Op::ClaimDue(query(rng, at), at + rng.below(60)) } else { Op::Poll(query(rng, at)) }
        }
        15 => Op::List(filter(rng, now)),
        16 | 17 => Op::PublishFull(publish(rng, now)),
        18 => Op::SaveSchedule(save(rng, now)),
        19 => Op::SaveSchedules((0..rng.below(4)).map(|_| save(rng, now)).collect()),
        20 if rng.chance(30) => Op::DeleteSchedule(rng.pick(SCHEDULES).to_string()),
        21 => {
            // A buffer that is open (in the memory store, now), mostly with its batch id.
            let at = now + rng.below(40);
            let q = DueQuery { limit: 1, ..due_query(rng, at) };
            let (workflow, key, batch_id) = match mem.due_buffers(&q).await.unwrap().into_iter().next() {
                Some(b) if rng.chance(80) => (b.workflow, b.key, b.batch_id),
                Some(b) => (b.workflow, b.key, "b-stale".into()),
                None => ("wf".into(), String::new(), "b-none".into()),
            };
            Op::Flush(workflow, key, batch_id, now)
        }
        22 => {
            let at = now + rng.below(40);
            Op::Due(due_query(rng, at))
        }
        26 | 27 => Op::Acquire(slot_request(rng, now)),
        28 => {
            let (gate, holder) = if rng.chance(80) {
                let r = slot_request(rng, now);
                (r.gate, r.holder)
            } else {
                (KEY_GATE.to_string(), run_id(rng).to_string())
            };
            Op::ReleaseSlot(gate, holder, now)
        }
        29 => Op::CreateRuns(
            (0..rng.below(4))
                .map(|_| {
                    let new = new_run(rng, now);
                    if rng.chance(50) { keyed(rng, new, now) } else { new }
                })
                .collect(),
        ),
        30 => Op::Admission(run_id(rng), now + rng.below(40)),
        _ => Op::Inspect(run_id(rng), format!("key{}", rng.below(2))),
    }
}

/// Polls futures in order until all are done: each is first polled (so each write is queued
/// on the writer) before any answer comes back, and in the order given.
async fn join_in_order<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futures.iter_mut().enumerate() {
            if out[i].is_none() {
                match std::pin::Pin::new(f).poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    out.into_iter().map(|v| v.expect("every future finished")).collect()
}

/// Every gate's row counts its slot rows (`held`, which the SQLite store keeps in the writes
/// that insert and delete slots instead of counting them), and no slot is at a gate without a
/// row: read from the file (on a connection of its own) after `step`.
fn assert_gates_count_their_slots(conn: &rusqlite::Connection, step: &str) {
    let mut stmt = conn
        .prepare(
            "SELECT gate, held, (SELECT COUNT(*) FROM admission_slots s WHERE s.gate = g.gate) \
             FROM admission_gates g ORDER BY gate",
        )
        .unwrap();
    let rows: Vec<(String, i64, i64)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
    for (gate, held, slots) in rows {
        assert_eq!(held, slots, "{step}: gate {gate:?} counts {held} slots and has {slots}");
    }
    let orphans: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM admission_slots WHERE gate NOT IN (SELECT gate FROM admission_gates)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0, "{step}: slots at a gate without a row");
}

async fn run_sequence(seed: u64, steps: usize, mem: &MemoryStore, sql: &dyn Store, path: &std::path::Path) {
    let trace = std::env::var("DURABLE_DIFF_TRACE").is_ok();
    let file = rusqlite::Connection::open(path).unwrap();
    let mut rng = Rng(seed);
    let mut now = 1_000u64;
    let mut step = 0;
    while step < steps {
        now += rng.below(20);
        // Mostly one call at a time; sometimes a burst of writes submitted together, so the
        // SQLite writer folds them into one group: groups must not change any answer.
        let burst = if rng.chance(15) { 2 + rng.below(10) as usize } else { 1 };
        let mut ops = Vec::with_capacity(burst);
        while ops.len() < burst {
            let op = gen_op(&mut rng, now, mem).await;
            if burst == 1 || op.is_write() {
                ops.push(op);
            }
        }
        if trace {
            eprintln!("step {step}: {ops:?}");
        }
        let mut expected = Vec::with_capacity(ops.len());
        for op in ops.clone() {
            expected.push(apply(mem, op).await);
        }
        let got = join_in_order(ops.iter().cloned().map(|op| Box::pin(apply(sql, op))).collect()).await;
        for (i, (e, g)) in expected.into_iter().zip(got).enumerate() {
            assert_eq!(e, g, "step {step}: {:?}: answers differ (left MemoryStore, right SqliteStore)", ops[i]);
        }
        // The admission records after every step (a hand-off changes no answer of the step
        // that made it): the stats and one run's slots and requests, every run's when tracing.
        let ids = if trace { RUNS } else { std::slice::from_ref(&RUNS[step % RUNS.len()]) };
        for id in ids {
            let op = Op::Admission(RunId::from(*id), now);
            assert_eq!(apply(mem, op.clone()).await, apply(sql, op).await, "step {step}: admission records of {id}");
        }
        assert_gates_count_their_slots(&file, &format!("step {step}: {ops:?}"));
        step += ops.len();
    }
    // Final state: every run, its history, waiters and state agree.
    for id in RUNS {
        for key in ["key0", "key1"] {
            let op = Op::Inspect(RunId::from(*id), key.into());
            assert_eq!(apply(mem, op.clone()).await, apply(sql, op).await, "final state of {id}");
        }
    }
    let all = Op::List(RunFilter { limit: 1000, ..RunFilter::default() });
    assert_eq!(apply(mem, all.clone()).await, apply(sql, all).await, "final list");
    for id in RUNS {
        let op = Op::Admission(RunId::from(*id), now);
        assert_eq!(apply(mem, op.clone()).await, apply(sql, op).await, "final admission records of {id}");
    }
    let every = Op::Due(DueQuery { namespace: None, workflows: None, now: u64::MAX, limit: 1000 });
    assert_eq!(apply(mem, every.clone()).await, apply(sql, every).await, "final schedules and buffers");
}

#[test]
fn sqlite_answers_like_the_memory_store() {
    let dir = tempfile::tempdir().unwrap();
    let rt = common::rt();
    let from: u64 = std::env::var("DURABLE_DIFF_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let seeds: u64 = std::env::var("DURABLE_DIFF_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for seed in from..seeds {
        let path = dir.path().join(format!("seed-{seed}.db"));
        let sql = common::open(&path);
        let mem = MemoryStore::new();
        rt.block_on(run_sequence(seed.wrapping_mul(0x9E37_79B9), 400, &mem, &sql, &path));
        let stats = sql.stats();
        assert!(stats.transactions < stats.writes, "some writes shared a transaction: {stats:?}");
        drop(sql);
        // And again after reopening the file: the state read back is the same.
        let sql = common::open(&path);
        rt.block_on(async {
            for id in RUNS {
                let op = Op::Inspect(RunId::from(*id), "key0".into());
                assert_eq!(apply(&mem, op.clone()).await, apply(&sql, op).await, "reopened: {id}");
            }
            let every = Op::Due(DueQuery { namespace: None, workflows: None, now: u64::MAX, limit: 1000 });
            assert_eq!(apply(&mem, every.clone()).await, apply(&sql, every).await, "reopened: schedules");
            let admission = Op::Admission(RunId::from(RUNS[0]), 5_000);
            assert_eq!(apply(&mem, admission.clone()).await, apply(&sql, admission).await, "reopened: admission");
        });
    }
}
