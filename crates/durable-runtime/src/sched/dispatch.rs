//! Execution slots on this engine: the ready queue the dispatcher loop serves, which runs
//! execute here, and the task that runs one until it is quiet (also for runs the transport's
//! consumer hands over).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable_core::{RunId, RunStatus};
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::Shared;

/// Who executes what on this engine.
pub(super) struct Dispatch {
    /// Run ids waiting for an execution slot on this engine: wakes are served before starts,
    /// so runs already in progress finish before new ones begin.
    ready: Mutex<Ready>,
    ready_changed: Notify,
    /// Runs known to the dispatcher: queued for a slot or executing here.
    active: Mutex<HashMap<RunId, Active>>,
    /// Execution slots shared by the dispatcher and the transport's consumer.
    slots: Arc<Semaphore>,
    /// Run tasks in flight (counted from the moment a slot is taken), and the most ever.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Runs whose turn a `shutdown` dropped: their leases are released once all turns ended.
    interrupted: Mutex<Option<Vec<RunId>>>,
    /// Notified each time a run task ends.
    idle: Notify,
}

impl Dispatch {
    pub(super) fn new(slots: usize) -> Self {
        Dispatch {
            ready: Mutex::new(Ready::default()),
            ready_changed: Notify::new(),
            active: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(slots)),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            interrupted: Mutex::new(None),
            idle: Notify::new(),
        }
    }

    /// Puts a run on the ready queue (wakes are served before starts).
    pub(super) fn push(&self, id: RunId, wake: bool) {
        let mut ready = self.ready.lock();
        if wake {
            ready.wakes.push_back(id)
        } else {
            ready.others.push_back(id)
        }
        drop(ready);
        self.ready_changed.notify_one();
    }
}

/// Run ids waiting for a slot, by kind.
#[derive(Default)]
struct Ready {
    wakes: VecDeque<RunId>,
    others: VecDeque<RunId>,
}

/// A run known to the dispatcher: queued (waiting for a slot) or executing.
#[derive(Default)]
struct Active {
    started: bool,
    /// A wake arrived while the run executed: run it again.
    rerun: bool,
    /// A start arrived while the run executed: run it again only if it is `pending` again
    /// (a retry), not if a poller found it pending before this engine claimed it.
    rerun_if_pending: bool,
}

impl Active {
    /// Records a dispatch that found the run executing here.
    fn again(&mut self, wake: bool) {
        if wake {
            self.rerun = true;
        } else {
            self.rerun_if_pending = true;
        }
    }
}

impl Shared {
    /// Run tasks executing turns right now.
    pub(crate) fn in_flight(&self) -> usize {
        self.dispatch.in_flight.load(Ordering::Acquire)
    }

    /// The most run tasks ever in flight at once.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.dispatch.max_in_flight.load(Ordering::Acquire)
    }

    /// Runs known to the dispatcher: queued for a slot or executing.
    pub(crate) fn dispatched(&self) -> usize {
        self.dispatch.active.lock().len()
    }

    /// Waits for an execution slot (`None`: the semaphore is closed).
    pub(super) async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.dispatch.slots.clone().acquire_owned().await.ok()
    }

    /// From now on, a run task cut off by the shutdown records its run for
    /// [`Shared::release_interrupted`].
    pub(crate) fn record_interrupted(&self) {
        self.dispatch.interrupted.lock().get_or_insert_with(Vec::new);
    }

    /// Releases the leases of the runs whose turns the shutdown dropped.
    pub(crate) async fn release_interrupted(&self) {
        let interrupted = self.dispatch.interrupted.lock().take().unwrap_or_default();
        for id in interrupted {
            let _ = self.store.release_lease(&id, &self.owner).await;
        }
    }

    /// Resolves once no run task is in flight.
    pub(crate) async fn until_idle(&self) {
        loop {
            let idle = self.dispatch.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The next run to execute, and whether it was woken (rather than started).
    async fn next_ready(&self) -> (RunId, bool) {
        loop {
            let changed = self.dispatch.ready_changed.notified();
            {
                let mut ready = self.dispatch.ready.lock();
                if let Some(id) = ready.wakes.pop_front() {
                    return (id, true);
                }
                if let Some(id) = ready.others.pop_front() {
                    return (id, false);
                }
            }
            changed.await;
        }
    }

    pub(super) async fn dispatch_loop(self: Arc<Self>) {
        loop {
            let (id, wake) = self.next_ready().await;
            if self.is_draining() {
                continue;
            }
            match self.dispatch.active.lock().entry(id.clone()) {
                Entry::Occupied(mut e) => {
                    // Queued runs will see the latest state anyway; executing ones may run again.
                    if e.get().started {
                        e.get_mut().again(wake);
                    }
                    continue;
                }
                Entry::Vacant(e) => {
                    e.insert(Active::default());
                }
            }
            let Some(slot) = self.slot().await else { return };
            if self.is_draining() {
                self.dispatch.active.lock().remove(&id);
                continue;
            }
            if let Some(a) = self.dispatch.active.lock().get_mut(&id) {
                a.started = true;
            }
            // Counted as in flight from here, so a shutdown waits for it even if it has not
            // been polled yet.
            let guard = TaskGuard::new(&self, id.clone());
            let shared = self.clone();
            tokio::spawn(async move {
                shared.run_in_slot(guard).await;
                drop(slot);
            });
        }
    }

    /// Marks a run as executing here; false (and a re-run request) if it already is.
    pub(super) fn begin_local(&self, id: &RunId, wake: bool) -> bool {
        match self.dispatch.active.lock().entry(id.clone()) {
            Entry::Occupied(mut e) => {
                e.get_mut().again(wake);
                false
            }
            Entry::Vacant(e) => {
                e.insert(Active { started: true, ..Active::default() });
                true
            }
        }
    }

    /// Executes a run marked as executing here, until it is quiet or the engine shuts down
    /// (a shutdown drops the turn wherever it is; the store keeps what was committed, and
    /// `shutdown` releases the lease).
    pub(super) async fn run_in_slot(self: &Arc<Self>, mut guard: TaskGuard) {
        let id = guard.id.clone();
        guard.quiet = tokio::select! {
            biased;
            () = self.shutdown_signal() => false,
            () = self.run_until_quiet(&id) => true,
        };
        drop(guard);
    }

    /// Drives the run, again as long as wakes arrived while it executed. Removes the run's
    /// dispatcher entry when it returns: from then on, a new wake starts a new task.
    async fn run_until_quiet(self: &Arc<Self>, id: &RunId) {
        let mut drive = true;
        loop {
            if drive {
                self.drive_run(id).await;
            }
            let check_pending = {
                let mut active = self.dispatch.active.lock();
                match active.get_mut(id) {
                    Some(a) if a.rerun => {
                        (a.rerun, a.rerun_if_pending) = (false, false);
                        false
                    }
                    Some(a) if a.rerun_if_pending => {
                        a.rerun_if_pending = false;
                        true
                    }
                    _ => {
                        active.remove(id);
                        return;
                    }
                }
            };
            // A read error runs it again: a spare turn is harmless, a missed retry is not.
            drive = !check_pending
                || match self.store.get_run(id).await {
                    Ok(run) => run.is_some_and(|r| r.status == RunStatus::Pending),
                    Err(_) => true,
                };
        }
    }
}

/// Keeps the in-flight gauge and the dispatcher's view right however a run task ends
/// (including being aborted).
pub(super) struct TaskGuard {
    shared: Arc<Shared>,
    id: RunId,
    /// The run went quiet: `run_until_quiet` already removed its dispatcher entry, and any
    /// entry there now belongs to a newer task of the same run, which must not be touched
    /// (removing it would let a third task execute the run beside the second).
    quiet: bool,
}

impl TaskGuard {
    pub(super) fn new(shared: &Arc<Shared>, id: RunId) -> Self {
        let now = shared.dispatch.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.dispatch.max_in_flight.fetch_max(now, Ordering::AcqRel);
        TaskGuard { shared: shared.clone(), id, quiet: false }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let dispatch = &self.shared.dispatch;
        if let Some(interrupted) = dispatch.interrupted.lock().as_mut() {
            interrupted.push(self.id.clone());
        }
        if !self.quiet {
            // Cut off (shutdown or abort): the entry is still this task's.
            dispatch.active.lock().remove(&self.id);
        }
        dispatch.in_flight.fetch_sub(1, Ordering::AcqRel);
        dispatch.idle.notify_waiters();
    }
}
