//! The storage contract every backend implements, and its error type.
//!
//! Implementers: read the `# Contract` section of each method. The conformance suite
//! (`durable-conformance`) checks every rule; run it on your store with
//! `durable_conformance::store_conformance_tests!(YourFactory)`.

use std::error::Error as StdError;
use std::fmt;

use async_trait::async_trait;

use crate::admission::{Admission, GateStats, SlotRecord, SlotRequest, WaiterRecord};
#[cfg(doc)]
use crate::admission::{AdmissionBook, GateRecord};
use crate::schedule::ScheduleRecord;
use crate::task::{BeatOutcome, NewTask, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, WorkerInfo};
use crate::trigger::{Publish, Published, TriggerBuffer};
use crate::{Checkpoint, Millis, NewRun, Payload, Run, RunId, RunStatus, StepError, Waiter};

/// The result type of store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// What can go wrong in a store call. Small on purpose: the engine branches on the variant,
/// never on the message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The thing addressed does not exist.
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for (names the run, seq or token).
        what: String,
    },
    /// The thing to create exists already.
    #[error("already exists: {what}")]
    AlreadyExists {
        /// What exists.
        what: String,
    },
    /// A write lost a race or broke an invariant (for example a status transition that the
    /// transition table forbids).
    #[error("conflict: {message}")]
    Conflict {
        /// What conflicted.
        message: String,
    },
    /// The caller does not hold the run's lease (any more): its write was refused.
    #[error("lease lost: run {run_id} is no longer leased by {owner}")]
    LeaseLost {
        /// The run.
        run_id: RunId,
        /// The owner the caller claimed to be.
        owner: String,
    },
    /// The backend cannot be reached or is overloaded.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// Whether trying again later can succeed.
        retryable: bool,
    },
    /// Any other backend failure (corrupt file, disk full, SQL error, …).
    #[error("store backend error: {0}")]
    Backend(Box<dyn StdError + Send + Sync>),
    /// A start was refused because its concurrency key's queue is full
    /// ([`SlotRequest::max_waiting`]): nothing was persisted.
    #[error("queue full: {gate} holds {held} and has {waiting} waiting")]
    QueueFull {
        /// The gate ([`protocol::key_gate`](crate::protocol::key_gate)).
        gate: String,
        /// Slots held.
        held: u32,
        /// Requests waiting.
        waiting: u32,
    },
}

/// The variant of a [`StoreError`], for matching without the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// [`StoreError::NotFound`].
    NotFound,
    /// [`StoreError::AlreadyExists`].
    AlreadyExists,
    /// [`StoreError::Conflict`].
    Conflict,
    /// [`StoreError::LeaseLost`].
    LeaseLost,
    /// [`StoreError::Unavailable`].
    Unavailable,
    /// [`StoreError::Backend`].
    Backend,
    /// [`StoreError::QueueFull`].
    QueueFull,
}

impl StoreError {
    /// The variant.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::NotFound { .. } => StoreErrorKind::NotFound,
            StoreError::AlreadyExists { .. } => StoreErrorKind::AlreadyExists,
            StoreError::Conflict { .. } => StoreErrorKind::Conflict,
            StoreError::LeaseLost { .. } => StoreErrorKind::LeaseLost,
            StoreError::Unavailable { .. } => StoreErrorKind::Unavailable,
            StoreError::Backend(_) => StoreErrorKind::Backend,
            StoreError::QueueFull { .. } => StoreErrorKind::QueueFull,
        }
    }

    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { retryable: true, .. })
    }

    /// Wraps any error as [`StoreError::Backend`].
    pub fn backend(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        StoreError::Backend(e.into())
    }

    /// A retryable [`StoreError::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        StoreError::Unavailable { message: message.into(), retryable: true }
    }
}

/// What a store can do, for the conformance suite to skip what a backend declares it lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Several processes can share the store (false for an in-memory store).
    pub shared_across_processes: bool,
    /// The store keeps its data when it is dropped and opened again.
    pub persistent: bool,
    /// The store keeps a task queue for remote steps: it implements [`Store::claim_tasks`],
    /// [`Store::complete_task`] and the other task and worker methods, and applies
    /// [`Commit::tasks`].
    pub tasks: bool,
    /// The store keeps admission records: it implements [`Store::acquire_slot`] and the
    /// other admission methods, applies [`Commit::release_slots`] and [`NewRun::admission`].
    pub admission: bool,
    /// The store writes a task dispatched to a worker ([`NewTask::claimed_by`]) claimed by it
    /// ([`Task::dispatched`]), so an engine may hand the attempt to a worker beside it (eager
    /// dispatch). Off by default: a store written before the field ignores it and stores
    /// every task `queued`; set it with [`Capabilities::with_claimed_dispatch`].
    pub claimed_dispatch: bool,
}

impl Capabilities {
    /// A store that keeps data and may be shared across processes.
    pub const FULL: Capabilities = Capabilities {
        shared_across_processes: true,
        persistent: true,
        tasks: true,
        admission: true,
        claimed_dispatch: false,
    };
    /// An in-process store that loses its data when dropped.
    pub const IN_MEMORY: Capabilities = Capabilities {
        shared_across_processes: false,
        persistent: false,
        tasks: true,
        admission: true,
        claimed_dispatch: false,
    };

    /// These capabilities with [`Capabilities::tasks`] set to `tasks` (a store without a task
    /// queue declares `Capabilities::FULL.with_tasks(false)`; the struct is non-exhaustive).
    pub const fn with_tasks(self, tasks: bool) -> Capabilities {
        Capabilities { tasks, ..self }
    }

    /// These capabilities with [`Capabilities::admission`] set to `admission`.
    pub const fn with_admission(self, admission: bool) -> Capabilities {
        Capabilities { admission, ..self }
    }

    /// These capabilities with [`Capabilities::claimed_dispatch`] set to `claimed_dispatch`.
    pub const fn with_claimed_dispatch(self, claimed_dispatch: bool) -> Capabilities {
        Capabilities { claimed_dispatch, ..self }
    }
}

/// The answer of [`Store::create_run`].
#[derive(Debug, Clone, PartialEq)]
pub enum CreateRun {
    /// The run was created `pending`.
    Created(Run),
    /// A run with that id existed; it is returned unchanged.
    Existing(Run),
}

impl CreateRun {
    /// The run, created or existing.
    pub fn run(&self) -> &Run {
        match self {
            CreateRun::Created(r) | CreateRun::Existing(r) => r,
        }
    }

    /// The run, created or existing.
    pub fn into_run(self) -> Run {
        match self {
            CreateRun::Created(r) | CreateRun::Existing(r) => r,
        }
    }

    /// Whether this call created it.
    pub fn created(&self) -> bool {
        matches!(self, CreateRun::Created(_))
    }
}

/// A request to take a run's lease and load it for a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The run.
    pub run_id: RunId,
    /// The engine instance asking.
    pub owner: String,
    /// The lease expiry to set.
    pub lease_until: Millis,
    /// The caller's clock.
    pub now: Millis,
}

/// The answer of [`Store::claim_run`].
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// The lease is the caller's; the run is `running`.
    Acquired {
        /// The run after the claim.
        run: Run,
        /// Its whole history, by seq.
        history: Vec<Checkpoint>,
        /// The status before the claim (to hand the run back unchanged if needed).
        previous: RunStatus,
        /// Whether the claim took over an expired lease of another owner (a recovery; the
        /// run's `recovery_attempts` was incremented, see [`Store::claim_run`]).
        recovered: bool,
    },
    /// Another owner holds an unexpired lease.
    Busy(Run),
    /// The run is terminal; nothing changed.
    Terminal(Run),
    /// No such run.
    NotFound,
}

/// How a turn ends, written by the same [`Commit`] as the turn's last checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    /// Park the run: `suspended`, `wake_at` set, lease released — unless a delivery arrived
    /// since the turn loaded the run (its `wake_gen` differs from `seen_wake_gen`, or a wait in
    /// this commit consumed a buffered delivery). Then the run stays `running` with the lease
    /// held and the outcome says `woken`.
    Suspend {
        /// The earliest time a parked timer is due.
        wake_at: Option<Millis>,
        /// The run's `wake_gen` when the turn loaded it.
        seen_wake_gen: u64,
    },
    /// Settle the run: only from `running` (compare-and-set), lease released, every waiter of
    /// the run removed (a settled run must not swallow later signals).
    Settle {
        /// `completed`, `failed`, `cancelled` or `dead`.
        status: RunStatus,
        /// The output, for `completed`.
        output: Option<Payload>,
        /// The error, otherwise.
        error: Option<StepError>,
    },
}

/// A signal sent by a commit (for example a child telling its parent it finished), delivered
/// atomically with the rest of the commit.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingSignal {
    /// The token.
    pub token: String,
    /// The payload.
    pub payload: Payload,
}

/// Everything one step completion or one suspension changes, applied as one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// The run.
    pub run_id: RunId,
    /// The lease owner making the commit.
    pub owner: String,
    /// The caller's clock.
    pub now: Millis,
    /// Checkpoints to insert or replace, keyed by `(run_id, seq)`.
    pub checkpoints: Vec<Checkpoint>,
    /// Waits to register. A wait that a buffered delivery already satisfies consumes it instead.
    pub waits: Vec<Waiter>,
    /// Seqs whose wait timed out: their waiters are removed.
    pub expire_waits: Vec<u32>,
    /// Query state to set, `(key, value)`.
    pub state: Vec<(String, Payload)>,
    /// Child runs to create (idempotent by id, like [`Store::create_run`]).
    pub children: Vec<NewRun>,
    /// Signals to send, like [`Store::send_signal`].
    pub signals: Vec<OutgoingSignal>,
    /// Remote-step attempts to dispatch (see [`Store::commit`]).
    pub tasks: Vec<NewTask>,
    /// Admission slots to release, `(gate, holder)`: their capacity is handed to the gates'
    /// next waiters in the same atomic write (see [`Store::acquire_slot`]).
    pub release_slots: Vec<(String, String)>,
    /// How the turn ends, if it does.
    pub end: Option<TurnEnd>,
}

impl Commit {
    /// The status this commit settles the run to, if it settles it.
    pub fn settles(&self) -> Option<RunStatus> {
        match &self.end {
            Some(TurnEnd::Settle { status, .. }) => Some(*status),
            _ => None,
        }
    }

    /// An empty commit for `run_id` by `owner` at `now`.
    pub fn new(run_id: RunId, owner: impl Into<String>, now: Millis) -> Self {
        Commit {
            run_id,
            owner: owner.into(),
            now,
            checkpoints: Vec::new(),
            waits: Vec::new(),
            expire_waits: Vec::new(),
            state: Vec::new(),
            children: Vec::new(),
            signals: Vec::new(),
            tasks: Vec::new(),
            release_slots: Vec::new(),
            end: None,
        }
    }

    /// Whether the commit records progress: it carries checkpoints or a turn end, other than a
    /// `Settle` to `dead`. Applied to a `running` run, such a commit sets the run's
    /// `recovery_attempts` back to 0 (see [`Store::commit`]).
    pub fn makes_progress(&self) -> bool {
        let burial = matches!(self.end, Some(TurnEnd::Settle { status: RunStatus::Dead, .. }));
        (!self.checkpoints.is_empty() || self.end.is_some()) && !burial
    }
}

/// Where a signal went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// A waiter took it: the payload is recorded at `(run_id, seq)` and the run was woken.
    Delivered {
        /// The run that received it.
        run_id: RunId,
        /// The seq it was recorded at.
        seq: u32,
    },
    /// No waiter: the payload is buffered for the next wait on the token.
    Buffered,
}

impl Delivery {
    /// Whether a wait of run `id` took it.
    pub fn is_to(&self, id: &RunId) -> bool {
        matches!(self, Delivery::Delivered { run_id, .. } if run_id == id)
    }
}

/// What a buffered delivery is kept under: a signal's token or an event's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BufferedKind {
    /// A signal ([`Store::send_signal`]) that no wait on its token took yet.
    Signal,
    /// An event ([`Store::publish`]) that no wait on its name accepted yet.
    Event,
}

impl BufferedKind {
    /// `"signal"` or `"event"`.
    pub fn as_str(self) -> &'static str {
        match self {
            BufferedKind::Signal => "signal",
            BufferedKind::Event => "event",
        }
    }
}

impl std::fmt::Display for BufferedKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The deliveries buffered under one signal token or event name ([`Store::buffered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedDeliveries {
    /// Signals or events.
    pub kind: BufferedKind,
    /// The signal token or the event name.
    pub key: String,
    /// How many are buffered.
    pub count: u64,
    /// When the oldest was buffered (the sender's clock).
    pub oldest_at: Millis,
    /// When the newest was buffered.
    pub newest_at: Millis,
}

/// Which buffered deliveries [`Store::buffered`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedQuery {
    /// Only signals, or only events (`None`: both).
    pub kind: Option<BufferedKind>,
    /// Only tokens or names that begin with this.
    pub prefix: Option<String>,
    /// Only keys whose oldest delivery was buffered before this time.
    pub oldest_before: Option<Millis>,
    /// At most this many keys.
    pub limit: usize,
}

/// Which buffered deliveries [`Store::purge_buffered`] deletes: those of one token or event
/// name, all of them or those buffered before a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedPurge {
    /// Signals or events.
    pub kind: BufferedKind,
    /// The signal token or the event name (exactly).
    pub key: String,
    /// Only those buffered before this time (`None`: all of them).
    pub buffered_before: Option<Millis>,
}

impl BufferedQuery {
    /// Every buffered signal and event, the first 100 keys.
    pub fn all() -> BufferedQuery {
        BufferedQuery { kind: None, prefix: None, oldest_before: None, limit: 100 }
    }

    /// Buffered signals only, the first 100 tokens.
    pub fn signals() -> BufferedQuery {
        BufferedQuery { kind: Some(BufferedKind::Signal), ..BufferedQuery::all() }
    }

    /// Buffered events only, the first 100 names.
    pub fn events() -> BufferedQuery {
        BufferedQuery { kind: Some(BufferedKind::Event), ..BufferedQuery::all() }
    }

    /// Only tokens or names that begin with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> BufferedQuery {
        self.prefix = Some(prefix.into());
        self
    }

    /// Only keys whose oldest delivery was buffered before `time`.
    pub fn oldest_before(mut self, time: Millis) -> BufferedQuery {
        self.oldest_before = Some(time);
        self
    }

    /// At most `limit` keys.
    pub fn limit(mut self, limit: usize) -> BufferedQuery {
        self.limit = limit;
        self
    }
}

impl BufferedPurge {
    /// Every buffered signal on `token`.
    pub fn signals(token: impl Into<String>) -> BufferedPurge {
        BufferedPurge { kind: BufferedKind::Signal, key: token.into(), buffered_before: None }
    }

    /// Every buffered event named `name`.
    pub fn events(name: impl Into<String>) -> BufferedPurge {
        BufferedPurge { kind: BufferedKind::Event, key: name.into(), buffered_before: None }
    }

    /// Only those buffered before `time`.
    pub fn buffered_before(mut self, time: Millis) -> BufferedPurge {
        self.buffered_before = Some(time);
        self
    }
}

/// The answer of [`Store::commit`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CommitOutcome {
    /// A `Suspend` was not applied because something was delivered to the run: run another
    /// turn (the lease is still held).
    pub woken: bool,
    /// For a `Settle`: whether it was applied (false when the run had left `running`, e.g. an
    /// operator cancelled it mid-turn).
    pub settled: bool,
    /// Where each of the commit's signals went, in order.
    pub deliveries: Vec<Delivery>,
    /// Seqs of `expire_waits` whose waiter was already taken by a delivery: their timeout
    /// checkpoints were not written (the delivery stands).
    pub raced: Vec<u32>,
    /// Runs a released slot was handed to: they were woken (made due now); dispatch them.
    pub handed_off: Vec<RunId>,
}

/// A change to a run row, applied by [`Store::update_run_if`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunPatch {
    /// New status.
    pub status: Option<RunStatus>,
    /// New output (`Some(None)` clears it).
    pub output: Option<Option<Payload>>,
    /// New error (`Some(None)` clears it).
    pub error: Option<Option<StepError>>,
    /// New wake time (`Some(None)` clears it).
    pub wake_at: Option<Option<Millis>>,
    /// Clear the lease.
    pub release_lease: bool,
    /// Reset `recovery_attempts` to 0 (operator retry; a commit that makes progress resets it
    /// too, see [`Store::commit`]).
    pub reset_recovery: bool,
    /// Delete the run's checkpoints from this seq on, so that part of the body runs again
    /// (operator retry resumes from the first failed step).
    pub truncate_history_from: Option<u32>,
    /// Wake the run as a delivery does: increment `wake_gen` and, if it is `suspended`, set
    /// `wake_at` to `now` (a turn in progress sees the change when it tries to suspend).
    pub wake: bool,
    /// Signals sent (as by [`Store::send_signal`]) in the same transaction, only if the patch
    /// applies — for example a cancelled child telling its parent.
    pub signals: Vec<OutgoingSignal>,
    /// The caller's clock (sets `updated_at`).
    pub now: Millis,
}

/// Which runs a poller asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunQuery {
    /// Only runs of this namespace (`None`: every namespace).
    pub namespace: Option<String>,
    /// Only runs of these `(workflow, version)` pairs (`None`: any).
    pub workflows: Option<Vec<(String, u32)>>,
    /// The caller's clock.
    pub now: Millis,
    /// At most this many ids.
    pub limit: usize,
    /// Due scans only ([`Store::due_runs`], [`Store::claim_due_runs`]): a due run that has an
    /// unclaimed item in this store's own run queue ([`RunQueue`](crate::RunQueue)), enqueued
    /// after this time and not after `now`, is left out — that item's consumer executes it,
    /// and a poller claiming it too would only make a second claim of a busy run. An older
    /// item does not count (its consumers may be gone), nor one stamped after `now` (by a
    /// clock ahead of the caller's), nor a claimed one, even if its claim expired. The runs
    /// left out are dropped from the `limit` earliest due, not replaced by runs due later: a
    /// scan reads at most `limit` due runs however many are left to items. `None`: no run is
    /// left out. A store without a run queue of its own ignores it.
    pub leave_queued_since: Option<Millis>,
}

/// Which due schedules or trigger buffers a scheduler asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueQuery {
    /// Only this namespace (`None`: every namespace).
    pub namespace: Option<String>,
    /// Only these workflows (`None`: any).
    pub workflows: Option<Vec<String>>,
    /// The caller's clock.
    pub now: Millis,
    /// At most this many.
    pub limit: usize,
}

/// A write of [`Store::save_schedule`].
#[derive(Debug, Clone, PartialEq)]
pub struct SaveSchedule {
    /// The record to store (its `revision` is ignored: the store sets it).
    pub record: ScheduleRecord,
    /// `None`: create; `Some(r)`: replace revision `r`.
    pub expected: Option<u64>,
    /// Runs to create in the same write (the schedule's fires).
    pub start: Vec<NewRun>,
}

/// The answer of [`Store::save_schedule`].
#[derive(Debug, Clone, PartialEq)]
pub enum SaveOutcome {
    /// Stored with this revision.
    Saved(u64),
    /// The expectation did not hold; the stored record, if any.
    Stale(Option<Box<ScheduleRecord>>),
}

/// A filter for [`Store::list_runs`]. Every field narrows; the default lists everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunFilter {
    /// Workflow name.
    pub workflow: Option<String>,
    /// Any of these statuses (empty: any).
    pub statuses: Vec<RunStatus>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Runs carrying this tag.
    pub tag: Option<String>,
    /// Children of this run.
    pub parent: Option<RunId>,
    /// Created at or after.
    pub created_after: Option<Millis>,
    /// Created before.
    pub created_before: Option<Millis>,
    /// Page size (0 means the default of 100).
    pub limit: usize,
    /// Continue after this cursor (from [`RunPage::next_cursor`]).
    pub cursor: Option<String>,
}

/// One page of [`Store::list_runs`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunPage {
    /// Runs, newest first (`created_at` descending, then id descending).
    pub runs: Vec<Run>,
    /// Pass as [`RunFilter::cursor`] for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// One line of [`Store::run_counts`]: how many runs of `workflow` are in `status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunCount {
    /// The workflow.
    pub workflow: String,
    /// The status.
    pub status: RunStatus,
    /// How many runs.
    pub count: u64,
}

/// The cursor format shared by the in-tree stores: `<created_at>:<id>`.
pub fn encode_cursor(run: &Run) -> String {
    format!("{}:{}", run.created_at, run.id)
}

/// Parses [`encode_cursor`]'s format.
pub fn decode_cursor(cursor: &str) -> StoreResult<(Millis, RunId)> {
    // Any id the store holds (the engine derives ids over `RunId::parse`'s 512 bytes: children,
    // successors), but never one with a control character (PostgreSQL refuses a NUL).
    let parsed = cursor.split_once(':').filter(|(_, id)| !id.is_empty() && !crate::protocol::has_control_char(id));
    parsed.and_then(|(t, id)| Some((t.parse().ok()?, RunId::new(id)))).ok_or_else(|| StoreError::NotFound {
        what: format!("list cursor {cursor:?} is malformed; pass a cursor returned by list_runs"),
    })
}

/// Which tasks [`Store::list_tasks`] returns. Every field narrows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskFilter {
    /// Tasks of this run.
    pub run_id: Option<RunId>,
    /// Only unfinished tasks.
    pub unfinished: bool,
    /// Unfinished tasks past their deadline at this time.
    pub expired_at: Option<Millis>,
    /// Unfinished tasks silent since before this time.
    pub silent_since: Option<Millis>,
    /// Only unclaimed (`queued`) tasks.
    pub queued: bool,
    /// At most this many (0: 100).
    pub limit: usize,
}

fn no_remote_steps() -> StoreError {
    StoreError::Unavailable {
        message: "this store does not support remote steps (it implements no task queue)".into(),
        retryable: false,
    }
}

fn no_buffer_admin() -> StoreError {
    StoreError::Unavailable {
        message: "this store cannot list or purge buffered signals and events".into(),
        retryable: false,
    }
}

fn no_admission() -> StoreError {
    StoreError::Unavailable {
        message: "this store does not support flow control (it keeps no admission records)".into(),
        retryable: false,
    }
}

/// The storage backend of the engine.
///
/// Object-safe: the engine holds an `Arc<dyn Store>`. Every method is one round trip and
/// every write is atomic. Times are the caller's clock (`now` arguments), never the store's.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// What this store can do.
    ///
    /// # Contract
    /// Constant for the lifetime of the store.
    fn capabilities(&self) -> Capabilities;

    /// Creates a run in `pending`.
    ///
    /// # Contract
    /// Idempotent on `run.id`: if a run with that id exists, nothing is written and it is
    /// returned as [`CreateRun::Existing`]. Concurrent creators of one id: exactly one gets
    /// `Created`.
    ///
    /// With [`NewRun::admission`] (a concurrency key; stores with [`Capabilities::admission`]):
    /// the request is decided as by [`Store::acquire_slot`] in the same transaction, holder =
    /// the run id. `Full` → [`StoreError::QueueFull`] and nothing is written; `Waiting` → the
    /// run is created `pending` with `wake_at = `[`protocol::GATED`](crate::protocol::GATED)
    /// (never due, never claimed) until a release hands it the slot; `Admitted` → created as
    /// usual. An existing id is answered `Existing` without deciding anything.
    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun>;

    /// Creates several runs in `pending` at once: a bulk start, in one round trip.
    ///
    /// # Contract
    /// - One answer per item, in the order of `runs`, each as [`Store::create_run`] answers:
    ///   `Created`, or `Existing` with the stored run, untouched, when the id exists. An id
    ///   given twice is created by its first item; the later one gets `Existing` with that run.
    /// - Atomic: the runs it creates are written in one transaction. If the call fails, none
    ///   of them is created, and no reader ever sees some of them without the others.
    /// - Concurrent creators of one id, in batches or one by one: exactly one gets `Created`.
    /// - An empty `runs` writes nothing and answers an empty list.
    ///
    /// The default calls [`Store::create_run`] for each item in order, so a store written
    /// before this method existed keeps working — but that is neither one round trip nor
    /// atomic: a store should override it (the in-tree stores do; the conformance suite checks
    /// that no reader sees part of a batch).
    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        let mut answers = Vec::with_capacity(runs.len());
        for run in runs {
            answers.push(self.create_run(run).await?);
        }
        Ok(answers)
    }

    /// Reads a run.
    ///
    /// # Contract
    /// `Ok(None)` when it does not exist.
    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>>;

    /// Reads several runs at once (an engine watching runs that execute elsewhere reads all
    /// of them in one call per interval, not one call per waiter; the engine also folds its
    /// reads of single runs made at the same time into one call of this).
    ///
    /// # Contract
    /// Returns the runs among `ids` that exist, each once, in any order; ids that do not
    /// exist are left out. The default calls [`Store::get_run`] for each id; a store with a
    /// cheaper way (one query) should override it.
    async fn get_runs(&self, ids: &[RunId]) -> StoreResult<Vec<Run>> {
        let mut runs = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(run) = self.get_run(id).await? {
                runs.push(run);
            }
        }
        Ok(runs)
    }

    /// Lists runs matching `filter`, newest first, one page at a time.
    ///
    /// # Contract
    /// Ordered by `created_at` descending, then id descending; at most `filter.limit` runs
    /// (100 when 0); `next_cursor` is `Some` exactly when more runs match. Paging through with
    /// the cursor visits every matching run once.
    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage>;

    /// How many runs there are per workflow and status.
    ///
    /// # Contract
    /// One [`RunCount`] per `(workflow, status)` with at least one run, ordered by workflow
    /// then status ([`RunStatus`]'s order); the counts are those of one consistent read. The
    /// default pages through [`Store::list_runs`] (every run is read); a store should answer
    /// it with one aggregate query (the in-tree stores do, from an index).
    async fn run_counts(&self) -> StoreResult<Vec<RunCount>> {
        let mut counts = std::collections::BTreeMap::<(String, RunStatus), u64>::new();
        let mut filter = RunFilter { limit: 1_000, ..RunFilter::default() };
        loop {
            let page = self.list_runs(&filter).await?;
            for run in page.runs {
                *counts.entry((run.workflow, run.status)).or_default() += 1;
            }
            match page.next_cursor {
                Some(cursor) => filter.cursor = Some(cursor),
                None => break,
            }
        }
        Ok(counts.into_iter().map(|((workflow, status), count)| RunCount { workflow, status, count }).collect())
    }

    /// Reads a run's checkpoints.
    ///
    /// # Contract
    /// Ordered by seq; empty when the run has none or does not exist.
    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>>;

    /// Takes the run's lease and loads it for a turn, in one atomic call.
    ///
    /// # Contract
    /// - Missing → `NotFound`; terminal → `Terminal` (nothing written).
    /// - A lease held by another owner with `lease_until >= now` → `Busy` (nothing written).
    /// - A `pending` run waiting for its concurrency key (`wake_at = GATED`) → `Busy`
    ///   (nothing written): it runs once a release hands it a slot.
    /// - Otherwise: lease set to `(owner, lease_until)`, status `running`, `updated_at = now`.
    ///   If the run was `running` under another owner (an expired lease), `recovery_attempts`
    ///   is incremented and `recovered` is true. The same owner may claim again (no recovery).
    ///   A commit that makes progress sets the count back to 0 (see [`Store::commit`]), so it
    ///   counts the recoveries since the run last got anywhere, not those of its whole life.
    ///   A `blocked` run's [`codes::BLOCKED`](crate::codes::BLOCKED) error is cleared
    ///   ([`Run::claim_clears_error`]); any other error stays.
    /// - Concurrent claimers: exactly one acquires.
    /// - A store that counts claims increments the run's [`Run::claims`] with each claim that
    ///   acquires it (`Busy`, `Terminal` and every other write leave it alone); one that does
    ///   not keeps it 0, and its runs are never resumed from an engine's memory.
    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome>;

    /// [`Store::claim_run`] for an engine that still holds the run's history up to `from_seq`
    /// in memory (it kept the suspended turn): the same claim, in one atomic call, except that
    /// an `Acquired` answer's `history` holds only the checkpoints with `seq >= from_seq`.
    ///
    /// # Contract
    /// Exactly [`Store::claim_run`] (outcomes, writes, the count of claims), with the history
    /// filtered to `seq >= from_seq`. The default calls `claim_run` and filters its answer, so
    /// it reads the whole history; a store that can, reads only the checkpoints asked for.
    async fn claim_run_from(&self, claim: Claim, from_seq: u32) -> StoreResult<ClaimOutcome> {
        let mut outcome = self.claim_run(claim).await?;
        if let ClaimOutcome::Acquired { history, .. } = &mut outcome {
            history.retain(|cp| cp.seq >= from_seq);
        }
        Ok(outcome)
    }

    /// Extends a lease.
    ///
    /// # Contract
    /// Succeeds (`true`) only if `owner` holds the lease (expired or not, as long as nobody
    /// took it over); then `lease_until` is set, and so is the lease of every leased
    /// admission slot the run holds (a step's slot lives as long as its run's lease).
    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool>;

    /// Gives a lease up.
    ///
    /// # Contract
    /// Clears the lease only if `owner` holds it; returns whether it did. The status is
    /// unchanged: a `running` run without a lease is picked up by [`Store::orphaned_runs`].
    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool>;

    /// Applies one commit atomically: all of it or none of it.
    ///
    /// # Contract
    /// - `LeaseLost` (nothing written) unless `commit.owner` holds the run's lease.
    /// - Checkpoints are upserted by `(run_id, seq)`.
    /// - Each wait in `waits`: a `Signal` wait consumes the oldest buffered signal for its
    ///   token, an `Event` wait the oldest buffered event of its name that its matcher accepts;
    ///   either way the payload is recorded as the `completed` checkpoint at the wait's seq
    ///   and `wake_gen` is incremented; otherwise the waiter is registered.
    /// - Each seq in `expire_waits`: its waiter is removed; if there was none (a delivery took
    ///   it), the commit's checkpoint at that seq is not written and the seq is in `raced`.
    /// - `state` upserted per `(run, key)`; `children` created as by `create_run` but [never refused](NewRun::never_refused); `signals`
    ///   sent as by `send_signal` (results in `deliveries`).
    /// - Each of `tasks` is stored as [`Task::dispatched`] makes it — `queued`, or `claimed`
    ///   by its [`NewTask::claimed_by`] worker at its `created_at` (eager dispatch) —
    ///   replacing the task at its `(run_id, seq)` if there is one (a re-dispatch; the old
    ///   attempt's logs are kept).
    /// - `end`: see [`TurnEnd`]. A `Settle` that finds the run no longer `running` changes
    ///   nothing of the run row and reports `settled = false` (checkpoints are still written).
    ///   An applied `Settle` finishes the run's unfinished tasks (outcome `cancelled`) and
    ///   releases all its admission slots and queued requests.
    /// - Each of `release_slots` is released as by [`Store::release_slot`]. Released capacity
    ///   is handed to the gates' next waiters in the same transaction; their runs are woken
    ///   and listed in `handed_off`.
    /// - Progress resets the recovery count: a commit that carries checkpoints or a turn end
    ///   (a `Suspend`, applied or `woken`, or a `Settle`), applied while the run is `running`,
    ///   sets its `recovery_attempts` to 0 in the same transaction — the turn that made it got
    ///   somewhere, so a later recovery starts counting again from 1. Exception: a `Settle` to
    ///   `dead` keeps the count (that is how the engine buries a run recovered too many times
    ///   in a row; the dead run shows how many). A commit with neither checkpoints nor an end
    ///   (an empty one), and a refused one (`LeaseLost`, `Conflict`, any error), leave it as it
    ///   is.
    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome>;

    /// Applies a commit and claims, for the committing engine, the first run its releases
    /// handed a slot to: one round trip where an engine would otherwise call
    /// [`Store::commit`] and then [`Store::claim_run`] to start that run's next turn (a run
    /// that waited for its concurrency key: the settle of the key's holder hands it on).
    ///
    /// # Contract
    /// The commit is applied exactly as [`Store::commit`] applies it (a refused commit writes
    /// nothing and claims nothing). Then the first run of `handed_off`, if there is one, is
    /// claimed exactly as [`Store::claim_run`] claims it (after the wake), with `owner =
    /// commit.owner`, `now = commit.now` and `lease_until`, and the claim's outcome is
    /// returned with the commit's (the run stays in `handed_off`). Nothing handed on →
    /// `(outcome, None)`. A store that can do both in one atomic write does; the default
    /// makes the two calls one after the other, and when the claim fails after the commit
    /// was applied it answers `(outcome, None)`: the commit stands and the caller wakes the
    /// run as after [`Store::commit`].
    async fn commit_and_claim_handed(
        &self,
        commit: Commit,
        lease_until: Millis,
    ) -> StoreResult<(CommitOutcome, Option<ClaimOutcome>)> {
        let (owner, now) = (commit.owner.clone(), commit.now);
        let outcome = self.commit(commit).await?;
        let Some(run_id) = outcome.handed_off.first().cloned() else { return Ok((outcome, None)) };
        let claimed = self.claim_run(Claim { run_id, owner, lease_until, now }).await.ok();
        Ok((outcome, claimed))
    }

    /// Compare-and-set on the run row.
    ///
    /// # Contract
    /// Applies `patch` only if the run's status is in `expected` (any status when empty),
    /// checked in the same atomic write; returns whether it applied. `Ok(false)` for a missing
    /// run. A patched status must be allowed by [`RunStatus::can_become`] from the current one
    /// (or equal to it), else nothing is written and `Conflict` is returned. Concurrent racers
    /// with the same expectation: exactly one wins. A patch that makes the run terminal also
    /// removes its waiters and releases its admission slots and queued requests (handing the
    /// capacity on, as a commit does). The patch's `signals` are sent in the same transaction.
    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool>;

    /// Pending runs to start, oldest first.
    ///
    /// # Contract
    /// Status `pending` with no `wake_at` (a delayed start is due through
    /// [`Store::due_runs`]) and without a live lease (none, or `lease_until < now`), matching
    /// the query's namespace and workflows; ordered by priority descending, then
    /// `created_at`, then id; at most `limit`.
    async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>>;

    /// Suspended runs that are due, and delayed starts whose time has come.
    ///
    /// # Contract
    /// Status `suspended` or `pending`, `wake_at <= now`, no live lease, matching the query
    /// (and not left to a run-queue item: [`RunQuery::leave_queued_since`]); earliest
    /// `wake_at` first; at most `limit`.
    async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>>;

    /// Claims due runs for a poller: the runs [`Store::due_runs`] returns, each taken out of
    /// every poller's sight until `until`, so that many pollers sharing the store hand each
    /// due run on about once (the poller then queues a wake for it).
    ///
    /// # Contract
    /// One atomic call: selects the runs `due_runs(query)` returns (same statuses, `wake_at <=
    /// now`, no live lease, namespace and workflows, and left to its run-queue item as
    /// [`RunQuery::leave_queued_since`] says; earliest `wake_at` first; at most `limit`) and
    /// sets each one's `wake_at` to `until`, in the same write; returns their ids,
    /// in no particular order. Nothing else of the row changes: status, lease, `wake_gen`,
    /// `updated_at` are kept. With `until > now`, concurrent callers (through any handle on
    /// the store) never get the same run: a claimed run is not due again before `until` —
    /// unless a delivery makes it due at once, or a turn parks it again (which sets its
    /// `wake_at` anew). A run waiting for its concurrency key (`wake_at = GATED`) is never due,
    /// so never claimed.
    async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>>;

    /// Runs that are `running` but nobody holds: the lease expired (`lease_until < now`) or was
    /// released.
    ///
    /// # Contract
    /// Matching the query; oldest `updated_at` first; at most `limit`.
    async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>>;

    /// Sends a signal to a token.
    ///
    /// # Contract
    /// Atomically: the oldest waiter registered on `token` is removed, the payload recorded as
    /// the `completed` checkpoint at the waiter's seq, the run's `wake_gen` incremented and, if
    /// the run is `suspended`, its `wake_at` set to `now` → `Delivered`. With no waiter, the
    /// payload is appended to the token's FIFO buffer → `Buffered` — except a child's result
    /// (a [`protocol::child_token`](crate::protocol::child_token)) whose parent is gone or
    /// [final](RunStatus::is_final), which no wait can ever take: it is dropped, nothing
    /// written → `Buffered` (if it were kept, a later run given the parent's id would take it
    /// for its own child's; a failed parent's is kept, for its retry). Concurrent senders
    /// and waiters: every payload is consumed exactly once. The same holds for the signals of
    /// a [`Commit`] and of a [`RunPatch`].
    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery>;

    /// Sends a signal and, when it is delivered to `claim.run_id`, claims that run: one round
    /// trip where an engine that keeps the run's suspended turn in memory would otherwise call
    /// [`Store::send_signal`] and then [`Store::claim_run_from`] to continue it.
    ///
    /// # Contract
    /// The signal is sent exactly as [`Store::send_signal`] sends it, at `claim.now`. When the answer is
    /// [`Delivery::Delivered`] to `claim.run_id`, that run is then claimed exactly as
    /// [`Store::claim_run_from`]`(claim, from_seq)` claims it (after the wake, so an `Acquired`
    /// claim's history holds the signal) and the claim's outcome is returned with the delivery;
    /// otherwise (buffered, or delivered to another run: the token's oldest wait is not
    /// `claim.run_id`'s) nothing is claimed → `(delivery, None)`. A store that can do both in
    /// one atomic write does; the default makes the two calls one after the other, and when
    /// the claim fails after the delivery it answers `(delivery, None)`: the signal stands and
    /// the caller wakes the run as after [`Store::send_signal`].
    async fn send_signal_and_claim(
        &self,
        token: &str,
        payload: Payload,
        claim: Claim,
        from_seq: u32,
    ) -> StoreResult<(Delivery, Option<ClaimOutcome>)> {
        let delivery = self.send_signal(token, payload, claim.now).await?;
        if !delivery.is_to(&claim.run_id) {
            return Ok((delivery, None));
        }
        Ok((delivery, self.claim_run_from(claim, from_seq).await.ok()))
    }

    /// Publishes a plain event ([`Store::publish`] without dedupe or triggers).
    async fn publish_event(&self, name: &str, payload: Payload, now: Millis) -> StoreResult<Vec<Delivery>> {
        match self.publish(Publish::event(name, payload, now)).await? {
            Published::Done { deliveries, .. } => Ok(deliveries),
            Published::Duplicate => Ok(Vec::new()),
        }
    }

    /// Publishes an event, with the runs it triggers.
    ///
    /// # Contract
    /// One atomic write. With a `dedupe` whose `(name, id)` is remembered and not expired
    /// (`keep_until >= now`): nothing happens → `Duplicate`. Otherwise the id is remembered
    /// until `keep_until` (expired ids may be forgotten), and: the event is delivered to every
    /// waiter on `name` whose matcher accepts the payload (as `send_signal` delivers to one),
    /// or, if none accepts, buffered for the first later wait that matches; every run of
    /// `start` is created as [`Store::create_run`] would, but [never
    /// refused](NewRun::never_refused); each of `gather` is applied to the open buffer of its
    /// `(workflow, key)` with [`TriggerBuffer::gather`] — the buffer is stored, or deleted and
    /// its run created. `Done` lists the deliveries, then the outcome
    /// of every `start` run in order followed by those of full buffers.
    async fn publish(&self, event: Publish) -> StoreResult<Published>;

    /// Open trigger buffers that are due.
    ///
    /// # Contract
    /// `due_at <= now`, matching the query's namespace (the buffer's run) and workflows;
    /// earliest `due_at` first, then workflow and key; at most `limit`. With `now =
    /// Millis::MAX` and `limit = 1`: the next buffer to come due.
    async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>>;

    /// Starts the run of a due buffer.
    ///
    /// # Contract
    /// Atomically: if the open buffer of `(workflow, key)` has `batch_id` and is due
    /// (`due_at <= now`: an event since the caller read it may have moved a debounce's due
    /// time, and changed the payload its `admission` was computed from), it is deleted and
    /// its run ([`TriggerBuffer::into_run`] at `now`, with `admission`: the run's concurrency
    /// key, which only the engine can compute from the gathered input) created as
    /// [`Store::create_run`] would but [never refused](NewRun::never_refused) → `Some`.
    /// Otherwise (flushed already, by this or another engine, or not due) nothing → `None`.
    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<crate::admission::SlotRequest>,
    ) -> StoreResult<Option<CreateRun>>;

    /// Reads a schedule.
    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>>;

    /// Lists schedules, by key.
    ///
    /// # Contract
    /// Keys greater than `after` (all with `None`), in the namespace if given, ascending; at
    /// most `limit`.
    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>>;

    /// Creates, updates or fires a schedule.
    ///
    /// # Contract
    /// One atomic write. `expected: None` creates the record if no schedule has its key;
    /// `Some(r)` replaces it if its stored revision is `r`. Otherwise nothing is written →
    /// `Stale` with the stored record (`None` if there is none). On success the record is
    /// stored with revision `expected + 1` (1 when created), every run of `start` is created
    /// as [`Store::create_run`] would but [never refused](NewRun::never_refused) (existing
    /// ids are left alone), and → `Saved` with the new revision.
    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome>;

    /// [`Store::save_schedule`] for several schedules, each atomic on its own (a stale one
    /// does not stop the others); answers in order. The default saves them one by one.
    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        let mut out = Vec::with_capacity(saves.len());
        for save in saves {
            out.push(self.save_schedule(save).await?);
        }
        Ok(out)
    }

    /// Deletes a schedule; returns whether it existed. Runs it started are kept.
    async fn delete_schedule(&self, key: &str) -> StoreResult<bool>;

    /// Schedules that are due.
    ///
    /// # Contract
    /// `due_at <= now` (a record with no `due_at` is never due), matching the query's
    /// namespace and workflows; earliest `due_at` first, then key; at most `limit`. The cost
    /// is in the number due, not the number stored. With `now = Millis::MAX` and `limit = 1`:
    /// the next schedule to come due.
    async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>>;

    /// Claims tasks for a worker.
    ///
    /// # Contract
    /// Tasks of the claim's queues (and namespace, if given) that are [`Task::claimable`] at
    /// `now`, whose `requires` are all among the claim's capabilities and whose run is not
    /// terminal; highest priority first, then oldest `created_at`; at most `limit`. Each is
    /// set `claimed` by the worker, stamped at `at = max(now, created_at)` (a claim never
    /// precedes its dispatch, whatever the claimer's clock says): `lease_until = at +
    /// heartbeat_timeout`, `heartbeat_at = at`, `claims + 1`, and `claimed_at = at` if it was
    /// never claimed (an attempt's timeout runs from its first claim). Concurrent claimers: each task goes to
    /// exactly one.
    async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        let _ = claim;
        Err(no_remote_steps())
    }

    /// A worker's heartbeat on a claimed task.
    ///
    /// # Contract
    /// The task at `(run_id, seq)` with this `attempt`, `claimed` by this worker: if its run is
    /// terminal, or the task is past its deadline, → `Cancelled` (nothing written); otherwise
    /// `lease_until = now + heartbeat_timeout`, `heartbeat_at = now`, the progress replaced
    /// (when given), the logs appended → `Extended(lease_until)`. A finished task →
    /// `Cancelled`; any other (another worker's claim, another attempt, no task) → `Lost`.
    async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        let _ = beat;
        Err(no_remote_steps())
    }

    /// Records a task's result: the checkpoint, the wake and the task's end, in one atomic
    /// call.
    ///
    /// # Contract
    /// - No unfinished task at `(run_id, seq)` with this `attempt` → `Duplicate`, nothing
    ///   written (a result from any worker is accepted once per attempt: the first wins).
    /// - The run is terminal → the task is finished (outcome `cancelled`) → `RunTerminal`.
    /// - The run has no waiter at `seq` → `Duplicate`, nothing written.
    /// - Otherwise: the waiter is removed; the checkpoint at `seq` is written — `completed`
    ///   with the output, or for an error `waiting` with the error and no `wake_at` (the turn
    ///   decides whether to retry); either way `attempts = attempt`, `updated_at = now`; the
    ///   run is woken as a delivery wakes it ([`Store::send_signal`]); the task is finished
    ///   (outcome `completed`, `failed`, or `timed_out` for an error coded `remote_timeout`),
    ///   its logs appended; the admission slot the step holds (holder = its step id, at any
    ///   gate: a gated remote step holds one while its attempt is out) is released and handed
    ///   on as [`Store::release_slot`] does → `Accepted`.
    async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
        let _ = done;
        Err(no_remote_steps())
    }

    /// Records a task's result and, when it is accepted, claims the run it woke: one round
    /// trip where an engine would otherwise call [`Store::complete_task`] and then
    /// [`Store::claim_run`] to start the woken run's turn.
    ///
    /// # Contract
    /// `claim.run_id` is `done.run_id` (otherwise → `Conflict`, nothing written). The result
    /// is recorded exactly as [`Store::complete_task`] records it. When that answers
    /// [`TaskCompletion::Accepted`], the run is then claimed exactly as [`Store::claim_run`]
    /// claims it (after the wake, so an `Acquired` claim's history holds the result) and its
    /// outcome is returned with it; otherwise nothing is claimed → `(completion, None)`. A
    /// store that can do both in one atomic write does; the default makes the two calls one
    /// after the other, and when the claim fails after the result was accepted it answers
    /// `(Accepted, None)`: the result stands and the caller wakes the run as after
    /// [`Store::complete_task`].
    async fn complete_task_and_claim(
        &self,
        done: TaskDone,
        claim: Claim,
    ) -> StoreResult<(TaskCompletion, Option<ClaimOutcome>)> {
        done.check_claim(&claim)?;
        let completion = self.complete_task(done).await?;
        if completion != TaskCompletion::Accepted {
            return Ok((completion, None));
        }
        Ok((completion, self.claim_run(claim).await.ok()))
    }

    /// Hands claimed tasks back unfinished (a draining worker).
    ///
    /// # Contract
    /// Each `(run_id, seq, attempt)` claimed by `worker` becomes `queued` again at once (its
    /// `claimed_at` is kept, so the attempt's timeout still counts from its first claim).
    /// Others are left alone.
    async fn release_tasks(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        let _ = (tasks, worker);
        Err(no_remote_steps())
    }

    /// Lists tasks.
    ///
    /// # Contract
    /// Tasks matching the filter, oldest `created_at` first (then run id and seq); at most
    /// `limit`. [`TaskFilter::expired_at`] selects unfinished tasks past their deadline
    /// ([`Task::expired`]); [`TaskFilter::silent_since`] unfinished tasks whose last heartbeat
    /// (or, never claimed, whose dispatch) is older. The cost is in the number matched for a
    /// filter on a run or on expiry.
    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<Task>> {
        let _ = filter;
        Err(no_remote_steps())
    }

    /// Per `(namespace, queue)`: unclaimed and claimed tasks of active runs, and the oldest.
    ///
    /// # Contract
    /// Ordered by namespace, then queue; queues with no unfinished task are left out.
    async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        Err(no_remote_steps())
    }

    /// Stores (or refreshes) a worker's descriptor, keyed by its id.
    async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
        let _ = worker;
        Err(no_remote_steps())
    }

    /// Removes a worker's descriptor (a clean shutdown); returns whether it existed.
    async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
        let _ = id;
        Err(no_remote_steps())
    }

    /// Worker descriptors, by id. Descriptors not refreshed since `heartbeat_before` are
    /// deleted first (dead workers are forgotten).
    async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        let _ = heartbeat_before;
        Err(no_remote_steps())
    }

    /// Asks to pass an admission gate (see [`crate::admission`]).
    ///
    /// # Contract
    /// One atomic call, doing what [`AdmissionBook::acquire`] does:
    /// 1. Slots of the gate whose lease passed (`lease_until <= now`) are deleted and their
    ///    capacity handed to the best waiters (woken: see below).
    /// 2. A holder that holds a slot of the gate → `Admitted` (a leased slot's lease is set to
    ///    the request's).
    /// 3. The gate's record is created or its limits replaced by the request's, and its rate
    ///    window rolled ([`GateRecord::roll`]).
    /// 4. [`decide`](crate::admission::decide), with the request's rank (kept if it waits
    ///    already, else [`GateRecord::rank`]) and the number of waiters ranked before it:
    ///    `Admit` → the waiter row (if any) is deleted, a slot recorded when the gate limits
    ///    concurrency, [`GateRecord::admitted`]; `Wait` → the waiter recorded if new; `Full`
    ///    → nothing written.
    ///
    /// A woken run (a slot handed to its waiter): a run waiting for its concurrency key
    /// (`pending`, `wake_at = GATED`) gets `wake_at = now`; any other run is woken as a
    /// delivery wakes it ([`Store::send_signal`]).
    async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
        let _ = request;
        Err(no_admission())
    }

    /// Releases a slot or a queued request outside a commit (a step whose turn ended before
    /// it could commit).
    ///
    /// # Contract
    /// Deletes `holder`'s slot and waiter row at `gate` (nothing when there are none) and
    /// hands the freed capacity on as [`Store::acquire_slot`] does. Returns the runs woken.
    async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        let _ = (gate, holder, now);
        Err(no_admission())
    }

    /// Per-gate figures at `now`, by gate name ([`AdmissionBook::stats`]).
    async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        let _ = now;
        Err(no_admission())
    }

    /// What a run holds and waits for at admission gates: its slots and its queued requests,
    /// each ordered by gate then holder.
    async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        let _ = id;
        Err(no_admission())
    }

    /// The waiters a run has registered.
    ///
    /// # Contract
    /// Ordered by seq.
    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>>;

    /// Reads a query value set by `ctx.set_state`.
    ///
    /// # Contract
    /// The latest value committed for `(run, key)`, also after the run settled.
    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>>;

    /// The signals and events buffered because no wait took them yet, summed per token or
    /// event name.
    ///
    /// # Contract
    /// One entry per `(kind, key)` that has at least one buffered delivery matching the query
    /// (its kind, a key beginning with its prefix, an oldest delivery buffered before its
    /// time), with the count and the oldest and newest buffering times; ordered by kind
    /// (signals first) then key (byte order); at most `limit` entries. Reads only.
    async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
        let _ = query;
        Err(no_buffer_admin())
    }

    /// Deletes buffered deliveries of one signal token or event name: all of them, or those
    /// buffered before a time.
    ///
    /// # Contract
    /// Atomically deletes the buffered deliveries of `(kind, key)` (exactly that key) whose
    /// buffering time is before `buffered_before` (all of them when it is `None`) and returns
    /// how many it deleted (0 when there were none). Waiters, runs and the other keys' buffers
    /// are untouched; a delivery buffered later is kept.
    async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
        let _ = purge;
        Err(no_buffer_admin())
    }

    /// Deletes a run and everything tied to it.
    ///
    /// # Contract
    /// Removes the run, its checkpoints, waiters, state, tasks and admission records (handing
    /// freed slots on), and the same for every descendant
    /// (runs whose parent chain leads to it), atomically, with the buffered results of the
    /// removed runs' children (signals on their [`protocol::child_token`](crate::protocol::child_token)s:
    /// a later run given a removed id must not take them). Returns how many runs were removed
    /// (0 when it did not exist). Other buffered signals are not tied to runs and are kept.
    async fn delete_run(&self, id: &RunId) -> StoreResult<u64>;
}

/// Helpers on top of [`Store`], for every store.
#[async_trait]
pub trait StoreExt: Store {
    /// Reads a run that must exist, or `NotFound` naming it.
    async fn require_run(&self, id: &RunId) -> StoreResult<Run> {
        self.get_run(id).await?.ok_or_else(|| StoreError::NotFound { what: format!("run {id}") })
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::RunFilter;

    /// A store written before `create_runs` existed: it has `create_run` only (the rest is
    /// never called here).
    #[derive(Debug, Default)]
    struct OldStore(Mutex<HashMap<RunId, Run>>);

    #[async_trait]
    impl Store for OldStore {
        fn capabilities(&self) -> Capabilities {
            Capabilities::IN_MEMORY
        }
        async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
            let mut runs = self.0.lock().expect("not poisoned");
            Ok(match runs.get(&run.id) {
                Some(existing) => CreateRun::Existing(existing.clone()),
                None => {
                    let run = run.into_run();
                    runs.insert(run.id.clone(), run.clone());
                    CreateRun::Created(run)
                }
            })
        }
        async fn get_run(&self, _: &RunId) -> StoreResult<Option<Run>> {
            unimplemented!()
        }
        async fn list_runs(&self, _: &RunFilter) -> StoreResult<RunPage> {
            unimplemented!()
        }
        async fn history(&self, _: &RunId) -> StoreResult<Vec<Checkpoint>> {
            unimplemented!()
        }
        async fn claim_run(&self, _: Claim) -> StoreResult<ClaimOutcome> {
            unimplemented!()
        }
        async fn renew_lease(&self, _: &RunId, _: &str, _: Millis) -> StoreResult<bool> {
            unimplemented!()
        }
        async fn release_lease(&self, _: &RunId, _: &str) -> StoreResult<bool> {
            unimplemented!()
        }
        async fn commit(&self, _: Commit) -> StoreResult<CommitOutcome> {
            unimplemented!()
        }
        async fn update_run_if(&self, _: &RunId, _: &[RunStatus], _: RunPatch) -> StoreResult<bool> {
            unimplemented!()
        }
        async fn pending_runs(&self, _: &RunQuery) -> StoreResult<Vec<RunId>> {
            unimplemented!()
        }
        async fn due_runs(&self, _: &RunQuery) -> StoreResult<Vec<RunId>> {
            unimplemented!()
        }
        async fn claim_due_runs(&self, _: &RunQuery, _: Millis) -> StoreResult<Vec<RunId>> {
            unimplemented!()
        }
        async fn orphaned_runs(&self, _: &RunQuery) -> StoreResult<Vec<RunId>> {
            unimplemented!()
        }
        async fn send_signal(&self, _: &str, _: Payload, _: Millis) -> StoreResult<Delivery> {
            unimplemented!()
        }
        async fn publish(&self, _: Publish) -> StoreResult<Published> {
            unimplemented!()
        }
        async fn due_buffers(&self, _: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
            unimplemented!()
        }
        async fn flush_buffer(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: Millis,
            _: Option<SlotRequest>,
        ) -> StoreResult<Option<CreateRun>> {
            unimplemented!()
        }
        async fn get_schedule(&self, _: &str) -> StoreResult<Option<ScheduleRecord>> {
            unimplemented!()
        }
        async fn list_schedules(&self, _: Option<&str>, _: Option<&str>, _: usize) -> StoreResult<Vec<ScheduleRecord>> {
            unimplemented!()
        }
        async fn save_schedule(&self, _: SaveSchedule) -> StoreResult<SaveOutcome> {
            unimplemented!()
        }
        async fn delete_schedule(&self, _: &str) -> StoreResult<bool> {
            unimplemented!()
        }
        async fn due_schedules(&self, _: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
            unimplemented!()
        }
        async fn waiters(&self, _: &RunId) -> StoreResult<Vec<Waiter>> {
            unimplemented!()
        }
        async fn get_state(&self, _: &RunId, _: &str) -> StoreResult<Option<Payload>> {
            unimplemented!()
        }
        async fn delete_run(&self, _: &RunId) -> StoreResult<u64> {
            unimplemented!()
        }
    }

    /// Polls a future that never waits (the store above answers at once).
    fn ready<T>(f: impl Future<Output = T>) -> T {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the future waited"),
        }
    }

    fn new_run(id: &str) -> NewRun {
        NewRun {
            trace_context: None,
            admission: None,
            id: RunId::from(id),
            workflow: "wf".into(),
            version: 1,
            namespace: "default".into(),
            input: Payload::from_trusted(format!("\"{id}\"")),
            tags: Vec::new(),
            priority: 0,
            parent: None,
            created_at: 7,
            start_at: None,
        }
    }

    #[test]
    fn the_default_create_runs_answers_like_create_run_item_by_item() {
        let store = OldStore::default();
        let old = ready(store.create_run(new_run("old"))).expect("created").into_run();
        let batch = vec![new_run("a"), new_run("old"), NewRun { priority: 5, ..new_run("a") }, new_run("b")];
        let answers = ready(store.create_runs(batch.clone())).expect("created");
        assert_eq!(
            answers,
            vec![
                CreateRun::Created(batch[0].clone().into_run()),
                CreateRun::Existing(old),
                CreateRun::Existing(batch[0].clone().into_run()),
                CreateRun::Created(batch[3].clone().into_run()),
            ]
        );
        assert_eq!(ready(store.create_runs(Vec::new())).expect("nothing"), vec![]);
    }

    #[test]
    fn a_cursor_names_any_stored_id_but_none_with_a_control_character() {
        // The engine derives ids longer than RunId::parse allows (a grandchild of a long id).
        let long = format!("{}.child.1.child.2", "r".repeat(512));
        assert_eq!(decode_cursor(&format!("5:{long}")).expect("a stored id"), (5, RunId::new(long)));
        assert_eq!(decode_cursor("7:a:b").expect("colons in the id"), (7, RunId::new("a:b")));
        for bad in ["1:a\0b", "1:", "x:a", "no-colon"] {
            assert!(decode_cursor(bad).is_err(), "{bad:?}");
        }
    }
}
