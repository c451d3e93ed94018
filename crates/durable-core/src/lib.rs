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
//! Like quinn-proto's `Connection`, the core is a set of method groups called in a fixed order:
//!
//! 1. **Load**: the runtime claims a run ([`Store::claim_run`]) and builds a [`History`] from
//!    its checkpoints, then a [`Turn`] over it.
//! 2. **Decide** (one per ctx call, in program order): [`Turn::take_seq`] synchronously at the
//!    call, then [`Turn::decide`] → a [`Decision`]: `Replay`, `ReplayError`, `Execute`, `Wait`
//!    or `NonDeterminism`.
//! 3. **Record**: results go in with [`Turn::record`] (and [`Turn::add_wait`],
//!    [`Turn::set_state`], …); [`Turn::commit`] hands back the [`Commit`] to apply — one
//!    atomic store call. Nothing is shown to the workflow before that commit is acknowledged.
//! 4. **Park / end**: parked calls are registered with [`Turn::park`]; when the body is pending
//!    and [`Turn::is_parked`] is true, [`Turn::suspend_commit`] ends the turn; when the body
//!    returns, [`Turn::settle_commit`] settles the run.
//!
//! Policies live beside it: [`RetryPolicy`] (backoff and seeded jitter), the status table
//! [`TRANSITIONS`] / [`RunStatus::can_become`], and the id scheme on [`RunId`].
//!
//! ```
//! use durable_core::{Checkpoint, CheckpointStatus, Decision, History, Payload, RunId, StepKind, Turn};
//!
//! let run = RunId::from("order:42");
//! // A history with one completed step.
//! let mut cp = Checkpoint::new(run.clone(), 0, "charge", StepKind::Step, CheckpointStatus::Completed, 1_000);
//! cp.output = Some(Payload::encode(&"receipt-1").unwrap());
//! let mut turn = Turn::new(run.clone(), "engine-a", 0, History::new([cp]));
//!
//! // Replaying: the recorded output comes back, nothing executes.
//! let seq = turn.take_seq();
//! assert_eq!(turn.decide(seq, "charge", StepKind::Step, 2_000),
//!            Decision::Replay(Payload::encode(&"receipt-1").unwrap()));
//! // The next call is new: execute it.
//! let seq = turn.take_seq();
//! assert_eq!(turn.decide(seq, "ship", StepKind::Step, 2_000), Decision::Execute { attempt: 1 });
//! // A changed body is caught.
//! assert!(matches!(turn.decide(0, "refund", StepKind::Step, 2_000), Decision::NonDeterminism(_)));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod history;
mod ids;
mod model;
mod payload;
mod queue;
mod retry;
mod store;
mod turn;

pub use history::{Decision, History, NonDeterminism, Patched};
pub use ids::{InvalidId, RunId};
pub use model::{
    Checkpoint, CheckpointStatus, Millis, NewRun, ParentLink, Run, RunStatus, StepError, StepKind, TRANSITIONS,
    UnknownName, WaitKind, Waiter,
};
pub use payload::{Payload, json_subset};
pub use queue::{QueueReason, QueuedRun, RunQueue};
pub use retry::{Backoff, RetryDecision, RetryPolicy, seed_for, splitmix64};
pub use store::{
    Capabilities, Claim, ClaimOutcome, Commit, CommitOutcome, CreateRun, Delivery, OutgoingSignal, RunFilter, RunPage,
    RunPatch, RunQuery, Store, StoreError, StoreErrorKind, StoreExt, StoreResult, TurnEnd, decode_cursor,
    encode_cursor,
};
pub use turn::{Turn, TurnStop};

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
}
