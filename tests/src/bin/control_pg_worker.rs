//! A worker process for the PostgreSQL control-plane tests: an engine that executes the
//! workflows of `durable_tests::control` on a PostgreSQL schema, with the schema's control plane,
//! until SIGTERM.
//!
//! ```text
//! usage: control_pg_worker <url> <schema>
//! prints: ready                          once the engine runs
//!         step <run> <i> <unix_us>       a step of `loop` started
//!         undo <run> <i> <unix_us>       an undo of `loop` ran
//!         stopped <run> <unix_us>        a turn of `loop` ended (its body was dropped)
//! ```
//!
//! APP_NAME: the connections' application_name (default `durable-control`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use durable::{Engine, PostgresOptions, PostgresStore};
use durable_tests::control::{self, Report};
use durable_tests::out;

fn unix_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("control_pg_worker: {}", e.to_string().replace('\n', " "));
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(schema)) = (args.first(), args.get(1)) else {
        return Err("usage: control_pg_worker <url> <schema>".into());
    };
    let app = std::env::var("APP_NAME").unwrap_or_else(|_| "durable-control".into());
    let options = PostgresOptions::new().schema(schema).pool_size(8).application_name(app);
    let store = PostgresStore::connect_with(url, options).await?;
    let plane = store.control_plane().await?;
    let engine = Engine::builder()
        .store(store)
        .config(control::config())
        .owner(format!("worker-process-{}", std::process::id()))
        .control_plane(plane)
        .build()?;
    control::register(
        &engine,
        Arc::new(|report| match report {
            Report::Step(run, i) => out(format_args!("step {run} {i} {}", unix_us())),
            Report::Undo(run, i) => out(format_args!("undo {run} {i} {}", unix_us())),
            Report::Stopped(run) => out(format_args!("stopped {run} {}", unix_us())),
        }),
    );
    out(format_args!("ready"));
    engine.run_worker(durable::shutdown_signal()).await;
    Ok(())
}
