//! `SqliteStore` certified by the public store conformance suite: one `#[test]` per case, each
//! on a fresh database file in a temporary directory; the cases across two handles open a
//! second `SqliteStore` on the same file, the persistence case reopens the file after every
//! handle was dropped. The store's run queue runs the run-queue cases (across two handles: the
//! queue of a second `SqliteStore` on the same file).

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use durable_conformance::{StoreFactory, TestStore};
use durable_core::{RunQueue, Store, StoreError, StoreResult};
use durable_store_sqlite::SqliteStore;

/// The database file in the case's temp dir (the factory's guard: removed with everything in it
/// when the case ends).
fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("durable.db")
}

struct SqliteFactory;

impl SqliteFactory {
    /// Another `SqliteStore` on the case's file.
    fn open(store: &TestStore) -> Option<StoreResult<Arc<SqliteStore>>> {
        let dir = store.guard::<tempfile::TempDir>()?;
        Some(SqliteStore::open(db_path(dir)).map(Arc::new).map_err(Into::into))
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn create(&self) -> StoreResult<TestStore> {
        let dir = tempfile::tempdir().map_err(StoreError::backend)?;
        // Default options: Durability::Full, as users get it.
        let store = SqliteStore::open(db_path(&dir))?;
        Ok(TestStore::new_with_queue(store).with_guard(dir))
    }

    async fn second_handle(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        Some(Self::open(store)?.map(|s| s as Arc<dyn Store>))
    }

    async fn second_queue(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn RunQueue>>> {
        Some(Self::open(store)?.map(|s| s as Arc<dyn RunQueue>))
    }

    async fn reopen(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        self.second_handle(store).await
    }
}

durable_conformance::store_conformance_tests!(SqliteFactory);
