//! One benchmark workload on one store; prints one JSON object.
//!
//! Run through `cargo xtask bench`, which builds this in release mode, runs each
//! workload × store in a fresh process (so `peak_rss_mb` is that workload's own), collects
//! the lines into `bench/results.json` in cargo's target directory and prints a table.
//!
//! With `--workers N` the runs execute in N worker processes (this binary with
//! `--role worker`) sharing one SQLite file or PostgreSQL schema; each runs an engine that
//! executes runs from the run queue and, in `remote_chain`, a remote-step worker beside it.
//! The run queue is the store-backed one (`--transport store`) or a broker's
//! (`--transport nats|redis`, with its control plane). This process is then a client engine
//! that starts the runs and waits for them. `peak_rss_mb` is the largest of the processes.
//!
//! `scale` (module [`scale`]) populates a SQLite file with `--runs` suspended runs and measures
//! it from a fresh engine in a child process (this binary with `--role scale-probe`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable::{Engine, MemoryStore, StartOptions, WorkflowCtx, WorkflowError, WorkflowOptions};
use durable_tests::broker::Broker;

mod api;
mod scale;
mod schedules;

struct Args {
    workload: String,
    store: String,
    dir: PathBuf,
    quick: bool,
    /// Worker processes (0: everything in this process).
    workers: usize,
    /// `--role worker`: run as one of the worker processes on `db`.
    role_worker: bool,
    /// `--role scale-probe`: the `scale` workload's fresh engine process on `db`.
    role_probe: bool,
    db: Option<PathBuf>,
    /// `--pg-schema`: the PostgreSQL schema a multi-process run shares.
    pg_schema: Option<String>,
    /// `--transport`: the run queue of a multi-process run: `store`, `nats` or `redis`.
    transport: String,
    /// `--broker-prefix`: the broker prefix (stream, keys) a multi-process run shares.
    broker_prefix: Option<String>,
    /// `--defer-runs` (`schedules`): the fired runs are created to start a year later, so none
    /// executes during the measurement.
    defer_runs: bool,
    /// `--runs N` (`scale`): how many suspended runs to populate.
    runs: Option<u64>,
    /// `--created-range A,B` (`--role scale-probe`): the populate's middle created range.
    created_range: Option<(u64, u64)>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        workload: String::new(),
        store: "memory".into(),
        dir: PathBuf::from("target/bench"),
        quick: false,
        workers: 0,
        role_worker: false,
        role_probe: false,
        db: None,
        pg_schema: None,
        transport: "store".into(),
        broker_prefix: None,
        defer_runs: false,
        runs: None,
        created_range: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--workload" => args.workload = it.next().ok_or("--workload needs a value")?,
            "--store" => args.store = it.next().ok_or("--store needs a value")?,
            "--dir" => args.dir = it.next().ok_or("--dir needs a value")?.into(),
            "--quick" => args.quick = true,
            "--defer-runs" => args.defer_runs = true,
            "--workers" => {
                args.workers = it.next().and_then(|n| n.parse().ok()).ok_or("--workers needs a number")?;
            }
            "--role" => match it.next().as_deref() {
                Some("worker") => args.role_worker = true,
                Some("scale-probe") => args.role_probe = true,
                other => return Err(format!("unknown role {other:?}: worker or scale-probe")),
            },
            "--runs" => {
                let n = it.next().and_then(|n| n.replace('_', "").parse().ok()).ok_or("--runs needs a number")?;
                args.runs = Some(n);
            }
            "--created-range" => {
                let range = it.next().ok_or("--created-range needs A,B")?;
                let parsed = range.split_once(',').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
                args.created_range = Some(parsed.ok_or_else(|| format!("--created-range {range:?}: not A,B"))?);
            }
            "--db" => args.db = Some(it.next().ok_or("--db needs a path")?.into()),
            "--pg-schema" => args.pg_schema = Some(it.next().ok_or("--pg-schema needs a name")?),
            "--transport" => args.transport = it.next().ok_or("--transport needs a value")?,
            "--broker-prefix" => args.broker_prefix = Some(it.next().ok_or("--broker-prefix needs a value")?),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if args.runs.is_some() && args.workload != "scale" {
        return Err(format!("--runs is the scale workload's size, not {:?}'s", args.workload));
    }
    if args.workload.is_empty() && !args.role_worker {
        return Err("--workload is required".into());
    }
    if args.workers > 0 && args.store == "memory" {
        return Err("--workers needs a store processes can share: --store sqlite or postgres".into());
    }
    if !["store", "nats", "redis"].contains(&args.transport.as_str()) {
        return Err(format!("unknown transport {:?}: store, nats or redis", args.transport));
    }
    if args.transport != "store" && args.workers == 0 && !args.role_worker {
        return Err(format!("--transport {} is the run queue of worker processes: add --workers N", args.transport));
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
    /// The in-process engine's turns and turns without progress (spare turns), if measured.
    turns: Option<(u64, u64)>,
    /// The workload's own fields, added to its JSON object.
    extra: Option<serde_json::Value>,
}

/// A fresh SQLite file for this workload.
fn fresh_db(args: &Args) -> Result<PathBuf, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let path = args.dir.join(format!("bench-{}-{}.db", args.workload, std::process::id()));
    remove_db(&path);
    Ok(path)
}

fn remove_db(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// The single in-process engine of a `--workers 0` run (a client engine, executing nothing,
/// for the workloads that measure starts alone).
fn engine(args: &Args) -> Result<(Engine, Option<PathBuf>), String> {
    // `api`: an operator engine, as `durable serve`'s.
    let client_only = args.workload.starts_with("start") || args.workload == "api";
    let mut config = durable::EngineConfig::default();
    config.execute = !client_only;
    tune(&mut config)?;
    let builder = Engine::builder().config(config);
    let (builder, db) = match args.store.as_str() {
        "memory" => (builder.store(MemoryStore::new()), None),
        "sqlite" => {
            let path = fresh_db(args)?;
            // DURABLE_BENCH_SQLITE_DURABILITY=normal: `Durability::Normal` (no fsync per group
            // commit), to see the engine's share of a workload apart from the disk's.
            let options = match std::env::var("DURABLE_BENCH_SQLITE_DURABILITY").as_deref() {
                Ok("normal") => durable::SqliteOptions::new().durability(durable::Durability::Normal),
                Ok("full") | Err(_) => durable::SqliteOptions::new(),
                Ok(other) => return Err(format!("DURABLE_BENCH_SQLITE_DURABILITY={other:?}: full or normal")),
            };
            let store = Arc::new(durable::SqliteStore::open_with(&path, options).map_err(|e| e.to_string())?);
            let _ = SQLITE_BENCH.set(Arc::downgrade(&store));
            (builder.shared_store(store), Some(path))
        }
        "postgres" => (builder.store(postgres_store(args)?), None),
        other => return Err(format!("unknown store {other:?}")),
    };
    let engine = builder.build().map_err(|e| e.to_string())?;
    register_all(&engine);
    Ok((engine, db))
}

/// The engine settings the environment tunes, for every engine of the run (worker processes
/// inherit the variables): `DURABLE_BENCH_WARM_RUNS` sets `warm_runs` (0: every wake replays),
/// `DURABLE_BENCH_MAX_CONCURRENT_RUNS` sets `max_concurrent_runs` and
/// `DURABLE_BENCH_HOLD_SLEEPS_MS` sets `hold_sleeps_under` (in ms), so the same binary measures
/// a workload with and without them.
fn tune(config: &mut durable::EngineConfig) -> Result<(), String> {
    fn var(name: &str) -> Result<Option<usize>, String> {
        match std::env::var(name) {
            Ok(n) => n.parse().map(Some).map_err(|_| format!("{name}={n:?}: not a number")),
            Err(_) => Ok(None),
        }
    }
    if let Some(n) = var("DURABLE_BENCH_WARM_RUNS")? {
        config.warm_runs = n;
    }
    if let Some(n) = var("DURABLE_BENCH_MAX_CONCURRENT_RUNS")? {
        config.max_concurrent_runs = n;
    }
    if let Some(ms) = var("DURABLE_BENCH_HOLD_SLEEPS_MS")? {
        config.hold_sleeps_under = Duration::from_millis(ms as u64);
    }
    Ok(())
}

/// The PostgreSQL bench server when DURABLE_PG_URL is not set.
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The SQLite store of this process (`--store sqlite`), for its writer's counters.
static SQLITE_BENCH: std::sync::OnceLock<std::sync::Weak<durable::SqliteStore>> = std::sync::OnceLock::new();

/// The PostgreSQL store of this process, and the schema to drop afterwards (if it made it).
static PG_BENCH: std::sync::OnceLock<(durable::PostgresStore, Option<String>)> = std::sync::OnceLock::new();

/// `--store postgres`: the server of DURABLE_PG_URL, in a schema of this process
/// (`durable_bench_<workload>_<pid>`, dropped by [`cleanup`]), or the shared schema that
/// DURABLE_PG_SCHEMA names (left in place). DURABLE_PG_WRITE_CONNECTIONS, if set, is the
/// store's `write_connections` (worker processes inherit it); else the store's default.
fn postgres_store(args: &Args) -> Result<durable::PostgresStore, String> {
    let url = std::env::var("DURABLE_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
    let shared = args.pg_schema.clone().or_else(|| std::env::var("DURABLE_PG_SCHEMA").ok());
    let schema = shared.clone().unwrap_or_else(|| format!("durable_bench_{}_{}", args.workload, std::process::id()));
    let mut options = durable::PostgresOptions::new().schema(&schema).notify_channel("durable_bench");
    if let Ok(n) = std::env::var("DURABLE_PG_WRITE_CONNECTIONS") {
        let n = n.parse().map_err(|_| format!("DURABLE_PG_WRITE_CONNECTIONS={n:?}: not a number"))?;
        options = options.write_connections(n);
    }
    // Called inside the (multi-threaded) runtime, and connecting is async.
    let handle = tokio::runtime::Handle::current();
    let connect = durable::PostgresStore::connect_with(&url, options);
    let store = tokio::task::block_in_place(|| handle.block_on(connect)).map_err(|e| e.to_string())?;
    let _ = PG_BENCH.set((store.clone(), if shared.is_none() { Some(schema) } else { None }));
    Ok(store)
}

/// What a process of a multi-process run did: its engine's counters and store round trips
/// (a worker prints it as its last line; the client adds its own and sums them).
fn process_stats(engine: &Engine) -> serde_json::Value {
    let m = engine.metrics();
    let mut stats = serde_json::json!({
        "rss_mb": peak_rss_mb(),
        "turns": m.turns,
        "turns_without_progress": m.turns_without_progress,
        "runs_sent": m.runs_sent,
    });
    // Round trips to PostgreSQL: write batches, reads and run-queue claims (task claims are not
    // counted).
    if let Some((store, _)) = PG_BENCH.get() {
        let s = store.stats();
        stats["pg_round_trips"] = s.round_trips().into();
        stats["pg_reads"] = s.reads.into();
        stats["pg_claims"] = s.claims.into();
        stats["pg_retries"] = s.retries.into();
    }
    stats
}

/// While the engine of a single-process SQLite run still lives: prints its store's write
/// transactions (one fsync each with `Full` durability) on stderr.
fn print_sqlite_stats() {
    if let Some(store) = SQLITE_BENCH.get().and_then(std::sync::Weak::upgrade) {
        let s = store.stats();
        eprintln!("durable-bench: sqlite: {} write transactions carrying {} writes", s.transactions, s.writes);
    }
}

/// After a PostgreSQL run: prints the store's round trips on stderr and drops the schema this
/// process created. Nothing to do for the other stores.
async fn cleanup() {
    let Some((store, schema)) = PG_BENCH.get() else { return };
    let s = store.stats();
    eprintln!(
        "durable-bench: postgres: {} round trips ({} write batches carrying {} writes, {} reads, {} queue claims)",
        s.round_trips(),
        s.batches,
        s.writes,
        s.reads,
        s.claims
    );
    if let Some(schema) = schema {
        let dropped = match store.pool().get().await {
            Ok(client) => client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = dropped {
            eprintln!("durable-bench: could not drop schema {schema}: {e}");
        }
    }
}

/// How long a broker leaves an unanswered run-queue item with a consumer before another
/// gets it (nobody dies in a benchmark: only a bound for a lost answer).
const REDELIVER_AFTER: Duration = Duration::from_secs(10);

/// The broker of `--transport nats|redis` under `prefix` (at DURABLE_NATS_URL /
/// DURABLE_REDIS_URL, or the local server's default port); `None` for `--transport store`.
async fn connect_broker(args: &Args, prefix: &str) -> Result<Option<Broker>, String> {
    let (var, default) = match args.transport.as_str() {
        "nats" => ("DURABLE_NATS_URL", "nats://127.0.0.1:4222"),
        "redis" => ("DURABLE_REDIS_URL", "redis://127.0.0.1:6379"),
        _ => return Ok(None),
    };
    let url = std::env::var(var).unwrap_or_else(|_| default.into());
    Broker::connect(&args.transport, &url, prefix, REDELIVER_AFTER)
        .await
        .map(Some)
        .map_err(|e| format!("connecting to {} at {url} (set {var}): {e}", args.transport))
}

/// An engine of a multi-process run: a worker (`execute`), or the client that starts and
/// waits. The processes share a SQLite file (`db`) or a PostgreSQL schema, and a run queue:
/// the store's, or the broker's with its control plane.
async fn shared_engine(
    args: &Args,
    db: Option<&std::path::Path>,
    broker: Option<&Broker>,
    execute: bool,
) -> Result<Engine, String> {
    let mut config = durable::EngineConfig::default();
    // Without a control plane the client sees completions by polling the store: cheap on a
    // local file, a round trip per interval (for every waiter at once) on a server.
    config.wait_poll_interval = Duration::from_millis(if db.is_some() { 5 } else { 50 });
    config.execute = execute;
    tune(&mut config)?;
    let builder = Engine::builder().config(config);
    let builder = match (db, broker) {
        (_, Some(broker)) => {
            let builder = match db {
                Some(db) => builder.store(durable::SqliteStore::open(db).map_err(|e| e.to_string())?),
                None => builder.store(postgres_store(args)?),
            };
            builder.transport(broker.transport.clone()).control_plane(broker.plane.clone())
        }
        (Some(db), None) => {
            let store = Arc::new(durable::SqliteStore::open(db).map_err(|e| e.to_string())?);
            let transport = durable::QueueTransport::new(store.clone()).poll_interval(Duration::from_millis(5));
            builder.shared_store(store).transport(transport)
        }
        (None, None) => {
            let store = Arc::new(postgres_store(args)?);
            let wakeups = store.queue_wakeups().await.map_err(|e| e.to_string())?;
            let transport = durable::QueueTransport::new(store.clone()).with_wakeups(wakeups);
            builder.shared_store(store).transport(transport)
        }
    };
    let engine = builder.build().map_err(|e| e.to_string())?;
    register_all(&engine);
    Ok(engine)
}

/// Every workload's workflows: workers and clients register the same code.
fn register_all(engine: &Engine) {
    register_chain(engine);
    register_flow(engine);
    engine.register("timers", 1, |ctx: WorkflowCtx, sleep_ms: u64| async move {
        let t0 = ctx.now().await.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        ctx.sleep(Duration::from_millis(sleep_ms)).await;
        let late: u64 = ctx.step("measure", move |_| async move { Ok(now_ms().saturating_sub(t0 + sleep_ms)) }).await?;
        Ok::<_, WorkflowError>(late)
    });
    engine.register("signals", 1, |ctx: WorkflowCtx, i: usize| async move {
        let n: usize = ctx.wait_for_signal(&format!("sig-{i}")).await?;
        Ok::<_, WorkflowError>(n)
    });
    engine.register("events", 1, |ctx: WorkflowCtx, i: usize| async move {
        let e: serde_json::Value = ctx.wait_for_event("order.paid", serde_json::json!({ "key": i })).await?;
        Ok::<_, WorkflowError>(e["key"].as_u64().unwrap_or(0) as usize)
    });
    engine.register("leaf", 1, |ctx: WorkflowCtx, i: u64| async move {
        let out: u64 = ctx.step("work", move |_| async move { Ok(i + 1) }).await?;
        Ok::<_, WorkflowError>(out)
    });
    engine.register("sleeper", 1, |ctx: WorkflowCtx, (naps, nap_ms): (u64, u64)| async move {
        for _ in 0..naps {
            ctx.sleep(Duration::from_millis(nap_ms)).await;
        }
        Ok::<_, WorkflowError>(naps)
    });
    engine.register("napper", 1, |ctx: WorkflowCtx, nap_ms: u64| async move {
        ctx.step("before", |_| async { Ok(()) }).await?;
        ctx.sleep(Duration::from_millis(nap_ms)).await;
        ctx.step("after", |_| async { Ok(()) }).await?;
        Ok::<_, WorkflowError>(())
    });
    engine.register("fanout", 1, |ctx: WorkflowCtx, children: u64| async move {
        let all: Vec<_> = (0..children).map(|i| ctx.child::<_, u64>("leaf", &i)).collect();
        let mut sum = 0;
        for r in ctx.all(all).await {
            sum += r?;
        }
        Ok::<_, WorkflowError>(sum)
    });
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

/// The remote-step handlers of `remote_chain`: no-ops.
fn remote_worker(builder: durable::WorkerBuilder) -> durable::WorkerBuilder {
    (0..5).fold(builder, |b, i| {
        b.handle(&format!("r{i}"), |_ctx, acc: u64| async move { Ok::<_, durable::StepError>(acc + 1) })
    })
}

/// `remote_chain`: runs of `steps` remote no-op steps, executed by in-process workers on
/// this engine (`--workers 0`) or by the worker processes.
async fn remote_chain(engine: &Engine, runs: usize, steps: usize, in_process: usize) -> Result<Measured, String> {
    let mut workers = Vec::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for _ in 0..in_process {
        let worker = remote_worker(durable::Worker::builder().engine(engine).concurrency(256)).build();
        let mut stopped = stopped.clone();
        workers.push(tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let result = start_all(engine, "remote_chain", runs, steps).await;
    let _ = stop.send(true);
    for w in workers {
        let _ = w.await;
    }
    let (wall, latencies, _) = result?;
    // Worker processes execute the runs with `--workers`: this engine's counters say nothing.
    let turns = engine.config().execute.then(|| engine.metrics()).map(|m| (m.turns, m.turns_without_progress));
    Ok(Measured { runs, steps_per_run: steps, wall, latencies, turns, extra: None })
}

/// When a `pickup` run's turn reached its remote step (just before the turn's commit enqueues
/// the task), and when the worker's handler was called, by run id.
static PICKUPS: std::sync::Mutex<Vec<(String, Instant, bool)>> = std::sync::Mutex::new(Vec::new());

fn pickup_mark(run_id: &str, handler: bool) {
    PICKUPS.lock().expect("not poisoned").push((run_id.to_string(), Instant::now(), handler));
}

/// `remote_chain`'s `pickup` figure on PostgreSQL: how long an idle worker takes to pick up a
/// new task, woken by the store's `LISTEN/NOTIFY` (`PostgresStore::task_wakeups`). The worker
/// has a store of its own (its own connections and listener, as in another process) and a
/// control plane nobody publishes on, so only the NOTIFY of the dispatch commit can wake it
/// before its poll interval (2 s). `runs` runs of one remote step, one at a time: each from
/// the moment its turn reaches the step (the commit that enqueues the task follows at once)
/// to the call of the worker's handler (the claim committed). Milliseconds.
async fn pickup(engine: &Engine, args: &Args, runs: usize) -> Result<serde_json::Value, String> {
    let store = postgres_store(args)?;
    let wakeups = store.task_wakeups().await.map_err(|e| e.to_string())?;
    let worker = durable::Worker::builder()
        .control_plane(durable::InProcessControlPlane::new())
        .engine(engine)
        .store(Arc::new(store))
        .wakeups(wakeups)
        .handle("pickup", |ctx, i: u64| async move {
            pickup_mark(ctx.run_id().as_str(), true);
            Ok::<_, durable::StepError>(i)
        })
        .build();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(async move {
        worker
            .run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
    });
    let mut result = Ok(());
    // One warm-up run (connections, prepared statements), then the measured ones.
    for i in 0..=runs {
        let id = format!("pickup-{i}");
        let done = async {
            let run = engine.start("pickup", &(i as u64), StartOptions::id(id.clone())).await?;
            engine.wait_for_run(&run.id).await?.output::<u64>()
        };
        if let Err(e) = done.await {
            result = Err(format!("pickup run {id}: {e}"));
            break;
        }
    }
    let _ = stop.send(true);
    let _ = worker.await;
    result?;
    let marks = std::mem::take(&mut *PICKUPS.lock().expect("not poisoned"));
    let mut latencies = Vec::with_capacity(runs);
    for i in 1..=runs {
        let id = format!("pickup-{i}");
        let at = |handler: bool| marks.iter().find(|(r, _, h)| r == &id && *h == handler).map(|m| m.1);
        let (Some(reached), Some(called)) = (at(false), at(true)) else {
            return Err(format!("pickup run {id}: no timestamps"));
        };
        latencies.push(called.saturating_duration_since(reached).as_secs_f64() * 1e3);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(serde_json::json!({
        "n": runs,
        "p50_ms": percentile(&latencies, 0.50),
        "p99_ms": percentile(&latencies, 0.99),
        "max_ms": latencies.last().copied().unwrap_or(f64::NAN),
    }))
}

fn register_chain(engine: &Engine) {
    engine.register("pickup", 1, |ctx: WorkflowCtx, i: u64| async move {
        // Each turn marks; the first mark of a run is its first turn's, which enqueues the task.
        pickup_mark(ctx.run_id().as_str(), false);
        let out: u64 = ctx.remote_step("pickup", &i).await?;
        Ok::<_, WorkflowError>(out)
    });
    engine.register("remote_chain", 1, |ctx: WorkflowCtx, steps: usize| async move {
        let mut acc = 0u64;
        for i in 0..steps {
            acc = ctx.remote_step(&format!("r{i}"), &acc).await?;
        }
        Ok::<_, WorkflowError>(acc)
    });
    engine.register("chain", 1, |ctx: WorkflowCtx, steps: usize| async move {
        let mut acc = 0u64;
        for i in 0..steps {
            acc = ctx.step(format!("s{i}"), move |_| async move { Ok(acc + 1) }).await?;
        }
        Ok::<_, WorkflowError>(acc)
    });
}

/// `keyed_chain`: `chain` with every run under one concurrency key of limit 64 (at most 64 runs
/// execute at once; the rest wait `pending` and are handed the key as runs finish). The limit
/// comes from `KEY_LIMIT` when set.
fn register_flow(engine: &Engine) {
    let limit = std::env::var("KEY_LIMIT").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let keyed = WorkflowOptions::default().concurrency(|_: &usize| "all".to_string(), limit);
    engine.register_with("keyed_chain", 1, keyed, |ctx: WorkflowCtx, steps: usize| async move {
        let mut acc = 0u64;
        for i in 0..steps {
            acc = ctx.step(format!("s{i}"), move |_| async move { Ok(acc + 1) }).await?;
        }
        Ok::<_, WorkflowError>(acc)
    });
    let single = WorkflowOptions::default().singleton(|_: &u64| "one".to_string());
    engine.register_with("handoff", 1, single, |ctx: WorkflowCtx, _: u64| async move {
        let began: u64 = ctx.step("began", |_| async { Ok(now_us()) }).await?;
        let ended: u64 = ctx.step("ended", |_| async { Ok(now_us()) }).await?;
        Ok::<_, WorkflowError>((began, ended))
    });
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

async fn keyed_chain(engine: &Engine, runs: usize, steps: usize) -> Result<Measured, String> {
    let (wall, latencies, _) = start_all(engine, "keyed_chain", runs, steps).await?;
    Ok(Measured { runs, steps_per_run: steps, wall, latencies, turns: None, extra: None })
}

/// `admission`: `runs` runs of a singleton key, all started at once; each run's latency is the
/// gap from the end of the previous holder's last step to its own first step: the settle that
/// releases the key, the hand-off, the dispatch and the claim.
async fn admission(engine: &Engine, runs: usize) -> Result<Measured, String> {
    let (wall, _, outputs) = start_all(engine, "handoff", runs, 0u64).await?;
    let mut spans: Vec<(u64, u64)> =
        outputs.iter().map(|v| (v[0].as_u64().unwrap_or(0), v[1].as_u64().unwrap_or(0))).collect();
    spans.sort();
    let latencies = spans.windows(2).map(|w| w[1].0.saturating_sub(w[0].1) as f64 / 1e3).collect();
    Ok(Measured { runs, steps_per_run: 2, wall, latencies, turns: None, extra: None })
}

async fn chain(engine: &Engine, runs: usize, steps: usize) -> Result<Measured, String> {
    let (wall, latencies, _) = start_all(engine, "chain", runs, steps).await?;
    Ok(Measured { runs, steps_per_run: steps, wall, latencies, turns: None, extra: None })
}

async fn timers(engine: &Engine, runs: usize) -> Result<Measured, String> {
    let (wall, _, outputs) = start_all(engine, "timers", runs, 10u64).await?;
    let latencies = outputs.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect();
    Ok(Measured { runs, steps_per_run: 1, wall, latencies, turns: None, extra: None })
}

/// `sleeps`: `runs` runs of `naps` durable 1 ms sleeps each, started at once; latency per
/// run. Each wake is a turn; with warm runs (the default) the engine that parked a run
/// continues its body, without them (`DURABLE_BENCH_WARM_RUNS=0`) each turn replays the
/// run's history so far. Reports the turns and the warm resumes.
async fn sleeps(engine: &Engine, runs: usize, naps: usize) -> Result<Measured, String> {
    let (wall, latencies, _) = start_all(engine, "sleeper", runs, (naps as u64, 1u64)).await?;
    let m = engine.metrics();
    let turns = engine.config().execute.then_some((m.turns, m.turns_without_progress));
    let extra = serde_json::json!({
        "warm_runs": engine.config().warm_runs,
        "warm_resumes": m.warm_resumes,
        "hold_sleeps_under_ms": engine.config().hold_sleeps_under.as_millis() as u64,
    });
    Ok(Measured { runs, steps_per_run: naps, wall, latencies, turns, extra: Some(extra) })
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
            engine.wait_until_suspended_or_terminal(&run.id).await.map(|_| run.id)
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
    Ok(Measured { runs, steps_per_run: 1, wall: began.elapsed(), latencies, turns: None, extra: None })
}

async fn signals(engine: &Engine, runs: usize) -> Result<Measured, String> {
    deliveries(
        engine,
        "signals",
        runs,
        |engine, i| async move { engine.signal(&format!("sig-{i}"), &i).await.map(drop) },
    )
    .await
}

async fn events(engine: &Engine, runs: usize) -> Result<Measured, String> {
    deliveries(engine, "events", runs, |engine, i| async move {
        engine.publish_event("order.paid", &serde_json::json!({ "key": i, "amount": 10 })).await.map(drop)
    })
    .await
}

/// `parents` parents, each fanning out to `children` one-step children; latency per parent.
async fn fanout(engine: &Engine, parents: usize, children: usize) -> Result<Measured, String> {
    let (wall, latencies, _) = start_all(engine, "fanout", parents, children as u64).await?;
    Ok(Measured { runs: parents, steps_per_run: children, wall, latencies, turns: None, extra: None })
}

/// Starts in flight at once in the bulk workloads, as a service starting runs in bulk has.
const STARTS_IN_FLIGHT: usize = 256;

/// Starts `runs` runs of `workflow` with `start`, `STARTS_IN_FLIGHT` calls at a time; returns
/// their ids and each start's latency.
async fn start_in_bulk<I: serde::Serialize + Send + Sync + 'static>(
    engine: &Engine,
    workflow: &'static str,
    runs: usize,
    input: I,
) -> Result<(Vec<durable::RunId>, Vec<f64>), String> {
    let input = Arc::new(input);
    let slots = Arc::new(tokio::sync::Semaphore::new(STARTS_IN_FLIGHT));
    let mut tasks = Vec::with_capacity(runs);
    for i in 0..runs {
        let permit = slots.clone().acquire_owned().await.map_err(|e| e.to_string())?;
        let (engine, input) = (engine.clone(), input.clone());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let run = engine.start(workflow, &*input, StartOptions::id(format!("{workflow}-{i}"))).await;
            drop(permit);
            Ok::<_, durable::Error>((run?.id, t0.elapsed().as_secs_f64() * 1e3))
        }));
    }
    let (mut ids, mut latencies) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for t in tasks {
        let (id, lat) = t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        ids.push(id);
        latencies.push(lat);
    }
    Ok((ids, latencies))
}

/// `runs` runs that each take a step, sleep 2 s and take a step, started in bulk
/// (`STARTS_IN_FLIGHT` `start` calls at a time) on an engine that executes them; wall time to
/// the last completion. Reports the engine's turns and spare turns (turns without progress):
/// two turns per run, none spare, is the goal.
async fn bulk(engine: &Engine, runs: usize) -> Result<Measured, String> {
    let began = Instant::now();
    let (ids, latencies) = start_in_bulk(engine, "napper", runs, 2_000u64).await?;
    for id in &ids {
        engine.wait_for_run(id).await.map_err(|e| e.to_string())?.output::<()>().map_err(|e| e.to_string())?;
    }
    let wall = began.elapsed();
    // Worker processes execute the runs with `--workers`: this engine's counters say nothing.
    let turns = engine.config().execute.then(|| engine.metrics()).map(|m| {
        eprintln!(
            "durable-bench: bulk: {} turns for {runs} runs, {} without progress ({:.2}% of runs)",
            m.turns,
            m.turns_without_progress,
            m.turns_without_progress as f64 * 100.0 / runs as f64
        );
        (m.turns, m.turns_without_progress)
    });
    Ok(Measured { runs, steps_per_run: 2, wall, latencies, turns, extra: None })
}

/// `runs` starts with `start`, `STARTS_IN_FLIGHT` at a time, on a client engine (nothing
/// executes them): how fast runs are created and queued one by one. Latency per start.
async fn starts(engine: &Engine, runs: usize) -> Result<Measured, String> {
    let began = Instant::now();
    let (_, latencies) = start_in_bulk(engine, "leaf", runs, 1u64).await?;
    Ok(Measured { runs, steps_per_run: 0, wall: began.elapsed(), latencies, turns: None, extra: None })
}

/// `runs` starts with one `start_many` call (one store call per 500) on a client engine:
/// how fast runs are created and queued in bulk. Latency per batch of 500.
async fn start_many(engine: &Engine, runs: usize) -> Result<Measured, String> {
    const BATCH: usize = 500;
    let began = Instant::now();
    let mut latencies = Vec::with_capacity(runs / BATCH + 1);
    for first in (0..runs).step_by(BATCH) {
        let t0 = Instant::now();
        let items = (first..(first + BATCH).min(runs)).map(|i| ("leaf", 1u64, StartOptions::id(format!("leaf-{i}"))));
        engine.start_many(items).await.map_err(|e| e.to_string())?;
        latencies.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Measured { runs, steps_per_run: 0, wall: began.elapsed(), latencies, turns: None, extra: None })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// CPU seconds (user and system) this process has used so far, from `/proc/self/stat` (NaN
/// where there is none). With `DURABLE_BENCH_THREADS` set, each thread's is printed on stderr.
fn cpu_seconds() -> f64 {
    fn ticks(stat: &str) -> Option<(String, f64)> {
        // The command name is in parentheses and may hold spaces: fields count from after it.
        let (head, rest) = stat.rsplit_once(')')?;
        let name = head.split_once('(')?.1.to_string();
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
        Some((name, f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?))
    }
    // Linux counts in clock ticks of 100 per second (USER_HZ).
    const HZ: f64 = 100.0;
    if std::env::var_os("DURABLE_BENCH_THREADS").is_some()
        && let Ok(dir) = std::fs::read_dir("/proc/self/task")
    {
        for t in dir.flatten() {
            if let Some((name, n)) = std::fs::read_to_string(t.path().join("stat")).ok().as_deref().and_then(ticks) {
                eprintln!("thread {name}: {:.2} s", n / HZ);
            }
        }
    }
    std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(ticks).map_or(f64::NAN, |(_, n)| n / HZ)
}

/// CPU seconds, user and system, the PostgreSQL server on this machine has used so far: its
/// processes' own, plus the postmaster's count of the backends it reaped. `None` unless the
/// store is PostgreSQL at a local address (DURABLE_PG_URL, or the default) and its processes
/// show in `/proc`. A figure far less noisy than the throughput of a CPU-bound server.
fn pg_server_cpu_s(args: &Args) -> Option<f64> {
    if args.store != "postgres" {
        return None;
    }
    let url = std::env::var("DURABLE_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
    if !pg_url_is_local(&url) {
        return None;
    }
    // (name, parent pid, utime + stime, cutime + cstime) from a `/proc/<pid>/stat` line.
    fn fields(stat: &str) -> Option<(&str, &str, f64, f64)> {
        let (head, rest) = stat.rsplit_once(')')?;
        let name = head.split_once('(')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let sum = |a: usize, b: usize| Some(f.get(a)?.parse::<f64>().ok()? + f.get(b)?.parse::<f64>().ok()?);
        Some((name, f.get(1)?, sum(11, 12)?, sum(13, 14)?))
    }
    let stats: Vec<(String, String)> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, std::fs::read_to_string(e.path().join("stat")).ok()?)))
        .collect();
    let postgres: std::collections::HashSet<&str> = stats
        .iter()
        .filter(|(_, stat)| fields(stat).is_some_and(|(name, ..)| name.starts_with("postgres")))
        .map(|(pid, _)| pid.as_str())
        .collect();
    let mut ticks = 0.0;
    for (_, stat) in stats.iter().filter(|(pid, _)| postgres.contains(pid.as_str())) {
        let Some((_, parent, own, reaped)) = fields(stat) else { continue };
        // The postmaster (whose parent is not a server process) has reaped the exited backends.
        ticks += own + if postgres.contains(parent) { 0.0 } else { reaped };
    }
    // Linux counts in clock ticks of 100 per second (USER_HZ).
    (!postgres.is_empty()).then_some(ticks / 100.0)
}

/// Whether a PostgreSQL URL (`postgres://[user@]host[:port]/db`, or `host=… ` key-value
/// settings) names a server on this machine: a loopback address, `localhost`, or a Unix socket
/// (no host, or a path).
fn pg_url_is_local(url: &str) -> bool {
    let host = match url.split_once("://") {
        Some((_, rest)) => {
            let authority = rest.split(['/', '?']).next().unwrap_or_default();
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            // `[::1]:5432`, `127.0.0.1:5432`, `localhost`.
            match host.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None => host.split(':').next().unwrap_or_default(),
            }
            .to_string()
        }
        None => url.split_whitespace().find_map(|kv| kv.strip_prefix("host=")).unwrap_or_default().to_string(),
    };
    host.is_empty() || host.starts_with('/') || ["127.0.0.1", "localhost", "::1"].contains(&host.as_str())
}

/// Runs the workload and, on a local PostgreSQL server, adds the server's CPU time over it
/// (`pg_server_cpu_s`, and per step `pg_server_cpu_ms_per_step`); then, for an in-process
/// `remote_chain` on PostgreSQL, its `pickup` figure.
async fn measured_workload(engine: &Engine, args: &Args) -> Result<Measured, String> {
    let before = pg_server_cpu_s(args);
    let mut m = workload(engine, args).await?;
    if let (Some(before), Some(after)) = (before, pg_server_cpu_s(args)) {
        let cpu = after - before;
        let steps = (m.runs * m.steps_per_run).max(1) as f64;
        let extra = m.extra.get_or_insert_with(|| serde_json::json!({}));
        extra["pg_server_cpu_s"] = serde_json::json!((cpu * 100.0).round() / 100.0);
        extra["pg_server_cpu_ms_per_step"] = serde_json::json!((cpu * 1e6 / steps).round() / 1000.0);
    }
    // Measured apart: how soon an idle worker on PostgreSQL picks up a new task.
    if args.workload == "remote_chain" && args.store == "postgres" && args.workers == 0 {
        let figure = pickup(engine, args, if args.quick { 50 } else { 200 }).await?;
        m.extra.get_or_insert_with(|| serde_json::json!({}))["pickup"] = figure;
    }
    Ok(m)
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

async fn workload(engine: &Engine, args: &Args) -> Result<Measured, String> {
    let q = args.quick;
    match args.workload.as_str() {
        "chain" => chain(engine, if q { 100 } else { 1_000 }, 5).await,
        "keyed_chain" => keyed_chain(engine, if q { 100 } else { 1_000 }, 5).await,
        "admission" => admission(engine, if q { 50 } else { 500 }).await,
        "remote_chain" => {
            let in_process = if args.workers == 0 { 2 } else { 0 };
            remote_chain(engine, if q { 100 } else { 1_000 }, 5, in_process).await
        }
        "long_chain" => chain(engine, if q { 4 } else { 20 }, if q { 200 } else { 1_000 }).await,
        "timers" => timers(engine, if q { 200 } else { 2_000 }).await,
        "sleeps" => sleeps(engine, if q { 50 } else { 200 }, if q { 20 } else { 50 }).await,
        "signals" => signals(engine, if q { 200 } else { 2_000 }).await,
        "events" => events(engine, if q { 200 } else { 2_000 }).await,
        "fanout" => fanout(engine, if q { 10 } else { 100 }, 20).await,
        "bulk" => bulk(engine, if q { 1_000 } else { 10_000 }).await,
        "starts" => starts(engine, if q { 2_000 } else { 20_000 }).await,
        "start_many" => start_many(engine, if q { 2_000 } else { 100_000 }).await,
        "api" => api::api(engine, if q { 2_000 } else { 100_000 }, if q { 20 } else { 200 }).await,
        other => Err(format!("unknown workload {other:?}")),
    }
}

/// Runs the workload; returns what it measured and the peak RSS (MiB) of the processes.
async fn run(args: &Args) -> Result<(Measured, f64), String> {
    if args.workload == "scale" {
        // Its own engines: a populating one here, a fresh one in a child process.
        return scale::scale(args).await;
    }
    if args.workload == "schedules" {
        // Its own engine: a clock that skips between rounds, a store that times the scheduler.
        if args.workers > 0 {
            return Err("the schedules workload runs in one process (no --workers)".into());
        }
        let m = schedules::schedules(args).await?;
        return Ok((m, peak_rss_mb()));
    }
    if args.workers == 0 {
        let (engine, db) = engine(args)?;
        let m = measured_workload(&engine, args).await?;
        // Per-thread CPU (with DURABLE_BENCH_THREADS) while the store's threads still run.
        cpu_seconds();
        print_sqlite_stats();
        engine.shutdown().await;
        if let Some(db) = db {
            remove_db(&db);
        }
        cleanup().await;
        return Ok((m, peak_rss_mb()));
    }
    // The shared store exists (schema migrated) before the processes race to open it: the
    // client engine makes it.
    let db = if args.store == "sqlite" { Some(fresh_db(args)?) } else { None };
    let prefix = format!("durable_bench_{}_{}", args.workload, std::process::id());
    let broker = connect_broker(args, &prefix).await?;
    let client = shared_engine(args, db.as_deref(), broker.as_ref(), false).await?;
    // The workers share the client's schema: its own (dropped afterwards) or the one named.
    let schema = PG_BENCH.get().and_then(|(_, s)| {
        s.clone().or_else(|| args.pg_schema.clone()).or_else(|| std::env::var("DURABLE_PG_SCHEMA").ok())
    });
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["--role", "worker", "--store", &args.store, "--workload", &args.workload]);
        cmd.args(["--transport", &args.transport, "--broker-prefix", &prefix]);
        match (&db, &schema) {
            (Some(db), _) => cmd.arg("--db").arg(db),
            (None, Some(schema)) => cmd.args(["--pg-schema", schema]),
            (None, None) => return Err("no shared store for the workers".into()),
        };
        let mut child =
            cmd.stdout(std::process::Stdio::piped()).spawn().map_err(|e| format!("starting a worker: {e}"))?;
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().expect("piped")));
        match lines.next() {
            Some(Ok(l)) if l == "ready" => {}
            other => return Err(format!("a worker did not start: {other:?}")),
        }
        workers.push((child, lines));
    }
    let m = measured_workload(&client, args).await;
    client.shutdown().await;
    // The processes' counters, summed (the largest RSS).
    let mut fleet = process_stats(&client);
    // Each worker process's turns, in start order: how evenly the processes shared the work.
    let mut turns_per_worker = Vec::with_capacity(workers.len());
    for (child, mut lines) in workers {
        let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let stats: serde_json::Value = match lines.next() {
            Some(Ok(l)) => {
                serde_json::from_str(&l).map_err(|e| format!("a worker's last line is not its stats ({e}): {l}"))?
            }
            other => return Err(format!("a worker ended without its stats: {other:?}")),
        };
        turns_per_worker.push(stats["turns"].clone());
        for (key, value) in stats.as_object().into_iter().flatten() {
            let (sum, add) = (fleet[key].as_f64().unwrap_or(0.0), value.as_f64().unwrap_or(f64::NAN));
            fleet[key] = serde_json::json!(if key == "rss_mb" { sum.max(add) } else { sum + add });
        }
        let mut child = child;
        let _ = child.wait();
    }
    if let Some(db) = db {
        remove_db(&db);
    }
    if let Some(broker) = broker
        && let Err(e) = broker.destroy().await
    {
        eprintln!("durable-bench: could not remove the broker's {prefix} stream or keys: {e}");
    }
    cleanup().await;
    let mut m = m?;
    let rss = fleet["rss_mb"].as_f64().unwrap_or(f64::NAN);
    let extra = m.extra.get_or_insert_with(|| serde_json::json!({}));
    for key in ["turns", "turns_without_progress", "runs_sent", "pg_round_trips", "pg_reads", "pg_claims", "pg_retries"]
    {
        if !fleet[key].is_null() {
            extra[format!("fleet_{key}")] = fleet[key].clone();
        }
    }
    extra["turns_per_worker"] = turns_per_worker.into();
    Ok((m, rss))
}

/// A worker process: an engine executing runs from the shared run queue and, in
/// `remote_chain`, a remote-step worker beside it, until SIGTERM; then prints its stats
/// (`process_stats`) as its last line.
async fn worker(args: &Args) -> Result<(), String> {
    let prefix = args.broker_prefix.as_deref().unwrap_or("durable_bench");
    let broker = connect_broker(args, prefix).await?;
    let engine = shared_engine(args, args.db.as_deref(), broker.as_ref(), true).await?;
    // `.engine(..)`: the engine's store, a claim as soon as it dispatches a task, and the run
    // woken in this process when a result is recorded.
    let steps = (args.workload == "remote_chain")
        .then(|| remote_worker(durable::Worker::builder().engine(&engine).concurrency(256)).build());
    println!("ready");
    match steps {
        Some(steps) => {
            tokio::join!(engine.run_worker(durable::shutdown_signal()), steps.run(durable::shutdown_signal()));
        }
        None => {
            engine.run_worker(durable::shutdown_signal()).await;
        }
    }
    println!("{}", process_stats(&engine));
    Ok(())
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
    if args.role_probe {
        return match rt.block_on(scale::probe(&args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("durable-bench scale probe: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.role_worker {
        return match rt.block_on(worker(&args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("durable-bench worker: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    match rt.block_on(run(&args)) {
        Ok((mut m, rss)) => {
            m.latencies.sort_by(f64::total_cmp);
            let wall = m.wall.as_secs_f64();
            let mut result = serde_json::json!({
                "workload": args.workload,
                "store": args.store,
                "runs": m.runs,
                "steps_per_run": m.steps_per_run,
                "wall_s": wall,
                "steps_per_s": (m.runs * m.steps_per_run) as f64 / wall,
                "runs_per_s": m.runs as f64 / wall,
                "p50_ms": percentile(&m.latencies, 0.50),
                "p99_ms": percentile(&m.latencies, 0.99),
                "peak_rss_mb": rss,
                "cpu_s": cpu_seconds(),
                "workers": args.workers,
                "transport": if args.workers > 0 { args.transport.as_str() } else { "in_process" },
                "turns": m.turns.map(|t| t.0),
                "turns_without_progress": m.turns.map(|t| t.1),
            });
            if let (Some(serde_json::Value::Object(extra)), Some(obj)) = (m.extra.take(), result.as_object_mut()) {
                obj.extend(extra);
            }
            println!("{result}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("durable-bench: {} on {}: {e}", args.workload, args.store);
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pg_url_is_local;

    #[test]
    fn a_postgres_url_is_local_for_loopback_localhost_and_sockets_only() {
        for local in [
            "postgres://postgres@127.0.0.1:5432/test",
            "postgres://localhost/db",
            "postgresql://u:p@[::1]:5433/db?sslmode=disable",
            "postgres:///db",
            "host=/var/run/postgresql dbname=test",
        ] {
            assert!(pg_url_is_local(local), "{local}");
        }
        for remote in ["postgres://u@db.example.com/x", "postgres://localhost.example.com/x", "host=10.0.0.5 user=u"] {
            assert!(!pg_url_is_local(remote), "{remote}");
        }
    }
}
