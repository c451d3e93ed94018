//! The engine's event stream: what happened to runs and steps, after it was committed.

use durable_core::{Millis, RunId, RunStatus, StepError};

/// Something that happened on this engine instance. Sent only after the store acknowledged
/// the commit that made it durable. Subscribe with [`Engine::subscribe`](crate::Engine::subscribe);
/// a receiver that falls more than 4,096 events behind loses the oldest ones.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// A run was created by `start` on this engine.
    RunCreated {
        /// The run.
        run_id: RunId,
        /// Its workflow.
        workflow: String,
    },
    /// A turn began (the run's lease was taken).
    TurnStarted {
        /// The run.
        run_id: RunId,
        /// Whether the turn took over an expired lease of another worker.
        recovered: bool,
    },
    /// A wake found the run's lease held by another engine; this engine looks again once the
    /// lease expires or is released.
    WakeDeferred {
        /// The run.
        run_id: RunId,
        /// The lease holder.
        holder: String,
    },
    /// A step completed and its output was committed.
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
    /// A step attempt failed and will be retried.
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
    /// A step failed after its last attempt (or fatally); the failure was committed.
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
    /// The run parked (sleep, signal, child, retry backoff) and released its lease.
    RunSuspended {
        /// The run.
        run_id: RunId,
        /// When it is due, if a timer is parked.
        wake_at: Option<Millis>,
    },
    /// A turn stopped because a store call failed; the run is retried after a backoff (its
    /// durable state is whatever the last successful commit left).
    TurnAborted {
        /// The run.
        run_id: RunId,
        /// The store error.
        error: String,
    },
    /// The run queue refused batches; reported at most once a minute, with the count of runs
    /// that could not be queued since the last report.
    QueueUnavailable {
        /// Runs not queued since the last report.
        failures: u64,
        /// The last error.
        error: String,
    },
    /// The run settled.
    RunSettled {
        /// The run.
        run_id: RunId,
        /// Its final status.
        status: RunStatus,
    },
}
