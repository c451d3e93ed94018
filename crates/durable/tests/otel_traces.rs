//! Acceptance (issue 18 #1): with an in-memory OpenTelemetry exporter, a run whose turns
//! execute on two engines sharing one SQLite file, with a remote step executed by a `Worker`
//! and a child run, exports spans of exactly one trace id — the trace of the caller's span it
//! was started in. Step spans carry the run id and seq; every span names its run.
//!
//! One subscriber for the whole binary (engines spawn tasks on every runtime thread); each
//! test picks its spans by run id.
#![cfg(feature = "otel")]

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

use durable::otel::opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use durable::otel::tracing_opentelemetry::{self, OpenTelemetrySpanExt};
use durable::trace::TraceParent;
use durable::{
    Engine, EngineConfig, RunId, SqliteStore, StartOptions, StepError, Worker, WorkerReport, WorkflowCtx, WorkflowError,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio::sync::oneshot;
use tracing_subscriber::prelude::*;

/// The exporter every span of this binary goes to.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("durable-tests"));
        tracing_subscriber::registry().with(layer).init();
        exporter
    })
}

/// A span's attribute, as text.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

/// The exported spans of the runs `ids` (by their `run_id` attribute).
fn spans_of(ids: &[&RunId]) -> Vec<SpanData> {
    let ids: BTreeSet<String> = ids.iter().map(|id| id.to_string()).collect();
    let spans = exporter().get_finished_spans().expect("exported spans");
    spans.into_iter().filter(|s| attr(s, "run_id").is_some_and(|id| ids.contains(&id))).collect()
}

/// The distinct trace ids of `spans`, as hex.
fn trace_ids(spans: &[SpanData]) -> BTreeSet<String> {
    spans.iter().map(|s| s.span_context.trace_id().to_string()).collect()
}

/// The spans named `name`.
fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn engine(path: &std::path::Path, owner: &str) -> Engine {
    let mut config = EngineConfig::default();
    config.poll_interval = Duration::from_millis(20);
    let engine = Engine::builder()
        .store(SqliteStore::open(path).expect("open the SQLite file"))
        .config(config)
        .owner(owner)
        .build()
        .expect("engine");
    engine.register("order", 1, |ctx: WorkflowCtx, n: u32| async move {
        let reserved: u32 = ctx.step("reserve", move |_| async move { Ok(n) }).await?;
        // The first turn ends here (engine A); the rest runs where the signal lands (engine B).
        let go: u32 = ctx.wait_for_signal(&format!("go:{}", ctx.run_id())).await?;
        let resized: u32 = ctx.remote_step("resize", &(reserved + go)).await?;
        let label: u32 = ctx.child("label", &resized).await?;
        Ok::<_, WorkflowError>(label)
    });
    engine.register("label", 1, |ctx: WorkflowCtx, n: u32| async move {
        Ok::<_, WorkflowError>(ctx.step("print", move |_| async move { Ok(n + 1) }).await?)
    });
    engine
}

/// A worker on its own store handle (as a worker process has), serving `resize`, spawned with
/// no span around it: its spans can join the run's trace only through the task record.
fn spawn_worker(path: &std::path::Path) -> (oneshot::Sender<()>, tokio::task::JoinHandle<WorkerReport>) {
    let worker = Worker::builder()
        .store(std::sync::Arc::new(SqliteStore::open(path).expect("open the SQLite file")))
        .handle("resize", |_ctx, n: u32| async move { Ok::<_, StepError>(n * 10) })
        .poll_interval(Duration::from_millis(20))
        .build();
    let (stop, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        worker
            .run(async {
                let _ = rx.await;
            })
            .await
    });
    (stop, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_two_engines_with_a_remote_step_and_a_child_is_one_trace() {
    exporter();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("traces.db");

    // The caller's span: the run joins its trace.
    let request = tracing::info_span!("request");
    let caller_trace = request.context().span().span_context().trace_id().to_string();
    let a = engine(&path, "engine-a");
    let started = {
        let start = a.start("order", &4u32, StartOptions::id("traced-order"));
        tracing::Instrument::instrument(start, request.clone()).await.expect("start")
    };
    drop(request);
    let id = started.id.clone();
    let stored = TraceParent::parse(started.run.trace_context.as_deref().expect("a stored trace context"))
        .expect("a valid traceparent");
    assert_eq!(stored.trace_id_hex(), caller_trace, "the run's trace is the caller's");

    // Engine A runs the first turn up to the signal wait, then stops.
    let suspended = a.wait_until_suspended_or_terminal(&id).await.expect("the first turn parks");
    assert_eq!(suspended.run.status, durable::RunStatus::Suspended);
    assert!(a.drain(Duration::from_secs(10)).await, "engine A drains");

    // Engine B finishes it: the signal, the remote step (on the worker), the child.
    let b = engine(&path, "engine-b");
    let (stop_worker, worker) = spawn_worker(&path);
    b.signal(&format!("go:{id}"), &1u32).await.expect("signal");
    let done = b.wait_for_run(&id).await.expect("the run settles");
    assert_eq!(done.output::<u32>().expect("output"), 51);
    assert!(b.drain(Duration::from_secs(10)).await, "engine B drains");
    let _ = stop_worker.send(());
    let report = worker.await.expect("worker task");
    assert_eq!(report.completed, 1, "the worker executed the remote step");

    let child = RunId::from(format!("{id}.child.3").as_str());
    let child_run = b.get_run(&child).await.expect("read").expect("the child exists");
    assert_eq!(child_run.trace_context, started.run.trace_context, "the child inherits its parent's trace context");

    let spans = spans_of(&[&id, &child]);
    assert_eq!(trace_ids(&spans), BTreeSet::from([caller_trace]), "one trace: {spans:#?}");

    // Turns on both engines, parented on the run's span.
    let turns = named(&spans, "turn");
    let engines: BTreeSet<String> = turns.iter().filter_map(|s| attr(s, "engine")).collect();
    assert_eq!(engines, BTreeSet::from(["engine-a".to_string(), "engine-b".to_string()]), "{turns:#?}");
    assert!(turns.iter().any(|s| attr(s, "outcome").as_deref() == Some("suspended")));
    assert!(turns.iter().any(|s| attr(s, "outcome").as_deref() == Some("completed")));

    // Step spans carry the run id, seq, kind, attempt and outcome.
    let steps: BTreeSet<(String, String, String)> = named(&spans, "step")
        .iter()
        .map(|s| {
            assert_eq!(attr(s, "attempt").as_deref(), Some("1"));
            assert_eq!(attr(s, "outcome").as_deref(), Some("completed"));
            assert_eq!(attr(s, "kind").as_deref(), Some("step"));
            (attr(s, "run_id").expect("run_id"), attr(s, "seq").expect("seq"), attr(s, "name").expect("name"))
        })
        .collect();
    let expected = BTreeSet::from([
        (id.to_string(), "0".to_string(), "reserve".to_string()),
        (child.to_string(), "0".to_string(), "print".to_string()),
    ]);
    assert_eq!(steps, expected);

    // The worker's span for the remote step's attempt.
    let tasks = named(&spans, "task");
    assert_eq!(tasks.len(), 1, "{tasks:#?}");
    let task = tasks[0];
    assert_eq!(attr(task, "seq").as_deref(), Some("2"));
    assert_eq!(attr(task, "attempt").as_deref(), Some("1"));
    assert_eq!(attr(task, "step_id"), Some(format!("{id}:2")));
    assert_eq!(attr(task, "outcome").as_deref(), Some("completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_outside_any_span_gets_a_fresh_trace_of_its_own() {
    exporter();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("fresh.db");
    let e = engine(&path, "engine-solo");
    e.register("solo", 1, |ctx: WorkflowCtx, _: ()| async move {
        Ok::<_, WorkflowError>(ctx.step("one", |_| async { Ok(1u32) }).await?)
    });
    let first = e.start("solo", &(), StartOptions::id("solo-1")).await.expect("start");
    let second = e.start("solo", &(), StartOptions::id("solo-2")).await.expect("start");
    e.wait_for_run(&first.id).await.expect("settles");
    e.wait_for_run(&second.id).await.expect("settles");
    assert!(e.drain(Duration::from_secs(10)).await);
    let one = trace_ids(&spans_of(&[&first.id]));
    let two = trace_ids(&spans_of(&[&second.id]));
    assert_eq!((one.len(), two.len()), (1, 1), "each run is one trace");
    assert_ne!(one, two, "two runs are two traces");
    let stored = TraceParent::parse(first.run.trace_context.as_deref().expect("stored")).expect("valid");
    assert_eq!(one, BTreeSet::from([stored.trace_id_hex()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_traceparent_is_joined_and_a_bad_one_is_refused() {
    exporter();
    let dir = tempfile::tempdir().expect("temp dir");
    let e = engine(&dir.path().join("given.db"), "engine-given");
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let run = e.start("order", &1u32, StartOptions::id("given").trace_context(given)).await.expect("start");
    assert_eq!(run.run.trace_context.as_deref(), Some(given));
    let err = e
        .start("order", &1u32, StartOptions::id("bad").trace_context("00-not-a-trace-01"))
        .await
        .expect_err("a bad traceparent is refused");
    assert!(matches!(err, durable::Error::InvalidTraceContext(_)), "{err:?}");
    assert!(err.to_string().contains("invalid traceparent \"00-not-a-trace-01\""), "{err}");
    assert!(e.get_run(&RunId::from("bad")).await.expect("read").is_none(), "nothing was stored");
    e.wait_until_suspended_or_terminal(&run.id).await.expect("parks");
    assert!(e.drain(Duration::from_secs(10)).await);
    let spans = spans_of(&[&run.id]);
    assert_eq!(trace_ids(&spans), BTreeSet::from(["0af7651916cd43dd8448eb211c80319c".to_string()]));
    let turn = named(&spans, "turn")[0];
    assert_eq!(turn.parent_span_id.to_string(), "b7ad6b7169203331", "the turn is a child of the given span");
}
