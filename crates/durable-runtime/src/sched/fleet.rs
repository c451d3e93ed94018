//! Many engines, one store: the batched run queue — the outbox and its flusher on the
//! sending end, the transport's consumer handing runs to this engine's slots on the other.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use durable_core::{Millis, QueueReason, QueuedRun, RunId};
use durable_transport::{Consumer, Handled, RunHandler, Transport};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::dispatch::{Counted, TaskGuard};
use super::{Nudge, Shared};
use crate::events::EngineEvent;

/// The run queue shared with other engines, if there is one: what waits to be sent, whether
/// sending fails, and the consumer taking this engine's share.
pub(super) struct Fleet {
    transport: Option<Arc<dyn Transport>>,
    outbox: Mutex<Outbox>,
    /// The outbox went from empty to not empty (a permit is kept if the flusher is busy).
    outbox_added: Notify,
    outbox_full: Notify,
    consumer: Mutex<Option<Consumer>>,
    queue_failures: Mutex<QueueFailures>,
    /// Runs handed over that the store does not have ([`Shared::missing_run`]).
    missing_report: Mutex<super::FailureTally>,
    /// Runs the pending poller sent again while this engine's consumer held none
    /// ([`Shared::stray_starts`]).
    stray_starts: Mutex<super::FailureTally>,
    /// Items the consumer holds: handed to this engine and not yet done (each is executing here
    /// or waiting for a slot).
    in_hand: AtomicUsize,
}

impl Fleet {
    pub(super) fn new(transport: Option<Arc<dyn Transport>>) -> Self {
        Fleet {
            transport,
            outbox: Mutex::new(Outbox::default()),
            outbox_added: Notify::new(),
            outbox_full: Notify::new(),
            consumer: Mutex::new(None),
            queue_failures: Mutex::new(QueueFailures::default()),
            missing_report: Mutex::new(super::FailureTally::default()),
            stray_starts: Mutex::new(super::FailureTally::default()),
            in_hand: AtomicUsize::new(0),
        }
    }

    /// Whether runs go through a run queue (a transport) rather than straight to this
    /// engine's dispatcher.
    pub(super) fn has_queue(&self) -> bool {
        self.transport.is_some()
    }

    /// How long the pending poller leaves a run it finds to the start item already sent for
    /// it (see [`EngineConfig::poll_grace`](crate::EngineConfig::poll_grace)): the grace with a
    /// working queue, zero without one or while it fails. Even a queue that merges items
    /// pays for a send: a run whose item a consumer already took gets a second one, and
    /// whoever takes that claims a run that is not free.
    pub(super) fn pending_grace(&self, grace: Duration) -> Duration {
        if self.transport.is_some() && !self.is_down() { grace } else { Duration::ZERO }
    }

    /// How long the due poller leaves a due run to the wake already sent for it: the grace
    /// with a working queue that keeps duplicates, zero otherwise. With a queue that merges
    /// items a due run is claimed at once: a delayed start or a sleep of a run parked by an
    /// engine that went away has no item of its own, and must not wake a grace late.
    pub(super) fn due_grace(&self, grace: Duration) -> Duration {
        match &self.transport {
            Some(transport) if !transport.merges_runs() && !self.is_down() => grace,
            _ => Duration::ZERO,
        }
    }

    /// Which due runs the due poller leaves to an item of their own in the store's run queue
    /// ([`RunQuery::leave_queued_since`](durable_core::RunQuery::leave_queued_since)): with a
    /// working queue that merges items (the store-backed one), those enqueued within the
    /// grace. A run a delivery woke is due at once and its deliverer sends it a wake; claiming
    /// it too made a second item whenever a consumer had taken the first, and a claim of a
    /// busy run. A due run without such an item (a sleep or a delayed start whose engine went
    /// away) is still claimed at once, unless `poll_batch` runs due before it are left to their
    /// items: a scan drops those, so it waits until they are taken or their items are as old as
    /// the grace.
    pub(super) fn leave_queued_since(&self, now: Millis, grace: Duration) -> Option<Millis> {
        match &self.transport {
            Some(transport) if transport.merges_runs() && !self.is_down() && !grace.is_zero() => {
                Some(now.saturating_sub(grace.as_millis() as Millis))
            }
            _ => None,
        }
    }

    /// Whether the last send to the queue failed.
    pub(super) fn is_down(&self) -> bool {
        self.queue_failures.lock().down
    }

    /// Adds an item to the outbox; a full batch (`batch` items) is sent at once.
    pub(super) fn add(&self, item: QueuedRun, batch: usize) {
        let waiting = self.outbox.lock().add(item);
        if waiting == 1 {
            self.outbox_added.notify_one();
        }
        if waiting >= batch {
            self.outbox_full.notify_one();
        }
    }
}

/// Runs waiting to be sent to the transport: at most one item per run (a wake replaces a
/// start), in arrival order.
#[derive(Default)]
struct Outbox {
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
                    queued.fold_wake_key(item.dedupe_key);
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
struct QueueFailures {
    tally: super::FailureTally,
    /// The last send failed: the pollers execute what they find here instead of queueing it.
    down: bool,
}

impl Shared {
    /// Sends the outbox one tick after something is added to it (so that what arrives in
    /// the meantime goes in the same batch), or at once when a batch is full. An idle engine
    /// does not wake up.
    pub(super) async fn flush_loop(self: Arc<Self>) {
        loop {
            self.fleet.outbox_added.notified().await;
            tokio::select! {
                biased;
                () = tokio::time::sleep(self.config.dispatch_tick) => {}
                () = self.fleet.outbox_full.notified() => {}
            }
            self.flush().await;
        }
    }

    /// Sends everything in the outbox, grouped by namespace, in batches.
    pub(crate) async fn flush(&self) {
        let Some(transport) = &self.fleet.transport else { return };
        let mut items = self.fleet.outbox.lock().take();
        if items.is_empty() {
            return;
        }
        if !transport.routes_without_namespace() {
            self.fill_namespaces(&mut items).await;
        }
        let mut groups: BTreeMap<Option<String>, Vec<QueuedRun>> = BTreeMap::new();
        for item in items {
            groups.entry(item.namespace.clone()).or_default().push(item);
        }
        let mut failed = false;
        for (namespace, group) in groups {
            for chunk in group.chunks(self.config.dispatch_batch.max(1)) {
                match transport.dispatch_runs(namespace.as_deref(), chunk.to_vec()).await {
                    Ok(()) => {
                        // Consumers elsewhere look now (`ControlWakeups`), not at their next poll.
                        self.nudge(namespace.as_deref(), None);
                        self.metrics.batches.fetch_add(1, Ordering::Relaxed);
                        self.metrics.queued_runs.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed = true;
                        self.queue_failed(chunk, &e);
                    }
                }
            }
        }
        // Up again once a whole flush went through (one namespace's sends may keep failing
        // while another's pass).
        if !failed && std::mem::take(&mut self.fleet.queue_failures.lock().down) {
            tracing::info!("the run queue is working again");
        }
    }

    /// Looks up the namespaces of the runs whose items lack one (a wake names only its run), in
    /// one store read, for a transport that routes by namespace. If the read fails they go
    /// without one: consumers of every namespace take them, and the pollers find the runs anyway.
    async fn fill_namespaces(&self, items: &mut [QueuedRun]) {
        let unknown: Vec<RunId> = items.iter().filter(|i| i.namespace.is_none()).map(|i| i.run_id.clone()).collect();
        if unknown.is_empty() {
            return;
        }
        match self.store.get_runs(&unknown).await {
            Ok(runs) => {
                let of: HashMap<RunId, String> = runs.into_iter().map(|r| (r.id, r.namespace)).collect();
                for item in items.iter_mut().filter(|i| i.namespace.is_none()) {
                    item.namespace = of.get(&item.run_id).cloned();
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not read the namespaces of queued runs; sending them without"),
        }
    }

    /// The queue refused a batch: report at most once a minute; starts stay `pending` for the
    /// pollers, wakes are executed here.
    fn queue_failed(&self, items: &[QueuedRun], e: &durable_transport::TransportError) {
        let report = {
            let mut f = self.fleet.queue_failures.lock();
            f.down = true;
            f.tally.failed(items.len() as u64)
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
                let since = self.mark_of(&item.dedupe_key);
                self.dispatch_as(item.run_id.clone(), Nudge::queued(true, since));
            }
        }
    }

    /// A run to execute here is not in the store. Deleted meanwhile, usually; but with a run
    /// queue it may be another deployment's, handed over because the two share the
    /// transport's prefix (each then loses the other's items until its pollers find them, a
    /// lease or a poll later): said at most once a minute.
    pub(super) fn missing_run(&self, id: &RunId) {
        if self.fleet.has_queue() && self.fleet.missing_report.lock().failed(1).is_some() {
            tracing::warn!(
                run_id = %id,
                "run {id} was handed to this engine but its store has no such run: deleted meanwhile, or \
                 another deployment (another database or schema) shares this run queue (the transport's prefix or \
                 stream), and the two take each other's runs; give each deployment its own (reported at most once \
                 a minute)"
            );
        }
    }

    /// The pending poller sends `n` runs to the run queue again: they were still pending after
    /// the poll grace while this engine, which executes runs, held no item of the queue and had
    /// a slot free, so their start items never reached its consumer (a backlog keeps the
    /// consumer's hands full). Now and then that is a start whose engine died before sending it,
    /// or one written by a tool without the run queue (`durable runs retry`); again and again, it
    /// is an engine that starts runs on another run queue (another broker or prefix) or on
    /// none, and each of its runs waits the grace: said at most once a minute, with the count
    /// since the last report.
    pub(super) fn stray_starts(&self, n: usize, grace: Duration) {
        if !self.config.execute || self.fleet.in_hand.load(Ordering::Acquire) > 0 || !self.has_free_slot() {
            return;
        }
        let Some(runs) = self.fleet.stray_starts.lock().failed(n as u64) else { return };
        tracing::warn!(
            runs,
            "{runs} pending run(s) never reached this engine's run queue while it was idle: the pending \
             poller sent them again after the poll grace ({grace:?}). If this keeps happening, the engines or tools \
             that start runs use another run queue (another broker or prefix) or none, and every run they start \
             waits the grace: give every engine of the deployment the same transport and prefix (reported at most \
             once a minute)"
        );
    }

    /// Registers this engine's consumer with the transport: it hands runs to
    /// [`EngineHandler`].
    pub(super) fn start_consumer(self: &Arc<Self>) {
        let Some(transport) = &self.fleet.transport else { return };
        let handler = Arc::new(EngineHandler(Arc::downgrade(self)));
        let consumer = transport.consume_runs(self.config.namespace.clone(), self.config.queue_concurrency, handler);
        *self.fleet.consumer.lock() = Some(consumer);
    }

    /// Stops the consumer (items in hand are handed back); `drain` and `shutdown` call it
    /// first.
    pub(crate) async fn stop_consumer(&self) {
        if let Some(consumer) = self.fleet_consumer() {
            consumer.stop().await;
        }
    }

    /// Takes the consumer out (dropping it stops its loop without waiting).
    pub(super) fn fleet_consumer(&self) -> Option<Consumer> {
        self.fleet.consumer.lock().take()
    }

    /// Executes a run handed over by the transport, in one of this engine's execution slots.
    /// An item this engine sent carries the mark its news dates from (in its dedupe key): if
    /// the run went quiet here since (a poller's find that raced the run's own item, say), it
    /// is read first.
    async fn run_queued(self: &Arc<Self>, item: QueuedRun) -> Handled {
        if self.is_stopping() || self.is_draining() {
            return Handled::HandBack;
        }
        let since = self.mark_of(&item.dedupe_key);
        if let Some(until) = item.claimed_until() {
            // Another poller (or ours) claimed the due run: it is due while its `wake_at` is
            // still the claim's end, whichever engine reads it.
            self.record_claim(&item.run_id, until);
        }
        let (id, wake) = (item.run_id, item.reason == QueueReason::Wake);
        if !self.enter_queued(&id, wake, since) {
            return Handled::Done; // queued or executing here already: it looks again when done
        }
        let Some(slot) = self.slot().await else {
            self.leave_queued(&id);
            return Handled::HandBack;
        };
        let Some(check) = self.begin_queued(&id) else { return Handled::Done };
        self.run_in_slot(TaskGuard::new(self, id), slot, check, None).await;
        // A turn cut off by a shutdown goes back to the queue for another engine.
        if self.is_stopping() { Handled::HandBack } else { Handled::Done }
    }
}

/// Hands runs from the transport to the engine.
struct EngineHandler(Weak<Shared>);

#[async_trait]
impl RunHandler for EngineHandler {
    async fn handle(&self, item: QueuedRun) -> Handled {
        match self.0.upgrade() {
            Some(shared) => {
                let _held = Counted::new(&shared.fleet.in_hand);
                shared.run_queued(item).await
            }
            None => Handled::HandBack,
        }
    }
}
