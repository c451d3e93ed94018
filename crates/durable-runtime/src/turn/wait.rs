//! Waiting on the outside world: signals, events, updates and external tasks — all deliveries
//! recorded at the waiting call's seq, so replay returns what was delivered — and query state.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use durable_core::protocol::{self, TaskResult};
use durable_core::{Deadline, Payload, RunId, StateBegin, StepError, StepKind, WaitBegin, WaitCall, WaitKind};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CallGuard, StepContext, TurnState, WorkflowCtx, halt};
use crate::error::StepFailed;

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
    /// The outside world reported failure with [`Engine::fail_task`](crate::Engine::fail_task).
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

/// The answer of [`Engine::update`](crate::Engine::update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// Validated and handed to the run (`delivered`: a waiting `on_update` took it at once;
    /// otherwise it is buffered for the next one).
    Accepted {
        /// Whether a waiting `on_update` call took it at once.
        delivered: bool,
    },
    /// Refused by the update's validator
    /// ([`Engine::register_update_validator`](crate::Engine::register_update_validator)); the
    /// run was not touched. (An unknown or finished run is an error instead:
    /// [`Error::RunNotFound`](crate::Error::RunNotFound),
    /// [`Error::RunFinished`](crate::Error::RunFinished).)
    Rejected {
        /// Why: the validator's answer, or that the argument does not decode into the type the
        /// validator takes.
        reason: String,
    },
}

fn decode_delivery<T: DeserializeOwned>(t: &TurnState, seq: u32, name: &str, p: &Payload) -> Result<T, SignalError> {
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
    t: &Arc<TurnState>,
    deadline: Option<(u32, Duration)>,
    seq: u32,
    named: (&str, &str),
    name: &str,
    kind: StepKind,
    wait: WaitKind,
) -> Option<Payload> {
    let _call = CallGuard::new(t, seq);
    let deadline = deadline.map(|(seq, after)| Deadline { seq, after });
    let lowest = deadline.map_or(seq, |d| d.seq.min(seq));
    loop {
        let begin = t.turn.lock().wait(seq, WaitCall { named, name, kind, wait: wait.clone(), deadline }, t.now());
        match begin {
            WaitBegin::Delivered(p) => return Some(p),
            WaitBegin::TimedOut => return None,
            WaitBegin::Expire(commit) => {
                if !t.apply(seq, commit).await {
                    return halt().await;
                }
                return None;
            }
            WaitBegin::Stopped => return halt().await,
            // A warm resume wakes it to begin again (as a replay of this seq would).
            WaitBegin::Park(_) => {
                let token = match &wait {
                    WaitKind::Signal { token } => Some(token.as_str()),
                    WaitKind::Event { .. } => None,
                };
                t.park_warm(seq, lowest, token).await;
            }
        }
    }
}

impl WorkflowCtx {
    /// Waits for a signal sent to `token` with [`Engine::signal`](crate::Engine::signal). The oldest buffered signal
    /// for the token is taken first (FIFO); otherwise the run suspends until one arrives.
    /// 1 seq.
    pub fn wait_for_signal<T: DeserializeOwned + Send + 'static>(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<T, SignalError>> + Send + 'static + use<T> {
        self.signal_wait((protocol::SIGNAL_TOKEN, token.to_string()), token.to_string())
    }

    /// A signal wait on `token`; `named` is what the workflow named (checked by the core).
    fn signal_wait<T: DeserializeOwned + Send + 'static>(
        &self,
        named: (&'static str, String),
        token: String,
    ) -> impl Future<Output = Result<T, SignalError>> + Send + 'static + use<T> {
        let seq = self.t.take_seq();
        let t = self.t.clone();
        async move {
            let wait = WaitKind::Signal { token: token.clone() };
            let named = (named.0, named.1.as_str());
            let Some(p) = await_delivery(&t, None, seq, named, &token, StepKind::Signal, wait).await else {
                return halt().await;
            };
            // Named as the workflow named it (an update's name, not its internal token).
            decode_delivery(&t, seq, named.1, &p)
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
            let named = (protocol::SIGNAL_TOKEN, token.as_str());
            match await_delivery(&t, Some((deadline, timeout)), seq, named, &token, StepKind::Signal, wait).await {
                Some(p) => decode_delivery(&t, seq, &token, &p).map(Some),
                None => Ok(None),
            }
        }
    }

    /// Waits for an event named `name` published with [`Engine::publish_event`](crate::Engine::publish_event) whose payload
    /// includes every field of `matcher` (a JSON object; `{}` accepts any object payload). A buffered event
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
            let named = ("event name", name.as_str());
            let Some(p) = await_delivery(&t, None, seq, named, &name, StepKind::Event, wait).await else {
                return halt().await;
            };
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
            let named = ("event name", name.as_str());
            match await_delivery(&t, Some((deadline, timeout)), seq, named, &name, StepKind::Event, wait).await {
                Some(p) => decode_delivery(&t, seq, &name, &p).map(Some),
                None => Ok(None),
            }
        }
    }

    /// Publishes a query value: [`Engine::get_state`](crate::Engine::get_state) returns the latest one set, during the
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
            let _call = CallGuard::new(&t, seq);
            let value = value.map_err(|e| e.to_string());
            let begin = t.turn.lock().set_state(seq, &key, value, t.now());
            match begin {
                StateBegin::Done => {}
                StateBegin::Commit(commit) => {
                    if !t.apply(seq, commit).await {
                        halt::<()>().await;
                    }
                }
                StateBegin::Park | StateBegin::Stopped => halt::<()>().await,
            }
        }
    }

    /// Waits for an update named `name` sent to this run with [`Engine::update`](crate::Engine::update) (after its
    /// validator, if any, accepted it). Updates are buffered like signals. 1 seq.
    pub fn on_update<T: DeserializeOwned + Send + 'static>(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<T, SignalError>> + Send + 'static + use<T> {
        self.signal_wait(("update name", name.to_string()), protocol::update_token(self.run_id(), name))
    }

    /// An external task: runs `dispatch` as a step (hand the work out — send the email with the
    /// approval link, enqueue the job), then waits for [`Engine::complete_task`](crate::Engine::complete_task) or
    /// [`Engine::fail_task`](crate::Engine::fail_task) for this run and `name`. 2 seqs.
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
        let step = self.step(protocol::task_step_name(&name), dispatch);
        // The wait takes the seq right after the step's, at this call.
        let seq = step.seq() + 1;
        let token = protocol::task_token(self.run_id(), &name);
        let wait = self.signal_wait::<TaskResult>(("task name", name.clone()), token);
        let run_id = self.run_id().clone();
        let t = self.t.clone();
        async move {
            // A task no result can reach is not handed out at all.
            if !t.turn.lock().check_name(seq, "task name", &name) {
                return halt().await;
            }
            step.await.map_err(TaskError::Dispatch)?;
            match wait.await.map_err(TaskError::BadPayload)? {
                TaskResult::Ok(p) => p.decode().map_err(|e| {
                    TaskError::BadPayload(SignalError {
                        run_id: run_id.clone(),
                        seq,
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
