//! The control plane: small, best-effort messages between engine instances (and workers) that
//! share a store — engine events, cancel requests and "work was queued" nudges.
//!
//! Nothing durable travels here. Every message reports or hints at something the store (or the
//! run queue) already holds, so a lost message only delays what the pollers find anyway: an
//! event a subscriber on another instance misses, a cancel a turn sees at its next commit
//! instead of its next ctx call, a nudge the next poll makes up for.
//!
//! The trait is defined here, next to [`Store`](crate::Store) and [`RunQueue`](crate::RunQueue),
//! so a store crate can implement it over its own connection (PostgreSQL's `LISTEN/NOTIFY`)
//! without depending on a transport crate; `durable-transport` re-exports it and holds the
//! in-process implementation, the broker crates hold theirs.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::RunId;

/// One message on the control plane. Encoded as JSON on the wire ([`ControlMessage::encode`]);
/// a message that does not decode (a newer sender's variant) is dropped by the receiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ControlMessage {
    /// An engine event that happened on instance `origin`, as the runtime encodes it (JSON).
    /// Receivers re-emit it to their local subscribers, except the instance it came from.
    Event {
        /// The publishing instance's id.
        origin: String,
        /// The event, JSON-encoded by the runtime.
        event: serde_json::Value,
    },
    /// An operator cancelled `run_id` (the store holds the cancel already): an instance running
    /// a turn of it stops the turn at its next ctx call, a worker running one of its remote
    /// steps tells the handler (`TaskContext::cancelled`).
    Cancel {
        /// The publishing instance's id.
        origin: String,
        /// The cancelled run.
        run_id: RunId,
    },
    /// Work was queued: runs to execute (`queue: None`) or remote-step tasks on `queue`, of
    /// `namespace` (`None`: unknown). Consumers look now instead of at their next poll.
    Enqueued {
        /// The publishing instance's id.
        origin: String,
        /// The namespace of the queued work, when known.
        namespace: Option<String>,
        /// The task queue that received tasks; `None` for the run queue.
        queue: Option<String>,
    },
}

impl ControlMessage {
    /// The id of the instance that published the message.
    pub fn origin(&self) -> &str {
        match self {
            ControlMessage::Event { origin, .. }
            | ControlMessage::Cancel { origin, .. }
            | ControlMessage::Enqueued { origin, .. } => origin,
        }
    }

    /// The wire form: one line of JSON.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a control message always encodes")
    }

    /// Decodes the wire form; `None` for anything else (garbage, or a variant this version does
    /// not know), which receivers drop.
    pub fn decode(text: &str) -> Option<ControlMessage> {
        serde_json::from_str(text).ok()
    }
}

/// Receives every message a [`ControlPlane`] delivers. Called from the plane's listener task
/// (or, in process, from the publisher's): it must return quickly (hand the message on; never
/// block on I/O). A sink stays subscribed as long as the plane lives, so one whose receiver is
/// gone (an engine dropped, a worker stopped) should hold it weakly and do nothing.
pub type ControlSink = Arc<dyn Fn(ControlMessage) + Send + Sync>;

/// The subscribers of one plane, for implementations: [`ControlSinks::add`] from
/// [`ControlPlane::subscribe`], [`ControlSinks::deliver`] for each message received. Delivery
/// calls every sink in the order they subscribed, without holding the list's lock (a sink may
/// subscribe another). Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct ControlSinks {
    sinks: Mutex<Arc<Vec<ControlSink>>>,
}

impl fmt::Debug for ControlSinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlSinks").field("sinks", &self.len()).finish()
    }
}

impl ControlSinks {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sink: it receives every message delivered from now on.
    pub fn add(&self, sink: ControlSink) {
        let mut sinks = self.sinks.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = Vec::with_capacity(sinks.len() + 1);
        next.extend(sinks.iter().cloned());
        next.push(sink);
        *sinks = Arc::new(next);
    }

    /// How many sinks subscribed.
    pub fn len(&self) -> usize {
        self.sinks.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no sink subscribed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands `message` to every sink.
    pub fn deliver(&self, message: &ControlMessage) {
        let sinks = self.sinks.lock().unwrap_or_else(PoisonError::into_inner).clone();
        for sink in sinks.iter() {
            sink(message.clone());
        }
    }
}

/// What went wrong publishing on a control plane.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("control plane unavailable: {0}")]
pub struct ControlError(pub String);

/// Carries [`ControlMessage`]s between the instances sharing a store.
///
/// # Contract
/// - [`publish`](ControlPlane::publish) sends to every subscriber of every instance connected
///   to the same plane (this one's included), best effort: when it returns `Ok` the message was
///   handed to the backend; it may still be lost (a subscriber reconnecting).
/// - [`subscribe`](ControlPlane::subscribe) starts delivering to `sink` every message published
///   after it returns, until the plane (every clone of it) is dropped. A subscriber whose
///   connection drops reconnects on its own and reports the outage at most once a minute.
///   Must be called inside a tokio runtime. There is no unsubscribe: a sink outlives whoever
///   subscribed it (see [`ControlSink`]). A plane that can subscribe without waiting (no
///   round trip) should: the engine subscribes while it is built, and only a subscription
///   made then hears what is published as soon as `build` returns.
/// - Messages of one publisher arrive in the order it published them;
///   [`publish_all`](ControlPlane::publish_all) keeps the order of its batch.
/// - A message larger than the backend carries may be dropped (with a log line), not refused:
///   every message is a hint.
#[async_trait]
pub trait ControlPlane: Send + Sync + fmt::Debug + 'static {
    /// Sends a message to every subscriber.
    async fn publish(&self, message: ControlMessage) -> Result<(), ControlError>;

    /// Sends several messages, in order, as [`publish`](ControlPlane::publish) would one by one
    /// (the default does exactly that). A backend that can send a batch in one round trip
    /// overrides it; the engine hands its events and nudges over in batches. On an error some
    /// of the messages may have been sent.
    async fn publish_all(&self, messages: Vec<ControlMessage>) -> Result<(), ControlError> {
        for message in messages {
            self.publish(message).await?;
        }
        Ok(())
    }

    /// Delivers every message published from now on to `sink`.
    async fn subscribe(&self, sink: ControlSink) -> Result<(), ControlError>;
}

/// A shared plane is a plane: `Arc<dyn ControlPlane>` (what an engine hands out) goes wherever a
/// plane is asked for.
#[async_trait]
impl<T: ControlPlane + ?Sized> ControlPlane for Arc<T> {
    async fn publish(&self, message: ControlMessage) -> Result<(), ControlError> {
        (**self).publish(message).await
    }

    async fn publish_all(&self, messages: Vec<ControlMessage>) -> Result<(), ControlError> {
        (**self).publish_all(messages).await
    }

    async fn subscribe(&self, sink: ControlSink) -> Result<(), ControlError> {
        (**self).subscribe(sink).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_their_wire_form() {
        let messages = [
            ControlMessage::Event { origin: "a".into(), event: serde_json::json!({"type": "RunSettled"}) },
            ControlMessage::Cancel { origin: "a".into(), run_id: RunId::from("r1") },
            ControlMessage::Enqueued { origin: "b".into(), namespace: Some("ns".into()), queue: Some("q".into()) },
        ];
        for m in messages {
            assert_eq!(ControlMessage::decode(&m.encode()), Some(m.clone()));
        }
        assert_eq!(ControlMessage::decode("{\"kind\":\"from_the_future\"}"), None);
        assert_eq!(ControlMessage::decode("not json"), None);
    }

    #[test]
    fn sinks_receive_every_message_in_order_and_may_subscribe_while_delivering() {
        let sinks = Arc::new(ControlSinks::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, inner) = (seen.clone(), Arc::downgrade(&sinks));
        sinks.add(Arc::new(move |m: ControlMessage| {
            s.lock().unwrap().push(m.origin().to_string());
            // Subscribing from inside a delivery does not deadlock; the new sink gets the next one.
            if let Some(sinks) = inner.upgrade() {
                let s = s.clone();
                sinks.add(Arc::new(move |m: ControlMessage| s.lock().unwrap().push(format!("late {}", m.origin()))));
            }
        }));
        let msg = |o: &str| ControlMessage::Cancel { origin: o.into(), run_id: RunId::from("r") };
        sinks.deliver(&msg("a"));
        assert_eq!(sinks.len(), 2);
        sinks.deliver(&msg("b"));
        assert_eq!(*seen.lock().unwrap(), ["a", "b", "late b"]);
    }
}
