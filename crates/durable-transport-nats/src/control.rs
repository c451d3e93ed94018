//! The control plane on core NATS: one subject per deployment, best effort.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::connection::State;
use async_trait::async_trait;
use durable_core::{ControlError, ControlMessage, ControlPlane, ControlSink};
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::task::AbortHandle;

use crate::names;
use crate::report::Reporter;

/// How long a subscription may take to be confirmed by the server.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a subscription's task looks at the connection's state.
const STATE_CHECK: Duration = Duration::from_secs(1);

/// [`ControlMessage`]s between the instances of one deployment, on the core NATS subject
/// `<prefix>.control` (not JetStream: nothing is stored). Clones share the connection and the
/// subscriptions; the subscriptions' tasks end when the last clone is dropped.
///
/// The client reconnects on its own after a connection loss; each subscription's task reports
/// the outages it sees with `tracing::warn!`, at most once a minute, with a count. Messages
/// published while a subscriber is disconnected do not reach it (best effort, as the
/// [`ControlPlane`] contract says), and [`publish`](ControlPlane::publish) fails at once while
/// this instance is disconnected.
#[derive(Clone)]
pub struct NatsControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    subject: String,
    /// The subscriptions' tasks, aborted when the last clone is dropped.
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}

impl fmt::Debug for NatsControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsControlPlane")
            .field("prefix", &self.inner.prefix)
            .field("subject", &self.inner.subject)
            .field("subscriptions", &self.inner.tasks.lock().len())
            .finish()
    }
}

fn unavailable(what: &str, e: impl fmt::Display) -> ControlError {
    ControlError(format!("{what}: {e}"))
}

impl NatsControlPlane {
    /// Connects to the NATS server(s) at `url` (several separated by commas); messages travel
    /// on `<prefix>.control`.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, ControlError> {
        names::check_prefix(prefix).map_err(ControlError)?;
        let client = async_nats::ConnectOptions::new()
            .name(format!("durable-control {prefix}"))
            .connect(url)
            .await
            .map_err(|e| unavailable(&format!("could not connect to NATS at {url}"), e))?;
        Self::from_client(client, prefix)
    }

    /// A control plane on a connection you made (or the one of a
    /// [`NatsTransport`](crate::NatsTransport): [`NatsTransport::client`](crate::NatsTransport::client)).
    pub fn from_client(client: Client, prefix: &str) -> Result<Self, ControlError> {
        names::check_prefix(prefix).map_err(ControlError)?;
        Ok(NatsControlPlane {
            inner: Arc::new(Inner {
                client,
                prefix: prefix.to_string(),
                subject: names::control_subject(prefix),
                tasks: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The subject messages travel on: `<prefix>.control`.
    pub fn subject(&self) -> &str {
        &self.inner.subject
    }

    /// The connection.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
}

/// Waits until the server has processed everything this connection sent so far (a message to a
/// private inbox comes back through the server, which handles one connection's commands in
/// order), so a subscription made before it is in force.
async fn round_trip(client: &Client) -> Result<(), ControlError> {
    let inbox = client.new_inbox();
    let mut probe = client.subscribe(inbox.clone()).await.map_err(|e| unavailable("subscribe", e))?;
    client.publish(inbox, Vec::new().into()).await.map_err(|e| unavailable("publish", e))?;
    match tokio::time::timeout(CONFIRM_TIMEOUT, probe.next()).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(ControlError("the NATS connection was closed".into())),
        Err(_) => Err(ControlError("the NATS server did not confirm the subscription in time".into())),
    }
}

#[async_trait]
impl ControlPlane for NatsControlPlane {
    async fn publish(&self, message: ControlMessage) -> Result<(), ControlError> {
        let client = &self.inner.client;
        if client.connection_state() == State::Disconnected {
            return Err(ControlError("not connected to NATS (reconnecting)".into()));
        }
        client
            .publish(self.inner.subject.clone(), message.encode().into())
            .await
            .map_err(|e| unavailable("publish to NATS", e))
    }

    async fn subscribe(&self, sink: ControlSink) -> Result<(), ControlError> {
        let client = self.inner.client.clone();
        let subject = self.inner.subject.clone();
        let mut subscription = client.subscribe(subject.clone()).await.map_err(|e| unavailable("subscribe", e))?;
        round_trip(&client).await?;
        // The task holds no clone of the plane: dropping the last one aborts it.
        let task = tokio::spawn(async move {
            let mut outages = Reporter::default();
            let mut connected = true;
            let mut check = tokio::time::interval(STATE_CHECK);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    message = subscription.next() => {
                        let Some(message) = message else {
                            tracing::warn!(subject, "the NATS connection was closed: control messages no longer arrive here");
                            break;
                        };
                        // Anything that does not decode (garbage, a newer sender's variant) is dropped.
                        if let Some(decoded) = std::str::from_utf8(&message.payload).ok().and_then(ControlMessage::decode) {
                            sink(decoded);
                        }
                    }
                    _ = check.tick() => {
                        let now = client.connection_state() != State::Disconnected;
                        if connected && !now && let Some(outages) = outages.failed() {
                            tracing::warn!(
                                subject,
                                outages,
                                "lost the NATS connection of the control plane ({outages} outages since the last report); \
                                 reconnecting, messages sent meanwhile do not arrive here"
                            );
                        }
                        if !connected && now && outages.succeeded() {
                            tracing::info!(subject, "the control plane is connected to NATS again");
                        }
                        connected = now;
                    }
                }
            }
        });
        self.inner.tasks.lock().push(task.abort_handle());
        Ok(())
    }
}
