//! The control plane over LISTEN/NOTIFY: two stores on one schema hear each other, in order, in
//! batches; another schema hears nothing; oversized messages are not sent; the listener comes
//! back after its connection is terminated.

use std::sync::Arc;
use std::time::Duration;

use durable_core::{ControlMessage, ControlPlane, RunId};
use durable_store_postgres::MAX_CONTROL_MESSAGE;
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);

fn cancel(origin: &str, run: &str) -> ControlMessage {
    ControlMessage::Cancel { origin: origin.into(), run_id: RunId::from(run) }
}

/// A sink that forwards every message into a channel.
async fn listen(plane: &dyn ControlPlane) -> mpsc::UnboundedReceiver<ControlMessage> {
    let (tx, rx) = mpsc::unbounded_channel();
    plane.subscribe(Arc::new(move |m| drop(tx.send(m)))).await.unwrap();
    rx
}

async fn next(rx: &mut mpsc::UnboundedReceiver<ControlMessage>) -> ControlMessage {
    tokio::time::timeout(WAIT, rx.recv()).await.expect("a message in time").expect("open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planes_on_one_schema_hear_each_other_in_order_and_no_other_schema_does() {
    let Some(url) = url_or_skip("planes_on_one_schema_hear_each_other_in_order_and_no_other_schema_does") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "control").await.unwrap();
    let (a, b) = (scratch.connect().await.unwrap(), scratch.connect().await.unwrap());
    let (plane_a, plane_b) = (a.control_plane().await.unwrap(), b.control_plane().await.unwrap());
    assert_eq!(plane_a.channel(), format!("{}:control", scratch.name()));
    let other_scratch = ScratchSchema::new(&url, "control_other").await.unwrap();
    let other = other_scratch.connect().await.unwrap().control_plane().await.unwrap();
    let (mut at_a, mut at_b, mut at_other) = (listen(&plane_a).await, listen(&plane_b).await, listen(&other).await);

    // One batch, one statement: every listener on the schema (the sender's too) hears all of it,
    // in order.
    let batch: Vec<ControlMessage> = (0..50).map(|i| cancel("a", &format!("r{i}"))).collect();
    plane_a.publish_all(batch.clone()).await.unwrap();
    for expected in &batch {
        assert_eq!(&next(&mut at_b).await, expected);
        assert_eq!(&next(&mut at_a).await, expected);
    }
    // A message too large for NOTIFY is left out of its batch; the rest goes.
    let big = ControlMessage::Event {
        origin: "b".into(),
        event: serde_json::json!({ "type": "RunBlocked", "message": "x".repeat(MAX_CONTROL_MESSAGE) }),
    };
    let small = ControlMessage::Enqueued { origin: "b".into(), namespace: Some("ns".into()), queue: Some("q".into()) };
    plane_b.publish_all(vec![big.clone(), small.clone()]).await.unwrap();
    plane_b.publish(big).await.unwrap();
    assert_eq!(next(&mut at_a).await, small);
    // The other schema's plane heard nothing: its own message is the first it gets.
    other.publish(cancel("o", "mine")).await.unwrap();
    assert_eq!(next(&mut at_other).await, cancel("o", "mine"));
    // A second call returns the same plane (one listener per store).
    let again = a.control_plane().await.unwrap();
    let mut at_again = listen(&again).await;
    plane_b.publish(cancel("b", "later")).await.unwrap();
    assert_eq!(next(&mut at_again).await, cancel("b", "later"));
    assert_eq!(next(&mut at_a).await, cancel("b", "later"));
    assert!(at_a.try_recv().is_err(), "nothing else: the big one was not sent");

    // The listeners' connections are terminated: they reconnect, and messages flow again.
    assert!(scratch.terminate_backends().await.unwrap() >= 2);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        // The publisher's pool replaces its broken connection; a message published before the
        // listener is back is lost (best effort), so publish until one arrives.
        let _ = plane_b.publish(cancel("b", "after")).await;
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), at_a.recv()).await {
            assert_eq!(m, cancel("b", "after"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the listener reconnects");
    }
}
