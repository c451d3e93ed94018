//! `SqliteStore` certified by the public store conformance suite: one `#[test]` per case, each
//! on a fresh database file in a temporary directory; the cases across two handles open a
//! second `SqliteStore` on the same file, the persistence case reopens the file after every
//! handle was dropped. The store's run queue runs the run-queue cases (across two handles: the
//! queue of a second `SqliteStore` on the same file).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use durable_conformance::{StoreFactory, TestStore};
use durable_core::{RunQueue, Store, StoreResult};
use durable_store_sqlite::SqliteStore;

/// A directory of its own per case, removed with everything in it when the case ends.
#[derive(Debug)]
struct TempDb {
    dir: PathBuf,
    path: PathBuf,
}

impl TempDb {
    fn new() -> TempDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "durable-sqlite-conformance-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the case's temp dir");
        let path = dir.join("durable.db");
        TempDb { dir, path }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct SqliteFactory;

impl SqliteFactory {
    /// Another `SqliteStore` on the case's file.
    fn open(store: &TestStore) -> Option<StoreResult<Arc<SqliteStore>>> {
        let db = store.guard::<TempDb>()?;
        Some(SqliteStore::open(&db.path).map(Arc::new).map_err(Into::into))
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn create(&self) -> StoreResult<TestStore> {
        let db = TempDb::new();
        // Default options: Durability::Full, as users get it.
        let store = SqliteStore::open(&db.path)?;
        Ok(TestStore::new_with_queue(store).with_guard(db))
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
