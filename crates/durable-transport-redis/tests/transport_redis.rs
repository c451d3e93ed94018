//! RedisTransport against a real server (`DURABLE_REDIS_URL`; skipped without it).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use durable_core::{QueueReason, QueuedRun, RunId};
use durable_transport::{Handled, RunHandler, Transport};
use durable_transport_redis::RedisTransport;
use durable_transport_redis::test_support::{Proxy, ScratchPrefix, url_or_skip};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

/// Long enough for a loaded machine; a test waits this long only when it fails.
const PATIENCE: Duration = Duration::from_secs(60);

fn item(run: &str) -> QueuedRun {
    QueuedRun {
        id: 0,
        run_id: RunId::from(run),
        reason: QueueReason::Start,
        namespace: None,
        priority: 0,
        dedupe_key: format!("start:{run}:0"),
    }
}

fn items(prefix: &str, n: usize) -> Vec<QueuedRun> {
    (0..n).map(|i| item(&format!("{prefix}{i}"))).collect()
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// What a handler was given, in order, with a counter to wait on.
struct Seen {
    items: Mutex<Vec<QueuedRun>>,
    count: watch::Sender<usize>,
}

impl Seen {
    fn new() -> Arc<Self> {
        Arc::new(Seen { items: Mutex::new(Vec::new()), count: watch::channel(0).0 })
    }

    fn push(&self, item: QueuedRun) {
        let n = {
            let mut items = self.items.lock();
            items.push(item);
            items.len()
        };
        self.count.send_replace(n);
    }

    async fn wait_for(&self, n: usize) {
        let mut rx = self.count.subscribe();
        within(&format!("{n} items"), rx.wait_for(|c| *c >= n)).await.expect("the sender lives in self");
    }

    fn runs(&self) -> Vec<String> {
        self.items.lock().iter().map(|i| i.run_id.as_str().to_owned()).collect()
    }
}

/// Records every item and is done with it.
struct Record(Arc<Seen>);

#[async_trait]
impl RunHandler for Record {
    async fn handle(&self, item: QueuedRun) -> Handled {
        self.0.push(item);
        Handled::Done
    }
}

/// Waits until `transport` holds no item (the last acknowledgements have landed).
async fn drained(transport: &RedisTransport) {
    within("an empty queue", async {
        while transport.queued().await.unwrap() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_item_is_delivered_once_and_leaves_the_queue() {
    let Some(url) = url_or_skip("every_item_is_delivered_once_and_leaves_the_queue") else { return };
    let scratch = ScratchPrefix::new(&url);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
    let sent = items("r", 50);
    for chunk in sent.chunks(7) {
        transport.dispatch_runs(Some("ns"), chunk.to_vec()).await.unwrap();
    }
    assert_eq!(transport.queued().await.unwrap(), 50);
    let seen = Seen::new();
    let consumer = transport.consume_runs(Some("ns".into()), 8, Arc::new(Record(seen.clone())));
    seen.wait_for(50).await;
    drained(&transport).await;
    consumer.stop().await;
    let got = seen.items.lock().clone();
    // At least once each (a lost acknowledgement may run an item again: the contract allows it).
    let runs: HashSet<_> = got.iter().map(|i| i.run_id.clone()).collect();
    assert_eq!(runs.len(), 50, "every item");
    assert_eq!(runs, sent.iter().map(|i| i.run_id.clone()).collect());
    // The fields travel: the namespace is the batch's, ids are distinct and non-zero.
    assert!(got.iter().all(|i| i.namespace.as_deref() == Some("ns") && i.reason == QueueReason::Start));
    assert_eq!(got.iter().map(|i| i.id).collect::<HashSet<_>>().len(), 50);
    assert!(got.iter().all(|i| i.id > 0));
    transport.destroy().await.unwrap();
    assert_eq!(scratch.key_count().await.unwrap(), 0, "destroy leaves no key behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedupe_key_sent_twice_is_delivered_once() {
    let Some(url) = url_or_skip("a_dedupe_key_sent_twice_is_delivered_once") else { return };
    let scratch = ScratchPrefix::new(&url);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
    // Twice in one batch, once more in another; a wake of the same run has another key.
    transport.dispatch_runs(None, vec![item("dup"), item("dup")]).await.unwrap();
    transport.dispatch_runs(None, vec![item("dup")]).await.unwrap();
    let mut wake = item("dup");
    wake.reason = QueueReason::Wake;
    wake.dedupe_key = "wake:dup:1".into();
    transport.dispatch_runs(None, vec![wake, item("last")]).await.unwrap();
    assert_eq!(transport.queued().await.unwrap(), 3);
    let seen = Seen::new();
    // One at a time, in stream order: once `last` is seen, everything sent before it was.
    let consumer = transport.consume_runs(None, 1, Arc::new(Record(seen.clone())));
    seen.wait_for(3).await;
    consumer.stop().await;
    assert_eq!(seen.runs(), ["dup", "dup", "last"]);
    let reasons: Vec<_> = seen.items.lock().iter().map(|i| i.reason).collect();
    assert_eq!(reasons, [QueueReason::Start, QueueReason::Wake, QueueReason::Start]);
    transport.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_500_goes_out_in_one_call_and_is_all_delivered() {
    let Some(url) = url_or_skip("a_batch_of_500_goes_out_in_one_call_and_is_all_delivered") else { return };
    let scratch = ScratchPrefix::new(&url);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
    let sent = items("big", 500);
    let started = Instant::now();
    transport.dispatch_runs(Some("bulk"), sent.clone()).await.unwrap();
    eprintln!("dispatched 500 items in {:?}", started.elapsed());
    assert_eq!(transport.queued().await.unwrap(), 500);
    // The same batch again: every key was sent already.
    transport.dispatch_runs(Some("bulk"), sent.clone()).await.unwrap();
    assert_eq!(transport.queued().await.unwrap(), 500);
    let seen = Seen::new();
    let consumer = transport.consume_runs(Some("bulk".into()), 64, Arc::new(Record(seen.clone())));
    seen.wait_for(500).await;
    drained(&transport).await;
    consumer.stop().await;
    let runs: HashSet<_> = seen.runs().into_iter().collect();
    assert_eq!(runs.len(), 500);
    assert_eq!(seen.items.lock().len(), 500);
    transport.destroy().await.unwrap();
}

/// Takes the first item it is given, says so, and hands it back once released.
struct HoldThenHandBack {
    taken: Arc<Seen>,
    release: Arc<Notify>,
}

#[async_trait]
impl RunHandler for HoldThenHandBack {
    async fn handle(&self, item: QueuedRun) -> Handled {
        self.taken.push(item);
        self.release.notified().await;
        Handled::HandBack
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_back_item_goes_to_another_consumer_at_once() {
    let Some(url) = url_or_skip("a_handed_back_item_goes_to_another_consumer_at_once") else { return };
    let scratch = ScratchPrefix::new(&url);
    // Redelivery after an hour: only the hand-back can explain a second delivery.
    let transport =
        RedisTransport::connect(&url, scratch.prefix()).await.unwrap().redeliver_after(Duration::from_secs(3600));
    let (taken, release) = (Seen::new(), Arc::new(Notify::new()));
    let first =
        transport.consume_runs(None, 4, Arc::new(HoldThenHandBack { taken: taken.clone(), release: release.clone() }));
    transport.dispatch_runs(None, vec![item("back")]).await.unwrap();
    taken.wait_for(1).await;
    // The first consumer stops (as an engine that drains), then hands back what it holds.
    first.stop().await;
    let seen = Seen::new();
    let second = transport.consume_runs(None, 4, Arc::new(Record(seen.clone())));
    release.notify_one();
    seen.wait_for(1).await;
    drained(&transport).await;
    second.stop().await;
    assert_eq!(taken.runs(), ["back"]);
    assert_eq!(seen.runs(), ["back"]);
    let again = seen.items.lock()[0].clone();
    assert_eq!((again.reason, again.dedupe_key.as_str()), (QueueReason::Start, "start:back:0"), "the same item");
    transport.destroy().await.unwrap();
}

/// Records every item; holds the one for run `held` until released.
struct RecordHoldingOne {
    seen: Arc<Seen>,
    release: Arc<Notify>,
}

#[async_trait]
impl RunHandler for RecordHoldingOne {
    async fn handle(&self, item: QueuedRun) -> Handled {
        let held = item.run_id.as_str() == "held";
        self.seen.push(item);
        if held {
            self.release.notified().await;
        }
        Handled::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_taken_by_a_claim_whose_reply_was_lost_is_started_at_the_consumers_next_look() {
    let Some(url) = url_or_skip("an_item_taken_by_a_claim_whose_reply_was_lost_is_started_at_the_consumers_next_look")
    else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    // Redelivery after an hour: within the test, only the consumer's look at its own pending
    // items (every 2 s) can start the lost one.
    let transport =
        RedisTransport::connect(&url, scratch.prefix()).await.unwrap().redeliver_after(Duration::from_secs(3600));
    let (seen, release) = (Seen::new(), Arc::new(Notify::new()));
    let consumer = transport.consume_runs(
        Some("ns".into()),
        4,
        Arc::new(RecordHoldingOne { seen: seen.clone(), release: release.clone() }),
    );
    // An item in hand, pending for this consumer all along: its next looks must leave it be.
    transport.dispatch_runs(Some("ns"), vec![item("held")]).await.unwrap();
    seen.wait_for(1).await;
    let stream = format!("{}:runs:ns", scratch.prefix());
    let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let consumers: Vec<Vec<redis::Value>> =
        redis::cmd("XINFO").arg("CONSUMERS").arg(&stream).arg("durable").query_async(&mut conn).await.unwrap();
    assert_eq!(consumers.len(), 1);
    let name: String = redis::from_redis_value(consumers[0][1].clone()).unwrap();
    // What a claim does when its reply never comes back: the item is added and delivered to
    // the consumer in one step (so the consumer cannot read it first), and never reaches it.
    let lost: u64 = redis::Script::new(
        "local id = redis.call('XADD', KEYS[1], '*', 'run_id', 'lost', 'reason', 'start', 'namespace', 'ns', \
         'priority', '0', 'dedupe_key', 'start:lost:0') \
         return #redis.call('XREADGROUP', 'GROUP', 'durable', ARGV[1], 'COUNT', 10, 'STREAMS', KEYS[1], '>')[1][2]",
    )
    .key(&stream)
    .arg(&name)
    .invoke_async(&mut conn)
    .await
    .unwrap();
    assert_eq!(lost, 1, "the item went to the consumer");
    seen.wait_for(2).await;
    assert_eq!(seen.runs(), ["held", "lost"], "the item in hand runs once");
    release.notify_one();
    drained(&transport).await;
    consumer.stop().await;
    assert_eq!(seen.runs(), ["held", "lost"]);
    transport.destroy().await.unwrap();
}

/// Takes an item and never finishes with it.
struct Hang(Arc<Seen>);

#[async_trait]
impl RunHandler for Hang {
    async fn handle(&self, item: QueuedRun) -> Handled {
        self.0.push(item);
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_never_acknowledged_goes_to_another_consumer_after_redeliver_after() {
    let Some(url) = url_or_skip("an_item_never_acknowledged_goes_to_another_consumer_after_redeliver_after") else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    let redeliver_after = Duration::from_secs(1);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap().redeliver_after(redeliver_after);
    let hung = Seen::new();
    // Free slots left: this consumer reclaims too, but never what its own handler still holds.
    let stuck = transport.consume_runs(Some("ns".into()), 4, Arc::new(Hang(hung.clone())));
    transport.dispatch_runs(Some("ns"), vec![item("stuck")]).await.unwrap();
    hung.wait_for(1).await;
    let taken_at = Instant::now();
    let seen = Seen::new();
    let rescuer = transport.consume_runs(Some("ns".into()), 4, Arc::new(Record(seen.clone())));
    seen.wait_for(1).await;
    assert!(taken_at.elapsed() >= redeliver_after - Duration::from_millis(100), "not before it idled long enough");
    drained(&transport).await;
    rescuer.stop().await;
    stuck.stop().await;
    assert_eq!(hung.runs(), ["stuck"]);
    assert_eq!(seen.runs(), ["stuck"]);
    transport.destroy().await.unwrap();
}

/// Panics on the first item it is given, records the ones after.
struct PanicOnce {
    /// When each call began.
    calls: Mutex<Vec<Instant>>,
    seen: Arc<Seen>,
}

#[async_trait]
impl RunHandler for PanicOnce {
    async fn handle(&self, item: QueuedRun) -> Handled {
        let first = {
            let mut calls = self.calls.lock();
            calls.push(Instant::now());
            calls.len() == 1
        };
        if first {
            panic!("a handler that panics (on purpose, in a test)");
        }
        self.seen.push(item);
        Handled::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_item_of_a_handler_that_panicked_comes_back_after_redeliver_after_even_to_a_lone_consumer() {
    let Some(url) =
        url_or_skip("the_item_of_a_handler_that_panicked_comes_back_after_redeliver_after_even_to_a_lone_consumer")
    else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    let redeliver_after = Duration::from_secs(1);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap().redeliver_after(redeliver_after);
    let seen = Seen::new();
    let handler = Arc::new(PanicOnce { calls: Mutex::new(Vec::new()), seen: seen.clone() });
    // One slot: the panic must give it back, or nothing more would run.
    let consumer = transport.consume_runs(None, 1, handler.clone());
    transport.dispatch_runs(None, vec![item("boom")]).await.unwrap();
    seen.wait_for(1).await;
    drained(&transport).await;
    consumer.stop().await;
    assert_eq!(seen.runs(), ["boom"]);
    // Not at the consumer's next look at its own pending items: only after redeliver_after.
    let calls = handler.calls.lock().clone();
    assert_eq!(calls.len(), 2);
    assert!(calls[1] - calls[0] >= redeliver_after, "taken back after {:?}", calls[1] - calls[0]);
    transport.destroy().await.unwrap();
}

/// Counts handlers running at once; each waits until `limit` of them ran at once (or it is
/// released), so a consumer that keeps its slots full shows it.
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    limit: usize,
    full: watch::Sender<bool>,
    done: Arc<Seen>,
}

#[async_trait]
impl RunHandler for Gauge {
    async fn handle(&self, item: QueuedRun) -> Handled {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        if now >= self.limit {
            self.full.send_replace(true);
        }
        let mut full = self.full.subscribe();
        let _ = full.wait_for(|f| *f).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.done.push(item);
        Handled::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_runs_exactly_its_concurrency_at_once_when_enough_items_wait() {
    let Some(url) = url_or_skip("a_consumer_runs_exactly_its_concurrency_at_once_when_enough_items_wait") else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    // Batches smaller than the limit: the slots fill over several reads.
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap().claim_batch(3);
    transport.dispatch_runs(None, items("c", 40)).await.unwrap();
    let limit = 5;
    let gauge = Arc::new(Gauge {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
        limit,
        full: watch::channel(false).0,
        done: Seen::new(),
    });
    let consumer = transport.consume_runs(None, limit, gauge.clone());
    gauge.done.wait_for(40).await;
    consumer.stop().await;
    assert_eq!(gauge.max.load(Ordering::SeqCst), limit, "never more than the limit, and the limit reached");
    assert_eq!(gauge.done.runs().into_iter().collect::<HashSet<_>>().len(), 40);
    transport.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_isolated_and_a_consumer_of_every_namespace_sees_them_all() {
    let Some(url) = url_or_skip("namespaces_are_isolated_and_a_consumer_of_every_namespace_sees_them_all") else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
    transport.dispatch_runs(Some("a"), vec![item("a1"), item("a2")]).await.unwrap();
    transport.dispatch_runs(Some("b"), vec![item("b1")]).await.unwrap();
    transport.dispatch_runs(None, vec![item("n1")]).await.unwrap();
    let (in_a, in_b) = (Seen::new(), Seen::new());
    let a = transport.consume_runs(Some("a".into()), 4, Arc::new(Record(in_a.clone())));
    let b = transport.consume_runs(Some("b".into()), 4, Arc::new(Record(in_b.clone())));
    in_a.wait_for(2).await;
    in_b.wait_for(1).await;
    // Each entry goes to one consumer: once the consumer of every namespace has the rest,
    // `a` and `b` had only theirs.
    let every = Seen::new();
    let all = transport.consume_runs(None, 4, Arc::new(Record(every.clone())));
    every.wait_for(1).await;
    // A namespace that did not exist when it started reaches it too.
    transport.dispatch_runs(Some("c"), vec![item("c1")]).await.unwrap();
    every.wait_for(2).await;
    drained(&transport).await;
    for consumer in [a, b, all] {
        consumer.stop().await;
    }
    let sorted = |seen: &Seen| {
        let mut runs = seen.runs();
        runs.sort();
        runs
    };
    assert_eq!(sorted(&in_a), ["a1", "a2"]);
    assert_eq!(sorted(&in_b), ["b1"]);
    assert_eq!(sorted(&every), ["c1", "n1"]);
    transport.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_of_priority_above_zero_are_read_before_the_others() {
    let Some(url) = url_or_skip("items_of_priority_above_zero_are_read_before_the_others") else { return };
    let scratch = ScratchPrefix::new(&url);
    let transport = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
    let urgent = |run: &str, priority| QueuedRun { priority, ..item(run) };
    let batch = vec![item("n1"), urgent("u1", 5), item("n2"), urgent("low", -1), urgent("u2", 1)];
    transport.dispatch_runs(Some("p"), batch.clone()).await.unwrap();
    transport.dispatch_runs(Some("q"), vec![item("q1"), urgent("qu", 9)]).await.unwrap();
    // One at a time: the order of delivery is the order of reading.
    let (in_p, every) = (Seen::new(), Seen::new());
    let p = transport.consume_runs(Some("p".into()), 1, Arc::new(Record(in_p.clone())));
    in_p.wait_for(5).await;
    p.stop().await;
    assert_eq!(in_p.runs(), ["u1", "u2", "n1", "n2", "low"], "urgent lane first, then stream order");
    let priorities: Vec<_> = in_p.items.lock().iter().map(|i| i.priority).collect();
    assert_eq!(priorities, [5, 1, 0, 0, -1]);
    let all = transport.consume_runs(None, 1, Arc::new(Record(every.clone())));
    every.wait_for(2).await;
    all.stop().await;
    assert_eq!(every.runs(), ["qu", "q1"]);
    transport.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_connection_fails_resumes_by_itself_when_the_server_is_back() {
    let Some(url) = url_or_skip("a_consumer_whose_connection_fails_resumes_by_itself_when_the_server_is_back") else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    let mut proxy = Proxy::start(&url).await;
    // The consumer goes through the proxy; the sender does not.
    let direct = RedisTransport::connect(&url, scratch.prefix()).await.unwrap();
    let through = RedisTransport::connect(proxy.url(), scratch.prefix()).await.unwrap();
    let seen = Seen::new();
    let consumer = through.consume_runs(Some("ns".into()), 4, Arc::new(Record(seen.clone())));
    direct.dispatch_runs(Some("ns"), vec![item("before")]).await.unwrap();
    seen.wait_for(1).await;
    drained(&direct).await;

    proxy.stop().await; // the server is gone for the consumer
    direct.dispatch_runs(Some("ns"), vec![item("during")]).await.unwrap();
    // Its claims fail now; let a few fail (they back off), then bring the server back.
    within("failing calls", async {
        let mut failing = 0;
        while failing < 3 {
            if through.queued().await.is_err() {
                failing += 1;
            }
        }
    })
    .await;
    assert_eq!(seen.runs(), ["before"]);
    proxy.restart().await;
    seen.wait_for(2).await;
    drained(&direct).await;
    consumer.stop().await;
    assert_eq!(seen.runs(), ["before", "during"]);
    direct.destroy().await.unwrap();
}

/// A server that cannot be reached is named in the error (its password hidden), and a blank
/// prefix is refused before connecting; the control plane says the same. No server needed.
#[tokio::test]
async fn connect_errors_name_the_server_and_blank_prefixes_are_refused() {
    use durable_transport_redis::RedisControlPlane;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("redis://:hunter2@127.0.0.1:{port}/0");
    let e = RedisTransport::connect(&url, "p").await.expect_err("nothing listens there").to_string();
    assert!(e.contains(&format!("could not connect to Redis at redis://:***@127.0.0.1:{port}/0")), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    let e = RedisControlPlane::connect(&url, "p").await.expect_err("nothing listens there").to_string();
    assert!(e.contains(&format!("127.0.0.1:{port}")) && !e.contains("hunter2"), "{e}");
    for blank in ["", " "] {
        let e = RedisTransport::connect(&url, blank).await.expect_err("blank prefix").to_string();
        assert!(e.contains("invalid Redis prefix"), "{e}");
        let e = RedisControlPlane::connect(&url, blank).await.expect_err("blank prefix").to_string();
        assert!(e.contains("invalid Redis prefix"), "{e}");
    }
    let e = RedisTransport::connect("http://127.0.0.1:6379", "p").await.expect_err("not a Redis URL").to_string();
    assert!(e.contains("could not connect to Redis at http://127.0.0.1:6379"), "{e}");
}
