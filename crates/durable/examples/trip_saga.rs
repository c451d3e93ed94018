//! A trip booking saga: book a flight, a hotel and a car; the car rental fails, so the hotel
//! and the flight are refunded — newest first — and the run ends `failed` with the car's
//! error. Each booking and each refund is its own checkpointed step: a crash in the middle of
//! the refunds resumes the remaining ones and never refunds twice.
//!
//! ```text
//! cargo run --release --example trip_saga
//! ```

use durable::{Engine, EngineEvent, SqliteStore, StartOptions, StepError, WorkflowCtx, WorkflowError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Booking {
    what: String,
    reference: String,
}

async fn book(what: &str, step_id: String) -> Result<Booking, StepError> {
    if what == "car" {
        return Err(StepError::fatal("no cars left at the airport").with_code("sold_out"));
    }
    println!("  booked {what:<6} (idempotency key {step_id})");
    Ok(Booking { what: what.to_string(), reference: format!("{}-{}", what.to_uppercase(), step_id.len()) })
}

async fn refund(booking: Booking) -> Result<(), StepError> {
    println!("  refunded {} ({})", booking.what, booking.reference);
    Ok(())
}

async fn trip(ctx: WorkflowCtx, traveller: String) -> Result<String, WorkflowError> {
    let mut booked = Vec::new();
    for what in ["flight", "hotel", "car"] {
        let booking = ctx.step(what, move |s| book(what, s.step_id())).compensate(refund).await?;
        booked.push(booking.reference);
    }
    Ok(format!("{traveller}'s trip: {}", booked.join(", ")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("durable-trip-{}.db", durable::uuid::Uuid::now_v7().simple()));
    let engine = Engine::builder().store(SqliteStore::open(&path)?).build()?;
    engine.register("trip", 1, trip);
    let mut events = engine.subscribe();

    println!("booking a trip for ada:");
    let run = engine.start("trip", &"ada", StartOptions::id("trip-ada")).await?;
    let outcome = engine.wait_for_run(&run.id).await?;
    while let Ok(event) = events.try_recv() {
        if let EngineEvent::StepFailed { name, error, .. } = event {
            println!("  step {name:?} failed: {}", error.message);
        }
    }
    println!(
        "\nrun {} is {}: {}",
        run.id,
        outcome.status(),
        outcome.error().map(|e| e.to_string()).unwrap_or_default()
    );
    println!("\nits history:");
    for cp in engine.history(&run.id).await? {
        println!("  #{} {:<12} {:<12} {}", cp.seq, cp.name, cp.kind, cp.status);
    }
    engine.shutdown().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}
