//! A worker process for the remote-step tests (`tests/remote_sqlite.rs`, `tests/remote_postgres.rs`),
//! built the way users build theirs: a [`Worker`] without an engine, on the store the engines
//! write to, serving the remote step `work` until SIGTERM.
//!
//! ```text
//! usage:
//!   remote_worker sqlite <db> <ledger>
//!   remote_worker pg <url> <schema> <ledger>
//!   remote_worker broker <nats|redis> <broker-url> <prefix> <pg-url> <schema> <ledger>
//! ```
//!
//! In `broker` mode the process is a whole fleet member: beside the worker it runs an engine
//! that executes `remote5` runs (`durable_tests::remote`), taking starts and wakes from the
//! broker's run queue, and both share the broker's control plane (task nudges, cancels,
//! events); the state is in PostgreSQL.
//!
//! The handler of `work` appends `start <step_id> <attempt> <pid> <unix_ms>` to the ledger file, works for
//! WORK_MS (default 3) milliseconds, appends `done <step_id> <attempt> <pid> <unix_ms>`, prints
//! `done <step_id>` to stdout and returns `work(input)` (`2 * input + 1`). The ledger is opened
//! with `O_APPEND` and each line is one `write`: lines of concurrent processes never interleave.
//! The worker prints `ready <id>` once it runs and `report <claimed> <completed> <dropped>
//! <handed_back>` when SIGTERM has drained it.
//!
//! Settings from the environment: CONCURRENCY (tasks at once, default 16), POLL_MS (the idle
//! poll: default 20 on SQLite, 250 on PostgreSQL where `task_wakeups` wakes it), APP_NAME (the
//! PostgreSQL connections' application_name, default `durable-remote`).

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use durable::{Engine, EngineConfig, PostgresOptions, PostgresStore, SqliteStore, StepError, TaskContext, Worker};
use durable_tests::broker::Broker;
use durable_tests::out;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// Appends one line with one `write` (the file is in append mode, so it lands whole at the end).
fn append(ledger: &File, line: String) {
    let mut f = ledger;
    f.write_all(line.as_bytes()).expect("append to the ledger");
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remote_worker: {}", e.to_string().replace('\n', " "));
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let builder = Worker::builder();
    let mut engine = None;
    let (builder, ledger, poll_ms) = match args.as_slice() {
        ["sqlite", db, ledger] => {
            let store: Arc<dyn durable::store::Store> = Arc::new(SqliteStore::open(db)?);
            (builder.store(store), *ledger, 20)
        }
        ["pg", url, schema, ledger] => {
            let app = std::env::var("APP_NAME").unwrap_or_else(|_| "durable-remote".into());
            let options =
                PostgresOptions::new().schema(*schema).pool_size(4).application_name(app).notify_channel("durable");
            let store = PostgresStore::connect_with(url, options).await?;
            let wakeups = store.task_wakeups().await?;
            (builder.store(Arc::new(store)).wakeups(wakeups), *ledger, 250)
        }
        ["broker", kind, broker_url, prefix, url, schema, ledger] => {
            let options = PostgresOptions::new().schema(*schema).pool_size(4).application_name("durable-broker");
            let store = PostgresStore::connect_with(url, options).await?;
            let broker = Broker::connect(kind, broker_url, prefix, Duration::from_secs(10)).await?;
            let mut config = EngineConfig::default();
            config.poll_interval = Duration::from_millis(100);
            config.orphan_poll_interval = Duration::from_millis(250);
            config.lease_ttl = Duration::from_secs(5);
            let e = Engine::builder()
                .store(store.clone())
                .transport(broker.transport.clone())
                .control_plane(broker.plane.clone())
                .config(config)
                .build()?;
            durable_tests::remote::register(&e, Duration::from_secs(5));
            // `.engine(&e)`: results wake runs in this process at once, the plane is the engine's.
            let builder = builder.store(Arc::new(store)).engine(&e).transport(broker.transport.clone());
            engine = Some(e);
            (builder, *ledger, 1000)
        }
        _ => {
            return Err(
                "usage: remote_worker sqlite <db> <ledger> | pg <url> <schema> <ledger> | broker <nats|redis> \
                        <broker-url> <prefix> <pg-url> <schema> <ledger>"
                    .into(),
            );
        }
    };
    let ledger = Arc::new(std::fs::OpenOptions::new().create(true).append(true).open(ledger)?);
    let work = Duration::from_millis(env_u64("WORK_MS", 3));
    let pid = std::process::id();
    let worker = builder
        .handle("work", move |ctx: TaskContext, n: u64| {
            let ledger = ledger.clone();
            async move {
                let step_id = ctx.step_id();
                append(&ledger, format!("start {step_id} {} {pid} {}\n", ctx.attempt(), unix_ms()));
                // The simulated work.
                tokio::time::sleep(work).await;
                append(&ledger, format!("done {step_id} {} {pid} {}\n", ctx.attempt(), unix_ms()));
                out(format_args!("done {step_id}"));
                Ok::<_, StepError>(2 * n + 1)
            }
        })
        .concurrency(env_u64("CONCURRENCY", 16) as usize)
        .poll_interval(Duration::from_millis(env_u64("POLL_MS", poll_ms)))
        .build();
    out(format_args!("ready {}", worker.id()));
    let executing = engine.clone().map(|e| tokio::spawn(async move { e.run_worker(durable::shutdown_signal()).await }));
    let r = worker.run(durable::shutdown_signal()).await;
    if let Some(task) = executing {
        task.await?;
    }
    out(format_args!("report {} {} {} {}", r.claimed, r.completed, r.dropped, r.handed_back));
    Ok(())
}
