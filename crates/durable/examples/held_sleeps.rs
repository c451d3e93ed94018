//! Held sleeps: a workflow that polls an export job every 100 ms until it is ready. With
//! `EngineConfig::hold_sleeps_under` the turn keeps the run and waits in memory at each sleep
//! (one write per sleep) instead of suspending it and claiming it again at every wake; the
//! example runs the same 20 exports with holds off and on and prints the turns each took.
//!
//! ```text
//! cargo run --release -p durable --example held_sleeps
//! ```

use std::time::{Duration, Instant};

use durable::{Engine, EngineConfig, EngineEvent, SqliteStore, StartOptions, WorkflowCtx, WorkflowError};

/// Polls the (simulated) export job until its tenth check says it is ready.
async fn export(ctx: WorkflowCtx, job: u64) -> Result<String, WorkflowError> {
    let mut checks = 0u32;
    loop {
        checks += 1;
        let ready: bool = ctx.step("check", move |_| async move { Ok(checks >= 10) }).await?;
        if ready {
            return Ok(format!("export {job} ready after {checks} checks"));
        }
        // Under `hold_sleeps_under`: held in the turn; otherwise the run suspends.
        ctx.sleep(Duration::from_millis(100)).await;
    }
}

async fn run_exports(hold: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = EngineConfig::default();
    config.hold_sleeps_under = hold;
    let engine = Engine::builder().config(config).store(SqliteStore::open(dir.path().join("exports.db"))?).build()?;
    engine.register("export", 1, export);
    let mut events = engine.subscribe();
    let began = Instant::now();
    let mut ids = Vec::new();
    for job in 0..20u64 {
        ids.push(engine.start("export", &job, StartOptions::id(format!("export-{job}"))).await?.id);
    }
    for id in &ids {
        engine.wait_for_run(id).await?.output::<String>()?;
    }
    let (mut held, mut suspended) = (0, 0);
    while let Ok(event) = events.try_recv() {
        match event {
            EngineEvent::SleepHeld { .. } => held += 1,
            EngineEvent::RunSuspended { .. } => suspended += 1,
            _ => {}
        }
    }
    let m = engine.metrics();
    println!(
        "hold_sleeps_under = {hold:?}: 20 exports x 9 sleeps in {:.2} s, {} turns, {held} sleeps held, {suspended} suspensions",
        began.elapsed().as_secs_f64(),
        m.turns
    );
    engine.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run_exports(Duration::ZERO).await?;
    run_exports(Duration::from_secs(1)).await?;
    Ok(())
}
