//! The data model: runs, checkpoints, errors and waiters.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Payload, RunId};

/// Milliseconds since the Unix epoch, as read from the engine's clock.
pub type Millis = u64;

/// The lifecycle state of a run.
///
/// Transitions are one explicit table, [`RunStatus::can_become`]; terminal states accept none
/// except an operator's retry of `failed` and `dead` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Created, not yet picked up by a worker.
    Pending,
    /// A turn holds the run's lease and is executing the body.
    Running,
    /// Parked on a timer, a signal, a child or a remote result.
    Suspended,
    /// Suspended on a remote step that no live worker can take (none serves its queue with
    /// the capabilities it requires); the run's error says what is missing. It behaves as
    /// `suspended` (deliveries and results wake it) and goes back to `suspended` when such a
    /// worker appears.
    Blocked,
    /// The body returned `Ok`; the output is recorded.
    Completed,
    /// The body returned `Err` (or failed non-deterministically, or panicked).
    Failed,
    /// Cancelled by an operator or a parent.
    Cancelled,
    /// Recovery gave up on the run (poison run); an operator may retry it.
    Dead,
}

/// The allowed status transitions: `(from, to)`.
///
/// `Running → Running` is a recovery (another worker takes over an expired lease);
/// `Running → Pending` hands back a run claimed by an engine that cannot run it;
/// `Failed | Dead → Pending` is an operator retry.
pub const TRANSITIONS: &[(RunStatus, RunStatus)] = {
    use RunStatus::*;
    &[
        (Pending, Running),
        (Pending, Cancelled),
        (Pending, Failed),
        (Pending, Dead),
        (Running, Pending),
        (Running, Running),
        (Running, Suspended),
        (Running, Completed),
        (Running, Failed),
        (Running, Cancelled),
        (Running, Dead),
        (Suspended, Running),
        (Suspended, Cancelled),
        (Suspended, Failed),
        (Suspended, Dead),
        (Suspended, Blocked),
        (Blocked, Suspended),
        (Blocked, Running),
        (Blocked, Cancelled),
        (Blocked, Failed),
        (Blocked, Dead),
        (Failed, Pending),
        (Dead, Pending),
    ]
};

impl RunStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Suspended,
        RunStatus::Blocked,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Dead,
    ];

    /// The statuses a run can still make progress from.
    pub const ACTIVE: [RunStatus; 4] =
        [RunStatus::Pending, RunStatus::Running, RunStatus::Suspended, RunStatus::Blocked];

    /// Whether the run is parked (`suspended` or `blocked`): woken by deliveries and due
    /// timers.
    pub fn is_parked(self) -> bool {
        matches!(self, RunStatus::Suspended | RunStatus::Blocked)
    }

    /// Whether the run has settled: completed, failed, cancelled or dead.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled | RunStatus::Dead)
    }

    /// Whether no transition leaves the status ([`TRANSITIONS`]): completed or cancelled (a
    /// failed or dead run can be retried).
    pub fn is_final(self) -> bool {
        !TRANSITIONS.iter().any(|&(from, _)| from == self)
    }

    /// Whether the transition `self → next` is in the [`TRANSITIONS`] table.
    pub fn can_become(self, next: RunStatus) -> bool {
        TRANSITIONS.contains(&(self, next))
    }

    /// The lower-case name used in storage and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Suspended => "suspended",
            RunStatus::Blocked => "blocked",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Dead => "dead",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownName { what: "run status", name: s.to_string() })
    }
}

/// A name that does not parse into one of the model's enums.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}")]
pub struct UnknownName {
    /// What was being parsed.
    pub what: &'static str,
    /// The text that did not parse.
    pub name: String,
}

/// An error recorded on a step or a run.
///
/// Step closures return it; `?` converts any `std::error::Error` into a retryable one.
/// `StepError::fatal` marks an error that must not be retried. It deliberately does not
/// implement `std::error::Error` itself (like `anyhow::Error`), so that conversion can exist.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    /// Human-readable message.
    pub message: String,
    /// Machine-readable code (`non_determinism`, `panic`, or the user's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Whether a retry policy may try the step again.
    pub retryable: bool,
}

impl StepError {
    /// A retryable error with this message.
    pub fn retryable(message: impl Into<String>) -> Self {
        StepError { message: message.into(), code: None, retryable: true }
    }

    /// A fatal error: the step is not retried.
    pub fn fatal(message: impl Into<String>) -> Self {
        StepError { message: message.into(), code: None, retryable: false }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The code, if any.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The fatal `payload_too_large` error of a value (`what`: "the output of step …") of
    /// `len` bytes over the `limit` (`max_payload_bytes`): the same value would be refused
    /// again, so it is never retried.
    pub fn payload_too_large(what: impl fmt::Display, len: usize, limit: usize) -> Self {
        StepError::fatal(format!("{what} is {len} bytes, over the {limit}-byte payload limit (max_payload_bytes)"))
            .with_code(crate::codes::PAYLOAD_TOO_LARGE)
    }
}

impl fmt::Debug for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepError")
            .field("message", &self.message)
            .field("code", &self.code)
            .field("retryable", &self.retryable)
            .finish()
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} [{code}]", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for StepError {
    fn from(e: E) -> Self {
        StepError::retryable(e.to_string())
    }
}

/// Which run (and which seq of it) started a child run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    /// The parent run.
    pub run_id: RunId,
    /// The parent's seq that waits for this child.
    pub seq: u32,
}

/// A workflow run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The run id.
    pub id: RunId,
    /// The registered workflow name.
    pub workflow: String,
    /// The workflow version the run started on (and always resumes on).
    pub version: u32,
    /// The namespace (pool) the run belongs to.
    pub namespace: String,
    /// Lifecycle state.
    pub status: RunStatus,
    /// The input the run was started with.
    pub input: Payload,
    /// The output, once completed.
    pub output: Option<Payload>,
    /// The error, once failed, cancelled or dead.
    pub error: Option<StepError>,
    /// Free-form tags set at start.
    pub tags: Vec<String>,
    /// Scheduling priority (higher first).
    pub priority: i32,
    /// The parent run, for child runs.
    pub parent: Option<ParentLink>,
    /// Creation time.
    pub created_at: Millis,
    /// Last change of the run row.
    pub updated_at: Millis,
    /// When a suspended run is due to be woken, or when a pending run with a delayed start
    /// may start (`None` on a pending run: at once).
    pub wake_at: Option<Millis>,
    /// The engine instance holding the run's lease.
    pub lease_owner: Option<String>,
    /// When the lease expires.
    pub lease_until: Option<Millis>,
    /// Consecutive recoveries without progress: incremented by each claim that takes the run
    /// over from an expired lease ([`Store::claim_run`](crate::Store::claim_run)), set back to
    /// 0 by each commit that records progress — checkpoints or a turn end
    /// ([`Store::commit`](crate::Store::commit)) — and by an operator retry. The engine buries
    /// a run recovered more than `max_recovery_attempts` times in a row as `dead`.
    pub recovery_attempts: u32,
    /// Incremented by every delivery to the run (signal, event, child result), so a turn that
    /// suspends can tell that something arrived while it ran.
    pub wake_gen: u64,
    /// How many claims have acquired the run ([`Store::claim_run`](crate::Store::claim_run)
    /// increments it with each): an engine that kept a suspended run's turn in memory resumes
    /// it only if its next claim is the very next one, so nobody else ran the run meanwhile.
    /// Always 0 from a store that does not count claims (such a run is never resumed from
    /// memory: its turn replays).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub claims: u64,
    /// The W3C `traceparent` the run's spans join (see [`trace`](crate::trace)), set at
    /// creation: every turn, remote step and child of the run shares its trace id. `None` on
    /// runs created before trace contexts were stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
}

impl Run {
    /// Whether a claim that acquires the run drops its error: a `blocked` run carries the
    /// [`codes::BLOCKED`](crate::codes::BLOCKED) message while no worker can take its remote
    /// step, and once claimed it is executing, so the message is stale. Any other error (a
    /// cancel request) stays. See [`Store::claim_run`](crate::Store::claim_run).
    pub fn claim_clears_error(&self) -> bool {
        self.status == RunStatus::Blocked
            && self.error.as_ref().is_some_and(|e| e.code() == Some(crate::codes::BLOCKED))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A run to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRun {
    /// The run id (unique in the store).
    pub id: RunId,
    /// The registered workflow name.
    pub workflow: String,
    /// The workflow version.
    pub version: u32,
    /// The namespace.
    pub namespace: String,
    /// The input.
    pub input: Payload,
    /// Tags.
    pub tags: Vec<String>,
    /// Priority.
    pub priority: i32,
    /// The parent, for child runs.
    pub parent: Option<ParentLink>,
    /// Creation time.
    pub created_at: Millis,
    /// A delayed start: the run stays `pending` until this time (its `wake_at`), then
    /// executes. `None`: at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Millis>,
    /// The W3C `traceparent` to store on the run ([`Run::trace_context`]); the engine sets
    /// one on every run it creates (children inherit their parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
    /// The concurrency key to pass before the run may execute (see
    /// [`Store::create_run`](crate::Store::create_run)); not part of the run's record.
    #[serde(default, skip)]
    pub admission: Option<crate::admission::SlotRequest>,
}

impl From<&Run> for NewRun {
    /// The create that would make `run` again: its id, workflow and version, namespace,
    /// input, tags, priority, parent, creation time and trace context (importing a recorded run,
    /// say).
    fn from(run: &Run) -> Self {
        NewRun {
            id: run.id.clone(),
            workflow: run.workflow.clone(),
            version: run.version,
            namespace: run.namespace.clone(),
            input: run.input.clone(),
            tags: run.tags.clone(),
            priority: run.priority,
            parent: run.parent.clone(),
            created_at: run.created_at,
            start_at: if run.status == RunStatus::Pending { run.wake_at } else { None },
            trace_context: run.trace_context.clone(),
            admission: None,
        }
    }
}

impl NewRun {
    /// This create as a store makes it for a commit's children, a publish, a schedule's fires
    /// and a buffer's flush: a run with a concurrency key waits for its slot however many runs
    /// wait already ([`SlotRequest::max_waiting`](crate::admission::SlotRequest::max_waiting)
    /// is dropped). No caller is there to be refused, and refusing one run would leave the
    /// rest of its write half done.
    pub fn never_refused(mut self) -> Self {
        if let Some(request) = &mut self.admission {
            request.max_waiting = None;
        }
        self
    }

    /// The stored form of a freshly created run: `pending`, no lease, due at `start_at`.
    pub fn into_run(self) -> Run {
        Run {
            id: self.id,
            workflow: self.workflow,
            version: self.version,
            namespace: self.namespace,
            status: RunStatus::Pending,
            input: self.input,
            output: None,
            error: None,
            tags: self.tags,
            priority: self.priority,
            parent: self.parent,
            created_at: self.created_at,
            updated_at: self.created_at,
            wake_at: self.start_at,
            lease_owner: None,
            lease_until: None,
            recovery_attempts: 0,
            wake_gen: 0,
            claims: 0,
            trace_context: self.trace_context,
        }
    }
}

/// What a checkpoint records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StepKind {
    /// A local step (`ctx.step`).
    Step,
    /// `ctx.side_effect`.
    SideEffect,
    /// `ctx.now()`.
    Now,
    /// `ctx.random_u64()`.
    Random,
    /// `ctx.uuid()`.
    Uuid,
    /// A `ctx.patched` marker.
    Patch,
    /// A durable sleep.
    Sleep,
    /// A wait for a signal (also updates and external tasks).
    Signal,
    /// A wait for an event.
    Event,
    /// A child run.
    Child,
    /// `ctx.set_state`.
    State,
    /// A compensation (undo) of an earlier step.
    Compensation,
    /// A remote step executed by a worker.
    Remote,
}

impl StepKind {
    /// Every kind.
    pub const ALL: [StepKind; 13] = [
        StepKind::Step,
        StepKind::SideEffect,
        StepKind::Now,
        StepKind::Random,
        StepKind::Uuid,
        StepKind::Patch,
        StepKind::Sleep,
        StepKind::Signal,
        StepKind::Event,
        StepKind::Child,
        StepKind::State,
        StepKind::Compensation,
        StepKind::Remote,
    ];

    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Step => "step",
            StepKind::SideEffect => "side_effect",
            StepKind::Now => "now",
            StepKind::Random => "random",
            StepKind::Uuid => "uuid",
            StepKind::Patch => "patch",
            StepKind::Sleep => "sleep",
            StepKind::Signal => "signal",
            StepKind::Event => "event",
            StepKind::Child => "child",
            StepKind::State => "state",
            StepKind::Compensation => "compensation",
            StepKind::Remote => "remote",
        }
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for StepKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StepKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownName { what: "step kind", name: s.to_string() })
    }
}

/// The state of one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointStatus {
    /// Started but not finished (a crash mid-step leaves this; the step runs again).
    Running,
    /// Parked: a sleep or a retry backoff until `wake_at`, or a wait for a delivery.
    Waiting,
    /// Finished with an output.
    Completed,
    /// Finished with an error after its last attempt.
    Failed,
}

impl CheckpointStatus {
    /// Every status.
    pub const ALL: [CheckpointStatus; 4] =
        [CheckpointStatus::Running, CheckpointStatus::Waiting, CheckpointStatus::Completed, CheckpointStatus::Failed];

    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointStatus::Running => "running",
            CheckpointStatus::Waiting => "waiting",
            CheckpointStatus::Completed => "completed",
            CheckpointStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for CheckpointStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for CheckpointStatus {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CheckpointStatus::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownName { what: "checkpoint status", name: s.to_string() })
    }
}

/// The recorded result of one ctx call at one seq.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run.
    pub run_id: RunId,
    /// Position in the run's program order, from 0.
    pub seq: u32,
    /// The name given at the call (step name, signal token, …).
    pub name: String,
    /// What kind of call recorded it.
    pub kind: StepKind,
    /// Its state.
    pub status: CheckpointStatus,
    /// The call's input, where it has one (a child's input, an event matcher).
    pub input: Option<Payload>,
    /// The result.
    pub output: Option<Payload>,
    /// The last error: of a failed checkpoint, before a durable retry wait, or of the last
    /// failed attempt of a step that then succeeded.
    pub error: Option<StepError>,
    /// Attempts made so far.
    pub attempts: u32,
    /// For a waiting checkpoint: when it is due.
    pub wake_at: Option<Millis>,
    /// When the call first ran.
    pub started_at: Millis,
    /// When the checkpoint was last written.
    pub updated_at: Millis,
}

impl Checkpoint {
    /// A checkpoint for `(run, seq)` with no result yet.
    pub fn new(
        run_id: RunId,
        seq: u32,
        name: impl Into<String>,
        kind: StepKind,
        status: CheckpointStatus,
        now: Millis,
    ) -> Self {
        Checkpoint {
            run_id,
            seq,
            name: name.into(),
            kind,
            status,
            input: None,
            output: None,
            error: None,
            attempts: 0,
            wake_at: None,
            started_at: now,
            updated_at: now,
        }
    }

    /// Whether the checkpoint holds a final result (completed or failed).
    pub fn is_final(&self) -> bool {
        matches!(self.status, CheckpointStatus::Completed | CheckpointStatus::Failed)
    }
}

/// What a registered wait listens for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum WaitKind {
    /// A signal sent to this token.
    Signal {
        /// The token.
        token: String,
    },
    /// An event of this name whose payload includes the matcher's fields.
    Event {
        /// The event name.
        name: String,
        /// A JSON object the payload must include ([`crate::json_subset`]).
        // Inside an internally tagged enum serde buffers the fields, which a raw JSON value
        // cannot be read from: go through a JSON value.
        #[serde(deserialize_with = "payload_via_value")]
        matcher: Payload,
    },
}

fn payload_via_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Payload::encode(&value).map_err(serde::de::Error::custom)
}

/// A wait registered by a suspended run: the delivery that resolves it is written at `seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiter {
    /// The waiting run.
    pub run_id: RunId,
    /// The seq the delivery resolves.
    pub seq: u32,
    /// The checkpoint name at that seq.
    pub name: String,
    /// What it waits for.
    pub kind: WaitKind,
    /// When it was registered.
    pub created_at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stores' SQL names the final statuses (`completed`, `cancelled`): a new transition out
    /// of one must change it there too.
    #[test]
    fn the_final_statuses_are_completed_and_cancelled() {
        let finals: Vec<RunStatus> = RunStatus::ALL.into_iter().filter(|s| s.is_final()).collect();
        assert_eq!(finals, [RunStatus::Completed, RunStatus::Cancelled]);
    }

    #[test]
    fn transition_table() {
        use RunStatus::*;
        assert!(Pending.can_become(Running));
        assert!(Running.can_become(Suspended));
        assert!(Suspended.can_become(Running));
        assert!(Failed.can_become(Pending));
        assert!(Dead.can_become(Pending));
        // Terminal states ignore late events.
        for terminal in [Completed, Cancelled] {
            for next in RunStatus::ALL {
                assert!(!terminal.can_become(next), "{terminal} -> {next}");
            }
        }
        assert!(!Pending.can_become(Completed));
        assert!(!Suspended.can_become(Completed));
        for st in RunStatus::ALL {
            assert_eq!(st.as_str().parse::<RunStatus>().unwrap(), st);
            assert_eq!(st.is_terminal(), !RunStatus::ACTIVE.contains(&st));
        }
    }

    #[test]
    fn names_round_trip() {
        for k in StepKind::ALL {
            assert_eq!(k.as_str().parse::<StepKind>().unwrap(), k);
        }
        for s in CheckpointStatus::ALL {
            assert_eq!(s.as_str().parse::<CheckpointStatus>().unwrap(), s);
        }
        assert!("bogus".parse::<StepKind>().is_err());
    }

    /// The names honour width and alignment, as in a table of checkpoints (`{:<10}`).
    #[test]
    fn names_pad_to_a_width() {
        assert_eq!(format!("[{:<8}]", StepKind::Step), "[step    ]");
        assert_eq!(format!("[{:>10}]", CheckpointStatus::Waiting), "[   waiting]");
        assert_eq!(format!("[{:^11}]", RunStatus::Running), "[  running  ]");
        assert_eq!(format!("[{:.3}]", RunStatus::Completed), "[com]");
        assert_eq!(format!("{}", RunStatus::Suspended), "suspended");
    }

    #[test]
    fn waiters_round_trip_through_json() {
        for kind in [
            WaitKind::Signal { token: "t".into() },
            WaitKind::Event { name: "e".into(), matcher: Payload::from_json(r#"{"a":{"b":1}}"#).unwrap() },
        ] {
            let w = Waiter { run_id: crate::RunId::from("r"), seq: 3, name: "n".into(), kind, created_at: 9 };
            let text = serde_json::to_string(&w).unwrap();
            assert_eq!(serde_json::from_str::<Waiter>(&text).unwrap(), w, "{text}");
        }
    }

    #[test]
    fn step_error_from_std_error() {
        let e: StepError = std::io::Error::other("disk on fire").into();
        assert!(e.retryable);
        assert_eq!(e.message, "disk on fire");
        assert_eq!(StepError::fatal("no").with_code("bad").to_string(), "no [bad]");
    }
}
