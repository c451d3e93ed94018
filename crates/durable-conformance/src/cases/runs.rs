//! Creating and reading runs: `capabilities`, `create_run`, `get_run`, `get_runs`, `history`.

use std::sync::Arc;

use durable_core::{ClaimOutcome, CreateRun, NewRun, ParentLink, RunId, Store, StoreResult};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// `capabilities` is constant for the lifetime of the store.
pub async fn capabilities_are_constant(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let declared = s.capabilities();
    start(s, "r").await?;
    s.send_signal("t", json(json!(1)), T0).await?;
    assert_eq!(s.capabilities(), declared, "capabilities changed after writes");
    Ok(())
}

/// `create_run` stores the run `pending` exactly as given, and is idempotent on the id: a
/// second create returns the stored run as `Existing` and writes nothing, also once the run
/// moved on.
pub async fn create_run_is_idempotent(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let new = NewRun {
        tags: vec!["vip".into(), "eu".into()],
        priority: -7,
        parent: Some(ParentLink { run_id: RunId::from("parent"), seq: 3 }),
        namespace: "billing".into(),
        version: 4,
        ..new_run("order-1")
    };
    let first = s.create_run(new.clone()).await?;
    assert_eq!(first, CreateRun::Created(new.clone().into_run()), "a new run is stored pending, as given");
    assert_eq!(get(s, "order-1").await?, new.clone().into_run());

    let other = NewRun { input: json(json!({"other": true})), created_at: T0 + 5, priority: 9, ..new.clone() };
    let again = s.create_run(other.clone()).await?;
    assert_eq!(again, CreateRun::Existing(new.clone().into_run()), "a second create returns the stored run");
    assert_eq!(get(s, "order-1").await?, new.into_run(), "a second create writes nothing");

    let claimed = acquire(s, claim("order-1", OWNER, T0 + 10)).await?;
    assert_eq!(s.create_run(other).await?, CreateRun::Existing(claimed.clone()), "the current run is returned");
    assert_eq!(get(s, "order-1").await?, claimed);
    Ok(())
}

/// 16 concurrent creators of one id: exactly one gets `Created`, every other gets the same
/// run as `Existing`.
pub async fn concurrent_creates_have_one_winner(store: Arc<dyn Store>) -> CaseResult {
    create_race(&[store]).await
}

/// The creator race of [`concurrent_creates_have_one_winner`], across `handles`.
pub(crate) async fn create_race(handles: &[Arc<dyn Store>]) -> CaseResult {
    let results = race(RACERS, |i| {
        let store = handle_for(handles, i);
        async move {
            let new = NewRun { input: json(json!({ "creator": i })), ..new_run("contended") };
            store.create_run(new).await
        }
    })
    .await;
    let results = results.into_iter().collect::<StoreResult<Vec<CreateRun>>>()?;
    assert_eq!(results.iter().filter(|r| r.created()).count(), 1, "exactly one creator creates: {results:?}");
    let stored = get(&*handles[0], "contended").await?;
    for result in &results {
        assert_eq!(result.run(), &stored, "every creator sees the one stored run");
    }
    Ok(())
}

/// A run that does not exist reads as absent: `get_run` is `None`, its history, waiters and
/// state are empty.
pub async fn missing_run_reads_as_absent(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "present").await?;
    let missing = RunId::from("missing");
    assert_eq!(s.get_run(&missing).await?, None);
    assert_eq!(s.history(&missing).await?, vec![]);
    assert_eq!(s.waiters(&missing).await?, vec![]);
    assert_eq!(s.get_state(&missing, "k").await?, None);
    Ok(())
}

/// `get_runs` returns each existing run among the ids once, as `get_run` reads it, and
/// leaves out ids that do not exist (also with duplicates and an empty list).
pub async fn get_runs_reads_the_existing_ones(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create(s, new_run("a")).await?;
    start(s, "b").await?;
    create(s, new_run("c ü")).await?;
    let ids: Vec<RunId> = ["c ü", "missing", "a", "b"].into_iter().map(RunId::from).collect();
    let mut got = s.get_runs(&ids).await?;
    got.sort_by(|x, y| x.id.as_str().cmp(y.id.as_str()));
    let expected = vec![get(s, "a").await?, get(s, "b").await?, get(s, "c ü").await?];
    assert_eq!(got, expected, "the existing runs, as get_run reads them");
    assert_eq!(s.get_runs(&[]).await?, vec![], "no ids, no runs");
    assert_eq!(s.get_runs(&[RunId::from("missing")]).await?, vec![], "missing ids are left out");
    Ok(())
}

/// `history` (and the history a claim loads) is ordered by seq, whatever order the
/// checkpoints were committed in.
pub async fn history_is_ordered_by_seq(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let run = start(s, "r").await?;
    for seqs in [[3, 0], [2, 1]] {
        let mut c = commit("r", OWNER);
        c.checkpoints = seqs.iter().map(|seq| completed("r", *seq, json!(seq))).collect();
        s.commit(c).await?;
    }
    assert_eq!(history_seqs(s, "r").await?, [0, 1, 2, 3]);

    // Park the run and claim it again: the claim loads the same order.
    let mut c = commit("r", OWNER);
    c.end = suspend(&run, Some(T0 + 5));
    s.commit(c).await?;
    match s.claim_run(claim("r", OTHER, T0 + 10)).await? {
        ClaimOutcome::Acquired { history, .. } => {
            assert_eq!(history.iter().map(|cp| cp.seq).collect::<Vec<_>>(), [0, 1, 2, 3]);
        }
        other => panic!("expected the claim of a suspended run to acquire it, got {other:?}"),
    }
    Ok(())
}
