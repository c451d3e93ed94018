//! `WorkflowCtx`: the handle a workflow body uses for every durable operation, and the local
//! primitives (steps with retries, recorded values, sleeps).
//!
//! Every method takes its seq synchronously at the call and returns a future, so the program
//! order of calls — not the order futures are polled in — decides the seqs. That is what makes
//! `join!`, `select!` and fan-out replay identically.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_core::{
    Backoff, GateCall, Millis, Payload, RecordBegin, RecordOutcome, RetryPolicy, RunId, SleepBegin, StepAfter,
    StepBegin, StepCall, StepError, StepKind, codes, millis_after, protocol,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::{CallGuard, CatchUnwind, TurnState, halt};
use crate::clock::BoxFuture;
use crate::error::StepFailed;
use crate::events::EngineEvent;

/// What a step closure receives: which step and which attempt this is.
#[derive(Debug, Clone)]
pub struct StepContext {
    run_id: RunId,
    seq: u32,
    attempt: u32,
    admitted_at: Option<Millis>,
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

    /// For a step run through a queue ([`Step::queue`]): when (engine clock, ms since the
    /// epoch) the store admitted this attempt — the instant a rate limit counted it in. `None`
    /// for a step without a queue.
    pub fn admitted_at(&self) -> Option<Millis> {
        self.admitted_at
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
    /// durable: the run suspends. Shorter ones are waited in memory. Either way the attempt
    /// count is committed first and survives crashes.
    pub backoff: Backoff,
    /// Fraction (0.0–1.0) of each delay randomized away, from a seed derived from the step.
    pub jitter: f64,
    /// Upper bound of one attempt; an attempt that exceeds it fails with a retryable error
    /// (code `timeout`).
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

/// What a step is: its name, kind, retry options and queue.
pub(crate) struct StepPlan {
    pub(crate) name: String,
    pub(crate) kind: StepKind,
    pub(crate) options: StepOptions,
    pub(crate) queue: Option<StepQueue>,
}

/// Where a step queues for admission ([`Step::queue`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct StepQueue {
    pub(crate) name: String,
    pub(crate) priority: i32,
    pub(crate) fairness_key: String,
}

pub(crate) type StepBody<'a, T> = Box<dyn FnMut(StepContext) -> BoxFuture<'a, Result<T, StepError>> + Send + 'a>;

/// An undo registered by a completed step: its closure and retry options (the core keeps
/// its name and its place in the stack).
pub(crate) struct Compensation {
    pub(crate) options: StepOptions,
    pub(crate) body: StepBody<'static, ()>,
}

/// Turns a completed step's output into its registered undo.
type OnComplete<'a, T> = Box<dyn FnOnce(&T) -> Compensation + Send + 'a>;

/// A local step: a future resolving to the step's output, or [`StepFailed`] after its last
/// attempt. Created by [`WorkflowCtx::step`]; its seq is taken at that call. Adjust it with
/// [`Step::options`] before awaiting it.
#[must_use = "a step does nothing unless awaited"]
pub struct Step<'a, T> {
    t: Arc<TurnState>,
    seq: u32,
    name: String,
    options: StepOptions,
    queue: Option<StepQueue>,
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

    /// Runs the step through the step queue `name` ([`Engine::register_queue`](crate::Engine::register_queue)):
    /// each attempt first takes a slot of the queue, across every process sharing the store.
    /// Not admitted, the run parks durably and is woken when a slot frees (or the queue's
    /// rate window ends). A queue this engine has not registered is ungated.
    ///
    /// ```no_run
    /// # async fn body(ctx: durable_runtime::WorkflowCtx) -> Result<(), durable_runtime::WorkflowError> {
    /// let quote: u64 = ctx
    ///     .step("fetch-quote", |_| async { Ok(42) })
    ///     .queue("pricing-api")
    ///     .priority(10)
    ///     .fairness_key("tenant-7")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue.get_or_insert_with(StepQueue::default).name = name.into();
        self
    }

    /// The step's priority in its queue (higher first, unless the queue says otherwise).
    pub fn priority(mut self, priority: i32) -> Self {
        self.queue.get_or_insert_with(StepQueue::default).priority = priority;
        self
    }

    /// The step's fairness key in its queue: with [`QueueOptions::fair`](crate::QueueOptions::fair),
    /// keys are served round robin.
    pub fn fairness_key(mut self, key: impl Into<String>) -> Self {
        self.queue.get_or_insert_with(StepQueue::default).fairness_key = key.into();
        self
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
        let undo = Arc::new(undo);
        self.on_complete = Some(Box::new(move |output: &T| {
            let output = output.clone();
            Compensation {
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
            let plan = StepPlan { name, kind: StepKind::Step, options, queue: self.queue.take() };
            let fut = run_step(t, seq, plan, body, on_complete);
            self.fut = Some(Box::pin(fut));
        }
        self.fut.as_mut().expect("set above").as_mut().poll(cx)
    }
}

/// Runs (or replays) the step at `seq`: the core decides each attempt, retry and commit; this
/// runs the closure, awaits the commits and registers the step's undo.
pub(crate) async fn run_step<'a, T: Serialize + DeserializeOwned + Send + 'a>(
    t: Arc<TurnState>,
    seq: u32,
    plan: StepPlan,
    mut body: StepBody<'a, T>,
    on_complete: Option<OnComplete<'a, T>>,
) -> Result<T, StepFailed> {
    let StepPlan { name, kind, options, queue } = plan;
    let _call = CallGuard::new(&t, seq);
    let run_id = t.run.id.clone();
    let failed = |error: StepError, attempts: u32| StepFailed {
        run_id: run_id.clone(),
        name: name.clone(),
        seq,
        error,
        attempts,
    };
    let policy = options.policy();
    // A registered queue with limits gates the step; any other name does not.
    let gated = queue.and_then(|q| {
        let limits = t.env.queue_limits(&q.name).filter(|l| l.gates())?;
        Some((protocol::queue_gate(&t.run.namespace, &q.name), limits, q))
    });
    let gate = gated.as_ref().map(|(gate, limits, q)| GateCall {
        gate,
        limits: *limits,
        priority: q.priority,
        fairness_key: &q.fairness_key,
    });
    let call = StepCall { name: &name, kind, policy: &policy, undo: on_complete.is_some(), gate };
    let mut begin = t.turn.lock().begin_step(seq, call, t.now());
    let mut admitted_at = None;
    if let StepBegin::Acquire(request) = begin {
        admitted_at = Some(request.now);
        begin = match t.acquire_slot(seq, request).await {
            Some(answer) => t.turn.lock().admitted(seq, answer, t.now()),
            None => StepBegin::Stopped,
        };
    }
    let mut attempt = match begin {
        StepBegin::Return(p) => {
            let Some(value) = t.decode::<T>(seq, &name, &p) else { return halt().await };
            register_undo(&t, seq, on_complete, &value);
            return Ok(value);
        }
        StepBegin::Fail { error, attempts } => return Err(failed(error, attempts)),
        StepBegin::Park(_) | StepBegin::Stopped | StepBegin::Acquire(_) => return halt().await,
        StepBegin::Run { attempt } => attempt,
    };
    let retrying = |attempt, retry_at, error| EngineEvent::StepRetrying {
        run_id: run_id.clone(),
        seq,
        name: name.clone(),
        attempt,
        retry_at,
        error,
    };
    loop {
        // One span per attempt: the closure runs in it, and so does the commit of its result.
        let span = crate::trace::step_span(&run_id, seq, &name, kind, attempt);
        let sc = StepContext { run_id: run_id.clone(), seq, attempt, admitted_at };
        let began = std::time::Instant::now();
        let result = run_attempt(&t, body(sc), options.timeout).instrument(span.clone()).await;
        let took = began.elapsed();
        let (value, encoded) = match result.and_then(|v| encode_output(&name, v)) {
            Ok((v, p)) => (Some(v), Ok(p)),
            Err(e) => (None, Err(e)),
        };
        let after = t.turn.lock().finish_step(seq, attempt, encoded, t.now());
        crate::trace::outcome(&span, after.outcome());
        crate::metrics::step_attempt(&t.run.workflow, kind, &after, took);
        match after {
            StepAfter::Completed { commit, .. } => {
                if !t.apply(seq, commit).instrument(span).await {
                    return halt().await;
                }
                t.emit(EngineEvent::StepCompleted {
                    run_id: run_id.clone(),
                    seq,
                    name: name.clone(),
                    attempts: attempt,
                });
                let Some(value) = value else { return halt().await };
                register_undo(&t, seq, on_complete, &value);
                return Ok(value);
            }
            StepAfter::RetryAt { at, attempt: next, error, commit } => {
                // The attempt count first: a turn cut off during the wait resumes with `next`.
                if !t.apply(seq, commit).instrument(span).await {
                    return halt().await;
                }
                tracing::debug!(run_id = %run_id, seq, attempt, error = %error, "step attempt failed; retrying in memory");
                t.emit(retrying(attempt, at, error));
                t.env.sleep_until(at).await;
                attempt = next;
            }
            StepAfter::Park { at, error, commit } => {
                if t.apply(seq, commit).instrument(span).await {
                    t.emit(retrying(attempt, at, error));
                }
                return halt().await;
            }
            StepAfter::Failed { error, attempts, commit } => {
                if !t.apply(seq, commit).instrument(span).await {
                    return halt().await;
                }
                let event = EngineEvent::StepFailed {
                    run_id: run_id.clone(),
                    seq,
                    name: name.clone(),
                    attempts,
                    error: error.clone(),
                };
                t.emit(event);
                return Err(failed(error, attempts));
            }
            StepAfter::Stopped => return halt().await,
        }
    }
}

/// Encodes a step's output; one that does not serialize, or would not decode back on replay
/// ([`Payload::encode_replayable`]), fails the step fatally.
fn encode_output<T: Serialize + DeserializeOwned>(name: &str, value: T) -> Result<(T, Payload), StepError> {
    match Payload::encode_replayable(&value) {
        Ok(p) => Ok((value, p)),
        Err(e) => Err(StepError::fatal(format!("the output of step {name:?} does not serialize: {e}"))
            .with_code(codes::BAD_PAYLOAD)),
    }
}

/// Keeps the undo a completed step registered (the core keeps the order).
fn register_undo<'a, T>(t: &TurnState, seq: u32, on_complete: Option<OnComplete<'a, T>>, value: &T) {
    if let Some(on_complete) = on_complete {
        t.undos.lock().insert(seq, on_complete(value));
    }
}

/// One attempt of a step closure: panics become retryable errors, and an optional timeout
/// (on the engine's clock) bounds it.
async fn run_attempt<'a, T>(
    t: &TurnState,
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
            let deadline = t.env.sleep_until(millis_after(t.now(), limit));
            tokio::select! {
                biased;
                r = attempt => r,
                () = deadline => Err(StepError::retryable(format!("step attempt timed out after {limit:?}")).with_code(codes::TIMEOUT)),
            }
        }
    }
}

/// The handle a workflow body uses for every durable operation. Cheap to clone.
///
/// Only futures returned by this type may be awaited in a body (plus combinators over them
/// such as `join!`, `select!` and [`WorkflowCtx::all`]): anything else — a `tokio::time::sleep`,
/// a network call — is invisible to replay and makes the body non-deterministic. Put such
/// work in a step. A body pending on such an await, with no ctx call executing or parked,
/// fails its run with code `non_ctx_await` once
/// [`EngineConfig::non_ctx_await_grace`](crate::EngineConfig::non_ctx_await_grace) has passed.
#[derive(Clone)]
pub struct WorkflowCtx {
    pub(crate) t: Arc<TurnState>,
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
        self.t.turn.lock().is_replaying()
    }

    /// A local step: runs `f`, commits its output, then resolves to it. On replay the recorded
    /// output is returned without running `f`. No retries unless set with [`Step::retry`] /
    /// [`Step::options`] or [`WorkflowCtx::step_with`].
    ///
    /// Execution is at least once: a step cut off before its commit (the process killed, the
    /// lease lost) runs again in the run's next turn with the same attempt number, so make its
    /// side effects idempotent on [`StepContext::step_id`].
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
            queue: None,
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
        async move { recorded(&t, seq, &name, StepKind::SideEffect, f).await }
    }

    /// The engine clock's time, recorded once and replayed.
    pub fn now(&self) -> impl Future<Output = SystemTime> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let now = t.now();
            let ms: Millis = recorded(&t, seq, "now", StepKind::Now, move || now).await;
            UNIX_EPOCH + Duration::from_millis(ms)
        }
    }

    /// A random number, recorded once and replayed.
    pub fn random_u64(&self) -> impl Future<Output = u64> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move { recorded(&t, seq, "random", StepKind::Random, rand::random::<u64>).await }
    }

    /// A random (v4) UUID, recorded once and replayed.
    pub fn uuid(&self) -> impl Future<Output = uuid::Uuid> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move { recorded(&t, seq, "uuid", StepKind::Uuid, uuid::Uuid::new_v4).await }
    }

    /// Sleeps durably for `d`: the run suspends (its future is dropped, its lease released)
    /// and is woken when the time comes, on this or any other engine sharing the store.
    pub fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let until = millis_after(t.now(), d);
            durable_sleep(&t, seq, until).await
        }
    }

    /// Sleeps durably until `at` (no-op if it has passed).
    pub fn sleep_until(&self, at: SystemTime) -> impl Future<Output = ()> + Send + 'static + use<> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        let at = at.duration_since(UNIX_EPOCH).map_or(0, |d| millis_after(0, d));
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

    /// The last stage of a patch: once no run that took the old branch of
    /// `if ctx.patched(id) { new } else { old }` is still running, replace the `if` with
    /// `ctx.deprecate_patch(id)` followed by the new branch alone, and delete the old one.
    ///
    /// Runs that reach it fresh still record the patch marker (1 seq), so a binary that still
    /// calls `patched(id)` — an older worker during a rollout, or a rollback — replays them on
    /// the new path. A run whose history has the marker here consumes it; a run whose history
    /// has something else here (it passed this point before the patch existed) carries on
    /// without consuming a seq. Once no run recorded with the marker is still running, the
    /// call itself can go.
    ///
    /// ```no_run
    /// # async fn body(ctx: durable_runtime::WorkflowCtx) -> Result<(), durable_runtime::WorkflowError> {
    /// // Was: if ctx.patched("send-receipt-email") { email } (and nothing otherwise).
    /// ctx.deprecate_patch("send-receipt-email");
    /// ctx.step("email", |_| async { Ok(()) }).await?;
    /// # Ok(()) }
    /// ```
    pub fn deprecate_patch(&self, id: &str) {
        let now = self.t.now();
        self.t.turn.lock().deprecate_patch(id, now);
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

async fn durable_sleep(t: &Arc<TurnState>, seq: u32, until: Millis) {
    let _call = CallGuard::new(t, seq);
    loop {
        let begin = t.turn.lock().sleep(seq, until, t.now());
        match begin {
            SleepBegin::Done => return,
            SleepBegin::Stopped => halt().await,
            // A warm resume wakes it to begin again (as a replay of this seq would).
            SleepBegin::Park(_) => t.park_warm(seq, seq, None).await,
        }
    }
}

/// A value produced once and replayed (`now`, `random_u64`, `uuid`, `side_effect`).
async fn recorded<T, F>(t: &Arc<TurnState>, seq: u32, name: &str, kind: StepKind, produce: F) -> T
where
    T: Serialize + DeserializeOwned,
    F: FnOnce() -> T,
{
    let _call = CallGuard::new(t, seq);
    let begin = t.turn.lock().begin_record(seq, name, kind, t.now());
    match begin {
        RecordBegin::Return(p) => match t.decode(seq, name, &p) {
            Some(v) => v,
            None => halt().await,
        },
        RecordBegin::Produce => {
            let value = produce();
            let payload = Payload::encode_replayable(&value);
            let outcome = t.turn.lock().finish_record(seq, name, kind, payload, t.now());
            match outcome {
                RecordOutcome::Return => value,
                RecordOutcome::Commit(commit) => {
                    if !t.apply(seq, commit).await {
                        return halt().await;
                    }
                    value
                }
                RecordOutcome::Stopped => halt().await,
            }
        }
        RecordBegin::Park | RecordBegin::Stopped => halt().await,
    }
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
