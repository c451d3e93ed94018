//! Operating on runs: children, cancel (abandon or compensate), retry, retry with a new input,
//! delete, and following continue-as-new chains.

use durable_core::protocol::{self, ChildResult};
use durable_core::{
    CheckpointStatus, OutgoingSignal, Payload, Run, RunFilter, RunId, RunPatch, RunStatus, StepError, StepKind, codes,
};
use serde::Serialize;

use crate::engine::Shared;
use crate::error::{Error, Result};
use crate::events::EngineEvent;
use crate::{Engine, RunOutcome};

/// The signal a settling child run sends its parent (none for a run without a parent).
pub(crate) fn child_notice(
    run: &Run,
    status: RunStatus,
    output: Option<Payload>,
    error: Option<StepError>,
) -> Option<OutgoingSignal> {
    let parent = run.parent.as_ref()?;
    let result = ChildResult { run_id: run.id.clone(), status, output, error };
    Some(OutgoingSignal { token: protocol::child_token(&parent.run_id, parent.seq), payload: result.encode() })
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
                id: Some(protocol::retry_id(id, n).to_string()),
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
            match protocol::successor_of(&outcome.run) {
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
