//! The end of a turn: suspend, settle, compensate, continue as new, or stop.

// Answers carrying a `Commit` are returned once per call and destructured at once; boxing the
// commit would cost an allocation per step for nothing.
#![allow(clippy::large_enum_variant)]

use super::replay::{EndedBy, ReplayMismatch, Replayed};
use super::{Mode, Turn, TurnStop};
use crate::admission::SlotRequest;
use crate::protocol;
use crate::{
    CheckpointStatus, Commit, Millis, NewRun, Payload, RetryPolicy, Run, RunStatus, StepError, StepKind, TurnEnd,
    codes, millis_after,
};

/// What follows a `Pending` or finished body.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Drop the body and run the registered undos: [`Turn::next_undo`] until `None`, each as a
    /// step, then [`Turn::on_compensated`].
    Compensate,
    /// The turn ends.
    End(End),
}

/// The answer of [`Turn::on_pending`].
#[derive(Debug, Clone, PartialEq)]
pub enum Pending {
    /// Keep polling: a call is executing (a step attempt, its in-memory backoff, a commit being
    /// applied) and its future wakes the body when it is done; or undos run.
    KeepPolling,
    /// Nothing is executing and nothing is parked: the body awaits something outside the ctx
    /// (a `tokio::time::sleep`, a channel, an HTTP call). Keep polling, and poll the body again
    /// at this time on the engine clock even if nothing wakes it: asked again then, the turn
    /// fails the run with `non_ctx_await` if the body is still idle. Any ctx call in between
    /// starts the wait afresh.
    IdleUntil(Millis),
    /// Every parked call is a durable sleep, nothing else is live, and the earliest is due
    /// within [`TurnConfig::hold_sleeps_under`](super::TurnConfig): apply `commit` if there is
    /// one (what the turn buffered, the sleeps' wake times among it; the run stays running
    /// under its lease) and hand its outcome to [`Turn::hold_committed`], before anything
    /// else of the turn; wait on the engine clock until `until`, read the run for
    /// [`Turn::hold_checked`] when [`Turn::hold_check_due`], then call [`Turn::end_hold`] and
    /// poll the body again. Asked again meanwhile (the same answer, without a commit), keep
    /// waiting; any other answer drops the wait.
    HoldUntil {
        /// What the turn buffered, to apply before the wait (`None`: nothing new).
        commit: Option<Commit>,
        /// When the earliest sleep is due.
        until: Millis,
    },
    /// What follows.
    Next(Next),
}

/// Why a turn stops without writing anything more; the run's durable state decides what
/// follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Halt {
    /// A store call failed: retry the run later.
    Abort(String),
    /// Another owner holds the run's lease now: leave it.
    LeaseLost(String),
    /// The store holds newer facts than this turn saw: run a fresh turn at once.
    Rerun(String),
}

/// How a turn ends. Each commit-carrying variant is applied as one store call.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// Every live branch is parked: apply `commit` (`suspended`, the earliest wake time, the
    /// lease released), then drop the body.
    Suspend {
        /// The suspension commit.
        commit: Commit,
        /// When a parked timer is due.
        wake_at: Option<Millis>,
    },
    /// Apply `commit`, which settles the run as `status` (a child tells its parent in it; a
    /// continued run's successor is created in it).
    Settle {
        /// The settling commit.
        commit: Commit,
        /// The status it settles to.
        status: RunStatus,
    },
    /// Stop without writing anything more.
    Halt(Halt),
    /// A replay-only turn ([`TurnConfig::replay_only`](super::TurnConfig::replay_only)) ended:
    /// how far the code matched the recorded history, or how it departs from it. Nothing is
    /// written.
    Replayed(Result<Replayed, ReplayMismatch>),
}

/// An undo to run as a step (kind [`StepKind::Compensation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoCall {
    /// The seq of the step whose undo this is (the runtime keeps its closure by it).
    pub step_seq: u32,
    /// The seq the undo runs at.
    pub seq: u32,
    /// Its checkpoint name ([`protocol::undo_name`]).
    pub name: String,
}

impl UndoCall {
    /// The undo as a step call with `policy`.
    pub fn step_call<'a>(&'a self, policy: &'a RetryPolicy) -> super::StepCall<'a> {
        super::StepCall { name: &self.name, kind: StepKind::Compensation, policy, undo: false, gate: None }
    }
}

impl Turn {
    /// The body returned `Pending`. Ends the turn when it stopped, or when every live branch
    /// is parked (suspend; compensate if a cancel with compensation is pending); keeps polling
    /// while a call is executing.
    ///
    /// With nothing executing and nothing parked, the body awaits something outside the ctx,
    /// which replay cannot see: the answer is [`Pending::IdleUntil`] the time the idleness
    /// began plus [`TurnConfig::non_ctx_await_grace`](super::TurnConfig). Asked again at or
    /// after that time with the body still idle (no ctx call began, finished or was dropped
    /// since), the run settles `failed` with code `non_ctx_await` — no undos run: the body is
    /// stuck in code the engine cannot see, as after a panic — or, while a cancel with
    /// compensation is pending, the undos run as the operator asked. Undos themselves never
    /// count as idle.
    pub fn on_pending(&mut self, now: Millis) -> Pending {
        if self.stop.is_some() {
            return Pending::Next(Next::End(self.on_stop(now)));
        }
        if !self.flights.is_empty() {
            self.active();
            return Pending::KeepPolling;
        }
        if self.parked.is_empty() {
            return self.idle(now);
        }
        if self.mode == Mode::CancelRequested {
            return Pending::Next(self.compensate_cancel());
        }
        if self.config.replay_only {
            return Pending::Next(Next::End(self.replay_parked()));
        }
        if let Some(until) = self.hold_until(now) {
            self.hold_checked_at.get_or_insert(now);
            let commit = (!self.buffer.is_empty()).then(|| self.drain(now));
            return Pending::HoldUntil { commit, until };
        }
        let wake_at = self.earliest_wake();
        let mut commit = self.drain(now);
        commit.end = Some(TurnEnd::Suspend { wake_at, seen_wake_gen: self.run.wake_gen });
        Pending::Next(Next::End(End::Suspend { commit, wake_at }))
    }

    /// When to end a hold ([`Pending::HoldUntil`]), if the turn holds: every parked call is a
    /// durable sleep (its checkpoint `waiting`: no wait for a delivery, which the store would
    /// hold while the turn does not look), and the earliest is due within
    /// [`TurnConfig::hold_sleeps_under`](super::TurnConfig).
    fn hold_until(&self, now: Millis) -> Option<Millis> {
        let limit = self.config.hold_sleeps_under;
        // A step between attempts or asking for a slot is live too: it is not a sleep.
        if limit.is_zero()
            || !self.holds_allowed
            || self.mode != Mode::Normal
            || !self.attempts.is_empty()
            || !self.remote_admitting.is_empty()
        {
            return None;
        }
        let mut earliest = Millis::MAX;
        for (seq, wake_at) in &self.parked {
            let cp = self.history.get(*seq)?;
            if cp.kind != StepKind::Sleep || cp.name != "sleep" || cp.status != CheckpointStatus::Waiting {
                return None;
            }
            earliest = earliest.min((*wake_at)?);
        }
        (earliest <= millis_after(now, limit)).then_some(earliest)
    }

    /// The body is pending with nothing in flight and nothing parked.
    fn idle(&mut self, now: Millis) -> Pending {
        if matches!(self.mode, Mode::Compensating { .. }) {
            return Pending::KeepPolling;
        }
        let since = *self.idle_since.get_or_insert(now);
        let grace = self.config.non_ctx_await_grace;
        let until = millis_after(since, grace);
        if until == Millis::MAX {
            // An unbounded grace: the check is off.
            return Pending::KeepPolling;
        }
        if now < until {
            return Pending::IdleUntil(until);
        }
        if self.mode == Mode::CancelRequested {
            return Pending::Next(self.compensate_cancel());
        }
        let at = match self.next_seq {
            0 => "before its first ctx call".to_string(),
            n => format!("after its ctx call at seq {}", n - 1),
        };
        let message = format!(
            "run {}: the workflow body has awaited something outside its WorkflowCtx for {grace:?} ({at}), with \
             no ctx call executing or parked — a tokio::time::sleep, a channel receive, an HTTP call? Replay \
             cannot see such an await. Move it into a ctx.step (its result is checkpointed), or use ctx.sleep, \
             ctx.wait_for_signal or ctx.wait_for_event instead",
            self.run.id
        );
        let error = StepError::fatal(message).with_code(codes::NON_CTX_AWAIT);
        Pending::Next(Next::End(self.end(RunStatus::Failed, None, Some(error), EndedBy::Engine, now)))
    }

    /// A cancel with compensation takes effect: the body is dropped and the undos run.
    fn compensate_cancel(&mut self) -> Next {
        self.mode = Mode::Compensating { error: None };
        self.parked.clear();
        Next::Compensate
    }

    /// The body returned. A failure with undos registered, or a failure while a cancel with
    /// compensation is pending, compensates; otherwise the run settles (a body that returns
    /// `Ok` while a cancel is pending finished first: it completes).
    pub fn on_body_done(&mut self, result: Result<Payload, StepError>, now: Millis) -> Next {
        if self.stop.is_some() {
            return Next::End(self.on_stop(now));
        }
        let end = match result {
            Err(e) if self.mode == Mode::CancelRequested || !self.undos.is_empty() => {
                let error = if self.mode == Mode::CancelRequested { None } else { Some(e) };
                self.mode = Mode::Compensating { error };
                self.parked.clear();
                self.flights.clear();
                return Next::Compensate;
            }
            Err(e) => self.end(RunStatus::Failed, None, Some(e), EndedBy::Body, now),
            Ok(output) if self.too_large(&output) => {
                let error = self.payload_too_large("the output", output.len());
                self.end(RunStatus::Failed, None, Some(error), EndedBy::Engine, now)
            }
            Ok(output) => self.end(RunStatus::Completed, Some(output), None, EndedBy::Body, now),
        };
        Next::End(end)
    }

    /// The body panicked: the run fails (no undos run: the body's state is unknown).
    pub fn on_panic(&mut self, message: &str, now: Millis) -> End {
        if self.stop.is_some() {
            return self.on_stop(now);
        }
        let error = StepError::fatal(format!("run {}: the workflow body panicked: {message}", self.run.id))
            .with_code(codes::PANIC);
        self.end(RunStatus::Failed, None, Some(error), EndedBy::Engine, now)
    }

    /// The run cannot start (its input does not decode): it fails with `error`.
    pub fn fail(&mut self, error: StepError, now: Millis) -> End {
        self.stop(TurnStop::Fail(error));
        self.on_stop(now)
    }

    /// The next undo to run, newest first, at a fresh seq; `None` when all have run.
    pub fn next_undo(&mut self) -> Option<UndoCall> {
        let undo = self.undos.pop()?;
        let seq = self.take_seq();
        Some(UndoCall { step_seq: undo.step_seq, seq, name: protocol::undo_name(&undo.name) })
    }

    /// Every undo ran (a failed undo is recorded and skipped): the run settles `failed` with
    /// the body's error, or `cancelled` after a cancel with compensation.
    pub fn on_compensated(&mut self, now: Millis) -> End {
        if self.stop.is_some() {
            return self.on_stop(now);
        }
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Compensating { error: Some(error) } => {
                self.end(RunStatus::Failed, None, Some(error), EndedBy::Body, now)
            }
            _ => {
                let error =
                    StepError::fatal(format!("run {} was cancelled by an operator; its undos ran", self.run.id))
                        .with_code(codes::CANCELLED);
                self.end(RunStatus::Cancelled, None, Some(error), EndedBy::Body, now)
            }
        }
    }

    fn on_stop(&mut self, now: Millis) -> End {
        if self.config.replay_only {
            return self.replay_stopped();
        }
        match self.stop.clone() {
            Some(TurnStop::Fail(error)) => self.settle(RunStatus::Failed, None, Some(error), now),
            Some(TurnStop::ContinueAsNew(input, admission)) => self.continue_as_new_commit(input, admission, now),
            Some(TurnStop::Abort(why)) => End::Halt(Halt::Abort(why)),
            Some(TurnStop::LeaseLost(why)) => End::Halt(Halt::LeaseLost(why)),
            Some(TurnStop::Rerun(why)) => End::Halt(Halt::Rerun(why)),
            None => End::Halt(Halt::Abort("the turn ended without a reason".into())),
        }
    }

    /// The run ends as `status`: a replay-only turn compares that with the recorded end, any
    /// other settles the run.
    fn end(
        &mut self,
        status: RunStatus,
        output: Option<Payload>,
        error: Option<StepError>,
        by: EndedBy,
        now: Millis,
    ) -> End {
        if self.config.replay_only {
            return self.replay_end(status, output, error, by);
        }
        // A body that returned without asking for calls history recorded is not the code that
        // made them: the run fails as a call that differs from history fails it.
        if by == EndedBy::Body
            && let Some(mismatch) = self.not_asked()
        {
            let error = StepError::fatal(mismatch.to_string()).with_code(codes::NON_DETERMINISM);
            return self.settle(RunStatus::Failed, None, Some(error), now);
        }
        self.settle(status, output, error, now)
    }

    /// Settles the run; a child tells its parent in the same commit.
    fn settle(&mut self, status: RunStatus, output: Option<Payload>, error: Option<StepError>, now: Millis) -> End {
        let mut commit = self.drain(now);
        commit.signals.extend(protocol::child_notice(&self.run, status, output.clone(), error.clone()));
        commit.end = Some(TurnEnd::Settle { status, output, error });
        End::Settle { commit, status }
    }

    /// Checks the runs `commit` creates against the runs that already hold those ids (read from
    /// the store just before it is applied): a create is idempotent by id, so an unrelated run
    /// with the id would silently stand in for the one meant. A child whose id another run
    /// holds is not started — its call fails with `child_failed` — unless that run is this
    /// call's own child (re-created after an operator's retry). A continued run whose
    /// successor id is taken fails with `id_taken` instead of completing, unless the run there
    /// is the successor exactly as this continuation creates it (same workflow, input and
    /// parent). Returns the commit
    /// to apply; when a join is already parked on a child that was not started, the turn stops
    /// with [`TurnStop::Rerun`] (run it again once the commit is applied).
    pub fn vet_creations(&mut self, mut commit: Commit, existing: &[Run], now: Millis) -> Commit {
        let mut keep = Vec::with_capacity(commit.children.len());
        for new in std::mem::take(&mut commit.children) {
            let Some(run) = existing.iter().find(|r| r.id == new.id) else {
                keep.push(new);
                continue;
            };
            match &new.parent {
                Some(link) if link.run_id == self.run.id => {
                    if run.parent.as_ref() == Some(link) {
                        keep.push(new);
                        continue;
                    }
                    let seq = link.seq;
                    let message = format!(
                        "child run {} was not started: that id belongs to an existing run of workflow {:?} that is not \
                         the child at seq {seq} of run {}; give the child another id (ChildOptions::id)",
                        new.id, run.workflow, self.run.id
                    );
                    let error = StepError::fatal(message).with_code(codes::CHILD_FAILED);
                    commit.waits.retain(|w| w.seq != seq);
                    if let Some(cp) = commit.checkpoints.iter_mut().find(|c| c.seq == seq) {
                        cp.status = crate::CheckpointStatus::Failed;
                        cp.error = Some(error);
                        cp.updated_at = now;
                        self.history.record(cp.clone());
                    }
                    // A join already parked on the child (or a turn ending now, whose joins were
                    // dropped) would wait forever: once this commit is applied, the run runs
                    // again and the join reads the failure.
                    let ending = matches!(commit.end, Some(TurnEnd::Suspend { .. }));
                    if self.parked.remove(&seq).is_some() || ending {
                        self.stop(TurnStop::Rerun(format!("the child at seq {seq} could not be started")));
                    }
                }
                // The successor exactly as this continuation would create it (same workflow,
                // input and parent) is this chain's own: nothing else would have made it.
                _ if run.workflow == new.workflow && run.input == new.input && run.parent == new.parent => {
                    keep.push(new);
                }
                _ => {
                    let message = format!(
                        "run {} could not continue as new: its successor id {} is taken by an existing run of \
                         workflow {:?} that this chain did not create; retry it, or start the next run yourself",
                        self.run.id, new.id, run.workflow
                    );
                    let error = StepError::fatal(message).with_code(codes::ID_TAKEN);
                    commit.signals.extend(protocol::child_notice(
                        &self.run,
                        RunStatus::Failed,
                        None,
                        Some(error.clone()),
                    ));
                    commit.end = Some(TurnEnd::Settle { status: RunStatus::Failed, output: None, error: Some(error) });
                }
            }
        }
        commit.children = keep;
        commit
    }

    /// Completes the run with a marker naming its successor and creates the successor — same
    /// workflow (newest version), namespace, tags, priority and parent — in the same commit.
    fn continue_as_new_commit(&mut self, input: Payload, admission: Option<SlotRequest>, now: Millis) -> End {
        let successor = protocol::successor_id(&self.run.id);
        let mut commit = self.drain(now);
        commit.children.push(NewRun {
            admission,
            id: successor.clone(),
            workflow: self.run.workflow.clone(),
            version: self.config.latest_version,
            namespace: self.run.namespace.clone(),
            input,
            tags: self.run.tags.clone(),
            priority: self.run.priority,
            parent: self.run.parent.clone(),
            created_at: now,
            start_at: None,
            trace_context: self.run.trace_context.clone(),
        });
        commit.end = Some(TurnEnd::Settle {
            status: RunStatus::Completed,
            output: Some(protocol::continued_marker(&successor)),
            error: None,
        });
        End::Settle { commit, status: RunStatus::Completed }
    }
}
