//! The control plane on Redis pub/sub.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_core::{ControlError, ControlMessage, ControlPlane, ControlSink};
use futures_util::StreamExt;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, PubSubSink, PubSubStream};
use tokio::task::JoinHandle;

use crate::keys::Keys;
use crate::outage::Outage;
use crate::transport::{RESPONSE_TIMEOUT, manager_config};

/// How often a subscriber pings the server, to find a connection that died silently (often in
/// this crate's own tests, so that they cross many pings).
const PING_EVERY: Duration = if cfg!(test) { Duration::from_millis(100) } else { Duration::from_secs(30) };

fn control_error(e: impl fmt::Display) -> ControlError {
    ControlError(format!("redis: {e}"))
}

/// The control plane on Redis pub/sub: messages published on channel `<prefix>:control` reach
/// every subscriber of every instance connected with the same prefix. Best effort, as the
/// [`ControlPlane`] contract says: a subscriber that is reconnecting misses what is published
/// meanwhile.
///
/// Cheap to clone; each [`subscribe`](ControlPlane::subscribe) opens a pub/sub connection of
/// its own, served by a task that ends when the last clone is dropped.
#[derive(Clone)]
pub struct RedisControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    conn: ConnectionManager,
    channel: String,
    subscribers: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.subscribers.get_mut().drain(..) {
            task.abort();
        }
    }
}

impl fmt::Debug for RedisControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisControlPlane")
            .field("channel", &self.inner.channel)
            .field("subscribers", &self.inner.subscribers.lock().len())
            .finish_non_exhaustive()
    }
}

impl RedisControlPlane {
    /// Connects to the server at `url` and uses channel `<prefix>:control` (the same prefix as
    /// the deployment's [`RedisTransport`](crate::RedisTransport), typically). Fails when the
    /// URL does not parse or the server cannot be reached now.
    pub async fn connect(url: &str, prefix: impl Into<String>) -> Result<Self, ControlError> {
        let prefix = prefix.into();
        crate::keys::check_prefix(&prefix).map_err(ControlError)?;
        let failed = |e| ControlError(crate::keys::connect_error(url, e));
        let client = redis::Client::open(url).map_err(failed)?;
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config(RESPONSE_TIMEOUT))
            .await
            .map_err(failed)?;
        let channel = Keys::new(prefix).control();
        Ok(RedisControlPlane { inner: Arc::new(Inner { client, conn, channel, subscribers: Mutex::new(Vec::new()) }) })
    }

    /// The pub/sub channel the messages travel on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }
}

#[async_trait]
impl ControlPlane for RedisControlPlane {
    async fn publish(&self, message: ControlMessage) -> Result<(), ControlError> {
        let mut conn = self.inner.conn.clone();
        redis::cmd("PUBLISH")
            .arg(&self.inner.channel)
            .arg(message.encode())
            .exec_async(&mut conn)
            .await
            .map_err(control_error)
    }

    async fn subscribe(&self, sink: ControlSink) -> Result<(), ControlError> {
        // The first subscription is made here, so every message published after this returns
        // is delivered; the task makes the later ones.
        let first = subscribed(&self.inner.client, &self.inner.channel).await.map_err(control_error)?;
        let task = tokio::spawn(listen(self.inner.client.clone(), self.inner.channel.clone(), sink, first));
        let mut subscribers = self.inner.subscribers.lock();
        subscribers.retain(|t| !t.is_finished());
        subscribers.push(task);
        Ok(())
    }
}

/// A new pub/sub connection, subscribed to `channel`.
async fn subscribed(client: &redis::Client, channel: &str) -> Result<(PubSubSink, PubSubStream), String> {
    let connect = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(pubsub.split())
    };
    match tokio::time::timeout(RESPONSE_TIMEOUT, connect).await {
        Ok(Ok(split)) => Ok(split),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {RESPONSE_TIMEOUT:?}")),
    }
}

/// Hands every message of the subscription to `sink`; resubscribes on a new connection when
/// the connection drops, for as long as the task lives.
async fn listen(client: redis::Client, channel: String, sink: ControlSink, first: (PubSubSink, PubSubStream)) {
    let mut failures = Outage::new("control plane subscriber");
    let mut current = Some(first);
    loop {
        let (mut pinger, mut messages) = match current.take() {
            Some(subscription) => subscription,
            None => match subscribed(&client, &channel).await {
                Ok(subscription) => {
                    failures.ok();
                    subscription
                }
                Err(e) => {
                    tokio::time::sleep(failures.failed(&e)).await;
                    continue;
                }
            },
        };
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        let lost = loop {
            tokio::select! {
                message = messages.next() => match message {
                    Some(message) => {
                        // Not text, or not a message this version knows: dropped.
                        if let Some(message) = message.get_payload::<String>().ok().and_then(|t| ControlMessage::decode(&t)) {
                            sink(message);
                        }
                    }
                    None => break "the connection closed".to_owned(),
                },
                _ = ping.tick() => {
                    match tokio::time::timeout(RESPONSE_TIMEOUT, pinger.ping::<redis::Value>()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => break e.to_string(),
                        Err(_) => break format!("no answer to a ping within {RESPONSE_TIMEOUT:?}"),
                    }
                }
            }
        };
        tokio::time::sleep(failures.failed(&lost)).await;
    }
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    use super::*;
    use crate::test_support::{ScratchPrefix, url_or_skip};
    use durable_core::RunId;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscription_keeps_receiving_across_its_pings() {
        let Some(url) = url_or_skip("a_subscription_keeps_receiving_across_its_pings") else { return };
        let scratch = ScratchPrefix::new(&url);
        let plane = RedisControlPlane::connect(&url, scratch.prefix()).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        plane.subscribe(Arc::new(move |m| drop(tx.send(m)))).await.unwrap();
        // A ping every 100 ms in this crate's tests: each round lets one or two go by. A ping
        // that broke the subscription would lose a message (it resubscribes on a new
        // connection), and the wait for it would time out.
        for i in 0..8 {
            let message = ControlMessage::Cancel { origin: "t".into(), run_id: RunId::from(format!("r{i}")) };
            plane.publish(message.clone()).await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("delivered");
            assert_eq!(got, Some(message));
            tokio::time::sleep(PING_EVERY + PING_EVERY / 2).await;
        }
    }
}
