//! # durable-runtime
//!
//! The tokio side of `durable`: the [`Engine`] that starts, executes and observes runs, the
//! [`WorkflowCtx`] workflow bodies use, the turn executor, the dispatcher, timers and pollers.
//! It drives the pure state machine of `durable-core` and applies its commits to whatever
//! [`Store`](durable_core::Store) it is given; it never names a concrete store.
//!
//! A run executes in **turns**: the body is polled from the top, every recorded ctx call
//! replays its result, new calls execute and are committed before the body sees their
//! results; when every branch is parked (a sleep, a durable retry backoff, a wait) the turn
//! ends with one commit and the body is dropped. A wake (a timer, a delivery) starts the
//! next turn, on this engine or any other sharing the store.
//!
//! A remote step ([`WorkflowCtx::remote_step`]) is executed by a [`Worker`] instead, in any
//! process that opens the store: the turn's commit writes the task with the step's checkpoint
//! and wait, the worker claims it with a lease, heartbeats and reports the result, which wakes
//! the run. [`Engine::worker_health`] and [`Engine::redispatch_pending`] operate them.
//!
//! ```no_run
//! use std::time::Duration;
//! use durable_runtime::{Engine, StartOptions, WorkflowCtx, WorkflowError};
//! # use durable_store_memory::MemoryStore;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::builder().store(MemoryStore::new()).build()?;
//! engine.register("reminder", 1, |ctx: WorkflowCtx, days: u64| async move {
//!     ctx.sleep(Duration::from_secs(days * 86_400)).await;
//!     ctx.step("send", |s| async move { Ok(format!("sent {}", s.step_id())) }).await.map_err(WorkflowError::from)
//! });
//! let run = engine.start("reminder", &30u64, StartOptions::id("remind:1")).await?;
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! `turn` executes one turn of one run — the [`WorkflowCtx`] and the driver that polls the
//! body — and sees the rest of the engine only through a narrow environment (clock, commit,
//! events, newest versions). `sched` holds the engine's state and everything that moves runs
//! (dispatch slots, timers and pollers, the turn executor, the run queue, waiters, the control
//! plane) and is that environment. `engine` is the [`Engine`] handle, grouped by audience
//! (runs, operate, messages, replay, worker). Dependencies point one way only: `engine` →
//! `sched` → `turn` (and `engine` → `turn`), all of them → the leaves `clock`, `config`,
//! `error`, `events`, `metrics` and `registry` (which may use `turn`); nothing but the
//! re-exports below names `engine`. [`metrics`] is public: the names of the metrics the engine
//! and workers record through the `metrics` facade.
//!
//! # Tasks this crate spawns
//!
//! - The dispatcher loop, the timer loop, the poller (pending, due and orphaned runs, and
//!   after each orphan scan the runs past their execution timeout), the scheduler and the
//!   remote-step loop (expired attempts, `blocked` runs), on an engine that executes runs; the
//!   outbox flush loop, with a transport; on every engine, the control plane's two
//!   publishers (forwarded events in batches; coalesced "work was queued" nudges), and, for a
//!   plane that does not subscribe at once, the task that subscribes. They end when the engine
//!   shuts down or its last clone is dropped.
//! - One task per run the dispatcher gives a slot: it runs the run's turns until the run is
//!   quiet, and ends early at shutdown. (The lease keeper is no task of its own: it races the
//!   turn inside this task. Runs from the transport's consumer execute in the consumer's task,
//!   which the transport spawns.)
//! - A store-error retry timer per run whose turn hit a store error: it dispatches the run
//!   again after the backoff.
//! - A lease re-check per run whose wake found another engine holding the lease (one per run
//!   at a time): it wakes the run once the lease is free.
//!
//! The last two hold the engine weakly and end on their own. A [`Worker`] runs its claim loop
//! on the task that awaits [`Worker::run`] and spawns one task per claimed task (at most its
//! concurrency at once) for the handler; they end with the drain. (What the control plane
//! hears is handed to the engine, or to the worker's claim loop, on the plane's own listener
//! task.)
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod config;
mod engine;
mod error;
mod events;
mod flow;
pub mod metrics;
mod registry;
mod remote;
mod sched;
mod trace;
mod trigger;
mod turn;

pub use clock::{BoxFuture, Clock, SystemClock, TokioClock, VirtualClock};
pub use config::EngineConfig;
pub use durable_core::{
    Backoff, Cadence, HistoryExport, Overlap, ReplayMismatch, Replayed, RetryPolicy, RunEnd, RunFilter, RunId, RunPage,
    RunStatus, Schedule, ScheduleError, ScheduleRecord, ScheduleState, StepError,
};
pub use durable_core::{BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Delivery};
pub use engine::{
    Engine, EngineBuilder, Metrics, Publication, QueueHealth, RunOutcome, StartOptions, Started, WorkerHealth,
    WorkflowOptions, shutdown_signal,
};
pub use error::{Error, ReplayError, Result, StepFailed, WorkflowError};
pub use events::{EngineEvent, EventForwarding};
pub use flow::QueueOptions;
pub use remote::{TaskContext, Worker, WorkerBuilder, WorkerReport};
pub use sched::Cancel;
pub use trigger::{EventTrigger, PublishOptions};
pub use turn::{
    All, ChildFailed, ChildHandle, ChildOptions, RemoteStep, SignalError, Step, StepContext, StepOptions, TaskError,
    UpdateOutcome, WorkflowCtx,
};
pub use uuid;
