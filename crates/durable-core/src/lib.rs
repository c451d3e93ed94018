//! # durable-core
//!
//! The pure core of `durable`: the data model, the replay state machine, retry policy, the run
//! status table and the [`Store`] trait every backend implements. **It does no I/O**: no tokio,
//! no clock, no randomness, no files or sockets — time and seeds are passed in, decisions and
//! commits are handed back. The runtime (`durable-runtime`) drives it; stores implement
//! [`Store`] against nothing but this crate. CI fails the build if this crate's dependency tree
//! gains an I/O crate.
//!
//! ## How the runtime drives it
//!
//! Like quinn-proto's `Connection`, the core is a set of method groups called in a fixed order
//! (the [`Turn`] docs list them all):
//!
//! 1. **Load**: the runtime claims a run ([`Store::claim_run`]) and builds a [`Turn`] over the
//!    run and its [`History`].
//! 2. **Call** (one per ctx call, in program order): [`Turn::take_seq`] synchronously at the
//!    call, then the call's typed method — [`Turn::begin_step`], [`Turn::sleep`],
//!    [`Turn::wait`], [`Turn::join_child`], … — whose answer says what to do: return a recorded
//!    value, fail with a recorded error, park, run attempt *n*, or stop. Each answer type holds
//!    only what that call can do.
//! 3. **Commit**: an answer that carries a [`Commit`] is applied as one atomic store call and
//!    its outcome handed back with [`Turn::committed`]; nothing is shown to the workflow before.
//! 4. **End**: when the body is pending, [`Turn::on_pending`]; when it returns,
//!    [`Turn::on_body_done`] — each answers with an [`End`]: suspend, settle, compensate (the
//!    undo stack lives in the turn), continue as new, or stop. A body pending with nothing in
//!    flight and nothing parked awaits something outside the ctx: `on_pending` answers
//!    [`Pending::IdleUntil`] (poll again then) and, once the grace has passed, fails the run
//!    with `non_ctx_await`. A body parked on short durable sleeps only may be held in the turn
//!    ([`Pending::HoldUntil`], [`TurnConfig::hold_sleeps_under`]): its commit applied, the run
//!    kept, [`Turn::end_hold`] once the earliest is due.
//!
//! **Replay only.** With [`TurnConfig::replay_only`] the same turn checks a recorded history
//! against the current code instead of running it: a call history holds no final result for
//! parks for good instead of executing, no commit is ever handed out, and the turn ends with
//! [`End::Replayed`] — how far the code matched ([`Replayed`]) or how it departs from the
//! history ([`ReplayMismatch`], naming the seq and both calls). A run's history travels as an
//! [`export::HistoryExport`], a versioned JSON document.
//!
//! Every persisted string and id scheme is formatted and parsed in [`protocol`]. Policies live
//! beside the turn: [`RetryPolicy`] (backoff and seeded jitter), the status table
//! [`TRANSITIONS`] / [`RunStatus::can_become`].
//!
//! ```
//! use durable_core::{
//!     Checkpoint, CheckpointStatus, History, NewRun, Payload, RetryPolicy, RunId, StepAfter, StepBegin, StepCall,
//!     StepKind, Turn, TurnConfig,
//! };
//!
//! let run = NewRun {
//!     id: RunId::from("order:42"), workflow: "order".into(), version: 1, namespace: "default".into(),
//!     input: Payload::null(), tags: vec![], priority: 0, parent: None, created_at: 0,
//!     start_at: None,
//!     admission: None,
//!     trace_context: None,
//! }
//! .into_run();
//! // A history with one completed step.
//! let mut cp = Checkpoint::new(run.id.clone(), 0, "charge", StepKind::Step, CheckpointStatus::Completed, 1_000);
//! cp.output = Some(Payload::encode(&"receipt-1").unwrap());
//! let mut turn = Turn::new(run, "engine-a", History::new([cp]), TurnConfig::default());
//! let policy = RetryPolicy::none();
//! let step = |name| StepCall { name, kind: StepKind::Step, policy: &policy, undo: false, gate: None };
//!
//! // Replaying: the recorded output comes back, nothing executes.
//! let seq = turn.take_seq();
//! assert_eq!(turn.begin_step(seq, step("charge"), 2_000), StepBegin::Return(Payload::encode(&"receipt-1").unwrap()));
//! // The next call is new: run it, then hand its result in and apply the commit.
//! let seq = turn.take_seq();
//! assert_eq!(turn.begin_step(seq, step("ship"), 2_000), StepBegin::Run { attempt: 1 });
//! let StepAfter::Completed { commit, .. } = turn.finish_step(seq, 1, Ok(Payload::null()), 2_001) else { panic!() };
//! assert_eq!(commit.checkpoints[0].name, "ship");
//! // A changed body is caught: the turn stops and the run fails with `non_determinism`.
//! let mut replay = Turn::new(turn.run().clone(), "engine-a", turn.history().clone(), TurnConfig::default());
//! let seq = replay.take_seq();
//! assert_eq!(replay.begin_step(seq, step("refund"), 3_000), StepBegin::Stopped);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admission;
pub mod control;
pub mod export;
mod history;
mod ids;
mod model;
mod payload;
pub mod protocol;
mod queue;
mod retry;
pub mod schedule;
mod store;
pub mod task;
mod time;
pub mod trace;
pub mod trigger;
mod turn;

pub use control::{ControlError, ControlMessage, ControlPlane, ControlSink, ControlSinks};
pub use export::{ExportError, HistoryExport};
pub use history::{Decision, History, NonDeterminism, Patched};
pub use ids::{InvalidId, RunId};
pub use model::{
    Checkpoint, CheckpointStatus, Millis, NewRun, ParentLink, Run, RunStatus, StepError, StepKind, TRANSITIONS,
    UnknownName, WaitKind, Waiter,
};
pub use payload::{Payload, json_subset};
pub use queue::{QueueReason, QueuedRun, RunQueue};
pub use retry::{Backoff, RetryDecision, RetryPolicy, seed_for, splitmix64};
pub use schedule::{Cadence, Overlap, Schedule, ScheduleError, ScheduleRecord, ScheduleState};
pub use store::{
    BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Capabilities, Claim, ClaimOutcome, Commit,
    CommitOutcome, CreateRun, Delivery, DueQuery, OutgoingSignal, RunCount, RunFilter, RunPage, RunPatch, RunQuery,
    SaveOutcome, SaveSchedule, Store, StoreError, StoreErrorKind, StoreExt, StoreResult, TaskFilter, TurnEnd,
    decode_cursor, encode_cursor,
};
pub use time::{LATEST_START, millis, millis_after, millis_before};
pub use trigger::{BufferAppend, Dedupe, Gather, Gathered, Publish, Published, TriggerBuffer};
pub use turn::{
    ChildCall, ChildJoin, Deadline, End, GateCall, Halt, Next, Pending, RecordBegin, RecordOutcome, RemoteBegin,
    RemoteCall, ReplayMismatch, Replayed, RunEnd, SleepBegin, StateBegin, StepAfter, StepBegin, StepCall, Turn,
    TurnConfig, TurnStop, UndoCall, WaitBegin, WaitCall,
};

/// Error codes the engine sets on runs and steps.
pub mod codes {
    /// The body asked for something other than what history recorded.
    pub const NON_DETERMINISM: &str = "non_determinism";
    /// The workflow body panicked.
    pub const PANIC: &str = "panic";
    /// Recovery gave up on the run.
    pub const MAX_RECOVERY_ATTEMPTS: &str = "max_recovery_attempts";
    /// The run exceeded its workflow's execution timeout.
    pub const EXECUTION_TIMEOUT: &str = "execution_timeout";
    /// An operator cancelled the run.
    pub const CANCELLED: &str = "cancelled";
    /// A payload did not decode into the type the workflow asked for.
    pub const BAD_PAYLOAD: &str = "bad_payload";
    /// A payload is over the configured size limit.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// An operator asked for the run to be cancelled with compensation; set on the run's
    /// error while it compensates.
    pub const CANCEL_REQUESTED: &str = "cancel_requested";
    /// A child run failed, was cancelled or died.
    pub const CHILD_FAILED: &str = "child_failed";
    /// A wait's deadline passed before a delivery.
    pub const WAIT_TIMEOUT: &str = "wait_timeout";
    /// A wait named something no message can be sent to (an empty token or name).
    pub const INVALID_NAME: &str = "invalid_name";
    /// A run the workflow meant to create has an id an unrelated run already holds.
    pub const ID_TAKEN: &str = "id_taken";
    /// The workflow body awaited something outside its ctx (a `tokio::time::sleep`, a
    /// channel, an HTTP call) for longer than the engine's grace, with no ctx call executing
    /// or parked: replay cannot see such an await.
    pub const NON_CTX_AWAIT: &str = "non_ctx_await";
    /// A remote step's attempt found no worker in time, or ran past its timeout.
    pub const REMOTE_TIMEOUT: &str = "remote_timeout";
    /// Set on a `blocked` run's error: no live worker can take its remote step.
    pub const BLOCKED: &str = "blocked";
    /// A worker took a remote step's task from a queue it serves but has no handler for the
    /// step (a rolling deploy, say): the attempt fails, retryable.
    pub const NO_HANDLER: &str = "no_handler";
    /// A run the workflow meant to create (a child, a successor) has a concurrency key that
    /// could not be computed from its input.
    pub const BAD_KEY: &str = "bad_key";
    /// `Engine::register_queue` refused a queue's options or name (`Error::BadQueue`).
    pub const BAD_QUEUE: &str = "bad_queue";
    /// A schedule could not be saved as given (`Error::BadSchedule`).
    pub const BAD_SCHEDULE: &str = "bad_schedule";
    /// An operator re-dispatched a remote step's attempt (`redispatch_pending`): the next
    /// attempt goes out at once, outside the retry policy.
    pub const REDISPATCH: &str = "redispatch";
    /// An attempt of a local step ran past its timeout (`StepOptions::timeout`): it fails,
    /// retryable.
    pub const TIMEOUT: &str = "timeout";
    /// Set on the error `Engine::get_run` shows for an active run whose workflow version is
    /// not registered on the engine while another version is: the run is left untouched.
    pub const VERSION_NOT_REGISTERED: &str = "version_not_registered";
    /// A start was refused: its workflow's concurrency key already has `limit +
    /// max_queue_depth` runs pending, running or suspended (`Error::QueueFull`). Nothing was
    /// written.
    pub const QUEUE_FULL: &str = "queue_full";
}
