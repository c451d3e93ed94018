//! Running the engine as a worker: registering workflows, listening for dead runs, and
//! stopping in order (drain, shutdown).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use durable_core::Run;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Engine;
use crate::error::WorkflowError;
use crate::turn::WorkflowCtx;

/// Per-workflow options for [`Engine::register_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkflowOptions {
    /// Runs older than this (since they were created) are cancelled with code
    /// `execution_timeout` by the engine's timeout poller.
    pub execution_timeout: Option<Duration>,
}

impl WorkflowOptions {
    /// Options with an execution timeout.
    pub fn execution_timeout(timeout: Duration) -> Self {
        WorkflowOptions { execution_timeout: Some(timeout) }
    }
}

impl Engine {
    /// Registers (or replaces) version `version` of workflow `name`. New runs start on the
    /// newest registered version; a run always resumes on the version it started on.
    pub fn register<F, Fut, I, O>(&self, name: &str, version: u32, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
    {
        self.inner.shared.registry.register(name, version, f);
        // Runs of this workflow may be waiting in the store: look now, not at the next tick.
        self.inner.shared.poll_now();
    }

    /// [`Engine::register`] with per-workflow options (an execution timeout).
    pub fn register_with<F, Fut, I, O>(&self, name: &str, version: u32, options: WorkflowOptions, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, WorkflowError>> + Send + 'static,
        I: serde::de::DeserializeOwned + Send + 'static,
        O: serde::Serialize + Send + 'static,
    {
        self.shared().hooks.set_timeout(name, options.execution_timeout);
        self.register(name, version, f);
    }

    /// Calls `listener` with the run each time recovery gives up on a run on this engine (it
    /// becomes `dead`). Listeners run inline: keep them short.
    pub fn on_dead(&self, listener: impl Fn(&Run) + Send + Sync + 'static) {
        self.shared().hooks.add_dead_listener(Arc::new(listener));
    }

    /// Runs this engine as a worker until `shutdown` resolves (for example
    /// [`shutdown_signal`]), then drains it: stops taking work, lets executing turns finish for
    /// up to `EngineConfig::drain_timeout` and releases the rest to other workers. Returns
    /// whether every turn finished in time.
    ///
    /// ```no_run
    /// # async fn worker(engine: durable_runtime::Engine) {
    /// // register workflows, then:
    /// engine.run_worker(durable_runtime::shutdown_signal()).await;
    /// # }
    /// ```
    pub async fn run_worker(&self, shutdown: impl Future<Output = ()>) -> bool {
        self.poll_now();
        shutdown.await;
        tracing::info!("shutdown requested; draining");
        self.drain(self.config().drain_timeout).await
    }

    /// Stops at once: background tasks end, executing turns are dropped and their leases
    /// released, so another engine can continue the runs immediately. Nothing durable is lost.
    pub async fn shutdown(&self) {
        let shared = &self.inner.shared;
        shared.record_interrupted();
        shared.stop_consumer().await;
        shared.flush().await;
        shared.stop_background();
        for task in self.inner.tasks.lock().drain(..) {
            task.abort();
        }
        shared.until_idle().await;
        shared.release_interrupted().await;
    }

    /// Stops taking work, lets executing turns finish for up to `timeout`, then shuts down
    /// (what did not finish is released for other engines). Returns whether every turn
    /// finished in time.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let shared = &self.inner.shared;
        shared.start_draining();
        // Stop taking queued runs (items in hand are handed back), send what is waiting.
        shared.stop_consumer().await;
        shared.flush().await;
        let finished = tokio::time::timeout(timeout, shared.until_idle()).await.is_ok();
        self.shutdown().await;
        finished
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C): the usual shutdown request of a worker process.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    biased;
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
