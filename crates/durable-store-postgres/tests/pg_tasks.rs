//! Remote steps on PostgreSQL: dispatch by commit, claims (each task to exactly one of many
//! concurrent claimers), redelivery after a lease expires, heartbeats, results (idempotent,
//! waking the run, never reviving a settled one), releases, listings, queue figures, workers,
//! the `blocked` status in the wake paths, and the `LISTEN/NOTIFY` wake-ups of idle workers —
//! with the latency of a claim by a worker woken by NOTIFY (p50/p99 printed).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ScratchSchema, T0, new_run, url_or_skip};
use durable_core::task::{
    BeatOutcome, NewTask, TaskBeat, TaskClaim, TaskCompletion, TaskDone, TaskLog, TaskState, WorkerInfo,
};
use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, Payload, RunId, RunPatch, RunQuery, RunStatus,
    StepError, StepKind, Store, TaskFilter, TurnEnd, WaitKind, Waiter, codes, protocol,
};
use durable_store_postgres::PostgresStore;

const OWNER: &str = "engine";

fn task(run: &str, seq: u32, attempt: u32, queue: &str) -> NewTask {
    NewTask {
        trace_context: None,
        run_id: RunId::from(run),
        seq,
        attempt,
        name: "resize".into(),
        queue: queue.into(),
        namespace: "default".into(),
        input: Payload::from_trusted(format!("{{ \"seq\": {seq} }}")),
        priority: 0,
        requires: Vec::new(),
        pickup_timeout_ms: None,
        timeout_ms: None,
        heartbeat_timeout_ms: 1_000,
        created_at: T0,
        claimed_by: None,
    }
}

/// Creates the run (if needed), takes its lease and commits a dispatch of `t` as
/// `Turn::remote_step` does: the `running` checkpoint, the wait on the remote token, the task,
/// and a suspension.
async fn dispatch(store: &PostgresStore, t: NewTask) {
    let run = t.run_id.clone();
    store.create_run(new_run(run.as_str())).await.unwrap();
    let now = t.created_at;
    let claimed = store
        .claim_run(Claim { run_id: run.clone(), owner: OWNER.into(), lease_until: now + 60_000, now })
        .await
        .unwrap();
    let ClaimOutcome::Acquired { run: r, .. } = claimed else { panic!("claim of {run}: {claimed:?}") };
    let mut c = Commit::new(run.clone(), OWNER, now);
    let mut cp = Checkpoint::new(run.clone(), t.seq, &t.name, StepKind::Remote, CheckpointStatus::Running, now);
    cp.attempts = t.attempt;
    cp.input = Some(t.input.clone());
    c.checkpoints.push(cp);
    c.waits.push(Waiter {
        run_id: run.clone(),
        seq: t.seq,
        name: t.name.clone(),
        kind: WaitKind::Signal { token: protocol::remote_token(&run, t.seq) },
        created_at: now,
    });
    c.tasks.push(t);
    c.end = Some(TurnEnd::Suspend { wake_at: Some(now + 300_000), seen_wake_gen: r.wake_gen });
    let out = store.commit(c).await.unwrap();
    assert!(!out.woken, "{out:?}");
}

fn claim(worker: &str, queues: &[&str], limit: usize, now: u64) -> TaskClaim {
    TaskClaim {
        worker: worker.into(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        namespace: None,
        capabilities: Vec::new(),
        limit,
        now,
    }
}

fn done(run: &str, seq: u32, attempt: u32, result: Result<Payload, StepError>, now: u64) -> TaskDone {
    TaskDone { run_id: RunId::from(run), seq, attempt, worker: Some("w".into()), result, logs: Vec::new(), now }
}

fn log(attempt: u32, message: &str) -> TaskLog {
    TaskLog { attempt, at: T0, level: "info".into(), message: message.into(), data: Some(serde_json::json!({"k": 1})) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_goes_to_exactly_one_of_sixteen_concurrent_claimers() {
    let Some(url) = url_or_skip("each_task_goes_to_exactly_one_of_sixteen_concurrent_claimers") else { return };
    let scratch = ScratchSchema::new(&url, "tclaim").await.unwrap();
    let store = PostgresStore::connect_with(&url, scratch.options().pool_size(16)).await.unwrap();
    const N: usize = 200;
    for i in 0..N {
        dispatch(&store, task(&format!("r{i:03}"), 1, 1, "q")).await;
    }
    let mut claimers = Vec::new();
    for w in 0..16 {
        let store = store.clone();
        claimers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let tasks = store.claim_tasks(&claim(&format!("w{w}"), &["q"], 3, T0 + 10)).await.unwrap();
                if tasks.is_empty() {
                    return got;
                }
                for t in tasks {
                    assert_eq!(t.state, TaskState::Claimed);
                    assert_eq!(t.worker.as_deref(), Some(format!("w{w}").as_str()));
                    got.push(t.task.run_id.to_string());
                }
            }
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(all.len(), N, "every task claimed once");
    assert_eq!(distinct.len(), N, "no task claimed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_follow_queue_namespace_capabilities_priority_and_age() {
    let Some(url) = url_or_skip("claims_follow_queue_namespace_capabilities_priority_and_age") else { return };
    let scratch = ScratchSchema::new(&url, "torder").await.unwrap();
    let store = scratch.connect().await.unwrap();
    dispatch(&store, NewTask { created_at: T0 + 2, ..task("old-low", 1, 1, "q") }).await;
    dispatch(&store, NewTask { priority: 5, created_at: T0 + 3, ..task("high", 1, 1, "q") }).await;
    dispatch(&store, NewTask { created_at: T0 + 1, ..task("older-low", 1, 1, "q") }).await;
    dispatch(&store, NewTask { requires: vec!["gpu".into()], ..task("gpu", 1, 1, "q") }).await;
    dispatch(&store, NewTask { namespace: "other".into(), ..task("other-ns", 1, 1, "q") }).await;
    dispatch(&store, task("elsewhere", 1, 1, "q2")).await;

    let mut c = claim("w", &["q"], 10, T0 + 10);
    c.namespace = Some("default".into());
    let got: Vec<String> =
        store.claim_tasks(&c).await.unwrap().into_iter().map(|t| t.task.run_id.to_string()).collect();
    assert_eq!(got, ["high", "older-low", "old-low"]);
    let mut c = claim("w2", &["q", "q2"], 10, T0 + 10);
    c.capabilities = vec!["gpu".into(), "fast".into()];
    let mut got: Vec<String> =
        store.claim_tasks(&c).await.unwrap().into_iter().map(|t| t.task.run_id.to_string()).collect();
    got.sort();
    assert_eq!(got, ["elsewhere", "gpu", "other-ns"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_redelivered_and_the_old_holder_loses_it() {
    let Some(url) = url_or_skip("an_expired_lease_is_redelivered_and_the_old_holder_loses_it") else { return };
    let scratch = ScratchSchema::new(&url, "tlease").await.unwrap();
    let store = scratch.connect().await.unwrap();
    dispatch(&store, NewTask { timeout_ms: Some(10_000), ..task("r", 1, 1, "q") }).await;

    let first = store.claim_tasks(&claim("a", &["q"], 5, T0 + 100)).await.unwrap();
    assert_eq!(first.len(), 1);
    let t = &first[0];
    assert_eq!(
        (t.claims, t.claimed_at, t.lease_until, t.heartbeat_at),
        (1, Some(T0 + 100), Some(T0 + 1_100), Some(T0 + 100))
    );
    assert!(store.claim_tasks(&claim("b", &["q"], 5, T0 + 1_099)).await.unwrap().is_empty(), "leased");

    // Heartbeats extend the lease, replace the progress and append logs.
    let beat = |worker: &str, now: u64| TaskBeat {
        run_id: RunId::from("r"),
        seq: 1,
        attempt: 1,
        worker: worker.into(),
        progress: Some(Payload::from_trusted("{\"done\": 0.5}")),
        logs: vec![log(1, "half")],
        now,
    };
    assert_eq!(store.heartbeat_task(&beat("a", T0 + 500)).await.unwrap(), BeatOutcome::Extended(T0 + 1_500));
    assert!(store.claim_tasks(&claim("b", &["q"], 5, T0 + 1_200)).await.unwrap().is_empty(), "extended");

    // Past the lease: another worker gets it, the attempt's timeout still counts from the first claim.
    let again = store.claim_tasks(&claim("b", &["q"], 5, T0 + 1_500)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].claims, again[0].claimed_at, again[0].worker.as_deref()), (2, Some(T0 + 100), Some("b")));
    assert_eq!(again[0].progress.as_ref().map(Payload::as_str), Some("{\"done\": 0.5}"));
    assert_eq!(again[0].logs, vec![log(1, "half")]);
    assert_eq!(store.heartbeat_task(&beat("a", T0 + 1_600)).await.unwrap(), BeatOutcome::Lost);
    let mut other_attempt = beat("b", T0 + 1_600);
    other_attempt.attempt = 2;
    assert_eq!(store.heartbeat_task(&other_attempt).await.unwrap(), BeatOutcome::Lost);
    // Past the attempt's deadline (first claim + timeout): cancelled, and no longer claimable.
    assert_eq!(store.heartbeat_task(&beat("b", T0 + 10_100)).await.unwrap(), BeatOutcome::Cancelled);
    assert!(store.claim_tasks(&claim("c", &["q"], 5, T0 + 20_000)).await.unwrap().is_empty());
    let expired =
        store.list_tasks(&TaskFilter { expired_at: Some(T0 + 10_100), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert!(
        store
            .list_tasks(&TaskFilter { expired_at: Some(T0 + 10_099), ..TaskFilter::default() })
            .await
            .unwrap()
            .is_empty()
    );

    // Release: a draining worker hands it back at once (only its own claim).
    dispatch(&store, task("s", 1, 1, "q")).await;
    let held = store.claim_tasks(&claim("d", &["q"], 5, T0 + 100)).await.unwrap();
    assert_eq!(held.len(), 1);
    store.release_tasks(&[(RunId::from("s"), 1, 1)], "someone-else").await.unwrap();
    assert!(store.claim_tasks(&claim("e", &["q"], 5, T0 + 200)).await.unwrap().is_empty());
    store.release_tasks(&[(RunId::from("s"), 1, 1)], "d").await.unwrap();
    let back = store.claim_tasks(&claim("e", &["q"], 5, T0 + 200)).await.unwrap();
    assert_eq!((back.len(), back[0].claims, back[0].claimed_at), (1, 2, Some(T0 + 100)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_recorded_once_and_wakes_the_run() {
    let Some(url) = url_or_skip("a_result_is_recorded_once_and_wakes_the_run") else { return };
    let scratch = ScratchSchema::new(&url, "tdone").await.unwrap();
    let store = scratch.connect().await.unwrap();
    dispatch(&store, task("r", 1, 1, "q")).await;
    let before = store.get_run(&RunId::from("r")).await.unwrap().unwrap();
    assert_eq!(before.status, RunStatus::Suspended);
    store.claim_tasks(&claim("w", &["q"], 1, T0 + 10)).await.unwrap();

    // A result of another attempt is a duplicate; the first result of this attempt wins.
    let out = Payload::from_trusted("{ \"w\" :1.0 }");
    assert_eq!(
        store.complete_task(done("r", 1, 2, Ok(out.clone()), T0 + 20)).await.unwrap(),
        TaskCompletion::Duplicate
    );
    let mut first = done("r", 1, 1, Ok(out.clone()), T0 + 20);
    first.logs = vec![log(1, "end")];
    assert_eq!(store.complete_task(first).await.unwrap(), TaskCompletion::Accepted);
    let again = done("r", 1, 1, Err(StepError::retryable("late")), T0 + 30);
    assert_eq!(store.complete_task(again).await.unwrap(), TaskCompletion::Duplicate);

    let run = store.get_run(&RunId::from("r")).await.unwrap().unwrap();
    assert_eq!(run.wake_gen, before.wake_gen + 1);
    assert_eq!(run.wake_at, Some(T0 + 20), "due now");
    let due = store
        .due_runs(&RunQuery { namespace: None, workflows: None, now: T0 + 20, limit: 10, leave_queued_since: None })
        .await
        .unwrap();
    assert_eq!(due, [RunId::from("r")]);
    let cp = store.history(&RunId::from("r")).await.unwrap().into_iter().find(|c| c.seq == 1).unwrap();
    assert_eq!((cp.status, cp.attempts, cp.kind), (CheckpointStatus::Completed, 1, StepKind::Remote));
    assert_eq!(cp.output.as_ref().map(Payload::as_str), Some("{ \"w\" :1.0 }"), "byte for byte");
    assert!(store.waiters(&RunId::from("r")).await.unwrap().is_empty(), "the wait was consumed");
    let t = store.list_tasks(&TaskFilter { run_id: Some(RunId::from("r")), ..TaskFilter::default() }).await.unwrap();
    assert_eq!((t[0].state, t[0].outcome.as_deref()), (TaskState::Finished, Some("completed")));
    assert_eq!(t[0].logs, vec![log(1, "end")]);

    // A failure: `waiting` with the error and no wake_at; a timeout is `timed_out`.
    dispatch(&store, task("f", 1, 3, "q")).await;
    let timeout = StepError { code: Some(codes::REMOTE_TIMEOUT.into()), ..StepError::retryable("too slow") };
    let mut d = done("f", 1, 3, Err(timeout.clone()), T0 + 40);
    d.worker = None;
    assert_eq!(store.complete_task(d).await.unwrap(), TaskCompletion::Accepted);
    let cp = store.history(&RunId::from("f")).await.unwrap().into_iter().find(|c| c.seq == 1).unwrap();
    assert_eq!((cp.status, cp.wake_at, cp.attempts), (CheckpointStatus::Waiting, None, 3));
    assert_eq!(cp.error, Some(timeout));
    let t = store.list_tasks(&TaskFilter { run_id: Some(RunId::from("f")), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(t[0].outcome.as_deref(), Some("timed_out"));

    // A re-dispatch replaces the attempt, keeps the logs, and the result of the old one is late.
    let logs_before = store.list_tasks(&TaskFilter::default()).await.unwrap();
    assert_eq!(logs_before.len(), 2);
    dispatch(&store, NewTask { created_at: T0 + 50, ..task("r", 1, 2, "q") }).await;
    let t = store.list_tasks(&TaskFilter { run_id: Some(RunId::from("r")), ..TaskFilter::default() }).await.unwrap();
    assert_eq!((t[0].task.attempt, t[0].state, t[0].claims, t[0].outcome.as_deref()), (2, TaskState::Queued, 0, None));
    assert_eq!(t[0].logs, vec![log(1, "end")], "the old attempt's logs are kept");
    assert_eq!(store.complete_task(done("r", 1, 1, Ok(out), T0 + 60)).await.unwrap(), TaskCompletion::Duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_run_is_never_revived_and_its_tasks_end() {
    let Some(url) = url_or_skip("a_settled_run_is_never_revived_and_its_tasks_end") else { return };
    let scratch = ScratchSchema::new(&url, "tterm").await.unwrap();
    let store = scratch.connect().await.unwrap();

    // Cancelled by an operator while a worker holds the task.
    dispatch(&store, task("c", 1, 1, "q")).await;
    store.claim_tasks(&claim("w", &["q"], 1, T0 + 10)).await.unwrap();
    let cancel = RunPatch { status: Some(RunStatus::Cancelled), now: T0 + 20, ..RunPatch::default() };
    assert!(store.update_run_if(&RunId::from("c"), &[], cancel).await.unwrap());
    let cancelled = store.get_run(&RunId::from("c")).await.unwrap().unwrap();
    let beat = TaskBeat {
        run_id: RunId::from("c"),
        seq: 1,
        attempt: 1,
        worker: "w".into(),
        progress: None,
        logs: vec![],
        now: T0 + 30,
    };
    assert_eq!(store.heartbeat_task(&beat).await.unwrap(), BeatOutcome::Cancelled);
    assert!(store.claim_tasks(&claim("w2", &["q"], 1, T0 + 5_000)).await.unwrap().is_empty(), "not redelivered");
    assert!(store.queue_stats().await.unwrap().is_empty(), "tasks of settled runs are not counted");
    let late = store.complete_task(done("c", 1, 1, Ok(Payload::null()), T0 + 40)).await.unwrap();
    assert_eq!(late, TaskCompletion::RunTerminal);
    let again = store.complete_task(done("c", 1, 1, Ok(Payload::null()), T0 + 41)).await.unwrap();
    assert_eq!(again, TaskCompletion::Duplicate);
    let run = store.get_run(&RunId::from("c")).await.unwrap().unwrap();
    assert_eq!(run, cancelled, "not revived, not woken");
    let cp = store.history(&RunId::from("c")).await.unwrap().into_iter().find(|c| c.seq == 1).unwrap();
    assert_eq!(cp.status, CheckpointStatus::Running, "no result recorded");
    let t = store.list_tasks(&TaskFilter { run_id: Some(RunId::from("c")), ..TaskFilter::default() }).await.unwrap();
    assert_eq!((t[0].state, t[0].outcome.as_deref()), (TaskState::Finished, Some("cancelled")));

    // A run settled by its own turn finishes its unfinished tasks; none is claimable.
    dispatch(&store, task("s", 1, 1, "q")).await;
    dispatch(&store, task("s", 2, 1, "q")).await;
    let claimed = store
        .claim_run(Claim { run_id: RunId::from("s"), owner: OWNER.into(), lease_until: T0 + 60_000, now: T0 + 50 })
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Acquired { .. }));
    let mut c = Commit::new(RunId::from("s"), OWNER, T0 + 60);
    c.end = Some(TurnEnd::Settle { status: RunStatus::Failed, output: None, error: Some(StepError::fatal("no")) });
    assert!(store.commit(c).await.unwrap().settled);
    let open = store
        .list_tasks(&TaskFilter { run_id: Some(RunId::from("s")), unfinished: true, ..TaskFilter::default() })
        .await
        .unwrap();
    assert!(open.is_empty(), "{open:?}");
    assert!(store.claim_tasks(&claim("w", &["q"], 10, T0 + 70)).await.unwrap().is_empty());
    assert_eq!(store.queue_stats().await.unwrap(), vec![]);
    let late = store.complete_task(done("s", 1, 1, Ok(Payload::null()), T0 + 80)).await.unwrap();
    assert_eq!(late, TaskCompletion::Duplicate);
    assert_eq!(store.get_run(&RunId::from("s")).await.unwrap().unwrap().status, RunStatus::Failed);

    // Deleting a run deletes its tasks.
    assert_eq!(store.delete_run(&RunId::from("s")).await.unwrap(), 1);
    assert!(
        store
            .list_tasks(&TaskFilter { run_id: Some(RunId::from("s")), ..TaskFilter::default() })
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_run_wakes_like_a_suspended_one() {
    let Some(url) = url_or_skip("a_blocked_run_wakes_like_a_suspended_one") else { return };
    let scratch = ScratchSchema::new(&url, "tblock").await.unwrap();
    let store = scratch.connect().await.unwrap();
    dispatch(&store, task("b", 1, 1, "q")).await;
    let block = RunPatch {
        status: Some(RunStatus::Blocked),
        error: Some(Some(StepError::retryable("no worker serves queue q"))),
        wake_at: Some(None),
        now: T0 + 5,
        ..RunPatch::default()
    };
    assert!(store.update_run_if(&RunId::from("b"), &[RunStatus::Suspended], block).await.unwrap());
    let q = RunQuery { namespace: None, workflows: None, now: T0 + 100, limit: 10, leave_queued_since: None };
    assert!(store.due_runs(&q).await.unwrap().is_empty());
    // Listed among the active runs.
    let active = store
        .list_runs(&durable_core::RunFilter { statuses: RunStatus::ACTIVE.to_vec(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(active.runs.len(), 1);

    // A result wakes it: due now, and claimable by an engine.
    store.claim_tasks(&claim("w", &["q"], 1, T0 + 10)).await.unwrap();
    let accepted = store.complete_task(done("b", 1, 1, Ok(Payload::null()), T0 + 20)).await.unwrap();
    assert_eq!(accepted, TaskCompletion::Accepted);
    let run = store.get_run(&RunId::from("b")).await.unwrap().unwrap();
    assert_eq!((run.status, run.wake_at), (RunStatus::Blocked, Some(T0 + 20)));
    assert_eq!(store.due_runs(&q).await.unwrap(), [RunId::from("b")]);
    let claimed = store
        .claim_run(Claim { run_id: RunId::from("b"), owner: OWNER.into(), lease_until: T0 + 60_000, now: T0 + 30 })
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Acquired { previous: RunStatus::Blocked, .. }), "{claimed:?}");

    // A signal to a blocked run wakes it too.
    store.create_run(new_run("s")).await.unwrap();
    let claimed = store
        .claim_run(Claim { run_id: RunId::from("s"), owner: OWNER.into(), lease_until: T0 + 60_000, now: T0 })
        .await
        .unwrap();
    let ClaimOutcome::Acquired { run, .. } = claimed else { panic!() };
    let mut c = Commit::new(RunId::from("s"), OWNER, T0);
    c.waits.push(Waiter {
        run_id: RunId::from("s"),
        seq: 0,
        name: "sig".into(),
        kind: WaitKind::Signal { token: "tok".into() },
        created_at: T0,
    });
    c.end = Some(TurnEnd::Suspend { wake_at: None, seen_wake_gen: run.wake_gen });
    store.commit(c).await.unwrap();
    let block = RunPatch { status: Some(RunStatus::Blocked), now: T0 + 1, ..RunPatch::default() };
    assert!(store.update_run_if(&RunId::from("s"), &[RunStatus::Suspended], block).await.unwrap());
    store.send_signal("tok", Payload::null(), T0 + 40).await.unwrap();
    assert_eq!(store.get_run(&RunId::from("s")).await.unwrap().unwrap().wake_at, Some(T0 + 40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_stats_and_workers() {
    let Some(url) = url_or_skip("listings_stats_and_workers") else { return };
    let scratch = ScratchSchema::new(&url, "tlist").await.unwrap();
    let store = scratch.connect().await.unwrap();
    dispatch(&store, NewTask { created_at: T0 + 3, pickup_timeout_ms: Some(100), ..task("a", 1, 1, "q") }).await;
    dispatch(&store, NewTask { created_at: T0 + 1, ..task("b", 1, 1, "q") }).await;
    dispatch(&store, NewTask { created_at: T0 + 2, namespace: "ns".into(), ..task("c", 1, 1, "z") }).await;
    store.claim_tasks(&claim("w", &["z"], 1, T0 + 10)).await.unwrap();

    let ids = |ts: Vec<durable_core::task::Task>| ts.into_iter().map(|t| t.task.run_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(store.list_tasks(&TaskFilter::default()).await.unwrap()), ["b", "c", "a"]);
    assert_eq!(ids(store.list_tasks(&TaskFilter { limit: 2, ..TaskFilter::default() }).await.unwrap()), ["b", "c"]);
    assert_eq!(ids(store.list_tasks(&TaskFilter { queued: true, ..TaskFilter::default() }).await.unwrap()), ["b", "a"]);
    let expired = TaskFilter { expired_at: Some(T0 + 103), ..TaskFilter::default() };
    assert_eq!(ids(store.list_tasks(&expired).await.unwrap()), ["a"]);
    let silent = TaskFilter { silent_since: Some(T0 + 3), ..TaskFilter::default() };
    assert_eq!(ids(store.list_tasks(&silent).await.unwrap()), ["b"], "c heartbeat at its claim, a dispatched at +3");

    let stats = store.queue_stats().await.unwrap();
    assert_eq!(stats.len(), 2);
    assert_eq!(
        (stats[0].namespace.as_str(), stats[0].queue.as_str(), stats[0].queued, stats[0].claimed),
        ("default", "q", 2, 0)
    );
    assert_eq!(stats[0].oldest_at, Some(T0 + 1));
    assert_eq!((stats[1].namespace.as_str(), stats[1].queued, stats[1].claimed), ("ns", 0, 1));

    let worker = |id: &str, beat: u64| WorkerInfo {
        id: id.into(),
        queues: vec!["q".into()],
        capabilities: vec!["gpu".into()],
        protocol_min: 1,
        protocol_max: 1,
        concurrency: 4,
        started_at: T0,
        heartbeat_at: beat,
    };
    store.register_worker(&worker("w2", T0 + 5)).await.unwrap();
    store.register_worker(&worker("w1", T0)).await.unwrap();
    store.register_worker(&worker("w1", T0 + 10)).await.unwrap();
    assert_eq!(store.workers(T0).await.unwrap(), vec![worker("w1", T0 + 10), worker("w2", T0 + 5)]);
    assert_eq!(store.workers(T0 + 6).await.unwrap(), vec![worker("w1", T0 + 10)], "w2 is forgotten");
    assert_eq!(store.workers(0).await.unwrap(), vec![worker("w1", T0 + 10)], "deleted, not hidden");
    assert!(store.remove_worker("w1").await.unwrap());
    assert!(!store.remove_worker("w1").await.unwrap());
    assert!(store.workers(0).await.unwrap().is_empty());
}

/// A store of its own with a notify channel named after the scratch schema (channels are per
/// database: tests running side by side must not nudge each other).
async fn notifying_store(scratch: &ScratchSchema, url: &str) -> PostgresStore {
    PostgresStore::connect_with(url, scratch.options().notify_channel(scratch.name())).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_and_a_release_wake_an_idle_worker() {
    let Some(url) = url_or_skip("a_dispatch_and_a_release_wake_an_idle_worker") else { return };
    let scratch = ScratchSchema::new(&url, "tnotify").await.unwrap();
    let engine = notifying_store(&scratch, &url).await;
    let worker = notifying_store(&scratch, &url).await;
    let nudges = worker.task_wakeups().await.unwrap();
    assert!(Arc::ptr_eq(&nudges, &worker.task_wakeups().await.unwrap()), "one listener per store");
    let bound = Duration::from_secs(10);

    dispatch(&engine, task("r", 1, 1, "q")).await;
    tokio::time::timeout(bound, nudges.notified()).await.expect("the dispatch nudges the idle worker");
    let held = worker.claim_tasks(&claim("w", &["q"], 1, T0 + 1)).await.unwrap();
    assert_eq!(held.len(), 1);

    worker.release_tasks(&[(RunId::from("r"), 1, 1)], "w").await.unwrap();
    tokio::time::timeout(bound, nudges.notified()).await.expect("the release nudges");
    assert_eq!(worker.claim_tasks(&claim("w2", &["q"], 1, T0 + 2)).await.unwrap().len(), 1);

    // Without a channel: a clear error.
    let plain = scratch.connect().await.unwrap();
    assert!(matches!(plain.task_wakeups().await, Err(durable_store_postgres::Error::InvalidOptions { .. })));
}

/// The latency from a dispatch's commit to the claim of an idle worker waiting on
/// `task_wakeups()`: printed as p50/p99 over 200 dispatches, with the commit's own round trip
/// for comparison (`--nocapture` to see it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_claim_latency() {
    let Some(url) = url_or_skip("notify_claim_latency") else { return };
    let scratch = ScratchSchema::new(&url, "tlatency").await.unwrap();
    let engine = notifying_store(&scratch, &url).await;
    let worker = notifying_store(&scratch, &url).await;
    let nudges = worker.task_wakeups().await.unwrap();
    const N: usize = 200;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let claimer = {
        let worker = worker.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(N);
            while latencies.len() < N {
                let Some(committed) = rx.recv().await else { break };
                loop {
                    // Idle: wait for a nudge (bounded: a hang guard, not a poll).
                    tokio::time::timeout(Duration::from_secs(10), nudges.notified()).await.expect("nudged");
                    let got = worker.claim_tasks(&claim("w", &["q"], 10, T0 + 1)).await.unwrap();
                    if !got.is_empty() {
                        latencies.push(committed.elapsed());
                        break;
                    }
                }
            }
            latencies
        })
    };
    let mut commits = Vec::with_capacity(N);
    for i in 0..N {
        let t = task(&format!("r{i:03}"), 1, 1, "q");
        // The run's creation and claim first, so the clock starts at the dispatch commit.
        let run = t.run_id.clone();
        engine.create_run(new_run(run.as_str())).await.unwrap();
        let claimed = engine
            .claim_run(Claim { run_id: run.clone(), owner: OWNER.into(), lease_until: T0 + 60_000, now: T0 })
            .await
            .unwrap();
        let ClaimOutcome::Acquired { run: r, .. } = claimed else { panic!() };
        let mut c = Commit::new(run.clone(), OWNER, T0);
        c.waits.push(Waiter {
            run_id: run.clone(),
            seq: 1,
            name: t.name.clone(),
            kind: WaitKind::Signal { token: protocol::remote_token(&run, 1) },
            created_at: T0,
        });
        c.tasks.push(t);
        c.end = Some(TurnEnd::Suspend { wake_at: None, seen_wake_gen: r.wake_gen });
        let start = Instant::now();
        engine.commit(c).await.unwrap();
        commits.push(start.elapsed());
        tx.send(start).unwrap();
        // One task in flight at a time: the worker is idle again before the next dispatch.
        while !engine.list_tasks(&TaskFilter { queued: true, ..TaskFilter::default() }).await.unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    }
    let mut latencies = claimer.await.unwrap();
    latencies.sort();
    commits.sort();
    let pct = |v: &[Duration], p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    println!(
        "notify_claim_latency: dispatch commit start -> claimed by an idle worker woken by NOTIFY, n={N}: \
         p50 {:?}, p99 {:?}, max {:?} (the dispatch commit's own round trip: p50 {:?}, p99 {:?})",
        pct(&latencies, 50),
        pct(&latencies, 99),
        latencies[latencies.len() - 1],
        pct(&commits, 50),
        pct(&commits, 99),
    );
    assert!(pct(&latencies, 50) < Duration::from_secs(1), "p50 {:?}", pct(&latencies, 50));
}

/// Two workers (on two stores, so two writers and two transactions) report the same attempt at
/// once, while the run's engine settles some of the runs: every task is accepted at most once,
/// and never after its run settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_results_and_settles_record_each_task_at_most_once() {
    let Some(url) = url_or_skip("racing_results_and_settles_record_each_task_at_most_once") else { return };
    let scratch = ScratchSchema::new(&url, "trace").await.unwrap();
    let a = scratch.connect().await.unwrap();
    let b = scratch.connect().await.unwrap();
    const N: usize = 40;
    for i in 0..N {
        dispatch(&a, task(&format!("r{i:02}"), 1, 1, "q")).await;
    }
    let before: Vec<u64> = {
        let mut v = Vec::new();
        for i in 0..N {
            v.push(a.get_run(&RunId::from(format!("r{i:02}").as_str())).await.unwrap().unwrap().wake_gen);
        }
        v
    };
    let mut jobs = Vec::new();
    for i in 0..N {
        let run = format!("r{i:02}");
        for (k, store) in [a.clone(), b.clone()].into_iter().enumerate() {
            let run = run.clone();
            jobs.push(tokio::spawn(async move {
                let out = Payload::from_trusted(format!("{k}"));
                (run.clone(), "result", store.complete_task(done(&run, 1, 1, Ok(out), T0 + 10)).await.unwrap())
            }));
        }
        if i % 2 == 0 {
            // The engine settles every other run meanwhile (a cancel taking effect in its turn).
            let store = b.clone();
            jobs.push(tokio::spawn(async move {
                let id = RunId::from(run.as_str());
                let claimed = store
                    .claim_run(Claim {
                        run_id: id.clone(),
                        owner: "other".into(),
                        lease_until: T0 + 60_000,
                        now: T0 + 5,
                    })
                    .await
                    .unwrap();
                let settled = match claimed {
                    ClaimOutcome::Acquired { .. } => {
                        let mut c = Commit::new(id, "other", T0 + 6);
                        c.end = Some(TurnEnd::Settle { status: RunStatus::Cancelled, output: None, error: None });
                        store.commit(c).await.unwrap().settled
                    }
                    _ => false,
                };
                (run, "settle", if settled { TaskCompletion::RunTerminal } else { TaskCompletion::Duplicate })
            }));
        }
    }
    let mut accepted = std::collections::BTreeMap::<String, usize>::new();
    for j in jobs {
        let (run, kind, outcome) = j.await.unwrap();
        if kind == "result" && outcome == TaskCompletion::Accepted {
            *accepted.entry(run).or_default() += 1;
        }
    }
    for (i, wake_gen) in before.into_iter().enumerate() {
        let id = format!("r{i:02}");
        let run = a.get_run(&RunId::from(id.as_str())).await.unwrap().unwrap();
        let n = accepted.get(&id).copied().unwrap_or(0);
        assert!(n <= 1, "{id}: accepted {n} times");
        let cp = a.history(&run.id).await.unwrap().into_iter().find(|c| c.seq == 1).unwrap();
        let t = a.list_tasks(&TaskFilter { run_id: Some(run.id.clone()), ..TaskFilter::default() }).await.unwrap();
        assert_eq!(t[0].state, TaskState::Finished, "{id}");
        if n == 1 {
            assert_eq!(cp.status, CheckpointStatus::Completed, "{id}");
            assert_eq!(t[0].outcome.as_deref(), Some("completed"));
            assert!(run.wake_gen > wake_gen, "{id}: woken");
        } else {
            assert_eq!(run.status, RunStatus::Cancelled, "{id}: only a settle keeps a result out");
            assert_eq!(cp.status, CheckpointStatus::Running, "{id}");
            assert_eq!(t[0].outcome.as_deref(), Some("cancelled"));
        }
        if i % 2 == 1 {
            assert_eq!(n, 1, "{id}: no settle raced it");
        }
    }
}
