//! Replay-only turns: a recorded history replayed against the current code with nothing
//! executed and nothing written. The core's replay-only [`Turn`] decides everything (which
//! calls replay, where history ends, whether the body matches); this module runs the body over
//! an environment that has no store and no clock of its own.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use durable_core::admission::{Admission, Limits, SlotRequest};
use durable_core::{
    Commit, CommitOutcome, End, History, Millis, Payload, Run, RunId, StoreError, StoreResult, Turn, TurnConfig,
};

use super::{TurnDriver, TurnEnv, TurnState, WorkflowCtx};
use crate::clock::BoxFuture;
use crate::error::BodyResult;
use crate::events::EngineEvent;

/// How many times a body that waits on something outside the ctx is polled again (letting
/// other tasks run in between) before the replay says so.
const OUTSIDE_AWAIT_POLLS: u32 = 64;

/// The environment of a replay-only turn: the clock stands still at the time the run was last
/// written, nothing is committed, nothing is emitted.
struct ReplayEnv {
    now: Millis,
    latest: HashMap<String, u32>,
}

impl TurnEnv for ReplayEnv {
    fn now(&self) -> Millis {
        self.now
    }

    fn sleep_until(&self, _at: Millis) -> BoxFuture<'static, ()> {
        // Only an in-memory retry sleeps, and a replay-only turn runs no attempt.
        Box::pin(std::future::pending())
    }

    fn commit(&self, commit: Commit) -> BoxFuture<'_, StoreResult<CommitOutcome>> {
        // A replay-only turn never hands out a commit; refuse rather than write.
        let run = commit.run_id;
        Box::pin(async move { Err(StoreError::unavailable(format!("replay of run {run} writes nothing"))) })
    }

    fn existing_runs(&self, _ids: Vec<RunId>) -> BoxFuture<'_, StoreResult<Vec<Run>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn emit(&self, _event: EngineEvent) {}

    fn may_hold(&self) -> bool {
        false
    }

    fn hold_began(&self) -> bool {
        false
    }

    fn hold_ended(&self) {}

    // Never asked: a replay holds no sleep (`may_hold` is false), and only a hold reads the run.
    fn read_run(&self, _id: RunId) -> BoxFuture<'_, StoreResult<Option<Run>>> {
        Box::pin(async { Ok(None) })
    }

    fn latest_version(&self, workflow: &str) -> Option<u32> {
        self.latest.get(workflow).copied()
    }

    fn acquire_slot(&self, request: SlotRequest) -> BoxFuture<'_, StoreResult<Admission>> {
        // A replay-only turn runs no attempt, so it never asks for a slot.
        let run = request.run_id;
        Box::pin(async move { Err(StoreError::unavailable(format!("replay of run {run} takes no slot"))) })
    }

    fn queue_limits(&self, _name: &str) -> Option<Limits> {
        None
    }

    fn key_request(&self, _run: &super::env::NewRunKey<'_>) -> Result<Option<SlotRequest>, String> {
        // A replay-only turn creates no run.
        Ok(None)
    }
}

/// Replays `checkpoints` of `run` (as recorded) against the code registered for the run's
/// workflow and version: `start` calls it with a ctx and the run's input. `latest` holds the
/// newest registered version of each workflow. Resolves to the core's [`End::Replayed`].
pub(crate) async fn replay_turn(
    run: Run,
    checkpoints: Vec<durable_core::Checkpoint>,
    start: impl FnOnce(WorkflowCtx, &Payload) -> Result<BoxFuture<'static, BodyResult>, serde_json::Error>,
    mut config: TurnConfig,
    latest: HashMap<String, u32>,
) -> End {
    config.replay_only = true;
    let input: Payload = run.input.clone();
    let env = Arc::new(ReplayEnv { now: run.updated_at, latest });
    let turn = Turn::new(run, "replay", History::new(checkpoints), config);
    let t = Arc::new(TurnState::new(turn, env));
    let body = match start(WorkflowCtx { t: t.clone() }, &input) {
        Ok(body) => body,
        Err(e) => {
            let error = durable_core::StepError::fatal(format!(
                "run {}: its input does not decode into the input type of workflow {:?} v{}: {e}",
                t.run.id, t.run.workflow, t.run.version
            ))
            .with_code(durable_core::codes::BAD_PAYLOAD);
            let now = t.now();
            return t.turn.lock().fail(error, now);
        }
    };
    let mut driver = TurnDriver::new(t.clone(), body);
    let (mut idle, mut seen) = (0, 0);
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(end) = Pin::new(&mut driver).poll(cx) {
            return Poll::Ready(end);
        }
        // A replay-only turn has nothing in flight, so a pending driver means the body waits on
        // something outside the ctx. Give other tasks a chance (a task the body spawned and
        // awaits), then say so.
        let next_seq = t.turn.lock().next_seq();
        if next_seq != seen {
            (idle, seen) = (0, next_seq);
        }
        if idle < OUTSIDE_AWAIT_POLLS {
            idle += 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(t.turn.lock().on_outside_await())
    })
    .await
}
