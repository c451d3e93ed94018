//! # durable-store-memory
//!
//! [`MemoryStore`]: the reference implementation of the [`Store`] contract, kept in process
//! memory. Every call takes one lock, so each call is atomic against concurrent callers. It is
//! what the runtime's and conformance crate's tests run on, and a good default for unit tests
//! of your own workflows. It keeps nothing when dropped and cannot be shared between processes
//! (use the SQLite or PostgreSQL store for that).
//!
//! ```
//! use std::sync::Arc;
//! use durable_core::Store;
//! use durable_store_memory::MemoryStore;
//!
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
//! assert!(!store.capabilities().persistent);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use async_trait::async_trait;
use durable_core::admission::{Admission, AdmissionBook, GateStats, Handoff, SlotRecord, SlotRequest, WaiterRecord};
use durable_core::task::{
    BeatOutcome, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, TaskLog, TaskState, WorkerInfo,
};
use durable_core::{
    BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Capabilities, Checkpoint, CheckpointStatus, Claim,
    ClaimOutcome, Commit, CommitOutcome, CreateRun, Delivery, DueQuery, Gathered, Millis, NewRun, Payload, Publish,
    Published, QueueReason, QueuedRun, Run, RunFilter, RunId, RunPage, RunPatch, RunQuery, RunQueue, RunStatus,
    SaveOutcome, SaveSchedule, ScheduleRecord, StepKind, Store, StoreError, StoreResult, TaskFilter, TriggerBuffer,
    TurnEnd, WaitKind, Waiter, codes, decode_cursor, encode_cursor, json_subset, protocol,
};
use parking_lot::Mutex;

/// The in-memory [`Store`]. Cheap to create; share it with `Arc`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// A planted bug for testing bug finders ([`MemoryStore::plant_bug_ignore_live_leases`]).
    ignore_live_leases: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct Inner {
    runs: HashMap<RunId, Run>,
    checkpoints: HashMap<RunId, BTreeMap<u32, Checkpoint>>,
    /// Every registered waiter by registration number (registration order = delivery order).
    waiters: BTreeMap<u64, Waiter>,
    by_token: HashMap<String, BTreeSet<u64>>,
    by_event: HashMap<String, BTreeSet<u64>>,
    by_run: HashMap<RunId, BTreeMap<u32, u64>>,
    /// Signals no wait took yet, per token, oldest first, with when each was buffered.
    signal_buffer: HashMap<String, VecDeque<(Millis, Payload)>>,
    /// Events no wait accepted yet, per name, oldest first, with when each was buffered.
    event_buffer: HashMap<String, VecDeque<(Millis, Payload)>>,
    state: HashMap<RunId, HashMap<String, Payload>>,
    next_waiter: u64,
    queue: BTreeMap<u64, Queued>,
    next_queued: u64,
    /// Remembered publish dedupe ids: `(event name, id)` → kept until.
    dedupe: HashMap<(String, String), Millis>,
    /// The same ids by expiry, so a publish forgets expired ones without scanning them all.
    dedupe_expiry: BTreeSet<(Millis, String, String)>,
    /// Open trigger buffers by `(workflow, key)`.
    buffers: BTreeMap<(String, String), TriggerBuffer>,
    schedules: BTreeMap<String, ScheduleRecord>,
    /// Remote-step tasks by `(run, seq)`.
    tasks: BTreeMap<(RunId, u32), Task>,
    workers: BTreeMap<String, WorkerInfo>,
    /// Admission gates, slots and queued requests.
    admission: AdmissionBook,
}

#[derive(Debug)]
struct Queued {
    item: QueuedRun,
    enqueued_at: Millis,
    claim: Option<(String, Millis)>,
}

impl Queued {
    /// Folds `item` (sent at `at`) into this unclaimed item of the same run, keeping the run at
    /// one unclaimed item: a `Wake` replaces a `Start` (with its dedupe key), the higher
    /// priority and the earlier place in line are kept.
    fn fold(&mut self, item: QueuedRun, at: Millis) {
        if item.reason == QueueReason::Wake {
            self.item.reason = QueueReason::Wake;
            self.item.fold_wake_key(item.dedupe_key);
        }
        self.item.priority = self.item.priority.max(item.priority);
        self.enqueued_at = self.enqueued_at.min(at);
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// **A planted bug, for testing tests.** While on, `claim_run` takes a run whose lease
    /// another owner still holds, breaking the rule that one engine at a time executes a run.
    /// It exists so that a simulation test can show it finds such a bug
    /// (`durable_conformance::sim`); never turn it on anywhere else.
    #[doc(hidden)]
    pub fn plant_bug_ignore_live_leases(&self, on: bool) {
        self.ignore_live_leases.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

fn lease_is_live(run: &Run, now: Millis) -> bool {
    run.lease_owner.is_some() && run.lease_until.is_some_and(|until| until >= now)
}

fn matches_query(run: &Run, q: &RunQuery) -> bool {
    q.namespace.as_ref().is_none_or(|ns| *ns == run.namespace)
        && q.workflows.as_ref().is_none_or(|ws| ws.iter().any(|(w, v)| *w == run.workflow && *v == run.version))
}

fn matches_due(namespace: &str, workflow: &str, q: &DueQuery) -> bool {
    q.namespace.as_ref().is_none_or(|ns| ns == namespace)
        && q.workflows.as_ref().is_none_or(|ws| ws.iter().any(|w| w == workflow))
}

fn check_transition(run: &Run, next: RunStatus) -> StoreResult<()> {
    if run.status == next || run.status.can_become(next) {
        Ok(())
    } else {
        Err(StoreError::Conflict { message: format!("run {}: status {} cannot become {next}", run.id, run.status) })
    }
}

impl Inner {
    /// `Store::commit`, under the store's lock.
    fn commit(&mut self, commit: Commit) -> StoreResult<CommitOutcome> {
        let inner = self;
        let Some(run) = inner.runs.get(&commit.run_id) else {
            return Err(StoreError::NotFound { what: format!("run {}", commit.run_id) });
        };
        if run.lease_owner.as_deref() != Some(commit.owner.as_str()) {
            return Err(StoreError::LeaseLost { run_id: commit.run_id, owner: commit.owner });
        }
        if let Some(TurnEnd::Settle { status, .. }) = &commit.end
            && run.status == RunStatus::Running
        {
            check_transition(run, *status)?;
        }
        let now = commit.now;
        let progress = commit.makes_progress();
        let mut out = CommitOutcome::default();
        // Expired waits first: a wait whose waiter a delivery already took keeps the delivery.
        for seq in &commit.expire_waits {
            let wid = inner.by_run.get(&commit.run_id).and_then(|m| m.get(seq)).copied();
            match wid {
                Some(wid) => {
                    inner.remove_waiter(wid);
                }
                None => out.raced.push(*seq),
            }
        }
        let cps = inner.checkpoints.entry(commit.run_id.clone()).or_default();
        for cp in commit.checkpoints {
            if out.raced.contains(&cp.seq) {
                continue;
            }
            cps.insert(cp.seq, cp);
        }
        for w in commit.waits {
            inner.register_wait(w, now);
        }
        if !commit.state.is_empty() {
            let st = inner.state.entry(commit.run_id.clone()).or_default();
            for (k, v) in commit.state {
                st.insert(k, v);
            }
        }
        for child in commit.children {
            inner.create_never_refused(child);
        }
        for sig in commit.signals {
            out.deliveries.push(inner.send_signal(&sig.token, sig.payload, now));
        }
        for task in commit.tasks {
            let key = (task.run_id.clone(), task.seq);
            let logs = inner.tasks.remove(&key).map(|t| t.logs).unwrap_or_default();
            inner.tasks.insert(key, Task { logs, ..Task::dispatched(task) });
        }
        let mut handed = Vec::new();
        for (gate, holder) in &commit.release_slots {
            handed.extend(inner.admission.release(gate, holder, now));
        }
        let run = inner.runs.get_mut(&commit.run_id).expect("checked above");
        if progress && run.status == RunStatus::Running {
            // The turn got somewhere: recoveries count again from here.
            run.recovery_attempts = 0;
        }
        match commit.end {
            None => run.updated_at = now,
            Some(TurnEnd::Suspend { wake_at, seen_wake_gen }) if run.status == RunStatus::Running => {
                run.updated_at = now;
                if run.wake_gen != seen_wake_gen || !out.raced.is_empty() {
                    out.woken = true;
                } else {
                    run.status = RunStatus::Suspended;
                    run.wake_at = wake_at;
                    run.lease_owner = None;
                    run.lease_until = None;
                }
            }
            Some(TurnEnd::Settle { status, output, error }) if run.status == RunStatus::Running => {
                run.status = status;
                run.output = output;
                run.error = error;
                run.wake_at = None;
                run.lease_owner = None;
                run.lease_until = None;
                run.updated_at = now;
                out.settled = true;
                inner.remove_waiters_of(&commit.run_id);
                inner.finish_tasks_of(&commit.run_id);
                handed.extend(inner.admission.release_run(&commit.run_id, now));
            }
            // A turn end that finds the run no longer running (an operator cancelled it
            // mid-turn) changes nothing of the run row: terminal runs accept no transition.
            Some(_) => {}
        }
        inner.wake_handed(&handed, now);
        out.handed_off = handed.into_iter().map(|h| h.run_id).collect();
        Ok(out)
    }

    /// [`Store::claim_run`] under the lock (`ignore_live_leases`: the planted bug).
    /// [`Store::claim_run_from`] under the lock (`from_seq` 0: [`Store::claim_run`]).
    fn claim_run(&mut self, claim: Claim, ignore_live_leases: bool, from_seq: u32) -> ClaimOutcome {
        let Some(run) = self.runs.get_mut(&claim.run_id) else {
            return ClaimOutcome::NotFound;
        };
        if run.status.is_terminal() {
            return ClaimOutcome::Terminal(run.clone());
        }
        if run.status == RunStatus::Pending && run.wake_at == Some(protocol::GATED) {
            return ClaimOutcome::Busy(run.clone());
        }
        let held_by_other = run.lease_owner.as_deref().is_some_and(|o| o != claim.owner);
        if held_by_other && lease_is_live(run, claim.now) && !ignore_live_leases {
            return ClaimOutcome::Busy(run.clone());
        }
        let previous = run.status;
        let recovered = previous == RunStatus::Running && held_by_other;
        if recovered {
            run.recovery_attempts += 1;
        }
        if run.claim_clears_error() {
            run.error = None;
        }
        run.status = RunStatus::Running;
        run.lease_owner = Some(claim.owner);
        run.lease_until = Some(claim.lease_until);
        run.updated_at = claim.now;
        run.claims += 1;
        let run = run.clone();
        let history = self
            .checkpoints
            .get(&claim.run_id)
            .map(|m| m.range(from_seq..).map(|(_, cp)| cp.clone()).collect())
            .unwrap_or_default();
        ClaimOutcome::Acquired { run, history, previous, recovered }
    }

    /// [`Store::complete_task`] under the lock.
    fn complete_task(&mut self, done: TaskDone) -> TaskCompletion {
        let inner = self;
        let key = (done.run_id.clone(), done.seq);
        match inner.tasks.get(&key) {
            Some(t) if t.task.attempt == done.attempt && t.state != TaskState::Finished => {}
            _ => return TaskCompletion::Duplicate,
        }
        let terminal = inner.runs.get(&done.run_id).is_none_or(|r| r.status.is_terminal());
        let finish = |t: &mut Task, outcome: &str, logs: Vec<TaskLog>| {
            t.state = TaskState::Finished;
            t.outcome = Some(outcome.to_string());
            t.lease_until = None;
            t.logs.extend(logs);
        };
        if terminal {
            finish(inner.tasks.get_mut(&key).expect("checked above"), "cancelled", done.logs);
            return TaskCompletion::RunTerminal;
        }
        let token = protocol::remote_token(&done.run_id, done.seq);
        let waiter = inner
            .by_run
            .get(&done.run_id)
            .and_then(|m| m.get(&done.seq))
            .copied()
            .filter(|id| matches!(&inner.waiters[id].kind, WaitKind::Signal { token: t } if *t == token));
        let Some(waiter) = waiter else {
            return TaskCompletion::Duplicate;
        };
        let w = inner.remove_waiter(waiter).expect("indexed waiter exists");
        let outcome = match done.result {
            Ok(output) => {
                inner.resolve(&done.run_id, done.seq, &w.name, StepKind::Remote, output, done.now);
                "completed"
            }
            Err(error) => {
                let timed_out = error.code() == Some(codes::REMOTE_TIMEOUT);
                let cps = inner.checkpoints.entry(done.run_id.clone()).or_default();
                let cp = cps.entry(done.seq).or_insert_with(|| {
                    Checkpoint::new(
                        done.run_id.clone(),
                        done.seq,
                        &w.name,
                        StepKind::Remote,
                        CheckpointStatus::Waiting,
                        done.now,
                    )
                });
                cp.status = CheckpointStatus::Waiting;
                cp.error = Some(error);
                cp.wake_at = None;
                cp.updated_at = done.now;
                inner.wake(&done.run_id, done.now);
                if timed_out { "timed_out" } else { "failed" }
            }
        };
        if let Some(cp) = inner.checkpoints.get_mut(&done.run_id).and_then(|m| m.get_mut(&done.seq)) {
            cp.attempts = done.attempt;
        }
        finish(inner.tasks.get_mut(&key).expect("checked above"), outcome, done.logs);
        // The step's admission slot (a gated remote step holds one while its attempt is out).
        let holder = protocol::step_id(&done.run_id, done.seq);
        let handed = inner.admission.release_holder(&done.run_id, &holder, done.now);
        inner.wake_handed(&handed, done.now);
        TaskCompletion::Accepted
    }

    /// The ids `Store::due_runs` returns: parked runs and delayed starts due at `q.now`
    /// without a live lease, earliest `wake_at` first.
    fn due_runs(&self, q: &RunQuery) -> Vec<RunId> {
        // Runs left to a fresh unclaimed item of their own (`RunQuery::leave_queued_since`).
        let queued: HashSet<&RunId> = match q.leave_queued_since {
            Some(since) => self
                .queue
                .values()
                .filter(|o| o.claim.is_none() && o.enqueued_at > since && o.enqueued_at <= q.now)
                .map(|o| &o.item.run_id)
                .collect(),
            None => HashSet::new(),
        };
        let mut runs: Vec<&Run> = self
            .runs
            .values()
            .filter(|r| {
                (r.status.is_parked() || r.status == RunStatus::Pending)
                    && r.wake_at.is_some_and(|w| w <= q.now)
                    && !lease_is_live(r, q.now)
                    && matches_query(r, q)
            })
            .collect();
        runs.sort_by(|a, b| (a.wake_at, &a.id).cmp(&(b.wake_at, &b.id)));
        // Those left to an item are dropped from the first `limit`, not replaced.
        runs.into_iter().take(q.limit).filter(|r| !queued.contains(&r.id)).map(|r| r.id.clone()).collect()
    }

    /// The run's unclaimed queue item, if it has one (it has at most one).
    fn open_item(&mut self, run: &RunId) -> Option<&mut Queued> {
        self.queue.values_mut().find(|q| q.claim.is_none() && q.item.run_id == *run)
    }

    /// [`Inner::create`], deciding the run's concurrency key first (see `Store::create_run`).
    fn create_admitted(&mut self, mut new: NewRun) -> StoreResult<CreateRun> {
        if let Some(existing) = self.runs.get(&new.id) {
            return Ok(CreateRun::Existing(existing.clone()));
        }
        if let Some(mut request) = new.admission.take() {
            request.holder = new.id.to_string();
            request.run_id = new.id.clone();
            request.lease_until = None;
            let (answer, handed) = self.admission.acquire(&request);
            self.wake_handed(&handed, request.now);
            match answer {
                Admission::Admitted => {}
                Admission::Waiting { .. } => new.start_at = Some(protocol::GATED),
                Admission::Full { held, waiting } => {
                    return Err(StoreError::QueueFull { gate: request.gate, held, waiting });
                }
            }
        }
        Ok(self.create(new))
    }

    /// Wakes the runs admission slots were handed to.
    fn wake_handed(&mut self, handed: &[Handoff], now: Millis) {
        for h in handed {
            match self.runs.get_mut(&h.run_id) {
                Some(run) if run.status == RunStatus::Pending && run.wake_at == Some(protocol::GATED) => {
                    run.wake_at = Some(now);
                    run.wake_gen += 1;
                    run.updated_at = now;
                }
                Some(_) => self.wake(&h.run_id, now),
                None => {}
            }
        }
    }

    /// [`Inner::create_admitted`] for a run no caller is there to refuse (a commit's child, a
    /// publish's or a schedule's start, a flushed buffer's run): it waits for its key however
    /// many wait.
    fn create_never_refused(&mut self, new: NewRun) -> CreateRun {
        self.create_admitted(new.never_refused()).expect("a request without a queue bound is never refused")
    }

    fn create(&mut self, new: NewRun) -> CreateRun {
        if let Some(existing) = self.runs.get(&new.id) {
            return CreateRun::Existing(existing.clone());
        }
        let run = new.into_run();
        self.runs.insert(run.id.clone(), run.clone());
        CreateRun::Created(run)
    }

    fn save_schedule(&mut self, save: SaveSchedule) -> SaveOutcome {
        let current = self.schedules.get(&save.record.key);
        if current.map(|r| r.revision) != save.expected {
            return SaveOutcome::Stale(current.cloned().map(Box::new));
        }
        let mut record = save.record;
        record.revision = save.expected.map_or(1, |r| r + 1);
        let revision = record.revision;
        self.schedules.insert(record.key.clone(), record);
        for run in save.start {
            self.create_never_refused(run);
        }
        SaveOutcome::Saved(revision)
    }

    fn remove_waiter(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        match &w.kind {
            WaitKind::Signal { token } => remove_index(&mut self.by_token, token, id),
            WaitKind::Event { name, .. } => remove_index(&mut self.by_event, name, id),
        }
        if let Some(m) = self.by_run.get_mut(&w.run_id) {
            m.remove(&w.seq);
            if m.is_empty() {
                self.by_run.remove(&w.run_id);
            }
        }
        Some(w)
    }

    /// Records a delivered payload at the waiter's seq and wakes its run.
    fn resolve(&mut self, run_id: &RunId, seq: u32, name: &str, kind: StepKind, payload: Payload, now: Millis) {
        let cps = self.checkpoints.entry(run_id.clone()).or_default();
        let cp = cps
            .entry(seq)
            .or_insert_with(|| Checkpoint::new(run_id.clone(), seq, name, kind, CheckpointStatus::Waiting, now));
        cp.status = CheckpointStatus::Completed;
        cp.output = Some(payload);
        cp.updated_at = now;
        self.wake(run_id, now);
    }

    /// Wakes a run as a delivery does.
    fn wake(&mut self, run_id: &RunId, now: Millis) {
        if let Some(run) = self.runs.get_mut(run_id) {
            run.wake_gen += 1;
            if run.status.is_parked() {
                run.wake_at = Some(run.wake_at.map_or(now, |w| w.min(now)));
            }
            run.updated_at = now;
        }
    }

    fn send_signal(&mut self, token: &str, payload: Payload, now: Millis) -> Delivery {
        let first = self.by_token.get(token).and_then(|s| s.first().copied());
        if let Some(id) = first {
            let w = self.remove_waiter(id).expect("indexed waiter exists");
            self.resolve(&w.run_id, w.seq, &w.name, StepKind::Signal, payload, now);
            return Delivery::Delivered { run_id: w.run_id, seq: w.seq };
        }
        // A child's result for a parent no wait of which can ever take it is dropped.
        let orphan = protocol::child_token_parent(token)
            .is_some_and(|parent| self.runs.get(parent).is_none_or(|p| p.status.is_final()));
        if !orphan {
            self.signal_buffer.entry(token.to_string()).or_default().push_back((now, payload));
        }
        Delivery::Buffered
    }

    fn register_wait(&mut self, w: Waiter, now: Millis) {
        match &w.kind {
            WaitKind::Signal { token } => {
                if let Some((_, payload)) = self.signal_buffer.get_mut(token).and_then(VecDeque::pop_front) {
                    self.resolve(&w.run_id, w.seq, &w.name, StepKind::Signal, payload, now);
                    return;
                }
            }
            WaitKind::Event { name, matcher } => {
                let matcher = matcher.to_value();
                if let Some(buf) = self.event_buffer.get_mut(name)
                    && let Some(pos) = buf.iter().position(|(_, p)| json_subset(&matcher, &p.to_value()))
                {
                    let (_, payload) = buf.remove(pos).expect("position is in range");
                    self.resolve(&w.run_id, w.seq, &w.name, StepKind::Event, payload, now);
                    return;
                }
            }
        }
        // Replace an earlier registration at the same seq (a re-suspension re-registers).
        if let Some(old) = self.by_run.get(&w.run_id).and_then(|m| m.get(&w.seq)).copied() {
            self.remove_waiter(old);
        }
        let id = self.next_waiter;
        self.next_waiter += 1;
        match &w.kind {
            WaitKind::Signal { token } => self.by_token.entry(token.clone()).or_default().insert(id),
            WaitKind::Event { name, .. } => self.by_event.entry(name.clone()).or_default().insert(id),
        };
        self.by_run.entry(w.run_id.clone()).or_default().insert(w.seq, id);
        self.waiters.insert(id, w);
    }

    fn remove_waiters_of(&mut self, id: &RunId) {
        if let Some(ws) = self.by_run.get(id).cloned() {
            for wid in ws.values() {
                self.remove_waiter(*wid);
            }
        }
    }

    /// Finishes the unfinished tasks of a settled run.
    fn finish_tasks_of(&mut self, id: &RunId) {
        for t in self.tasks.range_mut((id.clone(), 0)..=(id.clone(), u32::MAX)).map(|(_, t)| t) {
            if t.state != TaskState::Finished {
                t.state = TaskState::Finished;
                t.outcome = Some("cancelled".into());
            }
        }
    }

    fn delete_one(&mut self, id: &RunId) {
        self.tasks.retain(|(run, _), _| run != id);
        self.runs.remove(id);
        self.checkpoints.remove(id);
        self.state.remove(id);
        self.remove_waiters_of(id);
    }
}

fn remove_index(index: &mut HashMap<String, BTreeSet<u64>>, key: &str, id: u64) {
    if let Some(set) = index.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::IN_MEMORY.with_claimed_dispatch(true)
    }

    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
        self.inner.lock().create_admitted(run)
    }

    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        // Under one lock: no reader sees part of the batch.
        let mut inner = self.inner.lock();
        if runs.iter().all(|r| r.admission.is_none()) {
            return Ok(runs.into_iter().map(|run| inner.create(run)).collect());
        }
        // All or nothing: a refused start undoes the batch's admissions and creations.
        let book = inner.admission.clone();
        let mut answers = Vec::with_capacity(runs.len());
        for run in runs {
            match inner.create_admitted(run) {
                Ok(answer) => answers.push(answer),
                Err(e) => {
                    inner.admission = book;
                    for a in answers {
                        if let CreateRun::Created(r) = a {
                            inner.runs.remove(&r.id);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(answers)
    }

    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        Ok(self.inner.lock().runs.get(id).cloned())
    }

    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
        let after = filter.cursor.as_deref().map(decode_cursor).transpose()?;
        let limit = if filter.limit == 0 { 100 } else { filter.limit };
        let inner = self.inner.lock();
        let mut runs: Vec<&Run> = inner
            .runs
            .values()
            .filter(|r| {
                filter.workflow.as_ref().is_none_or(|w| *w == r.workflow)
                    && (filter.statuses.is_empty() || filter.statuses.contains(&r.status))
                    && filter.namespace.as_ref().is_none_or(|ns| *ns == r.namespace)
                    && filter.tag.as_ref().is_none_or(|t| r.tags.contains(t))
                    && filter.parent.as_ref().is_none_or(|p| r.parent.as_ref().is_some_and(|l| l.run_id == *p))
                    && filter.created_after.is_none_or(|t| r.created_at >= t)
                    && filter.created_before.is_none_or(|t| r.created_at < t)
                    && after.as_ref().is_none_or(|(t, id)| (r.created_at, &r.id) < (*t, id))
            })
            .collect();
        runs.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        let more = runs.len() > limit;
        runs.truncate(limit);
        let runs: Vec<Run> = runs.into_iter().cloned().collect();
        let next_cursor = if more { runs.last().map(encode_cursor) } else { None };
        Ok(RunPage { runs, next_cursor })
    }

    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
        Ok(self.inner.lock().checkpoints.get(id).map(|m| m.values().cloned().collect()).unwrap_or_default())
    }

    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
        let ignore = self.ignore_live_leases.load(std::sync::atomic::Ordering::Relaxed);
        Ok(self.inner.lock().claim_run(claim, ignore, 0))
    }

    async fn claim_run_from(&self, claim: Claim, from_seq: u32) -> StoreResult<ClaimOutcome> {
        let ignore = self.ignore_live_leases.load(std::sync::atomic::Ordering::Relaxed);
        Ok(self.inner.lock().claim_run(claim, ignore, from_seq))
    }

    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
        let mut inner = self.inner.lock();
        match inner.runs.get_mut(id) {
            Some(run) if run.lease_owner.as_deref() == Some(owner) => {
                run.lease_until = Some(lease_until);
                inner.admission.renew(id, lease_until);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
        let mut inner = self.inner.lock();
        match inner.runs.get_mut(id) {
            Some(run) if run.lease_owner.as_deref() == Some(owner) => {
                run.lease_owner = None;
                run.lease_until = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        self.inner.lock().commit(commit)
    }

    /// One lock: the commit, then the claim of the first run it handed a slot to.
    async fn commit_and_claim_handed(
        &self,
        commit: Commit,
        lease_until: Millis,
    ) -> StoreResult<(CommitOutcome, Option<ClaimOutcome>)> {
        let ignore = self.ignore_live_leases.load(std::sync::atomic::Ordering::Relaxed);
        let (owner, now) = (commit.owner.clone(), commit.now);
        let mut inner = self.inner.lock();
        let outcome = inner.commit(commit)?;
        let claimed = outcome
            .handed_off
            .first()
            .map(|run_id| inner.claim_run(Claim { run_id: run_id.clone(), owner, lease_until, now }, ignore, 0));
        Ok((outcome, claimed))
    }

    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
        let mut inner = self.inner.lock();
        let Some(run) = inner.runs.get_mut(id) else {
            return Ok(false);
        };
        if !expected.is_empty() && !expected.contains(&run.status) {
            return Ok(false);
        }
        if let Some(next) = patch.status {
            check_transition(run, next)?;
            run.status = next;
        }
        if let Some(output) = patch.output {
            run.output = output;
        }
        if let Some(error) = patch.error {
            run.error = error;
        }
        if let Some(wake_at) = patch.wake_at {
            run.wake_at = wake_at;
        }
        if patch.release_lease {
            run.lease_owner = None;
            run.lease_until = None;
        }
        if patch.reset_recovery {
            run.recovery_attempts = 0;
        }
        if patch.wake {
            run.wake_gen += 1;
            if run.status.is_parked() {
                run.wake_at = Some(run.wake_at.map_or(patch.now, |w| w.min(patch.now)));
            }
        }
        run.updated_at = patch.now;
        let terminal = run.status.is_terminal();
        if let (Some(from), Some(cps)) = (patch.truncate_history_from, inner.checkpoints.get_mut(id)) {
            cps.retain(|seq, _| *seq < from);
        }
        if terminal {
            inner.remove_waiters_of(id);
            let handed = inner.admission.release_run(id, patch.now);
            inner.wake_handed(&handed, patch.now);
        }
        for signal in patch.signals {
            inner.send_signal(&signal.token, signal.payload, patch.now);
        }
        Ok(true)
    }

    async fn pending_runs(&self, q: &RunQuery) -> StoreResult<Vec<RunId>> {
        let inner = self.inner.lock();
        let mut runs: Vec<&Run> = inner
            .runs
            .values()
            .filter(|r| {
                r.status == RunStatus::Pending && r.wake_at.is_none() && !lease_is_live(r, q.now) && matches_query(r, q)
            })
            .collect();
        runs.sort_by(|a, b| {
            (Reverse(a.priority), a.created_at, &a.id).cmp(&(Reverse(b.priority), b.created_at, &b.id))
        });
        Ok(runs.into_iter().take(q.limit).map(|r| r.id.clone()).collect())
    }

    async fn due_runs(&self, q: &RunQuery) -> StoreResult<Vec<RunId>> {
        Ok(self.inner.lock().due_runs(q))
    }

    async fn claim_due_runs(&self, q: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
        let mut inner = self.inner.lock();
        let ids = inner.due_runs(q);
        for id in &ids {
            if let Some(run) = inner.runs.get_mut(id) {
                run.wake_at = Some(until);
            }
        }
        Ok(ids)
    }

    async fn orphaned_runs(&self, q: &RunQuery) -> StoreResult<Vec<RunId>> {
        let inner = self.inner.lock();
        let mut runs: Vec<&Run> = inner
            .runs
            .values()
            .filter(|r| r.status == RunStatus::Running && !lease_is_live(r, q.now) && matches_query(r, q))
            .collect();
        runs.sort_by(|a, b| (a.updated_at, &a.id).cmp(&(b.updated_at, &b.id)));
        Ok(runs.into_iter().take(q.limit).map(|r| r.id.clone()).collect())
    }

    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
        Ok(self.inner.lock().send_signal(token, payload, now))
    }

    /// One lock: the delivery, then the claim of the run it woke if that is `claim.run_id`.
    async fn send_signal_and_claim(
        &self,
        token: &str,
        payload: Payload,
        claim: Claim,
        from_seq: u32,
    ) -> StoreResult<(Delivery, Option<ClaimOutcome>)> {
        let ignore = self.ignore_live_leases.load(std::sync::atomic::Ordering::Relaxed);
        let mut inner = self.inner.lock();
        let delivery = inner.send_signal(token, payload, claim.now);
        let claimed = delivery.is_to(&claim.run_id).then(|| inner.claim_run(claim, ignore, from_seq));
        Ok((delivery, claimed))
    }

    async fn publish(&self, event: Publish) -> StoreResult<Published> {
        let mut inner = self.inner.lock();
        let now = event.now;
        if let Some(d) = &event.dedupe {
            let key = (event.name.clone(), d.id.clone());
            if inner.dedupe.get(&key).is_some_and(|until| *until >= now) {
                return Ok(Published::Duplicate);
            }
            // The two indexes hold the same ids: forget the expired ones, oldest first.
            while let Some(expired) = inner.dedupe_expiry.first().filter(|(until, ..)| *until < now).cloned() {
                inner.dedupe_expiry.remove(&expired);
                inner.dedupe.remove(&(expired.1, expired.2));
            }
            if let Some(old) = inner.dedupe.insert(key.clone(), d.keep_until) {
                inner.dedupe_expiry.remove(&(old, key.0.clone(), key.1.clone()));
            }
            inner.dedupe_expiry.insert((d.keep_until, key.0, key.1));
        }
        let value = event.payload.to_value();
        let ids: Vec<u64> = inner.by_event.get(&event.name).map(|s| s.iter().copied().collect()).unwrap_or_default();
        let mut deliveries = Vec::new();
        for id in ids {
            let accepts = match &inner.waiters[&id].kind {
                WaitKind::Event { matcher, .. } => json_subset(&matcher.to_value(), &value),
                WaitKind::Signal { .. } => false,
            };
            if accepts {
                let w = inner.remove_waiter(id).expect("indexed waiter exists");
                inner.resolve(&w.run_id, w.seq, &w.name, StepKind::Event, event.payload.clone(), now);
                deliveries.push(Delivery::Delivered { run_id: w.run_id, seq: w.seq });
            }
        }
        if deliveries.is_empty() {
            inner.event_buffer.entry(event.name.clone()).or_default().push_back((now, event.payload.clone()));
        }
        let mut started: Vec<CreateRun> = event.start.into_iter().map(|run| inner.create_never_refused(run)).collect();
        for append in &event.gather {
            let key = (append.workflow.clone(), append.key.clone());
            let open = inner.buffers.remove(&key);
            match TriggerBuffer::gather(open, append, event.payload.clone(), now) {
                Gathered::Keep(buffer) => {
                    inner.buffers.insert(key, buffer);
                }
                Gathered::Start(run) => started.push(inner.create_never_refused(run)),
            }
        }
        Ok(Published::Done { deliveries, started })
    }

    async fn due_buffers(&self, q: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
        let inner = self.inner.lock();
        let mut due: Vec<&TriggerBuffer> = inner
            .buffers
            .values()
            .filter(|b| b.due_at <= q.now && matches_due(&b.run.namespace, &b.workflow, q))
            .collect();
        due.sort_by(|a, b| (a.due_at, &a.workflow, &a.key).cmp(&(b.due_at, &b.workflow, &b.key)));
        Ok(due.into_iter().take(q.limit).cloned().collect())
    }

    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<SlotRequest>,
    ) -> StoreResult<Option<CreateRun>> {
        let mut inner = self.inner.lock();
        let k = (workflow.to_string(), key.to_string());
        if inner.buffers.get(&k).is_none_or(|b| b.batch_id != batch_id || b.due_at > now) {
            return Ok(None);
        }
        let buffer = inner.buffers.remove(&k).expect("checked");
        Ok(Some(inner.create_never_refused(NewRun { admission, ..buffer.into_run(now) })))
    }

    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
        Ok(self.inner.lock().schedules.get(key).cloned())
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>> {
        let inner = self.inner.lock();
        let from = after.map_or(std::ops::Bound::Unbounded, |a| std::ops::Bound::Excluded(a.to_string()));
        Ok(inner
            .schedules
            .range((from, std::ops::Bound::Unbounded))
            .map(|(_, r)| r)
            .filter(|r| namespace.is_none_or(|ns| ns == r.namespace))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
        Ok(self.inner.lock().save_schedule(save))
    }

    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        let mut inner = self.inner.lock();
        Ok(saves.into_iter().map(|save| inner.save_schedule(save)).collect())
    }

    async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
        Ok(self.inner.lock().schedules.remove(key).is_some())
    }

    async fn due_schedules(&self, q: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
        let inner = self.inner.lock();
        let mut due: Vec<&ScheduleRecord> = inner
            .schedules
            .values()
            .filter(|r| r.due_at.is_some_and(|d| d <= q.now) && matches_due(&r.namespace, &r.workflow, q))
            .collect();
        due.sort_by(|a, b| (a.due_at, &a.key).cmp(&(b.due_at, &b.key)));
        Ok(due.into_iter().take(q.limit).cloned().collect())
    }

    async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let now = claim.now;
        let runs = &inner.runs;
        let mut picked: Vec<(RunId, u32)> = inner
            .tasks
            .values()
            .filter(|t| {
                t.claimable(now)
                    && claim.covers(&t.task)
                    && runs.get(&t.task.run_id).is_some_and(|r| !r.status.is_terminal())
            })
            .map(|t| (Reverse(t.task.priority), t.task.created_at, t.task.run_id.clone(), t.task.seq))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .take(claim.limit)
            .map(|(_, _, run, seq)| (run, seq))
            .collect();
        let mut out = Vec::with_capacity(picked.len());
        for key in picked.drain(..) {
            let t = inner.tasks.get_mut(&key).expect("picked from the map");
            t.state = TaskState::Claimed;
            t.worker = Some(claim.worker.clone());
            // Never stamped before the dispatch (a claimer's clock behind the dispatcher's).
            let at = now.max(t.task.created_at);
            t.lease_until = Some(at.saturating_add(t.task.heartbeat_timeout_ms));
            t.heartbeat_at = Some(at);
            t.claimed_at.get_or_insert(at);
            t.claims += 1;
            out.push(t.clone());
        }
        Ok(out)
    }

    async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let terminal = inner.runs.get(&beat.run_id).is_none_or(|r| r.status.is_terminal());
        let Some(t) = inner.tasks.get_mut(&(beat.run_id.clone(), beat.seq)) else {
            return Ok(BeatOutcome::Lost);
        };
        if t.task.attempt != beat.attempt {
            return Ok(BeatOutcome::Lost);
        }
        if t.state == TaskState::Finished {
            return Ok(BeatOutcome::Cancelled);
        }
        if t.state != TaskState::Claimed || t.worker.as_deref() != Some(beat.worker.as_str()) {
            return Ok(BeatOutcome::Lost);
        }
        if terminal || t.expired(beat.now) {
            return Ok(BeatOutcome::Cancelled);
        }
        let until = beat.now.saturating_add(t.task.heartbeat_timeout_ms);
        t.lease_until = Some(until);
        t.heartbeat_at = Some(beat.now);
        if let Some(p) = &beat.progress {
            t.progress = Some(p.clone());
        }
        t.logs.extend(beat.logs.iter().cloned());
        Ok(BeatOutcome::Extended(until))
    }

    async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
        Ok(self.inner.lock().complete_task(done))
    }

    /// Both under one lock: nothing happens to the run between the result and the claim.
    async fn complete_task_and_claim(
        &self,
        done: TaskDone,
        claim: Claim,
    ) -> StoreResult<(TaskCompletion, Option<ClaimOutcome>)> {
        done.check_claim(&claim)?;
        let ignore = self.ignore_live_leases.load(std::sync::atomic::Ordering::Relaxed);
        let mut inner = self.inner.lock();
        let completion = inner.complete_task(done);
        let claimed = (completion == TaskCompletion::Accepted).then(|| inner.claim_run(claim, ignore, 0));
        Ok((completion, claimed))
    }

    async fn release_tasks(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        for (run, seq, attempt) in tasks {
            if let Some(t) = inner.tasks.get_mut(&(run.clone(), *seq))
                && t.task.attempt == *attempt
                && t.state == TaskState::Claimed
                && t.worker.as_deref() == Some(worker)
            {
                t.state = TaskState::Queued;
                t.lease_until = None;
            }
        }
        Ok(())
    }

    async fn list_tasks(&self, f: &TaskFilter) -> StoreResult<Vec<Task>> {
        let inner = self.inner.lock();
        let limit = if f.limit == 0 { 100 } else { f.limit };
        let mut out: Vec<&Task> = inner
            .tasks
            .values()
            .filter(|t| {
                let open = t.state != TaskState::Finished;
                f.run_id.as_ref().is_none_or(|r| *r == t.task.run_id)
                    && (!f.unfinished || open)
                    && (!f.queued || t.state == TaskState::Queued)
                    && f.expired_at.is_none_or(|at| t.expired(at))
                    && f.silent_since.is_none_or(|at| open && t.heartbeat_at.unwrap_or(t.task.created_at) < at)
            })
            .collect();
        out.sort_by(|a, b| {
            (a.task.created_at, &a.task.run_id, a.task.seq).cmp(&(b.task.created_at, &b.task.run_id, b.task.seq))
        });
        Ok(out.into_iter().take(limit).cloned().collect())
    }

    async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        let inner = self.inner.lock();
        let mut stats: BTreeMap<(String, String), QueueStats> = BTreeMap::new();
        for t in inner.tasks.values() {
            let active = inner.runs.get(&t.task.run_id).is_some_and(|r| !r.status.is_terminal());
            if t.state == TaskState::Finished || !active {
                continue;
            }
            let s = stats.entry((t.task.namespace.clone(), t.task.queue.clone())).or_insert_with(|| QueueStats {
                namespace: t.task.namespace.clone(),
                queue: t.task.queue.clone(),
                queued: 0,
                claimed: 0,
                oldest_at: None,
            });
            match t.state {
                TaskState::Queued => s.queued += 1,
                _ => s.claimed += 1,
            }
            s.oldest_at = Some(s.oldest_at.map_or(t.task.created_at, |o| o.min(t.task.created_at)));
        }
        Ok(stats.into_values().collect())
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
        self.inner.lock().workers.insert(worker.id.clone(), worker.clone());
        Ok(())
    }

    async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
        Ok(self.inner.lock().workers.remove(id).is_some())
    }

    async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        let mut inner = self.inner.lock();
        inner.workers.retain(|_, w| w.heartbeat_at >= heartbeat_before);
        Ok(inner.workers.values().cloned().collect())
    }

    async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
        let mut inner = self.inner.lock();
        let (answer, handed) = inner.admission.acquire(request);
        inner.wake_handed(&handed, request.now);
        Ok(answer)
    }

    async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        let mut inner = self.inner.lock();
        let handed = inner.admission.release(gate, holder, now);
        inner.wake_handed(&handed, now);
        Ok(handed.into_iter().map(|h| h.run_id).collect())
    }

    async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        Ok(self.inner.lock().admission.stats(now))
    }

    async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        let inner = self.inner.lock();
        Ok((inner.admission.slots_of(id), inner.admission.waits_of(id)))
    }

    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
        let inner = self.inner.lock();
        Ok(inner
            .by_run
            .get(id)
            .map(|m| m.values().filter_map(|wid| inner.waiters.get(wid).cloned()).collect())
            .unwrap_or_default())
    }

    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
        Ok(self.inner.lock().state.get(id).and_then(|m| m.get(key).cloned()))
    }

    async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
        let inner = self.inner.lock();
        let kinds = [(BufferedKind::Signal, &inner.signal_buffer), (BufferedKind::Event, &inner.event_buffer)];
        let mut out = Vec::new();
        for (kind, buffers) in kinds {
            if query.kind.is_some_and(|k| k != kind) {
                continue;
            }
            let mut keys: Vec<(&String, &VecDeque<(Millis, Payload)>)> = buffers
                .iter()
                .filter(|(key, buf)| !buf.is_empty() && query.prefix.as_deref().is_none_or(|p| key.starts_with(p)))
                .collect();
            keys.sort_by(|a, b| a.0.cmp(b.0));
            for (key, buf) in keys {
                let oldest_at = buf.iter().map(|(at, _)| *at).min().expect("not empty");
                if query.oldest_before.is_some_and(|before| oldest_at >= before) {
                    continue;
                }
                out.push(BufferedDeliveries {
                    kind,
                    key: key.clone(),
                    count: buf.len() as u64,
                    oldest_at,
                    newest_at: buf.iter().map(|(at, _)| *at).max().expect("not empty"),
                });
            }
        }
        out.truncate(query.limit);
        Ok(out)
    }

    async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
        let mut inner = self.inner.lock();
        let buffers = match purge.kind {
            BufferedKind::Signal => &mut inner.signal_buffer,
            BufferedKind::Event => &mut inner.event_buffer,
        };
        let Some(buf) = buffers.get_mut(&purge.key) else { return Ok(0) };
        let before = buf.len();
        buf.retain(|(at, _)| purge.buffered_before.is_some_and(|t| *at >= t));
        let deleted = (before - buf.len()) as u64;
        if buf.is_empty() {
            buffers.remove(&purge.key);
        }
        Ok(deleted)
    }

    async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
        let mut inner = self.inner.lock();
        if !inner.runs.contains_key(id) {
            return Ok(0);
        }
        let mut doomed = vec![id.clone()];
        let mut i = 0;
        while i < doomed.len() {
            let parent = doomed[i].clone();
            doomed.extend(
                inner
                    .runs
                    .values()
                    .filter(|r| r.parent.as_ref().is_some_and(|p| p.run_id == parent))
                    .map(|r| r.id.clone()),
            );
            i += 1;
        }
        // A deletion knows no time: freed slots are handed on at each gate's latest, once all
        // the doomed runs' records are gone (none goes to one of them).
        let handed = inner.admission.release_runs(&doomed, 0);
        inner.wake_handed(&handed, 0);
        for d in &doomed {
            inner.delete_one(d);
        }
        // Their children's results kept for them: a later run given one of these ids must
        // not take them.
        let gone: HashSet<&str> = doomed.iter().map(RunId::as_str).collect();
        inner.signal_buffer.retain(|token, _| protocol::child_token_parent(token).is_none_or(|p| !gone.contains(p)));
        Ok(doomed.len() as u64)
    }
}

#[async_trait]
impl RunQueue for MemoryStore {
    async fn enqueue(&self, items: Vec<QueuedRun>, now: Millis) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        for mut item in items {
            let Some(run) = inner.runs.get(&item.run_id) else { continue };
            item.namespace.get_or_insert_with(|| run.namespace.clone());
            match inner.open_item(&item.run_id) {
                Some(q) => q.fold(item, now),
                None => {
                    inner.next_queued += 1;
                    item.id = inner.next_queued;
                    inner.queue.insert(item.id, Queued { item, enqueued_at: now, claim: None });
                }
            }
        }
        Ok(())
    }

    async fn claim_queued(
        &self,
        namespace: Option<&str>,
        owner: &str,
        limit: usize,
        claim_until: Millis,
        now: Millis,
    ) -> StoreResult<Vec<QueuedRun>> {
        let mut inner = self.inner.lock();
        let mut free: Vec<&mut Queued> = inner
            .queue
            .values_mut()
            .filter(|q| q.claim.as_ref().is_none_or(|(_, until)| *until < now))
            .filter(|q| namespace.is_none_or(|ns| q.item.namespace.as_deref() == Some(ns)))
            .collect();
        free.sort_by_key(|q| (Reverse(q.item.priority), q.enqueued_at, q.item.id));
        Ok(free
            .into_iter()
            .take(limit)
            .map(|q| {
                q.claim = Some((owner.to_string(), claim_until));
                q.item.clone()
            })
            .collect())
    }

    async fn ack_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        for id in ids {
            if inner.queue.get(id).is_some_and(|q| q.claim.as_ref().is_some_and(|(o, _)| o == owner)) {
                inner.queue.remove(id);
            }
        }
        Ok(())
    }

    async fn release_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        for id in ids {
            match inner.queue.get(id) {
                Some(q) if q.claim.as_ref().is_some_and(|(o, _)| o == owner) => {}
                _ => continue,
            }
            // Back in line, keeping its place; when the run was queued again meanwhile, the two
            // fold into the run's one unclaimed item as an enqueue would.
            let Some(released) = inner.queue.remove(id) else { continue };
            match inner.open_item(&released.item.run_id) {
                Some(open) => open.fold(released.item, released.enqueued_at),
                None => {
                    inner.queue.insert(*id, Queued { claim: None, ..released });
                }
            }
        }
        Ok(())
    }

    async fn queued_len(&self) -> StoreResult<u64> {
        Ok(self.inner.lock().queue.len() as u64)
    }
}
