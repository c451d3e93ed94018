//! `WorkflowCtx`: the handle a workflow body uses for every durable operation.
//!
//! Every method takes its seq synchronously at the call and returns a future, so the program
//! order of calls — not the order futures are polled in — decides the seqs. That is what makes
//! `join!`, `select!` and fan-out replay identically.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_core::{
    Backoff, Checkpoint, CheckpointStatus, CommitOutcome, Decision, Millis, Payload, RetryDecision, RetryPolicy, Run,
    RunId, StepError, StepKind, Turn, TurnStop, codes, seed_for,
};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clock::BoxFuture;
use crate::compose::Compensation;
use crate::engine::Shared;
use crate::error::StepFailed;
use crate::events::EngineEvent;

/// The state one turn shares between its `WorkflowCtx` clones and the turn driver.
pub(crate) struct TurnShared {
    pub(crate) run: Run,
    pub(crate) turn: Mutex<Turn>,
    pub(crate) engine: Arc<Shared>,
    /// Set when a store call reported that another owner holds the lease.
    pub(crate) lease_lost: std::sync::atomic::AtomicBool,
    /// Set when the turn stopped because the store holds newer facts than this turn saw (a
    /// delivery raced a timeout): run a fresh turn at once.
    pub(crate) rerun: std::sync::atomic::AtomicBool,
    /// An operator asked for a cancel with compensation: new calls park; the driver runs the
    /// undos and settles `cancelled`.
    pub(crate) cancel_requested: bool,
    /// Set once the undos run (new calls execute again).
    pub(crate) compensating: std::sync::atomic::AtomicBool,
    /// Undos registered by completed steps, oldest first.
    pub(crate) compensations: Mutex<Vec<crate::compose::Compensation>>,
}

impl TurnShared {
    pub(crate) fn new(run: Run, owner: String, history: durable_core::History, engine: Arc<Shared>) -> Self {
        let cancel_requested = run.error.as_ref().is_some_and(|e| e.code() == Some(codes::CANCEL_REQUESTED));
        TurnShared {
            turn: Mutex::new(Turn::new(run.id.clone(), owner, run.wake_gen, history)),
            run,
            engine,
            lease_lost: Default::default(),
            rerun: Default::default(),
            cancel_requested,
            compensating: Default::default(),
            compensations: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn has_compensations(&self) -> bool {
        !self.compensations.lock().is_empty()
    }

    pub(crate) fn now(&self) -> Millis {
        self.engine.clock.now()
    }

    pub(crate) fn take_seq(&self) -> u32 {
        self.turn.lock().take_seq()
    }

    /// The decision for a call, or `None` when the turn is stopping (a non-determinism found
    /// here stops it).
    pub(crate) fn begin(&self, seq: u32, name: &str, kind: StepKind) -> Option<Decision> {
        let now = self.now();
        let mut turn = self.turn.lock();
        if turn.stopped().is_some() {
            return None;
        }
        match turn.decide(seq, name, kind, now) {
            Decision::NonDeterminism(nd) => {
                tracing::error!(run_id = %self.run.id, seq, "{nd}");
                turn.stop(TurnStop::Fail(nd.to_error()));
                None
            }
            Decision::Execute { .. } | Decision::Wait { .. }
                if self.cancel_requested && !self.compensating.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                // Cancelling: nothing new runs; the driver compensates once every branch is here.
                turn.park(seq, None);
                None
            }
            d => Some(d),
        }
    }

    pub(crate) fn stop(&self, reason: TurnStop) {
        self.turn.lock().stop(reason);
    }

    /// Decodes a recorded payload, or stops the turn naming the seq when the type changed.
    pub(crate) fn decode<T: DeserializeOwned>(&self, seq: u32, name: &str, payload: &Payload) -> Option<T> {
        match payload.decode() {
            Ok(v) => Some(v),
            Err(e) => {
                self.stop(TurnStop::Fail(
                    StepError::fatal(format!(
                        "run {}: the value recorded at seq {seq} ({name:?}) does not decode into the type the workflow asks for: {e}",
                        self.run.id
                    ))
                    .with_code(codes::BAD_PAYLOAD),
                ));
                None
            }
        }
    }

    pub(crate) fn record(&self, cp: Checkpoint) {
        self.turn.lock().record(cp);
    }

    pub(crate) fn checkpoint(
        &self,
        seq: u32,
        name: &str,
        kind: StepKind,
        status: CheckpointStatus,
        started_at: Millis,
    ) -> Checkpoint {
        let mut cp = Checkpoint::new(self.run.id.clone(), seq, name, kind, status, started_at);
        cp.updated_at = self.now();
        cp
    }

    /// Commits everything recorded so far plus `cp`; `None` when the turn must stop (the commit
    /// failed or the turn was already stopping). Events are sent only after the commit.
    pub(crate) async fn commit(&self, cp: Option<Checkpoint>, event: Option<EngineEvent>) -> Option<CommitOutcome> {
        let commit = {
            let mut turn = self.turn.lock();
            if turn.stopped().is_some() {
                return None;
            }
            if let Some(cp) = cp {
                turn.record(cp);
            }
            turn.commit(self.now())
        };
        match self.engine.apply_commit(commit).await {
            Ok(outcome) => {
                if let Some(event) = event {
                    self.engine.emit(event);
                }
                Some(outcome)
            }
            Err(e) => {
                if e.kind() == durable_core::StoreErrorKind::LeaseLost {
                    self.lease_lost.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                tracing::warn!(run_id = %self.run.id, error = %e, "commit failed; the turn stops");
                self.stop(TurnStop::Abort(format!("commit failed: {e}")));
                None
            }
        }
    }
}

/// A future that never resolves: the turn stops or parks around it.
pub(crate) fn halt<T>() -> std::future::Pending<T> {
    std::future::pending()
}

/// Parks the call at `seq` for the rest of the turn. Registered on first poll, unregistered
/// when dropped (a `select!` loser).
pub(crate) struct Parked<T> {
    t: Arc<TurnShared>,
    seq: u32,
    wake_at: Option<Millis>,
    registered: bool,
    _out: PhantomData<fn() -> T>,
}

pub(crate) fn park<T>(t: &Arc<TurnShared>, seq: u32, wake_at: Option<Millis>) -> Parked<T> {
    Parked { t: t.clone(), seq, wake_at, registered: false, _out: PhantomData }
}

impl<T> Future for Parked<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<T> {
        if !self.registered {
            self.registered = true;
            self.t.turn.lock().park(self.seq, self.wake_at);
        }
        Poll::Pending
    }
}

impl<T> Drop for Parked<T> {
    fn drop(&mut self) {
        if self.registered {
            self.t.turn.lock().unpark(self.seq);
        }
    }
}

/// Counts a call as executing while it lives.
pub(crate) struct InFlight(Arc<TurnShared>);

impl InFlight {
    pub(crate) fn new(t: &Arc<TurnShared>) -> Self {
        t.turn.lock().begin_flight();
        InFlight(t.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.turn.lock().end_flight();
    }
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

/// What a step closure receives: which step and which attempt this is.
#[derive(Debug, Clone)]
pub struct StepContext {
    run_id: RunId,
    seq: u32,
    attempt: u32,
}

impl StepContext {
    /// `<run_id>:<seq>`: stable across retries, replays and recoveries. Use it as an
    /// idempotency key for the step's side effects.
    pub fn step_id(&self) -> String {
        self.run_id.step_id(self.seq)
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The step's seq.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// How a step is retried and bounded.
///
/// ```
/// use std::time::Duration;
/// use durable_runtime::{Backoff, StepOptions};
/// let opts = StepOptions { retries: 3, backoff: Backoff::Fixed(Duration::from_secs(1)), ..Default::default() };
/// assert_eq!(opts.retries, 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StepOptions {
    /// Retries after the first attempt (`retries = n`: at most n+1 attempts). Default 0.
    pub retries: u32,
    /// Delay between attempts. Delays above the engine's `durable_retry_threshold` are
    /// durable: the run suspends and the attempt count survives crashes.
    pub backoff: Backoff,
    /// Fraction (0.0–1.0) of each delay randomized away, from a seed derived from the step.
    pub jitter: f64,
    /// Upper bound of one attempt; an attempt that exceeds it fails with a retryable error.
    pub timeout: Option<Duration>,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions { retries: 0, backoff: Backoff::None, jitter: 0.0, timeout: None }
    }
}

impl StepOptions {
    /// `retries` retries with the given backoff.
    pub fn retries(retries: u32, backoff: Backoff) -> Self {
        StepOptions { retries, backoff, ..Default::default() }
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy::new(self.retries, self.backoff).with_jitter(self.jitter)
    }
}

pub(crate) type StepBody<'a, T> = Box<dyn FnMut(StepContext) -> BoxFuture<'a, Result<T, StepError>> + Send + 'a>;

/// Turns a completed step's output into its registered undo.
type OnComplete<'a, T> = Box<dyn FnOnce(&T) -> Compensation + Send + 'a>;

/// A local step: a future resolving to the step's output, or [`StepFailed`] after its last
/// attempt. Created by [`WorkflowCtx::step`]; its seq is taken at that call. Adjust it with
/// [`Step::options`] before awaiting it.
#[must_use = "a step does nothing unless awaited"]
pub struct Step<'a, T> {
    t: Arc<TurnShared>,
    seq: u32,
    name: String,
    options: StepOptions,
    body: Option<StepBody<'a, T>>,
    on_complete: Option<OnComplete<'a, T>>,
    fut: Option<BoxFuture<'a, Result<T, StepFailed>>>,
}

impl<T> fmt::Debug for Step<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step").field("seq", &self.seq).field("name", &self.name).finish()
    }
}

impl<'a, T> Step<'a, T> {
    /// Sets the retry and timeout options.
    pub fn options(mut self, options: StepOptions) -> Self {
        self.options = options;
        self
    }

    /// Sets how many times to retry and with which backoff.
    pub fn retry(mut self, retries: u32, backoff: Backoff) -> Self {
        self.options.retries = retries;
        self.options.backoff = backoff;
        self
    }

    /// The seq this step was given.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// Registers an undo for this step (a saga): once the step has completed (and again on
    /// every replay), `undo(output)` is remembered; if the body then fails — or an operator
    /// cancels the run with `Cancel::Compensate` — the undos run newest first, each as its own
    /// checkpointed step (`undo:<name>`), so a crash mid-compensation never repeats a finished
    /// undo. An undo that keeps failing is recorded as failed and skipped.
    pub fn compensate<F, Fut>(self, undo: F) -> Self
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        self.compensate_with(StepOptions::default(), undo)
    }

    /// [`Step::compensate`] with retry options for the undo.
    pub fn compensate_with<F, Fut>(mut self, options: StepOptions, undo: F) -> Self
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let name = self.name.clone();
        let undo = Arc::new(undo);
        self.on_complete = Some(Box::new(move |output: &T| {
            let output = output.clone();
            Compensation {
                name,
                options,
                body: Box::new(move |_| {
                    let (undo, output) = (undo.clone(), output.clone());
                    Box::pin(async move { undo(output).await })
                }),
            }
        }));
        self
    }
}

impl<'a, T: Serialize + DeserializeOwned + Send + 'a> Future for Step<'a, T> {
    type Output = Result<T, StepFailed>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.fut.is_none() {
            let body = self.body.take().expect("a step future is created once");
            let on_complete = self.on_complete.take();
            let (t, seq, name, options) =
                (self.t.clone(), self.seq, std::mem::take(&mut self.name), self.options.clone());
            let fut = run_step(t, seq, name, StepKind::Step, options, body, on_complete);
            self.fut = Some(Box::pin(fut));
        }
        self.fut.as_mut().expect("set above").as_mut().poll(cx)
    }
}

/// Runs (or replays) the step at `seq`: attempts with retries, the commit of its result, and
/// the registration of its undo.
pub(crate) async fn run_step<'a, T: Serialize + DeserializeOwned + Send + 'a>(
    t: Arc<TurnShared>,
    seq: u32,
    name: String,
    kind: StepKind,
    options: StepOptions,
    mut body: StepBody<'a, T>,
    on_complete: Option<OnComplete<'a, T>>,
) -> Result<T, StepFailed> {
    let run_id = t.run.id.clone();
    let failed = |error: StepError, attempts: u32| StepFailed {
        run_id: run_id.clone(),
        name: name.clone(),
        seq,
        error,
        attempts,
    };
    let completed = |value: T| {
        if let Some(register) = on_complete {
            let undo = register(&value);
            t.compensations.lock().push(undo);
        }
        Ok(value)
    };
    let mut attempt = match t.begin(seq, &name, kind) {
        None => return halt().await,
        Some(Decision::Replay(p)) => match t.decode(seq, &name, &p) {
            Some(v) => return completed(v),
            None => return halt().await,
        },
        Some(Decision::ReplayError { error, attempts }) => return Err(failed(error, attempts)),
        Some(Decision::Wait { wake_at }) => return park(&t, seq, wake_at).await,
        Some(Decision::Execute { attempt }) => attempt,
        Some(Decision::NonDeterminism(_)) => unreachable!("begin() turns non-determinism into a stop"),
    };
    let flight = InFlight::new(&t);
    let span = tracing::debug_span!("step", run_id = %run_id, seq, name = %name);
    let started_at = t.now();
    let policy = options.policy();
    // Kept on the checkpoint of a step that eventually succeeds, so operators see why the
    // earlier attempts failed.
    let mut last_error: Option<StepError> = None;
    loop {
        let sc = StepContext { run_id: run_id.clone(), seq, attempt };
        let result = {
            let _enter = span.enter();
            tracing::trace!(attempt, "executing");
            drop(_enter);
            run_attempt(&t, body(sc), options.timeout).await
        };
        let result = result.and_then(|value| match Payload::encode(&value) {
            Ok(p) if p.len() > t.engine.config.max_payload_bytes => Err(StepError::fatal(format!(
                "the output of step {name:?} (seq {seq}) of run {run_id} is {} bytes, over the {}-byte payload limit",
                p.len(),
                t.engine.config.max_payload_bytes
            ))
            .with_code(codes::PAYLOAD_TOO_LARGE)),
            Ok(p) => Ok((value, p)),
            Err(e) => Err(StepError::fatal(format!("the output of step {name:?} does not serialize: {e}"))
                .with_code(codes::BAD_PAYLOAD)),
        });
        let mut cp = t.checkpoint(seq, &name, kind, CheckpointStatus::Completed, started_at);
        cp.attempts = attempt;
        match result {
            Ok((value, payload)) => {
                cp.output = Some(payload);
                cp.error = last_error;
                let event =
                    EngineEvent::StepCompleted { run_id: run_id.clone(), seq, name: name.clone(), attempts: attempt };
                if t.commit(Some(cp), Some(event)).await.is_none() {
                    return halt().await;
                }
                return completed(value);
            }
            Err(error) => match policy.after_failure(attempt, &error, seed_for(run_id.as_str(), seq, attempt)) {
                RetryDecision::RetryAfter(delay) => {
                    let retry_at = t.now() + delay.as_millis() as Millis;
                    tracing::debug!(run_id = %run_id, seq, attempt, error = %error, ?delay, "step attempt failed; retrying");
                    let event = EngineEvent::StepRetrying {
                        run_id: run_id.clone(),
                        seq,
                        name: name.clone(),
                        attempt,
                        retry_at,
                        error: error.clone(),
                    };
                    if delay <= t.engine.config.durable_retry_threshold {
                        t.engine.emit(event);
                        last_error = Some(error);
                        t.engine.clock.sleep_until(retry_at).await;
                        attempt += 1;
                        continue;
                    }
                    cp.status = CheckpointStatus::Waiting;
                    cp.error = Some(error);
                    cp.wake_at = Some(retry_at);
                    if t.commit(Some(cp), Some(event)).await.is_none() {
                        return halt().await;
                    }
                    drop(flight);
                    return park(&t, seq, Some(retry_at)).await;
                }
                RetryDecision::GiveUp => {
                    cp.status = CheckpointStatus::Failed;
                    cp.error = Some(error.clone());
                    let event = EngineEvent::StepFailed {
                        run_id: run_id.clone(),
                        seq,
                        name: name.clone(),
                        attempts: attempt,
                        error: error.clone(),
                    };
                    if t.commit(Some(cp), Some(event)).await.is_none() {
                        return halt().await;
                    }
                    return Err(failed(error, attempt));
                }
            },
        }
    }
}

/// One attempt of a step closure: panics become retryable errors, and an optional timeout
/// (on the engine's clock) bounds it.
async fn run_attempt<'a, T>(
    t: &TurnShared,
    fut: BoxFuture<'a, Result<T, StepError>>,
    timeout: Option<Duration>,
) -> Result<T, StepError> {
    let attempt = async {
        match CatchUnwind(fut).await {
            Ok(r) => r,
            Err(panic) => Err(StepError::retryable(format!("step panicked: {panic}")).with_code(codes::PANIC)),
        }
    };
    match timeout {
        None => attempt.await,
        Some(limit) => {
            let deadline = t.engine.clock.sleep_until(t.now() + limit.as_millis() as Millis);
            tokio::select! {
                r = attempt => r,
                () = deadline => Err(StepError::retryable(format!("step attempt timed out after {limit:?}")).with_code("timeout")),
            }
        }
    }
}

/// The handle a workflow body uses for every durable operation. Cheap to clone.
///
/// Only futures returned by this type may be awaited in a body (plus combinators over them
/// such as `join!`, `select!` and [`WorkflowCtx::all`]): anything else — a `tokio::time::sleep`,
/// a network call — is invisible to replay and makes the body non-deterministic. Put such
/// work in a step.
#[derive(Clone)]
pub struct WorkflowCtx {
    pub(crate) t: Arc<TurnShared>,
}

impl fmt::Debug for WorkflowCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowCtx").field("run_id", &self.t.run.id).field("workflow", &self.t.run.workflow).finish()
    }
}

impl WorkflowCtx {
    /// The run this body executes.
    pub fn run_id(&self) -> &RunId {
        &self.t.run.id
    }

    /// The workflow name.
    pub fn workflow(&self) -> &str {
        &self.t.run.workflow
    }

    /// The workflow version the run is pinned to.
    pub fn version(&self) -> u32 {
        self.t.run.version
    }

    /// The run's namespace.
    pub fn namespace(&self) -> &str {
        &self.t.run.namespace
    }

    /// Whether the next call will replay a recorded result (useful to log only once).
    pub fn is_replaying(&self) -> bool {
        let turn = self.t.turn.lock();
        turn.next_seq() < turn.history().len()
    }

    /// A local step: runs `f` (at most once per attempt), commits its output, then resolves to
    /// it. On replay the recorded output is returned without running `f`. No retries unless set
    /// with [`Step::retry`] / [`Step::options`] or [`WorkflowCtx::step_with`].
    ///
    /// ```no_run
    /// # async fn body(ctx: durable_runtime::WorkflowCtx) -> Result<(), durable_runtime::WorkflowError> {
    /// let receipt: String = ctx.step("charge", |s| async move {
    ///     // s.step_id() is stable across retries: use it as the payment's idempotency key.
    ///     Ok(format!("receipt-for-{}", s.step_id()))
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn step<'a, T, F, Fut>(&self, name: impl Into<String>, mut f: F) -> Step<'a, T>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        F: FnMut(StepContext) -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, StepError>> + Send + 'a,
    {
        let seq = self.t.take_seq();
        Step {
            t: self.t.clone(),
            seq,
            name: name.into(),
            options: StepOptions::default(),
            body: Some(Box::new(move |sc| Box::pin(f(sc)))),
            on_complete: None,
            fut: None,
        }
    }

    /// A local step with retry and timeout options.
    pub fn step_with<'a, T, F, Fut>(&self, name: impl Into<String>, options: StepOptions, f: F) -> Step<'a, T>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        F: FnMut(StepContext) -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, StepError>> + Send + 'a,
    {
        self.step(name, f).options(options)
    }

    /// A value computed once, recorded, and replayed: `f` runs on the first execution only and
    /// its result is committed before the future resolves.
    pub fn side_effect<T, F>(&self, name: &str, f: F) -> impl Future<Output = T> + Send + 'static + use<T, F>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        let name = name.to_string();
        async move { recorded(&t, seq, &name, StepKind::SideEffect, f, true).await }
    }

    /// The engine clock's time, recorded once and replayed.
    pub fn now(&self) -> impl Future<Output = SystemTime> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let clock = t.engine.clock.clone();
            let ms: Millis = recorded(&t, seq, "now", StepKind::Now, move || clock.now(), false).await;
            UNIX_EPOCH + Duration::from_millis(ms)
        }
    }

    /// A random number, recorded once and replayed.
    pub fn random_u64(&self) -> impl Future<Output = u64> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move { recorded(&t, seq, "random", StepKind::Random, rand::random::<u64>, false).await }
    }

    /// A random (v4) UUID, recorded once and replayed.
    pub fn uuid(&self) -> impl Future<Output = uuid::Uuid> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move { recorded(&t, seq, "uuid", StepKind::Uuid, uuid::Uuid::new_v4, false).await }
    }

    /// Sleeps durably for `d`: the run suspends (its future is dropped, its lease released)
    /// and is woken when the time comes, on this or any other engine sharing the store.
    pub fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let now = t.now();
            durable_sleep(&t, seq, now.saturating_add(d.as_millis() as Millis)).await
        }
    }

    /// Sleeps durably until `at` (no-op if it has passed).
    pub fn sleep_until(&self, at: SystemTime) -> impl Future<Output = ()> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        let at = at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0);
        async move { durable_sleep(&t, seq, at).await }
    }

    /// Lets new code branch safely around a change: `true` on runs that reach this call fresh
    /// (a marker is recorded), `false` on older runs whose history has something else here (no
    /// seq is consumed for them, so their recorded calls still line up).
    ///
    /// ```no_run
    /// # async fn body(ctx: durable_runtime::WorkflowCtx) -> Result<(), durable_runtime::WorkflowError> {
    /// if ctx.patched("send-receipt-email") {
    ///     ctx.step("email", |_| async { Ok(()) }).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn patched(&self, id: &str) -> bool {
        let now = self.t.now();
        self.t.turn.lock().patched(id, now)
    }

    /// Awaits every future, returning their outputs in input order. The futures' seqs were
    /// taken when they were created, in iteration order, so replay lines up however their
    /// completions interleave.
    pub fn all<I>(&self, futures: I) -> All<I::Item>
    where
        I: IntoIterator,
        I::Item: Future,
    {
        All::new(futures)
    }
}

async fn durable_sleep(t: &Arc<TurnShared>, seq: u32, wake_at: Millis) {
    match t.begin(seq, "sleep", StepKind::Sleep) {
        None => halt().await,
        Some(Decision::Replay(_)) => {
            // A due sleep still recorded as waiting: mark it done (rides along with the next commit).
            let waiting = t.turn.lock().history().get(seq).filter(|c| c.status == CheckpointStatus::Waiting).cloned();
            if let Some(mut cp) = waiting {
                cp.status = CheckpointStatus::Completed;
                cp.updated_at = t.now();
                t.record(cp);
            }
        }
        Some(Decision::Wait { wake_at }) => park(t, seq, wake_at).await,
        Some(Decision::Execute { .. }) => {
            let now = t.now();
            let mut cp = t.checkpoint(seq, "sleep", StepKind::Sleep, CheckpointStatus::Waiting, now);
            cp.wake_at = Some(wake_at);
            if wake_at <= now {
                cp.status = CheckpointStatus::Completed;
                t.record(cp);
                return;
            }
            t.record(cp);
            park(t, seq, Some(wake_at)).await
        }
        Some(other) => corrupt(t, seq, "sleep", &other).await,
    }
}

/// A value produced once and replayed (`now`, `random_u64`, `uuid`, `side_effect`). With
/// `commit_now` the value is committed before it is returned; otherwise it rides along with
/// the next commit.
async fn recorded<T, F>(t: &Arc<TurnShared>, seq: u32, name: &str, kind: StepKind, produce: F, commit_now: bool) -> T
where
    T: Serialize + DeserializeOwned,
    F: FnOnce() -> T,
{
    match t.begin(seq, name, kind) {
        None => halt().await,
        Some(Decision::Replay(p)) => match t.decode(seq, name, &p) {
            Some(v) => v,
            None => halt().await,
        },
        Some(Decision::Execute { .. }) => {
            let now = t.now();
            let value = produce();
            let payload = match Payload::encode(&value) {
                Ok(p) => p,
                Err(e) => {
                    t.stop(TurnStop::Fail(
                        StepError::fatal(format!(
                            "run {}: the value of {name:?} (seq {seq}) does not serialize: {e}",
                            t.run.id
                        ))
                        .with_code(codes::BAD_PAYLOAD),
                    ));
                    return halt().await;
                }
            };
            let mut cp = t.checkpoint(seq, name, kind, CheckpointStatus::Completed, now);
            cp.output = Some(payload);
            cp.attempts = 1;
            if commit_now {
                let _flight = InFlight::new(t);
                if t.commit(Some(cp), None).await.is_none() {
                    return halt().await;
                }
            } else {
                t.record(cp);
            }
            value
        }
        Some(other) => corrupt(t, seq, name, &other).await,
    }
}

/// A history record this kind of call can never produce: fail the run naming the seq.
pub(crate) async fn corrupt<T>(t: &Arc<TurnShared>, seq: u32, name: &str, found: &Decision) -> T {
    t.stop(TurnStop::Fail(StepError::fatal(format!(
        "run {}: history at seq {seq} ({name:?}) holds a record this call cannot have made ({found:?}); the history is corrupt",
        t.run.id
    ))));
    halt::<Infallible>().await;
    unreachable!()
}

/// The future of [`WorkflowCtx::all`]: every output, in input order.
#[must_use = "futures do nothing unless awaited"]
pub struct All<F: Future> {
    slots: Vec<Slot<F>>,
}

enum Slot<F: Future> {
    Running(Pin<Box<F>>),
    Done(Option<F::Output>),
}

// The futures are boxed, never pinned in place.
impl<F: Future> Unpin for All<F> {}

impl<F: Future> All<F> {
    fn new(futures: impl IntoIterator<Item = F>) -> Self {
        All { slots: futures.into_iter().map(|f| Slot::Running(Box::pin(f))).collect() }
    }
}

impl<F: Future> fmt::Debug for All<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("All").field("len", &self.slots.len()).finish()
    }
}

impl<F: Future> Future for All<F> {
    type Output = Vec<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut pending = false;
        for slot in &mut self.slots {
            if let Slot::Running(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Slot::Done(Some(v)),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(
            self.slots
                .iter_mut()
                .map(|s| match s {
                    Slot::Done(v) => v.take().expect("All polled after completion"),
                    Slot::Running(_) => unreachable!("checked above"),
                })
                .collect(),
        )
    }
}
