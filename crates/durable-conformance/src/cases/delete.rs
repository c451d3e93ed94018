//! `delete_run`: a run and its whole subtree, nothing else.

use std::sync::Arc;

use durable_core::{Delivery, NewRun, ParentLink, RunFilter, RunId, Store};
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
