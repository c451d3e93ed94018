//! Creating and reading runs: `capabilities`, `create_run`, `create_runs`, `get_run`, `get_runs`,
//! `history`.

use std::sync::Arc;

use durable_core::{ClaimOutcome, CreateRun, NewRun, ParentLink, RunFilter, RunId, Store, StoreResult};
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

/// A run keeps the trace context (W3C `traceparent`) it was created with, as given, in every
/// read: `create_run`, `get_run`, `get_runs`, `list_runs`, `claim_run` and a second create;
/// `create_runs` and a child created by a commit keep theirs; a run created without one reads
/// back `None`.
pub async fn create_run_keeps_the_trace_context(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const CHILD: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let new = NewRun { trace_context: Some(TP.into()), ..new_run("traced") };
    let created = s.create_run(new.clone()).await?;
    assert_eq!(created.run().trace_context.as_deref(), Some(TP), "create_run returns the trace context");
    assert_eq!(get(s, "traced").await?.trace_context.as_deref(), Some(TP), "get_run returns it");
    let again = s.create_run(NewRun { trace_context: None, ..new }).await?;
    assert_eq!(again.run().trace_context.as_deref(), Some(TP), "a second create returns the stored one");
    let listed = s.list_runs(&RunFilter { limit: 10, ..RunFilter::default() }).await?;
    assert_eq!(listed.runs[0].trace_context.as_deref(), Some(TP), "list_runs returns it");
    let many = s.get_runs(&[RunId::from("traced")]).await?;
    assert_eq!(many[0].trace_context.as_deref(), Some(TP), "get_runs returns it");
    let claimed = acquire(s, claim("traced", OWNER, T0 + 1)).await?;
    assert_eq!(claimed.trace_context.as_deref(), Some(TP), "claim_run returns it");

    let batch =
        s.create_runs(vec![NewRun { trace_context: Some(CHILD.into()), ..new_run("batch") }, new_run("plain")]).await?;
    assert_eq!(batch[0].run().trace_context.as_deref(), Some(CHILD), "create_runs keeps each item's");
    assert_eq!(get(s, "batch").await?.trace_context.as_deref(), Some(CHILD));
    assert_eq!(get(s, "plain").await?.trace_context, None, "a run created without one has none");

    let mut c = commit("traced", OWNER);
    c.children.push(NewRun {
        trace_context: Some(TP.into()),
        parent: Some(ParentLink { run_id: RunId::from("traced"), seq: 0 }),
        ..new_run("traced.child")
    });
    s.commit(c).await?;
    assert_eq!(get(s, "traced.child").await?.trace_context.as_deref(), Some(TP), "a child keeps its trace context");
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

/// `create_runs` answers each item in the order given, as `create_run` would: a new id is
/// `Created` (stored `pending`, as given), an existing one `Existing` with the stored run
/// untouched, an id given twice is created by its first item and `Existing` for the second. A
/// second identical batch creates nothing; an empty one answers nothing.
pub async fn create_runs_answers_each_item_in_order(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    assert_eq!(s.create_runs(Vec::new()).await?, vec![], "an empty batch answers nothing");
    create(s, new_run("old")).await?;
    let old = acquire(s, claim("old", OWNER, T0 + 10)).await?;
    let batch = vec![
        NewRun {
            tags: vec!["vip".into()],
            priority: 3,
            namespace: "billing".into(),
            parent: Some(ParentLink { run_id: RunId::from("parent"), seq: 2 }),
            ..new_run("b-1")
        },
        NewRun { input: json(json!({"other": true})), ..new_run("old") },
        new_run("b-2"),
        NewRun { input: json(json!({"second": true})), priority: 9, ..new_run("b-1") },
        new_run("b-3"),
    ];
    let answers = s.create_runs(batch.clone()).await?;
    let created = |i: usize| batch[i].clone().into_run();
    assert_eq!(
        answers,
        vec![
            CreateRun::Created(created(0)),
            CreateRun::Existing(old.clone()),
            CreateRun::Created(created(2)),
            CreateRun::Existing(created(0)),
            CreateRun::Created(created(4)),
        ],
        "one answer per item, in order"
    );
    for i in [0, 2, 4] {
        assert_eq!(get(s, batch[i].id.as_str()).await?, created(i), "stored pending, as given");
    }
    assert_eq!(get(s, "old").await?, old, "an existing run is untouched");

    let again = s.create_runs(batch.clone()).await?;
    let stored = [created(0), old, created(2), created(0), created(4)];
    assert_eq!(again, stored.map(CreateRun::Existing).to_vec(), "a second batch creates nothing");
    Ok(())
}

/// `create_runs` is atomic: a reader never sees part of a batch. One task creates ten batches
/// of 100 runs, one after the other, while another lists the runs again and again (one
/// `list_runs` is one read): each read holds every run of a batch or none of it, and a batch
/// only after the ones created before it.
pub async fn create_runs_is_seen_whole(store: Arc<dyn Store>) -> CaseResult {
    const BATCHES: usize = 10;
    const SIZE: usize = 100;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for b in 0..BATCHES {
                let batch = (0..SIZE).map(|i| new_run(&format!("bulk-{b}-{i:03}"))).collect();
                let answers = store.create_runs(batch).await?;
                assert!(answers.iter().all(CreateRun::created), "batch {b}: every run is new");
            }
            Ok::<_, durable_core::StoreError>(())
        })
    };
    let filter = RunFilter { limit: BATCHES * SIZE, ..RunFilter::default() };
    let mut reads = 0;
    loop {
        // Whether the writer is done, taken before the read: a read after it sees everything.
        let finished = writer.is_finished();
        let runs = store.list_runs(&filter).await?.runs;
        let mut per_batch = [0usize; BATCHES];
        for run in &runs {
            let batch = run.id.as_str().split('-').nth(1).and_then(|b| b.parse::<usize>().ok());
            per_batch[batch.expect("a run of this case")] += 1;
        }
        for (b, seen) in per_batch.iter().enumerate() {
            assert!(*seen == 0 || *seen == SIZE, "read {reads} saw {seen} of the {SIZE} runs of batch {b}");
        }
        let whole = per_batch.iter().take_while(|n| **n == SIZE).count();
        assert!(per_batch[whole..].iter().all(|n| *n == 0), "read {reads} saw batches out of order: {per_batch:?}");
        reads += 1;
        if finished {
            assert_eq!(whole, BATCHES, "after the last batch, every run is there");
            break;
        }
        tokio::task::yield_now().await;
    }
    match writer.await {
        Ok(result) => result?,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
    Ok(())
}

/// Concurrent `create_runs` over overlapping ids (12 batches of 8 out of 23 ids, in one
/// order) and `create_run`s of some of them: each id is created exactly once, and every answer for an
/// id carries the one stored run.
pub async fn concurrent_create_runs_have_one_winner_per_id(store: Arc<dyn Store>) -> CaseResult {
    let ids: Vec<String> = (0..RACERS + 7).map(|i| format!("c-{i:02}")).collect();
    let results = race(RACERS, |i| {
        let store = store.clone();
        let mine: Vec<String> = ids[i..(i + 8).min(ids.len())].to_vec();
        async move {
            if i % 4 == 1 {
                let id = mine[0].clone();
                let created = store.create_run(NewRun { input: json(json!({ "creator": i })), ..new_run(&id) }).await?;
                return Ok(vec![(id, created)]);
            }
            let batch = mine.iter().map(|id| NewRun { input: json(json!({ "creator": i })), ..new_run(id) }).collect();
            let answers = store.create_runs(batch).await?;
            assert_eq!(answers.len(), mine.len(), "one answer per item");
            Ok::<_, durable_core::StoreError>(mine.into_iter().zip(answers).collect::<Vec<_>>())
        }
    })
    .await;
    let mut created: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for racer in results {
        for (id, answer) in racer? {
            assert_eq!(answer.run().id.as_str(), id, "answers are in the order of the items");
            assert_eq!(answer.run(), &get(&*store, &id).await?, "every creator of {id} sees the one stored run");
            *created.entry(id).or_default() += usize::from(answer.created());
        }
    }
    assert_eq!(created.len(), ids.len(), "every id was asked for");
    assert!(created.values().all(|n| *n == 1), "each id is created exactly once: {created:?}");
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
