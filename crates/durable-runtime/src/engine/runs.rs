//! Starting and observing runs: start, read, list, history, and waiting for a run to settle.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use durable_core::protocol;

use durable_core::{
    Checkpoint, CreateRun, HistoryExport, NewRun, Payload, Run, RunFilter, RunId, RunPage, StepError, StepKind, codes,
};
use serde::Serialize;

use super::{Engine, RunOutcome, StartOptions, Started};
use crate::error::{Error, Result};

impl Engine {
    fn check_size(&self, what: impl FnOnce() -> String, payload: &Payload) -> Result<()> {
        let limit = self.inner.shared.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge { what: what(), size: payload.len(), limit });
        }
        Ok(())
    }

    /// Starts a run of the newest version of `workflow`: validates and persists it `pending`,
    /// dispatches it, and returns at once. Idempotent on the id: a run of `workflow` that holds
    /// it is returned as it is (`created: false`, whatever its input); a run of another workflow
    /// holding it is [`Error::IdTaken`].
    pub async fn start<I: Serialize + ?Sized>(
        &self,
        workflow: &str,
        input: &I,
        options: StartOptions,
    ) -> Result<Started> {
        let shared = &self.inner.shared;
        let new = self.new_run(workflow, input, options, shared.clock.now())?;
        let mark = shared.mark();
        let created = shared.store.create_run(new).await.map_err(queue_full)?;
        if let CreateRun::Existing(run) = &created
            && run.workflow != workflow
        {
            return Err(Error::IdTaken {
                id: run.id.clone(),
                existing: run.workflow.clone(),
                requested: workflow.into(),
            });
        }
        Ok(self.started(created, mark))
    }

    /// Starts many runs at once: [`Engine::start`] for each item, in one store call
    /// ([`Store::create_runs`](durable_core::Store::create_runs), one transaction) per
    /// [`EngineConfig::start_batch`](crate::EngineConfig::start_batch) (500) items, and the
    /// started runs dispatched together (with a transport, into the outbox, which sends full
    /// batches at once). Returns what `start` returns for each item, in order: idempotent per
    /// id, so an id that exists — or that an earlier item of the call created — comes back
    /// with `created: false` and the run as it is.
    ///
    /// Every item is validated before anything is written: an unknown workflow, an input that
    /// does not fit the workflow, a bad id, or an id an earlier item gives to another workflow
    /// fails the call with [`Error::BadStart`] naming the item, and nothing is started. An id
    /// a run of another workflow holds in the store fails it the same way (its source
    /// [`Error::IdTaken`], as `start` says) once the store answered that run: the batches up
    /// to and including the item's are started then (the others of its batch too), the rest
    /// not, and the error's `started` says how many — call again without that item to start
    /// them (ids are idempotent).
    ///
    /// Items are written in batches, each whole or not at all: a
    /// batch that would overfill a concurrency key (`max_queue_depth`) is refused whole —
    /// [`Error::QueueFull`] if it is the first, so nothing is started — and a store failure
    /// after some batches were written is [`Error::PartlyStarted`], saying how many items were
    /// started.
    ///
    /// ```no_run
    /// # use durable_runtime::{Engine, StartOptions};
    /// # async fn demo(engine: Engine) -> Result<(), durable_runtime::Error> {
    /// let orders = [("o-1", 10), ("o-2", 25), ("o-3", 7)];
    /// let started = engine
    ///     .start_many(orders.iter().map(|(id, cents)| ("checkout", cents, StartOptions::id(format!("checkout:{id}")))))
    ///     .await?;
    /// assert_eq!(started.len(), 3);
    /// # Ok(()) }
    /// ```
    pub async fn start_many<W, I, Items>(&self, runs: Items) -> Result<Vec<Started>>
    where
        Items: IntoIterator<Item = (W, I, StartOptions)>,
        W: AsRef<str>,
        I: Serialize,
    {
        let shared = &self.inner.shared;
        let now = shared.clock.now();
        let mut news = Vec::new();
        // Each id the call names, with its first item and that item's workflow.
        let mut named: HashMap<RunId, (usize, String)> = HashMap::new();
        let taken = |index: usize, started: usize, id: &RunId, requested: &str, existing: &str| Error::BadStart {
            index,
            started,
            workflow: requested.to_string(),
            id: Some(id.to_string()),
            source: Box::new(Error::IdTaken {
                id: id.clone(),
                existing: existing.to_string(),
                requested: requested.to_string(),
            }),
        };
        for (index, (workflow, input, options)) in runs.into_iter().enumerate() {
            let workflow = workflow.as_ref();
            let id = options.id.clone();
            let given = id.is_some();
            let new = self.new_run(workflow, &input, options, now).map_err(|source| Error::BadStart {
                index,
                started: 0,
                workflow: workflow.to_string(),
                id,
                source: Box::new(source),
            })?;
            if given {
                match named.get(&new.id) {
                    Some((_, first)) if *first != new.workflow => {
                        return Err(taken(index, 0, &new.id, &new.workflow, first));
                    }
                    Some(_) => {}
                    None => {
                        named.insert(new.id.clone(), (index, new.workflow.clone()));
                    }
                }
            }
            news.push(new);
        }
        let batch = shared.config.start_batch.max(1);
        let mut started = Vec::with_capacity(news.len());
        let mut news = news.into_iter().peekable();
        while news.peek().is_some() {
            let chunk: Vec<NewRun> = news.by_ref().take(batch).collect();
            let mark = shared.mark();
            let created = shared.store.create_runs(chunk).await.map_err(|source| match source {
                // A full concurrency key refuses its batch whole: with nothing started yet,
                // the call is refused as `start` refuses.
                durable_core::StoreError::QueueFull { .. } if started.is_empty() => queue_full(source),
                source => Error::PartlyStarted { started: started.len(), source },
            })?;
            // An id a run of another workflow holds (the store answered that run, unchanged):
            // the rest of this batch is written and dispatched, and the call stops there, as
            // `start` refuses it. (Reading every id first, to write nothing, cost a quarter of
            // the throughput.)
            let refused: Vec<(&Run, &(usize, String))> = created
                .iter()
                .filter_map(|c| match c {
                    CreateRun::Existing(run) => {
                        named.get(&run.id).filter(|(_, workflow)| *workflow != run.workflow).map(|found| (run, found))
                    }
                    CreateRun::Created(_) => None,
                })
                .collect();
            // Started: the items up to this batch's end, but those refused.
            let so_far = started.len() + created.len() - refused.len();
            let held_elsewhere =
                refused.first().map(|(run, (index, workflow))| taken(*index, so_far, &run.id, workflow, &run.workflow));
            started.extend(created.into_iter().map(|c| self.started(c, mark)));
            if let Some(e) = held_elsewhere {
                return Err(e);
            }
        }
        Ok(started)
    }

    /// Validates one start and builds the run to create.
    fn new_run<I: Serialize + ?Sized>(
        &self,
        workflow: &str,
        input: &I,
        options: StartOptions,
        now: durable_core::Millis,
    ) -> Result<NewRun> {
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
        let named = |what: &str, name: &str| {
            durable_core::protocol::name_problem(name).map(|reason| Error::InvalidName {
                what: format!(
                    "{} of the start of workflow {workflow:?}",
                    durable_core::protocol::described(what, name)
                ),
                reason,
            })
        };
        if let Some(e) = named("namespace", &namespace) {
            return Err(e);
        }
        if let Some(e) = options.tags.iter().find_map(|tag| named("tag", tag)) {
            return Err(e);
        }
        let start_at = options.start_at.or_else(|| options.delay.map(|d| durable_core::millis_after(now, d)));
        if let Some(at) = start_at.filter(|at| *at > durable_core::LATEST_START) {
            return Err(Error::StartTooLate { workflow: workflow.to_string(), at });
        }
        let trace_context = match options.trace_context {
            Some(given) => durable_core::trace::TraceParent::parse(&given)?.to_string(),
            None => crate::trace::new_trace_context(Some(&id), workflow, version),
        };
        let admission = shared
            .flow
            .start_request(workflow, &namespace, &id, &input, options.priority, now)
            .map_err(|reason| Error::BadKey { workflow: workflow.to_string(), reason })?;
        Ok(NewRun {
            admission,
            trace_context: Some(trace_context),
            id,
            workflow: workflow.to_string(),
            version,
            namespace,
            input,
            tags: options.tags,
            priority: options.priority,
            parent: None,
            created_at: now,
            start_at: start_at.filter(|at| *at > now),
        })
    }

    /// What a start returns; a run it created is announced and dispatched (`mark`: taken
    /// before the store call that created it).
    fn started(&self, created: CreateRun, mark: crate::sched::Mark) -> Started {
        let is_new = created.created();
        let run = created.into_run();
        if is_new {
            self.inner.shared.announce_created(&run, mark);
        }
        Started { id: run.id.clone(), created: is_new, run }
    }

    /// Waits until the run is terminal (completed, failed, cancelled or dead). Works for runs
    /// executed by other processes too (it re-reads the store).
    ///
    /// A store out of reach for a moment (a retryable [`StoreError`](durable_core::StoreError),
    /// as while PostgreSQL restarts) does not end the wait: it looks again, less often each
    /// time, up to every 5 s, for as long as the outage lasts; bound it with
    /// [`Engine::wait_for_run_timeout`]. Any other error ends it.
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
                .with_code(codes::VERSION_NOT_REGISTERED),
            );
        }
        Ok(run)
    }

    /// The run's checkpoints by seq. [`Error::RunNotFound`] for an unknown id (a run with no
    /// checkpoint yet has an empty history).
    pub async fn history(&self, id: &RunId) -> Result<Vec<Checkpoint>> {
        let history = self.inner.shared.store.history(id).await?;
        if history.is_empty() && self.inner.shared.store.get_run(id).await?.is_none() {
            return Err(Error::RunNotFound(id.clone()));
        }
        Ok(history)
    }

    /// Exports a run's history as a versioned document ([`HistoryExport`]): the run row as
    /// stored, its checkpoints by seq, its registered waits and its query state. Write it with
    /// [`HistoryExport::to_json`]; check it against your code with
    /// [`Engine::check_replay`] (or `durable::testing::replay::assert_replayable` in a test).
    /// [`Error::RunNotFound`] for an unknown id.
    ///
    /// The parts are read one after the other; for a run that changes meanwhile the reads are
    /// repeated (a few times at most) until the run row is the same before and after, so the
    /// parts belong to one state of the run.
    ///
    /// ```no_run
    /// # async fn demo(engine: durable_runtime::Engine) -> Result<(), Box<dyn std::error::Error>> {
    /// let export = engine.export_history(&"order:42".into()).await?;
    /// std::fs::write("tests/fixtures/replay/order-42.json", export.to_json()?)?;
    /// # Ok(()) }
    /// ```
    pub async fn export_history(&self, id: &RunId) -> Result<HistoryExport> {
        const ATTEMPTS: usize = 5;
        let store = &self.inner.shared.store;
        let mut run = store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
        let mut attempt = 1;
        loop {
            let checkpoints = store.history(id).await?;
            let waiters = store.waiters(id).await?;
            let mut state = BTreeMap::new();
            for cp in checkpoints.iter().filter(|c| c.kind == StepKind::State) {
                if !state.contains_key(&cp.name)
                    && let Some(value) = store.get_state(id, &cp.name).await?
                {
                    state.insert(cp.name.clone(), value);
                }
            }
            let after = store.get_run(id).await?.ok_or_else(|| Error::RunNotFound(id.clone()))?;
            if after == run || attempt == ATTEMPTS {
                return Ok(HistoryExport::new(after, checkpoints, waiters, state));
            }
            run = after;
            attempt += 1;
        }
    }

    /// Lists runs, newest first (see [`RunFilter`]).
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage> {
        // A value no run can have (a NUL, which PostgreSQL refuses as a parameter too): say so.
        let named = [("workflow", &filter.workflow), ("namespace", &filter.namespace), ("tag", &filter.tag)];
        for (what, value) in named {
            if let Some(value) = value
                && let Some(reason) = protocol::storage_problem(value)
            {
                return Err(Error::InvalidName { what: protocol::described(&format!("{what} filter"), value), reason });
            }
        }
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

/// A store's refusal of a keyed start, as the engine's [`Error::QueueFull`] naming the
/// workflow and key of the gate.
fn queue_full(e: durable_core::StoreError) -> Error {
    match e {
        durable_core::StoreError::QueueFull { gate, held, waiting } => {
            let (workflow, key) = match protocol::parse_gate(&gate) {
                Some(protocol::GateName::Key { workflow, key, .. }) => (workflow, key),
                _ => (String::new(), gate),
            };
            Error::QueueFull { workflow, key, held, waiting }
        }
        other => Error::Store(other),
    }
}
