//! The control plane on core NATS: one subject per deployment, best effort.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::{Client, PublishErrorKind, Subscriber};
use async_trait::async_trait;
use durable_core::{ControlError, ControlMessage, ControlPlane, ControlSink, ControlSinks};
use futures_util::StreamExt;
use tokio::task::AbortHandle;

use crate::names;
use crate::report::Reporter;

/// How long the plane's subscription may take to be confirmed by the server.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the listener looks at the connection's state.
const STATE_CHECK: Duration = Duration::from_secs(1);

/// [`ControlMessage`]s between the instances of one deployment, on the core NATS subject
/// `<prefix>.control` (not JetStream: nothing is stored). Clones share the connection and the
/// subscribers.
///
/// The plane subscribes to its subject once, when it is made (a round trip to the server, so
/// that its subscription is in force when [`connect`](NatsControlPlane::connect) or
/// [`from_client`](NatsControlPlane::from_client) returns), and one task hands every message
/// that decodes to the sinks; [`subscribe`](ControlPlane::subscribe) only adds a sink, without
/// waiting. The task ends when the last clone is dropped.
///
/// The client reconnects on its own after a connection loss; the task reports the outages it
/// sees with `tracing::warn!`, at most once a minute, with a count. Messages published while
/// this instance is disconnected do not reach it (best effort, as the [`ControlPlane`]
/// contract says), and [`publish`](ControlPlane::publish) fails at once while it is
/// disconnected. A message larger than the server's maximum payload (1 MiB by default) is
/// dropped with a warning.
#[derive(Clone)]
pub struct NatsControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    subject: String,
    sinks: Arc<ControlSinks>,
    /// The listener task, aborted when the last clone is dropped.
    listener: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl fmt::Debug for NatsControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsControlPlane")
            .field("prefix", &self.inner.prefix)
            .field("subject", &self.inner.subject)
            .field("subscribers", &self.inner.sinks.len())
            .finish()
    }
}

fn unavailable(what: &str, e: impl fmt::Display) -> ControlError {
    ControlError(format!("{what}: {e}"))
}

impl NatsControlPlane {
    /// Connects to the NATS server(s) at `url` (several separated by commas) and listens on
    /// `<prefix>.control`. Must be called inside a tokio runtime (it spawns the listener).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, ControlError> {
        names::check_prefix(prefix).map_err(ControlError)?;
        let client = async_nats::ConnectOptions::new()
            .name(format!("durable-control {prefix}"))
            .connect(url)
            .await
            .map_err(|e| unavailable(&format!("could not connect to NATS at {url}"), e))?;
        Self::from_client(client, prefix).await
    }

    /// A control plane on a connection you made (or the one of a
    /// [`NatsTransport`](crate::NatsTransport): [`NatsTransport::client`](crate::NatsTransport::client)).
    pub async fn from_client(client: Client, prefix: &str) -> Result<Self, ControlError> {
        names::check_prefix(prefix).map_err(ControlError)?;
        let subject = names::control_subject(prefix);
        let subscription = client.subscribe(subject.clone()).await.map_err(|e| unavailable("subscribe", e))?;
        round_trip(&client).await?;
        let sinks = Arc::new(ControlSinks::new());
        // The task holds no clone of the plane: dropping the last one aborts it.
        let listener = tokio::spawn(listen(client.clone(), subject.clone(), subscription, sinks.clone()));
        Ok(NatsControlPlane {
            inner: Arc::new(Inner {
                client,
                prefix: prefix.to_string(),
                subject,
                sinks,
                listener: listener.abort_handle(),
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

    /// How many sinks subscribed (over every clone).
    pub fn subscribers(&self) -> usize {
        self.inner.sinks.len()
    }

    /// Publishes one message; an oversized one is dropped with a warning.
    async fn send(&self, message: &ControlMessage) -> Result<(), ControlError> {
        let payload = message.encode();
        let payload_len = payload.len();
        match self.inner.client.publish(self.inner.subject.clone(), payload.into()).await {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.kind(), PublishErrorKind::MaxPayloadExceeded) => {
                tracing::warn!(
                    subject = %self.inner.subject,
                    origin = message.origin(),
                    size = payload_len,
                    max_payload = self.inner.client.max_payload(),
                    "dropping a control message larger than the NATS server's maximum payload"
                );
                Ok(())
            }
            Err(e) => Err(unavailable("publish to NATS", e)),
        }
    }

    fn check_connected(&self) -> Result<(), ControlError> {
        if self.inner.client.connection_state() == State::Disconnected {
            return Err(ControlError("not connected to NATS (reconnecting)".into()));
        }
        Ok(())
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

/// The listener: hands every message that decodes to the sinks (anything else — garbage, a
/// newer sender's variant — is dropped), and reports outages at most once a minute.
async fn listen(client: Client, subject: String, mut subscription: Subscriber, sinks: Arc<ControlSinks>) {
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
                if let Some(decoded) = std::str::from_utf8(&message.payload).ok().and_then(ControlMessage::decode) {
                    sinks.deliver(&decoded);
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
}

#[async_trait]
impl ControlPlane for NatsControlPlane {
    async fn publish(&self, message: ControlMessage) -> Result<(), ControlError> {
        self.check_connected()?;
        self.send(&message).await
    }

    /// Publishes the messages in order on the one connection (they are pipelined: no round
    /// trip each).
    async fn publish_all(&self, messages: Vec<ControlMessage>) -> Result<(), ControlError> {
        self.check_connected()?;
        for message in &messages {
            self.send(message).await?;
        }
        Ok(())
    }

    async fn subscribe(&self, sink: ControlSink) -> Result<(), ControlError> {
        self.inner.sinks.add(sink);
        Ok(())
    }
}
