//! The engine's event stream: what happened to runs and steps on this engine instance (and,
//! with a control plane, on the others), and which events an engine forwards to the others.

use durable_core::{Millis, RunId, RunStatus, StepError};
use serde::{Deserialize, Serialize};

/// Something that happened to a run or a step. Most events report a store write and are sent
/// once the store acknowledged it; each variant says exactly when it is sent. Subscribe with [`Engine::subscribe`](crate::Engine::subscribe); a receiver that
/// falls more than 4,096 events behind loses the oldest ones.
///
/// An engine sees the events of what it did itself and, with a control plane shared with
/// other engines ([`EngineBuilder::control_plane`](crate::EngineBuilder::control_plane)), the
/// events those engines forward ([`EventForwarding`]: by default the run-level ones), a few
/// milliseconds after they were sent there. Without one, turns executed by other engines
/// sharing the store are not seen here.
///
/// Events travel as JSON, tagged with their variant's name:
/// `{"type":"RunSettled","run_id":"order:42","status":"completed"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
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
        /// `blocked: no worker serves queue …` or `blocked: no compatible worker (requires …)`.
        message: String,
    },
    /// A `blocked` run is `suspended` again: a worker that can take its step is live. Sent
    /// after the store applied the change.
    RunUnblocked {
        /// The run.
        run_id: RunId,
    },
    /// An attempt of a remote step passed its pickup timeout or its timeout with no result:
    /// it was recorded as failed with `remote_timeout` and the run woken (its policy decides
    /// whether to re-dispatch). Sent after the store accepted the failure.
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
    /// recovery has not given up on it), before the turn polls the body: from the top, or,
    /// for a run resumed warm ([`EngineConfig::warm_runs`](crate::EngineConfig::warm_runs)),
    /// where the body this engine kept in memory parked. Nothing else is committed yet.
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
    /// A step attempt failed and will be retried: sent after the store acknowledged the commit
    /// that records the attempt count and `retry_at` (a `waiting` checkpoint), so a crash
    /// during the wait resumes with the next attempt. For a delay up to
    /// `EngineConfig::durable_retry_threshold` the turn then waits in memory, holding the run;
    /// for a longer one (a durable backoff) the run suspends.
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
    /// Every live branch of the run's body parked on a short durable sleep, and its turn holds
    /// them in memory instead of suspending the run
    /// ([`EngineConfig::hold_sleeps_under`](crate::EngineConfig::hold_sleeps_under)): sent
    /// once the store applied the commit of the sleeps' wake times. The run stays `running`
    /// under this engine's lease; its body goes on at `until`.
    SleepHeld {
        /// The run.
        run_id: RunId,
        /// When the earliest sleep is due.
        until: Millis,
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
    /// A run was deleted by [`Engine::delete_run`](crate::Engine::delete_run) on this engine,
    /// with its subtree: sent after the store deleted them. Not sent when there was no such run.
    RunDeleted {
        /// The run.
        run_id: RunId,
        /// How many runs were deleted: the run and its descendants.
        runs: u64,
    },
}

impl EngineEvent {
    /// The run the event is about (`None` for [`QueueUnavailable`](EngineEvent::QueueUnavailable)
    /// and [`ScheduleAdvanced`](EngineEvent::ScheduleAdvanced)).
    pub fn run_id(&self) -> Option<&RunId> {
        match self {
            EngineEvent::RunCreated { run_id, .. }
            | EngineEvent::RunBlocked { run_id, .. }
            | EngineEvent::RunUnblocked { run_id }
            | EngineEvent::RemoteStepTimedOut { run_id, .. }
            | EngineEvent::TurnStarted { run_id, .. }
            | EngineEvent::WakeDeferred { run_id, .. }
            | EngineEvent::StepCompleted { run_id, .. }
            | EngineEvent::StepRetrying { run_id, .. }
            | EngineEvent::StepFailed { run_id, .. }
            | EngineEvent::RunSuspended { run_id, .. }
            | EngineEvent::SleepHeld { run_id, .. }
            | EngineEvent::TurnAborted { run_id, .. }
            | EngineEvent::RunSettled { run_id, .. }
            | EngineEvent::RunDeleted { run_id, .. } => Some(run_id),
            EngineEvent::ScheduleAdvanced { .. } | EngineEvent::QueueUnavailable { .. } => None,
        }
    }
}

/// Which of its [`EngineEvent`]s an engine publishes on its control plane, for the engines
/// sharing the plane to re-emit to their subscribers
/// ([`EngineConfig::event_forwarding`](crate::EngineConfig::event_forwarding)). Publishing
/// never slows a turn: events are handed to a bounded queue that a background task publishes
/// in batches; when it is full, events are dropped and counted (reported at most once a
/// minute).
///
/// An engine on the default control plane (one of its own, when none was given) forwards
/// nothing: nobody else would hear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EventForwarding {
    /// Nothing: other engines never see this engine's events.
    None,
    /// The run-level events (the default): [`RunCreated`](EngineEvent::RunCreated),
    /// [`RunSettled`](EngineEvent::RunSettled), [`RunDeleted`](EngineEvent::RunDeleted),
    /// [`RunBlocked`](EngineEvent::RunBlocked),
    /// [`RunUnblocked`](EngineEvent::RunUnblocked),
    /// [`RemoteStepTimedOut`](EngineEvent::RemoteStepTimedOut) and
    /// [`ScheduleAdvanced`](EngineEvent::ScheduleAdvanced) — a few per run, where per-step and
    /// per-turn events would be several per step (at thousands of steps a second, a flood for
    /// a database's `NOTIFY`).
    #[default]
    Runs,
    /// Every event, per-step and per-turn ones included. For small deployments and debugging.
    All,
}

impl EventForwarding {
    /// Whether `event` is forwarded.
    pub fn forwards(self, event: &EngineEvent) -> bool {
        match self {
            EventForwarding::None => false,
            EventForwarding::All => true,
            EventForwarding::Runs => matches!(
                event,
                EngineEvent::RunCreated { .. }
                    | EngineEvent::RunSettled { .. }
                    | EngineEvent::RunDeleted { .. }
                    | EngineEvent::RunBlocked { .. }
                    | EngineEvent::RunUnblocked { .. }
                    | EngineEvent::RemoteStepTimedOut { .. }
                    | EngineEvent::ScheduleAdvanced { .. }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_travel_as_tagged_json_and_come_back_equal() {
        let settled = EngineEvent::RunSettled { run_id: RunId::from("order:42"), status: RunStatus::Completed };
        let json = serde_json::to_value(&settled).unwrap();
        assert_eq!(json, serde_json::json!({"type": "RunSettled", "run_id": "order:42", "status": "completed"}));
        let events = [
            settled,
            EngineEvent::StepRetrying {
                run_id: RunId::from("r"),
                seq: 3,
                name: "charge".into(),
                attempt: 2,
                retry_at: 1_767_225_600_000,
                error: StepError::retryable("timeout").with_code("http_504"),
            },
            EngineEvent::ScheduleAdvanced {
                key: "nightly".into(),
                fired: vec![RunId::from("sched:nightly:1")],
                skipped: 1,
                missed: 0,
                buffered: None,
            },
            EngineEvent::RunDeleted { run_id: RunId::from("order:7"), runs: 3 },
        ];
        for event in events {
            let back: EngineEvent = serde_json::from_value(serde_json::to_value(&event).unwrap()).unwrap();
            assert_eq!(back, event);
        }
        assert!(serde_json::from_value::<EngineEvent>(serde_json::json!({"type": "FromTheFuture"})).is_err());
    }

    #[test]
    fn run_level_forwarding_leaves_out_step_and_turn_events() {
        let run = || RunId::from("r");
        let settled = EngineEvent::RunSettled { run_id: run(), status: RunStatus::Failed };
        let step = EngineEvent::StepCompleted { run_id: run(), seq: 0, name: "s".into(), attempts: 1 };
        let turn = EngineEvent::TurnStarted { run_id: run(), recovered: false };
        assert!(EventForwarding::Runs.forwards(&settled));
        assert!(!EventForwarding::Runs.forwards(&step) && !EventForwarding::Runs.forwards(&turn));
        assert!(EventForwarding::All.forwards(&step));
        assert!(!EventForwarding::None.forwards(&settled));
        assert_eq!(EventForwarding::default(), EventForwarding::Runs);
        assert_eq!(step.run_id(), Some(&run()));
    }
}
