//! The store-backed transport: a queue table in the store, claimed with a lease.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use durable_core::{Millis, QueuedRun, RunQueue};
use tokio::sync::{Notify, Semaphore, watch};

use crate::{Consumer, Handled, RunHandler, Transport, TransportError, Wakeups};

/// Runs queued in the store itself ([`RunQueue`]): every engine sharing the store (other
/// processes, other machines) consumes its share. A consumer claims items with a lease
/// (`claim_ttl`); items of a consumer that died come back once it expires.
///
/// When this process sends items, its consumers claim at once as many items as it sent; the
/// rest of the queue is shared out at each poll (every 50 ms by default) or when a [`Wakeups`]
/// source says items are waiting ([`QueueTransport::with_wakeups`], e.g. PostgreSQL's
/// `LISTEN/NOTIFY`). So a busy process, woken again and again by its own wakes, takes back
/// about what it queued and does not swallow a burst of starts sent by others.
#[derive(Clone)]
pub struct QueueTransport {
    queue: Arc<dyn RunQueue>,
    owner: String,
    poll_interval: Duration,
    claim_ttl: Duration,
    claim_batch: usize,
    local: Arc<Notify>,
    /// Items this process sent since its consumers last claimed on a local notify.
    local_sent: Arc<AtomicUsize>,
    wakeups: Option<Arc<dyn Wakeups>>,
}

impl fmt::Debug for QueueTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueTransport")
            .field("queue", &self.queue)
            .field("owner", &self.owner)
            .field("poll_interval", &self.poll_interval)
            .field("claim_batch", &self.claim_batch)
            .field("wakeups", &self.wakeups)
            .finish()
    }
}

/// Handles made by this process, numbering their owner names.
static HANDLES: AtomicUsize = AtomicUsize::new(0);

fn now_ms() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, durable_core::millis)
}

impl QueueTransport {
    /// A transport over `queue`: it polls every 50 ms for items sent by other processes (when
    /// this process sends items, it claims as many at once), claims at most 32 items at a time,
    /// and holds each claim for 60 s.
    pub fn new(queue: Arc<dyn RunQueue>) -> Self {
        QueueTransport {
            queue,
            // Unique per handle, also for handles made in the same millisecond.
            owner: format!(
                "consumer-{}-{:x}-{}",
                std::process::id(),
                now_ms(),
                HANDLES.fetch_add(1, Ordering::Relaxed)
            ),
            poll_interval: Duration::from_millis(50),
            claim_ttl: Duration::from_secs(60),
            claim_batch: 32,
            local: Arc::new(Notify::new()),
            local_sent: Arc::new(AtomicUsize::new(0)),
            wakeups: None,
        }
    }

    /// How often consumers look for items sent by other processes. With a [`Wakeups`] source
    /// this is only the safety net for nudges that never came (a listener reconnecting), and
    /// can be long.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Wakes consumers at once when `source` says items may be waiting (sent by another
    /// process), instead of at their next poll; polling continues as the safety net. For
    /// PostgreSQL: `PostgresStore::queue_wakeups()`, which listens for the `NOTIFY` of every
    /// enqueue. See [`Wakeups`] for what a source must do.
    pub fn with_wakeups(mut self, source: impl Wakeups) -> Self {
        self.wakeups = Some(Arc::new(source));
        self
    }

    /// How long a claimed item stays invisible to other consumers.
    pub fn claim_ttl(mut self, ttl: Duration) -> Self {
        self.claim_ttl = ttl;
        self
    }

    /// The most items one claim takes (at least 1). A consumer claims again at once after a
    /// full batch while it has free execution slots, so this bounds how much of a burst one
    /// consumer grabs before the others get a look, not its throughput.
    pub fn claim_batch(mut self, batch: usize) -> Self {
        self.claim_batch = batch.max(1);
        self
    }

    /// Items waiting in the queue.
    pub async fn queued(&self) -> Result<u64, TransportError> {
        self.queue.queued_len().await.map_err(|e| TransportError::Unavailable(e.to_string()))
    }
}

#[async_trait]
impl Transport for QueueTransport {
    async fn dispatch_runs(&self, _namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        let sent = batch.len();
        self.queue.enqueue(batch, now_ms()).await.map_err(|e| TransportError::Unavailable(e.to_string()))?;
        self.local_sent.fetch_add(sent, Ordering::AcqRel);
        self.local.notify_waiters();
        Ok(())
    }

    fn routes_without_namespace(&self) -> bool {
        true
    }

    fn merges_runs(&self) -> bool {
        true
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = watch::channel(false);
        let this = self.clone();
        let concurrency = concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        // Slots handed back by finished items. While the queue has a backlog (the last claim
        // came back full, or items were announced while every slot was busy), a consumer
        // claims again as soon as a quarter of a batch of slots is free, instead of leaving
        // them idle until its next poll or nudge.
        let freed = Arc::new(Notify::new());
        let refill_at = (this.claim_batch.min(concurrency) / 4).max(1);
        let task = tokio::spawn(async move {
            // A full look (at start, on a poll or a nudge) claims while batches come back
            // full; a local notify claims only as many items as this process sent.
            let mut full_look = true;
            let mut backlog = false;
            loop {
                let wake = this.local.notified();
                tokio::pin!(wake);
                wake.as_mut().enable();
                let budget = if full_look { usize::MAX } else { this.local_sent.swap(0, Ordering::AcqRel) };
                let want = slots.available_permits().min(this.claim_batch).min(budget);
                if want == 0 && full_look && slots.available_permits() == 0 {
                    backlog = true; // items may be waiting for a slot
                }
                if want > 0 {
                    let now = now_ms();
                    let until = durable_core::millis_after(now, this.claim_ttl);
                    match this.queue.claim_queued(namespace.as_deref(), &this.owner, want, until, now).await {
                        Ok(items) => {
                            let took = items.len();
                            if full_look || took < want {
                                backlog = took == want;
                            }
                            for item in items {
                                let permit = slots.clone().acquire_owned().await.expect("never closed");
                                let (handler, queue, owner) = (handler.clone(), this.queue.clone(), this.owner.clone());
                                let freed = freed.clone();
                                tokio::spawn(async move {
                                    let id = item.id;
                                    let result = match handler.handle(item).await {
                                        Handled::Done => queue.ack_queued(&[id], &owner).await,
                                        Handled::HandBack => queue.release_queued(&[id], &owner).await,
                                    };
                                    if let Err(e) = result {
                                        tracing::warn!(error = %e, "could not settle a queued item; its claim will expire");
                                    }
                                    drop(permit);
                                    freed.notify_one();
                                });
                            }
                            if took == want {
                                if full_look {
                                    continue; // more may be waiting
                                }
                                if budget > want {
                                    // The rest of what this process sent: next batch.
                                    this.local_sent.fetch_add(budget - want, Ordering::AcqRel);
                                    continue;
                                }
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "could not claim queued runs; trying again"),
                    }
                }
                let nudged = async {
                    match &this.wakeups {
                        Some(source) => source.next().await,
                        None => std::future::pending().await,
                    }
                };
                let refill = async {
                    loop {
                        freed.notified().await;
                        if slots.available_permits() >= refill_at {
                            break;
                        }
                    }
                };
                full_look = tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => break,
                    () = refill, if backlog => true,
                    () = &mut wake => false,
                    () = nudged => true,
                    () = tokio::time::sleep(this.poll_interval) => true,
                };
            }
        });
        Consumer::new(stop, task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use durable_core::{NewRun, Payload, QueueReason, RunId, Store};
    use durable_store_memory::MemoryStore;
    use parking_lot::Mutex;

    struct Collect(Mutex<Vec<RunId>>, Notify);

    #[async_trait]
    impl RunHandler for Collect {
        async fn handle(&self, item: QueuedRun) -> Handled {
            self.0.lock().push(item.run_id);
            self.1.notify_one();
            Handled::Done
        }
    }

    fn item(id: &str, reason: QueueReason) -> QueuedRun {
        QueuedRun {
            id: 0,
            run_id: RunId::from(id),
            reason,
            namespace: None,
            priority: 0,
            dedupe_key: format!("{reason}:{id}:0"),
        }
    }

    /// A memory store holding a pending run for each id.
    async fn store_with_runs(ids: &[&str]) -> Arc<MemoryStore> {
        let store = Arc::new(MemoryStore::new());
        for id in ids {
            let new = NewRun {
                trace_context: None,
                admission: None,
                id: RunId::from(*id),
                workflow: "w".into(),
                version: 1,
                namespace: "default".into(),
                input: Payload::null(),
                tags: vec![],
                priority: 0,
                parent: None,
                created_at: 0,
                start_at: None,
            };
            store.create_run(new).await.unwrap();
        }
        store
    }

    #[tokio::test]
    async fn queued_runs_reach_a_consumer_once_and_leave_the_queue() {
        let store = store_with_runs(&["a", "b"]).await;
        let transport = QueueTransport::new(store.clone());
        // A wake for an already queued run replaces its start; an unknown run is dropped.
        let batch = vec![
            item("a", QueueReason::Start),
            item("a", QueueReason::Wake),
            item("b", QueueReason::Start),
            item("zz", QueueReason::Start),
        ];
        transport.dispatch_runs(Some("default"), batch).await.unwrap();
        assert_eq!(transport.queued().await.unwrap(), 2);
        let handler = Arc::new(Collect(Mutex::new(Vec::new()), Notify::new()));
        let consumer = transport.consume_runs(None, 4, handler.clone());
        while handler.0.lock().len() < 2 {
            handler.1.notified().await;
        }
        consumer.stop().await;
        let mut got = handler.0.lock().clone();
        got.sort();
        assert_eq!(got, [RunId::from("a"), RunId::from("b")]);
        assert_eq!(transport.queued().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_nudge_wakes_an_idle_consumer_before_its_next_poll() {
        let store = store_with_runs(&["first", "second"]).await;
        let nudges = Arc::new(Notify::new());
        // Polling alone would take an hour: only the nudge can explain the second pickup.
        let transport =
            QueueTransport::new(store.clone()).poll_interval(Duration::from_secs(3600)).with_wakeups(nudges.clone());
        // Enqueued behind the transport's back, as another process would.
        store.enqueue(vec![item("first", QueueReason::Start)], 0).await.unwrap();
        let handler = Arc::new(Collect(Mutex::new(Vec::new()), Notify::new()));
        let consumer = transport.consume_runs(None, 4, handler.clone());
        while handler.0.lock().is_empty() {
            handler.1.notified().await; // the consumer's first claim, made at start
        }
        // That claim is over (its item reached the handler): the consumer now waits.
        store.enqueue(vec![item("second", QueueReason::Start)], 0).await.unwrap();
        nudges.notify_one();
        let picked = tokio::time::timeout(Duration::from_secs(60), async {
            while handler.0.lock().len() < 2 {
                handler.1.notified().await;
            }
        })
        .await;
        assert!(picked.is_ok(), "the nudge did not wake the consumer");
        consumer.stop().await;
        assert_eq!(handler.0.lock().clone(), [RunId::from("first"), RunId::from("second")]);
    }

    /// A queue that records every claim: (items asked for, items handed out).
    #[derive(Debug)]
    struct Claims(Arc<MemoryStore>, Mutex<Vec<(usize, usize)>>, Notify);

    impl Claims {
        fn new(store: Arc<MemoryStore>) -> Arc<Self> {
            Arc::new(Claims(store, Mutex::new(Vec::new()), Notify::new()))
        }
    }

    #[async_trait]
    impl RunQueue for Claims {
        async fn enqueue(&self, items: Vec<QueuedRun>, now: Millis) -> durable_core::StoreResult<()> {
            self.0.enqueue(items, now).await
        }
        async fn claim_queued(
            &self,
            namespace: Option<&str>,
            owner: &str,
            limit: usize,
            claim_until: Millis,
            now: Millis,
        ) -> durable_core::StoreResult<Vec<QueuedRun>> {
            let items = self.0.claim_queued(namespace, owner, limit, claim_until, now).await?;
            self.1.lock().push((limit, items.len()));
            self.2.notify_one();
            Ok(items)
        }
        async fn ack_queued(&self, ids: &[u64], owner: &str) -> durable_core::StoreResult<()> {
            self.0.ack_queued(ids, owner).await
        }
        async fn release_queued(&self, ids: &[u64], owner: &str) -> durable_core::StoreResult<()> {
            self.0.release_queued(ids, owner).await
        }
        async fn queued_len(&self) -> durable_core::StoreResult<u64> {
            self.0.queued_len().await
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("r{i}")).collect()
    }

    #[tokio::test]
    async fn a_burst_is_claimed_in_batches_of_at_most_claim_batch() {
        let ids = names(25);
        let store = store_with_runs(&ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
        store.enqueue(ids.iter().map(|id| item(id, QueueReason::Start)).collect(), 0).await.unwrap();
        let queue = Claims::new(store);
        let transport = QueueTransport::new(queue.clone()).claim_batch(10).poll_interval(Duration::from_secs(3600));
        let handler = Arc::new(Collect(Mutex::new(Vec::new()), Notify::new()));
        // Slots for everything: only the batch bounds the claims.
        let consumer = transport.consume_runs(None, 256, handler.clone());
        while handler.0.lock().len() < ids.len() {
            handler.1.notified().await;
        }
        consumer.stop().await;
        // Full batches are followed by another claim at once; the short one ends the burst.
        assert_eq!(queue.1.lock().clone(), [(10, 10), (10, 10), (10, 5)]);
    }

    /// Holds every item until told to finish one.
    struct Gate(Mutex<Vec<RunId>>, Notify, Semaphore);

    #[async_trait]
    impl RunHandler for Gate {
        async fn handle(&self, item: QueuedRun) -> Handled {
            self.0.lock().push(item.run_id);
            self.1.notify_one();
            self.2.acquire().await.expect("never closed").forget();
            Handled::Done
        }
    }

    #[tokio::test]
    async fn slots_freed_under_a_backlog_are_refilled_before_the_next_poll() {
        let ids = names(12);
        let store = store_with_runs(&ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
        store.enqueue(ids.iter().map(|id| item(id, QueueReason::Start)).collect(), 0).await.unwrap();
        let queue = Claims::new(store);
        // Polling alone would take an hour, and nothing nudges: only a freed slot can explain a
        // second claim.
        let transport = QueueTransport::new(queue.clone()).claim_batch(4).poll_interval(Duration::from_secs(3600));
        let handler = Arc::new(Gate(Mutex::new(Vec::new()), Notify::new(), Semaphore::new(0)));
        let consumer = transport.consume_runs(None, 4, handler.clone());
        while handler.0.lock().len() < 4 {
            handler.1.notified().await; // the first claim fills the four slots
        }
        // One item finishing frees one slot: a quarter of the batch, so the consumer claims one.
        handler.2.add_permits(1);
        let refilled = tokio::time::timeout(Duration::from_secs(60), async {
            while handler.0.lock().len() < 5 {
                handler.1.notified().await;
            }
        })
        .await;
        assert!(refilled.is_ok(), "the freed slot stayed idle until the next poll");
        // Every item in the end, each slot refilled as it frees, with no poll at all.
        handler.2.add_permits(ids.len());
        tokio::time::timeout(Duration::from_secs(60), async {
            while handler.0.lock().len() < ids.len() {
                handler.1.notified().await;
            }
        })
        .await
        .expect("the backlog drained through freed slots");
        consumer.stop().await;
        let claims = queue.1.lock().clone();
        assert_eq!(claims.first(), Some(&(4, 4)), "{claims:?}");
        assert_eq!(claims.iter().map(|c| c.1).sum::<usize>(), ids.len(), "{claims:?}");
    }

    #[tokio::test]
    async fn what_this_process_sends_lets_it_claim_that_many_not_the_whole_queue() {
        let ids = names(21);
        let store = store_with_runs(&ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
        let queue = Claims::new(store.clone());
        let transport = QueueTransport::new(queue.clone()).poll_interval(Duration::from_secs(3600));
        let handler = Arc::new(Collect(Mutex::new(Vec::new()), Notify::new()));
        let consumer = transport.consume_runs(None, 256, handler.clone());
        while queue.1.lock().is_empty() {
            queue.2.notified().await; // the first look, at start, finds nothing
        }
        // Twenty items from another process, then one sent here: the local notify entitles
        // this consumer to one item (the oldest); the twenty wait for everyone's next look.
        store.enqueue(ids[..20].iter().map(|id| item(id, QueueReason::Start)).collect(), 0).await.unwrap();
        transport.dispatch_runs(None, vec![item(&ids[20], QueueReason::Start)]).await.unwrap();
        while handler.0.lock().is_empty() {
            handler.1.notified().await;
        }
        consumer.stop().await;
        assert_eq!(queue.1.lock().clone(), [(32, 0), (1, 1)]);
        assert_eq!(handler.0.lock().clone(), [RunId::from("r0")]);
    }
}
