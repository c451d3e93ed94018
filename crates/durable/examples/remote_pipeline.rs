//! An image pipeline whose workflow runs in one process and whose `resize` and `upload` steps
//! run on a worker in another: remote steps (`ctx.remote_step`) and a `Worker`, sharing one
//! SQLite file.
//!
//! Run plainly, this program is the engine's process: it creates a database in a temp dir,
//! starts itself again as the worker process (`--worker <db>`), waits for the worker to show
//! up in `worker_health`, starts three runs, prints the progress the worker heartbeats and
//! the results, then stops the worker with SIGTERM (it drains: running handlers finish, the
//! unfinished tasks are handed back). It takes a few seconds. The README's "Remote steps and
//! workers" shows the code between `// readme:begin` and `// readme:end` (a test in `tests/`
//! keeps them equal).
//!
//! ```text
//! cargo run --example remote_pipeline
//! ```
//!
//! While it runs, `durable workers --db <the printed path>` shows the queues and the worker,
//! and `durable runs show photo-1 --db …` a run's pending step with its progress and logs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable::store::{Store, TaskFilter};
use durable::{
    Backoff, Engine, RunId, SqliteStore, StartOptions, StepError, TaskContext, Worker, WorkerReport, WorkflowCtx,
    WorkflowError, shutdown_signal,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Serialize, Deserialize)]
struct Image {
    url: String,
    width: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Resized {
    path: String,
    bytes: u64,
}

// readme:begin
/// The workflow, in the engine's process. Each remote step is a task in the store: the run
/// suspends until a worker's result is recorded, then continues on any engine.
async fn publish(ctx: WorkflowCtx, image: Image) -> Result<String, WorkflowError> {
    let resized: Resized = ctx
        .remote_step("resize", &image)
        .heartbeat_timeout(Duration::from_secs(3)) // silent for 3 s: another worker takes it
        .timeout(Duration::from_secs(60)) // one attempt, from its first claim
        .await?;
    let url: String = ctx
        .remote_step("upload", &resized)
        .retry(5, Backoff::exponential(Duration::from_secs(1), Duration::from_secs(30)))
        .await?;
    Ok(url)
}

/// The worker, in a process of its own: no engine, no workflow code, only handlers.
async fn run_worker(store: Arc<dyn Store>) -> WorkerReport {
    Worker::builder()
        .store(store)
        .handle("resize", |ctx: TaskContext, image: Image| async move {
            for done in 1..=6 {
                tokio::time::sleep(Duration::from_millis(300)).await; // the actual work
                // Extends the lease, and shows in `durable runs show`.
                if !ctx.heartbeat(&json!({ "done": done, "of": 6 })).await {
                    return Err(StepError::retryable("cancelled")); // dropped anyway
                }
            }
            ctx.log("info", "resized", Some(json!({ "width": image.width })));
            Ok::<_, StepError>(Resized { path: format!("/tmp/{}.w{}.png", ctx.step_id(), image.width), bytes: 48_000 })
        })
        .handle("upload", |ctx: TaskContext, resized: Resized| async move {
            // The step id is the same for every attempt of the step: the upload's idempotency key.
            let key = ctx.step_id();
            ctx.log("info", format!("uploading {} bytes from {}", resized.bytes, resized.path), None);
            Ok::<_, StepError>(format!("https://cdn.example/{key}.png"))
        })
        .capabilities(["cpu"])
        .concurrency(4)
        .run(shutdown_signal()) // SIGTERM or Ctrl-C: stop claiming, drain, hand back the rest
        .await
}
// readme:end

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, db] = args.as_slice()
        && flag == "--worker"
    {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(db)?);
        let report = run_worker(store).await;
        println!(
            "[worker] stopped: {} claimed, {} completed, {} handed back",
            report.claimed, report.completed, report.handed_back
        );
        return Ok(());
    }

    let dir = tempfile::tempdir()?;
    let db = dir.path().join("durable.db");
    let engine = Engine::builder().store(SqliteStore::open(&db)?).build()?;
    engine.register("publish", 1, publish);
    println!("database: {}", db.display());

    // The worker: this program again, in a process of its own, on the same file.
    let mut child = std::process::Command::new(std::env::current_exe()?).arg("--worker").arg(&db).spawn()?;
    let started = Instant::now();
    let worker = loop {
        let health = engine.worker_health().await?;
        if let Some(w) = health.workers.first() {
            break w.clone();
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            return Err("the worker process did not show up within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("worker {} serves {:?} with {:?}", worker.id, worker.queues, worker.capabilities);

    let mut ids = Vec::new();
    for (i, width) in [640, 1280, 320].into_iter().enumerate() {
        let image = Image { url: format!("https://img.example/photo-{i}.jpg"), width };
        ids.push(engine.start("publish", &image, StartOptions::id(format!("photo-{i}"))).await?.id);
    }

    // What the worker heartbeats, as an operator sees it (`durable runs show`).
    let mut shown: HashMap<(RunId, u32), String> = HashMap::new();
    let mut outputs = Vec::new();
    for id in &ids {
        loop {
            let unfinished = TaskFilter { unfinished: true, ..TaskFilter::default() };
            for task in engine.store().list_tasks(&unfinished).await? {
                let Some(progress) = &task.progress else { continue };
                let key = (task.task.run_id.clone(), task.task.seq);
                if shown.get(&key) != Some(&progress.as_str().to_string()) {
                    println!(
                        "  {} {}: {} on {}",
                        key.0,
                        task.task.name,
                        progress.as_str(),
                        task.worker.as_deref().unwrap_or("?")
                    );
                    shown.insert(key, progress.as_str().to_string());
                }
            }
            let run = engine.get_run(id).await?.ok_or("run vanished")?;
            if run.status.is_terminal() {
                let url: String = engine.wait_for_run(id).await?.output()?;
                outputs.push((id.clone(), url));
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                return Err(format!("run {id} did not finish within 60 s").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (id, url) in &outputs {
        println!("{id} -> {url}");
    }

    // Stop the worker the way a deployment does: SIGTERM, then it drains and exits.
    stop(&mut child)?;
    let status = child.wait()?;
    engine.shutdown().await;
    if !status.success() {
        return Err(format!("the worker process exited with {status}").into());
    }
    Ok(())
}

/// SIGTERM on Unix (the worker drains); elsewhere the process is killed.
fn stop(child: &mut std::process::Child) -> std::io::Result<()> {
    if cfg!(unix) {
        let status = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status()?;
        if status.success() {
            return Ok(());
        }
    }
    child.kill()
}
