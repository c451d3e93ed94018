//! Many workers, one PostgreSQL database, real processes (`src/bin/fleet_pg_worker.rs`): work is
//! shared out through the store-backed run queue, woken by `LISTEN/NOTIFY`; SIGKILLed workers'
//! runs are recovered by the others without a committed step running twice; an idle worker picks
//! up a start from another process within milliseconds; terminated connections are survived;
//! bad configuration is one clear line.
//!
//! The server comes from `DURABLE_PG_URL`; without it every test prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test fleet_postgres
//! ```
//!
//! Each test works in a schema of its own (`durable_test_fleet_<tag>_<pid>_<n>_<random>`, from
//! `durable_store_postgres::test_support`), dropped at the end (also when it fails), and
//! terminates only connections with its own application name. The
//! tests run one at a time. To see what the processes said, set `FLEET_DIAG=<file>` (every line,
//! with the time it arrived) and `PRINT_TURNS=1` (the workers also print every turn).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable::{Engine, PostgresOptions, PostgresStore, QueueTransport, StartOptions, WorkflowCtx, WorkflowError};
use durable_store_postgres::deadpool_postgres::tokio_postgres;
use durable_store_postgres::test_support::{self, ScratchSchema, url_or_skip};

/// The line a process's reader sends when its output ends (it exited or was killed).
const EXITED: &str = "<exited>";

/// Checks a line of the starter process: true once it saw every run complete.
fn starter_done(line: &str) -> bool {
    assert!(!line.starts_with("not completed"), "{line}");
    assert_ne!(line, EXITED, "the starter exited before all its runs were done");
    line == "all done"
}

/// How long a test waits for the next line of its processes before it gives up (a hang guard,
/// not a timing assertion).
const QUIET_LIMIT: Duration = Duration::from_secs(120);

/// The tests of this file run one at a time: each already runs several processes on the machine's
/// cores, and the latency test measures an idle worker, not one starved by another test's load.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
}

fn unix_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
}

/// A scratch schema of its own for one test (dropped at the end, also when the test fails), with
/// the steps' side-effect ledger.
struct Db {
    scratch: ScratchSchema,
}

impl Db {
    fn new(url: &str, tag: &str) -> Db {
        runtime().block_on(async {
            let db = Db { scratch: ScratchSchema::new(url, &format!("fleet_{tag}")).await.expect("a scratch schema") };
            // The store creates its schema (so the processes do not race to) …
            drop(db.connect().await);
            // … and the ledger lives next to its tables: one row per execution of a step.
            db.scratch
                .client()
                .await
                .expect("connect a plain client")
                .batch_execute(&format!(
                    "CREATE TABLE \"{}\".ledger (n bigint GENERATED ALWAYS AS IDENTITY, step_id text NOT NULL, worker integer NOT NULL)",
                    db.schema()
                ))
                .await
                .unwrap();
            db
        })
    }

    fn url(&self) -> &str {
        self.scratch.url()
    }

    fn schema(&self) -> &str {
        self.scratch.name()
    }

    /// Every connection of this test (workers, clients, listeners) carries this application name.
    fn options(&self) -> PostgresOptions {
        self.scratch.options().notify_channel("durable")
    }

    async fn connect(&self) -> PostgresStore {
        PostgresStore::connect_with(self.url(), self.options()).await.expect("connect the test's store")
    }

    fn query(&self, sql: &str) -> Vec<tokio_postgres::Row> {
        runtime().block_on(async {
            self.scratch.client().await.expect("connect a plain client").query(sql, &[]).await.expect(sql)
        })
    }

    /// Terminates every connection of this test's processes; returns how many.
    fn terminate_backends(&self) -> i64 {
        runtime().block_on(self.scratch.terminate_backends()).expect("terminate the test's connections")
    }

    /// Every run's (id, status, recovery_attempts).
    fn runs(&self) -> Vec<(String, String, i64)> {
        self.query(&format!("SELECT id, status, recovery_attempts FROM \"{}\".runs", self.schema()))
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }
}

/// The test's processes, SIGKILLed on drop if still running (a failing test leaks none).
#[derive(Default)]
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    /// Starts `fleet_pg_worker <url> <schema> <args>`; its stdout lines arrive on `lines` as
    /// `(index, line)` where index is its position in `self.0`.
    fn spawn(&mut self, db: &Db, args: &[&str], env: &[(&str, &str)], lines: &mpsc::Sender<(usize, String)>) -> usize {
        let index = self.0.len();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fleet_pg_worker"))
            .arg(db.url())
            .arg(db.schema())
            .args(args)
            .env("APP_NAME", db.scratch.application_name())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fleet_pg_worker");
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
        index
    }

    fn terminate(&self, index: usize) {
        Command::new("kill").args(["-TERM", &self.0[index].id().to_string()]).status().expect("kill -TERM");
    }

    fn wait_success(&mut self, index: usize) {
        let status = self.0[index].wait().expect("wait for a process");
        assert!(status.success(), "process {index} exited with {status}");
    }
}

fn recv(rx: &mpsc::Receiver<(usize, String)>) -> (usize, String) {
    let got =
        rx.recv_timeout(QUIET_LIMIT).unwrap_or_else(|e| panic!("no process said anything for {QUIET_LIMIT:?}: {e}"));
    if let Ok(path) = std::env::var("FLEET_DIAG") {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        let _ = writeln!(f, "{} {} {}", unix_us() / 1000, got.0, got.1);
    }
    got
}

/// `(run, seq)` of a step id `<run>:<seq>`.
fn split_step_id(step_id: &str) -> (String, i64) {
    let (run, seq) = step_id.rsplit_once(':').expect("a step id is <run>:<seq>");
    (run.to_string(), seq.parse().expect("a numeric seq"))
}

/// What the workers printed, folded.
#[derive(Default)]
struct Seen {
    /// `(run, seq)` → the worker that printed its commit.
    committed: BTreeMap<(String, i64), usize>,
    per_worker: BTreeMap<usize, usize>,
    aborted: BTreeSet<String>,
    /// Runs a worker recovered (took over from an expired lease).
    recovered: BTreeSet<String>,
    settled: BTreeMap<String, usize>,
    exited: BTreeSet<usize>,
}

impl Seen {
    /// Folds one worker line; panics on a step committed twice.
    fn fold(&mut self, worker: usize, line: &str) {
        if line == EXITED {
            self.exited.insert(worker);
        } else if let Some(rest) = line.strip_prefix("committed ") {
            let (run, seq) = rest.rsplit_once(' ').expect("committed <run> <seq>");
            let seq: i64 = seq.parse().expect("a seq");
            if let Some(first) = self.committed.insert((run.to_string(), seq), worker) {
                panic!("step {seq} of {run} committed twice (workers {first} and {worker})");
            }
            *self.per_worker.entry(worker).or_default() += 1;
        } else if let Some(run) = line.strip_prefix("recovered ") {
            self.recovered.insert(run.to_string());
        } else if let Some(rest) = line.strip_prefix("aborted ") {
            self.aborted.insert(rest.split(' ').next().unwrap_or_default().to_string());
        } else if let Some(rest) = line.strip_prefix("settled ") {
            let run = rest.split(' ').next().unwrap_or_default().to_string();
            *self.settled.entry(run).or_default() += 1;
        }
    }
}

/// The checks shared by the load tests, on the database after the processes are gone: every
/// run completed with its 12 checkpoints (10 steps, a sleep, a signal); every step executed at
/// least once; returns the ledger as step id → workers that executed it.
fn check_runs_and_ledger(db: &Db, runs: usize) -> HashMap<String, Vec<i32>> {
    let all = db.runs();
    assert_eq!(all.len(), runs, "runs lost or added");
    let unfinished: Vec<_> = all.iter().filter(|(_, status, _)| status != "completed").take(5).collect();
    assert!(unfinished.is_empty(), "runs not completed: {unfinished:?}");
    let rows = db.query(&format!(
        "SELECT run_id, count(*), count(*) FILTER (WHERE kind = 'step' AND status = 'completed'), \
                count(*) FILTER (WHERE status = 'completed') FROM \"{}\".checkpoints GROUP BY run_id",
        db.schema()
    ));
    assert_eq!(rows.len(), runs);
    for r in &rows {
        let (run, total, steps, completed): (String, i64, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        assert_eq!((total, steps, completed), (12, 10, 12), "run {run}: checkpoints (all, completed steps, completed)");
    }
    let mut ledger: HashMap<String, Vec<i32>> = HashMap::new();
    for r in db.query(&format!("SELECT step_id, worker FROM \"{}\".ledger ORDER BY n", db.schema())) {
        ledger.entry(r.get(0)).or_default().push(r.get(1));
    }
    let steps: BTreeSet<(String, i64)> = db
        .query(&format!("SELECT run_id, seq FROM \"{}\".checkpoints WHERE kind = 'step'", db.schema()))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for step in &steps {
        assert!(ledger.contains_key(&format!("{}:{}", step.0, step.1)), "step {step:?} committed but never executed");
    }
    for step_id in ledger.keys() {
        assert!(steps.contains(&split_step_id(step_id)), "ledger row {step_id} of a step that never committed");
    }
    ledger
}

#[test]
fn four_workers_share_2000_runs_with_sleeps_and_signals_and_survive_two_sigkills() {
    const RUNS: usize = 2_000;
    const STEPS: usize = RUNS * 10;
    let test = "four_workers_share_2000_runs_with_sleeps_and_signals_and_survive_two_sigkills";
    let Some(url) = url_or_skip(test) else { return };
    let _serial = one_at_a_time();
    let db = Db::new(&url, "share");
    let (tx, rx) = mpsc::channel();
    let mut procs = Procs::default();
    // Leases of 5 s (renewed every 2.5 s): a killed worker's runs are recovered 5 s after its
    // death, and a live worker starved of CPU for a moment (two cores, five processes and the
    // server) keeps its runs, so any step executed twice is explained by a kill.
    let env = [("LEASE_MS", "5000")];
    let workers: Vec<usize> = (0..4).map(|i| procs.spawn(&db, &["work", &i.to_string()], &env, &tx)).collect();
    let starter = procs.spawn(&db, &["start", &RUNS.to_string()], &[], &tx);

    // Worker 0 dies a quarter in, worker 1 past half-way.
    let kill_at = [(workers[0], STEPS / 4), (workers[1], STEPS * 55 / 100)];
    let mut killed_at_ms: BTreeMap<usize, i64> = BTreeMap::new();
    let mut seen = Seen::default();
    loop {
        let (who, line) = recv(&rx);
        if who == starter {
            if starter_done(&line) {
                break;
            }
            continue;
        }
        seen.fold(who, &line);
        assert!(line != EXITED || killed_at_ms.contains_key(&who), "worker {who} exited on its own");
        for (worker, at) in kill_at {
            if seen.committed.len() >= at && !killed_at_ms.contains_key(&worker) {
                procs.0[worker].kill().expect("SIGKILL a worker");
                procs.0[worker].wait().expect("reap the killed worker");
                killed_at_ms.insert(worker, (unix_us() / 1000) as i64);
            }
        }
    }
    procs.wait_success(starter);
    assert_eq!(killed_at_ms.len(), 2, "both kills happened");
    for &w in &workers[2..] {
        procs.terminate(w);
    }
    for &w in &workers[2..] {
        procs.wait_success(w);
    }
    // Lines still in flight from the survivors (their last commits).
    for (who, line) in rx.try_iter() {
        seen.fold(who, &line);
    }
    for &w in &workers[2..] {
        assert!(seen.per_worker.get(&w).copied().unwrap_or(0) > 0, "surviving worker {w} executed nothing");
    }

    let ledger = check_runs_and_ledger(&db, RUNS);
    // When each step's checkpoint was committed (the committing engine's clock, this machine's).
    let committed_at: HashMap<String, i64> = db
        .query(&format!(
            "SELECT run_id || ':' || seq, updated_at FROM \"{}\".checkpoints WHERE kind = 'step'",
            db.schema()
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let killed: BTreeMap<i32, i64> = killed_at_ms.iter().map(|(w, t)| (*w as i32, *t)).collect();
    let mut duplicated = 0;
    for (step_id, executions) in &ledger {
        if executions.len() == 1 {
            continue;
        }
        duplicated += 1;
        // Executed more than once: every execution but the last was cut off by a kill before
        // its commit — on a killed worker, whose kill came before the step's checkpoint was
        // committed (by another worker), and which never printed that commit.
        let (earlier, _last) = executions.split_at(executions.len() - 1);
        for w in earlier {
            let Some(kill_ms) = killed.get(w) else {
                panic!("step {step_id} executed twice without a kill: workers {executions:?}");
            };
            assert!(
                committed_at[step_id] > *kill_ms,
                "step {step_id} was executed again although its checkpoint was committed ({} ms) before worker {w} was killed ({kill_ms} ms)",
                committed_at[step_id]
            );
            let (run, seq) = split_step_id(step_id);
            assert_ne!(
                seen.committed.get(&(run, seq)),
                Some(&(*w as usize)),
                "{step_id}: committed by {w}, then run again"
            );
        }
        let survivors = executions.iter().filter(|w| !killed.contains_key(w)).count();
        assert!(survivors <= 1, "step {step_id} executed by surviving workers {executions:?}");
    }
    let recovered = seen.recovered.len();
    assert!(recovered > 0, "no run of the killed workers was recovered");
    // Every recovered run made progress afterwards (it completed): none keeps a recovery count.
    let counted: Vec<_> = db.runs().into_iter().filter(|(_, _, recoveries)| *recoveries > 0).take(5).collect();
    assert!(counted.is_empty(), "completed runs still counting recoveries: {counted:?}");
    eprintln!(
        "{RUNS} runs × 10 steps on 4 workers (2 SIGKILLed): steps committed per worker {:?}; {recovered} runs \
         recovered; {duplicated} steps executed twice (each cut off by a kill before its commit)",
        seen.per_worker
    );
}

#[test]
fn an_idle_worker_picks_up_a_start_from_another_process_within_milliseconds() {
    let test = "an_idle_worker_picks_up_a_start_from_another_process_within_milliseconds";
    let Some(url) = url_or_skip(test) else { return };
    let _serial = one_at_a_time();
    const STARTS: usize = 50;
    const QUEUE_POLL_MS: u64 = 2_000;
    let db = Db::new(&url, "latency");
    let (tx, rx) = mpsc::channel();
    let mut procs = Procs::default();
    // Polls so slow that only the NOTIFY of the enqueue can explain a fast pickup: the queue
    // every 2 s, the engine's pollers every 60 s.
    let poll = QUEUE_POLL_MS.to_string();
    let env =
        [("QUEUE_POLL_MS", poll.as_str()), ("POLL_MS", "60000"), ("ORPHAN_POLL_MS", "60000"), ("PRINT_TURNS", "1")];
    let worker = procs.spawn(&db, &["work", "0"], &env, &tx);
    loop {
        let (_, line) = recv(&rx);
        if line.starts_with("ready") {
            break;
        }
    }

    // This process is the client: it starts runs into the queue and executes nothing.
    let rt = runtime();
    let engine = rt.block_on(async {
        let store = db.connect().await;
        let engine = Engine::builder()
            .store(store.clone())
            .transport(QueueTransport::new(std::sync::Arc::new(store)))
            .client_only()
            .build()
            .expect("a client engine");
        engine.register("ping", 1, |_: WorkflowCtx, n: u32| async move { Ok::<u32, WorkflowError>(n) });
        engine
    });
    let mut latencies_ms = Vec::with_capacity(STARTS);
    // One warm-up start (connections, prepared plans), then the measured ones.
    for i in 0..=STARTS {
        let id = format!("ping-{i}");
        let t0 = unix_us();
        rt.block_on(engine.start("ping", &(i as u32), StartOptions::id(id.clone()))).expect("start");
        let began = loop {
            let (who, line) = recv(&rx);
            assert_eq!(who, worker);
            if let Some(rest) = line.strip_prefix(&format!("turn {id} ")) {
                break rest.split(' ').next().and_then(|t| t.parse::<u128>().ok()).expect("a time");
            }
        };
        // Idle again before the next start: the run settled (its one turn ended).
        loop {
            let (_, line) = recv(&rx);
            if line.starts_with(&format!("settled {id} ")) {
                assert_eq!(line, format!("settled {id} completed"));
                break;
            }
        }
        if i > 0 {
            latencies_ms.push(began.saturating_sub(t0) as f64 / 1000.0);
        }
    }
    rt.block_on(engine.shutdown());
    procs.terminate(worker);
    procs.wait_success(worker);
    latencies_ms.sort_by(f64::total_cmp);
    let median = latencies_ms[STARTS / 2];
    let p99 = latencies_ms[(STARTS * 99 / 100).min(STARTS - 1)];
    eprintln!(
        "start on a client process → turn on an idle worker: median {median:.1} ms, p99 {p99:.1} ms, min {:.1} ms, \
         max {:.1} ms over {STARTS} starts (queue poll {QUEUE_POLL_MS} ms)",
        latencies_ms[0],
        latencies_ms[STARTS - 1]
    );
    // Most of it is the client's outbox tick (`EngineConfig::dispatch_tick`, 10 ms): with a 1 ms
    // tick the median is about 4 ms. Polling alone would give a median near 1,000 ms (uniform
    // over 0–2,000 ms).
    assert!(median < 500.0, "median pickup {median:.1} ms: the NOTIFY wake-ups do not work");
}

#[test]
fn terminated_connections_are_survived_and_no_run_is_lost_or_duplicated() {
    let test = "terminated_connections_are_survived_and_no_run_is_lost_or_duplicated";
    let Some(url) = url_or_skip(test) else { return };
    let _serial = one_at_a_time();
    const RUNS: usize = 300;
    const ROUNDS: usize = 5;
    let db = Db::new(&url, "faults");
    let (tx, rx) = mpsc::channel();
    let mut procs = Procs::default();
    // Long leases: no worker dies here, so none needs recovering by the other.
    let env = [("LEASE_MS", "10000")];
    let workers: Vec<usize> = (0..2).map(|i| procs.spawn(&db, &["work", &i.to_string()], &env, &tx)).collect();
    let starter = procs.spawn(&db, &["start", &RUNS.to_string()], &[], &tx);
    let mut seen = Seen::default();
    let mut terminated = 0;
    let mut rounds = 0;
    loop {
        let (who, line) = recv(&rx);
        if who == starter {
            if starter_done(&line) {
                break;
            }
            continue;
        }
        seen.fold(who, &line);
        assert_ne!(line, EXITED, "worker {who} exited on its own");
        // Every 400 commits, every connection of this test (workers' pools and listeners, the
        // starter's) is terminated by the server; the engines carry on.
        if rounds < ROUNDS && seen.committed.len() >= (rounds + 1) * 400 {
            terminated += db.terminate_backends();
            rounds += 1;
        }
    }
    procs.wait_success(starter);
    for &w in &workers {
        procs.terminate(w);
    }
    for &w in &workers {
        procs.wait_success(w);
    }
    for (who, line) in rx.try_iter() {
        seen.fold(who, &line);
    }
    assert_eq!(rounds, ROUNDS, "all termination rounds happened");
    let ledger = check_runs_and_ledger(&db, RUNS);
    // No run settled twice; a step ran twice only in a run whose turn a store error cut off
    // (its commit failed with the connection: the step was not recorded, so it ran again).
    for (run, n) in &seen.settled {
        assert_eq!(*n, 1, "run {run} settled {n} times");
    }
    let mut duplicated = 0;
    for (step_id, executions) in &ledger {
        if executions.len() > 1 {
            duplicated += 1;
            let (run, _) = split_step_id(step_id);
            assert!(seen.aborted.contains(&run), "step {step_id} executed {executions:?} but no turn of {run} failed");
        }
    }
    eprintln!(
        "{RUNS} runs on 2 workers through {ROUNDS} rounds of pg_terminate_backend ({terminated} connections): \
         {} turns aborted by a lost connection and retried, {duplicated} steps executed again after a failed commit",
        seen.aborted.len()
    );
}

#[test]
fn bad_configuration_is_one_clear_line_from_a_worker() {
    let test = "bad_configuration_is_one_clear_line_from_a_worker";
    let Some(url) = url_or_skip(test) else { return };
    let _serial = one_at_a_time();
    let worker = |url: &str, schema: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_fleet_pg_worker"))
            .args([url, schema, "work", "0"])
            .stdin(Stdio::null())
            .output()
            .expect("run fleet_pg_worker");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(!err.contains("s3cret"), "never the password: {err}");
        err
    };
    // A malformed URL.
    let err = worker("postgres://u:s3cret@127.0.0.1:notaport/test", "x");
    assert!(err.contains("invalid PostgreSQL URL"), "{err}");
    // Nothing listens there.
    let err = worker("postgres://postgres:s3cret@127.0.0.1:1/test", "x");
    assert!(err.contains("127.0.0.1:1") && err.contains("connection refused"), "{err}");
    // A database that does not exist.
    let missing = format!("durable_no_such_db_{}", std::process::id());
    let err = worker(&test_support::with_database(&url, &missing), "x");
    assert!(err.contains(&missing) && err.contains("does not exist"), "{err}");
    // A schema written by a newer build.
    let db = Db::new(&url, "newer");
    db.query(&format!(
        "INSERT INTO \"{}\".schema_version (version, description) VALUES (99, 'from the future')",
        db.schema()
    ));
    let err = worker(&url, db.schema());
    assert!(err.contains("version 99") && err.contains("upgrade durable"), "{err}");
}
