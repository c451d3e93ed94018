//! `delete_run`: a run and its whole subtree, nothing else.

use std::sync::Arc;

use durable_core::{
    BufferedKind, BufferedQuery, Delivery, NewRun, ParentLink, RunFilter, RunId, RunStatus, Store, protocol,
};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// Creates `id` (a child of `parent`, if given), claims it and commits a checkpoint, a state
/// value and a signal wait on `wait-<id>`: a run with something of every kind tied to it.
async fn seed(s: &dyn Store, id: &str, parent: Option<&str>) -> CaseResult {
    let parent = parent.map(|p| ParentLink { run_id: RunId::from(p), seq: 1 });
    create(s, NewRun { parent, ..new_run(id) }).await?;
    acquire(s, claim(id, OWNER, T0)).await?;
    let mut c = commit(id, OWNER);
    c.checkpoints.push(completed(id, 0, json!(id)));
    c.state.push(("k".into(), json(json!(id))));
    c.waits.push(signal_wait(id, 1, &format!("wait-{id}")));
    s.commit(c).await?;
    Ok(())
}

/// Asserts that nothing of `id` is left.
async fn assert_gone(s: &dyn Store, id: &str) -> CaseResult {
    let run = RunId::from(id);
    assert_eq!(s.get_run(&run).await?, None, "{id} is deleted");
    assert_eq!(s.history(&run).await?, vec![], "{id}'s checkpoints are deleted");
    assert_eq!(s.waiters(&run).await?, vec![], "{id}'s waiters are deleted");
    assert_eq!(s.get_state(&run, "k").await?, None, "{id}'s state is deleted");
    assert_eq!(s.send_signal(&format!("wait-{id}"), json(json!(0)), T0).await?, Delivery::Buffered);
    Ok(())
}

/// Asserts that everything of `id` (as [`seed`] made it) is still there.
async fn assert_kept(s: &dyn Store, id: &str) -> CaseResult {
    let run = RunId::from(id);
    assert!(s.get_run(&run).await?.is_some(), "{id} is kept");
    assert_eq!(history(s, id).await?, vec![completed(id, 0, json!(id))], "{id}'s checkpoints are kept");
    assert_eq!(waiter_seqs(s, id).await?, [1], "{id}'s waiter is kept");
    assert_eq!(s.get_state(&run, "k").await?, Some(json(json!(id))), "{id}'s state is kept");
    Ok(())
}

/// Deleting a run removes it, its checkpoints, waiters and state, and the same for every
/// descendant (grandchildren included), and returns how many runs it removed. Unrelated runs
/// (even one whose id starts like a child's) and buffered signals are kept.
pub async fn delete_removes_run_and_subtree(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    seed(s, "r", None).await?;
    seed(s, "r.child.1", Some("r")).await?;
    seed(s, "r.child.1.child.2", Some("r.child.1")).await?;
    seed(s, "r.child.10", None).await?;
    seed(s, "s", None).await?;
    assert_eq!(s.send_signal("kept", json(json!("buffered")), T0).await?, Delivery::Buffered);

    assert_eq!(s.delete_run(&RunId::from("r")).await?, 3);
    for id in ["r", "r.child.1", "r.child.1.child.2"] {
        assert_gone(s, id).await?;
    }
    for id in ["r.child.10", "s"] {
        assert_kept(s, id).await?;
    }
    assert_eq!(listed(s, RunFilter::default()).await?, strings(&["s", "r.child.10"]));
    register_wait(s, signal_wait("s", 2, "kept")).await?;
    assert_eq!(checkpoint_at(s, "s", 2).await?.output, Some(json(json!("buffered"))), "buffered signals are kept");
    Ok(())
}

/// Deleting a child removes its own subtree and leaves its parent alone.
pub async fn delete_child_keeps_parent(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    seed(s, "r", None).await?;
    seed(s, "r.child.1", Some("r")).await?;
    seed(s, "r.child.1.child.2", Some("r.child.1")).await?;
    assert_eq!(s.delete_run(&RunId::from("r.child.1")).await?, 2);
    assert_gone(s, "r.child.1").await?;
    assert_gone(s, "r.child.1.child.2").await?;
    assert_kept(s, "r").await
}

/// Deleting a run that does not exist returns 0 and removes nothing.
pub async fn delete_missing_run_is_zero(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    seed(s, "r", None).await?;
    assert_eq!(s.delete_run(&RunId::from("missing")).await?, 0);
    assert_kept(s, "r").await
}

/// The buffered child results (`child:<parent>:<seq>` tokens) whose parent is `parent`.
async fn child_results_of(s: &dyn Store, parent: &str) -> CaseResult<Vec<String>> {
    let query = BufferedQuery {
        kind: Some(BufferedKind::Signal),
        prefix: Some(format!("child:{parent}:")),
        oldest_before: None,
        limit: 100,
    };
    let keys = s.buffered(&query).await?.into_iter().map(|b| b.key);
    Ok(keys.filter(|k| protocol::child_token_parent(k) == Some(parent)).collect())
}

/// A child's result never reaches another run given its parent's id: one sent to a parent
/// that is gone, completed or cancelled is dropped (a failed parent's is kept, for its retry),
/// and deleting a run deletes the results buffered for it — not those of a run whose id
/// merely starts like it (`p:1`'s tokens start with `child:p:`).
pub async fn child_results_never_reach_another_run_with_the_parents_id(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let token = |parent: &str, seq: u32| protocol::child_token(&RunId::from(parent), seq);
    for id in ["p", "p:1", "done", "gone", "failed"] {
        create(s, new_run(id)).await?;
    }
    // Buffered while the parent has not reached its join yet.
    for (parent, seq) in [("p", 0), ("p:1", 0), ("failed", 0)] {
        assert_eq!(s.send_signal(&token(parent, seq), json(json!(seq)), T0).await?, Delivery::Buffered);
    }
    drive(s, "done", &[RunStatus::Running, RunStatus::Completed]).await?;
    drive(s, "gone", &[RunStatus::Running, RunStatus::Cancelled]).await?;
    drive(s, "failed", &[RunStatus::Running, RunStatus::Failed]).await?;
    assert_eq!(s.delete_run(&RunId::from("gone")).await?, 1);
    for parent in ["done", "gone", "failed", "never"] {
        assert_eq!(s.send_signal(&token(parent, 1), json(json!(1)), T0).await?, Delivery::Buffered, "{parent}");
    }
    assert_eq!(child_results_of(s, "done").await?, Vec::<String>::new(), "a completed parent's is dropped");
    assert_eq!(child_results_of(s, "gone").await?, Vec::<String>::new(), "a deleted parent's is dropped");
    assert_eq!(child_results_of(s, "never").await?, Vec::<String>::new(), "no parent: dropped");
    assert_eq!(
        child_results_of(s, "failed").await?,
        strings(&["child:failed:0", "child:failed:1"]),
        "kept for a retry"
    );

    drive(s, "p", &[RunStatus::Running, RunStatus::Cancelled]).await?;
    assert_eq!(child_results_of(s, "p").await?, strings(&["child:p:0"]), "buffered before the cancel");
    assert_eq!(s.delete_run(&RunId::from("p")).await?, 1);
    assert_eq!(child_results_of(s, "p").await?, Vec::<String>::new(), "deleted with its parent");
    assert_eq!(child_results_of(s, "p:1").await?, strings(&["child:p:1:0"]), "another parent's is kept");

    // A new run with the deleted parent's id waits for its own child.
    start(s, "p").await?;
    register_wait(s, signal_wait("p", 0, &token("p", 0))).await?;
    assert_eq!(waiter_seqs(s, "p").await?, [0], "the new run took a deleted run's child result");
    Ok(())
}
