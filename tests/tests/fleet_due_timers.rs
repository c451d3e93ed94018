//! Many pollers, one store (issue 15, acceptance 4): four engines sharing one store and its run
//! queue poll the same 10,000 due timers at once, and each due run is handed to the queue about
//! once — at most 1.05 × 10,000 wake items in all — because a poller claims what it finds
//! (`Store::claim_due_runs` moves the runs' `wake_at` one lease period ahead) before it queues a
//! wake. Every run is still executed.
//!
//! On a SQLite file (four handles, as four processes would open it) and on PostgreSQL (four
//! pools on one scratch schema) when `DURABLE_PG_URL` is set; without it the PostgreSQL test
//! prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-tests --test fleet_due_timers
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use durable::store::{Claim, ClaimOutcome, Commit, NewRun, Store, TurnEnd};
use durable::transport::{Consumer, QueueReason, QueuedRun, RunHandler, RunQueue, Transport, TransportError};
use durable::{Engine, Payload, QueueTransport, RunFilter, RunId, RunStatus, WorkflowCtx, WorkflowError};
use durable_store_postgres::test_support::{ScratchSchema, url_or_skip};

/// Due timers.
const RUNS: usize = 10_000;
/// Engines polling them.
const ENGINES: usize = 4;
/// The acceptance bound: wake items sent, in all, per due timer.
const MAX_WAKES: u64 = RUNS as u64 * 105 / 100;
/// A hang guard, not a timing assertion.
const DEADLINE: Duration = Duration::from_secs(120);

/// The store's run queue, counting the wake items the engines send through it.
#[derive(Debug)]
struct CountingTransport {
    inner: QueueTransport,
    wakes: Arc<AtomicU64>,
}

#[async_trait]
impl Transport for CountingTransport {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        let wakes = batch.iter().filter(|item| item.reason == QueueReason::Wake).count();
        self.wakes.fetch_add(wakes as u64, Ordering::Relaxed);
        self.inner.dispatch_runs(namespace, batch).await
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        self.inner.consume_runs(namespace, concurrency, handler)
    }

    fn routes_without_namespace(&self) -> bool {
        self.inner.routes_without_namespace()
    }

    fn merges_runs(&self) -> bool {
        self.inner.merges_runs()
    }
}

/// A store handle that also keeps the run queue (the SQLite and PostgreSQL stores do).
trait QueueStore: Store + RunQueue {}
impl<S: Store + RunQueue> QueueStore for S {}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

/// Writes `RUNS` runs of `tick`, each suspended with a timer that came due a minute ago, through
/// the store directly (as the engine that parked them would have, before it went away).
async fn park_due_timers(store: Arc<dyn Store>) {
    let now = now_ms();
    let id = |i: usize| RunId::from(format!("timer-{i:05}"));
    let new = |i: usize| NewRun {
        trace_context: None,
        id: id(i),
        workflow: "tick".into(),
        version: 1,
        namespace: "default".into(),
        input: Payload::encode(&(i as u64)).expect("encodes"),
        tags: Vec::new(),
        priority: 0,
        parent: None,
        created_at: now - 120_000,
        start_at: None,
        admission: None,
    };
    let all: Vec<usize> = (0..RUNS).collect();
    for chunk in all.chunks(500) {
        let created = store.create_runs(chunk.iter().map(|i| new(*i)).collect()).await.expect("create runs");
        assert!(created.iter().all(|c| c.created()));
    }
    // Claimed and suspended until a minute ago by a parker that is gone; many at a time, so
    // the SQLite writer groups them.
    let mut parked = tokio::task::JoinSet::new();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(128));
    for i in 0..RUNS {
        let permit = in_flight.clone().acquire_owned().await.expect("open");
        let store = store.clone();
        parked.spawn(async move {
            let claim = Claim { run_id: id(i), owner: "parker".into(), lease_until: now + 60_000, now: now - 90_000 };
            let run = match store.claim_run(claim).await.expect("claim") {
                ClaimOutcome::Acquired { run, .. } => run,
                other => panic!("timer-{i:05}: {other:?}"),
            };
            let mut commit = Commit::new(id(i), "parker", now - 90_000);
            commit.end = Some(TurnEnd::Suspend { wake_at: Some(now - 60_000), seen_wake_gen: run.wake_gen });
            store.commit(commit).await.expect("suspend");
            drop(permit);
        });
    }
    while let Some(done) = parked.join_next().await {
        done.expect("parking task");
    }
    let due =
        durable::store::RunQuery { namespace: None, workflows: None, now, limit: RUNS + 1, leave_queued_since: None };
    assert_eq!(store.due_runs(&due).await.expect("due runs").len(), RUNS, "every timer is due");
}

/// Whether a run is still active (not settled): one indexed read of at most one run.
async fn any_active(store: &dyn Store) -> bool {
    let filter = RunFilter { statuses: RunStatus::ACTIVE.to_vec(), limit: 1, ..RunFilter::default() };
    !store.list_runs(&filter).await.expect("list active runs").runs.is_empty()
}

/// Parks `RUNS` due timers through the first handle, starts one engine per handle (each with
/// the store's run queue behind a counting transport) and their pollers at once, waits until
/// every run completed, and checks how many wake items went out.
async fn pollers_wake_each_due_timer_about_once(handles: Vec<Arc<dyn QueueStore>>, what: &str) {
    let store: Arc<dyn Store> = handles[0].clone();
    let parking = Instant::now();
    park_due_timers(store.clone()).await;
    let parked_in = parking.elapsed();

    let wakes = Arc::new(AtomicU64::new(0));
    let mut config = durable::EngineConfig::default();
    // Pollers that look often race each other more.
    config.poll_interval = Duration::from_millis(20);
    let engines: Vec<Engine> = handles
        .iter()
        .enumerate()
        .map(|(i, handle)| {
            let queue: Arc<dyn RunQueue> = handle.clone();
            let transport = CountingTransport { inner: QueueTransport::new(queue), wakes: wakes.clone() };
            Engine::builder()
                .shared_store(handle.clone())
                .transport(transport)
                .config(config.clone())
                .owner(format!("poller-{i}"))
                .build()
                .expect("engine")
        })
        .collect();
    // A poller looks at the store only once a workflow is registered (a registration has it
    // look at once): the four start together here.
    let started = Instant::now();
    for engine in &engines {
        engine.register("tick", 1, |_ctx: WorkflowCtx, i: u64| async move { Ok::<_, WorkflowError>(i) });
    }
    while any_active(&*store).await {
        assert!(started.elapsed() < DEADLINE, "{what}: runs still active after {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    // Whatever is still in an outbox is sent before the count is read.
    for engine in &engines {
        assert!(engine.drain(Duration::from_secs(10)).await, "{what}: an engine did not drain");
        engine.shutdown().await;
    }
    let sent = wakes.load(Ordering::Relaxed);

    let all = RunFilter { limit: RUNS + 1, ..RunFilter::default() };
    let runs = store.list_runs(&all).await.expect("list runs").runs;
    assert_eq!(runs.len(), RUNS);
    for run in &runs {
        assert_eq!(run.status, RunStatus::Completed, "{what}: {run:?}");
    }
    let turns: u64 = engines.iter().map(|e| e.metrics().turns).sum();
    let per_engine: Vec<u64> = engines.iter().map(|e| e.metrics().turns).collect();
    eprintln!(
        "{what}: {ENGINES} pollers x {RUNS} due timers: {sent} wake items sent ({:.3} per timer), {turns} turns \
         {per_engine:?}; parked in {parked_in:.1?}, all completed in {elapsed:.1?}",
        sent as f64 / RUNS as f64
    );
    assert!(sent >= RUNS as u64, "{what}: {sent} wake items for {RUNS} due timers");
    assert!(sent <= MAX_WAKES, "{what}: {sent} wake items for {RUNS} due timers (at most {MAX_WAKES})");
}

/// The tests of this file run one at a time: each keeps the machine's cores busy.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
}

#[test]
fn four_pollers_on_one_sqlite_file_wake_each_due_timer_about_once() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("timers.db");
    runtime().block_on(async {
        let options = || durable::SqliteOptions::new().durability(durable::Durability::Normal);
        let handles: Vec<Arc<dyn QueueStore>> = (0..ENGINES)
            .map(|_| Arc::new(durable::SqliteStore::open_with(&path, options()).expect("open")) as Arc<dyn QueueStore>)
            .collect();
        pollers_wake_each_due_timer_about_once(handles, "sqlite").await;
    });
}

#[test]
fn four_pollers_on_one_postgres_schema_wake_each_due_timer_about_once() {
    let test = "four_pollers_on_one_postgres_schema_wake_each_due_timer_about_once";
    let Some(url) = url_or_skip(test) else { return };
    let _serial = one_at_a_time();
    runtime().block_on(async {
        let scratch = ScratchSchema::new(&url, "due_timers").await.expect("a scratch schema");
        let mut handles: Vec<Arc<dyn QueueStore>> = Vec::new();
        for _ in 0..ENGINES {
            handles.push(Arc::new(scratch.connect().await.expect("connect")));
        }
        pollers_wake_each_due_timer_about_once(handles, "postgres").await;
        scratch.drop_now().await.expect("drop the scratch schema");
    });
}
