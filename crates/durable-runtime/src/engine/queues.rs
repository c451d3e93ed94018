//! Flow control on the engine: registering step queues and reading the admission records
//! (the registry and the requests live in [`crate::flow`]).

use durable_core::RunId;
use durable_core::admission::{GateStats, SlotRecord, WaiterRecord};

use super::Engine;
use crate::error::{Error, Result};
use crate::flow::QueueOptions;

impl Engine {
    /// Registers (or replaces) the step queue `name`: steps that name it
    /// ([`Step::queue`](crate::Step::queue), [`RemoteStep::queue`](crate::RemoteStep::queue))
    /// pass its limits first, across every process sharing the store. A step not admitted
    /// parks its run durably and is woken when a slot frees (or its rate window ends). A queue
    /// name no engine registered is ungated. Register the same options on every engine that
    /// runs the steps (the options travel with each request; the latest request's win).
    ///
    /// # Errors
    /// [`Error::BadQueue`] for limits that would admit nothing (a concurrency or rate of 0) or
    /// a rate window under 1 ms.
    pub fn register_queue(&self, name: &str, options: QueueOptions) -> Result<()> {
        if let Some(reason) = options.problem() {
            return Err(Error::BadQueue { name: name.into(), reason });
        }
        let limits = options.limits();
        if name.trim().is_empty() {
            // No remote step can be routed to a blank name (`invalid_name`).
            return Err(Error::BadQueue { name: name.into(), reason: "a queue needs a name that is not blank".into() });
        }
        if let Some(reason) = durable_core::protocol::storage_problem(name) {
            return Err(Error::BadQueue { name: name.into(), reason });
        }
        self.shared().flow.set_queue(name, limits);
        Ok(())
    }

    /// Every admission gate the store keeps (step queues `queue:<ns>:<name>` and concurrency
    /// keys `key:<ns>:<workflow>:<key>`): slots held, requests waiting, the rate window.
    pub async fn admission_stats(&self) -> Result<Vec<GateStats>> {
        let shared = self.shared();
        Ok(shared.store.admission_stats(shared.clock.now()).await?)
    }

    /// What a run holds and waits for at admission gates: its slots and its queued requests
    /// (a `pending` run waiting for its concurrency key, or a step waiting for its queue).
    pub async fn run_admission(&self, id: &RunId) -> Result<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        Ok(self.shared().store.run_admission(id).await?)
    }
}
