//! What the multi-process remote-step tests share: the workflow, the worker processes
//! (`src/bin/remote_worker.rs`), the scenario (two engines in this process, three workers, two
//! SIGKILLs) and the check of the workers' ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use durable::{Engine, EngineConfig, RunId, RunStatus, StartOptions};
use durable_tests::remote::{STEPS, expected, register};
use tokio::sync::mpsc;

/// How long the scenario may take before it fails: a hang guard, never the mechanism.
pub(crate) const LIMIT: Duration = Duration::from_secs(300);
/// The line a worker's reader sends when its output ends (it exited or was killed).
const EXITED: &str = "<exited>";

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// The engines' settings: pollers fast enough that a run woken by a worker's result in another
/// process is picked up within tens of milliseconds.
pub(crate) fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.poll_interval = Duration::from_millis(50);
    config.orphan_poll_interval = Duration::from_millis(250);
    config.wait_poll_interval = Duration::from_millis(50);
    config.recheck_interval = Duration::from_millis(200);
    config.lease_ttl = Duration::from_secs(10);
    config
}

/// The worker processes, SIGKILLed on drop if still running (a failing test leaks none).
#[derive(Default)]
pub(crate) struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Workers {
    /// Starts `remote_worker <args>`; its stdout lines arrive on `lines` as `(index, line)`.
    pub(crate) fn spawn(
        &mut self,
        args: &[&str],
        env: &[(&str, &str)],
        lines: &mpsc::UnboundedSender<(usize, String)>,
    ) {
        let index = self.0.len();
        let mut child = Command::new(env!("CARGO_BIN_EXE_remote_worker"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start remote_worker");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if lines.send((index, line)).is_err() {
                    return;
                }
            }
            let _ = lines.send((index, EXITED.to_string()));
        });
        self.0.push(child);
    }
}

/// One line of the ledger.
struct Entry {
    done: bool,
    at: u128,
    attempt: u32,
    pid: u32,
}

/// Runs the scenario (remote steps with the lease `lease`): three workers (started with `worker_args`, which the caller made write
/// to `ledger`), `runs` runs of `remote5` started half on each engine, worker 0 SIGKILLed a
/// fifth of the way through, worker 1 half-way; worker 2 finishes the work. Then checks every
/// run's output and the ledger, and prints the figures.
pub(crate) async fn scenario(
    runs: usize,
    engines: [&Engine; 2],
    lease: Duration,
    worker_args: &[&str],
    env: &[(&str, &str)],
    ledger: &Path,
) {
    let began = Instant::now();
    for e in engines {
        register(e, lease);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut workers = Workers::default();
    for _ in 0..3 {
        workers.spawn(worker_args, env, &tx);
    }
    drop(tx);
    let mut ready = 0;
    while ready < 3 {
        let (w, line) = tokio::time::timeout(LIMIT, rx.recv()).await.expect("workers ready in time").expect("lines");
        assert_ne!(line, EXITED, "worker {w} exited before it was ready");
        ready += usize::from(line.starts_with("ready "));
    }
    let pids: Vec<u32> = workers.0.iter().map(Child::id).collect();

    let started = Instant::now();
    for (k, engine) in engines.iter().enumerate() {
        let batch = (0..runs).filter(|i| i % 2 == k).map(|i| ("remote5", i as u64, StartOptions::id(format!("r{i}"))));
        engine.start_many(batch).await.expect("start the runs");
    }
    let waiter = engines[0].clone();
    let mut all = tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..runs {
            let engine = waiter.clone();
            set.spawn(async move { (i, engine.wait_for_run(&RunId::new(format!("r{i}"))).await) });
        }
        let mut outcomes = Vec::with_capacity(runs);
        while let Some(r) = set.join_next().await {
            outcomes.push(r.expect("a waiter task"));
        }
        outcomes
    });

    // Kill worker 0 once a fifth of the steps are done, worker 1 at half, each right after it
    // printed a `done` (so it holds tasks in flight).
    let kills = [(0usize, runs * STEPS as usize / 5), (1usize, runs * STEPS as usize / 2)];
    let mut killed: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut killed_ms: BTreeMap<u32, u128> = BTreeMap::new();
    let mut dones = 0usize;
    let mut per_worker = [0usize; 3];
    let mut reports: BTreeMap<usize, String> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + LIMIT;
    let outcomes = loop {
        tokio::select! {
            r = &mut all => break r.expect("the waiters"),
            line = rx.recv() => {
                let Some((w, line)) = line else { continue };
                if line == EXITED {
                    assert!(killed.contains_key(&pids[w]), "worker {w} exited on its own");
                } else if line.starts_with("done ") {
                    dones += 1;
                    per_worker[w] += 1;
                    for (victim, at) in kills {
                        if w == victim && dones >= at && !killed.contains_key(&pids[w]) {
                            workers.0[w].kill().expect("SIGKILL a worker");
                            killed.insert(pids[w], Instant::now());
                            killed_ms.insert(pids[w], unix_ms());
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                let health = engines[0].worker_health().await;
                panic!("not done after {LIMIT:?}: {dones} done lines, per worker {per_worker:?}, killed {killed:?}; {health:?}");
            }
        }
    };
    let wall = started.elapsed();
    assert_eq!(killed.len(), 2, "both kills happened ({dones} done lines, per worker {per_worker:?})");
    let last_kill = *killed.values().max().unwrap();
    let after_last_kill = last_kill.elapsed();

    // Every run completed with its output.
    assert_eq!(outcomes.len(), runs);
    for (i, outcome) in &outcomes {
        let outcome = outcome.as_ref().unwrap_or_else(|e| panic!("waiting for r{i}: {e}"));
        assert_eq!(outcome.status(), RunStatus::Completed, "r{i}: {:?}", outcome.error());
        assert_eq!(outcome.output::<u64>().expect("a u64 output"), expected(*i as u64), "r{i}");
    }

    // The survivor drains and reports.
    Command::new("kill").args(["-TERM", &pids[2].to_string()]).status().expect("kill -TERM");
    let survivor = std::mem::take(&mut workers.0);
    let survivor = tokio::task::spawn_blocking(move || {
        survivor.into_iter().map(|mut c| c.wait().expect("wait for a worker")).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(survivor[2].success(), "the surviving worker exited with {}", survivor[2]);
    while let Some((w, line)) = rx.recv().await {
        if let Some(r) = line.strip_prefix("report ") {
            reports.insert(w, r.to_string());
        }
    }

    // The ledger: step id → its lines in order.
    let text = std::fs::read_to_string(ledger).expect("read the ledger");
    if let Ok(path) = std::env::var("REMOTE_DIAG") {
        // For a look after the test: the ledger, then `killed <pid> <unix_ms>` lines.
        let kills: String = killed_ms.iter().map(|(pid, at)| format!("killed {pid} {at}\n")).collect();
        std::fs::write(path, format!("{text}{kills}")).expect("write the diagnostics");
    }
    let mut steps: HashMap<String, Vec<Entry>> = HashMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [kind @ ("start" | "done"), step_id, attempt, pid, at] = parts.as_slice() else {
            panic!("a torn or unknown ledger line: {line:?}");
        };
        let entry = Entry {
            done: *kind == "done",
            at: at.parse().unwrap(),
            attempt: attempt.parse().unwrap(),
            pid: pid.parse().unwrap(),
        };
        steps.entry(step_id.to_string()).or_default().push(entry);
    }
    let expected_ids: BTreeSet<String> =
        (0..runs).flat_map(|i| (0..STEPS).map(move |seq| format!("r{i}:{seq}"))).collect();
    let unknown: Vec<&String> = steps.keys().filter(|id| !expected_ids.contains(*id)).take(5).collect();
    assert!(unknown.is_empty(), "ledger lines of steps that do not exist: {unknown:?}");
    let (mut redelivered, mut executed_twice, mut in_flight_at_kills) = (0, 0, 0);
    let show = |entries: &[Entry]| -> Vec<String> {
        entries.iter().map(|e| format!("{} pid {} at {}", if e.done { "done" } else { "start" }, e.pid, e.at)).collect()
    };
    for id in &expected_ids {
        let entries = steps.get(id).map(Vec::as_slice).unwrap_or_default();
        assert!(entries.iter().any(|e| e.done), "step {id} lost: no `done` line");
        for e in entries.iter().filter(|e| e.done) {
            assert!(
                entries.iter().any(|s| !s.done && s.pid == e.pid && s.attempt == e.attempt),
                "step {id}: `done` without a `start` by pid {}",
                e.pid
            );
        }
        let starts: Vec<&Entry> = entries.iter().filter(|e| !e.done).collect();
        // A process starts a step at most once; a surviving one at most once altogether: every
        // other start was cut off by a kill, on a killed worker.
        let mut by_pid: BTreeMap<u32, usize> = BTreeMap::new();
        for s in &starts {
            *by_pid.entry(s.pid).or_default() += 1;
        }
        assert!(
            by_pid.values().all(|n| *n == 1),
            "step {id} started twice by one process: {:?}; killed {killed_ms:?}",
            show(entries)
        );
        let by_survivors = starts.iter().filter(|s| !killed.contains_key(&s.pid)).count();
        assert!(
            by_survivors <= 1,
            "step {id} started by {by_survivors} live workers: {:?}; killed {killed_ms:?}",
            show(entries)
        );
        // In flight at a kill: started on a worker that was killed, and started again on
        // another (its result had not been recorded: the handler was still running, or had
        // returned and its result was on its way to the store).
        if starts.len() > 1 && starts.iter().any(|s| killed.contains_key(&s.pid)) {
            in_flight_at_kills += 1;
        }
        if starts.len() > 1 {
            redelivered += 1;
        }
        if entries.iter().filter(|e| e.done).count() > 1 {
            executed_twice += 1;
        }
        // Redeliveries after a lost lease keep the attempt; nothing here fails an attempt.
        assert!(starts.iter().all(|s| s.attempt == 1), "step {id}: a second attempt: {by_pid:?}");
    }
    let starts_total: usize = steps.values().map(|v| v.iter().filter(|e| !e.done).count()).sum();
    eprintln!(
        "{runs} runs, {} remote steps on 2 engines and 3 workers (2 SIGKILLed): {:?} from the first start to the \
         last run's completion ({:?} after the second kill; setup {:?}); {starts_total} starts; {in_flight_at_kills} \
         steps in flight at a kill; {redelivered} steps started again on another worker; {executed_twice} executed to \
         the end twice; done lines per worker {per_worker:?}; survivor's report (claimed completed dropped \
         handed_back): {:?}",
        expected_ids.len(),
        wall,
        after_last_kill,
        started.duration_since(began),
        reports.get(&2),
    );
    assert!(in_flight_at_kills > 0, "no step of a killed worker was started again: the test tested no redelivery");
}
