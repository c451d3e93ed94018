//! The `Engine`: registration, starting and observing runs, and the background machinery
//! (dispatcher, timers, pollers) that keeps runs moving.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use durable_core::{
    Checkpoint, Millis, NewRun, Payload, Run, RunFilter, RunId, RunPage, RunQuery, RunStatus, StepError, Store,
};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use tokio::sync::{Notify, Semaphore, broadcast, watch};
use tokio::task::JoinHandle;

use crate::WorkflowCtx;
use crate::clock::{Clock, SystemClock};
use crate::config::EngineConfig;
use crate::error::{Error, Result, WorkflowError};
use crate::events::EngineEvent;
use crate::fleet::{EngineHandler, Outbox, QueueFailures};
use crate::registry::Registry;
use durable_transport::{Consumer, QueueReason, Transport};

/// The durable execution engine. Cheap to clone; all clones are one engine. Dropping the last
/// clone stops its background tasks (runs in progress are recovered from the store later);
/// [`Engine::shutdown`] and [`Engine::drain`] stop it in an orderly way.
///
/// ```no_run
/// use durable_runtime::{Engine, StartOptions, WorkflowCtx, WorkflowError};
/// # use durable_store_memory::MemoryStore;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Engine::builder().store(MemoryStore::new()).build()?;
/// engine.register("greet", 1, |ctx: WorkflowCtx, name: String| async move {
///     let greeting: String = ctx.step("compose", |_| { let name = name.clone(); async move { Ok(format!("hello {name}")) } }).await?;
///     Ok::<_, WorkflowError>(greeting)
/// });
/// let run = engine.start("greet", &"ada", StartOptions::id("greet:ada")).await?;
/// let out: String = engine.wait_for_run(&run.id).await?.output()?;
/// assert_eq!(out, "hello ada");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        // Every task (background loops and turns) ends at its next poll; no lease is released:
        // like a process that died, the runs are recovered once their leases expire.
        self.shared.stop_background();
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("owner", &self.inner.shared.owner)
            .field("store", &self.inner.shared.store)
            .field("workflows", &self.inner.shared.registry)
            .finish()
    }
}

/// Engine state shared with background tasks and turns.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: EngineConfig,
    pub(crate) owner: String,
    pub(crate) registry: Registry,
    events: broadcast::Sender<EngineEvent>,
    /// Run ids waiting for an execution slot on this engine: wakes are served before starts,
    /// so runs already in progress finish before new ones begin.
    ready: Mutex<Ready>,
    ready_changed: Notify,
    active: Mutex<HashMap<RunId, Active>>,
    pub(crate) timers: Timers,
    watchers: Mutex<HashMap<RunId, Arc<Watch>>>,
    /// When the watched runs were last read together (one store call for every waiter).
    watch_refreshed: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    poke: Notify,
    shutdown: watch::Sender<bool>,
    pub(crate) draining: AtomicBool,
    /// Runs whose turn a `shutdown` dropped: their leases are released once all turns ended.
    interrupted: Mutex<Option<Vec<RunId>>>,
    idle: Notify,
    pub(crate) store_failures: Mutex<HashMap<RunId, u32>>,
    pub(crate) warned_versions: Mutex<HashSet<RunId>>,
    pub(crate) update_validators: Mutex<HashMap<(String, String), crate::signals::UpdateValidator>>,
    pub(crate) metrics: MetricsInner,
    /// Execution slots shared by the dispatcher and the transport's consumer.
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) transport: Option<Arc<dyn Transport>>,
    pub(crate) outbox: Mutex<Outbox>,
    pub(crate) outbox_full: Notify,
    consumer: Mutex<Option<Consumer>>,
    pub(crate) queue_failures: Mutex<QueueFailures>,
    pub(crate) rechecks: Mutex<HashSet<RunId>>,
    pub(crate) dead_listeners: RwLock<Vec<DeadListener>>,
    pub(crate) timeouts: Mutex<HashMap<String, Duration>>,
}

/// A callback fired when a run becomes `dead`.
pub(crate) type DeadListener = Arc<dyn Fn(&Run) + Send + Sync>;

/// Run ids waiting for a slot, by kind.
#[derive(Default)]
struct Ready {
    wakes: VecDeque<RunId>,
    others: VecDeque<RunId>,
}

/// A run that `wait_for_run` callers wait on.
#[derive(Default)]
struct Watch {
    /// Notified when this engine settles or suspends the run.
    notify: Notify,
    /// What the last shared read found (`Some(None)`: the run does not exist).
    seen: Mutex<Option<Option<Run>>>,
}

/// A run known to the dispatcher: queued (waiting for a slot) or executing.
#[derive(Default)]
struct Active {
    started: bool,
    /// A wake arrived while the run executed: run it again.
    rerun: bool,
    /// A start arrived while the run executed: run it again only if it is `pending` again
    /// (a retry), not if a poller found it pending before this engine claimed it.
    rerun_if_pending: bool,
}

impl Active {
    /// Records a dispatch that found the run executing here.
    fn again(&mut self, wake: bool) {
        if wake {
            self.rerun = true;
        } else {
            self.rerun_if_pending = true;
        }
    }
}

#[derive(Default)]
pub(crate) struct MetricsInner {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    pub(crate) turns: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) queued_runs: AtomicU64,
    pub(crate) enqueued: AtomicU64,
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Runs executing turns right now.
    pub turns_in_flight: usize,
    /// The most runs ever executing at once on this engine.
    pub max_turns_in_flight: usize,
    /// Run ids waiting for an execution slot.
    pub runs_queued: usize,
    /// Turns executed since the engine started.
    pub turns: u64,
    /// Batches sent to the transport's run queue.
    pub batches_sent: u64,
    /// Runs sent to the transport's run queue (in those batches).
    pub runs_sent: u64,
    /// Runs that `wait_for_run` / `wait_until_suspended_or_terminal` callers are waiting on right
    /// now.
    pub runs_watched: usize,
}

/// In-memory timers for runs this engine parked: one task sleeps until the earliest.
#[derive(Default)]
pub(crate) struct Timers {
    due: Mutex<BTreeSet<(Millis, RunId)>>,
    changed: Notify,
}

impl Timers {
    pub(crate) fn schedule(&self, at: Millis, id: RunId) {
        let mut due = self.due.lock();
        let earliest = due.first().is_none_or(|(first, _)| at < *first);
        due.insert((at, id));
        if earliest {
            self.changed.notify_one();
        }
    }

    fn next(&self) -> Option<Millis> {
        self.due.lock().first().map(|(at, _)| *at)
    }

    fn pop_due(&self, now: Millis) -> Vec<RunId> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        while due.first().is_some_and(|(at, _)| *at <= now) {
            out.push(due.pop_first().expect("checked").1);
        }
        out
    }
}

impl Shared {
    pub(crate) fn emit(&self, event: EngineEvent) {
        let _ = self.events.send(event);
    }

    /// Queues a run for execution on this engine.
    pub(crate) fn dispatch(&self, id: RunId) {
        self.dispatch_as(id, false);
    }

    /// Queues a run that has something new to see (served before starts).
    pub(crate) fn dispatch_wake(&self, id: RunId) {
        self.dispatch_as(id, true);
    }

    pub(crate) fn dispatch_as(&self, id: RunId, wake: bool) {
        if self.config.execute && !self.is_stopping() && !self.draining.load(Ordering::Relaxed) {
            let mut ready = self.ready.lock();
            if wake {
                ready.wakes.push_back(id)
            } else {
                ready.others.push_back(id)
            }
            drop(ready);
            self.ready_changed.notify_one();
        }
    }

    /// The next run to execute, and whether it was woken (rather than started).
    async fn next_ready(&self) -> (RunId, bool) {
        loop {
            let changed = self.ready_changed.notified();
            {
                let mut ready = self.ready.lock();
                if let Some(id) = ready.wakes.pop_front() {
                    return (id, true);
                }
                if let Some(id) = ready.others.pop_front() {
                    return (id, false);
                }
            }
            changed.await;
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Wakes `wait_for_run` callers of this run.
    pub(crate) fn notify_run(&self, id: &RunId) {
        if let Some(w) = self.watchers.lock().get(id) {
            w.notify.notify_waiters();
        }
    }

    /// Reads every watched run in one store call per 1,000 ids and records what it found on
    /// their watches, unless another waiter did so within the last half interval: however
    /// many callers wait, runs executing elsewhere cost one read per interval, not one each.
    async fn refresh_watched(&self) -> Result<()> {
        let mut refreshed = self.watch_refreshed.lock().await;
        if refreshed.is_some_and(|at| at.elapsed() < self.config.wait_poll_interval / 2) {
            return Ok(());
        }
        // Ids only: a clone of a watch held here would keep a finished waiter from removing it.
        let watched: Vec<RunId> = self.watchers.lock().keys().cloned().collect();
        for ids in watched.chunks(1_000) {
            let mut runs: HashMap<RunId, Run> =
                self.store.get_runs(ids).await?.into_iter().map(|r| (r.id.clone(), r)).collect();
            let watchers = self.watchers.lock();
            for id in ids {
                if let Some(watch) = watchers.get(id) {
                    *watch.seen.lock() = Some(runs.remove(id));
                }
            }
        }
        *refreshed = Some(tokio::time::Instant::now());
        Ok(())
    }

    fn stop_background(&self) {
        self.shutdown.send_replace(true);
    }

    fn in_flight(&self) -> usize {
        self.metrics.in_flight.load(Ordering::Acquire)
    }

    async fn shutdown_signal(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    async fn dispatch_loop(self: Arc<Self>) {
        loop {
            let (id, wake) = self.next_ready().await;
            if self.draining.load(Ordering::Relaxed) {
                continue;
            }
            match self.active.lock().entry(id.clone()) {
                Entry::Occupied(mut e) => {
                    // Queued runs will see the latest state anyway; executing ones may run again.
                    if e.get().started {
                        e.get_mut().again(wake);
                    }
                    continue;
                }
                Entry::Vacant(e) => {
                    e.insert(Active::default());
                }
            }
            let Ok(slot) = self.slots.clone().acquire_owned().await else { return };
            if self.draining.load(Ordering::Relaxed) {
                self.active.lock().remove(&id);
                continue;
            }
            if let Some(a) = self.active.lock().get_mut(&id) {
                a.started = true;
            }
            // Counted as in flight from here, so a shutdown waits for it even if it has not
            // been polled yet.
            let guard = TaskGuard::new(&self, id.clone());
            let shared = self.clone();
            tokio::spawn(async move {
                shared.run_in_slot(guard).await;
                drop(slot);
            });
        }
    }

    /// Marks a run as executing here; false (and a re-run request) if it already is.
    pub(crate) fn begin_local(&self, id: &RunId, wake: bool) -> bool {
        match self.active.lock().entry(id.clone()) {
            Entry::Occupied(mut e) => {
                e.get_mut().again(wake);
                false
            }
            Entry::Vacant(e) => {
                e.insert(Active { started: true, ..Active::default() });
                true
            }
        }
    }

    /// Executes a run marked as executing here, until it is quiet or the engine shuts down
    /// (a shutdown drops the turn wherever it is; the store keeps what was committed, and
    /// `shutdown` releases the lease).
    pub(crate) async fn run_in_slot(self: &Arc<Self>, mut guard: TaskGuard) {
        let id = guard.id.clone();
        guard.quiet = tokio::select! {
            biased;
            () = self.shutdown_signal() => false,
            () = self.run_until_quiet(&id) => true,
        };
        drop(guard);
    }

    /// Drives the run, again as long as wakes arrived while it executed. Removes the run's
    /// dispatcher entry when it returns: from then on, a new wake starts a new task.
    async fn run_until_quiet(self: &Arc<Self>, id: &RunId) {
        let mut drive = true;
        loop {
            if drive {
                self.drive_run(id).await;
            }
            let check_pending = {
                let mut active = self.active.lock();
                match active.get_mut(id) {
                    Some(a) if a.rerun => {
                        (a.rerun, a.rerun_if_pending) = (false, false);
                        false
                    }
                    Some(a) if a.rerun_if_pending => {
                        a.rerun_if_pending = false;
                        true
                    }
                    _ => {
                        active.remove(id);
                        return;
                    }
                }
            };
            // A read error runs it again: a spare turn is harmless, a missed retry is not.
            drive = !check_pending
                || match self.store.get_run(id).await {
                    Ok(run) => run.is_some_and(|r| r.status == RunStatus::Pending),
                    Err(_) => true,
                };
        }
    }

    async fn timer_loop(self: Arc<Self>) {
        loop {
            match self.timers.next() {
                None => self.timers.changed.notified().await,
                Some(at) => {
                    tokio::select! {
                        () = self.clock.sleep_until(at) => {
                            for id in self.timers.pop_due(self.clock.now()) {
                                self.wake(id);
                            }
                        }
                        () = self.timers.changed.notified() => {}
                    }
                }
            }
        }
    }

    async fn poll_loop(self: Arc<Self>) {
        let mut last_orphan_scan: Option<tokio::time::Instant> = None;
        loop {
            let orphans = last_orphan_scan.is_none_or(|t| t.elapsed() >= self.config.orphan_poll_interval);
            if self.poll_once(orphans).await && orphans {
                last_orphan_scan = Some(tokio::time::Instant::now());
                self.enforce_timeouts().await;
            }
            tokio::select! {
                () = tokio::time::sleep(self.config.poll_interval) => {}
                () = self.poke.notified() => {}
            }
        }
    }

    /// One look at the store for runs to execute. Returns false when nothing is registered.
    async fn poll_once(&self, orphans: bool) -> bool {
        let workflows = self.registry.keys();
        if workflows.is_empty() {
            return false;
        }
        let query = RunQuery {
            namespace: self.config.namespace.clone(),
            workflows: Some(workflows),
            now: self.clock.now(),
            limit: self.config.poll_batch,
        };
        let (mut pending, mut due) = (Vec::new(), Vec::new());
        let result = async {
            pending.extend(self.store.pending_runs(&query).await?);
            due.extend(self.store.due_runs(&query).await?);
            if orphans {
                due.extend(self.store.orphaned_runs(&query).await?);
            }
            Ok::<_, durable_core::StoreError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "poller could not read the store; trying again next interval");
        }
        // With a run queue, what a poller finds is handed to every instance, not executed here.
        for id in pending {
            self.queue_found(id, QueueReason::Start);
        }
        for id in due {
            self.queue_found(id, QueueReason::Wake);
        }
        true
    }
}

/// Keeps the in-flight gauge and the dispatcher's view right however a run task ends
/// (including being aborted).
pub(crate) struct TaskGuard {
    shared: Arc<Shared>,
    id: RunId,
    /// The run went quiet: `run_until_quiet` already removed its dispatcher entry, and any
    /// entry there now belongs to a newer task of the same run, which must not be touched
    /// (removing it would let a third task execute the run beside the second).
    quiet: bool,
}

impl TaskGuard {
    pub(crate) fn new(shared: &Arc<Shared>, id: RunId) -> Self {
        let now = shared.metrics.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.metrics.max_in_flight.fetch_max(now, Ordering::AcqRel);
        TaskGuard { shared: shared.clone(), id, quiet: false }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(interrupted) = self.shared.interrupted.lock().as_mut() {
            interrupted.push(self.id.clone());
        }
        if !self.quiet {
            // Cut off (shutdown or abort): the entry is still this task's.
            self.shared.active.lock().remove(&self.id);
        }
        self.shared.metrics.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.shared.idle.notify_waiters();
    }
}

/// Builds an [`Engine`]: a store is required; clock and config have defaults.
#[must_use]
pub struct EngineBuilder {
    store: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    transport: Option<Arc<dyn Transport>>,
}

impl fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBuilder").field("store", &self.store).field("config", &self.config).finish()
    }
}

impl EngineBuilder {
    /// The store runs are kept in.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A store shared with other code (or other engines in this process).
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The durable clock (default: the system clock). Tests pass a
    /// [`VirtualClock`](crate::VirtualClock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// All tuning knobs at once.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// A run queue shared with other engines: starts and wakes are sent to it in batches and
    /// this engine consumes its share (see `durable-transport`). Without one, runs execute on
    /// the engine that starts or wakes them, and the pollers share out the rest.
    pub fn transport(mut self, transport: impl Transport) -> Self {
        self.transport = Some(Arc::new(transport));
        self
    }

    /// A client engine: it starts, signals, queries and waits for runs but executes none
    /// (workers do). Same as `EngineConfig { execute: false, .. }`.
    pub fn client_only(mut self) -> Self {
        self.config.execute = false;
        self
    }

    /// Only execute runs of this namespace, and start runs in it by default.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = Some(namespace.into());
        self
    }

    /// Builds the engine and starts its background tasks. Must be called inside a tokio
    /// runtime.
    pub fn build(self) -> Result<Engine> {
        let store = self.store.ok_or_else(|| {
            Error::Store(durable_core::StoreError::NotFound {
                what: "a store: call Engine::builder().store(..) before build()".into(),
            })
        })?;
        let owner = format!("engine-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let shared = Arc::new(Shared {
            store,
            clock: self.clock,
            slots: Arc::new(Semaphore::new(self.config.max_concurrent_runs.max(1))),
            config: self.config,
            owner,
            registry: Registry::default(),
            events: broadcast::channel(4096).0,
            ready: Mutex::new(Ready::default()),
            ready_changed: Notify::new(),
            active: Mutex::new(HashMap::new()),
            timers: Timers::default(),
            watchers: Mutex::new(HashMap::new()),
            watch_refreshed: tokio::sync::Mutex::new(None),
            poke: Notify::new(),
            shutdown: watch::Sender::new(false),
            draining: AtomicBool::new(false),
            interrupted: Mutex::new(None),
            idle: Notify::new(),
            store_failures: Mutex::new(HashMap::new()),
            warned_versions: Mutex::new(HashSet::new()),
            update_validators: Mutex::new(HashMap::new()),
            transport: self.transport,
            outbox: Mutex::new(Outbox::default()),
            outbox_full: Notify::new(),
            consumer: Mutex::new(None),
            queue_failures: Mutex::new(QueueFailures::default()),
            rechecks: Mutex::new(HashSet::new()),
            dead_listeners: RwLock::new(Vec::new()),
            timeouts: Mutex::new(HashMap::new()),
            metrics: MetricsInner::default(),
        });
        let spawn = |f: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| {
            let shared = shared.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = f => {}
                    () = shared.shutdown_signal() => {}
                }
            })
        };
        let mut tasks = Vec::new();
        if shared.config.execute {
            tasks.push(spawn(Box::pin(shared.clone().dispatch_loop())));
            tasks.push(spawn(Box::pin(shared.clone().timer_loop())));
            tasks.push(spawn(Box::pin(shared.clone().poll_loop())));
        }
        if let Some(transport) = &shared.transport {
            tasks.push(spawn(Box::pin(shared.clone().flush_loop())));
            if shared.config.execute {
                let handler = Arc::new(EngineHandler(Arc::downgrade(&shared)));
                let consumer =
                    transport.consume_runs(shared.config.namespace.clone(), shared.config.queue_concurrency, handler);
                *shared.consumer.lock() = Some(consumer);
            }
        }
        Ok(Engine { inner: Arc::new(EngineInner { shared, tasks: Mutex::new(tasks) }) })
    }
}

/// Options of [`Engine::start`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct StartOptions {
    /// The run id (default: a fresh UUID v7). Starting an existing id is a no-op that returns
    /// the existing run.
    pub id: Option<String>,
    /// The namespace (default: the engine's, or `"default"`).
    pub namespace: Option<String>,
    /// Tags to filter runs by.
    pub tags: Vec<String>,
    /// Scheduling priority, higher first (default 0).
    pub priority: i32,
}

impl StartOptions {
    /// Default options: a generated id.
    pub fn new() -> Self {
        Self::default()
    }

    /// Options with this run id.
    pub fn id(id: impl Into<String>) -> Self {
        StartOptions { id: Some(id.into()), ..Self::default() }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Adds a tag.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into());
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
}

/// What [`Engine::start`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    /// The run id.
    pub id: RunId,
    /// Whether this call created the run (false: it existed and nothing was done).
    pub created: bool,
    /// The run as stored after the call.
    pub run: Run,
}

/// A terminal run (or, for [`Engine::wait_until_suspended_or_terminal`], a suspended one).
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The run as stored.
    pub run: Run,
}

impl RunOutcome {
    /// The run's status.
    pub fn status(&self) -> RunStatus {
        self.run.status
    }

    /// The recorded error, for failed, cancelled and dead runs.
    pub fn error(&self) -> Option<&StepError> {
        self.run.error.as_ref()
    }

    /// The output of a completed run, decoded; [`Error::RunFailed`] otherwise.
    pub fn output<O: DeserializeOwned>(&self) -> Result<O> {
        match (&self.run.status, &self.run.output) {
            (RunStatus::Completed, Some(out)) => {
                out.decode().map_err(|source| Error::Output { id: self.run.id.clone(), source })
            }
            _ => Err(Error::RunFailed {
                id: self.run.id.clone(),
                status: self.run.status,
                error: self.run.error.clone(),
            }),
        }
    }
}

impl Engine {
    /// Starts building an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder { store: None, clock: Arc::new(SystemClock), config: EngineConfig::default(), transport: None }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// This engine instance's lease-owner id.
    pub fn owner(&self) -> &str {
        &self.inner.shared.owner
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.shared.store
    }

    /// The durable clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.shared.clock
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.shared.config
    }

    /// Registers (or replaces) version `version` of workflow `name`. New runs start on the
    /// newest registered version; a run always resumes on the version it started on.
    pub fn register<F, Fut, I, O>(&self, name: &str, version: u32, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
    {
        self.inner.shared.registry.register(name, version, f);
        // Runs of this workflow may be waiting in the store: look now, not at the next tick.
        self.inner.shared.poke.notify_one();
    }

    fn check_size(&self, what: impl FnOnce() -> String, payload: &Payload) -> Result<()> {
        let limit = self.inner.shared.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge { what: what(), size: payload.len(), limit });
        }
        Ok(())
    }

    /// Starts a run of the newest version of `workflow`: validates and persists it `pending`,
    /// dispatches it, and returns at once. Idempotent on the id.
    pub async fn start<I: Serialize + ?Sized>(
        &self,
        workflow: &str,
        input: &I,
        options: StartOptions,
    ) -> Result<Started> {
        let shared = &self.inner.shared;
        let (version, handler) =
            shared.registry.latest(workflow).ok_or_else(|| Error::UnknownWorkflow { name: workflow.to_string() })?;
        let input = Payload::encode(input)
            .map_err(|source| Error::Serialize { what: format!("the input of workflow {workflow:?}"), source })?;
        self.check_size(|| format!("the input of workflow {workflow:?}"), &input)?;
        handler.check_input(&input).map_err(|source| Error::InvalidInput { workflow: workflow.to_string(), source })?;
        let id = match options.id {
            Some(id) => RunId::parse(&id)?,
            None => RunId::new(uuid::Uuid::now_v7().to_string()),
        };
        let namespace =
            options.namespace.or_else(|| shared.config.namespace.clone()).unwrap_or_else(|| "default".into());
        let new = NewRun {
            id: id.clone(),
            workflow: workflow.to_string(),
            version,
            namespace,
            input,
            tags: options.tags,
            priority: options.priority,
            parent: None,
            created_at: shared.clock.now(),
        };
        let created = shared.store.create_run(new).await?;
        let is_new = created.created();
        if is_new {
            let run = created.run();
            shared.emit(EngineEvent::RunCreated { run_id: id.clone(), workflow: workflow.to_string() });
            shared.queue_start(id.clone(), &run.namespace, run.priority, run.updated_at);
        }
        Ok(Started { id, created: is_new, run: created.into_run() })
    }

    /// Waits until the run is terminal (completed, failed, cancelled or dead). Works for runs
    /// executed by other processes too (it re-reads the store).
    pub async fn wait_for_run(&self, id: &RunId) -> Result<RunOutcome> {
        self.wait(id, false, None).await
    }

    /// [`Engine::wait_for_run`] with a timeout ([`Error::Timeout`] when it passes).
    pub async fn wait_for_run_timeout(&self, id: &RunId, timeout: Duration) -> Result<RunOutcome> {
        self.wait(id, false, Some(timeout)).await
    }

    /// Waits until the run is [suspended](RunStatus::Suspended) (parked on a timer, a signal, a
    /// child or a remote result) or terminal (completed, failed, cancelled or dead), and returns
    /// it as first seen in either state: from there it makes no progress until time passes or
    /// something arrives. Tests use it to reach a run's next wait before they advance a clock or
    /// send a signal; [`Engine::wait_for_run`] waits for the end. Works for runs executed by
    /// other processes too (it re-reads the store).
    pub async fn wait_until_suspended_or_terminal(&self, id: &RunId) -> Result<RunOutcome> {
        self.wait(id, true, None).await
    }

    /// [`Engine::wait_until_suspended_or_terminal`] with a timeout ([`Error::Timeout`] when it
    /// passes).
    pub async fn wait_until_suspended_or_terminal_timeout(&self, id: &RunId, timeout: Duration) -> Result<RunOutcome> {
        self.wait(id, true, Some(timeout)).await
    }

    /// The old name of [`Engine::wait_until_suspended_or_terminal`], which also returns when the
    /// run is only suspended.
    #[deprecated(note = "renamed to `wait_until_suspended_or_terminal`: it also returns when the run is suspended")]
    pub async fn wait_for_settled(&self, id: &RunId) -> Result<RunOutcome> {
        self.wait_until_suspended_or_terminal(id).await
    }

    /// The old name of [`Engine::wait_until_suspended_or_terminal_timeout`].
    #[deprecated(
        note = "renamed to `wait_until_suspended_or_terminal_timeout`: it also returns when the run is suspended"
    )]
    pub async fn wait_for_settled_timeout(&self, id: &RunId, timeout: Duration) -> Result<RunOutcome> {
        self.wait_until_suspended_or_terminal_timeout(id, timeout).await
    }

    async fn wait(&self, id: &RunId, suspended_is_enough: bool, timeout: Option<Duration>) -> Result<RunOutcome> {
        let shared = &self.inner.shared;
        let watch = shared.watchers.lock().entry(id.clone()).or_default().clone();
        let done = |run: &Run| run.status.is_terminal() || (suspended_is_enough && run.status == RunStatus::Suspended);
        let wait = async {
            // First, and after a notify from this engine: read the run itself. When the
            // interval passes without one: read it with every other watched run.
            let mut read_alone = true;
            loop {
                let notified = watch.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let run = if read_alone {
                    shared.store.get_run(id).await?
                } else {
                    shared.refresh_watched().await?;
                    let seen = watch.seen.lock().clone();
                    match seen {
                        Some(run) => run,
                        None => shared.store.get_run(id).await?,
                    }
                };
                let run = run.ok_or_else(|| Error::RunNotFound(id.clone()))?;
                if done(&run) {
                    return Ok(RunOutcome { run });
                }
                read_alone = tokio::select! {
                    () = notified => true,
                    () = tokio::time::sleep(shared.config.wait_poll_interval) => false,
                };
            }
        };
        let result = match timeout {
            None => wait.await,
            Some(limit) => match tokio::time::timeout(limit, wait).await {
                Ok(r) => r,
                Err(_) => {
                    let status = shared.store.get_run(id).await?.map(|r| r.status).unwrap_or(RunStatus::Pending);
                    Err(Error::Timeout { id: id.clone(), timeout: limit, status })
                }
            },
        };
        drop(watch);
        let mut watchers = shared.watchers.lock();
        if watchers.get(id).is_some_and(|w| Arc::strong_count(w) == 1) {
            watchers.remove(id);
        }
        result
    }

    /// Reads a run. For an active run whose workflow version is not registered here (while
    /// another version of that workflow is), the returned `error` explains why it is not
    /// moving.
    pub async fn get_run(&self, id: &RunId) -> Result<Option<Run>> {
        let shared = &self.inner.shared;
        let mut run = shared.store.get_run(id).await?;
        if let Some(r) = &mut run
            && !r.status.is_terminal()
            && shared.registry.get(&r.workflow, r.version).is_none()
            && shared.registry.latest(&r.workflow).is_some()
        {
            r.error = Some(
                StepError::fatal(format!(
                    "run {}: workflow {:?} version {} is not registered on this engine, so the run is left untouched; \
                         register version {} again to resume it, or cancel it",
                    r.id, r.workflow, r.version, r.version
                ))
                .with_code("version_not_registered"),
            );
        }
        Ok(run)
    }

    /// The run's checkpoints by seq.
    pub async fn history(&self, id: &RunId) -> Result<Vec<Checkpoint>> {
        Ok(self.inner.shared.store.history(id).await?)
    }

    /// Lists runs, newest first (see [`RunFilter`]).
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage> {
        Ok(self.inner.shared.store.list_runs(filter).await?)
    }

    /// Subscribes to this engine's [`EngineEvent`]s.
    pub fn subscribe(&self) -> broadcast::Receiver<EngineEvent> {
        self.inner.shared.events.subscribe()
    }

    /// The engine's counters.
    pub fn metrics(&self) -> Metrics {
        let shared = &self.inner.shared;
        let in_flight = shared.in_flight();
        Metrics {
            turns_in_flight: in_flight,
            max_turns_in_flight: shared.metrics.max_in_flight.load(Ordering::Acquire),
            runs_queued: shared.active.lock().len().saturating_sub(in_flight),
            turns: shared.metrics.turns.load(Ordering::Relaxed),
            batches_sent: shared.metrics.batches.load(Ordering::Relaxed),
            runs_sent: shared.metrics.queued_runs.load(Ordering::Relaxed),
            runs_watched: shared.watchers.lock().len(),
        }
    }

    /// Looks at the store for pending, due and orphaned runs now, instead of at the next poll.
    pub fn poll_now(&self) {
        self.inner.shared.poke.notify_one();
    }

    /// Stops at once: background tasks end, executing turns are dropped and their leases
    /// released, so another engine can continue the runs immediately. Nothing durable is lost.
    pub async fn shutdown(&self) {
        let shared = &self.inner.shared;
        shared.interrupted.lock().get_or_insert_with(Vec::new);
        let consumer = shared.consumer.lock().take();
        if let Some(consumer) = consumer {
            consumer.stop().await;
        }
        shared.flush().await;
        shared.stop_background();
        for task in self.inner.tasks.lock().drain(..) {
            task.abort();
        }
        while shared.in_flight() > 0 {
            let idle = shared.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if shared.in_flight() == 0 {
                break;
            }
            idle.await;
        }
        let interrupted = shared.interrupted.lock().take().unwrap_or_default();
        for id in interrupted {
            let _ = shared.store.release_lease(&id, &shared.owner).await;
        }
    }

    /// Stops taking work, lets executing turns finish for up to `timeout`, then shuts down
    /// (what did not finish is released for other engines). Returns whether every turn
    /// finished in time.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let shared = &self.inner.shared;
        shared.draining.store(true, Ordering::Relaxed);
        // Stop taking queued runs (items in hand are handed back), send what is waiting.
        let consumer = shared.consumer.lock().take();
        if let Some(consumer) = consumer {
            consumer.stop().await;
        }
        shared.flush().await;
        let finished = tokio::time::timeout(timeout, async {
            loop {
                let idle = shared.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if shared.in_flight() == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await
        .is_ok();
        self.shutdown().await;
        finished
    }
}
