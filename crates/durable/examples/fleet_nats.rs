//! A fleet on NATS (feature `nats`): the run queue on a JetStream stream and the control plane
//! (events, cancels, "work queued" nudges) on NATS subjects, the state in one SQLite file.
//!
//! Three engine instances share the file — in one process here so the example runs with one
//! command; in production each is a process of its own, on any machine, and the state is a
//! `PostgresStore`. A remote-step worker serves the `charge` step. A client engine, which
//! executes nothing, starts 20 orders, sees each one complete through the fleet's events, then
//! starts a long-running job and cancels it: the instance running it stops at its next step.
//!
//! ```text
//! DURABLE_NATS_URL=nats://127.0.0.1:4222 cargo run -p durable --example fleet_nats --features nats
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::nats::{NatsControlPlane, NatsTransport};
use durable::{
    Engine, EngineEvent, RunId, RunStatus, SqliteStore, StartOptions, StepError, TaskContext, Worker, WorkflowCtx,
    WorkflowError,
};

/// An order: a local step, then a remote step on whichever worker serves `charge`.
async fn order(ctx: WorkflowCtx, amount: u64) -> Result<String, WorkflowError> {
    let cents: u64 = ctx.step("price", move |_| async move { Ok(amount * 100) }).await?;
    let receipt: String = ctx.remote_step("charge", &cents).await?;
    Ok(receipt)
}

/// A long job: a step every 50 ms until cancelled.
async fn long_job(ctx: WorkflowCtx, _: ()) -> Result<u32, WorkflowError> {
    for i in 0..100_000u32 {
        ctx.step(format!("tick{i}"), |_| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(())
        })
        .await?;
    }
    Ok(100_000)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DURABLE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    // One prefix per deployment: its stream and subjects.
    let prefix = format!("fleet_example_{}", std::process::id());
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("fleet.db");

    // readme:begin
    // What every instance does to join the fleet: the shared store (a `PostgresStore` across
    // machines), the run queue on a JetStream stream, the control plane on NATS subjects.
    let join = |client: bool| {
        let (url, prefix, db) = (url.clone(), prefix.clone(), db.clone());
        async move {
            let store = Arc::new(SqliteStore::open(&db)?);
            let transport = NatsTransport::connect(&url, &prefix).await?; // stream <PREFIX>_RUNS
            let plane = NatsControlPlane::connect(&url, &prefix).await?; // subject <prefix>.control
            let builder = Engine::builder().shared_store(store).transport(transport).control_plane(plane);
            let engine = if client { builder.client_only() } else { builder }.build()?;
            engine.register("order", 1, order);
            engine.register("long_job", 1, long_job);
            Ok::<_, Box<dyn std::error::Error>>(engine)
        }
    };
    // readme:end
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(join(false).await?);
    }
    let (shutdown, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for engine in &instances {
        let (engine, mut stopped) = (engine.clone(), stopped.clone());
        tasks.push(tokio::spawn(async move {
            engine
                .run_worker(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await;
        }));
    }
    // The remote-step worker: claims `charge` tasks from the store, told of new ones on NATS.
    let worker = Worker::builder()
        .store(Arc::new(SqliteStore::open(&db)?))
        .transport(NatsTransport::connect(&url, &prefix).await?) // results wake runs through the queue
        .control_plane(NatsControlPlane::connect(&url, &prefix).await?)
        .handle("charge", |ctx: TaskContext, cents: u64| async move {
            Ok::<_, StepError>(format!("receipt {} for {cents} cents", ctx.step_id()))
        })
        .build();
    let mut worker_stopped = stopped.clone();
    let worker_task = tokio::spawn(async move {
        worker
            .run(async move {
                let _ = worker_stopped.wait_for(|s| *s).await;
            })
            .await
    });

    // The client: starts runs, hears the fleet's events, cancels.
    let client = join(true).await?;
    let mut events = client.subscribe();
    let ids: Vec<RunId> = (0..20u64).map(|i| RunId::new(format!("order-{i}"))).collect();
    for (i, id) in ids.iter().enumerate() {
        client.start("order", &(i as u64 + 1), StartOptions::id(id.as_str())).await?;
    }
    let mut completed = 0;
    while completed < ids.len() {
        if let EngineEvent::RunSettled { run_id, status: RunStatus::Completed } = events.recv().await?
            && ids.contains(&run_id)
        {
            completed += 1;
        }
    }
    println!("the client saw {completed} orders complete on the fleet");
    let receipt: String = client.wait_for_run(&ids[0]).await?.output()?;
    println!("order-0: {receipt}");

    let job = RunId::new("long-job");
    client.start("long_job", &(), StartOptions::id(job.as_str())).await?;
    tokio::time::sleep(Duration::from_millis(300)).await; // let it run a few steps
    let asked = Instant::now();
    client.cancel(&job).await?;
    let outcome = client.wait_for_run(&job).await?;
    println!("long-job: {} {:?} after the cancel", outcome.status(), asked.elapsed());

    shutdown.send_replace(true);
    for t in tasks {
        t.await?;
    }
    worker_task.await?;
    client.shutdown().await;
    instances[0].shutdown().await;
    NatsTransport::connect(&url, &prefix).await?.delete().await?; // the example's stream
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
