//! `commit`: the one atomic write of a step completion or a suspension.

use std::sync::Arc;

use durable_core::{
    Checkpoint, CheckpointStatus, ClaimOutcome, Commit, CommitOutcome, Delivery, NewRun, OutgoingSignal, ParentLink,
    RunFilter, RunId, RunPatch, RunStatus, StepError, StepKind, Store, StoreErrorKind, TurnEnd, codes,
};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// A commit of `run` by `owner` carrying one of everything: a checkpoint, a wait, state, a
/// child, a signal to `tok` and a settle.
fn full_commit(run: &str, owner: &str) -> Commit {
    let mut c = commit(run, owner);
    c.checkpoints.push(completed(run, 0, json!("step")));
    c.waits.push(signal_wait(run, 1, "other-token"));
    c.state.push(("k".into(), json(json!(1))));
    c.children.push(NewRun {
        parent: Some(ParentLink { run_id: RunId::from(run), seq: 2 }),
        ..new_run(&format!("{run}.child.2"))
    });
    c.signals.push(OutgoingSignal { token: "tok".into(), payload: json(json!("hello")) });
    c.end = complete(json!("done"));
    c
}

/// Asserts that `c` is refused with `LeaseLost` and writes nothing: run row, history,
/// waiters, state and children as before.
async fn assert_lease_lost(s: &dyn Store, c: Commit) -> CaseResult {
    let id = c.run_id.clone();
    let before = (s.get_run(&id).await?, s.history(&id).await?, s.waiters(&id).await?);
    let mut state_before = Vec::new();
    for (key, _) in &c.state {
        state_before.push(s.get_state(&id, key).await?);
    }
    assert_kind(s.commit(c.clone()).await, StoreErrorKind::LeaseLost);
    let after = (s.get_run(&id).await?, s.history(&id).await?, s.waiters(&id).await?);
    assert_eq!(after, before, "a refused commit writes nothing of the run, its history or waiters");
    for ((key, _), value) in c.state.iter().zip(state_before) {
        assert_eq!(s.get_state(&id, key).await?, value, "a refused commit writes no state");
    }
    for child in &c.children {
        assert_eq!(s.get_run(&child.id).await?, None, "a refused commit creates no child");
    }
    Ok(())
}

/// A commit by an owner that does not hold the lease (the run is unleased, or leased to
/// someone else) is `LeaseLost`, and nothing of it is written: no checkpoint, wait, state,
/// child, signal or run change.
pub async fn commit_without_lease_is_lease_lost(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    park_on_signal(s, "w", 0, "tok", None).await?;
    create(s, new_run("r")).await?;
    assert_lease_lost(s, full_commit("r", OWNER)).await?;
    acquire(s, claim("r", OWNER, T0)).await?;
    assert_lease_lost(s, full_commit("r", OTHER)).await?;
    assert_eq!(waiter_seqs(s, "w").await?, [0], "the refused commit's signal was not sent");
    Ok(())
}

/// A step's commit (one checkpoint and nothing else, which a store may write by a shorter path)
/// is refused like any other: `LeaseLost` without the lease, before the first claim and after
/// another owner took the run over, `NotFound` for a run that does not exist; and it writes
/// nothing.
pub async fn step_commit_without_lease_is_refused(store: Arc<dyn Store>) -> CaseResult {
    let step = |owner: &str| {
        let mut c = commit("r", owner);
        c.checkpoints.push(completed("r", 0, json!("charged")));
        c
    };
    refused_without_lease(&*store, step).await
}

/// A settle with checkpoints only (a workflow's return after its last step, which a store may
/// write by a shorter path) is refused like any other commit, as a step's commit is (see
/// `step_commit_without_lease_is_refused`); the owner's is then applied.
pub async fn settle_without_lease_is_refused(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let settle = |owner: &str| {
        let mut c = commit("r", owner);
        c.checkpoints.push(completed("r", 0, json!("charged")));
        c.end = complete(json!("done"));
        c
    };
    refused_without_lease(s, settle).await?;
    let settled = s.commit(settle(OTHER)).await?;
    assert!(settled.settled, "the owner's settle is applied: {settled:?}");
    assert_eq!(get(s, "r").await?.status, RunStatus::Completed);
    Ok(())
}

/// The commit `of(owner)` of run `r` (with one checkpoint, at index 0) is refused: `LeaseLost`
/// without the lease, before the first claim and after another owner (`OTHER`, which holds the
/// run afterwards) took the run over, `NotFound` for a run that does not exist; and it writes
/// nothing.
async fn refused_without_lease(s: &dyn Store, of: impl Fn(&str) -> Commit) -> CaseResult {
    create(s, new_run("r")).await?;
    assert_lease_lost(s, of(OWNER)).await?;
    acquire(s, claim("r", OWNER, T0)).await?;
    assert_lease_lost(s, of(OTHER)).await?;
    acquire(s, claim("r", OTHER, T0 + LEASE + 1)).await?;
    assert_lease_lost(s, of(OWNER)).await?;
    let mut unknown = of(OWNER);
    unknown.run_id = RunId::from("missing");
    unknown.checkpoints[0].run_id = RunId::from("missing");
    assert_kind(s.commit(unknown).await, StoreErrorKind::NotFound);
    assert_eq!(s.history(&RunId::from("missing")).await?, vec![], "nothing written for a missing run");
    Ok(())
}

/// A zombie: the owner whose expired lease another owner took over commits, and is refused
/// with `LeaseLost` without writing anything.
pub async fn commit_after_takeover_is_lease_lost(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    park_on_signal(s, "w", 0, "tok", None).await?;
    start(s, "r").await?;
    acquire(s, claim("r", OTHER, T0 + LEASE + 1)).await?;
    assert_lease_lost(s, full_commit("r", OWNER)).await?;
    assert_eq!(waiter_seqs(s, "w").await?, [0], "the refused commit's signal was not sent");
    Ok(())
}

/// A step commit writes its checkpoints and the run keeps running under its lease; the last
/// step's checkpoint and the settle go together in one commit: `settled`, the output
/// recorded, the lease released.
pub async fn step_commit_is_atomic_with_settle(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.checkpoints.push(completed("r", 0, json!("charged")));
    assert_eq!(s.commit(c).await?, CommitOutcome::default());
    let running = get(s, "r").await?;
    assert_eq!(running.status, RunStatus::Running);
    assert_eq!((running.lease_owner, running.lease_until), (run.lease_owner, run.lease_until));
    assert_eq!(history(s, "r").await?, vec![completed("r", 0, json!("charged"))]);

    let mut c = commit("r", OWNER);
    c.checkpoints.push(completed("r", 1, json!("shipped")));
    c.end = complete(json!({"total": 3}));
    let out = s.commit(c).await?;
    assert!(out.settled && !out.woken, "{out:?}");
    let done = get(s, "r").await?;
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!((done.output, done.error), (Some(json(json!({"total": 3}))), None));
    assert_eq!((done.lease_owner, done.lease_until), (None, None), "settling releases the lease");
    assert_eq!(history(s, "r").await?, vec![completed("r", 0, json!("charged")), completed("r", 1, json!("shipped"))]);
    assert_kind(s.commit(commit("r", OWNER)).await, StoreErrorKind::LeaseLost);
    Ok(())
}

/// Checkpoints are upserted by `(run, seq)`: a later commit at a seq replaces the
/// checkpoint whole.
pub async fn commit_upserts_checkpoints_by_seq(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.checkpoints = vec![step("r", 0, CheckpointStatus::Running, None), completed("r", 1, json!("one"))];
    s.commit(c).await?;
    let mut retried = completed("r", 0, json!("zero"));
    retried.attempts = 2;
    retried.error = Some(StepError::retryable("first attempt timed out"));
    retried.updated_at = T0 + 1;
    let mut c = commit("r", OWNER);
    c.checkpoints.push(retried.clone());
    s.commit(c).await?;
    assert_eq!(history(s, "r").await?, vec![retried, completed("r", 1, json!("one"))]);
    Ok(())
}

/// A `Settle` records each terminal status with its output or error, and the run is then
/// terminal for claims.
pub async fn settle_records_terminal_status(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let dead = StepError::fatal("gave up").with_code(codes::MAX_RECOVERY_ATTEMPTS);
    let endings = [
        ("completed", RunStatus::Completed, Some(json(json!("out"))), None),
        ("failed", RunStatus::Failed, None, Some(StepError::fatal("boom"))),
        ("cancelled", RunStatus::Cancelled, None, Some(StepError::fatal("stop").with_code(codes::CANCELLED))),
        ("dead", RunStatus::Dead, None, Some(dead)),
    ];
    for (id, status, output, error) in endings {
        start(s, id).await?;
        let mut c = commit(id, OWNER);
        c.end = Some(TurnEnd::Settle { status, output: output.clone(), error: error.clone() });
        assert!(s.commit(c).await?.settled, "settling {id}");
        let run = get(s, id).await?;
        assert_eq!((run.status, run.output, run.error), (status, output, error));
        assert_eq!((run.lease_owner, run.lease_until), (None, None));
        assert!(matches!(s.claim_run(claim(id, OWNER, T0 + 2)).await?, ClaimOutcome::Terminal(_)));
    }
    Ok(())
}

/// A `Settle` removes every waiter of the run: a settled run does not swallow later signals
/// or events, they are buffered.
pub async fn settle_removes_waiters(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.waits = vec![signal_wait("r", 1, "tok"), event_wait("r", 2, "evt", json!({}))];
    s.commit(c).await?;
    assert_eq!(waiter_seqs(s, "r").await?, [1, 2]);
    let mut c = commit("r", OWNER);
    c.end = complete(json!("done early"));
    assert!(s.commit(c).await?.settled);
    assert_eq!(waiter_seqs(s, "r").await?, Vec::<u32>::new());
    assert_eq!(s.send_signal("tok", json(json!("late")), T0 + 2).await?, Delivery::Buffered);
    assert_eq!(s.publish_event("evt", json(json!("late")), T0 + 2).await?, vec![]);
    assert_eq!(history(s, "r").await?, vec![], "nothing was recorded on the settled run");
    Ok(())
}

/// Moves the run `id` to `cancelled` the way an operator does mid-turn: compare-and-set,
/// lease left in place. Returns the cancelled run.
async fn cancel_mid_turn(s: &dyn Store, id: &str) -> CaseResult<durable_core::Run> {
    let patch = RunPatch {
        status: Some(RunStatus::Cancelled),
        error: Some(Some(StepError::fatal("cancelled by operator").with_code(codes::CANCELLED))),
        now: T0 + 1,
        ..RunPatch::default()
    };
    assert!(s.update_run_if(&RunId::from(id), &RunStatus::ACTIVE, patch).await?);
    get(s, id).await
}

/// A `Settle` that finds the run no longer `running` (an operator cancelled it mid-turn)
/// reports `settled = false` and changes nothing of the run row; the commit's checkpoints
/// are still written.
pub async fn settle_after_cancel_is_not_applied(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    let cancelled = cancel_mid_turn(s, "r").await?;
    let mut c = Commit { now: T0 + 2, ..commit("r", OWNER) };
    c.checkpoints.push(completed("r", 0, json!("last step")));
    c.end = complete(json!("too late"));
    assert!(!s.commit(c).await?.settled, "the cancel stands");
    assert_eq!(get(s, "r").await?, cancelled, "the run row is unchanged");
    assert_eq!(history(s, "r").await?, vec![completed("r", 0, json!("last step"))]);
    Ok(())
}

/// A `Suspend` with nothing delivered parks the run: `suspended`, `wake_at` set (or none),
/// the lease released, the waits registered; the old owner can then neither renew nor commit.
pub async fn suspend_parks_run_and_releases_lease(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let mut sleep = Checkpoint::new(RunId::from("r"), 1, "nap", StepKind::Sleep, CheckpointStatus::Waiting, T0);
    sleep.wake_at = Some(T0 + 500);
    let mut c = commit("r", OWNER);
    c.checkpoints = vec![completed("r", 0, json!(0)), sleep, waiting(&signal_wait("r", 2, "tok"))];
    c.waits.push(signal_wait("r", 2, "tok"));
    c.end = suspend(&run, Some(T0 + 500));
    assert_eq!(s.commit(c).await?, CommitOutcome::default(), "parked: neither woken nor settled");
    let parked = get(s, "r").await?;
    assert_eq!(parked.status, RunStatus::Suspended);
    assert_eq!(parked.wake_at, Some(T0 + 500));
    assert_eq!((parked.lease_owner, parked.lease_until), (None, None), "suspending releases the lease");
    assert_eq!(parked.wake_gen, run.wake_gen);
    assert_eq!(waiter_seqs(s, "r").await?, [2]);
    assert_eq!(history(s, "r").await?.len(), 3);
    assert!(!s.renew_lease(&RunId::from("r"), OWNER, T0 + LEASE).await?);
    assert_kind(s.commit(commit("r", OWNER)).await, StoreErrorKind::LeaseLost);

    let timerless = start(s, "no-timer").await?;
    let mut c = commit("no-timer", OWNER);
    c.end = suspend(&timerless, None);
    s.commit(c).await?;
    let parked = get(s, "no-timer").await?;
    assert_eq!((parked.status, parked.wake_at), (RunStatus::Suspended, None));
    Ok(())
}

/// A `Suspend` that finds the run no longer `running` (an operator cancelled it mid-turn)
/// does not move it: terminal runs accept no transition (`RunStatus::can_become`). The
/// commit's checkpoints are still written.
pub async fn suspend_after_cancel_leaves_run_cancelled(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    let cancelled = cancel_mid_turn(s, "r").await?;
    let mut c = Commit { now: T0 + 2, ..commit("r", OWNER) };
    c.checkpoints.push(completed("r", 0, json!("last step")));
    c.end = suspend(&run, Some(T0 + 500));
    s.commit(c).await?;
    assert_eq!(get(s, "r").await?, cancelled, "a cancelled run is never suspended");
    assert_eq!(history(s, "r").await?, vec![completed("r", 0, json!("last step"))]);
    Ok(())
}

/// A delivery during the turn (the run's `wake_gen` moved past the one the turn loaded)
/// makes its `Suspend` report `woken`: the run stays `running` with the lease held. A later
/// suspension that saw the new `wake_gen` parks.
pub async fn suspend_after_delivery_stays_running(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    register_wait(s, signal_wait("r", 0, "tok")).await?;
    let delivered = s.send_signal("tok", json(json!("hi")), T0 + 2).await?;
    assert_eq!(delivered, Delivery::Delivered { run_id: RunId::from("r"), seq: 0 });
    let after = get(s, "r").await?;
    assert_eq!(after.wake_gen, run.wake_gen + 1, "a delivery increments wake_gen");
    assert_eq!((after.status, after.wake_at), (RunStatus::Running, None), "a running run gets no wake_at");

    let mut c = commit("r", OWNER);
    c.end = suspend(&run, Some(T0 + 500));
    let out = s.commit(c).await?;
    assert!(out.woken && !out.settled, "{out:?}");
    let still = get(s, "r").await?;
    assert_eq!(still.status, RunStatus::Running);
    assert_eq!((&still.lease_owner, still.lease_until), (&run.lease_owner, run.lease_until), "the lease is kept");

    let mut c = commit("r", OWNER);
    c.end = suspend(&still, Some(T0 + 500));
    assert!(!s.commit(c).await?.woken);
    assert_eq!(get(s, "r").await?.status, RunStatus::Suspended);
    Ok(())
}

/// Takes `id` (leased to [`OWNER`] since [`T0`]) over as [`OTHER`] once the lease expired: a
/// recovery. Returns the run as claimed, `recovery_attempts` 1.
async fn recover(s: &dyn Store, id: &str) -> CaseResult<durable_core::Run> {
    let run = acquire(s, claim(id, OTHER, T0 + LEASE + 1)).await?;
    assert_eq!(run.recovery_attempts, 1, "taking over an expired lease is a recovery");
    Ok(run)
}

/// Progress resets the recovery count. After a takeover (`recovery_attempts` 1), a commit by
/// the new owner that carries a checkpoint sets it to 0 (the run keeps running under its
/// lease), and the next takeover counts from 1 again; a `Suspend` with no checkpoint (applied,
/// or `woken` by a delivery during the turn) and a `Settle` to `completed` reset it too.
pub async fn progress_resets_recovery_attempts(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "step").await?;
    let recovered = recover(s, "step").await?;
    let mut c = commit("step", OTHER);
    c.checkpoints.push(completed("step", 0, json!("progress")));
    s.commit(c).await?;
    let run = get(s, "step").await?;
    assert_eq!(run.recovery_attempts, 0, "a committed step is progress");
    assert_eq!(
        (run.status, run.lease_owner, run.lease_until),
        (RunStatus::Running, recovered.lease_owner, recovered.lease_until)
    );
    let again = acquire(s, claim("step", "engine-c", T0 + 2 * LEASE + 2)).await?;
    assert_eq!(again.recovery_attempts, 1, "recoveries count again from the last progress");

    start(s, "park").await?;
    let recovered = recover(s, "park").await?;
    let mut c = commit("park", OTHER);
    c.end = suspend(&recovered, Some(T0 + 10 * LEASE));
    assert!(!s.commit(c).await?.woken);
    let run = get(s, "park").await?;
    assert_eq!((run.status, run.recovery_attempts), (RunStatus::Suspended, 0), "a suspension is progress");

    start(s, "woken").await?;
    let recovered = recover(s, "woken").await?;
    let wake = RunPatch { wake: true, now: T0 + LEASE + 2, ..RunPatch::default() };
    assert!(s.update_run_if(&RunId::from("woken"), &[RunStatus::Running], wake).await?);
    let mut c = commit("woken", OTHER);
    c.end = suspend(&recovered, Some(T0 + 10 * LEASE));
    assert!(s.commit(c).await?.woken, "a delivery moved wake_gen during the turn");
    let run = get(s, "woken").await?;
    assert_eq!((run.status, run.recovery_attempts), (RunStatus::Running, 0), "a woken suspension is progress");

    start(s, "done").await?;
    recover(s, "done").await?;
    let mut c = commit("done", OTHER);
    c.end = complete(json!("done"));
    assert!(s.commit(c).await?.settled);
    let run = get(s, "done").await?;
    assert_eq!((run.status, run.recovery_attempts), (RunStatus::Completed, 0), "completing is progress");
    Ok(())
}

/// What records no progress leaves the recovery count alone: an empty commit, a refused one
/// (the old owner's after the takeover: `LeaseLost`, nothing written), a commit to a run that
/// is no longer `running` (cancelled mid-turn, lease left in place: its row is unchanged), and
/// a `Settle` to `dead` — how an engine buries a run recovered too often, which keeps its count.
pub async fn no_progress_keeps_recovery_attempts(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    let recovered = recover(s, "r").await?;
    s.commit(commit("r", OTHER)).await?;
    let run = get(s, "r").await?;
    assert_eq!((run.status, run.recovery_attempts), (RunStatus::Running, 1), "an empty commit is no progress");
    let mut zombie = commit("r", OWNER);
    zombie.checkpoints.push(completed("r", 0, json!("zombie")));
    zombie.end = suspend(&recovered, None);
    assert_lease_lost(s, zombie).await?;
    assert_eq!(get(s, "r").await?.recovery_attempts, 1, "a refused commit resets nothing");

    start(s, "cancelled").await?;
    recover(s, "cancelled").await?;
    let cancelled = cancel_mid_turn(s, "cancelled").await?;
    let mut c = Commit { now: T0 + LEASE + 3, ..commit("cancelled", OTHER) };
    c.checkpoints.push(completed("cancelled", 0, json!("last step")));
    s.commit(c).await?;
    let run = get(s, "cancelled").await?;
    assert_eq!(run.recovery_attempts, 1, "a cancelled run keeps its count");
    assert_eq!(run.status, cancelled.status);

    start(s, "dead").await?;
    recover(s, "dead").await?;
    let mut c = commit("dead", OTHER);
    let error = StepError::fatal("recovered too many times").with_code(codes::MAX_RECOVERY_ATTEMPTS);
    c.end = Some(TurnEnd::Settle { status: RunStatus::Dead, output: None, error: Some(error) });
    assert!(s.commit(c).await?.settled);
    let run = get(s, "dead").await?;
    assert_eq!((run.status, run.recovery_attempts), (RunStatus::Dead, 1), "a burial keeps the count");
    Ok(())
}

/// A wait in a commit that a buffered signal satisfies consumes it: the payload becomes the
/// `completed` checkpoint at the wait's seq (over the commit's own `waiting` one), no waiter
/// is registered, `wake_gen` is incremented and the turn's `Suspend` reports `woken`.
pub async fn wait_consuming_buffered_signal_wakes_turn(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    assert_eq!(s.send_signal("tok", json(json!("early")), T0).await?, Delivery::Buffered);
    let run = start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.checkpoints.push(waiting(&signal_wait("r", 0, "tok")));
    c.waits.push(signal_wait("r", 0, "tok"));
    c.end = suspend(&run, None);
    assert!(s.commit(c).await?.woken, "the wait was satisfied at once: run another turn");
    let cp = checkpoint_at(s, "r", 0).await?;
    assert_eq!((cp.status, cp.output), (CheckpointStatus::Completed, Some(json(json!("early")))));
    assert_eq!(waiter_seqs(s, "r").await?, Vec::<u32>::new());
    let after = get(s, "r").await?;
    assert_eq!((after.status, after.lease_owner.as_deref()), (RunStatus::Running, Some(OWNER)));
    assert_eq!(after.wake_gen, run.wake_gen + 1);

    register_wait(s, signal_wait("r", 1, "tok")).await?;
    assert_eq!(waiter_seqs(s, "r").await?, [1], "the buffered signal was consumed once");
    Ok(())
}

/// The timeout checkpoint of a wait: a completed `null` at the wait's seq.
fn timed_out(run: &str, seq: u32, token: &str) -> Checkpoint {
    let mut cp = Checkpoint::new(RunId::from(run), seq, token, StepKind::Signal, CheckpointStatus::Completed, T0 + 1);
    cp.output = Some(json(json!(null)));
    cp
}

/// `expire_waits` removes the run's waiter at that seq and writes the commit's timeout
/// checkpoint; later signals to the token are buffered, not delivered to it.
pub async fn expire_wait_removes_waiter(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    register_wait(s, signal_wait("r", 1, "tok")).await?;
    let mut c = commit("r", OWNER);
    c.expire_waits.push(1);
    c.checkpoints.push(timed_out("r", 1, "tok"));
    assert_eq!(s.commit(c).await?.raced, Vec::<u32>::new());
    assert_eq!(waiter_seqs(s, "r").await?, Vec::<u32>::new());
    assert_eq!(checkpoint_at(s, "r", 1).await?, timed_out("r", 1, "tok"));
    assert_eq!(s.send_signal("tok", json(json!("late")), T0 + 2).await?, Delivery::Buffered);
    Ok(())
}

/// `expire_waits` for a seq whose waiter a signal already took: the seq is in `raced`, the
/// commit's timeout checkpoint is not written (the delivery stands), the rest of the commit
/// is, and the `Suspend` reports `woken`.
pub async fn expire_wait_raced_by_delivery_keeps_delivery(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    register_wait(s, signal_wait("r", 1, "tok")).await?;
    let delivery = s.send_signal("tok", json(json!("just in time")), T0 + 2).await?;
    assert_eq!(delivery, Delivery::Delivered { run_id: RunId::from("r"), seq: 1 });
    let delivered = checkpoint_at(s, "r", 1).await?;

    let mut c = commit("r", OWNER);
    c.expire_waits.push(1);
    c.checkpoints = vec![timed_out("r", 1, "tok"), completed("r", 2, json!("after"))];
    c.end = suspend(&run, Some(T0 + 500));
    let out = s.commit(c).await?;
    assert_eq!(out.raced, [1]);
    assert!(out.woken, "the delivery happened during the turn");
    assert_eq!(checkpoint_at(s, "r", 1).await?, delivered, "the delivery stands");
    assert_eq!(checkpoint_at(s, "r", 2).await?, completed("r", 2, json!("after")));
    Ok(())
}

/// State is upserted per `(run, key)` and `get_state` returns the latest value, also after
/// the run settled; runs do not share keys.
pub async fn state_is_upserted_and_outlives_settle(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    start(s, "other").await?;
    let commits: [(&str, &[(&str, serde_json::Value)]); 3] = [
        ("r", &[("status", json!("placed")), ("count", json!(1))]),
        ("other", &[("status", json!("elsewhere"))]),
        ("r", &[("status", json!({"shipped": true}))]),
    ];
    for (run, state) in commits {
        let mut c = commit(run, OWNER);
        c.state = state.iter().map(|(k, v)| (k.to_string(), json(v.clone()))).collect();
        s.commit(c).await?;
    }
    let mut c = commit("r", OWNER);
    c.end = complete(json!("done"));
    assert!(s.commit(c).await?.settled);

    let r = RunId::from("r");
    assert_eq!(s.get_state(&r, "status").await?, Some(json(json!({"shipped": true}))));
    assert_eq!(s.get_state(&r, "count").await?, Some(json(json!(1))));
    assert_eq!(s.get_state(&r, "missing").await?, None);
    assert_eq!(s.get_state(&RunId::from("other"), "status").await?, Some(json(json!("elsewhere"))));
    Ok(())
}

/// Children are created `pending` like `create_run`: idempotent by id, an existing run left
/// unchanged.
pub async fn children_are_created_idempotently(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let existing = create(s, NewRun { input: json(json!("original")), ..new_run("r.child.9") }).await?;
    start(s, "r").await?;
    let child = |id: &str, seq: u32, input: serde_json::Value| NewRun {
        workflow: "child-wf".into(),
        input: json(input),
        parent: Some(ParentLink { run_id: RunId::from("r"), seq }),
        ..new_run(id)
    };
    let mut c = commit("r", OWNER);
    c.children = vec![child("r.child.1", 1, json!("first")), child("r.child.9", 9, json!("replacement"))];
    s.commit(c).await?;
    assert_eq!(get(s, "r.child.1").await?, child("r.child.1", 1, json!("first")).into_run());
    assert_eq!(get(s, "r.child.9").await?, existing, "an existing run is not overwritten");

    let mut c = commit("r", OWNER);
    c.children.push(child("r.child.1", 1, json!("second")));
    s.commit(c).await?;
    assert_eq!(get(s, "r.child.1").await?, child("r.child.1", 1, json!("first")).into_run(), "created once");
    let children = RunFilter { parent: Some(RunId::from("r")), ..RunFilter::default() };
    assert_eq!(listed(s, children).await?, strings(&["r.child.1"]));
    Ok(())
}

/// A commit's signals are sent like `send_signal`, in order, and `deliveries` says where each
/// went.
pub async fn outgoing_signals_report_deliveries(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    park_on_signal(s, "w", 3, "tok-a", Some(T0 + 10 * LEASE)).await?;
    start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.signals = [("tok-a", 1), ("tok-b", 2), ("tok-a", 3)]
        .map(|(token, n)| OutgoingSignal { token: token.into(), payload: json(json!(n)) })
        .into();
    let now = c.now;
    let out = s.commit(c).await?;
    let to_w = Delivery::Delivered { run_id: RunId::from("w"), seq: 3 };
    assert_eq!(out.deliveries, [to_w, Delivery::Buffered, Delivery::Buffered]);
    let cp = checkpoint_at(s, "w", 3).await?;
    assert_eq!((cp.status, cp.output), (CheckpointStatus::Completed, Some(json(json!(1)))));
    assert_eq!(get(s, "w").await?.wake_at, Some(now), "the suspended receiver is due now");

    start(s, "x").await?;
    register_wait(s, signal_wait("x", 0, "tok-b")).await?;
    register_wait(s, signal_wait("x", 1, "tok-a")).await?;
    assert_eq!(checkpoint_at(s, "x", 0).await?.output, Some(json(json!(2))));
    assert_eq!(checkpoint_at(s, "x", 1).await?.output, Some(json(json!(3))));
    Ok(())
}
