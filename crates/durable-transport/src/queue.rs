//! The store-backed transport: a queue table in the store, claimed with a lease.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use durable_core::{Millis, QueuedRun, RunQueue};
use tokio::sync::{Notify, Semaphore, watch};

use crate::{Consumer, Handled, RunHandler, Transport, TransportError, Wakeups};

/// Runs queued in the store itself ([`RunQueue`]): every engine sharing the store (other
/// processes, other machines) consumes its share. A consumer claims items with a lease
/// (`claim_ttl`); items of a consumer that died come back once it expires.
///
/// Items sent by this process are claimed at once; items sent by other processes are found by
/// polling (every 50 ms by default), or at once when a [`Wakeups`] source says so
/// ([`QueueTransport::with_wakeups`], e.g. PostgreSQL's `LISTEN/NOTIFY`).
#[derive(Clone)]
pub struct QueueTransport {
    queue: Arc<dyn RunQueue>,
    owner: String,
    poll_interval: Duration,
    claim_ttl: Duration,
    local: Arc<Notify>,
    wakeups: Option<Arc<dyn Wakeups>>,
}

impl fmt::Debug for QueueTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueTransport")
            .field("queue", &self.queue)
            .field("owner", &self.owner)
            .field("poll_interval", &self.poll_interval)
            .field("wakeups", &self.wakeups)
            .finish()
    }
}

fn now_ms() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}

impl QueueTransport {
    /// A transport over `queue`, polling every 50 ms for items sent by other processes (items
    /// sent by this process are picked up at once) and claiming items for 60 s.
    pub fn new(queue: Arc<dyn RunQueue>) -> Self {
        QueueTransport {
            queue,
            owner: format!("consumer-{}-{:x}", std::process::id(), now_ms()),
            poll_interval: Duration::from_millis(50),
            claim_ttl: Duration::from_secs(60),
            local: Arc::new(Notify::new()),
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

    /// Items waiting in the queue.
    pub async fn queued(&self) -> Result<u64, TransportError> {
        self.queue.queued_len().await.map_err(|e| TransportError::Unavailable(e.to_string()))
    }
}

#[async_trait]
impl Transport for QueueTransport {
    async fn dispatch_runs(&self, _namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        self.queue.enqueue(batch, now_ms()).await.map_err(|e| TransportError::Unavailable(e.to_string()))?;
        self.local.notify_waiters();
        Ok(())
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = watch::channel(false);
        let this = self.clone();
        let concurrency = concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let task = tokio::spawn(async move {
            loop {
                let wake = this.local.notified();
                tokio::pin!(wake);
                wake.as_mut().enable();
                let free = slots.available_permits();
                if free > 0 {
                    let now = now_ms();
                    let until = now + this.claim_ttl.as_millis() as Millis;
                    match this.queue.claim_queued(namespace.as_deref(), &this.owner, free, until, now).await {
                        Ok(items) => {
                            let took = items.len();
                            for item in items {
                                let permit = slots.clone().acquire_owned().await.expect("never closed");
                                let (handler, queue, owner) = (handler.clone(), this.queue.clone(), this.owner.clone());
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
                                });
                            }
                            if took == free {
                                continue; // more may be waiting
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
                tokio::select! {
                    () = &mut wake => {}
                    () = nudged => {}
                    () = tokio::time::sleep(this.poll_interval) => {}
                    _ = stopped.wait_for(|s| *s) => break,
                }
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
                id: RunId::from(*id),
                workflow: "w".into(),
                version: 1,
                namespace: "default".into(),
                input: Payload::null(),
                tags: vec![],
                priority: 0,
                parent: None,
                created_at: 0,
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
}
