//! The quickstart: a 4-step order workflow with a retrying step and a durable sleep, on the
//! embedded SQLite store, printing the engine's events as they happen.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! README.md's quickstart is this file from `// quickstart:begin` to `// quickstart:end`, line
//! for line: `crates/durable/tests/docs_quickstart.rs` fails when the two differ, so change
//! both together.

// quickstart:begin
use std::time::Duration;

use durable::{Backoff, Engine, EngineEvent, SqliteStore, StartOptions, StepError, WorkflowCtx, WorkflowError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    items: Vec<String>,
    total_cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
    payment: String,
    tracking: String,
}

/// The workflow: a plain async fn. Each step's result is checkpointed before the next line
/// runs, so a crash anywhere resumes here without repeating finished steps.
async fn order_workflow(ctx: WorkflowCtx, order: Order) -> Result<Receipt, WorkflowError> {
    let items = order.items.clone();
    let reserved: usize = ctx
        .step("reserve_stock", move |_| {
            let n = items.len();
            async move { Ok(n) }
        })
        .await?;

    // A flaky payment gateway: the first two attempts time out. The step is retried with
    // exponential backoff; the step id is the idempotency key a real gateway would get.
    let total = order.total_cents;
    let payment: String = ctx
        .step("charge_card", move |s| async move {
            if s.attempt() < 3 {
                return Err(StepError::retryable(format!("gateway timeout (attempt {})", s.attempt())));
            }
            Ok(format!("paid {}.{:02} USD, idempotency key {}", total / 100, total % 100, s.step_id()))
        })
        .retry(3, Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1)))
        .await?;

    // A durable sleep: the run suspends and releases its lease; a timer (or any engine
    // sharing the store, even after a restart) wakes it.
    ctx.sleep(Duration::from_secs(2)).await;

    let order_id = order.id;
    let tracking: String = ctx.step("ship", move |_| async move { Ok(format!("TRACK-{order_id}-{reserved}")) }).await?;
    ctx.step("email_receipt", |_| async { Ok(()) }).await?;
    Ok(Receipt { order_id, payment, tracking })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("durable-quickstart.db");
    let engine = Engine::builder().store(SqliteStore::open(&path)?).build()?;
    engine.register("order", 1, order_workflow);
    let printer = print_events(&engine); // prints the events as they happen (below)

    // A fresh run id each time: starting an id that exists returns that run and does nothing.
    let run_id = format!("order-42-{}", durable::uuid::Uuid::now_v7().simple());
    let order = Order { id: 42, items: vec!["book".into(), "lamp".into()], total_cents: 4_250 };
    let run = engine.start("order", &order, StartOptions::id(run_id)).await?;
    let receipt: Receipt = engine.wait_for_run(&run.id).await?.output()?;
    printer.await?;

    println!("\nreceipt: {receipt:?}\n\nhistory of {}:", run.id);
    for cp in engine.history(&run.id).await? {
        println!("  #{:<2} {:<14} {:<6} {:<10} attempts={}", cp.seq, cp.name, cp.kind, cp.status, cp.attempts);
    }
    engine.shutdown().await;
    Ok(())
}

/// Prints the engine's events, with the time since the start, until the run settles.
fn print_events(engine: &Engine) -> tokio::task::JoinHandle<()> {
    let mut events = engine.subscribe();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        while let Ok(event) = events.recv().await {
            if let Some(line) = describe(&event) {
                println!("[{:>6.3}s] {line}", started.elapsed().as_secs_f64());
            }
            if matches!(event, EngineEvent::RunSettled { .. }) {
                break;
            }
        }
    })
}

fn describe(event: &EngineEvent) -> Option<String> {
    Some(match event {
        EngineEvent::RunCreated { run_id, workflow } => format!("created   {run_id} ({workflow})"),
        EngineEvent::TurnStarted { .. } => "turn      lease taken".to_string(),
        EngineEvent::StepCompleted { seq, name, attempts, .. } => {
            format!("step      #{seq} {name} completed after {attempts} attempt(s) — checkpointed")
        }
        EngineEvent::StepRetrying { seq, name, attempt, error, .. } => {
            format!("retry     #{seq} {name} attempt {attempt} failed: {}", error.message)
        }
        EngineEvent::StepFailed { seq, name, error, .. } => format!("failed    #{seq} {name}: {}", error.message),
        EngineEvent::RunSuspended { wake_at, .. } => match wake_at {
            Some(_) => "suspended sleeping; lease released".to_string(),
            None => "suspended waiting for a delivery".to_string(),
        },
        EngineEvent::RunSettled { status, .. } => format!("settled   {status}"),
        _ => return None,
    })
}
// quickstart:end
