//! The turn executor: claims a run, polls its body until it finishes or every branch is
//! parked, and applies the turn's end to the store — one place owns a run's turn. What
//! follows a turn that could not run is here too: a retry after a store error, a re-check
//! when another engine held the lease.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use durable_core::task::{TaskCompletion, TaskDone};
use durable_core::{
    Checkpoint, Claim, ClaimOutcome, Commit, CommitOutcome, Delivery, End, Halt, History, Millis, Payload, Run, RunId,
    RunPatch, RunStatus, StepError, StoreError, StoreErrorKind, StoreResult, Turn, TurnConfig, TurnEnd, codes,
};
use parking_lot::Mutex;
use tracing::Instrument;

use super::control::TurnWatch;
use super::eager::Assigned;
use super::warm::Parked;
use super::{Mark, Nudge, Shared};
use crate::events::EngineEvent;
use crate::registry::ErasedWorkflow;
use crate::turn::{TurnDriver, TurnState, WorkflowCtx};

/// How many times a claim that found this engine's own lease on a busy row is tried again
/// (after 2, 4, … up to 128 ms: about 0.9 s in all) before it is left to the re-check.
const OWN_BUSY_RETRIES: u32 = 12;

/// What the executor remembers about runs between turns.
#[derive(Default)]
pub(super) struct Executor {
    /// Consecutive store failures per run: the retry backoff doubles with each.
    store_failures: Mutex<HashMap<RunId, u32>>,
    /// Runs with a lease re-check under way (one per run at a time).
    rechecks: Mutex<HashSet<RunId>>,
    /// Runs already warned about: their workflow version is not registered here.
    warned_versions: Mutex<HashSet<RunId>>,
    /// Runs a settle here handed a concurrency key to and claimed in its commit
    /// ([`Store::commit_and_claim_handed`](durable_core::Store::commit_and_claim_handed)),
    /// with what the claim read, until their first drive takes it instead of claiming.
    handed: Mutex<HashMap<RunId, ClaimOutcome>>,
    /// Tasks a suspending commit of the run wrote claimed by workers beside this engine, handed
    /// over once the run's drive here ends ([`Shared::run_in_slot`]), or before its next turn
    /// ([`Shared::drive_run`]) if another follows first.
    pub(super) eager_after: Mutex<HashMap<RunId, Assigned>>,
    /// Runs being buried here ([`Shared::bury`]): from before their `dead` commit until their
    /// `on_dead` listeners ran. A waiter that reads such a run `dead` meanwhile waits on
    /// ([`Shared::burying`]), so no caller sees it dead — and, say, stops the engine under the
    /// listeners — before they ran.
    burying: Mutex<HashSet<RunId>>,
}

/// Marks a run as being buried here while it lives ([`Executor::burying`]).
struct Burying<'a> {
    shared: &'a Shared,
    id: RunId,
}

impl<'a> Burying<'a> {
    fn new(shared: &'a Shared, id: &RunId) -> Self {
        shared.executor.burying.lock().insert(id.clone());
        Burying { shared, id: id.clone() }
    }
}

impl Drop for Burying<'_> {
    fn drop(&mut self) {
        self.shared.executor.burying.lock().remove(&self.id);
    }
}

/// Whether a turn made progress, for `Metrics::turns_without_progress` (and, of a recovered
/// run, for the `durable_recoveries_total` metric): the store acknowledged a checkpoint of it,
/// or its end moved the run to another status than the claim found (pending → suspended, a
/// settle). Counted once per turn: as its end is applied, before its events and waiters are
/// told (so whoever sees the end sees the count), or when the turn ends without an end that
/// applied.
struct Tally {
    /// The run's workflow (the metrics' label).
    workflow: String,
    /// The run's status before the claim.
    previous: RunStatus,
    /// The claim took the run over from an owner whose lease had expired.
    recovered: bool,
    /// The store acknowledged a commit of the turn that carried a checkpoint.
    checkpointed: bool,
    counted: bool,
}

impl Tally {
    /// Counts the turn, once: `checkpoints` says whether its end carried any that applied,
    /// `status` what the end moved the run to (`None`: it did not apply).
    fn count(&mut self, metrics: &super::MetricsInner, checkpoints: bool, status: Option<RunStatus>) {
        if std::mem::replace(&mut self.counted, true) {
            return;
        }
        if self.checkpointed || checkpoints || status.is_some_and(|s| s != self.previous) {
            if self.recovered {
                crate::metrics::recovery(&self.workflow);
            }
        } else {
            metrics.turns_without_progress.fetch_add(1, Ordering::Relaxed);
            crate::metrics::turn_without_progress();
        }
    }
}

/// A write for a run that its drive's first claim makes, in the same store call
/// ([`Shared::drive_run`]); whoever asked for it hears the answer on `reply`.
pub(crate) enum FirstClaim {
    /// A worker's result ([`Store::complete_task_and_claim`](durable_core::Store::complete_task_and_claim)).
    Result { done: TaskDone, reply: tokio::sync::oneshot::Sender<StoreResult<TaskCompletion>> },
    /// A signal sent by this engine to a token the run's turn kept in memory waits on
    /// ([`Store::send_signal_and_claim`](durable_core::Store::send_signal_and_claim)); the
    /// claim reads the history from `from_seq` (the kept turn's).
    Signal {
        token: String,
        payload: Payload,
        from_seq: u32,
        reply: tokio::sync::oneshot::Sender<StoreResult<Delivery>>,
    },
}

/// A claimed run, ready for its turn.
struct Claimed {
    run: Run,
    /// Its whole history (empty when `resumed`).
    history: Vec<Checkpoint>,
    /// Its status before the claim.
    previous: RunStatus,
    /// The claim took it over from an expired lease.
    recovered: bool,
    /// Its suspended turn, kept in memory and resumed for this claim (no replay).
    resumed: Option<Parked>,
}

/// What the run loop does after a turn.
enum TurnEnded {
    /// Something was delivered while the turn ran: run another turn at once.
    Again,
    /// The run settled or suspended (or is someone else's now).
    Done,
    /// A store call failed: retry the run later.
    StoreFailed(StoreError),
}

impl Shared {
    /// Whether the run is being buried here: its `dead` commit may be in the store, its
    /// `on_dead` listeners not run yet.
    pub(super) fn burying(&self, id: &RunId) -> bool {
        self.executor.burying.lock().contains(id)
    }

    /// Applies a commit and releases its effects: created children and runs that received a
    /// signal are dispatched (only after the store acknowledged the commit).
    pub(super) async fn apply_commit(&self, mut commit: Commit) -> StoreResult<CommitOutcome> {
        let children: Vec<(RunId, String, i32, u64)> =
            commit.children.iter().map(|c| (c.id.clone(), c.namespace.clone(), c.priority, c.created_at)).collect();
        let started: Vec<String> = commit.children.iter().map(|c| c.workflow.clone()).collect();
        // Tasks a worker beside this engine can take now are written claimed by it and handed
        // over once the store has them; the others are left to the workers' claims. Not in a
        // commit that settles the run, which finishes its tasks in the same write.
        let eager = if !commit.tasks.is_empty()
            && !matches!(commit.end, Some(TurnEnd::Settle { .. }))
            && self.store.capabilities().claimed_dispatch
        {
            self.eager.assign(&mut commit.tasks, self.clock.now())
        } else {
            Assigned::default()
        };
        // Handed over once the run's drive here has ended (see below).
        let stash_for =
            (!eager.is_empty() && matches!(commit.end, Some(TurnEnd::Suspend { .. }))).then(|| commit.run_id.clone());
        let queues: Vec<(String, String)> = commit
            .tasks
            .iter()
            .filter(|t| t.claimed_by.is_none())
            .map(|t| (t.namespace.clone(), t.queue.clone()))
            .collect();
        let mark = self.mark();
        let size = crate::metrics::commit_size(&commit);
        // A settle releases the run's concurrency key: where the run it is handed to would
        // execute here, the commit claims it too, saving that run a claim of its own.
        let claim_handed =
            matches!(commit.end, Some(TurnEnd::Settle { .. })) && self.flow.has_keys() && self.executes_wakes_here();
        let began = std::time::Instant::now();
        let outcome = if claim_handed {
            let lease_until = self.clock.now().saturating_add(self.lease_ms());
            self.store.commit_and_claim_handed(commit, lease_until).await
        } else {
            self.store.commit(commit).await.map(|outcome| (outcome, None))
        };
        crate::metrics::store_commit(began.elapsed(), outcome.as_ref().ok().map(|_| size));
        let (outcome, claimed) = match outcome {
            Ok(applied) => applied,
            Err(e) => {
                // The store may have applied it all the same (an answer lost on the way back):
                // the tasks go back to the queue rather than wait out their leases. Not after a
                // lost lease, which the store refused before writing anything.
                if e.kind() != durable_core::StoreErrorKind::LeaseLost {
                    self.hand_back_tasks(eager.tasks()).await;
                }
                return Err(e);
            }
        };
        match stash_for {
            // Handed over once the run's drive here has ended: a result that comes back at once
            // then records itself and claims the run in one store call.
            Some(run_id) => self.executor.eager_after.lock().entry(run_id).or_default().extend(eager),
            None => self.hand_eager(eager).await,
        }
        // Only a run that waited for its key (pending: no turn of it ever ran, so none can be
        // in progress anywhere) is handed to its first drive. A run the claim found running
        // under this engine's own lease is executing here already: where the store's commit
        // and claim are two calls (PostgreSQL), a drive here can claim the run the commit
        // woke before the settle's claim does. It is left to that turn (handing it back would
        // release the lease under it, and its step would run again in the next turn); the
        // wake below makes it look again once that turn ends. Any other run the commit
        // claimed (a step slot handed to a suspended run) is handed back at once, to the
        // status the claim found, and the wake below claims it again: left running under
        // this lease, its next claim would take `running` for where it stood.
        match claimed {
            Some(claimed @ ClaimOutcome::Acquired { previous: RunStatus::Pending, recovered: false, .. }) => {
                if let ClaimOutcome::Acquired { run, .. } = &claimed {
                    let id = run.id.clone();
                    self.executor.handed.lock().insert(id, claimed);
                }
            }
            Some(ClaimOutcome::Acquired { previous: RunStatus::Running, recovered: false, .. }) => {}
            Some(ClaimOutcome::Acquired { run, previous, .. }) => self.hand_back(&run, previous).await,
            _ => {}
        }
        for child in &started {
            crate::metrics::run_started(child);
        }
        if !queues.is_empty() {
            self.task_dispatched.notify_waiters();
            // Workers elsewhere look now, not at their next poll.
            for (namespace, queue) in &queues {
                self.nudge(Some(namespace), Some(queue));
            }
        }
        for (id, namespace, priority, created_at) in children {
            self.queue_start(id, &namespace, priority, created_at, mark);
        }
        self.wake_delivered(&outcome.deliveries, mark);
        for id in &outcome.handed_off {
            self.wake(id.clone(), mark);
        }
        Ok(outcome)
    }

    /// Hands the tasks a commit wrote claimed by workers beside this engine to them. A task
    /// whose worker stopped taking tasks meanwhile is handed back to the store.
    pub(super) async fn hand_eager(&self, eager: Assigned) {
        let orphans = eager.hand();
        self.hand_back_tasks(orphans).await;
    }

    /// Hands the tasks the run's last suspending commit dispatched to workers beside this
    /// engine to them, if any wait; returns those whose worker stopped taking tasks, for
    /// [`Shared::hand_back_tasks`].
    pub(super) fn hand_stashed(&self, id: &RunId) -> Vec<durable_core::task::Task> {
        let eager = self.executor.eager_after.lock().remove(id);
        eager.map(Assigned::hand).unwrap_or_default()
    }

    /// Hands tasks written claimed by a worker beside this engine back to the store, queued for
    /// any worker (nothing changes for a task the store does not hold so), one call per
    /// worker; if that fails, the lease runs out and another worker claims the task then.
    pub(super) async fn hand_back_tasks(&self, tasks: Vec<durable_core::task::Task>) {
        let mut by_worker: HashMap<String, Vec<durable_core::task::Task>> = HashMap::new();
        for task in tasks {
            by_worker.entry(task.worker.clone().unwrap_or_default()).or_default().push(task);
        }
        for (worker, tasks) in by_worker {
            let back: Vec<_> = tasks.iter().map(|t| (t.task.run_id.clone(), t.task.seq, t.task.attempt)).collect();
            match self.store.release_tasks(&back, &worker).await {
                Ok(()) => {
                    self.task_dispatched.notify_waiters();
                    let queues: std::collections::BTreeSet<(&str, &str)> =
                        tasks.iter().map(|t| (t.task.namespace.as_str(), t.task.queue.as_str())).collect();
                    for (namespace, queue) in queues {
                        self.nudge(Some(namespace), Some(queue));
                    }
                }
                Err(e) => {
                    tracing::warn!(worker = %worker, tasks = back.len(), error = %e, "could not hand back tasks their worker does not take; other workers claim them once their leases pass")
                }
            }
        }
    }

    /// Wakes the runs that received a delivery from a store call begun at `mark`.
    pub(crate) fn wake_delivered(&self, deliveries: &[Delivery], mark: Mark) {
        for d in deliveries {
            if let Delivery::Delivered { run_id, .. } = d {
                self.wake(run_id.clone(), mark);
            }
        }
    }

    /// Runs turns of `id` until it settles, suspends or belongs to someone else. With
    /// `result`, a worker's result for the run is recorded first, in the same store call as
    /// the first claim ([`Store::complete_task_and_claim`](durable_core::Store::complete_task_and_claim));
    /// the worker gets the completion, and nothing more happens unless it was accepted.
    pub(super) async fn drive_run(self: &Arc<Self>, id: &RunId, mut first: Option<FirstClaim>) {
        // A cancel heard while the run executes here stops its turn (see `control`).
        let watch = self.watch_turns(id);
        let mut own_busy = 0u32;
        // The run's suspended turn kept in memory, if any: resumed if the claim shows that
        // nothing but deliveries happened to the run since; dropped otherwise.
        let mut warm = self.warm.take(id);
        let drop_warm = |w: Option<Parked>| {
            if let Some(w) = w {
                self.warm.count_dropped(1);
                drop(w);
            }
        };
        // Nothing new for the run: its kept turn goes back, still the latest.
        let keep_warm = |w: Option<Parked>| {
            if let Some(w) = w {
                self.put_back_warm(id, w);
            }
        };
        loop {
            // A turn that suspended woken, and runs again: what it dispatched to workers
            // beside this engine goes to them before the next turn.
            let orphans = self.hand_stashed(id);
            self.hand_back_tasks(orphans).await;
            watch.claiming();
            let now = self.clock.now();
            let claim = Claim {
                run_id: id.clone(),
                owner: self.owner.clone(),
                lease_until: now.saturating_add(self.lease_ms()),
                now,
            };
            // The seq the claim's history begins at: 0 (all of it) unless the claim read only
            // what the turn kept in memory needs.
            let mut read_from = 0;
            let claimed = match first.take() {
                None => match self.take_handed(id, now).await {
                    Some(claimed) => Ok(claimed),
                    None => match &warm {
                        // Only the checkpoints the parked calls look at: the rest is in memory.
                        Some(w) => {
                            read_from = w.from_seq;
                            self.store.claim_run_from(claim, w.from_seq).await
                        }
                        None => self.store.claim_run(claim).await,
                    },
                },
                Some(FirstClaim::Signal { token, payload, from_seq, reply }) => {
                    match self.store.send_signal_and_claim(&token, payload, claim, from_seq).await {
                        Ok((delivery, claimed)) => {
                            let to_this = delivery.is_to(id);
                            let _ = reply.send(Ok(delivery));
                            match claimed {
                                Some(outcome) => {
                                    read_from = from_seq;
                                    Ok(outcome)
                                }
                                // Delivered, but not claimed (a store whose two calls are
                                // apart): claim it as any wake does.
                                None if to_this => continue,
                                // Another run's wait took it, or it was buffered: nothing new
                                // for this run, whose turn stays kept.
                                None => return keep_warm(warm),
                            }
                        }
                        Err(e) => {
                            // Nothing written: the caller hears the error.
                            let _ = reply.send(Err(e));
                            return keep_warm(warm);
                        }
                    }
                }
                Some(FirstClaim::Result { done, reply }) => {
                    // A result recorded with the claim: a claim a settle made is stale now, and
                    // a turn kept warm replays (no warm turn waits on a remote step: that park
                    // halts for good).
                    self.executor.handed.lock().remove(id);
                    drop_warm(warm.take());
                    match self.store.complete_task_and_claim(done, claim).await {
                        Ok((completion, claimed)) => {
                            let _ = reply.send(Ok(completion));
                            match claimed {
                                Some(outcome) => Ok(outcome),
                                // Accepted, but not claimed (a store whose two calls are apart):
                                // the run was woken; claim it as any wake does.
                                None if completion == TaskCompletion::Accepted => continue,
                                // Nothing recorded: nothing new for the run.
                                None => return,
                            }
                        }
                        Err(e) => {
                            // Nothing written: the worker tries again.
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
            };
            let (run, history, previous, recovered) = match claimed {
                Ok(ClaimOutcome::Acquired { run, history, previous, recovered }) => (run, history, previous, recovered),
                Ok(ClaimOutcome::NotFound) => {
                    self.missing_run(id);
                    return drop_warm(warm);
                }
                Ok(ClaimOutcome::Terminal(_)) => {
                    drop_warm(warm);
                    return self.notify_run(id);
                }
                Ok(ClaimOutcome::Busy(run)) if self.holds_lease(&run) && own_busy < OWN_BUSY_RETRIES => {
                    // Our own lease (a turn here ended and left it, as a woken suspend does),
                    // but the store found the row busy: another transaction was writing it at
                    // that instant (PostgreSQL's claim skips a locked row rather than wait).
                    // Claim again shortly; waiting for our own lease to expire would stall
                    // the run for a lease period.
                    own_busy += 1;
                    tokio::time::sleep(Duration::from_millis(1 << own_busy.min(7))).await;
                    continue;
                }
                Ok(ClaimOutcome::Busy(run))
                    if run.status == RunStatus::Pending && run.wake_at == Some(durable_core::protocol::GATED) =>
                {
                    // Waiting for its concurrency key (a child, a successor or a schedule's
                    // run queued at its creation): the release that hands it the key wakes
                    // it, so nothing is re-checked meanwhile.
                    drop_warm(warm);
                    return;
                }
                Ok(ClaimOutcome::Busy(run)) => {
                    if run.lease_owner.is_none() || run.lease_until.is_none_or(|u| u < now) {
                        // Nobody holds the lease: the row was busy only because another
                        // transaction was writing it at that instant (PostgreSQL's claim skips
                        // a locked row: a poller claiming the run as due, a delivery). The
                        // turn kept in memory may still be the run's latest: it waits for the
                        // claim the re-check makes, whose count decides.
                        if let Some(w) = warm.take() {
                            self.put_back_warm(id, w);
                        }
                    } else {
                        drop_warm(warm);
                    }
                    return self.recheck_later(&run);
                }
                Err(e) => {
                    drop_warm(warm);
                    return self.retry_after_store_error(id, &e);
                }
            };
            if recovered {
                crate::metrics::lease_takeover(&run.workflow);
            }
            if recovered && run.recovery_attempts > self.config.max_recovery_attempts {
                drop_warm(warm);
                return self.bury(&run).await;
            }
            if !self.serves(&run.namespace) {
                // A wake reached an engine of another pool: leave the run to its own.
                drop_warm(warm);
                return self.hand_back(&run, previous).await;
            }
            let Some(handler) = self.registry.get(&run.workflow, run.version) else {
                drop_warm(warm);
                self.warn_unregistered(&run);
                return self.hand_back(&run, previous).await;
            };
            // Resume the turn kept in memory only if this claim is the run's very next one
            // since that turn's (nobody else ran it), and the store holds that turn's history
            // plus deliveries to its parked calls; on any doubt, replay over the whole history.
            // A replay reads the whole history if the claim read only a part (for a turn kept in
            // memory that is gone or stale now).
            let (history, resumed) = match warm.take() {
                None if read_from == 0 => (history, None),
                Some(w)
                    if w.claims > 0
                        && run.claims == w.claims + 1
                        && !recovered
                        && matches!(previous, RunStatus::Suspended | RunStatus::Running)
                        && read_from <= w.from_seq
                        && w.t.resume(run.clone(), history) =>
                {
                    self.warm.count_resumed();
                    (Vec::new(), Some(w))
                }
                stale => {
                    if stale.is_some() {
                        tracing::debug!(run_id = %id, "the run's turn kept in memory is stale; replaying");
                        drop_warm(stale);
                    }
                    match self.store.history(id).await {
                        Ok(history) => (history, None),
                        Err(e) => return self.retry_after_store_error(id, &e),
                    }
                }
            };
            // Its in-memory timer, if any, is stale now: the turn sets a new one if it parks.
            self.cancel_timer(id);
            self.emit(EngineEvent::TurnStarted { run_id: id.clone(), recovered });
            let span = crate::trace::turn_span(&run, &self.owner);
            let turn = Claimed { run, history, previous, recovered, resumed };
            match self.execute_turn(turn, handler, &watch).instrument(span).await {
                TurnEnded::Again => {
                    // A suspend that a delivery woke may have kept its turn: the next claim
                    // resumes it.
                    warm = self.warm.take(id);
                    continue;
                }
                TurnEnded::Done => {
                    self.executor.store_failures.lock().remove(id);
                    return;
                }
                TurnEnded::StoreFailed(e) => return self.retry_after_store_error(id, &e),
            }
        }
    }

    /// Runs one turn of a claimed run (`previous`: its status before the claim; `recovered`:
    /// the claim took it over from an expired lease) and applies its end; counts it in `turns`
    /// and, if it got nowhere, in `turns_without_progress`.
    async fn execute_turn(
        self: &Arc<Self>,
        claimed: Claimed,
        handler: Arc<dyn ErasedWorkflow>,
        watch: &TurnWatch<'_>,
    ) -> TurnEnded {
        self.metrics.turns.fetch_add(1, Ordering::Relaxed);
        let began = std::time::Instant::now();
        let workflow = claimed.run.workflow.clone();
        let (previous, recovered) = (claimed.previous, claimed.recovered);
        let mut tally = Tally { workflow, previous, recovered, checkpointed: false, counted: false };
        let ended = self.run_turn(claimed.run, claimed.history, claimed.resumed, handler, &mut tally, watch).await;
        // An end that did not apply (a halt, a failed commit) changed nothing.
        tally.count(&self.metrics, false, None);
        crate::metrics::turn(&tally.workflow, began.elapsed());
        ended
    }

    /// Builds the turn (or takes the resumed one), polls the body and applies its end; keeps
    /// the turn in memory if it suspended and can be resumed warm.
    async fn run_turn(
        self: &Arc<Self>,
        run: Run,
        history: Vec<Checkpoint>,
        resumed: Option<Parked>,
        handler: Arc<dyn ErasedWorkflow>,
        tally: &mut Tally,
        watch: &TurnWatch<'_>,
    ) -> TurnEnded {
        let id = run.id.clone();
        let leased_until = run.lease_until.unwrap_or_else(|| self.clock.now().saturating_add(self.lease_ms()));
        let (t, driver) = match resumed {
            Some(parked) => (parked.t, Ok(parked.driver)),
            None => {
                let input = run.input.clone();
                let config = TurnConfig {
                    max_payload_bytes: self.config.max_payload_bytes,
                    durable_retry_threshold: self.config.durable_retry_threshold,
                    latest_version: self.registry.latest(&run.workflow).map_or(run.version, |(v, _)| v),
                    non_ctx_await_grace: self.config.non_ctx_await_grace,
                    replay_only: false,
                    reconcile_interval: self.config.reconcile_interval,
                    slot_lease: self.config.lease_ttl,
                    admission_recheck: self.config.admission_recheck,
                    hold_sleeps_under: self.config.hold_sleeps_under,
                };
                let turn = Turn::new(run, self.owner.clone(), History::new(history), config);
                let t = Arc::new(TurnState::new(turn, self.clone()));
                let driver =
                    handler.call(WorkflowCtx { t: t.clone() }, &input).map(|body| TurnDriver::new(t.clone(), body));
                (t, driver)
            }
        };
        watch.turn(&t);
        let (end, driver) = match driver {
            Ok(mut driver) => {
                let end = tokio::select! {
                    biased;
                    end = &mut driver => end,
                    () = self.keep_lease(&id, leased_until) => End::Halt(Halt::LeaseLost("the lease could not be renewed".into())),
                };
                (end, Some(driver))
            }
            Err(e) => {
                let error = StepError::fatal(format!(
                    "run {id}: its input does not decode into the input type of workflow {:?} v{}: {e}",
                    t.run.workflow, t.run.version
                ))
                .with_code(codes::BAD_PAYLOAD);
                let end = t.turn.lock().fail(error, self.clock.now());
                (end, None)
            }
        };
        tally.checkpointed = t.checkpointed();
        self.end_turn(&id, &t, end, driver, tally).await
    }

    /// Keeps a turn whose suspend the store applied in memory, if it can be resumed warm
    /// (before the suspension is announced, so whoever hears of it finds the turn kept).
    fn keep_warm(&self, id: &RunId, t: &Arc<TurnState>, driver: Option<TurnDriver>) {
        if !self.warm.enabled() {
            return;
        }
        let (Some(driver), Some(from_seq)) = (driver, t.warm_from()) else { return };
        // Zero: the store does not count claims, so a later claim could not prove that
        // nobody else ran the run; such a turn always replays.
        let claims = t.turn.lock().run().claims;
        if claims == 0 {
            return;
        }
        let tokens = t.parked_tokens();
        self.warm.put(id.clone(), Parked { t: t.clone(), driver, claims, from_seq, tokens });
        if self.is_stopping() {
            // The engine stopped meanwhile: what it keeps would keep it alive.
            self.warm.remove(id);
        }
    }

    /// Puts a kept turn taken out for a claim that did not get the run back in memory (see
    /// [`Warm::put_back`](super::warm::Warm::put_back)), unless the engine is stopping.
    fn put_back_warm(&self, id: &RunId, w: Parked) {
        self.warm.put_back(id, w);
        if self.is_stopping() {
            self.warm.remove(id);
        }
    }

    /// Applies the end of a turn. `driver` (the body): kept in memory with the turn if the
    /// run suspends and the turn can be resumed warm.
    async fn end_turn(
        &self,
        id: &RunId,
        t: &Arc<TurnState>,
        end: End,
        driver: Option<TurnDriver>,
        tally: &mut Tally,
    ) -> TurnEnded {
        let outcome = match &end {
            End::Suspend { .. } => "suspended",
            End::Settle { status, .. } => status.as_str(),
            End::Halt(Halt::Rerun(_)) => "rerun",
            End::Halt(Halt::LeaseLost(_)) => "lease_lost",
            End::Halt(Halt::Abort(_)) => "aborted",
            End::Replayed(_) => "replayed",
        };
        crate::trace::outcome(&tracing::Span::current(), outcome);
        match end {
            End::Suspend { commit, wake_at } => match t.vet(commit).await {
                Ok(commit) => {
                    let ended = self.suspend(id, t, driver, commit, wake_at, tally).await;
                    // Vetting failed a child a join waits on: run again so the join sees it.
                    let rerun = matches!(t.turn.lock().stopped(), Some(durable_core::TurnStop::Rerun(_)));
                    if rerun && matches!(ended, TurnEnded::Done) { TurnEnded::Again } else { ended }
                }
                Err(e) => self.commit_failed(id, &e, tally),
            },
            End::Settle { commit, status } => {
                let commit = match t.vet(commit).await {
                    Ok(commit) => commit,
                    Err(e) => return self.commit_failed(id, &e, tally),
                };
                if let Some(durable_core::TurnEnd::Settle { error: Some(e), .. }) = &commit.end
                    && matches!(e.code(), Some(codes::PANIC | codes::NON_CTX_AWAIT))
                {
                    tracing::error!(run_id = %id, "{}", e.message);
                }
                // Vetting may turn a continue-as-new into a failure: the commit says how it ends.
                let status = commit.settles().unwrap_or(status);
                self.finish(id, commit, status, tally).await
            }
            End::Halt(Halt::Rerun(why)) => {
                tracing::debug!(run_id = %id, "turn restarted: {why}");
                TurnEnded::Again
            }
            End::Halt(Halt::LeaseLost(why)) => {
                tracing::info!(run_id = %id, "turn stopped: {why}; the run belongs to another owner now");
                crate::metrics::lease_lost(&tally.workflow);
                TurnEnded::Done
            }
            End::Halt(Halt::Abort(why)) => TurnEnded::StoreFailed(StoreError::unavailable(why)),
            // Only a replay-only turn ends so, and the executor never runs one.
            End::Replayed(verdict) => {
                tracing::error!(run_id = %id, ?verdict, "a turn ended as a replay; the run is left as it is");
                TurnEnded::Done
            }
        }
    }

    async fn finish(&self, id: &RunId, commit: Commit, status: RunStatus, tally: &mut Tally) -> TurnEnded {
        let checkpoints = !commit.checkpoints.is_empty();
        match self.apply_commit(commit).await {
            Ok(outcome) => {
                tally.count(&self.metrics, checkpoints, outcome.settled.then_some(status));
                if outcome.settled {
                    crate::metrics::run_settled(&tally.workflow, status, false);
                    self.emit(EngineEvent::RunSettled { run_id: id.clone(), status });
                }
                self.notify_run(id);
                TurnEnded::Done
            }
            Err(e) => self.commit_failed(id, &e, tally),
        }
    }

    async fn suspend(
        &self,
        id: &RunId,
        t: &Arc<TurnState>,
        driver: Option<TurnDriver>,
        commit: Commit,
        wake_at: Option<Millis>,
        tally: &mut Tally,
    ) -> TurnEnded {
        let checkpoints = !commit.checkpoints.is_empty();
        let outcome = self.apply_commit(commit).await;
        if let Ok(outcome) = &outcome {
            tally.count(&self.metrics, checkpoints, (!outcome.woken).then_some(RunStatus::Suspended));
            // Suspended, or woken with the lease still held: either way the next claim of the
            // run may continue this turn.
            self.keep_warm(id, t, driver);
        }
        match outcome {
            Ok(outcome) if outcome.woken => TurnEnded::Again,
            Ok(_) => {
                self.emit(EngineEvent::RunSuspended { run_id: id.clone(), wake_at });
                if let Some(at) = wake_at {
                    self.timers.schedule(at, id.clone());
                }
                self.notify_suspended(id);
                TurnEnded::Done
            }
            Err(e) => self.commit_failed(id, &e, tally),
        }
    }

    fn commit_failed(&self, id: &RunId, e: &StoreError, tally: &Tally) -> TurnEnded {
        if e.kind() == StoreErrorKind::LeaseLost {
            tracing::info!(run_id = %id, "turn end refused: {e}");
            crate::metrics::lease_lost(&tally.workflow);
            TurnEnded::Done
        } else {
            tracing::warn!(run_id = %id, error = %e, "could not commit the end of a turn");
            TurnEnded::StoreFailed(StoreError::unavailable(e.to_string()))
        }
    }

    /// Recovery gave up: the run becomes `dead` (and its parent is told).
    async fn bury(self: &Arc<Self>, run: &Run) {
        let error = StepError::fatal(format!(
            "run {}: recovered {} times (limit {}); it keeps crashing its worker — inspect it, then retry it",
            run.id, run.recovery_attempts, self.config.max_recovery_attempts
        ))
        .with_code(codes::MAX_RECOVERY_ATTEMPTS);
        let mut commit = Commit::new(run.id.clone(), self.owner.clone(), self.clock.now());
        commit.signals.extend(durable_core::protocol::child_notice(run, RunStatus::Dead, None, Some(error.clone())));
        commit.end = Some(TurnEnd::Settle { status: RunStatus::Dead, output: None, error: Some(error) });
        let burying = Burying::new(self, &run.id);
        match self.apply_commit(commit).await {
            Ok(outcome) if outcome.settled => {
                tracing::error!(run_id = %run.id, "run is dead after {} recoveries", run.recovery_attempts);
                crate::metrics::run_settled(&run.workflow, RunStatus::Dead, false);
                // The listeners first: whoever waits for the run sees it settled only after
                // they ran (a process that exits once its wait returns must not cut them off).
                let listeners = self.hooks.dead_listeners();
                if !listeners.is_empty() {
                    let dead = self.store.get_run(&run.id).await.ok().flatten().unwrap_or_else(|| run.clone());
                    for listener in listeners {
                        listener(&dead);
                    }
                }
                drop(burying);
                self.emit(EngineEvent::RunSettled { run_id: run.id.clone(), status: RunStatus::Dead });
                self.notify_run(&run.id);
            }
            Ok(_) => {}
            Err(e) => self.retry_after_store_error(&run.id, &e),
        }
    }

    fn warn_unregistered(&self, run: &Run) {
        if self.executor.warned_versions.lock().insert(run.id.clone()) {
            tracing::warn!(
                run_id = %run.id,
                "workflow {:?} version {} is not registered on this engine; the run is left as it is \
                 (register that version again to resume it, or cancel it)",
                run.workflow,
                run.version
            );
        }
    }

    /// A run this engine must not execute (another pool's, or a version it lacks): give it
    /// back as it was.
    async fn hand_back(&self, run: &Run, previous: RunStatus) {
        let patch =
            RunPatch { status: Some(previous), release_lease: true, now: self.clock.now(), ..Default::default() };
        if let Err(e) = self.store.update_run_if(&run.id, &[RunStatus::Running], patch).await {
            tracing::warn!(run_id = %run.id, error = %e, "could not hand the run back; its lease will expire");
        }
    }

    /// Renews the lease at half-life; returns only when it is lost (refused, or not renewed
    /// for a whole lease period).
    /// Renews the run's lease at half-life until the turn ends; returns (ending the turn) once
    /// the lease is lost to another owner, or when renewals fail and the lease, as last
    /// granted, would run out before the next attempt. A failed renewal is tried again after
    /// `store_retry_backoff`. Lease times are on the engine's clock, as the store measures
    /// them, so a turn never outlives its lease by more than one store call.
    async fn keep_lease(&self, id: &RunId, mut valid_until: Millis) {
        let ttl = self.config.lease_ttl;
        let retry = self.config.store_retry_backoff.min(ttl / 4);
        let mut wait = ttl / 2;
        loop {
            tokio::time::sleep(wait).await;
            let until = self.clock.now().saturating_add(self.lease_ms());
            match self.store.renew_lease(id, &self.owner, until).await {
                Ok(true) => {
                    valid_until = until;
                    wait = ttl / 2;
                }
                Ok(false) => {
                    tracing::warn!(run_id = %id, "lease lost to another owner; the turn stops");
                    return;
                }
                Err(e) => {
                    tracing::warn!(run_id = %id, error = %e, "lease renewal failed");
                    if self.clock.now().saturating_add(durable_core::millis(retry)) >= valid_until {
                        return;
                    }
                    wait = retry;
                }
            }
        }
    }

    /// The claim a settle here made of `id` when it handed it its concurrency key (see
    /// [`Shared::apply_commit`]), taken once, if the run is still as that claim left it: a
    /// read (a reader's, not a write) finds it running under this engine's lease, which has
    /// not passed, and nothing changed the row since (an operator's cancel, a delivery).
    /// Called once the turn's watch is set (so a cancel heard from here on stops the turn, as
    /// after a claim). `None`: there is none, or it is stale — the run is claimed again.
    async fn take_handed(&self, id: &RunId, now: Millis) -> Option<ClaimOutcome> {
        let claimed = self.executor.handed.lock().remove(id)?;
        let ClaimOutcome::Acquired { run: claimed_run, .. } = &claimed else { return None };
        let current = self.read_run(id).await.ok().flatten()?;
        let unchanged = current.status == RunStatus::Running
            && current.lease_owner == claimed_run.lease_owner
            && current.lease_until == claimed_run.lease_until
            && current.lease_until.is_some_and(|until| until > now)
            && current.wake_gen == claimed_run.wake_gen
            && current.updated_at == claimed_run.updated_at;
        unchanged.then_some(claimed)
    }

    pub(super) fn lease_ms(&self) -> Millis {
        durable_core::millis(self.config.lease_ttl)
    }

    /// Dispatches the run again after a backoff that doubles with consecutive failures.
    fn retry_after_store_error(self: &Arc<Self>, id: &RunId, e: &StoreError) {
        let failures = {
            let mut failures = self.executor.store_failures.lock();
            let n = failures.entry(id.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let delay = self
            .config
            .store_retry_backoff
            .saturating_mul(1 << (failures - 1).min(8))
            .min(std::time::Duration::from_secs(30));
        tracing::warn!(run_id = %id, error = %e, ?delay, "store error; the run will be retried");
        self.emit(EngineEvent::TurnAborted { run_id: id.clone(), error: e.to_string() });
        let shared = Arc::downgrade(self);
        let id = id.clone();
        // The run goes quiet after this, so the retry reads it first: if something else ran it
        // meanwhile, the retry costs that read, not a turn.
        let mark = self.mark();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(shared) = shared.upgrade() {
                shared.dispatch_as(id, Nudge::wake(mark));
            }
        });
    }

    /// A wake found the run's lease held by another engine: look again (every
    /// `recheck_interval`, at most `recheck_attempts` times) and execute it once the lease is
    /// free and the run has something new to see, so a wake racing another engine's turn is
    /// never lost. One re-check per run at a time.
    fn recheck_later(self: &Arc<Self>, run: &Run) {
        if !self.executor.rechecks.lock().insert(run.id.clone()) {
            return;
        }
        let holder = run.lease_owner.clone().unwrap_or_default();
        self.emit(EngineEvent::WakeDeferred { run_id: run.id.clone(), holder });
        let weak = Arc::downgrade(self);
        let id = run.id.clone();
        let mut lease_until = run.lease_until;
        tokio::spawn(async move {
            let Some(attempts) = weak.upgrade().map(|s| s.config.recheck_attempts) else { return };
            for _ in 0..attempts {
                let Some(wait) = weak.upgrade().map(|s| s.recheck_wait(lease_until)) else { return };
                tokio::time::sleep(wait).await;
                let Some(shared) = weak.upgrade() else { return };
                let mark = shared.mark();
                let run = match shared.store.get_run(&id).await {
                    Ok(Some(run)) if !run.status.is_terminal() => run,
                    _ => break,
                };
                let now = shared.clock.now();
                if !shared.holds_lease(&run) && run.lease_owner.is_some() && run.lease_until.is_some_and(|u| u >= now) {
                    lease_until = run.lease_until;
                    continue;
                }
                let due = match run.status {
                    RunStatus::Suspended => run.wake_at.is_some_and(|w| w <= now) || shared.claimed_here(&run),
                    _ => true,
                };
                if due {
                    tracing::debug!(run_id = %id, "re-check: the lease is free; waking the run");
                    shared.dispatch_as(id.clone(), Nudge::wake(mark));
                }
                break;
            }
            if let Some(shared) = weak.upgrade() {
                shared.executor.rechecks.lock().remove(&id);
            }
        });
    }

    /// Whether the run, as read from the store, is leased to this engine.
    fn holds_lease(&self, run: &Run) -> bool {
        run.lease_owner.as_deref() == Some(self.owner.as_str())
    }

    fn recheck_wait(&self, lease_until: Option<u64>) -> Duration {
        let remaining = lease_until.map_or(0, |u| u.saturating_sub(self.clock.now()));
        Duration::from_millis(remaining.saturating_add(1)).min(self.config.recheck_interval)
    }
}
