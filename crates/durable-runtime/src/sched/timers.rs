//! Timers and pollers: in-memory timers for runs this engine parked, and the poller that
//! looks at the store for pending, due and orphaned runs and runs past their execution
//! timeout. Due runs are claimed, not just read (`Store::claim_due_runs` moves their
//! `wake_at` one lease period ahead), so pollers of many engines sharing a store hand each
//! one on about once; the claims are remembered here until they end.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use durable_core::{Millis, QueueReason, Run, RunFilter, RunId, RunQuery, RunStatus, StepError, codes};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Shared;
use super::operate::Cancel;

/// In-memory timers for runs this engine parked: one task sleeps until the earliest. And the
/// poller's wake-up call.
#[derive(Default)]
pub(super) struct Timers {
    due: Mutex<Due>,
    changed: Notify,
    /// Look at the store now, not at the next poll (a registration, `poll_now`).
    poke: Notify,
    /// The due runs this engine's poller claimed lately, or whose claimed wake it took from
    /// the run queue, with the `wake_at` the claim gave them (when the claim ends). Forgotten
    /// once that time passed.
    claims: Mutex<HashMap<RunId, Millis>>,
    /// With a poll grace: the runs the last poll found pending, with when this poller first
    /// saw them pending (or last handed them on).
    pending_seen: Mutex<HashMap<RunId, Millis>>,
    /// Whether the poller has finished a look (one with nothing registered counts).
    polled: tokio::sync::watch::Sender<bool>,
}

/// One timer per run: the time its last turn here parked it until.
#[derive(Default)]
struct Due {
    by_time: BTreeSet<(Millis, RunId)>,
    by_run: HashMap<RunId, Millis>,
}

impl Timers {
    /// Sets the run's timer (replacing the one it had).
    pub(super) fn schedule(&self, at: Millis, id: RunId) {
        let mut due = self.due.lock();
        if let Some(old) = due.by_run.insert(id.clone(), at) {
            due.by_time.remove(&(old, id.clone()));
        }
        let earliest = due.by_time.first().is_none_or(|(first, _)| at < *first);
        due.by_time.insert((at, id));
        if earliest {
            self.changed.notify_one();
        }
    }

    /// Removes the run's timer, if it has one.
    fn cancel(&self, id: &RunId) {
        let mut due = self.due.lock();
        if let Some(at) = due.by_run.remove(id) {
            due.by_time.remove(&(at, id.clone()));
        }
    }

    fn next(&self) -> Option<Millis> {
        self.due.lock().by_time.first().map(|(at, _)| *at)
    }

    fn pop_due(&self, now: Millis) -> Vec<RunId> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        while due.by_time.first().is_some_and(|(at, _)| *at <= now) {
            let (_, id) = due.by_time.pop_first().expect("checked");
            due.by_run.remove(&id);
            out.push(id);
        }
        out
    }
}

impl Shared {
    /// Remembers runs a poller claimed (their `wake_at` is `until` now), forgetting the claims
    /// that ended.
    pub(super) fn record_claims(&self, ids: &[RunId], until: Millis) {
        let now = self.clock.now();
        let mut claims = self.timers.claims.lock();
        claims.retain(|_, end| *end > now);
        for id in ids {
            claims.insert(id.clone(), until);
        }
    }

    /// Remembers one claim named by a wake this engine took from the run queue (a single
    /// insert: the poller's [`Shared::record_claims`] forgets the ended ones each poll).
    pub(super) fn record_claim(&self, id: &RunId, until: Millis) {
        self.timers.claims.lock().insert(id.clone(), until);
    }

    /// Whether the run, as read from the store, is one a poller claimed (this engine's, or
    /// another's whose wake this engine took: the claim travels in the wake's dedupe key) and
    /// no turn has parked since: its `wake_at` is still the one the claim gave it. It is due
    /// then, although its `wake_at` says later — the claim moved it so that no other poller
    /// hands it on again; the wake queued for it must not be taken for stale news.
    pub(super) fn claimed_here(&self, run: &Run) -> bool {
        !run.status.is_terminal()
            && run.wake_at.is_some_and(|at| self.timers.claims.lock().get(&run.id).is_some_and(|until| *until == at))
    }

    /// Of the runs a poll found pending at `now`, those to hand on: with a `grace`, a run is
    /// left to the start item already sent for it until this poller has seen it pending for
    /// the grace, and is handed on again each time the grace passes. A run no longer found is
    /// forgotten.
    fn pending_to_hand_on(&self, found: Vec<RunId>, now: Millis, grace: Millis) -> Vec<RunId> {
        let mut seen = self.timers.pending_seen.lock();
        if grace == 0 {
            seen.clear();
            return found;
        }
        let mut still = HashMap::with_capacity(found.len());
        let mut hand_on = Vec::new();
        for id in found {
            let mut since = seen.remove(&id).unwrap_or(now);
            if now.saturating_sub(since) >= grace {
                hand_on.push(id.clone());
                since = now;
            }
            still.insert(id, since);
        }
        *seen = still;
        hand_on
    }

    /// Drops the run's in-memory timer: a turn of it starts here, and sets a new one if it
    /// parks (so a timer never wakes a run that already moved on).
    pub(super) fn cancel_timer(&self, id: &RunId) {
        self.timers.cancel(id);
    }

    /// Resolves once the poller has finished a look at the store (its first, at least); at once
    /// on an engine that executes nothing (it has no poller).
    pub(crate) async fn until_polled(&self) {
        if !self.config.execute {
            return;
        }
        let _ = self.timers.polled.subscribe().wait_for(|polled| *polled).await;
    }

    /// Has the poller look at the store now instead of at its next tick.
    pub(crate) fn poll_now(&self) {
        self.timers.poke.notify_one();
    }

    pub(super) async fn timer_loop(self: Arc<Self>) {
        loop {
            match self.timers.next() {
                None => self.timers.changed.notified().await,
                Some(at) => {
                    tokio::select! {
                        biased;
                        () = self.clock.sleep_until(at) => {
                            let mark = self.mark();
                            for id in self.timers.pop_due(self.clock.now()) {
                                self.wake(id, mark);
                            }
                        }
                        () = self.timers.changed.notified() => {}
                    }
                }
            }
        }
    }

    pub(super) async fn poll_loop(self: Arc<Self>) {
        let mut last_orphan_scan: Option<tokio::time::Instant> = None;
        loop {
            let orphans = last_orphan_scan.is_none_or(|t| t.elapsed() >= self.config.orphan_poll_interval);
            if self.poll_once(orphans).await && orphans {
                last_orphan_scan = Some(tokio::time::Instant::now());
                self.enforce_timeouts().await;
            }
            self.timers.polled.send_if_modified(|polled| !std::mem::replace(polled, true));
            tokio::select! {
                biased;
                () = tokio::time::sleep(self.config.poll_interval) => {}
                () = self.timers.poke.notified() => {}
            }
        }
    }

    /// One look at the store for runs to execute. Returns false when nothing is registered.
    ///
    /// Pending and orphaned runs are read; what is found is left alone if it is queued or
    /// executing here, or went quiet here while the store was read (the find is older than
    /// that turn): a run is executed by one turn per wake, never by a spare one because a
    /// poller saw it too. Due runs are claimed (`Store::claim_due_runs`: their `wake_at`
    /// moves one lease period ahead, so no other poller finds them meanwhile) and each gets a
    /// wake (see [`Shared::queue_claimed`]): if that wake is lost, the run is due again when
    /// the claim ends. A draining or stopping engine claims nothing: it could not hand on
    /// what it claimed, and the other engines' pollers find it. With a working run queue a
    /// run found pending is first left to its own start item for the poll grace
    /// ([`EngineConfig::poll_grace`](crate::EngineConfig::poll_grace)), and a run found due
    /// is left to its own wake for it too: on a queue that keeps duplicates (a broker) any
    /// due run, on the store-backed queue one with a wake waiting in the store's queue.
    async fn poll_once(&self, orphans: bool) -> bool {
        let workflows = self.registry.keys();
        if workflows.is_empty() {
            return false;
        }
        let now = self.clock.now();
        let query = RunQuery {
            namespace: self.config.namespace.clone(),
            workflows: Some(workflows),
            now,
            limit: self.config.poll_batch,
            leave_queued_since: None,
        };
        let until = now.saturating_add(self.lease_ms());
        let claim = !self.is_stopping() && !self.is_draining();
        let pending_grace = self.fleet.pending_grace(self.config.poll_grace).as_millis() as Millis;
        let due_grace = self.fleet.due_grace(self.config.poll_grace).as_millis() as Millis;
        let mark = self.mark();
        let (mut pending, mut claimed, mut orphaned) = (None, Vec::new(), Vec::new());
        let result = async {
            pending = Some(self.store.pending_runs(&query).await?);
            if claim {
                let due = RunQuery {
                    now: now.saturating_sub(due_grace),
                    leave_queued_since: self.fleet.leave_queued_since(now, self.config.poll_grace),
                    ..query.clone()
                };
                claimed.extend(self.store.claim_due_runs(&due, until).await?);
                self.record_claims(&claimed, until);
            }
            if orphans {
                orphaned.extend(self.store.orphaned_runs(&query).await?);
            }
            Ok::<_, durable_core::StoreError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "poller could not read the store; trying again next interval");
        }
        // With a run queue, what a poller finds is handed to every instance, not executed here.
        let pending = pending.map(|found| self.pending_to_hand_on(found, now, pending_grace)).unwrap_or_default();
        if pending_grace > 0 && !pending.is_empty() {
            self.stray_starts(pending.len(), Duration::from_millis(pending_grace));
        }
        for id in pending {
            self.queue_found(id, QueueReason::Start, mark);
        }
        for id in claimed {
            self.queue_claimed(id, mark, until);
        }
        for id in orphaned {
            self.queue_found(id, QueueReason::Wake, mark);
        }
        true
    }

    /// Cancels active runs older than their workflow's execution timeout.
    async fn enforce_timeouts(self: &Arc<Self>) {
        let limits: Vec<(String, Duration)> = self.hooks.timeouts();
        for (workflow, limit) in limits {
            let filter = RunFilter {
                workflow: Some(workflow.clone()),
                statuses: RunStatus::ACTIVE.to_vec(),
                namespace: self.config.namespace.clone(),
                created_before: Some(durable_core::millis_before(self.clock.now(), limit)),
                limit: 200,
                ..Default::default()
            };
            let runs = match self.store.list_runs(&filter).await {
                Ok(page) => page.runs,
                Err(e) => {
                    tracing::warn!(error = %e, "could not look for runs past their execution timeout");
                    continue;
                }
            };
            for run in runs {
                let error = StepError::fatal(format!(
                    "run {} of workflow {workflow:?} exceeded its execution timeout of {limit:?}",
                    run.id
                ))
                .with_code(codes::EXECUTION_TIMEOUT);
                tracing::warn!(run_id = %run.id, "{}", error.message);
                if let Err(e) = self.cancel_run(&run.id, Cancel::Abandon, Some(error)).await {
                    tracing::warn!(run_id = %run.id, error = %e, "could not time the run out");
                }
            }
        }
    }
}
