//! A worker process for the fleet tests, built the way users build theirs: it embeds the
//! workflow code, opens the shared SQLite file, and runs `Engine::run_worker` until SIGTERM.
//!
//! ```text
//! usage:
//!   fleet_worker <db> work [step_ms]   execute `fleet` runs; print `committed <run> <seq>` per step
//!                                      and `recovered <run>` per turn that took over an expired
//!                                      lease (DRAIN_MS: the drain timeout on SIGTERM, default 5000)
//!   fleet_worker <db> start <n>        (a client) start n `fleet` runs and wait for all of them
//!   fleet_worker <db> burst <n>        (a client) as `start`, all n in one `start_many` (a burst)
//!   fleet_worker <db> poison <marker>  start `poison` (it kills its process at step 2) and work;
//!                                      on_dead appends the run id to <marker>
//! ```

use std::io::Write;
use std::time::Duration;

use durable::{
    Engine, EngineConfig, EngineEvent, QueueTransport, RunStatus, SqliteStore, StartOptions, WorkflowCtx, WorkflowError,
};
use durable_tests::{out, print_events};

const STEPS: u32 = 10;

fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.lease_ttl = Duration::from_secs(2);
    config.poll_interval = Duration::from_millis(100);
    config.orphan_poll_interval = Duration::from_millis(250);
    config.wait_poll_interval = Duration::from_millis(25);
    config.recheck_interval = Duration::from_millis(200);
    config.max_recovery_attempts = 3;
    let drain_ms = std::env::var("DRAIN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    config.drain_timeout = Duration::from_millis(drain_ms);
    config
}

async fn fleet(ctx: WorkflowCtx, step_ms: u64) -> Result<u32, WorkflowError> {
    let mut sum = 0;
    for i in 0..STEPS {
        sum += ctx
            .step(format!("s{i}"), move |_| async move {
                if step_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(step_ms)).await;
                }
                Ok(i)
            })
            .await?;
        if i == STEPS / 2 {
            ctx.sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(sum)
}

async fn poison(ctx: WorkflowCtx, _: ()) -> Result<(), WorkflowError> {
    ctx.step("before", |_| async { Ok(()) }).await?;
    ctx.step("boom", |_| async {
        // The worker dies here every time: a poison run.
        let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        std::future::pending::<Result<(), durable::StepError>>().await
    })
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (db, mode) = match (args.first(), args.get(1)) {
        (Some(db), Some(mode)) => (db.clone(), mode.clone()),
        _ => {
            eprintln!("usage: fleet_worker <db> work [step_ms] | start <n> | burst <n> | poison <marker>");
            std::process::exit(2);
        }
    };
    let store = std::sync::Arc::new(SqliteStore::open(&db)?);
    let transport = QueueTransport::new(store.clone()).poll_interval(Duration::from_millis(20));
    let builder = Engine::builder().shared_store(store).transport(transport).config(config());
    match mode.as_str() {
        "start" | "burst" => {
            let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100);
            let engine = builder.client_only().build()?;
            engine.register("fleet", 1, fleet);
            let ids: Vec<_> = if mode == "burst" {
                let runs = (0..n).map(|i| ("fleet", 0u64, StartOptions::id(format!("fleet-{i}"))));
                engine.start_many(runs).await?.into_iter().map(|s| s.id).collect()
            } else {
                let mut ids = Vec::with_capacity(n);
                for i in 0..n {
                    ids.push(engine.start("fleet", &0u64, StartOptions::id(format!("fleet-{i}"))).await?.id);
                }
                ids
            };
            out(format_args!("started {n}"));
            for id in ids {
                let outcome = engine.wait_for_run(&id).await?;
                if outcome.status() != RunStatus::Completed {
                    out(format_args!("not completed {id} {}", outcome.status()));
                }
            }
            engine.shutdown().await;
            out(format_args!("all done"));
        }
        "work" => {
            let step_ms: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
            let engine = builder.build()?;
            tokio::spawn(print_events(engine.subscribe(), |event| match event {
                EngineEvent::StepCompleted { run_id, seq, .. } => out(format_args!("committed {run_id} {seq}")),
                EngineEvent::TurnStarted { run_id, recovered: true } => out(format_args!("recovered {run_id}")),
                _ => {}
            }));
            engine.register("fleet", 1, move |ctx: WorkflowCtx, _: u64| fleet(ctx, step_ms));
            out(format_args!("ready {}", engine.owner()));
            let in_time = engine.run_worker(durable::shutdown_signal()).await;
            out(format_args!("drained in_time={in_time}"));
        }
        "poison" => {
            let marker = args.get(2).cloned().ok_or("poison needs a marker file")?;
            let engine = builder.build()?;
            engine.on_dead(move |run| {
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&marker).expect("marker");
                let _ = writeln!(f, "{} {}", run.id, run.recovery_attempts);
            });
            engine.register("poison", 1, poison);
            let run = engine.start("poison", &(), StartOptions::id("poison-run")).await?;
            let outcome = engine.wait_for_run(&run.id).await?;
            out(format_args!("settled {}", outcome.status()));
            engine.shutdown().await;
        }
        other => {
            eprintln!("unknown mode {other:?}");
            std::process::exit(2);
        }
    }
    Ok(())
}
