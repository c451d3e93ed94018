//! Turning the store flags into a store, and the engine operator commands use.

use std::sync::Arc;

use durable::store::Store;
use durable::{Durability, Engine, SqliteOptions, SqliteStore};

use crate::cli::StoreArgs;
use crate::error::Result;

/// Whether a command may create the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Operator commands: only an existing durable database is opened; a missing or empty file
    /// is refused ("… is not a durable database") and nothing is created.
    Existing,
    /// The demo (a worker): a missing file is created and initialised.
    CreateIfMissing,
}

impl StoreArgs {
    /// Where the runs are, for messages.
    pub(crate) fn describe(&self) -> String {
        self.db.display().to_string()
    }

    /// Opens the store the flags name.
    pub(crate) fn open(&self, access: Access) -> Result<Arc<dyn Store>> {
        let options = match access {
            // One short-lived command: one reader is plenty.
            Access::Existing => SqliteOptions::new().create_if_missing(false).readers(1),
            // The demo shows throughput, and a crash (kill -9) still loses nothing with
            // `Normal`; only a power loss could lose the last commits of a demo.
            Access::CreateIfMissing => SqliteOptions::new().durability(Durability::Normal),
        };
        Ok(Arc::new(SqliteStore::open_with(&self.db, options)?))
    }
}

/// Runs `f` with a client engine on `store`: it executes nothing itself.
///
/// Why an engine and not the store alone: `retry`, `cancel` and `signal` are engine logic
/// (history truncation and retried children, recursive cancels that notify parents, payload
/// checks and limits) that must not be written twice. A client engine
/// ([`EngineBuilder::client_only`](durable::EngineBuilder::client_only)) runs no pollers and
/// never claims a run: the runs an operation wakes are left to the workers that have their
/// workflows registered.
pub(crate) async fn with_operator_engine<T, F, Fut>(store: Arc<dyn Store>, f: F) -> Result<T>
where
    F: FnOnce(Engine) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let engine = Engine::builder().shared_store(store).client_only().build()?;
    let result = f(engine.clone()).await;
    engine.shutdown().await;
    result
}
