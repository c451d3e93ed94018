//! The pollers' queues: `pending_runs`, `due_runs`, `claim_due_runs`, `orphaned_runs`.

use std::sync::Arc;

use durable_core::{Delivery, Millis, NewRun, Run, RunFilter, RunId, RunPatch, RunQuery, RunStatus, Store, protocol};

use super::fixtures::*;
use crate::CaseResult;

/// A query of every namespace and workflow at `now`, for up to 100 runs.
fn query(now: Millis) -> RunQuery {
    RunQuery { namespace: None, workflows: None, now, limit: 100, leave_queued_since: None }
}

/// The ids in `ids`, as strings.
fn names(ids: Vec<RunId>) -> Vec<String> {
    ids.into_iter().map(|id| id.to_string()).collect()
}

/// Claims `id` for [`OWNER`] at `now` and moves it to `status` without releasing the lease
/// (a run handed back, or parked by a turn that still holds it).
async fn leased_as(s: &dyn Store, id: &str, now: Millis, status: RunStatus, wake_at: Option<Millis>) -> CaseResult {
    acquire(s, claim(id, OWNER, now)).await?;
    let patch = RunPatch { status: Some(status), wake_at: Some(wake_at), now, ..RunPatch::default() };
    assert!(s.update_run_if(&RunId::from(id), &[RunStatus::Running], patch).await?);
    Ok(())
}

/// Pending runs come out by priority (highest first, the whole `i32` range), then oldest
/// `created_at`, then id; runs in other statuses are not pending.
pub async fn pending_runs_by_priority_then_age(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let runs = [
        ("a", 0, 3),
        ("b", 5, 9),
        ("c", 0, 1),
        ("d", i32::MIN, 0),
        ("e", i32::MAX, 20),
        ("f", 0, 3),
        ("running", 100, 0),
        ("cancelled", 100, 0),
    ];
    create_all(s, runs.map(|(id, priority, t)| NewRun { priority, ..new_run_at(id, T0 + t) })).await?;
    acquire(s, claim("running", OWNER, T0)).await?;
    drive(s, "cancelled", &[RunStatus::Cancelled]).await?;
    assert_eq!(names(s.pending_runs(&query(T0)).await?), strings(&["e", "b", "c", "a", "f", "d"]));
    Ok(())
}

/// `pending_runs` keeps the query's namespace and `(workflow, version)` pairs, and returns at
/// most `limit` runs.
pub async fn pending_runs_filter_and_limit(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let runs = [
        ("a", "default", "wf", 1),
        ("b", "billing", "wf", 1),
        ("c", "default", "wf", 2),
        ("d", "default", "other", 1),
        ("e", "default", "wf", 1),
    ];
    for (t, (id, namespace, workflow, version)) in (1..).zip(runs) {
        let run = NewRun { namespace: namespace.into(), workflow: workflow.into(), version, ..new_run_at(id, T0 + t) };
        create(s, run).await?;
    }
    let pairs = |ps: &[(&str, u32)]| Some(ps.iter().map(|(w, v)| (w.to_string(), *v)).collect());
    let cases = [
        (RunQuery { limit: 2, ..query(T0) }, &["a", "b"][..]),
        (RunQuery { namespace: Some("default".into()), ..query(T0) }, &["a", "c", "d", "e"]),
        (RunQuery { workflows: pairs(&[("wf", 1)]), ..query(T0) }, &["a", "b", "e"]),
        (
            RunQuery { namespace: Some("default".into()), workflows: pairs(&[("wf", 1), ("other", 1)]), ..query(T0) },
            &["a", "d", "e"],
        ),
        (RunQuery { workflows: pairs(&[]), ..query(T0) }, &[]),
    ];
    for (q, expected) in cases {
        assert_eq!(names(s.pending_runs(&q).await?), strings(expected), "pending_runs({q:?})");
    }
    Ok(())
}

/// A pending run whose lease is live (`lease_until >= now`) is not offered; once the lease
/// expired it is.
pub async fn pending_runs_skip_leased_runs(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create_all(s, [("free", 0), ("handed-back", 1), ("stale", 2)].map(|(id, t)| new_run_at(id, T0 + t))).await?;
    leased_as(s, "handed-back", T0, RunStatus::Pending, None).await?;
    leased_as(s, "stale", T0 - 2 * LEASE, RunStatus::Pending, None).await?;
    for (now, expected) in [
        (T0 + 1, &["free", "stale"][..]),
        (T0 + LEASE, &["free", "stale"]),
        (T0 + LEASE + 1, &["free", "handed-back", "stale"]),
    ] {
        assert_eq!(names(s.pending_runs(&query(now)).await?), strings(expected), "pending at {now}");
    }
    Ok(())
}

/// Due runs are `suspended` with `wake_at <= now` and no live lease, earliest `wake_at`
/// first, filtered by namespace, at most `limit`.
pub async fn due_runs_are_due_earliest_first(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for (id, wake) in [("d30", 30), ("d10", 10), ("d20", 20), ("future", 50)] {
        park_until(s, new_run(id), T0 + wake).await?;
    }
    park_until(s, NewRun { namespace: "billing".into(), ..new_run("d15") }, T0 + 15).await?;
    park_on_signal(s, "no-timer", 0, "tok", None).await?;
    create(s, new_run("leased")).await?;
    leased_as(s, "leased", T0, RunStatus::Suspended, Some(T0 + 5)).await?;

    let cases = [
        (query(T0 + 30), &["d10", "d15", "d20", "d30"][..]),
        (query(T0 + 29), &["d10", "d15", "d20"]),
        (RunQuery { namespace: Some("default".into()), ..query(T0 + 30) }, &["d10", "d20", "d30"]),
        (RunQuery { limit: 2, ..query(T0 + 30) }, &["d10", "d15"]),
        (query(T0 + LEASE + 1), &["leased", "d10", "d15", "d20", "d30", "future"]),
    ];
    for (q, expected) in cases {
        assert_eq!(names(s.due_runs(&q).await?), strings(expected), "due_runs({q:?})");
    }
    Ok(())
}

/// Orphaned runs are `running` without a live lease — expired (`lease_until < now`) or
/// released — oldest `updated_at` first, filtered by namespace, at most `limit`.
pub async fn orphaned_runs_are_running_without_live_lease(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let runs = ["expired", "released", "live", "pending"].map(new_run);
    create_all(s, runs).await?;
    create(s, NewRun { namespace: "billing".into(), ..new_run("billing-expired") }).await?;
    acquire(s, claim("expired", OWNER, T0)).await?;
    acquire(s, claim("billing-expired", OWNER, T0 + 2)).await?;
    acquire(s, claim("released", OWNER, T0 + 5)).await?;
    assert!(s.release_lease(&RunId::from("released"), OWNER).await?);
    acquire(s, claim("live", OWNER, T0 + 10)).await?;
    park_until(s, new_run("parked"), T0 + 1).await?;

    let now = T0 + LEASE + 3;
    let cases = [
        (query(now), &["expired", "billing-expired", "released"][..]),
        (RunQuery { namespace: Some("default".into()), ..query(now) }, &["expired", "released"]),
        (RunQuery { limit: 1, ..query(now) }, &["expired"]),
        (query(T0 + LEASE), &["released"]),
    ];
    for (q, expected) in cases {
        assert_eq!(names(s.orphaned_runs(&q).await?), strings(expected), "orphaned_runs({q:?})");
    }
    Ok(())
}

/// The ids, sorted (`claim_due_runs` answers in no particular order).
fn sorted(ids: Vec<RunId>) -> Vec<String> {
    let mut names = names(ids);
    names.sort();
    names
}

/// `claim_due_runs` takes what `due_runs` offers — parked runs and delayed starts that are
/// due, without a live lease — and moves each one's `wake_at` to `until`, nothing else of the
/// row: a second claim right after gets nothing, and once `until` passes the runs are due
/// again. A delivery makes a claimed run due at once; a run not due, leased or gated is never
/// claimed.
pub async fn claim_due_runs_moves_wake_at_to_until(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for (id, wake) in [("d10", 10), ("d20", 20), ("future", 50)] {
        park_until(s, new_run(id), T0 + wake).await?;
    }
    park_on_signal(s, "d5-signal", 0, "tok", Some(T0 + 5)).await?;
    park_on_signal(s, "no-timer", 0, "other", None).await?;
    create(s, NewRun { start_at: Some(T0 + 15), ..new_run("delayed") }).await?;
    create(s, NewRun { start_at: Some(protocol::GATED), ..new_run("gated") }).await?;
    create(s, new_run("leased")).await?;
    leased_as(s, "leased", T0, RunStatus::Suspended, Some(T0 + 5)).await?;

    let (now, until) = (T0 + 30, T0 + 30 + LEASE);
    let before: Vec<Run> = s.list_runs(&RunFilter { limit: 100, ..RunFilter::default() }).await?.runs;
    let claimed = sorted(s.claim_due_runs(&query(now), until).await?);
    assert_eq!(claimed, strings(&["d10", "d20", "d5-signal", "delayed"]));
    for run in before {
        let after = get(s, run.id.as_str()).await?;
        if claimed.contains(&run.id.to_string()) {
            assert_eq!(after.wake_at, Some(until), "claimed run {}", run.id);
            assert_eq!(Run { wake_at: run.wake_at, ..after }, run, "only the wake_at of {} moves", run.id);
        } else {
            assert_eq!(after, run, "run {} is not claimed, so not changed", run.id);
        }
    }
    assert_eq!(s.claim_due_runs(&query(now), until).await?, Vec::<RunId>::new(), "claimed already");
    assert_eq!(s.due_runs(&query(now)).await?, Vec::<RunId>::new(), "claimed runs are not due");

    // A delivery makes a claimed run due at once.
    assert!(matches!(s.send_signal("tok", json(serde_json::json!(1)), now + 1).await?, Delivery::Delivered { .. }));
    assert_eq!(names(s.due_runs(&query(now + 1)).await?), strings(&["d5-signal"]));
    assert_eq!(names(s.claim_due_runs(&query(now + 1), until + 1).await?), strings(&["d5-signal"]));

    // Once `until` passes, what was claimed is due again (with what came due since).
    // (The lease of `leased` ran out meanwhile: it is due too.)
    assert_eq!(names(s.due_runs(&query(until - 1)).await?), strings(&["leased", "future"]));
    let again = sorted(s.claim_due_runs(&query(until), until + LEASE).await?);
    assert_eq!(again, strings(&["d10", "d20", "delayed", "future", "leased"]));
    assert_eq!(get(s, "gated").await?.wake_at, Some(protocol::GATED), "a gated run is never claimed");
    Ok(())
}

/// `claim_due_runs` keeps the query's namespace and `(workflow, version)` pairs and claims at
/// most `limit` runs, the earliest due first: the next claim takes the next ones.
pub async fn claim_due_runs_filter_and_limit(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let runs = [
        ("a", "default", "wf", 1),
        ("b", "billing", "wf", 1),
        ("c", "default", "wf", 2),
        ("d", "default", "other", 1),
        ("e", "default", "wf", 1),
        ("f", "billing", "other", 1),
    ];
    for (t, (id, namespace, workflow, version)) in (1..).zip(runs) {
        let run = NewRun { namespace: namespace.into(), workflow: workflow.into(), version, ..new_run(id) };
        park_until(s, run, T0 + t).await?;
    }
    let pairs = |ps: &[(&str, u32)]| Some(ps.iter().map(|(w, v)| (w.to_string(), *v)).collect());
    let now = T0 + 10;
    let until = now + LEASE;
    let cases = [
        (RunQuery { workflows: pairs(&[]), ..query(now) }, &[][..]),
        (RunQuery { limit: 0, ..query(now) }, &[]),
        (RunQuery { namespace: Some("billing".into()), limit: 1, ..query(now) }, &["b"]),
        (RunQuery { workflows: pairs(&[("wf", 1)]), ..query(now) }, &["a", "e"]),
        (RunQuery { namespace: Some("default".into()), workflows: pairs(&[("other", 1)]), ..query(now) }, &["d"]),
        (RunQuery { limit: 1, ..query(now) }, &["c"]),
        (query(now), &["f"]),
        (query(now), &[]),
    ];
    for (q, expected) in cases {
        assert_eq!(sorted(s.claim_due_runs(&q, until).await?), strings(expected), "claim_due_runs({q:?})");
    }
    Ok(())
}

/// 16 pollers claiming 4 due runs each at the same time: no run is claimed twice, and the 40
/// due runs are all claimed.
pub async fn concurrent_due_claims_never_share_a_run(store: Arc<dyn Store>) -> CaseResult {
    due_claim_race(&[store]).await
}

/// [`concurrent_due_claims_never_share_a_run`] with the pollers alternating between two
/// handles on one store (engines in two processes).
pub async fn concurrent_due_claims_across_handles_never_share_a_run(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) -> CaseResult {
    due_claim_race(&[a, b]).await
}

/// The race of [`concurrent_due_claims_never_share_a_run`], across `handles`.
async fn due_claim_race(handles: &[Arc<dyn Store>]) -> CaseResult {
    let s = &*handles[0];
    for i in 0..40u64 {
        park_until(s, new_run(&format!("due-{i:02}")), T0 + 1 + i % 7).await?;
    }
    let now = T0 + 10;
    let results = race(RACERS, |i| {
        let store = handle_for(handles, i);
        async move { store.claim_due_runs(&RunQuery { limit: 4, ..query(now) }, now + LEASE).await }
    })
    .await;
    let mut seen = std::collections::BTreeSet::new();
    for claimed in results {
        let claimed = claimed?;
        assert!(claimed.len() <= 4, "a claim of 4 took {}", claimed.len());
        for id in claimed {
            assert!(seen.insert(id.to_string()), "run {id} was claimed twice");
        }
    }
    assert_eq!(seen.len(), 40, "16 claimers of 4 take all 40 due runs");
    assert_eq!(s.due_runs(&query(now)).await?, Vec::<RunId>::new());
    Ok(())
}
