//! Talking to running workflows: signals, signal-with-start, events, queries, updates and
//! external tasks. All of them are deliveries recorded at the waiting call's seq, so replay
//! returns what was delivered.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use durable_core::{
    CheckpointStatus, Decision, Delivery, Millis, Payload, RunId, StepError, StepKind, TurnStop, WaitKind, Waiter,
    codes,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ctx::{InFlight, TurnShared, corrupt, halt, park};
use crate::engine::Shared;
use crate::error::{Error, Result, StepFailed};
use crate::{Engine, StartOptions, Started, StepContext, WorkflowCtx};

use durable_core::codes::WAIT_TIMEOUT;

/// A delivered payload that does not decode into the type the workflow waits for. The run is
/// not harmed: the workflow sees this error and may handle it (replay gives the same error).
#[derive(Debug, Clone, PartialEq)]
pub struct SignalError {
    /// The run.
    pub run_id: RunId,
    /// The seq of the wait.
    pub seq: u32,
    /// The token, event name or update name waited on.
    pub name: String,
    /// Why decoding failed.
    pub message: String,
    /// The payload as delivered (JSON text).
    pub payload: String,
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {}: the payload delivered to {:?} (seq {}) does not decode into the awaited type: {} (payload: {})",
            self.run_id, self.name, self.seq, self.message, self.payload
        )
    }
}

impl std::error::Error for SignalError {}

/// Why an external task did not produce a value.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskError {
    /// The step that hands the task out failed.
    Dispatch(StepFailed),
    /// The outside world reported failure with [`Engine::fail_task`].
    Failed {
        /// The run.
        run_id: RunId,
        /// The task name.
        name: String,
        /// The reported reason.
        message: String,
    },
    /// The completion does not decode into the awaited type.
    BadPayload(SignalError),
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Dispatch(e) => write!(f, "{e}"),
            TaskError::Failed { run_id, name, message } => write!(f, "run {run_id}: task {name:?} failed: {message}"),
            TaskError::BadPayload(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TaskError {}

/// The answer of [`Engine::update`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// Validated and handed to the run (`delivered`: a waiting `on_update` took it at once;
    /// otherwise it is buffered for the next one).
    Accepted {
        /// Whether a waiting `on_update` call took it at once.
        delivered: bool,
    },
    /// Refused; the run was not touched.
    Rejected {
        /// Why (unknown run, finished run, argument that does not decode, validator said no).
        reason: String,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum TaskResult {
    Ok(Payload),
    Err(String),
}

fn update_token(run_id: &RunId, name: &str) -> String {
    format!("update:{run_id}:{name}")
}

fn task_token(run_id: &RunId, name: &str) -> String {
    format!("task:{run_id}:{name}")
}

fn decode_delivery<T: DeserializeOwned>(t: &TurnShared, seq: u32, name: &str, p: &Payload) -> Result<T, SignalError> {
    p.decode().map_err(|e| SignalError {
        run_id: t.run.id.clone(),
        seq,
        name: name.to_string(),
        message: e.to_string(),
        payload: p.as_str().chars().take(500).collect(),
    })
}

/// A wait for a delivery at `seq`, optionally bounded by a deadline recorded at `deadline.0`.
/// Resolves to the delivered payload, or `None` when the deadline passed first.
async fn await_delivery(
    t: &Arc<TurnShared>,
    deadline: Option<(u32, Duration)>,
    seq: u32,
    name: &str,
    kind: StepKind,
    wait: WaitKind,
) -> Option<Payload> {
    let mut due_at: Option<Millis> = None;
    let mut passed = false;
    if let Some((dseq, timeout)) = deadline {
        let dname = format!("timeout:{name}");
        match t.begin(dseq, &dname, StepKind::Sleep) {
            None => return halt().await,
            Some(Decision::Replay(_)) => passed = true,
            Some(Decision::Wait { wake_at }) => due_at = wake_at,
            Some(Decision::Execute { .. }) => {
                let now = t.now();
                let at = now.saturating_add(timeout.as_millis() as Millis);
                let mut cp = t.checkpoint(dseq, &dname, StepKind::Sleep, CheckpointStatus::Waiting, now);
                cp.wake_at = Some(at);
                t.record(cp);
                due_at = Some(at);
            }
            Some(other) => return corrupt(t, dseq, &dname, &other).await,
        }
    }
    match t.begin(seq, name, kind) {
        None => halt().await,
        Some(Decision::Replay(p)) => {
            if let Some((dseq, _)) = deadline {
                settle_deadline(t, dseq);
            }
            Some(p)
        }
        Some(Decision::ReplayError { error, .. }) if error.code() == Some(WAIT_TIMEOUT) => None,
        Some(Decision::Wait { .. }) if passed => expire(t, seq, name, kind).await,
        Some(Decision::Wait { .. }) => park(t, seq, due_at).await,
        Some(Decision::Execute { .. }) => {
            let now = t.now();
            t.record(t.checkpoint(seq, name, kind, CheckpointStatus::Waiting, now));
            let waiter = Waiter { run_id: t.run.id.clone(), seq, name: name.to_string(), kind: wait, created_at: now };
            t.turn.lock().add_wait(waiter);
            // A deadline that already passed still parks once, so a buffered delivery wins.
            park(t, seq, if passed { Some(now) } else { due_at }).await
        }
        Some(other) => corrupt(t, seq, name, &other).await,
    }
}

/// A delivery beat the deadline: mark the deadline's checkpoint done (rides along with the
/// next commit) so a finished run shows no timer still waiting.
fn settle_deadline(t: &TurnShared, dseq: u32) {
    let waiting = t.turn.lock().history().get(dseq).filter(|c| c.status == CheckpointStatus::Waiting).cloned();
    if let Some(mut cp) = waiting {
        cp.status = CheckpointStatus::Completed;
        cp.updated_at = t.now();
        t.record(cp);
    }
}

/// The deadline passed with the wait still registered: record the timeout and remove the
/// waiter in one commit. If a delivery took the waiter first, the delivery stands: restart
/// the turn to replay it.
async fn expire(t: &Arc<TurnShared>, seq: u32, name: &str, kind: StepKind) -> Option<Payload> {
    let _flight = InFlight::new(t);
    let mut cp = t.checkpoint(seq, name, kind, CheckpointStatus::Failed, t.now());
    cp.error = Some(StepError::fatal(format!("wait for {name:?} timed out")).with_code(WAIT_TIMEOUT));
    t.turn.lock().expire_wait(seq);
    let outcome = t.commit(Some(cp), None).await;
    match outcome {
        Some(o) if o.raced.contains(&seq) => {
            t.rerun.store(true, Ordering::Relaxed);
            t.stop(TurnStop::Abort(format!("a delivery to {name:?} (seq {seq}) raced its timeout")));
            halt().await
        }
        Some(_) => None,
        None => halt().await,
    }
}

impl WorkflowCtx {
    /// Waits for a signal sent to `token` with [`Engine::signal`]. The oldest buffered signal
    /// for the token is taken first (FIFO); otherwise the run suspends until one arrives.
    /// 1 seq.
    pub fn wait_for_signal<T: DeserializeOwned + Send + 'static>(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<T, SignalError>> + Send + 'static + use<T> {
        let token = token.to_string();
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let wait = WaitKind::Signal { token: token.clone() };
            let p = await_delivery(&t, None, seq, &token, StepKind::Signal, wait).await.expect("no deadline");
            decode_delivery(&t, seq, &token, &p)
        }
    }

    /// [`WorkflowCtx::wait_for_signal`] bounded by `timeout`: `Ok(None)` when it passes first
    /// (the wait's waiter is removed; a later signal is buffered for the next wait). 2 seqs.
    pub fn wait_for_signal_timeout<T: DeserializeOwned + Send + 'static>(
        &self,
        token: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<T>, SignalError>> + Send + 'static + use<T> {
        let token = token.to_string();
        let deadline = self.t.take_seq();
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let wait = WaitKind::Signal { token: token.clone() };
            match await_delivery(&t, Some((deadline, timeout)), seq, &token, StepKind::Signal, wait).await {
                Some(p) => decode_delivery(&t, seq, &token, &p).map(Some),
                None => Ok(None),
            }
        }
    }

    /// Waits for an event named `name` published with [`Engine::publish_event`] whose payload
    /// includes every field of `matcher` (a JSON object; `{}` accepts any). A buffered event
    /// that matches is claimed first. 1 seq.
    pub fn wait_for_event<T: DeserializeOwned + Send + 'static>(
        &self,
        name: &str,
        matcher: serde_json::Value,
    ) -> impl Future<Output = Result<T, SignalError>> + Send + 'static + use<T> {
        let name = name.to_string();
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let wait = event_wait(&name, &matcher);
            let p = await_delivery(&t, None, seq, &name, StepKind::Event, wait).await.expect("no deadline");
            decode_delivery(&t, seq, &name, &p)
        }
    }

    /// [`WorkflowCtx::wait_for_event`] bounded by `timeout` (`Ok(None)` when it passes). 2 seqs.
    pub fn wait_for_event_timeout<T: DeserializeOwned + Send + 'static>(
        &self,
        name: &str,
        matcher: serde_json::Value,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<T>, SignalError>> + Send + 'static + use<T> {
        let name = name.to_string();
        let deadline = self.t.take_seq();
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let wait = event_wait(&name, &matcher);
            match await_delivery(&t, Some((deadline, timeout)), seq, &name, StepKind::Event, wait).await {
                Some(p) => decode_delivery(&t, seq, &name, &p).map(Some),
                None => Ok(None),
            }
        }
    }

    /// Publishes a query value: [`Engine::get_state`] returns the latest one set, during the
    /// run and after it finished. Committed before the future resolves. 1 seq.
    pub fn set_state<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
    ) -> impl Future<Output = ()> + Send + 'static + use<T> {
        let key = key.to_string();
        let seq = self.t.take_seq();
        let t = self.t.clone();
        let value = Payload::encode(value);
        async move {
            match t.begin(seq, &key, StepKind::State) {
                None => halt().await,
                Some(Decision::Replay(_)) => {}
                Some(Decision::Execute { .. }) => {
                    let value = match value {
                        Ok(v) => v,
                        Err(e) => {
                            t.stop(TurnStop::Fail(
                                StepError::fatal(format!(
                                    "run {}: state {key:?} (seq {seq}) does not serialize: {e}",
                                    t.run.id
                                ))
                                .with_code(codes::BAD_PAYLOAD),
                            ));
                            return halt().await;
                        }
                    };
                    let mut cp = t.checkpoint(seq, &key, StepKind::State, CheckpointStatus::Completed, t.now());
                    cp.output = Some(value.clone());
                    cp.attempts = 1;
                    let _flight = InFlight::new(&t);
                    t.turn.lock().set_state(key, value);
                    if t.commit(Some(cp), None).await.is_none() {
                        halt::<()>().await;
                    }
                }
                Some(other) => corrupt(&t, seq, &key, &other).await,
            }
        }
    }

    /// Waits for an update named `name` sent to this run with [`Engine::update`] (after its
    /// validator, if any, accepted it). Updates are buffered like signals. 1 seq.
    pub fn on_update<T: DeserializeOwned + Send + 'static>(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<T, SignalError>> + Send + 'static + use<T> {
        self.wait_for_signal(&update_token(self.run_id(), name))
    }

    /// An external task: runs `dispatch` as a step (hand the work out — send the email with the
    /// approval link, enqueue the job), then waits for [`Engine::complete_task`] or
    /// [`Engine::fail_task`] for this run and `name`. 2 seqs.
    pub fn task<'a, T, F, Fut>(
        &self,
        name: &str,
        dispatch: F,
    ) -> impl Future<Output = Result<T, TaskError>> + Send + 'a + use<'a, T, F, Fut>
    where
        T: DeserializeOwned + Send + 'static,
        F: FnMut(StepContext) -> Fut + Send + 'a,
        Fut: Future<Output = Result<(), StepError>> + Send + 'a,
    {
        let name = name.to_string();
        let step = self.step(format!("task:{name}"), dispatch);
        let wait = self.wait_for_signal::<TaskResult>(&task_token(self.run_id(), &name));
        let run_id = self.run_id().clone();
        async move {
            step.await.map_err(TaskError::Dispatch)?;
            match wait.await.map_err(TaskError::BadPayload)? {
                TaskResult::Ok(p) => p.decode().map_err(|e| {
                    TaskError::BadPayload(SignalError {
                        run_id: run_id.clone(),
                        seq: 0,
                        name: name.clone(),
                        message: e.to_string(),
                        payload: p.as_str().chars().take(500).collect(),
                    })
                }),
                TaskResult::Err(message) => Err(TaskError::Failed { run_id, name, message }),
            }
        }
    }
}

fn event_wait(name: &str, matcher: &serde_json::Value) -> WaitKind {
    WaitKind::Event { name: name.to_string(), matcher: Payload::encode(matcher).unwrap_or_else(|_| Payload::null()) }
}

impl Shared {
    /// Sends a signal and wakes the run that received it.
    async fn deliver(&self, token: &str, payload: Payload) -> Result<Delivery> {
        let delivery = self.store.send_signal(token, payload, self.clock.now()).await?;
        self.wake_delivered(std::slice::from_ref(&delivery));
        Ok(delivery)
    }

    fn encode_payload<T: Serialize + ?Sized>(&self, what: impl Fn() -> String, value: &T) -> Result<Payload> {
        let payload = Payload::encode(value).map_err(|source| Error::Serialize { what: what(), source })?;
        let limit = self.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge { what: what(), size: payload.len(), limit });
        }
        Ok(payload)
    }
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidName { what: what.to_string() });
    }
    Ok(())
}

/// A validator of update arguments, registered per workflow and update name.
pub(crate) type UpdateValidator = Arc<dyn Fn(&Payload) -> Result<(), String> + Send + Sync>;

impl Engine {
    /// Sends `payload` to the oldest wait on `token`, recording it at that wait's seq and
    /// waking its run; with no wait, buffers it (FIFO per token) for the next one. Every
    /// signal is consumed exactly once. A signal to a finished run's token is buffered
    /// harmlessly and reported as [`Delivery::Buffered`].
    pub async fn signal<T: Serialize + ?Sized>(&self, token: &str, payload: &T) -> Result<Delivery> {
        check_name("signal token", token)?;
        let shared = self.shared();
        let payload = shared.encode_payload(|| format!("the payload of signal {token:?}"), payload)?;
        shared.deliver(token, payload).await
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
            return Err(Error::InvalidName { what: "run id for signal_with_start (set StartOptions::id)".into() });
        }
        check_name("signal token", token)?;
        let payload = self.shared().encode_payload(|| format!("the payload of signal {token:?}"), payload)?;
        let started = self.start(workflow, input, options).await?;
        let delivery = self.shared().deliver(token, payload).await?;
        Ok((started, delivery))
    }

    /// Publishes an event: every run waiting on `name` whose matcher accepts the payload gets
    /// it; if none does, it is buffered for the first later wait that matches.
    pub async fn publish_event<T: Serialize + ?Sized>(&self, name: &str, payload: &T) -> Result<Vec<Delivery>> {
        check_name("event name", name)?;
        let shared = self.shared();
        let payload = shared.encode_payload(|| format!("the payload of event {name:?}"), payload)?;
        let deliveries = shared.store.publish_event(name, payload, shared.clock.now()).await?;
        shared.wake_delivered(&deliveries);
        Ok(deliveries)
    }

    /// The latest value a run set with `ctx.set_state(key, ..)`, also after it finished;
    /// `None` if it never set one.
    pub async fn get_state<T: DeserializeOwned>(&self, run_id: &RunId, key: &str) -> Result<Option<T>> {
        let Some(p) = self.shared().store.get_state(run_id, key).await? else { return Ok(None) };
        p.decode().map(Some).map_err(|source| Error::Output { id: run_id.clone(), source })
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
        self.shared().update_validators.lock().insert((workflow.to_string(), update.to_string()), v);
    }

    /// Sends an update to a run: validated first (the run must exist and be active; the
    /// registered validator, if any, must accept it), then delivered to the run's
    /// `ctx.on_update(name)`. A rejected update touches nothing.
    pub async fn update<T: Serialize + ?Sized>(&self, run_id: &RunId, name: &str, arg: &T) -> Result<UpdateOutcome> {
        check_name("update name", name)?;
        let shared = self.shared();
        let payload = shared.encode_payload(|| format!("the argument of update {name:?}"), arg)?;
        let reject = |reason: String| Ok(UpdateOutcome::Rejected { reason });
        let Some(run) = shared.store.get_run(run_id).await? else {
            return reject(format!("unknown run {run_id}"));
        };
        if run.status.is_terminal() {
            return reject(format!("run {run_id} is {}; updates go to active runs only", run.status));
        }
        let validator = shared.update_validators.lock().get(&(run.workflow.clone(), name.to_string())).cloned();
        if let Some(validator) = validator
            && let Err(reason) = validator(&payload)
        {
            return reject(format!("update {name:?} to run {run_id} rejected: {reason}"));
        }
        let delivery = shared.deliver(&update_token(run_id, name), payload).await?;
        Ok(UpdateOutcome::Accepted { delivered: matches!(delivery, Delivery::Delivered { .. }) })
    }

    /// Completes the external task `name` of a run with `value` (see [`WorkflowCtx::task`]).
    pub async fn complete_task<T: Serialize + ?Sized>(
        &self,
        run_id: &RunId,
        name: &str,
        value: &T,
    ) -> Result<Delivery> {
        check_name("task name", name)?;
        let shared = self.shared();
        let value = shared.encode_payload(|| format!("the result of task {name:?} of run {run_id}"), value)?;
        let payload = Payload::encode(&TaskResult::Ok(value)).expect("a payload serializes");
        shared.deliver(&task_token(run_id, name), payload).await
    }

    /// Fails the external task `name` of a run; the workflow sees [`TaskError::Failed`].
    pub async fn fail_task(&self, run_id: &RunId, name: &str, message: &str) -> Result<Delivery> {
        check_name("task name", name)?;
        let payload = Payload::encode(&TaskResult::Err(message.to_string())).expect("a string serializes");
        self.shared().deliver(&task_token(run_id, name), payload).await
    }
}
