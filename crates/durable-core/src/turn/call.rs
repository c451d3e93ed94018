//! The typed calls: what each ctx primitive means on a fresh run and on replay.

// Answers carrying a `Commit` are returned once per call and destructured at once; boxing the
// commit would cost an allocation per step for nothing.
#![allow(clippy::large_enum_variant)]

use std::time::Duration;

use super::{Attempts, Flight, Mode, Turn, TurnStop, Undo};
use crate::admission::{Admission, Limits, SlotRequest};
use crate::protocol::{self, ChildResult};
use crate::task::{NewTask, RemoteOptions};
use crate::time::millis_after;
use crate::{
    CheckpointStatus, Commit, Decision, Millis, NewRun, ParentLink, Payload, RetryDecision, RetryPolicy, RunId,
    RunStatus, StepError, StepKind, WaitKind, Waiter, codes, seed_for,
};

/// A local step or an undo.
#[derive(Debug, Clone, Copy)]
pub struct StepCall<'a> {
    /// The step's name.
    pub name: &'a str,
    /// [`StepKind::Step`] or [`StepKind::Compensation`].
    pub kind: StepKind,
    /// Its retries and backoff.
    pub policy: &'a RetryPolicy,
    /// Whether the step registers an undo once it has completed.
    pub undo: bool,
    /// The admission gate each attempt must pass first (a step queue), if any.
    pub gate: Option<GateCall<'a>>,
}

/// The admission gate of a step: a registered step queue with its limits.
#[derive(Debug, Clone, Copy)]
pub struct GateCall<'a> {
    /// The gate ([`protocol::queue_gate`]).
    pub gate: &'a str,
    /// The queue's limits.
    pub limits: Limits,
    /// The step's priority in the queue.
    pub priority: i32,
    /// The step's fairness key (`""`: none).
    pub fairness_key: &'a str,
}

/// The answer of [`Turn::begin_step`].
#[derive(Debug, Clone, PartialEq)]
pub enum StepBegin {
    /// Completed before: return this output.
    Return(Payload),
    /// Failed before, after its last attempt: return this error.
    Fail {
        /// The recorded error.
        error: StepError,
        /// Attempts made.
        attempts: u32,
    },
    /// Park for the rest of the turn: until a durable backoff is due, or (`None`) forever
    /// (a cancel with compensation is pending).
    Park(Option<Millis>),
    /// Run the closure; this is attempt `attempt` (from 1). Then call [`Turn::finish_step`].
    Run {
        /// The attempt about to be made.
        attempt: u32,
    },
    /// Ask the store for an admission slot first ([`Store::acquire_slot`](crate::Store::acquire_slot)),
    /// then hand the answer to [`Turn::admitted`].
    Acquire(SlotRequest),
    /// The turn is stopping: halt.
    Stopped,
}

/// The answer of [`Turn::finish_step`].
#[derive(Debug, Clone, PartialEq)]
pub enum StepAfter {
    /// Apply `commit`, then return `output`.
    Completed {
        /// The step's output.
        output: Payload,
        /// The commit recording it.
        commit: Commit,
    },
    /// The attempt failed; apply `commit` (the attempt count), then wait in memory until `at`
    /// and run attempt `attempt`.
    RetryAt {
        /// When to retry.
        at: Millis,
        /// The attempt to make then.
        attempt: u32,
        /// Why the last attempt failed.
        error: StepError,
        /// The commit recording the failed attempt's count and the retry time (a `waiting`
        /// checkpoint, as a durable backoff writes): a turn cut off during the wait resumes
        /// with the next attempt.
        commit: Commit,
    },
    /// The attempt failed; apply `commit` (the durable backoff), then park until `at`.
    Park {
        /// When the next attempt is due.
        at: Millis,
        /// Why the last attempt failed.
        error: StepError,
        /// The commit recording the backoff.
        commit: Commit,
    },
    /// The step failed for good; apply `commit`, then return `error`.
    Failed {
        /// The final error.
        error: StepError,
        /// Attempts made.
        attempts: u32,
        /// The commit recording the failure.
        commit: Commit,
    },
    /// The turn is stopping: halt.
    Stopped,
}

impl StepAfter {
    /// How the attempt ended, in one word (what a span or a log records): `completed`,
    /// `retrying` (in memory), `parked` (a durable backoff), `failed` or `stopped`.
    pub fn outcome(&self) -> &'static str {
        match self {
            StepAfter::Completed { .. } => "completed",
            StepAfter::RetryAt { .. } => "retrying",
            StepAfter::Park { .. } => "parked",
            StepAfter::Failed { .. } => "failed",
            StepAfter::Stopped => "stopped",
        }
    }
}

/// The answer of [`Turn::begin_record`].
#[derive(Debug, Clone, PartialEq)]
pub enum RecordBegin {
    /// Recorded before: return this value.
    Return(Payload),
    /// Produce the value, then call [`Turn::finish_record`].
    Produce,
    /// Park forever (a cancel with compensation is pending).
    Park,
    /// The turn is stopping: halt.
    Stopped,
}

/// The answer of [`Turn::finish_record`].
#[derive(Debug, Clone, PartialEq)]
pub enum RecordOutcome {
    /// Return the value now; its record rides along with the next commit.
    Return,
    /// Apply `commit`, then return the value.
    Commit(Commit),
    /// The turn is stopping: halt.
    Stopped,
}

/// The answer of [`Turn::sleep`].
#[derive(Debug, Clone, PartialEq)]
pub enum SleepBegin {
    /// The sleep is over.
    Done,
    /// Park until the time (or forever, `None`: a cancel with compensation is pending).
    Park(Option<Millis>),
    /// The turn is stopping: halt.
    Stopped,
}

/// A wait's deadline: a timer recorded at its own seq just before the wait's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadline {
    /// The deadline's seq.
    pub seq: u32,
    /// How long after the first execution the wait gives up.
    pub after: Duration,
}

/// A wait for a delivery: a signal (also updates, task results) or an event.
#[derive(Debug, Clone)]
pub struct WaitCall<'a> {
    /// What the workflow named, for the name check: `("signal token", token)`,
    /// `("update name", name)`, … (see [`protocol::check_name`]).
    pub named: (&'a str, &'a str),
    /// The token or event name (the checkpoint name).
    pub name: &'a str,
    /// [`StepKind::Signal`] or [`StepKind::Event`].
    pub kind: StepKind,
    /// What the waiter listens for.
    pub wait: WaitKind,
    /// The deadline, if the wait has one.
    pub deadline: Option<Deadline>,
}

/// The answer of [`Turn::wait`].
#[derive(Debug, Clone, PartialEq)]
pub enum WaitBegin {
    /// Delivered: return this payload.
    Delivered(Payload),
    /// The deadline passed first.
    TimedOut,
    /// Park until the deadline (`Some`) or a delivery.
    Park(Option<Millis>),
    /// The deadline passed with the wait still open: apply `commit` (which records the
    /// timeout and removes the waiter); if [`Turn::committed`] says go on, it timed out.
    Expire(Commit),
    /// The turn is stopping: halt.
    Stopped,
}

/// A child run to start.
#[derive(Debug, Clone)]
pub struct ChildCall<'a> {
    /// The child's workflow.
    pub workflow: &'a str,
    /// The child's id (default [`protocol::child_id`]).
    pub id: RunId,
    /// The newest registered version of the workflow, `None` if it is not registered here.
    pub version: Option<u32>,
    /// The child's input, or why it does not serialize.
    pub input: Result<Payload, String>,
    /// The child's concurrency key as a request ([`NewRun::admission`]; holder and run are
    /// set to the child here), `None` if its workflow has no key, or why the key could not be
    /// computed from the input.
    pub admission: Result<Option<SlotRequest>, String>,
}

/// The answer of [`Turn::join_child`].
#[derive(Debug, Clone, PartialEq)]
pub enum ChildJoin {
    /// The child completed with this output.
    Completed(Payload),
    /// The child did not complete.
    Failed {
        /// How it ended.
        status: RunStatus,
        /// Its error.
        error: Option<StepError>,
    },
    /// Park until the child settles.
    Park,
    /// The turn is stopping: halt.
    Stopped,
}

/// The answer of [`Turn::set_state`].
#[derive(Debug, Clone, PartialEq)]
pub enum StateBegin {
    /// Set before (replay): nothing to do.
    Done,
    /// Apply `commit`, which sets the value; then return.
    Commit(Commit),
    /// Park forever (a cancel with compensation is pending).
    Park,
    /// The turn is stopping: halt.
    Stopped,
}

/// A remote step: a task handed to whichever worker serves its queue.
#[derive(Debug, Clone)]
pub struct RemoteCall<'a> {
    /// The step's name (the handler workers run).
    pub name: &'a str,
    /// Its input, or why it does not serialize.
    pub input: Result<Payload, String>,
    /// Its options.
    pub options: &'a RemoteOptions,
    /// The admission gate each attempt must pass before it is dispatched (a registered step
    /// queue), if any. The slot is held until the attempt's result is recorded.
    pub gate: Option<GateCall<'a>>,
}

/// The answer of [`Turn::remote_step`].
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteBegin {
    /// Completed: return this output.
    Return(Payload),
    /// Failed for good: return this error. Its record rides along with the next commit.
    Fail {
        /// The final error.
        error: StepError,
        /// Attempts made.
        attempts: u32,
    },
    /// Park: the attempt is out (its dispatch rides along with the next commit) or a durable
    /// backoff runs, until the time given (`None`: forever, a cancel with compensation is
    /// pending).
    Park(Option<Millis>),
    /// Ask the store for an admission slot first, then hand the answer to
    /// [`Turn::remote_admitted`].
    Acquire(SlotRequest),
    /// The turn is stopping: halt.
    Stopped,
}

/// How a call stands after the shared checks.
enum Checked {
    Go(Decision),
    /// Parked forever: a cancel with compensation is pending.
    CancelPark,
    /// Replay-only: history has no final result for the call; it is remembered, nothing runs.
    /// The caller parks it for good.
    Fresh,
    Stopped,
}

impl Turn {
    /// Decides `(name, kind)` at `seq`: stops the turn on a changed body, parks new work while
    /// a cancel with compensation is pending.
    fn check(&mut self, seq: u32, name: &str, kind: StepKind, now: Millis) -> Checked {
        self.active();
        if self.stop.is_some() {
            return Checked::Stopped;
        }
        // Before a new call runs or is written: a control character cannot be stored by every
        // store (PostgreSQL refuses a NUL in text), and the commit would fail at every retry.
        // A call recorded already was stored: its replay goes on. (The length limit applies to
        // the names stores index — tokens, event, update and task names, routing and fairness
        // keys — not to this one, which may be derived: `undo:<step>`, `timeout:<wait>`.)
        if self.history.get(seq).is_none() && protocol::has_control_char(name) {
            self.fail_invalid_name(format!(
                "the {} call at seq {seq} is named {}, which contains a control character; name steps, \
                 children, remote steps, waits and state keys without them",
                kind.as_str(),
                protocol::shown(name)
            ));
            return Checked::Stopped;
        }
        match self.history.decide(&self.run.id, seq, name, kind, now) {
            Decision::NonDeterminism(nd) => {
                self.stop(TurnStop::Fail(nd.to_error()));
                if self.config.replay_only && self.mismatch.is_none() {
                    self.mismatch = Some(nd);
                }
                Checked::Stopped
            }
            Decision::Execute { .. } | Decision::Wait { .. } if self.mode == Mode::CancelRequested => {
                self.park(seq, None);
                Checked::CancelPark
            }
            Decision::Execute { .. } if self.config.replay_only => {
                self.fresh(seq, name, kind);
                Checked::Fresh
            }
            d => Checked::Go(d),
        }
    }

    /// Fails the run with code `invalid_name`: `what` (after the run's id) says which call
    /// and name, and what to do.
    pub(super) fn fail_invalid_name(&mut self, what: String) {
        let message = format!("run {}: {what}", self.run.id);
        self.stop(TurnStop::Fail(StepError::fatal(message).with_code(codes::INVALID_NAME)));
    }

    /// A record this kind of call can never have made: the history is corrupt.
    fn corrupt(&mut self, seq: u32, name: &str, found: &Decision) {
        let message = format!(
            "run {}: history at seq {seq} ({name:?}) holds a record this call cannot have made ({found:?}); the history is corrupt",
            self.run.id
        );
        self.stop(TurnStop::Fail(StepError::fatal(message)));
    }

    fn fail_serialize(&mut self, what: String, error: &str) {
        let message = format!("run {}: {what} does not serialize: {error}", self.run.id);
        self.stop(TurnStop::Fail(StepError::fatal(message).with_code(codes::BAD_PAYLOAD)));
    }

    pub(super) fn payload_too_large(&self, what: &str, len: usize) -> StepError {
        StepError::payload_too_large(format_args!("{what} of run {}", self.run.id), len, self.config.max_payload_bytes)
    }

    /// Marks a due timer still recorded as waiting as done (rides along with the next commit).
    fn settle_timer(&mut self, seq: u32, now: Millis) {
        if let Some(cp) = self.history.get(seq).filter(|c| c.status == CheckpointStatus::Waiting) {
            let mut cp = cp.clone();
            cp.status = CheckpointStatus::Completed;
            cp.updated_at = now;
            self.record(cp);
        }
    }

    // ---- local steps ----

    /// Begins (or replays) the step at `seq`.
    pub fn begin_step(&mut self, seq: u32, call: StepCall<'_>, now: Millis) -> StepBegin {
        let attempt = match self.check(seq, call.name, call.kind, now) {
            Checked::Stopped => return StepBegin::Stopped,
            Checked::CancelPark => return StepBegin::Park(None),
            Checked::Fresh => {
                self.park(seq, None);
                return StepBegin::Park(None);
            }
            Checked::Go(Decision::Replay(output)) => {
                if call.undo {
                    self.push_undo(seq, call.name);
                }
                return StepBegin::Return(output);
            }
            Checked::Go(Decision::ReplayError { error, attempts }) => return StepBegin::Fail { error, attempts },
            Checked::Go(Decision::Wait { wake_at }) => {
                self.park(seq, wake_at);
                return StepBegin::Park(wake_at);
            }
            Checked::Go(Decision::Execute { attempt }) => attempt,
            Checked::Go(d @ Decision::NonDeterminism(_)) => {
                self.corrupt(seq, call.name, &d);
                return StepBegin::Stopped;
            }
        };
        // A step resumed after a durable backoff (or a crash) keeps when it first ran and the
        // error that caused the retry.
        let recorded = self.history.get(seq);
        if recorded.is_none()
            && let Some(g) = call.gate
        {
            if let Some(problem) = protocol::storage_problem(g.fairness_key) {
                self.fail_invalid_name(format!(
                    "the step {:?} at seq {seq} has the fairness key {}: {problem}; use keys without control \
                     characters, in at most {} bytes",
                    call.name,
                    protocol::shown(g.fairness_key),
                    protocol::MAX_NAME_BYTES
                ));
                return StepBegin::Stopped;
            }
            if let Some(problem) = protocol::gate_problem(g.gate, g.fairness_key) {
                self.fail_invalid_name(format!(
                    "the step {:?} at seq {seq} asks its queue for a slot: {problem}; use shorter names",
                    call.name
                ));
                return StepBegin::Stopped;
            }
        }
        let last_error = recorded.and_then(|c| c.error.clone());
        let started_at = recorded.map_or(now, |c| c.started_at);
        self.attempts.insert(
            seq,
            Attempts {
                name: call.name.to_string(),
                kind: call.kind,
                policy: call.policy.clone(),
                undo: call.undo,
                started_at,
                last_error,
                gate: call.gate.map(|g| (g.gate.to_string(), false)),
                next_attempt: attempt,
            },
        );
        self.flights.insert(seq, Flight::Running);
        match call.gate {
            None => StepBegin::Run { attempt },
            Some(g) => StepBegin::Acquire(SlotRequest {
                gate: g.gate.to_string(),
                holder: protocol::step_id(&self.run.id, seq),
                run_id: self.run.id.clone(),
                priority: g.priority,
                fairness_key: g.fairness_key.to_string(),
                limits: g.limits,
                lease_until: Some(millis_after(now, self.config.slot_lease)),
                max_waiting: None,
                succeeds: None,
                now,
            }),
        }
    }

    /// Hands in the store's answer to the [`StepBegin::Acquire`] of the step at `seq`:
    /// admitted → run the attempt; otherwise park the step until the rate window's end
    /// (jittered) or [`TurnConfig::admission_recheck`](super::TurnConfig::admission_recheck),
    /// whichever is first — a release wakes the run earlier by handing it the slot.
    pub fn admitted(&mut self, seq: u32, answer: Admission, now: Millis) -> StepBegin {
        self.active();
        if self.stop.is_some() {
            return StepBegin::Stopped;
        }
        let Some(a) = self.attempts.get_mut(&seq) else {
            // Abandoned meanwhile.
            return StepBegin::Stopped;
        };
        match answer {
            Admission::Admitted => {
                if let Some((_, held)) = &mut a.gate {
                    *held = true;
                }
                StepBegin::Run { attempt: a.next_attempt }
            }
            // A step's request sets no `max_waiting`, so `Full` cannot come; were it to, the
            // step asks again at the recheck, like any waiter.
            held_back => {
                let attempt = a.next_attempt;
                let at = self.admission_retry_at(seq, attempt, held_back.retry_at(), now);
                self.attempts.remove(&seq);
                self.flights.remove(&seq);
                self.park(seq, Some(at));
                StepBegin::Park(Some(at))
            }
        }
    }

    /// Hands in the result of attempt `attempt` of the step at `seq` (its output encoded, or
    /// its error) and says what follows: commit and return, retry in memory, park for a
    /// durable backoff, or fail.
    pub fn finish_step(
        &mut self,
        seq: u32,
        attempt: u32,
        result: Result<Payload, StepError>,
        now: Millis,
    ) -> StepAfter {
        self.active();
        if self.stop.is_some() || self.config.replay_only {
            return StepAfter::Stopped;
        }
        // Taken out (no clone per attempt); put back only for an in-memory retry.
        let Some(mut a) = self.attempts.remove(&seq) else {
            // The call was abandoned meanwhile: nothing of it is recorded.
            return StepAfter::Stopped;
        };
        let result = result.and_then(|p| {
            if self.too_large(&p) {
                Err(self.payload_too_large(&format!("the output of step {:?} (seq {seq})", a.name), p.len()))
            } else {
                Ok(p)
            }
        });
        match result {
            Ok(output) => {
                if a.undo {
                    self.push_undo(seq, &a.name);
                }
                let mut cp = self.checkpoint(seq, a.name, a.kind, CheckpointStatus::Completed, a.started_at, now);
                cp.attempts = attempt;
                cp.output = Some(output.clone());
                cp.error = a.last_error;
                self.record(cp);
                self.release_slot_of(seq, a.gate);
                StepAfter::Completed { output, commit: self.commit_for(seq, None, now) }
            }
            Err(error) => match a.policy.after_failure(attempt, &error, seed_for(self.run.id.as_str(), seq, attempt)) {
                RetryDecision::RetryAfter(delay) => {
                    let at = millis_after(now, delay);
                    // The failed attempt's count and the retry time, committed before the
                    // wait either way: a turn cut off during an in-memory wait (a crash, a
                    // lost lease) is followed by one that replays this record and makes the
                    // next attempt at `at`, not the first again.
                    let mut cp =
                        self.checkpoint(seq, a.name.clone(), a.kind, CheckpointStatus::Waiting, a.started_at, now);
                    cp.attempts = attempt;
                    cp.error = Some(error.clone());
                    cp.wake_at = Some(at);
                    self.record(cp);
                    if delay <= self.config.durable_retry_threshold {
                        a.last_error = Some(error.clone());
                        self.attempts.insert(seq, a);
                        let commit = self.commit_for_retry(seq, now);
                        return StepAfter::RetryAt { at, attempt: attempt + 1, error, commit };
                    }
                    self.release_slot_of(seq, a.gate);
                    StepAfter::Park { at, error, commit: self.commit_for(seq, Some(at), now) }
                }
                RetryDecision::GiveUp => {
                    let mut cp = self.checkpoint(seq, a.name, a.kind, CheckpointStatus::Failed, a.started_at, now);
                    cp.attempts = attempt;
                    cp.error = Some(error.clone());
                    self.record(cp);
                    self.release_slot_of(seq, a.gate);
                    StepAfter::Failed { error, attempts: attempt, commit: self.commit_for(seq, None, now) }
                }
            },
        }
    }

    // ---- recorded values ----

    /// Begins (or replays) a recorded value at `seq`: `now`, `random`, `uuid` or
    /// `side_effect` (`kind` says which).
    pub fn begin_record(&mut self, seq: u32, name: &str, kind: StepKind, now: Millis) -> RecordBegin {
        match self.check(seq, name, kind, now) {
            Checked::Stopped => RecordBegin::Stopped,
            Checked::CancelPark => RecordBegin::Park,
            Checked::Fresh => {
                self.park(seq, None);
                RecordBegin::Park
            }
            Checked::Go(Decision::Replay(p)) => RecordBegin::Return(p),
            Checked::Go(Decision::Execute { .. }) => RecordBegin::Produce,
            Checked::Go(d) => {
                self.corrupt(seq, name, &d);
                RecordBegin::Stopped
            }
        }
    }

    /// Records the value produced for `seq`. A side effect is committed before it is
    /// returned; `now`, `random` and `uuid` ride along with the next commit.
    pub fn finish_record(
        &mut self,
        seq: u32,
        name: &str,
        kind: StepKind,
        value: Result<Payload, String>,
        now: Millis,
    ) -> RecordOutcome {
        self.active();
        if self.stop.is_some() || self.config.replay_only {
            return RecordOutcome::Stopped;
        }
        let payload = match value {
            Ok(p) => p,
            Err(e) => {
                self.fail_serialize(format!("the value of {name:?} (seq {seq})"), &e);
                return RecordOutcome::Stopped;
            }
        };
        if self.too_large(&payload) {
            let error = self.payload_too_large(&format!("the value of {name:?} (seq {seq})"), payload.len());
            self.stop(TurnStop::Fail(error));
            return RecordOutcome::Stopped;
        }
        let mut cp = self.checkpoint(seq, name, kind, CheckpointStatus::Completed, now, now);
        cp.output = Some(payload);
        cp.attempts = 1;
        self.record(cp);
        if kind == StepKind::SideEffect {
            RecordOutcome::Commit(self.commit_for(seq, None, now))
        } else {
            RecordOutcome::Return
        }
    }

    // ---- timers ----

    /// A durable sleep at `seq` until `until`.
    pub fn sleep(&mut self, seq: u32, until: Millis, now: Millis) -> SleepBegin {
        match self.check(seq, "sleep", StepKind::Sleep, now) {
            Checked::Stopped => SleepBegin::Stopped,
            Checked::CancelPark => SleepBegin::Park(None),
            Checked::Fresh => {
                self.park(seq, None);
                SleepBegin::Park(None)
            }
            Checked::Go(Decision::Replay(_)) => {
                self.settle_timer(seq, now);
                SleepBegin::Done
            }
            Checked::Go(Decision::Wait { wake_at }) => {
                self.park(seq, wake_at);
                SleepBegin::Park(wake_at)
            }
            Checked::Go(Decision::Execute { .. }) => {
                let mut cp = self.checkpoint(seq, "sleep", StepKind::Sleep, CheckpointStatus::Waiting, now, now);
                cp.wake_at = Some(until);
                if until <= now {
                    cp.status = CheckpointStatus::Completed;
                    self.record(cp);
                    return SleepBegin::Done;
                }
                self.record(cp);
                self.park(seq, Some(until));
                SleepBegin::Park(Some(until))
            }
            Checked::Go(d) => {
                self.corrupt(seq, "sleep", &d);
                SleepBegin::Stopped
            }
        }
    }

    // ---- waits ----

    /// Checks a name the workflow waits on ([`protocol::check_name`]): an invalid one fails the
    /// run at once, naming the seq, since no message could ever reach it. A wait recorded at
    /// `seq` already passed the rule of its time and goes on. Returns whether the call goes on.
    pub fn check_name(&mut self, seq: u32, what: &str, name: &str) -> bool {
        if self.stop.is_some() {
            return false;
        }
        if self.history.get(seq).is_some() {
            return true;
        }
        match protocol::check_name(what, name) {
            Ok(()) => true,
            Err(reason) => {
                self.fail_invalid_name(format!(
                    "the wait at seq {seq} can never be satisfied: {reason} (the engine refuses to send to it)"
                ));
                false
            }
        }
    }

    /// A wait for a delivery at `seq`, optionally bounded by a deadline at its own seq.
    pub fn wait(&mut self, seq: u32, call: WaitCall<'_>, now: Millis) -> WaitBegin {
        if !self.check_name(seq, call.named.0, call.named.1) {
            return WaitBegin::Stopped;
        }
        let mut due_at: Option<Millis> = None;
        let mut passed = false;
        if let Some(deadline) = call.deadline {
            let dname = protocol::timeout_name(call.name);
            match self.check(deadline.seq, &dname, StepKind::Sleep, now) {
                Checked::Stopped => return WaitBegin::Stopped,
                Checked::CancelPark => return WaitBegin::Park(None),
                Checked::Fresh => {
                    self.park(seq, None);
                    return WaitBegin::Park(None);
                }
                Checked::Go(Decision::Replay(_)) => passed = true,
                Checked::Go(Decision::Wait { wake_at }) => due_at = wake_at,
                Checked::Go(Decision::Execute { .. }) => {
                    let at = millis_after(now, deadline.after);
                    let mut cp =
                        self.checkpoint(deadline.seq, &dname, StepKind::Sleep, CheckpointStatus::Waiting, now, now);
                    cp.wake_at = Some(at);
                    self.record(cp);
                    due_at = Some(at);
                }
                Checked::Go(d) => {
                    self.corrupt(deadline.seq, &dname, &d);
                    return WaitBegin::Stopped;
                }
            }
        }
        match self.check(seq, call.name, call.kind, now) {
            Checked::Stopped => WaitBegin::Stopped,
            Checked::CancelPark => WaitBegin::Park(None),
            Checked::Fresh => {
                self.park(seq, None);
                WaitBegin::Park(None)
            }
            Checked::Go(Decision::Replay(p)) => {
                if let Some(d) = call.deadline {
                    self.settle_timer(d.seq, now);
                }
                WaitBegin::Delivered(p)
            }
            Checked::Go(Decision::ReplayError { error, .. }) if error.code() == Some(codes::WAIT_TIMEOUT) => {
                WaitBegin::TimedOut
            }
            Checked::Go(Decision::Wait { .. }) if passed && self.config.replay_only => {
                // The deadline passed with the wait open: the timeout would be recorded now.
                self.fresh(seq, call.name, call.kind);
                self.park(seq, None);
                WaitBegin::Park(None)
            }
            Checked::Go(Decision::Wait { .. }) if passed => {
                let mut cp = self.checkpoint(seq, call.name, call.kind, CheckpointStatus::Failed, now, now);
                cp.error = Some(
                    StepError::fatal(format!("wait for {:?} timed out", call.name)).with_code(codes::WAIT_TIMEOUT),
                );
                self.record(cp);
                self.buffer.expire.push(seq);
                WaitBegin::Expire(self.commit_for(seq, None, now))
            }
            Checked::Go(Decision::Wait { .. }) => {
                self.park(seq, due_at);
                WaitBegin::Park(due_at)
            }
            Checked::Go(Decision::Execute { .. }) => {
                let cp = self.checkpoint(seq, call.name, call.kind, CheckpointStatus::Waiting, now, now);
                self.record(cp);
                self.buffer.waits.push(Waiter {
                    run_id: self.run.id.clone(),
                    seq,
                    name: call.name.to_string(),
                    kind: call.wait,
                    created_at: now,
                });
                // A deadline that already passed still parks once, so a buffered delivery wins.
                let wake = if passed { Some(now) } else { due_at };
                self.park(seq, wake);
                WaitBegin::Park(wake)
            }
            Checked::Go(d) => {
                self.corrupt(seq, call.name, &d);
                WaitBegin::Stopped
            }
        }
    }

    // ---- children ----

    /// Starts a child run at `seq` (its creation and the parent's wait for its result go out
    /// with the next commit). On replay, or while a cancel is pending, nothing happens here.
    pub fn spawn_child(&mut self, seq: u32, call: ChildCall<'_>, now: Millis) {
        match self.check(seq, call.workflow, StepKind::Child, now) {
            Checked::Go(Decision::Execute { .. }) => {}
            Checked::CancelPark => {
                // Nothing is started; the join parks.
                self.parked.remove(&seq);
                return;
            }
            _ => return,
        }
        let mut cp = self.checkpoint(seq, call.workflow, StepKind::Child, CheckpointStatus::Waiting, now, now);
        cp.input = Some(Payload::encode(&call.id).unwrap_or_else(|_| Payload::null()));
        let not_started = match (call.version, call.input, call.admission) {
            (None, ..) => {
                Err(format!("workflow {:?} is not registered on the engine that started the child", call.workflow))
            }
            (_, Err(e), _) => Err(format!("the child's input does not serialize: {e}")),
            (Some(_), Ok(input), _) if self.too_large(&input) => {
                Err(StepError::payload_too_large("the child's input", input.len(), self.config.max_payload_bytes)
                    .message)
            }
            (_, _, Err(e)) => Err(format!("its concurrency key could not be computed from its input: {e}")),
            (Some(version), Ok(input), Ok(admission)) => Ok((version, input, admission)),
        };
        let (version, input, admission) = match not_started {
            Ok(v) => v,
            Err(reason) => {
                cp.status = CheckpointStatus::Failed;
                cp.error = Some(
                    StepError::fatal(format!("child run {} was not started: {reason}", call.id))
                        .with_code(codes::CHILD_FAILED),
                );
                self.record(cp);
                return;
            }
        };
        self.record(cp);
        self.buffer.waits.push(Waiter {
            run_id: self.run.id.clone(),
            seq,
            name: call.workflow.to_string(),
            kind: WaitKind::Signal { token: protocol::child_token(&self.run.id, seq) },
            created_at: now,
        });
        self.buffer.children.push(NewRun {
            admission: admission.map(|request| request.for_run(&call.id)),
            id: call.id,
            workflow: call.workflow.to_string(),
            version,
            namespace: self.run.namespace.clone(),
            input,
            tags: Vec::new(),
            priority: self.run.priority,
            parent: Some(ParentLink { run_id: self.run.id.clone(), seq }),
            created_at: now,
            start_at: None,
            // A child joins its parent's trace.
            trace_context: self.run.trace_context.clone(),
        });
    }

    /// Waits for the child started at `seq` to settle.
    pub fn join_child(&mut self, seq: u32, workflow: &str, now: Millis) -> ChildJoin {
        match self.check(seq, workflow, StepKind::Child, now) {
            Checked::Stopped => ChildJoin::Stopped,
            Checked::CancelPark => ChildJoin::Park,
            // Replay-only: the spawn found no record either (nothing was started).
            Checked::Fresh => {
                self.park(seq, None);
                ChildJoin::Park
            }
            Checked::Go(Decision::Wait { .. }) => {
                self.park(seq, None);
                ChildJoin::Park
            }
            Checked::Go(Decision::ReplayError { error, .. }) => {
                let status = error.code().and_then(protocol::parse_child_failure_code).unwrap_or(RunStatus::Failed);
                ChildJoin::Failed { status, error: Some(error) }
            }
            Checked::Go(Decision::Replay(p)) => {
                let result: ChildResult = match p.decode() {
                    Ok(r) => r,
                    Err(e) => {
                        self.fail_decode(seq, workflow, &e.to_string());
                        return ChildJoin::Stopped;
                    }
                };
                if result.status == RunStatus::Completed {
                    return ChildJoin::Completed(result.output.unwrap_or_else(Payload::null));
                }
                // The same error every replay reads back from the re-recorded checkpoint.
                let error = self.record_child_failure(seq, &result, now);
                ChildJoin::Failed { status: result.status, error: Some(error) }
            }
            Checked::Go(d) => {
                // Execute: the spawn recorded nothing, which it always does when it runs.
                self.corrupt(seq, workflow, &d);
                ChildJoin::Stopped
            }
        }
    }

    /// Re-records a delivered child failure as a `failed` checkpoint, so an operator's retry of
    /// the parent re-runs the child call (rides along with the next commit). Returns the error
    /// recorded, which every later replay returns too.
    fn record_child_failure(&mut self, seq: u32, result: &ChildResult, now: Millis) -> StepError {
        let message = result
            .error
            .as_ref()
            .map_or_else(|| format!("child run {} is {}", result.run_id, result.status), |e| e.message.clone());
        let error = StepError::fatal(message).with_code(protocol::child_failure_code(result.status));
        if let Some(cp) = self.history.get(seq).filter(|c| c.status == CheckpointStatus::Completed) {
            let mut cp = cp.clone();
            cp.status = CheckpointStatus::Failed;
            cp.error = Some(error.clone());
            cp.updated_at = now;
            self.record(cp);
        }
        error
    }

    /// Registers the undo of the step at `step_seq`. The stack is kept in program (seq) order,
    /// so concurrent steps that complete out of order compensate in the same order on every
    /// replay.
    fn push_undo(&mut self, step_seq: u32, name: &str) {
        let at = self.undos.partition_point(|u| u.step_seq < step_seq);
        if self.undos.get(at).is_some_and(|u| u.step_seq == step_seq) {
            return;
        }
        self.undos.insert(at, Undo { step_seq, name: name.to_string() });
    }

    // ---- state and the end of a chain ----

    /// Sets query state `key` at `seq`; committed before the call returns.
    pub fn set_state(&mut self, seq: u32, key: &str, value: Result<Payload, String>, now: Millis) -> StateBegin {
        match self.check(seq, key, StepKind::State, now) {
            Checked::Stopped => StateBegin::Stopped,
            Checked::CancelPark => StateBegin::Park,
            Checked::Fresh => {
                self.park(seq, None);
                StateBegin::Park
            }
            Checked::Go(Decision::Replay(_)) => StateBegin::Done,
            Checked::Go(Decision::Execute { .. }) => {
                let value = match value {
                    Ok(v) => v,
                    Err(e) => {
                        self.fail_serialize(format!("state {key:?} (seq {seq})"), &e);
                        return StateBegin::Stopped;
                    }
                };
                if self.too_large(&value) {
                    let error = self.payload_too_large(&format!("state {key:?} (seq {seq})"), value.len());
                    self.stop(TurnStop::Fail(error));
                    return StateBegin::Stopped;
                }
                let mut cp = self.checkpoint(seq, key, StepKind::State, CheckpointStatus::Completed, now, now);
                cp.output = Some(value.clone());
                cp.attempts = 1;
                self.record(cp);
                self.buffer.state.retain(|(k, _)| k != key);
                self.buffer.state.push((key.to_string(), value));
                StateBegin::Commit(self.commit_for(seq, None, now))
            }
            Checked::Go(d) => {
                self.corrupt(seq, key, &d);
                StateBegin::Stopped
            }
        }
    }

    /// Ends this run and continues as a fresh run with `input` (or fails it when the input
    /// does not serialize). The body halts; the end of the turn settles.
    ///
    /// `admission` is the successor's concurrency key as a request (`None` if the workflow has
    /// none; holder and run are set to the successor here), or why it could not be computed
    /// from the input (the run fails with [`codes::BAD_KEY`]). The successor takes over the
    /// slot this run holds at that key, so the chain never queues behind other runs.
    pub fn continue_as_new(&mut self, input: Result<Payload, String>, admission: Result<Option<SlotRequest>, String>) {
        match (input, admission) {
            (Err(e), _) => self.fail_serialize("the continue-as-new input".to_string(), &e),
            (Ok(p), _) if self.too_large(&p) => {
                let error = self.payload_too_large("the continue-as-new input", p.len());
                self.stop(TurnStop::Fail(error));
            }
            (Ok(_), Err(e)) => {
                let message = format!(
                    "run {} could not continue as new: the successor's concurrency key could not be computed \
                     from its input: {e}",
                    self.run.id
                );
                self.stop(TurnStop::Fail(StepError::fatal(message).with_code(codes::BAD_KEY)));
            }
            (Ok(p), Ok(admission)) => {
                let successor = protocol::successor_id(&self.run.id);
                let admission = admission.map(|request| SlotRequest {
                    succeeds: Some(self.run.id.to_string()),
                    ..request.for_run(&successor)
                });
                self.stop(TurnStop::ContinueAsNew(p, admission));
            }
        }
    }
}

impl Turn {
    // ---- remote steps ----

    /// Begins (or replays) the remote step at `seq`.
    ///
    /// The checkpoint tells where the step stands: none — dispatch attempt 1; `running` — an
    /// attempt is out (park until a result wakes the run, at most the reconcile interval);
    /// `waiting` with an error and no `wake_at` — a worker reported a failure (or the attempt
    /// expired): the policy decides between a durable backoff, an immediate re-dispatch and
    /// the end; `waiting` with a `wake_at` — a backoff, then the next dispatch; `completed` /
    /// `failed` — the result. A dispatch records the `running` checkpoint, registers the wait
    /// the result is delivered to ([`protocol::remote_token`]) and queues the task, all in
    /// the next commit.
    pub fn remote_step(&mut self, seq: u32, call: RemoteCall<'_>, now: Millis) -> RemoteBegin {
        let decision = match self.check(seq, call.name, StepKind::Remote, now) {
            Checked::Stopped => return RemoteBegin::Stopped,
            Checked::CancelPark => return RemoteBegin::Park(None),
            Checked::Fresh => {
                self.park(seq, None);
                return RemoteBegin::Park(None);
            }
            Checked::Go(d) => d,
        };
        let recorded = self.history.get(seq).map(|c| (c.status, c.wake_at, c.attempts));
        if recorded.is_none()
            && let Some((what, value, problem)) = unstorable_routing(&call)
        {
            self.fail_invalid_name(format!(
                "the remote step {:?} at seq {seq} has the {what} {}: {problem}; route remote steps with names \
                 that are not empty, without control characters, in at most {} bytes",
                call.name,
                protocol::shown(value),
                protocol::MAX_NAME_BYTES
            ));
            return RemoteBegin::Stopped;
        }
        if recorded.is_none()
            && let Some(g) = call.gate
            && let Some(problem) = protocol::gate_problem(g.gate, g.fairness_key)
        {
            self.fail_invalid_name(format!(
                "the remote step {:?} at seq {seq} asks its queue for a slot: {problem}; use shorter names",
                call.name
            ));
            return RemoteBegin::Stopped;
        }
        match (decision, recorded) {
            (Decision::Replay(output), _) => RemoteBegin::Return(output),
            (Decision::ReplayError { error, attempts }, _) => RemoteBegin::Fail { error, attempts },
            (Decision::Wait { wake_at: Some(at) }, _) => {
                self.park(seq, Some(at));
                RemoteBegin::Park(Some(at))
            }
            // An attempt is out.
            (Decision::Execute { .. }, Some((CheckpointStatus::Running, _, _))) => {
                let at = millis_after(now, self.config.reconcile_interval);
                self.park(seq, Some(at));
                RemoteBegin::Park(Some(at))
            }
            // A result reported a failure: judge it.
            (Decision::Wait { wake_at: None }, Some((CheckpointStatus::Waiting, None, attempts))) => {
                if self.config.replay_only {
                    self.fresh(seq, call.name, StepKind::Remote);
                    self.park(seq, None);
                    return RemoteBegin::Park(None);
                }
                self.judge_remote(seq, call, attempts, now)
            }
            // Fresh, or a backoff is over.
            (Decision::Execute { attempt }, _) => self.dispatch_gated(seq, &call, attempt, now),
            (d, _) => {
                self.corrupt(seq, call.name, &d);
                RemoteBegin::Stopped
            }
        }
    }

    /// Applies the retry policy to the failure recorded for attempt `attempts` of the remote
    /// step at `seq`.
    fn judge_remote(&mut self, seq: u32, call: RemoteCall<'_>, attempts: u32, now: Millis) -> RemoteBegin {
        let Some(cp) = self.history.get(seq).cloned() else {
            return RemoteBegin::Stopped;
        };
        let error = cp.error.clone().unwrap_or_else(|| StepError::retryable("the worker reported no error"));
        // An operator's re-dispatch sends the next attempt at once, outside the policy.
        if error.code() == Some(codes::REDISPATCH) {
            return self.dispatch_gated(seq, &call, attempts + 1, now);
        }
        match call.options.policy.after_failure(attempts, &error, seed_for(self.run.id.as_str(), seq, attempts)) {
            RetryDecision::RetryAfter(delay) if delay.is_zero() => self.dispatch_gated(seq, &call, attempts + 1, now),
            RetryDecision::RetryAfter(delay) => {
                let at = millis_after(now, delay);
                let mut cp = cp;
                cp.wake_at = Some(at);
                cp.updated_at = now;
                self.record(cp);
                self.park(seq, Some(at));
                RemoteBegin::Park(Some(at))
            }
            RetryDecision::GiveUp => {
                let mut cp = cp;
                cp.status = CheckpointStatus::Failed;
                cp.error = Some(error.clone());
                cp.updated_at = now;
                self.record(cp);
                RemoteBegin::Fail { error, attempts }
            }
        }
    }

    /// Records attempt `attempt` of the remote step at `seq` as out and queues its task.
    /// Dispatches attempt `attempt`, or with a gate asks for its slot first.
    fn dispatch_gated(&mut self, seq: u32, call: &RemoteCall<'_>, attempt: u32, now: Millis) -> RemoteBegin {
        // An input over the limit fails the step (not the run, as a local step's output over
        // it does): nothing is dispatched, no retry could shrink it, the workflow may handle
        // it. Before a slot is asked for, which no result would give back.
        if let Ok(p) = &call.input
            && self.too_large(p)
        {
            let error =
                self.payload_too_large(&format!("the input of remote step {:?} (seq {seq})", call.name), p.len());
            let started_at = self.history.get(seq).map_or(now, |c| c.started_at);
            let mut cp = self.checkpoint(seq, call.name, StepKind::Remote, CheckpointStatus::Failed, started_at, now);
            cp.attempts = attempt;
            cp.error = Some(error.clone());
            self.record(cp);
            return RemoteBegin::Fail { error, attempts: attempt };
        }
        let Some(g) = call.gate else {
            return self.dispatch(seq, call, attempt, now);
        };
        self.remote_admitting.insert(seq, attempt);
        RemoteBegin::Acquire(SlotRequest {
            gate: g.gate.to_string(),
            holder: protocol::step_id(&self.run.id, seq),
            run_id: self.run.id.clone(),
            priority: g.priority,
            fairness_key: g.fairness_key.to_string(),
            limits: g.limits,
            // Held while the run is suspended: released when the result is recorded.
            lease_until: None,
            max_waiting: None,
            succeeds: None,
            now,
        })
    }

    /// Hands in the store's answer to the [`RemoteBegin::Acquire`] of the remote step at
    /// `seq` (the same call again): admitted → the attempt is dispatched; otherwise the step
    /// parks as a local step does ([`Turn::admitted`]).
    pub fn remote_admitted(&mut self, seq: u32, call: RemoteCall<'_>, answer: Admission, now: Millis) -> RemoteBegin {
        self.active();
        if self.stop.is_some() {
            return RemoteBegin::Stopped;
        }
        let Some(attempt) = self.remote_admitting.remove(&seq) else {
            return RemoteBegin::Stopped;
        };
        match answer {
            Admission::Admitted => self.dispatch(seq, &call, attempt, now),
            held_back => {
                let at = self.admission_retry_at(seq, attempt, held_back.retry_at(), now);
                self.park(seq, Some(at));
                RemoteBegin::Park(Some(at))
            }
        }
    }

    /// When a call held back at a gate asks again: just after the rate window's end `retry_at`
    /// (spread over the window's first 10%, at most 1 s, by a seed of the call so replays
    /// agree), or at the recheck interval, whichever comes first.
    fn admission_retry_at(&self, seq: u32, attempt: u32, retry_at: Option<Millis>, now: Millis) -> Millis {
        let recheck = millis_after(now, self.config.admission_recheck);
        let at = match retry_at {
            Some(t) => {
                let spread = (t.saturating_sub(now) / 10).clamp(1, 1_000);
                t + seed_for(self.run.id.as_str(), seq, attempt) % spread
            }
            None => recheck,
        };
        at.min(recheck.max(now + 1))
    }

    fn dispatch(&mut self, seq: u32, call: &RemoteCall<'_>, attempt: u32, now: Millis) -> RemoteBegin {
        let input = match &call.input {
            // (An input over the limit failed the step in `dispatch_gated`.)
            Ok(p) => p.clone(),
            Err(e) => {
                self.fail_serialize(format!("the input of remote step {:?} (seq {seq})", call.name), e);
                return RemoteBegin::Stopped;
            }
        };
        let recorded = self.history.get(seq);
        let started_at = recorded.map_or(now, |c| c.started_at);
        let last_error = recorded.and_then(|c| c.error.clone());
        let mut cp = self.checkpoint(seq, call.name, StepKind::Remote, CheckpointStatus::Running, started_at, now);
        cp.attempts = attempt;
        cp.input = Some(input.clone());
        cp.error = last_error;
        self.record(cp);
        self.buffer.waits.push(Waiter {
            run_id: self.run.id.clone(),
            seq,
            name: call.name.to_string(),
            kind: WaitKind::Signal { token: protocol::remote_token(&self.run.id, seq) },
            created_at: now,
        });
        let o = call.options;
        self.buffer.tasks.push(NewTask {
            run_id: self.run.id.clone(),
            seq,
            attempt,
            name: call.name.to_string(),
            queue: o.queue.clone().unwrap_or_else(|| call.name.to_string()),
            namespace: self.run.namespace.clone(),
            input,
            priority: o.priority,
            requires: o.requires.clone(),
            pickup_timeout_ms: o.pickup_timeout.map(crate::millis),
            timeout_ms: o.timeout.map(crate::millis),
            heartbeat_timeout_ms: crate::millis(o.heartbeat_timeout).max(1),
            created_at: now,
            // The worker's span joins the run's trace.
            trace_context: self.run.trace_context.clone(),
            claimed_by: None,
        });
        let at = millis_after(now, self.config.reconcile_interval);
        self.park(seq, Some(at));
        RemoteBegin::Park(Some(at))
    }
}

/// A routing name of a remote step (its queue, a required capability, its fairness key) that
/// not every store can keep ([`protocol::storage_problem`]): what it is, its value and why.
fn unstorable_routing<'a>(call: &RemoteCall<'a>) -> Option<(&'static str, &'a str, String)> {
    let o = call.options;
    // No worker serves an empty name (`Worker::handle` refuses one): the task would wait forever.
    let empty = |what: &'static str, v: &'a str| v.trim().is_empty().then(|| (what, v, "it is empty".to_string()));
    if let Some(problem) = empty("name", call.name).or_else(|| o.queue.as_deref().and_then(|q| empty("queue", q))) {
        return Some(problem);
    }
    let queue = o.queue.as_deref().map(|q| ("queue", q));
    let requires = o.requires.iter().map(|c| ("required capability", c.as_str()));
    let fairness = call.gate.map(|g| ("fairness key", g.fairness_key));
    queue
        .into_iter()
        .chain(requires)
        .chain(fairness)
        .find_map(|(what, v)| Some((what, v, protocol::storage_problem(v)?)))
}
