//! A worker process of a deployment on PostgreSQL (feature `postgres`): engines in any number of
//! processes and machines share the runs of one schema; the run queue hands each start and wake
//! to one of them, and `LISTEN/NOTIFY` wakes an idle one at once. The README's "Several workers
//! on one database" shows this program, line for line (a test in `tests/` keeps them equal).
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example postgres_worker --features postgres
//! ```

use std::sync::Arc;
use std::time::Duration;

use durable::{Engine, PostgresOptions, PostgresStore, QueueTransport, WorkflowCtx, WorkflowError};

async fn invoice(ctx: WorkflowCtx, customer: u64) -> Result<String, WorkflowError> {
    let total: u64 = ctx.step("total", move |_| async move { Ok(customer * 100) }).await?;
    ctx.sleep(Duration::from_secs(3600)).await; // durable: any worker may continue the run
    Ok(ctx.step("send", move |s| async move { Ok(format!("invoice {} of {total}", s.step_id())) }).await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every process connects to the same database and schema. With a notify channel, every
    // enqueue of the run queue NOTIFYs the workers (set it on every process, clients too).
    let options = PostgresOptions::new().schema("durable").notify_channel("durable");
    let store = PostgresStore::connect_with(&std::env::var("DATABASE_URL")?, options).await?;
    // Starts and wakes go through the run queue in the database; an idle worker is woken by
    // NOTIFY within milliseconds, the poll is only the safety net.
    let transport = QueueTransport::new(Arc::new(store.clone()))
        .poll_interval(Duration::from_secs(1))
        .with_wakeups(store.queue_wakeups().await?);
    let engine = Engine::builder()
        .store(store)
        .transport(transport)
        .namespace("billing") // this pool executes the runs of namespace "billing" only
        .build()?; // an API server that only starts runs adds `.client_only()`
    engine.register("invoice", 1, invoice);
    engine.run_worker(durable::shutdown_signal()).await; // until SIGTERM, then drain
    Ok(())
}
