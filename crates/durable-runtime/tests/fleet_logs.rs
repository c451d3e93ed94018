//! The operator's log lines: a workflow version registered again, and about a run queue (a run
//! handed over that the store does not have, a queue that works again). Each test reads what
//! its own subscriber (a thread-local default on a current-thread runtime, where the engine's
//! tasks run) logged. In a binary of their own:
//! tracing caches whether a call site is enabled, and a test elsewhere in the binary logging
//! the same line with no subscriber could make the cache say "never" for it.

use std::sync::Arc;

use async_trait::async_trait;
use durable_conformance::test_config;
use durable_core::{QueueReason, RunId};
use durable_runtime::{Engine, StartOptions, WorkflowCtx, WorkflowError};
use durable_store_memory::MemoryStore;
use durable_transport::{Consumer, Handled, InProcessTransport, QueuedRun, RunHandler, Transport, TransportError};

/// Logs into a buffer from here on (this thread), and makes every call site look again.
fn capture() -> (Logged, tracing::subscriber::DefaultGuard) {
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    (logged, guard)
}

/// A run queue that hands its consumer one item for a run no store has (another deployment's,
/// sharing the queue) and reports what the engine did with it.
#[derive(Debug)]
struct GhostTransport(parking_lot::Mutex<Option<tokio::sync::oneshot::Sender<Handled>>>);

#[async_trait]
impl Transport for GhostTransport {
    async fn dispatch_runs(&self, _: Option<&str>, _: Vec<QueuedRun>) -> Result<(), TransportError> {
        Ok(())
    }

    fn consume_runs(&self, _: Option<String>, _: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let done = self.0.lock().take();
        Consumer::new(
            stop,
            tokio::spawn(async move {
                let ghost = QueuedRun {
                    id: 1,
                    run_id: RunId::from("ghost"),
                    reason: QueueReason::Start,
                    namespace: None,
                    priority: 0,
                    dedupe_key: "start:ghost:0".into(),
                };
                let handled = handler.handle(ghost).await;
                if let Some(done) = done {
                    let _ = done.send(handled);
                }
                drop(stopped.wait_for(|s| *s).await);
            }),
        )
    }
}

/// What a test's subscriber logged.
#[derive(Clone, Default)]
struct Logged(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Registering a workflow version again replaces its body: that is logged, naming the fix.
#[tokio::test]
async fn registering_a_version_again_is_reported() {
    let (logged, _log) = capture();
    let engine = Engine::builder().store(MemoryStore::new()).config(test_config()).build().unwrap();
    engine.register("echo", 1, |_: WorkflowCtx, x: u64| async move { Ok::<_, WorkflowError>(x) });
    engine.register("echo", 2, |_: WorkflowCtx, x: u64| async move { Ok::<_, WorkflowError>(x) });
    let text = String::from_utf8(logged.0.lock().clone()).unwrap();
    assert!(!text.contains("registered already"), "a new version is no replacement: {text}");
    engine.register("echo", 1, |_: WorkflowCtx, x: u64| async move { Ok::<_, WorkflowError>(2 * x) });
    let text = String::from_utf8(logged.0.lock().clone()).unwrap();
    assert!(
        text.contains("WARN")
            && text.contains("workflow \"echo\" version 1 was registered already")
            && text.contains("register a changed body as a new version"),
        "{text}"
    );
    engine.shutdown().await;
}

/// A run the transport hands over that the store does not have (two deployments sharing a
/// broker prefix) is logged as such, naming the run and what to check.
#[tokio::test]
async fn a_run_handed_over_that_the_store_does_not_have_is_reported() {
    let (logged, _log) = capture();
    let (done, handled) = tokio::sync::oneshot::channel();
    let ghost = GhostTransport(parking_lot::Mutex::new(Some(done)));
    let engine = Engine::builder().store(MemoryStore::new()).transport(ghost).config(test_config()).build().unwrap();
    assert_eq!(handled.await.unwrap(), Handled::Done);
    let text = String::from_utf8(logged.0.lock().clone()).unwrap();
    assert!(
        text.contains("WARN") && text.contains("run ghost was handed to this engine but its store has no such run"),
        "{text}"
    );
    assert!(text.contains("shares this run queue"), "{text}");
    engine.shutdown().await;
}

/// A run queue down for its first send only; it tells the test of each send.
#[derive(Debug)]
struct BackTransport(tokio::sync::mpsc::UnboundedSender<usize>, std::sync::atomic::AtomicUsize);

#[async_trait]
impl Transport for BackTransport {
    async fn dispatch_runs(&self, _: Option<&str>, _: Vec<QueuedRun>) -> Result<(), TransportError> {
        let n = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = self.0.send(n);
        if n == 0 { Err(TransportError::Unavailable("broker unreachable".into())) } else { Ok(()) }
    }

    fn consume_runs(&self, _: Option<String>, _: usize, _: Arc<dyn RunHandler>) -> Consumer {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        Consumer::new(stop, tokio::spawn(async move { drop(stopped.wait_for(|s| *s).await) }))
    }
}

/// A run queue that failed and works again is said to, once: an operator who read the
/// failure learns it is over.
#[tokio::test]
async fn a_queue_that_works_again_is_reported() {
    let (logged, _log) = capture();
    let (sent, mut sends) = tokio::sync::mpsc::unbounded_channel();
    let back = BackTransport(sent, std::sync::atomic::AtomicUsize::new(0));
    let engine = Engine::builder().store(MemoryStore::new()).transport(back).config(test_config()).build().unwrap();
    engine.register("nap", 1, |_: WorkflowCtx, i: u64| async move { Ok::<_, WorkflowError>(i) });
    // Each start is one send; the flusher finishes one (and logs) before it makes the next.
    for i in 0..3u64 {
        engine.start("nap", &i, StartOptions::id(format!("back-{i}"))).await.unwrap();
        assert_eq!(sends.recv().await, Some(i as usize));
    }
    let text = String::from_utf8(logged.0.lock().clone()).unwrap();
    assert_eq!(text.matches("the run queue is failing").count(), 1, "{text}");
    assert_eq!(text.matches("the run queue is working again").count(), 1, "{text}");
    engine.shutdown().await;
}

/// An engine on `store` and `transport` with a 50 ms poll grace (a client, whose pollers do
/// not look, or a worker with `queue_concurrency` items at once), `nap` and `hold` registered: `hold` waits in its step
/// until `release` is notified, after saying so on `entered`.
fn fleet_engine(
    store: &Arc<dyn durable_core::Store>,
    transport: impl Transport,
    client: bool,
    queue_concurrency: usize,
    gate: &Gate,
) -> Engine {
    let mut config = test_config();
    config.poll_grace = std::time::Duration::from_millis(50);
    config.queue_concurrency = queue_concurrency;
    if client {
        // Only the worker's pending poller sends runs again.
        config.poll_interval = std::time::Duration::from_secs(3600);
    }
    let builder = Engine::builder().shared_store(store.clone()).transport(transport).config(config);
    let engine = if client { builder.client_only() } else { builder }.build().unwrap();
    engine.register("nap", 1, |_: WorkflowCtx, i: u64| async move { Ok::<_, WorkflowError>(i) });
    let gate = gate.clone();
    engine.register("hold", 1, move |ctx: WorkflowCtx, _: u64| {
        let gate = gate.clone();
        async move {
            let held: u64 = ctx
                .step("hold", move |_| {
                    let gate = gate.clone();
                    async move {
                        if let Some(entered) = gate.entered.lock().take() {
                            let _ = entered.send(());
                        }
                        gate.release.notified().await;
                        Ok::<_, durable_core::StepError>(1u64)
                    }
                })
                .await?;
            Ok::<_, WorkflowError>(held)
        }
    });
    engine
}

/// Where `hold` says it is in its step, and what lets it go on.
#[derive(Clone)]
struct Gate {
    entered: Arc<parking_lot::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
    release: Arc<tokio::sync::Notify>,
}

fn gate() -> (Gate, tokio::sync::oneshot::Receiver<()>) {
    let (entered, inside) = tokio::sync::oneshot::channel();
    (Gate { entered: Arc::new(parking_lot::Mutex::new(Some(entered))), release: Arc::default() }, inside)
}

const STRAY: &str = "never reached this engine's run queue while it was idle";

/// Workers and a client whose run queues differ (two brokers, or two prefixes on one): the
/// client's start items reach no consumer, the worker's pending poller sends the runs again
/// after the poll grace, and says what to check, once.
#[tokio::test]
async fn starts_that_never_reach_the_run_queue_are_reported() {
    let (logged, _log) = capture();
    let store: Arc<dyn durable_core::Store> = Arc::new(MemoryStore::new());
    let (gate, _) = gate();
    let client = fleet_engine(&store, InProcessTransport::new(), true, 64, &gate);
    let worker = fleet_engine(&store, InProcessTransport::new(), false, 64, &gate);
    for i in 0..3u64 {
        let id = client.start("nap", &i, StartOptions::id(format!("other-{i}"))).await.unwrap().id;
        assert_eq!(client.wait_for_run(&id).await.unwrap().output::<u64>().unwrap(), i, "run by the poller");
    }
    let text = String::from_utf8(logged.0.lock().clone()).unwrap();
    assert_eq!(text.matches(STRAY).count(), 1, "once a minute: {text}");
    assert!(text.contains("WARN") && text.contains("the same transport and prefix"), "{text}");
    client.shutdown().await;
    worker.shutdown().await;
}

/// One run queue, tells the test of each run sent to it a second time.
#[derive(Debug)]
struct Resent {
    queue: InProcessTransport,
    seen: parking_lot::Mutex<std::collections::HashSet<RunId>>,
    again: tokio::sync::mpsc::UnboundedSender<RunId>,
}

#[async_trait]
impl Transport for Resent {
    async fn dispatch_runs(&self, namespace: Option<&str>, batch: Vec<QueuedRun>) -> Result<(), TransportError> {
        for item in &batch {
            if !self.seen.lock().insert(item.run_id.clone()) {
                let _ = self.again.send(item.run_id.clone());
            }
        }
        self.queue.dispatch_runs(namespace, batch).await
    }

    fn consume_runs(&self, namespace: Option<String>, concurrency: usize, handler: Arc<dyn RunHandler>) -> Consumer {
        self.queue.consume_runs(namespace, concurrency, handler)
    }

    fn routes_without_namespace(&self) -> bool {
        self.queue.routes_without_namespace()
    }

    fn merges_runs(&self) -> bool {
        self.queue.merges_runs()
    }
}

/// A backlog on a shared queue is not a stray start: runs wait in the queue past the grace
/// (the pending poller sends them again) while the worker's consumer holds all it may, with
/// execution slots to spare, and nothing is said.
#[tokio::test]
async fn a_backlog_is_not_reported_as_stray_starts() {
    let (logged, _log) = capture();
    let store: Arc<dyn durable_core::Store> = Arc::new(MemoryStore::new());
    let (sent_again, mut again) = tokio::sync::mpsc::unbounded_channel();
    let queue = Arc::new(Resent { queue: InProcessTransport::new(), seen: Default::default(), again: sent_again });
    let (gate, inside) = gate();
    let client = fleet_engine(&store, queue.clone(), true, 64, &gate);
    let worker = fleet_engine(&store, queue, false, 1, &gate);
    let held = client.start("hold", &0, StartOptions::id("held")).await.unwrap().id;
    inside.await.unwrap();
    let waiting = client.start("nap", &1, StartOptions::id("waiting")).await.unwrap().id;
    // The worker's only queue item is `held`: `waiting` stays in the queue past the grace and
    // is sent again (the poller decided whether to warn before it sent it).
    while again.recv().await.unwrap() != waiting {}
    let text = String::from_utf8(logged.0.lock().clone()).unwrap();
    assert!(!text.contains(STRAY), "{text}");
    gate.release.notify_one();
    assert_eq!(client.wait_for_run(&held).await.unwrap().output::<u64>().unwrap(), 1);
    assert_eq!(client.wait_for_run(&waiting).await.unwrap().output::<u64>().unwrap(), 1);
    client.shutdown().await;
    worker.shutdown().await;
}
