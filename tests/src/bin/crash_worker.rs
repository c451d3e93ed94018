//! A worker process for the crash tests: runs one 20-step workflow on a SQLite file, each step
//! appending its step id to a ledger file (the side effect), and prints `committed <seq>` after
//! each step's commit. The tests SIGKILL it at random points and start it again.
//!
//! With `held`, a 50 ms durable sleep follows each step, held in the turn
//! (`EngineConfig::hold_sleeps_under`), and the worker also prints `held <until>` once a hold's
//! commit is applied.
//!
//! With `retries`, each step fails its first two attempts (retried after 100 ms, in memory),
//! the ledger line carries the attempt (`<step id> <attempt>`), and the worker also prints
//! `retrying <seq> <attempt>` once a failed attempt's count is committed.
//!
//! usage: `crash_worker <db> <ledger> [held|retries]`

use std::io::Write;
use std::time::Duration;

use durable::{
    Backoff, Engine, EngineConfig, EngineEvent, SqliteStore, StartOptions, StepError, WorkflowCtx, WorkflowError,
};
use durable_tests::{out, print_events};

const STEPS: u64 = 20;

/// Attempts each step fails with `retries` (the next one succeeds).
const FAILING_ATTEMPTS: u32 = 2;

async fn ledger_workflow(ctx: WorkflowCtx, (ledger, nap, flaky): (String, bool, bool)) -> Result<u64, WorkflowError> {
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
                    let line =
                        if flaky { format!("{} {}\n", s.step_id(), s.attempt()) } else { format!("{}\n", s.step_id()) };
                    // One write: a kill never leaves half a line for the next worker's to join.
                    f.write_all(line.as_bytes())?;
                    // Some work between the side effect and the commit: kills land here too.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if flaky && s.attempt() <= FAILING_ATTEMPTS {
                        return Err(StepError::retryable(format!("attempt {} fails", s.attempt())));
                    }
                    Ok(i)
                }
            })
            .retry(FAILING_ATTEMPTS, Backoff::Fixed(Duration::from_millis(100)))
            .await?;
    }
    Ok(sum)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (db, ledger, mode) = match (args.next(), args.next(), args.next()) {
        (Some(db), Some(ledger), mode) if matches!(mode.as_deref(), None | Some("held" | "retries")) => {
            (db, ledger, mode.unwrap_or_default())
        }
        _ => {
            eprintln!("usage: crash_worker <db> <ledger> [held|retries]");
            std::process::exit(2);
        }
    };
    let (held, flaky) = (mode == "held", mode == "retries");
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
        EngineEvent::StepRetrying { seq, attempt, .. } => out(format_args!("retrying {seq} {attempt}")),
        _ => {}
    }));
    engine.register("ledger", 1, ledger_workflow);
    let run = engine.start("ledger", &(ledger, held, flaky), StartOptions::id("crash-run")).await?;
    let sum: u64 = engine.wait_for_run(&run.id).await?.output()?;
    println!("done {sum}");
    engine.shutdown().await;
    Ok(())
}
