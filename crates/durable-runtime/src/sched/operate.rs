//! Operating on runs from inside the engine: listing children, cancelling (abandon or
//! compensate) a run and its subtree, and the notice a settling child sends its parent.

use durable_core::protocol;
use durable_core::{Run, RunFilter, RunId, RunPatch, RunStatus, StepError, codes};

use super::Shared;
use crate::error::{Error, Result};
use crate::events::EngineEvent;

/// How [`Engine::cancel_with`](crate::Engine::cancel_with) cancels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cancel {
    /// Stop the run at once (`cancelled`); no undos run.
    #[default]
    Abandon,
    /// Run the run's registered undos (newest first, each checkpointed), then settle it
    /// `cancelled`.
    Compensate,
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
        self.cancel_run_from(id, how, error, &RunStatus::ACTIVE).await
    }

    /// [`Shared::cancel_run`] of a run whose status is one of `from` (checked in the write);
    /// a run in any other status is left alone and its status returned.
    pub(crate) async fn cancel_run_from(
        &self,
        id: &RunId,
        how: Cancel,
        error: Option<StepError>,
        from: &[RunStatus],
    ) -> Result<RunStatus> {
        let run = self.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
        if !from.contains(&run.status) {
            return Ok(run.status);
        }
        let now = self.clock.now();
        let timed_out = error.as_ref().is_some_and(|e| e.code() == Some(codes::EXECUTION_TIMEOUT));
        let (patch, status) = match how {
            Cancel::Abandon => {
                let error = error.unwrap_or_else(|| {
                    StepError::fatal(format!("run {id} was cancelled by an operator")).with_code(codes::CANCELLED)
                });
                let notice = protocol::child_notice(&run, RunStatus::Cancelled, None, Some(error.clone()));
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
        let mark = self.mark();
        if !self.store.update_run_if(id, from, patch).await? {
            // It settled meanwhile.
            let run = self.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
            return Ok(run.status);
        }
        // A turn of the run stops at once — here, and, through the control plane, on the
        // engine executing it — instead of at its next commit (or, with compensation, its next
        // suspend): the run is claimed again and what follows is decided on what the store
        // holds now.
        self.interrupt_turn(id, format!("run {id} was cancelled by an operator"));
        self.publish_cancel(id).await;
        if status == RunStatus::Cancelled {
            crate::metrics::run_settled(&run.workflow, status, timed_out);
            self.emit(EngineEvent::RunSettled { run_id: id.clone(), status });
            self.notify_run(id);
            // Its admission slots went to waiting runs, made due by the store: look now.
            self.poll_now();
            if let Some(parent) = &run.parent {
                self.wake(parent.run_id.clone(), mark);
            }
        } else {
            self.wake_in(id.clone(), &run.namespace, mark);
        }
        for child in self.children(id).await? {
            if !child.status.is_terminal() {
                Box::pin(self.cancel_run(&child.id, how, None)).await?;
            }
        }
        Ok(status)
    }
}
