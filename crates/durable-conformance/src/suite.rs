//! The case table and the runner: what a case is, how it is run, what it reports.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe, Location};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use durable_core::{Capabilities, RunQueue, Store, StoreError};

use crate::factory::{StoreFactory, TestStore};

/// What a case returns: `Ok` when it passed. Assertions inside a case panic; an unexpected
/// store error is returned with `?` (and names the line it came from).
pub type CaseResult<T = ()> = Result<T, CaseError>;

/// The future a case runs as.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// Why a case did not pass (other than a failed assertion, which panics).
#[derive(Debug)]
#[non_exhaustive]
pub enum CaseError {
    /// A store call failed that the case expected to succeed.
    Store {
        /// The error.
        error: StoreError,
        /// Where in the case the call was made.
        location: &'static Location<'static>,
    },
    /// The case needs something the store or its factory does not provide: it is skipped.
    Unsupported(Requirement),
}

impl From<StoreError> for CaseError {
    #[track_caller]
    fn from(error: StoreError) -> Self {
        CaseError::Store { error, location: Location::caller() }
    }
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseError::Store { error, location } => {
                write!(f, "store call at {location} failed ({:?}): {error}", error.kind())
            }
            CaseError::Unsupported(req) => write!(f, "store lacks {req}"),
        }
    }
}

impl std::error::Error for CaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CaseError::Store { error, .. } => Some(error),
            CaseError::Unsupported(_) => None,
        }
    }
}

/// Something a case needs beyond the [`Store`] trait. Cases whose requirement is not met are
/// skipped and reported, never failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Requirement {
    /// The store declares [`Capabilities::persistent`].
    Persistent,
    /// The store declares [`Capabilities::shared_across_processes`].
    SharedAcrossProcesses,
    /// The store declares [`Capabilities::tasks`]: it keeps a task queue for remote steps.
    Tasks,
    /// The store declares [`Capabilities::admission`]: it keeps admission records.
    Admission,
    /// The store declares [`Capabilities::claimed_dispatch`]: it writes a task dispatched to a
    /// worker claimed by it.
    ClaimedDispatch,
    /// The factory opens a second handle on a store ([`StoreFactory::second_handle`]).
    SecondHandle,
    /// The factory reopens a store after a drop ([`StoreFactory::reopen`]).
    Reopen,
    /// The factory can build stores in this environment ([`StoreFactory::unavailable`] returns
    /// `None`): an external server it needs is configured.
    Environment,
    /// The store keeps a run queue ([`RunQueue`]) and the factory hands it over
    /// ([`TestStore::new_with_queue`]).
    RunQueue,
    /// The factory opens the run queue of a second handle on a store
    /// ([`StoreFactory::second_queue`]).
    SecondQueue,
}

impl Requirement {
    /// Whether capabilities declared by a store meet this requirement. The factory
    /// requirements ([`Requirement::SecondHandle`], [`Requirement::Reopen`],
    /// [`Requirement::RunQueue`], [`Requirement::SecondQueue`]) are only known when the case
    /// asks the factory, so they count as met here.
    pub fn met_by(self, caps: Capabilities) -> bool {
        match self {
            Requirement::Persistent => caps.persistent,
            Requirement::SharedAcrossProcesses => caps.shared_across_processes,
            Requirement::Tasks => caps.tasks,
            Requirement::Admission => caps.admission,
            Requirement::ClaimedDispatch => caps.claimed_dispatch,
            Requirement::SecondHandle
            | Requirement::Reopen
            | Requirement::Environment
            | Requirement::RunQueue
            | Requirement::SecondQueue => true,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Requirement::Persistent => "persistent",
            Requirement::SharedAcrossProcesses => "shared_across_processes",
            Requirement::Tasks => "tasks",
            Requirement::Admission => "admission",
            Requirement::ClaimedDispatch => "claimed_dispatch",
            Requirement::SecondHandle => "second_handle (StoreFactory::second_handle returned None)",
            Requirement::Reopen => "reopen (StoreFactory::reopen returned None)",
            Requirement::Environment => "a configured environment (StoreFactory::unavailable returned Some)",
            Requirement::RunQueue => "run_queue (the factory's TestStore has none: TestStore::new_with_queue)",
            Requirement::SecondQueue => "second_queue (StoreFactory::second_queue returned None)",
        })
    }
}

/// How a case is called: what it needs the runner to hand it.
#[derive(Debug, Clone, Copy)]
pub enum CaseFn {
    /// On one fresh store.
    Store(fn(Arc<dyn Store>) -> CaseFuture<'static>),
    /// On two handles on one fresh store (the second from [`StoreFactory::second_handle`]).
    TwoHandles(fn(Arc<dyn Store>, Arc<dyn Store>) -> CaseFuture<'static>),
    /// With the factory and a fresh store; the case tears the store down itself.
    Factory(for<'a> fn(&'a dyn StoreFactory, TestStore) -> CaseFuture<'a>),
    /// On one fresh store and its run queue ([`TestStore::queue`]).
    Queue(fn(Arc<dyn Store>, Arc<dyn RunQueue>) -> CaseFuture<'static>),
    /// On one fresh store, its run queue and the run queue of a second handle on it (from
    /// [`StoreFactory::second_queue`]).
    #[allow(clippy::type_complexity)] // a plain fn pointer, like its siblings
    TwoQueues(fn(Arc<dyn Store>, Arc<dyn RunQueue>, Arc<dyn RunQueue>) -> CaseFuture<'static>),
}

/// One conformance case: an entry of [`CASES`].
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The case's name, unique in [`CASES`] (also the name of its `#[test]` and of its
    /// function in [`crate::cases`]).
    pub name: &'static str,
    /// The module of [`crate::cases`] it lives in.
    pub area: &'static str,
    /// What it needs beyond the [`Store`] trait.
    pub requires: &'static [Requirement],
    /// The case itself.
    pub run: CaseFn,
}

crate::__store_cases!(__store_case_table {});

/// The case named `name`, if there is one.
pub fn find_case(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

/// How one case went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseOutcome {
    /// Every assertion held.
    Passed,
    /// Not run: the store or its factory lacks what the case needs.
    Skipped(Requirement),
    /// An assertion failed, the case panicked, or a store call failed unexpectedly.
    Failed(String),
}

/// Runs one case on a fresh store from `factory`, tears the store down and reports how it
/// went. Panics inside the case (failed assertions) are caught and reported as
/// [`CaseOutcome::Failed`].
///
/// Needs a tokio runtime with the time driver enabled (cases spawn tasks to race store calls).
///
/// A factory that reports itself [unavailable](StoreFactory::unavailable) gets every case
/// [skipped](CaseOutcome::Skipped) with [`Requirement::Environment`], without being asked for a
/// store.
pub async fn run_case(factory: &dyn StoreFactory, case: &Case) -> CaseOutcome {
    if factory.unavailable().is_some() {
        return CaseOutcome::Skipped(Requirement::Environment);
    }
    let fixture = match factory.create().await {
        Ok(fixture) => fixture,
        Err(e) => return CaseOutcome::Failed(format!("the factory could not create a store: {e}")),
    };
    let caps = fixture.store().capabilities();
    let outcome = match case.requires.iter().find(|r| !r.met_by(caps)) {
        Some(missing) => CaseOutcome::Skipped(*missing),
        None => match case.run {
            CaseFn::Store(f) => outcome(catch_unwind(f(fixture.store().clone())).await),
            CaseFn::TwoHandles(f) => match factory.second_handle(&fixture).await {
                None => CaseOutcome::Skipped(Requirement::SecondHandle),
                Some(Err(e)) => CaseOutcome::Failed(format!("the factory could not open a second handle: {e}")),
                Some(Ok(second)) => outcome(catch_unwind(f(fixture.store().clone(), second)).await),
            },
            // The case owns the store from here on, and tears it down itself.
            CaseFn::Factory(f) => return outcome(catch_unwind(f(factory, fixture)).await),
            CaseFn::Queue(f) => match fixture.queue() {
                None => CaseOutcome::Skipped(Requirement::RunQueue),
                Some(queue) => outcome(catch_unwind(f(fixture.store().clone(), queue.clone())).await),
            },
            CaseFn::TwoQueues(f) => match fixture.queue() {
                None => CaseOutcome::Skipped(Requirement::RunQueue),
                Some(queue) => match factory.second_queue(&fixture).await {
                    None => CaseOutcome::Skipped(Requirement::SecondQueue),
                    Some(Err(e)) => CaseOutcome::Failed(format!("the factory could not open a second queue: {e}")),
                    Some(Ok(second)) => outcome(catch_unwind(f(fixture.store().clone(), queue.clone(), second)).await),
                },
            },
        },
    };
    match (factory.teardown(fixture).await, outcome) {
        (Err(e), CaseOutcome::Passed) => CaseOutcome::Failed(format!("teardown failed: {e}")),
        (_, outcome) => outcome,
    }
}

fn outcome(result: Result<CaseResult, Box<dyn Any + Send>>) -> CaseOutcome {
    match result {
        Ok(Ok(())) => CaseOutcome::Passed,
        Ok(Err(CaseError::Unsupported(req))) => CaseOutcome::Skipped(req),
        Ok(Err(e)) => CaseOutcome::Failed(e.to_string()),
        Err(panic) => CaseOutcome::Failed(panic_message(&*panic)),
    }
}

pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "the case panicked".to_string(),
    }
}

/// Polls a future, turning a panic in it into an `Err` (like `futures`' `catch_unwind`).
pub(crate) async fn catch_unwind<F: Future + Unpin>(future: F) -> Result<F::Output, Box<dyn Any + Send>> {
    struct CatchUnwind<F>(F);
    impl<F: Future + Unpin> Future for CatchUnwind<F> {
        type Output = Result<F::Output, Box<dyn Any + Send>>;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.0).poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
                Err(panic) => Poll::Ready(Err(panic)),
            }
        }
    }
    CatchUnwind(future).await
}

/// The outcome of every case of a suite run, in [`CASES`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SuiteReport {
    /// Each case's name and outcome.
    pub outcomes: Vec<(&'static str, CaseOutcome)>,
}

impl SuiteReport {
    /// How many cases passed.
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|(_, o)| *o == CaseOutcome::Passed).count()
    }

    /// The skipped cases and what each lacked.
    pub fn skipped(&self) -> impl Iterator<Item = (&'static str, Requirement)> + '_ {
        self.outcomes.iter().filter_map(|(name, o)| match o {
            CaseOutcome::Skipped(req) => Some((*name, *req)),
            _ => None,
        })
    }

    /// The failed cases and why.
    pub fn failed(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.outcomes.iter().filter_map(|(name, o)| match o {
            CaseOutcome::Failed(why) => Some((*name, why.as_str())),
            _ => None,
        })
    }

    /// Whether no case failed (skips are not failures).
    pub fn is_success(&self) -> bool {
        self.failed().next().is_none()
    }

    /// Panics with the report if a case failed.
    #[track_caller]
    pub fn assert_success(&self) {
        assert!(self.is_success(), "{self}");
    }
}

impl fmt::Display for SuiteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (skipped, failed) = (self.skipped().count(), self.failed().count());
        writeln!(f, "store conformance: {} passed, {skipped} skipped, {failed} failed", self.passed())?;
        for (name, req) in self.skipped() {
            writeln!(f, "skipped {name}: store lacks {req}")?;
        }
        for (name, why) in self.failed() {
            writeln!(f, "FAILED {name}: {why}")?;
        }
        Ok(())
    }
}

/// Runs every case of [`CASES`] in order, each on its own fresh store, and reports them all
/// (it does not stop at the first failure). For custom harnesses; the
/// [`store_conformance_tests!`](crate::store_conformance_tests) macro is the usual way.
///
/// ```no_run
/// # async fn demo() {
/// use durable_conformance::{FnFactory, run_all};
/// use durable_store_memory::MemoryStore;
///
/// let report = run_all(&FnFactory::new(|| async { Ok(MemoryStore::new()) })).await;
/// print!("{report}");
/// report.assert_success();
/// # }
/// ```
pub async fn run_all(factory: &dyn StoreFactory) -> SuiteReport {
    let mut report = SuiteReport::default();
    for case in CASES {
        report.outcomes.push((case.name, run_case(factory, case).await));
    }
    report
}

#[cfg(test)]
mod tests {
    use durable_core::admission::{Admission, GateStats, SlotRecord, SlotRequest, WaiterRecord};
    use durable_core::task::{
        BeatOutcome, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, WorkerInfo,
    };
    use durable_core::{
        BufferedDeliveries, BufferedPurge, BufferedQuery, Checkpoint, Claim, ClaimOutcome, Commit, CommitOutcome,
        CreateRun, Delivery, DueQuery, Millis, NewRun, Payload, Publish, Published, QueuedRun, Run, RunCount,
        RunFilter, RunId, RunPage, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule, ScheduleRecord,
        StoreResult, TaskFilter, TriggerBuffer, Waiter,
    };
    use durable_store_memory::MemoryStore;

    use super::*;
    use crate::FnFactory;

    /// One `MemoryStore` behind any number of handles, declared persistent and shared, so the
    /// handle and persistence cases (skipped for the plain `MemoryStore`) run here too; the
    /// flag is [`Capabilities::tasks`].
    #[derive(Debug, Clone)]
    struct SharedMemory(Arc<MemoryStore>, bool);

    #[async_trait::async_trait]
    impl Store for SharedMemory {
        fn capabilities(&self) -> Capabilities {
            Capabilities::FULL.with_tasks(self.1).with_claimed_dispatch(self.1)
        }
        async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
            self.0.create_run(run).await
        }
        async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
            self.0.create_runs(runs).await
        }
        async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
            self.0.get_run(id).await
        }
        async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
            self.0.list_runs(filter).await
        }
        async fn run_counts(&self) -> StoreResult<Vec<RunCount>> {
            self.0.run_counts().await
        }
        async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
            self.0.history(id).await
        }
        async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
            self.0.claim_run(claim).await
        }
        async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
            self.0.renew_lease(id, owner, lease_until).await
        }
        async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
            self.0.release_lease(id, owner).await
        }
        async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
            self.0.commit(commit).await
        }
        async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
            self.0.update_run_if(id, expected, patch).await
        }
        async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
            self.0.pending_runs(query).await
        }
        async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
            self.0.due_runs(query).await
        }
        async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
            self.0.claim_due_runs(query, until).await
        }
        async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
            self.0.orphaned_runs(query).await
        }
        async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
            self.0.send_signal(token, payload, now).await
        }
        async fn publish(&self, event: Publish) -> StoreResult<Published> {
            self.0.publish(event).await
        }
        async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
            self.0.due_buffers(query).await
        }
        async fn flush_buffer(
            &self,
            workflow: &str,
            key: &str,
            batch_id: &str,
            now: Millis,
            admission: Option<SlotRequest>,
        ) -> StoreResult<Option<CreateRun>> {
            self.0.flush_buffer(workflow, key, batch_id, now, admission).await
        }
        async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
            self.0.get_schedule(key).await
        }
        async fn list_schedules(
            &self,
            namespace: Option<&str>,
            after: Option<&str>,
            limit: usize,
        ) -> StoreResult<Vec<ScheduleRecord>> {
            self.0.list_schedules(namespace, after, limit).await
        }
        async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
            self.0.save_schedule(save).await
        }
        async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
            self.0.save_schedules(saves).await
        }
        async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
            self.0.delete_schedule(key).await
        }
        async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
            self.0.due_schedules(query).await
        }
        async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
            self.0.claim_tasks(claim).await
        }
        async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
            self.0.heartbeat_task(beat).await
        }
        async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
            self.0.complete_task(done).await
        }
        async fn release_tasks(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
            self.0.release_tasks(tasks, worker).await
        }
        async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<Task>> {
            self.0.list_tasks(filter).await
        }
        async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
            self.0.queue_stats().await
        }
        async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
            self.0.register_worker(worker).await
        }
        async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
            self.0.remove_worker(id).await
        }
        async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
            self.0.workers(heartbeat_before).await
        }
        async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
            self.0.acquire_slot(request).await
        }
        async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
            self.0.release_slot(gate, holder, now).await
        }
        async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
            self.0.admission_stats(now).await
        }
        async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
            self.0.run_admission(id).await
        }
        async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
            self.0.waiters(id).await
        }
        async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
            self.0.get_state(id, key).await
        }
        async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
            self.0.buffered(query).await
        }
        async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
            self.0.purge_buffered(purge).await
        }
        async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
            self.0.delete_run(id).await
        }
    }

    #[async_trait::async_trait]
    impl RunQueue for SharedMemory {
        async fn enqueue(&self, items: Vec<QueuedRun>, now: Millis) -> StoreResult<()> {
            self.0.enqueue(items, now).await
        }
        async fn claim_queued(
            &self,
            namespace: Option<&str>,
            owner: &str,
            limit: usize,
            claim_until: Millis,
            now: Millis,
        ) -> StoreResult<Vec<QueuedRun>> {
            self.0.claim_queued(namespace, owner, limit, claim_until, now).await
        }
        async fn ack_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
            self.0.ack_queued(ids, owner).await
        }
        async fn release_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
            self.0.release_queued(ids, owner).await
        }
        async fn queued_len(&self) -> StoreResult<u64> {
            self.0.queued_len().await
        }
    }

    /// Builds [`SharedMemory`] stores (with their run queue); the data lives in the guard, so
    /// handles and reopens find it.
    struct SharedFactory {
        handles: bool,
        tasks: bool,
    }

    #[async_trait::async_trait]
    impl StoreFactory for SharedFactory {
        async fn create(&self) -> StoreResult<TestStore> {
            let data = SharedMemory(Arc::default(), self.tasks);
            Ok(TestStore::new_with_queue(data.clone()).with_guard(data))
        }
        async fn second_handle(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
            let data = store.guard::<SharedMemory>().filter(|_| self.handles)?;
            Some(Ok(Arc::new(data.clone())))
        }
        async fn second_queue(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn RunQueue>>> {
            let data = store.guard::<SharedMemory>().filter(|_| self.handles)?;
            Some(Ok(Arc::new(data.clone())))
        }
        async fn reopen(&self, store: &TestStore) -> Option<StoreResult<Arc<dyn Store>>> {
            assert!(store.is_closed(), "reopen is asked after the case closed its handle");
            Some(Ok(Arc::new(store.guard::<SharedMemory>()?.clone())))
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime").block_on(f)
    }

    #[test]
    fn every_case_passes_when_nothing_is_lacking() {
        let report = block_on(run_all(&SharedFactory { handles: true, tasks: true }));
        report.assert_success();
        assert_eq!(report.passed(), CASES.len(), "{report}");
    }

    #[test]
    fn skips_name_what_is_lacking() {
        let report = block_on(run_all(&SharedFactory { handles: false, tasks: true }));
        report.assert_success();
        let skipped: Vec<_> = report.skipped().collect();
        assert!(!skipped.is_empty());
        assert!(
            skipped.iter().all(|(_, req)| matches!(req, Requirement::SecondHandle | Requirement::SecondQueue)),
            "{report}"
        );

        let memory = FnFactory::new(|| async { Ok(MemoryStore::new()) });
        let persistence = find_case("data_survives_reopen").expect("case exists");
        assert_eq!(block_on(run_case(&memory, persistence)), CaseOutcome::Skipped(Requirement::Persistent));
        let queue = find_case("one_unclaimed_item_per_run").expect("case exists");
        assert_eq!(block_on(run_case(&memory, queue)), CaseOutcome::Skipped(Requirement::RunQueue));
        let with_queue = FnFactory::new(|| async { Ok(TestStore::new_with_queue(MemoryStore::new())) });
        assert_eq!(block_on(run_case(&with_queue, queue)), CaseOutcome::Passed);
    }

    #[test]
    fn a_store_without_tasks_skips_the_task_cases() {
        let report = block_on(run_all(&SharedFactory { handles: true, tasks: false }));
        report.assert_success();
        let skipped: Vec<_> = report.skipped().collect();
        // The task cases, and the cases of other areas that need a task queue too.
        let task_cases = CASES.iter().filter(|c| c.requires.contains(&Requirement::Tasks)).count();
        assert!(task_cases >= 22);
        assert_eq!(skipped.len(), task_cases, "{report}");
        assert!(skipped.iter().all(|(_, req)| *req == Requirement::Tasks), "{report}");
    }

    #[test]
    fn an_unavailable_factory_skips_every_case() {
        struct Unconfigured;
        #[async_trait::async_trait]
        impl StoreFactory for Unconfigured {
            fn unavailable(&self) -> Option<String> {
                Some("SERVER_URL is not set".into())
            }
            async fn create(&self) -> StoreResult<TestStore> {
                panic!("an unavailable factory is never asked for a store")
            }
        }
        let report = block_on(run_all(&Unconfigured));
        report.assert_success();
        assert_eq!(report.skipped().count(), CASES.len());
        assert!(report.skipped().all(|(_, req)| req == Requirement::Environment), "{report}");
    }

    #[test]
    fn case_names_are_unique_and_cover_the_contract() {
        let mut names: Vec<_> = CASES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CASES.len(), "case names are unique");
        assert!(CASES.len() >= 45);
        assert!(find_case("no_such_case").is_none());
    }

    #[test]
    fn failures_are_reported_not_raised() {
        async fn fails(_: Arc<dyn Store>) -> CaseResult {
            Err(StoreError::unavailable("down"))?;
            Ok(())
        }
        async fn panics(_: Arc<dyn Store>) -> CaseResult {
            panic!("assertion in a case")
        }
        let memory = FnFactory::new(|| async { Ok(MemoryStore::new()) });
        let case = |name, f: fn(Arc<dyn Store>) -> CaseFuture<'static>| Case {
            name,
            area: "test",
            requires: &[],
            run: CaseFn::Store(f),
        };
        match block_on(run_case(&memory, &case("fails", |s| Box::pin(fails(s))))) {
            CaseOutcome::Failed(why) => assert!(why.contains("suite.rs") && why.contains("Unavailable"), "{why}"),
            other => panic!("{other:?}"),
        }
        let outcome = block_on(run_case(&memory, &case("panics", |s| Box::pin(panics(s)))));
        assert_eq!(outcome, CaseOutcome::Failed("assertion in a case".into()));
    }
}
