//! The engine's and workers' metrics, read back from a real recorder (`PrometheusRecorder`'s
//! text): runs started and settled by outcome, counted once per run with two engines racing;
//! step and turn histograms with one sample per step attempt and per turn; a lease takeover
//! after an expiry, the recovery, and the lease the stalled engine lost; remote-step results
//! recorded and a duplicate dropped; commit latency and batch size.
//!
//! Each test records into its own recorder (`metrics::with_local_recorder`, on a
//! current-thread runtime: every task of the engines and workers runs on the test's thread),
//! so the tests do not see each other's counts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod support;

use durable_conformance::{Counter, TestEngine, test_config};
use durable_core::{RunStatus, StepError};
use durable_runtime::metrics::{self as names, PrometheusRecorder};
use durable_runtime::{EngineEvent, StartOptions, TaskContext, Worker, WorkflowCtx, WorkflowError, WorkflowOptions};
use support::StoreFixture;
use tokio::sync::{mpsc, oneshot, watch};

/// A Prometheus scrape.
struct Scrape(String);

impl Scrape {
    /// The value of the sample `name` whose labels are exactly `labels` (`None`: no such
    /// sample).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        want.sort();
        self.0.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, have) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.strip_suffix('}')?.split(',').map(String::from).collect()),
                None => (series, Vec::new()),
            };
            let mut have: Vec<String> = have;
            have.sort();
            (metric == name && have == want).then(|| value.parse().expect("a number"))
        })
    }

    /// [`Scrape::get`], 0 when absent.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// The sample count of histogram `name` with `labels`.
    fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(&format!("{name}_count"), labels)
    }

    /// The sum over every series of `name` (any labels).
    fn total(&self, name: &str) -> f64 {
        self.0
            .lines()
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

/// Runs `test` on a current-thread runtime with a fresh Prometheus recorder installed for this
/// thread only; returns what it returned and the scrape taken after it.
fn recorded<T, F: Future<Output = T>>(test: impl FnOnce() -> F) -> (T, Scrape) {
    let recorder = PrometheusRecorder::new();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let out = metrics::with_local_recorder(&recorder, || rt.block_on(test()));
    drop(rt);
    (out, Scrape(recorder.render()))
}

/// `job`: one step `work`; input 0 completes, 1 fails (the step fails fatally), 2 waits for
/// the signal `hold:<run>` (it is cancelled).
fn register_job(t: &TestEngine) {
    t.register("job", 1, |ctx: WorkflowCtx, mode: u32| async move {
        let n: u32 = ctx
            .step("work", move |_| async move { if mode == 1 { Err(StepError::fatal("refused")) } else { Ok(mode) } })
            .await?;
        if n == 2 {
            let _: () = ctx.wait_for_signal(&format!("hold:{}", ctx.run_id())).await?;
        }
        Ok::<_, WorkflowError>(n)
    });
}

#[test]
fn ten_runs_on_two_engines_are_counted_once_each_by_outcome_on_memory() {
    ten_runs_on_two_engines(StoreFixture::memory());
}

#[test]
fn ten_runs_on_two_engines_are_counted_once_each_by_outcome_on_sqlite() {
    ten_runs_on_two_engines(StoreFixture::sqlite());
}

/// Two engines (on SQLite, each with its own handle on the file, as two processes) start and
/// execute 10 runs: 7 complete, 2 fail, 1 is cancelled.
fn ten_runs_on_two_engines(s: StoreFixture) {
    let (turns, m) = recorded(|| async {
        let a = s.engine();
        let b = TestEngine::with_parts(s.second_handle(), a.clock().clone(), test_config());
        register_job(&a);
        register_job(&b);
        let modes = [0, 0, 0, 0, 0, 0, 0, 1, 1, 2];
        let mut ids = Vec::new();
        for (i, mode) in modes.iter().enumerate() {
            // Both engines start runs and both execute them (they share the store).
            let engine = if i % 2 == 0 { &a } else { &b };
            ids.push(engine.start("job", mode, StartOptions::id(format!("job:{i}"))).await.unwrap().id);
        }
        // Starting an id again creates nothing.
        assert!(!a.start("job", &0u32, StartOptions::id("job:0")).await.unwrap().created);
        for (id, mode) in ids.iter().zip(modes) {
            let expected = match mode {
                0 => RunStatus::Completed,
                1 => RunStatus::Failed,
                _ => RunStatus::Suspended,
            };
            a.assert_settled_status(id, expected).await;
        }
        assert_eq!(b.cancel(&ids[9]).await.unwrap(), RunStatus::Cancelled);
        // Cancelling it again changes nothing and counts nothing.
        assert_eq!(a.cancel(&ids[9]).await.unwrap(), RunStatus::Cancelled);
        a.assert_status(&ids[9], RunStatus::Cancelled).await;
        // A turn still executing (a late wake's) finishes before the count is read: a
        // shutdown would drop it, counted in `turns` but without its sample.
        assert!(a.drain(Duration::from_secs(30)).await && b.drain(Duration::from_secs(30)).await);
        a.metrics().turns + b.metrics().turns
    });
    let job = ("workflow", "job");
    assert_eq!(m.value(names::RUNS_STARTED, &[job]), 10.0, "{}", m.0);
    let settled = |outcome| m.value(names::RUNS_SETTLED, &[job, ("outcome", outcome)]);
    assert_eq!((settled("completed"), settled("failed"), settled("cancelled")), (7.0, 2.0, 1.0), "{}", m.0);
    assert_eq!(m.total(names::RUNS_SETTLED), 10.0, "nothing else settled");
    // One step attempt per run: 8 completed (7 runs, and the cancelled one's step), 2 failed.
    let steps = |outcome| m.count(names::STEP_DURATION, &[job, ("kind", "step"), ("outcome", outcome)]);
    assert_eq!((steps("completed"), steps("failed"), steps("retry")), (8.0, 2.0, 0.0), "{}", m.0);
    // One sample per turn, on whichever engine ran it.
    assert!(turns >= 10, "{turns} turns");
    assert_eq!(m.count(names::TURN_DURATION, &[job]), turns as f64, "{}", m.0);
    // Every commit of the turns: one per step and one per turn end at least.
    let commits = m.count(names::STORE_COMMIT, &[("outcome", "ok")]);
    assert!(commits >= 20.0, "{commits} commits");
    assert_eq!(m.value(&format!("{}_count", names::STORE_COMMIT_BATCH_SIZE), &[]), commits);
    assert!(m.value(&format!("{}_sum", names::STORE_COMMIT_BATCH_SIZE), &[]) >= commits, "each writes a record");
    assert_eq!(m.total(names::DEAD_RUNS), 0.0);
    assert_eq!(m.total(names::LEASE_TAKEOVERS), 0.0);
    // The engine describes its metrics to the recorder.
    assert!(m.0.contains(&format!("# HELP {} ", names::RUNS_SETTLED)), "{}", m.0);
}

#[test]
fn a_retried_step_takes_a_sample_per_attempt_and_a_timeout_counts_as_timed_out() {
    let ((), m) = recorded(|| async {
        let t = TestEngine::new();
        let fails = Counter::new();
        let f = fails.clone();
        t.register("flaky", 1, move |ctx: WorkflowCtx, (): ()| {
            let f = f.clone();
            async move {
                ctx.step("try", move |_| {
                    let n = f.bump();
                    async move { if n < 3 { Err(StepError::retryable("not yet")) } else { Ok(n) } }
                })
                .retry(5, durable_core::Backoff::None)
                .await?;
                Ok::<_, WorkflowError>(())
            }
        });
        let options = WorkflowOptions::execution_timeout(Duration::from_secs(60));
        t.register_with("slow", 1, options, |ctx: WorkflowCtx, (): ()| async move {
            ctx.sleep(Duration::from_secs(3600)).await;
            Ok::<_, WorkflowError>(())
        });
        let flaky = t.start("flaky", &(), StartOptions::id("flaky")).await.unwrap();
        t.assert_settled_status(&flaky.id, RunStatus::Completed).await;
        let slow = t.start("slow", &(), StartOptions::id("slow")).await.unwrap();
        t.assert_settled_status(&slow.id, RunStatus::Suspended).await;
        t.advance(Duration::from_secs(61));
        // The timeout poller (after each orphan scan) cancels it.
        assert_eq!(t.wait_for_run(&slow.id).await.unwrap().status(), RunStatus::Cancelled);
        t.engine().shutdown().await;
    });
    let attempts =
        |outcome| m.count(names::STEP_DURATION, &[("workflow", "flaky"), ("kind", "step"), ("outcome", outcome)]);
    assert_eq!((attempts("retry"), attempts("completed")), (2.0, 1.0), "{}", m.0);
    let slow = |outcome| m.value(names::RUNS_SETTLED, &[("workflow", "slow"), ("outcome", outcome)]);
    assert_eq!((slow("timed_out"), slow("cancelled")), (1.0, 0.0), "{}", m.0);
}

/// Engine A's step hangs; its lease expires (virtual clock) and engine B takes the run over,
/// reruns the step and completes the run. Then A's step returns: its commit is refused, A's
/// lease is lost.
#[test]
fn a_takeover_after_a_lease_expiry_is_counted_with_its_recovery_and_the_lost_lease() {
    let ((), m) = recorded(|| async {
        let a = TestEngine::new();
        let b = a.sibling();
        let (gate_tx, gate) = watch::channel(false);
        let (hung_tx, mut hung) = mpsc::unbounded_channel::<()>();
        let calls = Counter::new();
        for t in [&a, &b] {
            let (gate, hung_tx, calls) = (gate.clone(), hung_tx.clone(), calls.clone());
            t.register("stall", 1, move |ctx: WorkflowCtx, (): ()| {
                let (gate, hung_tx, calls) = (gate.clone(), hung_tx.clone(), calls.clone());
                async move {
                    ctx.step("work", move |_| {
                        let (mut gate, hung_tx, calls) = (gate.clone(), hung_tx.clone(), calls.clone());
                        async move {
                            // The first execution hangs until the gate opens.
                            if calls.bump() == 1 {
                                let _ = hung_tx.send(());
                                let _ = gate.wait_for(|open| *open).await;
                            }
                            Ok(())
                        }
                    })
                    .await?;
                    Ok::<_, WorkflowError>(())
                }
            });
        }
        // A runs it (B only polls, and finds nothing it may take yet).
        let run = a.start("stall", &(), StartOptions::id("stall")).await.unwrap();
        hung.recv().await.unwrap();
        let held = a.shared_store().get_run(&run.id).await.unwrap().unwrap();
        assert_eq!(held.lease_owner.as_deref(), Some(a.owner()));
        a.clock().advance(test_config().lease_ttl + Duration::from_secs(1));
        b.poll_now();
        b.assert_settled_status(&run.id, RunStatus::Completed).await;
        gate_tx.send_replace(true);
        // A's turn ends (its commit refused) before the drain returns.
        assert!(a.drain(Duration::from_secs(10)).await, "A's turn ended");
        b.engine().shutdown().await;
    });
    let stall = [("workflow", "stall")];
    assert_eq!(m.value(names::LEASE_TAKEOVERS, &stall), 1.0, "{}", m.0);
    assert_eq!(m.value(names::RECOVERIES, &stall), 1.0, "{}", m.0);
    assert_eq!(m.value(names::LEASES_LOST, &stall), 1.0, "{}", m.0);
    assert_eq!(m.value(names::RUNS_SETTLED, &[stall[0], ("outcome", "completed")]), 1.0);
    assert_eq!(m.total(names::RUNS_SETTLED), 1.0, "settled once");
}

/// A worker's handler for attempt 1 is still running when an operator re-dispatches the step:
/// attempt 2 completes on the same worker, and attempt 1's late result is dropped as a
/// duplicate (the run still waits for a signal, so it is not `run_settled`).
#[test]
fn remote_results_are_counted_by_queue_and_a_duplicate_is_dropped() {
    let (report, m) = recorded(|| async {
        let t = TestEngine::new();
        t.register("remote", 1, |ctx: WorkflowCtx, (): ()| async move {
            let v: u32 = ctx.remote_step("echo", &()).await?;
            let _: () = ctx.wait_for_signal("go").await?;
            Ok::<_, WorkflowError>(v)
        });
        let (started_tx, started) = oneshot::channel::<()>();
        let started_tx = Arc::new(parking_lot::Mutex::new(Some(started_tx)));
        let (gate_tx, gate) = watch::channel(false);
        let worker = Worker::builder()
            .engine(t.engine())
            .concurrency(4)
            .handle("echo", move |ctx: TaskContext, (): ()| {
                let (started_tx, mut gate) = (started_tx.lock().take(), gate.clone());
                async move {
                    if let Some(tx) = started_tx {
                        let _ = tx.send(());
                        let _ = gate.wait_for(|open| *open).await;
                    }
                    Ok::<_, StepError>(ctx.attempt())
                }
            })
            .build();
        let (stop_tx, stop) = oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            worker
                .run(async {
                    let _ = stop.await;
                })
                .await
        });
        let mut events = t.subscribe();
        let run = t.start("remote", &(), StartOptions::id("remote")).await.unwrap();
        started.await.unwrap();
        assert_eq!(t.redispatch_pending(&run.id).await.unwrap(), 1);
        // Attempt 2 completes; the run waits for its signal.
        loop {
            if let EngineEvent::RunSuspended { run_id, .. } = events.recv().await.unwrap()
                && run_id == run.id
                && t.checkpoints(&run.id).await.len() == 2
            {
                break;
            }
        }
        gate_tx.send_replace(true);
        let _ = stop_tx.send(());
        let report = running.await.unwrap();
        t.signal("go", &()).await.unwrap();
        t.assert_output(&run.id, 2u32).await;
        t.engine().shutdown().await;
        report
    });
    assert_eq!((report.completed, report.dropped), (1, 1), "{report:?}");
    let echo = |outcome| m.value(names::TASKS, &[("queue", "echo"), ("outcome", outcome)]);
    assert_eq!((echo("completed"), echo("redispatched"), echo("failed")), (1.0, 1.0, 0.0), "{}", m.0);
    assert_eq!(m.value(names::TASK_RESULTS_DROPPED, &[("reason", "duplicate")]), 1.0, "{}", m.0);
    assert_eq!(m.total(names::TASK_RESULTS_DROPPED), 1.0);
    // Both handler runs returned in time: two samples.
    assert_eq!(m.count(names::TASK_DURATION, &[("queue", "echo"), ("outcome", "completed")]), 2.0, "{}", m.0);
}

#[test]
fn every_metric_is_named_once_with_the_durable_prefix() {
    let mut all = names::ALL.to_vec();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), names::ALL.len());
    assert!(names::ALL.iter().all(|n| n.starts_with("durable_")));
}
