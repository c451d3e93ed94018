//! A worker process for the flow-control tests (`tests/flow_sqlite.rs`, `tests/flow_postgres.rs`),
//! built the way users build theirs: an engine on the shared store that registers the
//! workflows with their concurrency keys and step queues and runs until SIGTERM.
//!
//! ```text
//! usage:
//!   flow_worker sqlite <db> <ledger>
//!   flow_worker pg <url> <schema> <ledger>
//! ```
//!
//! Workflows (see `durable_tests::flow::register`):
//! - `keyed` (input `{key, n}`, at most 2 runs per key at once): one step that appends
//!   `start <key> <run> <unix_us> <pid> <attempt>` to the ledger, works WORK_MS (default 5)
//!   milliseconds, and appends `end <key> <run> <unix_us>`.
//! - `rated` (input `n`): 4 steps through the queue `api` (10 per second), each appending
//!   `call <run> <seq> <admitted_at_ms>`.
//! - `hog` (input `n`): one step through the queue `solo` (1 at once) that appends
//!   `hold <run> <pid>` and then, when HOG=1, never finishes (the test SIGKILLs the process).
//!
//! The ledger is opened with `O_APPEND` and each line is one `write`: lines of concurrent
//! processes never interleave. The worker prints `ready <owner>` once it runs.

use std::sync::Arc;

use durable::{Engine, PostgresOptions, PostgresStore, SqliteStore};
use durable_tests::flow::{config, register};
use durable_tests::out;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flow_worker: {}", e.to_string().replace('\n', " "));
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (builder, ledger) = match args.as_slice() {
        ["sqlite", db, ledger] => (Engine::builder().shared_store(Arc::new(SqliteStore::open(db)?)), *ledger),
        ["pg", url, schema, ledger] => {
            let app = std::env::var("APP_NAME").unwrap_or_else(|_| "durable-flow".into());
            let options = PostgresOptions::new().schema(*schema).pool_size(4).application_name(app);
            (Engine::builder().store(PostgresStore::connect_with(url, options).await?), *ledger)
        }
        _ => return Err("usage: flow_worker sqlite <db> <ledger> | pg <url> <schema> <ledger>".into()),
    };
    let ledger = Arc::new(std::fs::OpenOptions::new().create(true).append(true).open(ledger)?);
    let engine = builder.config(config()).build()?;
    register(&engine, Some(ledger));
    out(format_args!("ready {}", engine.owner()));
    engine.run_worker(durable::shutdown_signal()).await;
    Ok(())
}
