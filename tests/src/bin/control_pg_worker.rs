//! A worker process for the PostgreSQL control-plane tests: an engine that executes the
//! workflows of `durable_tests::control` on a PostgreSQL schema, with the schema's control plane,
//! until SIGTERM.
//!
//! ```text
//! usage: control_pg_worker <url> <schema> [<nats|redis> <broker-url> <prefix>]
//! prints: ready                          once the engine runs
//!         step <run> <i> <unix_us>       a step of `loop` started
//!         undo <run> <i> <unix_us>       an undo of `loop` ran
//!         stopped <run> <unix_us>        a turn of `loop` ended (its body was dropped)
//! ```
//!
//! With a broker, the control plane (and the run queue) are the broker's, under `prefix`;
//! without, the schema's `LISTEN/NOTIFY` plane.
//!
//! APP_NAME: the connections' application_name (default `durable-control`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable::{Engine, PostgresOptions, PostgresStore};
use durable_tests::broker::Broker;
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
        return Err("usage: control_pg_worker <url> <schema> [<nats|redis> <broker-url> <prefix>]".into());
    };
    let app = std::env::var("APP_NAME").unwrap_or_else(|_| "durable-control".into());
    let options = PostgresOptions::new().schema(schema).pool_size(8).application_name(app);
    let store = PostgresStore::connect_with(url, options).await?;
    let builder = Engine::builder().store(store.clone());
    let builder = match (args.get(2), args.get(3), args.get(4)) {
        (Some(kind), Some(broker_url), Some(prefix)) => {
            let broker = Broker::connect(kind, broker_url, prefix, Duration::from_secs(10)).await?;
            builder.transport(broker.transport.clone()).control_plane(broker.plane.clone())
        }
        _ => builder.control_plane(store.control_plane().await?),
    };
    let engine = builder.config(control::config()).owner(format!("worker-process-{}", std::process::id())).build()?;
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
