//! Warm runs: the turns of suspended runs kept in memory, so that a wake of the run on this
//! engine continues the parked body instead of replaying its history
//! ([`EngineConfig::warm_runs`](crate::EngineConfig::warm_runs)).
//!
//! An entry is the turn's state and its driver (which owns the parked body future), with the
//! run's claim count as of the claim that ran the turn and the lowest seq its parked calls
//! look at. The executor takes the entry out before it claims the run again; it resumes the
//! turn only if that claim is the very next one of the run (nobody else claimed it meanwhile)
//! and the store's checkpoints from that seq on are the turn's own plus deliveries to its
//! parked calls — otherwise the entry is dropped and the turn replays. Entries are also
//! dropped on a cancel of the run, past the capacity (least recently parked first) and when
//! the engine stops.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use durable_core::RunId;
use parking_lot::Mutex;

use crate::turn::{TurnDriver, TurnState};

/// A suspended turn kept in memory.
pub(super) struct Parked {
    /// The turn's state (the core's turn, the undo closures, the parked calls).
    pub(super) t: Arc<TurnState>,
    /// The driver, which owns the parked body.
    pub(super) driver: TurnDriver,
    /// The run's claim count after the claim that ran the turn: the next claim must find one
    /// more.
    pub(super) claims: u64,
    /// The lowest seq the parked calls look at: the next claim reads the checkpoints from
    /// here on.
    pub(super) from_seq: u32,
    /// The signal tokens the parked calls wait on: a signal this engine sends to one of them
    /// claims the run in the same write ([`Warm::waiting_on`]).
    pub(super) tokens: Vec<String>,
}

/// The bounded cache of parked turns, by run.
pub(super) struct Warm {
    capacity: usize,
    inner: Mutex<Inner>,
    /// Turns resumed from the cache.
    pub(super) resumed: AtomicU64,
    /// Entries dropped without a resume: a doubt at the next claim, a cancel, eviction,
    /// shutdown.
    pub(super) dropped: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// The entries with the tick they were put at.
    runs: HashMap<RunId, (u64, Parked)>,
    /// The entries by tick: the oldest is evicted first.
    order: BTreeMap<u64, RunId>,
    /// The run of an entry waiting on each signal token (the last one put, if several).
    tokens: HashMap<String, RunId>,
    tick: u64,
}

impl Inner {
    /// Takes the run's entry out, with its tokens.
    fn remove(&mut self, id: &RunId) -> Option<Parked> {
        let (tick, parked) = self.runs.remove(id)?;
        self.order.remove(&tick);
        for token in &parked.tokens {
            if self.tokens.get(token) == Some(id) {
                self.tokens.remove(token);
            }
        }
        Some(parked)
    }
}

impl Warm {
    pub(super) fn new(capacity: usize) -> Self {
        Warm { capacity, inner: Mutex::new(Inner::default()), resumed: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }

    /// Whether warm runs are on.
    pub(super) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Keeps a suspended turn; evicts the least recently parked entries past the capacity.
    /// The evicted bodies are dropped after the lock is released (dropping a body takes its
    /// turn's lock).
    pub(super) fn put(&self, id: RunId, parked: Parked) {
        if !self.enabled() {
            return;
        }
        let evicted = {
            let mut inner = self.inner.lock();
            inner.tick += 1;
            let tick = inner.tick;
            let mut evicted: Vec<Parked> = inner.remove(&id).into_iter().collect();
            for token in &parked.tokens {
                inner.tokens.insert(token.clone(), id.clone());
            }
            inner.runs.insert(id.clone(), (tick, parked));
            inner.order.insert(tick, id);
            while inner.runs.len() > self.capacity {
                let Some((_, oldest)) = inner.order.pop_first() else { break };
                evicted.extend(inner.remove(&oldest));
            }
            evicted
        };
        self.count_dropped(evicted.len() as u64);
        drop(evicted);
    }

    /// Puts back an entry taken out for a claim that did not get the run, unless the run has
    /// an entry again (a turn that ran meanwhile kept a newer one): then the one given is
    /// dropped. Whether it is still the run's latest turn is decided at the claim that
    /// acquires the run, by the count of claims, as for any entry.
    pub(super) fn put_back(&self, id: &RunId, parked: Parked) {
        if self.inner.lock().runs.contains_key(id) {
            self.count_dropped(1);
            drop(parked);
            return;
        }
        self.put(id.clone(), parked);
    }

    /// Takes the run's entry out, if there is one.
    pub(super) fn take(&self, id: &RunId) -> Option<Parked> {
        self.inner.lock().remove(id)
    }

    /// The run of an entry whose parked calls wait on the signal `token`, with its namespace
    /// and the seq its next claim reads the checkpoints from.
    pub(super) fn waiting_on(&self, token: &str) -> Option<(RunId, String, u32)> {
        let inner = self.inner.lock();
        let id = inner.tokens.get(token)?;
        inner.runs.get(id).map(|(_, parked)| (id.clone(), parked.t.run.namespace.clone(), parked.from_seq))
    }

    /// Drops the run's entry, if there is one.
    pub(super) fn remove(&self, id: &RunId) {
        if let Some(parked) = self.take(id) {
            self.count_dropped(1);
            drop(parked);
        }
    }

    /// Drops every entry (the engine stops).
    pub(super) fn clear(&self) {
        let all = std::mem::take(&mut *self.inner.lock());
        self.count_dropped(all.runs.len() as u64);
        drop(all);
    }

    /// Counts entries dropped without a resume.
    pub(super) fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        crate::metrics::warm_dropped(n);
    }

    /// Counts a resume.
    pub(super) fn count_resumed(&self) {
        self.resumed.fetch_add(1, Ordering::Relaxed);
        crate::metrics::warm_resume();
    }

    /// Entries held now.
    pub(super) fn len(&self) -> usize {
        self.inner.lock().runs.len()
    }
}
