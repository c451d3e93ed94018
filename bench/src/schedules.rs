//! The `schedules` workload: N stored schedules (`Schedule::every(60 s)`, all on the same
//! minute boundaries) fired by the engine's scheduler for a few consecutive rounds.
//!
//! Durable time is real time plus an offset ([`SkipClock`]): between rounds, once every run of
//! the round has completed, the clock skips ahead to [`LEAD_MS`] before the next minute
//! boundary, so a round costs seconds, not a minute, while the scheduler's own timing (its
//! sleep to the due time, its poll interval, every store call) stays real. The runs are no-op
//! workflows and execute during the measurement, on the same engine and store, as they would
//! in a deployment. With `--defer-runs` each schedule has a jitter of a year: every run is
//! created at the fire, as before, but to start up to a year later, so nothing executes while
//! the scheduler is measured (the scheduler's cost alone).
//!
//! Measured, per fire: lateness — when the `save_schedules` call that created the fire's run
//! returned, minus the nominal fire time in the run id, 0 if it returned before (the scheduler
//! decides an `Allow` schedule's fires up to `FIRE_AHEAD_MS` ahead and creates their runs to
//! start at the fire time: a run created ahead is due exactly on time) —, how far ahead it was
//! committed, and `created_at` − nominal; per round:
//! first-to-last run created, nominal-to-last commit, the store calls and their times
//! (`due_schedules`, `save_schedules`: through a timing wrapper of the store), the time
//! between them (planning; announcing the fired runs) and when every run had completed;
//! and the idle tick: the scheduler's reads with nothing due, timed on the store directly
//! with no schedule stored and with the N stored, and as the scheduler made them between
//! rounds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use durable::store::{
    Capabilities, Claim, ClaimOutcome, Commit, CommitOutcome, CreateRun, Delivery, DueQuery, NewRun, Publish,
    Published, RunCount, RunPatch, RunQuery, SaveOutcome, SaveSchedule, Store, StoreResult, TriggerBuffer, Waiter,
};
use durable::{
    BoxFuture, Checkpoint, Clock, Engine, Millis, Payload, Run, RunFilter, RunId, RunPage, RunStatus, Schedule,
    ScheduleRecord, WorkflowCtx, WorkflowError,
};
use serde_json::json;
use tokio::sync::Notify;

use crate::{Args, Measured, percentile};

/// The cadence of every schedule.
const PERIOD_MS: Millis = 60_000;
/// Durable time is moved to this long before each round's fire time; the scheduler then
/// sleeps through it for real (longer than `FIRE_AHEAD_MS`, so it decides the fires ahead as
/// it would in a deployment).
const LEAD_MS: Millis = 8_000;
/// Schedules declared at once.
const CREATE_IN_FLIGHT: usize = 256;
/// Timed repetitions of an idle tick.
const IDLE_SAMPLES: usize = 500;
/// `--defer-runs`: the jitter that puts every fired run's start after the measurement.
const DEFER: Duration = Duration::from_secs(365 * 24 * 3600);
/// Runs read per store call when the workload checks them.
const READ_PAGE: usize = 500;

/// Real time plus an offset that only grows: [`SkipClock::skip_to`] moves durable time ahead
/// at once (waking the sleeps it makes due), otherwise it runs at the speed of real time and
/// sleeps are tokio sleeps. Clones share the offset.
#[derive(Debug, Clone)]
pub(crate) struct SkipClock {
    inner: Arc<SkipInner>,
}

#[derive(Debug)]
struct SkipInner {
    /// Epoch microseconds at `start`.
    epoch_us: u64,
    start: Instant,
    offset_us: AtomicU64,
    skipped: Notify,
}

impl SkipClock {
    fn new() -> Self {
        let epoch_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        SkipClock {
            inner: Arc::new(SkipInner {
                epoch_us,
                start: Instant::now(),
                offset_us: AtomicU64::new(0),
                skipped: Notify::new(),
            }),
        }
    }

    /// Durable time in epoch microseconds.
    fn now_us(&self) -> u64 {
        let i = &self.inner;
        i.epoch_us + i.start.elapsed().as_micros() as u64 + i.offset_us.load(Ordering::Acquire)
    }

    /// Durable time in epoch milliseconds, with the microseconds.
    fn now_ms_f64(&self) -> f64 {
        self.now_us() as f64 / 1e3
    }

    /// Moves durable time to `at` (never backwards).
    fn skip_to(&self, at: Millis) {
        let target = at.saturating_mul(1_000);
        let now = self.now_us();
        if target > now {
            self.inner.offset_us.fetch_add(target - now, Ordering::AcqRel);
        }
        self.inner.skipped.notify_waiters();
    }
}

impl Clock for SkipClock {
    fn now(&self) -> Millis {
        self.now_us() / 1_000
    }

    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()> {
        let clock = self.clone();
        Box::pin(async move {
            let target = at.saturating_mul(1_000);
            loop {
                // Made before the check: a skip between the check and the wait still wakes it.
                let skipped = clock.inner.skipped.notified();
                let now = clock.now_us();
                if now >= target {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_micros(target - now)) => {}
                    () = skipped => {}
                }
            }
        })
    }
}

/// One scheduler store call, as the timing wrapper saw it.
#[derive(Debug, Clone)]
struct Call {
    method: &'static str,
    /// Durable time, epoch ms with µs.
    start: f64,
    end: f64,
    /// Records or saves in the call.
    items: usize,
    /// Runs a `save_schedules` call created (saved decisions only).
    fires: usize,
    /// The query's `now` (`due_*`).
    now: Millis,
}

/// The store, with the scheduler's calls timed (`due_schedules`, `save_schedules`,
/// `due_buffers`, `get_runs`) and everything else passed through.
#[derive(Debug)]
struct Timed {
    inner: Arc<dyn Store>,
    clock: SkipClock,
    calls: Mutex<Vec<Call>>,
    /// Runs created by saved scheduler decisions.
    fired: AtomicU64,
}

impl Timed {
    fn record(&self, method: &'static str, start: f64, items: usize, fires: usize, now: Millis) {
        let end = self.clock.now_ms_f64();
        self.calls.lock().expect("not poisoned").push(Call { method, start, end, items, fires, now });
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("not poisoned").clone()
    }
}

#[async_trait]
impl Store for Timed {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
        self.inner.create_run(run).await
    }
    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        self.inner.create_runs(runs).await
    }
    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        self.inner.get_run(id).await
    }
    async fn get_runs(&self, ids: &[RunId]) -> StoreResult<Vec<Run>> {
        let start = self.clock.now_ms_f64();
        let out = self.inner.get_runs(ids).await;
        self.record("get_runs", start, ids.len(), 0, 0);
        out
    }
    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
        self.inner.list_runs(filter).await
    }
    async fn run_counts(&self) -> StoreResult<Vec<RunCount>> {
        self.inner.run_counts().await
    }
    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
        self.inner.history(id).await
    }
    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
        self.inner.claim_run(claim).await
    }
    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
        self.inner.renew_lease(id, owner, lease_until).await
    }
    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
        self.inner.release_lease(id, owner).await
    }
    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        self.inner.commit(commit).await
    }
    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
        self.inner.update_run_if(id, expected, patch).await
    }
    async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.inner.pending_runs(query).await
    }
    async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.inner.due_runs(query).await
    }
    async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
        self.inner.claim_due_runs(query, until).await
    }
    async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.inner.orphaned_runs(query).await
    }
    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
        self.inner.send_signal(token, payload, now).await
    }
    async fn publish_event(&self, name: &str, payload: Payload, now: Millis) -> StoreResult<Vec<Delivery>> {
        self.inner.publish_event(name, payload, now).await
    }
    async fn publish(&self, event: Publish) -> StoreResult<Published> {
        self.inner.publish(event).await
    }
    async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
        let start = self.clock.now_ms_f64();
        let out = self.inner.due_buffers(query).await;
        self.record("due_buffers", start, out.as_ref().map_or(0, Vec::len), 0, query.now);
        out
    }
    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<durable::admission::SlotRequest>,
    ) -> StoreResult<Option<CreateRun>> {
        self.inner.flush_buffer(workflow, key, batch_id, now, admission).await
    }
    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
        self.inner.get_schedule(key).await
    }
    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>> {
        self.inner.list_schedules(namespace, after, limit).await
    }
    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
        self.inner.save_schedule(save).await
    }
    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        let start = self.clock.now_ms_f64();
        let items = saves.len();
        let starts: Vec<usize> = saves.iter().map(|s| s.start.len()).collect();
        let out = self.inner.save_schedules(saves).await;
        let fires = out.as_ref().map_or(0, |outcomes| {
            outcomes.iter().zip(&starts).filter(|(o, _)| matches!(o, SaveOutcome::Saved(_))).map(|(_, n)| n).sum()
        });
        self.fired.fetch_add(fires as u64, Ordering::AcqRel);
        self.record("save_schedules", start, items, fires, 0);
        out
    }
    async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
        self.inner.delete_schedule(key).await
    }
    async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
        let start = self.clock.now_ms_f64();
        let out = self.inner.due_schedules(query).await;
        self.record("due_schedules", start, out.as_ref().map_or(0, Vec::len), 0, query.now);
        out
    }
    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
        self.inner.waiters(id).await
    }
    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
        self.inner.get_state(id, key).await
    }
    async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
        self.inner.delete_run(id).await
    }
}

/// Summary of a sample: min, p50, p99, max (and the count).
fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({
        "n": v.len(),
        "min": r(v.first().copied().unwrap_or(f64::NAN)),
        "p50": r(percentile(&v, 0.50)),
        "p99": r(percentile(&v, 0.99)),
        "max": r(v.last().copied().unwrap_or(f64::NAN)),
    })
}

/// What the scheduler reads on a tick with nothing due (its due reads, then its look for
/// the next due time), timed on the store directly, `IDLE_SAMPLES` times: microseconds of
/// the `due_schedules` read alone, and of the whole tick's reads.
async fn idle_tick(store: &dyn Store, clock: &SkipClock, workflows: &[String]) -> Result<serde_json::Value, String> {
    let query = DueQuery { namespace: None, workflows: Some(workflows.to_vec()), now: 0, limit: 500 };
    let (mut due, mut tick) = (Vec::with_capacity(IDLE_SAMPLES), Vec::with_capacity(IDLE_SAMPLES));
    for _ in 0..IDLE_SAMPLES {
        let now = DueQuery { now: clock.now(), ..query.clone() };
        let t0 = Instant::now();
        let found = store.due_schedules(&now).await.map_err(|e| e.to_string())?;
        let t1 = Instant::now();
        store.due_buffers(&now).await.map_err(|e| e.to_string())?;
        let next = DueQuery { now: Millis::MAX, limit: 1, ..query.clone() };
        store.due_schedules(&next).await.map_err(|e| e.to_string())?;
        store.due_buffers(&next).await.map_err(|e| e.to_string())?;
        if !found.is_empty() {
            return Err(format!("idle tick: {} schedules due", found.len()));
        }
        due.push((t1 - t0).as_secs_f64() * 1e6);
        tick.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(json!({ "due_schedules_us": summary(due), "tick_reads_us": summary(tick) }))
}

/// The runs of one round (one per schedule), read from the store in pages.
async fn round_runs(store: &dyn Store, keys: &[String], nominal: Millis) -> Result<Vec<Run>, String> {
    let ids: Vec<RunId> = keys.iter().map(|k| RunId::new(format!("sched:{k}:{nominal}"))).collect();
    let mut runs = Vec::with_capacity(ids.len());
    for page in ids.chunks(READ_PAGE) {
        runs.extend(store.get_runs(page).await.map_err(|e| e.to_string())?);
    }
    Ok(runs)
}

/// Polls `done` every `every` until it holds, or fails after `limit`.
async fn until<F, Fut>(what: &str, every: Duration, limit: Duration, mut done: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, String>>,
{
    let began = Instant::now();
    while !done().await? {
        if began.elapsed() > limit {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

pub(crate) async fn schedules(args: &Args) -> Result<Measured, String> {
    let n = if args.quick { 1_000 } else { 10_000 };
    let execute = !args.defer_runs;
    let schedule = Schedule::every(Duration::from_millis(PERIOD_MS));
    let schedule = if execute { schedule } else { schedule.jitter(DEFER) };
    let rounds: u64 = if args.quick { 2 } else { 3 };
    let clock = SkipClock::new();
    // The first fire: at least 10 s of durable time to declare every schedule before it.
    let first = (clock.now() / PERIOD_MS + 2) * PERIOD_MS;
    clock.skip_to(first - 50_000);

    let (inner, db): (Arc<dyn Store>, _) = match args.store.as_str() {
        "memory" => (Arc::new(durable::MemoryStore::new()), None),
        "sqlite" => {
            let path = crate::fresh_db(args)?;
            (Arc::new(durable::SqliteStore::open(&path).map_err(|e| e.to_string())?), Some(path))
        }
        "postgres" => (Arc::new(crate::postgres_store(args)?), None),
        other => return Err(format!("unknown store {other:?}")),
    };
    let timed =
        Arc::new(Timed { inner: inner.clone(), clock: clock.clone(), calls: Mutex::default(), fired: 0.into() });
    let engine =
        Engine::builder().shared_store(timed.clone()).clock(clock.clone()).build().map_err(|e| e.to_string())?;
    engine.register("noop", 1, |_ctx: WorkflowCtx, _i: u64| async move { Ok::<_, WorkflowError>(()) });
    let workflows = vec!["noop".to_string()];

    let idle_empty = idle_tick(&*inner, &clock, &workflows).await?;

    // Declare the schedules, CREATE_IN_FLIGHT at a time.
    let keys: Vec<String> = (0..n).map(|i| format!("s{i:05}")).collect();
    let created = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(CREATE_IN_FLIGHT));
    let mut tasks = Vec::with_capacity(n);
    for (i, key) in keys.iter().enumerate() {
        let permit = slots.clone().acquire_owned().await.map_err(|e| e.to_string())?;
        let (engine, key, schedule) = (engine.clone(), key.clone(), schedule.clone());
        tasks.push(tokio::spawn(async move {
            let r = engine.schedule(&key, schedule, "noop", &(i as u64)).await;
            drop(permit);
            r
        }));
    }
    for t in tasks {
        let record = t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        if record.state.next_fire_at != Some(first) {
            return Err(format!("schedule {} first fires at {:?}, not {first}", record.key, record.state.next_fire_at));
        }
    }
    let create_s = created.elapsed().as_secs_f64();
    let idle_stored = idle_tick(&*inner, &clock, &workflows).await?;

    let mut latencies = Vec::with_capacity(n * rounds as usize);
    let mut created_late = Vec::with_capacity(n * rounds as usize);
    let mut ahead = Vec::with_capacity(n * rounds as usize);
    let mut round_reports = Vec::new();
    let mut wall = Duration::ZERO;
    for r in 0..rounds {
        let nominal = first + r * PERIOD_MS;
        clock.skip_to(nominal - LEAD_MS);
        let target = n as u64 * (r + 1);
        until("the round's fires", Duration::from_millis(5), Duration::from_secs(120), || async {
            Ok(timed.fired.load(Ordering::Acquire) >= target)
        })
        .await?;
        until("the round's runs to complete", Duration::from_millis(50), Duration::from_secs(300), || async {
            let runs = round_runs(&*inner, &keys, nominal).await?;
            let settled = if execute { RunStatus::Completed } else { RunStatus::Pending };
            Ok(runs.len() == n && runs.iter().all(|run| run.status == settled))
        })
        .await?;
        let done_ms = clock.now_ms_f64() - nominal as f64;

        // Fire lateness from the stored runs: created_at − nominal.
        let runs = round_runs(&*inner, &keys, nominal).await?;
        if runs.len() != n {
            return Err(format!("round {r}: {} runs, not {n}", runs.len()));
        }
        let created: Vec<Millis> = runs.iter().map(|run| run.created_at).collect();
        let (first_created, last_created) =
            (created.iter().min().copied().unwrap_or(0), created.iter().max().copied().unwrap_or(0));
        created_late.extend(created.iter().map(|c| *c as f64 - nominal as f64));

        // The scheduler's calls of the round: its tick, from the first due read that found
        // schedules to its look for the next due buffer, which ends a tick.
        let mut calls: Vec<Call> =
            timed.calls().into_iter().filter(|c| c.start >= (nominal - LEAD_MS) as f64).collect();
        calls.sort_by(|a, b| a.start.total_cmp(&b.start));
        let begin = calls.iter().position(|c| c.method == "due_schedules" && c.items > 0 && c.now != Millis::MAX);
        calls.drain(..begin.unwrap_or(0));
        if let Some(end) = calls.iter().position(|c| c.method == "due_buffers" && c.now == Millis::MAX) {
            calls.truncate(end + 1);
        }
        let saves: Vec<&Call> = calls.iter().filter(|c| c.method == "save_schedules").collect();
        for s in &saves {
            latencies.extend(std::iter::repeat_n((s.end - nominal as f64).max(0.0), s.fires));
            ahead.extend(std::iter::repeat_n(nominal as f64 - s.end, s.fires));
        }
        let due_reads: Vec<&Call> =
            calls.iter().filter(|c| c.method == "due_schedules" && c.items > 0 && c.now != Millis::MAX).collect();
        let last_commit = saves.iter().map(|s| s.end).fold(f64::NAN, f64::max);
        let first_read = due_reads.iter().map(|c| c.start).fold(f64::NAN, f64::min);
        let mut per_method = BTreeMap::new();
        for c in &calls {
            *per_method.entry(c.method).or_insert(0usize) += 1;
        }
        // Between a due read and the save of its decisions: the planning (CPU). Between a
        // save and the next read: announcing the fired runs (queueing them, events).
        let (mut plan_ms, mut announce_ms) = (Vec::new(), Vec::new());
        for s in &saves {
            if let Some(read) = due_reads.iter().rfind(|d| d.end <= s.start) {
                plan_ms.push(s.start - read.end);
            }
            let next = calls.iter().find(|c| c.method == "due_schedules" && c.start >= s.end);
            if let Some(next) = next {
                announce_ms.push(next.start - s.end);
            }
        }
        // Throughput: the round's runs over the time from the fire to the last one completed.
        wall += Duration::from_secs_f64(done_ms.max(0.0) / 1e3);
        round_reports.push(json!({
            "round": r,
            "first_fire_late_ms": first_created.saturating_sub(nominal),
            "created_span_ms": last_created - first_created,
            "first_read_to_last_commit_ms": ((last_commit - first_read) * 1e3).round() / 1e3,
            "nominal_to_last_commit_ms": ((last_commit - nominal as f64) * 1e3).round() / 1e3,
            "runs_completed_ms": done_ms.round(),
            "calls": per_method,
            "due_read_ms": summary(due_reads.iter().map(|c| c.end - c.start).collect()),
            "save_ms": summary(saves.iter().map(|c| c.end - c.start).collect()),
            "plan_ms": summary(plan_ms),
            "announce_ms": summary(announce_ms),
        }));
    }
    // The scheduler's own idle ticks, between and before the rounds: due reads that found
    // nothing at a `now` before the next fire.
    let observed_idle: Vec<f64> = timed
        .calls()
        .iter()
        .filter(|c| c.method == "due_schedules" && c.items == 0 && c.now != Millis::MAX)
        .map(|c| (c.end - c.start) * 1e3)
        .collect();
    engine.shutdown().await;
    drop(engine);
    drop(timed);
    drop(inner);
    if let Some(db) = db {
        crate::remove_db(&db);
    }
    crate::cleanup().await;
    let extra = json!({
        "schedules": n,
        "rounds": rounds,
        "runs_execute": execute,
        "create_s": (create_s * 1e3).round() / 1e3,
        "lateness_ms": summary(latencies.clone()),
        "committed_ahead_ms": summary(ahead),
        "created_minus_fire_ms": summary(created_late),
        "round": round_reports,
        "idle_tick": {
            "no_schedules": idle_empty,
            "schedules_stored": idle_stored,
            "scheduler_due_schedules_us": summary(observed_idle),
        },
    });
    Ok(Measured { runs: n * rounds as usize, steps_per_run: 0, wall, latencies, turns: None, extra: Some(extra) })
}
