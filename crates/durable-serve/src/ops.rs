//! The operator's actions on runs — retry, retry with a new input, cancel, delete, and sending a
//! signal — shared by the HTTP API and the `durable` command line (`durable runs retry |
//! cancel | delete`, `durable signal`), so both check and answer the same way.
//!
//! Each takes an [`Engine`]: the actions are engine logic (history truncation and retried
//! children, recursive cancels that notify parents, payload checks and limits). An operator's
//! engine is a client one
//! ([`EngineBuilder::client_only`](durable::EngineBuilder::client_only)): it executes nothing;
//! the runs an action wakes are continued by the workers with their workflows registered.

use durable::{Cancel, Checkpoint, CheckpointStatus, Delivery, Engine, Run, RunId, RunStatus};

/// Why an action was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// No run has this id.
    #[error("run {0} not found")]
    NotFound(RunId),
    /// The run is in a state the action does not apply to (the message says which and what to
    /// do).
    #[error("{0}")]
    Conflict(String),
    /// The run is still active and the action (a delete without force) needs it finished.
    #[error("run {id} is {status} (still active): cancel it first, or delete it with force")]
    Active {
        /// The run.
        id: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// The request itself is wrong (an empty signal token, …).
    #[error("{0}")]
    Invalid(String),
    /// The engine or the store refused or failed.
    #[error(transparent)]
    Engine(#[from] durable::Error),
}

/// What [`retry`] did.
#[derive(Debug, Clone)]
pub struct Retried {
    /// The run before the retry.
    pub before: Run,
    /// The failed checkpoint it resumes from (`None`: from where it stopped).
    pub from: Option<Checkpoint>,
}

/// Reads a run that must exist.
pub async fn require(engine: &Engine, id: &RunId) -> Result<Run, OpError> {
    engine.get_run(id).await?.ok_or_else(|| OpError::NotFound(id.clone()))
}

/// Retries a `failed` or `dead` run ([`Engine::retry`]): it goes back to `pending`.
pub async fn retry(engine: &Engine, id: &RunId) -> Result<Retried, OpError> {
    let before = require(engine, id).await?;
    let from = engine.history(id).await?.into_iter().find(|c| c.status == CheckpointStatus::Failed);
    let status = engine.retry(id).await?;
    if status != RunStatus::Pending {
        return Err(OpError::Conflict(format!("run {id} is {status} now (it changed meanwhile); it was not retried")));
    }
    Ok(Retried { before, from })
}

/// Starts a new run of `id`'s workflow with `input` ([`Engine::retry_with_input`]); the
/// original run is left as it is. Returns the new run. The workflow must be registered on
/// `engine` (its input is checked, its version chosen): on an operator engine with no
/// workflows this is a [`OpError::Conflict`] saying so.
pub async fn retry_with_input(engine: &Engine, id: &RunId, input: &serde_json::Value) -> Result<Run, OpError> {
    let run = require(engine, id).await?;
    let started = match engine.retry_with_input(id, input).await {
        Err(durable::Error::UnknownWorkflow { name }) => {
            return Err(OpError::Conflict(format!(
                "retrying run {id} with a new input starts a new run of workflow {name:?} (version {}), which needs the \
                 workflow registered on this engine: serve from a worker that registers it, or retry without an input",
                run.version
            )));
        }
        other => other?,
    };
    require(engine, &started.id).await
}

/// What [`cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The run had finished already: nothing was done.
    AlreadyFinished(RunStatus),
    /// The run (and its active children) is `cancelled`.
    Cancelled,
    /// A compensating cancel was recorded: a worker runs its undos, then it ends `cancelled`.
    Requested,
    /// The run finished with this status before the cancel landed.
    FinishedFirst(RunStatus),
}

/// Cancels an active run ([`Engine::cancel_with`]). Returns the run before the call and what
/// happened.
pub async fn cancel(engine: &Engine, id: &RunId, how: Cancel) -> Result<(Run, Cancelled), OpError> {
    let run = require(engine, id).await?;
    if run.status.is_terminal() {
        let status = run.status;
        return Ok((run, Cancelled::AlreadyFinished(status)));
    }
    let outcome = match (how, engine.cancel_with(id, how).await?) {
        (Cancel::Abandon, RunStatus::Cancelled) => Cancelled::Cancelled,
        (Cancel::Compensate, s) if !s.is_terminal() => Cancelled::Requested,
        (_, s) => Cancelled::FinishedFirst(s),
    };
    Ok((run, outcome))
}

/// Deletes a finished run and its subtree ([`Engine::delete_run`]); an active run only with
/// `force`. Returns how many runs were deleted (at least 1).
pub async fn delete(engine: &Engine, id: &RunId, force: bool) -> Result<u64, OpError> {
    let run = require(engine, id).await?;
    if !run.status.is_terminal() && !force {
        return Err(OpError::Active { id: id.clone(), status: run.status });
    }
    match engine.delete_run(id).await? {
        0 => Err(OpError::NotFound(id.clone())),
        n => Ok(n),
    }
}

/// Sends a signal ([`Engine::signal`]): the oldest run waiting on `token` receives `payload`,
/// or it is buffered for the next run that waits on it.
pub async fn signal(engine: &Engine, token: &str, payload: &serde_json::Value) -> Result<Delivery, OpError> {
    if token.trim().is_empty() {
        return Err(signal_token_empty());
    }
    Ok(engine.signal(token, payload).await?)
}

/// The error of [`signal`] for an empty token (a front end checks it before reading a payload).
pub fn signal_token_empty() -> OpError {
    OpError::Invalid("the signal token is empty or only whitespace; pass the token the run waits on".into())
}
