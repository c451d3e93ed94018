//! `durable demo`: a worker for the example workflows that executes N runs with a live
//! progress display, resumes what an earlier (killed) demo left unfinished, and closes with a
//! summary.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use durable::store::WaitKind;
use durable::{Engine, EngineConfig, EngineEvent, Run, RunId, RunStatus, StartOptions, StepKind};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use crate::cli::{DemoArgs, StoreArgs};
use crate::error::{Error, Result};
use crate::store::Access;
use crate::workflows::{
    Approval, DemoInput, Kind, approval_token, demo_run_id, is_demo_workflow, register_demo_workflows,
};

/// How long an interrupted demo lets in-flight turns finish before it exits.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The demo engine's settings: short leases, so that the runs a killed demo left `running`
/// are recovered by the next demo within about two seconds, and quick polls.
fn demo_config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.lease_ttl = Duration::from_secs(2);
    config.poll_interval = Duration::from_millis(100);
    config.orphan_poll_interval = Duration::from_millis(500);
    // `wait_for_run` is woken at once by this engine; the store re-read is only a fallback.
    config.wait_poll_interval = Duration::from_secs(1);
    config
}

/// How a run of the demo ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Completed,
    Failed,
    /// Failed, and its undos ran.
    Compensated,
    Cancelled,
    Dead,
    /// Deleted while the demo waited for it (`durable runs delete` from another shell).
    Deleted,
}

/// The counts the progress display and the summary show.
#[derive(Debug, Default)]
struct Tally {
    total: usize,
    new: usize,
    resumed: usize,
    already_finished: usize,
    completed: usize,
    failed: usize,
    compensated: usize,
    cancelled: usize,
    dead: usize,
    deleted: usize,
}

impl Tally {
    fn record(&mut self, ending: Ending) {
        match ending {
            Ending::Completed => self.completed += 1,
            Ending::Failed => self.failed += 1,
            Ending::Compensated => self.compensated += 1,
            Ending::Cancelled => self.cancelled += 1,
            Ending::Dead => self.dead += 1,
            Ending::Deleted => self.deleted += 1,
        }
    }

    fn finished(&self) -> usize {
        self.completed + self.failed + self.compensated + self.cancelled + self.dead + self.deleted
    }

    fn counts(&self) -> String {
        let mut s = format!("{} completed · {} failed · {} compensated", self.completed, self.failed, self.compensated);
        if self.cancelled > 0 {
            s.push_str(&format!(" · {} cancelled", self.cancelled));
        }
        if self.dead > 0 {
            s.push_str(&format!(" · {} dead", self.dead));
        }
        if self.deleted > 0 {
            s.push_str(&format!(" · {} deleted", self.deleted));
        }
        s
    }
}

/// Step counters, fed by the engine's event stream.
#[derive(Debug, Default)]
struct Steps {
    executed: AtomicU64,
    retried: AtomicU64,
    lagged: AtomicBool,
}

/// The live display on stderr: a progress bar on a terminal, plain lines otherwise (at most
/// four a second, see [`plain_lines`]).
#[derive(Debug)]
struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
    /// Plain lines: the state changed since the last line.
    dirty: AtomicBool,
    /// Plain lines: a line was printed already.
    printed: AtomicBool,
}

impl Progress {
    fn new(total: usize, started: Instant) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner:.green} [{elapsed_precise}] {bar:36.cyan/blue} {pos:>5}/{len} runs  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("█▉▊▋▌▍▎▏ ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Progress { bar, started, dirty: AtomicBool::new(false), printed: AtomicBool::new(false) }
    }

    fn update(&self, tally: &Tally, steps: &Steps) {
        let finished = tally.finished();
        match &self.bar {
            Some(bar) => {
                bar.set_position(finished as u64);
                let executed = steps.executed.load(Ordering::Relaxed);
                bar.set_message(format!("{} · {executed} steps", tally.counts()));
            }
            // The first and the last state are printed at once; the ones between by the ticker.
            None if finished == tally.total || !self.printed.swap(true, Ordering::Relaxed) => self.line(tally, steps),
            None => self.dirty.store(true, Ordering::Relaxed),
        }
    }

    fn line(&self, tally: &Tally, steps: &Steps) {
        self.dirty.store(false, Ordering::Relaxed);
        let line = format!(
            "[{:>6.2}s] {}/{} runs finished · {} · {} steps",
            self.started.elapsed().as_secs_f64(),
            tally.finished(),
            tally.total,
            tally.counts(),
            steps.executed.load(Ordering::Relaxed),
        );
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    /// Runs `f` (which prints to stdout) with the bar hidden, so the two do not garble.
    fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    fn finish(&self, interrupted: bool) {
        if let Some(bar) = &self.bar {
            if interrupted { bar.abandon() } else { bar.finish() }
        }
    }
}

/// Without a terminal: prints the progress as a plain line every 250 ms while it changes.
async fn plain_lines(demo: Arc<Demo>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        if demo.progress.dirty.load(Ordering::Relaxed) {
            let tally = demo.tally.lock();
            demo.progress.line(&tally, &demo.steps);
        }
    }
}

/// Everything the demo tracks while it runs, shared with its tasks and read again if it is
/// interrupted.
#[derive(Debug)]
struct Demo {
    engine: Engine,
    tally: Mutex<Tally>,
    steps: Steps,
    progress: Progress,
    /// Approval runs not finished yet: the ones the demo may have to signal.
    approvals: Mutex<HashSet<RunId>>,
    started: Instant,
}

impl Demo {
    fn settled(&self, id: &RunId, ending: Ending) {
        self.approvals.lock().remove(id);
        let mut tally = self.tally.lock();
        tally.record(ending);
        self.progress.update(&tally, &self.steps);
    }
}

/// Runs `durable demo`.
pub(crate) async fn demo(store_args: &StoreArgs, args: &DemoArgs, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let total = args.runs as usize;
    let store = store_args.open(Access::CreateIfMissing).await?;
    let engine = Engine::builder().shared_store(store).config(demo_config()).build()?;
    let demo = Arc::new(Demo {
        engine: engine.clone(),
        tally: Mutex::new(Tally { total, ..Tally::default() }),
        steps: Steps::default(),
        progress: Progress::new(total, started),
        approvals: Mutex::new(HashSet::new()),
        started,
    });
    let result = {
        let work = execute(demo.clone(), store_args, args.runs, out);
        tokio::select! {
            r = work => Some(r),
            () = interrupted() => None,
        }
    };
    match result {
        Some(Ok(())) => {
            demo.progress.finish(false);
            engine.shutdown().await;
            summary(&demo, out, None)?;
            Ok(())
        }
        Some(Err(e)) => {
            demo.progress.finish(true);
            engine.shutdown().await;
            Err(e)
        }
        None => {
            demo.progress.finish(true);
            // A second Ctrl-C while draining: stop at once (nothing durable is lost either way).
            tokio::spawn(async {
                interrupted().await;
                std::process::exit(130);
            });
            let drained = engine.drain(DRAIN_TIMEOUT).await;
            summary(&demo, out, Some(drained))?;
            Err(Error::Interrupted)
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    r = tokio::signal::ctrl_c() => if r.is_err() { std::future::pending::<()>().await },
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                if tokio::signal::ctrl_c().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The demo proper: look at what an earlier demo left, register the workflows, start the
/// missing runs, wait for every run to finish.
async fn execute(demo: Arc<Demo>, store_args: &StoreArgs, runs: u32, out: &mut dyn Write) -> Result<()> {
    let engine = &demo.engine;
    // 1. What exists already. Nothing is registered yet, so nothing executes while we look.
    let mut to_start = Vec::new();
    let mut to_wait = Vec::new();
    for i in 0..runs {
        let id = demo_run_id(i);
        match engine.get_run(&id).await? {
            None => to_start.push(i),
            Some(run) if !is_demo_workflow(&run.workflow) => {
                return Err(Error::bad(format!(
                    "{} already has a run {id} of workflow {:?}, which is not a demo run; give the demo a database of its own with --db (or a schema of its own with --schema)",
                    store_args.describe(),
                    run.workflow
                )));
            }
            Some(run) if run.status.is_terminal() => {
                let ending = ending_of(engine, &run).await?;
                let mut tally = demo.tally.lock();
                tally.already_finished += 1;
                tally.record(ending);
            }
            Some(_) => {
                demo.tally.lock().resumed += 1;
                to_wait.push(id);
            }
        }
    }
    {
        let tally = demo.tally.lock();
        demo.progress.suspend(|| {
            writeln!(
                out,
                "durable demo: {runs} runs (order, sleep, approval, saga, fan-out) on {}\n  {} to start, {} to resume (unfinished by an earlier demo), {} already finished",
                store_args.describe(),
                to_start.len(),
                tally.resumed,
                tally.already_finished,
            )?;
            out.flush()
        })?;
        demo.progress.update(&tally, &demo.steps);
    }
    {
        let mut approvals = demo.approvals.lock();
        approvals.extend(to_start.iter().filter(|i| Kind::of(**i) == Kind::Approval).map(|i| demo_run_id(*i)));
        approvals.extend(to_wait.iter().filter(|id| id.as_str().starts_with("demo-approval-")).cloned());
    }

    // 2. Watch the engine's events, answer approvals, then register: from here on the engine
    //    executes, and its pollers pick up the runs to resume.
    let (wake_signaller, wakes) = mpsc::unbounded_channel();
    let mut background = JoinSet::new();
    background.spawn(count_events(demo.clone(), engine.subscribe(), wake_signaller));
    background.spawn(signal_approvals(demo.clone(), wakes));
    if demo.progress.bar.is_none() {
        background.spawn(plain_lines(demo.clone()));
    }
    register_demo_workflows(engine);

    // 3. Start the missing runs (concurrently: the store commits them in groups) and wait for
    //    every run to finish.
    let mut runs_done = JoinSet::new();
    for id in to_wait {
        let engine = engine.clone();
        runs_done.spawn(async move {
            let run = finished(&engine, &id).await?;
            Ok::<_, Error>((id, run))
        });
    }
    for i in to_start {
        let demo = demo.clone();
        runs_done.spawn(async move {
            let kind = Kind::of(i);
            let options = StartOptions::id(demo_run_id(i).to_string()).tag("demo");
            let started = demo.engine.start(kind.workflow(), &DemoInput { n: u64::from(i) }, options).await?;
            if started.created {
                demo.tally.lock().new += 1;
            } else {
                // Another process created it between our look and our start (start is
                // idempotent: it did nothing): not started by us, so counted as resumed.
                demo.tally.lock().resumed += 1;
            }
            let run = finished(&demo.engine, &started.id).await?;
            Ok::<_, Error>((started.id, run))
        });
    }
    while let Some(joined) = runs_done.join_next().await {
        let (id, run) = joined.map_err(|e| Error::failed(format!("a demo task failed: {e}")))??;
        let ending = match run {
            Some(run) => ending_of(engine, &run).await?,
            None => Ending::Deleted,
        };
        demo.settled(&id, ending);
    }
    background.abort_all();
    Ok(())
}

/// The run once it finished; `None` if it was deleted meanwhile (an operator may delete a demo
/// run from another shell: the demo counts it and goes on with the others).
async fn finished(engine: &Engine, id: &RunId) -> Result<Option<Run>> {
    match engine.wait_for_run(id).await {
        Ok(outcome) => Ok(Some(outcome.run)),
        Err(durable::Error::RunNotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How a finished run ended; a failed run whose history has undos was compensated.
async fn ending_of(engine: &Engine, run: &Run) -> Result<Ending> {
    Ok(match run.status {
        RunStatus::Completed => Ending::Completed,
        RunStatus::Cancelled => Ending::Cancelled,
        RunStatus::Dead => Ending::Dead,
        _ => match engine.history(&run.id).await {
            Ok(history) if history.iter().any(|c| c.kind == StepKind::Compensation) => Ending::Compensated,
            Ok(_) => Ending::Failed,
            // Deleted from another shell since it finished.
            Err(durable::Error::RunNotFound(_)) => Ending::Deleted,
            Err(e) => return Err(e.into()),
        },
    })
}

/// Counts executed and retried steps, and tells the signaller when an approval run parked.
async fn count_events(
    demo: Arc<Demo>,
    mut events: broadcast::Receiver<EngineEvent>,
    wake_signaller: mpsc::UnboundedSender<RunId>,
) {
    loop {
        match events.recv().await {
            Ok(EngineEvent::StepCompleted { .. } | EngineEvent::StepFailed { .. }) => {
                demo.steps.executed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(EngineEvent::StepRetrying { .. }) => {
                demo.steps.retried.fetch_add(1, Ordering::Relaxed);
            }
            Ok(EngineEvent::RunSuspended { run_id, .. }) => {
                if demo.approvals.lock().contains(&run_id) {
                    let _ = wake_signaller.send(run_id);
                }
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => demo.steps.lagged.store(true, Ordering::Relaxed),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Plays the approver: signals every approval run that waits for its answer, once. Woken when
/// an approval run parks; also looks at all unfinished approvals every second (the runs an
/// earlier demo left parked, and any wake-up the event stream dropped).
async fn signal_approvals(demo: Arc<Demo>, mut wakes: mpsc::UnboundedReceiver<RunId>) {
    let mut signalled: HashSet<RunId> = HashSet::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    loop {
        let candidates: Vec<RunId> = tokio::select! {
            woken = wakes.recv() => match woken {
                Some(id) => vec![id],
                None => return,
            },
            _ = sweep.tick() => demo.approvals.lock().iter().cloned().collect(),
        };
        for id in candidates {
            if signalled.contains(&id) || !demo.approvals.lock().contains(&id) {
                continue;
            }
            let token = approval_token(&id);
            let waiting = match demo.engine.store().waiters(&id).await {
                Ok(waiters) => waiters.iter().any(|w| matches!(&w.kind, WaitKind::Signal { token: t } if *t == token)),
                Err(_) => false,
            };
            if !waiting {
                continue;
            }
            let answer = Approval { approved: true, by: "durable demo".into() };
            match demo.engine.signal(&token, &answer).await {
                Ok(_) => {
                    signalled.insert(id);
                }
                Err(e) => tracing::warn!(run_id = %id, error = %e, "could not signal the approval; trying again"),
            }
        }
    }
}

/// Prints the closing summary (`drained`: `Some` when the demo was interrupted).
fn summary(demo: &Demo, out: &mut dyn Write, drained: Option<bool>) -> Result<()> {
    let tally = demo.tally.lock();
    let wall = demo.started.elapsed().as_secs_f64();
    let executed = demo.steps.executed.load(Ordering::Relaxed);
    let retried = demo.steps.retried.load(Ordering::Relaxed);
    let at_least = if demo.steps.lagged.load(Ordering::Relaxed) { "≥" } else { "" };
    let finished = tally.finished();
    match drained {
        None => writeln!(out, "\ndone: {finished} of {} runs finished in {wall:.2} s", tally.total)?,
        Some(drained) => writeln!(
            out,
            "\ninterrupted: {finished} of {} runs finished in {wall:.2} s; {}run the same command again to resume the rest",
            tally.total,
            if drained {
                "in-flight steps were drained; "
            } else {
                "some steps did not drain in time (they run again); "
            }
        )?,
    }
    let rows: Vec<(&str, String, &str)> = vec![
        ("completed", tally.completed.to_string(), ""),
        ("failed", tally.failed.to_string(), ""),
        ("compensated", tally.compensated.to_string(), "sagas: the last step failed, the undos ran; status failed"),
        ("cancelled", tally.cancelled.to_string(), ""),
        ("dead", tally.dead.to_string(), ""),
        ("deleted", tally.deleted.to_string(), "deleted by an operator while the demo ran"),
        ("new", tally.new.to_string(), "started by this demo"),
        ("resumed", tally.resumed.to_string(), "unfinished at startup, picked up again"),
        ("already finished", tally.already_finished.to_string(), "finished by an earlier demo"),
        ("steps executed", format!("{at_least}{executed}"), ""),
        // Wall time includes the deliberate sleeps, backoffs and approval waits of the example
        // workflows: this is not the engine's speed, which `cargo xtask bench` measures.
        (
            "steps/s",
            format!("{:.0}", executed as f64 / wall.max(1e-3)),
            "includes the demo's deliberate sleeps and waits; see `cargo xtask bench` for engine throughput",
        ),
        ("retried attempts", format!("{at_least}{retried}"), ""),
        ("wall time", format!("{wall:.2} s"), ""),
    ];
    for (label, value, note) in rows {
        if matches!(label, "cancelled" | "dead" | "deleted") && value == "0" {
            continue;
        }
        let note = if note.is_empty() { String::new() } else { format!("  ({note})") };
        writeln!(out, "  {label:<17}{value:>7}{note}")?;
    }
    out.flush()?;
    Ok(())
}
