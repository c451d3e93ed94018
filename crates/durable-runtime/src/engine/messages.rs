//! Messages to running workflows from the outside: signals, signal-with-start, events,
//! queries, updates and external task results.

use std::sync::Arc;

use durable_core::protocol::{self, TaskResult};
use durable_core::{
    BufferAppend, BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Dedupe, Delivery, Gather, Millis,
    NewRun, Payload, Publish, Published, RunId,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Engine, StartOptions, Started};
use crate::error::{Error, Result};
use crate::sched::UpdateValidator;
use crate::trigger::PublishOptions;
use crate::turn::UpdateOutcome;

/// What [`Engine::publish`] did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Publication {
    /// Where the event went (empty: buffered for a later wait, or a duplicate).
    pub deliveries: Vec<Delivery>,
    /// Runs the event started: one per matching trigger, and the run of a batch it filled.
    pub started: Vec<RunId>,
    /// The dedupe id was seen before: nothing happened.
    pub duplicate: bool,
}

impl Engine {
    /// Sends a signal and wakes the run that received it.
    async fn deliver(&self, token: &str, payload: Payload) -> Result<Delivery> {
        Ok(self.shared().send_signal(token, payload).await?)
    }

    pub(super) fn encode_payload<T: Serialize + ?Sized>(
        &self,
        what: impl Fn() -> String,
        value: &T,
    ) -> Result<Payload> {
        let payload = Payload::encode(value).map_err(|source| Error::Serialize { what: what(), source })?;
        let limit = self.shared().config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge { what: what(), size: payload.len(), limit });
        }
        Ok(payload)
    }
}

/// The same rule as a wait's ([`protocol::check_name`]): what cannot be sent cannot be awaited.
/// A signal token must not begin with a prefix of the tokens the engine delivers to itself.
fn check_name(what: &str, name: &str) -> Result<()> {
    match protocol::problem_of(what, name) {
        None => Ok(()),
        Some(reason) => Err(Error::InvalidName { what: protocol::described(what, name), reason }),
    }
}

impl Engine {
    /// The signals and events buffered because no wait took them yet, summed per token or
    /// event name: how many, and when the oldest and the newest were buffered. Signals come
    /// first, then events, each in byte order of their keys, at most `query.limit` keys.
    ///
    /// A buffered delivery waits for the next wait on its key, however long that takes; one
    /// sent to a mistyped token, or to a run that already finished, stays until it is purged
    /// ([`Engine::purge_buffered`]). `durable signals list` prints this.
    ///
    /// ```no_run
    /// # mod durable { pub use durable_core::millis_before; pub use durable_runtime::*; }
    /// # async fn demo(engine: durable::Engine) -> durable::Result<()> {
    /// use durable::{BufferedQuery, millis_before};
    /// let week_ago = millis_before(engine.clock().now(), std::time::Duration::from_secs(7 * 86_400));
    /// for key in engine.buffered(&BufferedQuery::signals().oldest_before(week_ago)).await? {
    ///     println!("{} {:?}: {} waiting since {}", key.kind, key.key, key.count, key.oldest_at);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a prefix no store could hold (a control character, over
    /// [`MAX_NAME_BYTES`](protocol::MAX_NAME_BYTES)); store errors.
    pub async fn buffered(&self, query: &BufferedQuery) -> Result<Vec<BufferedDeliveries>> {
        if let Some(prefix) = &query.prefix
            && let Some(reason) = protocol::storage_problem(prefix)
        {
            return Err(Error::InvalidName { what: protocol::described("buffered key prefix", prefix), reason });
        }
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self.shared().store.buffered(query).await?)
    }

    /// Deletes the buffered signals of one token, or the buffered events of one name: all of
    /// them, or those buffered before [`BufferedPurge::buffered_before`]. Returns how many it
    /// deleted. Runs and their waits are untouched; a delivery buffered after the purge is kept.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a key that is empty, only whitespace or has a control
    /// character (no delivery can be buffered under it); store errors.
    pub async fn purge_buffered(&self, purge: &BufferedPurge) -> Result<u64> {
        let what = match purge.kind {
            BufferedKind::Signal => protocol::SIGNAL_TOKEN,
            BufferedKind::Event => "event name",
        };
        // Any key a buffer may have (one buffered before the length limit too), but none that
        // no store can hold.
        let reason = if purge.key.trim().is_empty() {
            // No signal or wait can have such a key (see `Engine::signal`).
            Some("it is empty or only whitespace: pass the key `durable signals list` shows")
        } else {
            protocol::has_control_char(&purge.key).then_some("it contains a control character")
        };
        if let Some(reason) = reason {
            return Err(Error::InvalidName { what: protocol::described(what, &purge.key), reason: reason.into() });
        }
        Ok(self.shared().store.purge_buffered(purge).await?)
    }
}

impl Engine {
    /// Sends `payload` to the oldest wait on `token`, recording it at that wait's seq and
    /// waking its run; with no wait, buffers it (FIFO per token) for the next one. Every
    /// signal is consumed exactly once. A signal to a finished run's token is buffered
    /// harmlessly and reported as [`Delivery::Buffered`].
    ///
    /// The token must be a valid name (not empty or only whitespace, no control character) and
    /// must not begin with `child:`, `update:`, `task:` or `remote:`, the engine's own tokens
    /// ([`Error::InvalidName`]).
    pub async fn signal<T: Serialize + ?Sized>(&self, token: &str, payload: &T) -> Result<Delivery> {
        check_name(protocol::SIGNAL_TOKEN, token)?;
        let payload = self.encode_payload(|| format!("the payload of signal {token:?}"), payload)?;
        self.deliver(token, payload).await
    }

    /// Starts the run (idempotent on `options.id`, which is required) and then signals it.
    pub async fn signal_with_start<I: Serialize + ?Sized, P: Serialize + ?Sized>(
        &self,
        workflow: &str,
        input: &I,
        options: StartOptions,
        token: &str,
        payload: &P,
    ) -> Result<(Started, Delivery)> {
        if options.id.is_none() {
            return Err(Error::InvalidName {
                what: "run id for signal_with_start".into(),
                reason: "it is required: set StartOptions::id".into(),
            });
        }
        check_name(protocol::SIGNAL_TOKEN, token)?;
        let payload = self.encode_payload(|| format!("the payload of signal {token:?}"), payload)?;
        let started = self.start(workflow, input, options).await?;
        let delivery = self.deliver(token, payload).await?;
        Ok((started, delivery))
    }

    /// Publishes an event: every run waiting on `name` whose matcher accepts the payload gets
    /// it, one [`Delivery::Delivered`] each; if none does, it is buffered for the first later
    /// wait that matches and the list is empty (unlike a signal's single answer, an event has
    /// no [`Delivery::Buffered`] entry). Workflows
    /// registered to start on it ([`WorkflowOptions::on_event`](crate::WorkflowOptions::on_event))
    /// start ([`Engine::publish`] says which).
    pub async fn publish_event<T: Serialize + ?Sized>(&self, name: &str, payload: &T) -> Result<Vec<Delivery>> {
        Ok(self.publish(name, payload, PublishOptions::default()).await?.deliveries)
    }

    /// Publishes an event ([`Engine::publish_event`]) with options, and says what it did: where
    /// it was delivered, which runs it started, whether it was a duplicate.
    ///
    /// Everything happens in one store write: the deliveries, the runs of matching triggers
    /// (one per trigger, `evt:<workflow>:<UUID>`), and the payload added to every debounce or
    /// batch it feeds. With [`PublishOptions::dedupe`] the same `(event name, id)` published
    /// again — by any engine on the store, within the dedupe window — does nothing and comes
    /// back with `duplicate: true`; past the window it is a new event, and starts its triggers'
    /// runs again.
    ///
    /// A payload that does not decode into a triggered workflow's input (the element type
    /// for a batch) fails the publish with [`Error::InvalidInput`] naming the workflow, and
    /// nothing is published. So does a debounce or batch key (the payload's
    /// [`key_by`](crate::WorkflowOptions::key_by) field) that no store can keep — with a
    /// control character, or longer than [`MAX_NAME_BYTES`](protocol::MAX_NAME_BYTES) — with
    /// [`Error::InvalidName`], and a debounce whose run could not take its workflow's
    /// concurrency key with [`Error::BadKey`].
    pub async fn publish<T: Serialize + ?Sized>(
        &self,
        name: &str,
        payload: &T,
        options: PublishOptions,
    ) -> Result<Publication> {
        check_name("event name", name)?;
        if let Some(id) = &options.dedupe_id {
            check_name("dedupe id", id)?;
        }
        let shared = self.shared();
        let payload = self.encode_payload(|| format!("the payload of event {name:?}"), payload)?;
        let now = shared.clock.now();
        let (mut start, mut gather) = (Vec::new(), Vec::new());
        let mut soonest = Millis::MAX;
        let triggers = shared.hooks.triggers_for(name);
        // Parsed only for triggers to match: a plain publish stays text end to end.
        let value = if triggers.is_empty() { serde_json::Value::Null } else { payload.to_value() };
        for (workflow, trigger) in triggers {
            if !trigger.accepts(&value) {
                continue;
            }
            let (version, handler) =
                shared.registry.latest(&workflow).ok_or_else(|| Error::UnknownWorkflow { name: workflow.clone() })?;
            let probe = match trigger.gather {
                Some(Gather::Batch { .. }) => Payload::from_trusted(format!("[{}]", payload.as_str())),
                _ => payload.clone(),
            };
            handler.check_input(&probe).map_err(|source| Error::InvalidInput { workflow: workflow.clone(), source })?;
            let run = NewRun {
                admission: None,
                // The publisher's trace (with `otel`), or a fresh one.
                trace_context: Some(crate::trace::new_trace_context(None, &workflow, version)),
                id: RunId::new(""),
                workflow: workflow.clone(),
                version,
                namespace: shared.config.namespace.clone().unwrap_or_else(|| "default".into()),
                input: payload.clone(),
                tags: vec![format!("event:{name}")],
                priority: 0,
                parent: None,
                created_at: now,
                start_at: None,
            };
            match trigger.gather {
                None => {
                    // A fresh id for each trigger an event starts: a publish with a dedupe id
                    // starts once per id and window by the store's record of the id (the same
                    // write), and two triggers of a workflow, two event names or a window
                    // passed are distinct starts.
                    let id = RunId::parse(&format!("evt:{workflow}:{}", uuid::Uuid::now_v7()))?;
                    let admission = shared
                        .flow
                        .start_request(&workflow, &run.namespace, &id, &run.input, run.priority, now)
                        .map_err(|reason| Error::BadKey { workflow: workflow.clone(), reason })?;
                    start.push(NewRun { id, admission, ..run });
                }
                Some(g) => {
                    let wait = match g {
                        Gather::Debounce { quiet_ms } => quiet_ms,
                        Gather::Batch { max_wait_ms, .. } => max_wait_ms,
                        _ => 0,
                    };
                    soonest = soonest.min(now.saturating_add(wait));
                    // The run starts later, in the scheduler: its concurrency key must be one.
                    if matches!(g, Gather::Debounce { .. }) {
                        shared.flow.check_key(&workflow, &run.namespace, &run.input)?;
                    }
                    let key = trigger.key_of(&value);
                    if let Some(reason) = protocol::storage_problem(&key) {
                        let field = trigger.key_field.as_deref().unwrap_or_default();
                        return Err(Error::InvalidName {
                            what: format!(
                                "the key (field {field:?}) of event {} for workflow {workflow:?}'s trigger",
                                protocol::shown(name)
                            ),
                            reason,
                        });
                    }
                    gather.push(BufferAppend {
                        key,
                        workflow,
                        gather: g,
                        batch_id: uuid::Uuid::now_v7().to_string(),
                        run,
                    });
                }
            }
        }
        let window = options.dedupe_window.unwrap_or(shared.config.event_dedupe_window);
        let dedupe = options.dedupe_id.map(|id| Dedupe { id, keep_until: durable_core::millis_after(now, window) });
        let event = Publish { name: name.to_string(), payload, now, dedupe, start, gather };
        let mark = shared.mark();
        match shared.store.publish(event).await? {
            Published::Duplicate => Ok(Publication { deliveries: Vec::new(), started: Vec::new(), duplicate: true }),
            Published::Done { deliveries, started } => {
                shared.wake_delivered(&deliveries, mark);
                let mut ids = Vec::new();
                for created in started.iter().filter(|c| c.created()) {
                    shared.announce_created(created.run(), mark);
                    ids.push(created.run().id.clone());
                }
                shared.note_due(soonest);
                Ok(Publication { deliveries, started: ids, duplicate: false })
            }
        }
    }

    /// The latest value a run set with `ctx.set_state(key, ..)`, also after it finished;
    /// `None` if it never set one; [`Error::RunNotFound`] if there is no such run.
    pub async fn get_state<T: DeserializeOwned>(&self, run_id: &RunId, key: &str) -> Result<Option<T>> {
        let store = &self.shared().store;
        let Some(p) = store.get_state(run_id, key).await? else {
            // Never set, or no run at all: one more read tells them apart.
            return match store.get_run(run_id).await? {
                Some(_) => Ok(None),
                None => Err(Error::RunNotFound(run_id.clone())),
            };
        };
        p.decode().map(Some).map_err(|source| Error::State { id: run_id.clone(), key: key.to_string(), source })
    }

    /// Registers a validator for updates named `update` sent to runs of `workflow`: it sees
    /// the decoded argument and returns `Err(reason)` to reject it.
    pub fn register_update_validator<T, F>(&self, workflow: &str, update: &str, validator: F)
    where
        T: DeserializeOwned + 'static,
        F: Fn(&T) -> Result<(), String> + Send + Sync + 'static,
    {
        let v: UpdateValidator = Arc::new(move |p: &Payload| {
            let arg: T = p.decode().map_err(|e| format!("the argument does not decode: {e}"))?;
            validator(&arg)
        });
        self.shared().hooks.add_update_validator(workflow, update, v);
    }

    /// Sends an update to a run: the run must exist ([`Error::RunNotFound`]) and be active
    /// ([`Error::RunFinished`]); then the registered validator, if any, must accept it
    /// ([`UpdateOutcome::Rejected`] otherwise); then it is delivered to the run's
    /// `ctx.on_update(name)`. A refused or rejected update touches nothing.
    ///
    /// The rule for every message addressed to a run by its id (`update`, `complete_task`,
    /// `fail_task`): an unknown run is `RunNotFound`, a finished one `RunFinished`, and nothing
    /// is written. Messages addressed to a token or an event name (`signal`, `publish_event`)
    /// are buffered instead when nobody waits yet, since a run may wait on them later.
    pub async fn update<T: Serialize + ?Sized>(&self, run_id: &RunId, name: &str, arg: &T) -> Result<UpdateOutcome> {
        check_name("update name", name)?;
        let shared = self.shared();
        let payload = self.encode_payload(|| format!("the argument of update {name:?}"), arg)?;
        let reject = |reason: String| Ok(UpdateOutcome::Rejected { reason });
        let run = self.active_run(run_id).await?;
        let validator = shared.hooks.update_validator(&run.workflow, name);
        if let Some(validator) = validator
            && let Err(reason) = validator(&payload)
        {
            return reject(format!("update {name:?} to run {run_id} rejected: {reason}"));
        }
        let delivery = self.deliver(&protocol::update_token(run_id, name), payload).await?;
        Ok(UpdateOutcome::Accepted { delivered: matches!(delivery, Delivery::Delivered { .. }) })
    }

    /// Completes the external task `name` of a run with `value` (see
    /// [`WorkflowCtx::task`](crate::WorkflowCtx::task)). The run must exist and be active (the
    /// rule of [`Engine::update`]); a result that arrives before the run waits for it is
    /// buffered for its wait. The result goes to the run's task of that name, whichever it is:
    /// sent twice (a retried webhook), the second one is buffered for the next task of the same
    /// name, so a workflow that hands out several tasks of one kind names each one apart
    /// (`review-1`, `review-2`).
    pub async fn complete_task<T: Serialize + ?Sized>(
        &self,
        run_id: &RunId,
        name: &str,
        value: &T,
    ) -> Result<Delivery> {
        check_name("task name", name)?;
        let value = self.encode_payload(|| format!("the result of task {name:?} of run {run_id}"), value)?;
        self.active_run(run_id).await?;
        let payload = TaskResult::Ok(value).encode();
        self.deliver(&protocol::task_token(run_id, name), payload).await
    }

    /// Fails the external task `name` of a run; the workflow sees
    /// [`TaskError::Failed`](crate::TaskError::Failed). The run must exist and be active (the
    /// rule of [`Engine::update`]).
    pub async fn fail_task(&self, run_id: &RunId, name: &str, message: &str) -> Result<Delivery> {
        check_name("task name", name)?;
        self.active_run(run_id).await?;
        let payload = TaskResult::Err(message.to_string()).encode();
        self.deliver(&protocol::task_token(run_id, name), payload).await
    }

    /// The run a message is addressed to, if it exists and is active.
    async fn active_run(&self, run_id: &RunId) -> Result<durable_core::Run> {
        let run = self.shared().store.get_run(run_id).await?.ok_or_else(|| Error::RunNotFound(run_id.clone()))?;
        if run.status.is_terminal() {
            return Err(Error::RunFinished { id: run_id.clone(), status: run.status });
        }
        Ok(run)
    }
}
