//! The scheduler: fires due schedules and starts the runs of due trigger buffers.
//!
//! It runs on every executing engine, on the engine's clock: it sleeps until the next
//! schedule or buffer comes due (or another engine may have changed one: at most
//! `schedule_poll_interval`), asks the store for what is due, decides each schedule's fires
//! with the pure [`ScheduleRecord::plan`], and writes every decision back with a
//! compare-and-set on the record's revision together with the fired runs
//! ([`Store::save_schedules`](durable_core::Store::save_schedules)). Engines sharing a store
//! race harmlessly: a fire's run id is `sched:<key>:<fire-ms>` and one save per revision wins.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use durable_core::admission::SlotRequest;
use durable_core::{
    DueQuery, Millis, NewRun, Overlap, RunId, SaveOutcome, SaveSchedule, ScheduleRecord, StoreResult, TriggerBuffer,
};
use tokio::sync::Notify;

use super::Shared;
use crate::events::EngineEvent;

/// The scheduler's wake-up call.
pub(super) struct Starter {
    /// Look at the store now (a schedule was saved or triggered here, a trigger registered).
    poke: Notify,
    /// When the scheduler means to look next (`Millis::MAX`: not before its poll interval).
    next: AtomicU64,
}

impl Default for Starter {
    fn default() -> Self {
        Starter { poke: Notify::new(), next: AtomicU64::new(0) }
    }
}

impl Shared {
    /// The concurrency key of a run the scheduler starts, if its workflow has one. The input
    /// and its key were checked when the schedule was saved or the event published, so only a
    /// key function (or a namespace) changed since can fail: that is logged, and the run
    /// starts without its key rather than not at all.
    fn started_key(&self, run: &NewRun) -> Option<SlotRequest> {
        self.flow.start_request(&run.workflow, &run.namespace, &run.id, &run.input, run.priority, run.created_at).unwrap_or_else(
            |reason| {
                tracing::error!(run = %run.id, workflow = %run.workflow, %reason, "the run starts without its concurrency key: the key could not be computed from its input");
                None
            },
        )
    }

    /// [`Shared::started_key`] of the run a due buffer starts at `now`.
    fn buffer_key(&self, buffer: &TriggerBuffer, now: Millis) -> Option<SlotRequest> {
        if !self.flow.keyed(&buffer.workflow) {
            return None;
        }
        self.started_key(&buffer.clone().into_run(now))
    }

    /// Has the scheduler look at the store now.
    pub(crate) fn poke_scheduler(&self) {
        self.starter.poke.notify_one();
    }

    /// Something stored here comes due at `at`: the scheduler looks then if it meant to
    /// look later.
    pub(crate) fn note_due(&self, at: Millis) {
        if at < self.starter.next.load(Ordering::Acquire) {
            self.poke_scheduler();
        }
    }

    pub(super) async fn scheduler_loop(self: Arc<Self>) {
        loop {
            let next = match self.scheduler_tick().await {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(error = %e, "scheduler could not read or write the store; trying again next interval");
                    None
                }
            };
            self.starter.next.store(next.unwrap_or(Millis::MAX), Ordering::Release);
            let sleep = async {
                match next {
                    Some(at) => self.clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = self.starter.poke.notified() => {}
                () = sleep => {}
                () = tokio::time::sleep(self.config.schedule_poll_interval) => {}
            }
        }
    }

    /// Fires what is due now; returns when the next schedule or buffer comes due.
    async fn scheduler_tick(&self) -> StoreResult<Option<Millis>> {
        let workflows = self.registry.names();
        if workflows.is_empty() {
            return Ok(None);
        }
        let limit = self.config.schedule_batch.max(1);
        let query = DueQuery { namespace: self.config.namespace.clone(), workflows: Some(workflows), now: 0, limit };
        loop {
            let now = self.clock.now();
            let due = self.store.due_schedules(&DueQuery { now, ..query.clone() }).await?;
            let full = due.len() == limit;
            let stale = self.fire(due, now).await?;
            // A full batch may hide more; one that lost every race (another engine fired
            // them) is left to the next tick rather than read again at once.
            if !full || stale == limit {
                break;
            }
        }
        loop {
            let now = self.clock.now();
            let due = self.store.due_buffers(&DueQuery { now, ..query.clone() }).await?;
            let full = due.len() == limit;
            let mark = self.mark();
            let mut flushed = 0;
            for buffer in due {
                let admission = self.buffer_key(&buffer, now);
                if let Some(created) =
                    self.store.flush_buffer(&buffer.workflow, &buffer.key, &buffer.batch_id, now, admission).await?
                {
                    flushed += 1;
                    if created.created() {
                        self.announce_created(created.run(), mark);
                    }
                }
            }
            if !full || flushed == 0 {
                break;
            }
        }
        let next = DueQuery { now: Millis::MAX, limit: 1, ..query };
        let schedule = self.store.due_schedules(&next).await?.first().and_then(|r| r.due_at);
        let buffer = self.store.due_buffers(&next).await?.first().map(|b| b.due_at);
        Ok(schedule.into_iter().chain(buffer).min())
    }

    /// Fires the due schedules; returns how many lost their compare-and-set.
    async fn fire(&self, due: Vec<ScheduleRecord>, now: Millis) -> StoreResult<usize> {
        if due.is_empty() {
            return Ok(0);
        }
        // Whether each schedule's latest run is still active, where the overlap policy asks.
        let watched: Vec<RunId> = due
            .iter()
            .filter(|r| r.schedule.overlap != Overlap::Allow)
            .filter_map(|r| r.state.last_run_id.clone())
            .collect();
        let active: HashSet<RunId> = if watched.is_empty() {
            HashSet::new()
        } else {
            self.store.get_runs(&watched).await?.into_iter().filter(|r| !r.status.is_terminal()).map(|r| r.id).collect()
        };
        let mut saves = Vec::with_capacity(due.len());
        for record in due {
            let last_active = record.state.last_run_id.as_ref().is_some_and(|id| active.contains(id));
            let Some((version, _)) = self.registry.latest(&record.workflow) else { continue };
            let (next, fires) = match record.plan(now, last_active) {
                Ok(plan) => (plan.record, plan.fires),
                Err(e) => {
                    // A definition this engine cannot read (written by another version?):
                    // stop it, so it is not read again on every tick, and say so.
                    tracing::error!(schedule = %record.key, error = %e, "schedule stopped: its definition is invalid; fix it with Engine::schedule");
                    let mut stopped = record.clone();
                    stopped.due_at = None;
                    (stopped, Vec::new())
                }
            };
            let start = fires
                .into_iter()
                .map(|fire| NewRun {
                    admission: None,
                    trace_context: Some(crate::trace::new_trace_context(Some(&fire.run_id), &record.workflow, version)),
                    id: fire.run_id,
                    workflow: record.workflow.clone(),
                    version,
                    namespace: record.namespace.clone(),
                    input: record.input.clone(),
                    tags: vec![format!("schedule:{}", record.key)],
                    priority: 0,
                    parent: None,
                    created_at: now,
                    start_at: fire.start_at,
                })
                .map(|run| NewRun { admission: self.started_key(&run), ..run })
                .collect();
            saves.push(SaveSchedule { record: next, expected: Some(record.revision), start });
        }
        let mark = self.mark();
        let decided: Vec<(ScheduleRecord, Vec<NewRun>)> =
            saves.iter().map(|s| (s.record.clone(), s.start.clone())).collect();
        let outcomes = self.store.save_schedules(saves).await?;
        let mut stale = 0;
        for ((record, runs), outcome) in decided.into_iter().zip(outcomes) {
            match outcome {
                SaveOutcome::Saved(_) => {
                    let fired = runs.iter().map(|r| r.id.clone()).collect();
                    for run in runs {
                        self.announce_created(&run.into_run(), mark);
                    }
                    self.emit(EngineEvent::ScheduleAdvanced {
                        key: record.key,
                        fired,
                        skipped: record.state.skipped,
                        missed: record.state.missed,
                        buffered: record.state.buffered_fire,
                    });
                }
                SaveOutcome::Stale(_) => stale += 1,
            }
        }
        Ok(stale)
    }
}
