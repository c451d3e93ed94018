//! Flow control across processes on PostgreSQL (`src/bin/flow_worker.rs`): concurrency keys
//! and a SIGKILLed slot holder. See `flow_common`.
//!
//! The server comes from `DURABLE_PG_URL`; without it each test prints one skip line and
//! passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test flow_postgres
//! ```
//!
//! Each test works in a schema of its own, dropped at the end (also when it fails).

mod flow_common;

use std::path::Path;

use durable::{Engine, PostgresStore};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
use durable_tests::flow::{config, register};

type Scenario = for<'a> fn(
    &'a Engine,
    &'a [&'a str],
    &'a [(&'a str, &'a str)],
    &'a Path,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

fn on_postgres(test: &str, scenario: Scenario) {
    let Some(url) = url_or_skip(test) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let scratch = rt.block_on(ScratchSchema::new(&url, "flow")).expect("a scratch schema");
    let dir = tempfile::tempdir().expect("a temp dir");
    let ledger = dir.path().join("ledger");
    rt.block_on(async {
        let store = PostgresStore::connect_with(scratch.url(), scratch.options().pool_size(4)).await.expect("connect");
        let client = Engine::builder().store(store).config(config()).client_only().build().expect("an engine");
        register(&client, None);
        let app = scratch.application_name();
        let ledger_arg = ledger.to_string_lossy().to_string();
        let args = ["pg", scratch.url(), scratch.name(), &ledger_arg];
        scenario(&client, &args, &[("APP_NAME", &app)], &ledger).await;
        client.shutdown().await;
    });
    drop(rt);
    drop(scratch);
}

#[test]
fn three_processes_300_keyed_runs_never_exceed_2_per_key() {
    on_postgres("three_processes_300_keyed_runs_never_exceed_2_per_key", |c, a, e, l| {
        Box::pin(flow_common::three_processes_keyed_runs(c, a, e, l))
    });
}

#[test]
fn a_sigkilled_holders_slot_is_reclaimed_after_the_lease() {
    on_postgres("a_sigkilled_holders_slot_is_reclaimed_after_the_lease", |c, a, e, l| {
        Box::pin(flow_common::sigkilled_holder(c, a, e, l))
    });
}

#[test]
fn a_queue_of_10_per_second_holds_across_processes_for_20_seconds() {
    on_postgres("a_queue_of_10_per_second_holds_across_processes_for_20_seconds", |c, a, e, l| {
        Box::pin(flow_common::rate_limited_queue(c, a, e, l))
    });
}
