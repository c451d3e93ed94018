//! A worker process for the crash tests: runs one 20-step workflow on a SQLite file, each step
//! appending its step id to a ledger file (the side effect), and prints `committed <seq>` after
//! each step's commit. The tests SIGKILL it at random points and start it again.
//!
//! With `held`, a 50 ms durable sleep follows each step, held in the turn
//! (`EngineConfig::hold_sleeps_under`), and the worker also prints `held <until>` once a hold's
//! commit is applied.
//!
//! usage: `crash_worker <db> <ledger> [held]`

use std::io::Write;
use std::time::Duration;

use durable::{Engine, EngineConfig, EngineEvent, SqliteStore, StartOptions, WorkflowCtx, WorkflowError};
use durable_tests::{out, print_events};

const STEPS: u64 = 20;

async fn ledger_workflow(ctx: WorkflowCtx, (ledger, nap): (String, bool)) -> Result<u64, WorkflowError> {
    let mut sum = 0;
    for i in 0..STEPS {
        if nap && i > 0 {
            ctx.sleep(Duration::from_millis(50)).await;
        }
        let ledger = ledger.clone();
        sum += ctx
            .step(format!("step{i}"), move |s| {
                let ledger = ledger.clone();
                async move {
                    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&ledger)?;
                    writeln!(f, "{}", s.step_id())?;
                    // Some work between the side effect and the commit: kills land here too.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok(i)
                }
            })
            .await?;
    }
    Ok(sum)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (db, ledger, held) = match (args.next(), args.next(), args.next().as_deref()) {
        (Some(db), Some(ledger), None) => (db, ledger, false),
        (Some(db), Some(ledger), Some("held")) => (db, ledger, true),
        _ => {
            eprintln!("usage: crash_worker <db> <ledger> [held]");
            std::process::exit(2);
        }
    };
    let mut config = EngineConfig::default();
    // A killed worker's lease must expire quickly for the next one to recover the run.
    config.lease_ttl = Duration::from_secs(1);
    config.poll_interval = Duration::from_millis(50);
    config.orphan_poll_interval = Duration::from_millis(100);
    if held {
        config.hold_sleeps_under = Duration::from_millis(500);
    }
    let engine = Engine::builder().store(SqliteStore::open(&db)?).config(config).build()?;
    tokio::spawn(print_events(engine.subscribe(), |event| match event {
        EngineEvent::StepCompleted { seq, .. } => out(format_args!("committed {seq}")),
        EngineEvent::SleepHeld { until, .. } => out(format_args!("held {until}")),
        _ => {}
    }));
    engine.register("ledger", 1, ledger_workflow);
    let run = engine.start("ledger", &(ledger, held), StartOptions::id("crash-run")).await?;
    let sum: u64 = engine.wait_for_run(&run.id).await?.output()?;
    println!("done {sum}");
    engine.shutdown().await;
    Ok(())
}
