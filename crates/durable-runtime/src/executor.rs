//! The turn executor: claims a run, polls its body until it finishes or every branch is
//! parked, and applies the turn's end to the store — one place owns a run's turn.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use durable_core::{
    Checkpoint, Claim, ClaimOutcome, Commit, CommitOutcome, Delivery, History, Millis, NewRun, Payload, Run, RunId,
    RunPatch, RunStatus, StepError, StoreError, StoreErrorKind, StoreResult, TurnEnd, TurnStop, codes,
};
use tracing::Instrument;

use crate::clock::BoxFuture;
use crate::compose::{child_notice, compensate, continued_marker};
use crate::ctx::{TurnShared, WorkflowCtx, panic_message};
use crate::engine::Shared;
use crate::events::EngineEvent;
use crate::registry::{BodyResult, ErasedWorkflow};

/// How a body's polling ended.
enum TurnResult {
    Finished(BodyResult),
    Panicked(String),
    Stopped(TurnStop),
    /// The undos ran after a failure (`Some(error)`) or a cancel request (`None`).
    Compensated(Option<StepError>),
    /// Every live branch is parked: the suspension commit, computed before the body is dropped.
    Parked(Box<Commit>),
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

/// Polls the body; when it fails (or a cancel with compensation finds it parked) and undos
/// are registered, polls the compensation instead.
struct TurnDriver {
    body: Option<BoxFuture<'static, BodyResult>>,
    compensation: Option<(BoxFuture<'static, ()>, Option<StepError>)>,
    t: Arc<TurnShared>,
}

impl TurnDriver {
    fn start_compensating(&mut self, error: Option<StepError>) {
        self.body = None;
        self.t.compensating.store(true, Ordering::Relaxed);
        self.compensation = Some((Box::pin(compensate(self.t.clone())), error));
    }
}

impl Future for TurnDriver {
    type Output = TurnResult;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TurnResult> {
        loop {
            let this = &mut *self;
            let polled = match (&mut this.compensation, &mut this.body) {
                (Some((fut, _)), _) => {
                    std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx).map(|()| None)))
                }
                (None, Some(body)) => std::panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(cx).map(Some))),
                (None, None) => unreachable!("a driver always has a body or a compensation"),
            };
            let now = this.t.now();
            let cancel_requested = this.t.cancel_requested && !this.t.compensating.load(Ordering::Relaxed);
            let mut turn = this.t.turn.lock();
            if let Some(stop) = turn.stopped() {
                return Poll::Ready(TurnResult::Stopped(stop.clone()));
            }
            match polled {
                Err(panic) => return Poll::Ready(TurnResult::Panicked(panic_message(panic.as_ref()))),
                // The compensation finished.
                Ok(Poll::Ready(None)) => {
                    let error = this.compensation.take().and_then(|(_, e)| e);
                    return Poll::Ready(TurnResult::Compensated(error));
                }
                Ok(Poll::Ready(Some(Err(e)))) if this.t.has_compensations() || cancel_requested => {
                    drop(turn);
                    let error = if cancel_requested { None } else { Some(e.to_step_error()) };
                    this.start_compensating(error);
                }
                Ok(Poll::Ready(Some(r))) => return Poll::Ready(TurnResult::Finished(r)),
                Ok(Poll::Pending) if turn.is_parked() && cancel_requested => {
                    drop(turn);
                    this.start_compensating(None);
                }
                Ok(Poll::Pending) if turn.is_parked() => {
                    return Poll::Ready(TurnResult::Parked(Box::new(turn.suspend_commit(now))));
                }
                Ok(Poll::Pending) => return Poll::Pending,
            }
        }
    }
}

impl Shared {
    /// Applies a commit and releases its effects: created children and runs that received a
    /// signal are dispatched (only after the store acknowledged the commit).
    pub(crate) async fn apply_commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        let children: Vec<(RunId, String, i32, u64)> =
            commit.children.iter().map(|c| (c.id.clone(), c.namespace.clone(), c.priority, c.created_at)).collect();
        let outcome = self.store.commit(commit).await?;
        for (id, namespace, priority, created_at) in children {
            self.queue_start(id, &namespace, priority, created_at);
        }
        self.wake_delivered(&outcome.deliveries);
        Ok(outcome)
    }

    /// Wakes the runs that received a delivery.
    pub(crate) fn wake_delivered(&self, deliveries: &[Delivery]) {
        for d in deliveries {
            if let Delivery::Delivered { run_id, .. } = d {
                self.wake(run_id.clone());
            }
        }
    }

    /// Runs turns of `id` until it settles, suspends or belongs to someone else.
    pub(crate) async fn drive_run(self: &Arc<Self>, id: &RunId) {
        loop {
            let now = self.clock.now();
            let claim =
                Claim { run_id: id.clone(), owner: self.owner.clone(), lease_until: now + self.lease_ms(), now };
            let (run, history, previous, recovered) = match self.store.claim_run(claim).await {
                Ok(ClaimOutcome::Acquired { run, history, previous, recovered }) => (run, history, previous, recovered),
                Ok(ClaimOutcome::NotFound) => return,
                Ok(ClaimOutcome::Terminal(_)) => return self.notify_run(id),
                Ok(ClaimOutcome::Busy(run)) => return self.recheck_later(&run),
                Err(e) => return self.retry_after_store_error(id, &e),
            };
            if recovered && run.recovery_attempts > self.config.max_recovery_attempts {
                return self.bury(&run).await;
            }
            if !self.serves(&run.namespace) {
                // A wake reached an engine of another pool: leave the run to its own.
                return self.hand_back(&run, previous).await;
            }
            let Some(handler) = self.registry.get(&run.workflow, run.version) else {
                self.warn_unregistered(&run);
                return self.hand_back(&run, previous).await;
            };
            self.emit(EngineEvent::TurnStarted { run_id: id.clone(), recovered });
            let span = tracing::info_span!("turn", run_id = %id, workflow = %run.workflow, version = run.version);
            match self.execute_turn(run, history, handler).instrument(span).await {
                TurnEnded::Again => continue,
                TurnEnded::Done => {
                    self.store_failures.lock().remove(id);
                    return;
                }
                TurnEnded::StoreFailed(e) => return self.retry_after_store_error(id, &e),
            }
        }
    }

    async fn execute_turn(
        self: &Arc<Self>,
        run: Run,
        history: Vec<Checkpoint>,
        handler: Arc<dyn ErasedWorkflow>,
    ) -> TurnEnded {
        self.metrics.turns.fetch_add(1, Ordering::Relaxed);
        let id = run.id.clone();
        let input = run.input.clone();
        let t = Arc::new(TurnShared::new(run, self.owner.clone(), History::new(history), self.clone()));
        let body = match handler.call(WorkflowCtx { t: t.clone() }, &input) {
            Ok(body) => body,
            Err(e) => {
                let error = StepError::fatal(format!(
                    "run {id}: its input does not decode into the input type of workflow {:?} v{}: {e}",
                    t.run.workflow, t.run.version
                ))
                .with_code(codes::BAD_PAYLOAD);
                return self.settle(&t, RunStatus::Failed, None, Some(error)).await;
            }
        };
        let driver = TurnDriver { body: Some(body), compensation: None, t: t.clone() };
        let result = tokio::select! {
            r = driver => r,
            () = self.keep_lease(&id) => {
                t.lease_lost.store(true, Ordering::Relaxed);
                TurnResult::Stopped(TurnStop::Abort("the lease could not be renewed".into()))
            }
        };
        match result {
            TurnResult::Finished(Ok(output)) => self.settle(&t, RunStatus::Completed, Some(output), None).await,
            TurnResult::Finished(Err(e)) => self.settle(&t, RunStatus::Failed, None, Some(e.to_step_error())).await,
            TurnResult::Compensated(Some(error)) => self.settle(&t, RunStatus::Failed, None, Some(error)).await,
            TurnResult::Compensated(None) => {
                let error = StepError::fatal(format!("run {id} was cancelled by an operator; its undos ran"))
                    .with_code(codes::CANCELLED);
                self.settle(&t, RunStatus::Cancelled, None, Some(error)).await
            }
            TurnResult::Panicked(msg) => {
                tracing::error!(run_id = %id, "workflow body panicked: {msg}");
                let error =
                    StepError::fatal(format!("run {id}: the workflow body panicked: {msg}")).with_code(codes::PANIC);
                self.settle(&t, RunStatus::Failed, None, Some(error)).await
            }
            TurnResult::Stopped(TurnStop::Fail(error)) => self.settle(&t, RunStatus::Failed, None, Some(error)).await,
            TurnResult::Stopped(TurnStop::ContinueAsNew(input)) => self.continue_as_new(&t, input).await,
            TurnResult::Stopped(TurnStop::Abort(why)) => {
                if t.rerun.load(Ordering::Relaxed) {
                    tracing::debug!(run_id = %id, "turn restarted: {why}");
                    TurnEnded::Again
                } else if t.lease_lost.load(Ordering::Relaxed) {
                    tracing::info!(run_id = %id, "turn stopped: {why}; the run belongs to another owner now");
                    TurnEnded::Done
                } else {
                    TurnEnded::StoreFailed(StoreError::unavailable(why))
                }
            }
            TurnResult::Parked(commit) => self.suspend(&t, *commit).await,
        }
    }

    /// Settles the run; a child run tells its parent in the same commit.
    async fn settle(
        &self,
        t: &TurnShared,
        status: RunStatus,
        output: Option<Payload>,
        error: Option<StepError>,
    ) -> TurnEnded {
        let notice = child_notice(&t.run, status, output.clone(), error.clone());
        let mut commit = t.turn.lock().settle_commit(self.clock.now(), status, output, error);
        commit.signals.extend(notice);
        self.finish(t, commit, status).await
    }

    /// Completes the run with a marker naming its successor, and creates the successor — same
    /// workflow (newest version), namespace, tags, priority and parent — in the same commit.
    async fn continue_as_new(&self, t: &TurnShared, input: Payload) -> TurnEnded {
        let run = &t.run;
        let (_, position) = run.id.chain_position();
        let successor = run.id.successor(position + 1);
        let version = self.registry.latest(&run.workflow).map_or(run.version, |(v, _)| v);
        let now = self.clock.now();
        let mut commit =
            t.turn.lock().settle_commit(now, RunStatus::Completed, Some(continued_marker(&successor)), None);
        commit.children.push(NewRun {
            id: successor.clone(),
            workflow: run.workflow.clone(),
            version,
            namespace: run.namespace.clone(),
            input,
            tags: run.tags.clone(),
            priority: run.priority,
            parent: run.parent.clone(),
            created_at: now,
        });
        tracing::info!(run_id = %run.id, successor = %successor, "continued as new");
        self.finish(t, commit, RunStatus::Completed).await
    }

    async fn finish(&self, t: &TurnShared, commit: Commit, status: RunStatus) -> TurnEnded {
        match self.apply_commit(commit).await {
            Ok(outcome) => {
                if outcome.settled {
                    self.emit(EngineEvent::RunSettled { run_id: t.run.id.clone(), status });
                }
                self.notify_run(&t.run.id);
                TurnEnded::Done
            }
            Err(e) => self.commit_failed(&t.run.id, &e),
        }
    }

    async fn suspend(&self, t: &TurnShared, commit: Commit) -> TurnEnded {
        let wake_at = match &commit.end {
            Some(TurnEnd::Suspend { wake_at, .. }) => *wake_at,
            _ => None,
        };
        match self.apply_commit(commit).await {
            Ok(outcome) if outcome.woken => TurnEnded::Again,
            Ok(_) => {
                self.emit(EngineEvent::RunSuspended { run_id: t.run.id.clone(), wake_at });
                if let Some(at) = wake_at {
                    self.timers.schedule(at, t.run.id.clone());
                }
                self.notify_run(&t.run.id);
                TurnEnded::Done
            }
            Err(e) => self.commit_failed(&t.run.id, &e),
        }
    }

    fn commit_failed(&self, id: &RunId, e: &StoreError) -> TurnEnded {
        if e.kind() == StoreErrorKind::LeaseLost {
            tracing::info!(run_id = %id, "turn end refused: {e}");
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
        commit.signals.extend(child_notice(run, RunStatus::Dead, None, Some(error.clone())));
        commit.end = Some(TurnEnd::Settle { status: RunStatus::Dead, output: None, error: Some(error) });
        match self.apply_commit(commit).await {
            Ok(outcome) if outcome.settled => {
                tracing::error!(run_id = %run.id, "run is dead after {} recoveries", run.recovery_attempts);
                self.emit(EngineEvent::RunSettled { run_id: run.id.clone(), status: RunStatus::Dead });
                self.notify_run(&run.id);
                let listeners = self.dead_listeners.read().clone();
                if !listeners.is_empty() {
                    let dead = self.store.get_run(&run.id).await.ok().flatten().unwrap_or_else(|| run.clone());
                    for listener in listeners {
                        listener(&dead);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => self.retry_after_store_error(&run.id, &e),
        }
    }

    fn warn_unregistered(&self, run: &Run) {
        if self.warned_versions.lock().insert(run.id.clone()) {
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
    async fn keep_lease(&self, id: &RunId) {
        let ttl = self.config.lease_ttl;
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(ttl / 2).await;
            match self.store.renew_lease(id, &self.owner, self.clock.now() + self.lease_ms()).await {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => {
                    tracing::warn!(run_id = %id, "lease lost to another owner; the turn stops");
                    return;
                }
                Err(e) => {
                    tracing::warn!(run_id = %id, error = %e, "lease renewal failed");
                    if last_ok.elapsed() >= ttl {
                        return;
                    }
                }
            }
        }
    }

    pub(crate) fn lease_ms(&self) -> Millis {
        self.config.lease_ttl.as_millis() as Millis
    }

    /// Dispatches the run again after a backoff that doubles with consecutive failures.
    fn retry_after_store_error(self: &Arc<Self>, id: &RunId, e: &StoreError) {
        let failures = {
            let mut failures = self.store_failures.lock();
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
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(shared) = shared.upgrade() {
                shared.dispatch(id);
            }
        });
    }
}
