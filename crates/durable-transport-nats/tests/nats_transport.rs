//! The run queue on a real NATS server (DURABLE_NATS_URL; skipped without it).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use durable_core::QueueReason;
use durable_transport::{Handled, RunHandler, Transport};
use durable_transport_nats::test_support::url_or_skip;
use parking_lot::Mutex;
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_item_reaches_exactly_one_of_two_instances_with_its_fields() {
    let Some(url) = url_or_skip("every_item_reaches_exactly_one_of_two_instances_with_its_fields") else { return };
    let (a, prefix) = fresh(&url, "every").await;
    let b = instance(&url, &prefix).await;
    let (ra, rb) = (Recorder::new(), Recorder::new());
    let ca = a.consume_runs(None, 4, ra.clone());
    let cb = b.consume_runs(None, 4, rb.clone());
    let mut batch = items("r", 20);
    batch[3].reason = QueueReason::Wake;
    batch[3].namespace = Some("ns".into());
    batch[3].dedupe_key = "wake:r3:9@owner#12".into();
    a.dispatch_runs(None, batch).await.expect("dispatch");

    wait_total(&[&ra, &rb], 20).await;
    ca.stop().await;
    cb.stop().await;

    let mut all: Vec<_> = ra.seen.lock().iter().chain(rb.seen.lock().iter()).cloned().collect();
    all.sort_by(|x, y| x.run_id.cmp(&y.run_id));
    let ids: BTreeSet<_> = all.iter().map(|i| i.run_id.as_str().to_string()).collect();
    assert_eq!(all.len(), 20, "each item exactly once");
    assert_eq!(ids.len(), 20);
    let r3 = all.iter().find(|i| i.run_id.as_str() == "r3").expect("r3");
    assert_eq!(r3.reason, QueueReason::Wake);
    assert_eq!(r3.namespace.as_deref(), Some("ns"));
    assert_eq!(r3.dedupe_key, "wake:r3:9@owner#12");
    // The queue id is the stream sequence: distinct and non-zero.
    let seqs: BTreeSet<_> = all.iter().map(|i| i.id).collect();
    assert_eq!(seqs.len(), 20);
    assert!(!seqs.contains(&0));
    // Acked items leave the work queue.
    poll_until("the stream to empty", || async { a.queued().await.expect("queued") == 0 }).await;
    a.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_sent_twice_under_one_dedupe_key_is_delivered_once() {
    let Some(url) = url_or_skip("an_item_sent_twice_under_one_dedupe_key_is_delivered_once") else { return };
    let (t, _) = fresh(&url, "dedupe").await;
    // Twice in one batch, once more in another.
    t.dispatch_runs(None, vec![item("a"), item("a")]).await.expect("dispatch");
    t.dispatch_runs(None, vec![item("a")]).await.expect("dispatch again");
    assert_eq!(t.queued().await.expect("queued"), 1, "JetStream kept one copy");
    // A sentinel behind it: one consumer with one slot takes items in stream order, so once
    // the sentinel arrives every copy of `a` that was stored has been delivered.
    t.dispatch_runs(None, vec![item("sentinel")]).await.expect("dispatch");
    let r = Recorder::new();
    let c = t.consume_runs(None, 1, r.clone());
    wait_for("the sentinel", &r.changed, || r.runs().contains(&"sentinel".to_string())).await;
    c.stop().await;
    assert_eq!(r.runs(), ["a", "sentinel"]);
    t.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_500_arrives_whole() {
    let Some(url) = url_or_skip("a_batch_of_500_arrives_whole") else { return };
    let (t, prefix) = fresh(&url, "burst").await;
    let batch = items("b", 500);
    let started = Instant::now();
    t.dispatch_runs(Some("ns"), batch).await.expect("dispatch 500");
    eprintln!("dispatching 500 items took {:?}", started.elapsed());
    assert_eq!(t.queued().await.expect("queued"), 500);
    let other = instance(&url, &prefix).await;
    let (r1, r2) = (Recorder::new(), Recorder::new());
    let c1 = t.consume_runs(Some("ns".into()), 64, r1.clone());
    let c2 = other.consume_runs(Some("ns".into()), 64, r2.clone());
    wait_total(&[&r1, &r2], 500).await;
    c1.stop().await;
    c2.stop().await;
    let mut runs = r1.runs();
    runs.extend(r2.runs());
    let distinct: BTreeSet<_> = runs.iter().cloned().collect();
    assert_eq!((runs.len(), distinct.len()), (500, 500));
    assert!(r1.seen.lock().iter().chain(r2.seen.lock().iter()).all(|i| i.namespace.as_deref() == Some("ns")));
    t.delete().await.expect("delete");
}

/// Hands back every item until `go` is notified... then hands back at once.
struct HandBack {
    seen: Mutex<Vec<u64>>,
    changed: Notify,
    go: Notify,
}

#[async_trait::async_trait]
impl RunHandler for HandBack {
    async fn handle(&self, item: durable_core::QueuedRun) -> Handled {
        let first = {
            let mut seen = self.seen.lock();
            seen.push(item.id);
            seen.len() == 1
        };
        self.changed.notify_waiters();
        if first {
            self.go.notified().await; // the test starts the other consumer meanwhile
        }
        Handled::HandBack
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_handed_back_goes_to_another_instance_at_once() {
    let Some(url) = url_or_skip("an_item_handed_back_goes_to_another_instance_at_once") else { return };
    let (a, prefix) = fresh(&url, "handback").await;
    // A redelivery after the ack wait would take an hour: only the NAK explains a quick one.
    let a = a.redeliver_after(Duration::from_secs(3600));
    let b = instance(&url, &prefix).await.redeliver_after(Duration::from_secs(3600));
    let draining = Arc::new(HandBack { seen: Mutex::new(Vec::new()), changed: Notify::new(), go: Notify::new() });
    let ca = a.consume_runs(None, 1, draining.clone());
    a.dispatch_runs(None, vec![item("x")]).await.expect("dispatch");
    wait_for("the first delivery", &draining.changed, || !draining.seen.lock().is_empty()).await;
    let r = Recorder::new();
    let cb = b.consume_runs(None, 1, r.clone());
    draining.go.notify_one();
    wait_for("the handed-back item at the other instance", &r.changed, || r.count() == 1).await;
    ca.stop().await;
    cb.stop().await;
    assert_eq!(r.runs(), ["x"]);
    assert_eq!(r.seen.lock()[0].id, draining.seen.lock()[0], "the same message");
    a.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_nobody_answers_goes_to_another_instance_after_redeliver_after() {
    let Some(url) = url_or_skip("an_item_nobody_answers_goes_to_another_instance_after_redeliver_after") else {
        return;
    };
    let (a, prefix) = fresh(&url, "hang").await;
    let a = a.redeliver_after(Duration::from_secs(1)).poll_interval(Duration::from_millis(200));
    let b =
        instance(&url, &prefix).await.redeliver_after(Duration::from_secs(1)).poll_interval(Duration::from_millis(200));
    let hung = Arc::new(Hang::default());
    // One slot, taken for good by the hung handler: A fetches nothing more.
    let ca = a.consume_runs(None, 1, hung.clone());
    a.dispatch_runs(None, vec![item("stuck")]).await.expect("dispatch");
    wait_for("the first delivery", &hung.changed, || !hung.seen.lock().is_empty()).await;
    let delivered_at = Instant::now();
    let r = Recorder::new();
    let cb = b.consume_runs(None, 1, r.clone());
    r.wait_count(1).await;
    eprintln!("redelivered after {:?}", delivered_at.elapsed());
    assert!(delivered_at.elapsed() >= Duration::from_millis(900), "not before the ack wait");
    assert_eq!(r.runs(), ["stuck"]);
    assert_eq!(r.seen.lock()[0].id, hung.seen.lock()[0].id);
    cb.stop().await;
    drop(ca); // its handler never returns; dropping the consumer stops its loop
    a.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_runs_exactly_its_concurrency_at_most() {
    let Some(url) = url_or_skip("a_consumer_runs_exactly_its_concurrency_at_most") else { return };
    let (t, _) = fresh(&url, "limit").await;
    let limit = 4;
    t.dispatch_runs(None, items("c", 40)).await.expect("dispatch");
    // A small claim batch too: the limit holds across fetches.
    let t = t.claim_batch(3);
    let gauge = Gauge::new(limit);
    let c = t.consume_runs(None, limit, gauge.clone());
    wait_for("40 handled", &gauge.changed, || gauge.done.load(Ordering::SeqCst) == 40).await;
    c.stop().await;
    assert_eq!(gauge.max.load(Ordering::SeqCst), limit, "reached the limit and never passed it");
    t.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_of_one_namespace_sees_none_of_another() {
    let Some(url) = url_or_skip("a_consumer_of_one_namespace_sees_none_of_another") else { return };
    let (t, prefix) = fresh(&url, "ns").await;
    let other = instance(&url, &prefix).await;
    // Namespaces a subject token could confuse: dots, wildcards, spaces.
    let (na, nb) = ("a.b", "a.*");
    let (ra, rb) = (Recorder::new(), Recorder::new());
    let ca = t.consume_runs(Some(na.into()), 8, ra.clone());
    let cb = other.consume_runs(Some(nb.into()), 8, rb.clone());
    t.dispatch_runs(Some(na), items("a", 5)).await.expect("dispatch a");
    t.dispatch_runs(Some(nb), items("b", 7)).await.expect("dispatch b");
    ra.wait_count(5).await;
    rb.wait_count(7).await;
    // And one more each, behind: nothing of the other's can be in flight unseen.
    t.dispatch_runs(Some(na), vec![item("a-last")]).await.expect("dispatch");
    t.dispatch_runs(Some(nb), vec![item("b-last")]).await.expect("dispatch");
    ra.wait_count(6).await;
    rb.wait_count(8).await;
    ca.stop().await;
    cb.stop().await;
    assert!(ra.runs().iter().all(|r| r.starts_with('a')), "{:?}", ra.runs());
    assert!(rb.runs().iter().all(|r| r.starts_with('b')), "{:?}", rb.runs());
    assert!(ra.seen.lock().iter().all(|i| i.namespace.as_deref() == Some(na)));
    assert!(rb.seen.lock().iter().all(|i| i.namespace.as_deref() == Some(nb)));
    assert_eq!((ra.count(), rb.count()), (6, 8));
    t.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_items_are_taken_before_the_others() {
    let Some(url) = url_or_skip("priority_items_are_taken_before_the_others") else { return };
    let (t, _) = fresh(&url, "prio").await;
    let mut batch = items("n", 5);
    for (i, p) in [(7, 5), (8, 1), (9, 3)] {
        let mut it = item(&format!("p{i}"));
        it.priority = p;
        batch.push(it);
    }
    batch[0].priority = -2; // below 0 counts as 0
    t.dispatch_runs(None, batch).await.expect("dispatch");
    let r = Recorder::new();
    // One slot: items are handled one after another, in the order the consumer takes them.
    let c = t.consume_runs(None, 1, r.clone());
    r.wait_count(8).await;
    c.stop().await;
    assert_eq!(r.runs(), ["p7", "p8", "p9", "n0", "n1", "n2", "n3", "n4"]);
    let priorities: BTreeMap<_, _> =
        r.seen.lock().iter().map(|i| (i.run_id.as_str().to_string(), i.priority)).collect();
    assert_eq!(priorities["p7"], 5);
    assert_eq!(priorities["n0"], -2);
    t.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_started_later_gets_what_was_sent_before() {
    let Some(url) = url_or_skip("a_consumer_started_later_gets_what_was_sent_before") else { return };
    let (t, prefix) = fresh(&url, "later").await;
    t.dispatch_runs(Some("ns"), items("e", 3)).await.expect("dispatch");
    let late = instance(&url, &prefix).await;
    let r = Recorder::new();
    let c = late.consume_runs(Some("ns".into()), 2, r.clone());
    r.wait_count(3).await;
    c.stop().await;
    t.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_stops_fetching_and_items_in_hand_finish() {
    let Some(url) = url_or_skip("stop_stops_fetching_and_items_in_hand_finish") else { return };
    let (t, _) = fresh(&url, "stop").await;
    let r = Recorder::new();
    let c = t.consume_runs(None, 2, r.clone());
    t.dispatch_runs(None, vec![item("before")]).await.expect("dispatch");
    r.wait_count(1).await;
    c.stop().await;
    t.dispatch_runs(None, vec![item("after")]).await.expect("dispatch");
    // Still in the stream: nobody took it. (A stopped consumer's loop has ended when `stop`
    // returns, so this is not a race.)
    assert_eq!(t.queued().await.expect("queued"), 1);
    assert_eq!(r.runs(), ["before"]);
    t.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_prefixes_are_refused() {
    let Some(url) = url_or_skip("invalid_prefixes_are_refused") else { return };
    for bad in ["", "a b", "a.>", "a..b"] {
        assert!(durable_transport_nats::NatsTransport::connect(&url, bad).await.is_err(), "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_instances_starting_at_once_share_one_stream() {
    let Some(url) = url_or_skip("many_instances_starting_at_once_share_one_stream") else { return };
    let prefix = durable_transport_nats::test_support::unique_prefix("race");
    let starts = (0..8).map(|_| {
        let (url, prefix) = (url.clone(), prefix.clone());
        tokio::spawn(async move { durable_transport_nats::NatsTransport::connect(&url, &prefix).await })
    });
    let mut transports = Vec::new();
    for start in starts {
        transports.push(start.await.expect("task").expect("connect"));
    }
    transports[0].dispatch_runs(None, vec![item("one")]).await.expect("dispatch");
    assert_eq!(transports[7].queued().await.expect("queued"), 1);
    transports[0].delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_is_a_work_queue_with_the_options_it_was_created_with() {
    let Some(url) = url_or_skip("the_stream_is_a_work_queue_with_the_options_it_was_created_with") else { return };
    let prefix = durable_transport_nats::test_support::unique_prefix("options");
    let options = durable_transport_nats::StreamOptions::new()
        .dedupe_window(Duration::from_secs(30))
        .max_age(Duration::from_secs(600))
        .memory(true);
    let t = durable_transport_nats::NatsTransport::connect_with(&url, &prefix, options).await.expect("connect");
    assert_eq!(t.stream_name(), format!("{}_RUNS", prefix.to_uppercase()));
    let js = async_nats::jetstream::new(t.client().clone());
    let mut stream = js.get_stream(t.stream_name()).await.expect("the stream");
    let config = stream.info().await.expect("stream info").config.clone();
    use async_nats::jetstream::stream::{RetentionPolicy, StorageType};
    assert_eq!(config.retention, RetentionPolicy::WorkQueue);
    assert_eq!(config.storage, StorageType::Memory);
    assert_eq!(config.duplicate_window, Duration::from_secs(30));
    assert_eq!(config.max_age, Duration::from_secs(600));
    assert_eq!(config.subjects, [format!("{prefix}.prio.>"), format!("{prefix}.runs.>")]);
    // Another instance with other options uses the stream as it is.
    let again = durable_transport_nats::NatsTransport::connect(&url, &prefix).await.expect("connect again");
    again.dispatch_runs(None, vec![item("x")]).await.expect("dispatch");
    assert_eq!(t.queued().await.expect("queued"), 1);
    t.delete().await.expect("delete");
    // Deleting twice is fine.
    t.delete().await.expect("delete again");
}

/// Prefixes that differ only in case or punctuation map to one stream name: the second is
/// refused at connect, naming both sets of subjects, instead of publishing to subjects no
/// stream captures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_whose_stream_name_is_taken_by_another_prefix_is_refused() {
    let Some(url) = url_or_skip("a_prefix_whose_stream_name_is_taken_by_another_prefix_is_refused") else { return };
    let prefix = durable_transport_nats::test_support::unique_prefix("clash");
    let first = durable_transport_nats::NatsTransport::connect(&url, &prefix).await.expect("connect");
    for other in [prefix.to_uppercase(), prefix.replace('_', "-")] {
        assert_eq!(names_stream(&other), first.stream_name(), "{other} maps to the same stream");
        let Err(e) = durable_transport_nats::NatsTransport::connect(&url, &other).await else {
            panic!("{other}: connected to another prefix's stream")
        };
        let message = e.to_string();
        assert!(message.contains("another prefix maps to the same stream name"), "{message}");
        assert!(
            message.contains(&format!("{prefix}.runs.>")) && message.contains(&format!("{other}.runs.>")),
            "{message}"
        );
    }
    first.dispatch_runs(None, vec![item("x")]).await.expect("dispatch");
    assert_eq!(first.queued().await.expect("queued"), 1, "the first prefix is unaffected");
    first.delete().await.expect("delete");
}

/// The stream name of a prefix, as the crate documents it: letters and digits upper-cased, any
/// other character `_`, then `_RUNS`.
fn names_stream(prefix: &str) -> String {
    let part: String =
        prefix.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("{part}_RUNS")
}
