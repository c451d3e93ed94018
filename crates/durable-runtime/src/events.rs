//! The engine's event stream: what happened to runs and steps on this engine instance.

use durable_core::{Millis, RunId, RunStatus, StepError};

/// Something that happened on this engine instance (turns executed by other engines sharing
/// the store are not seen here). Most events report a store write and are sent once the store
/// acknowledged it; each variant says exactly when it is sent — in particular, a
/// [`StepRetrying`](EngineEvent::StepRetrying) for an in-memory retry is sent with nothing
/// committed. Subscribe with [`Engine::subscribe`](crate::Engine::subscribe); a receiver that
/// falls more than 4,096 events behind loses the oldest ones.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// A run was created by [`Engine::start`](crate::Engine::start) on this engine (also
    /// through `signal_with_start` and `retry_with_input`, a schedule's fire, an event
    /// trigger or a full or due batch or debounce): sent after the store created it.
    /// Not sent when a run with that id existed already, nor for child runs and
    /// continue-as-new successors (a turn's commit creates those).
    RunCreated {
        /// The run.
        run_id: RunId,
        /// Its workflow.
        workflow: String,
    },
    /// This engine's scheduler looked at a due schedule and saved what it decided: the runs
    /// it fired (oldest first; created in the same store write) and the schedule's running
    /// totals. Sent after the store acknowledged the save; not sent when another engine
    /// saved first.
    ScheduleAdvanced {
        /// The schedule key.
        key: String,
        /// The runs fired (`sched:<key>:<fire-ms>`).
        fired: Vec<RunId>,
        /// Fires skipped by the overlap policy so far.
        skipped: u64,
        /// Fires missed during downtime (not caught up) so far.
        missed: u64,
        /// A `buffer_one` fire held back until the latest run ends.
        buffered: Option<Millis>,
    },
    /// A run's remote step has no live worker that can take it (none serves its queue with
    /// the capabilities it requires): the run is now `blocked` with this message. Sent after
    /// the store applied the change.
    RunBlocked {
        /// The run.
        run_id: RunId,
        /// `blocked: no compatible worker (requires …)`.
        message: String,
    },
    /// A `blocked` run is `suspended` again: a worker that can take its step is live.
    RunUnblocked {
        /// The run.
        run_id: RunId,
    },
    /// An attempt of a remote step passed its pickup timeout or its timeout with no result:
    /// it was recorded as failed with `remote_timeout` and the run woken (its policy decides
    /// whether to re-dispatch).
    RemoteStepTimedOut {
        /// The run.
        run_id: RunId,
        /// The step's seq.
        seq: u32,
        /// The attempt that expired.
        attempt: u32,
    },
    /// A turn begins: sent after the store granted the run's lease and loaded it, once the
    /// engine decided to execute it (its version is registered here, its namespace is served,
    /// recovery has not given up on it), before the body is first polled. Nothing else is
    /// committed yet.
    TurnStarted {
        /// The run.
        run_id: RunId,
        /// Whether the turn took over an expired lease of another worker.
        recovered: bool,
    },
    /// A wake found the run's lease held by another engine; this engine looks again once the
    /// lease expires or is released. Sent when the claim is refused, if no re-check of the run
    /// is pending already; nothing is written.
    WakeDeferred {
        /// The run.
        run_id: RunId,
        /// The lease holder.
        holder: String,
    },
    /// A step completed: sent after the store acknowledged the commit recording its output.
    StepCompleted {
        /// The run.
        run_id: RunId,
        /// The step's seq.
        seq: u32,
        /// The step name.
        name: String,
        /// Attempts it took.
        attempts: u32,
    },
    /// A step attempt failed and will be retried. For a delay up to
    /// `EngineConfig::durable_retry_threshold` (waited in memory) it is sent as soon as the
    /// attempt failed, before the wait, and nothing is committed: the failed attempt is not
    /// recorded (a crash before the step's next commit starts its attempts over). For a longer delay
    /// (a durable backoff) it is sent after the store acknowledged the commit that records the
    /// attempt count and `retry_at`; the run then suspends.
    StepRetrying {
        /// The run.
        run_id: RunId,
        /// The step's seq.
        seq: u32,
        /// The step name.
        name: String,
        /// The attempt that failed.
        attempt: u32,
        /// When the next attempt runs.
        retry_at: Millis,
        /// The error.
        error: StepError,
    },
    /// A step failed after its last attempt (or fatally): sent after the store acknowledged
    /// the commit recording the failure.
    StepFailed {
        /// The run.
        run_id: RunId,
        /// The step's seq.
        seq: u32,
        /// The step name.
        name: String,
        /// Attempts made.
        attempts: u32,
        /// The error.
        error: StepError,
    },
    /// The run parked (sleep, signal, child, retry backoff) and released its lease: sent after
    /// the store applied the suspend commit. Not sent when the store kept the run running
    /// because a delivery arrived during the turn (the next turn starts at once).
    RunSuspended {
        /// The run.
        run_id: RunId,
        /// When it is due, if a timer is parked.
        wake_at: Option<Millis>,
    },
    /// A store call failed (a claim, a commit, the end of a turn): sent when the run is
    /// scheduled to run again after a backoff. Its durable state is whatever the last
    /// successful commit left.
    TurnAborted {
        /// The run.
        run_id: RunId,
        /// The store error.
        error: String,
    },
    /// The run queue refused batches: sent when a batch is refused, at most once a minute,
    /// with the count of runs that could not be queued since the last report.
    QueueUnavailable {
        /// Runs not queued since the last report.
        failures: u64,
        /// The last error.
        error: String,
    },
    /// The run settled: sent after the store applied the commit that settled it on this
    /// engine (including a run that recovery gave up on, settled `dead`), or, for a cancel
    /// without compensation ([`Engine::cancel`](crate::Engine::cancel), an execution timeout),
    /// after the store applied the cancel — on the engine that cancelled it. Not sent when a
    /// settle found the run no longer running (an operator's cancel won).
    RunSettled {
        /// The run.
        run_id: RunId,
        /// Its final status.
        status: RunStatus,
    },
}
