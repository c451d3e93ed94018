//! `PostgresStore` certified by the public store conformance suite: one `#[test]` per case, each
//! on a scratch schema of its own (`durable_test_<pid>_<n>`), dropped when the case ends, also
//! when it fails. The cases across two handles connect a second `PostgresStore` (a second pool
//! and writer) to the same schema; the persistence case connects again after every handle was
//! dropped. The store's run queue runs the run-queue cases (across two handles: the queue of a
//! second `PostgresStore` on the schema).
//!
//! The server comes from `DURABLE_PG_URL` (like sqlx's `DATABASE_URL`). Without it, every case
//! prints one line saying how to run it and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test store_postgres_conformance
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use durable_conformance::{StoreFactory, TestStore};
use durable_core::{RunQueue, Store, StoreError, StoreResult};
use durable_store_postgres::deadpool_postgres::tokio_postgres::{self, NoTls};
use durable_store_postgres::{PostgresOptions, PostgresStore};

/// The environment variable naming the server.
const ENV: &str = "DURABLE_PG_URL";

/// A schema of its own for one case. Dropped (with everything in it) by the factory's teardown,
/// or, if the case never got there (a panic), when the guard is dropped.
#[derive(Debug)]
struct ScratchSchema {
    url: String,
    schema: String,
    dropped: AtomicBool,
}

impl ScratchSchema {
    fn new(url: &str) -> ScratchSchema {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let schema = format!("durable_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        ScratchSchema { url: url.to_string(), schema, dropped: AtomicBool::new(false) }
    }

    fn options(&self) -> PostgresOptions {
        PostgresOptions::new().schema(&self.schema).pool_size(4).application_name(format!("durable-{}", self.schema))
    }

    async fn connect(&self) -> StoreResult<PostgresStore> {
        Ok(PostgresStore::connect_with(&self.url, self.options()).await?)
    }

    /// `DROP SCHEMA … CASCADE` on a connection of its own.
    async fn drop_schema(url: &str, schema: &str) -> Result<(), tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        let driver = tokio::spawn(connection);
        let result = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await;
        drop(client);
        let _ = driver.await;
        result
    }

    async fn cleanup(&self) -> StoreResult<()> {
        if !self.dropped.swap(true, Ordering::SeqCst) {
            Self::drop_schema(&self.url, &self.schema).await.map_err(StoreError::backend)?;
        }
        Ok(())
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        if self.dropped.swap(true, Ordering::SeqCst) {
            return;
        }
        // Maybe inside the case's runtime: drop the schema from a thread with a runtime of its own.
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(Self::drop_schema(&url, &schema)).ok()
        })
        .join();
    }
}

struct PostgresFactory {
    url: Option<String>,
}

fn factory() -> PostgresFactory {
    PostgresFactory { url: std::env::var(ENV).ok().filter(|url| !url.trim().is_empty()) }
}

#[async_trait]
impl StoreFactory for PostgresFactory {
    fn unavailable(&self) -> Option<String> {
        match self.url {
            Some(_) => None,
            None => Some(format!(
                "{ENV} is not set; to run the PostgreSQL tests: \
                 {ENV}=postgres://postgres@127.0.0.1:5432/test cargo test"
            )),
        }
    }

    async fn create(&self) -> StoreResult<TestStore> {
        let url = self.url.as_deref().ok_or_else(|| StoreError::unavailable(format!("{ENV} is not set")))?;
        let scratch = ScratchSchema::new(url);
        // A schema left over by an earlier process with the same pid is dropped first.
        ScratchSchema::drop_schema(url, &scratch.schema).await.map_err(StoreError::backend)?;
        let store = scratch.connect().await?;
        Ok(TestStore::new_with_queue(store).with_guard(scratch))
    }

    async fn second_handle(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        let scratch = store.guard::<ScratchSchema>()?;
        Some(scratch.connect().await.map(|s| Arc::new(s) as Arc<dyn Store>))
    }

    async fn second_queue(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn RunQueue>>> {
        let scratch = store.guard::<ScratchSchema>()?;
        Some(scratch.connect().await.map(|s| Arc::new(s) as Arc<dyn RunQueue>))
    }

    async fn reopen(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        self.second_handle(store).await
    }

    async fn teardown(&self, mut store: TestStore) -> StoreResult<()> {
        store.close();
        match store.guard::<ScratchSchema>() {
            Some(scratch) => scratch.cleanup().await,
            None => Ok(()),
        }
    }
}

durable_conformance::store_conformance_tests!(factory());
