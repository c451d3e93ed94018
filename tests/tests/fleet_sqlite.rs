//! Many workers, one SQLite file, real processes: work is shared out through the store-backed
//! run queue, a SIGKILLed worker's runs are recovered by the others, a poison run ends `dead`,
//! and SIGTERM drains a worker whose unfinished runs complete elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A temp dir of the test's own (removed with everything in it when the test ends) and the
/// database file the workers share in it.
fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("fleet.db");
    (dir, db)
}

/// A worker process whose stdout lines arrive on `lines` as `(worker, line)`.
fn spawn(index: usize, db: &PathBuf, args: &[&str], lines: &mpsc::Sender<(usize, String)>) -> Child {
    spawn_with(index, db, args, lines, &[])
}

fn spawn_with(
    index: usize,
    db: &PathBuf,
    args: &[&str],
    lines: &mpsc::Sender<(usize, String)>,
    env: &[(&str, &str)],
) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleet_worker"))
        .envs(env.iter().copied())
        .arg(db)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start fleet_worker");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let lines = lines.clone();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if lines.send((index, line)).is_err() {
                break;
            }
        }
    });
    child
}

/// Three workers (indexes 0–2) executing `fleet` runs with steps of `step_ms`, once all of
/// them said they are ready.
fn ready_workers(
    db: &PathBuf,
    step_ms: &str,
    tx: &mpsc::Sender<(usize, String)>,
    rx: &mpsc::Receiver<(usize, String)>,
) -> Vec<Child> {
    let workers: Vec<Child> = (0..3).map(|i| spawn(i, db, &["work", step_ms], tx)).collect();
    let mut ready = 0;
    while ready < 3 {
        ready += usize::from(rx.recv().expect("workers talking").1.starts_with("ready"));
    }
    workers
}

fn terminate(child: &Child) {
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill -TERM");
}

/// Reads the store after the processes are gone.
fn runs(db: &PathBuf) -> Vec<durable::Run> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = durable::SqliteStore::open(db).unwrap();
        let filter = durable::RunFilter { limit: 10_000, ..Default::default() };
        durable::store::Store::list_runs(&store, &filter).await.unwrap().runs
    })
}

#[test]
fn three_workers_share_500_runs_and_survive_a_sigkill() {
    const RUNS: usize = 500;
    let (_dir, db) = temp_db();
    let (tx, rx) = mpsc::channel();
    // Create the file (and its schema) before four processes race to.
    drop(runs(&db));
    // Steps of 2 ms: the runs outlast the two first workers' slots (64 each), so every worker
    // holds runs in flight when one is killed (instant steps: the next test).
    let mut workers = ready_workers(&db, "2", &tx, &rx);
    let mut starter = spawn(3, &db, &["start", &RUNS.to_string()], &tx);

    let mut committed: BTreeMap<(String, u32), usize> = BTreeMap::new();
    // Runs a surviving worker took over from the killed one's expired leases.
    let mut recovered: BTreeSet<String> = BTreeSet::new();
    let mut per_worker = [0usize; 3];
    let mut killed: Option<usize> = None;
    let mut killed_at: Option<std::time::Instant> = None;
    // After the kill: when each run first committed a step again (for the recovery time).
    let mut first_after_kill: BTreeMap<String, std::time::Instant> = BTreeMap::new();
    let mut all_done = false;
    while !all_done {
        let (worker, line) = rx.recv().expect("a worker or the starter is still talking");
        if worker == 3 {
            assert!(!line.starts_with("not completed"), "{line}");
            all_done = line == "all done";
            continue;
        }
        if let Some(run) = line.strip_prefix("recovered ") {
            recovered.insert(run.to_string());
        }
        if let Some(rest) = line.strip_prefix("committed ") {
            let (run, seq) = rest.rsplit_once(' ').unwrap();
            let seq: u32 = seq.parse().unwrap();
            if let Some(first) = committed.insert((run.to_string(), seq), worker) {
                panic!("step {seq} of {run} committed twice (workers {first} and {worker})");
            }
            per_worker[worker] += 1;
            if killed_at.is_some() && killed != Some(worker) {
                first_after_kill.entry(run.to_string()).or_insert_with(std::time::Instant::now);
            }
            if killed.is_none() && committed.len() >= RUNS * 10 / 2 {
                // Kill the worker that just committed: it holds runs in flight.
                workers[worker].kill().expect("SIGKILL a worker");
                workers[worker].wait().unwrap();
                killed = Some(worker);
                killed_at = Some(std::time::Instant::now());
            }
        }
    }
    assert!(starter.wait().unwrap().success());
    let killed = killed.expect("the kill never happened");
    for (i, w) in workers.iter_mut().enumerate().filter(|(i, _)| *i != killed) {
        terminate(w);
        assert!(w.wait().unwrap().success(), "worker {i} did not drain cleanly");
    }
    assert!(per_worker.iter().all(|n| *n > 0), "a worker executed nothing: {per_worker:?}");

    let runs = runs(&db);
    assert_eq!(runs.len(), RUNS);
    assert!(runs.iter().all(|r| r.status == durable::RunStatus::Completed));
    assert!(!recovered.is_empty(), "no run of the killed worker was recovered");
    // Every recovered run made progress afterwards (it completed): none keeps a recovery count.
    assert!(runs.iter().all(|r| r.recovery_attempts == 0), "a completed run still counts recoveries");
    // Recovery time (reported, not asserted): from the kill to the first step a recovered run
    // committed on a surviving worker. Bounded by the lease TTL (2 s here) plus a poll.
    let kill = killed_at.unwrap();
    let recovery = recovered.iter().filter_map(|id| first_after_kill.get(id)).map(|t| t.duration_since(kill)).min();
    eprintln!(
        "steps committed per worker {per_worker:?}; {} runs recovered after the kill; recovery took {recovery:?}",
        recovered.len()
    );
}

/// Three workers and a burst of instant runs, all started at once: each worker executes at
/// least a sixth (1/(2N)) of the steps. The file's write lock decides who gets to claim and
/// commit; with SQLite's own busy handler (sleeps of up to 100 ms between tries) a worker that
/// lost the lock a few times slept while the other two took all the work (0 / 274 / 726).
#[test]
fn three_workers_share_a_burst_of_instant_runs_fairly() {
    const RUNS: usize = 600;
    let (_dir, db) = temp_db();
    let (tx, rx) = mpsc::channel();
    drop(runs(&db));
    let mut workers = ready_workers(&db, "0", &tx, &rx);
    let mut starter = spawn(3, &db, &["burst", &RUNS.to_string()], &tx);
    let mut per_worker = [0usize; 3];
    loop {
        let (worker, line) = rx.recv().expect("a worker or the starter is still talking");
        if worker == 3 {
            assert!(!line.starts_with("not completed"), "{line}");
            if line == "all done" {
                break;
            }
        } else if line.starts_with("committed ") {
            per_worker[worker] += 1;
        }
    }
    assert!(starter.wait().unwrap().success());
    for w in &mut workers {
        terminate(w);
        assert!(w.wait().unwrap().success());
    }
    // Lines still in flight from the workers' last moments.
    for (worker, line) in rx.try_iter() {
        if worker < 3 && line.starts_with("committed ") {
            per_worker[worker] += 1;
        }
    }
    let total: usize = per_worker.iter().sum();
    assert_eq!(total, RUNS * 10, "every step committed once: {per_worker:?}");
    eprintln!("steps committed per worker {per_worker:?}");
    assert!(
        per_worker.iter().all(|n| n * 6 >= total),
        "a worker executed less than a sixth of the steps: {per_worker:?}"
    );
}

#[test]
fn a_poison_run_ends_dead_and_on_dead_fires_once() {
    let (_dir, db) = temp_db();
    let marker = db.with_extension("marker");
    let (tx, rx) = mpsc::channel();
    let marker_arg = marker.to_string_lossy().to_string();
    let mut deaths = 0;
    loop {
        let mut worker = spawn(0, &db, &["poison", &marker_arg], &tx);
        let status = worker.wait().unwrap();
        if status.success() {
            break;
        }
        deaths += 1;
        assert!(deaths <= 10, "the poison run never became dead");
    }
    // The last worker's lines reach the channel through a reader thread, which may still be
    // at it when the process has exited: wait for its "settled" line, then take the rest.
    let mut settled = Vec::new();
    while settled.is_empty() {
        let (_, line) = rx.recv_timeout(Duration::from_secs(60)).expect("the last worker said how the run settled");
        if line.starts_with("settled") {
            settled.push(line);
        }
    }
    settled.extend(rx.try_iter().map(|(_, l)| l).filter(|l| l.starts_with("settled")));
    assert_eq!(settled, ["settled dead"]);
    let fired = std::fs::read_to_string(&marker).expect("on_dead wrote the marker");
    assert_eq!(fired.lines().count(), 1, "on_dead fired {} times", fired.lines().count());
    assert!(fired.starts_with("poison-run 4"), "{fired}");
    let run = runs(&db).into_iter().next().unwrap();
    assert_eq!(run.status, durable::RunStatus::Dead);
    assert_eq!(run.error.unwrap().code(), Some("max_recovery_attempts"));
    assert_eq!(deaths, 4, "the worker died once per attempt: first run + 3 recoveries");
}

#[test]
fn drain_under_load_hands_unfinished_runs_to_another_worker() {
    const RUNS: usize = 200;
    let (_dir, db) = temp_db();
    let (tx, rx) = mpsc::channel();
    drop(runs(&db));
    // Slow steps (100 ms each, ~1 s per run): the first worker holds many turns at once, and
    // its drain timeout (300 ms) is too short for them: the rest are released to the second.
    let mut first = spawn_with(0, &db, &["work", "100"], &tx, &[("DRAIN_MS", "300")]);
    let mut starter = spawn(1, &db, &["start", &RUNS.to_string()], &tx);
    let mut second: Option<Child> = None;
    let mut terminated = false;
    let mut all_done = false;
    let mut drained = None;
    while !all_done {
        let (who, line) = rx.recv().expect("processes talking");
        match who {
            0 if line.starts_with("committed") && !terminated => {
                terminate(&first);
                terminated = true;
                second = Some(spawn(2, &db, &["work", "100"], &tx));
            }
            0 if line.starts_with("drained") => drained = Some(line),
            1 => {
                assert!(!line.starts_with("not completed"), "{line}");
                all_done = line == "all done";
            }
            _ => {}
        }
    }
    assert!(first.wait().unwrap().success(), "the drained worker exited with an error");
    assert!(starter.wait().unwrap().success());
    let mut second = second.unwrap();
    terminate(&second);
    assert!(second.wait().unwrap().success());
    let drained = drained.or_else(|| rx.try_iter().find(|(w, l)| *w == 0 && l.starts_with("drained")).map(|(_, l)| l));
    assert_eq!(drained.as_deref(), Some("drained in_time=false"), "the drain should have cut turns off");
    let runs = runs(&db);
    assert_eq!(runs.len(), RUNS);
    assert!(runs.iter().all(|r| r.status == durable::RunStatus::Completed), "a run was lost");
}
