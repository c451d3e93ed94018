//! Flow control: workflow concurrency keys (and singletons) and step queues with concurrency,
//! rate limits, priority and fairness — held in the store, so they hold across every process
//! sharing it. The decisions are the core's ([`durable_core::admission`]); this module keeps
//! what the caller registered and turns it into requests.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use durable_core::admission::{Limits, Order, PriorityOrder, Rate, SlotRequest};
use durable_core::{Payload, RunId, protocol};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;

/// How a step queue admits steps ([`Engine::register_queue`](crate::Engine::register_queue)).
///
/// ```
/// use std::time::Duration;
/// use durable_runtime::QueueOptions;
/// // At most 4 calls at once and 10 per second; tenants served round robin.
/// let api = QueueOptions::default().concurrency(4).rate(10, Duration::from_secs(1)).fair();
/// # let _ = api;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueOptions {
    limits: Limits,
    /// A rate window that is no whole number of milliseconds (the store keeps milliseconds):
    /// refused at registration rather than rounded.
    odd_period: Option<Duration>,
}

impl QueueOptions {
    /// At most `n` steps of the queue execute at once, across every process.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.limits.concurrency = Some(n);
        self
    }

    /// At most `n` steps of the queue are admitted per `period` (a fixed window, a whole
    /// number of milliseconds).
    pub fn rate(mut self, n: u32, period: Duration) -> Self {
        // Not `Rate::per`, which rounds a window under 1 ms up to 1 ms: registering it is
        // refused instead ([`Error::BadQueue`]), as is a window of 1.5 ms (kept as 1 ms, it
        // would admit half as much again as asked).
        self.limits.rate = Some(Rate { limit: n, period_ms: durable_core::millis(period) });
        self.odd_period = (!period.subsec_nanos().is_multiple_of(1_000_000) && !period.is_zero()).then_some(period);
        self
    }

    /// Why these options cannot be registered, if they cannot.
    pub(crate) fn problem(&self) -> Option<String> {
        if let Err(reason) = self.limits.validate() {
            return Some(reason);
        }
        self.odd_period.map(|p| format!("a rate window is a whole number of milliseconds, not {p:?}"))
    }

    /// Waiting steps of different fairness keys ([`Step::fairness_key`](crate::Step::fairness_key))
    /// are served round robin, so one busy key cannot starve the others.
    pub fn fair(mut self) -> Self {
        self.limits.fairness = true;
        self
    }

    /// Among waiters of equal priority the newest goes first (default: the oldest).
    pub fn lifo(mut self) -> Self {
        self.limits.order = Order::Lifo;
        self
    }

    /// A lower priority is served first (default: a higher one).
    pub fn lowest_priority_first(mut self) -> Self {
        self.limits.priority = PriorityOrder::LowestFirst;
        self
    }

    /// The limits as the core sees them.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// A workflow's concurrency key: at most `limit` runs with one key are running or suspended
/// at once; more wait `pending` (up to `max_queue_depth` of them).
/// A workflow's key function over a run's encoded input.
type KeyFn = Arc<dyn Fn(&Payload) -> std::result::Result<String, String> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct ConcurrencyKey {
    key: KeyFn,
    pub(crate) limit: u32,
    pub(crate) max_queue_depth: Option<u32>,
}

impl ConcurrencyKey {
    pub(crate) fn new<I: DeserializeOwned + 'static>(
        key: impl Fn(&I) -> String + Send + Sync + 'static,
        limit: u32,
    ) -> Self {
        ConcurrencyKey {
            key: Arc::new(move |input: &Payload| input.decode::<I>().map(|i| key(&i)).map_err(|e| e.to_string())),
            limit,
            max_queue_depth: None,
        }
    }

    /// The key of a run with `input`. A key function that panics is an error like one whose
    /// input does not decode: the caller (a start, a publish, a parent's child call) is told,
    /// rather than unwound by another workflow's code.
    pub(crate) fn key_of(&self, input: &Payload) -> std::result::Result<String, String> {
        let key = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.key)(input)))
            .map_err(|panic| format!("the key function panicked: {}", crate::turn::panic_message(panic.as_ref())))??;
        match protocol::storage_problem(&key) {
            None => Ok(key),
            Some(problem) => Err(format!("the concurrency key {}: {problem}", protocol::shown(&key))),
        }
    }
}

impl fmt::Debug for ConcurrencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyKey")
            .field("limit", &self.limit)
            .field("max_queue_depth", &self.max_queue_depth)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ConcurrencyKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.key, &other.key) && self.limit == other.limit && self.max_queue_depth == other.max_queue_depth
    }
}

impl Eq for ConcurrencyKey {}

/// What this engine registered: step queues by name and concurrency keys by workflow.
#[derive(Default)]
pub(crate) struct FlowControl {
    queues: RwLock<HashMap<String, Limits>>,
    keys: RwLock<HashMap<String, ConcurrencyKey>>,
}

impl FlowControl {
    /// Registers (or replaces) a step queue's limits.
    pub(crate) fn set_queue(&self, name: &str, limits: Limits) {
        self.queues.write().insert(name.to_string(), limits);
    }

    /// The limits of a registered step queue.
    pub(crate) fn queue(&self, name: &str) -> Option<Limits> {
        self.queues.read().get(name).copied()
    }

    /// Whether any workflow registered here has a concurrency key.
    pub(crate) fn has_keys(&self) -> bool {
        !self.keys.read().is_empty()
    }

    /// Whether `workflow` has a concurrency key.
    /// Whether a run of `workflow` with `input` in `namespace` can take its concurrency key (or
    /// needs none): checked where the run is created later, by the scheduler (a schedule's
    /// fires, a debounce's run), which could only start it without its key otherwise.
    pub(crate) fn check_key(&self, workflow: &str, namespace: &str, input: &Payload) -> crate::Result<()> {
        self.start_request(workflow, namespace, &RunId::new(""), input, 0, 0)
            .map(drop)
            .map_err(|reason| crate::Error::BadKey { workflow: workflow.to_string(), reason })
    }

    pub(crate) fn keyed(&self, workflow: &str) -> bool {
        self.keys.read().contains_key(workflow)
    }

    pub(crate) fn set_key(&self, workflow: &str, key: Option<ConcurrencyKey>) {
        let mut keys = self.keys.write();
        match key {
            Some(k) => keys.insert(workflow.to_string(), k),
            None => keys.remove(workflow),
        };
    }

    /// The request a run of `workflow` with `input` makes, if the workflow has a key: a start,
    /// or a run the engine creates (a child, a successor, an event's or a schedule's run).
    /// `Err`: why the key function could not read the input.
    pub(crate) fn start_request(
        &self,
        workflow: &str,
        namespace: &str,
        run_id: &RunId,
        input: &Payload,
        priority: i32,
        now: durable_core::Millis,
    ) -> std::result::Result<Option<SlotRequest>, String> {
        let Some(k) = self.keys.read().get(workflow).cloned() else {
            return Ok(None);
        };
        let key = k.key_of(input)?;
        let gate = protocol::key_gate(namespace, workflow, &key);
        if let Some(problem) = protocol::gate_problem(&gate, "") {
            return Err(format!(
                "the concurrency key {} of namespace {}: {problem}; use a shorter key (or namespace, or workflow name)",
                protocol::shown(&key),
                protocol::shown(namespace),
            ));
        }
        Ok(Some(SlotRequest {
            gate,
            holder: run_id.to_string(),
            run_id: run_id.clone(),
            priority,
            fairness_key: String::new(),
            limits: Limits { concurrency: Some(k.limit), ..Limits::default() },
            lease_until: None,
            max_waiting: k.max_queue_depth,
            succeeds: None,
            now,
        }))
    }
}

impl fmt::Debug for FlowControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowControl")
            .field("queues", &*self.queues.read())
            .field("keys", &self.keys.read().keys().collect::<Vec<_>>())
            .finish()
    }
}
