//! Checking replay before you deploy: an order run is parked waiting for a signal; its history
//! is exported as JSON (what `durable runs export <id> --out …` writes), then replayed against
//! three versions of the code — the one that wrote it, a version that swapped two steps (it
//! would break the run: the check names the seq and both calls), and a version that adds a step
//! behind `ctx.patched` (safe). Nothing executes during the checks: the step closures print
//! when they run, and only the first run prints.
//!
//! In a real project the export is committed under `tests/fixtures/replay/` and a test calls
//! `durable::testing::replay::assert_replayable_dir(register, "tests/fixtures/replay")`.
//!
//! ```text
//! cargo run --example replay_check
//! ```

use durable::testing::replay::{HistoryExport, check_replayable};
use durable::{Engine, RunStatus, SqliteStore, StartOptions, WorkflowCtx, WorkflowError};

/// Which version of the workflow code.
#[derive(Debug, Clone, Copy)]
enum Code {
    /// The code that is deployed: reserve, charge, wait for the warehouse, ship.
    Deployed,
    /// A refactor that charges before it reserves.
    Swapped,
    /// A fraud check added after the charge, behind a patch.
    Patched,
}

fn register(engine: &Engine, code: Code) {
    engine.register("order", 1, move |ctx: WorkflowCtx, order_id: u64| async move {
        let step = |name: &'static str| {
            ctx.step(name, move |_| async move {
                println!("    executing step {name:?}");
                Ok(format!("{name}-{order_id}"))
            })
        };
        let (first, second) = match code {
            Code::Swapped => ("charge", "reserve"),
            Code::Deployed | Code::Patched => ("reserve", "charge"),
        };
        step(first).await?;
        step(second).await?;
        if matches!(code, Code::Patched) && ctx.patched("fraud-check") {
            step("fraud_check").await?;
        }
        let _: String = ctx.wait_for_signal(&format!("picked:{order_id}")).await?;
        let shipped: String = step("ship").await?;
        Ok::<_, WorkflowError>(shipped)
    });
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("durable-replay-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let engine = Engine::builder().store(SqliteStore::open(dir.join("app.db"))?).build()?;
    register(&engine, Code::Deployed);

    println!("running order 7 with the deployed code:");
    let run = engine.start("order", &7u64, StartOptions::id("order-7")).await?;
    let parked = engine.wait_until_suspended_or_terminal(&run.id).await?;
    assert_eq!(parked.status(), RunStatus::Suspended);

    // Export the parked run, as `durable runs export order-7 --out …` does, and read it back.
    let file = dir.join("order-7.json");
    std::fs::write(&file, engine.export_history(&run.id).await?.to_json()? + "\n")?;
    let history = HistoryExport::from_json(&std::fs::read_to_string(&file)?)?;
    println!("exported {} ({} checkpoints) to {}\n", history.run.id, history.checkpoints.len(), file.display());
    engine.shutdown().await;

    for code in [Code::Deployed, Code::Swapped, Code::Patched] {
        match check_replayable(|e: &Engine| register(e, code), &history).await {
            Ok(replayed) => println!("{code:?} code: replays ({replayed:?})"),
            Err(e) => println!("{code:?} code: would break the run:\n  {e}"),
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
