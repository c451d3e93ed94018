//! The control plane on PostgreSQL (`PostgresControlPlane`, LISTEN/NOTIFY): a client engine sees
//! the runs another engine executed settle, and its cancel stops a long turn there within
//! milliseconds — abandoning the run, or running its undos. Once with both engines in this
//! process (each with a store and a plane of its own on one schema), once with the executing
//! engine in a process of its own (`src/bin/control_pg_worker.rs`). The process test runs again
//! with the control plane (and the run queue) on NATS and on Redis, the state in PostgreSQL.
//!
//! The servers come from `DURABLE_PG_URL`, `DURABLE_NATS_URL` and `DURABLE_REDIS_URL`; without
//! one, each test that needs it prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test DURABLE_NATS_URL=nats://127.0.0.1:4222 \
//!   DURABLE_REDIS_URL=redis://127.0.0.1:6379 cargo test -p durable-tests --test control_postgres
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable::{Cancel, CheckpointStatus, Engine, EngineEvent, PostgresStore, RunId, RunStatus, StartOptions};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};
use durable_tests::broker::Broker;
use durable_tests::control::{self, LoopInput, Report};
use tokio::sync::broadcast;

/// A hang guard, not a timing assertion.
const WAIT: Duration = Duration::from_secs(60);

/// What the tests assert on the turn-stop latency: 100 ms is the target, this never flakes.
const BOUND: Duration = Duration::from_secs(1);

/// 5,000 steps of 20 ms: the turn would run for minutes.
const LONG: LoopInput = (5_000, 20, false);
const LONG_SAGA: LoopInput = (5_000, 20, true);

/// The tests of this file run one at a time: they measure latencies.
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

fn unix_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
}

fn ms(us: u128) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

/// An engine on its own connection to the schema, with the schema's control plane.
async fn engine(scratch: &ScratchSchema, owner: &str, execute: bool) -> (Engine, PostgresStore) {
    let store = scratch.connect().await.expect("connect");
    let plane = store.control_plane().await.expect("the control plane");
    let mut builder =
        Engine::builder().store(store.clone()).config(control::config()).owner(owner).control_plane(plane);
    if !execute {
        builder = builder.client_only();
    }
    (builder.build().expect("engine"), store)
}

async fn until<F: Fn(&EngineEvent) -> bool>(rx: &mut broadcast::Receiver<EngineEvent>, f: F) -> EngineEvent {
    durable_conformance::next_event(rx, WAIT, f).await
}

fn settled_of(run: &RunId) -> impl Fn(&EngineEvent) -> bool + '_ {
    move |e| matches!(e, EngineEvent::RunSettled { run_id, .. } if run_id == run)
}

/// The completed `tick` steps of a run, by index (their output).
async fn completed_steps(engine: &Engine, run: &RunId) -> usize {
    let history = engine.history(run).await.expect("history");
    history.iter().filter(|c| c.name == "tick" && c.status == CheckpointStatus::Completed).count()
}

/// The reports of the engine in this process, with when they were made.
struct Reports(tokio::sync::mpsc::UnboundedReceiver<(Report, Instant)>);

impl Reports {
    async fn until(&mut self, f: impl Fn(&Report) -> bool) -> Instant {
        tokio::time::timeout(WAIT, async {
            loop {
                let (report, at) = self.0.recv().await.expect("reports open");
                if f(&report) {
                    return at;
                }
            }
        })
        .await
        .expect("the report in time")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_on_one_schema_share_events_and_cancels_through_notify() {
    let Some(url) = url_or_skip("two_engines_on_one_schema_share_events_and_cancels_through_notify") else {
        return;
    };
    let _serial = one_at_a_time().await;
    let scratch = ScratchSchema::new(&url, "control").await.expect("scratch schema");
    let (b, _) = engine(&scratch, "engine-b", true).await;
    let (a, _) = engine(&scratch, "engine-a", false).await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    control::register(&b, Arc::new(move |r| drop(tx.send((r, Instant::now())))));
    control::register(&a, Arc::new(|_| {}));
    let mut reports = Reports(rx);
    let mut at_a = a.subscribe();

    // Events: B executed the run A started; A's subscribers see it settle.
    let run = a.start("greet", &"ada", StartOptions::id("greet:ada")).await.unwrap();
    let settled = until(&mut at_a, settled_of(&run.id)).await;
    assert_eq!(settled, EngineEvent::RunSettled { run_id: run.id.clone(), status: RunStatus::Completed });

    // An abandoning cancel stops B's turn in the middle of its step loop.
    let run = a.start("loop", &LONG, StartOptions::id("loop")).await.unwrap();
    for _ in 0..5 {
        reports.until(|r| matches!(r, Report::Step(id, _) if *id == run.id)).await;
    }
    let called = Instant::now();
    assert_eq!(a.cancel(&run.id).await.unwrap(), RunStatus::Cancelled);
    let returned = Instant::now();
    let stopped = reports.until(|r| *r == Report::Stopped(run.id.clone())).await;
    let latency = stopped.saturating_duration_since(returned);
    println!(
        "PostgreSQL, in process: B's turn stopped {} after A's cancel returned ({} after it was called)",
        ms(latency.as_micros()),
        ms(stopped.saturating_duration_since(called).as_micros())
    );
    assert!(latency < BOUND, "{latency:?}");

    // A cancel with compensation: B's turn stops, and a fresh one runs every undo.
    let run = a.start("loop", &LONG_SAGA, StartOptions::id("saga")).await.unwrap();
    for _ in 0..5 {
        reports.until(|r| matches!(r, Report::Step(id, _) if *id == run.id)).await;
    }
    assert_eq!(a.cancel_with(&run.id, Cancel::Compensate).await.unwrap(), RunStatus::Running);
    let returned = Instant::now();
    let stopped = reports.until(|r| *r == Report::Stopped(run.id.clone())).await;
    let settled = until(&mut at_a, settled_of(&run.id)).await;
    assert_eq!(settled, EngineEvent::RunSettled { run_id: run.id.clone(), status: RunStatus::Cancelled });
    println!(
        "PostgreSQL, in process: with compensation, B's turn stopped {} after the cancel returned",
        ms(stopped.saturating_duration_since(returned).as_micros())
    );
    assert!(stopped.saturating_duration_since(returned) < BOUND);
    let mut undos = Vec::new();
    while let Ok((report, _)) = reports.0.try_recv() {
        if let Report::Undo(id, i) = report
            && id == run.id
        {
            undos.push(i);
        }
    }
    assert!(!undos.is_empty());
    assert_eq!(undos.len(), completed_steps(&b, &run.id).await, "one undo per completed step");
    assert!(undos.windows(2).all(|w| w[0] > w[1]), "newest first: {undos:?}");
    b.shutdown().await;
    a.shutdown().await;
}

/// The worker process and the lines it prints.
struct WorkerProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl WorkerProcess {
    /// `broker`: `[kind, url, prefix]` of the broker whose plane it uses, else the schema's.
    fn spawn(scratch: &ScratchSchema, broker: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_control_pg_worker"))
            .arg(scratch.url())
            .arg(scratch.name())
            .args(broker)
            .env("APP_NAME", scratch.application_name())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start control_pg_worker");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        WorkerProcess { child, lines }
    }

    /// The next line starting with `prefix` (the words after it).
    fn until(&self, prefix: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line =
                self.lines.recv_timeout(left).unwrap_or_else(|e| panic!("no {prefix:?} line from the worker: {e}"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.split_whitespace().map(String::from).collect();
            }
        }
    }

    fn stop(mut self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill -TERM");
        let status = self.child.wait().expect("wait for the worker");
        assert!(status.success(), "the worker exited with {status}");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hears_a_worker_process_and_its_cancel_stops_the_turn_there() {
    let test = "a_client_hears_a_worker_process_and_its_cancel_stops_the_turn_there";
    let Some(url) = url_or_skip(test) else { return };
    client_and_worker_process(&url, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_nats_a_client_hears_a_worker_process_and_its_cancel_stops_the_turn_there() {
    let test = "over_nats_a_client_hears_a_worker_process_and_its_cancel_stops_the_turn_there";
    let Some(url) = url_or_skip(test) else { return };
    let Some(nats) = durable_transport_nats::test_support::url_or_skip(test) else { return };
    client_and_worker_process(&url, Some(("nats", &nats))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_redis_a_client_hears_a_worker_process_and_its_cancel_stops_the_turn_there() {
    let test = "over_redis_a_client_hears_a_worker_process_and_its_cancel_stops_the_turn_there";
    let Some(url) = url_or_skip(test) else { return };
    let Some(redis) = durable_transport_redis::test_support::url_or_skip(test) else { return };
    client_and_worker_process(&url, Some(("redis", &redis))).await;
}

/// A client engine here, an executing engine in a worker process; the control plane is the
/// schema's, or `broker`'s (`(kind, url)`, with its run queue).
async fn client_and_worker_process(url: &str, broker: Option<(&str, &str)>) {
    let _serial = one_at_a_time().await;
    let scratch = ScratchSchema::new(url, "control_proc").await.expect("scratch schema");
    let over = broker.map_or("PostgreSQL", |(kind, _)| kind);
    // The client first: it creates the schema the worker connects to.
    let (a, worker, broker) = match broker {
        None => {
            let (a, _) = engine(&scratch, "client", false).await;
            (a, WorkerProcess::spawn(&scratch, &[]), None)
        }
        Some((kind, broker_url)) => {
            let prefix = durable_transport_nats::test_support::unique_prefix("control");
            let broker = Broker::connect(kind, broker_url, &prefix, Duration::from_secs(10)).await.expect("broker");
            let store = scratch.connect().await.expect("connect");
            let a = Engine::builder()
                .store(store)
                .config(control::config())
                .owner("client")
                .transport(broker.transport.clone())
                .control_plane(broker.plane.clone())
                .client_only()
                .build()
                .expect("engine");
            (a, WorkerProcess::spawn(&scratch, &[kind, broker_url, &prefix]), Some(broker))
        }
    };
    control::register(&a, Arc::new(|_| {}));
    worker.until("ready");
    let mut at_a = a.subscribe();

    let run = a.start("greet", &"ada", StartOptions::id("greet:ada")).await.unwrap();
    let settled = until(&mut at_a, settled_of(&run.id)).await;
    assert_eq!(settled, EngineEvent::RunSettled { run_id: run.id.clone(), status: RunStatus::Completed });

    let run = a.start("loop", &LONG, StartOptions::id("loop")).await.unwrap();
    for _ in 0..5 {
        worker.until(&format!("step {} ", run.id));
    }
    let called = unix_us();
    assert_eq!(a.cancel(&run.id).await.unwrap(), RunStatus::Cancelled);
    let returned = unix_us();
    let words = worker.until(&format!("stopped {} ", run.id));
    let stopped: u128 = words[0].parse().expect("a time");
    println!(
        "{over}, worker process: its turn stopped {} after the client's cancel returned ({} after it was called)",
        ms(stopped.saturating_sub(returned)),
        ms(stopped.saturating_sub(called))
    );
    assert!(stopped.saturating_sub(returned) < BOUND.as_micros());

    let run = a.start("loop", &LONG_SAGA, StartOptions::id("saga")).await.unwrap();
    for _ in 0..5 {
        worker.until(&format!("step {} ", run.id));
    }
    assert_eq!(a.cancel_with(&run.id, Cancel::Compensate).await.unwrap(), RunStatus::Running);
    let settled = until(&mut at_a, settled_of(&run.id)).await;
    assert_eq!(settled, EngineEvent::RunSettled { run_id: run.id.clone(), status: RunStatus::Cancelled });
    // Five steps started; the one the turn was in when it stopped never completed.
    let completed = completed_steps(&a, &run.id).await;
    assert!(completed >= 4, "{completed}");
    for _ in 0..completed {
        worker.until(&format!("undo {} ", run.id));
    }
    worker.stop();
    a.shutdown().await;
    if let Some(broker) = broker {
        broker.destroy().await.expect("remove the broker's stream or keys");
    }
}
