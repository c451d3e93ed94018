//! Remote steps: tasks dispatched by commits, claimed, heartbeated, completed and released by
//! workers; the worker registry; and the `blocked` status in the wake paths.

use std::collections::BTreeSet;
use std::sync::Arc;

use durable_core::task::{
    BeatOutcome, NewTask, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, TaskLog, TaskState,
    WorkerInfo,
};
use durable_core::{
    Checkpoint, CheckpointStatus, ClaimOutcome, Delivery, Millis, Run, RunId, RunPatch, RunQuery, RunStatus, StepError,
    StepKind, Store, StoreErrorKind, TaskFilter, WaitKind, Waiter, codes, protocol,
};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// The queue most cases dispatch to.
const QUEUE: &str = "resize";
/// The lease a claim takes in these cases.
const HB: u64 = 1_000;
/// When the cases' tasks are dispatched (the time of [`commit`]).
const AT: Millis = T0 + 1;
/// A worker.
const W1: &str = "worker-1";
/// Another worker.
const W2: &str = "worker-2";

/// Attempt `attempt` of the remote step of `run` at `seq`, on [`QUEUE`] in namespace `default`,
/// dispatched at [`AT`] with a lease of [`HB`] and no deadlines.
pub(crate) fn task(run: &str, seq: u32, attempt: u32) -> NewTask {
    NewTask {
        trace_context: None,
        run_id: RunId::from(run),
        seq,
        attempt,
        name: QUEUE.into(),
        queue: QUEUE.into(),
        namespace: "default".into(),
        input: json(json!({ "run": run, "seq": seq })),
        priority: 0,
        requires: Vec::new(),
        pickup_timeout_ms: None,
        timeout_ms: None,
        heartbeat_timeout_ms: HB,
        created_at: AT,
        claimed_by: None,
    }
}

/// The `running` checkpoint a turn records when it dispatches `t`.
fn dispatched_checkpoint(t: &NewTask) -> Checkpoint {
    let mut cp =
        Checkpoint::new(t.run_id.clone(), t.seq, t.name.clone(), StepKind::Remote, CheckpointStatus::Running, AT);
    cp.attempts = t.attempt;
    cp.input = Some(t.input.clone());
    cp
}

/// The wait a turn registers for the result of `t`.
fn result_wait(t: &NewTask) -> Waiter {
    Waiter {
        run_id: t.run_id.clone(),
        seq: t.seq,
        name: t.name.clone(),
        kind: WaitKind::Signal { token: protocol::remote_token(&t.run_id, t.seq) },
        created_at: AT,
    }
}

/// Commits the dispatch of `tasks` (all of the run `run`, as claimed by [`OWNER`]): their
/// checkpoints, waits and tasks, and, with `park`, the suspension of the run.
async fn dispatch(store: &dyn Store, run: &Run, tasks: &[NewTask], park: bool) -> CaseResult {
    let mut c = commit(run.id.as_str(), OWNER);
    for t in tasks {
        c.checkpoints.push(dispatched_checkpoint(t));
        c.waits.push(result_wait(t));
        c.tasks.push(t.clone());
    }
    if park {
        c.end = suspend(run, None);
    }
    let out = store.commit(c).await?;
    assert!(!out.woken, "nothing was delivered to {}, yet its suspension reported woken", run.id);
    Ok(())
}

/// Creates `id`, claims it and parks it on the dispatch of `t`. Returns the suspended run.
pub(crate) async fn parked_on(store: &dyn Store, id: &str, t: NewTask) -> CaseResult<Run> {
    let run = start(store, id).await?;
    dispatch(store, &run, &[t], true).await?;
    get(store, id).await
}

/// A claim by `worker` of up to `limit` tasks of `queues` at `now`, with no capabilities.
fn claim_of(worker: &str, queues: &[&str], limit: usize, now: Millis) -> TaskClaim {
    TaskClaim {
        worker: worker.into(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        namespace: None,
        capabilities: Vec::new(),
        limit,
        now,
    }
}

/// Claims up to 100 tasks of [`QUEUE`] for `worker` at `now`.
async fn claim_all(store: &dyn Store, worker: &str, now: Millis) -> CaseResult<Vec<Task>> {
    Ok(store.claim_tasks(&claim_of(worker, &[QUEUE], 100, now)).await?)
}

/// The `(run, seq)` of each task, in order.
fn keys(tasks: &[Task]) -> Vec<(String, u32)> {
    tasks.iter().map(|t| (t.task.run_id.to_string(), t.task.seq)).collect()
}

/// Owned `(run, seq)` keys to compare with [`keys`].
fn owned(keys: &[(&str, u32)]) -> Vec<(String, u32)> {
    keys.iter().map(|(r, s)| (r.to_string(), *s)).collect()
}

/// The task at `(run, seq)`, which must exist.
async fn task_at(store: &dyn Store, run: &str, seq: u32) -> CaseResult<Task> {
    let filter = TaskFilter { run_id: Some(RunId::from(run)), ..TaskFilter::default() };
    let tasks = store.list_tasks(&filter).await?;
    Ok(tasks.into_iter().find(|t| t.task.seq == seq).unwrap_or_else(|| panic!("run {run} has no task at seq {seq}")))
}

/// A result of attempt `attempt` of `(run, seq)`, reported by `worker` at `now`.
pub(crate) fn done(
    run: &str,
    seq: u32,
    attempt: u32,
    worker: &str,
    result: Result<serde_json::Value, StepError>,
    now: Millis,
) -> TaskDone {
    TaskDone {
        run_id: RunId::from(run),
        seq,
        attempt,
        worker: Some(worker.into()),
        result: result.map(json),
        logs: Vec::new(),
        now,
    }
}

/// A heartbeat of `worker` on attempt `attempt` of `(run, seq)` at `now`.
fn beat(run: &str, seq: u32, attempt: u32, worker: &str, now: Millis) -> TaskBeat {
    TaskBeat { run_id: RunId::from(run), seq, attempt, worker: worker.into(), progress: None, logs: Vec::new(), now }
}

/// A log line of attempt `attempt` at `at`.
fn log(attempt: u32, at: Millis, message: &str) -> TaskLog {
    TaskLog { attempt, at, level: "info".into(), message: message.into(), data: None }
}

/// The runs due at `now`.
async fn due(store: &dyn Store, now: Millis) -> CaseResult<Vec<RunId>> {
    Ok(store
        .due_runs(&RunQuery { namespace: None, workflows: None, now, limit: 100, leave_queued_since: None })
        .await?)
}

/// A task keeps the trace context (its run's W3C `traceparent`) it was dispatched with, in
/// claims and listings; a re-dispatch replaces it; a task dispatched without one has none.
pub async fn a_task_keeps_its_trace_context(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let run = start(s, "r").await?;
    let traced = NewTask { trace_context: Some(TP.into()), ..task("r", 0, 1) };
    dispatch(s, &run, &[traced, task("r", 1, 1)], false).await?;
    let claimed = claim_all(s, W1, AT).await?;
    let mut contexts: Vec<_> = claimed.iter().map(|t| (t.task.seq, t.task.trace_context.as_deref())).collect();
    contexts.sort();
    assert_eq!(contexts, [(0, Some(TP)), (1, None)], "claims return each task's trace context");
    assert_eq!(task_at(s, "r", 0).await?.task.trace_context.as_deref(), Some(TP), "list_tasks returns it");
    dispatch(s, &run, &[NewTask { trace_context: Some(TP2.into()), ..task("r", 0, 2) }], false).await?;
    assert_eq!(task_at(s, "r", 0).await?.task.trace_context.as_deref(), Some(TP2), "a re-dispatch replaces it");
    Ok(())
}

/// A task dispatched to a worker ([`NewTask::claimed_by`], eager dispatch) is stored
/// `claimed` by it as a claim at its `created_at` stamps it; no other worker claims it while
/// its lease holds; the worker heartbeats and completes it as a claimed one; once its lease
/// passes without a beat, another worker claims the same attempt. A re-dispatch to no worker
/// stores it `queued` again.
pub async fn a_task_dispatched_to_a_worker_is_claimed_by_it(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let eager = NewTask { claimed_by: Some(W1.into()), timeout_ms: Some(60_000), ..task("r", 0, 1) };
    dispatch(s, &run, &[eager, task("r", 1, 1)], false).await?;
    let t = task_at(s, "r", 0).await?;
    assert_eq!((t.state, t.worker.as_deref(), t.claims), (TaskState::Claimed, Some(W1), 1), "{t:?}");
    assert_eq!((t.claimed_at, t.heartbeat_at, t.lease_until), (Some(AT), Some(AT), Some(AT + HB)), "{t:?}");
    assert_eq!(t.task.claimed_by, None, "a stored task reads back without the dispatch's worker");
    assert_eq!(t.deadline(), Some(AT + 60_000), "the attempt's timeout runs from its dispatch");
    assert_eq!(task_at(s, "r", 1).await?.state, TaskState::Queued, "the commit's other task is queued");
    assert_eq!(keys(&claim_all(s, W2, AT + HB - 1).await?), owned(&[("r", 1)]), "the claimed task is W1's");
    let stats = s.queue_stats().await?;
    assert_eq!(stats.iter().map(|q| (q.queued, q.claimed)).collect::<Vec<_>>(), [(0, 2)], "{stats:?}");
    assert_eq!(s.heartbeat_task(&beat("r", 0, 1, W1, AT + 10)).await?, BeatOutcome::Extended(AT + 10 + HB));
    assert_eq!(s.heartbeat_task(&beat("r", 0, 1, W2, AT + 10)).await?, BeatOutcome::Lost, "W2 does not hold it");
    assert!(claim_all(s, W2, AT + HB).await?.is_empty(), "the beat extended W1's lease");
    let redelivered = claim_all(s, W2, AT + 10 + HB).await?;
    assert_eq!(keys(&redelivered), owned(&[("r", 0)]), "its lease passed: another worker claims it");
    assert_eq!((redelivered[0].task.attempt, redelivered[0].claims), (1, 2), "the same attempt, claimed again");
    let done = done("r", 0, 1, W2, Ok(json!("small.png")), AT + 20 + HB);
    assert_eq!(s.complete_task(done).await?, TaskCompletion::Accepted);
    dispatch(s, &run, &[NewTask { claimed_by: Some(W1.into()), ..task("r", 2, 1) }], false).await?;
    assert_eq!(s.complete_task(self::done("r", 2, 1, W1, Ok(json!(2)), AT + 5)).await?, TaskCompletion::Accepted);
    let cp = s.history(&run.id).await?.into_iter().find(|c| c.seq == 2).expect("seq 2 recorded");
    assert_eq!(cp.status, CheckpointStatus::Completed, "the worker it was dispatched to completes it");
    dispatch(s, &run, &[task("r", 2, 2)], false).await?;
    let t = task_at(s, "r", 2).await?;
    assert_eq!((t.state, t.worker.as_deref(), t.claims, t.claimed_at), (TaskState::Queued, None, 0, None), "{t:?}");
    Ok(())
}

/// A commit dispatches its tasks atomically with the step's `running` checkpoint and the wait
/// for its result (a transactional outbox): after it, all three are stored, the task `queued`
/// with every dispatch field as given; a commit refused for a lost lease stores none of them.
pub async fn dispatch_is_atomic_with_checkpoint_and_wait(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let t = NewTask {
        priority: 7,
        requires: vec!["gpu".into(), "fast".into()],
        pickup_timeout_ms: Some(5_000),
        timeout_ms: Some(60_000),
        queue: "images".into(),
        ..task("r", 3, 1)
    };
    dispatch(s, &run, std::slice::from_ref(&t), false).await?;
    let stored = task_at(s, "r", 3).await?;
    assert_eq!(stored, Task::queued(t.clone()), "stored queued, as dispatched");
    let cp = checkpoint_at(s, "r", 3).await?;
    assert_eq!((cp.status, cp.kind, cp.attempts), (CheckpointStatus::Running, StepKind::Remote, 1));
    assert_eq!(s.waiters(&RunId::from("r")).await?, vec![result_wait(&t)]);

    // The lease is lost: nothing of the dispatch is written.
    acquire(s, claim("r", OTHER, T0 + 2 * LEASE)).await?;
    let mut c = commit("r", OWNER);
    let lost = task("r", 4, 1);
    c.checkpoints.push(dispatched_checkpoint(&lost));
    c.waits.push(result_wait(&lost));
    c.tasks.push(lost);
    assert_kind(s.commit(c).await, StoreErrorKind::LeaseLost);
    let all = s.list_tasks(&TaskFilter { run_id: Some(RunId::from("r")), ..TaskFilter::default() }).await?;
    assert_eq!(keys(&all), owned(&[("r", 3)]), "the refused commit dispatched nothing");
    assert_eq!(history_seqs(s, "r").await?, [3]);
    assert_eq!(waiter_seqs(s, "r").await?, [3]);
    Ok(())
}

/// Claims take the highest priority first, then the oldest; only the claim's queues, and its
/// namespace when it names one; at most `limit`; each claimed task is `claimed` by the worker
/// with its lease, first claim and heartbeat set.
pub async fn claims_by_priority_then_age_per_queue_and_namespace(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let tasks = [
        NewTask { created_at: AT + 3, ..task("r", 0, 1) },
        NewTask { created_at: AT + 1, ..task("r", 1, 1) },
        NewTask { priority: 5, created_at: AT + 9, ..task("r", 2, 1) },
        NewTask { created_at: AT + 2, ..task("r", 3, 1) },
        NewTask { queue: "other".into(), ..task("r", 4, 1) },
        NewTask { namespace: "billing".into(), created_at: AT, ..task("r", 5, 1) },
    ];
    dispatch(s, &run, &tasks, false).await?;
    let now = AT + 100;
    let mut c = claim_of(W1, &[QUEUE], 2, now);
    c.namespace = Some("default".into());
    let first = s.claim_tasks(&c).await?;
    assert_eq!(keys(&first), owned(&[("r", 2), ("r", 1)]), "priority first, then the oldest; at most limit");
    for t in &first {
        assert_eq!(t.state, TaskState::Claimed);
        assert_eq!(t.worker.as_deref(), Some(W1));
        assert_eq!((t.lease_until, t.claimed_at, t.heartbeat_at, t.claims), (Some(now + HB), Some(now), Some(now), 1));
    }
    let rest = s.claim_tasks(&c).await?;
    assert_eq!(keys(&rest), owned(&[("r", 3), ("r", 0)]), "the namespace filter leaves billing's task");
    assert!(s.claim_tasks(&c).await?.is_empty(), "claimed tasks are not claimed again under a live lease");
    let any_ns = s.claim_tasks(&claim_of(W2, &[QUEUE], 10, now)).await?;
    assert_eq!(keys(&any_ns), owned(&[("r", 5)]), "no namespace: any");
    let other = s.claim_tasks(&claim_of(W2, &["other", "nothing"], 10, now)).await?;
    assert_eq!(keys(&other), owned(&[("r", 4)]), "only the claim's queues");
    assert!(s.claim_tasks(&claim_of(W2, &[QUEUE, "other"], 0, now)).await?.is_empty(), "a limit of 0 claims nothing");
    Ok(())
}

/// A task is claimed only by a worker that has every capability it requires.
pub async fn claims_need_every_required_capability(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let tasks = [
        NewTask { requires: vec!["gpu".into(), "big".into()], ..task("r", 0, 1) },
        NewTask { requires: vec!["gpu".into()], created_at: AT + 1, ..task("r", 1, 1) },
        NewTask { created_at: AT + 2, ..task("r", 2, 1) },
    ];
    dispatch(s, &run, &tasks, false).await?;
    let now = AT + 10;
    let mut c = claim_of(W1, &[QUEUE], 10, now);
    c.capabilities = vec!["gpu".into(), "fast".into()];
    assert_eq!(keys(&s.claim_tasks(&c).await?), owned(&[("r", 1), ("r", 2)]), "requires ⊆ capabilities");
    let mut c = claim_of(W2, &[QUEUE], 10, now);
    c.capabilities = vec!["big".into()];
    assert!(s.claim_tasks(&c).await?.is_empty(), "one capability of two is not enough");
    c.capabilities = vec!["big".into(), "tpu".into(), "gpu".into()];
    assert_eq!(keys(&s.claim_tasks(&c).await?), owned(&[("r", 0)]));
    Ok(())
}

/// Several workers (`RACERS`, 16) claiming at once: every task goes to exactly one of them.
pub async fn concurrent_claimers_take_each_task_once(store: Arc<dyn Store>) -> CaseResult {
    claim_race(&[store]).await
}

/// [`concurrent_claimers_take_each_task_once`] with the workers alternating between two
/// handles on one store (two processes sharing it).
pub async fn concurrent_claimers_across_handles_take_each_task_once(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) -> CaseResult {
    claim_race(&[a, b]).await
}

/// The race of [`concurrent_claimers_take_each_task_once`], across `handles`.
async fn claim_race(handles: &[Arc<dyn Store>]) -> CaseResult {
    let s = &*handles[0];
    let run = start(s, "r").await?;
    let tasks: Vec<NewTask> = (0..40).map(|seq| task("r", seq, 1)).collect();
    dispatch(s, &run, &tasks, false).await?;
    let results = race(RACERS, |i| {
        let store = handle_for(handles, i);
        async move { store.claim_tasks(&claim_of(&format!("w{i}"), &[QUEUE], 4, AT + 10)).await }
    })
    .await;
    let mut seen = BTreeSet::new();
    for (i, claimed) in results.into_iter().enumerate() {
        for t in claimed? {
            assert_eq!(t.worker.as_deref(), Some(format!("w{i}").as_str()));
            assert!(seen.insert(t.task.seq), "task {} was claimed twice", t.task.seq);
        }
    }
    assert_eq!(seen.len(), 40, "16 claimers of 4 take all 40 tasks");
    for t in s.list_tasks(&TaskFilter { run_id: Some(RunId::from("r")), ..TaskFilter::default() }).await? {
        assert_eq!((t.state, t.claims), (TaskState::Claimed, 1), "task {}", t.task.seq);
    }
    Ok(())
}

/// A claimed task whose lease expired is claimable again, by any worker: the same attempt,
/// with `claims` counting the redelivery and `claimed_at` kept from the first claim.
pub async fn expired_lease_redelivers_the_same_attempt(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", task("r", 0, 1)).await?;
    let first = claim_all(s, W1, AT + 10).await?;
    assert_eq!(keys(&first), owned(&[("r", 0)]));
    assert!(claim_all(s, W2, AT + 10 + HB - 1).await?.is_empty(), "the lease holds until it expires");
    let again = claim_all(s, W2, AT + 10 + HB).await?;
    assert_eq!(keys(&again), owned(&[("r", 0)]), "an expired lease is claimable");
    let t = &again[0];
    assert_eq!((t.task.attempt, t.claims, t.worker.as_deref()), (1, 2, Some(W2)));
    assert_eq!(
        (t.claimed_at, t.heartbeat_at, t.lease_until),
        (Some(AT + 10), Some(AT + 10 + HB), Some(AT + 10 + 2 * HB))
    );
    assert_eq!(task_at(s, "r", 0).await?, t.clone(), "claim answers the task as stored");
    Ok(())
}

/// A heartbeat of the holder extends the lease from `now`, replaces the progress and appends
/// the logs; the task is not claimable while the extended lease holds.
pub async fn heartbeat_extends_the_lease(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", task("r", 0, 1)).await?;
    claim_all(s, W1, AT + 10).await?;
    let now = AT + 10 + HB - 1;
    let mut b = beat("r", 0, 1, W1, now);
    b.progress = Some(json(json!({ "pct": 40 })));
    b.logs = vec![log(1, now, "halfway")];
    assert_eq!(s.heartbeat_task(&b).await?, BeatOutcome::Extended(now + HB));
    let t = task_at(s, "r", 0).await?;
    assert_eq!((t.lease_until, t.heartbeat_at), (Some(now + HB), Some(now)));
    assert_eq!(t.progress, Some(json(json!({ "pct": 40 }))));
    assert_eq!(t.logs, vec![log(1, now, "halfway")]);
    assert!(claim_all(s, W2, AT + 10 + HB).await?.is_empty(), "the old expiry no longer frees it");
    let mut b = beat("r", 0, 1, W1, now + 5);
    b.logs = vec![log(1, now + 5, "more")];
    assert_eq!(s.heartbeat_task(&b).await?, BeatOutcome::Extended(now + 5 + HB));
    let t = task_at(s, "r", 0).await?;
    assert_eq!(t.progress, Some(json(json!({ "pct": 40 }))), "no progress given: the last one stays");
    assert_eq!(t.logs, vec![log(1, now, "halfway"), log(1, now + 5, "more")], "logs are appended");
    Ok(())
}

/// A heartbeat from a worker that no longer holds the attempt is `Lost` (another worker
/// claimed it after the lease expired, another attempt, no task); on a finished task, on a task
/// past its deadline and on a task of a terminal run it is `Cancelled`. None extends anything.
pub async fn heartbeat_without_the_task_is_lost_or_cancelled(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", NewTask { timeout_ms: Some(10 * HB), ..task("r", 0, 1) }).await?;
    claim_all(s, W1, AT + 10).await?;
    claim_all(s, W2, AT + 10 + HB).await?;
    let now = AT + 10 + HB + 1;
    assert_eq!(s.heartbeat_task(&beat("r", 0, 1, W1, now)).await?, BeatOutcome::Lost, "W2 holds it now");
    assert_eq!(s.heartbeat_task(&beat("r", 0, 2, W2, now)).await?, BeatOutcome::Lost, "no such attempt");
    assert_eq!(s.heartbeat_task(&beat("r", 9, 1, W2, now)).await?, BeatOutcome::Lost, "no such task");
    assert_eq!(task_at(s, "r", 0).await?.lease_until, Some(AT + 10 + 2 * HB), "nothing extended");
    let deadline = AT + 10 + 10 * HB;
    assert_eq!(s.heartbeat_task(&beat("r", 0, 1, W2, deadline)).await?, BeatOutcome::Cancelled, "past its deadline");
    assert_eq!(s.heartbeat_task(&beat("r", 0, 1, W2, now)).await?, BeatOutcome::Extended(now + HB));

    // A finished task.
    assert_eq!(s.complete_task(done("r", 0, 1, W2, Ok(json!(1)), now + 1)).await?, TaskCompletion::Accepted);
    assert_eq!(s.heartbeat_task(&beat("r", 0, 1, W2, now + 2)).await?, BeatOutcome::Cancelled);

    // A task of a run that was cancelled.
    parked_on(s, "c", task("c", 0, 1)).await?;
    claim_all(s, W1, AT + 10).await?;
    drive(s, "c", &[RunStatus::Cancelled]).await?;
    assert_eq!(s.heartbeat_task(&beat("c", 0, 1, W1, AT + 11)).await?, BeatOutcome::Cancelled);
    Ok(())
}

/// An accepted result writes the `completed` checkpoint with the output and the attempt,
/// removes the wait, wakes the run as a delivery does (`wake_gen + 1`, a suspended run due
/// now) and finishes the task (outcome `completed`, logs appended).
pub async fn completion_records_the_result_and_wakes_the_run(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parked = parked_on(s, "r", task("r", 2, 1)).await?;
    assert_eq!((parked.status, parked.wake_at), (RunStatus::Suspended, None));
    claim_all(s, W1, AT + 10).await?;
    let now = AT + 50;
    let mut d = done("r", 2, 1, W1, Ok(json!({ "url": "s3://x" })), now);
    d.logs = vec![log(1, now, "done")];
    assert_eq!(s.complete_task(d).await?, TaskCompletion::Accepted);

    let cp = checkpoint_at(s, "r", 2).await?;
    assert_eq!((cp.status, cp.attempts, cp.wake_at), (CheckpointStatus::Completed, 1, None));
    assert_eq!(cp.output, Some(json(json!({ "url": "s3://x" }))));
    assert_eq!(cp.updated_at, now);
    assert_eq!(waiter_seqs(s, "r").await?, Vec::<u32>::new(), "the wait was consumed");
    let run = get(s, "r").await?;
    assert_eq!(run.wake_gen, parked.wake_gen + 1);
    assert_eq!((run.status, run.wake_at), (RunStatus::Suspended, Some(now)), "due now");
    assert_eq!(due(s, now).await?, [RunId::from("r")]);
    let t = task_at(s, "r", 2).await?;
    assert_eq!((t.state, t.outcome.as_deref()), (TaskState::Finished, Some("completed")));
    assert_eq!(t.logs, vec![log(1, now, "done")]);
    assert!(claim_all(s, W2, now + 10 * HB).await?.is_empty(), "a finished task is never claimed");
    assert_eq!(
        s.send_signal(&protocol::remote_token(&RunId::from("r"), 2), json(json!(0)), now).await?,
        Delivery::Buffered,
        "the result wait is gone"
    );
    Ok(())
}

/// `complete_task_and_claim`: an accepted result is recorded as `complete_task` records it
/// and the woken run is then claimed as `claim_run` claims it, in the same call (the claim's
/// history holds the result). A duplicate result, or one for a settled run, claims nothing;
/// a run whose lease another owner holds is `Busy`, its result recorded all the same; a failed
/// attempt claims the run as a completed one does; a claim of another run than the result's is
/// refused with nothing written.
pub async fn complete_task_and_claim_claims_the_woken_run(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parked = parked_on(s, "r", task("r", 2, 1)).await?;
    claim_all(s, W1, AT + 10).await?;
    let now = AT + 50;
    let result = || done("r", 2, 1, W1, Ok(json!({ "url": "s3://x" })), now);
    assert_kind(s.complete_task_and_claim(result(), claim("other", OWNER, now)).await, StoreErrorKind::Conflict);
    assert_eq!(task_at(s, "r", 2).await?.state, TaskState::Claimed, "a refused call writes nothing");
    assert_eq!(get(s, "r").await?, parked);

    let (completion, claimed) = s.complete_task_and_claim(result(), claim("r", OWNER, now)).await?;
    assert_eq!(completion, TaskCompletion::Accepted);
    let Some(ClaimOutcome::Acquired { run, history, previous, recovered }) = claimed else {
        panic!("run r: the accepted result's claim should acquire the run, got {claimed:?}")
    };
    assert_eq!(
        (run.status, run.lease_owner.as_deref(), run.lease_until),
        (RunStatus::Running, Some(OWNER), Some(now + LEASE))
    );
    assert_eq!((previous, recovered), (RunStatus::Suspended, false));
    assert_eq!(run.wake_gen, parked.wake_gen + 1, "woken by the result before the claim");
    // It counts as any acquiring claim does (the run's earlier claim tells whether the store counts).
    let counts = parked.claims > 0;
    assert_eq!(run.claims, parked.claims + u64::from(counts), "the result's claim is counted");
    assert_eq!(get(s, "r").await?, run, "the claim answers the run as stored");
    let cp = history.iter().find(|c| c.seq == 2).expect("the claim's history holds the result");
    assert_eq!((cp.status, cp.attempts), (CheckpointStatus::Completed, 1));
    assert_eq!(cp.output, Some(json(json!({ "url": "s3://x" }))));
    assert_eq!(history, super::fixtures::history(s, "r").await?);
    assert_eq!(waiter_seqs(s, "r").await?, Vec::<u32>::new(), "the wait was consumed");
    let t = task_at(s, "r", 2).await?;
    assert_eq!((t.state, t.outcome.as_deref()), (TaskState::Finished, Some("completed")));

    // A second result of the attempt: a duplicate, and nothing is claimed.
    let again = s.complete_task_and_claim(done("r", 2, 1, W2, Ok(json!(0)), now + 1), claim("r", OTHER, now + 1));
    assert_eq!(again.await?, (TaskCompletion::Duplicate, None));
    assert_eq!(get(s, "r").await?, run, "a duplicate leaves the run as it was");

    // Another owner holds the run's lease (a turn in progress): the result is recorded and
    // the run woken, the claim is `Busy`.
    let p = parked_on(s, "b", task("b", 0, 1)).await?;
    claim_all(s, W1, now).await?;
    acquire(s, claim("b", OTHER, now)).await?;
    let (completion, claimed) =
        s.complete_task_and_claim(done("b", 0, 1, W1, Ok(json!(7)), now + 1), claim("b", OWNER, now + 1)).await?;
    assert_eq!(completion, TaskCompletion::Accepted);
    let Some(ClaimOutcome::Busy(busy)) = claimed else {
        panic!("run b: its lease is another owner's, the claim should be busy, got {claimed:?}")
    };
    assert_eq!((busy.lease_owner.as_deref(), busy.wake_gen), (Some(OTHER), p.wake_gen + 1));
    assert_eq!(get(s, "b").await?, busy);
    assert_eq!(checkpoint_at(s, "b", 0).await?.status, CheckpointStatus::Completed);

    // A failed attempt (the third) claims the run too: its checkpoint is `waiting` with the
    // error and the attempt, as `complete_task` writes it.
    let f = parked_on(s, "f", task("f", 1, 3)).await?;
    claim_all(s, W1, now).await?;
    let error = StepError::retryable("out of memory");
    let (completion, claimed) =
        s.complete_task_and_claim(done("f", 1, 3, W1, Err(error.clone()), now + 1), claim("f", OWNER, now + 1)).await?;
    assert_eq!(completion, TaskCompletion::Accepted);
    let Some(ClaimOutcome::Acquired { run, history, .. }) = claimed else {
        panic!("run f: the failed result's claim should acquire the run, got {claimed:?}")
    };
    assert_eq!((run.status, run.wake_gen), (RunStatus::Running, f.wake_gen + 1));
    let cp = history.iter().find(|c| c.seq == 1).expect("the claim's history holds the failed attempt");
    assert_eq!(
        (cp.status, cp.attempts, cp.wake_at, cp.error.as_ref()),
        (CheckpointStatus::Waiting, 3, None, Some(&error))
    );
    assert_eq!(task_at(s, "f", 1).await?.outcome.as_deref(), Some("failed"));

    // A result for a settled run: `RunTerminal`, nothing claimed, the run untouched.
    parked_on(s, "c", task("c", 0, 1)).await?;
    claim_all(s, W1, now).await?;
    drive(s, "c", &[RunStatus::Cancelled]).await?;
    let cancelled = get(s, "c").await?;
    let late = s.complete_task_and_claim(done("c", 0, 1, W1, Ok(json!(1)), now + 2), claim("c", OWNER, now + 2));
    assert_eq!(late.await?, (TaskCompletion::RunTerminal, None));
    assert_eq!(get(s, "c").await?, cancelled);
    Ok(())
}

/// A failed attempt writes the checkpoint `waiting` with the error, the attempt and no
/// `wake_at` (the turn judges it), wakes the run and finishes the task (`failed`; `timed_out`
/// for an error coded `remote_timeout`).
pub async fn failed_attempt_is_recorded_waiting_without_wake_at(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parked = parked_on(s, "r", task("r", 1, 3)).await?;
    claim_all(s, W1, AT + 10).await?;
    let error = StepError::retryable("out of memory");
    let now = AT + 20;
    assert_eq!(s.complete_task(done("r", 1, 3, W1, Err(error.clone()), now)).await?, TaskCompletion::Accepted);
    let cp = checkpoint_at(s, "r", 1).await?;
    assert_eq!((cp.status, cp.attempts, cp.wake_at), (CheckpointStatus::Waiting, 3, None));
    assert_eq!(cp.error, Some(error));
    let run = get(s, "r").await?;
    assert_eq!((run.wake_gen, run.wake_at), (parked.wake_gen + 1, Some(now)));
    assert_eq!(waiter_seqs(s, "r").await?, Vec::<u32>::new());
    assert_eq!(task_at(s, "r", 1).await?.outcome.as_deref(), Some("failed"));

    // The engine expires an attempt: `timed_out`.
    parked_on(s, "x", task("x", 0, 1)).await?;
    let expired = StepError::retryable("no worker took it").with_code(codes::REMOTE_TIMEOUT);
    let d = TaskDone { worker: None, ..done("x", 0, 1, W1, Err(expired), now) };
    assert_eq!(s.complete_task(d).await?, TaskCompletion::Accepted);
    let t = task_at(s, "x", 0).await?;
    assert_eq!((t.state, t.outcome.as_deref()), (TaskState::Finished, Some("timed_out")));
    Ok(())
}

/// A result is accepted once per attempt: a second result (from any worker), a result of an
/// older attempt after a re-dispatch, and a result for no task are `Duplicate` and change
/// nothing.
pub async fn completion_is_once_per_attempt(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", task("r", 0, 1)).await?;
    claim_all(s, W1, AT + 10).await?;
    assert_eq!(s.complete_task(done("r", 0, 1, W1, Ok(json!("first")), AT + 20)).await?, TaskCompletion::Accepted);
    let run = get(s, "r").await?;
    for d in [
        done("r", 0, 1, W1, Ok(json!("again")), AT + 30),
        done("r", 0, 1, W2, Err(StepError::fatal("late")), AT + 30),
        done("r", 7, 1, W1, Ok(json!("nothing")), AT + 30),
        done("nobody", 0, 1, W1, Ok(json!("nothing")), AT + 30),
    ] {
        assert_eq!(s.complete_task(d).await?, TaskCompletion::Duplicate);
    }
    assert_eq!(checkpoint_at(s, "r", 0).await?.output, Some(json(json!("first"))));
    assert_eq!(get(s, "r").await?.wake_gen, run.wake_gen, "no second wake");

    // Attempt 2 is dispatched: a late result of attempt 1 is stale.
    let run = acquire(s, claim("r", OWNER, AT + 40)).await?;
    dispatch(s, &run, &[task("r", 0, 2)], true).await?;
    assert_eq!(s.complete_task(done("r", 0, 1, W1, Ok(json!("stale")), AT + 50)).await?, TaskCompletion::Duplicate);
    let cp = checkpoint_at(s, "r", 0).await?;
    assert_eq!((cp.status, cp.attempts), (CheckpointStatus::Running, 2), "the stale result wrote nothing");
    assert_eq!(waiter_seqs(s, "r").await?, [0]);
    assert_eq!(s.complete_task(done("r", 0, 2, W2, Ok(json!("second")), AT + 60)).await?, TaskCompletion::Accepted);
    assert_eq!(checkpoint_at(s, "r", 0).await?.attempts, 2);
    Ok(())
}

/// A result for a task of a run that settled (cancelled by an operator) is `RunTerminal`:
/// nothing is recorded, the run is not revived, and the task is finished as `cancelled`.
pub async fn completion_after_the_run_settled_is_run_terminal(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", task("r", 0, 1)).await?;
    claim_all(s, W1, AT + 10).await?;
    drive(s, "r", &[RunStatus::Cancelled]).await?;
    let cancelled = get(s, "r").await?;
    let outcome = s.complete_task(done("r", 0, 1, W1, Ok(json!(1)), AT + 20)).await?;
    assert_eq!(outcome, TaskCompletion::RunTerminal);
    assert_eq!(get(s, "r").await?, cancelled, "the run is untouched");
    assert_eq!(checkpoint_at(s, "r", 0).await?.status, CheckpointStatus::Running, "no result recorded");
    let t = task_at(s, "r", 0).await?;
    assert_eq!((t.state, t.outcome.as_deref()), (TaskState::Finished, Some("cancelled")));
    assert_eq!(s.complete_task(done("r", 0, 1, W1, Ok(json!(1)), AT + 21)).await?, TaskCompletion::Duplicate);

    // A queued task of a cancelled run is not claimed.
    parked_on(s, "q", task("q", 0, 1)).await?;
    drive(s, "q", &[RunStatus::Cancelled]).await?;
    assert!(claim_all(s, W1, AT + 30).await?.is_empty(), "tasks of terminal runs are not claimed");
    Ok(())
}

/// A re-dispatch (a commit carrying attempt 2 at the same seq) replaces the task: queued
/// again, with the new attempt's fields and no claim, keeping the logs of attempt 1.
pub async fn redispatch_replaces_the_task_and_keeps_logs(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", task("r", 0, 1)).await?;
    claim_all(s, W1, AT + 10).await?;
    let mut b = beat("r", 0, 1, W1, AT + 11);
    b.logs = vec![log(1, AT + 11, "trying")];
    b.progress = Some(json(json!(0.5)));
    s.heartbeat_task(&b).await?;
    let mut d = done("r", 0, 1, W1, Err(StepError::retryable("flaky")), AT + 12);
    d.logs = vec![log(1, AT + 12, "failed")];
    assert_eq!(s.complete_task(d).await?, TaskCompletion::Accepted);

    let run = acquire(s, claim("r", OWNER, AT + 20)).await?;
    let second = NewTask { attempt: 2, priority: 3, created_at: AT + 20, ..task("r", 0, 2) };
    let mut c = commit("r", OWNER);
    c.tasks.push(second.clone());
    c.checkpoints.push(dispatched_checkpoint(&second));
    c.waits.push(result_wait(&second));
    c.end = suspend(&run, None);
    s.commit(c).await?;
    let t = task_at(s, "r", 0).await?;
    assert_eq!(t.task, second);
    assert_eq!(
        (t.state, t.worker.as_deref(), t.claims, t.claimed_at, t.lease_until),
        (TaskState::Queued, None, 0, None, None)
    );
    assert_eq!((t.progress.as_ref(), t.outcome.as_deref()), (None, None));
    assert_eq!(t.logs, vec![log(1, AT + 11, "trying"), log(1, AT + 12, "failed")], "attempt 1's logs are kept");
    let claimed = claim_all(s, W2, AT + 30).await?;
    assert_eq!(claimed.iter().map(|t| t.task.attempt).collect::<Vec<_>>(), [2]);
    Ok(())
}

/// Released tasks are `queued` at once, for any worker, keeping their first claim time; a
/// release names the attempt and the worker: others are left alone.
pub async fn released_tasks_are_claimable_at_once(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    dispatch(s, &run, &[task("r", 0, 1), task("r", 1, 1), task("r", 2, 1)], true).await?;
    let now = AT + 10;
    assert_eq!(claim_all(s, W1, now).await?.len(), 3);
    let r = RunId::from("r");
    // Seq 1 with the wrong attempt, seq 2 by the wrong worker: left alone.
    s.release_tasks(&[(r.clone(), 0, 1), (r.clone(), 1, 2)], W1).await?;
    s.release_tasks(&[(r.clone(), 2, 1)], W2).await?;
    let t = task_at(s, "r", 0).await?;
    assert_eq!((t.state, t.lease_until, t.claimed_at), (TaskState::Queued, None, Some(now)));
    assert_eq!(task_at(s, "r", 1).await?.state, TaskState::Claimed);
    assert_eq!(task_at(s, "r", 2).await?.state, TaskState::Claimed);
    let again = claim_all(s, W2, now + 1).await?;
    assert_eq!(keys(&again), owned(&[("r", 0)]), "claimable at once, before the old lease ends");
    assert_eq!((again[0].claims, again[0].claimed_at), (2, Some(now)));
    Ok(())
}

/// An unclaimed task past `created_at + pickup_timeout` is no longer claimable and is listed
/// by `list_tasks(expired_at)`; before it, it is neither.
pub async fn unclaimed_task_expires_at_its_pickup_deadline(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let tasks = [NewTask { pickup_timeout_ms: Some(500), ..task("r", 0, 1) }, task("r", 1, 1)];
    dispatch(s, &run, &tasks, true).await?;
    let expired = |at| TaskFilter { expired_at: Some(at), ..TaskFilter::default() };
    assert!(s.list_tasks(&expired(AT + 499)).await?.is_empty());
    assert_eq!(keys(&s.list_tasks(&expired(AT + 500)).await?), owned(&[("r", 0)]), "no deadline: never expires");
    assert_eq!(keys(&claim_all(s, W1, AT + 500).await?), owned(&[("r", 1)]), "an expired task is not claimed");
    let t = task_at(s, "r", 0).await?;
    assert_eq!((t.state, t.claims), (TaskState::Queued, 0));

    // Claimed in time, the pickup deadline no longer applies.
    let run = start(s, "k").await?;
    let k = NewTask { pickup_timeout_ms: Some(500), queue: "k".into(), ..task("k", 0, 1) };
    dispatch(s, &run, &[k], true).await?;
    assert_eq!(keys(&s.claim_tasks(&claim_of(W1, &["k"], 10, AT + 499)).await?), owned(&[("k", 0)]));
    assert!(
        s.list_tasks(&expired(AT + 10_000)).await?.iter().all(|t| t.task.run_id.as_str() != "k"),
        "a claimed task without a timeout does not expire"
    );
    Ok(())
}

/// A claimed attempt expires `timeout` after its first claim, through redeliveries: it is
/// listed expired then and is not claimed again, even with its lease gone.
pub async fn claimed_attempt_expires_from_its_first_claim(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    parked_on(s, "r", NewTask { timeout_ms: Some(5 * HB), pickup_timeout_ms: Some(100), ..task("r", 0, 1) }).await?;
    let first = AT + 50;
    claim_all(s, W1, first).await?;
    assert_eq!(claim_all(s, W2, first + HB).await?.len(), 1, "redelivered after its lease");
    let expired = |at| TaskFilter { expired_at: Some(at), ..TaskFilter::default() };
    assert!(s.list_tasks(&expired(first + 5 * HB - 1)).await?.is_empty(), "the pickup deadline no longer counts");
    assert_eq!(
        keys(&s.list_tasks(&expired(first + 5 * HB)).await?),
        owned(&[("r", 0)]),
        "timeout from the first claim"
    );
    assert!(claim_all(s, W1, first + 6 * HB).await?.is_empty(), "an expired attempt is not claimed");
    Ok(())
}

/// An applied `Settle` finishes every unfinished task of the run (outcome `cancelled`),
/// leaving finished ones and other runs' tasks as they are.
pub async fn settle_finishes_the_runs_tasks(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    dispatch(s, &run, &[task("r", 0, 1), task("r", 1, 1), task("r", 2, 1)], false).await?;
    parked_on(s, "other", task("other", 0, 1)).await?;
    let now = AT + 10;
    // The first task has a result; the others are claimed.
    assert_eq!(s.complete_task(done("r", 0, 1, W1, Ok(json!(0)), now)).await?, TaskCompletion::Accepted);
    claim_all(s, W1, now + 1).await?;
    let mut c = commit("r", OWNER);
    c.end = complete(json!("gave up waiting"));
    assert!(s.commit(c).await?.settled);
    let tasks = s.list_tasks(&TaskFilter { run_id: Some(RunId::from("r")), ..TaskFilter::default() }).await?;
    let outcomes: Vec<_> = tasks.iter().map(|t| (t.task.seq, t.state, t.outcome.clone())).collect();
    assert_eq!(
        outcomes,
        vec![
            (0, TaskState::Finished, Some("completed".to_string())),
            (1, TaskState::Finished, Some("cancelled".to_string())),
            (2, TaskState::Finished, Some("cancelled".to_string())),
        ]
    );
    assert_eq!(task_at(s, "other", 0).await?.state, TaskState::Claimed, "other runs' tasks are untouched");
    assert_eq!(s.heartbeat_task(&beat("r", 1, 1, W1, now + 2)).await?, BeatOutcome::Cancelled);
    Ok(())
}

/// `list_tasks` filters by run, unfinished, queued, expiry and silence, oldest first (then run
/// and seq), at most `limit` (100 when 0).
pub async fn list_tasks_filters(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let a = start(s, "a").await?;
    dispatch(
        s,
        &a,
        &[
            NewTask { created_at: AT + 2, pickup_timeout_ms: Some(1_000), ..task("a", 0, 1) },
            NewTask { created_at: AT, ..task("a", 1, 1) },
            NewTask { created_at: AT + 1, ..task("a", 2, 1) },
        ],
        true,
    )
    .await?;
    let b = start(s, "b").await?;
    dispatch(s, &b, &[NewTask { created_at: AT, ..task("b", 0, 1) }], true).await?;
    // a:1 is claimed at AT + 10 and heartbeats at AT + 500; a:2 finishes.
    s.claim_tasks(&claim_of(W1, &[QUEUE], 2, AT + 10)).await?; // a:1 and b:0 (AT, by run id)
    s.heartbeat_task(&beat("a", 1, 1, W1, AT + 500)).await?;
    s.claim_tasks(&claim_of(W1, &[QUEUE], 1, AT + 20)).await?; // a:2
    s.complete_task(done("a", 2, 1, W1, Ok(json!(2)), AT + 30)).await?;

    let list = |f: TaskFilter| async move { Ok::<_, crate::CaseError>(keys(&s.list_tasks(&f).await?)) };
    let all = owned(&[("a", 1), ("b", 0), ("a", 2), ("a", 0)]);
    assert_eq!(list(TaskFilter::default()).await?, all, "oldest first, then run id and seq");
    assert_eq!(list(TaskFilter { limit: 2, ..TaskFilter::default() }).await?, all[..2].to_vec());
    assert_eq!(
        list(TaskFilter { run_id: Some(RunId::from("a")), ..TaskFilter::default() }).await?,
        owned(&[("a", 1), ("a", 2), ("a", 0)])
    );
    assert_eq!(
        list(TaskFilter { unfinished: true, ..TaskFilter::default() }).await?,
        owned(&[("a", 1), ("b", 0), ("a", 0)])
    );
    assert_eq!(list(TaskFilter { queued: true, ..TaskFilter::default() }).await?, owned(&[("a", 0)]));
    assert_eq!(
        list(TaskFilter { expired_at: Some(AT + 2 + 1_000), ..TaskFilter::default() }).await?,
        owned(&[("a", 0)])
    );
    // Silent: the last heartbeat (or, never claimed, the dispatch) before the time.
    assert_eq!(list(TaskFilter { silent_since: Some(AT + 10), ..TaskFilter::default() }).await?, owned(&[("a", 0)]));
    assert_eq!(
        list(TaskFilter { silent_since: Some(AT + 11), ..TaskFilter::default() }).await?,
        owned(&[("b", 0), ("a", 0)])
    );
    assert_eq!(
        list(TaskFilter { silent_since: Some(AT + 501), ..TaskFilter::default() }).await?,
        owned(&[("a", 1), ("b", 0), ("a", 0)]),
        "finished tasks are never silent"
    );
    let combined = TaskFilter { run_id: Some(RunId::from("a")), unfinished: true, limit: 1, ..TaskFilter::default() };
    assert_eq!(list(combined).await?, owned(&[("a", 1)]));
    Ok(())
}

/// `queue_stats` counts queued and claimed tasks of active runs per `(namespace, queue)`, with
/// the oldest dispatch; ordered by namespace then queue; queues with nothing unfinished are
/// left out.
pub async fn queue_stats_count_per_queue(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    assert!(s.queue_stats().await?.is_empty());
    let run = start(s, "r").await?;
    dispatch(
        s,
        &run,
        &[
            NewTask { created_at: AT + 5, ..task("r", 0, 1) },
            NewTask { created_at: AT + 3, ..task("r", 1, 1) },
            NewTask { created_at: AT + 4, ..task("r", 2, 1) },
            NewTask { queue: "alpha".into(), namespace: "zeta".into(), ..task("r", 3, 1) },
            NewTask { queue: "done".into(), ..task("r", 4, 1) },
        ],
        true,
    )
    .await?;
    parked_on(s, "gone", NewTask { created_at: AT - 1, ..task("gone", 0, 1) }).await?;
    drive(s, "gone", &[RunStatus::Cancelled]).await?;
    s.claim_tasks(&claim_of(W1, &[QUEUE], 1, AT + 10)).await?; // r:1
    s.claim_tasks(&claim_of(W1, &["done"], 1, AT + 10)).await?;
    s.complete_task(done("r", 4, 1, W1, Ok(json!(4)), AT + 11)).await?;
    let stats = s.queue_stats().await?;
    assert_eq!(
        stats,
        vec![
            QueueStats {
                namespace: "default".into(),
                queue: QUEUE.into(),
                queued: 2,
                claimed: 1,
                oldest_at: Some(AT + 3)
            },
            QueueStats { namespace: "zeta".into(), queue: "alpha".into(), queued: 1, claimed: 0, oldest_at: Some(AT) },
        ],
        "the cancelled run's task and the finished queue do not count"
    );
    Ok(())
}

/// Workers register by id (a second registration replaces the first), are listed by id,
/// are forgotten once their heartbeat is older than `heartbeat_before`, and are removed.
pub async fn workers_register_refresh_and_expire(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let worker = |id: &str, heartbeat_at: Millis| WorkerInfo {
        id: id.into(),
        queues: vec![QUEUE.into()],
        capabilities: vec!["gpu".into()],
        protocol_min: 1,
        protocol_max: 1,
        concurrency: 4,
        started_at: T0,
        heartbeat_at,
    };
    assert!(s.workers(T0).await?.is_empty());
    s.register_worker(&worker("w-b", T0 + 10)).await?;
    s.register_worker(&worker("w-a", T0 + 5)).await?;
    s.register_worker(&worker("w-c", T0 + 1)).await?;
    let refreshed = WorkerInfo { queues: vec!["other".into()], concurrency: 8, ..worker("w-c", T0 + 20) };
    s.register_worker(&refreshed).await?;
    assert_eq!(s.workers(T0).await?, vec![worker("w-a", T0 + 5), worker("w-b", T0 + 10), refreshed.clone()]);
    assert_eq!(s.workers(T0 + 10).await?, vec![worker("w-b", T0 + 10), refreshed.clone()], "w-a was stale");
    assert_eq!(s.workers(T0).await?, vec![worker("w-b", T0 + 10), refreshed.clone()], "and is forgotten");
    assert!(s.remove_worker("w-b").await?);
    assert!(!s.remove_worker("w-b").await?);
    assert!(!s.remove_worker("w-a").await?);
    assert_eq!(s.workers(T0).await?, vec![refreshed]);
    Ok(())
}

/// A `blocked` run wakes as a suspended one: a delivery and a task result each make it due now
/// (`wake_gen + 1`), it is in `due_runs` when its `wake_at` has come, and a claim takes it.
pub async fn blocked_runs_wake_like_suspended_ones(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    // Woken by a signal.
    let parked = park_on_signal(s, "sig", 0, "tok", None).await?;
    drive(s, "sig", &[RunStatus::Blocked]).await?;
    assert!(due(s, T0 + 100_000).await?.is_empty(), "blocked without wake_at is not due");
    let now = T0 + 100;
    s.send_signal("tok", json(json!(1)), now).await?;
    let run = get(s, "sig").await?;
    assert_eq!((run.status, run.wake_at, run.wake_gen), (RunStatus::Blocked, Some(now), parked.wake_gen + 1));
    assert_eq!(due(s, now).await?, [RunId::from("sig")]);
    let claimed = acquire(s, claim("sig", OWNER, now)).await?;
    assert_eq!(claimed.status, RunStatus::Running);

    // Woken by a task's result.
    let parked = parked_on(s, "rem", task("rem", 0, 1)).await?;
    drive(s, "rem", &[RunStatus::Blocked]).await?;
    claim_all(s, W1, AT + 10).await?;
    assert_eq!(s.complete_task(done("rem", 0, 1, W1, Ok(json!("ok")), now)).await?, TaskCompletion::Accepted);
    let run = get(s, "rem").await?;
    assert_eq!((run.status, run.wake_at, run.wake_gen), (RunStatus::Blocked, Some(now), parked.wake_gen + 1));
    assert_eq!(due(s, now).await?, [RunId::from("rem")]);

    // Due by its own timer.
    let timer = park_until(s, new_run("timer"), T0 + 500).await?;
    drive(s, "timer", &[RunStatus::Blocked]).await?;
    assert_eq!(get(s, "timer").await?.wake_at, timer.wake_at);
    assert!(!due(s, T0 + 499).await?.contains(&RunId::from("timer")));
    assert!(due(s, T0 + 500).await?.contains(&RunId::from("timer")));
    Ok(())
}

/// A claim that takes a run out of `blocked` (its task's result, a signal or its timer woke it
/// before the engine unblocked it) clears the run's `blocked` error: the run is executing, and
/// a later block of it must find it without an error. Both claim paths: `claim_run` and
/// `complete_task_and_claim`. Another error (a cancel request) stays.
pub async fn a_claim_out_of_blocked_clears_the_blocked_error(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let now = T0 + 100;
    let blocked = StepError::fatal("blocked: no compatible worker (requires gpu)").with_code(codes::BLOCKED);
    let block = |id: &'static str, error: StepError| async move {
        let patch = RunPatch { status: Some(RunStatus::Blocked), error: Some(Some(error)), now, ..RunPatch::default() };
        assert!(s.update_run_if(&RunId::from(id), &[RunStatus::Suspended], patch).await?, "run {id} is suspended");
        let run = get(s, id).await?;
        assert_eq!(run.status, RunStatus::Blocked);
        CaseResult::Ok(run)
    };

    // Woken by a signal, then claimed.
    park_on_signal(s, "sig", 0, "tok", None).await?;
    block("sig", blocked.clone()).await?;
    s.send_signal("tok", json(json!(1)), now).await?;
    let run = acquire(s, claim("sig", OWNER, now)).await?;
    assert_eq!((run.status, run.error.as_ref()), (RunStatus::Running, None), "the claim's answer");
    assert_eq!(get(s, "sig").await?.error, None, "run sig as stored");

    // Its task's result, recorded with the claim.
    parked_on(s, "rem", task("rem", 0, 1)).await?;
    block("rem", blocked.clone()).await?;
    claim_all(s, W1, AT + 10).await?;
    let (completion, claimed) =
        s.complete_task_and_claim(done("rem", 0, 1, W1, Ok(json!("ok")), now), claim("rem", OWNER, now)).await?;
    assert_eq!(completion, TaskCompletion::Accepted);
    let Some(ClaimOutcome::Acquired { run, .. }) = claimed else {
        panic!("run rem: the result's claim should acquire the blocked run, got {claimed:?}")
    };
    assert_eq!((run.status, run.error.as_ref()), (RunStatus::Running, None), "the claim's answer");
    assert_eq!(get(s, "rem").await?.error, None, "run rem as stored");

    // A cancel request on a blocked run is not the block's: it stays.
    park_until(s, new_run("cancel"), T0 + 50).await?;
    let request = StepError::fatal("cancel requested").with_code(codes::CANCEL_REQUESTED);
    block("cancel", request.clone()).await?;
    let run = acquire(s, claim("cancel", OWNER, now)).await?;
    assert_eq!((run.status, run.error.as_ref()), (RunStatus::Running, Some(&request)));
    assert_eq!(get(s, "cancel").await?.error, Some(request));
    Ok(())
}
