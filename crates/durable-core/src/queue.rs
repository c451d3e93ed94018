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

/// How the dedupe key of a wake for a *claimed* due run begins: `claim=<until>;` (see
/// [`QueuedRun::claimed_until`]).
const CLAIM_PREFIX: &str = "claim=";

impl QueuedRun {
    /// The dedupe key of a wake a poller sends for a due run it claimed: the claim moved the
    /// run's `wake_at` to `until` (so that no other poller finds it meanwhile), and whichever
    /// engine takes the wake must know that the run is due although its `wake_at` says later.
    pub fn claim_key(until: Millis, key: &str) -> String {
        format!("{CLAIM_PREFIX}{until};{key}")
    }

    /// The end of the claim this item's wake was sent for ([`QueuedRun::claim_key`]), if any:
    /// the run is due as long as its `wake_at` is still exactly this (no turn parked it since).
    pub fn claimed_until(&self) -> Option<Millis> {
        let (until, _) = self.dedupe_key.strip_prefix(CLAIM_PREFIX)?.split_once(';')?;
        until.parse().ok()
    }

    /// Folds a later wake of the same run into this item's dedupe key, as a queue that keeps
    /// one item per run does: the later key wins, unless only this one names a claim — a claim
    /// must not be lost by a merge, or the engine that takes the item would read the claimed
    /// run as not due and drop it until the claim ends. (Stores that merge in SQL apply the
    /// same rule: the new key is kept unless the old starts with `claim=` and the new does not.)
    pub fn fold_wake_key(&mut self, later: String) {
        if later.starts_with(CLAIM_PREFIX) || !self.dedupe_key.starts_with(CLAIM_PREFIX) {
            self.dedupe_key = later;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str) -> QueuedRun {
        QueuedRun {
            id: 0,
            run_id: RunId::new("r"),
            reason: QueueReason::Wake,
            namespace: None,
            priority: 0,
            dedupe_key: key.into(),
        }
    }

    #[test]
    fn a_claim_travels_in_the_dedupe_key_and_survives_a_merge() {
        let claimed = item(&QueuedRun::claim_key(1_700, "wake:r:3@e1#9"));
        assert_eq!(claimed.dedupe_key, "claim=1700;wake:r:3@e1#9");
        assert_eq!(claimed.claimed_until(), Some(1_700));
        assert_eq!(item("wake:r:3").claimed_until(), None);
        assert_eq!(item("claim=x;wake:r:3").claimed_until(), None, "not a time");
        assert_eq!(item("wake:claim=5;r").claimed_until(), None, "only as a prefix");

        // A later plain wake does not erase the claim; a later claim replaces it; a plain key
        // gives way to a later one.
        let mut merged = claimed.clone();
        merged.fold_wake_key("wake:r:4".into());
        assert_eq!(merged.claimed_until(), Some(1_700));
        merged.fold_wake_key(QueuedRun::claim_key(2_000, "wake:r:5"));
        assert_eq!(merged.claimed_until(), Some(2_000));
        let mut plain = item("start:r:1");
        plain.fold_wake_key("wake:r:2".into());
        assert_eq!(plain.dedupe_key, "wake:r:2");
    }
}
