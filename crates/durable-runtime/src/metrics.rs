//! The metrics the engine and workers record through the [`metrics`](https://docs.rs/metrics)
//! facade, named in one place.
//!
//! Nothing is exported until the application installs a recorder ([`PrometheusRecorder`], or
//! any exporter of the `metrics` ecosystem: StatsD, OpenTelemetry, …); without one every call
//! is a no-op. [`describe`] gives the installed recorder each metric's unit and help text; the
//! engine and workers call it when they are built, so install the recorder first.
//!
//! Labels are bounded: workflow names, step kinds, queue names and fixed outcome and reason
//! words — never a run id or a step id. Each count is taken by the process that observed the
//! outcome, where the store confirmed it: a settle is counted by the engine whose store call
//! applied it, so a run that several engines race to settle is counted once.
//!
//! | Name | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `durable_runs_started_total` | counter | `workflow` | Runs created by this process: [`Engine::start`](crate::Engine::start), `start_many`, `retry_with_input`, children (when the parent's commit that creates them is acknowledged), schedule fires, event triggers. A start that found its id taken is not counted. |
//! | `durable_runs_settled_total` | counter | `workflow`, `outcome` | Runs this process settled, counted when the store applied the settle: `outcome` is `completed`, `failed`, `cancelled`, `timed_out` (cancelled by the workflow's execution timeout) or `dead` (recovery gave up). A run retried by an operator settles (and is counted) again. |
//! | `durable_step_duration_seconds` | histogram | `workflow`, `kind`, `outcome` | One sample per attempt of a step executed in this process (`kind`: `step` or `compensation`): the closure's run time, commit excluded. `outcome`: `completed`, `retry` (the attempt failed and the step is retried, in memory or after a durable backoff) or `failed` (the step's last attempt failed). Replayed steps take no sample. |
//! | `durable_turn_duration_seconds` | histogram | `workflow` | One sample per turn executed in this process: from its claim's answer to the end of the turn (its last commit applied, or the turn stopped). |
//! | `durable_turns_without_progress_total` | counter | — | Turns that got nowhere (see [`Metrics::turns_without_progress`](crate::Metrics::turns_without_progress)). |
//! | `durable_warm_resumes_total` | counter | — | Turns this engine continued from a suspended turn it kept in memory instead of replaying the run's history (see [`EngineConfig::warm_runs`](crate::EngineConfig::warm_runs)). |
//! | `durable_warm_dropped_total` | counter | — | Suspended turns kept in memory that were dropped without a resume: the run's next claim found a doubt (another engine claimed it, a cancel, a history that is not the turn's), a cancel, eviction past the capacity, the engine stopping. Their runs replay. |
//! | `durable_lease_takeovers_total` | counter | `workflow` | Claims of this engine that took a run over from another owner whose lease had expired (the store increments the run's `recovery_attempts`). |
//! | `durable_recoveries_total` | counter | `workflow` | Turns of a taken-over run (see above) that made progress: the store acknowledged a checkpoint of the turn, or its end moved the run on (the rule that resets `recovery_attempts`). Takeovers minus recoveries are recoveries that got nowhere. |
//! | `durable_leases_lost_total` | counter | `workflow` | Turns of this engine stopped because their lease was lost: renewals refused or failing for a whole lease period, or an end the store refused (another owner holds the lease). |
//! | `durable_dead_runs_total` | counter | `workflow` | Runs this engine buried `dead` (recovered more than `max_recovery_attempts` times in a row without progress). Also counted in `durable_runs_settled_total{outcome="dead"}`. |
//! | `durable_store_commit_seconds` | histogram | `outcome` | Latency of each `Store::commit` this engine made (a turn's checkpoints, waits, children, tasks and end in one transaction): `outcome` is `ok` or `error`. |
//! | `durable_store_commit_batch_size` | histogram | — | Records written by each acknowledged commit: checkpoints, waits, expired waits, state values, children, signals and tasks, plus one for a turn's end (suspend or settle). |
//! | `durable_tasks_total` | counter | `queue`, `outcome` | Remote-step attempts whose result the store recorded, counted by the process that reported it: `completed` or `failed` (a worker's handler), `timed_out` (an engine expired the attempt past its deadline) or `redispatched` ([`Engine::redispatch_pending`](crate::Engine::redispatch_pending)). Once per attempt across the fleet. |
//! | `durable_task_duration_seconds` | histogram | `queue`, `outcome` | One sample per handler run on a worker of this process that returned in time: `outcome` is `completed` or `failed`. |
//! | `durable_task_results_dropped_total` | counter | `reason` | Results of remote steps that changed nothing: `duplicate` (the store had recorded a result of that attempt already, or the attempt had ended), `run_settled` (the run was terminal), `expired` (the worker dropped it itself: the attempt's deadline passed, or a cancelled handler did not return within its grace), `lease_lost` (a failure returned after a heartbeat said another worker took the attempt over). |
//!
//! Queue depth and oldest age per queue and runs by status are read from the store, not
//! counted here: `durable serve` computes them at scrape time (see
//! [`Engine::worker_health`](crate::Engine::worker_health)).
//!
//! Histograms are samples in seconds (or a count, for the batch size). An exporter that
//! renders buckets needs them set; [`SECONDS_BUCKETS`] and [`BATCH_BUCKETS`] fit these
//! metrics, and [`PrometheusRecorder`] (this crate's own recorder, Prometheus text without an
//! exporter crate) uses them:
//!
//! ```no_run
//! use durable_runtime::metrics::PrometheusRecorder;
//!
//! let prometheus = PrometheusRecorder::new();
//! prometheus.install().expect("no other global recorder");
//! // … build the engine, run workflows …
//! println!("{}", prometheus.render());
//! ```

use std::time::Duration;

use ::metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use durable_core::{Commit, RunStatus, StepAfter, StepKind};

mod prometheus;

pub use prometheus::PrometheusRecorder;

/// Counter: runs created by this process, by `workflow`.
pub const RUNS_STARTED: &str = "durable_runs_started_total";
/// Counter: runs this process settled, by `workflow` and `outcome`.
pub const RUNS_SETTLED: &str = "durable_runs_settled_total";
/// Histogram (seconds): one attempt of a step, by `workflow`, `kind` and `outcome`.
pub const STEP_DURATION: &str = "durable_step_duration_seconds";
/// Histogram (seconds): one turn, by `workflow`.
pub const TURN_DURATION: &str = "durable_turn_duration_seconds";
/// Counter: turns that got nowhere.
pub const TURNS_WITHOUT_PROGRESS: &str = "durable_turns_without_progress_total";
/// Counter: turns continued from memory (warm runs).
pub const WARM_RESUMES: &str = "durable_warm_resumes_total";
/// Counter: turns kept in memory that were dropped without a resume.
pub const WARM_DROPPED: &str = "durable_warm_dropped_total";
/// Counter: runs taken over from an owner whose lease expired, by `workflow`.
pub const LEASE_TAKEOVERS: &str = "durable_lease_takeovers_total";
/// Counter: turns of taken-over runs that made progress, by `workflow`.
pub const RECOVERIES: &str = "durable_recoveries_total";
/// Counter: turns stopped because their lease was lost, by `workflow`.
pub const LEASES_LOST: &str = "durable_leases_lost_total";
/// Counter: runs buried `dead`, by `workflow`.
pub const DEAD_RUNS: &str = "durable_dead_runs_total";
/// Histogram (seconds): one `Store::commit`, by `outcome` (`ok`, `error`).
pub const STORE_COMMIT: &str = "durable_store_commit_seconds";
/// Histogram (count): records written by one acknowledged commit.
pub const STORE_COMMIT_BATCH_SIZE: &str = "durable_store_commit_batch_size";
/// Counter: remote-step attempts whose result the store recorded, by `queue` and `outcome`.
pub const TASKS: &str = "durable_tasks_total";
/// Histogram (seconds): one handler run on a worker, by `queue` and `outcome`.
pub const TASK_DURATION: &str = "durable_task_duration_seconds";
/// Counter: remote-step results that changed nothing, by `reason`.
pub const TASK_RESULTS_DROPPED: &str = "durable_task_results_dropped_total";

/// Every metric's name, in the order of the table above.
pub const ALL: &[&str] = &[
    RUNS_STARTED,
    RUNS_SETTLED,
    STEP_DURATION,
    TURN_DURATION,
    TURNS_WITHOUT_PROGRESS,
    WARM_RESUMES,
    WARM_DROPPED,
    LEASE_TAKEOVERS,
    RECOVERIES,
    LEASES_LOST,
    DEAD_RUNS,
    STORE_COMMIT,
    STORE_COMMIT_BATCH_SIZE,
    TASKS,
    TASK_DURATION,
    TASK_RESULTS_DROPPED,
];

/// Histogram buckets (seconds) for the `_seconds` metrics: 1 ms to 5 min.
pub const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Histogram buckets for [`STORE_COMMIT_BATCH_SIZE`].
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// Gives the installed recorder each metric's unit and help text (the `# HELP` lines of a
/// Prometheus scrape). The engine and workers call it when they are built; calling it again
/// is harmless.
pub fn describe() {
    describe_counter!(RUNS_STARTED, Unit::Count, "Runs created by this process, by workflow.");
    describe_counter!(
        RUNS_SETTLED,
        Unit::Count,
        "Runs this process settled (counted when the store applied the settle), by workflow and outcome \
         (completed, failed, cancelled, timed_out, dead)."
    );
    describe_histogram!(
        STEP_DURATION,
        Unit::Seconds,
        "Run time of one attempt of a step executed in this process, by workflow, kind and outcome \
         (completed, retry, failed)."
    );
    describe_histogram!(TURN_DURATION, Unit::Seconds, "Duration of one turn executed in this process, by workflow.");
    describe_counter!(TURNS_WITHOUT_PROGRESS, Unit::Count, "Turns that got nowhere (no checkpoint, no status change).");
    describe_counter!(WARM_RESUMES, Unit::Count, "Turns continued from a suspended turn kept in memory (no replay).");
    describe_counter!(
        WARM_DROPPED,
        Unit::Count,
        "Suspended turns kept in memory that were dropped without a resume (their runs replay)."
    );
    describe_counter!(
        LEASE_TAKEOVERS,
        Unit::Count,
        "Runs this engine took over from an owner whose lease had expired, by workflow."
    );
    describe_counter!(
        RECOVERIES,
        Unit::Count,
        "Turns of taken-over runs that made progress (a checkpoint or a status change), by workflow."
    );
    describe_counter!(
        LEASES_LOST,
        Unit::Count,
        "Turns of this engine stopped because their lease was lost, by workflow."
    );
    describe_counter!(DEAD_RUNS, Unit::Count, "Runs this engine buried dead (too many recoveries), by workflow.");
    describe_histogram!(
        STORE_COMMIT,
        Unit::Seconds,
        "Latency of one Store::commit of this engine, by outcome (ok, error)."
    );
    describe_histogram!(STORE_COMMIT_BATCH_SIZE, Unit::Count, "Records written by one acknowledged commit.");
    describe_counter!(
        TASKS,
        Unit::Count,
        "Remote-step attempts whose result the store recorded, by queue and outcome \
         (completed, failed, timed_out, redispatched)."
    );
    describe_histogram!(
        TASK_DURATION,
        Unit::Seconds,
        "Run time of one remote-step handler on a worker of this process, by queue and outcome (completed, failed)."
    );
    describe_counter!(
        TASK_RESULTS_DROPPED,
        Unit::Count,
        "Remote-step results that changed nothing, by reason (duplicate, run_settled, expired, lease_lost)."
    );
}

// What the engine and workers record, one function per observation (the call sites stay one
// line each).

pub(crate) fn run_started(workflow: &str) {
    counter!(RUNS_STARTED, "workflow" => workflow.to_string()).increment(1);
}

/// A settle the store applied; `timed_out`: a cancel by the execution timeout.
pub(crate) fn run_settled(workflow: &str, status: RunStatus, timed_out: bool) {
    let outcome = if timed_out { "timed_out" } else { status.as_str() };
    counter!(RUNS_SETTLED, "workflow" => workflow.to_string(), "outcome" => outcome).increment(1);
    if status == RunStatus::Dead {
        counter!(DEAD_RUNS, "workflow" => workflow.to_string()).increment(1);
    }
}

/// An attempt of a step took `took`, and the core decided `after` (a stopping turn's attempt
/// takes no sample).
pub(crate) fn step_attempt(workflow: &str, kind: StepKind, after: &StepAfter, took: Duration) {
    let outcome = match after {
        StepAfter::Completed { .. } => "completed",
        StepAfter::RetryAt { .. } | StepAfter::Park { .. } => "retry",
        StepAfter::Failed { .. } => "failed",
        StepAfter::Stopped => return,
    };
    histogram!(STEP_DURATION, "workflow" => workflow.to_string(), "kind" => kind.as_str(), "outcome" => outcome)
        .record(took);
}

pub(crate) fn turn(workflow: &str, took: Duration) {
    histogram!(TURN_DURATION, "workflow" => workflow.to_string()).record(took);
}

pub(crate) fn turn_without_progress() {
    counter!(TURNS_WITHOUT_PROGRESS).increment(1);
}

pub(crate) fn warm_resume() {
    counter!(WARM_RESUMES).increment(1);
}

pub(crate) fn warm_dropped(n: u64) {
    if n > 0 {
        counter!(WARM_DROPPED).increment(n);
    }
}

pub(crate) fn lease_takeover(workflow: &str) {
    counter!(LEASE_TAKEOVERS, "workflow" => workflow.to_string()).increment(1);
}

pub(crate) fn recovery(workflow: &str) {
    counter!(RECOVERIES, "workflow" => workflow.to_string()).increment(1);
}

pub(crate) fn lease_lost(workflow: &str) {
    counter!(LEASES_LOST, "workflow" => workflow.to_string()).increment(1);
}

/// How many records a commit writes (see [`STORE_COMMIT_BATCH_SIZE`]).
pub(crate) fn commit_size(commit: &Commit) -> usize {
    commit.checkpoints.len()
        + commit.waits.len()
        + commit.expire_waits.len()
        + commit.state.len()
        + commit.children.len()
        + commit.signals.len()
        + commit.tasks.len()
        + usize::from(commit.end.is_some())
}

/// One `Store::commit`: its latency, and for an acknowledged one its size.
pub(crate) fn store_commit(took: Duration, size: Option<usize>) {
    histogram!(STORE_COMMIT, "outcome" => if size.is_some() { "ok" } else { "error" }).record(took);
    if let Some(size) = size {
        histogram!(STORE_COMMIT_BATCH_SIZE).record(size as f64);
    }
}

/// A remote-step result the store recorded.
pub(crate) fn task_recorded(queue: &str, outcome: &'static str) {
    counter!(TASKS, "queue" => queue.to_string(), "outcome" => outcome).increment(1);
}

pub(crate) fn task_handled(queue: &str, ok: bool, took: Duration) {
    let outcome = if ok { "completed" } else { "failed" };
    histogram!(TASK_DURATION, "queue" => queue.to_string(), "outcome" => outcome).record(took);
}

pub(crate) fn task_result_dropped(reason: &'static str) {
    counter!(TASK_RESULTS_DROPPED, "reason" => reason).increment(1);
}
