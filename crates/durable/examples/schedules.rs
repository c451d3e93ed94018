//! Things that start runs: a weekday-morning report on a cron schedule in Paris time, an
//! order-events batcher, and a reminder that starts in 30 days.
//!
//! The engine runs on a virtual clock here so that a week (and a month) pass in a moment, as
//! they would in a test; with the default clock the same code fires at the real times. The
//! schedule, the gathered events and the delayed start are all stored in the SQLite file, so
//! any engine on it fires them, and a restart loses none.
//!
//! ```text
//! cargo run --example schedules
//! ```

use std::time::Duration;

use durable::{
    Clock, Engine, EngineEvent, Overlap, RunFilter, Schedule, SqliteStore, StartOptions, VirtualClock, WorkflowCtx,
    WorkflowError, WorkflowOptions,
};
use serde_json::json;

/// Monday 30 November 2026, 06:00 UTC.
const MONDAY_MORNING: u64 = 1_796_018_400_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = VirtualClock::new(MONDAY_MORNING);
    let engine =
        Engine::builder().store(SqliteStore::open(dir.path().join("durable.db"))?).clock(clock.clone()).build()?;

    // 1. A report every weekday at 09:00 in Paris; a report still running when the next is
    //    due makes that one skip.
    engine.register("report", 1, |ctx: WorkflowCtx, kind: String| async move {
        let now = ctx.now().await.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Ok::<_, WorkflowError>(format!("{kind} report of {}", paris(now.as_millis() as u64)))
    });
    let weekday_mornings = Schedule::cron("0 9 * * MON-FRI").timezone("Europe/Paris").overlap(Overlap::Skip);
    let record = engine.schedule("morning-report", weekday_mornings, "report", &"sales").await?;
    println!("schedule {:?} stored; the next fires:", record.key);
    let upcoming = record.schedule.upcoming(clock.now(), 5)?;
    for at in &upcoming {
        println!("  {}", paris(*at));
    }
    // Fast-forward a week, one fire at a time.
    let mut events = engine.subscribe();
    for at in upcoming {
        clock.set(at);
        loop {
            if let EngineEvent::ScheduleAdvanced { key, fired, .. } = events.recv().await?
                && key == "morning-report"
            {
                for id in fired {
                    let out: String = engine.wait_for_run(&id).await?.output()?;
                    println!("  {id} -> {out}");
                }
                break;
            }
        }
    }

    // 2. Paid orders shipped in batches of up to 10, or 5 s after the first of a batch.
    engine.register_with(
        "ship-orders",
        1,
        WorkflowOptions::default().on_event("order.paid", json!({})).batch(10, Duration::from_secs(5)),
        |_ctx: WorkflowCtx, orders: Vec<u64>| async move { Ok::<_, WorkflowError>(orders.len()) },
    );
    for order in 1..=25u64 {
        engine.publish_event("order.paid", &order).await?;
    }
    clock.advance(Duration::from_secs(5));
    let filter = RunFilter { workflow: Some("ship-orders".into()), ..Default::default() };
    let mut shipped = 0;
    while shipped < 25 {
        shipped = 0;
        for run in engine.list_runs(&filter).await?.runs {
            shipped += engine.wait_for_run(&run.id).await?.output::<usize>()?;
        }
    }
    let batches = engine.list_runs(&filter).await?.runs.len();
    println!("25 paid orders shipped in {batches} batches");

    // 3. A reminder in 30 days: pending until then, one durable timer.
    engine.register("remind", 1, |_ctx: WorkflowCtx, who: String| async move {
        Ok::<_, WorkflowError>(format!("reminded {who}"))
    });
    let month = Duration::from_secs(30 * 86_400);
    let started = engine.start("remind", &"ada", StartOptions::id("reminder").delay(month)).await?;
    let waiting = engine.get_run(&started.id).await?.expect("stored");
    println!("run {} is {} until {}", waiting.id, waiting.status, paris(waiting.wake_at.unwrap_or_default()));
    clock.advance(month);
    let out: String = engine.wait_for_run(&started.id).await?.output()?;
    println!("30 days later: {out}");
    engine.shutdown().await;
    Ok(())
}

/// An epoch-ms time in Paris.
fn paris(at: u64) -> String {
    let utc = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(at as i64).unwrap_or_default();
    utc.with_timezone(&chrono_tz::Europe::Paris).format("%a %d %b %Y %H:%M %Z").to_string()
}
