//! Waiting for runs: `wait_for_run` callers watch a run by id (never a broadcast every
//! waiter filters), are notified when this engine settles it (or suspends it, those waiting
//! for a suspension), and read runs executing elsewhere together, one store call per
//! interval however many wait.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use durable_core::{Run, RunId, RunStatus, Store, StoreResult};
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use super::Shared;
use crate::error::{Error, Result};

/// The runs `wait_for_run` callers wait on.
#[derive(Default)]
pub(super) struct Watchers {
    /// One watch per waited-on run, shared by its waiters; the last one out removes it.
    map: Mutex<HashMap<RunId, Arc<Watch>>>,
    /// When the watched runs were last read together (one store call for every waiter).
    refreshed: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Reads of one run, folded into batches ([`Shared::read_run`]).
    reads: RunReads,
}

/// A read of one run asked of [`RunReads`]: the run's id and where its answer goes (`None`:
/// the batch failed, read it alone).
type ReadRequest = (RunId, oneshot::Sender<Option<Option<Run>>>);

/// Reads of single runs by id, folded together: the requests that arrive while a batch is
/// read wait for the next one, read with one `Store::get_runs`. Under load (many waiters
/// woken at once, many turns starting) that is one store call for many reads — one round
/// trip to PostgreSQL, one reader job on SQLite — instead of one each; a lone read costs a
/// channel hop. Each batch is read after its requests arrived, so a read sees at least what
/// was committed before it was asked for.
#[derive(Default)]
struct RunReads {
    /// The batching task's inbox, started with the first read (inside the runtime).
    inbox: OnceLock<mpsc::UnboundedSender<ReadRequest>>,
}

/// Batches read at once, at most (each is one store call).
const READS_IN_FLIGHT: usize = 2;
/// Runs in one batch, at most.
const READ_BATCH: usize = 512;

impl RunReads {
    fn inbox(&self, store: &Arc<dyn Store>) -> &mpsc::UnboundedSender<ReadRequest> {
        self.inbox.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            // The task holds the store, not the engine: it ends when the engine (the sender)
            // is dropped.
            tokio::spawn(read_batches(store.clone(), rx));
            tx
        })
    }
}

/// The batching task: takes every request waiting (up to [`READ_BATCH`]) whenever fewer than
/// [`READS_IN_FLIGHT`] batches are being read, and reads them together.
async fn read_batches(store: Arc<dyn Store>, mut inbox: mpsc::UnboundedReceiver<ReadRequest>) {
    let slots = Arc::new(Semaphore::new(READS_IN_FLIGHT));
    let mut batch = Vec::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        if inbox.recv_many(&mut batch, READ_BATCH).await == 0 {
            return;
        }
        let requests = std::mem::take(&mut batch);
        let store = store.clone();
        tokio::spawn(async move {
            let mut ids: Vec<RunId> = requests.iter().map(|(id, _)| id.clone()).collect();
            ids.sort_unstable();
            ids.dedup();
            let found: StoreResult<HashMap<RunId, Run>> =
                store.get_runs(&ids).await.map(|runs| runs.into_iter().map(|r| (r.id.clone(), r)).collect());
            for (id, answer) in requests {
                // A failed batch: each reads alone, to get its own error.
                let _ = answer.send(found.as_ref().ok().map(|runs| runs.get(&id).cloned()));
            }
            drop(slot);
        });
    }
}

/// A run that `wait_for_run` callers wait on.
#[derive(Default)]
struct Watch {
    /// Notified when this engine settles the run (or changes it otherwise, a cancel).
    notify: Notify,
    /// Notified when this engine suspends the run: only the waiters for which a suspension is
    /// enough read the run then (a run of remote steps suspends once per step; waiters for its
    /// end would read it each time for nothing).
    suspended: Notify,
    /// What the last shared read found (`Some(None)`: the run does not exist).
    seen: Mutex<Option<Option<Run>>>,
}

impl Shared {
    /// The run, as `Store::get_run` reads it, read in a batch with the other runs asked for
    /// at the same time (see [`RunReads`]).
    pub(crate) async fn read_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        let (answer, answered) = oneshot::channel();
        if self.watchers.reads.inbox(&self.store).send((id.clone(), answer)).is_ok()
            && let Ok(Some(run)) = answered.await
        {
            return Ok(run);
        }
        self.store.get_run(id).await
    }

    /// How many runs callers wait on right now.
    pub(crate) fn watched(&self) -> usize {
        self.watchers.map.lock().len()
    }

    /// Wakes `wait_for_run` callers of this run.
    pub(super) fn notify_run(&self, id: &RunId) {
        if let Some(w) = self.watchers.map.lock().get(id) {
            w.notify.notify_waiters();
            w.suspended.notify_waiters();
        }
    }

    /// Wakes the callers waiting for this run to suspend (or settle): this engine suspended it.
    pub(super) fn notify_suspended(&self, id: &RunId) {
        if let Some(w) = self.watchers.map.lock().get(id) {
            w.suspended.notify_waiters();
        }
    }

    /// Reads every watched run in one store call per 1,000 ids and records what it found on
    /// their watches, unless another waiter did so within the last half interval: however
    /// many callers wait, runs executing elsewhere cost one read per interval, not one each.
    async fn refresh_watched(&self) -> Result<()> {
        let mut refreshed = self.watchers.refreshed.lock().await;
        if refreshed.is_some_and(|at| at.elapsed() < self.config.wait_poll_interval / 2) {
            return Ok(());
        }
        // Ids only: a clone of a watch held here would keep a finished waiter from removing it.
        let mut watched: Vec<RunId> = self.watchers.map.lock().keys().cloned().collect();
        watched.sort_unstable();
        for ids in watched.chunks(1_000) {
            let mut runs: HashMap<RunId, Run> =
                self.store.get_runs(ids).await?.into_iter().map(|r| (r.id.clone(), r)).collect();
            let watchers = self.watchers.map.lock();
            for id in ids {
                if let Some(watch) = watchers.get(id) {
                    *watch.seen.lock() = Some(runs.remove(id));
                }
            }
        }
        *refreshed = Some(tokio::time::Instant::now());
        Ok(())
    }

    /// Waits until the run is terminal (or, with `suspended_is_enough`, suspended), for at
    /// most `timeout`.
    pub(crate) async fn wait_for(
        &self,
        id: &RunId,
        suspended_is_enough: bool,
        timeout: Option<Duration>,
    ) -> Result<Run> {
        let watch = self.watchers.map.lock().entry(id.clone()).or_default().clone();
        // A run buried here is seen dead once its `on_dead` listeners ran (its notify follows).
        let done = |run: &Run| {
            (run.status.is_terminal() && !(run.status == RunStatus::Dead && self.burying(id)))
                || (suspended_is_enough && run.status == RunStatus::Suspended)
        };
        let wait = async {
            // First, and after a notify from this engine: read the run itself. When the
            // interval passes without one: read it with every other watched run.
            let mut read_alone = true;
            // How long to wait before looking again after a retryable store error.
            let mut outage = self.config.wait_poll_interval;
            loop {
                let notified = watch.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let suspended = watch.suspended.notified();
                tokio::pin!(suspended);
                if suspended_is_enough {
                    suspended.as_mut().enable();
                }
                let read = async {
                    if read_alone {
                        return Ok(self.read_run(id).await?);
                    }
                    self.refresh_watched().await?;
                    let seen = watch.seen.lock().clone();
                    match seen {
                        Some(run) => Ok(run),
                        None => Ok(self.read_run(id).await?),
                    }
                };
                let run = match read.await {
                    Ok(run) => run,
                    // The store is out of reach for a moment (a restart, a dropped connection):
                    // the run goes on where it executes, so look again, less often each time
                    // (up to every 5 s). Only an error that will not pass ends the wait.
                    Err(Error::Store(e)) if e.is_retryable() => {
                        tracing::debug!(run = %id, error = %e, "waiting for a run: the store is unavailable; looking again");
                        tokio::time::sleep(outage).await;
                        outage = (outage * 2).min(Duration::from_secs(5));
                        read_alone = true;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                outage = self.config.wait_poll_interval;
                let run = run.ok_or_else(|| Error::RunNotFound(id.clone()))?;
                if done(&run) {
                    return Ok(run);
                }
                read_alone = tokio::select! {
                    biased;
                    () = notified => true,
                    () = suspended, if suspended_is_enough => true,
                    () = tokio::time::sleep(self.config.wait_poll_interval) => false,
                };
            }
        };
        let result = match timeout {
            None => wait.await,
            Some(limit) => match tokio::time::timeout(limit, wait).await {
                Ok(r) => r,
                Err(_) => {
                    let status = self.store.get_run(id).await?.map(|r| r.status).unwrap_or(RunStatus::Pending);
                    Err(Error::Timeout { id: id.clone(), timeout: limit, status })
                }
            },
        };
        drop(watch);
        let mut watchers = self.watchers.map.lock();
        if watchers.get(id).is_some_and(|w| Arc::strong_count(w) == 1) {
            watchers.remove(id);
        }
        result
    }
}
