//! One turn of a run as a pure state machine.
//!
//! A [`Turn`] owns everything a turn knows: the loaded history, the next seq, the calls that
//! are executing or parked, the buffer of the next [`Commit`], the undo stack of a saga, the
//! cancel mode and why the turn stopped. The runtime feeds it one typed call per ctx primitive
//! and does what the answer says; it never decides anything itself.
//!
//! # Call order
//!
//! 1. [`Turn::new`] over the run as claimed and its history.
//! 2. For every ctx call, in program order: [`Turn::take_seq`] synchronously at the call, then
//!    the call's `begin` method when its future is first polled:
//!    [`Turn::begin_step`] / [`Turn::finish_step`] (local steps and undos, with retries),
//!    [`Turn::begin_record`] / [`Turn::finish_record`] (`now`, `random`, `uuid`,
//!    `side_effect`), [`Turn::sleep`], [`Turn::wait`] (signals, events, updates, task
//!    results, with deadlines), [`Turn::spawn_child`] / [`Turn::join_child`],
//!    [`Turn::set_state`], [`Turn::patched`], [`Turn::continue_as_new`], [`Turn::remote_step`].
//!    After [`StepAfter::RetryAt`] the runtime applies its commit (the failed attempt's count),
//!    waits and calls [`Turn::finish_step`] again with the next attempt's result (no second
//!    `begin`); a task checks its name first with
//!    [`Turn::check_name`].
//! 3. An answer that carries a [`Commit`] is applied to the store, and its outcome handed back
//!    with [`Turn::committed`] **before** the workflow sees anything. A commit that creates
//!    runs is first checked with [`Turn::vet_creations`] against the runs the store already
//!    holds with those ids.
//! 4. A call future dropped before it finished (a `select!` loser, the end of the turn) calls
//!    [`Turn::abandon`].
//! 5. Each time the body is `Pending`: [`Turn::on_pending`], which answers [`Pending`]: keep
//!    polling, idle until a time (the body awaits something outside the ctx: poll it again
//!    then and ask again), or a [`Next`]; when it returns: [`Turn::on_body_done`] (or
//!    [`Turn::on_panic`]); while undos run: [`Turn::next_undo`] then [`Turn::on_compensated`].
//!    Each answers with a [`Next`] or an [`End`] carrying its commit.
//!
//! ```text
//!              take_seq + begin_* ──► Return / Fail ─────────────────────► body continues
//!                    │                Run ──► closure ──► finish_* ──► Commit ──► committed ─┘
//!                    │                Park ─────────────────────────────┐
//!                    ▼                                                  ▼
//!   body Pending ─► on_pending: all branches parked? ── yes ─► End::Suspend(commit)
//!                   nothing in flight, nothing parked ─► IdleUntil(t) … still so at t ─► Settle(non_ctx_await)
//!   body Ready ──► on_body_done: Ok ─► End::Settle(completed)
//!                                Err + undos ─► Next::Compensate ─► next_undo* ─► on_compensated
//!                                Err ─► End::Settle(failed)
//!   stopped ─────► Fail ─► Settle(failed) · ContinueAsNew ─► Settle(completed + successor)
//!                  Abort / LeaseLost / Rerun ─► End::Halt
//! ```

mod call;
mod end;
mod replay;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

pub use call::{
    ChildCall, ChildJoin, Deadline, GateCall, RecordBegin, RecordOutcome, RemoteBegin, RemoteCall, SleepBegin,
    StateBegin, StepAfter, StepBegin, StepCall, WaitBegin, WaitCall,
};
pub use end::{End, Halt, Next, Pending, UndoCall};
pub use replay::{ReplayMismatch, Replayed, RunEnd};

use crate::{
    Checkpoint, CheckpointStatus, Commit, CommitOutcome, History, Millis, NonDeterminism, Patched, Payload,
    RetryPolicy, Run, RunStatus, StepError, StepKind, StoreErrorKind, codes, millis_after, protocol,
};

/// Why a turn stopped before the body finished.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnStop {
    /// Fail the run with this error (non-determinism, a bad payload, a corrupt history).
    Fail(StepError),
    /// Complete the run and start its successor with this input and a fresh history.
    ContinueAsNew(Payload, Option<crate::admission::SlotRequest>),
    /// Stop quietly without writing anything more: a store call failed. Retry the run later.
    Abort(String),
    /// Stop quietly: another owner holds the run's lease now.
    LeaseLost(String),
    /// Stop quietly and run a fresh turn at once: the store holds newer facts than this turn
    /// saw (a delivery raced a wait's deadline).
    Rerun(String),
}

/// What the runtime tells the turn about its environment at the start.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnConfig {
    /// The largest payload a turn may write (step outputs, recorded values, state, child
    /// inputs, the run's output).
    pub max_payload_bytes: usize,
    /// Retry delays up to this are waited in memory; longer ones suspend the run durably.
    pub durable_retry_threshold: Duration,
    /// The newest registered version of the run's workflow (a continued run's successor
    /// starts on it).
    pub latest_version: u32,
    /// How long the body may stay pending with nothing in flight and nothing parked — awaiting
    /// something outside the ctx — before the run fails with `non_ctx_await`
    /// ([`Turn::on_pending`]). `Duration::MAX` turns the check off.
    pub non_ctx_await_grace: Duration,
    /// Replay only: check the history against the code without executing or writing anything.
    /// A call history holds no final result for parks for good instead of running (nothing is
    /// recorded, no commit is ever answered), and the turn ends with [`End::Replayed`]: how far
    /// the code matched the history, or how it departs from it. See [`Replayed`].
    pub replay_only: bool,
    /// A run parked on a remote step wakes at least this often to look at its checkpoint
    /// again, so a lost wake heals.
    pub reconcile_interval: Duration,
    /// The lease a step's admission slot takes (the engine renews it with the run's lease).
    pub slot_lease: Duration,
    /// A step waiting for an admission slot asks again at least this often, so a slot whose
    /// holder died is reclaimed even when nothing else calls on the gate.
    pub admission_recheck: Duration,
    /// Sleeps due within this are held in the turn ([`Pending::HoldUntil`]): when every parked
    /// call is a durable sleep, nothing else is live and the earliest is due within it, the
    /// turn commits what it buffered (the sleeps' wake times among it), keeps the run and its
    /// lease, waits on the engine clock and continues, instead of suspending the run and
    /// claiming it again once the timer fires. `Duration::ZERO` (the default) holds none.
    pub hold_sleeps_under: Duration,
}

impl Default for TurnConfig {
    fn default() -> Self {
        TurnConfig {
            max_payload_bytes: 4 * 1024 * 1024,
            durable_retry_threshold: Duration::from_secs(1),
            latest_version: 1,
            non_ctx_await_grace: Duration::from_secs(1),
            replay_only: false,
            reconcile_interval: Duration::from_secs(300),
            slot_lease: Duration::from_secs(30),
            admission_recheck: Duration::from_secs(15),
            hold_sleeps_under: Duration::ZERO,
        }
    }
}

/// Where a call that is executing stands.
#[derive(Debug, Clone, PartialEq)]
enum Flight {
    /// A step attempt (or its in-memory backoff).
    Running,
    /// Its commit is being applied; afterwards it parks until the given time (a durable
    /// backoff) or returns (`None`).
    Committing { then_park: Option<Millis> },
    /// The commit of a failed attempt's count is being applied; afterwards its in-memory
    /// backoff goes on ([`Flight::Running`]).
    CommittingRetry,
}

/// A step between its attempts.
#[derive(Debug, Clone)]
struct Attempts {
    name: String,
    kind: StepKind,
    policy: RetryPolicy,
    undo: bool,
    started_at: Millis,
    last_error: Option<StepError>,
    /// The admission gate the step must pass, and whether it holds a slot there.
    gate: Option<(String, bool)>,
    /// The attempt about to run, once admitted.
    next_attempt: u32,
}

/// An undo registered by a completed step.
#[derive(Debug, Clone, PartialEq)]
struct Undo {
    step_seq: u32,
    name: String,
}

/// Whether the run is being cancelled with compensation, and how far along.
#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Normal,
    /// An operator asked for a cancel with compensation: new calls park until every branch is
    /// parked, then the undos run.
    CancelRequested,
    /// The undos run; `error` is the body's failure (`None` for a cancel).
    Compensating {
        error: Option<StepError>,
    },
}

/// The commit being gathered.
#[derive(Debug, Default)]
struct Buffer {
    checkpoints: Vec<Checkpoint>,
    waits: Vec<crate::Waiter>,
    expire: Vec<u32>,
    state: Vec<(String, Payload)>,
    children: Vec<crate::NewRun>,
    signals: Vec<crate::OutgoingSignal>,
    tasks: Vec<crate::task::NewTask>,
    release_slots: Vec<(String, String)>,
}

impl Buffer {
    fn is_empty(&self) -> bool {
        self.checkpoints.is_empty()
            && self.waits.is_empty()
            && self.expire.is_empty()
            && self.state.is_empty()
            && self.children.is_empty()
            && self.signals.is_empty()
            && self.tasks.is_empty()
            && self.release_slots.is_empty()
    }
}

/// The state of one turn. See the module docs for the call order.
#[derive(Debug)]
pub struct Turn {
    run: Run,
    owner: String,
    config: TurnConfig,
    history: History,
    next_seq: u32,
    buffer: Buffer,
    flights: BTreeMap<u32, Flight>,
    parked: BTreeMap<u32, Option<Millis>>,
    attempts: BTreeMap<u32, Attempts>,
    /// Remote steps asking for an admission slot: the attempt each will dispatch.
    remote_admitting: BTreeMap<u32, u32>,
    undos: Vec<Undo>,
    mode: Mode,
    stop: Option<TurnStop>,
    /// Since when the body has been pending with nothing in flight and nothing parked (it
    /// awaits something outside the ctx); any ctx call beginning or finishing clears it.
    idle_since: Option<Millis>,
    /// When this turn's holds last looked at the run as the store holds it (the first hold's
    /// start counts): see [`Turn::hold_check_due`].
    hold_checked_at: Option<Millis>,
    /// Whether the engine lets the turn hold now ([`Turn::allow_holds`]).
    holds_allowed: bool,
    /// Replay-only: the mismatch that stopped the turn.
    mismatch: Option<NonDeterminism>,
    /// Replay-only: the first call history has no final result for.
    first_fresh: Option<replay::Fresh>,
}

impl Turn {
    /// Starts a turn of `run` (as claimed), held by `owner`, over its loaded `history`.
    ///
    /// With [`TurnConfig::replay_only`], `run` is the run as recorded (its status and output are
    /// what the replay is compared with); a run that was cancelled with compensation replays in
    /// cancel mode, as its last turns ran.
    pub fn new(run: Run, owner: impl Into<String>, history: History, config: TurnConfig) -> Self {
        let cancel_requested = run.error.as_ref().is_some_and(|e| e.code() == Some(codes::CANCEL_REQUESTED))
            || (config.replay_only && replay::cancelled_with_undos(&run, &history));
        Turn {
            run,
            owner: owner.into(),
            config,
            history,
            next_seq: 0,
            buffer: Buffer::default(),
            flights: BTreeMap::new(),
            parked: BTreeMap::new(),
            attempts: BTreeMap::new(),
            remote_admitting: BTreeMap::new(),
            undos: Vec::new(),
            mode: if cancel_requested { Mode::CancelRequested } else { Mode::Normal },
            stop: None,
            idle_since: None,
            hold_checked_at: None,
            holds_allowed: true,
            mismatch: None,
            first_fresh: None,
        }
    }

    /// The run as claimed.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// The configuration the turn was started with.
    pub fn config(&self) -> &TurnConfig {
        &self.config
    }

    /// The history as known to this turn (loaded plus recorded).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Takes the next seq. Call synchronously at the ctx call, so seqs follow call order.
    pub fn take_seq(&mut self) -> u32 {
        self.active();
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// The seq the next call will take.
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Whether the next call replays a recorded result.
    pub fn is_replaying(&self) -> bool {
        self.next_seq < self.history.len()
    }

    /// Why the turn stopped, if it did.
    pub fn stopped(&self) -> Option<&TurnStop> {
        self.stop.as_ref()
    }

    /// Calls executing right now (attempts, in-memory backoffs, commits being applied).
    pub fn in_flight(&self) -> usize {
        self.flights.len()
    }

    /// Calls parked for the rest of the turn, with their wake times.
    pub fn parked(&self) -> impl Iterator<Item = (u32, Option<Millis>)> + '_ {
        self.parked.iter().map(|(s, w)| (*s, *w))
    }

    /// The earliest `wake_at` among parked calls.
    pub fn earliest_wake(&self) -> Option<Millis> {
        self.parked.values().flatten().min().copied()
    }

    /// Whether undos are registered (a failure would compensate).
    pub fn has_undos(&self) -> bool {
        !self.undos.is_empty()
    }

    /// `ctx.patched(id)`: true on runs that reach it fresh (a marker is recorded and a seq
    /// consumed) or recorded it; false on older runs (no seq consumed).
    pub fn patched(&mut self, id: &str, now: Millis) -> bool {
        self.active();
        let seq = self.next_seq;
        match self.history.patched(seq, id) {
            Patched::Old => false,
            Patched::Replayed => {
                self.next_seq += 1;
                true
            }
            Patched::Record => {
                self.next_seq += 1;
                if let Some(problem) = protocol::storage_problem(id) {
                    self.fail_invalid_name(format!(
                        "ctx.patched at seq {seq} is named {}: {problem}; name patches without control \
                         characters, in at most {} bytes",
                        protocol::shown(id),
                        protocol::MAX_NAME_BYTES
                    ));
                    return false;
                }
                if self.config.replay_only {
                    self.fresh(seq, id, StepKind::Patch);
                } else {
                    let cp = self.checkpoint(seq, id, StepKind::Patch, CheckpointStatus::Completed, now, now);
                    self.record(cp);
                }
                true
            }
        }
    }

    /// `ctx.deprecate_patch(id)`, the last stage of a patch's life: the code no longer branches
    /// on it. Runs that reach it fresh still record the marker and consume a seq (so code that
    /// still calls `patched(id)` — an older binary during a rollout, or a rollback — replays
    /// them on the new path); a history with the marker at this seq consumes it; a history
    /// with something else there (a run that passed this point before the patch existed)
    /// carries on without consuming a seq.
    pub fn deprecate_patch(&mut self, id: &str, now: Millis) {
        self.patched(id, now);
    }

    /// A call future was dropped before it finished (a `select!` loser, or the body dropped
    /// at the end of the turn): it no longer executes or waits.
    pub fn abandon(&mut self, seq: u32) {
        self.active();
        self.flights.remove(&seq);
        self.parked.remove(&seq);
        self.remote_admitting.remove(&seq);
        if let Some(a) = self.attempts.remove(&seq) {
            self.release_slot_of(seq, a.gate);
        }
    }

    /// The outcome of applying a commit an answer for `seq` carried. Returns whether the call
    /// goes on: `false` when the turn must stop (the store refused the commit, or a delivery
    /// raced the wait's deadline); the call then halts and the end of the turn says why.
    pub fn committed(&mut self, seq: u32, outcome: Result<&CommitOutcome, (StoreErrorKind, String)>) -> bool {
        self.active();
        let flight = self.flights.remove(&seq);
        match outcome {
            Ok(o) if o.raced.contains(&seq) => {
                self.stop(TurnStop::Rerun(format!("a delivery raced the deadline of the wait at seq {seq}")));
                false
            }
            Ok(_) => {
                match flight {
                    Some(Flight::Committing { then_park: Some(at) }) => {
                        self.parked.insert(seq, Some(at));
                    }
                    Some(Flight::CommittingRetry) => {
                        self.flights.insert(seq, Flight::Running);
                    }
                    _ => {}
                }
                self.stop.is_none()
            }
            Err((kind, message)) => self.commit_failed(kind, &message),
        }
    }

    /// A commit failed: the turn stops (the lease lost to another owner, or the store's
    /// failure); `false`.
    fn commit_failed(&mut self, kind: StoreErrorKind, message: &str) -> bool {
        self.stop(match kind {
            StoreErrorKind::LeaseLost => TurnStop::LeaseLost(format!("commit refused: {message}")),
            _ => TurnStop::Abort(format!("commit failed: {message}")),
        });
        false
    }

    /// A recorded value no longer decodes into the type the workflow asks for: the run fails
    /// naming the seq, and what to do if the code changed the type.
    pub fn fail_decode(&mut self, seq: u32, name: &str, error: &str) {
        let message = format!(
            "run {}: the value recorded at seq {seq} ({name:?}) does not decode into the type the workflow asks for: \
             {error}; if the workflow code changed that type, runs started before need the old code (register \
             the change as a new workflow version, or branch with ctx.patched)",
            self.run.id
        );
        self.stop(TurnStop::Fail(StepError::fatal(message).with_code(codes::BAD_PAYLOAD)));
    }

    /// Whether this turn, as it suspends, may be kept in memory and continued by
    /// [`Turn::resume`] at the run's next claim: nothing is executing, buffered or asking for
    /// a slot, the turn did not stop, no cancel is pending and no undo runs, it is not a
    /// replay-only turn, and no child it spawned is still unsettled. A child's settle rewrites
    /// its spawn's seq, which no parked call looks at while the child is not joined (a join
    /// parks for good): a resumed turn, whose claim reads from the lowest parked seq on, would
    /// never see it, so such a turn replays.
    pub fn can_resume(&self) -> bool {
        self.stop.is_none()
            && self.flights.is_empty()
            && self.attempts.is_empty()
            && self.remote_admitting.is_empty()
            && self.buffer.is_empty()
            && self.mode == Mode::Normal
            && !self.config.replay_only
            && !self.history.iter().any(|cp| cp.kind == StepKind::Child && !cp.is_final())
    }

    /// Continues a suspended turn kept in memory ([`Turn::can_resume`]) for a new claim of its
    /// run: `run` as that claim returned it, `checkpoints` what the store holds from the lowest
    /// seq a parked call looks at on (what deliveries recorded since the suspension).
    ///
    /// Returns the seqs that were parked: their calls must begin again, and each then decides
    /// exactly as a replay of that seq over the store's history would. Returns `None`, and
    /// changes nothing, when the store's answer is not this turn's history plus deliveries to
    /// its parked calls — a checkpoint at or past the next seq, or one that differs from what
    /// the turn knows at a seq that is not parked — or the run carries an error (a cancel
    /// request), or is not this turn's run (another id, or the same id on a run created
    /// since: deleted, then started again): the caller then builds a fresh turn over the
    /// whole history (a replay).
    pub fn resume(&mut self, run: Run, checkpoints: Vec<Checkpoint>) -> Option<Vec<u32>> {
        let same_run = run.id == self.run.id
            && run.created_at == self.run.created_at
            && (run.workflow.as_str(), run.version) == (self.run.workflow.as_str(), self.run.version);
        if !self.can_resume() || run.error.is_some() || !same_run {
            return None;
        }
        let foreign = checkpoints.iter().any(|cp| {
            cp.seq >= self.next_seq || (!self.parked.contains_key(&cp.seq) && self.history.get(cp.seq) != Some(cp))
        });
        if foreign {
            return None;
        }
        self.run = run;
        for cp in checkpoints {
            self.history.record(cp);
        }
        self.idle_since = None;
        // The claim just read the run: holds look at it again a full limit from the next one.
        self.hold_checked_at = None;
        Some(std::mem::take(&mut self.parked).into_keys().collect())
    }

    /// The commit of a held sleep ([`Pending::HoldUntil`]) was applied (`Ok`) or failed: whether
    /// the hold goes on. A refused lease or a store failure stops the turn, as for any commit.
    pub fn hold_committed(&mut self, outcome: Result<&CommitOutcome, (StoreErrorKind, String)>) -> bool {
        match outcome {
            Ok(o) if !o.raced.is_empty() => {
                self.stop(TurnStop::Rerun(format!("a delivery raced the deadline of the wait at seq {:?}", o.raced)));
                false
            }
            Ok(_) => self.stop.is_none(),
            Err((kind, message)) => self.commit_failed(kind, &message),
        }
    }

    /// A held sleep is due ([`Pending::HoldUntil`]): every parked call begins again, as after
    /// [`Turn::resume`] (those due return, the others park again).
    pub fn end_hold(&mut self) {
        self.parked.clear();
        self.idle_since = None;
    }

    /// Whether a held sleep that is due at `now` reads the run first ([`Turn::hold_checked`]):
    /// once [`TurnConfig::hold_sleeps_under`] has passed since the last look (the start of
    /// the turn's first hold, or of the first after a resume, counts as one). A cancel without
    /// compensation, a deletion or another owner make the next commit fail anyway; a cancel
    /// with compensation only marks the run, which a turn that does not suspend sees by this
    /// read alone: at the first hold ending a full limit after the last look, so within about
    /// twice the limit of the holds' start.
    pub fn hold_check_due(&self, now: Millis) -> bool {
        self.hold_checked_at.is_none_or(|at| now >= millis_after(at, self.config.hold_sleeps_under))
    }

    /// Checks the run as the store holds it once a held sleep is due (`None`: it is gone):
    /// whether the hold may end with the body going on. A turn that does not suspend never
    /// sees what the store learnt meanwhile without a read: an operator's cancel (with
    /// compensation: an error on the run; without: the run settled) or another owner. Then
    /// the turn stops ([`TurnStop::Rerun`]) and a fresh claim acts on what the store holds.
    pub fn hold_checked(&mut self, run: Option<&Run>, now: Millis) -> bool {
        self.hold_checked_at = Some(now);
        let changed = match run {
            None => Some("it was deleted".to_string()),
            Some(r) if r.status != RunStatus::Running => Some(format!("it is {}", r.status.as_str())),
            Some(r) if r.lease_owner.as_deref() != Some(self.owner.as_str()) => Some("another owner holds it".into()),
            Some(r) if r.error.as_ref().is_some_and(|e| e.code() == Some(codes::CANCEL_REQUESTED)) => {
                Some("a cancel with compensation was asked".into())
            }
            Some(_) => None,
        };
        match changed {
            Some(why) => {
                self.stop(TurnStop::Rerun(format!("run {} changed during a held sleep: {why}", self.run.id)));
                false
            }
            None => self.stop.is_none(),
        }
    }

    /// Whether the engine lets the turn hold its sleeps right now (not while it drains or
    /// stops, nor with no free execution slot): asked before each [`Turn::on_pending`]; while
    /// not, the turn suspends where it would have held.
    pub fn allow_holds(&mut self, allowed: bool) {
        self.holds_allowed = allowed;
    }

    /// Stops the turn; the first reason given wins.
    pub fn stop(&mut self, reason: TurnStop) {
        if self.stop.is_none() {
            self.stop = Some(reason);
        }
    }

    // ---- internals shared by the call and end modules ----

    /// A ctx call began, finished or was dropped: the body is not idle (see
    /// [`Turn::on_pending`]).
    fn active(&mut self) {
        self.idle_since = None;
    }

    fn checkpoint(
        &self,
        seq: u32,
        name: impl Into<String>,
        kind: StepKind,
        status: CheckpointStatus,
        started_at: Millis,
        now: Millis,
    ) -> Checkpoint {
        let mut cp = Checkpoint::new(self.run.id.clone(), seq, name, kind, status, started_at);
        cp.updated_at = now;
        cp
    }

    /// Buffers a checkpoint for the next commit and makes it part of this turn's history.
    fn record(&mut self, cp: Checkpoint) {
        if let Some(slot) = self.buffer.checkpoints.iter_mut().find(|b| b.seq == cp.seq) {
            *slot = cp.clone();
        } else {
            self.buffer.checkpoints.push(cp.clone());
        }
        self.history.record(cp);
    }

    /// A commit of everything buffered (no turn end).
    fn drain(&mut self, now: Millis) -> Commit {
        let b = std::mem::take(&mut self.buffer);
        let mut c = Commit::new(self.run.id.clone(), self.owner.clone(), now);
        c.checkpoints = b.checkpoints;
        c.waits = b.waits;
        c.expire_waits = b.expire;
        c.state = b.state;
        c.children = b.children;
        c.signals = b.signals;
        c.tasks = b.tasks;
        c.release_slots = b.release_slots;
        c
    }

    /// Buffers the release of the slot the step at `seq` holds (if it holds one).
    fn release_slot_of(&mut self, seq: u32, gate: Option<(String, bool)>) {
        if let Some((gate, true)) = gate {
            self.buffer.release_slots.push((gate, protocol::step_id(&self.run.id, seq)));
        }
    }

    /// A commit of everything buffered, applied while `seq` stays in flight.
    fn commit_for(&mut self, seq: u32, then_park: Option<Millis>, now: Millis) -> Commit {
        self.flights.insert(seq, Flight::Committing { then_park });
        self.drain(now)
    }

    /// [`Turn::commit_for`] a failed attempt whose backoff is waited in memory: `seq` stays
    /// in flight, and executes again after the wait.
    fn commit_for_retry(&mut self, seq: u32, now: Millis) -> Commit {
        self.flights.insert(seq, Flight::CommittingRetry);
        self.drain(now)
    }

    fn park(&mut self, seq: u32, wake_at: Option<Millis>) {
        self.parked.insert(seq, wake_at);
    }

    fn too_large(&self, payload: &Payload) -> bool {
        payload.len() > self.config.max_payload_bytes
    }
}

/// The answers of the end-of-turn calls as one value, so tests compare whole answers.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
enum Ended {
    /// Not an end: [`Pending::IdleUntil`].
    Idle(Millis),
    /// Not an end: [`Pending::HoldUntil`].
    Hold {
        commit: Option<Commit>,
        until: Millis,
    },
    Suspend {
        commit: Commit,
        wake_at: Option<Millis>,
    },
    Settle {
        commit: Commit,
        status: crate::RunStatus,
    },
    Compensate,
    Stop(TurnStop),
    Replayed(Result<Replayed, ReplayMismatch>),
}

#[cfg(test)]
impl From<End> for Ended {
    fn from(end: End) -> Self {
        match end {
            End::Suspend { commit, wake_at } => Ended::Suspend { commit, wake_at },
            End::Settle { commit, status } => Ended::Settle { commit, status },
            End::Halt(Halt::Abort(why)) => Ended::Stop(TurnStop::Abort(why)),
            End::Halt(Halt::LeaseLost(why)) => Ended::Stop(TurnStop::LeaseLost(why)),
            End::Halt(Halt::Rerun(why)) => Ended::Stop(TurnStop::Rerun(why)),
            End::Replayed(r) => Ended::Replayed(r),
        }
    }
}

#[cfg(test)]
impl From<Next> for Ended {
    fn from(next: Next) -> Self {
        match next {
            Next::Compensate => Ended::Compensate,
            Next::End(end) => end.into(),
        }
    }
}

#[cfg(test)]
impl Turn {
    /// `None` for [`Pending::KeepPolling`].
    fn t_pending(&mut self, now: Millis) -> Option<Ended> {
        match self.on_pending(now) {
            Pending::KeepPolling => None,
            Pending::IdleUntil(at) => Some(Ended::Idle(at)),
            Pending::HoldUntil { commit, until } => Some(Ended::Hold { commit, until }),
            Pending::Next(next) => Some(next.into()),
        }
    }
    fn t_body_done(&mut self, result: Result<Payload, StepError>, now: Millis) -> Ended {
        self.on_body_done(result, now).into()
    }
    fn t_compensated(&mut self, now: Millis) -> Ended {
        self.on_compensated(now).into()
    }
    fn t_panic(&mut self, message: &str, now: Millis) -> Ended {
        self.on_panic(message, now).into()
    }
    fn t_fail(&mut self, error: StepError, now: Millis) -> Ended {
        self.fail(error, now).into()
    }
}
