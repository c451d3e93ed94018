//! Flow control across processes on one SQLite file (`src/bin/flow_worker.rs`): concurrency
//! keys, a rate-limited queue and a SIGKILLed slot holder. See `flow_common`.

mod flow_common;

use std::path::Path;
use std::sync::Arc;

use durable::{Engine, SqliteStore};
use durable_tests::flow::{config, register};

/// A client engine on the file (it starts runs; the workers execute them).
fn client(db: &Path) -> Engine {
    let store = Arc::new(SqliteStore::open(db).expect("open the SQLite file"));
    let engine = Engine::builder().shared_store(store).config(config()).client_only().build().expect("an engine");
    register(&engine, None);
    engine
}

fn paths(dir: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let db = dir.path().join("flow.db");
    let ledger = dir.path().join("ledger");
    (db.clone(), ledger, db.to_string_lossy().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_300_keyed_runs_never_exceed_2_per_key() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (db, ledger, db_arg) = paths(&dir);
    let client = client(&db);
    let ledger_arg = ledger.to_string_lossy().to_string();
    flow_common::three_processes_keyed_runs(&client, &["sqlite", &db_arg, &ledger_arg], &[], &ledger).await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_10_per_second_holds_across_processes_for_20_seconds() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (db, ledger, db_arg) = paths(&dir);
    let client = client(&db);
    let ledger_arg = ledger.to_string_lossy().to_string();
    flow_common::rate_limited_queue(&client, &["sqlite", &db_arg, &ledger_arg], &[], &ledger).await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holders_slot_is_reclaimed_after_the_lease() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (db, ledger, db_arg) = paths(&dir);
    let client = client(&db);
    let ledger_arg = ledger.to_string_lossy().to_string();
    flow_common::sigkilled_holder(&client, &["sqlite", &db_arg, &ledger_arg], &[], &ledger).await;
    client.shutdown().await;
}
