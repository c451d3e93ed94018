//! Remote steps across processes on PostgreSQL: two engines (in this process, each with a store
//! of its own) and three worker processes (`src/bin/remote_worker.rs`, woken by
//! `task_wakeups`) run 5,000 remote steps while two workers are SIGKILLed. Every run completes
//! with its output; the workers' ledger shows no lost step, and a step started twice only when
//! a killed worker had it in flight.
//!
//! The server comes from `DURABLE_PG_URL`; without it the test prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test remote_postgres
//! ```
//!
//! It works in a schema of its own (`durable_test_remote_<pid>_<n>_<random>`), dropped at the end
//! (also when it fails).

mod remote_common;

/// Runs started by the test.
const RUNS: usize = 1_000;

use std::time::Duration;

use durable::{Engine, PostgresStore};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};

#[test]
fn two_engines_three_workers_5000_remote_steps_survive_two_sigkills() {
    let test = "two_engines_three_workers_5000_remote_steps_survive_two_sigkills";
    let Some(url) = url_or_skip(test) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let scratch = rt.block_on(ScratchSchema::new(&url, "remote")).expect("a scratch schema");
    let dir = tempfile::tempdir().expect("a temp dir");
    let ledger = dir.path().join("ledger");
    rt.block_on(async {
        let engine = || async {
            // The notify channel makes dispatches NOTIFY the workers' `task_wakeups`.
            let options = scratch.options().notify_channel("durable").pool_size(8);
            let store = PostgresStore::connect_with(scratch.url(), options).await.expect("connect the store");
            Engine::builder().store(store).config(remote_common::config()).build().expect("an engine")
        };
        // The first store creates the schema before the workers connect.
        let engines = [engine().await, engine().await];
        let app = scratch.application_name();
        let ledger_arg = ledger.to_string_lossy().to_string();
        // Leases of 5 s, not 2: a batch of the store's writer that loses a deadlock waits the
        // server's `deadlock_timeout` (1 s) each time, and a worker's result delayed past its
        // lease sends the step to another live worker, a duplicate no kill explains.
        let lease = Duration::from_secs(5);
        remote_common::scenario(
            RUNS,
            [&engines[0], &engines[1]],
            lease,
            &["pg", scratch.url(), scratch.name(), &ledger_arg],
            &[("APP_NAME", &app)],
            &ledger,
        )
        .await;
        for e in &engines {
            tokio::time::timeout(Duration::from_secs(30), e.shutdown()).await.expect("the engines shut down");
        }
    });
    drop(rt);
    drop(scratch);
}
