//! # durable-transport
//!
//! Transports move work between engine instances. This crate defines the run-queue half: an
//! engine sends the runs it wants executed (starts and wakes) in batches with
//! [`Transport::dispatch_runs`], and every instance takes its share with
//! [`Transport::consume_runs`]. A queued item is only a nudge — the run's durable state in the
//! store decides what happens (a consumer acts on the run as it finds it), so a lost or
//! duplicated item never loses or repeats work; the engine's pollers remain the safety net.
//!
//! Two transports:
//! - [`InProcessTransport`]: a channel inside one process (tests, single-process apps).
//! - [`QueueTransport`]: a queue table in the store itself ([`RunQueue`], implemented by the
//!   memory, SQLite and PostgreSQL stores), claimed with a lease so a consumer that dies
//!   leaves its items to others. Several processes sharing one SQLite file share its queue; several machines
//!   sharing one PostgreSQL database share its queue, woken within milliseconds by
//!   `LISTEN/NOTIFY` through a [`Wakeups`] source ([`QueueTransport::with_wakeups`]).
//!
//! The control plane ([`ControlPlane`], defined in `durable-core` and re-exported here) carries
//! small best-effort messages between instances: engine events, cancels, and "work was queued"
//! nudges. [`InProcessControlPlane`] is the one inside a process (the engine's default);
//! [`ControlWakeups`] turns a plane's run-queue nudges into [`Wakeups`] for a
//! [`QueueTransport`]. PostgreSQL's plane lives in its store crate, brokers' in theirs.
//!
//! It does not depend on any store crate: [`RunQueue`] is defined in `durable-core`, next to
//! the `Store` trait, and re-exported here.
//!
//! ```
//! use std::sync::Arc;
//! use durable_store_memory::MemoryStore;
//! use durable_transport::QueueTransport;
//!
//! let store = Arc::new(MemoryStore::new());
//! let transport = QueueTransport::new(store.clone());
//! # let _ = transport;
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod control;
mod in_process;
mod queue;
mod wakeups;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
pub use control::{ControlWakeups, InProcessControlPlane};
pub use durable_core::{
    ControlError, ControlMessage, ControlPlane, ControlSink, ControlSinks, QueueReason, QueuedRun, RunQueue,
};
pub use in_process::InProcessTransport;
pub use queue::QueueTransport;
use tokio::sync::watch;
use tokio::task::JoinHandle;
pub use wakeups::{WakeupFuture, Wakeups};

/// What went wrong sending runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The queue's backend failed.
    #[error("run queue unavailable: {0}")]
    Unavailable(String),
    /// The transport was closed.
    #[error("the transport is closed")]
    Closed,
}

/// What a consumer did with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Done with it (executed, or nothing to do): remove it from the queue.
    Done,
    /// Not taken (the engine is draining): put it back for another consumer.
    HandBack,
}

/// Executes queued runs; implemented by the engine.
#[async_trait]
pub trait RunHandler: Send + Sync + 'static {
    /// Acts on the run as the store has it now (start it, resume it, or skip a settled one).
    async fn handle(&self, item: QueuedRun) -> Handled;
}

/// A running consumer; [`Consumer::stop`] ends it.
#[derive(Debug)]
pub struct Consumer {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Consumer {
    /// A consumer whose loop is `task`, stopped through `stop`.
    pub fn new(stop: watch::Sender<bool>, task: JoinHandle<()>) -> Self {
        Consumer { stop, task: Some(task) }
    }

    /// Stops taking items. Items already in hand finish on their own (their handler decides to
    /// ack or hand them back); the engine's drain bounds how long that may take.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// The run queue between engine instances.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// Sends a batch of runs of one namespace (`None`: the senders did not know it) to be
    /// executed by whichever instance consumes them.
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError>;

    /// Starts handing queued runs of `namespace` (`None`: every namespace) to `handler`, at
    /// most `concurrency` at once, until the returned consumer is stopped. Must be called
    /// inside a tokio runtime.
    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer;

    /// Whether an item sent without a namespace still reaches the consumers of its run's
    /// namespace (a store-backed queue fills it in from the run; the in-process queue hands such
    /// items to every consumer). When `false` (the default: a broker routes by namespace), the
    /// engine looks up the namespaces it does not know before it sends.
    fn routes_without_namespace(&self) -> bool {
        false
    }

    /// Whether the queue keeps at most one item per run: an item sent for a run that already
    /// waits in the queue merges into the waiting one (the store-backed queue does). When
    /// `false` (the default: a broker keeps every message), each duplicate item is delivered
    /// and costs a turn, so the engine's due poller leaves a run it finds due to the wake
    /// already sent for it for [`EngineConfig::poll_grace`] before it sends another (the
    /// pending poller leaves a pending run to its start item for that long on any queue).
    ///
    /// [`EngineConfig::poll_grace`]: https://docs.rs/durable-runtime/latest/durable_runtime/struct.EngineConfig.html#structfield.poll_grace
    fn merges_runs(&self) -> bool {
        false
    }
}

#[async_trait]
impl<T: Transport + ?Sized> Transport for Arc<T> {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        (**self).dispatch_runs(namespace, batch).await
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        (**self).consume_runs(namespace, concurrency, handler)
    }

    fn routes_without_namespace(&self) -> bool {
        (**self).routes_without_namespace()
    }

    fn merges_runs(&self) -> bool {
        (**self).merges_runs()
    }
}
