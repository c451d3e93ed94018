//! # durable-runtime
//!
//! The tokio side of `durable`: the [`Engine`] that starts, executes and observes runs, the
//! [`WorkflowCtx`] workflow bodies use, the turn executor, the dispatcher, timers and pollers.
//! It drives the pure state machine of `durable-core` and applies its commits to whatever
//! [`Store`](durable_core::Store) it is given; it never names a concrete store. It is the only
//! crate of `durable` that spawns tasks.
//!
//! A run executes in **turns**: the body is polled from the top, every recorded ctx call
//! replays its result, new calls execute and are committed before the body sees their
//! results; when every branch is parked (a sleep, a durable retry backoff, a wait) the turn
//! ends with one commit and the body is dropped. A wake (a timer, a delivery) starts the
//! next turn, on this engine or any other sharing the store.
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
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod config;
mod engine;
mod error;
mod events;
mod registry;
mod sched;
mod turn;

pub use clock::{BoxFuture, Clock, SystemClock, VirtualClock};
pub use config::EngineConfig;
pub use durable_core::Delivery;
pub use durable_core::{Backoff, RetryPolicy, RunFilter, RunId, RunPage, RunStatus, StepError};
pub use engine::{Engine, EngineBuilder, Metrics, RunOutcome, StartOptions, Started, WorkflowOptions, shutdown_signal};
pub use error::{Error, Result, StepFailed, WorkflowError};
pub use events::EngineEvent;
pub use sched::Cancel;
pub use turn::{
    All, ChildFailed, ChildHandle, ChildOptions, SignalError, Step, StepContext, StepOptions, TaskError, UpdateOutcome,
    WorkflowCtx,
};
pub use uuid;
