//! Group commit: concurrent writes share transactions, and one failing write in a group rolls
//! back alone.
//!
//! To make grouping deterministic (no timing), another connection holds the database's write
//! lock while the writes are submitted: the writer cannot commit, so every write queues; the
//! test waits (without sleeping) until the store's `queued` gauge shows all of them, then
//! releases the lock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{create_and_claim, rt, step};
use durable_core::{Commit, Payload, RunId, RunPatch, RunStatus, Store, StoreErrorKind};
use durable_store_sqlite::{SqliteOptions, SqliteStore};
use rusqlite::Connection;
use serde_json::json;

/// Holds the write lock of `path` until dropped.
struct WriteLock(Connection);

impl WriteLock {
    fn take(path: &std::path::Path) -> WriteLock {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        WriteLock(conn)
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("ROLLBACK");
    }
}

fn wait_until_queued(store: &SqliteStore, n: u64) {
    while store.stats().queued < n {
        std::thread::yield_now();
    }
}

/// Durability::Full (the default), and a busy timeout long enough for the writer to wait for
/// the test's lock instead of failing.
fn patient(path: &std::path::Path) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open_with(path, SqliteOptions::new().busy_timeout(Duration::from_secs(600))).unwrap())
}

#[test]
fn two_hundred_concurrent_commits_share_a_few_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group.db");
    let store = patient(&path);
    let rt = rt();
    rt.block_on(async {
        for i in 0..200 {
            create_and_claim(&*store, &format!("run-{i}"), "engine", 1_000).await;
        }
    });
    let before = store.stats();
    assert_eq!(before.queued, 0);

    let lock = WriteLock::take(&path);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            rt.spawn(async move {
                let id = format!("run-{i}");
                let mut c = Commit::new(RunId::from(id.as_str()), "engine", 2_000);
                c.checkpoints.push(step(&id, 0, 2_000, json!(i)));
                store.commit(c).await
            })
        })
        .collect();
    wait_until_queued(&store, 200);
    drop(lock);
    for t in tasks {
        rt.block_on(t).unwrap().unwrap();
    }

    let after = store.stats();
    assert_eq!(after.writes - before.writes, 200);
    assert_eq!(after.queued, 0);
    let transactions = after.transactions - before.transactions;
    // The writer held at most the first write(s) when it met the lock; everything else queued
    // behind it and went in one more group.
    assert!(transactions <= 2, "200 concurrent commits took {transactions} transactions");
    rt.block_on(async {
        for i in 0..200 {
            let history = store.history(&RunId::from(format!("run-{i}").as_str())).await.unwrap();
            assert_eq!(history, vec![step(&format!("run-{i}"), 0, 2_000, json!(i))]);
        }
    });
}

#[test]
fn a_failing_write_rolls_back_alone_inside_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("isolation.db");
    let store = patient(&path);
    let rt = rt();
    rt.block_on(async {
        for i in 0..90 {
            create_and_claim(&*store, &format!("run-{i}"), "engine", 1_000).await;
            store.create_run(common::new_run(&format!("pending-{i}"), 1_000)).await.unwrap();
        }
    });
    let before = store.stats();

    let lock = WriteLock::take(&path);
    let tasks: Vec<_> = (0..90)
        .map(|i| {
            let store = store.clone();
            rt.spawn(async move {
                let id = format!("run-{i}");
                // Every third write is a zombie (wrong owner, its checkpoint must not be
                // written): LeaseLost. Every third asks a pending run for a forbidden
                // transition (pending -> completed): Conflict, and the run is unchanged.
                if i % 3 == 2 {
                    let patch = RunPatch {
                        status: Some(RunStatus::Completed),
                        output: Some(Some(Payload::encode(&json!("no")).unwrap())),
                        now: 2_000,
                        ..RunPatch::default()
                    };
                    return store
                        .update_run_if(&RunId::from(format!("pending-{i}").as_str()), &[], patch)
                        .await
                        .map(|_| ());
                }
                let owner = if i % 3 == 1 { "zombie" } else { "engine" };
                let mut c = Commit::new(RunId::from(id.as_str()), owner, 2_000);
                c.checkpoints.push(step(&id, 0, 2_000, json!(i)));
                store.commit(c).await.map(|_| ())
            })
        })
        .collect();
    wait_until_queued(&store, 90);
    drop(lock);
    let results: Vec<_> = tasks.into_iter().map(|t| rt.block_on(t).unwrap()).collect();

    let transactions = store.stats().transactions - before.transactions;
    assert!(transactions <= 2, "90 writes took {transactions} transactions");
    rt.block_on(async {
        for (i, result) in results.into_iter().enumerate() {
            let id = RunId::from(format!("run-{i}").as_str());
            let history = store.history(&id).await.unwrap();
            match i % 3 {
                0 => {
                    result.unwrap();
                    assert_eq!(history.len(), 1, "run-{i}: the good write is kept");
                }
                1 => {
                    assert_eq!(result.unwrap_err().kind(), StoreErrorKind::LeaseLost);
                    assert!(history.is_empty(), "run-{i}: the zombie's checkpoint is rolled back");
                }
                _ => {
                    assert_eq!(result.unwrap_err().kind(), StoreErrorKind::Conflict);
                    let pending = store.get_run(&RunId::from(format!("pending-{i}").as_str())).await.unwrap().unwrap();
                    assert_eq!((pending.status, pending.output), (RunStatus::Pending, None));
                }
            }
        }
    });
}

#[test]
fn groups_are_bounded_by_max_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bounded.db");
    let store = Arc::new(
        SqliteStore::open_with(&path, SqliteOptions::new().busy_timeout(Duration::from_secs(600)).max_group(10))
            .unwrap(),
    );
    let rt = rt();
    let before = store.stats();
    let lock = WriteLock::take(&path);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            rt.spawn(async move { store.create_run(common::new_run(&format!("run-{i}"), 1_000)).await })
        })
        .collect();
    wait_until_queued(&store, 50);
    drop(lock);
    for t in tasks {
        assert!(rt.block_on(t).unwrap().unwrap().created());
    }
    let transactions = store.stats().transactions - before.transactions;
    assert!((5..=6).contains(&transactions), "50 writes in groups of at most 10 took {transactions} transactions");
}

/// A keyed start runs without a savepoint of its own: its refusals are decided before it
/// writes a row. So in one group, a start refused with `QueueFull` costs the other writes
/// nothing (no failed group, no retry) and persists nothing, while a start that waits for
/// the key and the commits around it are kept.
#[test]
fn a_keyed_start_refused_inside_a_group_costs_the_group_nothing() {
    use durable_core::admission::{Limits, SlotRequest};
    use durable_core::{StoreError, protocol};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keyed.db");
    let store = patient(&path);
    let rt = rt();
    let gate = protocol::key_gate("default", "wf", "acme");
    let keyed = move |id: &str| {
        let mut run = common::new_run(id, 1_000);
        run.admission = Some(SlotRequest {
            gate: gate.clone(),
            holder: id.into(),
            run_id: RunId::from(id),
            priority: 0,
            fairness_key: String::new(),
            limits: Limits { concurrency: Some(1), ..Limits::default() },
            lease_until: None,
            max_waiting: Some(1),
            succeeds: None,
            now: 1_000,
        });
        run
    };
    rt.block_on(async {
        for i in 0..10 {
            create_and_claim(&*store, &format!("run-{i}"), "engine", 1_000).await;
        }
        store.create_run(keyed("k1")).await.unwrap();
        store.create_run(keyed("k2")).await.unwrap();
    });
    let before = store.stats();

    let lock = WriteLock::take(&path);
    let mut tasks = Vec::new();
    for i in 0..10 {
        let s = store.clone();
        tasks.push(rt.spawn(async move {
            let store = s;
            let id = format!("run-{i}");
            let mut c = Commit::new(RunId::from(id.as_str()), "engine", 2_000);
            c.checkpoints.push(step(&id, 0, 2_000, json!(i)));
            store.commit(c).await.map(|_| ())
        }));
        if i == 4 {
            // The key's queue is full (one holds it, one waits): refused.
            let (store, run) = (store.clone(), keyed("k3"));
            tasks.push(rt.spawn(async move {
                match store.create_run(run).await {
                    Err(StoreError::QueueFull { held: 1, waiting: 1, .. }) => Ok(()),
                    other => panic!("expected QueueFull for k3, got {other:?}"),
                }
            }));
        }
    }
    wait_until_queued(&store, 11);
    drop(lock);
    for t in tasks {
        rt.block_on(t).unwrap().unwrap();
    }
    let after = store.stats();
    assert_eq!(after.failed_groups, before.failed_groups, "the refusal rolled no group back");
    assert!(after.transactions - before.transactions <= 2);
    rt.block_on(async {
        assert!(store.get_run(&RunId::from("k3")).await.unwrap().is_none(), "a refused start persists nothing");
        let (slots, waits) = store.run_admission(&RunId::from("k3")).await.unwrap();
        assert!(slots.is_empty() && waits.is_empty(), "nor a slot or a queued request");
        for i in 0..10 {
            let history = store.history(&RunId::from(format!("run-{i}").as_str())).await.unwrap();
            assert_eq!(history.len(), 1, "run-{i}: its commit is kept");
        }
        let stats = store.admission_stats(3_000).await.unwrap();
        assert_eq!((stats[0].held, stats[0].waiting), (1, 1), "k1 holds the key, k2 waits: {stats:?}");
    });
}
