//! One stored schedule, fired by a fleet of real processes on one SQLite file and the real
//! clock: every process declares `tick` (every 1 s) at boot, processes are SIGKILLed,
//! stopped and started again while it fires, and afterwards the store holds exactly one run
//! per fire time, with none missing between the first and the last fire.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The safety net of every wait: nothing here should take more than a few seconds.
const PATIENCE: Duration = Duration::from_secs(30);

/// Fires to watch before the fleet is stopped (about 20 s).
const FIRES: usize = 20;

/// A worker process whose stdout lines arrive on the test's channel as `(process, line)`;
/// SIGKILLed if the test ends without stopping it (a failed assertion).
struct Worker {
    child: Child,
    reader: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn(index: usize, db: &Path, lines: &mpsc::Sender<(usize, String)>) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_schedule_worker"))
            .arg(db)
            .arg("fire")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start schedule_worker");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let lines = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if lines.send((index, line)).is_err() {
                    break;
                }
            }
        });
        Worker { child, reader: Some(reader) }
    }

    fn sigterm(&self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill -TERM");
    }

    /// Waits for the process to exit and for its last lines to be sent.
    fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().unwrap();
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        status
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Ok (and no signal) once it was waited for.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Runtime::new().unwrap().block_on(f)
}

/// The runs the schedule fired and its stored record, read after the processes are gone.
fn stored(db: &Path) -> (Vec<durable::Run>, durable::ScheduleRecord) {
    block_on(async {
        let store = durable::SqliteStore::open(db).unwrap();
        let filter = durable::RunFilter { tag: Some("schedule:tick".into()), limit: 10_000, ..Default::default() };
        let runs = durable::store::Store::list_runs(&store, &filter).await.unwrap().runs;
        let record = durable::store::Store::get_schedule(&store, "tick").await.unwrap().expect("schedule stored");
        (runs, record)
    })
}

/// What the test does to the fleet, once this many distinct fires were seen.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Start process n.
    Start(usize),
    /// SIGKILL process n (only once another process is up and has declared the schedule).
    Kill(usize),
    /// SIGTERM process n and wait for its drain (same condition).
    Stop(usize),
}

#[test]
fn three_processes_fire_a_shared_schedule_once_per_second_through_kills_and_restarts() {
    use Act::*;
    // Processes 0-2 start at once; 3-6 replace them. One process alone fires for a while
    // after fire 7 (two SIGKILLs leave 3), 12 (a SIGKILL leaves 4) and 15 (a SIGTERM leaves 5);
    // two after fire 3 (a SIGKILL).
    let script: &[(usize, Act)] = &[
        (3, Kill(0)),
        (5, Start(3)),
        (7, Kill(1)),
        (7, Kill(2)),
        (10, Start(4)),
        (12, Kill(3)),
        (13, Start(5)),
        (15, Stop(4)),
        (16, Start(6)),
    ];
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("schedules.db");
    // Create the file (and its schema) before three processes race to.
    block_on(async { drop(durable::SqliteStore::open(&db).unwrap()) });
    let (tx, rx) = mpsc::channel();
    let mut procs: BTreeMap<usize, Worker> = BTreeMap::new();
    let mut ready: BTreeSet<usize> = BTreeSet::new(); // up and declared
    for i in 0..3 {
        procs.insert(i, Worker::spawn(i, &db, &tx));
    }
    // fire time -> the processes that reported it (more than one would be a double fire).
    let mut fires: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut lateness: BTreeMap<usize, u64> = BTreeMap::new();
    let mut log: Vec<String> = Vec::new();
    let mut next = 0;
    let mut min_up = usize::MAX;
    while fires.len() < FIRES || next < script.len() {
        let (who, line) = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
            panic!("no word from the fleet for {PATIENCE:?}; {} fires so far; log: {log:#?}", fires.len())
        });
        if line.starts_with("ready") {
            ready.insert(who);
        } else if let Some(rest) = line.strip_prefix("fired ") {
            let (at, now) = rest.split_once(' ').expect("fired <at> <now>");
            let (at, now): (u64, u64) = (at.parse().unwrap(), now.parse().unwrap());
            fires.entry(at).or_default().push(who);
            let late = lateness.entry(who).or_default();
            *late = (*late).max(now.saturating_sub(at));
        } else {
            assert!(!line.starts_with("lagged"), "process {who} missed events: {line}");
        }
        // Run every step that is due and allowed, in order.
        while let Some(&(at, act)) = script.get(next) {
            if fires.len() < at {
                break;
            }
            match act {
                Start(n) => {
                    procs.insert(n, Worker::spawn(n, &db, &tx));
                }
                Kill(n) | Stop(n) => {
                    // At least one other engine up and firing, always.
                    if !ready.iter().any(|r| *r != n) {
                        break;
                    }
                    let mut worker = procs.remove(&n).expect("a running process");
                    ready.remove(&n);
                    if let Kill(_) = act {
                        worker.child.kill().expect("SIGKILL");
                        worker.wait();
                    } else {
                        worker.sigterm();
                        assert!(worker.wait().success(), "process {n} did not stop cleanly");
                    }
                }
            }
            log.push(format!("after {} fires: {act:?}", fires.len()));
            next += 1;
            min_up = min_up.min(procs.len());
        }
    }
    // Stop the rest; their last lines arrive before their readers end.
    for worker in procs.values() {
        worker.sigterm();
    }
    for (n, mut worker) in procs {
        assert!(worker.wait().success(), "process {n} did not stop cleanly");
    }
    drop(tx);
    for (who, line) in rx.try_iter() {
        if let Some(rest) = line.strip_prefix("fired ") {
            let at: u64 = rest.split_once(' ').unwrap().0.parse().unwrap();
            fires.entry(at).or_default().push(who);
        }
    }

    // No fire decided twice.
    let twice: Vec<_> = fires.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "fires started by more than one process: {twice:?}");
    let (runs, record) = stored(&db);
    // One run per fire, each with its own fire time, on the 1 s grid.
    let times: Vec<u64> = runs
        .iter()
        .map(|r| {
            let at = r.id.as_str().strip_prefix("sched:tick:").expect("a fire's run id").parse().expect("fire ms");
            assert_eq!(at % 1000, 0, "fire {at} is off the 1 s grid");
            at
        })
        .collect();
    let distinct: BTreeSet<u64> = times.iter().copied().collect();
    assert_eq!(distinct.len(), runs.len(), "two runs with one fire time: {times:?}");
    assert_eq!(record.state.fires, runs.len() as u64, "the stored fire count disagrees with the runs");
    assert_eq!((record.state.missed, record.state.skipped), (0, 0));
    // Every second from the first fire to the last has its run: an engine was always up.
    let (first, last) = (*distinct.first().unwrap(), *distinct.last().unwrap());
    let gaps: Vec<u64> = (first..=last).step_by(1000).filter(|t| !distinct.contains(t)).collect();
    assert!(gaps.is_empty(), "fires missed: {gaps:?} (between {first} and {last})");
    // Every fire a process reported is in the store (a SIGKILL may land between a save and
    // its report, so the store may hold a few more).
    let reported: BTreeSet<u64> = fires.keys().copied().collect();
    assert!(reported.is_subset(&distinct), "reported fires without a run: {:?}", reported.difference(&distinct));
    assert!(runs.len() >= FIRES, "only {} runs", runs.len());

    let mut spread: BTreeMap<usize, usize> = BTreeMap::new();
    for by in fires.values() {
        *spread.entry(by[0]).or_default() += 1;
    }
    eprintln!(
        "{} fires, {} runs; fires per process {spread:?} ({} unreported); fewest processes up: {min_up}; \
         latest fire per process (ms after its time) {lateness:?}; {log:?}",
        reported.len(),
        runs.len(),
        distinct.len() - reported.len(),
    );
}
