//! [`FaultyStore`]: a store wrapper that injects errors and latency.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_core::TaskFilter;
use durable_core::admission::{Admission, GateStats, SlotRecord, SlotRequest, WaiterRecord};
use durable_core::task::{BeatOutcome, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, WorkerInfo};
use durable_core::{
    BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Capabilities, Checkpoint, Claim, ClaimOutcome,
    Commit, CommitOutcome, CreateRun, Delivery, DueQuery, Millis, NewRun, Payload, Publish, Published, Run, RunCount,
    RunFilter, RunId, RunPage, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule, ScheduleRecord, Store,
    StoreError, StoreResult, TriggerBuffer, Waiter,
};
use parking_lot::Mutex;

/// A method of the [`Store`] trait (all but `capabilities`, which cannot fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Method {
    /// [`Store::create_run`].
    CreateRun,
    /// [`Store::create_runs`].
    CreateRuns,
    /// [`Store::get_run`].
    GetRun,
    /// [`Store::get_runs`].
    GetRuns,
    /// [`Store::list_runs`].
    ListRuns,
    /// [`Store::run_counts`].
    RunCounts,
    /// [`Store::history`].
    History,
    /// [`Store::claim_run`].
    ClaimRun,
    /// [`Store::renew_lease`].
    RenewLease,
    /// [`Store::release_lease`].
    ReleaseLease,
    /// [`Store::commit`].
    Commit,
    /// [`Store::commit_and_claim_handed`] (an engine's settle of a run under a concurrency
    /// key; a fault on [`Method::Commit`] does not select it).
    CommitAndClaimHanded,
    /// [`Store::update_run_if`].
    UpdateRunIf,
    /// [`Store::pending_runs`].
    PendingRuns,
    /// [`Store::due_runs`].
    DueRuns,
    /// [`Store::claim_due_runs`].
    ClaimDueRuns,
    /// [`Store::orphaned_runs`].
    OrphanedRuns,
    /// [`Store::send_signal`].
    SendSignal,
    /// [`Store::send_signal_and_claim`] (an engine's signal to a run whose suspended turn it
    /// keeps in memory; a fault on [`Method::SendSignal`] does not select it).
    SendSignalAndClaim,
    /// [`Store::publish`] (and `publish_event`, which calls it).
    PublishEvent,
    /// [`Store::due_buffers`].
    DueBuffers,
    /// [`Store::flush_buffer`].
    FlushBuffer,
    /// [`Store::get_schedule`].
    GetSchedule,
    /// [`Store::list_schedules`].
    ListSchedules,
    /// [`Store::save_schedule`].
    SaveSchedule,
    /// [`Store::save_schedules`].
    SaveSchedules,
    /// [`Store::delete_schedule`].
    DeleteSchedule,
    /// [`Store::due_schedules`].
    DueSchedules,
    /// [`Store::claim_tasks`].
    ClaimTasks,
    /// [`Store::heartbeat_task`].
    HeartbeatTask,
    /// [`Store::complete_task`].
    CompleteTask,
    /// [`Store::complete_task_and_claim`].
    CompleteTaskAndClaim,
    /// [`Store::release_tasks`].
    ReleaseTasks,
    /// [`Store::list_tasks`].
    ListTasks,
    /// [`Store::queue_stats`].
    QueueStats,
    /// [`Store::register_worker`].
    RegisterWorker,
    /// [`Store::remove_worker`].
    RemoveWorker,
    /// [`Store::workers`].
    Workers,
    /// [`Store::acquire_slot`].
    AcquireSlot,
    /// [`Store::release_slot`].
    ReleaseSlot,
    /// [`Store::admission_stats`].
    AdmissionStats,
    /// [`Store::run_admission`].
    RunAdmission,
    /// [`Store::waiters`].
    Waiters,
    /// [`Store::get_state`].
    GetState,
    /// [`Store::buffered`].
    Buffered,
    /// [`Store::purge_buffered`].
    PurgeBuffered,
    /// [`Store::delete_run`].
    DeleteRun,
}

impl Method {
    /// Every method, in trait order.
    pub const ALL: [Method; 47] = [
        Method::CreateRun,
        Method::CreateRuns,
        Method::GetRun,
        Method::GetRuns,
        Method::ListRuns,
        Method::RunCounts,
        Method::History,
        Method::ClaimRun,
        Method::RenewLease,
        Method::ReleaseLease,
        Method::Commit,
        Method::CommitAndClaimHanded,
        Method::UpdateRunIf,
        Method::PendingRuns,
        Method::DueRuns,
        Method::ClaimDueRuns,
        Method::OrphanedRuns,
        Method::SendSignal,
        Method::SendSignalAndClaim,
        Method::PublishEvent,
        Method::DueBuffers,
        Method::FlushBuffer,
        Method::GetSchedule,
        Method::ListSchedules,
        Method::SaveSchedule,
        Method::SaveSchedules,
        Method::DeleteSchedule,
        Method::DueSchedules,
        Method::ClaimTasks,
        Method::HeartbeatTask,
        Method::CompleteTask,
        Method::CompleteTaskAndClaim,
        Method::ReleaseTasks,
        Method::ListTasks,
        Method::QueueStats,
        Method::RegisterWorker,
        Method::RemoveWorker,
        Method::Workers,
        Method::AcquireSlot,
        Method::ReleaseSlot,
        Method::AdmissionStats,
        Method::RunAdmission,
        Method::Waiters,
        Method::GetState,
        Method::Buffered,
        Method::PurgeBuffered,
        Method::DeleteRun,
    ];

    /// The method's name in the trait (`"create_run"`, `"commit"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Method::CreateRun => "create_run",
            Method::CreateRuns => "create_runs",
            Method::GetRun => "get_run",
            Method::GetRuns => "get_runs",
            Method::ListRuns => "list_runs",
            Method::RunCounts => "run_counts",
            Method::History => "history",
            Method::ClaimRun => "claim_run",
            Method::RenewLease => "renew_lease",
            Method::ReleaseLease => "release_lease",
            Method::Commit => "commit",
            Method::CommitAndClaimHanded => "commit_and_claim_handed",
            Method::UpdateRunIf => "update_run_if",
            Method::PendingRuns => "pending_runs",
            Method::DueRuns => "due_runs",
            Method::ClaimDueRuns => "claim_due_runs",
            Method::OrphanedRuns => "orphaned_runs",
            Method::SendSignal => "send_signal",
            Method::SendSignalAndClaim => "send_signal_and_claim",
            Method::PublishEvent => "publish",
            Method::DueBuffers => "due_buffers",
            Method::FlushBuffer => "flush_buffer",
            Method::GetSchedule => "get_schedule",
            Method::ListSchedules => "list_schedules",
            Method::SaveSchedule => "save_schedule",
            Method::SaveSchedules => "save_schedules",
            Method::DeleteSchedule => "delete_schedule",
            Method::DueSchedules => "due_schedules",
            Method::ClaimTasks => "claim_tasks",
            Method::HeartbeatTask => "heartbeat_task",
            Method::CompleteTask => "complete_task",
            Method::CompleteTaskAndClaim => "complete_task_and_claim",
            Method::ReleaseTasks => "release_tasks",
            Method::ListTasks => "list_tasks",
            Method::QueueStats => "queue_stats",
            Method::RegisterWorker => "register_worker",
            Method::RemoveWorker => "remove_worker",
            Method::Workers => "workers",
            Method::AcquireSlot => "acquire_slot",
            Method::ReleaseSlot => "release_slot",
            Method::AdmissionStats => "admission_stats",
            Method::RunAdmission => "run_admission",
            Method::Waiters => "waiters",
            Method::GetState => "get_state",
            Method::Buffered => "buffered",
            Method::PurgeBuffered => "purge_buffered",
            Method::DeleteRun => "delete_run",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One call made to a [`FaultyStore`], as fault predicates and error builders see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Call<'a> {
    /// The method called.
    pub method: Method,
    /// The run the call addresses, if it addresses one (the run created — the first of a
    /// `create_runs` batch —, claimed, committed, read, …).
    pub run_id: Option<&'a RunId>,
    /// The signal token (`send_signal`), event name (`publish`), schedule key
    /// (`get_schedule`, `save_schedule`, `delete_schedule`), workflow (`flush_buffer`) or
    /// worker id (`claim_tasks`, `heartbeat_task`, `complete_task` when a worker reports,
    /// `release_tasks`, `register_worker`, `remove_worker`).
    pub token: Option<&'a str>,
    /// The position of this call among every call the wrapper received, from 1.
    pub number: u64,
}

type Predicate = Arc<dyn Fn(&Call<'_>) -> bool + Send + Sync>;
type ErrorBuilder = Arc<dyn Fn(&Call<'_>) -> StoreError + Send + Sync>;
type LatencyFn = Arc<dyn Fn(&Call<'_>) -> Duration + Send + Sync>;

/// A fault to arm on a [`FaultyStore`]: which calls fail, how many times, with what error.
///
/// Built from a selector ([`Fault::every_call`], [`Fault::on`], [`Fault::when`],
/// [`Fault::nth_call`]) and refined with [`Fault::nth`], [`Fault::after`], [`Fault::times`],
/// [`Fault::error`] and [`Fault::after_apply`]. By default a fault fails every selected call
/// until it is cleared, before the call reaches the wrapped store, with a retryable
/// [`StoreError::Unavailable`].
///
/// ```
/// use durable_conformance::{Fault, Method};
/// use durable_core::StoreError;
///
/// // The third commit fails, once.
/// let third_commit = Fault::on(Method::Commit).nth(3);
/// // Every claim of run "poison" fails with a non-retryable error, until cleared.
/// let poison = Fault::when(|c| c.method == Method::ClaimRun && c.run_id.is_some_and(|r| r.as_str() == "poison"))
///     .error(|_| StoreError::Unavailable { message: "disk gone".into(), retryable: false });
/// // Two commits are applied but their answers are lost.
/// let lost_acks = Fault::on(Method::Commit).times(2).after_apply();
/// # let _ = (third_commit, poison, lost_acks);
/// ```
#[derive(Clone)]
pub struct Fault {
    selects: Predicate,
    skip: u64,
    times: Option<u64>,
    error: ErrorBuilder,
    after_apply: bool,
    hang: bool,
}

impl Fault {
    /// Every call.
    pub fn every_call() -> Self {
        Fault::when(|_| true)
    }

    /// Every call of `method`.
    pub fn on(method: Method) -> Self {
        Fault::when(move |call| call.method == method)
    }

    /// Every call `selects` accepts (it sees the method, the run id and the token).
    pub fn when(selects: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static) -> Self {
        Fault {
            selects: Arc::new(selects),
            skip: 0,
            times: None,
            error: Arc::new(|call| StoreError::Unavailable {
                message: format!("injected fault on {} (call #{})", call.method, call.number),
                retryable: true,
            }),
            after_apply: false,
            hang: false,
        }
    }

    /// Only the `n`-th call (from 1) of any method made after the fault is armed.
    pub fn nth_call(n: u64) -> Self {
        Fault::every_call().nth(n)
    }

    /// Only the `n`-th selected call (from 1) made after the fault is armed, once.
    pub fn nth(self, n: u64) -> Self {
        self.after(n.saturating_sub(1)).times(1)
    }

    /// Lets the first `n` selected calls through before failing any.
    pub fn after(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }

    /// Fails `n` selected calls, then disarms itself (default: until cleared).
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }

    /// The error returned, built per call (default: a retryable `Unavailable`).
    pub fn error(mut self, error: impl Fn(&Call<'_>) -> StoreError + Send + Sync + 'static) -> Self {
        self.error = Arc::new(error);
        self
    }

    /// The call reaches the wrapped store and is applied, then its answer is replaced by the
    /// error: a lost acknowledgement (the write happened, the caller cannot know).
    pub fn after_apply(mut self) -> Self {
        self.after_apply = true;
        self
    }

    /// The call never answers (its future stays pending until dropped), as when the process
    /// making it is killed during the call. With [`Fault::after_apply`] the call is applied
    /// first. The error builder is not used.
    pub fn hang(mut self) -> Self {
        self.hang = true;
        self
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fault")
            .field("skip", &self.skip)
            .field("times", &self.times)
            .field("after_apply", &self.after_apply)
            .field("hang", &self.hang)
            .finish_non_exhaustive()
    }
}

/// A fault armed on a store, with its counters.
#[derive(Debug)]
struct Armed {
    fault: Fault,
    selected: u64,
    fired: u64,
}

#[derive(Default)]
struct Control {
    faults: Vec<Armed>,
    latency: Duration,
    method_latency: BTreeMap<Method, Duration>,
    latency_fn: Option<LatencyFn>,
    counts: BTreeMap<Method, u64>,
    total: u64,
    injected: u64,
}

/// What a fault does to the call it fires on.
enum Effect {
    Fail(StoreError),
    Hang,
}

/// What to do with one call, decided under the lock.
struct Plan {
    latency: Duration,
    /// The fault's effect, and whether the call is applied first.
    fail: Option<(Effect, bool)>,
}

impl Control {
    fn plan(&mut self, method: Method, run_id: Option<&RunId>, token: Option<&str>) -> Plan {
        self.total += 1;
        *self.counts.entry(method).or_default() += 1;
        let call = Call { method, run_id, token, number: self.total };
        let mut fail = None;
        for armed in &mut self.faults {
            if !(armed.fault.selects)(&call) {
                continue;
            }
            armed.selected += 1;
            let exhausted = armed.fault.times.is_some_and(|t| armed.fired >= t);
            if fail.is_none() && armed.selected > armed.fault.skip && !exhausted {
                armed.fired += 1;
                let effect = if armed.fault.hang { Effect::Hang } else { Effect::Fail((armed.fault.error)(&call)) };
                fail = Some((effect, armed.fault.after_apply));
            }
        }
        self.faults.retain(|a| a.fault.times.is_none_or(|t| a.fired < t));
        self.injected += u64::from(fail.is_some());
        let latency = match &self.latency_fn {
            Some(latency) => latency(&call),
            None => self.method_latency.get(&method).copied().unwrap_or(self.latency),
        };
        Plan { latency, fail }
    }
}

/// A [`Store`] wrapper that injects faults and latency, for testing how an engine (or a
/// runtime test) copes with a failing backend.
///
/// Arm [`Fault`]s with [`FaultyStore::arm`]: the selected calls fail with the fault's error
/// (before reaching the wrapped store, or after it applied them with
/// [`Fault::after_apply`]). [`FaultyStore::set_latency`] delays every call with
/// `tokio::time::sleep` (so a paused tokio clock skips it). Every call is counted per method.
/// With no fault armed and no latency it is transparent: it passes the conformance suite
/// itself.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use durable_conformance::{Fault, FaultyStore, Method};
/// use durable_core::{RunId, Store, StoreErrorKind};
/// use durable_store_memory::MemoryStore;
///
/// let store = Arc::new(FaultyStore::new(MemoryStore::new()));
/// store.arm(Fault::on(Method::GetRun).times(1));
/// let engine_view: Arc<dyn Store> = store.clone();
/// let id = RunId::from("r");
/// let err = engine_view.get_run(&id).await.unwrap_err();
/// assert_eq!(err.kind(), StoreErrorKind::Unavailable);
/// assert!(err.is_retryable());
/// assert_eq!(engine_view.get_run(&id).await.unwrap(), None); // the fault fired once
/// assert_eq!(store.calls(Method::GetRun), 2);
/// # });
/// ```
pub struct FaultyStore<S: ?Sized> {
    inner: Arc<S>,
    control: Mutex<Control>,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner`, with no fault armed and no latency.
    pub fn new(inner: S) -> Self {
        Self::over(Arc::new(inner))
    }
}

impl<S: Store + ?Sized> FaultyStore<S> {
    /// Wraps a store shared with other code: several wrappers over one store (one per
    /// engine of a simulation, say) inject faults independently into the same data.
    pub fn over(inner: Arc<S>) -> Self {
        FaultyStore { inner, control: Mutex::new(Control::default()) }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The wrapped store, shared.
    pub fn into_inner(self) -> Arc<S> {
        self.inner
    }

    /// Arms a fault. Faults are checked in the order they were armed; a call fails with the
    /// first that fires, and is counted by every fault that selects it.
    pub fn arm(&self, fault: Fault) {
        self.control.lock().faults.push(Armed { fault, selected: 0, fired: 0 });
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.control.lock().faults.clear();
    }

    /// How many faults are still armed (a fault with [`Fault::times`] disarms itself).
    pub fn armed(&self) -> usize {
        self.control.lock().faults.len()
    }

    /// How many calls failed because of a fault.
    pub fn injected(&self) -> u64 {
        self.control.lock().injected
    }

    /// Delays every call by `latency` (`Duration::ZERO`: none), unless its method has its own.
    pub fn set_latency(&self, latency: Duration) {
        self.control.lock().latency = latency;
    }

    /// Delays every call of `method` by `latency`, instead of the general latency.
    pub fn set_method_latency(&self, method: Method, latency: Duration) {
        self.control.lock().method_latency.insert(method, latency);
    }

    /// Delays each call by what `latency` says for it (seeded random delays, say), instead of
    /// the fixed latencies.
    pub fn set_latency_with(&self, latency: impl Fn(&Call<'_>) -> Duration + Send + Sync + 'static) {
        self.control.lock().latency_fn = Some(Arc::new(latency));
    }

    /// How many calls of `method` the wrapper received (failed ones included).
    pub fn calls(&self, method: Method) -> u64 {
        self.control.lock().counts.get(&method).copied().unwrap_or(0)
    }

    /// How many calls of each method the wrapper received (methods never called are absent).
    pub fn call_counts(&self) -> BTreeMap<Method, u64> {
        self.control.lock().counts.clone()
    }

    /// How many calls the wrapper received in all.
    pub fn total_calls(&self) -> u64 {
        self.control.lock().total
    }

    /// Sets every call count back to zero.
    pub fn reset_counts(&self) {
        let mut control = self.control.lock();
        control.counts.clear();
        control.total = 0;
    }

    /// Runs one call: counts it, applies latency and faults, and calls the wrapped store.
    async fn call<T>(
        &self,
        method: Method,
        run_id: Option<&RunId>,
        token: Option<&str>,
        inner: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let plan = self.control.lock().plan(method, run_id, token);
        if !plan.latency.is_zero() {
            tokio::time::sleep(plan.latency).await;
        }
        match plan.fail {
            None => inner.await,
            Some((effect, applied)) => {
                if applied {
                    // The write is applied (or fails on its own); either way the caller gets the fault.
                    let _ = inner.await;
                }
                match effect {
                    Effect::Fail(error) => Err(error),
                    Effect::Hang => std::future::pending().await,
                }
            }
        }
    }
}

impl<S: fmt::Debug + ?Sized> fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let control = self.control.lock();
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("armed", &control.faults.len())
            .field("latency", &control.latency)
            .field("calls", &control.total)
            .finish()
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for FaultyStore<S> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
        let id = run.id.clone();
        self.call(Method::CreateRun, Some(&id), None, self.inner.create_run(run)).await
    }

    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        // One call, addressed to the first run of the batch (a fault fails the whole batch).
        let id = runs.first().map(|r| r.id.clone());
        self.call(Method::CreateRuns, id.as_ref(), None, self.inner.create_runs(runs)).await
    }

    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        self.call(Method::GetRun, Some(id), None, self.inner.get_run(id)).await
    }

    async fn get_runs(&self, ids: &[RunId]) -> StoreResult<Vec<Run>> {
        self.call(Method::GetRuns, None, None, self.inner.get_runs(ids)).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
        self.call(Method::ListRuns, None, None, self.inner.list_runs(filter)).await
    }

    async fn run_counts(&self) -> StoreResult<Vec<RunCount>> {
        self.call(Method::RunCounts, None, None, self.inner.run_counts()).await
    }

    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
        self.call(Method::History, Some(id), None, self.inner.history(id)).await
    }

    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
        let id = claim.run_id.clone();
        self.call(Method::ClaimRun, Some(&id), None, self.inner.claim_run(claim)).await
    }

    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
        self.call(Method::RenewLease, Some(id), None, self.inner.renew_lease(id, owner, lease_until)).await
    }

    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
        self.call(Method::ReleaseLease, Some(id), None, self.inner.release_lease(id, owner)).await
    }

    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        let id = commit.run_id.clone();
        self.call(Method::Commit, Some(&id), None, self.inner.commit(commit)).await
    }

    async fn commit_and_claim_handed(
        &self,
        commit: Commit,
        lease_until: Millis,
    ) -> StoreResult<(CommitOutcome, Option<ClaimOutcome>)> {
        let id = commit.run_id.clone();
        self.call(
            Method::CommitAndClaimHanded,
            Some(&id),
            None,
            self.inner.commit_and_claim_handed(commit, lease_until),
        )
        .await
    }

    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
        self.call(Method::UpdateRunIf, Some(id), None, self.inner.update_run_if(id, expected, patch)).await
    }

    async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.call(Method::PendingRuns, None, None, self.inner.pending_runs(query)).await
    }

    async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.call(Method::DueRuns, None, None, self.inner.due_runs(query)).await
    }

    async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
        self.call(Method::ClaimDueRuns, None, None, self.inner.claim_due_runs(query, until)).await
    }

    async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.call(Method::OrphanedRuns, None, None, self.inner.orphaned_runs(query)).await
    }

    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
        self.call(Method::SendSignal, None, Some(token), self.inner.send_signal(token, payload, now)).await
    }

    async fn send_signal_and_claim(
        &self,
        token: &str,
        payload: Payload,
        claim: Claim,
        from_seq: u32,
    ) -> StoreResult<(Delivery, Option<ClaimOutcome>)> {
        let id = claim.run_id.clone();
        let inner = self.inner.send_signal_and_claim(token, payload, claim, from_seq);
        self.call(Method::SendSignalAndClaim, Some(&id), Some(token), inner).await
    }

    async fn publish(&self, event: Publish) -> StoreResult<Published> {
        let name = event.name.clone();
        self.call(Method::PublishEvent, None, Some(&name), self.inner.publish(event)).await
    }

    async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
        self.call(Method::DueBuffers, None, None, self.inner.due_buffers(query)).await
    }

    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<SlotRequest>,
    ) -> StoreResult<Option<CreateRun>> {
        let flush = self.inner.flush_buffer(workflow, key, batch_id, now, admission);
        self.call(Method::FlushBuffer, None, Some(workflow), flush).await
    }

    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
        self.call(Method::GetSchedule, None, Some(key), self.inner.get_schedule(key)).await
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>> {
        self.call(Method::ListSchedules, None, None, self.inner.list_schedules(namespace, after, limit)).await
    }

    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
        let key = save.record.key.clone();
        self.call(Method::SaveSchedule, None, Some(&key), self.inner.save_schedule(save)).await
    }

    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        self.call(Method::SaveSchedules, None, None, self.inner.save_schedules(saves)).await
    }

    async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
        self.call(Method::DeleteSchedule, None, Some(key), self.inner.delete_schedule(key)).await
    }

    async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
        self.call(Method::DueSchedules, None, None, self.inner.due_schedules(query)).await
    }

    async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        self.call(Method::ClaimTasks, None, Some(&claim.worker), self.inner.claim_tasks(claim)).await
    }

    async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        self.call(Method::HeartbeatTask, Some(&beat.run_id), Some(&beat.worker), self.inner.heartbeat_task(beat)).await
    }

    async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
        let (id, worker) = (done.run_id.clone(), done.worker.clone());
        self.call(Method::CompleteTask, Some(&id), worker.as_deref(), self.inner.complete_task(done)).await
    }

    async fn complete_task_and_claim(
        &self,
        done: TaskDone,
        claim: Claim,
    ) -> StoreResult<(TaskCompletion, Option<ClaimOutcome>)> {
        let (id, worker) = (done.run_id.clone(), done.worker.clone());
        let inner = self.inner.complete_task_and_claim(done, claim);
        self.call(Method::CompleteTaskAndClaim, Some(&id), worker.as_deref(), inner).await
    }

    async fn release_tasks(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        let id = tasks.first().map(|t| t.0.clone());
        self.call(Method::ReleaseTasks, id.as_ref(), Some(worker), self.inner.release_tasks(tasks, worker)).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<Task>> {
        self.call(Method::ListTasks, filter.run_id.as_ref(), None, self.inner.list_tasks(filter)).await
    }

    async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.call(Method::QueueStats, None, None, self.inner.queue_stats()).await
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
        self.call(Method::RegisterWorker, None, Some(&worker.id), self.inner.register_worker(worker)).await
    }

    async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
        self.call(Method::RemoveWorker, None, Some(id), self.inner.remove_worker(id)).await
    }

    async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        self.call(Method::Workers, None, None, self.inner.workers(heartbeat_before)).await
    }

    async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
        self.call(Method::AcquireSlot, Some(&request.run_id), None, self.inner.acquire_slot(request)).await
    }

    async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        self.call(Method::ReleaseSlot, None, None, self.inner.release_slot(gate, holder, now)).await
    }

    async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        self.call(Method::AdmissionStats, None, None, self.inner.admission_stats(now)).await
    }

    async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        self.call(Method::RunAdmission, Some(id), None, self.inner.run_admission(id)).await
    }

    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
        self.call(Method::Waiters, Some(id), None, self.inner.waiters(id)).await
    }

    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
        self.call(Method::GetState, Some(id), None, self.inner.get_state(id, key)).await
    }

    async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
        self.call(Method::Buffered, None, None, self.inner.buffered(query)).await
    }

    async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
        let token = (purge.kind == BufferedKind::Signal).then_some(purge.key.as_str());
        self.call(Method::PurgeBuffered, None, token, self.inner.purge_buffered(purge)).await
    }

    async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
        self.call(Method::DeleteRun, Some(id), None, self.inner.delete_run(id)).await
    }
}

#[cfg(test)]
mod tests {
    use durable_core::{NewRun, StoreErrorKind, StoreExt};
    use durable_store_memory::MemoryStore;

    use super::*;

    fn store() -> FaultyStore<MemoryStore> {
        FaultyStore::new(MemoryStore::new())
    }

    fn new_run(id: &str) -> NewRun {
        NewRun {
            trace_context: None,
            admission: None,
            id: RunId::from(id),
            workflow: "wf".into(),
            version: 1,
            namespace: "default".into(),
            input: Payload::null(),
            tags: vec![],
            priority: 0,
            parent: None,
            created_at: 1,
            start_at: None,
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(f)
    }

    #[test]
    fn nth_call_fails_once_before_reaching_the_store() {
        block_on(async {
            let s = store();
            s.arm(Fault::nth_call(2));
            s.create_run(new_run("a")).await.unwrap();
            let err = s.create_run(new_run("b")).await.unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Unavailable);
            assert!(err.is_retryable());
            assert_eq!(s.inner().get_run(&RunId::from("b")).await.unwrap(), None, "refused before the store");
            s.create_run(new_run("b")).await.unwrap();
            assert_eq!((s.armed(), s.injected(), s.total_calls()), (0, 1, 3));
        });
    }

    #[test]
    fn run_counts_is_a_call_of_its_own_forwarded_to_the_store() {
        block_on(async {
            let s = store();
            s.create_run(new_run("a")).await.unwrap();
            s.arm(Fault::on(Method::RunCounts).times(1));
            assert_eq!(s.run_counts().await.unwrap_err().kind(), StoreErrorKind::Unavailable);
            let counts = s.run_counts().await.unwrap();
            assert_eq!(counts, vec![RunCount { workflow: "wf".into(), status: RunStatus::Pending, count: 1 }]);
            // Forwarded as one call, not the default's pages of `list_runs`.
            assert_eq!(s.call_counts(), BTreeMap::from([(Method::CreateRun, 1), (Method::RunCounts, 2)]));
        });
    }

    #[test]
    fn a_hung_call_never_answers_and_after_apply_is_applied_first() {
        block_on(async {
            let s = store();
            s.arm(Fault::on(Method::CreateRun).times(1).hang());
            let hung = tokio::time::timeout(Duration::from_millis(20), s.create_run(new_run("a"))).await;
            assert!(hung.is_err(), "the call never answers");
            assert_eq!(s.inner().get_run(&RunId::from("a")).await.unwrap(), None, "and was not applied");
            s.arm(Fault::on(Method::CreateRun).times(1).after_apply().hang());
            let hung = tokio::time::timeout(Duration::from_millis(20), s.create_run(new_run("b"))).await;
            assert!(hung.is_err(), "the call never answers");
            assert!(s.inner().get_run(&RunId::from("b")).await.unwrap().is_some(), "but was applied");
        });
    }

    #[test]
    fn latency_with_decides_per_call_and_two_wrappers_share_one_store() {
        let shared = Arc::new(MemoryStore::new());
        let (a, b) = (FaultyStore::over(shared.clone()), FaultyStore::over(shared.clone()));
        a.set_latency_with(|call| Duration::from_secs(u64::from(call.method == Method::GetRun) * 3600));
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(
            async {
                let start = tokio::time::Instant::now();
                a.create_run(new_run("a")).await.unwrap();
                assert_eq!(start.elapsed(), Duration::ZERO, "create_run is not delayed");
                assert!(b.get_run(&RunId::from("a")).await.unwrap().is_some(), "b sees what a wrote");
                a.get_run(&RunId::from("a")).await.unwrap();
                assert!(start.elapsed() >= Duration::from_secs(3600), "get_run waits its hour");
            },
        );
    }

    #[test]
    fn method_faults_with_custom_error_until_cleared() {
        block_on(async {
            let s = store();
            s.arm(Fault::on(Method::GetRun).error(|_| StoreError::Conflict { message: "nope".into() }));
            for _ in 0..3 {
                assert_eq!(s.get_run(&RunId::from("x")).await.unwrap_err().kind(), StoreErrorKind::Conflict);
            }
            assert!(s.history(&RunId::from("x")).await.is_ok(), "other methods pass");
            s.clear_faults();
            assert_eq!(s.get_run(&RunId::from("x")).await.unwrap(), None);
            assert_eq!(s.calls(Method::GetRun), 4);
            assert_eq!(s.call_counts(), BTreeMap::from([(Method::GetRun, 4), (Method::History, 1)]));
        });
    }

    #[test]
    fn predicate_sees_run_id_and_token_and_times_limits() {
        block_on(async {
            let s = store();
            s.arm(Fault::when(|c| c.run_id.is_some_and(|r| r.as_str() == "poison")).times(2));
            s.arm(Fault::when(|c| c.token == Some("t")).after(1));
            s.create_run(new_run("fine")).await.unwrap();
            for _ in 0..2 {
                assert!(s.create_run(new_run("poison")).await.is_err());
            }
            s.create_run(new_run("poison")).await.unwrap();
            s.send_signal("t", Payload::null(), 1).await.unwrap();
            assert!(s.send_signal("t", Payload::null(), 1).await.is_err());
            assert!(s.send_signal("u", Payload::null(), 1).await.is_ok());
            assert_eq!(s.armed(), 1);
        });
    }

    #[test]
    fn after_apply_writes_then_fails() {
        block_on(async {
            let s = store();
            s.arm(Fault::on(Method::CreateRun).nth(1).after_apply());
            assert!(s.create_run(new_run("a")).await.is_err());
            assert!(s.require_run(&RunId::from("a")).await.is_ok(), "the write happened");
            s.reset_counts();
            s.get_run(&RunId::from("a")).await.unwrap();
            assert_eq!((s.total_calls(), s.calls(Method::CreateRun)), (1, 0));
        });
    }

    #[test]
    fn task_calls_are_counted_and_faulted_by_worker() {
        use durable_core::task::{TaskClaim, TaskDone};
        block_on(async {
            let s = store();
            s.arm(
                Fault::when(|c| c.token == Some("bad-worker")).error(|_| StoreError::Conflict { message: "x".into() }),
            );
            let claim = |worker: &str| TaskClaim {
                worker: worker.into(),
                queues: vec!["q".into()],
                namespace: None,
                capabilities: vec![],
                limit: 1,
                now: 1,
            };
            let faulted = s.claim_tasks(&claim("bad-worker")).await.unwrap_err();
            assert_eq!(faulted.kind(), StoreErrorKind::Conflict);
            // Another worker's call reaches the wrapped store (whatever it answers).
            let passed = s.claim_tasks(&claim("good-worker")).await;
            assert!(passed.as_ref().err().is_none_or(|e| e.kind() != StoreErrorKind::Conflict), "{passed:?}");
            let done = TaskDone {
                run_id: RunId::from("r"),
                seq: 0,
                attempt: 1,
                worker: Some("bad-worker".into()),
                result: Ok(Payload::null()),
                logs: vec![],
                now: 1,
            };
            assert_eq!(s.complete_task(done).await.unwrap_err().kind(), StoreErrorKind::Conflict);
            let _ = s.workers(0).await;
            assert_eq!(
                s.call_counts(),
                BTreeMap::from([(Method::ClaimTasks, 2), (Method::CompleteTask, 1), (Method::Workers, 1)])
            );
            assert_eq!(
                Method::ALL.iter().filter(|m| m.name().contains("task") || m.name().contains("worker")).count(),
                9
            );
        });
    }

    #[test]
    fn latency_delays_calls_without_changing_answers() {
        block_on(async {
            let s = store();
            s.set_latency(Duration::from_millis(1));
            s.set_method_latency(Method::GetRun, Duration::ZERO);
            s.create_run(new_run("a")).await.unwrap();
            assert!(s.get_run(&RunId::from("a")).await.unwrap().is_some());
        });
    }
}
