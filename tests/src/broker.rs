//! The broker transports of the fleet tests: a run queue and a control plane on NATS or Redis,
//! under one prefix, for the test process and the worker processes alike.

use std::sync::Arc;
use std::time::Duration;

use durable::nats::{NatsControlPlane, NatsTransport};
use durable::redis::{RedisControlPlane, RedisTransport};
use durable::transport::{ControlPlane, Transport};

/// A broker's run queue and control plane.
#[derive(Debug)]
pub struct Broker {
    /// The run queue.
    pub transport: Arc<dyn Transport>,
    /// The control plane.
    pub plane: Arc<dyn ControlPlane>,
    /// The run queue as its own type, for [`Broker::destroy`].
    queue: Queue,
}

#[derive(Debug)]
enum Queue {
    Nats(NatsTransport),
    Redis(RedisTransport),
}

impl Broker {
    /// Connects to the broker `kind` (`nats` or `redis`) at `url`, under `prefix`; unanswered
    /// queue items go to another consumer after `redeliver_after`.
    pub async fn connect(
        kind: &str,
        url: &str,
        prefix: &str,
        redeliver_after: Duration,
    ) -> Result<Broker, Box<dyn std::error::Error>> {
        let (queue, plane): (Queue, Arc<dyn ControlPlane>) = match kind {
            "nats" => (
                Queue::Nats(
                    NatsTransport::connect(url, prefix).await?.redeliver_after(redeliver_after).claim_batch(64),
                ),
                Arc::new(NatsControlPlane::connect(url, prefix).await?),
            ),
            "redis" => (
                Queue::Redis(
                    RedisTransport::connect(url, prefix).await?.redeliver_after(redeliver_after).claim_batch(64),
                ),
                Arc::new(RedisControlPlane::connect(url, prefix.to_string()).await?),
            ),
            other => return Err(format!("unknown broker {other:?}: nats or redis").into()),
        };
        let transport: Arc<dyn Transport> = match &queue {
            Queue::Nats(t) => Arc::new(t.clone()),
            Queue::Redis(t) => Arc::new(t.clone()),
        };
        Ok(Broker { transport, plane, queue })
    }

    /// Deletes everything under the prefix (the stream, the keys).
    pub async fn destroy(&self) -> Result<(), Box<dyn std::error::Error>> {
        match &self.queue {
            Queue::Nats(t) => t.delete().await?,
            Queue::Redis(t) => t.destroy().await?,
        }
        Ok(())
    }
}
