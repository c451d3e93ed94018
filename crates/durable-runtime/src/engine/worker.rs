//! Running the engine as a worker: registering workflows, listening for dead runs, and
//! stopping in order (drain, shutdown).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use durable_core::{Gather, Run};

use crate::trigger::EventTrigger;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Engine;
use crate::error::WorkflowError;
use crate::flow::ConcurrencyKey;
use crate::turn::WorkflowCtx;

/// Per-workflow options for [`Engine::register_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkflowOptions {
    /// Runs older than this (since they were created) are cancelled with code
    /// `execution_timeout` by the engine's timeout poller.
    pub execution_timeout: Option<Duration>,
    /// Events that start runs of the workflow ([`WorkflowOptions::on_event`]).
    pub triggers: Vec<EventTrigger>,
    /// The concurrency key ([`WorkflowOptions::concurrency`]).
    pub(crate) concurrency: Option<ConcurrencyKey>,
    /// [`WorkflowOptions::max_queue_depth`].
    pub(crate) max_queue_depth: Option<u32>,
}

impl WorkflowOptions {
    /// Options with an execution timeout.
    pub fn execution_timeout(timeout: Duration) -> Self {
        WorkflowOptions { execution_timeout: Some(timeout), ..Self::default() }
    }

    /// Starts a run of the workflow for each published event named `event` whose payload
    /// contains `matcher` (a JSON subset, as `ctx.wait_for_event` matches; `json!({})` takes
    /// every event, also one whose payload is not an object), with the payload as input. Chain [`WorkflowOptions::debounce`] or
    /// [`WorkflowOptions::batch`] to gather events first; call `on_event` again for another
    /// event.
    ///
    /// The run's id is `evt:<workflow>:<UUID>`. A publish with a dedupe id
    /// ([`PublishOptions::dedupe`](crate::PublishOptions::dedupe)) starts it once: the same
    /// event published again within the dedupe window starts nothing.
    pub fn on_event(mut self, event: impl Into<String>, matcher: serde_json::Value) -> Self {
        self.triggers.push(EventTrigger { event: event.into(), matcher, gather: None, key_field: None });
        self
    }

    /// The last `on_event` starts one run with the last payload once no matching event came
    /// for `quiet` (per key: [`WorkflowOptions::key_by`]).
    pub fn debounce(mut self, quiet: Duration) -> Self {
        if let Some(t) = self.triggers.last_mut() {
            t.gather = Some(Gather::Debounce { quiet_ms: durable_core::millis(quiet) });
        }
        self
    }

    /// The last `on_event` starts one run per up to `max_items` payloads (the input is the
    /// JSON array of them, oldest first: the workflow takes a `Vec`), when full or `max_wait`
    /// after the first (per key: [`WorkflowOptions::key_by`]).
    pub fn batch(mut self, max_items: u32, max_wait: Duration) -> Self {
        if let Some(t) = self.triggers.last_mut() {
            t.gather = Some(Gather::Batch { max_items, max_wait_ms: durable_core::millis(max_wait) });
        }
        self
    }

    /// At most `limit` runs with the same key — `key(&input)` — are running or suspended at
    /// once, across every process sharing the store. A run over the limit is created
    /// `pending` and waits (shown by `durable runs show`) until a run holding the key
    /// settles, which hands its slot to the next waiter at once (higher start priority first,
    /// then the oldest).
    ///
    /// ```
    /// # use durable_runtime::WorkflowOptions;
    /// #[derive(serde::Deserialize)]
    /// struct Sync { customer: String }
    /// // One sync per customer at a time, at most 10 more queued per customer.
    /// let options = WorkflowOptions::default()
    ///     .concurrency(|s: &Sync| s.customer.clone(), 1)
    ///     .max_queue_depth(10);
    /// # let _ = options;
    /// ```
    ///
    /// # Panics
    /// With a `limit` of 0 (no run could ever start).
    pub fn concurrency<I: DeserializeOwned + 'static>(
        mut self,
        key: impl Fn(&I) -> String + Send + Sync + 'static,
        limit: u32,
    ) -> Self {
        assert!(limit > 0, "WorkflowOptions::concurrency: a limit of 0 would never start a run; use at least 1");
        self.concurrency = Some(ConcurrencyKey::new(key, limit));
        self
    }

    /// A singleton per key: [`WorkflowOptions::concurrency`] with a limit of 1.
    pub fn singleton<I: DeserializeOwned + 'static>(self, key: impl Fn(&I) -> String + Send + Sync + 'static) -> Self {
        self.concurrency(key, 1)
    }

    /// With a concurrency key: a start when `limit + depth` runs with its key are pending,
    /// running or suspended is refused with [`Error::QueueFull`](crate::Error::QueueFull)
    /// (code `queue_full`) and persists nothing. `max_queue_depth(0)` refuses every start
    /// over the limit. Default: no bound.
    ///
    /// The bound refuses the caller of [`Engine::start`](crate::Engine::start),
    /// [`Engine::start_many`](crate::Engine::start_many) and
    /// [`Engine::signal_with_start`](crate::Engine::signal_with_start). Runs the engine
    /// creates itself — children, a run continued as new, runs started by an event or a
    /// schedule — have no caller to refuse: they take the key too, and wait for it however
    /// many wait.
    pub fn max_queue_depth(mut self, depth: u32) -> Self {
        self.max_queue_depth = Some(depth);
        self
    }

    /// The last `on_event` debounces or batches per value of this top-level payload field
    /// (events without it share one key).
    pub fn key_by(mut self, field: impl Into<String>) -> Self {
        if let Some(t) = self.triggers.last_mut() {
            t.key_field = Some(field.into());
        }
        self
    }
}

impl Engine {
    /// Registers (or replaces) version `version` of workflow `name`. New runs start on the
    /// newest registered version; a run always resumes on the version it started on. Replacing
    /// a version's body logs a warning: the runs already started on it replay on the new body,
    /// so a changed body belongs in a new version.
    ///
    /// # Panics
    /// On a name no store could keep and index for its runs' listings — empty, with a control
    /// character, or longer than [`MAX_NAME_BYTES`](durable_core::protocol::MAX_NAME_BYTES)
    /// — a bug to fix at boot, like [`Engine::register_with`]'s triggers.
    pub fn register<F, Fut, I, O>(&self, name: &str, version: u32, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
    {
        check_workflow_name(name, version);
        self.inner.shared.registry.register(name, version, f);
        // Runs of this workflow may be waiting in the store: look now, not at the next tick.
        self.inner.shared.poll_now();
    }

    /// [`Engine::register`] with per-workflow options: an execution timeout, events that
    /// start runs ([`WorkflowOptions::on_event`]).
    ///
    /// # Panics
    /// On a trigger that can never work — an empty event name, a batch of 0 items, a
    /// debounce of 0 ms, a batch feeding a workflow with a concurrency key — naming the
    /// workflow and the event: registration happens once at boot, and such a trigger is a bug
    /// to fix, not a condition to handle.
    pub fn register_with<F, Fut, I, O>(&self, name: &str, version: u32, options: WorkflowOptions, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, WorkflowError>> + Send + 'static,
        I: serde::de::DeserializeOwned + Send + 'static,
        O: serde::Serialize + Send + 'static,
    {
        check_workflow_name(name, version);
        for trigger in &options.triggers {
            if let Err(reason) = trigger.check(name) {
                panic!("register_with: {reason}");
            }
            // A full batch starts its run inside the publish, in the store, where a key (a
            // function of the whole batch) cannot be computed: the run would pass its key.
            if options.concurrency.is_some() && matches!(trigger.gather, Some(Gather::Batch { .. })) {
                panic!(
                    "register_with: workflow {name:?} has a concurrency key and a batch trigger on event {:?}; \
                     a full batch's run is started inside the publish, where its key cannot be computed. \
                     Use a debounce, or limit the work with a step queue (Engine::register_queue)",
                    trigger.event
                );
            }
        }
        let hooks = &self.shared().hooks;
        hooks.set_timeout(name, options.execution_timeout);
        hooks.set_triggers(name, options.triggers);
        let key = options.concurrency.map(|mut k| {
            k.max_queue_depth = options.max_queue_depth;
            k
        });
        self.shared().flow.set_key(name, key);
        self.register(name, version, f);
        self.shared().poke_scheduler();
    }

    /// Calls `listener` with the run each time recovery gives up on a run on this engine (it
    /// becomes `dead`). Listeners run inline, before the run's `RunSettled` event and before
    /// `wait_for_run` on this engine returns it: keep them short.
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
        let tasks: Vec<_> = self.inner.tasks.lock().drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        // A loop may be inside a poll on another thread (a store call that never yields, on
        // the memory store): once this returns, no background loop of the engine writes.
        for task in tasks {
            let _ = task.await;
        }
        shared.until_idle().await;
        shared.release_interrupted().await;
        // The last turns' events, for the other engines.
        shared.flush_events().await;
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

/// Panics on a workflow name no store could keep and index for its runs' listings (see
/// [`Engine::register`]).
fn check_workflow_name(name: &str, version: u32) {
    assert!(!name.is_empty(), "register: a workflow's name must be non-empty (version {version})");
    if let Some(problem) = durable_core::protocol::storage_problem(name) {
        panic!(
            "register: workflow {} (version {version}): {problem}; name workflows without control characters, in \
             at most {} bytes",
            durable_core::protocol::shown(name),
            durable_core::protocol::MAX_NAME_BYTES
        );
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
