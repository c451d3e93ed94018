//! The runtime's errors: [`Error`] for engine calls, [`WorkflowError`] for workflow bodies and
//! [`StepFailed`] for a step that failed after its last attempt.

use std::fmt;
use std::time::Duration;

use durable_core::{InvalidId, RunId, RunStatus, StepError, StoreError, codes};

/// The result type of engine calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a workflow body returns once its output is encoded.
pub(crate) type BodyResult = Result<durable_core::Payload, WorkflowError>;

/// What can go wrong in an engine call. Every message names the run, workflow or token it
/// concerns and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No workflow of that name is registered.
    #[error(
        "unknown workflow {name:?}: register it with engine.register({name:?}, version, fn) before starting runs of it"
    )]
    UnknownWorkflow {
        /// The name asked for.
        name: String,
    },
    /// The input does not deserialize into the workflow's input type. Nothing was persisted.
    #[error(
        "invalid input for workflow {workflow:?}: {source}; pass a value that deserializes into the workflow's input type"
    )]
    InvalidInput {
        /// The workflow.
        workflow: String,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// A value could not be serialized. Nothing was persisted.
    #[error("could not serialize {what}: {source}")]
    Serialize {
        /// What was being serialized.
        what: String,
        /// The serialization error.
        source: serde_json::Error,
    },
    /// A payload is over the configured limit. Nothing was persisted.
    #[error(
        "{what} is {size} bytes, over the {limit}-byte payload limit; keep large data elsewhere and pass a reference, or raise EngineConfig::max_payload_bytes"
    )]
    PayloadTooLarge {
        /// What the payload is.
        what: String,
        /// Its size in bytes.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A name or token was empty, only whitespace, held a control character, or (a signal
    /// token) began with a prefix the engine keeps for its own messages.
    #[error("invalid {what}: {reason}")]
    InvalidName {
        /// What was invalid (and the name, when it was not empty).
        what: String,
        /// What is wrong with it, and what to do.
        reason: String,
    },
    /// A run id was refused.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// A trace context ([`StartOptions::trace_context`](crate::StartOptions::trace_context))
    /// is not a valid W3C `traceparent`.
    #[error(transparent)]
    InvalidTraceContext(#[from] durable_core::trace::BadTraceParent),
    /// No run with that id.
    #[error("run {0} not found")]
    RunNotFound(RunId),
    /// [`Engine::start`](crate::Engine::start) with an id that a run of another workflow holds:
    /// a start is idempotent on the id only for the same workflow. Nothing was written.
    #[error(
        "run {id} already exists as a run of workflow {existing:?}, so it cannot be started as a run of {requested:?}; \
         give the new run another id"
    )]
    IdTaken {
        /// The run id.
        id: RunId,
        /// The workflow of the run that holds it.
        existing: String,
        /// The workflow the start asked for.
        requested: String,
    },
    /// A message addressed to a run that has finished (an update, a task result): refused,
    /// nothing written.
    #[error("run {id} is {status}; updates and task results go to active runs only")]
    RunFinished {
        /// The run.
        id: RunId,
        /// Its terminal status.
        status: RunStatus,
    },
    /// A wait ran out of time.
    #[error("run {id} did not settle within {timeout:?} (it is {status})")]
    Timeout {
        /// The run.
        id: RunId,
        /// How long was waited.
        timeout: Duration,
        /// Its status when the wait gave up.
        status: RunStatus,
    },
    /// The run settled without an output (failed, cancelled or dead).
    #[error("run {id} is {status}{}", error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    RunFailed {
        /// The run.
        id: RunId,
        /// Its status.
        status: RunStatus,
        /// Its recorded error.
        error: Option<StepError>,
    },
    /// A recorded output does not decode into the type asked for.
    #[error("the output of run {id} does not decode into the requested type: {source}")]
    Output {
        /// The run.
        id: RunId,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// The output of a run that continued as new was asked for as the workflow's output type:
    /// its output only names its successor, whose output is the chain's.
    #[error(
        "run {id} continued as new as run {successor}: its output names the successor; wait with \
         Engine::wait_for_run_following for the output of the chain's last run"
    )]
    ContinuedAsNew {
        /// The run that continued.
        id: RunId,
        /// Its successor.
        successor: RunId,
    },
    /// A run's query state does not decode into the type asked for
    /// ([`Engine::get_state`](crate::Engine::get_state)).
    #[error("query state {key:?} of run {id} does not decode into the requested type: {source}")]
    State {
        /// The run.
        id: RunId,
        /// The state's key.
        key: String,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// Only failed and dead runs can be retried.
    #[error("run {id} is {status}; only failed or dead runs can be retried")]
    NotRetryable {
        /// The run.
        id: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// The run ran its undos (a saga that failed or was cancelled): retrying it would replay
    /// steps whose effects were undone.
    #[error(
        "run {id} ran its undos after it failed; retrying it would replay steps that were undone — start a new run instead (`Engine::retry_with_input`, or a new start)"
    )]
    Compensated {
        /// The run.
        id: RunId,
    },
    /// [`Engine::import_history`](crate::Engine::import_history) refused to import a run.
    #[error("could not import run {run_id}: {reason}")]
    Import {
        /// The run.
        run_id: RunId,
        /// Why.
        reason: String,
    },
    /// A history export whose parts do not fit together, or that this version cannot read.
    #[error(transparent)]
    Export(#[from] durable_core::ExportError),
    /// An item of [`Engine::start_many`](crate::Engine::start_many) was refused (an unknown
    /// workflow, an input that does not serialize, is too large or does not decode into the
    /// workflow's input type, a bad id, an id a run of another workflow holds). Refused before
    /// anything was written, nothing of the call was persisted (`started` is 0); an id found
    /// held in the store is refused once its batch was written, so the items of the batches
    /// up to it were started (`started` says how many).
    #[error(
        "start_many item {index} (workflow {workflow:?}{}): {source}; {}",
        id.as_ref().map(|id| format!(", id {id}")).unwrap_or_default(),
        started_so_far(*started)
    )]
    BadStart {
        /// The item's position in the call, from 0.
        index: usize,
        /// How many items were started: 0 when nothing was; else every item up to the end of
        /// the refused item's batch but that one.
        started: usize,
        /// Its workflow.
        workflow: String,
        /// Its run id, if one was given.
        id: Option<String>,
        /// Why it was refused.
        source: Box<Error>,
    },
    /// A start's time ([`StartOptions::start_at`](crate::StartOptions::start_at) or
    /// [`delay`](crate::StartOptions::delay)) comes after
    /// [`LATEST_START`](durable_core::LATEST_START), the year 9999: refused, nothing was written.
    #[error(
        "the start of workflow {workflow:?} is set for {at} ms since 1970, after the year 9999: give start_at in milliseconds since 1970 (at most {}) or a shorter delay",
        durable_core::LATEST_START
    )]
    StartTooLate {
        /// The workflow.
        workflow: String,
        /// The start time asked for, in milliseconds since 1970.
        at: durable_core::Millis,
    },
    /// The store failed during [`Engine::start_many`](crate::Engine::start_many) after the
    /// first `started` items were persisted and dispatched (whole batches: the failed batch
    /// persisted nothing). Starting the rest again is safe for items with ids (an existing id
    /// is returned as it is); items without an id would get new ones.
    #[error("start_many: the first {started} items were started, the rest were not: {source}")]
    PartlyStarted {
        /// How many items, from the first, were started.
        started: usize,
        /// The store's error.
        source: StoreError,
    },
    /// A schedule's key or definition was refused (a bad cron expression, an unknown time
    /// zone, an interval of zero); nothing was saved.
    #[error("schedule {}: {source}", durable_core::protocol::shown(key))]
    BadSchedule {
        /// The schedule key.
        key: String,
        /// What is wrong.
        #[source]
        source: durable_core::ScheduleError,
    },
    /// No schedule has this key.
    #[error("schedule {key:?} not found; `Engine::list_schedules` (or `durable schedules list`) shows the keys")]
    ScheduleNotFound {
        /// The key.
        key: String,
    },
    /// A start was refused: its concurrency key already has `limit + max_queue_depth` runs
    /// pending, running or suspended. Nothing was persisted; start it again later.
    #[error(
        "queue_full: key {key:?} of workflow {workflow:?} is held by {held} run(s) with {waiting} more waiting, the most its max_queue_depth allows; nothing was started — try again once one finishes"
    )]
    QueueFull {
        /// The workflow.
        workflow: String,
        /// The concurrency key.
        key: String,
        /// Runs holding a slot of the key.
        held: u32,
        /// Runs waiting for one.
        waiting: u32,
    },
    /// A workflow's concurrency-key function could not read a start's input, or gave a key
    /// no store can keep. Nothing was persisted.
    #[error("workflow {workflow:?}: the input gives no usable concurrency key: {reason}")]
    BadKey {
        /// The workflow.
        workflow: String,
        /// Why.
        reason: String,
    },
    /// [`Engine::register_queue`](crate::Engine::register_queue) refused the options.
    #[error("step queue {}: {reason}", durable_core::protocol::shown(name))]
    BadQueue {
        /// The queue.
        name: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// A stable code for the error where one applies (`queue_full`, `bad_key`, `bad_queue`,
    /// `bad_schedule`), for callers that branch on it.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Error::QueueFull { .. } => Some(codes::QUEUE_FULL),
            Error::BadKey { .. } => Some(codes::BAD_KEY),
            Error::BadQueue { .. } => Some(codes::BAD_QUEUE),
            Error::BadSchedule { .. } => Some(codes::BAD_SCHEDULE),
            _ => None,
        }
    }
}

/// Why [`Engine::check_replay`](crate::Engine::check_replay) says a recorded history does not
/// replay against the code registered on the engine. The message names the run (and the seq
/// and both calls, for a changed body).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The run's workflow version is not registered: nothing could be replayed.
    #[error(
        "run {run_id}: workflow {workflow:?} version {version} is not registered{}; register the code that runs it \
         (engine.register({workflow:?}, {version}, ..)) before checking its history",
        if registered.is_empty() { String::new() } else { format!(" (registered versions: {registered:?})") }
    )]
    NotRegistered {
        /// The run.
        run_id: RunId,
        /// Its workflow.
        workflow: String,
        /// Its version.
        version: u32,
        /// The versions of that workflow that are registered.
        registered: Vec<u32>,
    },
    /// The code departs from the history.
    #[error(transparent)]
    Mismatch(#[from] durable_core::ReplayMismatch),
}

/// A step that failed after its last attempt (or with a fatal error). The workflow may handle
/// it, or return it with `?` to fail the run with the step's message and code.
#[derive(Debug, Clone, PartialEq)]
pub struct StepFailed {
    /// The run.
    pub run_id: RunId,
    /// The step name.
    pub name: String,
    /// The step's seq.
    pub seq: u32,
    /// The last error.
    pub error: StepError,
    /// How many attempts were made.
    pub attempts: u32,
}

impl fmt::Display for StepFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {:?} (seq {}) of run {} failed after {} attempt{}: {}",
            self.name,
            self.seq,
            self.run_id,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.error.message
        )
    }
}

impl std::error::Error for StepFailed {}

/// The error a workflow body returns. `?` converts any `std::error::Error` into it; a
/// [`StepFailed`] keeps its step's error code, a [`ChildFailed`](crate::ChildFailed) gets
/// `child_failed`, a [`SignalError`](crate::SignalError) `bad_payload`. Like `anyhow::Error`, it deliberately does not
/// implement `std::error::Error` itself.
pub struct WorkflowError {
    message: String,
    code: Option<String>,
}

impl WorkflowError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        WorkflowError { message: message.into(), code: None }
    }

    /// An error with this message and code, if any.
    pub(crate) fn coded(message: String, code: Option<String>) -> Self {
        WorkflowError { message, code }
    }

    /// Sets the machine-readable code recorded on the run.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The code.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// An error carrying a step error's message and code.
    pub fn from_step_error(e: StepError) -> Self {
        WorkflowError { message: e.message, code: e.code }
    }

    /// The error recorded on the failed run.
    pub fn to_step_error(&self) -> StepError {
        StepError { message: self.message.clone(), code: self.code.clone(), retryable: false }
    }
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} [{code}]", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl fmt::Debug for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowError").field("message", &self.message).field("code", &self.code).finish()
    }
}

/// The end of a [`Error::BadStart`] message: what the call started.
fn started_so_far(started: usize) -> String {
    match started {
        0 => "nothing was started".into(),
        n => format!(
            "{n} items were started (those up to the end of this item's batch, but this one), the rest were \
             not: call again without this item to start them (ids are idempotent)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_failed_keeps_its_code_through_question_mark() {
        let failed = StepFailed {
            run_id: RunId::from("r"),
            name: "charge".into(),
            seq: 2,
            error: StepError::fatal("card declined").with_code("declined"),
            attempts: 1,
        };
        let w: WorkflowError = failed.into();
        assert_eq!(w.code(), Some("declined"));
        assert!(w.message().contains("card declined") && w.message().contains("seq 2"));
        let io: WorkflowError = std::io::Error::other("x").into();
        assert_eq!(io.code(), None);
    }
}
