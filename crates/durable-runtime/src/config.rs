//! Engine configuration. Every interval and limit of the engine is here.

use std::time::Duration;

use crate::events::EventForwarding;

/// The default of [`EngineConfig::max_payload_bytes`] (and of a remote-step worker's limit
/// away from an engine): 4 MiB.
pub(crate) const DEFAULT_MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;

/// Tuning knobs of an [`Engine`](crate::Engine). `Default` gives the documented defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Only execute, recover and time out runs of this namespace (`None`: all of them). Runs
    /// started by this engine default to it (or to `"default"`).
    pub namespace: Option<String>,
    /// Turns executing at once on this instance; further run ids wait in memory in arrival
    /// order. Default 256.
    pub max_concurrent_runs: usize,
    /// How long a turn's lease lasts; renewed at half-life. Default 30 s.
    pub lease_ttl: Duration,
    /// How often the pending and due-timer pollers look at the store. Default 500 ms.
    pub poll_interval: Duration,
    /// How often the orphan poller looks for runs whose lease expired. Default 5 s.
    pub orphan_poll_interval: Duration,
    /// Runs fetched per poll. Default 512.
    pub poll_batch: usize,
    /// With a run queue (a transport): how long the pollers leave a run to the item already
    /// sent for it. A run the pending poller finds is handed on only once this poller has seen
    /// it pending for this long (and again each time this long passes). On a queue that keeps
    /// duplicates (a broker: NATS, Redis; see
    /// [`Transport::merges_runs`](durable_transport::Transport::merges_runs)) the due poller
    /// also claims only runs due for this long; on the store-backed queue, which merges an
    /// item into the run's waiting one, a due run is claimed at once unless it has an unclaimed
    /// item of its own in the store's queue enqueued within this long (the wake its deliverer
    /// or its engine's timer sent; a delayed start or a sleep whose engine went away has
    /// none; such a run waits up to this long only behind `poll_batch` runs due before it that
    /// are left to their items). Each item a poller adds for a run already queued costs:
    /// on a broker it is delivered and costs a turn that finds nothing to do; on the store
    /// queue, a run whose item a consumer already took gets a second item, and the engine
    /// that takes it claims a run that is not free. Without the grace a burst of starts
    /// waiting in the queue gets one more item per engine per poll. The price: a start that
    /// was lost (an engine that died before its outbox was sent) or that was written without
    /// the run queue (by an engine or a tool without a transport), and on a broker a lost
    /// wake, are healed this much later. Not applied without a run queue or while the queue
    /// is failing. Default 5 s.
    pub poll_grace: Duration,
    /// Retry backoffs longer than this are durable waits (the run suspends); shorter ones are
    /// waited in memory, the run held. Either way the failed attempt's count is committed
    /// before the wait, so a crash never starts a step's retries over. Default 1 s.
    pub durable_retry_threshold: Duration,
    /// How long a workflow body may await something that is not a ctx future — a
    /// `tokio::time::sleep`, a channel receive, an HTTP call — before its run fails with code
    /// `non_ctx_await`. Replay cannot see such an await, and a run stuck on one holds its
    /// lease and an execution slot for nothing. It is measured on the engine's clock from the
    /// moment the body is pending with no ctx call executing (a step attempt, its in-memory
    /// backoff, a commit) and none parked; any ctx call starts it afresh, so a long step, a
    /// durable sleep or a wait never trip it. Default 1 s, like `durable_retry_threshold`,
    /// the engine's line between waiting in memory and waiting durably: far longer than the
    /// in-memory hand-offs a body may harmlessly await between ctx calls (an async mutex, a
    /// `yield_now`), yet short enough that the bug is named, and the lease and slot freed,
    /// at once rather than after a silent hang. `Duration::MAX` turns the check off.
    pub non_ctx_await_grace: Duration,
    /// Largest accepted payload (input, output, signal) in bytes. Default 4 MiB.
    pub max_payload_bytes: usize,
    /// Consecutive recoveries of one run without progress before it becomes `dead`: a run
    /// recovered more often than this since it last committed a step or a turn end is buried
    /// (a poison pill that kills its worker every time); recoveries that make progress never
    /// add up. Default 10.
    pub max_recovery_attempts: u32,
    /// How often `wait_for_run` re-reads the store for runs executed by other processes: all
    /// the runs this engine's callers wait on are read together (`Store::get_runs`), one
    /// call per interval however many callers wait. Default 250 ms.
    pub wait_poll_interval: Duration,
    /// First delay before retrying a turn that a store error aborted: after the run's n-th
    /// store error in a row (the count restarts once one of its turns ends) the delay is this
    /// × 2^min(n−1, 8), at most 30 s — with the default, 100 ms, 200 ms, … up to 25.6 s.
    /// Default 100 ms.
    pub store_retry_backoff: Duration,
    /// With a transport: most runs per batch sent to the run queue. Default 500.
    pub dispatch_batch: usize,
    /// [`Engine::start_many`](crate::Engine::start_many): runs created per store call (one
    /// `Store::create_runs`, one transaction). Default 500.
    pub start_batch: usize,
    /// With a transport: how often the outgoing batch is flushed when not full. Default 10 ms.
    pub dispatch_tick: Duration,
    /// With a transport: queued runs this engine executes at once. Default 64.
    pub queue_concurrency: usize,
    /// A wake that found another engine's lease is looked at again this often… Default 2 s.
    pub recheck_interval: Duration,
    /// …at most this many times. Default 30.
    pub recheck_attempts: u32,
    /// How long `run_worker` lets executing turns finish after a shutdown request. Default 30 s.
    pub drain_timeout: Duration,
    /// Whether this engine executes runs. `false` makes a client (an API server, a CLI): it
    /// starts runs, signals, queries and waits, and leaves the execution to workers. Default
    /// true.
    pub execute: bool,
    /// How often the scheduler looks at the store for schedules and trigger buffers that
    /// another engine created or changed; its own it times exactly (on the engine's clock).
    /// Default 1 s.
    pub schedule_poll_interval: Duration,
    /// Schedules fired (and buffers flushed) per store call. Default 500.
    pub schedule_batch: usize,
    /// How long a publish's dedupe id is remembered
    /// ([`PublishOptions::dedupe`](crate::PublishOptions::dedupe)). Default 24 h.
    pub event_dedupe_window: Duration,
    /// A run parked on a remote step wakes at least this often to look at its step again, so
    /// a lost wake heals. Default 5 min.
    pub reconcile_interval: Duration,
    /// How often the engine looks for remote-step attempts past their deadline (expiring
    /// them with `remote_timeout`) and for runs to mark `blocked` (no live worker can take
    /// their step) or to unblock. Default 5 s.
    pub blocked_poll: Duration,
    /// A worker that has not heartbeated for this long counts as gone. Default 30 s. Workers
    /// refresh their descriptor every 5 s: keep this well above that (15 s or more), or live
    /// workers drop out between refreshes and their steps' runs show `blocked`. It is this
    /// engine's view only: a descriptor is forgotten (deleted) once it is an hour old, or
    /// older than this if that is longer.
    pub worker_ttl: Duration,
    /// A step waiting for a slot of its queue asks again at least this often (a release
    /// wakes it at once; this heals a slot whose holder died: it is reclaimed once its lease
    /// passes). Default 15 s.
    pub admission_recheck: Duration,
    /// Which of this engine's events it publishes on its control plane for the other engines
    /// sharing it ([`EngineBuilder::control_plane`](crate::EngineBuilder::control_plane)).
    /// Default [`EventForwarding::Runs`]: the run-level events.
    pub event_forwarding: EventForwarding,
    /// Warm runs: how many suspended runs this engine keeps in memory — the parked workflow
    /// body and its turn — so that a wake of the run here continues the body where it parked
    /// instead of replaying its history (`0` turns it off). A run is resumed from memory only
    /// if its next claim is the very next one of the run (no other engine claimed it
    /// meanwhile, which needs a store that counts claims: [`Run::claims`](durable_core::Run::claims))
    /// and the store's checkpoints are the turn's own plus deliveries to its parked calls (a
    /// sleep or a wait); otherwise — and after a cancel, a lost lease, a store error, a run
    /// parked on something else (a step's durable backoff, a child, a remote step, a slot) or
    /// holding a child spawned and not joined yet —
    /// it replays as without the cache. Past the capacity, the least recently parked run is
    /// dropped. Each entry holds the run's history and its body's state in memory: about the
    /// size of its checkpoints plus the body's future. Default 1,024.
    pub warm_runs: usize,
    /// Short sleeps held in the turn: when every parked call of a workflow body is a durable
    /// sleep (`ctx.sleep`, `ctx.sleep_until`), nothing else is live and the earliest is due
    /// within this, the turn commits the sleeps' wake times, keeps the run `running` under
    /// its lease (the engine goes on renewing it) and waits in memory, then continues the
    /// body: one write per sleep, no suspension, timer, wake-up or claim. At most once per
    /// this limit, a due hold reads the run first: a cancel (one with compensation that
    /// reached only the store, too) or another owner meanwhile stops the turn, and a fresh
    /// claim acts on it. A crash or a lost lease meanwhile changes nothing durable: the run is
    /// recovered once its lease passes and its sleep ends at the recorded wake time. A run
    /// waiting for anything else (a signal, an event, a child, a remote step, a slot, a wait
    /// with a timeout) suspends as usual, and so does a longer sleep. A held turn keeps its
    /// execution slot: with no slot free, or while the engine drains or stops, turns suspend
    /// where they would hold (a drain wakes the held ones, and a run coming to wait for a
    /// slot one of them, which suspend at once). While held, the run shows as
    /// `running`, not `suspended`. Default `Duration::ZERO`: every sleep suspends the run.
    pub hold_sleeps_under: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            namespace: None,
            max_concurrent_runs: 256,
            lease_ttl: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            orphan_poll_interval: Duration::from_secs(5),
            poll_batch: 512,
            poll_grace: Duration::from_secs(5),
            durable_retry_threshold: Duration::from_secs(1),
            non_ctx_await_grace: Duration::from_secs(1),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_recovery_attempts: 10,
            wait_poll_interval: Duration::from_millis(250),
            store_retry_backoff: Duration::from_millis(100),
            dispatch_batch: 500,
            start_batch: 500,
            dispatch_tick: Duration::from_millis(10),
            queue_concurrency: 64,
            recheck_interval: Duration::from_secs(2),
            recheck_attempts: 30,
            drain_timeout: Duration::from_secs(30),
            execute: true,
            schedule_poll_interval: Duration::from_secs(1),
            schedule_batch: 500,
            event_dedupe_window: Duration::from_secs(24 * 3600),
            reconcile_interval: Duration::from_secs(300),
            blocked_poll: Duration::from_secs(5),
            worker_ttl: Duration::from_secs(30),
            admission_recheck: Duration::from_secs(15),
            event_forwarding: EventForwarding::Runs,
            warm_runs: 1024,
            hold_sleeps_under: Duration::ZERO,
        }
    }
}
