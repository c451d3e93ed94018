//! The `Engine` handle, grouped by audience: starting and observing runs (`runs`),
//! operating on them (`operate`), messages to running workflows (`messages`), checking recorded
//! histories against the registered code and importing exported runs (`replay`) and running the engine as a worker
//! (`worker`). Everything that moves runs lives in `sched`; an
//! `Engine` is a handle on its state.

mod messages;
mod operate;
mod queues;
mod remote;
mod replay;
mod runs;
mod schedules;
mod worker;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use durable_core::{Millis, Run, RunId, RunStatus, StepError, Store};
use durable_transport::{ControlPlane, Transport};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::clock::{Clock, SystemClock};
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::events::EngineEvent;
use crate::sched::Shared;

pub use messages::Publication;
pub use remote::{QueueHealth, WorkerHealth};
pub use worker::{WorkflowOptions, shutdown_signal};

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
    /// Turns, among `turns`, that got nowhere: the turn claimed the run and ended without the
    /// store acknowledging any checkpoint from it, and without moving the run to a status other
    /// than the one the claim found (a suspend back to `suspended`, or an end that did not
    /// apply: a halt after a store error or a lost lease, a `woken` suspend, a settle that an
    /// operator's cancel beat). Typically a spare turn — a run executed although nothing had
    /// arrived for it, which costs a replay and two writes — and the engine is built so that
    /// it does not happen: a run already queued or executing on this engine is not queued
    /// again, and a wake that races the end of a turn costs a store read, not a turn. Store
    /// failures, lost leases and deliveries that race a suspend still count.
    pub turns_without_progress: u64,
    /// Batches sent to the transport's run queue.
    pub batches_sent: u64,
    /// Runs sent to the transport's run queue (in those batches).
    pub runs_sent: u64,
    /// Runs that `wait_for_run` / `wait_until_suspended_or_terminal` callers are waiting on right
    /// now.
    pub runs_watched: usize,
    /// Turns, among `turns`, that continued a suspended turn kept in memory instead of
    /// replaying the run's history ([`EngineConfig::warm_runs`](crate::EngineConfig::warm_runs)).
    /// The other turns replayed (or began a fresh run).
    pub warm_resumes: u64,
    /// Suspended turns kept in memory that were dropped without a resume: a doubt at the run's
    /// next claim, a cancel, eviction past the capacity, the engine stopping.
    pub warm_dropped: u64,
    /// Suspended turns held in memory right now.
    pub warm_runs: usize,
}

/// Builds an [`Engine`]: a store is required; clock and config have defaults.
#[must_use]
pub struct EngineBuilder {
    store: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    transport: Option<Arc<dyn Transport>>,
    control_plane: Option<Arc<dyn ControlPlane>>,
    owner: Option<String>,
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

    /// The control plane shared with the other engines (and workers) on the store — an
    /// [`InProcessControlPlane`](durable_transport::InProcessControlPlane) clone for engines in
    /// one process, `PostgresStore::control_plane()` for engines on one PostgreSQL schema, a
    /// broker's. On it this engine
    /// - publishes its events as [`EngineConfig::event_forwarding`] says (by default the
    ///   run-level ones) and re-emits the events of the others to its own
    ///   [`subscribe`](Engine::subscribe)rs, so a client engine sees runs settle that workers
    ///   executed;
    /// - publishes its cancels: the engine executing a turn of the cancelled run stops it at
    ///   once (instead of at its next commit) and acts on what the store holds;
    /// - announces the remote-step tasks its commits dispatch (workers with the plane claim at
    ///   once) and the batches it sends to the run queue
    ///   ([`ControlWakeups`](durable_transport::ControlWakeups)), coalesced.
    ///
    /// Everything on it is a hint; the store stays the truth and the pollers the safety net.
    /// Without one the engine has an in-process plane of its own ([`Engine::control_plane`]),
    /// which the workers beside it share, and forwards no events.
    pub fn control_plane(mut self, plane: impl ControlPlane) -> Self {
        self.control_plane = Some(Arc::new(plane));
        self
    }

    /// Which of this engine's events are published on its control plane (default
    /// [`EventForwarding::Runs`](crate::EventForwarding::Runs)). Same as setting
    /// `config.event_forwarding = forwarding` on the [`EngineConfig`] given to
    /// [`config`](Self::config).
    pub fn event_forwarding(mut self, forwarding: crate::events::EventForwarding) -> Self {
        self.config.event_forwarding = forwarding;
        self
    }

    /// The id this engine holds leases under, shown as a run's `lease_owner` (default:
    /// `engine-<pid>-<random>`). Every engine sharing a store needs its own: two engines
    /// with one id would each take the other's leases for their own. Useful to name a
    /// process after its host or pod, and for reproducible simulations.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// A client engine: it starts, signals, queries and waits for runs but executes none
    /// (workers do). Same as setting `config.execute = false` on the [`EngineConfig`] given
    /// to [`config`](Self::config).
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
    /// runtime. Describes the engine's metrics to the installed `metrics` recorder, if any
    /// (see [`metrics`](crate::metrics)): install it before building the engine.
    pub fn build(self) -> Result<Engine> {
        let store = self.store.ok_or_else(|| {
            Error::Store(durable_core::StoreError::NotFound {
                what: "a store: call Engine::builder().store(..) before build()".into(),
            })
        })?;
        let owner = self.owner.unwrap_or_else(|| {
            format!("engine-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..12])
        });
        crate::metrics::describe();
        let shared = Shared::new(store, self.clock, self.config, self.transport, self.control_plane, owner);
        let tasks = shared.spawn_background();
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
    /// A delayed start: the run is created `pending` and executes at this time (epoch ms on
    /// the engine's clock). Wins over `delay`.
    pub start_at: Option<Millis>,
    /// A delayed start: the run executes this long after it is created.
    pub delay: Option<Duration>,
    /// The W3C `traceparent` the run's spans join (a trace the caller received from
    /// elsewhere, say an HTTP request's header). Default: the caller's current span's, with
    /// the `otel` feature and a valid OpenTelemetry context, else a fresh trace. A value that
    /// is not a valid `traceparent` fails the start with [`Error::InvalidTraceContext`](crate::Error::InvalidTraceContext).
    pub trace_context: Option<String>,
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

    /// Starts the run at `at` (epoch milliseconds on the engine's clock) rather than at once:
    /// it is created `pending` with that start time (shown by `runs show`) and executes when
    /// it comes — one durable timer, no polling per run, surviving restarts. A time in the
    /// past starts at once; one after the year 9999
    /// ([`LATEST_START`](durable_core::LATEST_START)) is refused as
    /// [`Error::StartTooLate`](crate::Error::StartTooLate).
    pub fn start_at(mut self, at: Millis) -> Self {
        self.start_at = Some(at);
        self
    }

    /// Starts the run `delay` after it is created ([`StartOptions::start_at`]; a delay that
    /// ends after the year 9999 is refused as [`Error::StartTooLate`](crate::Error::StartTooLate)).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Sets the W3C `traceparent` the run's spans join ([`StartOptions::trace_context`]).
    pub fn trace_context(mut self, traceparent: impl Into<String>) -> Self {
        self.trace_context = Some(traceparent.into());
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

    /// The output of a completed run, decoded; [`Error::RunFailed`] otherwise. A run that
    /// continued as new has only its successor's id as output: asked for another type, it is
    /// [`Error::ContinuedAsNew`] (wait with [`Engine::wait_for_run_following`] instead).
    pub fn output<O: DeserializeOwned>(&self) -> Result<O> {
        match (&self.run.status, &self.run.output) {
            (RunStatus::Completed, Some(out)) => out.decode().map_err(|source| {
                let id = self.run.id.clone();
                match durable_core::protocol::successor_of(&self.run) {
                    Some(successor) => Error::ContinuedAsNew { id, successor },
                    None => Error::Output { id, source },
                }
            }),
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
        EngineBuilder {
            store: None,
            clock: Arc::new(SystemClock),
            config: EngineConfig::default(),
            transport: None,
            control_plane: None,
            owner: None,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// The control plane this engine publishes on and listens to: the one given to
    /// [`EngineBuilder::control_plane`], or the engine's own in-process plane.
    pub fn control_plane(&self) -> &Arc<dyn ControlPlane> {
        self.inner.shared.control_plane()
    }

    /// This engine instance's id: the lease owner it holds leases under, and the `origin` of
    /// what it publishes on its control plane.
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

    /// Subscribes to this engine's [`EngineEvent`]s, and to those other engines forward on
    /// the control plane.
    pub fn subscribe(&self) -> broadcast::Receiver<EngineEvent> {
        self.inner.shared.hooks.subscribe()
    }

    /// Resolves once no run executes on this engine: every turn in flight here ended and its
    /// run went quiet ([`Metrics::turns_in_flight`] is 0). New work may start at once after;
    /// for tests and tools that want a still moment (say, between two measured phases).
    pub async fn until_idle(&self) {
        self.shared().until_idle().await;
    }

    /// Resolves once the engine's poller has looked at the store (for pending, due and orphaned
    /// runs of the workflows registered then) at least once since the engine was built. Its
    /// first look runs on a task of its own, so it may come late: a test that has a second
    /// engine act on runs this one could find waits for it first. At once on an engine that
    /// executes nothing ([`EngineBuilder::client_only`]): it has no poller.
    pub async fn until_polled(&self) {
        self.inner.shared.until_polled().await;
    }

    /// The engine's counters.
    pub fn metrics(&self) -> Metrics {
        let shared = &self.inner.shared;
        let in_flight = shared.in_flight();
        Metrics {
            turns_in_flight: in_flight,
            max_turns_in_flight: shared.max_in_flight(),
            runs_queued: shared.dispatched().saturating_sub(in_flight),
            turns: shared.metrics.turns(),
            turns_without_progress: shared.metrics.turns_without_progress(),
            batches_sent: shared.metrics.batches(),
            runs_sent: shared.metrics.queued_runs(),
            runs_watched: shared.watched(),
            warm_resumes: shared.warm_resumes(),
            warm_dropped: shared.warm_dropped(),
            warm_runs: shared.warm_held(),
        }
    }

    /// Looks at the store for pending, due and orphaned runs now, instead of at the next poll.
    pub fn poll_now(&self) {
        self.inner.shared.poll_now();
    }
}
