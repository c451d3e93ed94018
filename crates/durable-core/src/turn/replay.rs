//! Replay-only turns ([`TurnConfig::replay_only`](super::TurnConfig::replay_only)): a recorded
//! history is replayed against the current code without executing or writing anything, and the
//! turn ends with a verdict instead of a commit.
//!
//! Every call history holds a final result for replays it as usual (its name and kind are
//! compared). A call history has **no** final result for — a step never run or interrupted, a
//! value never recorded, a wait whose deadline would now expire, a child never started — is
//! where the recorded history ends: it is parked for good, nothing runs, and the first such
//! call is remembered. The turn then ends with [`End::Replayed`]:
//!
//! - every branch parked → [`Replayed::UpTo`] (a call without a record was reached) or
//!   [`Replayed::Parked`] (only recorded waits remain open: where the run is suspended);
//! - the body finished → compared with how the recorded run ended: [`Replayed::Finished`], or
//!   [`ReplayMismatch::End`] when it ends otherwise, or [`ReplayMismatch::NotAsked`] when
//!   history recorded calls the code no longer makes;
//! - a changed call → [`ReplayMismatch::Call`] naming the seq and both calls;
//! - the replay itself fails (a recorded value no longer decodes, the body panics, a corrupt
//!   history) → [`ReplayMismatch::Failed`].

use std::fmt;

use super::{End, Turn, TurnStop};
use crate::{NonDeterminism, Payload, RunId, RunStatus, StepError, StepKind, codes, protocol};

/// Where a replay-only turn that matched its history stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// Every recorded call matched up to the first call history holds no final result for:
    /// `seq`, which the code asks for as `kind` `name`. A live run would go on executing
    /// from there.
    UpTo {
        /// The first call without a final record.
        seq: u32,
        /// Its name as the code gives it.
        name: String,
        /// Its kind.
        kind: StepKind,
    },
    /// Every recorded call matched and every branch is parked on a wait history records as
    /// open (a sleep, a signal, a child, a durable retry backoff): where the run is suspended.
    Parked {
        /// The seq the next new call would take.
        next_seq: u32,
    },
    /// The body finished, as the recorded run did (or as an active run would).
    Finished {
        /// How it finished.
        status: RunStatus,
    },
}

/// How a run ended (or, on replay, would end): its status, output and error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// The status.
    pub status: RunStatus,
    /// The output of a completed run.
    pub output: Option<Payload>,
    /// The error of a run that did not complete.
    pub error: Option<StepError>,
}

impl fmt::Display for RunEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.output, &self.error) {
            (_, Some(e)) => write!(f, "{} with error {e}", self.status),
            (Some(out), None) => write!(f, "{} with output {out}", self.status),
            (None, None) => write!(f, "{}", self.status),
        }
    }
}

/// How the current code departs from a recorded history. Every variant names the run, and
/// the seq where it concerns one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayMismatch {
    /// At one seq the code asks for another call than history recorded.
    Call(NonDeterminism),
    /// The body finished without asking for a call history recorded.
    NotAsked {
        /// The run.
        run_id: RunId,
        /// The first recorded seq the code never asked for.
        seq: u32,
        /// `(name, kind)` history recorded there.
        recorded: (String, StepKind),
    },
    /// The body ends the run otherwise than the recorded run ended.
    End {
        /// The run.
        run_id: RunId,
        /// How the recorded run ended.
        recorded: RunEnd,
        /// How the code ends it now.
        replayed: RunEnd,
    },
    /// Replaying failed: a recorded value no longer decodes into the type the code asks for,
    /// the body panicked, or the history holds a record no call can have made. The error
    /// names the run and the seq.
    Failed {
        /// The run.
        run_id: RunId,
        /// What failed.
        error: StepError,
    },
    /// The body waits on something that is not a ctx call (a timer, a channel, I/O), so
    /// replay cannot know what it returns.
    OutsideAwait {
        /// The run.
        run_id: RunId,
        /// The seq the next ctx call would take.
        next_seq: u32,
    },
}

impl ReplayMismatch {
    /// The run concerned.
    pub fn run_id(&self) -> &RunId {
        match self {
            ReplayMismatch::Call(nd) => &nd.run_id,
            ReplayMismatch::NotAsked { run_id, .. }
            | ReplayMismatch::End { run_id, .. }
            | ReplayMismatch::Failed { run_id, .. }
            | ReplayMismatch::OutsideAwait { run_id, .. } => run_id,
        }
    }
}

impl fmt::Display for ReplayMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayMismatch::Call(nd) => write!(f, "{nd}"),
            ReplayMismatch::NotAsked { run_id, seq, recorded } => write!(
                f,
                "run {run_id}: the workflow code finished without asking for {} {:?}, which history recorded at seq {seq}; \
                 the body changed under a running run — register the change as a new version, or guard it with \
                 ctx.patched(..); or the body is not deterministic (it decides by random numbers, the clock or a \
                 HashMap's order: use ctx.random_u64(), ctx.now() and ordered maps)",
                recorded.1, recorded.0
            ),
            ReplayMismatch::End { run_id, recorded, replayed } => write!(
                f,
                "run {run_id}: the recorded run ended {recorded}, but the workflow code now ends it {replayed}"
            ),
            ReplayMismatch::Failed { run_id, error } => {
                // Engine messages already name the run; do not say it twice.
                if error.message.starts_with(&format!("run {run_id}")) {
                    write!(f, "replay failed: {error}")
                } else {
                    write!(f, "run {run_id}: replay failed: {error}")
                }
            }
            ReplayMismatch::OutsideAwait { run_id, next_seq } => write!(
                f,
                "run {run_id}: after seq {} the workflow body waits on something that is not a ctx call (a timer, a \
                 channel, I/O); replay cannot know what it returns — do such work in a step",
                next_seq.saturating_sub(1)
            ),
        }
    }
}

impl std::error::Error for ReplayMismatch {}

/// Who ended the body: its own return, or the engine (a failure replay detected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EndedBy {
    Body,
    Engine,
}

/// The first call of a replay-only turn that history has no final result for.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Fresh {
    pub(super) seq: u32,
    pub(super) name: String,
    pub(super) kind: StepKind,
}

impl Turn {
    /// Replay-only: remembers the call at `seq` as one history has no final result for
    /// (the lowest such seq wins). The caller parks it for good (or, for a patch marker,
    /// goes on without recording it).
    pub(super) fn fresh(&mut self, seq: u32, name: &str, kind: StepKind) {
        if self.first_fresh.as_ref().is_none_or(|f| seq < f.seq) {
            self.first_fresh = Some(Fresh { seq, name: name.to_string(), kind });
        }
    }

    /// Replay-only: every live branch is parked.
    pub(super) fn replay_parked(&self) -> End {
        End::Replayed(Ok(match &self.first_fresh {
            Some(f) => Replayed::UpTo { seq: f.seq, name: f.name.clone(), kind: f.kind },
            None => Replayed::Parked { next_seq: self.next_seq },
        }))
    }

    /// Replay-only: the body keeps waiting on something that is not a ctx call.
    pub fn on_outside_await(&self) -> End {
        End::Replayed(Err(ReplayMismatch::OutsideAwait { run_id: self.run.id.clone(), next_seq: self.next_seq }))
    }

    /// Replay-only: the turn stopped before the body finished.
    pub(super) fn replay_stopped(&mut self) -> End {
        let run_id = self.run.id.clone();
        if let Some(nd) = self.mismatch.clone() {
            return End::Replayed(Err(ReplayMismatch::Call(nd)));
        }
        match self.stop.clone() {
            Some(TurnStop::Fail(error)) => self.replay_end(RunStatus::Failed, None, Some(error), EndedBy::Engine),
            Some(TurnStop::ContinueAsNew(..)) => {
                let successor = protocol::successor_id(&self.run.id);
                let marker = protocol::continued_marker(&successor);
                self.replay_end(RunStatus::Completed, Some(marker), None, EndedBy::Body)
            }
            Some(TurnStop::Abort(why) | TurnStop::LeaseLost(why) | TurnStop::Rerun(why)) => {
                End::Replayed(Err(ReplayMismatch::Failed { run_id, error: StepError::fatal(why) }))
            }
            None => End::Replayed(Err(ReplayMismatch::Failed {
                run_id,
                error: StepError::fatal("the replay ended without a reason"),
            })),
        }
    }

    /// The first call history recorded that the body, which has returned, never asked for: the
    /// code changed under the run (it makes fewer calls than it did).
    pub(super) fn not_asked(&self) -> Option<ReplayMismatch> {
        let cp = self.history.first_from(self.next_seq)?;
        Some(ReplayMismatch::NotAsked {
            run_id: self.run.id.clone(),
            seq: cp.seq,
            recorded: (cp.name.clone(), cp.kind),
        })
    }

    /// Replay-only: the body ended the run as `status`; compares it with how the recorded run
    /// ended.
    ///
    /// - A failure the engine detected (a value that no longer decodes, a panic, a payload over
    ///   the limit) is a mismatch unless the recorded run failed with the same code.
    /// - A body that finished without asking for calls history recorded is a mismatch.
    /// - A recorded `completed` run must complete with the same output (compared as JSON); a
    ///   recorded `failed` run must fail with the same error code. A `cancelled` or `dead` run
    ///   was ended from outside, and an active run has not ended yet: any end is theirs.
    pub(super) fn replay_end(
        &mut self,
        status: RunStatus,
        output: Option<Payload>,
        error: Option<StepError>,
        by: EndedBy,
    ) -> End {
        let run_id = self.run.id.clone();
        let recorded =
            RunEnd { status: self.run.status, output: self.run.output.clone(), error: self.run.error.clone() };
        let same_code = |e: &Option<StepError>| {
            recorded.status == RunStatus::Failed
                && recorded.error.as_ref().and_then(|r| r.code.clone()) == e.as_ref().and_then(|e| e.code.clone())
        };
        if by == EndedBy::Engine {
            if same_code(&error) {
                return End::Replayed(Ok(Replayed::Finished { status }));
            }
            let error = error.unwrap_or_else(|| StepError::fatal("replay failed"));
            return End::Replayed(Err(ReplayMismatch::Failed { run_id, error }));
        }
        if let Some(mismatch) = self.not_asked() {
            return End::Replayed(Err(mismatch));
        }
        let json = |p: &Option<Payload>| p.as_ref().map(Payload::to_value).unwrap_or(serde_json::Value::Null);
        let matches = match recorded.status {
            RunStatus::Completed => status == RunStatus::Completed && json(&output) == json(&recorded.output),
            RunStatus::Failed => status == RunStatus::Failed && same_code(&error),
            _ => true,
        };
        if matches {
            End::Replayed(Ok(Replayed::Finished { status }))
        } else {
            End::Replayed(Err(ReplayMismatch::End { run_id, recorded, replayed: RunEnd { status, output, error } }))
        }
    }
}

/// Whether a recorded run was cancelled with compensation: its undos ran after the cancel, so
/// its replay runs in cancel mode.
pub(super) fn cancelled_with_undos(run: &crate::Run, history: &crate::History) -> bool {
    run.status == RunStatus::Cancelled
        && run.error.as_ref().is_some_and(|e| e.code() == Some(codes::CANCELLED))
        && history.iter().any(|c| c.kind == StepKind::Compensation)
}
