//! Remote steps: the tasks a run hands to worker processes, and what workers tell the store.
//!
//! A remote step at `(run, seq)` is one task row, keyed by its step id `<run>:<seq>`
//! ([`crate::protocol::step_id`]). Each dispatch is an *attempt*; a re-dispatch replaces the
//! row with the next attempt under the same step id. The row is written by the same
//! [`Commit`](crate::Commit) that records the step's in-flight checkpoint and registers the
//! run's wait for it (a transactional outbox), and the result is written by
//! [`Store::complete_task`](crate::Store::complete_task), which records the checkpoint,
//! consumes the wait and wakes the run in one atomic call.
//!
//! ```text
//!   turn commit ──► task queued ──claim──► claimed (lease) ──heartbeat──► lease extended
//!                      ▲                        │ lease expired: claimable again (same attempt)
//!                      │                        ▼
//!        redispatch (attempt + 1)        complete_task ──► finished; checkpoint written; run woken
//!                                               │
//!        expired (pickup or attempt deadline) ──┘ (the engine completes it with `remote_timeout`)
//! ```

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Millis, Payload, RunId, StepError};

/// The protocol version range this build of workers and engines speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The lease a claim takes when the step sets no `heartbeat_timeout`.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// A task a commit dispatches: one attempt of the remote step at `(run_id, seq)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewTask {
    /// The run the step belongs to.
    pub run_id: RunId,
    /// The step's seq.
    pub seq: u32,
    /// The attempt (from 1).
    pub attempt: u32,
    /// The step's name (the handler a worker runs).
    pub name: String,
    /// The queue workers claim from (default: the step's name).
    pub queue: String,
    /// The run's namespace: queues are partitioned by it.
    pub namespace: String,
    /// The step's input.
    pub input: Payload,
    /// Higher first.
    pub priority: i32,
    /// Capabilities a worker must have to claim the task.
    pub requires: Vec<String>,
    /// An unclaimed task expires this long after it was dispatched (`None`: never).
    pub pickup_timeout_ms: Option<u64>,
    /// A claimed attempt expires this long after its first claim (`None`: never).
    pub timeout_ms: Option<u64>,
    /// The lease a claim (and each heartbeat) takes.
    pub heartbeat_timeout_ms: u64,
    /// When it was dispatched.
    pub created_at: Millis,
    /// The run's W3C `traceparent` ([`Run::trace_context`](crate::Run::trace_context)): the
    /// worker's span for the attempt joins the run's trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
    /// Dispatched already claimed by this worker (eager dispatch: an engine hands the attempt
    /// to a worker beside it that has a free slot, so no claim round trip follows): the
    /// store writes the task as [`Task::dispatched`] does, `claimed` by it at `created_at`.
    /// `None` (the turn's own dispatch): `queued`. Only the dispatch reads it; a stored task
    /// reads back with `None` (the claim shows in [`Task::worker`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
}

impl NewTask {
    /// The step id, `<run>:<seq>`: the idempotency key handlers see.
    pub fn step_id(&self) -> String {
        crate::protocol::step_id(&self.run_id, self.seq)
    }
}

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a worker.
    Queued,
    /// Held by a worker until its lease expires.
    Claimed,
    /// Its result was recorded, it expired, or its run settled: nothing more happens to it.
    Finished,
}

impl TaskState {
    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Claimed => "claimed",
            TaskState::Finished => "finished",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskState {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [TaskState::Queued, TaskState::Claimed, TaskState::Finished]
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| crate::UnknownName { what: "task state", name: s.to_string() })
    }
}

/// One line a handler logged with `ctx.log(..)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskLog {
    /// The attempt that logged it.
    pub attempt: u32,
    /// When.
    pub at: Millis,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The message.
    pub message: String,
    /// Structured data, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// A task as stored: the dispatch plus where it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The dispatch (of the latest attempt).
    pub task: NewTask,
    /// Where it stands.
    pub state: TaskState,
    /// The worker holding (or that last held) the claim.
    pub worker: Option<String>,
    /// When the claim's lease expires.
    pub lease_until: Option<Millis>,
    /// When the attempt was first claimed.
    pub claimed_at: Option<Millis>,
    /// The last heartbeat (a claim counts as one).
    pub heartbeat_at: Option<Millis>,
    /// The last progress a heartbeat reported.
    pub progress: Option<Payload>,
    /// How many times this attempt was claimed (more than 1: redelivered after a lease
    /// expired).
    pub claims: u32,
    /// Log lines of every attempt, oldest first.
    pub logs: Vec<TaskLog>,
    /// How it finished: `completed`, `failed`, `timed_out` or `cancelled`.
    pub outcome: Option<String>,
}

impl Task {
    /// A task just dispatched.
    pub fn queued(task: NewTask) -> Self {
        Task {
            task,
            state: TaskState::Queued,
            worker: None,
            lease_until: None,
            claimed_at: None,
            heartbeat_at: None,
            progress: None,
            claims: 0,
            logs: Vec::new(),
            outcome: None,
        }
    }

    /// A task as its dispatch stores it: [`Task::queued`], or for a dispatch claimed already
    /// ([`NewTask::claimed_by`]) `claimed` by that worker as a claim at `created_at` stamps it:
    /// `lease_until = created_at + heartbeat_timeout`, `claimed_at = heartbeat_at =
    /// created_at`, `claims = 1`. Its `task.claimed_by` is `None`.
    pub fn dispatched(mut task: NewTask) -> Self {
        let Some(worker) = task.claimed_by.take() else { return Task::queued(task) };
        let at = task.created_at;
        Task {
            state: TaskState::Claimed,
            worker: Some(worker),
            lease_until: Some(at.saturating_add(task.heartbeat_timeout_ms)),
            claimed_at: Some(at),
            heartbeat_at: Some(at),
            claims: 1,
            ..Task::queued(task)
        }
    }

    /// When the attempt expires unfinished: an unclaimed task at `created_at +
    /// pickup_timeout`, a claimed one at `claimed_at + timeout`.
    pub fn deadline(&self) -> Option<Millis> {
        match self.claimed_at {
            None => self.task.pickup_timeout_ms.map(|t| self.task.created_at.saturating_add(t)),
            Some(at) => self.task.timeout_ms.map(|t| at.saturating_add(t)),
        }
    }

    /// Whether a worker may claim it at `now` (see [`Store::claim_tasks`](crate::Store::claim_tasks)).
    pub fn claimable(&self, now: Millis) -> bool {
        let free = match self.state {
            TaskState::Queued => true,
            TaskState::Claimed => self.lease_until.is_some_and(|l| l <= now),
            TaskState::Finished => false,
        };
        free && self.deadline().is_none_or(|d| d > now)
    }

    /// Whether it is unfinished past its deadline at `now` (see
    /// [`TaskFilter::expired_at`](crate::TaskFilter::expired_at)).
    pub fn expired(&self, now: Millis) -> bool {
        self.state != TaskState::Finished && self.deadline().is_some_and(|d| d <= now)
    }
}

/// A worker's request for tasks ([`Store::claim_tasks`](crate::Store::claim_tasks)).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskClaim {
    /// The worker's id.
    pub worker: String,
    /// The queues it serves.
    pub queues: Vec<String>,
    /// Only this namespace (`None`: any).
    pub namespace: Option<String>,
    /// The capabilities it has.
    pub capabilities: Vec<String>,
    /// At most this many tasks.
    pub limit: usize,
    /// The caller's clock.
    pub now: Millis,
}

impl TaskClaim {
    /// Whether the claim's queues, namespace and capabilities cover `task` (its state and
    /// run aside): the routing half of [`Store::claim_tasks`](crate::Store::claim_tasks).
    pub fn covers(&self, task: &NewTask) -> bool {
        self.queues.contains(&task.queue)
            && self.namespace.as_ref().is_none_or(|ns| *ns == task.namespace)
            && task.requires.iter().all(|r| self.capabilities.contains(r))
    }
}

/// A heartbeat ([`Store::heartbeat_task`](crate::Store::heartbeat_task)).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskBeat {
    /// The run.
    pub run_id: RunId,
    /// The step's seq.
    pub seq: u32,
    /// The attempt the worker holds.
    pub attempt: u32,
    /// The worker.
    pub worker: String,
    /// Progress to show, if any (replaces the last).
    pub progress: Option<Payload>,
    /// Log lines to append.
    pub logs: Vec<TaskLog>,
    /// The caller's clock.
    pub now: Millis,
}

/// The answer of [`Store::heartbeat_task`](crate::Store::heartbeat_task).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatOutcome {
    /// The lease is the worker's until this time.
    Extended(Millis),
    /// The worker no longer holds this attempt (its lease expired and another worker claimed
    /// it, or a newer attempt replaced it): stop working on it.
    Lost,
    /// Stop: the run settled (for example it was cancelled), or the attempt expired or
    /// finished.
    Cancelled,
}

/// A result ([`Store::complete_task`](crate::Store::complete_task)).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskDone {
    /// The run.
    pub run_id: RunId,
    /// The step's seq.
    pub seq: u32,
    /// The attempt this result is of.
    pub attempt: u32,
    /// The worker reporting (`None`: the engine, expiring the attempt).
    pub worker: Option<String>,
    /// The output, or why the attempt failed.
    pub result: Result<Payload, StepError>,
    /// Log lines to append.
    pub logs: Vec<TaskLog>,
    /// The caller's clock.
    pub now: Millis,
}

impl TaskDone {
    /// Checks that `claim` is of this result's run, as
    /// [`Store::complete_task_and_claim`](crate::Store::complete_task_and_claim) requires: a
    /// `Conflict` naming both runs otherwise.
    pub fn check_claim(&self, claim: &crate::Claim) -> crate::StoreResult<()> {
        if self.run_id == claim.run_id {
            return Ok(());
        }
        Err(crate::StoreError::Conflict {
            message: format!(
                "complete_task_and_claim: the result is for run {} (seq {}) but the claim is for run {}",
                self.run_id, self.seq, claim.run_id
            ),
        })
    }
}

/// The answer of [`Store::complete_task`](crate::Store::complete_task).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskCompletion {
    /// Recorded: the checkpoint is written and the run woken.
    Accepted,
    /// Nothing changed: the attempt already has a result, was replaced by a newer attempt, or
    /// does not exist (a duplicate or late result).
    Duplicate,
    /// Nothing recorded: the run has settled. The task is finished.
    RunTerminal,
}

/// A worker's descriptor ([`Store::register_worker`](crate::Store::register_worker)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Unique per worker process.
    pub id: String,
    /// The queues it serves.
    pub queues: Vec<String>,
    /// Its capabilities.
    pub capabilities: Vec<String>,
    /// The oldest protocol version it speaks.
    pub protocol_min: u32,
    /// The newest protocol version it speaks.
    pub protocol_max: u32,
    /// Its concurrency (tasks at once).
    pub concurrency: u32,
    /// When it started.
    pub started_at: Millis,
    /// Its last heartbeat.
    pub heartbeat_at: Millis,
}

impl WorkerInfo {
    /// Whether it is live at `now`: it heartbeated within `ttl`.
    pub fn live(&self, now: Millis, ttl: Duration) -> bool {
        self.heartbeat_at.saturating_add(ttl.as_millis() as u64) > now
    }

    /// Whether it can run a task of `queue` that requires `requires`.
    pub fn serves(&self, queue: &str, requires: &[String]) -> bool {
        self.queues.iter().any(|q| q == queue)
            && requires.iter().all(|r| self.capabilities.contains(r))
            && (self.protocol_min..=self.protocol_max).contains(&PROTOCOL_VERSION)
    }
}

/// Per-queue figures ([`Store::queue_stats`](crate::Store::queue_stats)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// The namespace.
    pub namespace: String,
    /// The queue.
    pub queue: String,
    /// Unclaimed tasks.
    pub queued: u64,
    /// Claimed tasks.
    pub claimed: u64,
    /// When the oldest unfinished task was dispatched.
    pub oldest_at: Option<Millis>,
}

/// A remote step's options as the turn uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteOptions {
    /// Retries and backoff between attempts (every wait is durable).
    pub policy: crate::RetryPolicy,
    /// Start-to-close of one attempt.
    pub timeout: Option<Duration>,
    /// Dispatch to first claim.
    pub pickup_timeout: Option<Duration>,
    /// The lease a claim or heartbeat takes.
    pub heartbeat_timeout: Duration,
    /// Capabilities a worker must have.
    pub requires: Vec<String>,
    /// The queue (`None`: the step's name).
    pub queue: Option<String>,
    /// Higher first.
    pub priority: i32,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            policy: crate::RetryPolicy::default(),
            timeout: None,
            pickup_timeout: None,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            requires: Vec::new(),
            queue: None,
            priority: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> NewTask {
        NewTask {
            trace_context: None,
            run_id: RunId::from("r"),
            seq: 2,
            attempt: 1,
            name: "resize".into(),
            queue: "resize".into(),
            namespace: "default".into(),
            input: Payload::null(),
            priority: 0,
            requires: vec!["gpu".into()],
            pickup_timeout_ms: Some(1_000),
            timeout_ms: Some(5_000),
            heartbeat_timeout_ms: 100,
            created_at: 10,
            claimed_by: None,
        }
    }

    #[test]
    fn a_dispatch_to_a_worker_is_stored_claimed_by_it_at_its_creation() {
        assert_eq!(Task::dispatched(task()), Task::queued(task()));
        let t = Task::dispatched(NewTask { claimed_by: Some("w".into()), ..task() });
        assert_eq!(t.task, task(), "the dispatch reads back without its worker");
        assert_eq!((t.state, t.worker.as_deref(), t.claims), (TaskState::Claimed, Some("w"), 1));
        assert_eq!((t.claimed_at, t.heartbeat_at, t.lease_until), (Some(10), Some(10), Some(110)));
        assert_eq!(t.deadline(), Some(5_010), "the attempt's timeout runs from the dispatch");
        assert!(!t.claimable(109) && t.claimable(110), "another worker claims it once its lease passes");
    }

    #[test]
    fn deadlines_follow_the_claim() {
        let mut t = Task::queued(task());
        assert_eq!(t.task.step_id(), "r:2");
        assert_eq!(t.deadline(), Some(1_010));
        assert!(t.claimable(1_009) && !t.claimable(1_010));
        assert!(t.expired(1_010));
        t.state = TaskState::Claimed;
        t.claimed_at = Some(500);
        t.lease_until = Some(600);
        assert_eq!(t.deadline(), Some(5_500));
        assert!(!t.claimable(599) && t.claimable(600), "an expired lease is claimable again");
        assert!(!t.expired(5_499) && t.expired(5_500));
        t.state = TaskState::Finished;
        assert!(!t.claimable(600) && !t.expired(9_999));
    }

    #[test]
    fn workers_serve_by_queue_capability_and_protocol() {
        let w = WorkerInfo {
            id: "w".into(),
            queues: vec!["resize".into()],
            capabilities: vec!["gpu".into(), "fast".into()],
            protocol_min: 1,
            protocol_max: 1,
            concurrency: 4,
            started_at: 0,
            heartbeat_at: 100,
        };
        assert!(w.serves("resize", &["gpu".into()]));
        assert!(!w.serves("resize", &["tpu".into()]));
        assert!(!w.serves("upload", &[]));
        assert!(w.live(100, Duration::from_millis(1)) && !w.live(101, Duration::from_millis(1)));
        let old = WorkerInfo { protocol_min: 2, protocol_max: 3, ..w };
        assert!(!old.serves("resize", &[]));
    }
}
