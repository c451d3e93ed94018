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
    nats: Option<NatsTransport>,
    redis: Option<RedisTransport>,
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
        Ok(match kind {
            "nats" => {
                let transport =
                    NatsTransport::connect(url, prefix).await?.redeliver_after(redeliver_after).claim_batch(64);
                let plane = NatsControlPlane::connect(url, prefix).await?;
                Broker {
                    transport: Arc::new(transport.clone()),
                    plane: Arc::new(plane),
                    nats: Some(transport),
                    redis: None,
                }
            }
            "redis" => {
                let transport =
                    RedisTransport::connect(url, prefix).await?.redeliver_after(redeliver_after).claim_batch(64);
                let plane = RedisControlPlane::connect(url, prefix.to_string()).await?;
                Broker {
                    transport: Arc::new(transport.clone()),
                    plane: Arc::new(plane),
                    nats: None,
                    redis: Some(transport),
                }
            }
            other => return Err(format!("unknown broker {other:?}: nats or redis").into()),
        })
    }

    /// Deletes everything under the prefix (the stream, the keys).
    pub async fn destroy(&self) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(t) = &self.nats {
            t.delete().await?;
        }
        if let Some(t) = &self.redis {
            t.destroy().await?;
        }
        Ok(())
    }
}
