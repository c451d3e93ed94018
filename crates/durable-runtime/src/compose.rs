//! Composition: child runs, sagas (compensation), continue-as-new, cancellation and the
//! operator's retry and delete.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use durable_core::{
    CheckpointStatus, Decision, NewRun, OutgoingSignal, ParentLink, Payload, Run, RunFilter, RunId, RunPatch,
    RunStatus, StepError, StepKind, TurnStop, WaitKind, Waiter, codes,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ctx::{StepBody, TurnShared, corrupt, halt, park, run_step};
use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::events::EngineEvent;
use crate::{Engine, RunOutcome, StepOptions, WorkflowCtx, WorkflowError};

/// An undo registered by a completed step.
pub(crate) struct Compensation {
    pub(crate) name: String,
    pub(crate) options: StepOptions,
    pub(crate) body: StepBody<'static, ()>,
}

/// Runs the registered undos newest first, each as a checkpointed step at the next seq. An
/// undo that fails after its retries is recorded as failed and skipped.
pub(crate) async fn compensate(t: Arc<TurnShared>) {
    loop {
        let next = t.compensations.lock().pop();
        let Some(undo) = next else { return };
        let seq = t.take_seq();
        let name = format!("undo:{}", undo.name);
        if let Err(failed) = run_step(t.clone(), seq, name, StepKind::Compensation, undo.options, undo.body, None).await
        {
            tracing::warn!(run_id = %t.run.id, seq, "an undo failed and is skipped: {failed}");
        }
    }
}

/// What a child run tells its parent when it settles.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildResult {
    run_id: RunId,
    status: RunStatus,
    output: Option<Payload>,
    error: Option<StepError>,
}

/// The token a child's result is sent to: the parent's wait at the child's seq.
fn child_token(parent: &ParentLink) -> String {
    format!("child:{}:{}", parent.run_id, parent.seq)
}

/// The signal a settling child run sends its parent (none for a run without a parent).
pub(crate) fn child_notice(
    run: &Run,
    status: RunStatus,
    output: Option<Payload>,
    error: Option<StepError>,
) -> Option<OutgoingSignal> {
    let parent = run.parent.as_ref()?;
    let result = ChildResult { run_id: run.id.clone(), status, output, error };
    Some(OutgoingSignal {
        token: child_token(parent),
        payload: Payload::encode(&result).expect("a child result serializes"),
    })
}

const CONTINUED_AS_NEW: &str = "$continued_as_new";

/// The output of a run that continued as new: names its successor.
pub(crate) fn continued_marker(successor: &RunId) -> Payload {
    Payload::encode(&serde_json::json!({ CONTINUED_AS_NEW: successor })).expect("a marker serializes")
}

/// The successor named by a continued run's output.
fn successor_of(run: &Run) -> Option<RunId> {
    if run.status != RunStatus::Completed {
        return None;
    }
    let value = run.output.as_ref()?.to_value();
    value.get(CONTINUED_AS_NEW)?.as_str().map(RunId::from)
}

/// A child run that did not complete: it failed, was cancelled or died. The parent always
/// hears of it; it never waits forever.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildFailed {
    /// The parent.
    pub run_id: RunId,
    /// The parent's seq for the child.
    pub seq: u32,
    /// The child run.
    pub child_id: RunId,
    /// The child's workflow.
    pub workflow: String,
    /// How the child ended.
    pub status: RunStatus,
    /// The child's error.
    pub error: Option<StepError>,
}

impl fmt::Display for ChildFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "child run {} ({:?}, seq {} of run {}) is {}",
            self.child_id, self.workflow, self.seq, self.run_id, self.status
        )?;
        if let Some(e) = &self.error {
            write!(f, ": {}", e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ChildFailed {}

/// Options of [`WorkflowCtx::child_with`] and [`WorkflowCtx::spawn_child_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct ChildOptions {
    /// The child's run id (default `<parent>.child.<seq>`). Starting is idempotent by id.
    pub id: Option<String>,
}

impl ChildOptions {
    /// Options with this child id.
    pub fn id(id: impl Into<String>) -> Self {
        ChildOptions { id: Some(id.into()) }
    }
}

/// A started child run. [`ChildHandle::join`] waits for its outcome.
#[must_use = "join the handle to receive the child's outcome"]
pub struct ChildHandle<O> {
    t: Arc<TurnShared>,
    seq: u32,
    child_id: RunId,
    workflow: String,
    _out: PhantomData<fn() -> O>,
}

impl<O> fmt::Debug for ChildHandle<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildHandle").field("child_id", &self.child_id).field("seq", &self.seq).finish()
    }
}

impl<O: DeserializeOwned + Send + 'static> ChildHandle<O> {
    /// The child's run id.
    pub fn id(&self) -> &RunId {
        &self.child_id
    }

    /// Waits until the child settles: its output, or [`ChildFailed`].
    pub async fn join(self) -> Result<O, ChildFailed> {
        let t = &self.t;
        let failed = |status, error| ChildFailed {
            run_id: t.run.id.clone(),
            seq: self.seq,
            child_id: self.child_id.clone(),
            workflow: self.workflow.clone(),
            status,
            error,
        };
        match t.begin(self.seq, &self.workflow, StepKind::Child) {
            None => halt().await,
            Some(Decision::Wait { .. }) => park(t, self.seq, None).await,
            Some(Decision::ReplayError { error, .. }) => {
                let status = error.code().and_then(|c| c.strip_prefix("child_")).and_then(|s| s.parse().ok());
                Err(failed(status.unwrap_or(RunStatus::Failed), Some(error)))
            }
            Some(Decision::Replay(p)) => {
                let Some(result) = t.decode::<ChildResult>(self.seq, &self.workflow, &p) else {
                    return halt().await;
                };
                if result.status == RunStatus::Completed {
                    let out = result.output.unwrap_or_else(Payload::null);
                    match t.decode::<O>(self.seq, &self.workflow, &out) {
                        Some(v) => Ok(v),
                        None => halt().await,
                    }
                } else {
                    record_child_failure(t, self.seq, &result);
                    Err(failed(result.status, result.error))
                }
            }
            Some(other) => corrupt(t, self.seq, &self.workflow, &other).await,
        }
    }
}

/// Re-records a delivered child failure as a `failed` checkpoint, so an operator's retry of
/// the parent re-runs the child call (rides along with the next commit).
fn record_child_failure(t: &TurnShared, seq: u32, result: &ChildResult) {
    let recorded = t.turn.lock().history().get(seq).cloned();
    if let Some(mut cp) = recorded.filter(|c| c.status == CheckpointStatus::Completed) {
        let message = result
            .error
            .as_ref()
            .map_or_else(|| format!("child run {} is {}", result.run_id, result.status), |e| e.message.clone());
        cp.status = CheckpointStatus::Failed;
        cp.error = Some(StepError::fatal(message).with_code(format!("child_{}", result.status)));
        cp.updated_at = t.now();
        t.record(cp);
    }
}

impl WorkflowCtx {
    /// Starts a child run of `workflow` (newest version) and waits for its output. The child's
    /// id is `<run>.child.<seq>`; it inherits the namespace and priority; starting is
    /// idempotent. 1 seq.
    pub fn child<I: Serialize + ?Sized, O: DeserializeOwned + Send + 'static>(
        &self,
        workflow: &str,
        input: &I,
    ) -> impl Future<Output = Result<O, ChildFailed>> + Send + 'static + use<I, O> {
        self.spawn_child(workflow, input).join()
    }

    /// [`WorkflowCtx::child`] with options (an explicit child id).
    pub fn child_with<I: Serialize + ?Sized, O: DeserializeOwned + Send + 'static>(
        &self,
        workflow: &str,
        input: &I,
        options: ChildOptions,
    ) -> impl Future<Output = Result<O, ChildFailed>> + Send + 'static + use<I, O> {
        self.spawn_child_with(workflow, input, options).join()
    }

    /// Starts a child run without waiting for it; [`ChildHandle::join`] waits later. The child
    /// is created by the parent's next commit. 1 seq.
    pub fn spawn_child<I: Serialize + ?Sized, O>(&self, workflow: &str, input: &I) -> ChildHandle<O> {
        self.spawn_child_with(workflow, input, ChildOptions::default())
    }

    /// [`WorkflowCtx::spawn_child`] with options.
    pub fn spawn_child_with<I: Serialize + ?Sized, O>(
        &self,
        workflow: &str,
        input: &I,
        options: ChildOptions,
    ) -> ChildHandle<O> {
        let t = &self.t;
        let seq = t.take_seq();
        let child_id = match options.id {
            Some(id) => RunId::new(id),
            None => t.run.id.child(seq),
        };
        let handle = ChildHandle {
            t: t.clone(),
            seq,
            child_id: child_id.clone(),
            workflow: workflow.to_string(),
            _out: PhantomData,
        };
        if let Some(Decision::Execute { .. }) = t.begin(seq, workflow, StepKind::Child) {
            start_child(t, seq, workflow, child_id, Payload::encode(input));
        }
        handle
    }

    /// Ends this run and continues as a fresh run `<id>~N` of the same workflow with `input`:
    /// this run completes, the successor starts with an empty history (same namespace, tags,
    /// priority and parent). Callers waiting with [`Engine::wait_for_run_following`] — and a
    /// parent waiting on this run as a child — get the final run's outcome.
    ///
    /// ```no_run
    /// # use durable_runtime::{WorkflowCtx, WorkflowError};
    /// async fn counter(ctx: WorkflowCtx, n: u32) -> Result<u32, WorkflowError> {
    ///     if n < 100 {
    ///         return ctx.continue_as_new(&(n + 1)).await;
    ///     }
    ///     Ok(n)
    /// }
    /// ```
    pub fn continue_as_new<I: Serialize + ?Sized, O>(
        &self,
        input: &I,
    ) -> impl Future<Output = Result<O, WorkflowError>> + Send + 'static + use<I, O> {
        let t = self.t.clone();
        let input = Payload::encode(input);
        async move {
            let stop = match input {
                Ok(p) => TurnStop::ContinueAsNew(p),
                Err(e) => TurnStop::Fail(
                    StepError::fatal(format!("run {}: the continue-as-new input does not serialize: {e}", t.run.id))
                        .with_code(codes::BAD_PAYLOAD),
                ),
            };
            t.stop(stop);
            halt().await
        }
    }
}

/// Records the child call, registers the parent's wait for the child's result, and queues the
/// child's creation — all written by the parent's next commit.
fn start_child(t: &Arc<TurnShared>, seq: u32, workflow: &str, child_id: RunId, input: serde_json::Result<Payload>) {
    let now = t.now();
    let mut cp = t.checkpoint(seq, workflow, StepKind::Child, CheckpointStatus::Waiting, now);
    cp.input = Some(Payload::encode(&child_id).expect("an id serializes"));
    let version = t.engine.registry.latest(workflow).map(|(v, _)| v);
    let (version, input) = match (version, input) {
        (Some(v), Ok(input)) => (v, input),
        (None, _) | (_, Err(_)) => {
            let reason = match version {
                None => format!("workflow {workflow:?} is not registered on the engine that started the child"),
                Some(_) => "the child's input does not serialize".to_string(),
            };
            cp.status = CheckpointStatus::Failed;
            cp.error = Some(
                StepError::fatal(format!("child run {child_id} was not started: {reason}")).with_code("child_failed"),
            );
            t.record(cp);
            return;
        }
    };
    t.record(cp);
    let parent = ParentLink { run_id: t.run.id.clone(), seq };
    let mut turn = t.turn.lock();
    turn.add_wait(Waiter {
        run_id: t.run.id.clone(),
        seq,
        name: workflow.to_string(),
        kind: WaitKind::Signal { token: child_token(&parent) },
        created_at: now,
    });
    turn.add_child(NewRun {
        id: child_id,
        workflow: workflow.to_string(),
        version,
        namespace: t.run.namespace.clone(),
        input,
        tags: Vec::new(),
        priority: t.run.priority,
        parent: Some(parent),
        created_at: now,
    });
}

/// How [`Engine::cancel_with`] cancels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cancel {
    /// Stop the run at once (`cancelled`); no undos run.
    #[default]
    Abandon,
    /// Run the run's registered undos (newest first, each checkpointed), then settle it
    /// `cancelled`.
    Compensate,
}

impl Engine {
    /// The run's children, oldest first.
    pub async fn children(&self, id: &RunId) -> Result<Vec<Run>> {
        self.shared().children(id).await
    }

    /// Cancels an active run at once (its children too, recursively; its parent is told, as of
    /// a failed child). A turn executing it stops at its next commit. A terminal run is left as
    /// it is. Returns the run's status after the call.
    pub async fn cancel(&self, id: &RunId) -> Result<RunStatus> {
        self.cancel_with(id, Cancel::Abandon).await
    }

    /// Cancels an active run, abandoning it or running its undos first (see [`Cancel`]).
    pub async fn cancel_with(&self, id: &RunId, how: Cancel) -> Result<RunStatus> {
        self.shared().cancel_run(id, how, None).await
    }

    /// Retries a `failed` or `dead` run: it goes back to `pending` and resumes from its first
    /// failed checkpoint — that step and everything after it run again (with fresh attempts);
    /// the completed steps before it are kept. Failed children behind that point are retried
    /// with it. Returns the run's status after the call.
    pub async fn retry(&self, id: &RunId) -> Result<RunStatus> {
        let shared = self.shared();
        let run = shared.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
        if !matches!(run.status, RunStatus::Failed | RunStatus::Dead) {
            return Err(Error::NotRetryable { id: id.clone(), status: run.status });
        }
        let history = shared.store.history(id).await?;
        if history.iter().any(|c| c.kind == StepKind::Compensation) {
            return Err(Error::Compensated { id: id.clone() });
        }
        let from = history.iter().find(|c| c.status == CheckpointStatus::Failed).map(|c| c.seq);
        for cp in history.iter().filter(|c| c.kind == StepKind::Child && from.is_some_and(|f| c.seq >= f)) {
            let Some(child) = cp.input.as_ref().and_then(|p| p.decode::<RunId>().ok()) else { continue };
            if let Some(c) = shared.store.get_run(&child).await?
                && matches!(c.status, RunStatus::Failed | RunStatus::Dead)
            {
                Box::pin(self.retry(&child)).await?;
            }
        }
        let patch = RunPatch {
            status: Some(RunStatus::Pending),
            error: Some(None),
            output: Some(None),
            wake_at: Some(None),
            release_lease: true,
            reset_recovery: true,
            truncate_history_from: from,
            now: shared.clock.now(),
            ..Default::default()
        };
        if !shared.store.update_run_if(id, &[RunStatus::Failed, RunStatus::Dead], patch).await? {
            let run = shared.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
            return Ok(run.status);
        }
        shared.queue_start(id.clone(), &run.namespace, run.priority, shared.clock.now());
        Ok(RunStatus::Pending)
    }

    /// Starts a new run `<id>~retry~<n>` of the same workflow (newest version), namespace and
    /// tags with a new input; the original run is left untouched.
    pub async fn retry_with_input<I: Serialize + ?Sized>(&self, id: &RunId, input: &I) -> Result<crate::Started> {
        let shared = self.shared();
        let run = shared.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
        for n in 1u32.. {
            let options = crate::StartOptions {
                id: Some(format!("{id}~retry~{n}")),
                namespace: Some(run.namespace.clone()),
                tags: run.tags.clone(),
                priority: run.priority,
            };
            let started = self.start(&run.workflow, input, options).await?;
            if started.created {
                return Ok(started);
            }
        }
        unreachable!("u32 ids run out only after 4 billion retries")
    }

    /// Deletes a run and its whole subtree (children, grandchildren, …) with their histories,
    /// waiters and state. Returns how many runs were deleted (0: no such run).
    pub async fn delete_run(&self, id: &RunId) -> Result<u64> {
        Ok(self.shared().store.delete_run(id).await?)
    }

    /// [`Engine::wait_for_run`] that follows continue-as-new chains to the final run's outcome.
    pub async fn wait_for_run_following(&self, id: &RunId) -> Result<RunOutcome> {
        let mut id = id.clone();
        loop {
            let outcome = self.wait_for_run(&id).await?;
            match successor_of(&outcome.run) {
                Some(next) => id = next,
                None => return Ok(outcome),
            }
        }
    }
}

impl Shared {
    /// Every child of a run, oldest first.
    pub(crate) async fn children(&self, id: &RunId) -> Result<Vec<Run>> {
        let mut filter = RunFilter { parent: Some(id.clone()), limit: 500, ..Default::default() };
        let mut out = Vec::new();
        loop {
            let page = self.store.list_runs(&filter).await?;
            out.extend(page.runs);
            match page.next_cursor {
                Some(c) => filter.cursor = Some(c),
                None => break,
            }
        }
        out.reverse();
        Ok(out)
    }

    /// Cancels an active run (and its active children, recursively). `error` overrides the
    /// recorded error of an abandoning cancel (an execution timeout sets its own).
    pub(crate) async fn cancel_run(&self, id: &RunId, how: Cancel, error: Option<StepError>) -> Result<RunStatus> {
        let run = self.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
        if run.status.is_terminal() {
            return Ok(run.status);
        }
        let now = self.clock.now();
        let (patch, status) = match how {
            Cancel::Abandon => {
                let error = error.unwrap_or_else(|| {
                    StepError::fatal(format!("run {id} was cancelled by an operator")).with_code(codes::CANCELLED)
                });
                let notice = child_notice(&run, RunStatus::Cancelled, None, Some(error.clone()));
                let patch = RunPatch {
                    status: Some(RunStatus::Cancelled),
                    error: Some(Some(error)),
                    wake_at: Some(None),
                    release_lease: true,
                    signals: notice.into_iter().collect(),
                    now,
                    ..Default::default()
                };
                (patch, RunStatus::Cancelled)
            }
            Cancel::Compensate => {
                let marker = StepError::fatal(format!("run {id}: cancel requested; running its undos"))
                    .with_code(codes::CANCEL_REQUESTED);
                (RunPatch { error: Some(Some(marker)), wake: true, now, ..Default::default() }, run.status)
            }
        };
        if !self.store.update_run_if(id, &RunStatus::ACTIVE, patch).await? {
            // It settled meanwhile.
            let run = self.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
            return Ok(run.status);
        }
        if status == RunStatus::Cancelled {
            self.emit(EngineEvent::RunSettled { run_id: id.clone(), status });
            self.notify_run(id);
            if let Some(parent) = &run.parent {
                self.wake(parent.run_id.clone());
            }
        } else {
            self.wake(id.clone());
        }
        for child in self.children(id).await? {
            if !child.status.is_terminal() {
                Box::pin(self.cancel_run(&child.id, how, None)).await?;
            }
        }
        Ok(status)
    }
}
