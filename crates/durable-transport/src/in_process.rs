//! A transport inside one process: an in-memory queue shared by every clone.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_core::QueuedRun;
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use crate::{Consumer, Handled, RunHandler, Transport, TransportError};

/// How long a dedupe key is remembered.
const DEDUPE_WINDOW: Duration = Duration::from_secs(120);

/// Runs sent through memory to consumers in the same process. Items are not persisted: after
/// a crash the engine's pollers find the runs in the store. Clones share the queue.
///
/// It keeps the promises of the transport contract (checked by the transport conformance
/// suite): highest priority first, then oldest; an item is in one consumer's hands at a time;
/// an item handed back is delivered again at once; an item sent again under a dedupe key seen
/// in the last two minutes is dropped; a consumer of a namespace sees that namespace's items
/// (and items sent without one). Items are not redelivered while their handler runs, unless
/// [`redeliver_after`](InProcessTransport::redeliver_after) says when to give up on it.
#[derive(Debug, Clone)]
pub struct InProcessTransport {
    shared: Arc<Shared>,
    redeliver_after: Option<Duration>,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when items become ready.
    ready: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    next_id: u64,
    /// Waiting items, best first: highest priority, then oldest.
    ready: BTreeMap<(Reverse<i32>, u64), QueuedRun>,
    /// Delivered and not answered: the item and when it goes back to `ready` (`None`: never).
    in_hand: BTreeMap<u64, (QueuedRun, Option<Instant>)>,
    /// The redelivery times of `in_hand`, earliest first.
    deadlines: BTreeSet<(Instant, u64)>,
    /// Dedupe keys seen, with when they were sent.
    seen: HashMap<String, Instant>,
    /// When `seen` was last pruned.
    pruned: Option<Instant>,
}

impl Queue {
    fn push(&mut self, mut item: QueuedRun) {
        self.next_id += 1;
        item.id = self.next_id;
        self.ready.insert((Reverse(item.priority), item.id), item);
    }

    /// Items whose redelivery time has come go back to `ready`; returns the next such time.
    fn expire(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&(at, id)) = self.deadlines.first()
            && at <= now
        {
            self.deadlines.pop_first();
            // Under a new id: the answer of the handler that gave up on it is then ignored.
            let (item, _) = self.in_hand.remove(&id).expect("a deadline of an item in hand");
            self.push(item);
        }
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// The item `id` is answered: it leaves `in_hand` (`None`: it had been redelivered).
    fn answered(&mut self, id: u64) -> Option<QueuedRun> {
        let (item, until) = self.in_hand.remove(&id)?;
        if let Some(at) = until {
            self.deadlines.remove(&(at, id));
        }
        Some(item)
    }

    /// Takes up to `limit` ready items a consumer of `namespace` may have.
    fn take(&mut self, namespace: Option<&str>, limit: usize, until: Option<Instant>) -> Vec<QueuedRun> {
        let keys: Vec<(Reverse<i32>, u64)> = self
            .ready
            .iter()
            .filter(|(_, item)| matches(namespace, item.namespace.as_deref()))
            .take(limit)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .map(|k| {
                let item = self.ready.remove(&k).expect("listed above");
                if let Some(at) = until {
                    self.deadlines.insert((at, item.id));
                }
                self.in_hand.insert(item.id, (item.clone(), until));
                item
            })
            .collect()
    }
}

/// Whether a consumer of `consumer` (`None`: every namespace) takes an item of `item`
/// (`None`: the sender did not know it).
fn matches(consumer: Option<&str>, item: Option<&str>) -> bool {
    match (consumer, item) {
        (Some(c), Some(i)) => c == i,
        _ => true,
    }
}

impl InProcessTransport {
    /// A new, empty queue.
    pub fn new() -> Self {
        InProcessTransport { shared: Arc::default(), redeliver_after: None }
    }

    /// Delivers an item again if its handler has not answered within `after` (by default
    /// never: inside one process a handler that runs is alive). For tests of what a fleet does
    /// when a consumer stops answering.
    pub fn redeliver_after(mut self, after: Duration) -> Self {
        self.redeliver_after = Some(after);
        self
    }

    /// Items waiting or in a handler's hands.
    pub fn queued(&self) -> usize {
        let q = self.shared.queue.lock();
        q.ready.len() + q.in_hand.len()
    }

    fn answer(&self, id: u64, handled: Handled) {
        let mut q = self.shared.queue.lock();
        // Gone already when its redelivery time came and another consumer took it.
        if let Some(item) = q.answered(id)
            && handled == Handled::HandBack
        {
            q.ready.insert((Reverse(item.priority), item.id), item);
            drop(q);
            self.shared.ready.notify_waiters();
        }
    }
}

impl Default for InProcessTransport {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Transport for InProcessTransport {
    async fn dispatch_runs(&self, _namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        let now = Instant::now();
        {
            let mut q = self.shared.queue.lock();
            if q.pruned.is_none_or(|at| now.duration_since(at) >= DEDUPE_WINDOW) {
                q.seen.retain(|_, at| now.duration_since(*at) < DEDUPE_WINDOW);
                q.pruned = Some(now);
            }
            for item in batch {
                if !item.dedupe_key.is_empty() {
                    match q.seen.get(&item.dedupe_key) {
                        Some(at) if now.duration_since(*at) < DEDUPE_WINDOW => continue,
                        _ => {
                            q.seen.insert(item.dedupe_key.clone(), now);
                        }
                    }
                }
                q.push(item);
            }
        }
        self.shared.ready.notify_waiters();
        Ok(())
    }

    fn routes_without_namespace(&self) -> bool {
        true
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = watch::channel(false);
        let this = self.clone();
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        let task = tokio::spawn(async move {
            loop {
                // Biased, stop first: a stopped consumer takes nothing more, and the order in
                // which ready branches are taken does not depend on chance.
                let permit = tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => break,
                    p = slots.clone().acquire_owned() => p.expect("never closed"),
                };
                // Armed before the look, so an item sent after it wakes this consumer.
                let ready = this.shared.ready.notified();
                tokio::pin!(ready);
                ready.as_mut().enable();
                let (item, next_expiry) = {
                    let now = Instant::now();
                    let mut q = this.shared.queue.lock();
                    let next = q.expire(now);
                    let until = this.redeliver_after.map(|d| now + d);
                    let item = q.take(namespace.as_deref(), 1, until).pop();
                    (item, next)
                };
                if item.is_some() && this.redeliver_after.is_some() {
                    // Idle consumers wait for the earliest redelivery they knew of: this one is new.
                    this.shared.ready.notify_waiters();
                }
                let Some(item) = item else {
                    drop(permit);
                    let expiry = async {
                        match next_expiry {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => break,
                        () = &mut ready => {}
                        () = expiry => {}
                    }
                    continue;
                };
                let (handler, this) = (handler.clone(), this.clone());
                tokio::spawn(async move {
                    let id = item.id;
                    let handled = handler.handle(item).await;
                    this.answer(id, handled);
                    drop(permit);
                });
            }
        });
        Consumer::new(stop, task)
    }
}
