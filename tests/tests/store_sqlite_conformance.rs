//! `SqliteStore` certified by the public store conformance suite: one `#[test]` per case, each
//! on a fresh database file in a temporary directory; the cases across two handles open a
//! second `SqliteStore` on the same file, the persistence case reopens the file after every
//! handle was dropped.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use durable_conformance::{StoreFactory, TestStore};
use durable_core::{Store, StoreError, StoreResult};
use durable_store_sqlite::SqliteStore;

/// The database file in the case's temp dir (the factory's guard: removed with everything in it
/// when the case ends).
fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("durable.db")
}

struct SqliteFactory;

impl SqliteFactory {
    fn open(store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        let dir = store.guard::<tempfile::TempDir>()?;
        Some(SqliteStore::open(db_path(dir)).map(|s| Arc::new(s) as Arc<dyn Store>).map_err(Into::into))
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn create(&self) -> StoreResult<TestStore> {
        let dir = tempfile::tempdir().map_err(StoreError::backend)?;
        // Default options: Durability::Full, as users get it.
        let store = SqliteStore::open(db_path(&dir))?;
        Ok(TestStore::new(store).with_guard(dir))
    }

    async fn second_handle(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        Self::open(store)
    }

    async fn reopen(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        Self::open(store)
    }
}

durable_conformance::store_conformance_tests!(SqliteFactory);
