//! Fleets on a message broker, with the state in PostgreSQL: three worker processes
//! (`src/bin/remote_worker.rs` in `broker` mode: an engine executing runs from the broker's run
//! queue, and a remote-step worker, sharing the broker's control plane) run 2,000 runs of five
//! remote steps each while two of them are SIGKILLed; two client engines in this process start
//! the runs through the broker and wait for them. Every run completes with its output; the
//! ledger shows no lost step, and a step started twice only when a killed worker had it in
//! flight. Once over NATS, once over Redis.
//!
//! The servers come from `DURABLE_PG_URL`, `DURABLE_NATS_URL` and `DURABLE_REDIS_URL`; without
//! one, its test prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test DURABLE_NATS_URL=nats://127.0.0.1:4222 \
//!   DURABLE_REDIS_URL=redis://127.0.0.1:6379 cargo test -p durable-tests --test broker_fleet
//! ```
//!
//! Each test works in a PostgreSQL schema and under a broker prefix of its own, both removed at
//! the end.

mod remote_common;

use std::time::Duration;

use durable::{Engine, PostgresStore};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
use durable_tests::broker::Broker;

/// Runs started by each test.
const RUNS: usize = 2_000;

fn fleet(test: &str, kind: &str, broker_url: Option<String>) {
    let Some(pg) = url_or_skip(test) else { return };
    let Some(broker_url) = broker_url else { return };
    // One fleet at a time: two would share the machine's cores and the database.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let scratch = rt.block_on(ScratchSchema::new(&pg, "broker")).expect("a scratch schema");
    let dir = tempfile::tempdir().expect("a temp dir");
    let ledger = dir.path().join("ledger");
    let prefix = durable_transport_nats::test_support::unique_prefix("fleet");
    rt.block_on(async {
        let broker = Broker::connect(kind, &broker_url, &prefix, Duration::from_secs(10)).await.expect("the broker");
        let client = || async {
            let store = PostgresStore::connect_with(scratch.url(), scratch.options().pool_size(4))
                .await
                .expect("connect the store");
            Engine::builder()
                .store(store)
                .transport(broker.transport.clone())
                .control_plane(broker.plane.clone())
                .config(remote_common::config())
                .client_only()
                .build()
                .expect("a client engine")
        };
        // The first store creates the schema before the workers connect.
        let clients = [client().await, client().await];
        let ledger_arg = ledger.to_string_lossy().to_string();
        let lease = Duration::from_secs(5);
        remote_common::scenario(
            RUNS,
            [&clients[0], &clients[1]],
            lease,
            &["broker", kind, &broker_url, &prefix, scratch.url(), scratch.name(), &ledger_arg],
            &[],
            &ledger,
        )
        .await;
        for e in &clients {
            tokio::time::timeout(Duration::from_secs(30), e.shutdown()).await.expect("the clients shut down");
        }
        broker.destroy().await.expect("remove the broker's stream or keys");
    });
    drop(rt);
    drop(scratch);
}

#[test]
fn nats_three_worker_processes_2000_runs_survive_two_sigkills() {
    let test = "nats_three_worker_processes_2000_runs_survive_two_sigkills";
    fleet(test, "nats", durable_transport_nats::test_support::url_or_skip(test));
}

#[test]
fn redis_three_worker_processes_2000_runs_survive_two_sigkills() {
    let test = "redis_three_worker_processes_2000_runs_survive_two_sigkills";
    fleet(test, "redis", durable_transport_redis::test_support::url_or_skip(test));
}
