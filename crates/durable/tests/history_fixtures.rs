//! Histories that must keep replaying: one recorded history per primitive, stored as JSON in
//! `tests/fixtures/histories/<primitive>.json`, replayed by the engine's current code to the
//! same outcome. A history written by one version must replay in every later one, so a failure
//! here means stored runs of users would break — fix the engine, never the fixture.
//!
//! # Fixture format (`"format": 1`)
//!
//! ```text
//! {
//!   "format": 1, "primitive": "sleep", "recorded_by": "<durable version>",
//!   "workflow": "sleep", "version": 1, "run_id": "sleep",
//!   "suspended": { "clock_ms": .., "runs": [ <recorded run>, .. ] },   // optional
//!   "actions": [ { "action": "advance", "ms": .. }, .. ],             // optional
//!   "settled":   { "clock_ms": .., "runs": [ <recorded run>, .. ] },
//!   "outcome":   { "status": "completed", "output": .., "error_code": .. }
//! }
//! <recorded run> = { "run": <durable_core::Run>, "checkpoints": [<Checkpoint>..],
//!                    "waiters": [<Waiter>..], "state": { key: value } }
//! ```
//!
//! A snapshot holds every run of the scenario (the main run first, then its children or
//! continue-as-new successors) as the store held them at `clock_ms` on the virtual clock.
//! `settled` is the end of the recording; `suspended`, when present, is the point where every
//! run was parked, and `actions` (advance the clock, signal, publish an event, send an update,
//! complete a task, cancel with compensation) are what moved it from there to `settled`.
//!
//! # What each replay test checks
//!
//! Each fixture is replayed on a fresh `MemoryStore` and on a fresh SQLite file
//! (`replay::memory::<name>`, `replay::sqlite::<name>`), written through the `Store` trait.
//!
//! 1. **Full replay.** The `settled` runs are written into a fresh store as `pending` runs
//!    carrying their whole recorded history (and query state); an engine whose clock is at the
//!    recording's end runs them again from seq 0. A cancel is re-issued (it lives in the
//!    run row, not in the history). Every run must end with the recorded status, output and
//!    error code and the recorded `(seq, name, kind, status)` history, recorded outputs must be
//!    unchanged, and no closure of the workflow (steps, undos, side effects, task dispatch)
//!    may run: everything is replayed.
//! 2. **Resume** (fixtures with `suspended`). The parked runs are written back as they were
//!    (status, `wake_at`, waiters, state), the recorded actions are applied to an engine whose
//!    clock is at the suspension, and the runs must end exactly as `settled`; only calls that
//!    had no final record at the suspension may execute.
//! 3. **Exports.** The same scenarios also left `tests/fixtures/exports/` (see "Exported
//!    histories" at the end of this file): every run exported as a `HistoryExport`, parked and
//!    settled, replayed with `assert_replayable` (nothing executes; no store is involved).
//!
//! The workflows below are the code the fixtures were recorded with; the replay registers the
//! same code (`patched_old` is the exception on purpose: it was recorded by the pre-patch body
//! and is replayed by the patched one).
//!
//! # Recording new fixtures
//!
//! ```text
//! cargo test -p durable --test history_fixtures -- --ignored record
//! ```
//!
//! writes the fixture of every scenario that has no file yet. `DURABLE_RECORD=sleep,child`
//! limits it to some scenarios; `DURABLE_RECORD_OVERWRITE=1` rewrites existing files. Do not
//! overwrite a fixture to make a failing replay pass: the old file is exactly the history an
//! older version left in users' stores. When the format of a primitive changes, add a new
//! scenario (and file) next to the old one. Times come from the virtual clock (2026-01-01), so
//! re-recording changes nothing but the values of `random_u64`, `uuid` and the side effect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use durable::store::{Claim, ClaimOutcome, Commit, NewRun, RunPatch, Store, TurnEnd, Waiter};
use durable::testing::replay::{Replayed, assert_replayable_dir, read_export};
use durable::{
    Backoff, Cancel, Checkpoint, CheckpointStatus, ChildHandle, Clock, Delivery, Engine, EngineEvent, HistoryExport,
    Millis, Payload, Run, RunId, RunStatus, StartOptions, StepContext, StepError, StepKind, StepOptions, UpdateOutcome,
    VirtualClock, WorkflowCtx, WorkflowError,
};
use durable_conformance::{TestEngine, test_config};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The fixture format this file writes. Loading must keep accepting every older one.
const FORMAT: u32 = 1;

/// How long a replay may take before the test gives up on a run (real time; a healthy replay
/// takes milliseconds).
const WAIT: Duration = Duration::from_secs(30);

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

// ---------------------------------------------------------------------------------------------
// The fixture file.

#[derive(Debug, Serialize, Deserialize)]
struct Fixture {
    format: u32,
    primitive: String,
    recorded_by: String,
    workflow: String,
    version: u32,
    run_id: RunId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    suspended: Option<Snapshot>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    actions: Vec<Action>,
    settled: Snapshot,
    outcome: Outcome,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Snapshot {
    /// The virtual clock when the snapshot was taken.
    clock_ms: Millis,
    /// The main run first, then the others of the scenario.
    runs: Vec<RecordedRun>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RecordedRun {
    run: Run,
    checkpoints: Vec<Checkpoint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "waiters_json")]
    waiters: Vec<Waiter>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    state: BTreeMap<String, Payload>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Outcome {
    status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error_code: Option<String>,
}

/// A recorded value as JSON. `Some(null)` and `None` are one value here: serde writes both as
/// `null` and reads `null` back as `None`, and the engine replays a missing output as `null`.
fn json_of(payload: Option<&Payload>) -> Option<Value> {
    payload.map(Payload::to_value).filter(|v| !v.is_null())
}

impl Outcome {
    fn of(run: &Run) -> Self {
        Outcome {
            status: run.status,
            output: json_of(run.output.as_ref()),
            error_code: run.error.as_ref().and_then(|e| e.code.clone()),
        }
    }
}

/// What moved the recorded runs from `suspended` to `settled`. Aimed at the main run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
enum Action {
    Advance { ms: u64 },
    Signal { token: String, payload: Value },
    PublishEvent { name: String, payload: Value },
    Update { name: String, arg: Value },
    CompleteTask { name: String, value: Value },
    CancelCompensate,
}

/// Waiters are written with `Waiter`'s own serde JSON, but read through a mirror: the core's
/// `WaitKind` is an internally tagged enum holding a `Payload` (a raw JSON value), which serde
/// cannot read back through a tagged enum ("invalid type: newtype struct"), so an event waiter
/// does not deserialize as `Waiter` today.
mod waiters_json {
    use durable::store::{WaitKind, Waiter};
    use durable::{Millis, Payload, RunId};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    struct WaiterJson {
        run_id: RunId,
        seq: u32,
        name: String,
        kind: KindJson,
        created_at: Millis,
    }

    #[derive(Deserialize)]
    struct KindJson {
        #[serde(rename = "type")]
        kind: String,
        token: Option<String>,
        name: Option<String>,
        matcher: Option<Payload>,
    }

    pub(super) fn serialize<S: Serializer>(waiters: &[Waiter], s: S) -> Result<S::Ok, S::Error> {
        waiters.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Waiter>, D::Error> {
        use serde::de::Error;
        let raw = Vec::<WaiterJson>::deserialize(d)?;
        raw.into_iter()
            .map(|w| {
                let kind = match (w.kind.kind.as_str(), w.kind.token, w.kind.name) {
                    ("signal", Some(token), _) => WaitKind::Signal { token },
                    ("event", _, Some(name)) => {
                        WaitKind::Event { name, matcher: w.kind.matcher.unwrap_or_else(Payload::null) }
                    }
                    (other, ..) => return Err(D::Error::custom(format!("unknown wait kind {other:?}"))),
                };
                Ok(Waiter { run_id: w.run_id, seq: w.seq, name: w.name, kind, created_at: w.created_at })
            })
            .collect()
    }
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/histories")
}

fn fixture_path(name: &str) -> PathBuf {
    fixture_dir().join(format!("{name}.json"))
}

fn read_fixture(name: &str) -> Fixture {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; record it with `cargo test -p durable --test history_fixtures -- --ignored record`",
            path.display()
        )
    });
    let fixture: Fixture =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
    assert!(fixture.format <= FORMAT, "{}: format {} is newer than this test knows", path.display(), fixture.format);
    assert_eq!(fixture.primitive, name, "{}: the file names another primitive", path.display());
    fixture
}

// ---------------------------------------------------------------------------------------------
// The workflows. Every closure that must not run on replay records its execution.

/// Which closures executed: `(run, checkpoint name)`.
#[derive(Debug, Clone, Default)]
struct Executions(Arc<Mutex<Vec<(String, String)>>>);

impl Executions {
    fn hit(&self, run: &RunId, name: &str) {
        self.0.lock().push((run.to_string(), name.to_string()));
    }

    fn take(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.0.lock())
    }

    /// A step body recorded as `name` that returns `f(attempt)`.
    fn body<T: Send + 'static>(
        &self,
        name: &str,
        f: impl Fn(u32) -> Result<T, StepError> + Send + 'static,
    ) -> impl FnMut(StepContext) -> std::future::Ready<Result<T, StepError>> + Send + 'static {
        let (ex, name) = (self.clone(), name.to_string());
        move |sc: StepContext| {
            ex.hit(sc.run_id(), &name);
            std::future::ready(f(sc.attempt()))
        }
    }

    /// An undo recorded as `undo:<name>`.
    fn undo(
        &self,
        run: &RunId,
        name: &str,
    ) -> impl Fn(String) -> std::future::Ready<Result<(), StepError>> + Send + Sync + 'static {
        let (ex, run, name) = (self.clone(), run.clone(), format!("undo:{name}"));
        move |_booking: String| {
            ex.hit(&run, &name);
            std::future::ready(Ok(()))
        }
    }
}

fn fail(message: impl Into<String>) -> StepError {
    StepError::retryable(message)
}

/// Registers every workflow of the scenarios, version 1.
fn register_all(t: &Engine, ex: &Executions) {
    let x = ex.clone();
    t.register("step_retries", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            // 200 ms is under the 1 s durable threshold: the backoff waits in memory.
            let opts = StepOptions::retries(3, Backoff::Fixed(Duration::from_millis(200)));
            let attempt: u32 = ctx
                .step_with(
                    "call",
                    opts,
                    x.body("call", |a| if a < 3 { Err(fail(format!("planned failure {a}"))) } else { Ok(a) }),
                )
                .await?;
            Ok::<_, WorkflowError>(attempt)
        }
    });

    let x = ex.clone();
    t.register("durable_backoff", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let prepared: u32 = ctx.step("prepare", x.body("prepare", |_| Ok(7))).await?;
            // An hour is over the durable threshold: the run suspends between attempts.
            let opts = StepOptions::retries(3, Backoff::Fixed(Duration::from_secs(3600)));
            let attempt: u32 = ctx
                .step_with(
                    "charge",
                    opts,
                    x.body("charge", |a| if a < 2 { Err(fail("gateway timeout")) } else { Ok(a) }),
                )
                .await?;
            Ok::<_, WorkflowError>(prepared + attempt)
        }
    });

    let x = ex.clone();
    t.register("sleep", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let before: u64 = ctx.step("before", x.body("before", |_| Ok(1))).await?;
            ctx.sleep(Duration::from_millis(30 * DAY)).await;
            let after: u64 = ctx.step("after", x.body("after", |_| Ok(2))).await?;
            Ok::<_, WorkflowError>(before + after)
        }
    });

    let x = ex.clone();
    t.register("signal_timeout", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let got: Option<String> = ctx.wait_for_signal_timeout("approval", Duration::from_millis(HOUR)).await?;
            ctx.step("after", x.body("after", |_| Ok(()))).await?;
            Ok::<_, WorkflowError>(got)
        }
    });

    let x = ex.clone();
    t.register("event", 1, move |ctx: WorkflowCtx, order_id: u64| {
        let x = x.clone();
        async move {
            let paid: Value = ctx.wait_for_event("order.paid", json!({ "order_id": order_id })).await?;
            let amount = paid["amount"].as_u64().unwrap_or(0);
            let receipt: String = ctx.step("receipt", x.body("receipt", move |_| Ok(format!("paid {amount}")))).await?;
            Ok::<_, WorkflowError>(receipt)
        }
    });

    t.register("update", 1, |ctx: WorkflowCtx, _: ()| async move {
        let qty: u32 = ctx.on_update("set_quantity").await?;
        Ok::<_, WorkflowError>(qty * 2)
    });

    let x = ex.clone();
    t.register("task", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let verdict: String = ctx.task("review", x.body("task:review", |_| Ok(()))).await?;
            Ok::<_, WorkflowError>(format!("review: {verdict}"))
        }
    });

    let x = ex.clone();
    t.register("nap", 1, move |ctx: WorkflowCtx, minutes: u64| {
        let x = x.clone();
        async move {
            ctx.sleep(Duration::from_millis(minutes * MINUTE)).await;
            let doubled: u64 = ctx.step("double", x.body("double", move |_| Ok(minutes * 2))).await?;
            Ok::<_, WorkflowError>(doubled)
        }
    });

    t.register("parent", 1, |ctx: WorkflowCtx, minutes: u64| async move {
        let doubled: u64 = ctx.child("nap", &minutes).await?;
        Ok::<_, WorkflowError>(format!("child said {doubled}"))
    });

    t.register("fan_out", 1, |ctx: WorkflowCtx, n: u64| async move {
        let handles: Vec<ChildHandle<u64>> = (1..=n).map(|m| ctx.spawn_child("nap", &m)).collect();
        let mut out = Vec::new();
        for (i, r) in ctx.all(handles.into_iter().map(ChildHandle::join)).await.into_iter().enumerate() {
            out.push(r.map_err(|e| WorkflowError::new(format!("branch {i}: {e}")))?);
        }
        Ok::<_, WorkflowError>(out)
    });

    let x = ex.clone();
    t.register("saga", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let run = ctx.run_id().clone();
            for what in ["flight", "hotel", "car"] {
                let booking = format!("{what}-booking");
                ctx.step(what, x.body(what, move |_| Ok(booking.clone()))).compensate(x.undo(&run, what)).await?;
            }
            ctx.step("pay", x.body("pay", |_| Err::<(), _>(StepError::fatal("card declined").with_code("declined"))))
                .await?;
            Ok::<_, WorkflowError>(())
        }
    });

    let x = ex.clone();
    t.register("cancel", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let run = ctx.run_id().clone();
            for what in ["flight", "hotel"] {
                let booking = format!("{what}-booking");
                ctx.step(what, x.body(what, move |_| Ok(booking.clone()))).compensate(x.undo(&run, what)).await?;
            }
            ctx.sleep(Duration::from_millis(DAY)).await;
            ctx.step("never", x.body("never", |_| Ok(()))).await?;
            Ok::<_, WorkflowError>(())
        }
    });

    let x = ex.clone();
    t.register("countdown", 1, move |ctx: WorkflowCtx, n: u32| {
        let x = x.clone();
        async move {
            let left: u32 = ctx.step("tick", x.body("tick", move |_| Ok(n))).await?;
            if left > 0 {
                return ctx.continue_as_new(&(left - 1)).await;
            }
            Ok::<_, WorkflowError>("liftoff".to_string())
        }
    });

    let x = ex.clone();
    t.register("patched", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let a: String = ctx.step("a", x.body("a", |_| Ok("a".to_string()))).await?;
            let mut out = a;
            if ctx.patched("send-receipt") {
                let r: String = ctx.step("receipt", x.body("receipt", |_| Ok("receipt".to_string()))).await?;
                out = format!("{out}+{r}");
            }
            let b: String = ctx.step("b", x.body("b", |_| Ok("b".to_string()))).await?;
            Ok::<_, WorkflowError>(format!("{out}+{b}"))
        }
    });

    let x = ex.clone();
    t.register("recorded_values", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let now = ctx.now().await;
            let random = ctx.random_u64().await;
            let uuid = ctx.uuid().await;
            let (ex, run) = (x.clone(), ctx.run_id().clone());
            let token: String = ctx
                .side_effect("token", move || {
                    ex.hit(&run, "token");
                    format!("tok-{}", durable::uuid::Uuid::new_v4().simple())
                })
                .await;
            let go: String = ctx.wait_for_signal("go").await?;
            let now_ms = now.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
            Ok::<_, WorkflowError>(json!({
                "now_ms": now_ms, "random": random, "uuid": uuid.to_string(), "token": token, "go": go,
            }))
        }
    });

    t.register("set_state", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.set_state("progress", &25u32).await;
        ctx.set_state("progress", &50u32).await;
        let _: () = ctx.wait_for_signal("go").await?;
        ctx.set_state("progress", &100u32).await;
        Ok::<_, WorkflowError>(())
    });
}

/// The body of `patched` before the patch: the code that wrote `patched_old.json`.
fn register_unpatched(t: &Engine, ex: &Executions) {
    register_all(t, ex);
    let x = ex.clone();
    t.register("patched", 1, move |ctx: WorkflowCtx, _: ()| {
        let x = x.clone();
        async move {
            let a: String = ctx.step("a", x.body("a", |_| Ok("a".to_string()))).await?;
            let b: String = ctx.step("b", x.body("b", |_| Ok("b".to_string()))).await?;
            Ok::<_, WorkflowError>(format!("{a}+{b}"))
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The scenarios: how each fixture is recorded.

struct Scenario {
    /// The fixture's name, also the main run's id.
    name: &'static str,
    workflow: &'static str,
    input: Value,
    /// The other runs of the scenario (children, successors), in creation order.
    related: Vec<&'static str>,
    /// Whether every run first parks; the actions then resume them.
    suspends: bool,
    actions: Vec<Action>,
    /// Registers the code that records the history, when it is not [`register_all`].
    record_with: fn(&Engine, &Executions),
}

fn scenario(name: &'static str, workflow: &'static str, input: Value) -> Scenario {
    Scenario {
        name,
        workflow,
        input,
        related: Vec::new(),
        suspends: false,
        actions: Vec::new(),
        record_with: register_all,
    }
}

impl Scenario {
    fn related(mut self, ids: &[&'static str]) -> Self {
        self.related = ids.to_vec();
        self
    }

    fn resumed_by(mut self, actions: Vec<Action>) -> Self {
        self.suspends = true;
        self.actions = actions;
        self
    }
}

fn scenarios() -> Vec<Scenario> {
    let signal = |token: &str, payload: Value| Action::Signal { token: token.into(), payload };
    vec![
        scenario("step_retries", "step_retries", json!(null)),
        scenario("durable_backoff", "durable_backoff", json!(null)).resumed_by(vec![Action::Advance { ms: HOUR }]),
        scenario("sleep", "sleep", json!(null)).resumed_by(vec![Action::Advance { ms: 30 * DAY }]),
        scenario("signal_delivered", "signal_timeout", json!(null))
            .resumed_by(vec![signal("approval", json!("approved"))]),
        scenario("signal_timed_out", "signal_timeout", json!(null)).resumed_by(vec![Action::Advance { ms: HOUR }]),
        scenario("event", "event", json!(42)).resumed_by(vec![Action::PublishEvent {
            name: "order.paid".into(),
            payload: json!({ "order_id": 42, "amount": 10 }),
        }]),
        scenario("update", "update", json!(null))
            .resumed_by(vec![Action::Update { name: "set_quantity".into(), arg: json!(3) }]),
        scenario("task", "task", json!(null))
            .resumed_by(vec![Action::CompleteTask { name: "review".into(), value: json!("lgtm") }]),
        scenario("child", "parent", json!(5))
            .related(&["child.child.0"])
            .resumed_by(vec![Action::Advance { ms: 5 * MINUTE }]),
        scenario("fan_out", "fan_out", json!(3))
            .related(&["fan_out.child.0", "fan_out.child.1", "fan_out.child.2"])
            .resumed_by(vec![Action::Advance { ms: 3 * MINUTE }]),
        scenario("saga", "saga", json!(null)),
        scenario("cancel_compensate", "cancel", json!(null)).resumed_by(vec![Action::CancelCompensate]),
        scenario("continue_as_new", "countdown", json!(2)).related(&["continue_as_new~1", "continue_as_new~2"]),
        scenario("patched", "patched", json!(null)),
        Scenario { record_with: register_unpatched, ..scenario("patched_old", "patched", json!(null)) },
        scenario("recorded_values", "recorded_values", json!(null)).resumed_by(vec![signal("go", json!("go"))]),
        scenario("set_state", "set_state", json!(null)).resumed_by(vec![signal("go", json!(null))]),
    ]
}

// ---------------------------------------------------------------------------------------------
// Engine-side helpers shared by recording and replay.

/// Moves the virtual clock through in-memory retry backoffs (they wait on the engine's clock),
/// driven by the engine's `StepRetrying` events. Durable backoffs are left to the actions.
fn pump_in_memory_backoffs(t: &TestEngine) -> tokio::task::JoinHandle<()> {
    let mut events = t.subscribe();
    let clock = t.clock().clone();
    let threshold = t.config().durable_retry_threshold.as_millis() as Millis;
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(EngineEvent::StepRetrying { retry_at, .. }) if retry_at <= clock.now() + threshold => {
                    clock.set(retry_at)
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

async fn apply(t: &TestEngine, run: &RunId, action: &Action) {
    match action {
        Action::Advance { ms } => t.advance(Duration::from_millis(*ms)),
        Action::Signal { token, payload } => {
            let d = t.signal(token, payload).await.unwrap();
            assert!(matches!(d, Delivery::Delivered { .. }), "signal {token:?} found no waiter: {d:?}");
        }
        Action::PublishEvent { name, payload } => {
            let d = t.publish_event(name, payload).await.unwrap();
            assert!(!d.is_empty(), "event {name:?} found no waiter");
        }
        Action::Update { name, arg } => {
            let o = t.update(run, name, arg).await.unwrap();
            assert_eq!(o, UpdateOutcome::Accepted { delivered: true }, "update {name:?}");
        }
        Action::CompleteTask { name, value } => {
            let d = t.complete_task(run, name, value).await.unwrap();
            assert!(matches!(d, Delivery::Delivered { .. }), "task {name:?} found no waiter: {d:?}");
        }
        Action::CancelCompensate => {
            t.cancel_with(run, Cancel::Compensate).await.unwrap();
        }
    }
}

async fn capture(t: &TestEngine, ids: &[RunId]) -> Snapshot {
    let mut runs = Vec::new();
    for id in ids {
        let run = t.get_run(id).await.unwrap().unwrap_or_else(|| panic!("run {id} does not exist"));
        let checkpoints = t.checkpoints(id).await;
        let waiters = t.store().waiters(id).await.unwrap();
        let mut state = BTreeMap::new();
        for cp in checkpoints.iter().filter(|c| c.kind == StepKind::State) {
            if let Some(v) = t.store().get_state(id, &cp.name).await.unwrap() {
                state.insert(cp.name.clone(), v);
            }
        }
        runs.push(RecordedRun { run, checkpoints, waiters, state });
    }
    Snapshot { clock_ms: t.clock().now(), runs }
}

async fn wait_status(t: &TestEngine, id: &RunId, terminal: bool) -> Run {
    let waited = if terminal {
        t.wait_for_run_timeout(id, WAIT).await
    } else {
        t.wait_until_suspended_or_terminal_timeout(id, WAIT).await
    };
    match waited {
        Ok(outcome) => outcome.run,
        Err(e) => {
            let run = t.get_run(id).await.ok().flatten();
            let history = t.history(id).await.unwrap_or_default();
            panic!("run {id} did not settle: {e}\nrun: {run:#?}\nhistory: {history:#?}")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Recording.

/// Runs scenario `s` on a fresh engine: its fixture, and an export of each of its runs at the
/// suspension (if any) and at the end, named `<run id>.<suspended|settled>`.
async fn record_scenario(s: &Scenario) -> (Fixture, Vec<(String, HistoryExport)>) {
    let t = TestEngine::new();
    let ex = Executions::default();
    (s.record_with)(&t, &ex);
    let pump = pump_in_memory_backoffs(&t);
    let main = RunId::from(s.name);
    let ids: Vec<RunId> = std::iter::once(main.clone()).chain(s.related.iter().map(|r| RunId::from(*r))).collect();
    t.start(s.workflow, &s.input, StartOptions::id(s.name)).await.unwrap();
    let mut exports = Vec::new();
    let suspended = if s.suspends {
        for id in &ids {
            let run = wait_status(&t, id, false).await;
            assert_eq!(run.status, RunStatus::Suspended, "{}: run {id} did not park: {:?}", s.name, run.error);
        }
        for id in &ids {
            exports.push((format!("{id}.suspended"), t.export_history(id).await.unwrap()));
        }
        Some(capture(&t, &ids).await)
    } else {
        None
    };
    for action in &s.actions {
        apply(&t, &main, action).await;
    }
    for id in &ids {
        wait_status(&t, id, true).await;
    }
    let settled = capture(&t, &ids).await;
    for id in &ids {
        exports.push((format!("{id}.settled"), t.export_history(id).await.unwrap()));
    }
    pump.abort();
    t.shutdown().await;
    let main_run = &settled.runs[0].run;
    let fixture = Fixture {
        format: FORMAT,
        primitive: s.name.to_string(),
        recorded_by: format!("durable {}", env!("CARGO_PKG_VERSION")),
        workflow: main_run.workflow.clone(),
        version: main_run.version,
        run_id: main,
        outcome: Outcome::of(main_run),
        suspended,
        actions: s.actions.clone(),
        settled,
    };
    (fixture, exports)
}

/// Writes the fixtures that do not exist yet (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "records fixtures: cargo test -p durable --test history_fixtures -- --ignored record"]
async fn record() {
    let only: Option<BTreeSet<String>> =
        std::env::var("DURABLE_RECORD").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let overwrite = std::env::var("DURABLE_RECORD_OVERWRITE").is_ok_and(|v| v == "1");
    std::fs::create_dir_all(fixture_dir()).unwrap();
    for s in scenarios() {
        if only.as_ref().is_some_and(|o| !o.contains(s.name)) {
            continue;
        }
        let path = fixture_path(s.name);
        if path.exists() && !overwrite {
            println!("kept     {}", path.display());
            continue;
        }
        let (fixture, _) = record_scenario(&s).await;
        let mut text = serde_json::to_string_pretty(&fixture).unwrap();
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        println!("recorded {}", path.display());
    }
}

// ---------------------------------------------------------------------------------------------
// Replay.

/// The loader's lease owner: it writes the runs as a turn would, then lets go.
const LOADER: &str = "fixture-loader";

/// Writes a recorded run into `store`: its row (as `as_status`), its checkpoints and query
/// state and, for a parked run, its waiters and `wake_at`.
async fn load(store: &dyn Store, rec: &RecordedRun, as_status: RunStatus, now: Millis) {
    let run = &rec.run;
    let new = NewRun::from(run);
    assert!(store.create_run(new).await.unwrap().created(), "run {} loaded twice", run.id);
    let claim = Claim { run_id: run.id.clone(), owner: LOADER.into(), lease_until: now + 60_000, now };
    let ClaimOutcome::Acquired { run: claimed, .. } = store.claim_run(claim).await.unwrap() else {
        panic!("the loader could not claim run {}", run.id)
    };
    let mut commit = Commit::new(run.id.clone(), LOADER, now);
    commit.checkpoints = rec.checkpoints.clone();
    commit.state = rec.state.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    match as_status {
        RunStatus::Pending => {
            store.commit(commit).await.unwrap();
            let patch = RunPatch { status: Some(RunStatus::Pending), release_lease: true, now, ..Default::default() };
            assert!(store.update_run_if(&run.id, &[RunStatus::Running], patch).await.unwrap());
        }
        RunStatus::Suspended => {
            commit.waits = rec.waiters.clone();
            commit.end = Some(TurnEnd::Suspend { wake_at: run.wake_at, seen_wake_gen: claimed.wake_gen });
            let outcome = store.commit(commit).await.unwrap();
            assert!(!outcome.woken, "loading run {} consumed a delivery", run.id);
        }
        status if status.is_terminal() => {
            commit.end = Some(TurnEnd::Settle { status, output: run.output.clone(), error: run.error.clone() });
            assert!(store.commit(commit).await.unwrap().settled, "run {} did not settle on load", run.id);
        }
        other => panic!("run {} was recorded {other}; fixtures hold parked or settled runs only", run.id),
    }
}

fn shape(history: &[Checkpoint]) -> Vec<(u32, String, StepKind, CheckpointStatus)> {
    history.iter().map(|c| (c.seq, c.name.clone(), c.kind, c.status)).collect()
}

/// Waits for every run of `expected` to settle and compares it with the recording.
async fn assert_settled_as(t: &TestEngine, fixture: &Fixture, loaded: &Snapshot, expected: &Snapshot, how: &str) {
    let name = &fixture.primitive;
    for rec in &expected.runs {
        let id = &rec.run.id;
        let run = wait_status(t, id, true).await;
        let history = t.checkpoints(id).await;
        let got = Outcome::of(&run);
        assert_eq!(
            got,
            Outcome::of(&rec.run),
            "{name} ({how}): run {id} ended differently from the recording (error: {:?})\nhistory: {history:#?}",
            run.error
        );
        assert_eq!(
            (&run.workflow, run.version, run.input.to_value(), &run.parent),
            (&rec.run.workflow, rec.run.version, rec.run.input.to_value(), &rec.run.parent),
            "{name} ({how}): run {id}'s row changed"
        );
        assert_eq!(shape(&history), shape(&rec.checkpoints), "{name} ({how}): run {id}'s history differs");
        // Results that were final when the run was loaded are replayed, never rewritten.
        let before = loaded.runs.iter().find(|r| r.run.id == *id);
        for old in before.iter().flat_map(|r| &r.checkpoints).filter(|c| c.is_final()) {
            let new = history.iter().find(|c| c.seq == old.seq).expect("shape compared above");
            assert_eq!(
                (json_of(new.output.as_ref()), new.attempts),
                (json_of(old.output.as_ref()), old.attempts),
                "{name} ({how}): run {id} rewrote its recorded result at seq {}",
                old.seq
            );
        }
        for (key, value) in &rec.state {
            let now: Option<Value> = t.get_state(id, key).await.unwrap();
            assert_eq!(now, Some(value.to_value()), "{name} ({how}): run {id}'s state {key:?}");
        }
        assert!(t.store().waiters(id).await.unwrap().is_empty(), "{name} ({how}): settled run {id} left waiters");
    }
    let main = t.get_run(&fixture.run_id).await.unwrap().expect("main run");
    assert_eq!(Outcome::of(&main), fixture.outcome, "{name} ({how}): the main run's outcome");
}

/// The engine that replays: the given store, the virtual clock at `clock_ms`, every workflow.
fn replay_engine(store: Arc<dyn Store>, clock_ms: Millis, ex: &Executions) -> TestEngine {
    let t = TestEngine::with_parts(store, VirtualClock::new(clock_ms), test_config());
    register_all(&t, ex);
    t
}

/// Full replay: every recorded run runs again from seq 0 over its whole history.
async fn replay_from_scratch(f: &Fixture, store: Arc<dyn Store>) {
    for rec in &f.settled.runs {
        load(&*store, rec, RunStatus::Pending, f.settled.clock_ms).await;
    }
    let ex = Executions::default();
    let t = replay_engine(store, f.settled.clock_ms, &ex);
    // A cancel lives in the run row, not in the history: issue it again.
    for action in f.actions.iter().filter(|a| matches!(a, Action::CancelCompensate)) {
        apply(&t, &f.run_id, action).await;
    }
    assert_settled_as(&t, f, &f.settled, &f.settled, "full replay").await;
    let executed = ex.take();
    assert!(executed.is_empty(), "{}: replay executed recorded calls again: {executed:?}", f.primitive);
    t.shutdown().await;
}

/// Resume: the parked runs are loaded as they were and the recorded actions resume them.
async fn replay_resume(f: &Fixture, parked: &Snapshot, store: Arc<dyn Store>) {
    for rec in &parked.runs {
        load(&*store, rec, rec.run.status, parked.clock_ms).await;
    }
    let ex = Executions::default();
    let t = replay_engine(store, parked.clock_ms, &ex);
    let pump = pump_in_memory_backoffs(&t);
    for action in &f.actions {
        apply(&t, &f.run_id, action).await;
    }
    assert_settled_as(&t, f, parked, &f.settled, "resume").await;
    pump.abort();
    // Only calls with no final record at the suspension may have run, and only ones the
    // recording ran too.
    let final_names = |snap: &Snapshot, run: &str| -> BTreeSet<String> {
        snap.runs
            .iter()
            .filter(|r| r.run.id.as_str() == run)
            .flat_map(|r| &r.checkpoints)
            .filter(|c| c.is_final())
            .map(|c| c.name.clone())
            .collect()
    };
    for (run, name) in ex.take() {
        assert!(
            !final_names(parked, &run).contains(&name),
            "{}: resuming executed {name:?} of run {run} again, although its result was recorded",
            f.primitive
        );
        assert!(
            final_names(&f.settled, &run).contains(&name),
            "{}: resuming executed {name:?} of run {run}, which the recording never finished",
            f.primitive
        );
    }
    t.shutdown().await;
}

/// A fresh store of one replay: memory, or a SQLite file of its own. (The runtime's tests share
/// a fuller fixture, `crates/durable-runtime/tests/support`; this file needs only a fresh store.)
struct StoreFixture {
    store: Arc<dyn Store>,
    /// The SQLite store's temp dir, removed (with the WAL files) when the replay ends.
    _dir: Option<tempfile::TempDir>,
}

impl StoreFixture {
    fn memory() -> Self {
        StoreFixture { store: Arc::new(durable::MemoryStore::new()), _dir: None }
    }

    fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = Arc::new(durable::SqliteStore::open(dir.path().join("durable.db")).expect("open sqlite"));
        StoreFixture { store, _dir: Some(dir) }
    }
}

/// Replays fixture `name`, each shape on a fresh store from `new_store`.
async fn replay(name: &str, new_store: fn(&str) -> StoreFixture) {
    let f = read_fixture(name);
    let s = new_store(name);
    replay_from_scratch(&f, s.store.clone()).await;
    if let Some(parked) = &f.suspended {
        let s = new_store(name);
        replay_resume(&f, parked, s.store.clone()).await;
    }
}

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {
        mod replay {
            mod memory {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        crate::replay(stringify!($name), |_| crate::StoreFixture::memory()).await
                    }
                )*
            }
            mod sqlite {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        crate::replay(stringify!($name), |_| crate::StoreFixture::sqlite()).await
                    }
                )*
            }
        }

        /// The fixtures with a replay test above.
        const TESTED: &[&str] = &[$(stringify!($name)),*];
    };
}

fixture_tests!(
    step_retries,
    durable_backoff,
    sleep,
    signal_delivered,
    signal_timed_out,
    event,
    update,
    task,
    child,
    fan_out,
    saga,
    cancel_compensate,
    continue_as_new,
    patched,
    patched_old,
    recorded_values,
    set_state,
);

/// Every scenario has a fixture on disk and a replay test, and every file on disk is replayed.
#[test]
fn every_fixture_is_replayed() {
    let tested: BTreeSet<&str> = TESTED.iter().copied().collect();
    let scenarios: BTreeSet<&str> = scenarios().iter().map(|s| s.name).collect();
    assert_eq!(tested, scenarios, "a scenario without a replay test, or a test without a scenario");
    let on_disk: BTreeSet<String> = std::fs::read_dir(fixture_dir())
        .expect("the fixture directory exists")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let stem = path.file_stem()?.to_string_lossy().into_owned();
            (path.extension()? == "json").then_some(stem)
        })
        .collect();
    let on_disk: BTreeSet<&str> = on_disk.iter().map(String::as_str).collect();
    assert_eq!(on_disk, tested, "fixture files and replay tests differ (record missing ones, see the module docs)");
}

// ---------------------------------------------------------------------------------------------
// Exported histories: `tests/fixtures/exports/<run id>.<suspended|settled>.json`, what
// `Engine::export_history` (and `durable runs export`) wrote for every run of every scenario,
// parked and settled. Each must keep loading and replaying against the workflows above with
// `assert_replayable`, executing nothing. Like the histories, they are never rewritten: a
// failure here means users' committed exports (and their replay checks in CI) would break.
// Record the missing ones with
//
//     cargo test -p durable --test history_fixtures -- --ignored write_exports

fn export_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/exports")
}

/// Writes the exports that do not exist yet (`DURABLE_RECORD` limits the scenarios).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "records exports: cargo test -p durable --test history_fixtures -- --ignored write_exports"]
async fn write_exports() {
    let only: Option<BTreeSet<String>> =
        std::env::var("DURABLE_RECORD").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    std::fs::create_dir_all(export_dir()).unwrap();
    for s in scenarios() {
        if only.as_ref().is_some_and(|o| !o.contains(s.name)) {
            continue;
        }
        let (_, exports) = record_scenario(&s).await;
        for (name, export) in exports {
            let path = export_dir().join(format!("{name}.json"));
            if path.exists() {
                println!("kept     {}", path.display());
                continue;
            }
            std::fs::write(&path, format!("{}\n", export.to_json().unwrap())).unwrap();
            println!("recorded {}", path.display());
        }
    }
}

/// The export files every scenario must have: each run at its suspension (if the scenario
/// parks) and settled.
fn expected_exports() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for s in scenarios() {
        for id in std::iter::once(s.name).chain(s.related.iter().copied()) {
            names.insert(format!("{id}.settled.json"));
            if s.suspends {
                names.insert(format!("{id}.suspended.json"));
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_export_replays_against_the_current_code_without_executing_anything() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(export_dir())
        .expect("the exports directory exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(on_disk, expected_exports(), "export files and scenarios differ (record the missing ones, see above)");

    let ex = Executions::default();
    let replayed = assert_replayable_dir(|e: &Engine| register_all(e, &ex), export_dir()).await;
    assert_eq!(replayed.len(), on_disk.len());
    for (path, verdict) in replayed {
        let export = read_export(&path).unwrap();
        assert_eq!(export.format, 1, "{}", path.display());
        // A settled run replays to its end; a parked one to the waits it is parked on.
        if export.run.status.is_terminal() {
            assert_eq!(verdict, Replayed::Finished { status: export.run.status }, "{}", path.display());
        } else {
            assert!(matches!(verdict, Replayed::Parked { .. }), "{}: {verdict:?}", path.display());
        }
        // The file is exactly what this version writes for the value it holds.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            format!("{}\n", export.to_json().unwrap()),
            text,
            "{}: written again, the bytes differ",
            path.display()
        );
    }
    let executed = ex.take();
    assert!(executed.is_empty(), "replaying the exports executed closures: {executed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_workflow_fails_the_replay_of_its_exports() {
    // `sleep` after a change: the sleep moved before the first step.
    let export = read_export(export_dir().join("sleep.settled.json")).unwrap();
    let register = |e: &Engine| {
        e.register("sleep", 1, |ctx: WorkflowCtx, _: ()| async move {
            ctx.sleep(Duration::from_millis(30 * DAY)).await;
            let before: u64 = ctx.step("before", |_| async { Ok(1) }).await?;
            let after: u64 = ctx.step("after", |_| async { Ok(2) }).await?;
            Ok::<_, WorkflowError>(before + after)
        });
    };
    let err = durable::testing::check_replayable(register, &export).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "run sleep: non-determinism at seq 0: the workflow code asked for sleep \"sleep\" but history recorded step \
         \"before\"; the body changed under a running run — register the change as a new version, or guard it with \
         ctx.patched(..); or the body is not deterministic (it decides by random numbers, the clock or a HashMap's \
         order: use ctx.random_u64(), ctx.now() and ordered maps)"
    );
}

#[test]
fn an_export_of_a_newer_format_is_refused_naming_the_file_and_the_format() {
    let text = std::fs::read_to_string(export_dir().join("sleep.settled.json")).unwrap();
    assert!(text.starts_with("{\n  \"format\": 1,\n"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("from-the-future.json");
    std::fs::write(&path, text.replacen("\"format\": 1,", "\"format\": 999,", 1)).unwrap();
    let err = read_export(&path).unwrap_err();
    assert_eq!(
        err,
        format!(
            "{}: this history export has format 999 (written by durable {v}), but durable {v} reads formats up to 1: \
             upgrade durable to load it",
            path.display(),
            v = env!("CARGO_PKG_VERSION")
        )
    );
    let err = HistoryExport::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap_err();
    assert!(matches!(err, durable::ExportError::NewerFormat { format: 999, .. }), "{err:?}");
}
