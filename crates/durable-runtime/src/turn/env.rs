//! The narrow environment a turn runs in.

use durable_core::admission::{Admission, Limits, SlotRequest};
use durable_core::{Commit, CommitOutcome, Millis, Run, RunId, StoreResult};

use crate::clock::BoxFuture;
use crate::events::EngineEvent;

/// Everything a turn needs from the engine: time, the commit, events and the registry's
/// newest versions. The engine implements it; tests can too.
pub(crate) trait TurnEnv: Send + Sync + 'static {
    /// The engine clock's time.
    fn now(&self) -> Millis;
    /// Resolves at `at` on the engine clock.
    fn sleep_until(&self, at: Millis) -> BoxFuture<'static, ()>;
    /// Applies a commit and releases its effects (created children and delivered signals are
    /// dispatched) only once the store acknowledged it.
    fn commit(&self, commit: Commit) -> BoxFuture<'_, StoreResult<CommitOutcome>>;
    /// The runs that exist with these ids (a commit creating runs is vetted against them).
    fn existing_runs(&self, ids: Vec<RunId>) -> BoxFuture<'_, StoreResult<Vec<Run>>>;
    /// The run as the store holds it, read in a batch with the other reads asked for at the
    /// same time.
    fn read_run(&self, id: RunId) -> BoxFuture<'_, StoreResult<Option<Run>>>;
    /// Sends an engine event.
    fn emit(&self, event: EngineEvent);
    /// The newest registered version of `workflow`, if any.
    fn latest_version(&self, workflow: &str) -> Option<u32>;
    /// Asks the store for an admission slot.
    fn acquire_slot(&self, request: SlotRequest) -> BoxFuture<'_, StoreResult<Admission>>;
    /// The limits of the step queue `name`, if it is registered.
    fn queue_limits(&self, name: &str) -> Option<Limits>;
    /// Whether a turn may hold its sleeps now ([`EngineConfig::hold_sleeps_under`](crate::EngineConfig::hold_sleeps_under)):
    /// not while the engine drains or stops, nor while no execution slot is free (a held turn
    /// keeps its slot; suspended, it frees it for the runs waiting).
    fn may_hold(&self) -> bool;
    /// A turn begins to wait out a held sleep (keeping its execution slot); returns whether a
    /// run waits for a slot already, so the turn should ask [`TurnEnv::may_hold`] again at once.
    /// Each call is followed by one [`TurnEnv::hold_ended`].
    fn hold_began(&self) -> bool;
    /// The wait [`TurnEnv::hold_began`] counted ended.
    fn hold_ended(&self);
    /// The concurrency key's request of a run the turn creates (a child, a successor), if its
    /// workflow has a key; `Err`: why the key could not be computed from `input`.
    fn key_request(&self, run: &NewRunKey<'_>) -> Result<Option<SlotRequest>, String>;
}

/// What a run's concurrency key is computed from ([`TurnEnv::key_request`]).
pub(crate) struct NewRunKey<'a> {
    pub(crate) workflow: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) id: &'a RunId,
    pub(crate) input: &'a durable_core::Payload,
    pub(crate) priority: i32,
    pub(crate) now: Millis,
}
