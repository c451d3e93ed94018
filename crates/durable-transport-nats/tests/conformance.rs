//! `NatsTransport` certified by the public transport conformance suite
//! (`durable_conformance::transport`): each case on a stream of its own (a fresh prefix), each
//! handle a connection of its own, as another process would open it; the stream is deleted
//! after the case.
//!
//! The cases need `DURABLE_NATS_URL`; without it each prints one line and passes:
//!
//! ```text
//! DURABLE_NATS_URL=nats://127.0.0.1:4222 cargo test -p durable-transport-nats --test conformance
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use durable_conformance::transport::{TransportFactory, TransportSettings, TransportUnderTest};
use durable_transport::Transport;
use durable_transport_nats::NatsTransport;
use durable_transport_nats::test_support::{self, unique_prefix};

struct Nats {
    url: Option<String>,
}

/// One case's queue: a prefix of its own on the server.
struct Stream {
    url: String,
    prefix: String,
    settings: TransportSettings,
    /// The handle that created the stream; it deletes it after the case.
    first: NatsTransport,
}

#[async_trait]
impl TransportFactory for Nats {
    fn unavailable(&self) -> Option<String> {
        self.url.is_none().then(test_support::skip_reason)
    }

    async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
        let url = self.url.clone().ok_or_else(test_support::skip_reason)?;
        let prefix = unique_prefix("conformance");
        let first = NatsTransport::connect(&url, &prefix).await.map_err(|e| e.to_string())?;
        Ok(Box::new(Stream { url, prefix, settings: settings.clone(), first }))
    }
}

#[async_trait]
impl TransportUnderTest for Stream {
    async fn handle(&self) -> Result<Arc<dyn Transport>, String> {
        let transport = NatsTransport::connect(&self.url, &self.prefix).await.map_err(|e| e.to_string())?;
        Ok(Arc::new(transport.redeliver_after(self.settings.redeliver_after)))
    }

    async fn destroy(&self) -> Result<(), String> {
        self.first.delete().await.map_err(|e| e.to_string())
    }
}

durable_conformance::transport_conformance_tests!(Nats { url: test_support::url() });
