//! The control plane on a real NATS server (DURABLE_NATS_URL; skipped without it).

mod common;

use std::sync::Arc;

use common::*;
use durable_core::{ControlMessage, ControlPlane, RunId};
use durable_transport_nats::NatsControlPlane;
use durable_transport_nats::test_support::{unique_prefix, url_or_skip};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// A sink recording every message.
#[derive(Default)]
struct Inbox {
    got: Mutex<Vec<ControlMessage>>,
    changed: Notify,
}

impl Inbox {
    fn sink(self: &Arc<Self>) -> durable_core::ControlSink {
        let inbox = self.clone();
        Arc::new(move |m| {
            inbox.got.lock().push(m);
            inbox.changed.notify_waiters();
        })
    }

    async fn wait_count(&self, n: usize) {
        wait_for(&format!("{n} control messages"), &self.changed, || self.got.lock().len() >= n).await;
    }
}

fn cancel(origin: &str, run: &str) -> ControlMessage {
    ControlMessage::Cancel { origin: origin.into(), run_id: RunId::from(run) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_on_one_plane_reaches_the_others_and_its_own() {
    let Some(url) = url_or_skip("a_message_published_on_one_plane_reaches_the_others_and_its_own") else { return };
    let prefix = unique_prefix("control");
    let (a, b) = (
        NatsControlPlane::connect(&url, &prefix).await.expect("connect a"),
        NatsControlPlane::connect(&url, &prefix).await.expect("connect b"),
    );
    assert_eq!(a.subject(), format!("{prefix}.control"));
    let (ia, ib) = (Arc::new(Inbox::default()), Arc::new(Inbox::default()));
    a.subscribe(ia.sink()).await.expect("subscribe a");
    b.subscribe(ib.sink()).await.expect("subscribe b");
    let sent = [
        cancel("a", "r1"),
        ControlMessage::Enqueued { origin: "a".into(), namespace: Some("ns".into()), queue: None },
        ControlMessage::Event { origin: "a".into(), event: serde_json::json!({"type": "RunSettled", "n": 1.5}) },
    ];
    for m in &sent {
        a.publish(m.clone()).await.expect("publish");
    }
    ib.wait_count(3).await;
    ia.wait_count(3).await;
    // In the order published.
    assert_eq!(*ib.got.lock(), sent);
    assert_eq!(*ia.got.lock(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_subject_is_dropped() {
    let Some(url) = url_or_skip("garbage_on_the_subject_is_dropped") else { return };
    let prefix = unique_prefix("garbage");
    let plane = NatsControlPlane::connect(&url, &prefix).await.expect("connect");
    let inbox = Arc::new(Inbox::default());
    plane.subscribe(inbox.sink()).await.expect("subscribe");
    let raw = async_nats::connect(&url).await.expect("a raw client");
    for junk in [&b"not json"[..], b"{\"kind\":\"from_the_future\"}", b"\xff\xfe", b""] {
        raw.publish(plane.subject().to_string(), junk.to_vec().into()).await.expect("publish junk");
    }
    raw.flush().await.expect("flush");
    // One publisher's messages arrive in order: once this one is in, the junk was seen.
    let good = cancel("raw", "r9");
    raw.publish(plane.subject().to_string(), good.encode().into()).await.expect("publish");
    inbox.wait_count(1).await;
    assert_eq!(*inbox.got.lock(), [good]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planes_of_two_prefixes_do_not_hear_each_other() {
    let Some(url) = url_or_skip("planes_of_two_prefixes_do_not_hear_each_other") else { return };
    let (p1, p2) = (unique_prefix("one"), unique_prefix("two"));
    let a = NatsControlPlane::connect(&url, &p1).await.expect("connect");
    let b = NatsControlPlane::connect(&url, &p2).await.expect("connect");
    let (ia, ib) = (Arc::new(Inbox::default()), Arc::new(Inbox::default()));
    a.subscribe(ia.sink()).await.expect("subscribe");
    b.subscribe(ib.sink()).await.expect("subscribe");
    b.publish(cancel("b", "other")).await.expect("publish");
    a.publish(cancel("a", "mine")).await.expect("publish");
    ia.wait_count(1).await;
    ib.wait_count(1).await;
    assert_eq!(*ia.got.lock(), [cancel("a", "mine")]);
    assert_eq!(*ib.got.lock(), [cancel("b", "other")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_ends_when_the_last_clone_is_dropped() {
    let Some(url) = url_or_skip("the_subscription_ends_when_the_last_clone_is_dropped") else { return };
    let prefix = unique_prefix("dropped");
    let plane = NatsControlPlane::connect(&url, &prefix).await.expect("connect");
    let clone = plane.clone();
    let inbox = Arc::new(Inbox::default());
    let sink = inbox.sink();
    let held = Arc::downgrade(&sink);
    plane.subscribe(sink).await.expect("subscribe");
    drop(plane);
    // A clone keeps it alive.
    clone.publish(cancel("x", "r")).await.expect("publish");
    inbox.wait_count(1).await;
    assert!(held.upgrade().is_some());
    drop(clone);
    // The task was aborted: it dropped the sink it held.
    poll_until("the subscription task to end", || {
        let gone = held.upgrade().is_none();
        async move { gone }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_all_keeps_its_order_and_an_oversized_message_is_dropped() {
    let Some(url) = url_or_skip("publish_all_keeps_its_order_and_an_oversized_message_is_dropped") else { return };
    let prefix = unique_prefix("batch");
    let (a, b) = (
        NatsControlPlane::connect(&url, &prefix).await.expect("connect a"),
        NatsControlPlane::connect(&url, &prefix).await.expect("connect b"),
    );
    let inbox = Arc::new(Inbox::default());
    b.subscribe(inbox.sink()).await.expect("subscribe");
    assert_eq!(b.subscribers(), 1);
    let huge = "x".repeat(a.client().max_payload() + 1);
    let oversized = ControlMessage::Event { origin: "a".into(), event: serde_json::json!({ "blob": huge }) };
    let batch: Vec<_> = (0..50).map(|i| cancel("a", &format!("r{i}"))).collect();
    let mut sent = batch.clone();
    sent.insert(10, oversized);
    a.publish_all(sent).await.expect("an oversized message is dropped, not refused");
    inbox.wait_count(50).await;
    assert_eq!(*inbox.got.lock(), batch);
}
