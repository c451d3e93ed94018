//! Helpers shared by the integration tests: a runtime, store options, builders. Database files
//! live in `tempfile::tempdir()`s, removed with everything in them when the test ends.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::path::Path;

use durable_core::{Checkpoint, CheckpointStatus, Claim, ClaimOutcome, NewRun, Payload, RunId, StepKind, Store};
use durable_store_sqlite::{Durability, SqliteOptions, SqliteStore};

/// A current-thread-free runtime for driving the store from a test.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

pub fn block_on<F: Future>(f: F) -> F::Output {
    rt().block_on(f)
}

/// Fast options for tests that do many writes (no fsync per commit).
pub fn fast() -> SqliteOptions {
    SqliteOptions::new().durability(Durability::Normal)
}

pub fn open(path: &Path) -> SqliteStore {
    SqliteStore::open_with(path, fast()).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

pub fn new_run(id: &str, created_at: u64) -> NewRun {
    NewRun {
        trace_context: None,
        admission: None,
        id: RunId::from(id),
        workflow: "wf".into(),
        version: 1,
        namespace: "default".into(),
        input: Payload::encode(&serde_json::json!({"id": id})).expect("payload"),
        tags: vec![],
        priority: 0,
        parent: None,
        created_at,
        start_at: None,
    }
}

pub fn step(run: &str, seq: u32, now: u64, output: serde_json::Value) -> Checkpoint {
    let mut cp =
        Checkpoint::new(RunId::from(run), seq, format!("step-{seq}"), StepKind::Step, CheckpointStatus::Completed, now);
    cp.output = Some(Payload::encode(&output).expect("payload"));
    cp.attempts = 1;
    cp
}

pub fn claim(id: &str, owner: &str, lease_until: u64, now: u64) -> Claim {
    Claim { run_id: RunId::from(id), owner: owner.into(), lease_until, now }
}

/// Creates a run and claims it for `owner`; panics unless acquired.
pub async fn create_and_claim(store: &dyn Store, id: &str, owner: &str, now: u64) {
    store.create_run(new_run(id, now)).await.expect("create");
    match store.claim_run(claim(id, owner, now + 60_000, now)).await.expect("claim") {
        ClaimOutcome::Acquired { .. } => {}
        other => panic!("claim of {id} not acquired: {other:?}"),
    }
}

/// Removes a database file and its WAL and shared-memory files.
pub fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
