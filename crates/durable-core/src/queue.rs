//! The run queue a store can provide to a store-backed transport: runs to execute (starts and
//! wakes), claimed with a lease so a consumer that dies leaves its claims to others.
//!
//! Defined here, next to [`Store`](crate::Store), so a store crate still depends on nothing but
//! the core; `durable-transport` builds its store-backed transport on this trait and never
//! names a store crate.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Millis, RunId, StoreResult};

/// Why a run is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueReason {
    /// A new (or retried) run to start.
    Start,
    /// A parked run with something new to see (a due timer, a delivery).
    Wake,
}

impl QueueReason {
    /// The lower-case name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueReason::Start => "start",
            QueueReason::Wake => "wake",
        }
    }
}

impl fmt::Display for QueueReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One queued run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedRun {
    /// Assigned by the queue (0 before it is enqueued).
    pub id: u64,
    /// The run to execute.
    pub run_id: RunId,
    /// Why.
    pub reason: QueueReason,
    /// The run's namespace, when the sender knows it (a store-backed queue fills it in from the
    /// run row otherwise).
    pub namespace: Option<String>,
    /// The run's priority (higher first).
    pub priority: i32,
    /// Identifies the pending state this item was sent for, e.g. `start:<run>:<n>`; a retry or
    /// a recovery gets a new key. Brokers use it to drop duplicate sends.
    pub dedupe_key: String,
}

/// A queue of runs to execute, kept by a store.
///
/// # Contract (checked by the conformance suite for stores that provide one)
/// - `enqueue` is atomic for the batch. A run has at most one *unclaimed* item: enqueueing a
///   run that has one updates it (a `Wake` replaces a `Start`, the higher priority is kept)
///   instead of adding another. Items of runs that do not exist are dropped. Missing
///   namespaces are filled in from the run.
/// - `claim_queued` hands out unclaimed items (or items whose claim expired) of the namespace
///   (`None`: any), highest priority first, then oldest; each item to exactly one claimer.
/// - `ack_queued` deletes items still claimed by the owner; `release_queued` makes them
///   unclaimed again, at once (when the run was queued again meanwhile, the released item
///   folds into that unclaimed item as an enqueue would, so the run keeps one). An item whose
///   claim expired and was taken by another claimer is no longer the first owner's.
#[async_trait]
pub trait RunQueue: Send + Sync + fmt::Debug + 'static {
    /// Adds items (see the contract).
    async fn enqueue(&self, items: Vec<QueuedRun>, now: Millis) -> StoreResult<()>;

    /// Claims up to `limit` items for `owner` until `claim_until`.
    async fn claim_queued(
        &self,
        namespace: Option<&str>,
        owner: &str,
        limit: usize,
        claim_until: Millis,
        now: Millis,
    ) -> StoreResult<Vec<QueuedRun>>;

    /// Deletes handled items claimed by `owner`.
    async fn ack_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()>;

    /// Hands claimed items back, unhandled.
    async fn release_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()>;

    /// Items waiting (claimed or not), for monitoring.
    async fn queued_len(&self) -> StoreResult<u64>;
}
