//! Builders shared by the cases: runs, claims, commits, waits, and the race helper.

use std::fmt::Debug;
use std::future::Future;
use std::panic::resume_unwind;
use std::sync::Arc;

use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, CreateRun, Millis, NewRun, Payload, Run, RunFilter,
    RunId, RunPatch, RunStatus, StepKind, Store, StoreErrorKind, StoreExt, StoreResult, TurnEnd, WaitKind, Waiter,
};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::CaseResult;

/// The time every case starts at (the caller's clock; stores never read their own).
pub(crate) const T0: Millis = 1_700_000_000_000;
/// How long the leases the cases take last.
pub(crate) const LEASE: Millis = 30_000;
/// The lease owner most cases use.
pub(crate) const OWNER: &str = "engine-a";
/// Another lease owner.
pub(crate) const OTHER: &str = "engine-b";
/// How many tasks the race cases start together.
pub(crate) const RACERS: usize = 16;

/// A payload holding `value`.
pub(crate) fn json(value: Value) -> Payload {
    Payload::from_trusted(value.to_string())
}

/// A run to create: workflow `wf` v1 in namespace `default`, created at [`T0`].
pub(crate) fn new_run(id: &str) -> NewRun {
    NewRun {
        trace_context: None,
        admission: None,
        id: RunId::from(id),
        workflow: "wf".into(),
        version: 1,
        namespace: "default".into(),
        input: json(json!({ "run": id })),
        tags: Vec::new(),
        priority: 0,
        parent: None,
        created_at: T0,
        start_at: None,
    }
}

/// [`new_run`] created at `created_at`.
pub(crate) fn new_run_at(id: &str, created_at: Millis) -> NewRun {
    NewRun { created_at, ..new_run(id) }
}

/// Creates `run`, which must not exist yet.
pub(crate) async fn create(store: &dyn Store, run: NewRun) -> CaseResult<Run> {
    match store.create_run(run).await? {
        CreateRun::Created(run) => Ok(run),
        CreateRun::Existing(run) => panic!("run {} existed before the case created it", run.id),
    }
}

/// Creates every run of `runs`.
pub(crate) async fn create_all(store: &dyn Store, runs: impl IntoIterator<Item = NewRun>) -> CaseResult {
    for run in runs {
        create(store, run).await?;
    }
    Ok(())
}

/// A claim of `id` by `owner` at `now`, for a lease of [`LEASE`].
pub(crate) fn claim(id: &str, owner: &str, now: Millis) -> Claim {
    Claim { run_id: RunId::from(id), owner: owner.into(), lease_until: now + LEASE, now }
}

/// Makes `claim`, which must acquire; returns the run as claimed.
pub(crate) async fn acquire(store: &dyn Store, claim: Claim) -> CaseResult<Run> {
    let id = claim.run_id.clone();
    match store.claim_run(claim).await? {
        ClaimOutcome::Acquired { run, .. } => Ok(run),
        other => panic!("expected the claim of {id} to acquire it, got {other:?}"),
    }
}

/// Creates `id` and claims it for [`OWNER`] at [`T0`]: a run in the middle of a turn.
pub(crate) async fn start(store: &dyn Store, id: &str) -> CaseResult<Run> {
    create(store, new_run(id)).await?;
    acquire(store, claim(id, OWNER, T0)).await
}

/// The run `id`, which must exist.
pub(crate) async fn get(store: &dyn Store, id: &str) -> CaseResult<Run> {
    Ok(store.require_run(&RunId::from(id)).await?)
}

/// The history of `id`.
pub(crate) async fn history(store: &dyn Store, id: &str) -> CaseResult<Vec<Checkpoint>> {
    Ok(store.history(&RunId::from(id)).await?)
}

/// The seqs of `id`'s history, in the order the store returns them.
pub(crate) async fn history_seqs(store: &dyn Store, id: &str) -> CaseResult<Vec<u32>> {
    Ok(history(store, id).await?.iter().map(|cp| cp.seq).collect())
}

/// The checkpoint of `id` at `seq`, which must exist.
pub(crate) async fn checkpoint_at(store: &dyn Store, id: &str, seq: u32) -> CaseResult<Checkpoint> {
    let history = history(store, id).await?;
    Ok(history
        .into_iter()
        .find(|cp| cp.seq == seq)
        .unwrap_or_else(|| panic!("run {id} has no checkpoint at seq {seq}")))
}

/// The seqs of `id`'s registered waiters.
pub(crate) async fn waiter_seqs(store: &dyn Store, id: &str) -> CaseResult<Vec<u32>> {
    Ok(store.waiters(&RunId::from(id)).await?.iter().map(|w| w.seq).collect())
}

/// A checkpoint of a local step of `run` at `seq`: `step-<seq>`, with the given status and
/// output.
pub(crate) fn step(run: &str, seq: u32, status: CheckpointStatus, output: Option<Value>) -> Checkpoint {
    let mut cp = Checkpoint::new(RunId::from(run), seq, format!("step-{seq}"), StepKind::Step, status, T0);
    cp.output = output.map(json);
    cp.attempts = 1;
    cp
}

/// A completed local step of `run` at `seq` with `output`.
pub(crate) fn completed(run: &str, seq: u32, output: Value) -> Checkpoint {
    step(run, seq, CheckpointStatus::Completed, Some(output))
}

/// The `waiting` checkpoint a turn records at the seq of `wait`.
pub(crate) fn waiting(wait: &Waiter) -> Checkpoint {
    let kind = match wait.kind {
        WaitKind::Signal { .. } => StepKind::Signal,
        WaitKind::Event { .. } => StepKind::Event,
    };
    Checkpoint::new(wait.run_id.clone(), wait.seq, wait.name.clone(), kind, CheckpointStatus::Waiting, T0)
}

/// A wait of `run` at `seq` for a signal to `token`.
pub(crate) fn signal_wait(run: &str, seq: u32, token: &str) -> Waiter {
    Waiter {
        run_id: RunId::from(run),
        seq,
        name: token.into(),
        kind: WaitKind::Signal { token: token.into() },
        created_at: T0,
    }
}

/// A wait of `run` at `seq` for an event `name` whose payload includes `matcher`.
pub(crate) fn event_wait(run: &str, seq: u32, name: &str, matcher: Value) -> Waiter {
    Waiter {
        run_id: RunId::from(run),
        seq,
        name: name.into(),
        kind: WaitKind::Event { name: name.into(), matcher: json(matcher) },
        created_at: T0,
    }
}

/// An empty commit of `run` by `owner` at `T0 + 1`.
pub(crate) fn commit(run: &str, owner: &str) -> Commit {
    Commit::new(RunId::from(run), owner, T0 + 1)
}

/// The end of a turn that parks `run` (as loaded by the turn's claim) until `wake_at`.
pub(crate) fn suspend(run: &Run, wake_at: Option<Millis>) -> Option<TurnEnd> {
    Some(TurnEnd::Suspend { wake_at, seen_wake_gen: run.wake_gen })
}

/// The end of a turn that completes the run with `output`.
pub(crate) fn complete(output: Value) -> Option<TurnEnd> {
    Some(TurnEnd::Settle { status: RunStatus::Completed, output: Some(json(output)), error: None })
}

/// Commits a registration of one wait by [`OWNER`] (the run keeps running).
pub(crate) async fn register_wait(store: &dyn Store, wait: Waiter) -> CaseResult {
    let mut c = commit(wait.run_id.as_str(), OWNER);
    c.waits.push(wait);
    store.commit(c).await?;
    Ok(())
}

/// Creates `id`, claims it for [`OWNER`] and ends the turn parked on `wait` (with its
/// `waiting` checkpoint), due at `wake_at`. Returns the suspended run.
pub(crate) async fn park(store: &dyn Store, id: &str, wait: Waiter, wake_at: Option<Millis>) -> CaseResult<Run> {
    let run = start(store, id).await?;
    let mut c = commit(id, OWNER);
    c.checkpoints.push(waiting(&wait));
    c.waits.push(wait);
    c.end = suspend(&run, wake_at);
    let out = store.commit(c).await?;
    assert!(!out.woken, "nothing was delivered to {id}, yet its suspension reported woken");
    get(store, id).await
}

/// [`park`] on a signal wait of `id` at `seq` for `token`.
pub(crate) async fn park_on_signal(
    store: &dyn Store,
    id: &str,
    seq: u32,
    token: &str,
    wake_at: Option<Millis>,
) -> CaseResult<Run> {
    park(store, id, signal_wait(id, seq, token), wake_at).await
}

/// Creates `id`, claims it and suspends it until `wake_at` (no waiters).
pub(crate) async fn park_until(store: &dyn Store, run: NewRun, wake_at: Millis) -> CaseResult<Run> {
    let id = run.id.clone();
    create(store, run).await?;
    let claimed = acquire(store, claim(id.as_str(), OWNER, T0)).await?;
    let mut c = commit(id.as_str(), OWNER);
    c.end = suspend(&claimed, Some(wake_at));
    store.commit(c).await?;
    get(store, id.as_str()).await
}

/// Moves `id` through `statuses` with unconditional [`Store::update_run_if`] calls, at `T0`.
pub(crate) async fn drive(store: &dyn Store, id: &str, statuses: &[RunStatus]) -> CaseResult {
    for status in statuses {
        let patch = RunPatch { status: Some(*status), now: T0, ..RunPatch::default() };
        assert!(store.update_run_if(&RunId::from(id), &[], patch).await?, "run {id} vanished");
    }
    Ok(())
}

/// The ids `list_runs` returns for `filter` (one page).
pub(crate) async fn listed(store: &dyn Store, filter: RunFilter) -> CaseResult<Vec<String>> {
    Ok(ids(&store.list_runs(&filter).await?.runs))
}

/// The ids of `runs`, in order.
pub(crate) fn ids(runs: &[Run]) -> Vec<String> {
    runs.iter().map(|r| r.id.to_string()).collect()
}

/// The owned strings of `ids`, to compare with [`ids`] and [`listed`].
pub(crate) fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// Asserts that `result` is an error of `kind`.
#[track_caller]
pub(crate) fn assert_kind<T: Debug>(result: StoreResult<T>, kind: StoreErrorKind) {
    match result {
        Err(e) => assert_eq!(e.kind(), kind, "expected a {kind:?} error, got {e}"),
        Ok(v) => panic!("expected a {kind:?} error, got Ok({v:?})"),
    }
}

/// Starts `n` tasks that each wait on one barrier and then run `task(i)`, so their store
/// calls race; returns their results in index order. A panic in a task is re-raised here.
pub(crate) async fn race<T, Fut>(n: usize, task: impl Fn(usize) -> Fut) -> Vec<T>
where
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let barrier = barrier.clone();
            let work = task(i);
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(n);
    for handle in handles {
        match handle.await {
            Ok(result) => results.push(result),
            Err(e) => match e.try_into_panic() {
                Ok(panic) => resume_unwind(panic),
                Err(e) => panic!("a racing task did not finish: {e}"),
            },
        }
    }
    results
}

/// The store of the `i`-th racer: racers alternate between the handles.
pub(crate) fn handle_for(handles: &[Arc<dyn Store>], i: usize) -> Arc<dyn Store> {
    handles[i % handles.len()].clone()
}
