//! How the suite gets the stores it tests.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use durable_core::{RunQueue, Store, StoreResult};

/// Builds the stores the conformance suite runs on: one fresh, empty store per case.
///
/// Only [`create`](StoreFactory::create) is required. The optional methods unlock the cases
/// that need them; a factory that does not provide one gets those cases reported as skipped.
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use durable_conformance::{StoreFactory, TestStore};
/// use durable_core::{RunQueue, Store, StoreResult};
/// use durable_store_memory::MemoryStore;
///
/// struct MemoryFactory;
///
/// #[async_trait]
/// impl StoreFactory for MemoryFactory {
///     async fn create(&self) -> StoreResult<TestStore> {
///         Ok(TestStore::new(MemoryStore::new()))
///     }
///     // A file-backed store would also implement `second_handle` (a second connection to the
///     // same file) and `reopen` (the file opened again after every handle was dropped),
///     // finding the file through `store.guard::<tempfile::TempDir>()`.
/// }
/// ```
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// Why this factory cannot build stores in this environment, or `None` (the default) when
    /// it can.
    ///
    /// For stores that need an external server configured from the environment (like sqlx's
    /// `DATABASE_URL`): return `Some("DURABLE_PG_URL is not set; run DURABLE_PG_URL=… cargo
    /// test to run it")` when it is not configured, and every case is skipped — the test prints
    /// `skipped <case>: <reason>` and passes, and [`run_case`](crate::run_case) reports
    /// [`Requirement::Environment`](crate::Requirement::Environment) — instead of failing in
    /// [`create`](StoreFactory::create). Asked before anything else, once per case.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// A fresh, empty store for one case.
    ///
    /// Attach whatever must outlive the store and be cleaned up after it (a temporary
    /// directory, a scratch database schema) with [`TestStore::with_guard`].
    async fn create(&self) -> StoreResult<TestStore>;

    /// A second handle on the same data as `store`, open at the same time as it (SQLite: a
    /// second connection to the same file; PostgreSQL: a second pool on the same schema).
    ///
    /// The cases that check atomicity across handles (a lease taken through one handle is
    /// respected by the other, concurrent claims through both have one winner) run only when
    /// this returns `Some`. The default returns `None`.
    async fn second_handle(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        let _ = store;
        None
    }

    /// The run queue ([`RunQueue`]) of a second handle on the same data as `store`, open at the
    /// same time as it: what [`second_handle`](StoreFactory::second_handle) is to the store, for
    /// a store that also keeps a run queue ([`TestStore::new_with_queue`]).
    ///
    /// The case racing claims of the run queue through two handles runs only when this returns
    /// `Some` (and the store declares
    /// [`Capabilities::shared_across_processes`](durable_core::Capabilities)). The default
    /// returns `None`.
    async fn second_queue(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn RunQueue>>> {
        let _ = store;
        None
    }

    /// The data of `store` opened again, after every handle on it was dropped (including the
    /// [`TestStore`]'s own, see [`TestStore::close`]).
    ///
    /// The persistence cases run only when the store declares
    /// [`Capabilities::persistent`](durable_core::Capabilities) and this returns `Some`. The
    /// default returns `None`.
    async fn reopen(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
        let _ = store;
        None
    }

    /// Tears a case's store down once the case is over, whether it passed or not.
    ///
    /// The default drops it, which drops its handle and then its guard. Override it for
    /// asynchronous cleanup (dropping a database schema).
    async fn teardown(&self, store: TestStore) -> StoreResult<()> {
        drop(store);
        Ok(())
    }
}

/// A store built by a [`StoreFactory`] for one case, with its cleanup guard and, for a store
/// that keeps one, its run queue ([`RunQueue`]).
///
/// Dropping it drops the store handle (and the queue handle) first, then the guard.
pub struct TestStore {
    // Field order matters: the handles are dropped before the guard they may depend on.
    store: Option<Arc<dyn Store>>,
    queue: Option<Arc<dyn RunQueue>>,
    guard: Option<Box<dyn Any + Send + Sync>>,
}

impl TestStore {
    /// Wraps a store.
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Wraps a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        TestStore { store: Some(store), queue: None, guard: None }
    }

    /// Wraps a store that also keeps a run queue ([`RunQueue`], like the in-tree stores): the
    /// run-queue cases run on it. A store wrapped with [`TestStore::new`] has them skipped.
    ///
    /// ```
    /// use durable_conformance::{FnFactory, StoreFactory, TestStore};
    /// use durable_store_memory::MemoryStore;
    ///
    /// let factory: &dyn StoreFactory =
    ///     &FnFactory::new(|| async { Ok(TestStore::new_with_queue(MemoryStore::new())) });
    /// # let _ = factory;
    /// ```
    pub fn new_with_queue<S: Store + RunQueue>(store: S) -> Self {
        let store = Arc::new(store);
        Self::from_arc(store.clone()).with_queue(store)
    }

    /// Attaches the run queue kept with the store's data, when it is a value of its own (a
    /// wrapper, or a queue beside the store). [`TestStore::new_with_queue`] is the usual way.
    pub fn with_queue(mut self, queue: Arc<dyn RunQueue>) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Attaches a value dropped after the store (a temporary directory, a handle on a
    /// scratch schema). [`TestStore::guard`] gives it back, so
    /// [`StoreFactory::second_handle`] and [`StoreFactory::reopen`] can find the data.
    pub fn with_guard(mut self, guard: impl Any + Send + Sync) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }

    /// The guard attached with [`TestStore::with_guard`], if it has type `G`.
    pub fn guard<G: Any>(&self) -> Option<&G> {
        self.guard.as_deref().and_then(|g| g.downcast_ref())
    }

    /// The store handle.
    ///
    /// # Panics
    /// After [`TestStore::close`].
    pub fn store(&self) -> &Arc<dyn Store> {
        self.store.as_ref().expect("TestStore::store called after TestStore::close")
    }

    /// The run queue attached with [`TestStore::new_with_queue`] or [`TestStore::with_queue`],
    /// if any (`None` after [`TestStore::close`]).
    pub fn queue(&self) -> Option<&Arc<dyn RunQueue>> {
        self.queue.as_ref()
    }

    /// Drops this handle on the store (and on its run queue) and keeps the guard, so the data
    /// can be reopened with [`StoreFactory::reopen`].
    pub fn close(&mut self) {
        self.store = None;
        self.queue = None;
    }

    /// Whether [`TestStore::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.store.is_none()
    }
}

impl<S: Store> From<S> for TestStore {
    fn from(store: S) -> Self {
        TestStore::new(store)
    }
}

impl fmt::Debug for TestStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestStore")
            .field("store", &self.store)
            .field("queue", &self.queue)
            .field("guard", &self.guard.as_ref().map(|_| ".."))
            .finish()
    }
}

/// A [`StoreFactory`] made of a closure returning a future of a store.
///
/// The store may be any [`Store`] or a [`TestStore`] (to attach a guard):
///
/// ```
/// use durable_conformance::{FnFactory, StoreFactory};
/// use durable_store_memory::MemoryStore;
///
/// let factory: &dyn StoreFactory = &FnFactory::new(|| async { Ok(MemoryStore::new()) });
/// # let _ = factory;
/// ```
pub struct FnFactory<F> {
    create: F,
}

impl<F> FnFactory<F> {
    /// A factory calling `create` for every case.
    pub fn new(create: F) -> Self {
        FnFactory { create }
    }
}

impl<F> fmt::Debug for FnFactory<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnFactory").finish_non_exhaustive()
    }
}

#[async_trait]
impl<F, Fut, S> StoreFactory for FnFactory<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = StoreResult<S>> + Send + 'static,
    S: Into<TestStore> + Send + 'static,
{
    async fn create(&self) -> StoreResult<TestStore> {
        (self.create)().await.map(Into::into)
    }
}
