//! Eager dispatch: a remote step's attempt handed straight to a [`Worker`](crate::Worker)
//! running beside this engine ([`WorkerBuilder::engine`](crate::WorkerBuilder::engine)) that
//! serves its queue, has a free slot and no backlog in the store. The commit writes the task
//! already claimed by that worker ([`NewTask::claimed_by`], on a store that
//! [declares it](durable_core::Capabilities::claimed_dispatch)) and, once the store has it
//! and the dispatching turn has ended here, the engine hands it over in memory: no claim
//! statement, no wake-up of idle workers elsewhere, and the result comes back beside this
//! engine, which records it and claims the run in one store call.
//!
//! The slot is taken before the commit and travels with the task, so a worker never gets more
//! tasks than its concurrency. A commit that fails frees the slots it took and hands its tasks
//! back to the store in case it was applied after all. A task the store holds but that never
//! reaches the worker (this process stopped or died in between) is claimed with a lease like
//! any other: once the lease passes, another worker claims it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use durable_core::Millis;
use durable_core::task::{NewTask, Task, TaskClaim};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// A task handed to a worker beside the engine, with the worker slot it occupies.
pub(crate) struct Handed {
    pub(crate) task: Task,
    pub(crate) slot: OwnedSemaphorePermit,
}

/// What a worker beside the engine takes eagerly: its routing, its slots, and where to send
/// the tasks it gets.
pub(crate) struct LocalWorker {
    /// The worker's claim (its id, queues, namespace and capabilities): it takes a task this
    /// covers ([`TaskClaim::covers`]).
    pub(crate) route: TaskClaim,
    /// The worker's execution slots, shared with its own claims.
    pub(crate) slots: Arc<Semaphore>,
    /// Tasks may wait for the worker in the store (its last claim filled every slot it asked
    /// for, or it was told of tasks queued since): it takes none eagerly, so those are claimed
    /// first, in the store's order (priority, then age).
    pub(crate) backlog: Arc<AtomicBool>,
    pub(crate) tasks: mpsc::UnboundedSender<Handed>,
}

/// The workers beside this engine that take tasks eagerly.
#[derive(Default)]
pub(crate) struct Eager {
    workers: Mutex<Vec<LocalWorker>>,
}

/// Tasks of commits assigned to workers beside the engine, handed over once the store has
/// them ([`Assigned::hand`]); dropped unhanded, their slots are free again.
#[derive(Default)]
pub(crate) struct Assigned(Vec<(mpsc::UnboundedSender<Handed>, Handed)>);

impl Eager {
    /// From now on the worker takes tasks eagerly.
    pub(crate) fn register(&self, worker: LocalWorker) {
        self.workers.lock().push(worker);
    }

    /// From now on the worker `id` takes no more tasks eagerly (it drains or stops).
    pub(crate) fn unregister(&self, id: &str) {
        self.workers.lock().retain(|w| w.route.worker != id);
    }

    /// Marks each task that a worker beside the engine serves and has a free slot for (and no
    /// backlog) as claimed by it, taking the slot. Its `created_at` becomes `now` if that is
    /// later (the claim's lease and the attempt's timeout count from the commit, not from
    /// when the turn buffered the dispatch).
    pub(crate) fn assign(&self, tasks: &mut [NewTask], now: Millis) -> Assigned {
        let mut assigned = Assigned::default();
        if tasks.is_empty() {
            return assigned;
        }
        let mut workers = self.workers.lock();
        // A worker whose loop ended without unregistering (its future was dropped) takes none.
        workers.retain(|w| !w.tasks.is_closed());
        for task in tasks.iter_mut().filter(|t| t.claimed_by.is_none()) {
            let Some((worker, slot)) = workers
                .iter()
                .filter(|w| w.route.covers(task) && !w.backlog.load(Ordering::Acquire))
                .find_map(|w| w.slots.clone().try_acquire_owned().ok().map(|slot| (w, slot)))
            else {
                // Queued: the workers beside the engine that serve it have a backlog now.
                for w in workers.iter().filter(|w| w.route.covers(task)) {
                    w.backlog.store(true, Ordering::Release);
                }
                continue;
            };
            task.claimed_by = Some(worker.route.worker.clone());
            task.created_at = task.created_at.max(now);
            assigned.0.push((worker.tasks.clone(), Handed { task: Task::dispatched(task.clone()), slot }));
        }
        assigned
    }
}

impl Assigned {
    /// Whether no task was assigned.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds the tasks of another commit.
    pub(crate) fn extend(&mut self, other: Assigned) {
        self.0.extend(other.0);
    }

    /// The tasks, as the store holds them if their commit was applied.
    pub(crate) fn tasks(&self) -> Vec<Task> {
        self.0.iter().map(|(_, h)| h.task.clone()).collect()
    }

    /// Hands the tasks to their workers (the store holds them now). Returns the tasks whose
    /// worker stopped taking them: the caller hands them back to the store.
    pub(crate) fn hand(self) -> Vec<Task> {
        let mut orphans = Vec::new();
        for (worker, handed) in self.0 {
            if let Err(mpsc::error::SendError(handed)) = worker.send(handed) {
                orphans.push(handed.task);
            }
        }
        orphans
    }
}
