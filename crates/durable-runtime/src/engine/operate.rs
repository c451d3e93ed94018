//! Operating on runs: children, cancel (abandon or compensate), retry, retry with a new
//! input, delete.

use durable_core::protocol;
use durable_core::{CheckpointStatus, Run, RunId, RunPatch, RunStatus, StepError, StepKind, codes};
use serde::Serialize;

use super::{Engine, StartOptions, Started};
use crate::error::{Error, Result};
use crate::sched::Cancel;

impl Engine {
    /// The run's children, oldest first.
    pub async fn children(&self, id: &RunId) -> Result<Vec<Run>> {
        self.shared().children(id).await
    }

    /// Cancels an active run at once (its children too, recursively; its parent is told, as of
    /// a failed child). A turn executing it stops at once, on this engine or, through a shared
    /// control plane, on the engine executing it; on an engine that shares only the store, at
    /// its next write (a held sleep: its next read of the run). A terminal run is left as it
    /// is. Returns the run's status after the call.
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
    /// with it. A `dead` run (given up on by recovery) has no failed checkpoint: it resumes
    /// where it stopped, and a step it stopped between two attempts goes on with the attempts
    /// it had left (each failed attempt's count is recorded). Returns the run's status after
    /// the call.
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
        let mark = shared.mark();
        if !shared.store.update_run_if(id, &[RunStatus::Failed, RunStatus::Dead], patch).await? {
            let run = shared.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
            return Ok(run.status);
        }
        shared.queue_start(id.clone(), &run.namespace, run.priority, shared.clock.now(), mark);
        Ok(RunStatus::Pending)
    }

    /// Starts a new run `<id>~retry~<n>` of the same workflow (newest version), namespace and
    /// tags with a new input; the original run is left untouched.
    pub async fn retry_with_input<I: Serialize + ?Sized>(&self, id: &RunId, input: &I) -> Result<Started> {
        let shared = self.shared();
        let run = shared.store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
        for n in 1u32.. {
            let options = StartOptions {
                id: Some(protocol::retry_id(id, n).to_string()),
                namespace: Some(run.namespace.clone()),
                tags: run.tags.clone(),
                priority: run.priority,
                ..StartOptions::default()
            };
            let started = self.start(&run.workflow, input, options).await?;
            if started.created {
                return Ok(started);
            }
        }
        unreachable!("u32 ids run out only after 4 billion retries")
    }

    /// Deletes a run and its whole subtree (children, grandchildren, …) with their histories,
    /// waiters and state, and the results of their children buffered for them (a run started
    /// later with one of their ids waits for its own children). Returns how many runs were
    /// deleted (0: no such run).
    ///
    /// It deletes a run in any status, active ones too — there is no `--force` here: a turn
    /// executing the run stops when its next write finds the run gone, and its remote steps'
    /// late results are dropped. An active child run of an active parent is cancelled first
    /// (its error says it was deleted), so its parent is told, as of any cancel, instead of
    /// waiting forever for a child that no longer exists.
    /// To let a run compensate, cancel it first with
    /// [`cancel_with(id, Cancel::Compensate)`](Engine::cancel_with) and delete it once it
    /// settled; `durable runs delete` and the HTTP API refuse an active run unless told to
    /// force.
    pub async fn delete_run(&self, id: &RunId) -> Result<u64> {
        let shared = self.shared();
        let Some(run) = shared.store.get_run(id).await? else { return Ok(0) };
        let parent_active = match (&run.parent, run.status.is_terminal()) {
            (Some(p), false) => shared.store.get_run(&p.run_id).await?.is_some_and(|p| !p.status.is_terminal()),
            _ => false,
        };
        if parent_active {
            let error = StepError::fatal(format!("run {id} was deleted by an operator")).with_code(codes::CANCELLED);
            match shared.cancel_run(id, Cancel::Abandon, Some(error)).await {
                Ok(_) | Err(Error::RunNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let runs = shared.store.delete_run(id).await?;
        if runs > 0 {
            shared.emit(crate::EngineEvent::RunDeleted { run_id: id.clone(), runs });
        }
        Ok(runs)
    }
}
