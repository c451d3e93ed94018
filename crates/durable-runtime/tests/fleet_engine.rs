//! Acceptance (many workers, one store) that runs inside one process: the bounded runner,
//! batched run-queue dispatch and its failure reporting, lost-wake re-checks, child delivery
//! under store faults, and namespaces.

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use durable_conformance::{Fault, FaultyStore, Method, TestEngine, test_config};
use durable_core::{Claim, ClaimOutcome, Commit, Millis, RunId, RunStatus, Store, WaitKind, Waiter};
use durable_runtime::{
    Clock, Engine, EngineConfig, EngineEvent, StartOptions, VirtualClock, WorkflowCtx, WorkflowError,
};
use durable_store_memory::MemoryStore;
use durable_transport::{Consumer, QueueTransport, QueuedRun, RunHandler, Transport, TransportError};

fn register_nap(engine: &Engine) {
    engine.register("nap", 1, |ctx: WorkflowCtx, i: u64| async move {
        ctx.sleep(Duration::from_millis(1)).await;
        let out: u64 = ctx.step("double", move |_| async move { Ok(i * 2) }).await?;
        Ok::<_, WorkflowError>(out)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_10000_starts_keeps_at_most_256_turns_in_flight() {
    let engine = Engine::builder().store(MemoryStore::new()).build().unwrap();
    register_nap(&engine);
    let mut ids = Vec::new();
    for i in 0..10_000u64 {
        ids.push(engine.start("nap", &i, StartOptions::id(format!("burst-{i}"))).await.unwrap().id);
    }
    for (i, id) in ids.iter().enumerate() {
        let out: u64 = engine.wait_for_run(id).await.unwrap().output().unwrap();
        assert_eq!(out, i as u64 * 2);
    }
    let m = engine.metrics();
    assert!(m.max_turns_in_flight <= 256, "{m:?}");
    assert!(m.max_turns_in_flight > 1, "nothing ran concurrently: {m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_and_wakes_go_to_the_run_queue_in_batches() {
    let store = Arc::new(MemoryStore::new());
    let engine = Engine::builder()
        .shared_store(store.clone())
        .transport(QueueTransport::new(store.clone()))
        .config(test_config())
        .build()
        .unwrap();
    register_nap(&engine);
    let mut ids = Vec::new();
    for i in 0..2_000u64 {
        ids.push(engine.start("nap", &i, StartOptions::id(format!("q-{i}"))).await.unwrap().id);
    }
    for id in &ids {
        assert_eq!(engine.wait_for_run(id).await.unwrap().status(), RunStatus::Completed);
    }
    let m = engine.metrics();
    assert!(m.runs_sent >= 4_000, "every start and every wake goes through the queue: {m:?}");
    // One run per batch would be 4,000 batches. How full they are depends on timing: under a
    // loaded CPU, about 15 runs a batch was seen; unloaded, far more.
    assert!(m.batches_sent * 5 < m.runs_sent, "runs were not batched: {m:?}");
    eprintln!("{} runs sent in {} batches", m.runs_sent, m.batches_sent);
}

/// A run queue that is down; it remembers the size of every batch it refused.
#[derive(Debug, Clone, Default)]
struct DownTransport(Arc<parking_lot::Mutex<Vec<usize>>>);

#[async_trait]
impl Transport for DownTransport {
    async fn dispatch_runs(&self, _: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        self.0.lock().push(batch.len());
        Err(TransportError::Unavailable("broker unreachable".into()))
    }

    fn consume_runs(&self, _: Option<String>, _: usize, _: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        Consumer::new(stop, tokio::spawn(async move { drop(stopped.wait_for(|s| *s).await) }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_queue_is_reported_once_a_minute_and_loses_no_run() {
    let mut config = test_config();
    config.dispatch_batch = 50;
    let down = DownTransport::default();
    let engine = Engine::builder().store(MemoryStore::new()).transport(down.clone()).config(config).build().unwrap();
    register_nap(&engine);
    let mut events = engine.subscribe();
    let mut ids = Vec::new();
    for i in 0..500u64 {
        ids.push(engine.start("nap", &i, StartOptions::id(format!("down-{i}"))).await.unwrap().id);
    }
    for id in &ids {
        assert_eq!(engine.wait_for_run(id).await.unwrap().status(), RunStatus::Completed);
    }
    let mut reports = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let EngineEvent::QueueUnavailable { failures, error } = event {
            assert!(error.contains("broker unreachable"));
            reports.push(failures);
        }
    }
    assert_eq!(reports.len(), 1, "one report per minute, not one per failure: {reports:?}");
    let refused = down.0.lock().clone();
    assert!(refused.iter().sum::<usize>() >= 500, "every start was offered to the queue: {refused:?}");
    assert!(refused.iter().all(|n| *n <= 50), "batches of at most dispatch_batch: {refused:?}");
    // The first failure reports at once, counting the runs of that batch; the rest wait for
    // the next minute.
    assert_eq!(reports[0], refused[0] as u64, "the report counts the runs that failed: {reports:?}");
    assert_eq!(engine.metrics().batches_sent, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_that_finds_the_lease_held_elsewhere_is_seen_once_it_frees() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut config = test_config();
    // No poller would find the run in time: only the re-check can.
    config.poll_interval = Duration::from_secs(3600);
    config.orphan_poll_interval = Duration::from_secs(3600);
    config.recheck_interval = Duration::from_millis(20);
    let t = TestEngine::with_parts(store.clone(), VirtualClock::starting_2026(), config);
    t.register("approve", 1, |ctx: WorkflowCtx, _: ()| async move {
        let ok: bool = ctx.wait_for_signal("approve").await?;
        Ok::<_, WorkflowError>(ok)
    });
    let run = t.start("approve", &(), StartOptions::id("held")).await.unwrap();
    t.assert_settled_status(&run.id, RunStatus::Suspended).await;

    // Another instance holds the lease when the signal arrives.
    let now = durable_runtime::Clock::now(t.clock());
    let claim = Claim { run_id: run.id.clone(), owner: "intruder".into(), lease_until: now + 60_000, now };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    let mut events = t.subscribe();
    t.signal("approve", &true).await.unwrap();
    // The engine tried, found the lease held, and will look again.
    loop {
        match events.recv().await.unwrap() {
            EngineEvent::TurnStarted { .. } => panic!("the engine ran the turn under someone else's lease"),
            EngineEvent::WakeDeferred { run_id, holder } if run_id == run.id => {
                assert_eq!(holder, "intruder");
                break;
            }
            _ => {}
        }
    }
    assert!(store.release_lease(&run.id, "intruder").await.unwrap());
    t.assert_output(&run.id, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_result_reaches_its_parent_once_even_when_the_childs_commits_fail() {
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new()));
    let t = TestEngine::with_store(faulty.clone());
    t.register("leaf", 1, |ctx: WorkflowCtx, n: u64| async move {
        let out: u64 = ctx.step("inc", move |_| async move { Ok(n + 1) }).await?;
        Ok::<_, WorkflowError>(out)
    });
    t.register("root", 1, |ctx: WorkflowCtx, _: ()| async move {
        let got: u64 = ctx.child("leaf", &41u64).await?;
        Ok::<_, WorkflowError>(got)
    });
    // The child's settling commit (the one that tells the parent) fails twice.
    faulty.arm(
        Fault::when(|call| {
            call.method == Method::Commit && call.run_id.is_some_and(|r| r.as_str().contains(".child."))
        })
        .after(1)
        .times(2),
    );
    let run = t.start("root", &(), StartOptions::id("root")).await.unwrap();
    t.assert_output(&run.id, 42u64).await;
    assert_eq!(faulty.injected(), 2);
    let history = t.checkpoints(&run.id).await;
    assert_eq!(history.len(), 1, "the parent recorded the child once: {history:?}");
    assert!(t.store().waiters(&run.id).await.unwrap().is_empty());
    // No stray copy of the result is left buffered: a wait registered on the same token would
    // take it at once. (Workflows may not wait on the engine's own tokens: the probe registers
    // its wait through the store, as a turn's commit would.)
    t.register("probe", 1, |ctx: WorkflowCtx, _: ()| async move {
        ctx.sleep(Duration::from_secs(3600)).await;
        Ok::<_, WorkflowError>(())
    });
    let probe = t.start("probe", &(), StartOptions::id("probe")).await.unwrap();
    t.assert_settled_status(&probe.id, RunStatus::Suspended).await;
    let store = t.store();
    let now = t.clock().now();
    let claim = Claim { run_id: probe.id.clone(), owner: "prober".into(), lease_until: now + 60_000, now };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    let mut commit = Commit::new(probe.id.clone(), "prober", now);
    commit.waits.push(Waiter {
        run_id: probe.id.clone(),
        seq: 1,
        name: "stray".into(),
        kind: WaitKind::Signal { token: format!("child:{}:0", run.id) },
        created_at: now,
    });
    store.commit(commit).await.unwrap();
    let taken: Vec<_> = store.history(&probe.id).await.unwrap().into_iter().filter(|c| c.seq == 1).collect();
    assert!(taken.is_empty(), "a stray copy of the child's result was buffered: {taken:?}");
    assert_eq!(store.waiters(&probe.id).await.unwrap().len(), 1, "the probe's wait is registered and open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_of_two_namespaces_never_execute_each_others_runs() {
    let s = support::StoreFixture::sqlite();
    let engine = |namespace: &'static str, store: Arc<dyn Store>| {
        let mut config = EngineConfig::default();
        config.namespace = Some(namespace.to_string());
        config.poll_interval = Duration::from_millis(20);
        let engine = Engine::builder().shared_store(store).config(config).build().unwrap();
        engine.register("whoami", 1, move |ctx: WorkflowCtx, _: ()| async move {
            let me: String = ctx.step("who", move |_| async move { Ok(namespace.to_string()) }).await?;
            Ok::<_, WorkflowError>(me)
        });
        engine
    };
    let a = engine("a", s.store.clone());
    let b = engine("b", s.second_handle());
    let mut ids = Vec::new();
    for i in 0..50 {
        // Started by the other engine, in the right namespace: only its own pool may run it.
        ids.push(("a", b.start("whoami", &(), StartOptions::id(format!("a-{i}")).namespace("a")).await.unwrap().id));
        ids.push(("b", a.start("whoami", &(), StartOptions::id(format!("b-{i}")).namespace("b")).await.unwrap().id));
    }
    for (namespace, id) in ids {
        let ran_on: String = a.wait_for_run(&id).await.unwrap().output().unwrap();
        assert_eq!(ran_on, namespace, "run {id} of namespace {namespace} ran on engine {ran_on}");
    }
}

/// A client engine waiting on many runs that execute elsewhere reads each once on its own,
/// then all of them together once per interval — not once per waiter per interval — and
/// still sees every completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_on_many_runs_reads_them_together() {
    const RUNS: usize = 100;
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new()));
    let refreshes = Arc::new(tokio::sync::Notify::new());
    let seen = refreshes.clone();
    // Never injects: it only tells the test that a shared read happened.
    faulty.arm(Fault::when(move |call| {
        if call.method == Method::GetRuns {
            seen.notify_one();
        }
        false
    }));
    let mut config = test_config();
    config.wait_poll_interval = Duration::from_millis(20);
    let worker = Engine::builder().shared_store(faulty.clone()).config(config.clone()).build().unwrap();
    let client = Engine::builder().shared_store(faulty.clone()).config(config).client_only().build().unwrap();
    for engine in [&worker, &client] {
        engine.register("await_go", 1, |ctx: WorkflowCtx, i: u64| async move {
            let go: u64 = ctx.wait_for_signal(&format!("go-{i}")).await?;
            Ok::<_, WorkflowError>(i + go)
        });
    }
    let mut ids = Vec::new();
    for i in 0..RUNS as u64 {
        ids.push(client.start("await_go", &i, StartOptions::id(format!("await-{i}"))).await.unwrap().id);
    }
    let reads_before = faulty.calls(Method::GetRun);
    let waits: Vec<_> = ids
        .iter()
        .map(|id| {
            let (client, id) = (client.clone(), id.clone());
            tokio::spawn(async move { client.wait_for_run(&id).await.unwrap().output::<u64>().unwrap() })
        })
        .collect();
    // Three shared reads: every waiter has been through several intervals.
    let three = async {
        for _ in 0..3 {
            refreshes.notified().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), three).await.expect("the waiters never read their runs together");
    for i in 0..RUNS as u64 {
        worker.signal(&format!("go-{i}"), &1000u64).await.unwrap();
    }
    for (i, wait) in waits.into_iter().enumerate() {
        assert_eq!(wait.await.unwrap(), i as u64 + 1000);
    }
    // Each waiter reads its run alone first, and at most once more if its first interval
    // ended before any shared read included it; polling alone would be one per interval.
    let alone = faulty.calls(Method::GetRun) - reads_before;
    assert!(alone <= 2 * RUNS as u64, "{alone} reads of single runs for {RUNS} waiters: they polled one by one");
    assert!(faulty.calls(Method::GetRuns) >= 3);
    assert_eq!(client.metrics().runs_watched, 0, "a finished wait left its run watched (and read forever)");
}

/// A run queue that routes by namespace (as the brokers do) and records what it is sent.
#[derive(Debug, Clone)]
struct Routing {
    inner: durable_transport::InProcessTransport,
    sent: Arc<parking_lot::Mutex<Vec<QueuedRun>>>,
}

#[async_trait]
impl Transport for Routing {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        self.sent.lock().extend(batch.iter().cloned());
        self.inner.dispatch_runs(namespace, batch).await
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        self.inner.consume_runs(namespace, concurrency, handler)
    }
}

/// Every start and wake an engine sends to a transport that routes by namespace names the
/// run's namespace — also the wakes of its in-memory timers, which know only the run's id — so
/// the consumers of that namespace get them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_item_sent_to_a_routing_transport_names_its_runs_namespace() {
    let sent = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let transport = Routing { inner: durable_transport::InProcessTransport::new(), sent: sent.clone() };
    let mut config = EngineConfig::default();
    config.namespace = Some("billing".into());
    let engine = Engine::builder().store(MemoryStore::new()).transport(transport).config(config).build().unwrap();
    register_nap(&engine);
    let mut ids = Vec::new();
    for i in 0..20u64 {
        ids.push(engine.start("nap", &i, StartOptions::id(format!("nap-{i}"))).await.unwrap().id);
    }
    for (i, id) in ids.iter().enumerate() {
        let out: u64 = engine.wait_for_run(id).await.unwrap().output().unwrap();
        assert_eq!(out, 2 * i as u64);
    }
    let sent = sent.lock().clone();
    assert!(sent.iter().any(|item| item.reason == durable_transport::QueueReason::Wake), "no wake was sent: {sent:?}");
    let stray: Vec<_> = sent.iter().filter(|item| item.namespace.as_deref() != Some("billing")).collect();
    assert!(stray.is_empty(), "items sent without the run's namespace: {stray:?}");
    engine.shutdown().await;
}

/// A batch sent to a run queue, with its namespace.
type Batch = (Option<String>, Vec<QueuedRun>);

/// A run queue that keeps what its engine sends (for the test to forward) and hands that
/// engine nothing: its wakes reach only the engines the test forwards them to. It says it keeps
/// duplicates (a broker) unless made with [`Kept::merging`] (as the store-backed queue says).
#[derive(Debug, Clone, Default)]
struct Kept {
    sent: Arc<parking_lot::Mutex<Vec<Batch>>>,
    arrived: Arc<tokio::sync::Notify>,
    merges: bool,
}

#[async_trait]
impl Transport for Kept {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        self.sent.lock().push((namespace.map(str::to_string), batch));
        self.arrived.notify_one();
        Ok(())
    }

    fn consume_runs(&self, _: Option<String>, _: usize, _: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        Consumer::new(stop, task)
    }

    fn merges_runs(&self) -> bool {
        self.merges
    }
}

/// A poller's claim moves a due run's `wake_at` a lease period ahead, so no other poller hands
/// it on again; the wake it sends names the claim. Here that wake reaches another engine, which
/// finds the run's lease held by a third party (a re-check), and reads the run once it is handed
/// back: it must read the claimed run as due and execute it, not drop the wake until the claim
/// ends (an hour here, so only the wake can finish the run in time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_wake_taken_by_another_engine_runs_the_run() {
    let store = Arc::new(MemoryStore::new());
    let queue = durable_transport::InProcessTransport::new();
    let mut config = test_config();
    config.poll_interval = Duration::from_secs(3600);
    config.orphan_poll_interval = Duration::from_secs(3600);
    config.recheck_interval = Duration::from_millis(20);
    config.lease_ttl = Duration::from_secs(3600);
    // Engine A's queue keeps duplicates: without this its poller would leave the due run to
    // its own wake (there is none) for the grace, past the single poll this test relies on.
    config.poll_grace = Duration::ZERO;
    let register = |engine: &Engine| {
        engine.register("approve", 1, |ctx: WorkflowCtx, _: ()| async move {
            let ok: bool = ctx.wait_for_signal("approve").await?;
            Ok::<_, WorkflowError>(ok)
        });
    };
    let b =
        Engine::builder().shared_store(store.clone()).transport(queue.clone()).config(config.clone()).build().unwrap();
    let mut b_events = b.subscribe();
    register(&b);
    let id = b.start("approve", &(), StartOptions::id("claimed")).await.unwrap().id;
    loop {
        if let EngineEvent::RunSuspended { run_id, .. } = b_events.recv().await.unwrap()
            && run_id == id
        {
            break;
        }
    }

    // The signal is written by a bare store call: the run is due, and no engine heard of it.
    let now = || durable_runtime::Clock::now(&durable_runtime::SystemClock);
    let payload = durable_core::Payload::encode(&true).unwrap();
    store.send_signal("approve", payload, now()).await.unwrap();

    // Engine A's poller (it polls when a workflow is registered) claims the due run and sends
    // a wake, which the test holds.
    let kept = Kept::default();
    let a = Engine::builder().shared_store(store.clone()).transport(kept.clone()).config(config).build().unwrap();
    let arrived = kept.arrived.notified();
    register(&a);
    tokio::time::timeout(Duration::from_secs(10), arrived).await.expect("engine A sent no wake");
    let sent = std::mem::take(&mut *kept.sent.lock());
    let items: Vec<&QueuedRun> = sent.iter().flat_map(|(_, batch)| batch).collect();
    assert_eq!(items.len(), 1, "{items:?}");
    let until = items[0].claimed_until().expect("the wake names the claim");
    assert_eq!(store.get_run(&id).await.unwrap().unwrap().wake_at, Some(until), "the claim moved wake_at");
    assert!(until > now() + 3_000_000, "the claim lasts a lease period");

    // A third party holds the run's lease when engine B takes the wake.
    let claim = Claim { run_id: id.clone(), owner: "intruder".into(), lease_until: now() + 60_000, now: now() };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    for (namespace, batch) in sent {
        queue.dispatch_runs(namespace.as_deref(), batch).await.unwrap();
    }
    loop {
        match b_events.recv().await.unwrap() {
            EngineEvent::TurnStarted { run_id, .. } if run_id == id => panic!("a turn ran under the intruder's lease"),
            EngineEvent::WakeDeferred { run_id, .. } if run_id == id => break,
            _ => {}
        }
    }
    // The intruder hands the run back as it found it (as an engine that does not serve it does).
    let patch = durable_core::RunPatch {
        status: Some(RunStatus::Suspended),
        release_lease: true,
        now: now(),
        ..Default::default()
    };
    store.update_run_if(&id, &[RunStatus::Running], patch).await.unwrap();
    assert_eq!(store.get_run(&id).await.unwrap().unwrap().wake_at, Some(until), "still claimed");

    let done = tokio::time::timeout(Duration::from_secs(10), b.wait_for_run(&id)).await;
    let out: bool = done.expect("the claimed wake was dropped").unwrap().output().unwrap();
    assert!(out);
    a.shutdown().await;
    b.shutdown().await;
}

/// Counts the polls of the engines on a [`FaultyStore`] (their `pending_runs` calls, one per
/// poll) so a test can wait for a number of them.
fn count_polls(store: &FaultyStore<MemoryStore>) -> tokio::sync::watch::Receiver<u64> {
    let (polled, polls) = tokio::sync::watch::channel(0u64);
    store.set_latency_with(move |call| {
        if call.method == Method::PendingRuns {
            polled.send_modify(|n| *n += 1);
        }
        Duration::ZERO
    });
    polls
}

/// Waits until `n` more polls began (so at least `n - 1` whole polls ran since the call).
async fn polls_pass(polls: &mut tokio::sync::watch::Receiver<u64>, n: u64) {
    let target = *polls.borrow_and_update() + n;
    let waited = tokio::time::timeout(Duration::from_secs(30), polls.wait_for(|seen| *seen >= target)).await;
    waited.expect("the poller stopped polling").unwrap();
}

impl Kept {
    /// A queue that merges an item into its run's waiting one, as the store-backed queue does.
    fn merging() -> Kept {
        Kept { merges: true, ..Kept::default() }
    }

    /// The items sent so far.
    fn items(&self) -> Vec<QueuedRun> {
        self.sent.lock().iter().flat_map(|(_, batch)| batch.clone()).collect()
    }

    /// Waits until `n` items were sent in all.
    async fn wait_for_items(&self, n: usize) {
        let arrived = async {
            while self.items().len() < n {
                self.arrived.notified().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), arrived).await.expect("the items never came");
    }
}

/// On any run queue, the pending poller leaves a run to the start item its creator sent for the
/// poll grace: polls within the grace send nothing more (on a broker each extra item would be
/// delivered and cost a turn; on the store queue an item a consumer already took would get a
/// second one, and a claim of a run that is not free), and once the run was seen pending for
/// the grace — its item lost, say — one more start is sent, and no more until the grace passes
/// again. Time is the engine's (virtual) clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_leave_a_pending_run_to_its_own_item_on_a_broker_for_the_grace() {
    pending_run_left_to_its_item_for_the_grace(Kept::default()).await;
}

/// The same on a queue that merges items, as the store-backed one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_leave_a_pending_run_to_its_own_item_on_a_merging_queue_for_the_grace() {
    pending_run_left_to_its_item_for_the_grace(Kept::merging()).await;
}

async fn pending_run_left_to_its_item_for_the_grace(kept: Kept) {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let mut polls = count_polls(&store);
    let clock = VirtualClock::starting_2026();
    let config = test_config();
    let grace = config.poll_grace;
    assert!(!grace.is_zero(), "the default grace applies to a run queue");
    let engine =
        Engine::builder().shared_store(store.clone()).clock(clock.clone()).transport(kept.clone()).config(config);
    let engine = engine.build().unwrap();
    register_nap(&engine);
    let id = engine.start("nap", &1u64, StartOptions::id("waits-in-the-queue")).await.unwrap().id;
    kept.wait_for_items(1).await;

    polls_pass(&mut polls, 6).await;
    clock.advance(grace / 2);
    polls_pass(&mut polls, 6).await;
    assert_eq!(kept.items().len(), 1, "a poll within the grace sent the run again: {:?}", kept.items());

    clock.advance(grace / 2);
    kept.wait_for_items(2).await;
    polls_pass(&mut polls, 6).await;
    let items = kept.items();
    assert_eq!(items.len(), 2, "once the grace passed, one more start and no more: {items:?}");
    assert!(items.iter().all(|item| item.run_id == id && item.reason == durable_transport::QueueReason::Start));
    engine.shutdown().await;
}

/// On a queue that keeps duplicates, the due poller claims only runs due for the poll grace:
/// a run whose signal arrived (due now, its wake on its way through the broker) is left alone
/// — not claimed, no wake sent — until it has been due for the grace; then one claimed wake
/// heals it (here nothing else would: the signal was written by a bare store call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_leave_a_due_run_to_its_own_item_on_a_broker_for_the_grace() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let clock = VirtualClock::starting_2026();
    let (id, due_at) = a_due_run_parked_elsewhere(&store, &clock).await;
    left_for_the_grace_then_claimed(&store, &clock, Kept::default(), &id, due_at).await;
}

/// Starts an engine polling `store` with `kept` as its run queue; checks that its polls leave
/// the due run `id` (`wake_at` = `due_at`) alone for the poll grace counted from now — no
/// claim, no wake sent — and that once the grace has passed one claimed wake is sent for it.
async fn left_for_the_grace_then_claimed(
    store: &Arc<FaultyStore<MemoryStore>>,
    clock: &VirtualClock,
    kept: Kept,
    id: &RunId,
    due_at: Millis,
) {
    let mut polls = count_polls(store);
    let config = test_config();
    let grace = config.poll_grace;
    let a = Engine::builder().shared_store(store.clone()).clock(clock.clone()).transport(kept.clone()).config(config);
    let a = a.build().unwrap();
    register_approve(&a);
    polls_pass(&mut polls, 6).await;
    clock.advance(grace - Duration::from_millis(1));
    polls_pass(&mut polls, 6).await;
    assert_eq!(store.get_run(id).await.unwrap().unwrap().wake_at, Some(due_at), "claimed within the grace");
    assert!(kept.items().is_empty(), "a poll within the grace sent a wake: {:?}", kept.items());

    clock.advance(Duration::from_millis(1));
    kept.wait_for_items(1).await;
    polls_pass(&mut polls, 6).await;
    let items = kept.items();
    assert_eq!(items.len(), 1, "one claimed wake: {items:?}");
    assert_eq!(&items[0].run_id, id);
    assert!(items[0].claimed_until().is_some(), "the wake names its claim: {items:?}");
    a.shutdown().await;
}

/// On a queue that merges items (the store-backed one), the due poller claims a due run that
/// has no item of its own in the store's run queue at once: a sleep or a delivery of a run
/// parked by an engine that went away has none, so no grace is left to one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_claim_a_due_run_at_once_on_a_merging_queue() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let clock = VirtualClock::starting_2026();
    let (id, due_at) = a_due_run_parked_elsewhere(&store, &clock).await;

    let kept = Kept::merging();
    let a = Engine::builder().shared_store(store.clone()).clock(clock.clone()).transport(kept.clone());
    let a = a.config(test_config()).build().unwrap();
    register_approve(&a);
    kept.wait_for_items(1).await;
    let items = kept.items();
    assert_eq!(items[0].run_id, id);
    assert!(items[0].claimed_until().is_some(), "the wake names its claim: {items:?}");
    assert_ne!(store.get_run(&id).await.unwrap().unwrap().wake_at, Some(due_at), "the wake was sent unclaimed");
    a.shutdown().await;
}

/// On a queue that merges items, the due poller leaves a due run that has a fresh unclaimed
/// item of its own in the store's run queue (the wake its deliverer sent) to that item: no
/// claim, no wake sent, while the item is younger than the poll grace — claiming it too cost a
/// second item whenever a consumer had taken the first, and a claim of a busy run. Once the
/// item is as old as the grace (its consumers gone, say), the poller claims the run and sends
/// one claimed wake. The grace counts from the item, not from the run's wake time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_leave_a_due_run_to_its_item_in_the_store_queue_for_the_grace() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let clock = VirtualClock::starting_2026();
    let (id, due_at) = a_due_run_parked_elsewhere(&store, &clock).await;
    clock.advance(Duration::from_secs(2));
    let wake = QueuedRun {
        id: 0,
        run_id: id.clone(),
        reason: durable_transport::QueueReason::Wake,
        namespace: None,
        priority: 0,
        dedupe_key: "wake:delivered".into(),
    };
    let enqueued_at = durable_runtime::Clock::now(&clock);
    durable_core::RunQueue::enqueue(store.inner(), vec![wake], enqueued_at).await.unwrap();
    // The grace is left from the item on: the run has been due 2 s longer when it ends.
    assert_eq!(enqueued_at, due_at + 2_000);
    left_for_the_grace_then_claimed(&store, &clock, Kept::merging(), &id, due_at).await;
}

fn register_approve(engine: &Engine) {
    engine.register("approve", 1, |ctx: WorkflowCtx, _: ()| async move {
        let ok: bool = ctx.wait_for_signal("approve").await?;
        Ok::<_, WorkflowError>(ok)
    });
}

/// A run an engine without a run queue parked on a signal before it went away, made due by a
/// signal sent with a bare store call (so no engine sent a wake for it): its id and `wake_at`.
async fn a_due_run_parked_elsewhere(store: &Arc<FaultyStore<MemoryStore>>, clock: &VirtualClock) -> (RunId, Millis) {
    let b = Engine::builder().shared_store(store.clone()).clock(clock.clone()).config(test_config()).build().unwrap();
    let mut events = b.subscribe();
    register_approve(&b);
    let id = b.start("approve", &(), StartOptions::id("due-in-the-queue")).await.unwrap().id;
    loop {
        if let EngineEvent::RunSuspended { run_id, .. } = events.recv().await.unwrap()
            && run_id == id
        {
            break;
        }
    }
    b.shutdown().await;
    let payload = durable_core::Payload::encode(&true).unwrap();
    store.send_signal("approve", payload, durable_runtime::Clock::now(clock)).await.unwrap();
    let due_at = store.get_run(&id).await.unwrap().unwrap().wake_at.expect("the signal made the run due");
    (id, due_at)
}
