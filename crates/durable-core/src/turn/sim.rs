//! A property test of the turn over random call scripts, with crashes.
//!
//! A script is a workflow body as a list of ops (steps that fail a few times, sleeps, waits with
//! and without deadlines, children, patches, state, recorded values, steps with undos, and
//! awaits outside the ctx that resolve within the grace or not). A driver
//! runs the script the way the runtime runs a body — one call at a time, doing what each answer
//! says — turn after turn, each turn built from what a small in-test store (the [`World`]) has
//! committed, until the run settles. Between turns the world delivers signals, events and child
//! results or lets time pass. At chosen points a turn crashes: the [`Turn`] is dropped, with or
//! without the commit it was about to apply, or a commit fails.
//!
//! For every script it checks:
//! - (a) no call runs again once its completion was committed (closure executions are counted
//!   per seq and attempt; an attempt may run twice only if its commit was never applied; a
//!   recorded value is never produced again once committed), and attempt numbers follow what
//!   was committed;
//! - (b) every turn observes the same value at every op (a replay returns what the first run
//!   returned), and the run ends exactly as a crash-free run of the same script: same seqs, same
//!   observed values, same output, same final checkpoints; the crash-free run executes every
//!   attempt exactly once;
//! - (c) the commits are valid: no checkpoint goes from completed/failed back to running/waiting
//!   or changes its name or kind, nothing is written after the settle, the run settles exactly
//!   once, a suspend always has a wake time or a waiter, children are created once;
//! - (d) a replay-only turn ([`TurnConfig::replay_only`]) of the settled run over its final
//!   history matches it: it replays to the recorded end (`Replayed::Finished` with the settled
//!   status), observes the same values at every op, and runs, produces and commits nothing;
//! - and the run's own semantics: it fails only with an error of its own (never
//!   `non_determinism`: the code does not change between turns), every op the body saw has a
//!   final checkpoint at its seq once the run settled, a child that did not complete is recorded
//!   as a failed call, undos run newest first;
//! - a body pending with nothing in flight or parked (an await outside the ctx) is told to poll
//!   again exactly the grace after its last ctx call, and fails the run with `non_ctx_await`
//!   exactly when such awaits, back to back, outlast the grace.
//!
//! `random_scripts_reach_every_path` pins that the generators keep reaching every path (crashes
//! before and after a commit, failed commits, races, backoffs, compensation, ...).
//!
//! A failure prints the script, the crash points and a log of every call and commit.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use proptest::prelude::*;
use serde::Serialize;

use super::*;
use crate::protocol::{self, ChildResult};
use crate::{Backoff, NewRun, RunId, RunStatus, TurnEnd, WaitKind, Waiter, json_subset};

// ---- scripts ----

/// How a step retries.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Retry {
    /// No retries: the first failure gives up.
    None,
    /// Three retries 50 ms apart, waited in memory.
    InMemory,
    /// Three retries 2 s, 4 s, 8 s apart: each suspends the run.
    Durable,
    /// Three retries 400 ms, 800 ms (in memory), then 1.6 s (durable), with jitter.
    Mixed,
}

impl Retry {
    fn policy(self) -> RetryPolicy {
        match self {
            Retry::None => RetryPolicy::none(),
            Retry::InMemory => RetryPolicy::new(3, Backoff::Fixed(Duration::from_millis(50))),
            Retry::Durable => {
                RetryPolicy::new(3, Backoff::exponential(Duration::from_secs(2), Duration::from_secs(10)))
            }
            Retry::Mixed => {
                RetryPolicy::new(3, Backoff::exponential(Duration::from_millis(400), Duration::from_secs(10)))
                    .with_jitter(0.2)
            }
        }
    }
}

/// A step's closure: attempts up to `fails` fail (fatally if `fatal`), later ones succeed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StepSpec {
    fails: u32,
    retry: Retry,
    fatal: bool,
    /// The output is over the payload limit.
    big: bool,
}

/// When the world delivers to a wait.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Delivery {
    /// Before the run starts: buffered until the wait registers.
    Early,
    /// While the run is suspended on the wait (before its deadline).
    Before,
    /// After the deadline passed, while the turn that would expire the wait runs.
    Race,
    /// Never.
    Never,
}

/// How a child run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ChildEnd {
    Completes,
    Fails,
    Cancelled,
    /// Its workflow is not registered: it is never started.
    Unregistered,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Rec {
    Now,
    Random,
    Uuid,
    SideEffect,
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    /// A step, with an undo if given.
    Step(StepSpec, Option<StepSpec>),
    Sleep(u64),
    Wait {
        event: bool,
        deadline: Option<u64>,
        delivery: Delivery,
    },
    Child(ChildEnd),
    Patch,
    State,
    Record(Rec),
    /// An await outside the ctx (a `tokio::time::sleep`) that resolves this many ms after the
    /// body first waits on it, or never.
    Foreign(Option<u64>),
}

/// Where a turn crashes: at its `at`-th event (a call, or the points before and after a commit
/// is applied). With `fail`, a commit at that point fails instead (the store is unavailable).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Crash {
    at: u32,
    fail: bool,
}

fn retry() -> impl Strategy<Value = Retry> {
    prop_oneof![Just(Retry::None), Just(Retry::InMemory), Just(Retry::Durable), Just(Retry::Mixed)]
}

fn step_spec() -> impl Strategy<Value = StepSpec> {
    // Mostly steps that end up succeeding: a step that gives up ends the body.
    let fails = prop_oneof![10 => Just(0u32), 6 => 1..=2u32, 2 => Just(3u32), 1 => Just(4u32)];
    (fails, retry(), prop::bool::weighted(0.05), prop::bool::weighted(0.02))
        .prop_map(|(fails, retry, fatal, big)| StepSpec { fails, retry, fatal, big })
}

fn undo_spec() -> impl Strategy<Value = StepSpec> {
    (prop_oneof![3 => Just(0u32), 1 => 1..=2u32], retry()).prop_map(|(fails, retry)| StepSpec {
        fails,
        retry,
        fatal: false,
        big: false,
    })
}

fn op() -> impl Strategy<Value = Op> {
    let delivery =
        prop_oneof![Just(Delivery::Early), Just(Delivery::Before), Just(Delivery::Race), Just(Delivery::Never)];
    prop_oneof![
        6 => (step_spec(), prop::option::weighted(0.4, undo_spec())).prop_map(|(s, u)| Op::Step(s, u)),
        2 => prop_oneof![Just(0u64), 1..3_000u64].prop_map(Op::Sleep),
        3 => (any::<bool>(), prop::option::of(0..3_000u64), delivery).prop_map(|(event, deadline, delivery)| {
            // Without a deadline a wait must be delivered to, or the run never ends.
            let delivery = match (deadline, delivery) {
                (None, Delivery::Race | Delivery::Never) => Delivery::Before,
                (_, d) => d,
            };
            Op::Wait { event, deadline, delivery }
        }),
        2 => prop_oneof![
            Just(ChildEnd::Completes),
            Just(ChildEnd::Fails),
            Just(ChildEnd::Cancelled),
            Just(ChildEnd::Unregistered)
        ]
        .prop_map(Op::Child),
        1 => Just(Op::Patch),
        1 => Just(Op::State),
        2 => prop_oneof![Just(Rec::Now), Just(Rec::Random), Just(Rec::Uuid), Just(Rec::SideEffect)].prop_map(Op::Record),
        // Mostly within the grace: one that outlasts it ends the script.
        1 => prop_oneof![6 => (0..GRACE).prop_map(Some), 1 => (GRACE..3 * GRACE).prop_map(Some), 1 => Just(None)]
            .prop_map(Op::Foreign),
    ]
}

fn crashes() -> impl Strategy<Value = Vec<Option<Crash>>> {
    // Most turns have a handful of events; some have dozens.
    let at = prop_oneof![3 => 1..10u32, 1 => 10..40u32];
    let crash = (at, prop::bool::weighted(0.3)).prop_map(|(at, fail)| Crash { at, fail });
    prop::collection::vec(prop::option::weighted(0.6, crash), 0..12)
}

// ---- the world: a store, a clock and everything outside the run ----

const OWNER: &str = "sim";
const MAX_TURNS: usize = 400;
/// How long the body may await something outside the ctx, in ms.
const GRACE: u64 = 1_000;

fn config() -> TurnConfig {
    TurnConfig {
        max_payload_bytes: 4096,
        durable_retry_threshold: Duration::from_secs(1),
        latest_version: 1,
        non_ctx_await_grace: Duration::from_millis(GRACE),
        replay_only: false,
        reconcile_interval: Duration::from_secs(300),
        ..TurnConfig::default()
    }
}

fn p<T: Serialize + ?Sized>(v: &T) -> Payload {
    Payload::encode(v).expect("encodes")
}

/// The op index in a name like `w3` or `kid:3`.
fn op_of(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// A checkpoint without its timestamps, to compare runs.
type CpShape = (String, StepKind, CheckpointStatus, Option<Payload>, Option<Payload>, Option<StepError>, u32);

fn shape(c: &Checkpoint) -> CpShape {
    (c.name.clone(), c.kind, c.status, c.input.clone(), c.output.clone(), c.error.clone(), c.attempts)
}

#[derive(Debug)]
struct World {
    run: Run,
    now: Millis,
    cps: BTreeMap<u32, Checkpoint>,
    waiters: BTreeMap<u32, Waiter>,
    signals: HashMap<String, VecDeque<Payload>>,
    events: HashMap<String, VecDeque<Payload>>,
    children: BTreeMap<RunId, NewRun>,
    state: BTreeMap<String, Payload>,
    settled: Option<(RunStatus, Option<Payload>, Option<StepError>)>,
    /// A waiter to deliver to right after the next turn loaded the run (a delivery racing the
    /// wait's deadline).
    race: Option<u32>,
}

impl World {
    fn new(script: &[Op]) -> Self {
        let run = NewRun {
            trace_context: None,
            admission: None,
            id: RunId::from("run"),
            workflow: "wf".into(),
            version: 1,
            namespace: "ns".into(),
            input: Payload::null(),
            tags: vec![],
            priority: 0,
            parent: None,
            created_at: 0,
            start_at: None,
        }
        .into_run();
        let mut w = World {
            run,
            now: 1_000,
            cps: BTreeMap::new(),
            waiters: BTreeMap::new(),
            signals: HashMap::new(),
            events: HashMap::new(),
            children: BTreeMap::new(),
            state: BTreeMap::new(),
            settled: None,
            race: None,
        };
        for (i, op) in script.iter().enumerate() {
            if let Op::Wait { event, delivery: Delivery::Early, .. } = op {
                w.send(i, *event);
            }
        }
        w
    }

    fn wait_payload(i: usize, event: bool) -> Payload {
        if event { p(&serde_json::json!({"op": i, "v": format!("ev{i}")})) } else { p(&format!("sig{i}")) }
    }

    /// Sends op `i`'s signal or event: to its waiter, or into the buffer.
    fn send(&mut self, i: usize, event: bool) {
        let name = format!("w{i}");
        let payload = World::wait_payload(i, event);
        let waiter = self.waiters.values().find(|w| w.name == name).map(|w| w.seq);
        match waiter {
            Some(seq) => self.deliver(seq, payload),
            None if event => self.events.entry(name).or_default().push_back(payload),
            None => self.signals.entry(name).or_default().push_back(payload),
        }
    }

    /// Takes the waiter at `seq` and records `payload` as its delivery.
    fn deliver(&mut self, seq: u32, payload: Payload) {
        self.waiters.remove(&seq).expect("a registered waiter");
        self.resolve(seq, payload);
    }

    fn resolve(&mut self, seq: u32, payload: Payload) {
        let cp = self.cps.get_mut(&seq).expect("a waiter's checkpoint is written with it");
        cp.status = CheckpointStatus::Completed;
        cp.output = Some(payload);
        cp.updated_at = self.now;
        self.run.wake_gen += 1;
        if self.run.status == RunStatus::Suspended {
            self.run.wake_at = Some(self.run.wake_at.map_or(self.now, |w| w.min(self.now)));
        }
    }

    fn register(&mut self, w: Waiter) {
        let buffered = match &w.kind {
            WaitKind::Signal { token } => self.signals.get_mut(token).and_then(VecDeque::pop_front),
            WaitKind::Event { name, matcher } => self.events.get_mut(name).and_then(|buf| {
                let pos = buf.iter().position(|e| json_subset(&matcher.to_value(), &e.to_value()))?;
                buf.remove(pos)
            }),
        };
        match buffered {
            Some(payload) => self.resolve(w.seq, payload),
            None => {
                self.waiters.insert(w.seq, w);
            }
        }
    }

    /// Applies a commit as a store does, checking that it is valid.
    fn apply(&mut self, c: Commit, script: &[Op]) -> Result<CommitOutcome, String> {
        if let Some(s) = &self.settled {
            return Err(format!("a commit after the run settled ({s:?}): {c:?}"));
        }
        if c.run_id != self.run.id || c.owner != OWNER {
            return Err(format!("a commit for the wrong run or owner: {c:?}"));
        }
        if self.run.status != RunStatus::Running {
            return Err(format!("a commit while the run is {}", self.run.status));
        }
        let mut out = CommitOutcome::default();
        for seq in &c.expire_waits {
            if self.waiters.remove(seq).is_none() {
                out.raced.push(*seq);
            }
        }
        for cp in c.checkpoints {
            if out.raced.contains(&cp.seq) {
                continue;
            }
            if cp.run_id != self.run.id {
                return Err(format!("a checkpoint of another run: {cp:?}"));
            }
            if let Some(old) = self.cps.get(&cp.seq) {
                if old.is_final() && !cp.is_final() {
                    return Err(format!(
                        "checkpoint {} went from {} back to {}: {old:?} -> {cp:?}",
                        cp.seq, old.status, cp.status
                    ));
                }
                if (old.name.as_str(), old.kind) != (cp.name.as_str(), cp.kind) {
                    return Err(format!("checkpoint {} changed what it records: {old:?} -> {cp:?}", cp.seq));
                }
            }
            self.cps.insert(cp.seq, cp);
        }
        for w in c.waits {
            if !self.cps.get(&w.seq).is_some_and(|c| c.status == CheckpointStatus::Waiting) {
                return Err(format!("a waiter without a waiting checkpoint at its seq: {w:?}"));
            }
            self.register(w);
        }
        for (k, v) in c.state {
            self.state.insert(k, v);
        }
        for child in c.children {
            let Some(link) = &child.parent else { return Err(format!("a child without a parent link: {child:?}")) };
            let spawned = self.cps.get(&link.seq).is_some_and(|c| c.kind == StepKind::Child);
            if link.run_id != self.run.id || !spawned || child.namespace != self.run.namespace {
                return Err(format!("a child that does not belong to its spawn: {child:?}"));
            }
            let i: usize = child.input.decode().map_err(|e| e.to_string())?;
            if !matches!(script.get(i), Some(Op::Child(_))) {
                return Err(format!("a child for op {i}, which spawns none: {child:?}"));
            }
            if let Some(old) = self.children.insert(child.id.clone(), child) {
                return Err(format!("child {} was created twice", old.id));
            }
        }
        if !c.signals.is_empty() {
            return Err(format!("a root run sent signals: {:?}", c.signals));
        }
        match c.end {
            None => {}
            Some(TurnEnd::Suspend { wake_at, seen_wake_gen }) => {
                if self.run.wake_gen != seen_wake_gen || !out.raced.is_empty() {
                    out.woken = true;
                } else {
                    if wake_at.is_none() && self.waiters.is_empty() {
                        return Err("a suspend without a wake time or a waiter: the run would sleep forever".into());
                    }
                    self.run.status = RunStatus::Suspended;
                    self.run.wake_at = wake_at;
                }
            }
            Some(TurnEnd::Settle { status, output, error }) => {
                self.run.status = status;
                self.run.wake_at = None;
                self.waiters.clear();
                self.settled = Some((status, output, error));
                out.settled = true;
            }
        }
        Ok(out)
    }

    /// What happens while the run is not running: one delivery, or time passes.
    fn between(&mut self, script: &[Op]) -> Result<String, String> {
        if self.run.status != RunStatus::Suspended {
            return Ok(String::new());
        }
        let deliverable = self.waiters.values().find_map(|w| match &w.kind {
            WaitKind::Signal { token } if token.starts_with("child:") => Some((w.seq, None)),
            _ => match op_of(&w.name, "w").and_then(|i| script.get(i).map(|op| (i, op))) {
                Some((i, Op::Wait { event, delivery: Delivery::Before | Delivery::Early, .. })) => {
                    Some((w.seq, Some((i, *event))))
                }
                _ => None,
            },
        });
        match deliverable {
            Some((seq, None)) => {
                let child = self
                    .children
                    .values()
                    .find(|c| c.parent.as_ref().is_some_and(|l| l.seq == seq))
                    .ok_or_else(|| format!("a child waiter at seq {seq} but no child was created"))?;
                let i: usize = child.input.decode().expect("the input is the op");
                let Some(Op::Child(end)) = script.get(i) else { unreachable!("checked at creation") };
                let (status, output, error) = match end {
                    ChildEnd::Completes => (RunStatus::Completed, Some(p(&format!("kid{i}"))), None),
                    ChildEnd::Fails => {
                        (RunStatus::Failed, None, Some(StepError::fatal(format!("kid{i} failed")).with_code("kid")))
                    }
                    ChildEnd::Cancelled => (RunStatus::Cancelled, None, None),
                    ChildEnd::Unregistered => return Err(format!("child of op {i} was started unregistered")),
                };
                let result = ChildResult { run_id: child.id.clone(), status, output, error };
                self.deliver(seq, result.encode());
                Ok(format!("child at seq {seq} ended {status}"))
            }
            Some((seq, Some((i, event)))) => {
                self.deliver(seq, World::wait_payload(i, event));
                Ok(format!("delivered to seq {seq}"))
            }
            None => {
                let Some(at) = self.run.wake_at else {
                    return Err(format!("suspended forever: no wake time, waiters {:?}", self.waiters));
                };
                self.now = self.now.max(at);
                // A delivery meant to race a deadline arrives once the deadline is due.
                for w in self.waiters.values() {
                    let i = op_of(&w.name, "w");
                    let racing =
                        matches!(i.and_then(|i| script.get(i)), Some(Op::Wait { delivery: Delivery::Race, .. }));
                    let due = w.seq.checked_sub(1).and_then(|d| self.cps.get(&d)).and_then(|d| d.wake_at);
                    if racing && due.is_some_and(|d| d <= self.now) {
                        self.race = Some(w.seq);
                    }
                }
                Ok(format!("time passes to {}", self.now))
            }
        }
    }
}

// ---- the driver: one body, turn after turn ----

/// Why a turn ended early.
#[derive(Debug)]
enum Halt {
    Crash,
    Bug(String),
}

type R<T> = Result<T, Halt>;

fn bug<T>(message: String) -> R<T> {
    Err(Halt::Bug(message))
}

/// What a call tells the body.
enum Flow {
    Next,
    /// Parked or halted: the body is pending for the rest of the turn.
    Pending,
    /// The body returns this error.
    Fail(StepError),
}

/// What a step's call ended with.
enum StepFlow {
    Ok(Payload),
    Err(StepError),
    Pending,
}

struct Sim<'a> {
    script: &'a [Op],
    crashes: &'a [Option<Crash>],
    world: World,
    turn: Turn,
    turn_no: usize,
    events: u32,
    crash: Option<Crash>,
    /// What this turn's body observed, in order.
    seen: Vec<String>,
    /// What any turn observed first, per op.
    observed: BTreeMap<String, String>,
    /// Closure executions per (seq, attempt).
    executions: BTreeMap<(u32, u32), u32>,
    /// Recorded values produced per seq.
    productions: BTreeMap<u32, u32>,
    /// The op each step seq belongs to (for its undo).
    step_ops: BTreeMap<u32, usize>,
    /// How often each interesting path was taken (for the coverage test).
    hits: BTreeMap<&'static str, usize>,
    /// Since when the body awaits outside the ctx with no ctx call in between (this turn).
    idle_from: Option<Millis>,
    /// The body awaits outside the ctx past the grace: the turn must fail with `non_ctx_await`.
    stuck: bool,
    log: String,
    /// How the replay-only turn ended.
    replayed: Option<Result<Replayed, ReplayMismatch>>,
}

impl<'a> Sim<'a> {
    fn new(script: &'a [Op], crashes: &'a [Option<Crash>]) -> Self {
        let world = World::new(script);
        let turn = Turn::new(world.run.clone(), OWNER, History::default(), config());
        Sim {
            script,
            crashes,
            world,
            turn,
            turn_no: 0,
            events: 0,
            crash: None,
            seen: Vec::new(),
            observed: BTreeMap::new(),
            executions: BTreeMap::new(),
            productions: BTreeMap::new(),
            step_ops: BTreeMap::new(),
            hits: BTreeMap::new(),
            idle_from: None,
            stuck: false,
            log: String::new(),
            replayed: None,
        }
    }

    fn now(&self) -> Millis {
        self.world.now
    }

    fn hit(&mut self, what: &'static str) {
        *self.hits.entry(what).or_default() += 1;
    }

    fn note(&mut self, line: impl AsRef<str>) {
        let _ = writeln!(self.log, "  {:>3} {}", self.events, line.as_ref());
    }

    /// One more event; crashes here if planned.
    fn point(&mut self) -> R<()> {
        self.events += 1;
        if self.crash.is_some_and(|c| c.at == self.events) {
            self.note("CRASH");
            self.hit("crash at a call");
            return Err(Halt::Crash);
        }
        Ok(())
    }

    /// Applies a commit (for the call at `seq`, or the turn's end) and acknowledges it.
    fn apply(&mut self, seq: Option<u32>, commit: Commit) -> R<bool> {
        self.events += 1;
        if let Some(c) = self.crash.filter(|c| c.at == self.events) {
            if let (true, Some(seq)) = (c.fail, seq) {
                let go = self.turn.committed(seq, Err((StoreErrorKind::Unavailable, "injected".into())));
                self.note(format!("COMMIT FAILS (seq {seq}) -> go on: {go}"));
                self.hit("a commit fails");
                return Ok(go);
            }
            self.note("CRASH before the commit is applied");
            self.hit("crash before a commit is applied");
            return Err(Halt::Crash);
        }
        let summary = format!(
            "commit: cps {:?} waits {:?} expire {:?} children {} end {:?}",
            commit.checkpoints.iter().map(|c| (c.seq, c.status.as_str())).collect::<Vec<_>>(),
            commit.waits.iter().map(|w| w.seq).collect::<Vec<_>>(),
            commit.expire_waits,
            commit.children.len(),
            commit.end
        );
        let outcome = self.world.apply(commit, self.script).map_err(Halt::Bug)?;
        self.note(format!("{summary} -> raced {:?} woken {}", outcome.raced, outcome.woken));
        if !outcome.raced.is_empty() {
            self.hit("an expire raced by a delivery");
        }
        if outcome.woken {
            self.hit("a suspend woken by a delivery");
        }
        self.events += 1;
        if self.crash.is_some_and(|c| c.at == self.events) {
            self.note("CRASH after the commit was applied");
            self.hit("crash after a commit was applied");
            return Err(Halt::Crash);
        }
        Ok(seq.is_none_or(|seq| self.turn.committed(seq, Ok(&outcome))))
    }

    fn observe(&mut self, label: String, seq: u32, value: impl std::fmt::Debug) -> R<()> {
        let value = format!("@{seq} {value:?}");
        self.note(format!("observe {label} = {value}"));
        self.seen.push(format!("{label}={value}"));
        match self.observed.get(&label) {
            Some(first) if *first != value => {
                bug(format!("{label} observed {value}, but an earlier turn observed {first}"))
            }
            Some(_) => Ok(()),
            None => {
                self.observed.insert(label, value);
                Ok(())
            }
        }
    }

    /// Runs the whole run; `Err` names the first violation.
    fn run(&mut self) -> Result<(), String> {
        for turn_no in 0..MAX_TURNS {
            if self.world.settled.is_some() {
                return Ok(());
            }
            let what = self.world.between(self.script)?;
            self.world.now += 1;
            self.world.run.status = RunStatus::Running;
            self.world.run.lease_owner = Some(OWNER.into());
            self.turn_no = turn_no;
            self.events = 0;
            self.crash = self.crashes.get(turn_no).copied().flatten();
            self.seen.clear();
            self.step_ops.clear();
            self.idle_from = None;
            self.stuck = false;
            let _ = writeln!(self.log, "turn {turn_no} at {} ({what}) crash {:?}", self.world.now, self.crash);
            let history = History::new(self.world.cps.values().cloned());
            self.turn = Turn::new(self.world.run.clone(), OWNER, history, config());
            if let Some(seq) = self.world.race.take()
                && let Some(i) = self.world.waiters.get(&seq).and_then(|w| op_of(&w.name, "w"))
            {
                let Op::Wait { event, .. } = self.script[i] else { unreachable!() };
                self.world.deliver(seq, World::wait_payload(i, event));
                self.note(format!("a delivery to seq {seq} races its deadline"));
                self.hit("a delivery races a deadline");
            }
            match self.turn_body() {
                Ok(end) => self.note(end),
                Err(Halt::Crash) => {}
                Err(Halt::Bug(m)) => return Err(m),
            }
        }
        Err(format!("the run did not settle in {MAX_TURNS} turns"))
    }

    /// (d) Replays the settled run over its final history with a replay-only turn.
    fn replay_settled(&mut self) -> Result<(), String> {
        let Some((status, output, error)) = self.world.settled.clone() else {
            return Err("the run did not settle".into());
        };
        let _ = writeln!(self.log, "replay-only turn of the settled run");
        (self.crash, self.events, self.idle_from) = (None, 0, None);
        self.seen.clear();
        self.step_ops.clear();
        let recorded = Run { status, output, error, ..self.world.run.clone() };
        let history = History::new(self.world.cps.values().cloned());
        self.turn = Turn::new(recorded, OWNER, history, TurnConfig { replay_only: true, ..config() });
        let (executions, productions) = (self.executions.clone(), self.productions.clone());
        match self.turn_body() {
            Ok(end) => self.note(end),
            Err(Halt::Crash) => return Err("a replay-only turn crashed without a planned crash".into()),
            Err(Halt::Bug(m)) => return Err(format!("replaying the settled run: {m}")),
        }
        match self.replayed.take() {
            Some(Ok(Replayed::Finished { status: s })) if s == status => {}
            other => {
                return Err(format!(
                    "the replay-only turn of the run settled {status} ended with {other:?}, not as the run did"
                ));
            }
        }
        if self.executions != executions || self.productions != productions {
            return Err("the replay-only turn ran a closure or produced a value".into());
        }
        Ok(())
    }

    fn turn_body(&mut self) -> R<String> {
        // `None`: the body is pending; otherwise what it returned.
        let mut done = None;
        for i in 0..self.script.len() {
            match self.op(i)? {
                Flow::Next if i + 1 == self.script.len() => done = Some(Ok(p(&self.seen))),
                Flow::Next => {}
                Flow::Pending => break,
                Flow::Fail(e) => {
                    done = Some(Err(e));
                    break;
                }
            }
        }
        self.point()?;
        let now = self.now();
        let end = match done {
            Some(result) => self.turn.t_body_done(result, now),
            None => match self.turn.t_pending(now) {
                Some(Ended::Idle(at)) => {
                    return bug(format!("the body is pending and on_pending says idle until {at}"));
                }
                Some(end) => end,
                None => {
                    return bug("the body is pending, nothing runs, and on_pending says keep polling".into());
                }
            },
        };
        // A replay-only turn ends replayed, its verdict checked by `replay_settled`.
        let non_ctx = matches!(&end, Ended::Settle { commit, status: RunStatus::Failed }
            if matches!(&commit.end, Some(TurnEnd::Settle { error: Some(e), .. })
                if e.code() == Some(codes::NON_CTX_AWAIT) && e.message.starts_with("run run:")))
            || (self.turn.config().replay_only && matches!(&end, Ended::Replayed(_)) && self.stuck);
        if non_ctx != self.stuck {
            return bug(format!("the body is stuck outside the ctx: {}, but the turn ends with {end:?}", self.stuck));
        }
        self.end(end)
    }

    fn end(&mut self, mut end: Ended) -> R<String> {
        loop {
            end = match end {
                Ended::Hold { until, .. } => return bug(format!("a hold until {until}, with held sleeps off")),
                Ended::Suspend { commit, wake_at } => {
                    let expected = Some(TurnEnd::Suspend { wake_at, seen_wake_gen: self.turn.run().wake_gen });
                    if commit.end != expected {
                        return bug(format!("a suspend whose commit ends otherwise: {commit:?}"));
                    }
                    self.apply(None, commit)?;
                    if self.world.run.status == RunStatus::Running {
                        return Ok("woken: a delivery arrived during the turn".into());
                    }
                    return Ok(format!("suspended until {wake_at:?}"));
                }
                Ended::Settle { commit, status } => {
                    if !matches!(&commit.end, Some(TurnEnd::Settle { status: s, .. }) if *s == status) {
                        return bug(format!("a settle whose commit ends otherwise: {commit:?}"));
                    }
                    self.apply(None, commit)?;
                    self.hit(if status == RunStatus::Completed { "settled completed" } else { "settled failed" });
                    return Ok(format!("settled {status}"));
                }
                Ended::Replayed(r) if self.turn.config().replay_only => {
                    let line = format!("replayed: {r:?}");
                    self.replayed = Some(r);
                    return Ok(line);
                }
                Ended::Replayed(r) => return bug(format!("a turn that is not replay-only ended as a replay: {r:?}")),
                Ended::Stop(reason) => {
                    self.hit(match reason {
                        TurnStop::Rerun(_) => "stop: rerun",
                        TurnStop::Abort(_) => "stop: abort",
                        _ => "stop: other",
                    });
                    return Ok(format!("stopped: {reason:?}"));
                }
                Ended::Idle(at) => return bug(format!("idle until {at} where the turn should end")),
                Ended::Compensate => {
                    self.note("compensate");
                    self.hit("compensate");
                    match self.compensate()? {
                        Some(end) => end,
                        None => {
                            self.point()?;
                            self.turn.t_compensated(self.now())
                        }
                    }
                }
            };
        }
    }

    /// Runs the undos; `Some(end)` when one parks or halts.
    fn compensate(&mut self) -> R<Option<Ended>> {
        let mut previous: Option<usize> = None;
        loop {
            self.point()?;
            let Some(u) = self.turn.next_undo() else { return Ok(None) };
            let Some(&i) = self.step_ops.get(&u.step_seq) else {
                return bug(format!("an undo for seq {}, which ran no step this turn: {u:?}", u.step_seq));
            };
            // The body is sequential: newest first is the reverse of program order.
            if previous.is_some_and(|p| p <= i) {
                return bug(format!("the undo of op {i} runs after the undo of op {previous:?}: not newest first"));
            }
            previous = Some(i);
            let Op::Step(_, Some(spec)) = self.script[i] else {
                return bug(format!("an undo for op {i}, which registered none: {u:?}"));
            };
            if u.name != protocol::undo_name(&format!("s{i}")) {
                return bug(format!("undo of op {i} named {}", u.name));
            }
            let policy = spec.retry.policy();
            let call = u.step_call(&policy);
            match self.step(u.seq, call, spec, i, true)? {
                StepFlow::Ok(v) => self.observe(format!("undo{i}"), u.seq, v)?,
                StepFlow::Err(e) => {
                    self.hit("an undo fails");
                    self.observe(format!("undo{i}"), u.seq, e)?;
                }
                StepFlow::Pending => {
                    self.point()?;
                    return match self.turn.t_pending(self.now()) {
                        Some(end) => Ok(Some(end)),
                        None => bug("an undo is pending and on_pending says keep polling".into()),
                    };
                }
            }
        }
    }

    /// Runs a step (or an undo) at `seq` as the runtime does.
    fn step(&mut self, seq: u32, call: StepCall<'_>, spec: StepSpec, i: usize, undo: bool) -> R<StepFlow> {
        self.point()?;
        let now = self.now();
        let begin = self.turn.begin_step(seq, call, now);
        self.note(format!("begin_step({seq}, {}) -> {begin:?}", call.name));
        let mut attempt = match begin {
            StepBegin::Return(v) => return Ok(StepFlow::Ok(v)),
            StepBegin::Fail { error, .. } => return Ok(StepFlow::Err(error)),
            StepBegin::Park(_) | StepBegin::Stopped => return Ok(StepFlow::Pending),
            StepBegin::Run { attempt } => attempt,
            StepBegin::Acquire(_) => return bug("a step without a gate asked for a slot".to_string()),
        };
        let expected = match self.world.cps.get(&seq) {
            None => 1,
            Some(c) if c.status == CheckpointStatus::Waiting => c.attempts + 1,
            Some(c) => return bug(format!("seq {seq} runs again though its {} checkpoint is committed", c.status)),
        };
        if attempt > 1 && expected > 1 {
            self.hit("a durable backoff resumes");
            // Its wait was short enough to be waited in memory: the turn waiting was cut off.
            if let Some(c) = self.world.cps.get(&seq)
                && c.wake_at.is_some_and(|at| {
                    at.saturating_sub(c.updated_at) <= crate::millis(config().durable_retry_threshold)
                })
            {
                self.hit("an in-memory retry resumes in a later turn");
            }
        }
        if attempt != expected {
            return bug(format!("seq {seq} runs attempt {attempt}, the committed checkpoint says {expected}"));
        }
        loop {
            // (a): nothing committed as done runs again; a committed attempt never runs again.
            if let Some(c) = self.world.cps.get(&seq)
                && (c.is_final() || c.attempts >= attempt)
            {
                return bug(format!("seq {seq} attempt {attempt} runs again after {c:?} was committed"));
            }
            *self.executions.entry((seq, attempt)).or_default() += 1;
            let result = if attempt <= spec.fails {
                let msg = format!("op {i} attempt {attempt} failed");
                Err(if spec.fatal { StepError::fatal(msg) } else { StepError::retryable(msg) })
            } else if spec.big {
                Ok(p(&"x".repeat(5_000)))
            } else if undo {
                Ok(p(&format!("undone{i}")))
            } else {
                Ok(p(&format!("out{i}")))
            };
            self.point()?;
            let now = self.now();
            let after = self.turn.finish_step(seq, attempt, result, now);
            self.note(format!("finish_step({seq}, {attempt}) -> {}", short(&after)));
            match after {
                StepAfter::Completed { output, commit } => {
                    return Ok(if self.apply(Some(seq), commit)? { StepFlow::Ok(output) } else { StepFlow::Pending });
                }
                StepAfter::RetryAt { at, attempt: next, commit, .. } => {
                    if next != attempt + 1 || at < now {
                        return bug(format!("retry of seq {seq} as attempt {next} at {at}, after attempt {attempt}"));
                    }
                    if !self.apply(Some(seq), commit)? {
                        return Ok(StepFlow::Pending);
                    }
                    if self.turn.t_pending(now).is_some() {
                        return bug(format!("the turn ends while seq {seq} waits in memory to retry"));
                    }
                    self.hit("in-memory retry");
                    self.world.now = at;
                    attempt = next;
                    self.point()?;
                }
                StepAfter::Park { at, commit, .. } => {
                    self.hit("durable backoff");
                    if !self.apply(Some(seq), commit)? {
                        return Ok(StepFlow::Pending);
                    }
                    if !self.turn.parked().any(|x| x == (seq, Some(at))) {
                        return bug(format!("seq {seq} is not parked until {at} after its backoff commit"));
                    }
                    return Ok(StepFlow::Pending);
                }
                StepAfter::Failed { error, commit, .. } => {
                    return Ok(if self.apply(Some(seq), commit)? { StepFlow::Err(error) } else { StepFlow::Pending });
                }
                StepAfter::Stopped => return Ok(StepFlow::Pending),
            }
        }
    }

    fn op(&mut self, i: usize) -> R<Flow> {
        let label = format!("op{i}");
        if !matches!(self.script[i], Op::Foreign(_)) {
            // Every other op makes a ctx call.
            self.idle_from = None;
        }
        match self.script[i].clone() {
            Op::Foreign(after) => {
                self.point()?;
                let now = self.now();
                let from = *self.idle_from.get_or_insert(now);
                let answer = self.turn.t_pending(now);
                self.note(format!("await outside the ctx ({after:?} ms) -> {answer:?}"));
                let Some(Ended::Idle(until)) = answer else {
                    return bug(format!("the body awaits outside the ctx, and on_pending says {answer:?}"));
                };
                if until != from + GRACE {
                    return bug(format!("idle since {from}, and on_pending says poll again at {until}"));
                }
                match after {
                    Some(ms) if now + ms < until => {
                        self.hit("an await outside the ctx resolves in time");
                        self.world.now = now + ms;
                        Ok(Flow::Next)
                    }
                    _ => {
                        self.hit("an await outside the ctx outlasts the grace");
                        // Nothing wakes the body before the timer the runtime arms.
                        self.world.now = until;
                        self.stuck = true;
                        Ok(Flow::Pending)
                    }
                }
            }
            Op::Step(spec, undo) => {
                let seq = self.turn.take_seq();
                self.step_ops.insert(seq, i);
                let policy = spec.retry.policy();
                let name = format!("s{i}");
                let call =
                    StepCall { name: &name, kind: StepKind::Step, policy: &policy, undo: undo.is_some(), gate: None };
                match self.step(seq, call, spec, i, false)? {
                    StepFlow::Ok(v) => self.observe(label, seq, v).map(|()| Flow::Next),
                    StepFlow::Err(e) => {
                        self.observe(label, seq, &e)?;
                        Ok(Flow::Fail(e))
                    }
                    StepFlow::Pending => Ok(Flow::Pending),
                }
            }
            Op::Record(rec) => {
                let seq = self.turn.take_seq();
                let (name, kind) = match rec {
                    Rec::Now => ("now".to_string(), StepKind::Now),
                    Rec::Random => ("random".to_string(), StepKind::Random),
                    Rec::Uuid => ("uuid".to_string(), StepKind::Uuid),
                    Rec::SideEffect => (format!("fx{i}"), StepKind::SideEffect),
                };
                self.point()?;
                let begin = self.turn.begin_record(seq, &name, kind, self.now());
                self.note(format!("begin_record({seq}, {name}) -> {begin:?}"));
                match begin {
                    RecordBegin::Return(v) => return self.observe(label, seq, v).map(|()| Flow::Next),
                    RecordBegin::Park | RecordBegin::Stopped => return Ok(Flow::Pending),
                    RecordBegin::Produce => {}
                }
                if let Some(c) = self.world.cps.get(&seq) {
                    return bug(format!("the value at seq {seq} is produced again after {c:?} was committed"));
                }
                *self.productions.entry(seq).or_default() += 1;
                let value = p(&format!("rec{i}"));
                self.point()?;
                let outcome = self.turn.finish_record(seq, &name, kind, Ok(value.clone()), self.now());
                self.note(format!(
                    "finish_record({seq}) -> {}",
                    if let RecordOutcome::Commit(_) = outcome { "Commit" } else { "-" }
                ));
                let go = match outcome {
                    RecordOutcome::Return => true,
                    RecordOutcome::Commit(c) => self.apply(Some(seq), c)?,
                    RecordOutcome::Stopped => false,
                };
                if !go {
                    return Ok(Flow::Pending);
                }
                self.observe(label, seq, value).map(|()| Flow::Next)
            }
            Op::Sleep(ms) => {
                let seq = self.turn.take_seq();
                self.point()?;
                let now = self.now();
                let answer = self.turn.sleep(seq, now + ms, now);
                self.note(format!("sleep({seq}, {}) -> {answer:?}", now + ms));
                match answer {
                    SleepBegin::Done => self.observe(label, seq, "slept").map(|()| Flow::Next),
                    SleepBegin::Park(_) | SleepBegin::Stopped => Ok(Flow::Pending),
                }
            }
            Op::Wait { event, deadline, .. } => {
                let deadline =
                    deadline.map(|ms| Deadline { seq: self.turn.take_seq(), after: Duration::from_millis(ms) });
                let seq = self.turn.take_seq();
                let name = format!("w{i}");
                let call = WaitCall {
                    named: ("signal token", &name),
                    name: &name,
                    kind: if event { StepKind::Event } else { StepKind::Signal },
                    wait: if event {
                        WaitKind::Event { name: name.clone(), matcher: p(&serde_json::json!({"op": i})) }
                    } else {
                        WaitKind::Signal { token: name.clone() }
                    },
                    deadline,
                };
                self.point()?;
                let answer = self.turn.wait(seq, call, self.now());
                self.note(format!("wait({seq}, {name}) -> {}", short_wait(&answer)));
                match answer {
                    WaitBegin::Delivered(v) => self.observe(label, seq, v).map(|()| Flow::Next),
                    WaitBegin::TimedOut => {
                        self.hit("a timeout replayed");
                        self.observe(label, seq, "timed out").map(|()| Flow::Next)
                    }
                    WaitBegin::Expire(c) => {
                        self.hit("a wait expires");
                        if !self.apply(Some(seq), c)? {
                            return Ok(Flow::Pending);
                        }
                        self.observe(label, seq, "timed out").map(|()| Flow::Next)
                    }
                    WaitBegin::Park(_) | WaitBegin::Stopped => Ok(Flow::Pending),
                }
            }
            Op::Child(end) => {
                let seq = self.turn.take_seq();
                self.point()?;
                let now = self.now();
                let call = ChildCall {
                    workflow: "kid",
                    id: protocol::child_id(&self.world.run.id, seq),
                    version: if end == ChildEnd::Unregistered { None } else { Some(1) },
                    input: Ok(p(&i)),
                    admission: Ok(None),
                };
                self.turn.spawn_child(seq, call, now);
                let answer = self.turn.join_child(seq, "kid", now);
                self.note(format!("child({seq}) -> {answer:?}"));
                match answer {
                    ChildJoin::Completed(v) => self.observe(label, seq, v).map(|()| Flow::Next),
                    ChildJoin::Failed { status, error } => {
                        self.observe(label, seq, (status, error)).map(|()| Flow::Next)
                    }
                    ChildJoin::Park | ChildJoin::Stopped => Ok(Flow::Pending),
                }
            }
            Op::Patch => {
                self.point()?;
                let seq = self.turn.next_seq();
                let patched = self.turn.patched(&format!("p{i}"), self.now());
                self.observe(label, seq, patched).map(|()| Flow::Next)
            }
            Op::State => {
                let seq = self.turn.take_seq();
                self.point()?;
                let answer = self.turn.set_state(seq, &format!("k{i}"), Ok(p(&i)), self.now());
                self.note(format!(
                    "set_state({seq}) -> {}",
                    if let StateBegin::Commit(_) = answer { "Commit".into() } else { format!("{answer:?}") }
                ));
                let go = match answer {
                    StateBegin::Done => true,
                    StateBegin::Commit(c) => self.apply(Some(seq), c)?,
                    StateBegin::Park | StateBegin::Stopped => false,
                };
                if !go {
                    return Ok(Flow::Pending);
                }
                self.observe(label, seq, "set").map(|()| Flow::Next)
            }
        }
    }
}

fn short(after: &StepAfter) -> String {
    match after {
        StepAfter::Completed { output, .. } => format!("Completed({output})"),
        StepAfter::RetryAt { at, attempt, .. } => format!("RetryAt({at}, attempt {attempt})"),
        StepAfter::Park { at, .. } => format!("Park({at})"),
        StepAfter::Failed { error, attempts, .. } => format!("Failed({error}, {attempts} attempts)"),
        StepAfter::Stopped => "Stopped".into(),
    }
}

fn short_wait(answer: &WaitBegin) -> String {
    match answer {
        WaitBegin::Expire(_) => "Expire".into(),
        other => format!("{other:?}"),
    }
}

/// Everything two runs of the same script must agree on.
#[derive(Debug, PartialEq)]
struct Ending {
    settled: Option<(RunStatus, Option<Payload>, Option<StepError>)>,
    observed: BTreeMap<String, String>,
    checkpoints: BTreeMap<u32, CpShape>,
    children: Vec<RunId>,
    state: BTreeMap<String, Payload>,
}

/// How one run of a script went.
struct Outcome {
    ending: Ending,
    /// Closure executions per (seq, attempt).
    executions: BTreeMap<(u32, u32), u32>,
    /// Recorded values produced per seq.
    productions: BTreeMap<u32, u32>,
    log: String,
}

/// Runs `script` with `crashes` until it settles.
fn run_script(script: &[Op], crashes: &[Option<Crash>]) -> Result<Outcome, String> {
    let mut sim = Sim::new(script, crashes);
    let result = sim.run().and_then(|()| sim.replay_settled());
    let explain = |m: String, sim: &Sim<'_>| {
        format!("{m}\n\nscript:\n{}\ncrashes: {crashes:?}\n\nlog:\n{}", describe(script), sim.log)
    };
    if let Err(m) = result {
        return Err(explain(m, &sim));
    }
    let ending = Ending {
        settled: sim.world.settled.clone(),
        observed: sim.observed.clone(),
        checkpoints: sim.world.cps.iter().map(|(s, c)| (*s, shape(c))).collect(),
        children: sim.world.children.keys().cloned().collect(),
        state: sim.world.state.clone(),
    };
    match &ending.settled {
        None => return Err(explain("the run ended without settling".into(), &sim)),
        // The code never changes between turns: a run fails only with an error of its own.
        Some((RunStatus::Failed, _, Some(e)))
            if e.message.starts_with("op ")
                || e.code() == Some(codes::PAYLOAD_TOO_LARGE)
                || e.code() == Some(codes::NON_CTX_AWAIT) => {}
        Some((RunStatus::Completed, Some(_), None)) => {}
        Some(other) => return Err(explain(format!("the run settled with {other:?}, not an end of its own"), &sim)),
    }
    // Everything the body saw is recorded as done.
    for (label, value) in &ending.observed {
        let seq: u32 = value[1..].split(' ').next().and_then(|s| s.parse().ok()).expect("@seq value");
        let cp = sim.world.cps.get(&seq);
        if !cp.is_some_and(Checkpoint::is_final) {
            return Err(explain(
                format!("{label} was observed at seq {seq}, which has no final checkpoint: {cp:?}"),
                &sim,
            ));
        }
        // A child that did not complete is recorded as a failed call (an operator's retry re-runs it).
        let child = op_of(label, "op").and_then(|i| match script[i] {
            Op::Child(ChildEnd::Fails) => Some(RunStatus::Failed),
            Op::Child(ChildEnd::Unregistered) => Some(RunStatus::Failed),
            Op::Child(ChildEnd::Cancelled) => Some(RunStatus::Cancelled),
            _ => None,
        });
        if let Some(status) = child {
            let code = protocol::child_failure_code(status);
            if !cp.is_some_and(|c| {
                c.status == CheckpointStatus::Failed && c.error.as_ref().and_then(StepError::code) == Some(&code)
            }) {
                return Err(explain(
                    format!("{label}: the {status} child is not recorded as failed with {code}: {cp:?}"),
                    &sim,
                ));
            }
        }
    }
    Ok(Outcome { ending, executions: sim.executions, productions: sim.productions, log: sim.log })
}

/// What differs between two endings, field by field and key by key.
fn differences(clean: &Ending, crashed: &Ending) -> String {
    fn maps<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
        out: &mut String,
        what: &str,
        a: &BTreeMap<K, V>,
        b: &BTreeMap<K, V>,
    ) {
        for k in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
            if a.get(k) != b.get(k) {
                let _ = writeln!(
                    out,
                    "  {what} {k:?}:\n    without crashes {:?}\n    with crashes    {:?}",
                    a.get(k),
                    b.get(k)
                );
            }
        }
    }
    let mut out = String::new();
    if clean.settled != crashed.settled {
        let _ = writeln!(
            out,
            "  settled:\n    without crashes {:?}\n    with crashes    {:?}",
            clean.settled, crashed.settled
        );
    }
    maps(&mut out, "observed", &clean.observed, &crashed.observed);
    maps(&mut out, "checkpoint", &clean.checkpoints, &crashed.checkpoints);
    maps(&mut out, "state", &clean.state, &crashed.state);
    if clean.children != crashed.children {
        let _ = writeln!(
            out,
            "  children:\n    without crashes {:?}\n    with crashes    {:?}",
            clean.children, crashed.children
        );
    }
    out
}

fn describe(script: &[Op]) -> String {
    script.iter().enumerate().map(|(i, op)| format!("  op{i}: {op:?}\n")).collect()
}

/// Checks one script against one crash plan.
fn check(script: &[Op], crashes: &[Option<Crash>]) -> Result<(), String> {
    let Outcome { ending: clean, executions, productions, .. } = run_script(script, &[])?;
    if let Some(((seq, attempt), n)) = executions.iter().find(|(_, n)| **n != 1) {
        return Err(format!(
            "without crashes, seq {seq} attempt {attempt} ran {n} times\n\nscript:\n{}",
            describe(script)
        ));
    }
    if let Some((seq, n)) = productions.iter().find(|(_, n)| **n != 1) {
        return Err(format!(
            "without crashes, the value at seq {seq} was produced {n} times\n\nscript:\n{}",
            describe(script)
        ));
    }
    let crashed = run_script(script, crashes)?;
    if crashed.ending != clean {
        return Err(format!(
            "with crashes the run ended differently:\n{}\nscript:\n{}\ncrashes: {crashes:?}\n\nlog with crashes:\n{}",
            differences(&clean, &crashed.ending),
            describe(script),
            crashed.log
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(10_000) })]

    #[test]
    fn random_scripts_survive_crashes(script in prop::collection::vec(op(), 1..16), crashes in crashes()) {
        if let Err(m) = check(&script, &crashes) {
            return Err(TestCaseError::fail(m));
        }
    }
}

/// The generators reach every path the property is meant to exercise (a fixed sample, so a
/// change to the generators that starves a path fails here rather than going unnoticed).
#[test]
fn random_scripts_reach_every_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let mut runner =
        TestRunner::new_with_rng(ProptestConfig::default(), TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (prop::collection::vec(op(), 1..16), crashes());
    let mut hits: BTreeMap<&'static str, usize> = BTreeMap::new();
    for _ in 0..2_000 {
        let (script, crashes) = strategy.new_tree(&mut runner).expect("a case").current();
        let mut sim = Sim::new(&script, &crashes);
        sim.run().expect("the run settles");
        for (what, n) in sim.hits {
            *hits.entry(what).or_default() += n;
        }
    }
    for what in [
        "crash at a call",
        "crash before a commit is applied",
        "crash after a commit was applied",
        "a commit fails",
        "stop: abort",
        "in-memory retry",
        "durable backoff",
        "a durable backoff resumes",
        "an in-memory retry resumes in a later turn",
        "a wait expires",
        "a timeout replayed",
        "a delivery races a deadline",
        "an expire raced by a delivery",
        "stop: rerun",
        "a suspend woken by a delivery",
        "compensate",
        "an undo fails",
        "settled completed",
        "settled failed",
        "an await outside the ctx resolves in time",
        "an await outside the ctx outlasts the grace",
    ] {
        let n = hits.get(what).copied().unwrap_or(0);
        assert!(n >= 10, "{what}: reached {n} times in 2,000 scripts: {hits:#?}");
    }
}
