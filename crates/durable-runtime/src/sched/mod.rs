//! Execution: the engine state shared with background tasks and turns ([`Shared`]), and
//! everything that moves runs — dispatch slots, timers and pollers, the turn executor, the
//! run queue, operations on runs and the watchers of `wait_for_run`.
//!
//! # Modules
//!
//! Each submodule uses only the ones after it in this list (and this module), so there is
//! no cycle: `fleet` (the run queue: outbox flusher, consumer) → `dispatch` (slots, the
//! dispatcher loop, the task that runs a run) → `executor` (a run's turns, and what follows
//! a turn that could not run) → `timers` (in-memory timers, the pollers) → `operate` (cancel,
//! children) → `control` (the control plane: forwarded events, cancels, nudges, and the turns
//! executing here that a cancel stops) → `watch` (waiters) → `starter` (the scheduler:
//! schedules, trigger buffers) → `warm` (suspended turns kept in memory). Asking for a run to execute (`wake`, `queue_start`,
//! `dispatch_as`, with a [`Nudge`] that says how old the news is, from a [`Mark`]) is what all
//! of them need, so it lives here, as does `impl TurnEnv`.
//!
//! # State by owner
//!
//! `Shared` holds what never changes after `build` (store, clock, config, owner, registry),
//! counters, two lifecycle flags (`shutdown`, `draining`), and one struct per owner:
//! [`Dispatch`], [`Executor`], [`Timers`], [`Fleet`], [`Watchers`], [`Hooks`] and [`Control`].
//! The fields of each are private to the file that declares it, so each lock is taken in that
//! file only: `dispatch.rs` (`ready`, `runs`, `interrupted`), `executor.rs` (`store_failures`,
//! `rechecks`, `warned_versions`), `timers.rs` (`due`, `claims`), `fleet.rs` (`outbox`,
//! `queue_failures`, `consumer`), `watch.rs` (`map`, `refreshed`, each watch's `seen`),
//! `hooks.rs` (`dead_listeners`, `update_validators`, `timeouts`), `control.rs` (`turns`,
//! `nudges`, `dropped_report`, `publish_report`, and `pending_events`, a tokio mutex the event
//! publisher holds across its receive and nothing else) and `warm.rs` (`inner`: it drops the
//! turns it evicts only after releasing it, since dropping a body takes its turn's lock).
//!
//! # Lock order
//!
//! There is exactly one nesting, in `refresh_watched`:
//!
//! `Watchers::refreshed` (a tokio mutex, held across the store read) → `Watchers::map` →
//! `Watch::seen`.
//!
//! Every other lock is taken alone: it is released before any other lock is taken, is never
//! held across an `.await`, and nothing called under it takes a lock of ours (at most a tokio
//! `Notify` is signalled). User callbacks — dead-run listeners, update validators — are
//! copied out and called after the lock is released.
//!
//! Outside `Shared`: the registry's lock and a turn's locks (`turn/`) are never taken while one
//! of these is held, and no lock of ours is taken while they are — a turn holds its lock only
//! around a call into the core, reading the clock (`TurnEnv::now`) at most; `commit`, `emit`
//! and `latest_version` are called without it. The executor takes a turn's lock once, to fail
//! a turn whose input does not decode. A cancel heard on the control plane copies the turn out
//! of `Control::turns`, releases that lock, then stops the turn (`TurnState::interrupt`: the
//! turn's lock, released, then its driver's waker slot). The engine holds its task list's lock
//! only to abort the background tasks.
//!
//! The control plane calls the engine's sink on the plane's listener (or, in process, on the
//! publisher's task — a turn's, for a forwarded event): it takes the locks above one at a time
//! like any caller, and never waits.

mod control;
pub(crate) use control::FailureTally;
mod dispatch;
pub(crate) mod eager;
mod executor;
mod fleet;
mod hooks;
mod operate;
mod remote;
mod starter;
mod timers;
mod warm;
mod watch;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use durable_core::admission::{Admission, Limits, SlotRequest};
use durable_core::{Commit, CommitOutcome, Millis, QueueReason, QueuedRun, RunId, Store, StoreResult, protocol};
use durable_transport::{ControlPlane, Transport};
use tokio::task::JoinHandle;

use crate::clock::{BoxFuture, Clock};
use crate::config::EngineConfig;
use crate::events::EngineEvent;
use crate::registry::Registry;
use crate::turn::TurnEnv;
use control::Control;
use dispatch::Dispatch;
use executor::Executor;
use fleet::Fleet;
use hooks::Hooks;
use starter::Starter;
use timers::Timers;
use watch::Watchers;

pub(crate) use hooks::UpdateValidator;
pub use operate::Cancel;

/// Engine state shared with background tasks and turns: what never changes after `build`,
/// the two lifecycle flags, and the mutable state split by owner (the module that takes its
/// locks).
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: EngineConfig,
    pub(crate) owner: String,
    pub(crate) registry: Registry,
    pub(crate) metrics: MetricsInner,
    pub(crate) hooks: Hooks,
    /// Registered step queues and concurrency keys.
    pub(crate) flow: crate::flow::FlowControl,
    /// Set once by `shutdown` (or the last `Engine` clone dropped): background loops and run
    /// tasks end at their next poll. A flag and a `Notify` rather than a `watch` channel:
    /// a `watch` wakes its waiters in an order chosen at random, a `Notify` in the order they
    /// began waiting, so a simulation of the engine replays exactly.
    shutdown: AtomicBool,
    shutdown_notify: tokio::sync::Notify,
    /// Set once by `drain`: no new run is taken; executing turns may finish.
    draining: AtomicBool,
    dispatch: Dispatch,
    executor: Executor,
    timers: Timers,
    fleet: Fleet,
    watchers: Watchers,
    starter: Starter,
    control: Control,
    /// Suspended turns kept in memory (warm runs).
    warm: warm::Warm,
    /// Notified after a commit that dispatched remote-step tasks (in-process workers look at
    /// once).
    pub(crate) task_dispatched: Arc<tokio::sync::Notify>,
    /// Workers beside this engine that take tasks straight from its commits.
    pub(crate) eager: eager::Eager,
}

/// Counters for `Engine::metrics` (the in-flight gauge is the dispatcher's).
#[derive(Default)]
pub(crate) struct MetricsInner {
    turns: AtomicU64,
    turns_without_progress: AtomicU64,
    batches: AtomicU64,
    queued_runs: AtomicU64,
    enqueued: AtomicU64,
}

impl MetricsInner {
    /// Turns executed.
    pub(crate) fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }

    /// Turns that got nowhere (see `Metrics::turns_without_progress`).
    pub(crate) fn turns_without_progress(&self) -> u64 {
        self.turns_without_progress.load(Ordering::Relaxed)
    }

    /// Batches sent to the run queue.
    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Runs sent to the run queue.
    pub(crate) fn queued_runs(&self) -> u64 {
        self.queued_runs.load(Ordering::Relaxed)
    }
}

impl Shared {
    /// The state of a new engine; nothing runs until [`Shared::spawn_background`].
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
        transport: Option<Arc<dyn Transport>>,
        plane: Option<Arc<dyn ControlPlane>>,
        owner: String,
    ) -> Arc<Self> {
        let control = Control::new(plane, config.event_forwarding);
        let config_warm_runs = if config.execute { config.warm_runs } else { 0 };
        Arc::new(Shared {
            store,
            clock,
            dispatch: Dispatch::new(config.max_concurrent_runs.max(1)),
            config,
            owner,
            registry: Registry::default(),
            metrics: MetricsInner::default(),
            hooks: Hooks::new(),
            flow: crate::flow::FlowControl::default(),
            shutdown: AtomicBool::new(false),
            shutdown_notify: tokio::sync::Notify::new(),
            draining: AtomicBool::new(false),
            executor: Executor::default(),
            timers: Timers::default(),
            fleet: Fleet::new(transport),
            watchers: Watchers::default(),
            starter: Starter::default(),
            control,
            warm: warm::Warm::new(config_warm_runs),
            task_dispatched: Arc::new(tokio::sync::Notify::new()),
            eager: eager::Eager::default(),
        })
    }

    /// Starts the background tasks: the dispatcher, the timer loop and the poller on an
    /// engine that executes runs; the outbox flusher (and, executing, the transport's
    /// consumer) with a run queue; the control plane's publishers (events, nudges), after
    /// subscribing to it. Each ends when the engine stops.
    pub(crate) fn spawn_background(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let spawn = |f: Pin<Box<dyn Future<Output = ()> + Send>>| {
            let shared = self.clone();
            tokio::spawn(async move {
                // Shutdown first: a stopped engine's loops make no further store call.
                tokio::select! {
                    biased;
                    () = shared.shutdown_signal() => {}
                    () = f => {}
                }
            })
        };
        let mut tasks = Vec::new();
        tasks.extend(self.subscribe_control());
        tasks.push(spawn(Box::pin(self.clone().event_loop())));
        tasks.push(spawn(Box::pin(self.clone().nudge_loop())));
        if self.config.execute {
            tasks.push(spawn(Box::pin(self.clone().dispatch_loop())));
            tasks.push(spawn(Box::pin(self.clone().timer_loop())));
            tasks.push(spawn(Box::pin(self.clone().poll_loop())));
            tasks.push(spawn(Box::pin(self.clone().scheduler_loop())));
            tasks.push(spawn(Box::pin(self.clone().remote_loop())));
        }
        if self.fleet.has_queue() {
            tasks.push(spawn(Box::pin(self.clone().flush_loop())));
            if self.config.execute {
                self.start_consumer();
            }
        }
        tasks
    }

    /// Sends an event to this engine's subscribers and, if it is forwarded, to the other
    /// engines on the control plane.
    pub(crate) fn emit(&self, event: EngineEvent) {
        self.forward_event(&event);
        self.hooks.emit(event);
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Background loops and run tasks end at their next poll.
    pub(crate) fn stop_background(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.shutdown_notify.notify_waiters();
        // The transport's consumer too: a stopped engine takes no more runs from the queue
        // (dropping it tells its loop to stop; items in hand are handed back).
        drop(self.fleet_consumer());
        // The suspended turns kept in memory hold the engine's state: dropping them frees it.
        self.drop_warm_runs();
    }

    /// Turns continued from memory (`Metrics::warm_resumes`).
    pub(crate) fn warm_resumes(&self) -> u64 {
        self.warm.resumed.load(Ordering::Relaxed)
    }

    /// Turns kept in memory that were dropped without a resume (`Metrics::warm_dropped`).
    pub(crate) fn warm_dropped(&self) -> u64 {
        self.warm.dropped.load(Ordering::Relaxed)
    }

    /// Suspended turns held in memory now (`Metrics::warm_runs`).
    pub(crate) fn warm_held(&self) -> usize {
        self.warm.len()
    }

    /// Drops every suspended turn kept in memory.
    pub(crate) fn drop_warm_runs(&self) {
        self.warm.clear();
    }

    /// Drops the run's suspended turn kept in memory, if any (its run was cancelled, …).
    pub(crate) fn drop_warm_run(&self, id: &RunId) {
        self.warm.remove(id);
    }

    async fn shutdown_signal(&self) {
        // A `Notified` created before `notify_waiters` completes even if not yet polled, so
        // the flag cannot be set unseen between the check and the wait.
        let notified = self.shutdown_notify.notified();
        if self.is_stopping() {
            return;
        }
        notified.await;
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// From now on no new run is taken (`drain`).
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
        // A turn holding its sleeps suspends instead (`TurnEnv::may_hold`): woken, it asks again.
        self.nudge_turns();
    }

    /// Whether a run this engine wakes executes here: it executes runs, is not stopping or
    /// draining, and has no run queue (which would spread the wake over the engines).
    fn executes_wakes_here(&self) -> bool {
        self.config.execute && !self.is_stopping() && !self.is_draining() && !self.fleet.has_queue()
    }

    /// Whether this engine executes runs of `namespace`.
    fn serves(&self, namespace: &str) -> bool {
        self.config.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }
}

/// Asking for a run to execute: what the executor, the pollers, the timers, operations and
/// engine calls all do. Nothing here executes a run.
impl Shared {
    /// Queues a run for execution on this engine (unless it is queued or executing here
    /// already: see [`Nudge`]).
    fn dispatch_as(&self, id: RunId, nudge: Nudge) {
        if self.config.execute && !self.is_stopping() && !self.is_draining() {
            self.dispatch.push(id, nudge);
        }
    }

    /// A position in the order runs go quiet here: take it before the store call whose answer
    /// asks for runs to execute ([`Shared::wake`], [`Shared::queue_start`]).
    pub(crate) fn mark(&self) -> Mark {
        self.dispatch.mark()
    }

    /// Asks for `id` to be executed because something new arrived for it, written by a store
    /// call begun at `mark`: if a turn of the run went quiet here since, it may have seen it
    /// already (or a poller may have executed it), so the run is read before it is executed —
    /// a read, not a spare turn.
    /// The run's namespace is not known here: a transport that routes by namespace gets it
    /// looked up before the send ([`Shared::wake_in`] when the caller knows it).
    pub(crate) fn wake(&self, id: RunId, mark: Mark) {
        self.enqueue(id, Nudge::wake(mark), None, 0, None, None);
    }

    /// [`Shared::wake`] of a run of `namespace`: nothing to look up before the send.
    pub(crate) fn wake_in(&self, id: RunId, namespace: &str, mark: Mark) {
        self.enqueue(id, Nudge::wake(mark), Some(namespace.to_string()), 0, None, None);
    }

    /// Asks for a new run, created `pending` by a store call begun at `mark`, to be started
    /// (`token` tells this pending state from earlier ones). If a turn of it went quiet here
    /// since (a poller found it first), it is read before it is executed.
    pub(crate) fn queue_start(&self, id: RunId, namespace: &str, priority: i32, token: u64, mark: Mark) {
        if !self.fleet.has_queue() && !self.serves(namespace) {
            return; // the pollers of its own pool start it
        }
        self.enqueue(id, Nudge::start(mark), Some(namespace.to_string()), priority, Some(token), None);
    }

    /// A run this engine created (a start, a schedule's fire, an event trigger): announced,
    /// then queued to start — or, with a delayed start, timed to wake at its start time.
    pub(crate) fn announce_created(&self, run: &durable_core::Run, mark: Mark) {
        crate::metrics::run_started(&run.workflow);
        self.emit(EngineEvent::RunCreated { run_id: run.id.clone(), workflow: run.workflow.clone() });
        match run.wake_at {
            // Waiting for its concurrency key: the release that hands it a slot wakes it.
            Some(protocol::GATED) => {}
            // Due later: the in-memory timer here (the pollers of any engine find it too).
            Some(at) if at > self.clock.now() => {
                if self.config.execute && self.serves(&run.namespace) {
                    self.timers.schedule(at, run.id.clone());
                }
            }
            _ => self.queue_start(run.id.clone(), &run.namespace, run.priority, run.updated_at, mark),
        }
    }

    /// Asks for a run a poller found (pending, due or orphaned) in reads begun at `mark` to be
    /// executed — unless it is queued or executing here, or went quiet here since the reads
    /// began (what they saw is older than its last turn): through the queue, so every
    /// instance takes a share, or here while the queue is failing.
    fn queue_found(&self, id: RunId, reason: QueueReason, mark: Mark) {
        let nudge = Nudge::found(reason == QueueReason::Wake, mark);
        if !self.fleet.has_queue() || self.fleet.is_down() {
            return self.dispatch_as(id, nudge);
        }
        if self.dispatch.knows(&id, mark) {
            return;
        }
        self.enqueue(id, nudge, self.config.namespace.clone(), 0, None, None);
    }

    /// Asks for a due run this engine's poller claimed, in a claim begun at `mark`, to be
    /// woken: through the queue, so every instance takes a share — or here, while the queue
    /// is failing or when the run is queued or executing here or went quiet here since the
    /// claim began. Unlike a poller's find, the claim is never dropped as old news: no other
    /// poller will find the run before the claim ends. Here it is a wake: a run queued or
    /// executing here looks again once its turn ends, and a run that went quiet here since
    /// is read first — a read that, the claim remembered ([`Shared::claimed_here`]), knows the
    /// run is due while no turn parked it since the claim. Through the queue the wake names
    /// the claim (its end, `until`, in the dedupe key: [`QueuedRun::claim_key`]), so the
    /// engine that takes it remembers the claim too: it may find the run's lease held (a
    /// re-check) or have seen the run go quiet (a read), and either way must read the claimed
    /// run as due, not drop the wake until the claim ends.
    fn queue_claimed(&self, id: RunId, mark: Mark, until: Millis) {
        let nudge = Nudge::wake(mark);
        if !self.fleet.has_queue() || self.fleet.is_down() || self.dispatch.knows(&id, mark) {
            return self.dispatch_as(id, nudge);
        }
        self.enqueue(id, nudge, self.config.namespace.clone(), 0, None, Some(until));
    }

    /// Without a transport the run is dispatched here; with one it goes into the outbox,
    /// which is sent in batches (`claim`: the end of the due-timer claim the wake is for).
    fn enqueue(
        &self,
        run_id: RunId,
        nudge: Nudge,
        namespace: Option<String>,
        priority: i32,
        token: Option<u64>,
        claim: Option<Millis>,
    ) {
        if !self.fleet.has_queue() {
            return self.dispatch_as(run_id, nudge);
        }
        if self.is_stopping() {
            return; // persisted: the pollers of this or another engine find it
        }
        let reason = if nudge.is_wake() { QueueReason::Wake } else { QueueReason::Start };
        let n = token.unwrap_or_else(|| self.metrics.enqueued.fetch_add(1, Ordering::Relaxed));
        let mut dedupe_key = format!("{reason}:{run_id}:{n}");
        if let Some(mark) = nudge.since {
            // When the item comes back to this engine, the mark says how old its news is.
            dedupe_key.push_str(&format!("@{}#{}", self.owner, mark.0));
        }
        if let Some(until) = claim {
            dedupe_key = QueuedRun::claim_key(until, &dedupe_key);
        }
        let item = QueuedRun { id: 0, run_id, reason, namespace, priority, dedupe_key };
        self.fleet.add(item, self.config.dispatch_batch);
    }

    /// The mark in the dedupe key of an item this engine sent (`…@<owner>#<mark>`); `None`
    /// for another engine's item.
    fn mark_of(&self, dedupe_key: &str) -> Option<Mark> {
        let (head, mark) = dedupe_key.rsplit_once('#')?;
        let mark = mark.parse().ok()?;
        head.strip_suffix(self.owner.as_str())?.ends_with('@').then_some(Mark(mark))
    }
}

/// Why a run is asked to execute here, and how old that news is.
///
/// A run is executed by one turn per wake: a nudge for a run queued here is dropped (the
/// queued execution reads the latest state), one for a run executing here makes it look
/// again once its turn ends — a store read, and another turn only if the run has something to
/// do. News from a store call begun at a [`Mark`] (a start's `create_run`, a delivery, a
/// poller's reads) may be older than a turn of the run that went quiet here since: a poller's
/// find is then dropped, any other nudge reads the run first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nudge {
    /// Something new arrived for the run (served before starts).
    wake: bool,
    /// The news comes from a store call begun at this mark; `None`: its age is unknown (an
    /// item from the run queue), it is taken as news.
    since: Option<Mark>,
    /// A poller found the run: nothing to do if it is known here (see [`Dispatch::knows`]).
    found: bool,
}

impl Nudge {
    /// A new run (or one an operator set back to `pending`), written by a store call begun
    /// at `mark`.
    pub(crate) fn start(mark: Mark) -> Self {
        Nudge { wake: false, since: Some(mark), found: false }
    }

    /// Something new for the run, known since `mark` (written by a store call begun then, or
    /// a timer popped then).
    pub(crate) fn wake(mark: Mark) -> Self {
        Nudge { wake: true, since: Some(mark), found: false }
    }

    /// An item from the run queue (`wake`: rather than a start); `since`: the mark its news
    /// dates from if this engine sent it (`None`: unknown, taken as news).
    pub(crate) fn queued(wake: bool, since: Option<Mark>) -> Self {
        Nudge { wake, since, found: false }
    }

    /// A poller found the run (`wake`: due or orphaned, rather than pending) in reads begun
    /// at `mark`.
    pub(crate) fn found(wake: bool, mark: Mark) -> Self {
        Nudge { wake, since: Some(mark), found: true }
    }

    /// Whether it is a wake rather than a start.
    pub(crate) fn is_wake(&self) -> bool {
        self.wake
    }
}

/// A position in the order runs go quiet on this engine: taken before a store call, it tells
/// whether a run went quiet after that call began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Mark(u64);

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

    fn existing_runs(&self, ids: Vec<RunId>) -> BoxFuture<'_, StoreResult<Vec<durable_core::Run>>> {
        Box::pin(async move { self.store.get_runs(&ids).await })
    }

    fn read_run(&self, id: RunId) -> BoxFuture<'_, StoreResult<Option<durable_core::Run>>> {
        Box::pin(async move { Shared::read_run(self, &id).await })
    }

    fn emit(&self, event: EngineEvent) {
        Shared::emit(self, event);
    }

    fn latest_version(&self, workflow: &str) -> Option<u32> {
        self.registry.latest(workflow).map(|(v, _)| v)
    }

    fn acquire_slot(&self, request: SlotRequest) -> BoxFuture<'_, StoreResult<Admission>> {
        Box::pin(async move { self.store.acquire_slot(&request).await })
    }

    fn may_hold(&self) -> bool {
        !self.is_stopping() && !self.is_draining() && self.has_free_slot()
    }

    fn hold_began(&self) -> bool {
        Shared::hold_began(self)
    }

    fn hold_ended(&self) {
        Shared::hold_ended(self);
    }

    fn queue_limits(&self, name: &str) -> Option<Limits> {
        self.flow.queue(name)
    }

    fn key_request(&self, run: &crate::turn::NewRunKey<'_>) -> Result<Option<SlotRequest>, String> {
        self.flow.start_request(run.workflow, run.namespace, run.id, run.input, run.priority, run.now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(owner: &str) -> Arc<Shared> {
        let store: Arc<dyn Store> = Arc::new(durable_store_memory::MemoryStore::new());
        Shared::new(store, Arc::new(crate::clock::SystemClock), EngineConfig::default(), None, None, owner.into())
    }

    #[test]
    fn an_item_this_engine_sent_carries_its_mark_back() {
        let (me, other) = (shared("engine-1"), shared("my-engine-1"));
        let key = "wake:r:3@engine-1#42";
        assert_eq!(me.mark_of(key), Some(Mark(42)));
        assert_eq!(other.mark_of(key), None, "another engine's item");
        assert_eq!(me.mark_of("start:r:1767225600000"), None, "no mark");
        assert_eq!(me.mark_of("wake:r:3@engine-1#x"), None);
    }
}
