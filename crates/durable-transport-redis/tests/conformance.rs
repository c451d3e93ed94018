//! The public transport conformance suite on RedisTransport: one `#[test]` per case, each on a
//! key prefix of its own on the server in `DURABLE_REDIS_URL` (skipped without it).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_conformance::transport::{TransportFactory, TransportSettings, TransportUnderTest};
use durable_transport::Transport;
use durable_transport_redis::RedisTransport;
use durable_transport_redis::test_support::{self, ScratchPrefix};

struct Redis {
    url: Option<String>,
}

/// One case's queue: a prefix of its own; each handle is a transport connected anew, as
/// another engine instance would connect.
struct Queue {
    scratch: ScratchPrefix,
    redeliver_after: Duration,
}

#[async_trait]
impl TransportFactory for Redis {
    fn unavailable(&self) -> Option<String> {
        self.url.is_none().then(test_support::skip_reason)
    }

    async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
        let url = self.url.as_deref().ok_or_else(test_support::skip_reason)?;
        Ok(Box::new(Queue { scratch: ScratchPrefix::new(url), redeliver_after: settings.redeliver_after }))
    }
}

#[async_trait]
impl TransportUnderTest for Queue {
    async fn handle(&self) -> Result<Arc<dyn Transport>, String> {
        let transport =
            RedisTransport::connect(self.scratch.url(), self.scratch.prefix()).await.map_err(|e| e.to_string())?;
        Ok(Arc::new(transport.redeliver_after(self.redeliver_after)))
    }

    async fn destroy(&self) -> Result<(), String> {
        self.scratch.delete_now().await.map_err(|e| e.to_string())
    }
}

durable_conformance::transport_conformance_tests!(Redis { url: test_support::url() });
