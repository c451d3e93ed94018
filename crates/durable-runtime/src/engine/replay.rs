//! Checking recorded histories against the registered code, before it runs them.

use std::collections::HashMap;

use durable_core::{End, HistoryExport, Replayed, TurnConfig};

use super::Engine;
use crate::error::ReplayError;
use crate::turn::replay_turn;

impl Engine {
    /// Replays a recorded history ([`Engine::export_history`], `durable runs export`) against
    /// the code registered on this engine for the run's workflow and version, **without
    /// executing anything**: no step closure, side effect, task dispatch or undo runs, nothing
    /// is written to the store, no event is sent. Recorded results are handed to the body as a
    /// turn would; the replay stops where the recorded history ends.
    ///
    /// `Ok` says how far the code matched: [`Replayed::UpTo`] the first call history holds no
    /// result for (where the run would go on executing), [`Replayed::Parked`] on the waits the
    /// run is suspended on, or [`Replayed::Finished`] as the run ended (a recorded `completed`
    /// run must complete with the same output, a `failed` one fail with the same error code).
    /// [`ReplayError::Mismatch`] says how the code departs from the history — a changed call
    /// names the seq and both calls — and [`ReplayError::NotRegistered`] that the run's
    /// workflow version is not registered here.
    ///
    /// The body sees the run as recorded; `ctx.now()` and other recorded values replay, and the
    /// engine clock stands at the time the run was last written.
    ///
    /// ```no_run
    /// # async fn demo(engine: durable_runtime::Engine) -> Result<(), Box<dyn std::error::Error>> {
    /// let export = durable_core::HistoryExport::from_json(&std::fs::read_to_string("order-42.json")?)?;
    /// match engine.check_replay(&export).await {
    ///     Ok(replayed) => println!("replays: {replayed:?}"),
    ///     Err(e) => eprintln!("would break the run: {e}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check_replay(&self, history: &HistoryExport) -> Result<Replayed, ReplayError> {
        let shared = self.shared();
        let run = &history.run;
        let Some(handler) = shared.registry.get(&run.workflow, run.version) else {
            let registered = shared.registry.keys().into_iter().filter(|(n, _)| *n == run.workflow).map(|(_, v)| v);
            return Err(ReplayError::NotRegistered {
                run_id: run.id.clone(),
                workflow: run.workflow.clone(),
                version: run.version,
                registered: registered.collect(),
            });
        };
        let mut latest: HashMap<String, u32> = HashMap::new();
        for (name, version) in shared.registry.keys() {
            let v = latest.entry(name).or_insert(version);
            *v = (*v).max(version);
        }
        let config = TurnConfig {
            max_payload_bytes: shared.config.max_payload_bytes,
            durable_retry_threshold: shared.config.durable_retry_threshold,
            latest_version: latest.get(&run.workflow).copied().unwrap_or(run.version),
            replay_only: true,
        };
        let end = replay_turn(run.clone(), history.checkpoints.clone(), handler, config, latest).await;
        match end {
            End::Replayed(Ok(replayed)) => Ok(replayed),
            End::Replayed(Err(mismatch)) => Err(ReplayError::Mismatch(mismatch)),
            // A replay-only turn always ends replayed; anything else is a bug in the core.
            other => Err(ReplayError::Mismatch(durable_core::ReplayMismatch::Failed {
                run_id: run.id.clone(),
                error: durable_core::StepError::fatal(format!("the replay ended with {other:?}")),
            })),
        }
    }
}
