//! Operating remote steps: the health of queues and workers, and re-dispatching a run's
//! pending steps.

use std::collections::HashSet;
use std::time::Duration;

use durable_core::task::{Task, TaskCompletion, TaskDone, WorkerInfo};
use durable_core::{RunId, StepError, TaskFilter, codes};

use super::Engine;
use crate::error::Result;

/// Unfinished tasks of a run read at once by [`Engine::redispatch_pending`].
const REDISPATCH_PAGE: usize = 100;

/// One queue's figures in [`Engine::worker_health`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueHealth {
    /// The namespace.
    pub namespace: String,
    /// The queue.
    pub queue: String,
    /// Tasks waiting for a worker.
    pub depth: u64,
    /// Tasks held by workers.
    pub claimed: u64,
    /// How long the oldest unfinished task has waited since its dispatch.
    pub oldest_age: Option<Duration>,
    /// Live workers serving the queue.
    pub workers: Vec<String>,
}

/// The answer of [`Engine::worker_health`].
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerHealth {
    /// Per queue with unfinished tasks, and per queue a live worker serves.
    pub queues: Vec<QueueHealth>,
    /// Live workers (heartbeated within `EngineConfig::worker_ttl`), with their capabilities
    /// and last heartbeat.
    pub workers: Vec<WorkerInfo>,
}

impl Engine {
    /// Per queue: depth, claimed tasks, the oldest task's age and the live workers serving
    /// it; and every live worker.
    pub async fn worker_health(&self) -> Result<WorkerHealth> {
        let shared = self.shared();
        let now = shared.clock.now();
        let workers = shared.live_workers(now).await?;
        let mut queues: Vec<QueueHealth> = shared
            .store
            .queue_stats()
            .await?
            .into_iter()
            .map(|s| QueueHealth {
                oldest_age: s.oldest_at.map(|at| Duration::from_millis(now.saturating_sub(at))),
                namespace: s.namespace,
                queue: s.queue,
                depth: s.queued,
                claimed: s.claimed,
                workers: Vec::new(),
            })
            .collect();
        for w in &workers {
            for q in &w.queues {
                if !queues.iter().any(|h| &h.queue == q) {
                    queues.push(QueueHealth {
                        namespace: "*".into(),
                        queue: q.clone(),
                        depth: 0,
                        claimed: 0,
                        oldest_age: None,
                        workers: Vec::new(),
                    });
                }
            }
        }
        for h in &mut queues {
            h.workers = workers.iter().filter(|w| w.queues.contains(&h.queue)).map(|w| w.id.clone()).collect();
        }
        queues.sort_by(|a, b| (&a.namespace, &a.queue).cmp(&(&b.namespace, &b.queue)));
        Ok(WorkerHealth { queues, workers })
    }

    /// Re-sends the run's pending remote steps: each unfinished attempt is ended (a result
    /// that still arrives for it is dropped) and the next attempt dispatched at once, with the
    /// same step id, outside the step's retry policy. For a worker that is known to be gone or
    /// stuck. Returns how many steps were re-sent: 0 for a run with none pending (a finished
    /// run too); [`Error::RunNotFound`](crate::Error::RunNotFound) for an unknown run.
    pub async fn redispatch_pending(&self, run_id: &RunId) -> Result<usize> {
        let shared = self.shared();
        let mut filter = TaskFilter {
            run_id: Some(run_id.clone()),
            unfinished: true,
            limit: REDISPATCH_PAGE,
            ..TaskFilter::default()
        };
        let mut sent = 0;
        // Steps re-sent: their next attempts, dispatched meanwhile, are not re-sent again.
        let mut seen: HashSet<u32> = HashSet::new();
        loop {
            let tasks = shared.store.list_tasks(&filter).await?;
            if seen.is_empty() && tasks.is_empty() && shared.store.get_run(run_id).await?.is_none() {
                return Err(crate::Error::RunNotFound(run_id.clone()));
            }
            // A page short of the limit holds every unfinished task of the run.
            let full = tasks.len() >= filter.limit;
            let mut fresh = false;
            for task in tasks {
                if seen.insert(task.task.seq) {
                    fresh = true;
                    sent += self.redispatch(run_id, task).await?;
                }
            }
            if !full {
                return Ok(sent);
            }
            // A full page of steps already re-sent (their next attempts may sort first): a
            // larger one. The run's unfinished tasks are at most one per step, so this ends.
            if !fresh {
                filter.limit = filter.limit.saturating_mul(2);
            }
        }
    }

    /// Ends `task`'s attempt as re-dispatched and wakes its run; 1 if the store took it.
    async fn redispatch(&self, run_id: &RunId, task: Task) -> Result<usize> {
        let shared = self.shared();
        let done = TaskDone {
            run_id: run_id.clone(),
            seq: task.task.seq,
            attempt: task.task.attempt,
            worker: None,
            result: Err(StepError::retryable(format!(
                "attempt {} of remote step {:?} was re-dispatched by an operator",
                task.task.attempt, task.task.name
            ))
            .with_code(codes::REDISPATCH)),
            logs: Vec::new(),
            now: shared.clock.now(),
        };
        let mark = shared.mark();
        if shared.store.complete_task(done).await? != TaskCompletion::Accepted {
            return Ok(0);
        }
        crate::metrics::task_recorded(&task.task.queue, "redispatched");
        shared.wake_in(run_id.clone(), &task.task.namespace, mark);
        Ok(1)
    }
}
