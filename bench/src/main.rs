//! One benchmark workload on one store, in this process; prints one JSON object.
//!
//! Run through `cargo xtask bench`, which builds this in release mode, runs each
//! workload × store in a fresh process (so `peak_rss_mb` is that workload's own), collects
//! the lines into `target/bench/results.json` and prints a table.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable::{Engine, MemoryStore, StartOptions, WorkflowCtx, WorkflowError};

struct Args {
    workload: String,
    store: String,
    dir: PathBuf,
    quick: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args =
        Args { workload: String::new(), store: "memory".into(), dir: PathBuf::from("target/bench"), quick: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--workload" => args.workload = it.next().ok_or("--workload needs a value")?,
            "--store" => args.store = it.next().ok_or("--store needs a value")?,
            "--dir" => args.dir = it.next().ok_or("--dir needs a value")?.into(),
            "--quick" => args.quick = true,
            "--workers" => {
                let n = it.next().ok_or("--workers needs a value")?;
                if n != "1" {
                    return Err("--workers > 1 is not supported yet".into());
                }
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if args.workload.is_empty() {
        return Err("--workload is required".into());
    }
    Ok(args)
}

/// What a workload measured.
struct Measured {
    runs: usize,
    steps_per_run: usize,
    wall: Duration,
    /// Per-run latencies in milliseconds (or the workload's own latency notion).
    latencies: Vec<f64>,
}

fn engine(args: &Args) -> Result<Engine, String> {
    let builder = Engine::builder();
    let builder = match args.store.as_str() {
        "memory" => builder.store(MemoryStore::new()),
        "sqlite" => {
            std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
            let path = args.dir.join(format!("bench-{}-{}.db", args.workload, std::process::id()));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            builder.store(durable::SqliteStore::open(&path).map_err(|e| e.to_string())?)
        }
        other => return Err(format!("unknown store {other:?}")),
    };
    builder.build().map_err(|e| e.to_string())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Starts `runs` runs of `workflow` at once, each task waiting for its own run; returns the
/// wall time and each run's start-to-complete latency, plus the runs' outputs.
async fn start_all<I: serde::Serialize + Send + Sync + 'static>(
    engine: &Engine,
    workflow: &'static str,
    runs: usize,
    input: I,
) -> Result<(Duration, Vec<f64>, Vec<serde_json::Value>), String> {
    let input = Arc::new(input);
    let began = Instant::now();
    let mut tasks = Vec::with_capacity(runs);
    for i in 0..runs {
        let engine = engine.clone();
        let input = input.clone();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let run = engine.start(workflow, &*input, StartOptions::id(format!("{workflow}-{i}"))).await?;
            let outcome = engine.wait_for_run(&run.id).await?;
            let out: serde_json::Value = outcome.output()?;
            Ok::<_, durable::Error>((t0.elapsed().as_secs_f64() * 1e3, out))
        }));
    }
    let mut latencies = Vec::with_capacity(runs);
    let mut outputs = Vec::with_capacity(runs);
    for t in tasks {
        let (lat, out) = t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        latencies.push(lat);
        outputs.push(out);
    }
    Ok((began.elapsed(), latencies, outputs))
}

fn register_chain(engine: &Engine) {
    engine.register("chain", 1, |ctx: WorkflowCtx, steps: usize| async move {
        let mut acc = 0u64;
        for i in 0..steps {
            acc = ctx.step(format!("s{i}"), move |_| async move { Ok(acc + 1) }).await?;
        }
        Ok::<_, WorkflowError>(acc)
    });
}

async fn chain(engine: &Engine, runs: usize, steps: usize) -> Result<Measured, String> {
    register_chain(engine);
    let (wall, latencies, _) = start_all(engine, "chain", runs, steps).await?;
    Ok(Measured { runs, steps_per_run: steps, wall, latencies })
}

async fn timers(engine: &Engine, runs: usize) -> Result<Measured, String> {
    engine.register("timers", 1, |ctx: WorkflowCtx, sleep_ms: u64| async move {
        let t0 = ctx.now().await.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        ctx.sleep(Duration::from_millis(sleep_ms)).await;
        let late: u64 = ctx.step("measure", move |_| async move { Ok(now_ms().saturating_sub(t0 + sleep_ms)) }).await?;
        Ok::<_, WorkflowError>(late)
    });
    let (wall, _, outputs) = start_all(engine, "timers", runs, 10u64).await?;
    let latencies = outputs.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect();
    Ok(Measured { runs, steps_per_run: 1, wall, latencies })
}

/// Parks `runs` runs, each waiting for its own delivery, then sends every delivery at once
/// with `send(i)`; latencies run from a run's delivery to its completion.
async fn deliveries<F, Fut>(engine: &Engine, workflow: &'static str, runs: usize, send: F) -> Result<Measured, String>
where
    F: Fn(Engine, usize) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<(), durable::Error>> + Send,
{
    let mut parking = Vec::with_capacity(runs);
    for i in 0..runs {
        let engine = engine.clone();
        parking.push(tokio::spawn(async move {
            let run = engine.start(workflow, &i, StartOptions::id(format!("{workflow}-{i}"))).await?;
            engine.wait_for_settled(&run.id).await.map(|_| run.id)
        }));
    }
    let mut ids = Vec::with_capacity(runs);
    for p in parking {
        ids.push(p.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?);
    }
    let began = Instant::now();
    let mut tasks = Vec::with_capacity(runs);
    for (i, id) in ids.into_iter().enumerate() {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            send(engine.clone(), i).await?;
            engine.wait_for_run(&id).await?.output::<usize>()?;
            Ok::<_, durable::Error>(t0.elapsed().as_secs_f64() * 1e3)
        }));
    }
    let mut latencies = Vec::with_capacity(runs);
    for t in tasks {
        latencies.push(t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?);
    }
    Ok(Measured { runs, steps_per_run: 1, wall: began.elapsed(), latencies })
}

async fn signals(engine: &Engine, runs: usize) -> Result<Measured, String> {
    engine.register("signals", 1, |ctx: WorkflowCtx, i: usize| async move {
        let n: usize = ctx.wait_for_signal(&format!("sig-{i}")).await?;
        Ok::<_, WorkflowError>(n)
    });
    deliveries(
        engine,
        "signals",
        runs,
        |engine, i| async move { engine.signal(&format!("sig-{i}"), &i).await.map(drop) },
    )
    .await
}

async fn events(engine: &Engine, runs: usize) -> Result<Measured, String> {
    engine.register("events", 1, |ctx: WorkflowCtx, i: usize| async move {
        let e: serde_json::Value = ctx.wait_for_event("order.paid", serde_json::json!({ "key": i })).await?;
        Ok::<_, WorkflowError>(e["key"].as_u64().unwrap_or(0) as usize)
    });
    deliveries(engine, "events", runs, |engine, i| async move {
        engine.publish_event("order.paid", &serde_json::json!({ "key": i, "amount": 10 })).await.map(drop)
    })
    .await
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

async fn run(args: &Args) -> Result<Measured, String> {
    let engine = engine(args)?;
    let q = args.quick;
    let m = match args.workload.as_str() {
        "chain" => chain(&engine, if q { 100 } else { 1_000 }, 5).await?,
        "long_chain" => chain(&engine, if q { 4 } else { 20 }, if q { 200 } else { 1_000 }).await?,
        "timers" => timers(&engine, if q { 200 } else { 2_000 }).await?,
        "signals" => signals(&engine, if q { 200 } else { 2_000 }).await?,
        "events" => events(&engine, if q { 200 } else { 2_000 }).await?,
        other => return Err(format!("workload {other:?} is not implemented yet")),
    };
    engine.shutdown().await;
    Ok(m)
}

fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("durable-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(run(&args)) {
        Ok(mut m) => {
            m.latencies.sort_by(f64::total_cmp);
            let wall = m.wall.as_secs_f64();
            let result = serde_json::json!({
                "workload": args.workload,
                "store": args.store,
                "runs": m.runs,
                "steps_per_run": m.steps_per_run,
                "wall_s": wall,
                "steps_per_s": (m.runs * m.steps_per_run) as f64 / wall,
                "runs_per_s": m.runs as f64 / wall,
                "p50_ms": percentile(&m.latencies, 0.50),
                "p99_ms": percentile(&m.latencies, 0.99),
                "peak_rss_mb": peak_rss_mb(),
            });
            println!("{result}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("durable-bench: {} on {}: {e}", args.workload, args.store);
            std::process::ExitCode::FAILURE
        }
    }
}
