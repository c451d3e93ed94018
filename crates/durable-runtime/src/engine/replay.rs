//! Checking recorded histories against the registered code, before it runs them, and loading
//! an exported run into a store.

use std::collections::HashMap;

use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, CreateRun, End, HistoryExport, Millis, NewRun, Replayed,
    Run, RunPatch, RunStatus, StepError, StepKind, TurnConfig, TurnEnd, codes,
};

use super::Engine;
use crate::error::{Error, ReplayError, Result};
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
            // The replay's clock stands still; its driver reports an await outside the ctx
            // itself (`OutsideAwait`) after a bounded number of polls.
            non_ctx_await_grace: shared.config.non_ctx_await_grace,
            replay_only: true,
            reconcile_interval: shared.config.reconcile_interval,
            slot_lease: shared.config.lease_ttl,
            admission_recheck: shared.config.admission_recheck,
            // A replay writes nothing and holds nothing.
            hold_sleeps_under: std::time::Duration::ZERO,
        };
        let start = |ctx, input: &_| handler.call(ctx, input);
        let end = replay_turn(run.clone(), history.checkpoints.clone(), start, config, latest).await;
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

    /// Writes an exported run into this engine's store as it was exported — to debug a
    /// production run locally, say: its row (same id, workflow, version, input, tags, parent),
    /// its checkpoints and query state and, for a suspended run, its waits and `wake_at`.
    /// Returns the run as stored.
    ///
    /// A `completed`, `failed`, `cancelled` or `dead` run is stored settled. A `suspended` run is
    /// stored suspended: a worker with its workflow registered continues it when it is woken
    /// (import the runs it waits on — its children — too; a `blocked` run is stored suspended,
    /// and blocked again if no worker can take its remote step). A remote step whose attempt was
    /// out when the run was exported has no task here (an export holds none): its attempt is
    /// recorded as re-dispatched and the run made due, so its next turn sends the next attempt
    /// to the workers of this store, as [`Engine::redispatch_pending`] does. A `pending` or `running` run is
    /// stored `pending`: a worker picks it up and replays it, executing what the history has no
    /// result for, with its real side effects.
    ///
    /// Import with a client engine ([`EngineBuilder::client_only`](crate::EngineBuilder::client_only))
    /// while no worker executes runs on the store, then start the workers: the run is created
    /// `pending` and gets its history a moment later, and a worker that claimed it in between
    /// would execute it from the start.
    ///
    /// Refused with [`Error::Import`]: an engine that executes runs, a run id the store
    /// already holds, a run another engine claimed while it was imported; with
    /// [`Error::Export`]: an export whose parts do not fit together.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// # let store = durable_store_memory::MemoryStore::new();
    /// let history = durable_core::HistoryExport::from_json(&std::fs::read_to_string("order-42.json")?)?;
    /// let importer = durable_runtime::Engine::builder().store(store).client_only().build()?;
    /// importer.import_history(&history).await?;
    /// importer.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn import_history(&self, history: &HistoryExport) -> Result<Run> {
        history.validate()?;
        let run = &history.run;
        let refused = |reason: String| Error::Import { run_id: run.id.clone(), reason };
        if self.config().execute {
            return Err(refused(
                "this engine executes runs, and could run it before its history is written; import with a \
                 client engine (Engine::builder().client_only())"
                    .into(),
            ));
        }
        let shared = self.shared();
        let (store, now) = (&shared.store, shared.clock.now());
        let new = NewRun::from(run);
        if let CreateRun::Existing(_) = store.create_run(new).await? {
            return Err(refused("the store already holds a run with this id; delete it first".into()));
        }
        let claim = Claim {
            run_id: run.id.clone(),
            owner: shared.owner.clone(),
            lease_until: now.saturating_add(durable_core::millis(shared.config.lease_ttl)),
            now,
        };
        let ClaimOutcome::Acquired { run: claimed, history: found, .. } = store.claim_run(claim).await? else {
            return Err(refused("another engine claimed it before its history was written".into()));
        };
        if !found.is_empty() {
            return Err(refused("another engine executed it before its history was written".into()));
        }
        let mut commit = Commit::new(run.id.clone(), shared.owner.clone(), now);
        commit.checkpoints = history.checkpoints.clone();
        // A finished run is stored as it was; an active one's attempts out are sent again.
        let redispatched =
            if run.status.is_terminal() { Vec::new() } else { end_attempts_out(&mut commit.checkpoints, now) };
        commit.state = history.state.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let back_to_pending = match run.status {
            RunStatus::Pending | RunStatus::Running => {
                store.commit(commit).await?;
                true
            }
            RunStatus::Suspended | RunStatus::Blocked => {
                commit.waits = history.waiters.iter().filter(|w| !redispatched.contains(&w.seq)).cloned().collect();
                let wake_at = if redispatched.is_empty() { run.wake_at } else { Some(now) };
                commit.end = Some(TurnEnd::Suspend { wake_at, seen_wake_gen: claimed.wake_gen });
                // A buffered delivery the waits consumed leaves the run running: let a worker
                // replay it from pending.
                store.commit(commit).await?.woken
            }
            status => {
                commit.end = Some(TurnEnd::Settle { status, output: run.output.clone(), error: run.error.clone() });
                store.commit(commit).await?;
                false
            }
        };
        if back_to_pending {
            let patch = RunPatch { status: Some(RunStatus::Pending), release_lease: true, now, ..Default::default() };
            store.update_run_if(&run.id, &[RunStatus::Running], patch).await?;
        }
        // An active run's error says why it waits (a cancel with compensation requested); a
        // blocked run's reason is not carried over: it is stored suspended, and the blocked
        // pass here judges it again (it skips a suspended run with an error).
        if !run.status.is_terminal() && run.error.as_ref().is_some_and(|e| e.code() != Some(codes::BLOCKED)) {
            let patch = RunPatch { error: Some(run.error.clone()), now, ..Default::default() };
            store.update_run_if(&run.id, &RunStatus::ACTIVE, patch).await?;
        }
        store.get_run(&run.id).await?.ok_or_else(|| Error::RunNotFound(run.id.clone()))
    }
}

/// Ends the attempts of remote steps that were out when the run was exported (`running`
/// checkpoints of kind `remote`): an export holds no task, so no worker here could ever answer
/// them. Each is recorded as [`Engine::redispatch_pending`] records one (`waiting`, with a
/// retryable `redispatch` error), which the next turn answers with the next attempt at once.
/// Returns their seqs, whose waits are not registered.
fn end_attempts_out(checkpoints: &mut [Checkpoint], now: Millis) -> Vec<u32> {
    let mut ended = Vec::new();
    for cp in checkpoints.iter_mut() {
        if cp.kind == StepKind::Remote && cp.status == CheckpointStatus::Running {
            cp.status = CheckpointStatus::Waiting;
            cp.error = Some(
                StepError::retryable(format!(
                    "attempt {} of remote step {:?} was out when run {} was exported; it is sent again where \
                     the run was imported",
                    cp.attempts, cp.name, cp.run_id
                ))
                .with_code(codes::REDISPATCH),
            );
            cp.wake_at = None;
            cp.updated_at = now;
            ended.push(cp.seq);
        }
    }
    ended
}
