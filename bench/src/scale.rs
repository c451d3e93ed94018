//! The `scale` workload: N suspended runs in one SQLite file (`--runs`, default 1,000,000),
//! then what a fresh engine process costs over them.
//!
//! **Populate** (this process). N runs of four workflows (`order` 40%, `invoice` 30%,
//! `shipment` 20%, `refund` 10%) over 16 namespaces (`tenant-0`…`tenant-15`), each tagged with
//! one of 10,000 customers (`customer-<n>`) and one in 100,000 also `vip`, are started with
//! [`Engine::start_many`] in chunks of [`CHUNK`] on an engine that executes them. Each run's
//! first turn waits up to 30 days for its signal (`s-<i>`), so the turn's commit writes the wait
//! (its checkpoints and its waiter) and suspends the run: the engine's own write path, store
//! batches and group commit included. One run in N/100 (100 in all) completes at once and one
//! in N/10 fails: the rare statuses. The next chunk is started while the engine still executes
//! the one before, so at most two chunks are in memory. The engine then shuts down, the WAL is
//! checkpointed into the file, and `bytes_per_run` is the file's growth over an empty store
//! divided by N (every table and index; `tables` breaks the file down by table and index, from
//! SQLite's `dbstat`).
//!
//! **Probe** (a child process: this binary with `--role scale-probe`, so nothing of the
//! populating process is warm). It opens the file and builds an engine that executes runs
//! (`startup_ms`: store open with its schema check, engine build, workflows registered), idles
//! with its pollers running (`idle_rss_mb`: the resident set then), times the first page (100
//! runs, the default) of every `list_runs` filter — cold (`cold_ms`, the first call) and warm
//! (`warm_ms`, the median of 4 more) — then signals 100 of the suspended runs at once and times
//! until all 100 have completed (`wake_100_ms`), and reads the runs' counts by status. It prints
//! one JSON line.
//!
//! **Checkpoints.** On two fresh files, K runs of a workflow of S one-line steps (an integer
//! output: a small payload) and K runs of none; `bytes_per_checkpoint` is the difference in
//! size divided by K × S: what one more checkpoint costs, indexes and page slack included.
//! `checkpoint_row_bytes` is the checkpoints table's own pages per checkpoint row (`dbstat`).
//!
//! `p50_ms` / `p99_ms` of the result are over the filters' cold first pages; `runs_per_s` is the
//! populate rate; `peak_rss_mb` the populating process's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable::{Engine, RunFilter, RunStatus, SqliteStore, StartOptions, WorkflowCtx, WorkflowError};
use serde_json::json;

use crate::{Args, Measured, now_ms, percentile, remove_db};

/// The workflows, by share of the runs (`workflow_of`).
const WORKFLOWS: [&str; 4] = ["order", "invoice", "shipment", "refund"];
/// Namespaces `tenant-0`…
const NAMESPACES: u64 = 16;
/// Tags `customer-0`…
const CUSTOMERS: u64 = 10_000;
/// One run in this many also carries the tag `vip`.
const VIP_EVERY: u64 = 100_000;
/// How long each run waits for its signal.
const WAIT: Duration = Duration::from_secs(30 * 24 * 3600);
/// Runs per `start_many` call of the populate.
const CHUNK: u64 = 5_000;
/// Runs signalled at once by the probe.
const WAKES: u64 = 100;
/// The smallest `--runs`: 100 strata of at least 100 runs (see `mode_of`).
pub(crate) const MIN_RUNS: u64 = 10_000;
/// What a run does: wait for its signal, complete at once, or fail at once.
const WAITS: u8 = 0;
const COMPLETES: u8 = 1;
const FAILS: u8 = 2;
/// The step workflow of the checkpoint measurement.
const STEPPER: &str = "stepper";

fn workflow_of(i: u64) -> &'static str {
    match i % 10 {
        0..=3 => WORKFLOWS[0],
        4..=6 => WORKFLOWS[1],
        7 | 8 => WORKFLOWS[2],
        _ => WORKFLOWS[3],
    }
}

/// The runs fall in 100 strata of `n / 100`: one run near the start of each completes, one
/// of every tenth stratum fails, one near the middle of each is among the 100 woken by the
/// probe (offset by the stratum, so they spread over the workflows).
fn stride(n: u64) -> u64 {
    (n / 100).max(100)
}

fn mode_of(i: u64, n: u64) -> u8 {
    let (stratum, k) = (i / stride(n), i % stride(n));
    if k == 1 + stratum % 10 {
        COMPLETES
    } else if k == 11 && stratum % 10 == 0 {
        FAILS
    } else {
        WAITS
    }
}

fn woken(n: u64) -> impl Iterator<Item = u64> {
    (0..WAKES).map(move |s| s * stride(n) + stride(n) / 2 + s % 10).filter(move |i| *i < n)
}

fn token(i: u64) -> String {
    format!("s-{i}")
}

fn start_item(i: u64, n: u64) -> (&'static str, (u64, u8), StartOptions) {
    let mut options = StartOptions::new().namespace(format!("tenant-{}", i % NAMESPACES));
    options = options.tag(format!("customer-{}", (i / 3) % CUSTOMERS));
    if i % VIP_EVERY == 7 {
        options = options.tag("vip");
    }
    (workflow_of(i), (i, mode_of(i, n)), options)
}

/// The workload's workflows (the populating engine, the probe's and the checkpoint runs').
fn register(engine: &Engine) {
    for name in WORKFLOWS {
        engine.register(name, 1, |ctx: WorkflowCtx, (i, mode): (u64, u8)| async move {
            match mode {
                COMPLETES => Ok(i),
                FAILS => Err(WorkflowError::new("declined")),
                _ => {
                    let got: Option<u64> = ctx.wait_for_signal_timeout(&token(i), WAIT).await?;
                    Ok(got.unwrap_or(0))
                }
            }
        });
    }
    engine.register(STEPPER, 1, |ctx: WorkflowCtx, steps: u32| async move {
        let mut sum = 0u64;
        for j in 0..steps {
            sum += ctx.step("work", move |_| async move { Ok(u64::from(j) * 7) }).await?;
        }
        Ok::<_, WorkflowError>(sum)
    });
}

fn open_engine(db: &Path) -> Result<Engine, String> {
    let store = SqliteStore::open(db).map_err(|e| format!("opening {}: {e}", db.display()))?;
    let engine = Engine::builder().store(store).build().map_err(|e| e.to_string())?;
    register(&engine);
    Ok(engine)
}

/// Waits until the engine has run at least `turns` turns and, if `idle`, has none in flight
/// or queued. Fails when nothing moves for a minute.
async fn settle(engine: &Engine, turns: u64, idle: bool) -> Result<(), String> {
    let (mut last, mut since) = (u64::MAX, Instant::now());
    loop {
        let m = engine.metrics();
        if m.turns >= turns && (!idle || (m.turns_in_flight == 0 && m.runs_queued == 0)) {
            return Ok(());
        }
        if m.turns != last {
            (last, since) = (m.turns, Instant::now());
        } else if since.elapsed() > Duration::from_secs(60) {
            return Err(format!("the engine is stuck at {} turns of {turns} for a minute", m.turns));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Merges the WAL into the file (after every engine on it has closed) and returns its size.
fn file_bytes(db: &Path) -> Result<u64, String> {
    let conn = rusqlite::Connection::open(db).map_err(|e| e.to_string())?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).map_err(|e| e.to_string())?;
    drop(conn);
    let size = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    Ok(size(db.to_path_buf()) + size(PathBuf::from(format!("{}-wal", db.display()))))
}

/// The file's bytes by table and index (SQLite's `dbstat`: pages, and the payload in them),
/// the largest first.
fn tables(db: &Path) -> Result<Vec<serde_json::Value>, String> {
    let conn = rusqlite::Connection::open(db).map_err(|e| e.to_string())?;
    let mut stmt = conn
        .prepare(
            "SELECT name, COUNT(*), SUM(pgsize), SUM(payload), SUM(ncell) FROM dbstat \
             GROUP BY name ORDER BY SUM(pgsize) DESC",
        )
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map([], |r| {
            Ok(json!({
                "name": r.get::<_, String>(0)?,
                "pages": r.get::<_, i64>(1)?,
                "bytes": r.get::<_, i64>(2)?,
                "payload": r.get::<_, i64>(3)?,
                "cells": r.get::<_, i64>(4)?,
            }))
        })
        .map_err(|e| e.to_string())?;
    rows.collect::<Result<_, _>>().map_err(|e| e.to_string())
}

/// The rows of a table.
fn count_rows(db: &Path, table: &str) -> Result<u64, String> {
    let conn = rusqlite::Connection::open(db).map_err(|e| e.to_string())?;
    conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
        .map_err(|e| e.to_string())
}

/// The resident set (`VmRSS`) or its peak (`VmHWM`) of this process, in MiB.
fn rss_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .map(|kb: f64| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// The populate: what it made and how fast.
struct Populated {
    wall: Duration,
    turns: u64,
    turns_without_progress: u64,
    /// A created range in the middle of the runs: `[after, before)`.
    range: (u64, u64),
}

async fn populate(db: &Path, n: u64) -> Result<Populated, String> {
    let engine = open_engine(db)?;
    let began = Instant::now();
    let mut range = (0, 0);
    let mut first = 0;
    while first < n {
        let last = (first + CHUNK).min(n);
        let middle = (first..last).contains(&(n / 2));
        if middle {
            range.0 = now_ms();
        }
        engine.start_many((first..last).map(|i| start_item(i, n))).await.map_err(|e| e.to_string())?;
        if middle {
            range.1 = now_ms() + 1;
        }
        // The chunks before have had their turns: at most two chunks in memory.
        settle(&engine, first, false).await?;
        first = last;
        if first % (CHUNK * 200) == 0 {
            eprintln!("durable-bench: scale: {first} of {n} runs started ({:.0} s)", began.elapsed().as_secs_f64());
        }
    }
    settle(&engine, n, true).await?;
    let wall = began.elapsed();
    let m = engine.metrics();
    engine.shutdown().await;
    drop(engine);
    Ok(Populated { wall, turns: m.turns, turns_without_progress: m.turns_without_progress, range })
}

/// The `list_runs` filters the probe times, by name.
fn filters(range: (u64, u64)) -> Vec<(&'static str, RunFilter)> {
    let f = RunFilter::default;
    let status = |s: RunStatus| RunFilter { statuses: vec![s], ..f() };
    let (after, before) = (Some(range.0), Some(range.1));
    vec![
        ("none", f()),
        ("status=suspended", status(RunStatus::Suspended)),
        ("status=completed (100 runs)", status(RunStatus::Completed)),
        ("status=running (none)", status(RunStatus::Running)),
        ("status=failed (10 runs)", status(RunStatus::Failed)),
        ("status=pending (none)", status(RunStatus::Pending)),
        ("status=completed|failed", RunFilter { statuses: vec![RunStatus::Completed, RunStatus::Failed], ..f() }),
        ("workflow=order", RunFilter { workflow: Some("order".into()), ..f() }),
        ("workflow=refund", RunFilter { workflow: Some("refund".into()), ..f() }),
        ("namespace=tenant-3", RunFilter { namespace: Some("tenant-3".into()), ..f() }),
        ("tag=customer-42", RunFilter { tag: Some("customer-42".into()), ..f() }),
        ("tag=vip", RunFilter { tag: Some("vip".into()), ..f() }),
        ("created in a middle range", RunFilter { created_after: after, created_before: before, ..f() }),
        ("created before the middle", RunFilter { created_before: after, ..f() }),
        (
            "workflow=invoice+status=suspended",
            RunFilter { workflow: Some("invoice".into()), statuses: vec![RunStatus::Suspended], ..f() },
        ),
        (
            "workflow=order+status=completed",
            RunFilter { workflow: Some("order".into()), statuses: vec![RunStatus::Completed], ..f() },
        ),
        (
            "workflow=order+status=failed",
            RunFilter { workflow: Some("order".into()), statuses: vec![RunStatus::Failed], ..f() },
        ),
        (
            "namespace=tenant-3+status=completed",
            RunFilter { namespace: Some("tenant-3".into()), statuses: vec![RunStatus::Completed], ..f() },
        ),
        (
            "workflow=refund+namespace=tenant-9",
            RunFilter { workflow: Some("refund".into()), namespace: Some("tenant-9".into()), ..f() },
        ),
        (
            "tag=customer-42+status=suspended",
            RunFilter { tag: Some("customer-42".into()), statuses: vec![RunStatus::Suspended], ..f() },
        ),
        (
            "tag=customer-42+workflow=invoice",
            RunFilter { tag: Some("customer-42".into()), workflow: Some("invoice".into()), ..f() },
        ),
        (
            "workflow=shipment+created in the middle range",
            RunFilter { workflow: Some("shipment".into()), created_after: after, created_before: before, ..f() },
        ),
        (
            "status=suspended+created in the middle range",
            RunFilter { statuses: vec![RunStatus::Suspended], created_after: after, created_before: before, ..f() },
        ),
    ]
}

/// The child process: a fresh engine on the populated file; prints its measurements as one
/// JSON line.
pub(crate) async fn probe(args: &Args) -> Result<(), String> {
    let db = args.db.as_deref().ok_or("--role scale-probe needs --db")?;
    let n = args.runs.ok_or("--role scale-probe needs --runs")?;
    let range = args.created_range.ok_or("--role scale-probe needs --created-range")?;
    let t0 = Instant::now();
    let store = SqliteStore::open(db).map_err(|e| format!("opening {}: {e}", db.display()))?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let engine = Engine::builder().store(store).build().map_err(|e| e.to_string())?;
    register(&engine);
    let startup_ms = t0.elapsed().as_secs_f64() * 1e3;
    // Idle with the pollers running (due, pending and orphan scans: several rounds of each).
    tokio::time::sleep(Duration::from_secs(if args.quick { 1 } else { 6 })).await;
    let idle_rss_mb = rss_mb("VmRSS:");
    let mut timed = serde_json::Map::new();
    let mut worst = (0.0f64, "");
    for (name, filter) in filters(range) {
        let t = Instant::now();
        let page = engine.list_runs(&filter).await.map_err(|e| format!("list_runs {name}: {e}"))?;
        let cold = t.elapsed().as_secs_f64() * 1e3;
        let mut warm = Vec::new();
        for _ in 0..4 {
            let t = Instant::now();
            engine.list_runs(&filter).await.map_err(|e| e.to_string())?;
            warm.push(t.elapsed().as_secs_f64() * 1e3);
        }
        warm.sort_by(f64::total_cmp);
        if cold > worst.0 {
            worst = (cold, name);
        }
        timed.insert(
            name.into(),
            json!({ "rows": page.runs.len(), "cold_ms": cold, "warm_ms": percentile(&warm, 0.5) }),
        );
    }
    // 100 wakes: all signalled at once; done when every one of them has completed.
    let began = Instant::now();
    let mut tasks = Vec::new();
    for i in woken(n) {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let delivery = engine.signal(&token(i), &i).await?;
            let durable::store::Delivery::Delivered { run_id, .. } = delivery else {
                return Ok(Err(format!("the signal of run {i} found no waiter")));
            };
            let out: u64 = engine.wait_for_run(&run_id).await?.output()?;
            Ok::<_, durable::Error>(if out == i { Ok(()) } else { Err(format!("run {i} returned {out}")) })
        }));
    }
    let woken_runs = tasks.len();
    for t in tasks {
        t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())??;
    }
    let wake_100_ms = began.elapsed().as_secs_f64() * 1e3;
    let rss_after_mb = rss_mb("VmRSS:");
    let mut counts = BTreeMap::new();
    for c in engine.store().run_counts().await.map_err(|e| e.to_string())? {
        *counts.entry(c.status.as_str().to_string()).or_insert(0u64) += c.count;
    }
    engine.shutdown().await;
    println!(
        "{}",
        json!({
            "open_ms": open_ms,
            "startup_ms": startup_ms,
            "idle_rss_mb": idle_rss_mb,
            "rss_after_mb": rss_after_mb,
            "filters": timed,
            "slowest_filter": worst.1,
            "slowest_filter_ms": worst.0,
            "woken_runs": woken_runs,
            "wake_100_ms": wake_100_ms,
            "counts": counts,
        })
    );
    Ok(())
}

/// Bytes per checkpoint: two fresh files, `k` runs of `steps` steps and `k` of none; the
/// difference in size per step. Also the checkpoints table's pages per row in the first.
async fn checkpoint_bytes(args: &Args, k: u64, steps: u32) -> Result<serde_json::Value, String> {
    let mut sizes = Vec::new();
    let mut row_bytes = f64::NAN;
    for s in [steps, 0] {
        let db = args.dir.join(format!("bench-scale-checkpoints-{s}-{}.db", std::process::id()));
        remove_db(&db);
        let engine = open_engine(&db)?;
        let items = (0..k).map(|_| (STEPPER, s, StartOptions::new()));
        let started = engine.start_many(items).await.map_err(|e| e.to_string())?;
        settle(&engine, k, true).await?;
        for run in &started {
            engine
                .wait_for_run(&run.id)
                .await
                .map_err(|e| e.to_string())?
                .output::<u64>()
                .map_err(|e| e.to_string())?;
        }
        engine.shutdown().await;
        drop(engine);
        sizes.push(file_bytes(&db)?);
        if s > 0 {
            let rows = count_rows(&db, "checkpoints")?;
            let bytes: i64 = tables(&db)?
                .iter()
                .filter(|t| t["name"] == "checkpoints")
                .map(|t| t["bytes"].as_i64().unwrap_or(0))
                .sum();
            row_bytes = bytes as f64 / rows.max(1) as f64;
        }
        remove_db(&db);
    }
    let per = (sizes[0] as f64 - sizes[1] as f64) / (k * u64::from(steps)) as f64;
    Ok(json!({
        "bytes_per_checkpoint": per,
        "checkpoint_row_bytes": row_bytes,
        "checkpoint_runs": k,
        "checkpoint_steps": steps,
    }))
}

/// The whole workload: populate, probe in a child process, checkpoints.
pub(crate) async fn scale(args: &Args) -> Result<(Measured, f64), String> {
    if args.store != "sqlite" {
        return Err("the scale workload measures one SQLite file: --store sqlite".into());
    }
    if args.workers > 0 {
        return Err("the scale workload runs in one process and a probe (no --workers)".into());
    }
    let n = args.runs.unwrap_or(if args.quick { 10_000 } else { 1_000_000 });
    if n < MIN_RUNS {
        return Err(format!("--runs {n}: the scale workload needs at least {MIN_RUNS} runs"));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let db = args.dir.join(format!("bench-scale-{}.db", std::process::id()));
    remove_db(&db);
    let result = measure(args, &db, n).await;
    remove_db(&db);
    result
}

async fn measure(args: &Args, db: &Path, n: u64) -> Result<(Measured, f64), String> {
    drop(SqliteStore::open(db).map_err(|e| e.to_string())?);
    let empty = file_bytes(db)?;
    let populated = populate(db, n).await?;
    let peak = rss_mb("VmHWM:");
    let size = file_bytes(db)?;
    let breakdown = tables(db)?;
    let checkpoint_rows = count_rows(db, "checkpoints")?;
    let waiter_rows = count_rows(db, "waiters")?;
    eprintln!(
        "durable-bench: scale: {n} runs in {:.1} s ({:.0} runs/s), {:.0} MB; probing",
        populated.wall.as_secs_f64(),
        n as f64 / populated.wall.as_secs_f64(),
        size as f64 / 1e6
    );
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["--role", "scale-probe", "--store", "sqlite", "--workload", "scale", "--db"]).arg(db);
    cmd.args(["--runs", &n.to_string(), "--created-range", &format!("{},{}", populated.range.0, populated.range.1)]);
    if args.quick {
        cmd.arg("--quick");
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output().map_err(|e| format!("starting the probe: {e}"))?;
    if !out.status.success() {
        return Err(format!("the probe failed ({})", out.status));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let mut probe: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("the probe printed no JSON ({e}): {line}"))?;
    let (k, steps) = if args.quick { (1_000, 20) } else { (10_000, 20) };
    let checkpoints = checkpoint_bytes(args, k, steps).await?;
    let mut latencies: Vec<f64> =
        probe["filters"].as_object().into_iter().flatten().filter_map(|(_, f)| f["cold_ms"].as_f64()).collect();
    latencies.sort_by(f64::total_cmp);
    let extra = probe.as_object_mut().ok_or("the probe's line is not an object")?;
    extra.insert("populate_s".into(), json!(populated.wall.as_secs_f64()));
    extra.insert("file_mb".into(), json!(size as f64 / 1e6));
    extra.insert("bytes_per_run".into(), json!((size - empty) as f64 / n as f64));
    extra.insert("checkpoint_rows".into(), json!(checkpoint_rows));
    extra.insert("waiter_rows".into(), json!(waiter_rows));
    extra.insert("tables".into(), json!(breakdown.into_iter().take(16).collect::<Vec<_>>()));
    extra.extend(checkpoints.as_object().cloned().unwrap_or_default());
    let m = Measured {
        runs: n as usize,
        steps_per_run: 0,
        wall: populated.wall,
        latencies,
        turns: Some((populated.turns, populated.turns_without_progress)),
        extra: Some(probe),
    };
    Ok((m, peak))
}
