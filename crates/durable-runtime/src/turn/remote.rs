//! `ctx.remote_step`: a step executed by a [`Worker`](crate::Worker) in another process (or
//! this one). The core decides every dispatch, retry and result; this only builds the call
//! and decodes what comes back.

use std::fmt;
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use durable_core::task::RemoteOptions;
use durable_core::{Backoff, GateCall, Payload, RemoteBegin, RemoteCall, RetryPolicy, protocol};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CallGuard, TurnState, WorkflowCtx, halt};
use crate::clock::BoxFuture;
use crate::error::StepFailed;

/// Remote steps retry 3 times by default, waiting 1 s, 2 s, 4 s (durably) in between.
fn default_policy() -> RetryPolicy {
    RetryPolicy::new(3, Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60)))
}

/// A remote step: a future resolving to the worker's output, or [`StepFailed`] after its last
/// attempt. Created by [`WorkflowCtx::remote_step`], which takes its seq; set its options
/// before awaiting it.
#[must_use = "a remote step does nothing unless awaited"]
pub struct RemoteStep<O> {
    t: Arc<TurnState>,
    seq: u32,
    name: String,
    input: Result<Payload, String>,
    options: RemoteOptions,
    fairness_key: String,
    _out: PhantomData<fn() -> O>,
}

impl<O> fmt::Debug for RemoteStep<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteStep").field("seq", &self.seq).field("name", &self.name).finish()
    }
}

impl<O> RemoteStep<O> {
    /// Retries after the first attempt (failures and timed-out attempts) and the backoff
    /// between them. Every wait is durable: the run suspends, and the attempt count lives in
    /// the checkpoint. Default: 3 retries, exponential from 1 s to 60 s.
    pub fn retry(mut self, retries: u32, backoff: Backoff) -> Self {
        self.options.policy = RetryPolicy::new(retries, backoff).with_jitter(self.options.policy.jitter);
        self
    }

    /// The whole retry policy.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.options.policy = policy;
        self
    }

    /// Start-to-close of one attempt, from its first claim by a worker. A worker past it sees
    /// `ctx.cancelled()` resolve, its result is dropped, and the attempt fails with
    /// `remote_timeout` (retried by the policy). Default: none.
    ///
    /// # Panics
    /// If `timeout` is under a millisecond: every attempt would be over before it began.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        at_least_a_millisecond("timeout", timeout);
        self.options.timeout = Some(timeout);
        self
    }

    /// How long an attempt may wait for a worker to claim it before it fails with
    /// `remote_timeout`. Default: forever.
    ///
    /// # Panics
    /// If `timeout` is under a millisecond: no worker could claim an attempt in time.
    pub fn pickup_timeout(mut self, timeout: Duration) -> Self {
        at_least_a_millisecond("pickup_timeout", timeout);
        self.options.pickup_timeout = Some(timeout);
        self
    }

    /// The lease a worker's claim (and each heartbeat) takes: a worker silent for longer loses
    /// the task, which goes to another worker (same attempt). Default 30 s.
    ///
    /// # Panics
    /// If `timeout` is under a millisecond: every claim would lapse at once and each attempt
    /// would run on several workers.
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        at_least_a_millisecond("heartbeat_timeout", timeout);
        self.options.heartbeat_timeout = timeout;
        self
    }

    /// Capabilities a worker must have to take the step. With no live worker that has them
    /// the run shows as `blocked` until one appears.
    pub fn requires<I, S>(mut self, capabilities: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.options.requires = capabilities.into_iter().map(Into::into).collect();
        self
    }

    /// The queue workers take it from. Default: the step's name. Queues are partitioned by
    /// the run's namespace. If the engine registered a step queue of that name
    /// ([`Engine::register_queue`](crate::Engine::register_queue)), each attempt first takes
    /// one of its slots (held until the attempt's result is recorded), so the queue's
    /// concurrency and rate hold for the remote step too.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.options.queue = Some(queue.into());
        self
    }

    /// Higher first among the queue's waiting tasks (and among the waiters for a slot of a
    /// registered step queue). Default 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.options.priority = priority;
        self
    }

    /// The step's fairness key in a registered step queue with
    /// [`QueueOptions::fair`](crate::QueueOptions::fair): keys are served round robin.
    pub fn fairness_key(mut self, key: impl Into<String>) -> Self {
        self.fairness_key = key.into();
        self
    }

    /// The step's seq.
    pub fn seq(&self) -> u32 {
        self.seq
    }
}

impl<O: DeserializeOwned + Send + 'static> IntoFuture for RemoteStep<O> {
    type Output = Result<O, StepFailed>;
    type IntoFuture = BoxFuture<'static, Result<O, StepFailed>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(run_remote(self))
    }
}

/// Refuses a remote step's timeout under a millisecond (the store keeps milliseconds), by a
/// panic naming the option: the run fails with it (a mistake in the workflow's code).
fn at_least_a_millisecond(option: &str, timeout: Duration) {
    assert!(
        timeout >= Duration::from_millis(1),
        "remote step option {option}({timeout:?}) is under a millisecond: give it at least 1 ms"
    );
}

async fn run_remote<O: DeserializeOwned>(s: RemoteStep<O>) -> Result<O, StepFailed> {
    let RemoteStep { t, seq, name, input, options, fairness_key, .. } = s;
    let _call = CallGuard::new(&t, seq);
    // A registered step queue of the routing queue's name gates each attempt.
    let queue = options.queue.clone().unwrap_or_else(|| name.clone());
    let gate_name = protocol::queue_gate(&t.run.namespace, &queue);
    let gate = t.env.queue_limits(&queue).filter(|l| l.gates()).map(|limits| GateCall {
        gate: &gate_name,
        limits,
        priority: options.priority,
        fairness_key: &fairness_key,
    });
    let call = |input: Result<Payload, String>| RemoteCall { name: &name, input, options: &options, gate };
    let mut begin = t.turn.lock().remote_step(seq, call(input.clone()), t.now());
    if let RemoteBegin::Acquire(request) = begin {
        begin = match t.acquire_slot(seq, request).await {
            Some(answer) => t.turn.lock().remote_admitted(seq, call(input), answer, t.now()),
            None => RemoteBegin::Stopped,
        };
    }
    match begin {
        RemoteBegin::Return(p) => match t.decode::<O>(seq, &name, &p) {
            Some(v) => Ok(v),
            None => halt().await,
        },
        RemoteBegin::Fail { error, attempts } => {
            Err(StepFailed { run_id: t.run.id.clone(), name, seq, error, attempts })
        }
        RemoteBegin::Park(_) | RemoteBegin::Stopped | RemoteBegin::Acquire(_) => halt().await,
    }
}

impl WorkflowCtx {
    /// A step executed by a [`Worker`](crate::Worker) that serves `name` (its queue, unless
    /// [`RemoteStep::queue`] says otherwise): the task and the step's checkpoint are written
    /// in one commit, the run suspends, and the worker's result wakes it. Exactly one result
    /// per attempt counts; retries (failures, lost or timed-out attempts) follow the step's
    /// policy with durable waits. 1 seq.
    ///
    /// ```no_run
    /// # use durable_runtime::{WorkflowCtx, WorkflowError};
    /// # use std::time::Duration;
    /// async fn thumbnail(ctx: WorkflowCtx, url: String) -> Result<String, WorkflowError> {
    ///     let path: String = ctx
    ///         .remote_step("resize", &url)
    ///         .timeout(Duration::from_secs(120))
    ///         .heartbeat_timeout(Duration::from_secs(10))
    ///         .requires(["gpu"])
    ///         .await?;
    ///     Ok(path)
    /// }
    /// ```
    pub fn remote_step<O, I>(&self, name: &str, input: &I) -> RemoteStep<O>
    where
        I: Serialize + ?Sized,
    {
        RemoteStep {
            seq: self.t.take_seq(),
            t: self.t.clone(),
            name: name.to_string(),
            input: Payload::encode(input).map_err(|e| e.to_string()),
            options: RemoteOptions { policy: default_policy(), ..RemoteOptions::default() },
            fairness_key: String::new(),
            _out: PhantomData,
        }
    }
}
