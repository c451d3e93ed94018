//! # durable
//!
//! Durable execution for Rust, as a library. Write a workflow as a plain `async fn`; every
//! step's result is checkpointed in a store, so a run survives `kill -9`, deploys and
//! restarts and resumes exactly where it stopped. Runs sleep for months, retry with durable
//! backoff, hand steps to workers in other processes ([`WorkflowCtx::remote_step`] and
//! [`Worker`]), and detect code changes that would corrupt them. No server to run: the default
//! store is one embedded SQLite file.
//!
//! ```no_run
//! use std::time::Duration;
//! use durable::{Backoff, Engine, SqliteStore, StartOptions, WorkflowCtx, WorkflowError};
//!
//! async fn order(ctx: WorkflowCtx, order_id: u64) -> Result<String, WorkflowError> {
//!     let stock: u32 = ctx.step("reserve", |_| async { Ok(2) }).await?;
//!     let paid: String = ctx
//!         .step("charge", |s| async move { Ok(format!("charged, key {}", s.step_id())) })
//!         .retry(3, Backoff::exponential(Duration::from_millis(100), Duration::from_secs(5)))
//!         .await?;
//!     ctx.sleep(Duration::from_secs(3600)).await; // durable: survives restarts
//!     let label = format!("order {order_id}: {stock} items, {paid}");
//!     Ok(ctx.step("ship", move |_| { let label = label.clone(); async move { Ok(label) } }).await?)
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::builder().store(SqliteStore::open("app.db")?).build()?;
//! engine.register("order", 1, order);
//! let run = engine.start("order", &42u64, StartOptions::id("order:42")).await?;
//! let receipt: String = engine.wait_for_run(&run.id).await?.output()?;
//! # Ok(()) }
//! ```
//!
//! (The README's quickstart is a longer version of this: `examples/quickstart.rs`, with a
//! retried payment and the events it prints.)
//!
//! Crates behind this facade: `durable-core` (the pure replay state machine and the
//! [`store::Store`] trait), `durable-runtime` (the engine), `durable-store-memory`,
//! `durable-store-sqlite` (feature `sqlite`, on by default), `durable-store-postgres`
//! (feature `postgres`: `PostgresStore`, many engines sharing one PostgreSQL database) and
//! `durable-conformance` (feature `testing`: the workflow test harness, as `durable::testing`;
//! feature `conformance`: the store conformance suite, as `durable::conformance`). The example
//! `postgres_worker` is a worker process of a deployment on PostgreSQL; `remote_pipeline` runs
//! a workflow whose `resize` and `upload` steps execute on a [`Worker`] in a child process;
//! `flow_control` runs a per-customer singleton workflow whose API calls go through a
//! rate-limited step queue ([`WorkflowOptions::singleton`], [`Engine::register_queue`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// docs.rs builds with every feature and `--cfg docsrs`: feature-gated items say which feature
// they need.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Remote steps' tasks and workers as stored: for tools that read them (the CLI) and for
/// store implementations.
pub use durable_core::task;
pub use durable_core::{
    Backoff, Cadence, Checkpoint, CheckpointStatus, ExportError, Gather, HistoryExport, InvalidId, LATEST_START,
    Millis, Overlap, Payload, ReplayMismatch, Replayed, RetryDecision, RetryPolicy, Run, RunEnd, RunFilter, RunId,
    RunPage, RunStatus, Schedule, ScheduleError, ScheduleRecord, ScheduleState, StepError, StepKind, codes,
    millis_after, millis_before,
};
pub use durable_runtime::{
    All, BoxFuture, BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Cancel, ChildFailed, ChildHandle,
    ChildOptions, Clock, Delivery, Engine, EngineBuilder, EngineConfig, EngineEvent, Error, EventForwarding,
    EventTrigger, Metrics, Publication, PublishOptions, QueueHealth, QueueOptions, RemoteStep, ReplayError, Result,
    RunOutcome, SignalError, StartOptions, Started, Step, StepContext, StepFailed, StepOptions, SystemClock,
    TaskContext, TaskError, TokioClock, UpdateOutcome, VirtualClock, Worker, WorkerBuilder, WorkerHealth, WorkerReport,
    WorkflowCtx, WorkflowError, WorkflowOptions, shutdown_signal, uuid,
};
pub use durable_store_memory::MemoryStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use durable_store_postgres::{
    Error as PostgresError, PostgresControlPlane, PostgresOptions, PostgresStats, PostgresStore, RunNotifications,
};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use durable_store_sqlite::{Durability, Error as SqliteError, SqliteOptions, SqliteStats, SqliteStore};
pub use durable_transport::{
    ControlMessage, ControlPlane, ControlWakeups, InProcessControlPlane, InProcessTransport, QueueTransport, Transport,
};

/// The NATS transport (feature `nats`): [`NatsTransport`](nats::NatsTransport) puts the run
/// queue on a JetStream stream, [`NatsControlPlane`](nats::NatsControlPlane) carries events,
/// cancels and nudges on core NATS subjects.
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats {
    pub use durable_transport_nats::{NatsControlPlane, NatsTransport, StreamOptions};
}

/// The Redis transport (feature `redis`): [`RedisTransport`](redis::RedisTransport) puts the
/// run queue on Redis Streams with a consumer group,
/// [`RedisControlPlane`](redis::RedisControlPlane) carries events, cancels and nudges on
/// pub/sub.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use durable_transport_redis::{RedisControlPlane, RedisTransport};
}

/// The API for implementing a transport: the run queue and the control plane between engine
/// instances.
pub mod transport {
    pub use durable_transport::{
        Consumer, ControlError, ControlMessage, ControlPlane, ControlSink, ControlSinks, Handled, QueueReason,
        QueuedRun, RunHandler, RunQueue, Transport, TransportError, WakeupFuture, Wakeups,
    };
}

/// The API for implementing a store: the trait, its contract types and its error.
pub mod store {
    pub use durable_core::{
        BufferAppend, BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Capabilities, Claim,
        ClaimOutcome, Commit, CommitOutcome, CreateRun, Dedupe, Delivery, DueQuery, Gathered, NewRun, OutgoingSignal,
        ParentLink, Publish, Published, RunCount, RunPatch, RunQuery, SaveOutcome, SaveSchedule, Store, StoreError,
        StoreErrorKind, StoreExt, StoreResult, TaskFilter, TriggerBuffer, TurnEnd, WaitKind, Waiter,
    };
}

/// Flow control as stored: admission gates, their limits, held slots and queued requests
/// (what [`Engine::admission_stats`] and [`Engine::run_admission`] return), and the pure
/// admission controller the stores share.
pub use durable_core::admission;

/// W3C trace contexts as runs store them ([`Run::trace_context`]): parse, validate, format.
pub use durable_core::trace;

/// OpenTelemetry traces (feature `otel`): every run is one trace — its `run` span, the `turn`
/// spans of every engine that executes it, the `step` spans inside them, the `task` spans of
/// the workers that run its remote steps, and its children's spans share one trace id.
///
/// Install a [`tracing_opentelemetry`] layer over your OpenTelemetry tracer (from
/// `opentelemetry_sdk` 0.33 with the exporter of your choice: OTLP, stdout, in-memory), and
/// durable's spans are exported:
///
/// ```ignore
/// use durable::otel::{opentelemetry::trace::TracerProvider as _, tracing_opentelemetry};
/// use tracing_subscriber::prelude::*;
///
/// let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
///     .with_batch_exporter(my_exporter)
///     .build();
/// tracing_subscriber::registry()
///     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("my-service")))
///     .init();
/// ```
///
/// A run started inside a span joins that span's trace (its `run` span is the span's child);
/// [`StartOptions::trace_context`] names a trace explicitly (a `traceparent` received from
/// elsewhere). The example `otel_traces` runs a workflow and prints the spans it exported.
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel {
    pub use opentelemetry;
    pub use tracing_opentelemetry;
}

/// The metrics the engine and workers record through the `metrics` facade: every name as a
/// constant, the table of their types, labels and meanings, histogram buckets that fit them,
/// and [`PrometheusRecorder`]. Install a recorder (that one, or any `metrics` exporter) before
/// building the engine; without one nothing is recorded.
pub use durable_runtime::metrics as metrics_names;

/// A `metrics` recorder rendering Prometheus text (`durable serve`'s `/metrics`, or your own
/// endpoint): [`PrometheusRecorder::install`] it before building the engine, serve
/// [`PrometheusRecorder::render`].
pub use durable_runtime::metrics::PrometheusRecorder;

/// Every persisted string format and id scheme (child ids, successor and retry ids, tokens,
/// checkpoint names of deadlines and undos, the continued-run marker), formatted and parsed in
/// one place. Tools that read stored runs should use it instead of parsing by hand.
pub use durable_core::protocol;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing {
    //! Testing your workflows (feature `testing`): an engine on a virtual clock, steps that fail on
    //! purpose, and a store that fails on purpose.
    //!
    //! Turn it on for your tests only:
    //!
    //! ```toml
    //! [dev-dependencies]
    //! durable = { version = "0.1", features = ["testing"] }
    //! ```
    //!
    //! - [`TestEngine`]: an [`Engine`](crate::Engine) on a [`VirtualClock`](crate::VirtualClock)
    //!   and, by default, a fresh [`MemoryStore`](crate::MemoryStore). It derefs to the engine
    //!   (`register`, `start`, `signal`, …); [`TestEngine::advance`] moves time forward, so a run
    //!   that sleeps for a month completes at once; [`TestEngine::restart`] and
    //!   [`TestEngine::crash`] play a process restart and a `kill -9` on the same store; assertions
    //!   on a run's status, output, steps and attempts.
    //! - [`FailFirst`] (a step helper failing its first `n` calls) and [`Counter`] (how many times a
    //!   step ran).
    //! - [`FaultyStore`]: wraps any store and fails the calls a [`Fault`] selects, or delays them.
    //! - [`sim`]: seeded simulation of whole engines running your workflows, with store faults,
    //!   crashes and restarts chosen from a seed, checked against a fault-free run
    //!   ([`sim::Simulation`]).
    //! - [`replay`]: [`assert_replayable`] replays a recorded history (a
    //!   [`HistoryExport`](crate::HistoryExport) of a real run, from `durable runs export` or
    //!   [`Engine::export_history`](crate::Engine::export_history)) against your current workflow
    //!   code without executing anything, and fails naming the seq and both calls when the code
    //!   would break the run; [`assert_replayable_dir`] checks every export of a directory.
    //!
    //! These are re-exported from `durable-conformance`, which also holds the conformance suite for
    //! your own stores (feature `conformance`: `durable::conformance`).
    //!
    //! ```
    //! use std::time::Duration;
    //! use durable::testing::TestEngine;
    //! use durable::{RunStatus, StartOptions, WorkflowCtx, WorkflowError};
    //!
    //! async fn reminder(ctx: WorkflowCtx, who: String) -> Result<String, WorkflowError> {
    //!     ctx.sleep(Duration::from_secs(24 * 3600)).await; // a day, durably
    //!     ctx.step("send", |_| async { Ok(()) }).await?;
    //!     Ok(format!("reminded {who}"))
    //! }
    //!
    //! # #[tokio::main(flavor = "current_thread")]
    //! # async fn main() {
    //! let t = TestEngine::new(); // memory store, virtual clock
    //! t.register("reminder", 1, reminder);
    //! let run = t.start("reminder", "ada", StartOptions::id("remind-ada")).await.unwrap();
    //! // Asleep: the run is suspended until the virtual clock passes the day.
    //! let parked = t.wait_until_suspended_or_terminal(&run.id).await.unwrap();
    //! assert_eq!(parked.status(), RunStatus::Suspended);
    //! t.advance(Duration::from_secs(24 * 3600));
    //! t.assert_status(&run.id, RunStatus::Completed).await;
    //! t.assert_output(&run.id, "reminded ada".to_string()).await;
    //! t.assert_step_names(&run.id, &["send"]).await;
    //! # }
    //! ```

    pub use durable_conformance::replay::{self, assert_replayable, assert_replayable_dir, check_replayable};
    pub use durable_conformance::{
        Call, Counter, FailFirst, Fault, FaultyStore, Method, TestEngine, next_event, sim, test_config,
    };
}

/// The store conformance suite (feature `conformance`): certify your own
/// [`Store`](crate::store::Store). The whole `durable-conformance` crate, workflow test harness
/// included (that is also `durable::testing`, feature `testing`).
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub use durable_conformance as conformance;
