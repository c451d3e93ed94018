//! Several handles on one file: two `SqliteStore`s in one process, two processes, and a file
//! locked by someone else.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{claim, create_and_claim, new_run, rt, step};
use durable_core::{
    ClaimOutcome, Commit, Delivery, Payload, RunId, StepKind, Store, StoreErrorKind, TurnEnd, WaitKind, Waiter,
};
use durable_store_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;

#[test]
fn concurrent_claims_through_two_handles_have_exactly_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.db");
    let a: Arc<dyn Store> = Arc::new(common::open(&path));
    let b: Arc<dyn Store> = Arc::new(common::open(&path));
    let rt = rt();
    const RUNS: usize = 100;
    rt.block_on(async {
        for i in 0..RUNS {
            a.create_run(new_run(&format!("run-{i}"), 1_000)).await.unwrap();
        }
    });
    let mut tasks = Vec::new();
    for i in 0..RUNS {
        for (store, owner) in [(a.clone(), "engine-a"), (b.clone(), "engine-b")] {
            tasks.push(rt.spawn(async move {
                let id = format!("run-{i}");
                let outcome = store.claim_run(claim(&id, owner, 100_000, 2_000)).await.unwrap();
                (id, owner, matches!(outcome, ClaimOutcome::Acquired { .. }))
            }));
        }
    }
    let mut winners: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for t in tasks {
        let (id, owner, won) = rt.block_on(t).unwrap();
        let entry = winners.entry(id).or_default();
        if won {
            entry.push(owner);
        }
    }
    assert_eq!(winners.len(), RUNS);
    rt.block_on(async {
        for (id, owners) in &winners {
            assert_eq!(owners.len(), 1, "{id} was acquired by {owners:?}");
            let run = b.get_run(&RunId::from(id.as_str())).await.unwrap().unwrap();
            assert_eq!(run.lease_owner.as_deref(), Some(owners[0]), "{id}: the stored lease is the winner's");
        }
    });
}

#[test]
fn signals_and_waits_through_two_handles_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("signals.db");
    let a: Arc<dyn Store> = Arc::new(common::open(&path));
    let b: Arc<dyn Store> = Arc::new(common::open(&path));
    let rt = rt();
    const N: usize = 60;
    rt.block_on(async {
        for i in 0..N {
            create_and_claim(&*a, &format!("w-{i}"), "engine", 1_000).await;
        }
    });
    // Waiters register through `a` while signals for the same token are sent through `b`.
    let mut tasks = Vec::new();
    for i in 0..N {
        let a = a.clone();
        tasks.push(rt.spawn(async move {
            let id = RunId::from(format!("w-{i}").as_str());
            let mut c = Commit::new(id.clone(), "engine", 2_000);
            c.waits.push(Waiter {
                run_id: id,
                seq: 0,
                name: "go".into(),
                kind: WaitKind::Signal { token: "shared".into() },
                created_at: 2_000,
            });
            c.end = Some(TurnEnd::Suspend { wake_at: None, seen_wake_gen: 0 });
            a.commit(c).await.map(|_| None)
        }));
        let b = b.clone();
        tasks.push(
            rt.spawn(
                async move { b.send_signal("shared", Payload::encode(&json!(i)).unwrap(), 2_000).await.map(Some) },
            ),
        );
    }
    let mut buffered = 0;
    for t in tasks {
        if let Some(Delivery::Buffered) = rt.block_on(t).unwrap().unwrap() {
            buffered += 1;
        }
    }
    // Every payload went exactly once: to a waiter, or to the buffer and then to the next wait.
    rt.block_on(async {
        let mut received = Vec::new();
        for i in 0..N {
            let history = a.history(&RunId::from(format!("w-{i}").as_str())).await.unwrap();
            assert_eq!(history.len(), 1, "w-{i} got exactly one payload");
            assert_eq!(history[0].kind, StepKind::Signal);
            received.push(history[0].output.clone().unwrap().decode::<usize>().unwrap());
            assert!(a.waiters(&RunId::from(format!("w-{i}").as_str())).await.unwrap().is_empty());
        }
        received.sort_unstable();
        assert_eq!(received, (0..N).collect::<Vec<_>>());
        assert!(buffered <= N);
    });
}

#[test]
fn a_write_locked_out_past_the_busy_timeout_is_unavailable_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let store = SqliteStore::open_with(&path, SqliteOptions::new().busy_timeout(Duration::from_millis(20))).unwrap();
    let rt = rt();
    rt.block_on(create_and_claim(&store, "r", "engine", 1_000));
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    rt.block_on(async {
        let mut c = Commit::new(RunId::from("r"), "engine", 2_000);
        c.checkpoints.push(step("r", 0, 2_000, json!("x")));
        let err = store.commit(c.clone()).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        assert!(err.is_retryable());
        assert!(err.to_string().contains(&path.display().to_string()), "names the file: {err}");
        // Reads do not wait for the writer, nor for the other connection's lock.
        assert_eq!(store.get_run(&RunId::from("r")).await.unwrap().unwrap().lease_owner.as_deref(), Some("engine"));
        assert!(store.history(&RunId::from("r")).await.unwrap().is_empty(), "nothing was written");
        assert_eq!(store.stats().failed_groups, 1);
        other.execute_batch("ROLLBACK").unwrap();
        // Trying again succeeds.
        store.commit(c).await.unwrap();
        assert_eq!(store.history(&RunId::from("r")).await.unwrap().len(), 1);
    });
}

const CHILD_ENV: &str = "DURABLE_SQLITE_TEST_CLAIMER";
const PROCESS_RUNS: usize = 80;

/// The child side of `two_processes_claiming_the_same_runs_have_one_winner_each`: does nothing
/// unless started by it.
#[test]
fn child_claimer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let mut parts = spec.splitn(3, '|');
    let (path, owner, order) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let store = SqliteStore::open(path).unwrap();
    let mut ids: Vec<usize> = (0..PROCESS_RUNS).collect();
    if order == "desc" {
        ids.reverse();
    }
    rt().block_on(async {
        for i in ids {
            let id = format!("run-{i}");
            if let ClaimOutcome::Acquired { .. } = store.claim_run(claim(&id, owner, 1_000_000, 2_000)).await.unwrap() {
                let mut c = Commit::new(RunId::from(id.as_str()), owner, 2_001);
                c.checkpoints.push(step(&id, 0, 2_001, json!(owner)));
                store.commit(c).await.unwrap();
                println!("won {id}");
            }
        }
    });
}

#[test]
fn two_processes_claiming_the_same_runs_have_one_winner_each() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("processes.db");
    {
        let store = common::open(&path);
        rt().block_on(async {
            for i in 0..PROCESS_RUNS {
                store.create_run(new_run(&format!("run-{i}"), 1_000)).await.unwrap();
            }
        });
    }
    let exe = std::env::current_exe().unwrap();
    // One claims from the first run up, the other from the last down: they meet in the middle.
    let children: Vec<_> = [("proc-a", "asc"), ("proc-b", "desc")]
        .into_iter()
        .map(|(owner, order)| {
            let child = Command::new(&exe)
                .args(["--exact", "child_claimer", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, format!("{}|{owner}|{order}", path.display()))
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            (owner, child)
        })
        .collect();
    let mut winners: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (owner, child) in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{owner} failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // The harness may print "test child_claimer ... " on the same line as the first.
            if let Some((_, id)) = line.split_once("won ") {
                winners.entry(id.to_string()).or_default().push(owner);
            }
        }
    }
    assert_eq!(winners.len(), PROCESS_RUNS, "every run was won");
    let store = common::open(&path);
    rt().block_on(async {
        for (id, owners) in &winners {
            assert_eq!(owners.len(), 1, "{id} was won by {owners:?}");
            let history = store.history(&RunId::from(id.as_str())).await.unwrap();
            assert_eq!(history.len(), 1);
            assert_eq!(history[0].output.as_ref().unwrap().decode::<String>().unwrap(), owners[0]);
        }
    });
}
