//! Certifying stores that are not in the tree, the way a third party does: a small custom
//! store written against the public API only, and the fault-injecting `FaultyStore` with no
//! fault armed, both run through `store_conformance_tests!`. Also shows `run_all` and
//! `run_case` as a custom harness would use them, and that the suite catches a broken store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use durable_conformance::{
    CaseOutcome, Fault, FaultyStore, FnFactory, Method, Requirement, StoreFactory, TestStore, find_case, run_all,
    run_case,
};
use durable_core::admission::{Admission, GateStats, SlotRecord, SlotRequest, WaiterRecord};
use durable_core::task::{BeatOutcome, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, WorkerInfo};
use durable_core::{
    BufferedDeliveries, BufferedPurge, BufferedQuery, Capabilities, Checkpoint, Claim, ClaimOutcome, Commit,
    CommitOutcome, CreateRun, Delivery, DueQuery, Millis, NewRun, Payload, Publish, Published, Run, RunFilter, RunId,
    RunPage, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule, ScheduleRecord, Store, StoreResult, TaskFilter,
    TriggerBuffer, Waiter,
};
use durable_store_memory::MemoryStore;

/// A third party's store: keeps its data in a `MemoryStore` and counts the writes it makes,
/// for its own metrics.
#[derive(Debug, Default)]
struct AuditedStore {
    inner: MemoryStore,
    writes: AtomicU64,
}

impl AuditedStore {
    fn write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Store for AuditedStore {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
        self.write();
        self.inner.create_run(run).await
    }

    // Without it the trait's default would create the runs one by one: correct answers, but
    // neither one round trip nor atomic (the suite's `create_runs_is_seen_whole` would see
    // part of a batch).
    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        self.write();
        self.inner.create_runs(runs).await
    }

    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        self.inner.get_run(id).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
        self.inner.list_runs(filter).await
    }

    // `get_runs` and `run_counts` are left to the trait's defaults (reads through `get_run` and
    // `list_runs`): a store written before they existed, which the suite certifies as it is.

    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
        self.inner.history(id).await
    }

    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
        self.write();
        self.inner.claim_run(claim).await
    }

    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
        self.write();
        self.inner.renew_lease(id, owner, lease_until).await
    }

    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
        self.write();
        self.inner.release_lease(id, owner).await
    }

    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        self.write();
        self.inner.commit(commit).await
    }

    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
        self.write();
        self.inner.update_run_if(id, expected, patch).await
    }

    async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.inner.pending_runs(query).await
    }

    async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.inner.due_runs(query).await
    }

    async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
        self.write();
        self.inner.claim_due_runs(query, until).await
    }

    async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.inner.orphaned_runs(query).await
    }

    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
        self.write();
        self.inner.send_signal(token, payload, now).await
    }

    async fn publish(&self, event: Publish) -> StoreResult<Published> {
        self.write();
        self.inner.publish(event).await
    }

    async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
        self.inner.due_buffers(query).await
    }

    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<durable::admission::SlotRequest>,
    ) -> StoreResult<Option<CreateRun>> {
        self.write();
        self.inner.flush_buffer(workflow, key, batch_id, now, admission).await
    }

    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
        self.inner.get_schedule(key).await
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>> {
        self.inner.list_schedules(namespace, after, limit).await
    }

    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
        self.write();
        self.inner.save_schedule(save).await
    }

    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        self.write();
        self.inner.save_schedules(saves).await
    }

    async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
        self.write();
        self.inner.delete_schedule(key).await
    }

    async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
        self.inner.due_schedules(query).await
    }

    async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        self.write();
        self.inner.claim_tasks(claim).await
    }

    async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        self.write();
        self.inner.heartbeat_task(beat).await
    }

    async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
        self.write();
        self.inner.complete_task(done).await
    }

    async fn release_tasks(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        self.write();
        self.inner.release_tasks(tasks, worker).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<Task>> {
        self.inner.list_tasks(filter).await
    }

    async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.inner.queue_stats().await
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
        self.write();
        self.inner.register_worker(worker).await
    }

    async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
        self.write();
        self.inner.remove_worker(id).await
    }

    async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        self.write();
        self.inner.workers(heartbeat_before).await
    }

    async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
        self.write();
        self.inner.acquire_slot(request).await
    }

    async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        self.write();
        self.inner.release_slot(gate, holder, now).await
    }

    async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        self.inner.admission_stats(now).await
    }

    async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        self.inner.run_admission(id).await
    }

    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
        self.inner.waiters(id).await
    }

    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
        self.inner.get_state(id, key).await
    }

    async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
        self.inner.buffered(query).await
    }

    async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
        self.write();
        self.inner.purge_buffered(purge).await
    }

    async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
        self.write();
        self.inner.delete_run(id).await
    }
}

/// The factory a third party writes by hand (the closure-based `FnFactory` works too).
struct AuditedFactory;

#[async_trait]
impl StoreFactory for AuditedFactory {
    async fn create(&self) -> StoreResult<TestStore> {
        Ok(TestStore::new(AuditedStore::default()))
    }
}

mod audited {
    durable_conformance::store_conformance_tests!(super::AuditedFactory);
}

mod faulty_without_faults {
    use super::*;

    durable_conformance::store_conformance_tests!(FnFactory::new(|| async {
        Ok(FaultyStore::new(MemoryStore::new()))
    }));
}

/// A custom harness: `run_all` runs every case and reports skips instead of failing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_reports_every_case() {
    let report = run_all(&AuditedFactory).await;
    report.assert_success();
    let skipped: Vec<_> = report.skipped().collect();
    assert!(
        skipped.iter().any(|(_, req)| *req == Requirement::Persistent),
        "an in-memory store skips the persistence cases: {report}"
    );
    assert!(skipped.iter().any(|(_, req)| *req == Requirement::SharedAcrossProcesses), "{report}");
    assert_eq!(report.passed() + skipped.len(), durable_conformance::CASES.len());
}

/// The suite fails a store that breaks the contract, and says which call failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_store_fails_the_suite() {
    let broken = FnFactory::new(|| async {
        let store = FaultyStore::new(MemoryStore::new());
        store.arm(Fault::on(Method::Commit));
        Ok(store)
    });
    let case = find_case("step_commit_is_atomic_with_settle").expect("the case exists");
    match run_case(&broken, case).await {
        CaseOutcome::Failed(why) => assert!(why.contains("commit.rs"), "the failure names the call site: {why}"),
        other => panic!("a store whose commits fail passed {}: {other:?}", case.name),
    }
    let lost_acks = FnFactory::new(|| async {
        let store = Arc::new(FaultyStore::new(MemoryStore::new()));
        store.arm(Fault::on(Method::CreateRun).after_apply());
        Ok(TestStore::from_arc(store))
    });
    let case = find_case("create_run_is_idempotent").expect("the case exists");
    assert!(matches!(run_case(&lost_acks, case).await, CaseOutcome::Failed(_)));
}
