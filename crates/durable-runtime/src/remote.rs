//! Workers: processes that execute remote steps ([`WorkflowCtx::remote_step`]) without an
//! engine. A worker claims tasks from the store with a lease, runs its handler for each,
//! heartbeats on the handler's behalf when asked, and reports the result; the store records
//! it on the run's checkpoint and wakes the run.
//!
//! [`WorkflowCtx::remote_step`]: crate::WorkflowCtx::remote_step

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use durable_core::task::{
    BeatOutcome, NewTask, PROTOCOL_VERSION, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, TaskLog, WorkerInfo,
};
use durable_core::{Millis, Payload, RunId, StepError, Store, TaskFilter, codes, millis_after, protocol};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use durable_core::{ControlMessage, ControlPlane, ControlSink, QueueReason, QueuedRun};
use durable_transport::Transport;

use crate::clock::{BoxFuture, Clock, SystemClock};
use crate::engine::Engine;
use crate::sched::eager::{Handed, LocalWorker};
use crate::sched::{FailureTally, Shared};

type Handler = Arc<dyn Fn(TaskContext, Payload) -> BoxFuture<'static, Result<Payload, StepError>> + Send + Sync>;

/// What a worker's handler gets besides its input.
#[derive(Clone)]
pub struct TaskContext {
    inner: Arc<TaskInner>,
}

struct TaskInner {
    task: Task,
    worker: String,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// Heartbeats closer together than this are folded into the next one.
    beat_every: u64,
    beat: Mutex<BeatState>,
    /// Set to true when the handler should stop: the run settled, the attempt expired or was
    /// taken over, or the worker is shutting down past its drain timeout.
    stop: watch::Sender<bool>,
    /// The worker is shutting down and hands the task back: whatever the handler returns is
    /// dropped (another worker runs the attempt; it is not counted as failed).
    handed_back: AtomicBool,
    /// A heartbeat found the attempt no longer this worker's (taken over, or replaced).
    lost: AtomicBool,
}

#[derive(Default)]
struct BeatState {
    last: Option<Millis>,
    progress: Option<Payload>,
    logs: Vec<TaskLog>,
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext").field("step_id", &self.step_id()).field("attempt", &self.attempt()).finish()
    }
}

impl TaskContext {
    /// The step's id, `<run>:<seq>`: the same for every attempt. Use it as the idempotency key
    /// of whatever the handler changes in the world.
    pub fn step_id(&self) -> String {
        self.inner.task.task.step_id()
    }

    /// The run the step belongs to.
    pub fn run_id(&self) -> &RunId {
        &self.inner.task.task.run_id
    }

    /// The step's seq in its run.
    pub fn seq(&self) -> u32 {
        self.inner.task.task.seq
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.inner.task.task.name
    }

    /// This attempt (from 1).
    pub fn attempt(&self) -> u32 {
        self.inner.task.task.attempt
    }

    /// Reports that the handler is alive, with optional progress shown by `durable runs show`,
    /// and extends the task's lease. Throttled: the first beat goes out at once, later ones at
    /// most once per a third of the step's `heartbeat_timeout` (the latest progress and logs
    /// ride with the next beat that goes out, or with the result). Returns `false` when the
    /// handler should stop ([`TaskContext::cancelled`] has resolved). Progress that does not
    /// serialize is logged (a warning) and left out; the beat still extends the lease.
    pub async fn heartbeat<P: Serialize + ?Sized>(&self, progress: &P) -> bool {
        let progress = Payload::encode(progress)
            .inspect_err(|e| {
                tracing::warn!(step_id = %self.step_id(), error = %e, "the heartbeat's progress does not serialize; the beat goes without it")
            })
            .ok();
        let now = self.inner.clock.now();
        let beat = {
            let mut b = self.inner.beat.lock();
            if progress.is_some() {
                b.progress = progress;
            }
            if b.last.is_some_and(|l| now < l.saturating_add(self.inner.beat_every)) {
                return !self.is_cancelled();
            }
            b.last = Some(now);
            TaskBeat {
                run_id: self.run_id().clone(),
                seq: self.seq(),
                attempt: self.attempt(),
                worker: self.inner.worker.clone(),
                progress: b.progress.take(),
                logs: std::mem::take(&mut b.logs),
                now,
            }
        };
        match self.inner.store.heartbeat_task(&beat).await {
            Ok(BeatOutcome::Extended(_)) => {}
            Ok(BeatOutcome::Lost) => {
                self.inner.lost.store(true, Ordering::Release);
                self.cancel();
            }
            Ok(BeatOutcome::Cancelled) => self.cancel(),
            Err(e) => tracing::warn!(step_id = %self.step_id(), error = %e, "heartbeat failed; the lease runs on"),
        }
        !self.is_cancelled()
    }

    /// Adds a log line to the step's record (stored with the next heartbeat or the result;
    /// `durable runs show` lists them). `level`: `trace`, `debug`, `info`, `warn` or `error`.
    pub fn log(&self, level: &str, message: impl Into<String>, data: Option<serde_json::Value>) {
        let line = TaskLog {
            attempt: self.attempt(),
            at: self.inner.clock.now(),
            level: level.to_string(),
            message: message.into(),
            data,
        };
        self.inner.beat.lock().logs.push(line);
    }

    /// Resolves when the handler should stop: the run was cancelled (or settled otherwise),
    /// the attempt passed its timeout, another worker took it over, the attempt was ended in
    /// the store (an operator's [`Engine::redispatch_pending`]; a heartbeat finds out at once,
    /// and the worker looks every 10 s at attempts running that long), or the worker is
    /// shutting down and its drain timeout passed. The handler then has 5 s to return before
    /// it is dropped, and its slot is free again. What it returns is recorded only if the
    /// store still takes it: a result for an attempt that ended or a run that settled is
    /// dropped, and so is one returned during a shutdown (its task goes to another worker),
    /// and a failure returned after a heartbeat said another worker took the attempt over
    /// (that worker finishes it; past 5 claims of the attempt the failure counts again).
    pub async fn cancelled(&self) {
        let mut rx = self.inner.stop.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// Whether [`TaskContext::cancelled`] has resolved.
    pub fn is_cancelled(&self) -> bool {
        *self.inner.stop.borrow()
    }

    fn cancel(&self) {
        self.inner.stop.send_replace(true);
    }
}

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    store: Option<Arc<dyn Store>>,
    transport: Option<Arc<dyn Transport>>,
    clock: Arc<dyn Clock>,
    engine: Option<Weak<Shared>>,
    wakeups: Option<Arc<Notify>>,
    control: Option<Arc<dyn ControlPlane>>,
    handlers: HashMap<String, Handler>,
    queues: Vec<String>,
    capabilities: Vec<String>,
    namespace: Option<String>,
    concurrency: usize,
    id: Option<String>,
    poll_interval: Duration,
    drain_timeout: Duration,
    register_interval: Duration,
    max_payload_bytes: Option<usize>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .field("capabilities", &self.capabilities)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl WorkerBuilder {
    /// The store the engines write to (required, unless [`WorkerBuilder::engine`] gives it).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Runs beside an engine in this process: its store and clock, a wake-up as soon as the
    /// engine dispatches a task, the run woken at once when a result is recorded, and the
    /// engine's control plane (unless [`WorkerBuilder::control_plane`] gives one).
    ///
    /// While [`Worker::run`] lasts, the engine hands the worker the tasks it serves straight
    /// from the commits that dispatch them (eager dispatch), as long as the worker has a free
    /// slot and its last claim came back short (no tasks wait for it in the store, which keep
    /// their priority and age order) and the store declares
    /// [`Capabilities::claimed_dispatch`](durable_core::Capabilities::claimed_dispatch): each
    /// is written claimed by this worker in that commit, so no claim round trip follows and no
    /// other worker is woken for it ([`WorkerReport::eager`] counts them). Its lease and the
    /// attempt's timeout count from that commit. A task handed over here is leased like a
    /// claimed one: if the process dies before its handler starts, another worker takes it
    /// once its lease passes.
    pub fn engine(mut self, engine: &Engine) -> Self {
        self.store = Some(engine.store().clone());
        self.clock = engine.clock().clone();
        self.wakeups = Some(engine.shared().task_dispatched.clone());
        self.engine = Some(Arc::downgrade(engine.shared()));
        self.control.get_or_insert_with(|| engine.control_plane().clone());
        self.max_payload_bytes.get_or_insert(engine.config().max_payload_bytes);
        self
    }

    /// The largest output a handler may return, in bytes of JSON (default: the engine's
    /// [`EngineConfig::max_payload_bytes`](crate::EngineConfig::max_payload_bytes) beside an
    /// engine, else 4 MiB, that setting's default). A larger output fails the attempt at once,
    /// fatal, with code `payload_too_large`, and is never written to the store.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = Some(bytes);
        self
    }

    /// The control plane the engines publish on (the one given to
    /// [`EngineBuilder::control_plane`](crate::EngineBuilder::control_plane)). Through it the
    /// worker
    /// - cancels a running handler ([`TaskContext::cancelled`] resolves) as soon as an operator
    ///   cancels its run, instead of at its next poll interval;
    /// - claims at once when an engine announces tasks on a queue it serves (like
    ///   [`WorkerBuilder::wakeups`]);
    /// - announces the tasks it hands back when it drains, so another worker takes them now.
    ///
    /// Polling stays on as the safety net (a message may be lost).
    pub fn control_plane(mut self, plane: impl ControlPlane) -> Self {
        self.control = Some(Arc::new(plane));
        self
    }

    /// The run queue the engines consume (for example a `QueueTransport` on the same store):
    /// each recorded result sends the run a wake through it, so an engine resumes the run at
    /// once instead of at its next poll of the store. Without it (and without
    /// [`WorkerBuilder::engine`]) engines find woken runs by polling.
    pub fn transport(mut self, transport: impl Transport) -> Self {
        self.transport = Some(Arc::new(transport));
        self
    }

    /// The clock (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Nudges that say "tasks may be waiting, look now" (for example
    /// `PostgresStore::task_wakeups()`); polling stays on as the safety net.
    pub fn wakeups(mut self, wakeups: Arc<Notify>) -> Self {
        self.wakeups = Some(wakeups);
        self
    }

    /// Handles the remote step `name` (and serves the queue of the same name). A handler's
    /// error fails the attempt; the workflow's retry policy decides what follows
    /// ([`StepError::fatal`] is never retried). An input that does not decode into `I` fails
    /// the step at once.
    ///
    /// # Panics
    /// On an empty name: no step can be dispatched to it.
    pub fn handle<I, O, F, Fut>(mut self, name: &str, handler: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(TaskContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, StepError>> + Send + 'static,
    {
        assert!(!name.is_empty(), "Worker::handle: a remote step's name must be non-empty");
        let handler = Arc::new(handler);
        let step = name.to_string();
        let erased: Handler = Arc::new(move |ctx: TaskContext, input: Payload| {
            let handler = handler.clone();
            let step = step.clone();
            Box::pin(async move {
                let input: I = input.decode().map_err(|e| {
                    StepError::fatal(format!(
                        "the input of remote step {step:?} ({}) does not decode into the handler's type: {e}",
                        ctx.step_id()
                    ))
                    .with_code(codes::BAD_PAYLOAD)
                })?;
                let out = handler(ctx, input).await?;
                Payload::encode(&out).map_err(|e| {
                    StepError::fatal(format!("the output of remote step {step:?} does not serialize: {e}"))
                        .with_code(codes::BAD_PAYLOAD)
                })
            })
        });
        self.handlers.insert(name.to_string(), erased);
        if !self.queues.iter().any(|q| q == name) {
            self.queues.push(name.to_string());
        }
        self
    }

    /// Also serves this queue (for steps that set [`RemoteStep::queue`](crate::RemoteStep::queue));
    /// its tasks must name a step this worker handles.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        let queue = queue.into();
        if !self.queues.contains(&queue) {
            self.queues.push(queue);
        }
        self
    }

    /// What this worker offers; steps `requires` them.
    pub fn capabilities<I, S>(mut self, capabilities: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.capabilities = capabilities.into_iter().map(Into::into).collect();
        self
    }

    /// Only tasks of runs in this namespace (default: every namespace).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Tasks at once (default 16; at least 1: 0 is taken as 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// The worker's id (default `worker-<pid>-<random>`), shown by `durable workers`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// How often an idle worker looks for tasks without a nudge, and at the runs of its running
    /// tasks to stop the handlers of settled ones (default 200 ms; 2 s with
    /// [`WorkerBuilder::wakeups`], [`WorkerBuilder::engine`] or
    /// [`WorkerBuilder::control_plane`]).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a shutdown lets running handlers finish before they are cancelled and their
    /// tasks handed back (default 30 s). A cancelled handler then has 5 s to return (its
    /// `cancelled()` branch runs) before it is dropped.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Builds the worker.
    ///
    /// # Panics
    /// Without a store, or without a handler.
    pub fn build(self) -> Worker {
        let store = self.store.expect("Worker::builder() needs .store(..) or .engine(..)");
        assert!(!self.handlers.is_empty(), "a worker needs at least one .handle(name, handler)");
        crate::metrics::describe();
        let nudged = self.wakeups.is_some() || self.control.is_some();
        let poll =
            if nudged && self.poll_interval == DEFAULT_POLL { Duration::from_secs(2) } else { self.poll_interval };
        let id = self.id.unwrap_or_else(|| {
            format!("worker-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8])
        });
        Worker {
            inner: Arc::new(WorkerInner {
                store,
                transport: self.transport,
                clock: self.clock,
                engine: self.engine,
                wakeups: self.wakeups,
                control: self.control,
                handlers: self.handlers,
                queues: self.queues,
                capabilities: self.capabilities,
                namespace: self.namespace,
                concurrency: self.concurrency,
                id,
                poll_interval: poll,
                drain_timeout: self.drain_timeout,
                register_interval: self.register_interval,
                max_payload_bytes: self.max_payload_bytes.unwrap_or(crate::config::DEFAULT_MAX_PAYLOAD_BYTES),
                wake_failures: Mutex::new(FailureTally::default()),
            }),
        }
    }

    /// Builds the worker and runs it until `shutdown` resolves (see [`Worker::run`]).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> WorkerReport {
        self.build().run(shutdown).await
    }
}

const DEFAULT_POLL: Duration = Duration::from_millis(200);

/// A process's executor of remote steps ([`WorkflowCtx::remote_step`](crate::WorkflowCtx::remote_step)),
/// without an engine: it claims tasks from the store with a lease, runs its handler for each,
/// heartbeats when the handler asks ([`TaskContext::heartbeat`]), and reports the result; the
/// store records it on the run's checkpoint and wakes the run.
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn durable_core::Store>) {
/// use durable_runtime::{StepError, Worker};
/// let report = Worker::builder()
///     .store(store)
///     .handle("resize", |ctx, url: String| async move {
///         ctx.heartbeat(&"downloading").await;
///         Ok::<_, StepError>(format!("{url}.small.png"))
///     })
///     .capabilities(["gpu"])
///     .concurrency(4)
///     .run(durable_runtime::shutdown_signal())
///     .await;
/// println!("{report:?}");
/// # }
/// ```
#[derive(Clone)]
pub struct Worker {
    inner: Arc<WorkerInner>,
}

struct WorkerInner {
    store: Arc<dyn Store>,
    transport: Option<Arc<dyn Transport>>,
    clock: Arc<dyn Clock>,
    engine: Option<Weak<Shared>>,
    wakeups: Option<Arc<Notify>>,
    control: Option<Arc<dyn ControlPlane>>,
    handlers: HashMap<String, Handler>,
    queues: Vec<String>,
    capabilities: Vec<String>,
    namespace: Option<String>,
    concurrency: usize,
    id: String,
    poll_interval: Duration,
    drain_timeout: Duration,
    register_interval: Duration,
    max_payload_bytes: usize,
    /// The wakes the transport refused (a broker outage), reported once a minute with a count.
    wake_failures: Mutex<FailureTally>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("id", &self.inner.id).field("queues", &self.inner.queues).finish()
    }
}

/// What a worker did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Tasks claimed.
    pub claimed: u64,
    /// Of those, the tasks an engine beside the worker dispatched straight to it, claimed in
    /// the commit that dispatched them (eager dispatch, see [`WorkerBuilder::engine`]).
    pub eager: u64,
    /// Results the store recorded.
    pub completed: u64,
    /// Results the store dropped: a duplicate or late result, or the run had settled.
    pub dropped: u64,
    /// Tasks handed back at shutdown, unfinished.
    pub handed_back: u64,
}

impl Worker {
    /// Starts building a worker.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            store: None,
            transport: None,
            clock: Arc::new(SystemClock),
            engine: None,
            wakeups: None,
            control: None,
            handlers: HashMap::new(),
            queues: Vec::new(),
            capabilities: Vec::new(),
            namespace: None,
            concurrency: 16,
            id: None,
            poll_interval: DEFAULT_POLL,
            drain_timeout: Duration::from_secs(30),
            register_interval: Duration::from_secs(5),
            max_payload_bytes: None,
        }
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Claims and runs tasks until `shutdown` resolves (for example
    /// [`shutdown_signal`](crate::shutdown_signal), SIGTERM or Ctrl-C), then drains: it stops
    /// claiming, lets running handlers finish for up to the drain timeout, cancels the rest
    /// and hands their tasks back so another worker takes them at once.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> WorkerReport {
        let w = &self.inner;
        let mut report = WorkerReport::default();
        let mut running: JoinSet<Outcome> = JoinSet::new();
        let mut inflight: HashMap<AttemptKey, TaskContext> = HashMap::new();
        let started_at = w.clock.now();
        let mut registered_at: Option<Millis> = None;
        let (mut checked_at, mut attempts_checked_at): (Millis, Millis) = (0, 0);
        let (mut look, mut saturated, mut next_poll) = (true, false, 0);
        tokio::pin!(shutdown);
        let never = Notify::new();
        let nudges = w.wakeups.as_deref().unwrap_or(&never);
        // Armed before any claim and re-armed only once it fired (then a claim follows), so
        // no nudge falls between two looks.
        let mut nudged = Box::pin(nudges.notified());
        nudged.as_mut().enable();
        let mut heard = self.hear().await;
        // The worker's execution slots: its claims take them, and so do the tasks an engine
        // beside it dispatches straight to it (eager dispatch), each with its slot.
        let slots = Arc::new(Semaphore::new(w.concurrency));
        let backlog = Arc::new(AtomicBool::new(false));
        let mut handed = self.take_eagerly(&slots, &backlog);
        loop {
            let now = w.clock.now();
            while let Some(done) = running.try_join_next() {
                self.settled(done, &mut inflight, &mut report);
            }
            while let Some(h) = handed.as_mut().and_then(|rx| rx.try_recv().ok()) {
                look |= !self.start_handed(h, &mut running, &mut inflight, &mut report);
            }
            if !inflight.is_empty() && now >= millis_after(checked_at, w.poll_interval) {
                checked_at = now;
                self.stop_settled_runs(&inflight).await;
                if now >= millis_after(attempts_checked_at, ATTEMPT_CHECK_EVERY) {
                    attempts_checked_at = now;
                    self.stop_ended_attempts(&inflight, now).await;
                }
            }
            // A claim is a write: look when told to (a nudge), on the poll interval (leases
            // that expired, tasks another process queued), or when the last claim filled
            // every slot and one has freed since (tasks may be waiting) — not after every
            // finished task.
            if now >= next_poll {
                look = true;
            }
            let free = slots.available_permits();
            // The claim's slots, taken before it: an engine beside the worker may hand it
            // tasks meanwhile, which take slots of their own.
            let claim_slots = if free > 0 && (look || saturated) {
                slots.clone().try_acquire_many_owned(u32::try_from(free).unwrap_or(u32::MAX)).ok()
            } else {
                None
            };
            if claim_slots.is_none() && now >= next_poll {
                // Every slot is taken: the claim waits for one to free (`look` stays set), and
                // the loop for the next poll, not for a time already past (a busy loop).
                next_poll = millis_after(now, w.poll_interval);
            }
            if let Some(mut claim_slots) = claim_slots {
                look = false;
                next_poll = millis_after(now, w.poll_interval);
                let claim = TaskClaim {
                    limit: free,
                    // Read afresh: the loop may have waited on the store since `now`, and a
                    // claim stamped in the past would start the attempt's timeout early.
                    now: w.clock.now(),
                    ..self.route()
                };
                match w.store.claim_tasks(&claim).await {
                    Ok(tasks) => {
                        saturated = tasks.len() == free;
                        // Tasks may be left in the store: take none eagerly until a claim
                        // comes back short.
                        backlog.store(saturated, Ordering::Release);
                        report.claimed += tasks.len() as u64;
                        let mut surplus = Vec::new();
                        for task in tasks {
                            // Our own task back after its lease expired: its handler still runs
                            // here (the claim renewed its lease); never run it twice at once.
                            if inflight.contains_key(&attempt_key(&task)) {
                                continue;
                            }
                            // At most `free` tasks: each takes one of the claim's slots.
                            match claim_slots.split(1) {
                                Some(slot) => self.start(task, slot, &mut running, &mut inflight),
                                None => surplus.push((task.task.run_id, task.task.seq, task.task.attempt)),
                            }
                        }
                        if !surplus.is_empty() {
                            tracing::warn!(worker = %w.id, tasks = surplus.len(), "the store answered a claim with more tasks than asked for; handing them back");
                            if let Err(e) = w.store.release_tasks(&surplus, &w.id).await {
                                tracing::warn!(worker = %w.id, error = %e, "could not hand back surplus tasks; they return when their leases expire");
                            }
                        }
                    }
                    Err(e) => tracing::warn!(worker = %w.id, error = %e, "could not claim tasks; trying again"),
                }
            }
            // After the claim: a worker that shows as live has made its first claim, and takes
            // tasks eagerly unless that claim filled its slots.
            if registered_at.is_none_or(|at| now >= millis_after(at, w.register_interval)) {
                match w.store.register_worker(&self.info(started_at, now)).await {
                    Ok(()) => registered_at = Some(now),
                    Err(e) => tracing::warn!(worker = %w.id, error = %e, "could not publish the worker's descriptor"),
                }
            }
            let idle = w.clock.sleep_until(next_poll);
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(done) = running.join_next(), if !running.is_empty() => {
                    self.settled(done, &mut inflight, &mut report);
                }
                Some(h) = async { handed.as_mut()?.recv().await }, if handed.is_some() => {
                    look |= !self.start_handed(h, &mut running, &mut inflight, &mut report);
                }
                _ = &mut nudged => {
                    look = true;
                    nudged = Box::pin(nudges.notified());
                    nudged.as_mut().enable();
                }
                Some(first) = heard.recv() => {
                    let mut next = Some(first);
                    while let Some(message) = next {
                        match message {
                            Heard::Cancel(run_id) => self.cancel_run_tasks(&run_id, &inflight),
                            Heard::Queued => {
                                look = true;
                                backlog.store(true, Ordering::Release);
                            }
                        }
                        next = heard.try_recv().ok();
                    }
                }
                _ = idle => {}
            }
        }
        // No more tasks from the engine; those it handed over meanwhile are not started: they
        // go back to the store with the unfinished ones.
        let mut unstarted = Vec::new();
        if let Some(mut rx) = handed.take() {
            if let Some(shared) = w.engine.as_ref().and_then(Weak::upgrade) {
                shared.eager.unregister(&w.id);
            }
            rx.close();
            while let Ok(h) = rx.try_recv() {
                report.claimed += 1;
                report.eager += 1;
                unstarted.push(h.task.task);
            }
        }
        self.drain(running, inflight, unstarted, &mut report).await;
        let _ = w.store.remove_worker(&w.id).await;
        report
    }

    /// The worker's claim, for no task yet (`limit` 0): its id, queues, namespace and
    /// capabilities.
    fn route(&self) -> TaskClaim {
        let w = &self.inner;
        TaskClaim {
            worker: w.id.clone(),
            queues: w.queues.clone(),
            namespace: w.namespace.clone(),
            capabilities: w.capabilities.clone(),
            limit: 0,
            now: 0,
        }
    }

    /// Beside an engine: registers with it to take tasks straight from its commits, in
    /// `slots`; the receiver of those tasks. `None` without an engine.
    fn take_eagerly(
        &self,
        slots: &Arc<Semaphore>,
        backlog: &Arc<AtomicBool>,
    ) -> Option<mpsc::UnboundedReceiver<Handed>> {
        let w = &self.inner;
        let shared = w.engine.as_ref().and_then(Weak::upgrade)?;
        let (tx, rx) = mpsc::unbounded_channel();
        shared.eager.register(LocalWorker {
            route: self.route(),
            slots: slots.clone(),
            backlog: backlog.clone(),
            tasks: tx,
        });
        Some(rx)
    }

    /// Starts a task an engine beside the worker handed it, unless the same attempt already
    /// runs here (its lease passed and a claim of this worker took it first) or its lease
    /// passed (another worker may hold it now; a claim takes it if it is still there):
    /// `false` then, and the worker should look.
    fn start_handed(
        &self,
        handed: Handed,
        running: &mut JoinSet<Outcome>,
        inflight: &mut HashMap<AttemptKey, TaskContext>,
        report: &mut WorkerReport,
    ) -> bool {
        let running_here = inflight.contains_key(&attempt_key(&handed.task));
        if running_here || handed.task.lease_until.is_some_and(|l| l <= self.inner.clock.now()) {
            return false;
        }
        report.claimed += 1;
        report.eager += 1;
        self.start(handed.task, handed.slot, running, inflight);
        true
    }

    /// Runs the handler of a claimed task in `slot`, tracked in `inflight` until it ends.
    fn start(
        &self,
        task: Task,
        slot: OwnedSemaphorePermit,
        running: &mut JoinSet<Outcome>,
        inflight: &mut HashMap<AttemptKey, TaskContext>,
    ) {
        let key = attempt_key(&task);
        // One span per attempt, in the run's trace.
        let span = crate::trace::task_span(&task, &self.inner.id);
        let ctx = self.context(task);
        inflight.insert(key.clone(), ctx.clone());
        // Whatever happens in it, the task ends with its key: a task lost from `inflight` only
        // by a panic would stay claimed here forever.
        let execute = Box::pin(self.clone().execute(ctx).instrument(span));
        running.spawn(async move {
            let _slot = slot;
            crate::turn::CatchUnwind(execute).await.unwrap_or_else(|panic| {
                tracing::error!(run_id = %key.0, seq = key.1, "a remote step's task panicked in the worker: {panic}");
                Outcome { key, completion: None, dropped: true }
            })
        });
    }

    /// Subscribes to the control plane, if the worker has one: cancels of any run, and tasks
    /// queued on a queue it serves (in its namespace, or of an unknown one). The subscription
    /// outlives this run of the worker; once the receiver is gone it costs a check per message.
    async fn hear(&self) -> mpsc::UnboundedReceiver<Heard> {
        let w = &self.inner;
        let (tx, rx) = mpsc::unbounded_channel();
        let Some(plane) = &w.control else { return rx };
        let (queues, namespace) = (w.queues.clone(), w.namespace.clone());
        let sink: ControlSink = Arc::new(move |message| {
            let heard = match message {
                ControlMessage::Cancel { run_id, .. } => Heard::Cancel(run_id),
                ControlMessage::Enqueued { queue: Some(queue), namespace: queued, .. }
                    if queues.contains(&queue)
                        && namespace.as_ref().zip(queued.as_ref()).is_none_or(|(mine, theirs)| mine == theirs) =>
                {
                    Heard::Queued
                }
                _ => return,
            };
            let _ = tx.send(heard);
        });
        if let Err(e) = plane.subscribe(sink).await {
            tracing::warn!(worker = %w.id, error = %e, "could not subscribe to the control plane; cancels and nudges are found by polling");
        }
        rx
    }

    /// An operator cancelled `run_id`: the handlers of its tasks running here are told at once.
    fn cancel_run_tasks(&self, run_id: &RunId, inflight: &HashMap<AttemptKey, TaskContext>) {
        for ((run, _, _), ctx) in inflight {
            if run == run_id && !ctx.is_cancelled() {
                tracing::debug!(worker = %self.inner.id, step_id = %ctx.step_id(), "the run was cancelled; cancelling its task");
                ctx.cancel();
            }
        }
    }

    /// Tells the handlers of tasks whose run has settled (a cancel, say) to stop.
    async fn stop_settled_runs(&self, inflight: &HashMap<AttemptKey, TaskContext>) {
        let mut ids: Vec<RunId> = inflight.keys().map(|(run, _, _)| run.clone()).collect();
        ids.sort();
        ids.dedup();
        match self.inner.store.get_runs(&ids).await {
            Ok(runs) => {
                for ((run, _, _), ctx) in inflight {
                    if !runs.iter().any(|r| &r.id == run && !r.status.is_terminal()) {
                        ctx.cancel();
                    }
                }
            }
            Err(e) => {
                tracing::warn!(worker = %self.inner.id, error = %e, "could not look at the runs of running tasks")
            }
        }
    }

    /// Tells the handlers of attempts that ended in the store while they ran (an operator's
    /// `redispatch_pending`, a timeout the engine enforced) to stop: each such handler then
    /// has [`CANCEL_GRACE`] to return before it is dropped and its slot is free again. Only
    /// attempts in flight for [`ATTEMPT_CHECK_EVERY`] are looked at, one read per run, at
    /// most once per that interval: a short task costs nothing.
    async fn stop_ended_attempts(&self, inflight: &HashMap<AttemptKey, TaskContext>, now: Millis) {
        let mut runs: Vec<&RunId> = inflight
            .iter()
            .filter(|(_, ctx)| {
                let since = ctx.inner.task.claimed_at.unwrap_or(ctx.inner.task.task.created_at);
                !ctx.is_cancelled() && now >= millis_after(since, ATTEMPT_CHECK_EVERY)
            })
            .map(|((run, _, _), _)| run)
            .collect();
        runs.sort();
        runs.dedup();
        for run in runs {
            let filter = TaskFilter {
                run_id: Some(run.clone()),
                unfinished: true,
                limit: OPEN_TASKS_READ,
                ..TaskFilter::default()
            };
            let open = match self.inner.store.list_tasks(&filter).await {
                // A full page may leave open attempts out: none is taken for ended then.
                Ok(open) if open.len() < OPEN_TASKS_READ => open,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(worker = %self.inner.id, run_id = %run, error = %e, "could not look at the tasks of a run");
                    continue;
                }
            };
            for ((r, seq, attempt), ctx) in inflight.iter().filter(|((r, _, _), _)| r == run) {
                if !open.iter().any(|t| t.task.seq == *seq && t.task.attempt == *attempt) {
                    tracing::info!(worker = %self.inner.id, run_id = %r, seq, attempt, "the attempt ended in the store (re-dispatched or timed out); cancelling its handler");
                    ctx.cancel();
                }
            }
        }
    }

    /// Lets running handlers finish for the drain timeout, cancels the rest and hands their
    /// tasks back to the store with `unstarted` (tasks handed over by an engine and never
    /// started).
    async fn drain(
        &self,
        mut running: JoinSet<Outcome>,
        mut inflight: HashMap<AttemptKey, TaskContext>,
        unstarted: Vec<NewTask>,
        report: &mut WorkerReport,
    ) {
        let w = &self.inner;
        let deadline = tokio::time::Instant::now() + w.drain_timeout;
        // Handlers of runs that have settled meanwhile are told to stop now, not left to run
        // out the drain timeout.
        if !inflight.is_empty() {
            self.stop_settled_runs(&inflight).await;
        }
        loop {
            tokio::select! {
                biased;
                done = running.join_next() => match done {
                    Some(done) => self.settled(done, &mut inflight, report),
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        // Handlers that ended as the deadline came: settled, not handed back.
        while let Some(done) = running.try_join_next() {
            self.settled(done, &mut inflight, report);
        }
        // The rest are told to stop (`cancelled()`) and get the grace a cancelled attempt
        // gets (see `execute`) to run their cleanup and return, before they are dropped. What
        // they return is dropped: their tasks go back to the store below, for another worker.
        for ctx in inflight.values() {
            ctx.inner.handed_back.store(true, Ordering::Release);
            ctx.cancel();
        }
        let grace = tokio::time::Instant::now() + CANCEL_GRACE;
        loop {
            tokio::select! {
                biased;
                done = running.join_next() => match done {
                    // A result recorded before the handler was told (it was reporting then):
                    // settled, not handed back. A dropped one is handed back below.
                    Some(Ok(outcome)) if outcome.completion.is_some() => self.settled(Ok(outcome), &mut inflight, report),
                    Some(_) => {}
                    None => break,
                },
                _ = tokio::time::sleep_until(grace) => break,
            }
        }
        running.abort_all();
        while running.join_next().await.is_some() {}
        let tasks: Vec<&NewTask> = inflight.values().map(|ctx| &ctx.inner.task.task).chain(&unstarted).collect();
        if tasks.is_empty() {
            return;
        }
        let back: Vec<(RunId, u32, u32)> = tasks.iter().map(|t| (t.run_id.clone(), t.seq, t.attempt)).collect();
        report.handed_back += back.len() as u64;
        let queues: std::collections::BTreeSet<(String, String)> =
            tasks.iter().map(|t| (t.namespace.clone(), t.queue.clone())).collect();
        match w.store.release_tasks(&back, &w.id).await {
            Ok(_) => {
                // Other workers take them now, not at their next poll.
                if let (Some(plane), false) = (&w.control, queues.is_empty()) {
                    let messages = queues
                        .into_iter()
                        .map(|(namespace, queue)| ControlMessage::Enqueued {
                            origin: w.id.clone(),
                            namespace: Some(namespace),
                            queue: Some(queue),
                        })
                        .collect();
                    if let Err(e) = plane.publish_all(messages).await {
                        tracing::debug!(worker = %w.id, error = %e, "could not announce the tasks handed back");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(worker = %w.id, error = %e, "could not hand tasks back; they return when their leases expire")
            }
        }
    }

    fn settled(
        &self,
        done: Result<Outcome, tokio::task::JoinError>,
        inflight: &mut HashMap<AttemptKey, TaskContext>,
        report: &mut WorkerReport,
    ) {
        let Ok(outcome) = done else { return };
        inflight.remove(&outcome.key);
        match outcome.completion {
            Some(TaskCompletion::Accepted) => report.completed += 1,
            Some(_) => report.dropped += 1,
            None if outcome.dropped => report.dropped += 1,
            None => {}
        }
    }

    fn info(&self, started_at: Millis, now: Millis) -> WorkerInfo {
        let w = &self.inner;
        WorkerInfo {
            id: w.id.clone(),
            queues: w.queues.clone(),
            capabilities: w.capabilities.clone(),
            protocol_min: PROTOCOL_VERSION,
            protocol_max: PROTOCOL_VERSION,
            concurrency: w.concurrency as u32,
            started_at,
            heartbeat_at: now,
        }
    }

    fn context(&self, task: Task) -> TaskContext {
        let w = &self.inner;
        let beat_every = (task.task.heartbeat_timeout_ms / 3).max(1);
        TaskContext {
            inner: Arc::new(TaskInner {
                task,
                worker: w.id.clone(),
                store: w.store.clone(),
                clock: w.clock.clone(),
                beat_every,
                beat: Mutex::new(BeatState::default()),
                stop: watch::channel(false).0,
                handed_back: AtomicBool::new(false),
                lost: AtomicBool::new(false),
            }),
        }
    }

    /// Runs one task's handler (cancelled at the attempt's deadline) and reports its result.
    async fn execute(self, ctx: TaskContext) -> Outcome {
        let w = &self.inner;
        let task = &ctx.inner.task;
        let key = attempt_key(task);
        let result = match w.handlers.get(&task.task.name) {
            // Another worker of the queue may have it (a rolling deploy): retryable.
            None => Err(StepError::retryable(format!(
                "worker {} serves queue {:?} but has no handler for remote step {:?}",
                w.id, task.task.queue, task.task.name
            ))
            .with_code(codes::NO_HANDLER)),
            Some(handler) => {
                let began = std::time::Instant::now();
                // A panic fails the attempt like an error (the retry policy decides what
                // follows), as in a local step; uncaught, it left the task in flight here,
                // claimed again at each lease expiry and never run.
                let name = &task.task.name;
                let handled = crate::turn::CatchUnwind(handler(ctx.clone(), task.task.input.clone()));
                let run = async move {
                    handled.await.unwrap_or_else(|panic| {
                        Err(StepError::retryable(format!("the handler of remote step {name:?} panicked: {panic}"))
                            .with_code(codes::PANIC))
                    })
                };
                let deadline = task.deadline();
                // At the attempt's deadline, or when the store says stop, the handler is told
                // (`cancelled()`) and given a grace to return before it is dropped.
                let stop = async {
                    let expire = async {
                        match deadline {
                            Some(at) => w.clock.sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = expire => ctx.cancel(),
                        _ = ctx.cancelled() => {}
                    }
                    tokio::time::sleep(CANCEL_GRACE).await;
                };
                let result = tokio::select! {
                    r = run => r,
                    _ = stop => {
                        crate::metrics::task_result_dropped("expired");
                        return Outcome::dropped(key);
                    }
                };
                crate::metrics::task_handled(&task.task.queue, result.is_ok(), began.elapsed());
                result
            }
        };
        // An output over the limit is refused here, before it is written (as a local step's).
        let result = result.and_then(|out| {
            if out.len() <= w.max_payload_bytes {
                return Ok(out);
            }
            let what = format_args!("the output of remote step {:?} ({})", task.task.name, ctx.step_id());
            Err(StepError::payload_too_large(what, out.len(), w.max_payload_bytes))
        });
        // A handler told to stop by a shutdown: its task goes back to the store.
        if ctx.inner.handed_back.load(Ordering::Acquire) {
            return Outcome::dropped(key);
        }
        // A result past the attempt's deadline is not reported: the attempt has expired.
        if task.deadline().is_some_and(|d| w.clock.now() >= d) {
            crate::metrics::task_result_dropped("expired");
            return Outcome::dropped(key);
        }
        // A failure after a heartbeat said the attempt is no longer this worker's (another
        // worker took it over once this one's lease lapsed) is not its to report: recorded, it
        // would end that worker's attempt too. A success is reported (the work is done; the
        // first result counts). Past a few takeovers of the attempt the failure is reported
        // all the same, so stalls that keep recurring still reach the retry policy.
        if result.is_err() && ctx.inner.lost.load(Ordering::Acquire) && task.claims < DROP_FAILURES_UP_TO_CLAIMS {
            crate::metrics::task_result_dropped("lease_lost");
            tracing::info!(step_id = %ctx.step_id(), attempt = ctx.attempt(), "the attempt was taken over by another worker; this worker's error is dropped");
            return Outcome::dropped(key);
        }
        crate::trace::outcome(&tracing::Span::current(), if result.is_ok() { "completed" } else { "failed" });
        let logs = std::mem::take(&mut ctx.inner.beat.lock().logs);
        let done = TaskDone {
            run_id: task.task.run_id.clone(),
            seq: task.task.seq,
            attempt: task.task.attempt,
            worker: Some(w.id.clone()),
            result,
            logs,
            now: w.clock.now(),
        };
        let completion = self.report(done, task.task.namespace.clone(), &task.task.queue).await;
        Outcome { key, completion, dropped: false }
    }

    /// Hands a result to the store (retrying a failing store a few times; after that the task's
    /// lease runs out and another worker runs it again).
    async fn report(&self, done: TaskDone, namespace: String, queue: &str) -> Option<TaskCompletion> {
        let w = &self.inner;
        let shared = w.engine.as_ref().and_then(Weak::upgrade);
        let run_id = done.run_id.clone();
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=5 {
            // Beside an engine, the engine records it and wakes the run (starting its turn in
            // the same store call when it can).
            let recorded = match &shared {
                Some(s) => s.complete_and_execute(done.clone(), &namespace).await,
                None => w.store.complete_task(done.clone()).await,
            };
            match recorded {
                Ok(c) => {
                    match c {
                        TaskCompletion::Accepted => {
                            crate::metrics::task_recorded(
                                queue,
                                if done.result.is_ok() { "completed" } else { "failed" },
                            );
                            // Beside an engine, `complete_and_execute` woke the run.
                            if shared.is_none()
                                && let Some(t) = &w.transport
                            {
                                let item = QueuedRun {
                                    id: 0,
                                    reason: QueueReason::Wake,
                                    namespace: Some(namespace.clone()),
                                    priority: 0,
                                    dedupe_key: format!("remote:{}:{}:{}", run_id, done.seq, done.attempt),
                                    run_id,
                                };
                                if let Err(e) = t.dispatch_runs(Some(&namespace), vec![item]).await
                                    && let Some(failures) = w.wake_failures.lock().failed(1)
                                {
                                    tracing::warn!(
                                        run_id = %done.run_id,
                                        seq = done.seq,
                                        error = %e,
                                        failures,
                                        "could not send {failures} runs their wakes since the last report, the latest \
                                         this one (the transport refused them; engines find the runs at their next poll)"
                                    );
                                }
                            }
                        }
                        TaskCompletion::Duplicate => {
                            crate::metrics::task_result_dropped("duplicate");
                            tracing::debug!(step_id = %protocol::step_id(&done.run_id, done.seq), attempt = done.attempt, "duplicate or late result dropped")
                        }
                        TaskCompletion::RunTerminal => {
                            crate::metrics::task_result_dropped("run_settled");
                            tracing::info!(run_id = %done.run_id, seq = done.seq, "result dropped: the run has settled")
                        }
                    }
                    return Some(c);
                }
                Err(e) if attempt < 5 => {
                    tracing::warn!(run_id = %done.run_id, seq = done.seq, error = %e, "could not record a result; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    tracing::error!(run_id = %done.run_id, seq = done.seq, error = %e, "could not record a result; the task returns when its lease expires");
                }
            }
        }
        None
    }
}

/// An attempt a worker runs: its run, seq and attempt number. Two attempts of one step may
/// run on one worker at once (the first told to stop, the second re-dispatched to it).
type AttemptKey = (RunId, u32, u32);

fn attempt_key(task: &Task) -> AttemptKey {
    (task.task.run_id.clone(), task.task.seq, task.task.attempt)
}

/// What a worker heard on its control plane.
enum Heard {
    /// An operator cancelled this run.
    Cancel(RunId),
    /// Tasks were queued on a queue the worker serves.
    Queued,
}

struct Outcome {
    key: AttemptKey,
    completion: Option<TaskCompletion>,
    /// The worker dropped the result itself (the attempt expired, or the handler did not
    /// return within its grace after being cancelled).
    dropped: bool,
}

impl Outcome {
    /// The worker dropped the attempt's result (its span says so).
    fn dropped(key: AttemptKey) -> Self {
        crate::trace::outcome(&tracing::Span::current(), "dropped");
        Outcome { key, completion: None, dropped: true }
    }
}

/// How long a cancelled handler may take to return before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// A failure reported after a heartbeat found the attempt taken over is dropped while the
/// attempt has been claimed fewer times than this (see `Worker::execute`).
const DROP_FAILURES_UP_TO_CLAIMS: u32 = 5;

/// How long an attempt runs before its worker looks, at this interval, whether it ended in
/// the store meanwhile (`Worker::stop_ended_attempts`).
const ATTEMPT_CHECK_EVERY: Duration = Duration::from_secs(10);

/// The unfinished tasks of a run read at once by that look; a run with more is not looked at.
const OPEN_TASKS_READ: usize = 1_000;
