//! A worker process for the schedule and event-trigger tests (tests/tests/schedules_sqlite.rs
//! and tests/tests/triggers_sqlite.rs), on a shared SQLite file and the real clock.
//!
//! ```text
//! usage:
//!   schedule_worker <db> fire
//!       declare schedule `tick` (every 1 s, workflow `tick`; idempotent) and work until
//!       SIGTERM; print `ready <owner>` once declared, then `fired <fire-ms> <now-ms>` for each
//!       fire this engine's scheduler started (from its `ScheduleAdvanced` events)
//!   schedule_worker <db> publish <n>
//!       (a client) for i in 0..n: publish `cart` {"n": i} and `order` i, each with a dedupe
//!       id, printing `publishing <event> <i>` before and `acked <event> <i>` once each
//!       publish returned; after each order, wait for a line on stdin before going on
//!   schedule_worker <db> finish <order-from> <cart-from> <n>
//!       (a client) publish the rest (orders order-from..n, carts cart-from..n, same dedupe ids:
//!       one another process stored unacknowledged is a duplicate, printed `duplicate <event>
//!       <i>`); print `published`; then execute: print `settled <run> <status>` per run settled
//!       here and `done` once no trigger buffer is open and every `bulk`/`settle` run is
//!       finished
//! ```
//!
//! `bulk` gathers `order` events in batches (10 items or 5 s), `settle` debounces `cart`
//! events (1 s of quiet); both return their input.

use std::sync::Arc;
use std::time::Duration;

use durable::store::{DueQuery, Store};
use durable::{
    Engine, EngineConfig, EngineEvent, PublishOptions, RunFilter, Schedule, SqliteStore, WorkflowCtx, WorkflowError,
    WorkflowOptions,
};
use durable_tests::out;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.lease_ttl = Duration::from_secs(2);
    config.poll_interval = Duration::from_millis(100);
    config.orphan_poll_interval = Duration::from_millis(250);
    config.wait_poll_interval = Duration::from_millis(25);
    config.drain_timeout = Duration::from_secs(2);
    config
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// The two gathering triggers, on any engine of the trigger test.
fn register_triggers(engine: &Engine) {
    engine.register_with(
        "bulk",
        1,
        WorkflowOptions::default().on_event("order", json!({})).batch(10, Duration::from_secs(5)),
        |_ctx: WorkflowCtx, orders: Vec<u32>| async move { Ok::<_, WorkflowError>(orders) },
    );
    engine.register_with(
        "settle",
        1,
        WorkflowOptions::default().on_event("cart", json!({})).debounce(Duration::from_secs(1)),
        |_ctx: WorkflowCtx, last: serde_json::Value| async move { Ok::<_, WorkflowError>(last) },
    );
}

/// Publishes `cart` i with its dedupe id; returns whether it was new.
async fn publish_cart(engine: &Engine, i: u32) -> Result<bool, durable::Error> {
    let p = engine.publish("cart", &json!({ "n": i }), PublishOptions::dedupe(format!("cart-{i}"))).await?;
    Ok(!p.duplicate)
}

/// Publishes `order` i with its dedupe id; returns whether it was new.
async fn publish_order(engine: &Engine, i: u32) -> Result<bool, durable::Error> {
    let p = engine.publish("order", &i, PublishOptions::dedupe(format!("order-{i}"))).await?;
    Ok(!p.duplicate)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, String> {
    args.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| format!("missing or bad {what}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (db, mode) = match (args.first(), args.get(1)) {
        (Some(db), Some(mode)) => (db.clone(), mode.clone()),
        _ => {
            eprintln!("usage: schedule_worker <db> fire | publish <n> | finish <order-from> <cart-from> <n>");
            std::process::exit(2);
        }
    };
    let store = Arc::new(SqliteStore::open(&db)?);
    let builder = || Engine::builder().shared_store(store.clone()).config(config());
    match mode.as_str() {
        "fire" => {
            let engine = builder().build()?;
            let mut events = engine.subscribe();
            tokio::spawn(async move {
                loop {
                    match events.recv().await {
                        Ok(EngineEvent::ScheduleAdvanced { key, fired, .. }) if key == "tick" => {
                            for id in fired {
                                let at = id.as_str().rsplit_once(':').map_or("?", |(_, at)| at).to_string();
                                out(format_args!("fired {at} {}", now_ms()));
                            }
                        }
                        Ok(_) => {}
                        Err(RecvError::Lagged(n)) => out(format_args!("lagged {n}")),
                        Err(RecvError::Closed) => break,
                    }
                }
            });
            engine.register("tick", 1, |_ctx: WorkflowCtx, _: ()| async move { Ok::<_, WorkflowError>(()) });
            engine.schedule("tick", Schedule::every(Duration::from_secs(1)), "tick", &()).await?;
            out(format_args!("ready {}", engine.owner()));
            engine.run_worker(durable::shutdown_signal()).await;
            out(format_args!("stopped"));
        }
        "publish" => {
            let n: u32 = arg(&args, 2, "n")?;
            let engine = builder().client_only().build()?;
            register_triggers(&engine);
            let mut stdin = std::io::stdin().lines();
            for i in 0..n {
                out(format_args!("publishing cart {i}"));
                publish_cart(&engine, i).await?;
                out(format_args!("acked cart {i}"));
                out(format_args!("publishing order {i}"));
                publish_order(&engine, i).await?;
                out(format_args!("acked order {i}"));
                // The test's go-ahead (it SIGKILLs this process instead, at some point).
                let line = tokio::task::block_in_place(|| stdin.next());
                if line.is_none() {
                    break;
                }
            }
            engine.shutdown().await;
        }
        "finish" => {
            let (order_from, cart_from, n): (u32, u32, u32) =
                (arg(&args, 2, "order-from")?, arg(&args, 3, "cart-from")?, arg(&args, 4, "n")?);
            // Publish as a client first: no scheduler here flushes a buffer between two
            // publishes, however slow this process is to start or to publish.
            let client = builder().client_only().build()?;
            register_triggers(&client);
            for i in cart_from.min(order_from)..n {
                if i >= cart_from && !publish_cart(&client, i).await? {
                    out(format_args!("duplicate cart {i}"));
                }
                if i >= order_from && !publish_order(&client, i).await? {
                    out(format_args!("duplicate order {i}"));
                }
            }
            client.shutdown().await;
            out(format_args!("published"));

            let engine = builder().build()?;
            let mut events = engine.subscribe();
            register_triggers(&engine);
            let workflows = vec!["bulk".to_string(), "settle".to_string()];
            loop {
                let settled = match events.recv().await {
                    Ok(EngineEvent::RunSettled { run_id, status }) => {
                        out(format_args!("settled {run_id} {status}"));
                        true
                    }
                    Ok(_) => false,
                    // Missed events: look at the store anyway.
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return Err("the engine's event stream closed".into()),
                };
                if !settled {
                    continue;
                }
                // A flush deletes its buffer and creates its run in one write: no open buffer
                // and every run finished means nothing more will start.
                let query = DueQuery {
                    namespace: None,
                    workflows: Some(workflows.clone()),
                    now: durable::Millis::MAX,
                    limit: 1,
                };
                if !store.due_buffers(&query).await?.is_empty() {
                    continue;
                }
                let mut finished = true;
                for w in &workflows {
                    let filter = RunFilter { workflow: Some(w.clone()), limit: 1000, ..Default::default() };
                    finished &= store.list_runs(&filter).await?.runs.iter().all(|r| r.status.is_terminal());
                }
                if finished {
                    break;
                }
            }
            engine.shutdown().await;
            out(format_args!("done"));
        }
        other => {
            eprintln!("unknown mode {other:?}");
            std::process::exit(2);
        }
    }
    Ok(())
}
