//! Many engines, one store: the batched run queue (outbox, flusher, consumer), lost-wake
//! re-checks, execution timeouts and the worker entry point.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use durable_core::{QueueReason, QueuedRun, Run, RunFilter, RunId, RunStatus, StepError, codes};
use durable_transport::{Handled, RunHandler};

use crate::compose::Cancel;
use crate::engine::Shared;
use crate::events::EngineEvent;
use crate::{Engine, WorkflowCtx, WorkflowError};

/// Runs waiting to be sent to the transport: at most one item per run (a wake replaces a
/// start), in arrival order.
#[derive(Default)]
pub(crate) struct Outbox {
    items: Vec<QueuedRun>,
    index: HashMap<RunId, usize>,
}

impl Outbox {
    /// Adds an item; returns how many are waiting.
    fn add(&mut self, item: QueuedRun) -> usize {
        match self.index.get(&item.run_id) {
            Some(&i) => {
                let queued = &mut self.items[i];
                if item.reason == QueueReason::Wake {
                    queued.reason = QueueReason::Wake;
                    queued.dedupe_key = item.dedupe_key;
                }
                queued.priority = queued.priority.max(item.priority);
                if queued.namespace.is_none() {
                    queued.namespace = item.namespace;
                }
            }
            None => {
                self.index.insert(item.run_id.clone(), self.items.len());
                self.items.push(item);
            }
        }
        self.items.len()
    }

    fn take(&mut self) -> Vec<QueuedRun> {
        self.index.clear();
        std::mem::take(&mut self.items)
    }
}

/// Counts queue failures between the (at most once a minute) reports.
#[derive(Default)]
pub(crate) struct QueueFailures {
    since_report: u64,
    last_report: Option<Instant>,
    /// The last send failed: the pollers execute what they find here instead of queueing it.
    down: bool,
}

impl Shared {
    /// Asks for `id` to be executed because something new arrived for it.
    pub(crate) fn wake(&self, id: RunId) {
        self.enqueue(id, QueueReason::Wake, None, 0, None);
    }

    /// Asks for a new run to be started (`token` tells this pending state from earlier ones).
    pub(crate) fn queue_start(&self, id: RunId, namespace: &str, priority: i32, token: u64) {
        if self.transport.is_none() && !self.serves(namespace) {
            return; // the pollers of its own pool start it
        }
        self.enqueue(id, QueueReason::Start, Some(namespace.to_string()), priority, Some(token));
    }

    /// Whether this engine executes runs of `namespace`.
    pub(crate) fn serves(&self, namespace: &str) -> bool {
        self.config.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }

    /// Asks for a run a poller found (pending, due or orphaned) to be executed: through the
    /// queue, so every instance takes a share — or here while the queue is failing.
    pub(crate) fn queue_found(&self, id: RunId, reason: QueueReason) {
        if self.queue_failures.lock().down {
            return self.dispatch_as(id, reason == QueueReason::Wake);
        }
        self.enqueue(id, reason, self.config.namespace.clone(), 0, None);
    }

    /// Without a transport the run is dispatched here; with one it goes into the outbox,
    /// which is sent in batches.
    fn enqueue(
        &self,
        run_id: RunId,
        reason: QueueReason,
        namespace: Option<String>,
        priority: i32,
        token: Option<u64>,
    ) {
        if self.transport.is_none() {
            return match reason {
                QueueReason::Wake => self.dispatch_wake(run_id),
                QueueReason::Start => self.dispatch(run_id),
            };
        }
        if self.is_stopping() {
            return; // persisted: the pollers of this or another engine find it
        }
        let n = token.unwrap_or_else(|| self.metrics.enqueued.fetch_add(1, Ordering::Relaxed));
        let dedupe_key = format!("{reason}:{run_id}:{n}");
        let item = QueuedRun { id: 0, run_id, reason, namespace, priority, dedupe_key };
        if self.outbox.lock().add(item) >= self.config.dispatch_batch {
            self.outbox_full.notify_one();
        }
    }

    /// Sends the outbox every tick, or at once when a batch is full.
    pub(crate) async fn flush_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.dispatch_tick) => {}
                () = self.outbox_full.notified() => {}
            }
            self.flush().await;
        }
    }

    /// Sends everything in the outbox, grouped by namespace, in batches.
    pub(crate) async fn flush(&self) {
        let Some(transport) = &self.transport else { return };
        let items = self.outbox.lock().take();
        if items.is_empty() {
            return;
        }
        let mut groups: BTreeMap<Option<String>, Vec<QueuedRun>> = BTreeMap::new();
        for item in items {
            groups.entry(item.namespace.clone()).or_default().push(item);
        }
        for (namespace, group) in groups {
            for chunk in group.chunks(self.config.dispatch_batch.max(1)) {
                match transport.dispatch_runs(namespace.as_deref(), chunk.to_vec()).await {
                    Ok(()) => {
                        self.queue_failures.lock().down = false;
                        self.metrics.batches.fetch_add(1, Ordering::Relaxed);
                        self.metrics.queued_runs.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => self.queue_failed(chunk, &e),
                }
            }
        }
    }

    /// The queue refused a batch: report at most once a minute; starts stay `pending` for the
    /// pollers, wakes are executed here.
    fn queue_failed(&self, items: &[QueuedRun], e: &durable_transport::TransportError) {
        let report = {
            let mut f = self.queue_failures.lock();
            f.down = true;
            f.since_report += items.len() as u64;
            if f.last_report.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                f.last_report = Some(Instant::now());
                Some(std::mem::take(&mut f.since_report))
            } else {
                None
            }
        };
        if let Some(failures) = report {
            tracing::warn!(
                error = %e,
                failures,
                "the run queue is failing: {failures} runs could not be queued since the last report; \
                 starts stay pending for the pollers, wakes run on this engine"
            );
            self.emit(EngineEvent::QueueUnavailable { failures, error: e.to_string() });
        }
        for item in items {
            if item.reason == QueueReason::Wake {
                self.dispatch_wake(item.run_id.clone());
            }
        }
    }

    /// Executes a run handed over by the transport, in one of this engine's execution slots.
    async fn run_queued(self: &Arc<Self>, id: RunId, wake: bool) -> Handled {
        if self.is_stopping() || self.draining.load(Ordering::Relaxed) {
            return Handled::HandBack;
        }
        let Ok(_slot) = self.slots.clone().acquire_owned().await else { return Handled::HandBack };
        if !self.begin_local(&id, wake) {
            return Handled::Done; // already executing here: it runs again when done
        }
        self.run_in_slot(crate::engine::TaskGuard::new(self, id)).await;
        // A turn cut off by a shutdown goes back to the queue for another engine.
        if self.is_stopping() { Handled::HandBack } else { Handled::Done }
    }

    /// A wake found the run's lease held by another engine: look again (every
    /// `recheck_interval`, at most `recheck_attempts` times) and execute it once the lease is
    /// free and the run has something new to see, so a wake racing another engine's turn is
    /// never lost. One re-check per run at a time.
    pub(crate) fn recheck_later(self: &Arc<Self>, run: &Run) {
        if !self.rechecks.lock().insert(run.id.clone()) {
            return;
        }
        let holder = run.lease_owner.clone().unwrap_or_default();
        self.emit(EngineEvent::WakeDeferred { run_id: run.id.clone(), holder });
        let weak = Arc::downgrade(self);
        let id = run.id.clone();
        let mut lease_until = run.lease_until;
        tokio::spawn(async move {
            let Some(attempts) = weak.upgrade().map(|s| s.config.recheck_attempts) else { return };
            for _ in 0..attempts {
                let Some(wait) = weak.upgrade().map(|s| s.recheck_wait(lease_until)) else { return };
                tokio::time::sleep(wait).await;
                let Some(shared) = weak.upgrade() else { return };
                let run = match shared.store.get_run(&id).await {
                    Ok(Some(run)) if !run.status.is_terminal() => run,
                    _ => break,
                };
                let now = shared.clock.now();
                if run.lease_owner.is_some() && run.lease_until.is_some_and(|u| u >= now) {
                    lease_until = run.lease_until;
                    continue;
                }
                let due = match run.status {
                    RunStatus::Suspended => run.wake_at.is_some_and(|w| w <= now),
                    _ => true,
                };
                if due {
                    tracing::debug!(run_id = %id, "re-check: the lease is free; waking the run");
                    shared.dispatch_wake(id.clone());
                }
                break;
            }
            if let Some(shared) = weak.upgrade() {
                shared.rechecks.lock().remove(&id);
            }
        });
    }

    fn recheck_wait(&self, lease_until: Option<u64>) -> Duration {
        let remaining = lease_until.map_or(0, |u| u.saturating_sub(self.clock.now()));
        Duration::from_millis(remaining.saturating_add(1)).min(self.config.recheck_interval)
    }

    /// Cancels active runs older than their workflow's execution timeout.
    pub(crate) async fn enforce_timeouts(self: &Arc<Self>) {
        let limits: Vec<(String, Duration)> = self.timeouts.lock().iter().map(|(k, v)| (k.clone(), *v)).collect();
        for (workflow, limit) in limits {
            let filter = RunFilter {
                workflow: Some(workflow.clone()),
                statuses: RunStatus::ACTIVE.to_vec(),
                namespace: self.config.namespace.clone(),
                created_before: Some(self.clock.now().saturating_sub(limit.as_millis() as u64)),
                limit: 200,
                ..Default::default()
            };
            let runs = match self.store.list_runs(&filter).await {
                Ok(page) => page.runs,
                Err(e) => {
                    tracing::warn!(error = %e, "could not look for runs past their execution timeout");
                    continue;
                }
            };
            for run in runs {
                let error = StepError::fatal(format!(
                    "run {} of workflow {workflow:?} exceeded its execution timeout of {limit:?}",
                    run.id
                ))
                .with_code(codes::EXECUTION_TIMEOUT);
                tracing::warn!(run_id = %run.id, "{}", error.message);
                if let Err(e) = self.cancel_run(&run.id, Cancel::Abandon, Some(error)).await {
                    tracing::warn!(run_id = %run.id, error = %e, "could not time the run out");
                }
            }
        }
    }
}

/// Hands runs from the transport to the engine.
pub(crate) struct EngineHandler(pub(crate) Weak<Shared>);

#[async_trait]
impl RunHandler for EngineHandler {
    async fn handle(&self, item: QueuedRun) -> Handled {
        match self.0.upgrade() {
            Some(shared) => shared.run_queued(item.run_id, item.reason == QueueReason::Wake).await,
            None => Handled::HandBack,
        }
    }
}

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
    /// [`Engine::register`] with per-workflow options (an execution timeout).
    pub fn register_with<F, Fut, I, O>(&self, name: &str, version: u32, options: WorkflowOptions, f: F)
    where
        F: Fn(WorkflowCtx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, WorkflowError>> + Send + 'static,
        I: serde::de::DeserializeOwned + Send + 'static,
        O: serde::Serialize + Send + 'static,
    {
        match options.execution_timeout {
            Some(limit) => self.shared().timeouts.lock().insert(name.to_string(), limit),
            None => self.shared().timeouts.lock().remove(name),
        };
        self.register(name, version, f);
    }

    /// Calls `listener` with the run each time recovery gives up on a run on this engine (it
    /// becomes `dead`). Listeners run inline: keep them short.
    pub fn on_dead(&self, listener: impl Fn(&Run) + Send + Sync + 'static) {
        self.shared().dead_listeners.write().push(Arc::new(listener));
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
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C): the usual shutdown request of a worker process.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
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
