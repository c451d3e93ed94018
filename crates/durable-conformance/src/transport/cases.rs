//! The transport cases, one `pub async fn` each, run by
//! [`run_transport_case`](super::run_transport_case) on a fresh queue.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use durable_core::{QueueReason, QueuedRun, RunId};
use durable_transport::{Handled, RunHandler, Transport};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::TransportUnderTest;
use crate::CaseResult;

/// The longest a case waits for something the contract says must happen.
const DEADLINE: Duration = Duration::from_secs(30);

/// What a recording handler does with an item.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Answer `Done` at once.
    Done,
    /// Take `Duration` to answer `Done`.
    Work(Duration),
    /// Never answer (a consumer that died with the item in hand).
    Hang,
    /// Hand the item back the first time it comes, then `Done`.
    HandBackFirst,
}

/// A handler that records every delivery.
struct Recorder {
    act: Act,
    /// Every delivery, in order.
    deliveries: Mutex<Vec<RunId>>,
    /// Runs in a handler's hands now.
    in_hand: Mutex<BTreeSet<RunId>>,
    /// Deliveries of a run already in a handler's hands.
    overlaps: AtomicUsize,
    running: AtomicUsize,
    max_running: AtomicUsize,
    changed: Notify,
}

impl Recorder {
    fn new(act: Act) -> Arc<Recorder> {
        Arc::new(Recorder {
            act,
            deliveries: Mutex::new(Vec::new()),
            in_hand: Mutex::new(BTreeSet::new()),
            overlaps: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            changed: Notify::new(),
        })
    }

    /// How many times each run was delivered.
    fn counts(&self) -> BTreeMap<RunId, usize> {
        let mut out = BTreeMap::new();
        for id in self.deliveries.lock().iter() {
            *out.entry(id.clone()).or_default() += 1;
        }
        out
    }

    /// Waits until `done` holds of the delivery counts, or panics after [`DEADLINE`] with
    /// `what` and the counts.
    async fn wait_for(&self, what: &str, done: impl Fn(&BTreeMap<RunId, usize>) -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let counts = self.counts();
            if done(&counts) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("{what}: not within {DEADLINE:?}; deliveries so far: {counts:?}");
            }
        }
    }

    /// Waits until every run of `runs` was delivered at least once.
    async fn wait_for_all(&self, what: &str, runs: &[RunId]) {
        self.wait_for(what, |c| runs.iter().all(|r| c.contains_key(r))).await;
    }
}

#[async_trait]
impl RunHandler for Recorder {
    async fn handle(&self, item: QueuedRun) -> Handled {
        let id = item.run_id.clone();
        let first = !self.deliveries.lock().contains(&id);
        if !self.in_hand.lock().insert(id.clone()) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(running, Ordering::SeqCst);
        self.deliveries.lock().push(id.clone());
        self.changed.notify_waiters();
        let handled = match self.act {
            Act::Done => Handled::Done,
            Act::Work(d) => {
                tokio::time::sleep(d).await;
                Handled::Done
            }
            Act::Hang => std::future::pending().await,
            Act::HandBackFirst if first => Handled::HandBack,
            Act::HandBackFirst => Handled::Done,
        };
        self.in_hand.lock().remove(&id);
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        handled
    }
}

fn check<T, E: Display>(result: Result<T, E>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// `n` run ids named after the case.
fn runs(case: &str, n: usize) -> Vec<RunId> {
    (0..n).map(|i| RunId::from(format!("{case}-{i}"))).collect()
}

fn item(run: &RunId, namespace: &str) -> QueuedRun {
    QueuedRun {
        id: 0,
        run_id: run.clone(),
        reason: QueueReason::Start,
        namespace: Some(namespace.to_string()),
        priority: 0,
        dedupe_key: format!("start:{run}:1"),
    }
}

/// A handle with `runs` of `namespace` prepared, and their items sent through it.
async fn send(q: &dyn TransportUnderTest, namespace: &str, runs: &[RunId]) -> Arc<dyn Transport> {
    let pairs: Vec<(RunId, String)> = runs.iter().map(|r| (r.clone(), namespace.to_string())).collect();
    check(q.prepare_runs(&pairs).await, "preparing the runs");
    let handle = check(q.handle().await, "opening a handle");
    let items = runs.iter().map(|r| item(r, namespace)).collect();
    check(handle.dispatch_runs(Some(namespace), items).await, "dispatch_runs");
    handle
}

/// Every item sent before any consumer existed reaches the consumer that starts later.
pub async fn delivered_at_least_once(q: &dyn TransportUnderTest) -> CaseResult {
    let runs = runs("once", 20);
    let handle = send(q, "ns-a", &runs).await;
    let rec = Recorder::new(Act::Done);
    let consumer = handle.consume_runs(Some("ns-a".into()), 8, rec.clone());
    rec.wait_for_all("every item delivered", &runs).await;
    consumer.stop().await;
    Ok(())
}

/// Two instances consume one queue: each item goes to one of them, never to both at once, and
/// (answered long before the redelivery time) exactly once.
pub async fn claimed_by_one_consumer_at_a_time(q: &dyn TransportUnderTest) -> CaseResult {
    let runs = runs("one-at-a-time", 200);
    let (a, b) = (check(q.handle().await, "opening a handle"), check(q.handle().await, "opening a handle"));
    let rec = Recorder::new(Act::Work(Duration::from_millis(2)));
    let first = a.consume_runs(Some("ns-a".into()), 8, rec.clone());
    let second = b.consume_runs(Some("ns-a".into()), 8, rec.clone());
    send(q, "ns-a", &runs).await;
    rec.wait_for_all("every item delivered", &runs).await;
    first.stop().await;
    second.stop().await;
    assert_eq!(rec.overlaps.load(Ordering::SeqCst), 0, "an item was in two handlers' hands at once");
    let twice: Vec<_> = rec.counts().into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(twice.is_empty(), "items answered in time were delivered again: {twice:?}");
    Ok(())
}

/// A consumer that took an item and never answered (it died) leaves it to another instance
/// once the redelivery time has passed.
pub async fn redelivered_after_a_consumer_dies(q: &dyn TransportUnderTest) -> CaseResult {
    let runs = runs("dies", 3);
    let handle = send(q, "ns-a", &runs).await;
    let dead = Recorder::new(Act::Hang);
    let consumer = handle.consume_runs(Some("ns-a".into()), 8, dead.clone());
    dead.wait_for_all("every item delivered to the first consumer", &runs).await;
    // It stops taking items; its handlers never answer, as if the process had died.
    consumer.stop().await;
    let other = check(q.handle().await, "opening a handle");
    let alive = Recorder::new(Act::Done);
    let consumer = other.consume_runs(Some("ns-a".into()), 8, alive.clone());
    alive.wait_for_all("the dead consumer's items redelivered to another", &runs).await;
    consumer.stop().await;
    Ok(())
}

/// An item handed back (a draining engine) is delivered again at once, long before the
/// redelivery time of a dead consumer's item.
pub async fn handed_back_items_return_at_once(q: &dyn TransportUnderTest) -> CaseResult {
    let runs = runs("hand-back", 4);
    let handle = send(q, "ns-a", &runs).await;
    let rec = Recorder::new(Act::HandBackFirst);
    let consumer = handle.consume_runs(Some("ns-a".into()), 8, rec.clone());
    // The queue redelivers unanswered items only after ten minutes: a second delivery within
    // the case's deadline is the hand-back's.
    rec.wait_for("every item delivered twice", |c| runs.iter().all(|r| c.get(r).is_some_and(|n| *n >= 2))).await;
    consumer.stop().await;
    Ok(())
}

/// An item sent twice under one dedupe key (a retried send) is delivered once.
pub async fn duplicate_sends_are_delivered_once(q: &dyn TransportUnderTest) -> CaseResult {
    let [dup, after]: [RunId; 2] = runs("dedupe", 2).try_into().expect("two");
    let handle = send(q, "ns-a", std::slice::from_ref(&dup)).await;
    check(handle.dispatch_runs(Some("ns-a"), vec![item(&dup, "ns-a")]).await, "dispatch_runs");
    // Then another item, after both copies: once it is delivered, so would the copy have been.
    send(q, "ns-a", std::slice::from_ref(&after)).await;
    let rec = Recorder::new(Act::Done);
    let consumer = handle.consume_runs(Some("ns-a".into()), 1, rec.clone());
    rec.wait_for_all("both items delivered", &[dup.clone(), after]).await;
    // Settle what is in flight: one more look at the queue after the last delivery.
    consumer.stop().await;
    assert_eq!(rec.counts()[&dup], 1, "the item sent twice under one dedupe key was delivered twice");
    Ok(())
}

/// A batch of 500 items in one call arrives whole.
pub async fn batches_of_500_arrive_whole(q: &dyn TransportUnderTest) -> CaseResult {
    let runs = runs("batch", 500);
    let handle = send(q, "ns-a", &runs).await;
    let rec = Recorder::new(Act::Done);
    let consumer = handle.consume_runs(Some("ns-a".into()), 64, rec.clone());
    rec.wait_for_all("all 500 items delivered", &runs).await;
    consumer.stop().await;
    Ok(())
}

/// A consumer never runs more handlers at once than its concurrency, and does run that many
/// when enough items wait.
pub async fn concurrency_is_respected(q: &dyn TransportUnderTest) -> CaseResult {
    let runs = runs("concurrency", 24);
    let handle = send(q, "ns-a", &runs).await;
    let rec = Recorder::new(Act::Work(Duration::from_millis(50)));
    let consumer = handle.consume_runs(Some("ns-a".into()), 3, rec.clone());
    rec.wait_for_all("every item delivered", &runs).await;
    consumer.stop().await;
    let max = rec.max_running.load(Ordering::SeqCst);
    assert!(max <= 3, "{max} handlers ran at once under a concurrency of 3");
    assert_eq!(max, 3, "24 items waited, yet no more than {max} handlers ran at once under a concurrency of 3");
    Ok(())
}

/// A consumer of one namespace is handed none of another namespace's items.
pub async fn namespaces_are_isolated(q: &dyn TransportUnderTest) -> CaseResult {
    let (in_a, in_b) = (runs("ns-a", 10), runs("ns-b", 10));
    send(q, "ns-a", &in_a).await;
    let handle = send(q, "ns-b", &in_b).await;
    let (rec_a, rec_b) = (Recorder::new(Act::Done), Recorder::new(Act::Done));
    let a = handle.consume_runs(Some("ns-a".into()), 8, rec_a.clone());
    let b = check(q.handle().await, "opening a handle").consume_runs(Some("ns-b".into()), 8, rec_b.clone());
    rec_a.wait_for_all("namespace a's items delivered", &in_a).await;
    rec_b.wait_for_all("namespace b's items delivered", &in_b).await;
    a.stop().await;
    b.stop().await;
    let stray_a: Vec<_> = rec_a.counts().into_keys().filter(|r| !in_a.contains(r)).collect();
    let stray_b: Vec<_> = rec_b.counts().into_keys().filter(|r| !in_b.contains(r)).collect();
    assert!(stray_a.is_empty(), "a consumer of ns-a was handed other namespaces' items: {stray_a:?}");
    assert!(stray_b.is_empty(), "a consumer of ns-b was handed other namespaces' items: {stray_b:?}");
    Ok(())
}
