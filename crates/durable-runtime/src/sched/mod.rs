//! Execution: the engine state shared with background tasks and turns, and everything that
//! moves runs — dispatch slots, timers and pollers, the turn executor, the run queue,
//! operations on runs and the watchers of `wait_for_run`.
//!
//! Submodules, each using only the ones listed after it (no cycle): `fleet` (the run queue's
//! sending and consuming ends) → `dispatch` (slots, the dispatcher loop) → `executor` (one
//! run's turns) → `timers` (in-memory timers, pollers) → `operate` (cancel, children) →
//! `watch` (waiters). Asking for a run to execute is everybody's need and lives here.

mod dispatch;
mod executor;
mod fleet;
mod operate;
mod timers;
mod watch;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use durable_core::{Commit, CommitOutcome, Millis, Payload, QueueReason, QueuedRun, Run, RunId, Store, StoreResult};
use durable_transport::{Consumer, Transport};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, Semaphore, broadcast};
use tokio::task::JoinHandle;

use crate::clock::{BoxFuture, Clock};
use crate::config::EngineConfig;
use crate::events::EngineEvent;
use crate::registry::Registry;
use crate::turn::TurnEnv;
use dispatch::{Active, Ready};
use fleet::{EngineHandler, Outbox, QueueFailures};
use timers::Timers;
use watch::Watch;

pub use operate::Cancel;

/// Engine state shared with background tasks and turns.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: EngineConfig,
    pub(crate) owner: String,
    pub(crate) registry: Registry,
    pub(crate) events: broadcast::Sender<EngineEvent>,
    /// Run ids waiting for an execution slot on this engine: wakes are served before starts,
    /// so runs already in progress finish before new ones begin.
    ready: Mutex<Ready>,
    ready_changed: Notify,
    pub(crate) active: Mutex<HashMap<RunId, Active>>,
    timers: Timers,
    pub(crate) watchers: Mutex<HashMap<RunId, Arc<Watch>>>,
    /// When the watched runs were last read together (one store call for every waiter).
    watch_refreshed: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    pub(crate) poke: Notify,
    shutdown: tokio::sync::watch::Sender<bool>,
    pub(crate) draining: AtomicBool,
    /// Runs whose turn a `shutdown` dropped: their leases are released once all turns ended.
    pub(crate) interrupted: Mutex<Option<Vec<RunId>>>,
    pub(crate) idle: Notify,
    store_failures: Mutex<HashMap<RunId, u32>>,
    warned_versions: Mutex<HashSet<RunId>>,
    pub(crate) update_validators: Mutex<HashMap<(String, String), UpdateValidator>>,
    pub(crate) metrics: MetricsInner,
    /// Execution slots shared by the dispatcher and the transport's consumer.
    slots: Arc<Semaphore>,
    transport: Option<Arc<dyn Transport>>,
    outbox: Mutex<Outbox>,
    outbox_full: Notify,
    pub(crate) consumer: Mutex<Option<Consumer>>,
    queue_failures: Mutex<QueueFailures>,
    rechecks: Mutex<HashSet<RunId>>,
    pub(crate) dead_listeners: RwLock<Vec<DeadListener>>,
    pub(crate) timeouts: Mutex<HashMap<String, Duration>>,
}

/// A callback fired when a run becomes `dead`.
pub(crate) type DeadListener = Arc<dyn Fn(&Run) + Send + Sync>;

/// A validator of update arguments, registered per workflow and update name.
pub(crate) type UpdateValidator = Arc<dyn Fn(&Payload) -> Result<(), String> + Send + Sync>;

#[derive(Default)]
pub(crate) struct MetricsInner {
    pub(crate) in_flight: AtomicUsize,
    pub(crate) max_in_flight: AtomicUsize,
    pub(crate) turns: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) queued_runs: AtomicU64,
    pub(crate) enqueued: AtomicU64,
}

impl Shared {
    /// The state of a new engine; nothing runs until [`Shared::spawn_background`].
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
        transport: Option<Arc<dyn Transport>>,
        owner: String,
    ) -> Arc<Self> {
        Arc::new(Shared {
            store,
            clock,
            slots: Arc::new(Semaphore::new(config.max_concurrent_runs.max(1))),
            config,
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
            shutdown: tokio::sync::watch::Sender::new(false),
            draining: AtomicBool::new(false),
            interrupted: Mutex::new(None),
            idle: Notify::new(),
            store_failures: Mutex::new(HashMap::new()),
            warned_versions: Mutex::new(HashSet::new()),
            update_validators: Mutex::new(HashMap::new()),
            transport,
            outbox: Mutex::new(Outbox::default()),
            outbox_full: Notify::new(),
            consumer: Mutex::new(None),
            queue_failures: Mutex::new(QueueFailures::default()),
            rechecks: Mutex::new(HashSet::new()),
            dead_listeners: RwLock::new(Vec::new()),
            timeouts: Mutex::new(HashMap::new()),
            metrics: MetricsInner::default(),
        })
    }

    /// Starts the background tasks: the dispatcher, the timer loop and the poller on an
    /// engine that executes runs; the outbox flusher (and, executing, the transport's
    /// consumer) with a run queue. Each ends when the engine stops.
    pub(crate) fn spawn_background(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let spawn = |f: Pin<Box<dyn Future<Output = ()> + Send>>| {
            let shared = self.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = f => {}
                    () = shared.shutdown_signal() => {}
                }
            })
        };
        let mut tasks = Vec::new();
        if self.config.execute {
            tasks.push(spawn(Box::pin(self.clone().dispatch_loop())));
            tasks.push(spawn(Box::pin(self.clone().timer_loop())));
            tasks.push(spawn(Box::pin(self.clone().poll_loop())));
        }
        if let Some(transport) = &self.transport {
            tasks.push(spawn(Box::pin(self.clone().flush_loop())));
            if self.config.execute {
                let handler = Arc::new(EngineHandler(Arc::downgrade(self)));
                let consumer =
                    transport.consume_runs(self.config.namespace.clone(), self.config.queue_concurrency, handler);
                *self.consumer.lock() = Some(consumer);
            }
        }
        tasks
    }

    pub(crate) fn emit(&self, event: EngineEvent) {
        let _ = self.events.send(event);
    }

    pub(crate) fn is_stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub(crate) fn stop_background(&self) {
        self.shutdown.send_replace(true);
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.metrics.in_flight.load(Ordering::Acquire)
    }

    async fn shutdown_signal(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    fn lease_ms(&self) -> Millis {
        self.config.lease_ttl.as_millis() as Millis
    }

    /// Whether this engine executes runs of `namespace`.
    fn serves(&self, namespace: &str) -> bool {
        self.config.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }
}

/// Asking for a run to execute: what the executor, the pollers, the timers, operations and
/// engine calls all do. Nothing here executes a run.
impl Shared {
    /// Queues a run for execution on this engine.
    fn dispatch(&self, id: RunId) {
        self.dispatch_as(id, false);
    }

    /// Queues a run that has something new to see (served before starts).
    fn dispatch_wake(&self, id: RunId) {
        self.dispatch_as(id, true);
    }

    fn dispatch_as(&self, id: RunId, wake: bool) {
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

    /// Asks for `id` to be executed because something new arrived for it.
    pub(crate) fn wake(&self, id: RunId) {
        self.enqueue(id, QueueReason::Wake, None, 0, None);
    }

    /// Asks for a new run to be started (`token` tells this pending state from earlier ones).
    pub(crate) fn queue_start(&self, id: RunId, namespace: &str, priority: i32, token: u64) {
        if self.transport.is_none() && !self.serves(namespace) {
            return; // the pollers of its own pool start it
        }
        self.enqueue(id, QueueReason::Start, Some(namespace.to_string()), priority, Some(token));
    }

    /// Asks for a run a poller found (pending, due or orphaned) to be executed: through the
    /// queue, so every instance takes a share — or here while the queue is failing.
    fn queue_found(&self, id: RunId, reason: QueueReason) {
        if self.queue_failures.lock().down {
            return self.dispatch_as(id, reason == QueueReason::Wake);
        }
        self.enqueue(id, reason, self.config.namespace.clone(), 0, None);
    }

    /// Without a transport the run is dispatched here; with one it goes into the outbox,
    /// which is sent in batches.
    fn enqueue(
        &self,
        run_id: RunId,
        reason: QueueReason,
        namespace: Option<String>,
        priority: i32,
        token: Option<u64>,
    ) {
        if self.transport.is_none() {
            return match reason {
                QueueReason::Wake => self.dispatch_wake(run_id),
                QueueReason::Start => self.dispatch(run_id),
            };
        }
        if self.is_stopping() {
            return; // persisted: the pollers of this or another engine find it
        }
        let n = token.unwrap_or_else(|| self.metrics.enqueued.fetch_add(1, Ordering::Relaxed));
        let dedupe_key = format!("{reason}:{run_id}:{n}");
        let item = QueuedRun { id: 0, run_id, reason, namespace, priority, dedupe_key };
        if self.outbox.lock().add(item) >= self.config.dispatch_batch {
            self.outbox_full.notify_one();
        }
    }
}

/// The engine is the turn's environment: its clock, its commit path, its events, its registry.
impl TurnEnv for Shared {
    fn now(&self) -> Millis {
        self.clock.now()
    }

    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()> {
        self.clock.sleep_until(at)
    }

    fn commit(&self, commit: Commit) -> BoxFuture<'_, StoreResult<CommitOutcome>> {
        Box::pin(self.apply_commit(commit))
    }

    fn emit(&self, event: EngineEvent) {
        Shared::emit(self, event);
    }

    fn latest_version(&self, workflow: &str) -> Option<u32> {
        self.registry.latest(workflow).map(|(v, _)| v)
    }
}
