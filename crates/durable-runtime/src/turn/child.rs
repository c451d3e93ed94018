//! Composition inside a body: child runs, continue-as-new, and the undos of a saga.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use durable_core::protocol;
use durable_core::{ChildCall, ChildJoin, Payload, RunId, RunStatus, StepError, StepKind};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ctx::{StepPlan, run_step};
use super::{CallGuard, TurnState, WorkflowCtx, halt};
use crate::error::WorkflowError;

/// Runs the registered undos newest first, each as a checkpointed step at the next seq. An
/// undo that fails after its retries is recorded as failed and skipped.
pub(crate) async fn compensate(t: Arc<TurnState>) {
    loop {
        let Some(undo) = t.turn.lock().next_undo() else { return };
        let Some(comp) = t.undos.lock().remove(&undo.step_seq) else {
            tracing::warn!(run_id = %t.run.id, seq = undo.step_seq, "an undo's closure is missing; it is skipped");
            continue;
        };
        let (seq, name) = (undo.seq, undo.name);
        if let Err(failed) = run_step(
            t.clone(),
            seq,
            StepPlan { name, kind: StepKind::Compensation, options: comp.options, queue: None },
            comp.body,
            None,
        )
        .await
        {
            tracing::warn!(run_id = %t.run.id, seq, "an undo failed and is skipped: {failed}");
        }
    }
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
    t: Arc<TurnState>,
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
        let _call = CallGuard::new(t, self.seq);
        let joined = t.turn.lock().join_child(self.seq, &self.workflow, t.now());
        match joined {
            ChildJoin::Completed(out) => match t.decode::<O>(self.seq, &self.workflow, &out) {
                Some(v) => Ok(v),
                None => halt().await,
            },
            ChildJoin::Failed { status, error } => Err(ChildFailed {
                run_id: t.run.id.clone(),
                seq: self.seq,
                child_id: self.child_id.clone(),
                workflow: self.workflow.clone(),
                status,
                error,
            }),
            ChildJoin::Park | ChildJoin::Stopped => halt().await,
        }
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
            None => protocol::child_id(&t.run.id, seq),
        };
        let handle = ChildHandle {
            t: t.clone(),
            seq,
            child_id: child_id.clone(),
            workflow: workflow.to_string(),
            _out: PhantomData,
        };
        let now = t.now();
        let input = Payload::encode(input).map_err(|e| e.to_string());
        let admission = t.key_request(workflow, &child_id, &input, now);
        let call = ChildCall { workflow, id: child_id, version: t.env.latest_version(workflow), input, admission };
        t.turn.lock().spawn_child(seq, call, now);
        handle
    }

    /// Ends this run and continues as a fresh run `<id>~N` of the same workflow with `input`:
    /// this run completes, the successor starts with an empty history (same namespace, tags,
    /// priority and parent). Callers waiting with [`Engine::wait_for_run_following`](crate::Engine::wait_for_run_following) — and a
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
        let input = Payload::encode(input).map_err(|e| e.to_string());
        // The successor's key (same workflow): it takes over this run's slot.
        let admission = t.key_request(&t.run.workflow, &protocol::successor_id(&t.run.id), &input, t.now());
        async move {
            t.turn.lock().continue_as_new(input, admission);
            halt().await
        }
    }
}
