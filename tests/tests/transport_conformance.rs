//! The transports of this repository certified by the public transport conformance suite
//! (`durable_conformance::transport`): the in-process queue, and the store-backed queue
//! (`QueueTransport`) on the memory store, on a SQLite file (each handle a `SqliteStore` of its
//! own on the file, as another process would open it) and on PostgreSQL (each handle a
//! `PostgresStore` of its own on a scratch schema, dropped after the case). The broker crates
//! certify theirs in their own test files.
//!
//! The PostgreSQL cases need `DURABLE_PG_URL`; without it each prints one line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test transport_conformance
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_conformance::transport::{TransportFactory, TransportSettings, TransportUnderTest};
use durable_core::{NewRun, Payload, RunId, RunQueue, Store};
use durable_transport::{InProcessTransport, QueueTransport, Transport};

mod in_process {
    use super::*;

    struct InProcess;
    struct Channel(InProcessTransport);

    #[async_trait]
    impl TransportUnderTest for Channel {
        async fn handle(&self) -> Result<Arc<dyn Transport>, String> {
            Ok(Arc::new(self.0.clone()))
        }
    }

    #[async_trait]
    impl TransportFactory for InProcess {
        async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
            Ok(Box::new(Channel(InProcessTransport::new().redeliver_after(settings.redeliver_after))))
        }
    }

    durable_conformance::transport_conformance_tests!(InProcess);
}

type Opening<S> = Pin<Box<dyn Future<Output = Result<Arc<S>, String>> + Send>>;
type Destroying = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A store-backed queue: handles are `QueueTransport`s over handles on one store.
struct StoreQueue<S> {
    /// The store the runs are created in (and the first handle's).
    first: Arc<S>,
    /// Opens another handle on the store's data.
    open: Box<dyn Fn() -> Opening<S> + Send + Sync>,
    settings: TransportSettings,
    /// Dropped after the case (a temp dir, a scratch schema).
    #[allow(dead_code)]
    guard: Box<dyn std::any::Any + Send + Sync>,
    /// Drops a scratch schema.
    destroy: Option<Box<dyn Fn() -> Destroying + Send + Sync>>,
}

#[async_trait]
impl<S: Store + RunQueue> TransportUnderTest for StoreQueue<S> {
    async fn handle(&self) -> Result<Arc<dyn Transport>, String> {
        let store = (self.open)().await?;
        Ok(Arc::new(
            QueueTransport::new(store)
                .claim_ttl(self.settings.redeliver_after)
                .poll_interval(Duration::from_millis(20)),
        ))
    }

    async fn prepare_runs(&self, runs: &[(RunId, String)]) -> Result<(), String> {
        for (id, namespace) in runs {
            let run = NewRun {
                trace_context: None,
                admission: None,
                id: id.clone(),
                workflow: "w".into(),
                version: 1,
                namespace: namespace.clone(),
                input: Payload::null(),
                tags: vec![],
                priority: 0,
                parent: None,
                created_at: 0,
                start_at: None,
            };
            self.first.create_run(run).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    async fn destroy(&self) -> Result<(), String> {
        match &self.destroy {
            Some(destroy) => destroy().await,
            None => Ok(()),
        }
    }
}

mod queue_memory {
    use super::*;
    use durable_store_memory::MemoryStore;

    struct Memory;

    #[async_trait]
    impl TransportFactory for Memory {
        async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
            let store = Arc::new(MemoryStore::new());
            let shared = store.clone();
            Ok(Box::new(StoreQueue {
                first: store,
                open: Box::new(move || {
                    let shared = shared.clone();
                    Box::pin(async move { Ok(shared) })
                }),
                settings: settings.clone(),
                guard: Box::new(()),
                destroy: None,
            }))
        }
    }

    durable_conformance::transport_conformance_tests!(Memory);
}

mod queue_sqlite {
    use super::*;
    use durable_store_sqlite::SqliteStore;

    struct Sqlite;

    #[async_trait]
    impl TransportFactory for Sqlite {
        async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let path = dir.path().join("durable.db");
            let first = Arc::new(SqliteStore::open(&path).map_err(|e| e.to_string())?);
            Ok(Box::new(StoreQueue {
                first,
                open: Box::new(move || {
                    let opened = SqliteStore::open(&path).map(Arc::new).map_err(|e| e.to_string());
                    Box::pin(async move { opened })
                }),
                settings: settings.clone(),
                guard: Box::new(dir),
                destroy: None,
            }))
        }
    }

    durable_conformance::transport_conformance_tests!(Sqlite);
}

mod queue_postgres {
    use super::*;
    use durable_store_postgres::PostgresStore;
    use durable_store_postgres::test_support::{self, ScratchSchema};

    struct Postgres {
        url: Option<String>,
    }

    #[async_trait]
    impl TransportFactory for Postgres {
        fn unavailable(&self) -> Option<String> {
            self.url.is_none().then(test_support::skip_reason)
        }

        async fn create(&self, settings: &TransportSettings) -> Result<Box<dyn TransportUnderTest>, String> {
            let url = self.url.as_deref().ok_or_else(test_support::skip_reason)?;
            let scratch = Arc::new(ScratchSchema::new(url, "transport").await.map_err(|e| e.to_string())?);
            let first: Arc<PostgresStore> = Arc::new(scratch.connect().await.map_err(|e| e.to_string())?);
            let opener = scratch.clone();
            let dropper = scratch.clone();
            Ok(Box::new(StoreQueue {
                first,
                // A second pool on the schema, as another process would connect.
                open: Box::new(move || {
                    let scratch = opener.clone();
                    Box::pin(async move { scratch.connect().await.map(Arc::new).map_err(|e| e.to_string()) })
                }),
                settings: settings.clone(),
                guard: Box::new(scratch),
                destroy: Some(Box::new(move || {
                    let scratch = dropper.clone();
                    Box::pin(async move { scratch.drop_now().await.map_err(|e| e.to_string()) })
                })),
            }))
        }
    }

    durable_conformance::transport_conformance_tests!(Postgres { url: test_support::url() });
}
