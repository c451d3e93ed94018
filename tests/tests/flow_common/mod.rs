//! What the multi-process flow-control tests share: the worker processes
//! (`src/bin/flow_worker.rs`), the scenarios and the checks of their ledger.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use durable::{Engine, RunId, RunStatus, StartOptions};
use serde_json::json;
use tokio::sync::mpsc;

/// How long a scenario may take before it fails: a hang guard, never the mechanism.
const LIMIT: Duration = Duration::from_secs(120);

/// The worker processes, SIGKILLed on drop if still running (a failing test leaks none).
#[derive(Default)]
pub(crate) struct Workers {
    children: Vec<Child>,
    lines: Option<mpsc::UnboundedSender<(usize, String)>>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Workers {
    /// Starts `flow_worker <args>` with `env` and waits for its `ready` line.
    async fn spawn(&mut self, args: &[&str], env: &[(&str, &str)], rx: &mut mpsc::UnboundedReceiver<(usize, String)>) {
        let index = self.children.len();
        let mut child = Command::new(env!("CARGO_BIN_EXE_flow_worker"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start flow_worker");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let lines = self.lines.clone().expect("a line channel");
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if lines.send((index, line)).is_err() {
                    return;
                }
            }
        });
        self.children.push(child);
        loop {
            let (w, line) = tokio::time::timeout(LIMIT, rx.recv()).await.expect("ready in time").expect("lines");
            if w == index && line.starts_with("ready ") {
                return;
            }
        }
    }

    fn new() -> (Self, mpsc::UnboundedReceiver<(usize, String)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Workers { children: Vec::new(), lines: Some(tx) }, rx)
    }
}

/// Waits for every run of `ids` to complete (a failure after [`LIMIT`]).
async fn all_complete(engine: &Engine, ids: &[RunId]) {
    let wait = async {
        for id in ids {
            let outcome = engine.wait_for_run(id).await.expect("the run settles");
            assert_eq!(outcome.status(), RunStatus::Completed, "run {id}: {:?}", outcome.run.error);
        }
    };
    tokio::time::timeout(LIMIT, wait).await.expect("every run completes in time");
}

fn ledger_lines(ledger: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_string).collect())
        .collect()
}

/// Prints, for each run whose step started more than once, its ledger lines (with the process
/// and the attempt), its checkpoints and its claim count: what a failure needs to be explained.
async fn explain_repeated_steps(client: &Engine, ledger: &Path) {
    let mut starts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in ledger_lines(ledger).into_iter().filter(|l| l[0] == "start") {
        starts.entry(l[2].clone()).or_default().push(l.join(" "));
    }
    for (run, lines) in starts.iter().filter(|(_, lines)| lines.len() > 1) {
        let id = RunId::from(run.as_str());
        eprintln!("run {run}: its step started {} times: {lines:?}", lines.len());
        for cp in client.history(&id).await.unwrap_or_default() {
            eprintln!(
                "  seq {} {} {:?}, attempts {}, started {}",
                cp.seq, cp.name, cp.status, cp.attempts, cp.started_at
            );
        }
        if let Ok(Some(r)) = client.get_run(&id).await {
            eprintln!("  claims {}, recoveries {}, updated {}", r.claims, r.recovery_attempts, r.updated_at);
        }
    }
}

/// Acceptance 1: three worker processes run 300 runs over 10 keys with a limit of 2 per key;
/// the ledger of (key, start, end) never shows more than 2 runs of one key at once.
pub(crate) async fn three_processes_keyed_runs(client: &Engine, args: &[&str], env: &[(&str, &str)], ledger: &Path) {
    let (mut workers, mut rx) = Workers::new();
    let env: Vec<(&str, &str)> = env.iter().copied().chain([("LEASE_MS", "15000")]).collect();
    for _ in 0..3 {
        workers.spawn(args, &env, &mut rx).await;
    }
    let began = Instant::now();
    let runs = (0..300)
        .map(|i| ("keyed", json!({ "key": format!("k{}", i % 10), "n": i }), StartOptions::id(format!("keyed-{i}"))));
    let started = client.start_many(runs).await.expect("start 300 runs");
    let ids: Vec<RunId> = started.into_iter().map(|s| s.id).collect();
    all_complete(client, &ids).await;
    let wall = began.elapsed();
    let mut events: BTreeMap<String, Vec<(u128, i32)>> = BTreeMap::new();
    let mut starts = 0;
    for l in ledger_lines(ledger) {
        let at: u128 = l[3].parse().expect("a time");
        match l[0].as_str() {
            "start" => {
                starts += 1;
                events.entry(l[1].clone()).or_default().push((at, 1));
            }
            "end" => events.entry(l[1].clone()).or_default().push((at, -1)),
            other => panic!("unexpected ledger line {other}"),
        }
    }
    if starts != 300 {
        explain_repeated_steps(client, ledger).await;
    }
    assert_eq!(starts, 300, "each run's step ran once");
    let mut peaks = BTreeMap::new();
    for (key, mut ev) in events {
        // At the same microsecond an end goes before a start (the start came later).
        ev.sort();
        let (mut now, mut peak) = (0, 0);
        for (_, d) in ev {
            now += d;
            peak = peak.max(now);
        }
        assert!(peak <= 2, "key {key} had {peak} runs at once");
        peaks.insert(key, peak);
    }
    println!("300 keyed runs over 10 keys (limit 2) on 3 processes in {wall:?}; peak per key {peaks:?}");
}

/// Acceptance 2: a queue of 10 per second driven by 50 runs (200 calls, at least 20 s) across
/// three processes: no one-second window admits more than 10.
pub(crate) async fn rate_limited_queue(client: &Engine, args: &[&str], env: &[(&str, &str)], ledger: &Path) {
    let (mut workers, mut rx) = Workers::new();
    let env: Vec<(&str, &str)> = env.iter().copied().chain([("LEASE_MS", "15000")]).collect();
    for _ in 0..3 {
        workers.spawn(args, &env, &mut rx).await;
    }
    let began = Instant::now();
    let runs = (0..50u32).map(|i| ("rated", i, StartOptions::id(format!("rated-{i}"))));
    let ids: Vec<RunId> = client.start_many(runs).await.expect("start 50 runs").into_iter().map(|s| s.id).collect();
    all_complete(client, &ids).await;
    let wall = began.elapsed();
    let mut per_window: BTreeMap<u64, u32> = BTreeMap::new();
    let mut calls = 0;
    for l in ledger_lines(ledger).into_iter().filter(|l| l[0] == "call") {
        calls += 1;
        let at: u64 = l[3].parse().expect("an admission time");
        *per_window.entry(at / 1_000).or_default() += 1;
    }
    assert_eq!(calls, 200, "each of the 200 calls ran once");
    let worst = per_window.values().max().copied().unwrap_or(0);
    assert!(worst <= 10, "a one-second window admitted {worst}: {per_window:?}");
    assert!(per_window.len() >= 20, "200 calls at 10 per second take at least 20 windows: {per_window:?}");
    println!("200 calls at 10/s over {} windows in {wall:?}; busiest window {worst}", per_window.len());
}

/// Acceptance 5: the process holding a queue's only slot is SIGKILLed mid-step; the slot comes
/// back after the lease (not leaked): a run waiting for it completes, and so does the killed
/// run, recovered by another process.
pub(crate) async fn sigkilled_holder(client: &Engine, args: &[&str], env: &[(&str, &str)], ledger: &Path) {
    let (mut workers, mut rx) = Workers::new();
    let hog_env: Vec<(&str, &str)> = env.iter().copied().chain([("HOG", "1")]).collect();
    workers.spawn(args, &hog_env, &mut rx).await;
    let first = client.start("hog", &1u32, StartOptions::id("hog-1")).await.expect("start").id;
    let deadline = Instant::now() + LIMIT;
    while !ledger_lines(ledger).iter().any(|l| l[0] == "hold" && l[1] == "hog-1") {
        assert!(Instant::now() < deadline, "hog-1 never took the slot");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    workers.children[0].kill().expect("SIGKILL the holder");
    let _ = workers.children[0].wait();
    let killed = Instant::now();
    let second = client.start("hog", &2u32, StartOptions::id("hog-2")).await.expect("start").id;
    workers.spawn(args, env, &mut rx).await;
    all_complete(client, &[second.clone(), first.clone()]).await;
    let stats = client.admission_stats().await.expect("stats");
    let solo = stats.iter().find(|g| g.gate.ends_with(":solo")).expect("the solo queue");
    assert_eq!((solo.held, solo.waiting), (0, 0), "no slot leaked: {solo:?}");
    println!("the killed holder's slot came back; both runs done {:?} after the kill", killed.elapsed());
}
