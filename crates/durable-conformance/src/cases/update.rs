//! `update_run_if`: the compare-and-set on the run row.

use std::sync::Arc;

use durable_core::{
    CheckpointStatus, Delivery, OutgoingSignal, Run, RunId, RunPatch, RunStatus, StepError, Store, StoreErrorKind,
    StoreResult,
};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// A patch moving a run to `cancelled` with `reason` as its error, at `now`.
fn cancel(reason: &str, now: u64) -> RunPatch {
    RunPatch {
        status: Some(RunStatus::Cancelled),
        error: Some(Some(StepError::fatal(reason))),
        now,
        ..RunPatch::default()
    }
}

/// The patch applies only when the run's status is one of `expected`; otherwise `false` and
/// nothing is written.
pub async fn update_applies_only_from_expected_status(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let before = create(s, new_run("r")).await?;
    let id = RunId::from("r");
    let applied = s.update_run_if(&id, &[RunStatus::Running, RunStatus::Suspended], cancel("no", T0 + 5)).await?;
    assert!(!applied, "a pending run is not running or suspended");
    assert_eq!(get(s, "r").await?, before, "a refused patch writes nothing");

    assert!(s.update_run_if(&id, &[RunStatus::Pending], cancel("stop", T0 + 5)).await?);
    let expected =
        Run { status: RunStatus::Cancelled, error: Some(StepError::fatal("stop")), updated_at: T0 + 5, ..before };
    assert_eq!(get(s, "r").await?, expected, "the patch and `updated_at = now`, nothing else");
    Ok(())
}

/// An empty expectation matches any status.
pub async fn update_with_no_expectation_matches_any_status(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create(s, new_run("r")).await?;
    let id = RunId::from("r");
    let to_running = RunPatch { status: Some(RunStatus::Running), now: T0 + 1, ..RunPatch::default() };
    assert!(s.update_run_if(&id, &[], to_running).await?);
    let wake = RunPatch { wake_at: Some(Some(T0 + 50)), now: T0 + 2, ..RunPatch::default() };
    assert!(s.update_run_if(&id, &[], wake).await?);
    let run = get(s, "r").await?;
    assert_eq!((run.status, run.wake_at, run.updated_at), (RunStatus::Running, Some(T0 + 50), T0 + 2));
    Ok(())
}

/// A missing run is `Ok(false)`, not an error, and is not created.
pub async fn update_missing_run_is_false(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = RunId::from("missing");
    assert!(!s.update_run_if(&id, &[], cancel("x", T0)).await?);
    assert!(!s.update_run_if(&id, &[RunStatus::Pending], cancel("x", T0)).await?);
    assert_eq!(s.get_run(&id).await?, None);
    Ok(())
}

/// A status the transition table forbids from the current one is `Conflict` and nothing of
/// the patch is written; the current status itself is always allowed.
pub async fn update_forbidden_transition_is_conflict(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create(s, new_run("done")).await?;
    drive(s, "done", &[RunStatus::Running, RunStatus::Completed]).await?;
    create(s, new_run("fresh")).await?;

    let attempts: [(&str, RunStatus); 4] = [
        ("fresh", RunStatus::Completed),
        ("fresh", RunStatus::Suspended),
        ("done", RunStatus::Pending),
        ("done", RunStatus::Running),
    ];
    for (id, status) in attempts {
        let before = get(s, id).await?;
        let patch = RunPatch {
            status: Some(status),
            output: Some(Some(json(json!("sneaky")))),
            wake_at: Some(Some(T0 + 9)),
            release_lease: true,
            now: T0 + 9,
            ..RunPatch::default()
        };
        assert_kind(s.update_run_if(&RunId::from(id), &[], patch).await, StoreErrorKind::Conflict);
        assert_eq!(get(s, id).await?, before, "{} -> {status} is refused without writing", before.status);
    }

    let same = RunPatch {
        status: Some(RunStatus::Completed),
        output: Some(Some(json(json!("kept")))),
        now: T0 + 10,
        ..RunPatch::default()
    };
    assert!(s.update_run_if(&RunId::from("done"), &[RunStatus::Completed], same).await?);
    assert_eq!(get(s, "done").await?.output, Some(json(json!("kept"))));
    Ok(())
}

/// Every field of a patch applies: output, error and wake time set and cleared, lease
/// released, recovery count reset, failed checkpoints deleted (and only those).
pub async fn update_applies_every_patch_field(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = RunId::from("r");
    create(s, new_run("r")).await?;
    acquire(s, claim("r", OWNER, T0)).await?;
    let mut c = commit("r", OWNER);
    let mut failed = step("r", 1, CheckpointStatus::Failed, None);
    failed.error = Some(StepError::fatal("card declined"));
    c.checkpoints = vec![completed("r", 0, json!("ok")), failed, waiting(&signal_wait("r", 2, "t"))];
    s.commit(c).await?;
    // Taken over after the commit (one that carries checkpoints resets the recovery count).
    let takeover = T0 + LEASE + 1;
    acquire(s, claim("r", OTHER, takeover)).await?;

    let fail = RunPatch {
        status: Some(RunStatus::Failed),
        output: Some(Some(json(json!({"partial": true})))),
        error: Some(Some(StepError::fatal("boom").with_code("card"))),
        wake_at: Some(Some(T0 + 99)),
        release_lease: true,
        now: takeover + 5,
        ..RunPatch::default()
    };
    assert!(s.update_run_if(&id, &[RunStatus::Running], fail).await?);
    let run = get(s, "r").await?;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.output, Some(json(json!({"partial": true}))));
    assert_eq!(run.error, Some(StepError::fatal("boom").with_code("card")));
    assert_eq!(run.wake_at, Some(T0 + 99));
    assert_eq!((run.lease_owner, run.lease_until), (None, None), "release_lease clears the lease");
    assert_eq!(run.recovery_attempts, 1, "recovery_attempts is kept unless reset");
    assert_eq!(run.updated_at, takeover + 5);
    assert_eq!(history(s, "r").await?.len(), 3, "checkpoints are kept unless cleared");

    let retry = RunPatch {
        status: Some(RunStatus::Pending),
        output: Some(None),
        error: Some(None),
        wake_at: Some(None),
        reset_recovery: true,
        now: takeover + 6,
        ..RunPatch::default()
    };
    assert!(s.update_run_if(&id, &[RunStatus::Failed, RunStatus::Dead], retry).await?);
    let run = get(s, "r").await?;
    assert_eq!(run.status, RunStatus::Pending);
    assert_eq!((run.output, run.error, run.wake_at), (None, None, None), "`Some(None)` clears");
    assert_eq!(run.recovery_attempts, 0);
    assert_eq!(run.updated_at, takeover + 6);
    assert_eq!(history_seqs(s, "r").await?, [0, 1, 2], "without truncate_history_from the history is kept");
    Ok(())
}

/// 16 concurrent racers with the same expectation: exactly one applies its patch.
pub async fn concurrent_updates_have_one_winner(store: Arc<dyn Store>) -> CaseResult {
    create(&*store, new_run("r")).await?;
    let results =
        race(RACERS, |i| {
            let store = store.clone();
            async move {
                store.update_run_if(&RunId::from("r"), &[RunStatus::Pending], cancel(&format!("racer {i}"), T0)).await
            }
        })
        .await;
    let results = results.into_iter().collect::<StoreResult<Vec<bool>>>()?;
    let winners: Vec<usize> = (0..RACERS).filter(|i| results[*i]).collect();
    assert_eq!(winners.len(), 1, "exactly one racer wins: {winners:?}");
    let run = get(&*store, "r").await?;
    assert_eq!(run.error, Some(StepError::fatal(format!("racer {}", winners[0]))), "the winner's patch is stored");
    Ok(())
}

/// `truncate_history_from` deletes the checkpoints from that seq on (and only those); a
/// refused patch deletes nothing.
pub async fn update_truncates_history_from_seq(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = RunId::from("r");
    start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.checkpoints = (0..5).map(|seq| completed("r", seq, json!(seq))).collect();
    s.commit(c).await?;

    let truncate = |from| RunPatch { truncate_history_from: Some(from), now: T0 + 2, ..RunPatch::default() };
    assert!(!s.update_run_if(&id, &[RunStatus::Pending], truncate(0)).await?);
    assert_eq!(history_seqs(s, "r").await?, [0, 1, 2, 3, 4], "a refused patch deletes nothing");
    assert!(s.update_run_if(&id, &[RunStatus::Running], truncate(2)).await?);
    assert_eq!(history_seqs(s, "r").await?, [0, 1]);
    assert!(s.update_run_if(&id, &[], truncate(10)).await?);
    assert_eq!(history_seqs(s, "r").await?, [0, 1], "nothing at or after seq 10");
    Ok(())
}

/// A patch with `wake` wakes the run as a delivery does: `wake_gen` incremented, a suspended
/// run made due now (a running one keeps its `wake_at`, and its turn's `Suspend` reports
/// `woken`).
pub async fn update_wake_counts_as_a_delivery(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let wake = |now| RunPatch { wake: true, now, ..RunPatch::default() };
    let parked = park_on_signal(s, "parked", 0, "tok", Some(T0 + 10 * LEASE)).await?;
    assert!(s.update_run_if(&RunId::from("parked"), &[RunStatus::Suspended], wake(T0 + 50)).await?);
    let woken = get(s, "parked").await?;
    assert_eq!(
        (woken.status, woken.wake_gen, woken.wake_at),
        (RunStatus::Suspended, parked.wake_gen + 1, Some(T0 + 50))
    );
    assert_eq!(waiter_seqs(s, "parked").await?, [0], "a wake is not a delivery to a waiter");

    let running = start(s, "running").await?;
    assert!(s.update_run_if(&RunId::from("running"), &[RunStatus::Running], wake(T0 + 2)).await?);
    let after = get(s, "running").await?;
    assert_eq!((after.wake_gen, after.wake_at), (running.wake_gen + 1, None));
    let mut c = commit("running", OWNER);
    c.end = suspend(&running, Some(T0 + 500));
    assert!(s.commit(c).await?.woken, "the turn sees the wake when it tries to suspend");
    Ok(())
}

/// A patch that makes the run terminal removes its waiters (a settled run must not swallow
/// later signals); a patch that does not keeps them.
pub async fn terminal_update_removes_waiters(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = RunId::from("w");
    let run = start(s, "w").await?;
    let mut c = commit("w", OWNER);
    c.waits = vec![event_wait("w", 1, "evt", json!({})), signal_wait("w", 2, "tok")];
    c.end = suspend(&run, None);
    s.commit(c).await?;
    let later = RunPatch { wake_at: Some(Some(T0 + 99)), now: T0 + 2, ..RunPatch::default() };
    assert!(s.update_run_if(&id, &[RunStatus::Suspended], later).await?);
    assert_eq!(waiter_seqs(s, "w").await?, [1, 2], "a non-terminal patch keeps the waiters");

    assert!(s.update_run_if(&id, &[RunStatus::Suspended], cancel("stop", T0 + 3)).await?);
    assert_eq!(waiter_seqs(s, "w").await?, Vec::<u32>::new(), "a terminal patch removes the waiters");
    assert_eq!(s.publish_event("evt", json(json!({"late": true})), T0 + 4).await?, vec![], "buffered, not swallowed");
    assert_eq!(s.send_signal("tok", json(json!("late")), T0 + 4).await?, Delivery::Buffered, "buffered, not swallowed");
    Ok(())
}

/// A patch's `signals` are sent in the same transaction, and only if the patch applies: a
/// refused or conflicting patch sends nothing.
pub async fn update_signals_are_sent_only_when_applied(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let parent = park_on_signal(s, "parent", 4, "child-done", None).await?;
    create(s, new_run("child")).await?;
    let id = RunId::from("child");
    let notify = |status| RunPatch {
        status: Some(status),
        signals: vec![OutgoingSignal { token: "child-done".into(), payload: json(json!("child cancelled")) }],
        now: T0 + 5,
        ..RunPatch::default()
    };
    assert!(!s.update_run_if(&id, &[RunStatus::Running], notify(RunStatus::Cancelled)).await?);
    assert_kind(s.update_run_if(&id, &[], notify(RunStatus::Completed)).await, StoreErrorKind::Conflict);
    assert_eq!(waiter_seqs(s, "parent").await?, [4], "no signal was sent by the patches that did not apply");

    assert!(s.update_run_if(&id, &[RunStatus::Pending], notify(RunStatus::Cancelled)).await?);
    let cp = checkpoint_at(s, "parent", 4).await?;
    assert_eq!((cp.status, cp.output), (CheckpointStatus::Completed, Some(json(json!("child cancelled")))));
    let woken = get(s, "parent").await?;
    assert_eq!((woken.wake_gen, woken.wake_at), (parent.wake_gen + 1, Some(T0 + 5)));
    Ok(())
}
