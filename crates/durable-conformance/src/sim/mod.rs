//! Seeded simulation: whole engines over one store, on virtual time, with store faults,
//! crashes and restarts, duplicate and delayed deliveries — all chosen from one seed — and
//! the invariants of durable execution checked against a fault-free run.
//!
//! A [`Simulation`] runs on its own current-thread tokio runtime with paused time, so a
//! simulated month takes milliseconds and nothing depends on the machine's speed. The seed
//! picks, for the faulty run:
//! - how many engines share the store (one or two) and whether runs reach them through a
//!   shared run queue (whose deliveries are duplicated and delayed at random) or through the
//!   store's pollers, and each engine's polling cadence;
//! - a random latency for every store call, which reorders what the engines do;
//! - store faults on a share of the calls (an error before the call is applied, or a lost
//!   acknowledgement: applied, then an error), through [`FaultyStore`](crate::FaultyStore);
//! - crashes: an engine stops dead in the middle of a store call (before or after it is
//!   applied), and restarts later with a new lease-owner id;
//! - when each run starts and when each signal is sent.
//!
//! The same workflows and inputs are first run fault-free on one engine. Then the faulty run
//! must satisfy every invariant ([`Invariant`]): no completed step executes again, no two
//! executions of one step overlap, no step completion is reported twice, every signal is
//! consumed exactly once, no run is lost or stuck, and every run ends with the status,
//! output, error code and history (`(seq, name, kind, status)`) of the fault-free run.
//!
//! A failure names its seed; [`Simulation::seeded`] with that seed reproduces it exactly: the
//! same seed gives the same sequence of events, whose hash is [`SimReport::trace_hash`].
//!
//! ```
//! use durable_conformance::sim::Simulation;
//! use durable_runtime::WorkflowCtx;
//!
//! let report = Simulation::seeded(7)
//!     .register(|engine| {
//!         engine.register("greet", 1, |ctx: WorkflowCtx, name: String| async move {
//!             let hello: String = ctx.step("hello", move |_| {
//!                 let name = name.clone();
//!                 async move { Ok(format!("hello {name}")) }
//!             })
//!             .await?;
//!             Ok::<_, durable_runtime::WorkflowError>(hello)
//!         });
//!     })
//!     .start("greet", "greet-1", &"ada")
//!     .run()
//!     .unwrap_or_else(|failure| panic!("{failure}"));
//! assert_eq!(report.runs["greet-1"].output.as_deref(), Some("\"hello ada\""));
//! ```
//!
//! The engine's own sample workflows (steps with retries, sleeps, signals with timeouts,
//! children, sagas, continue-as-new) are one call away: [`Simulation::samples`].

mod driver;
mod samples;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use durable_core::{Payload, RunStatus};
use durable_runtime::Engine;
use serde::Serialize;

pub use samples::SAMPLE_WORKFLOWS;

/// Workflows to register on every engine the simulation builds.
#[derive(Clone)]
enum Registration {
    /// The user's.
    User(Arc<dyn Fn(&Engine) + Send + Sync>),
    /// The engine's samples, with the probe of the execution.
    Samples,
}

/// One simulation: workflows, the runs to start, the signals to send, and what may go wrong.
/// Build it with [`Simulation::seeded`], then [`Simulation::run`] it.
#[derive(Clone)]
#[must_use]
pub struct Simulation {
    seed: u64,
    options: SimOptions,
    registrations: Vec<Registration>,
    starts: Vec<SimStart>,
    signals: Vec<SimSignal>,
}

impl fmt::Debug for Simulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulation")
            .field("seed", &self.seed)
            .field("options", &self.options)
            .field("starts", &self.starts.len())
            .field("signals", &self.signals.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
struct SimStart {
    workflow: String,
    id: String,
    input: Payload,
}

#[derive(Debug, Clone)]
struct SimSignal {
    token: String,
    payload: Payload,
    /// Sent this long after the simulation begins (virtual time).
    after: Duration,
}

/// What may go wrong in a simulation, and its limits. `None` fields are chosen from the seed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SimOptions {
    /// Engines sharing the store (default: one or two, from the seed).
    pub engines: Option<usize>,
    /// Runs reach engines through a shared run queue rather than the store's pollers
    /// (default: from the seed).
    pub run_queue: Option<bool>,
    /// The share of store calls that fail (default 0.05). A fifth of them are lost
    /// acknowledgements (the call is applied, then fails).
    pub fault_rate: f64,
    /// The largest latency of a store call (default 20 ms; each call draws its own).
    pub max_latency: Duration,
    /// The most crashes in one simulation (default 3; the seed picks how many, from zero).
    pub max_crashes: u32,
    /// The share of run-queue deliveries sent twice, and the share delayed (default 0.1 each).
    pub delivery_fault_rate: f64,
    /// How much virtual time the runs have to finish (default 30 days).
    pub horizon: Duration,
    /// Logs every store call of the executing engines in the trace (method, run, latency):
    /// for finding out why a seed fails (default false).
    pub trace_store_calls: bool,
    /// Plants a bug (claims ignore live leases) in the simulated store, for testing that the
    /// simulation finds bugs. Never set it for anything else.
    #[doc(hidden)]
    pub plant_lease_bug: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            engines: None,
            run_queue: None,
            fault_rate: 0.05,
            max_latency: Duration::from_millis(20),
            max_crashes: 3,
            delivery_fault_rate: 0.1,
            horizon: Duration::from_secs(30 * 24 * 3600),
            trace_store_calls: false,
            plant_lease_bug: false,
        }
    }
}

impl Simulation {
    /// An empty simulation driven by `seed`, with the default [`SimOptions`].
    pub fn seeded(seed: u64) -> Self {
        Simulation {
            seed,
            options: SimOptions::default(),
            registrations: Vec::new(),
            starts: Vec::new(),
            signals: Vec::new(),
        }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Replaces the options.
    pub fn options(mut self, options: SimOptions) -> Self {
        self.options = options;
        self
    }

    /// How many engines share the store ([`SimOptions::engines`]).
    pub fn engines(mut self, engines: usize) -> Self {
        self.options.engines = Some(engines.max(1));
        self
    }

    /// The share of store calls that fail ([`SimOptions::fault_rate`]); 0 turns store faults
    /// off.
    pub fn fault_rate(mut self, rate: f64) -> Self {
        self.options.fault_rate = rate;
        self
    }

    /// The most crashes ([`SimOptions::max_crashes`]); 0 turns crashes off.
    pub fn max_crashes(mut self, crashes: u32) -> Self {
        self.options.max_crashes = crashes;
        self
    }

    /// How much virtual time the runs have to finish ([`SimOptions::horizon`]).
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.options.horizon = horizon;
        self
    }

    /// Logs every store call of the executing engines in the trace
    /// ([`SimOptions::trace_store_calls`]).
    pub fn trace_store_calls(mut self) -> Self {
        self.options.trace_store_calls = true;
        self
    }

    /// Plants a bug in the simulated store: claims take runs whose lease another engine still
    /// holds. For testing that the simulation finds bugs; never use it for anything else.
    #[doc(hidden)]
    pub fn plant_lease_bug(mut self) -> Self {
        self.options.plant_lease_bug = true;
        self
    }

    /// Registers workflows: `register` is called on every engine the simulation builds
    /// (each restart builds a new one), as a process registers its workflows at startup.
    pub fn register(mut self, register: impl Fn(&Engine) + Send + Sync + 'static) -> Self {
        self.registrations.push(Registration::User(Arc::new(register)));
        self
    }

    /// Starts a run of `workflow` with id `id` (at a time the seed picks, within the first
    /// 30 simulated seconds).
    ///
    /// # Panics
    /// If `input` does not serialize to JSON.
    pub fn start<I: Serialize + ?Sized>(mut self, workflow: &str, id: &str, input: &I) -> Self {
        let input = Payload::encode(input).unwrap_or_else(|e| panic!("the input of simulated run {id:?}: {e}"));
        self.starts.push(SimStart { workflow: workflow.to_string(), id: id.to_string(), input });
        self
    }

    /// Sends a signal on `token`, `after` the simulation begins (virtual time).
    ///
    /// # Panics
    /// If `payload` does not serialize to JSON.
    pub fn signal<P: Serialize + ?Sized>(mut self, token: &str, payload: &P, after: Duration) -> Self {
        let payload =
            Payload::encode(payload).unwrap_or_else(|e| panic!("the payload of simulated signal {token:?}: {e}"));
        self.signals.push(SimSignal { token: token.to_string(), payload, after });
        self
    }

    /// Adds the engine's sample workflows ([`SAMPLE_WORKFLOWS`]: steps with retries, sleeps,
    /// signals with timeouts, children, sagas, continue-as-new), a seed-chosen mix of runs of
    /// them and the signals they wait for. Their steps also check, as they execute, that no
    /// completed step runs again and that no two executions of one step overlap.
    pub fn samples(self) -> Self {
        samples::add(self)
    }

    /// Whether the simulation runs the engine's samples and nothing else.
    fn samples_only(&self) -> bool {
        !self.registrations.is_empty() && self.registrations.iter().all(|r| matches!(r, Registration::Samples))
    }

    /// Runs the simulation: first fault-free on one engine, then with everything the seed
    /// chooses, and compares. Blocks; call it from a plain `#[test]` (it builds its own
    /// runtime, so not from inside a tokio runtime).
    ///
    /// # Errors
    /// The first invariant that does not hold, with the seed that reproduces it.
    pub fn run(&self) -> Result<SimReport, SimFailure> {
        let reference = driver::execute(self, None)?;
        let faulty = driver::execute(self, Some(&reference))?;
        driver::compare(self, &reference, &faulty)?;
        Ok(SimReport {
            seed: self.seed,
            trace_hash: faulty.trace_hash(),
            trace: faulty.trace.clone(),
            runs: faulty.runs.clone(),
            engines: faulty.engines,
            crashes: faulty.crashes,
            store_faults: faulty.store_faults,
            elapsed: faulty.elapsed,
        })
    }
}

/// How one run ended in a simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunEnd {
    /// Its status at the end (terminal, or a legitimate wait).
    pub status: RunStatus,
    /// Its output as JSON text, if it completed.
    pub output: Option<String>,
    /// Its error code, if it failed with one.
    pub error_code: Option<String>,
    /// Its history as `(seq, name, kind, status)`.
    pub history: Vec<String>,
}

/// What a simulation that held every invariant did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// A hash of the faulty run's event log (engine events and the simulation's own actions,
    /// with their virtual times): equal for two runs of one seed.
    pub trace_hash: u64,
    /// The faulty run's event log: one line per engine event or simulation action (a
    /// start, a signal, a crash, a restart, a duplicated or delayed delivery), each with
    /// its virtual time in milliseconds and who did it.
    pub trace: Vec<String>,
    /// Every run in the store at the end (children and successors included), by id.
    pub runs: BTreeMap<String, RunEnd>,
    /// How many engines shared the store.
    pub engines: usize,
    /// How many times an engine crashed.
    pub crashes: u32,
    /// How many store calls failed on purpose.
    pub store_faults: u64,
    /// The virtual time the faulty run took.
    pub elapsed: Duration,
}

/// The invariant a simulation broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Invariant {
    /// A step executed although its result was already committed.
    StepReexecuted,
    /// Two executions of one step overlapped (two engines ran one run at once).
    ConcurrentExecution,
    /// An engine reported one step's completion twice.
    DuplicateCompletion,
    /// A signal was consumed twice, or never although the fault-free run consumed it.
    SignalNotExactlyOnce,
    /// A run did not reach a terminal state or a legitimate wait within the horizon.
    Stuck,
    /// A run ended differently from the fault-free run (status, output, error, history), or
    /// a run is missing.
    OutcomeDiffers,
    /// The fault-free run itself did not finish, or the simulation could not proceed (a
    /// start refused for good, say).
    Setup,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::StepReexecuted => "step_reexecuted",
            Invariant::ConcurrentExecution => "concurrent_execution",
            Invariant::DuplicateCompletion => "duplicate_completion",
            Invariant::SignalNotExactlyOnce => "signal_not_exactly_once",
            Invariant::Stuck => "stuck",
            Invariant::OutcomeDiffers => "outcome_differs",
            Invariant::Setup => "setup",
        })
    }
}

/// A broken invariant, with the seed that reproduces it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SimFailure {
    /// The seed.
    pub seed: u64,
    /// Which invariant broke.
    pub invariant: Invariant,
    /// What happened, naming the run, seq or token.
    pub message: String,
    /// The event log up to the failure ([`SimReport::trace`]); the message shows its end.
    pub trace: Vec<String>,
    /// A hash of the whole event log up to the failure (equal for two runs of one seed).
    pub trace_hash: u64,
    /// Whether the simulation ran the engine's samples alone (`cargo xtask sim` replays it).
    samples_only: bool,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "simulation seed {} broke {}: {}", self.seed, self.invariant, self.message)?;
        write!(f, "reproduce with Simulation::seeded({})", self.seed)?;
        if self.samples_only {
            write!(f, " (in the durable repository: cargo xtask sim --seed {})", self.seed)?;
        }
        writeln!(f)?;
        writeln!(f, "last events (virtual ms, who, what):")?;
        for line in &self.trace[self.trace.len().saturating_sub(40)..] {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SimFailure {}

/// Runs the engine's samples ([`Simulation::samples`]) with the default options for every
/// seed in `seeds`; returns the reports, or the first failure.
///
/// # Errors
/// The first seed that breaks an invariant.
pub fn run_samples(seeds: impl IntoIterator<Item = u64>) -> Result<Vec<SimReport>, SimFailure> {
    seeds.into_iter().map(|seed| Simulation::seeded(seed).samples().run()).collect()
}

/// A small, fast, seedable generator (SplitMix64): the simulation's only source of chance.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        durable_core::splitmix64(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        // 53 random bits as a float in [0, 1).
        #[allow(clippy::cast_precision_loss)]
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// Uniform in `0..=max`.
    pub(crate) fn duration(&mut self, max: Duration) -> Duration {
        let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.below(ms.saturating_add(1)))
    }

    /// An independent generator for one purpose, so that drawing more numbers for one thing
    /// does not shift what another draws.
    pub(crate) fn fork(&mut self, purpose: u64) -> Rng {
        Rng::new(durable_core::splitmix64(self.next_u64() ^ purpose))
    }
}
