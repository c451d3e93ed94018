//! RedisControlPlane against a real server (`DURABLE_REDIS_URL`; skipped without it).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use durable_core::{ControlMessage, ControlPlane, RunId};
use durable_transport_redis::RedisControlPlane;
use durable_transport_redis::test_support::{Proxy, ScratchPrefix, url_or_skip};
use tokio::sync::mpsc;

/// Long enough for a loaded machine; a test waits this long only when it fails.
const PATIENCE: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

fn cancel(run: &str) -> ControlMessage {
    ControlMessage::Cancel { origin: "one".into(), run_id: RunId::from(run) }
}

/// Subscribes a sink that forwards to a channel.
async fn subscribe(plane: &RedisControlPlane) -> mpsc::UnboundedReceiver<ControlMessage> {
    let (tx, rx) = mpsc::unbounded_channel();
    plane.subscribe(Arc::new(move |m| drop(tx.send(m)))).await.unwrap();
    rx
}

async fn next(rx: &mut mpsc::UnboundedReceiver<ControlMessage>) -> ControlMessage {
    within("a message", rx.recv()).await.expect("the sink lives as long as the plane")
}

/// The number of subscribers of `channel` on the server.
async fn subscribers(url: &str, channel: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (_, n): (String, u64) = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(&mut conn).await.unwrap();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_on_one_plane_reaches_the_sink_of_another_in_order() {
    let Some(url) = url_or_skip("a_message_published_on_one_plane_reaches_the_sink_of_another_in_order") else {
        return;
    };
    let scratch = ScratchPrefix::new(&url);
    let (one, two) = (
        RedisControlPlane::connect(&url, scratch.prefix()).await.unwrap(),
        RedisControlPlane::connect(&url, scratch.prefix()).await.unwrap(),
    );
    let other = RedisControlPlane::connect(&url, format!("{}_other", scratch.prefix())).await.unwrap();
    let mut at_two = subscribe(&two).await;
    let mut at_one = subscribe(&one).await;
    let mut elsewhere = subscribe(&other).await;
    let messages = vec![
        ControlMessage::Event { origin: "one".into(), event: serde_json::json!({"type": "RunSettled", "n": 1}) },
        cancel("r-9"),
        ControlMessage::Enqueued { origin: "one".into(), namespace: Some("ns".into()), queue: None },
    ];
    for m in &messages {
        one.publish(m.clone()).await.unwrap();
    }
    for m in &messages {
        assert_eq!(&next(&mut at_two).await, m);
        assert_eq!(&next(&mut at_one).await, m, "the publisher's own subscribers get it too");
    }
    // Another prefix is another deployment: its subscriber sees only what is published there.
    other.publish(cancel("mine")).await.unwrap();
    assert_eq!(next(&mut elsewhere).await, cancel("mine"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_channel_is_dropped() {
    let Some(url) = url_or_skip("garbage_on_the_channel_is_dropped") else { return };
    let scratch = ScratchPrefix::new(&url);
    let plane = RedisControlPlane::connect(&url, scratch.prefix()).await.unwrap();
    let mut rx = subscribe(&plane).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for garbage in [&b"not json"[..], br#"{"kind":"from_the_future"}"#, b"\xff\xfe"] {
        redis::cmd("PUBLISH").arg(plane.channel()).arg(garbage).exec_async(&mut conn).await.unwrap();
    }
    plane.publish(cancel("after")).await.unwrap();
    // Messages of one publisher arrive in order: had the garbage got through, it came first.
    assert_eq!(next(&mut rx).await, cancel("after"));
    assert!(rx.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_whose_connection_drops_resubscribes_by_itself() {
    let Some(url) = url_or_skip("a_subscriber_whose_connection_drops_resubscribes_by_itself") else { return };
    let scratch = ScratchPrefix::new(&url);
    let mut proxy = Proxy::start(&url).await;
    let publisher = RedisControlPlane::connect(&url, scratch.prefix()).await.unwrap();
    let subscriber = RedisControlPlane::connect(proxy.url(), scratch.prefix()).await.unwrap();
    let mut rx = subscribe(&subscriber).await;
    publisher.publish(cancel("before")).await.unwrap();
    assert_eq!(next(&mut rx).await, cancel("before"));

    proxy.stop().await;
    within("the subscription to drop", async {
        while subscribers(&url, subscriber.channel()).await > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    proxy.restart().await;
    // Messages published while it resubscribes are lost (best effort): publish until one
    // arrives.
    let arrived = within("a message after the outage", async {
        loop {
            publisher.publish(cancel("after")).await.unwrap();
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
                return m;
            }
        }
    })
    .await;
    assert_eq!(arrived, cancel("after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_ends_when_every_clone_of_the_plane_is_dropped() {
    let Some(url) = url_or_skip("the_subscription_ends_when_every_clone_of_the_plane_is_dropped") else { return };
    let scratch = ScratchPrefix::new(&url);
    let plane = RedisControlPlane::connect(&url, scratch.prefix()).await.unwrap();
    let channel = plane.channel().to_owned();
    let _rx = subscribe(&plane).await;
    let _rx2 = subscribe(&plane).await;
    assert_eq!(subscribers(&url, &channel).await, 2);
    let clone = plane.clone();
    drop(plane);
    assert_eq!(subscribers(&url, &channel).await, 2, "a clone keeps them");
    drop(clone);
    within("the subscriptions to end", async {
        while subscribers(&url, &channel).await > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}
