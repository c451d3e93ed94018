//! The turn: the [`WorkflowCtx`] a body uses and the driver that polls it. Every decision —
//! replay or execute, retry or park, suspend or settle — is taken by `durable-core`'s pure
//! [`Turn`]; this module only runs closures, awaits commits, parks futures and wakes them.
//!
//! The turn talks to the rest of the engine through [`TurnEnv`] alone (the clock, the commit,
//! events, the registry's newest versions), never through the engine's shared state.

mod child;
mod ctx;
mod driver;
mod env;
mod remote;
mod replay;
mod wait;

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

pub use child::{ChildFailed, ChildHandle, ChildOptions};
pub(crate) use ctx::Compensation;
pub use ctx::{All, Step, StepContext, StepOptions, WorkflowCtx};
pub(crate) use driver::TurnDriver;
pub(crate) use env::{NewRunKey, TurnEnv};
pub use remote::RemoteStep;
pub(crate) use replay::replay_turn;
pub use wait::{SignalError, TaskError, UpdateOutcome};

use durable_core::admission::{Admission, SlotRequest};
use durable_core::{Commit, Millis, Payload, Run, RunId, StoreResult, Turn};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;

use crate::events::EngineEvent;

/// The state one turn shares between its `WorkflowCtx` clones and the driver.
pub(crate) struct TurnState {
    pub(crate) run: Run,
    pub(crate) turn: Mutex<Turn>,
    env: Arc<dyn TurnEnv>,
    /// The closures of registered undos, by the seq of the step that registered them (the
    /// core keeps their order).
    undos: Mutex<HashMap<u32, Compensation>>,
    /// The store acknowledged a commit of this turn that carried a checkpoint (a step result,
    /// a recorded value, a wait, a sleep, …): the turn got somewhere.
    checkpointed: AtomicBool,
    /// The waker of the task polling the driver, as of its last poll: an [`interrupt`]
    /// from outside the turn wakes it so the driver asks the core at once.
    ///
    /// [`interrupt`]: TurnState::interrupt
    driver: Mutex<Option<Waker>>,
    /// Calls parked so that a warm resume ([`TurnState::resume`]) can wake them, by seq.
    /// Calls parked otherwise never resolve, so a turn with one is not kept warm.
    warm_parked: Mutex<HashMap<u32, ParkedCall>>,
    /// How many times the turn was resumed warm: a parked call whose count moved begins again.
    resumes: AtomicU64,
    /// The turn waits out a held sleep ([`TurnState::hold_wait`]) and no caller waiting for a
    /// slot asked it to give its own up yet ([`TurnState::take_holding`]).
    holding: AtomicBool,
}

/// A turn's wait for a held sleep, counted by the engine ([`TurnEnv::hold_began`]) while it
/// lasts (the wait may be dropped half-way: the driver drops it when it stops holding).
struct Holding<'a> {
    turn: &'a TurnState,
    /// A run waited for a slot when the wait began.
    slot_wanted: bool,
}

impl<'a> Holding<'a> {
    fn begin(turn: &'a TurnState) -> Self {
        turn.holding.store(true, Ordering::SeqCst);
        let slot_wanted = turn.env.hold_began();
        Holding { turn, slot_wanted }
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.turn.holding.store(false, Ordering::SeqCst);
        self.turn.env.hold_ended();
    }
}

impl TurnState {
    pub(crate) fn new(turn: Turn, env: Arc<dyn TurnEnv>) -> Self {
        TurnState {
            run: turn.run().clone(),
            turn: Mutex::new(turn),
            env,
            undos: Mutex::new(HashMap::new()),
            checkpointed: AtomicBool::new(false),
            driver: Mutex::new(None),
            warm_parked: Mutex::new(HashMap::new()),
            resumes: AtomicU64::new(0),
            holding: AtomicBool::new(false),
        }
    }

    /// If this turn, which just suspended, can be kept in memory and resumed warm: the core
    /// says so ([`Turn::can_resume`]) and every parked call is parked so that a resume wakes
    /// it. Returns the lowest seq the parked calls look at (what the next claim must read).
    pub(crate) fn warm_from(&self) -> Option<u32> {
        let turn = self.turn.lock();
        if !turn.can_resume() {
            return None;
        }
        let warm = self.warm_parked.lock();
        let mut from: Option<u32> = None;
        for (seq, _) in turn.parked() {
            let lowest = warm.get(&seq)?.lowest;
            from = Some(from.map_or(lowest, |f| f.min(lowest)));
        }
        from
    }

    /// The signal tokens the turn's parked calls wait on (what a signal sent by this engine
    /// may claim the run for: [`Store::send_signal_and_claim`](durable_core::Store::send_signal_and_claim)).
    pub(crate) fn parked_tokens(&self) -> Vec<String> {
        let turn = self.turn.lock();
        let warm = self.warm_parked.lock();
        turn.parked().filter_map(|(seq, _)| warm.get(&seq)?.token.clone()).collect()
    }

    /// Resumes the suspended turn for a new claim of its run (see [`Turn::resume`]): the core
    /// takes the run and the checkpoints read from the lowest parked seq on, and every parked
    /// call is woken to begin again. `false` (nothing changed): the store's answer is not this
    /// turn's history plus deliveries; replay instead.
    pub(crate) fn resume(&self, run: Run, checkpoints: Vec<durable_core::Checkpoint>) -> bool {
        if self.turn.lock().resume(run, checkpoints).is_none() {
            return false;
        }
        self.checkpointed.store(false, Ordering::Relaxed);
        self.wake_parked();
        true
    }

    /// Wakes every call parked for a warm resume to begin again.
    fn wake_parked(&self) {
        self.resumes.fetch_add(1, Ordering::AcqRel);
        let parked: Vec<_> = self.warm_parked.lock().drain().filter_map(|(_, call)| call.waker).collect();
        for waker in parked {
            waker.wake();
        }
    }

    /// Parks the call at `seq` (which looks at seqs from `lowest` on, and waits for a signal to
    /// `token` if it names one) until the turn is resumed warm; the end of a turn that is not
    /// kept drops it.
    fn park_warm(self: &Arc<Self>, seq: u32, lowest: u32, token: Option<&str>) -> WarmPark {
        let resumes = self.resumes.load(Ordering::Acquire);
        WarmPark { t: self.clone(), seq, lowest, token: token.map(str::to_string), resumes }
    }

    /// Wakes the task polling the driver, so that it asks the core again (the engine started
    /// draining: a held turn then suspends).
    pub(crate) fn nudge(&self) {
        let waker = self.driver.lock().take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Stops the turn from outside it, because the store holds newer facts about the run than
    /// the turn saw — an operator cancelled it: the core is told to stop with
    /// [`TurnStop::Rerun`](durable_core::TurnStop::Rerun) (the executor then claims the run
    /// again and a fresh turn acts on what the store holds), and the driver is woken, so the
    /// turn ends at its next poll — at once, even in the middle of a step (whose closure is
    /// dropped, its result unrecorded, as in a crash). Takes the turn's locks one after the
    /// other, never together.
    pub(crate) fn interrupt(&self, why: String) {
        self.turn.lock().stop(durable_core::TurnStop::Rerun(why));
        self.nudge();
    }

    /// Records the waker of the task polling the driver (see [`TurnState::interrupt`]).
    fn driven_by(&self, waker: &Waker) {
        let mut driver = self.driver.lock();
        if !driver.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *driver = Some(waker.clone());
        }
    }

    /// Whether the store acknowledged a commit of this turn that carried a checkpoint.
    pub(crate) fn checkpointed(&self) -> bool {
        self.checkpointed.load(Ordering::Relaxed)
    }

    pub(crate) fn now(&self) -> Millis {
        self.env.now()
    }

    /// The concurrency key's request of a run this turn creates (a child, the successor) of
    /// `workflow` with id `id` and `input`, in this run's namespace and at its priority, as the
    /// core creates it; none for an input that did not encode (the call fails on that).
    fn key_request(
        &self,
        workflow: &str,
        id: &RunId,
        input: &Result<Payload, String>,
        now: Millis,
    ) -> Result<Option<SlotRequest>, String> {
        let Ok(input) = input else { return Ok(None) };
        let (namespace, priority) = (&self.run.namespace, self.run.priority);
        self.env.key_request(&NewRunKey { workflow, namespace, id, input, priority, now })
    }

    fn take_seq(&self) -> u32 {
        self.turn.lock().take_seq()
    }

    fn emit(&self, event: EngineEvent) {
        self.env.emit(event);
    }

    /// Vets the runs a commit creates against the store (see [`Turn::vet_creations`]): one read
    /// of the ids, only for a commit that creates runs.
    pub(crate) async fn vet(&self, commit: Commit) -> StoreResult<Commit> {
        if commit.children.is_empty() {
            return Ok(commit);
        }
        let ids = commit.children.iter().map(|c| c.id.clone()).collect();
        let existing = self.env.existing_runs(ids).await?;
        if existing.is_empty() {
            return Ok(commit);
        }
        Ok(self.turn.lock().vet_creations(commit, &existing, self.now()))
    }

    /// Applies a commit the answer for `seq` carried and hands the outcome to the turn.
    /// `false`: the turn stops (the call halts).
    async fn apply(&self, seq: u32, commit: Commit) -> bool {
        let result = self.commit(commit).await;
        let mut turn = self.turn.lock();
        match &result {
            Ok(outcome) => turn.committed(seq, Ok(outcome)),
            Err(e) => {
                tracing::warn!(run_id = %self.run.id, seq, error = %e, "commit failed; the turn stops");
                turn.committed(seq, Err((e.kind(), e.to_string())))
            }
        }
    }

    /// Vets and applies a commit of the turn.
    async fn commit(&self, commit: Commit) -> durable_core::StoreResult<durable_core::CommitOutcome> {
        let commit = self.vet(commit).await?;
        let checkpoints = !commit.checkpoints.is_empty();
        let result = self.env.commit(commit).await;
        if checkpoints && result.is_ok() {
            self.checkpointed.store(true, Ordering::Relaxed);
        }
        result
    }

    /// The commit of a hold ([`Pending::HoldUntil`](durable_core::Pending::HoldUntil)): what
    /// the turn buffered, the sleeps' wake times among it. `false`: it failed and the turn
    /// stops. [`EngineEvent::SleepHeld`] once applied.
    pub(crate) async fn hold_commit(self: Arc<Self>, commit: Commit, until: Millis) -> bool {
        let going_on = match &self.commit(commit).await {
            Ok(outcome) => self.turn.lock().hold_committed(Ok(outcome)),
            Err(e) => {
                tracing::warn!(run_id = %self.run.id, error = %e, "commit of a held sleep failed; the turn stops");
                self.turn.lock().hold_committed(Err((e.kind(), e.to_string())))
            }
        };
        if going_on {
            self.env.emit(EngineEvent::SleepHeld { run_id: self.run.id.clone(), until });
        }
        going_on
    }

    /// The wait of a hold: until `until` on the engine clock, then, when the core says one is
    /// due ([`Turn::hold_check_due`]), a read of the run, which it checks
    /// ([`Turn::hold_checked`]: a cancel or another owner meanwhile stops the turn). `false`:
    /// the turn stops (a failed read too: the run is claimed again later).
    pub(crate) async fn hold_wait(self: Arc<Self>, until: Millis) -> bool {
        let held = Holding::begin(&self);
        if held.slot_wanted {
            // A run waits for a slot: the driver asks again, and the turn suspends.
            self.nudge();
        }
        self.env.sleep_until(until).await;
        drop(held);
        if !self.turn.lock().hold_check_due(self.env.now()) {
            return true;
        }
        match self.env.read_run(self.run.id.clone()).await {
            Ok(run) => self.turn.lock().hold_checked(run.as_ref(), self.env.now()),
            Err(e) => {
                let run = &self.run.id;
                tracing::warn!(run_id = %run, error = %e, "reading the run after a held sleep failed; the turn stops");
                self.turn
                    .lock()
                    .stop(durable_core::TurnStop::Abort(format!("run {run}: read after a held sleep: {e}")));
                false
            }
        }
    }

    /// Whether the turn waits out a held sleep now that no caller asked it to give up yet;
    /// marks it asked.
    pub(crate) fn take_holding(&self) -> bool {
        self.holding.swap(false, Ordering::SeqCst)
    }

    /// A held sleep is due: every parked call begins again ([`Turn::end_hold`]).
    pub(crate) fn end_hold(&self) {
        self.turn.lock().end_hold();
        self.wake_parked();
    }

    /// Asks the store for the admission slot the call at `seq` requested. A store failure
    /// stops the turn (`None`: the call halts; the run is retried later).
    async fn acquire_slot(&self, seq: u32, request: durable_core::admission::SlotRequest) -> Option<Admission> {
        match self.env.acquire_slot(request).await {
            Ok(answer) => Some(answer),
            Err(e) => {
                let run = &self.run.id;
                tracing::warn!(run_id = %run, seq, error = %e, "asking for an admission slot failed; the turn stops");
                self.turn
                    .lock()
                    .stop(durable_core::TurnStop::Abort(format!("run {run} seq {seq}: acquire_slot failed: {e}")));
                None
            }
        }
    }

    /// Decodes a recorded payload; when the type changed, the turn fails naming the seq.
    fn decode<T: DeserializeOwned>(&self, seq: u32, name: &str, payload: &Payload) -> Option<T> {
        match payload.decode() {
            Ok(v) => Some(v),
            Err(e) => {
                self.turn.lock().fail_decode(seq, name, &e.to_string());
                None
            }
        }
    }
}

/// Tells the turn when a call's future is dropped (a `select!` loser, or the body dropped at
/// the end of the turn), so it no longer counts as executing or parked.
struct CallGuard {
    t: Arc<TurnState>,
    seq: u32,
}

impl CallGuard {
    fn new(t: &Arc<TurnState>, seq: u32) -> Self {
        CallGuard { t: t.clone(), seq }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.t.turn.lock().abandon(self.seq);
    }
}

/// A call parked for a warm resume, as the turn lists it.
struct ParkedCall {
    /// The lowest seq the call looks at (its deadline's, or its own).
    lowest: u32,
    /// The waker of its last poll.
    waker: Option<Waker>,
    /// The token of the signal it waits for, if it waits for one.
    token: Option<String>,
}

/// A parked call waiting for a warm resume ([`TurnState::park_warm`]).
struct WarmPark {
    t: Arc<TurnState>,
    seq: u32,
    lowest: u32,
    token: Option<String>,
    /// The turn's resume count when the call parked.
    resumes: u64,
}

impl Future for WarmPark {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut warm = self.t.warm_parked.lock();
        if self.t.resumes.load(Ordering::Acquire) != self.resumes {
            warm.remove(&self.seq);
            return Poll::Ready(());
        }
        let call = ParkedCall { lowest: self.lowest, waker: Some(cx.waker().clone()), token: self.token.clone() };
        warm.insert(self.seq, call);
        Poll::Pending
    }
}

impl Drop for WarmPark {
    fn drop(&mut self) {
        let mut warm = self.t.warm_parked.lock();
        if self.t.resumes.load(Ordering::Acquire) == self.resumes {
            warm.remove(&self.seq);
        }
    }
}

/// A future that never resolves: the call is parked or the turn is stopping; the end of the
/// turn drops it.
async fn halt<T>() -> T {
    std::future::pending().await
}

/// Polls a future, turning a panic into `Err(message)`.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.0).poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(panic.as_ref()))),
        }
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

// Here rather than beside `WorkflowError`: it knows the turn's error types (error.rs does not
// import the turn).
impl<E: std::error::Error + Send + Sync + 'static> From<E> for crate::error::WorkflowError {
    fn from(e: E) -> Self {
        let code = code_of(&e).map(str::to_string);
        crate::error::WorkflowError::coded(e.to_string(), code)
    }
}

/// The code an error of the engine's carries onto the run when `?` returns it: a step's own
/// code, `child_failed` for a child that did not complete, `bad_payload` for a delivery that
/// does not decode.
fn code_of(e: &dyn std::any::Any) -> Option<&str> {
    if let Some(s) = e.downcast_ref::<crate::error::StepFailed>() {
        return s.error.code.as_deref();
    }
    if e.is::<ChildFailed>() {
        return Some(durable_core::codes::CHILD_FAILED);
    }
    if e.is::<SignalError>() {
        return Some(durable_core::codes::BAD_PAYLOAD);
    }
    match e.downcast_ref::<TaskError>()? {
        TaskError::Dispatch(s) => s.error.code.as_deref(),
        TaskError::BadPayload(_) => Some(durable_core::codes::BAD_PAYLOAD),
        TaskError::Failed { .. } => None,
    }
}
