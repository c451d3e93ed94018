//! Helpers shared by the runtime's integration tests.
#![allow(dead_code, unreachable_pub)]

use durable_core::RunId;
use durable_runtime::EngineEvent;
use tokio::sync::broadcast;

/// Waits until `rx` has seen the `StepCompleted` event of `run` at `seq`.
pub async fn step_committed(rx: &mut broadcast::Receiver<EngineEvent>, run: &RunId, seq: u32) {
    loop {
        match rx.recv().await.expect("event stream open") {
            EngineEvent::StepCompleted { run_id, seq: s, .. } if run_id == *run && s == seq => return,
            _ => {}
        }
    }
}

/// A gate a workflow body can wait on: closed gates never open (the body stays pending, as
/// if the process were stuck there), open gates pass at once.
pub async fn gate(open: bool) {
    if !open {
        std::future::pending::<()>().await;
    }
}

/// Waits until `rx` has seen a turn of `run` start.
pub async fn turn_started(rx: &mut broadcast::Receiver<EngineEvent>, run: &RunId) {
    loop {
        match rx.recv().await.expect("event stream open") {
            EngineEvent::TurnStarted { run_id, .. } if run_id == *run => return,
            _ => {}
        }
    }
}

use std::path::PathBuf;
use std::sync::Arc;

use durable_core::Store;
use durable_store_memory::MemoryStore;
use durable_store_sqlite::SqliteStore;

/// The store fixture of one test: a store on one backend (memory, or a SQLite file of its own),
/// a second handle on its data, a `TestEngine` on it. (Not `durable_conformance::TestStore`, what
/// a conformance `StoreFactory` builds.)
pub struct StoreFixture {
    pub store: Arc<dyn Store>,
    /// The SQLite store's file, in a temp dir removed (with the WAL files) when the test ends.
    pub db: Option<(tempfile::TempDir, PathBuf)>,
}

impl StoreFixture {
    pub fn memory() -> Self {
        StoreFixture { store: Arc::new(MemoryStore::new()), db: None }
    }

    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("durable.db");
        let store = Arc::new(SqliteStore::open(&path).expect("open sqlite"));
        StoreFixture { store, db: Some((dir, path)) }
    }

    /// Another handle on the same data: a second `SqliteStore` on the same file (as a second
    /// process would have), or the same memory store.
    pub fn second_handle(&self) -> Arc<dyn Store> {
        match &self.db {
            Some((_, path)) => Arc::new(SqliteStore::open(path).expect("open sqlite")),
            None => self.store.clone(),
        }
    }

    /// A test engine (virtual clock) on this store.
    pub fn engine(&self) -> durable_conformance::TestEngine {
        durable_conformance::TestEngine::with_store(self.store.clone())
    }
}

/// Emits, for each async fn `name(store: StoreFixture)`, a `#[tokio::test]` on the memory
/// store and one on a fresh SQLite file.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::support::StoreFixture::memory()).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::support::StoreFixture::sqlite()).await
                }
            )*
        }
    };
}
