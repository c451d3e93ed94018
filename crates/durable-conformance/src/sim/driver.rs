//! One execution of a [`Simulation`]: the world (store, engines, clock, run queue), the
//! driver loop (starts, signals, crashes, restarts, the end check) and the event log.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_core::{
    CheckpointStatus, Millis, QueuedRun, Run, RunFilter, RunId, RunStatus, StepKind, Store, StoreError,
};
use durable_runtime::{Engine, EngineConfig, EngineEvent, StartOptions, TokioClock};
use durable_store_memory::MemoryStore;
use durable_transport::{Consumer, InProcessTransport, RunHandler, Transport, TransportError};
use parking_lot::Mutex;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::samples::{self, Probe};
use super::{Invariant, Registration, Rng, RunEnd, SimFailure, Simulation};
use crate::{Fault, FaultyStore};

/// Where the simulated clock starts: 2026-01-01T00:00:00Z.
const EPOCH_MS: Millis = 1_767_225_600_000;
/// How often the driver looks whether every run has finished.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// What one execution of a simulation left.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) runs: BTreeMap<String, RunEnd>,
    pub(super) trace: Vec<String>,
    pub(super) engines: usize,
    pub(super) crashes: u32,
    pub(super) store_faults: u64,
    pub(super) elapsed: Duration,
    /// Store calls the executing engines made.
    pub(super) calls: u64,
    /// How many times each simulated signal was consumed (recorded in some run's history).
    pub(super) consumed: BTreeMap<(String, String), usize>,
}

impl Outcome {
    pub(super) fn trace_hash(&self) -> u64 {
        hash_lines(&self.trace)
    }
}

/// FNV-1a over the lines (and a separator after each): stable across processes and versions.
fn hash_lines(lines: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in lines {
        for b in line.bytes().chain([b'\n']) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Runs `sim` once: fault-free on one engine (`reference` is `None`), or with everything the
/// seed chooses, on a fresh current-thread runtime with paused time.
pub(super) fn execute(sim: &Simulation, reference: Option<&Outcome>) -> Result<Outcome, SimFailure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime for the simulation");
    runtime.block_on(async {
        let world = World::new(sim, reference);
        let log = world.log.clone();
        world.run().await.map_err(|(invariant, message)| log.failure(sim, invariant, message))
    })
}

/// Compares the faulty run with the fault-free one.
pub(super) fn compare(sim: &Simulation, reference: &Outcome, faulty: &Outcome) -> Result<(), SimFailure> {
    let fail = |invariant, message: String| {
        Err(SimFailure {
            seed: sim.seed,
            invariant,
            message,
            trace: faulty.trace.clone(),
            trace_hash: faulty.trace_hash(),
            samples_only: sim.samples_only(),
        })
    };
    for ((token, payload), n) in &faulty.consumed {
        let expected = reference.consumed.get(&(token.clone(), payload.clone())).copied().unwrap_or(0);
        if *n != expected {
            return fail(
                Invariant::SignalNotExactlyOnce,
                format!(
                    "signal {payload} on token {token:?} was consumed {n} times; the fault-free run consumed it {expected} times"
                ),
            );
        }
    }
    for id in reference.runs.keys().chain(faulty.runs.keys()).collect::<BTreeSet<_>>() {
        match (reference.runs.get(id), faulty.runs.get(id)) {
            (Some(want), Some(got)) if want == got => {}
            (Some(want), Some(got)) => {
                return fail(
                    Invariant::OutcomeDiffers,
                    format!("run {id} ended as {got:?}; the fault-free run ended as {want:?}"),
                );
            }
            (Some(_), None) => return fail(Invariant::OutcomeDiffers, format!("run {id} is missing")),
            (None, _) => {
                return fail(Invariant::OutcomeDiffers, format!("run {id} exists only in the run with faults"));
            }
        }
    }
    Ok(())
}

/// The simulation's event log and the violations found while it ran.
pub(super) struct Log {
    start: Instant,
    inner: Mutex<LogInner>,
}

#[derive(Default)]
struct LogInner {
    lines: Vec<String>,
    /// `(run, seq)` of every step completion an engine reported.
    completions: BTreeSet<(RunId, u32)>,
    violation: Option<(Invariant, String)>,
}

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Log").field("lines", &self.inner.lock().lines.len()).finish_non_exhaustive()
    }
}

impl Log {
    fn new() -> Self {
        Log { start: Instant::now(), inner: Mutex::new(LogInner::default()) }
    }

    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub(super) fn push(&self, who: &str, what: impl fmt::Display) {
        let line = format!("{:>10} {who} {what}", self.elapsed().as_millis());
        self.inner.lock().lines.push(line);
    }

    /// Records the first violation (later ones are usually its consequences).
    pub(super) fn violation(&self, invariant: Invariant, message: String) {
        self.push("sim", format_args!("VIOLATION {invariant}: {message}"));
        self.inner.lock().violation.get_or_insert((invariant, message));
    }

    fn take_violation(&self) -> Option<(Invariant, String)> {
        self.inner.lock().violation.take()
    }

    fn event(&self, who: &str, event: &EngineEvent) {
        self.push(who, format_args!("{event:?}"));
        if let EngineEvent::StepCompleted { run_id, seq, name, .. } = event
            && !self.inner.lock().completions.insert((run_id.clone(), *seq))
        {
            self.violation(
                Invariant::DuplicateCompletion,
                format!("run {run_id} seq {seq}: step {name:?} was reported completed a second time (by {who})"),
            );
        }
    }

    fn lines(&self) -> Vec<String> {
        self.inner.lock().lines.clone()
    }

    fn failure(&self, sim: &Simulation, invariant: Invariant, message: String) -> SimFailure {
        let trace = self.lines();
        SimFailure {
            seed: sim.seed,
            invariant,
            message,
            trace_hash: hash_lines(&trace),
            trace,
            samples_only: sim.samples_only(),
        }
    }
}

/// The run queue of a simulation: the in-process queue, with deliveries duplicated and
/// delayed at random.
#[derive(Debug, Clone)]
struct SimTransport {
    inner: InProcessTransport,
    rng: Arc<Mutex<Rng>>,
    rate: f64,
    log: Arc<Log>,
}

#[async_trait]
impl Transport for SimTransport {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        let mut now = Vec::with_capacity(batch.len());
        for item in batch {
            let (twice, delay) = {
                let mut rng = self.rng.lock();
                let twice = rng.chance(self.rate);
                let delay = rng.chance(self.rate).then(|| rng.duration(Duration::from_secs(2)));
                (twice, delay)
            };
            if twice {
                self.log.push("queue", format_args!("duplicate delivery of run {}", item.run_id));
                now.push(item.clone());
            }
            match delay {
                Some(delay) => {
                    self.log.push("queue", format_args!("delivery of run {} delayed {delay:?}", item.run_id));
                    let (inner, namespace) = (self.inner.clone(), namespace.map(str::to_string));
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = inner.dispatch_runs(namespace.as_deref(), vec![item]).await;
                    });
                }
                None => now.push(item),
            }
        }
        self.inner.dispatch_runs(namespace, now).await
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        self.inner.consume_runs(namespace, concurrency, handler)
    }
}

/// One engine process of the simulation.
struct Slot {
    engine: Option<Engine>,
    store: Arc<FaultyStore<MemoryStore>>,
    /// Calls made by earlier generations' wrappers.
    calls: u64,
    faults: u64,
    generation: u32,
    restart_at: Option<Instant>,
}

enum Action {
    Start(usize),
    Signal(usize),
}

struct World<'a> {
    sim: &'a Simulation,
    faulty: bool,
    /// The driver's own decisions (crashes, restarts, latencies, faults).
    rng: Rng,
    store: Arc<MemoryStore>,
    clock: TokioClock,
    /// When the simulation began (tokio's clock).
    start: Instant,
    config: EngineConfig,
    log: Arc<Log>,
    probe: Arc<Probe>,
    slots: Vec<Slot>,
    transport: Option<SimTransport>,
    crash_tx: mpsc::UnboundedSender<usize>,
    crash_rx: mpsc::UnboundedReceiver<usize>,
    /// Store-call numbers (per engine generation) at which the next crashes happen.
    crash_points: Vec<u64>,
    crashes: u32,
}

impl<'a> World<'a> {
    fn new(sim: &'a Simulation, reference: Option<&Outcome>) -> Self {
        let faulty = reference.is_some();
        let mut rng = Rng::new(sim.seed).fork(if faulty { 2 } else { 1 });
        let options = &sim.options;
        let engines = if faulty { options.engines.unwrap_or(1 + rng.below(2) as usize).max(1) } else { 1 };
        let run_queue = faulty && options.run_queue.unwrap_or_else(|| rng.chance(0.5));
        let store = Arc::new(MemoryStore::new());
        store.plant_bug_ignore_live_leases(faulty && options.plant_lease_bug);
        let clock = TokioClock::starting_at(EPOCH_MS);
        let start = Instant::now();
        let mut config = EngineConfig::default();
        config.poll_interval = Duration::from_millis(if faulty { 1_000 + rng.below(9_000) } else { 5_000 });
        config.orphan_poll_interval = Duration::from_secs(10);
        config.wait_poll_interval = Duration::from_secs(1);
        config.store_retry_backoff = Duration::from_millis(100);
        config.lease_ttl = Duration::from_secs(30);
        let log = Arc::new(Log::new());
        let transport = run_queue.then(|| SimTransport {
            inner: InProcessTransport::new(),
            rng: Arc::new(Mutex::new(rng.fork(3))),
            rate: options.delivery_fault_rate,
            log: log.clone(),
        });
        let crash_points = match reference {
            Some(reference) if options.max_crashes > 0 => {
                let n = rng.below(u64::from(options.max_crashes) + 1);
                // Half of the crashes early, while the runs are busy; the rest anywhere.
                let span = (reference.calls / engines as u64).max(1);
                (0..n).map(|k| 1 + if k % 2 == 0 { rng.below(span / 10 + 1) } else { rng.below(span) }).collect()
            }
            _ => Vec::new(),
        };
        let (crash_tx, crash_rx) = mpsc::unbounded_channel();
        let probe = Arc::new(Probe::new(store.clone(), log.clone()));
        let mut world = World {
            sim,
            faulty,
            rng,
            store,
            clock,
            start,
            config,
            log,
            probe,
            slots: Vec::new(),
            transport,
            crash_tx,
            crash_rx,
            crash_points,
            crashes: 0,
        };
        world.log.push(
            "sim",
            format_args!(
                "seed {} {}: {engines} engine(s), run queue {run_queue}, poll every {:?}",
                sim.seed,
                if faulty { "with faults" } else { "fault-free" },
                world.config.poll_interval
            ),
        );
        for i in 0..engines {
            let store = world.wrap_store(i);
            world.slots.push(Slot { engine: None, store, calls: 0, faults: 0, generation: 0, restart_at: None });
            world.boot(i);
        }
        world
    }

    /// A fresh view of the store for engine `i`: seeded latency, faults and, maybe, the next
    /// crash point.
    fn wrap_store(&mut self, i: usize) -> Arc<FaultyStore<MemoryStore>> {
        let store = Arc::new(FaultyStore::over(self.store.clone()));
        if !self.faulty {
            return store;
        }
        if let Some(at) = self.crash_points.pop() {
            let after_apply = self.rng.chance(0.5);
            let tx = self.crash_tx.clone();
            let crash = Fault::when(move |call| {
                let hit = call.number == at;
                if hit {
                    let _ = tx.send(i);
                }
                hit
            })
            .hang();
            store.arm(if after_apply { crash.after_apply() } else { crash });
        }
        let rate = self.sim.options.fault_rate;
        let faults = Arc::new(Mutex::new(self.rng.fork(10 + i as u64)));
        let f = faults.clone();
        store.arm(Fault::when(move |_| f.lock().chance(rate * 0.8)));
        let f = faults.clone();
        store.arm(Fault::when(move |_| f.lock().chance(rate * 0.2)).after_apply());
        let max = self.sim.options.max_latency;
        let latency = Mutex::new(self.rng.fork(20 + i as u64));
        let (log, trace_calls) = (self.log.clone(), self.sim.options.trace_store_calls);
        let who = format!("e{i}");
        store.set_latency_with(move |call| {
            let latency = latency.lock().duration(max);
            if trace_calls {
                let run = call.run_id.map_or("", |id| id.as_str());
                log.push(&who, format_args!("store call #{} {} {run} ({latency:?})", call.number, call.method));
            }
            latency
        });
        store
    }

    fn owner(i: usize, generation: u32) -> String {
        format!("sim-e{i}.{generation}")
    }

    /// Starts engine `i` (again, after a crash).
    fn boot(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let owner = Self::owner(i, slot.generation);
        let mut builder = Engine::builder()
            .shared_store(slot.store.clone())
            .clock(self.clock)
            .config(self.config.clone())
            .owner(owner.clone());
        if let Some(transport) = &self.transport {
            builder = builder.transport(transport.clone());
        }
        let engine = builder.build().expect("a simulated engine");
        collect_events(&engine, &owner, &self.log);
        register(&engine, self.sim, &self.probe);
        self.log.push(&owner, "started");
        slot.engine = Some(engine);
    }

    /// Engine `i` dies in the middle of a store call: its turns vanish, its leases stay held.
    fn crash(&mut self, i: usize) {
        let restart_in = self.rng.duration(Duration::from_secs(60));
        let slot = &mut self.slots[i];
        let Some(engine) = slot.engine.take() else { return };
        drop(engine);
        self.crashes += 1;
        self.log.push(&Self::owner(i, slot.generation), format_args!("CRASH; restarts in {restart_in:?}"));
        slot.calls += slot.store.total_calls();
        slot.faults += slot.store.injected();
        slot.generation += 1;
        slot.restart_at = Some(Instant::now() + restart_in);
        let store = self.wrap_store(i);
        self.slots[i].store = store;
    }

    async fn run(mut self) -> Result<Outcome, (Invariant, String)> {
        let client = self.client();
        let mut schedule = self.schedule();
        schedule.reverse();
        let horizon = self.sim.options.horizon;
        let mut next_check = Instant::now() + CHECK_EVERY;
        loop {
            if let Some((invariant, message)) = self.log.take_violation() {
                return Err((invariant, message));
            }
            let next_action = schedule.last().map(|(at, _)| self.start + *at);
            let next_restart = self.slots.iter().filter_map(|s| s.restart_at).min();
            let wake = [Some(next_check), next_action, next_restart].into_iter().flatten().min().unwrap_or(next_check);
            tokio::select! {
                biased;
                Some(i) = self.crash_rx.recv() => {
                    self.crash(i);
                    continue;
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            while schedule.last().is_some_and(|(at, _)| self.start + *at <= now) {
                let (_, action) = schedule.pop().expect("a due action");
                self.act(&client, action).await?;
            }
            for i in 0..self.slots.len() {
                if self.slots[i].restart_at.is_some_and(|at| at <= now) {
                    self.slots[i].restart_at = None;
                    self.boot(i);
                }
            }
            if now >= next_check {
                next_check = now + CHECK_EVERY;
                let restarting = self.slots.iter().any(|s| s.restart_at.is_some());
                let runs = all_runs(&self.store).await;
                let unsettled: Vec<&Run> = runs.iter().filter(|r| !settled(r)).collect();
                if unsettled.is_empty() && schedule.is_empty() && !restarting {
                    break;
                }
                if self.log.elapsed() > horizon {
                    let list: Vec<String> = unsettled
                        .iter()
                        .map(|r| format!("{} ({}, wake_at {:?}, lease {:?})", r.id, r.status, r.wake_at, r.lease_owner))
                        .collect();
                    return Err((
                        Invariant::Stuck,
                        format!("after {horizon:?} these runs are neither finished nor waiting: {}", list.join(", ")),
                    ));
                }
            }
        }
        if let Some((invariant, message)) = self.log.take_violation() {
            return Err((invariant, message));
        }
        self.log.push("sim", "every run finished or waits");
        let outcome = self.outcome().await;
        drop(client);
        for slot in &mut self.slots {
            slot.engine.take();
        }
        Ok(outcome)
    }

    /// A client engine (it executes nothing) the driver starts runs and sends signals with.
    /// Its store calls fail now and then, but only before they are applied: a signal whose
    /// acknowledgement was lost cannot be told apart from one never sent, so it would be sent
    /// twice — that is the sender's problem, not the engine's.
    fn client(&mut self) -> Engine {
        let store = Arc::new(FaultyStore::over(self.store.clone()));
        if self.faulty {
            let rate = self.sim.options.fault_rate;
            let rng = Mutex::new(self.rng.fork(30));
            store.arm(Fault::when(move |_| rng.lock().chance(rate)));
        }
        let mut builder = Engine::builder()
            .shared_store(store)
            .clock(self.clock)
            .config(self.config.clone())
            .owner("sim-client")
            .client_only();
        if let Some(transport) = &self.transport {
            builder = builder.transport(transport.clone());
        }
        let client = builder.build().expect("the simulation's client engine");
        // Starting a run checks that its workflow is known.
        register(&client, self.sim, &self.probe);
        client
    }

    /// When each run starts and each signal is sent: the same in both executions of a seed.
    fn schedule(&self) -> Vec<(Duration, Action)> {
        let mut rng = Rng::new(self.sim.seed).fork(4);
        let mut schedule: Vec<(Duration, Action)> = Vec::new();
        for k in 0..self.sim.starts.len() {
            schedule.push((rng.duration(Duration::from_secs(30)), Action::Start(k)));
        }
        for (k, signal) in self.sim.signals.iter().enumerate() {
            schedule.push((signal.after, Action::Signal(k)));
        }
        schedule.sort_by_key(|(at, action)| {
            (
                *at,
                match action {
                    Action::Start(k) => (0, *k),
                    Action::Signal(k) => (1, *k),
                },
            )
        });
        schedule
    }

    async fn act(&mut self, client: &Engine, action: Action) -> Result<(), (Invariant, String)> {
        match action {
            Action::Start(k) => {
                let start = &self.sim.starts[k];
                self.log.push("sim", format_args!("start {} ({})", start.id, start.workflow));
                let input = start.input.to_value();
                retry(&self.log, &format!("starting run {}", start.id), || {
                    client.start(&start.workflow, &input, StartOptions::id(start.id.clone()))
                })
                .await
                .map(drop)
            }
            Action::Signal(k) => {
                let signal = &self.sim.signals[k];
                self.log.push("sim", format_args!("signal {} {}", signal.token, signal.payload.as_str()));
                let payload = signal.payload.to_value();
                retry(&self.log, &format!("signal on token {:?}", signal.token), || {
                    client.signal(&signal.token, &payload)
                })
                .await
                .map(drop)
            }
        }
    }

    async fn outcome(&self) -> Outcome {
        let mut runs = BTreeMap::new();
        let mut consumed: BTreeMap<(String, String), usize> = BTreeMap::new();
        for signal in &self.sim.signals {
            consumed.insert((signal.token.clone(), signal.payload.as_str().to_string()), 0);
        }
        for run in all_runs(&self.store).await {
            let history = self.store.history(&run.id).await.expect("the memory store answers");
            for c in &history {
                if c.kind == StepKind::Signal && c.status == CheckpointStatus::Completed {
                    let key = (c.name.clone(), c.output.as_ref().map_or_else(String::new, |p| p.as_str().to_string()));
                    if let Some(n) = consumed.get_mut(&key) {
                        *n += 1;
                    }
                }
            }
            let end = RunEnd {
                status: run.status,
                output: run.output.as_ref().map(|p| p.as_str().to_string()),
                error_code: run.error.as_ref().and_then(|e| e.code().map(str::to_string)),
                history: history.iter().map(|c| format!("{} {} {:?} {:?}", c.seq, c.name, c.kind, c.status)).collect(),
            };
            runs.insert(run.id.to_string(), end);
        }
        let calls = self.slots.iter().map(|s| s.calls + s.store.total_calls()).sum();
        let store_faults = self.slots.iter().map(|s| s.faults + s.store.injected()).sum();
        Outcome {
            runs,
            trace: self.log.lines(),
            engines: self.slots.len(),
            crashes: self.crashes,
            store_faults,
            elapsed: self.log.elapsed(),
            calls,
            consumed,
        }
    }
}

/// Registers the simulation's workflows on a freshly built engine.
fn register(engine: &Engine, sim: &Simulation, probe: &Arc<Probe>) {
    for registration in &sim.registrations {
        match registration {
            Registration::User(register) => register(engine),
            Registration::Samples => samples::register(engine, probe),
        }
    }
}

/// Copies the engine's events into the log, in the order the engine emits them.
fn collect_events(engine: &Engine, who: &str, log: &Arc<Log>) {
    let mut events = engine.subscribe();
    let (log, who) = (log.clone(), who.to_string());
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) => log.event(&who, &event),
                Err(broadcast::error::RecvError::Lagged(n)) => log.push(&who, format_args!("{n} events lost (lagged)")),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// Calls `f` until it succeeds, on retryable store errors (with a short pause).
async fn retry<T, F, Fut>(log: &Log, what: &str, mut f: F) -> Result<T, (Invariant, String)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = durable_runtime::Result<T>>,
{
    for _ in 0..1_000 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(durable_runtime::Error::Store(e)) if e.is_retryable() => {
                log.push("sim", format_args!("{what} failed ({e}); retrying"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err((Invariant::Setup, format!("{what}: {e}"))),
        }
    }
    Err((Invariant::Setup, format!("{what}: still failing after 1,000 tries")))
}

/// Finished, or waiting for something that has no time (a signal, an event, a child).
fn settled(run: &Run) -> bool {
    run.status.is_terminal() || (run.status == RunStatus::Suspended && run.wake_at.is_none())
}

/// Every run in the store, oldest first.
async fn all_runs(store: &MemoryStore) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut filter = RunFilter { limit: 1_000, ..RunFilter::default() };
    loop {
        let page = store.list_runs(&filter).await.unwrap_or_else(|e: StoreError| panic!("the memory store: {e}"));
        runs.extend(page.runs);
        match page.next_cursor {
            Some(cursor) => filter.cursor = Some(cursor),
            None => break,
        }
    }
    runs.reverse();
    runs
}
