//! The engine's side of remote steps, apart from the turn: attempts past their deadline are
//! expired (recorded as failed with `remote_timeout`, so the step's policy decides what
//! follows), and runs whose step no live worker can take are marked `blocked` — and
//! unblocked when such a worker appears. Runs on every executing engine, every
//! `blocked_poll`; engines sharing a store race harmlessly (each result is recorded once per
//! attempt, each status change is a compare-and-set).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use durable_core::task::{Task, TaskCompletion, TaskDone, WorkerInfo};
use durable_core::{
    Millis, RunFilter, RunId, RunPatch, RunStatus, StepError, StoreResult, TaskFilter, codes, millis_after,
    millis_before,
};

use super::Shared;
use crate::events::EngineEvent;

/// Tasks looked at per pass.
const BATCH: usize = 500;

impl Shared {
    pub(super) async fn remote_loop(self: Arc<Self>) {
        loop {
            // The next pass is due a poll after this one began: time that moved during the
            // pass (a slow store, a virtual clock) is not slept through again.
            let began = self.clock.now();
            // A store without a task queue answers `Unavailable`, not retryable: nothing to do.
            if let Err(e) = self.remote_tick(began).await
                && (e.kind() != durable_core::StoreErrorKind::Unavailable || e.is_retryable())
            {
                tracing::warn!(error = %e, "could not look after remote steps; trying again next interval");
            }
            self.clock.sleep_until(millis_after(began, self.config.blocked_poll)).await;
        }
    }

    /// One pass: expire, then block and unblock.
    async fn remote_tick(&self, now: Millis) -> StoreResult<()> {
        self.expire_tasks(now).await?;
        self.route_blocked(now).await
    }

    async fn expire_tasks(&self, now: Millis) -> StoreResult<()> {
        let filter = TaskFilter { expired_at: Some(now), limit: BATCH, ..TaskFilter::default() };
        for task in self.store.list_tasks(&filter).await? {
            let t = &task.task;
            let message = match task.claimed_at {
                None => format!(
                    "remote step {:?} (attempt {}) was not picked up by any worker within its pickup timeout of {}",
                    t.name,
                    t.attempt,
                    secs(t.pickup_timeout_ms)
                ),
                Some(_) => format!(
                    "remote step {:?} (attempt {}) ran past its timeout of {} on worker {}",
                    t.name,
                    t.attempt,
                    secs(t.timeout_ms),
                    task.worker.as_deref().unwrap_or("?")
                ),
            };
            let done = TaskDone {
                run_id: t.run_id.clone(),
                seq: t.seq,
                attempt: t.attempt,
                worker: None,
                result: Err(StepError::retryable(message).with_code(codes::REMOTE_TIMEOUT)),
                logs: Vec::new(),
                now,
            };
            let mark = self.mark();
            if self.store.complete_task(done).await? == TaskCompletion::Accepted {
                crate::metrics::task_recorded(&t.queue, "timed_out");
                self.emit(EngineEvent::RemoteStepTimedOut { run_id: t.run_id.clone(), seq: t.seq, attempt: t.attempt });
                self.wake_in(t.run_id.clone(), &t.namespace, mark);
            }
        }
        Ok(())
    }

    async fn route_blocked(&self, now: Millis) -> StoreResult<()> {
        let workers = self.live_workers(now).await?;
        let queued = self.store.list_tasks(&TaskFilter { queued: true, limit: BATCH, ..TaskFilter::default() }).await?;
        // Runs with a waiting task no live worker can take, with the first such task's reason.
        let mut stuck: BTreeMap<RunId, String> = BTreeMap::new();
        for task in &queued {
            if !workers.iter().any(|w| w.serves(&task.task.queue, &task.task.requires)) {
                stuck.entry(task.task.run_id.clone()).or_insert_with(|| blocked_message(task));
            }
        }
        let blocked = self
            .store
            .list_runs(&RunFilter { statuses: vec![RunStatus::Blocked], limit: BATCH, ..RunFilter::default() })
            .await?;
        let already: HashSet<RunId> = blocked.runs.iter().map(|r| r.id.clone()).collect();
        for run in &blocked.runs {
            if !stuck.contains_key(&run.id) {
                let patch =
                    RunPatch { status: Some(RunStatus::Suspended), error: Some(None), now, ..RunPatch::default() };
                if self.store.update_run_if(&run.id, &[RunStatus::Blocked], patch).await? {
                    self.emit(EngineEvent::RunUnblocked { run_id: run.id.clone() });
                }
            }
        }
        stuck.retain(|id, _| !already.contains(id));
        let ids: Vec<RunId> = stuck.keys().cloned().collect();
        for run in self.store.get_runs(&ids).await? {
            // Only a plain suspended run: its error field may carry a cancel request.
            if run.status != RunStatus::Suspended || run.error.is_some() {
                continue;
            }
            let Some(message) = stuck.remove(&run.id) else { continue };
            let error = StepError::fatal(message.clone()).with_code(codes::BLOCKED);
            let patch =
                RunPatch { status: Some(RunStatus::Blocked), error: Some(Some(error)), now, ..RunPatch::default() };
            if self.store.update_run_if(&run.id, &[RunStatus::Suspended], patch).await? {
                self.emit(EngineEvent::RunBlocked { run_id: run.id, message });
            }
        }
        Ok(())
    }

    /// Workers that heartbeated within `worker_ttl`. The store forgets only descriptors past
    /// [`FORGET_WORKERS_AFTER`] (or the ttl, if longer): deleting all those past this engine's
    /// ttl hid live workers from engines and operators that count a longer one.
    pub(crate) async fn live_workers(&self, now: Millis) -> StoreResult<Vec<WorkerInfo>> {
        let ttl = self.config.worker_ttl;
        let known = self.store.workers(millis_before(now, ttl.max(FORGET_WORKERS_AFTER))).await?;
        let live_since = millis_before(now, ttl);
        Ok(known.into_iter().filter(|w| w.heartbeat_at >= live_since).collect())
    }
}

/// How long a worker's descriptor is kept after its last refresh, whatever an engine's
/// `worker_ttl` (which decides only whom that engine counts live).
const FORGET_WORKERS_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// `blocked: no compatible worker (requires a, b)`, or for a step without requirements,
/// `blocked: no worker serves queue "q"`.
fn blocked_message(task: &Task) -> String {
    if task.task.requires.is_empty() {
        format!("blocked: no worker serves queue {:?}", task.task.queue)
    } else {
        format!("blocked: no compatible worker (requires {})", task.task.requires.join(", "))
    }
}

fn secs(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".into(), |ms| format!("{:?}", Duration::from_millis(ms)))
}
