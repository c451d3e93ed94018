//! Control planes: the in-process one, and run-queue wake-ups fed from any plane.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use durable_core::{ControlError, ControlMessage, ControlPlane, ControlSink, ControlSinks};
use tokio::sync::Notify;

use crate::wakeups::{WakeupFuture, Wakeups};

/// A [`ControlPlane`] inside one process: `publish` hands the message to every subscriber
/// before it returns, on the publisher's task (subscribers only hand messages on, so this is
/// quick). Clones share the plane: give clones to the engines (and workers) of one process
/// that should hear each other, as tests with several engines do. Nothing leaves the process.
///
/// It is the engine's default: an engine built without a plane gets one of its own, which the
/// workers running beside it share (`WorkerBuilder::engine` in `durable-runtime`).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use durable_core::RunId;
/// use durable_transport::{ControlMessage, ControlPlane, InProcessControlPlane};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let plane = InProcessControlPlane::new();
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let s = seen.clone();
/// plane.clone().subscribe(Arc::new(move |m: ControlMessage| s.lock().unwrap().push(m))).await.unwrap();
/// let cancel = ControlMessage::Cancel { origin: "engine-a".into(), run_id: RunId::from("order:42") };
/// plane.publish(cancel.clone()).await.unwrap();
/// assert_eq!(*seen.lock().unwrap(), [cancel]);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct InProcessControlPlane {
    sinks: Arc<ControlSinks>,
}

impl fmt::Debug for InProcessControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessControlPlane").field("subscribers", &self.sinks.len()).finish()
    }
}

impl InProcessControlPlane {
    /// A new plane with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many sinks subscribed (over every clone).
    pub fn subscribers(&self) -> usize {
        self.sinks.len()
    }
}

#[async_trait]
impl ControlPlane for InProcessControlPlane {
    async fn publish(&self, message: ControlMessage) -> Result<(), ControlError> {
        self.sinks.deliver(&message);
        Ok(())
    }

    async fn publish_all(&self, messages: Vec<ControlMessage>) -> Result<(), ControlError> {
        for message in &messages {
            self.sinks.deliver(message);
        }
        Ok(())
    }

    async fn subscribe(&self, sink: ControlSink) -> Result<(), ControlError> {
        self.sinks.add(sink);
        Ok(())
    }
}

/// Run-queue wake-ups from a control plane: a [`Wakeups`] source for
/// [`QueueTransport::with_wakeups`](crate::QueueTransport::with_wakeups) that nudges the
/// consumer each time an engine announces runs it queued (`ControlMessage::Enqueued` with no
/// task queue) in the consumer's namespace, or of an unknown one. Engines built with a control
/// plane announce every batch they send to the run queue (coalesced).
///
/// Useful where the store has no wake-ups of its own (several processes on one SQLite file,
/// with a broker's plane); on PostgreSQL, `PostgresStore::queue_wakeups` does the same from the
/// store's own `NOTIFY`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use durable_store_memory::MemoryStore;
/// use durable_transport::{ControlWakeups, InProcessControlPlane, QueueTransport};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let plane = InProcessControlPlane::new();
/// let transport = QueueTransport::new(Arc::new(MemoryStore::new()))
///     .poll_interval(Duration::from_secs(2)) // the safety net only
///     .with_wakeups(ControlWakeups::subscribe(&plane, None).await.unwrap());
/// # let _ = transport;
/// # }
/// ```
#[derive(Debug)]
pub struct ControlWakeups {
    notify: Arc<Notify>,
}

impl ControlWakeups {
    /// Subscribes to `plane` for runs queued in `namespace` (`None`: every namespace; use the
    /// namespace the consumer serves). The subscription lasts as long as the plane; once this
    /// value is dropped it costs one check per message.
    ///
    /// # Errors
    /// The plane's, if it cannot subscribe.
    pub async fn subscribe(plane: &dyn ControlPlane, namespace: Option<String>) -> Result<Self, ControlError> {
        let notify = Arc::new(Notify::new());
        let weak = Arc::downgrade(&notify);
        let sink: ControlSink = Arc::new(move |message| {
            if let ControlMessage::Enqueued { queue: None, namespace: queued, .. } = message {
                let ours = match (&namespace, &queued) {
                    (Some(mine), Some(theirs)) => mine == theirs,
                    _ => true,
                };
                if let (true, Some(notify)) = (ours, weak.upgrade()) {
                    notify.notify_one();
                }
            }
        });
        plane.subscribe(sink).await?;
        Ok(ControlWakeups { notify })
    }
}

impl Wakeups for ControlWakeups {
    fn next(&self) -> WakeupFuture<'_> {
        self.notify.next()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use durable_core::RunId;

    use super::*;

    fn enqueued(namespace: Option<&str>, queue: Option<&str>) -> ControlMessage {
        ControlMessage::Enqueued {
            origin: "e".into(),
            namespace: namespace.map(Into::into),
            queue: queue.map(Into::into),
        }
    }

    async fn nudged(w: &ControlWakeups) -> bool {
        tokio::time::timeout(Duration::from_millis(50), w.next()).await.is_ok()
    }

    #[tokio::test]
    async fn the_run_queue_of_the_consumers_namespace_nudges_it() {
        let plane = InProcessControlPlane::new();
        let w = ControlWakeups::subscribe(&plane, Some("ns".into())).await.unwrap();
        for (message, nudges) in [
            (enqueued(Some("ns"), None), true),
            (enqueued(None, None), true),
            (enqueued(Some("other"), None), false),
            (enqueued(Some("ns"), Some("resize")), false),
            (ControlMessage::Cancel { origin: "e".into(), run_id: RunId::from("r") }, false),
        ] {
            plane.publish(message.clone()).await.unwrap();
            assert_eq!(nudged(&w).await, nudges, "{message:?}");
        }
        // A nudge while nobody waits is kept for the next wait.
        plane.publish_all(vec![enqueued(None, None), enqueued(None, None)]).await.unwrap();
        assert!(nudged(&w).await);
        assert!(!nudged(&w).await, "nudges fold");
        drop(w);
        plane.publish(enqueued(None, None)).await.unwrap();
        assert_eq!(plane.subscribers(), 1);
    }
}
