//! What the NATS tests share: items, recording handlers, waiting for a condition, a transport
//! on a prefix of the test's own.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use durable_core::{QueueReason, QueuedRun, RunId};
use durable_transport::{Handled, RunHandler};
use durable_transport_nats::NatsTransport;
use durable_transport_nats::test_support::unique_prefix;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// How long a test waits for something that must happen (generous: the machine may be loaded).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// An item for run `id` with a dedupe key of its own.
pub fn item(id: &str) -> QueuedRun {
    QueuedRun {
        id: 0,
        run_id: RunId::from(id),
        reason: QueueReason::Start,
        namespace: None,
        priority: 0,
        dedupe_key: format!("start:{id}:0"),
    }
}

/// `n` items `<tag>0`, `<tag>1`, ….
pub fn items(tag: &str, n: usize) -> Vec<QueuedRun> {
    (0..n).map(|i| item(&format!("{tag}{i}"))).collect()
}

/// A transport on a fresh prefix (its stream created), and the prefix.
pub async fn fresh(url: &str, tag: &str) -> (NatsTransport, String) {
    let prefix = unique_prefix(tag);
    let transport = NatsTransport::connect(url, &prefix).await.expect("connect to NATS");
    (transport, prefix)
}

/// Another instance on the same prefix (a connection of its own, as another process).
pub async fn instance(url: &str, prefix: &str) -> NatsTransport {
    NatsTransport::connect(url, prefix).await.expect("connect to NATS")
}

/// Waits until `done()` holds, re-checking whenever `changed` is notified; panics with `what`
/// after [`DEADLINE`].
pub async fn wait_for(what: &str, changed: &Notify, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        loop {
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done() {
                return;
            }
            notified.await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

/// Waits until the async `check` says yes, asking again every 20 ms (for server-side state
/// nothing notifies about); panics with `what` after [`DEADLINE`].
pub async fn poll_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(DEADLINE, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

/// A handler recording every item it gets, answering `Done`.
#[derive(Default)]
pub struct Recorder {
    pub seen: Mutex<Vec<QueuedRun>>,
    pub changed: Notify,
}

impl Recorder {
    pub fn new() -> Arc<Self> {
        Arc::new(Recorder::default())
    }

    pub fn count(&self) -> usize {
        self.seen.lock().len()
    }

    pub fn runs(&self) -> Vec<String> {
        self.seen.lock().iter().map(|i| i.run_id.as_str().to_string()).collect()
    }

    pub async fn wait_count(&self, n: usize) {
        wait_for(&format!("{n} items"), &self.changed, || self.count() >= n).await;
    }
}

#[async_trait]
impl RunHandler for Recorder {
    async fn handle(&self, item: QueuedRun) -> Handled {
        self.seen.lock().push(item);
        self.changed.notify_waiters();
        Handled::Done
    }
}

/// Waits until the recorders got `n` items between them.
pub async fn wait_total(recorders: &[&Arc<Recorder>], n: usize) {
    let changed = Arc::new(Notify::new());
    // Each recorder's news, forwarded to one Notify the wait listens to.
    let forwards: Vec<_> = recorders
        .iter()
        .map(|r| {
            let (r, changed) = ((*r).clone(), changed.clone());
            tokio::spawn(async move {
                loop {
                    let news = r.changed.notified();
                    tokio::pin!(news);
                    news.as_mut().enable();
                    changed.notify_waiters();
                    news.await;
                }
            })
        })
        .collect();
    wait_for(&format!("{n} items in all"), &changed, || recorders.iter().map(|r| r.count()).sum::<usize>() >= n).await;
    for f in forwards {
        f.abort();
    }
}

/// A handler that records the item and then never answers (a hung turn).
#[derive(Default)]
pub struct Hang {
    pub seen: Mutex<Vec<QueuedRun>>,
    pub changed: Notify,
}

#[async_trait]
impl RunHandler for Hang {
    async fn handle(&self, item: QueuedRun) -> Handled {
        self.seen.lock().push(item);
        self.changed.notify_waiters();
        std::future::pending().await
    }
}

/// Counts handlers in flight; each waits for `release` before it answers.
pub struct Gauge {
    pub in_flight: AtomicUsize,
    pub max: AtomicUsize,
    pub done: AtomicUsize,
    pub changed: Notify,
    /// Handlers hold until this many are in flight at once (then all go).
    pub hold_until: usize,
    pub released: Notify,
}

impl Gauge {
    pub fn new(hold_until: usize) -> Arc<Self> {
        Arc::new(Gauge {
            in_flight: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            changed: Notify::new(),
            hold_until,
            released: Notify::new(),
        })
    }
}

#[async_trait]
impl RunHandler for Gauge {
    async fn handle(&self, _item: QueuedRun) -> Handled {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.changed.notify_waiters();
        // Hold until the limit was reached once, so that a consumer able to run `limit` at
        // once is seen doing it.
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if self.max.load(Ordering::SeqCst) >= self.hold_until {
                break;
            }
            released.await;
        }
        self.released.notify_waiters();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Handled::Done
    }
}
