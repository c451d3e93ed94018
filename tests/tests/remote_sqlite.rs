//! Remote steps across processes on one SQLite file: two engines (in this process, each with a
//! store handle of its own) and three worker processes (`src/bin/remote_worker.rs`) run 5,000
//! remote steps while two workers are SIGKILLed. Every run completes with its output; the
//! workers' ledger shows no lost step, and a step started twice only when a killed worker had
//! it in flight.

mod remote_common;

/// Runs started by the test.
const RUNS: usize = 1_000;

use std::sync::Arc;
use std::time::Duration;

use durable::{Engine, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_three_workers_5000_remote_steps_survive_two_sigkills() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("remote.db");
    let ledger = dir.path().join("ledger");
    let engine = || {
        let store = Arc::new(SqliteStore::open(&db).expect("open the SQLite file"));
        Engine::builder().shared_store(store).config(remote_common::config()).build().expect("an engine")
    };
    // The first store creates the schema before the workers open the file.
    let engines = [engine(), engine()];
    let (db_arg, ledger_arg) = (db.to_string_lossy().to_string(), ledger.to_string_lossy().to_string());
    // Leases of 2 s: a killed worker's tasks go to the survivor 2 s after their claim.
    let lease = Duration::from_secs(2);
    remote_common::scenario(RUNS, [&engines[0], &engines[1]], lease, &["sqlite", &db_arg, &ledger_arg], &[], &ledger)
        .await;
    for e in &engines {
        tokio::time::timeout(Duration::from_secs(30), e.shutdown()).await.expect("the engines shut down");
    }
}
