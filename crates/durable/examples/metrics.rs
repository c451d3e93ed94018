//! The engine's metrics as Prometheus text: installs durable's `PrometheusRecorder`, runs a few
//! workflows on the embedded SQLite store (completed, failed, cancelled, a retried step and
//! a remote step on an in-process worker), then prints what a scrape of `/metrics` would show.
//!
//! ```text
//! cargo run -p durable --example metrics
//! ```

use std::time::Duration;

use durable::{
    Backoff, Engine, PrometheusRecorder, RunStatus, SqliteStore, StartOptions, StepError, Worker, WorkflowCtx,
    WorkflowError,
};

async fn checkout(ctx: WorkflowCtx, cents: u64) -> Result<String, WorkflowError> {
    // The first attempt of every charge fails: one `retry` sample, then one `completed`.
    let paid: String = ctx
        .step("charge", move |s| async move {
            if cents == 0 {
                return Err(StepError::fatal("nothing to charge"));
            }
            if s.attempt() == 1 {
                return Err(StepError::retryable("gateway timeout"));
            }
            Ok(format!("charged {cents} cents"))
        })
        .retry(2, Backoff::Fixed(Duration::from_millis(10)))
        .await?;
    if cents > 10_000 {
        // Large orders wait for a review (the example cancels that one).
        let () = ctx.wait_for_signal(&format!("review:{}", ctx.run_id())).await?;
    }
    let label: String = ctx.remote_step("print_label", &cents).await?;
    Ok(format!("{paid}, {label}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Install the recorder first: the engine describes its metrics to it when it is built. It
    // picks the histograms' buckets by name (`durable::metrics_names::SECONDS_BUCKETS`, …).
    let prometheus = PrometheusRecorder::new();
    prometheus.install()?;

    let dir = tempfile::tempdir()?;
    let engine = Engine::builder().store(SqliteStore::open(dir.path().join("metrics.db"))?).build()?;
    engine.register("checkout", 1, checkout);
    let worker = Worker::builder()
        .engine(&engine)
        .handle("print_label", |_ctx, cents: u64| async move { Ok::<_, StepError>(format!("label for {cents}")) })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
    });

    let mut runs = Vec::new();
    for (i, cents) in [1_200u64, 4_500, 990, 0, 25_000].into_iter().enumerate() {
        runs.push(engine.start("checkout", &cents, StartOptions::id(format!("checkout:{i}"))).await?.id);
    }
    for id in &runs[..4] {
        let outcome = engine.wait_for_run(id).await?;
        println!("# {id}: {}", outcome.status());
    }
    let review = &runs[4];
    assert_eq!(engine.wait_until_suspended_or_terminal(review).await?.status(), RunStatus::Suspended);
    println!("# {review}: {}", engine.cancel(review).await?);

    let _ = stop.send(());
    worker.await?;
    engine.shutdown().await;
    println!("\n{}", prometheus.render());
    Ok(())
}
