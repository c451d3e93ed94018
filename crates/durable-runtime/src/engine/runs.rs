//! Starting and observing runs: start, read, list, history, and waiting for a run to settle.

use std::time::Duration;

use durable_core::protocol;
use durable_core::{Checkpoint, NewRun, Payload, Run, RunFilter, RunId, RunPage, StepError};
use serde::Serialize;

use super::{Engine, RunOutcome, StartOptions, Started};
use crate::error::{Error, Result};
use crate::events::EngineEvent;

impl Engine {
    fn check_size(&self, what: impl FnOnce() -> String, payload: &Payload) -> Result<()> {
        let limit = self.inner.shared.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge { what: what(), size: payload.len(), limit });
        }
        Ok(())
    }

    /// Starts a run of the newest version of `workflow`: validates and persists it `pending`,
    /// dispatches it, and returns at once. Idempotent on the id.
    pub async fn start<I: Serialize + ?Sized>(
        &self,
        workflow: &str,
        input: &I,
        options: StartOptions,
    ) -> Result<Started> {
        let shared = &self.inner.shared;
        let (version, handler) =
            shared.registry.latest(workflow).ok_or_else(|| Error::UnknownWorkflow { name: workflow.to_string() })?;
        let input = Payload::encode(input)
            .map_err(|source| Error::Serialize { what: format!("the input of workflow {workflow:?}"), source })?;
        self.check_size(|| format!("the input of workflow {workflow:?}"), &input)?;
        handler.check_input(&input).map_err(|source| Error::InvalidInput { workflow: workflow.to_string(), source })?;
        let id = match options.id {
            Some(id) => RunId::parse(&id)?,
            None => RunId::new(uuid::Uuid::now_v7().to_string()),
        };
        let namespace =
            options.namespace.or_else(|| shared.config.namespace.clone()).unwrap_or_else(|| "default".into());
        let new = NewRun {
            id: id.clone(),
            workflow: workflow.to_string(),
            version,
            namespace,
            input,
            tags: options.tags,
            priority: options.priority,
            parent: None,
            created_at: shared.clock.now(),
        };
        let mark = shared.mark();
        let created = shared.store.create_run(new).await?;
        let is_new = created.created();
        if is_new {
            let run = created.run();
            shared.emit(EngineEvent::RunCreated { run_id: id.clone(), workflow: workflow.to_string() });
            shared.queue_start(id.clone(), &run.namespace, run.priority, run.updated_at, mark);
        }
        Ok(Started { id, created: is_new, run: created.into_run() })
    }

    /// Waits until the run is terminal (completed, failed, cancelled or dead). Works for runs
    /// executed by other processes too (it re-reads the store).
    pub async fn wait_for_run(&self, id: &RunId) -> Result<RunOutcome> {
        self.wait(id, false, None).await
    }

    /// [`Engine::wait_for_run`] with a timeout ([`Error::Timeout`] when it passes).
    pub async fn wait_for_run_timeout(&self, id: &RunId, timeout: Duration) -> Result<RunOutcome> {
        self.wait(id, false, Some(timeout)).await
    }

    /// Waits until the run is [suspended](durable_core::RunStatus::Suspended) (parked on a timer, a signal, a
    /// child or a remote result) or terminal (completed, failed, cancelled or dead), and returns
    /// it as first seen in either state: from there it makes no progress until time passes or
    /// something arrives. Tests use it to reach a run's next wait before they advance a clock or
    /// send a signal; [`Engine::wait_for_run`] waits for the end. Works for runs executed by
    /// other processes too (it re-reads the store).
    pub async fn wait_until_suspended_or_terminal(&self, id: &RunId) -> Result<RunOutcome> {
        self.wait(id, true, None).await
    }

    /// [`Engine::wait_until_suspended_or_terminal`] with a timeout ([`Error::Timeout`] when it
    /// passes).
    pub async fn wait_until_suspended_or_terminal_timeout(&self, id: &RunId, timeout: Duration) -> Result<RunOutcome> {
        self.wait(id, true, Some(timeout)).await
    }

    /// The old name of [`Engine::wait_until_suspended_or_terminal`], which also returns when the
    /// run is only suspended.
    #[deprecated(note = "renamed to `wait_until_suspended_or_terminal`: it also returns when the run is suspended")]
    pub async fn wait_for_settled(&self, id: &RunId) -> Result<RunOutcome> {
        self.wait_until_suspended_or_terminal(id).await
    }

    /// The old name of [`Engine::wait_until_suspended_or_terminal_timeout`].
    #[deprecated(
        note = "renamed to `wait_until_suspended_or_terminal_timeout`: it also returns when the run is suspended"
    )]
    pub async fn wait_for_settled_timeout(&self, id: &RunId, timeout: Duration) -> Result<RunOutcome> {
        self.wait_until_suspended_or_terminal_timeout(id, timeout).await
    }

    async fn wait(&self, id: &RunId, suspended_is_enough: bool, timeout: Option<Duration>) -> Result<RunOutcome> {
        let run = self.shared().wait_for(id, suspended_is_enough, timeout).await?;
        Ok(RunOutcome { run })
    }

    /// Reads a run. For an active run whose workflow version is not registered here (while
    /// another version of that workflow is), the returned `error` explains why it is not
    /// moving.
    pub async fn get_run(&self, id: &RunId) -> Result<Option<Run>> {
        let shared = &self.inner.shared;
        let mut run = shared.store.get_run(id).await?;
        if let Some(r) = &mut run
            && !r.status.is_terminal()
            && shared.registry.get(&r.workflow, r.version).is_none()
            && shared.registry.latest(&r.workflow).is_some()
        {
            r.error = Some(
                StepError::fatal(format!(
                    "run {}: workflow {:?} version {} is not registered on this engine, so the run is left untouched; \
                         register version {} again to resume it, or cancel it",
                    r.id, r.workflow, r.version, r.version
                ))
                .with_code("version_not_registered"),
            );
        }
        Ok(run)
    }

    /// The run's checkpoints by seq.
    pub async fn history(&self, id: &RunId) -> Result<Vec<Checkpoint>> {
        Ok(self.inner.shared.store.history(id).await?)
    }

    /// Lists runs, newest first (see [`RunFilter`]).
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage> {
        Ok(self.inner.shared.store.list_runs(filter).await?)
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
