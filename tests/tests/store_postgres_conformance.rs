//! `PostgresStore` certified by the public store conformance suite: one `#[test]` per case, each
//! on a scratch schema of its own (`durable_test_conformance_<pid>_<n>_<random>`, from
//! `durable_store_postgres::test_support`), dropped when the case ends, also when it fails. The
//! cases across two handles connect a second `PostgresStore` (a second pool and writer) to the
//! same schema; the persistence case connects again after every handle was dropped. The store's
//! run queue runs the run-queue cases (across two handles: the queue of a second `PostgresStore`
//! on the schema).
//!
//! The server comes from `DURABLE_PG_URL` (like sqlx's `DATABASE_URL`). Without it, every case
//! prints one line saying how to run it and passes (the factory's `unavailable`):
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test store_postgres_conformance
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use durable_conformance::{StoreFactory, TestStore};
use durable_core::{RunQueue, Store, StoreError, StoreResult};
use durable_store_postgres::test_support::{self, ScratchSchema};

/// Each case on a scratch schema of its own (the `TestStore`'s guard): dropped by the teardown,
/// or, if the case never got there (a panic), when the guard is dropped.
struct PostgresFactory {
    url: Option<String>,
}

fn factory() -> PostgresFactory {
    PostgresFactory { url: test_support::url() }
}

#[async_trait]
impl StoreFactory for PostgresFactory {
    fn unavailable(&self) -> Option<String> {
        match self.url {
            Some(_) => None,
            None => Some(test_support::skip_reason()),
        }
    }

    async fn create(&self) -> StoreResult<TestStore> {
        let url = self.url.as_deref().ok_or_else(|| StoreError::unavailable(test_support::skip_reason()))?;
        let scratch = ScratchSchema::new(url, "conformance").await.map_err(StoreError::backend)?;
        let store = scratch.connect().await?;
        Ok(TestStore::new_with_queue(store).with_guard(scratch))
    }

    async fn second_handle(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        let scratch = store.guard::<ScratchSchema>()?;
        Some(scratch.connect().await.map(|s| Arc::new(s) as Arc<dyn Store>).map_err(Into::into))
    }

    async fn second_queue(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn RunQueue>>> {
        let scratch = store.guard::<ScratchSchema>()?;
        Some(scratch.connect().await.map(|s| Arc::new(s) as Arc<dyn RunQueue>).map_err(Into::into))
    }

    async fn reopen(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        self.second_handle(store).await
    }

    async fn teardown(&self, mut store: TestStore) -> StoreResult<()> {
        store.close();
        match store.guard::<ScratchSchema>() {
            Some(scratch) => scratch.drop_now().await.map_err(StoreError::backend),
            None => Ok(()),
        }
    }
}

durable_conformance::store_conformance_tests!(factory());
