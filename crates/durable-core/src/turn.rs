//! One turn of a run as a pure state machine: seqs handed out in call order, decisions taken
//! from history, results buffered into the next [`Commit`], and the end of the turn detected
//! when every branch of the body is parked.
//!
//! The runtime owns a `Turn` per executing run, calls it from `WorkflowCtx` methods and the
//! turn driver, and applies the commits it produces to the store.

use std::collections::BTreeMap;

use crate::{
    Checkpoint, CheckpointStatus, Commit, Decision, History, Millis, NewRun, OutgoingSignal, Patched, Payload, RunId,
    RunStatus, StepError, StepKind, TurnEnd, Waiter,
};

/// Why a turn stopped before the body finished.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnStop {
    /// Fail the run with this error (non-determinism, a panic in the body, a bad payload).
    Fail(StepError),
    /// Stop quietly without writing anything more (the lease was lost, the store failed, the
    /// run was cancelled); the run's durable state decides what happens next.
    Abort(String),
    /// Complete the run and start its successor (`<id>~N`) with this input and a fresh history.
    ContinueAsNew(Payload),
}

/// The state of one turn. See the module docs.
#[derive(Debug)]
pub struct Turn {
    run_id: RunId,
    owner: String,
    history: History,
    wake_gen: u64,
    next_seq: u32,
    buffered: Vec<Checkpoint>,
    waits: Vec<Waiter>,
    expire: Vec<u32>,
    state: Vec<(String, Payload)>,
    children: Vec<NewRun>,
    signals: Vec<OutgoingSignal>,
    in_flight: usize,
    parked: BTreeMap<u32, Option<Millis>>,
    stop: Option<TurnStop>,
}

impl Turn {
    /// Starts a turn of `run_id`, held by `owner`, over the loaded history.
    pub fn new(run_id: RunId, owner: impl Into<String>, wake_gen: u64, history: History) -> Self {
        Turn {
            run_id,
            owner: owner.into(),
            history,
            wake_gen,
            next_seq: 0,
            buffered: Vec::new(),
            waits: Vec::new(),
            expire: Vec::new(),
            state: Vec::new(),
            children: Vec::new(),
            signals: Vec::new(),
            in_flight: 0,
            parked: BTreeMap::new(),
            stop: None,
        }
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The history as known to this turn (loaded plus recorded).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Takes the next seq. Call synchronously at the ctx call, so seqs follow call order.
    pub fn take_seq(&mut self) -> u32 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// The seq the next call will take.
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Decides the call `(name, kind)` at `seq` (see [`History::decide`]).
    pub fn decide(&self, seq: u32, name: &str, kind: StepKind, now: Millis) -> Decision {
        self.history.decide(&self.run_id, seq, name, kind, now)
    }

    /// `ctx.patched(id)`: true on runs that reach it fresh (a marker is recorded and a seq
    /// consumed) or recorded it; false on older runs (no seq consumed).
    pub fn patched(&mut self, id: &str, now: Millis) -> bool {
        let seq = self.next_seq;
        match self.history.patched(seq, id) {
            Patched::Old => false,
            Patched::Replayed => {
                self.next_seq += 1;
                true
            }
            Patched::Record => {
                self.next_seq += 1;
                self.record(Checkpoint::new(
                    self.run_id.clone(),
                    seq,
                    id,
                    StepKind::Patch,
                    CheckpointStatus::Completed,
                    now,
                ));
                true
            }
        }
    }

    /// Records a checkpoint: it goes into the next commit and into this turn's history.
    pub fn record(&mut self, cp: Checkpoint) {
        if let Some(slot) = self.buffered.iter_mut().find(|b| b.seq == cp.seq) {
            *slot = cp.clone();
        } else {
            self.buffered.push(cp.clone());
        }
        self.history.record(cp);
    }

    /// Registers a wait; written with the next commit.
    pub fn add_wait(&mut self, waiter: Waiter) {
        self.waits.push(waiter);
    }

    /// Marks the wait at `seq` as timed out; its waiter is removed by the next commit.
    pub fn expire_wait(&mut self, seq: u32) {
        self.expire.push(seq);
    }

    /// Sets query state; written with the next commit.
    pub fn set_state(&mut self, key: String, value: Payload) {
        self.state.retain(|(k, _)| *k != key);
        self.state.push((key, value));
    }

    /// Creates a child run with the next commit.
    pub fn add_child(&mut self, child: NewRun) {
        self.children.push(child);
    }

    /// Sends a signal with the next commit.
    pub fn add_signal(&mut self, signal: OutgoingSignal) {
        self.signals.push(signal);
    }

    /// Whether anything is waiting to be committed.
    pub fn has_uncommitted(&self) -> bool {
        !(self.buffered.is_empty()
            && self.waits.is_empty()
            && self.expire.is_empty()
            && self.state.is_empty()
            && self.children.is_empty()
            && self.signals.is_empty())
    }

    /// A commit of everything recorded so far (no turn end).
    pub fn commit(&mut self, now: Millis) -> Commit {
        let mut c = Commit::new(self.run_id.clone(), self.owner.clone(), now);
        c.checkpoints = std::mem::take(&mut self.buffered);
        c.waits = std::mem::take(&mut self.waits);
        c.expire_waits = std::mem::take(&mut self.expire);
        c.state = std::mem::take(&mut self.state);
        c.children = std::mem::take(&mut self.children);
        c.signals = std::mem::take(&mut self.signals);
        c
    }

    /// The commit that parks the run: everything recorded, plus `suspended` with the earliest
    /// parked `wake_at`.
    pub fn suspend_commit(&mut self, now: Millis) -> Commit {
        let mut c = self.commit(now);
        c.end = Some(TurnEnd::Suspend { wake_at: self.earliest_wake(), seen_wake_gen: self.wake_gen });
        c
    }

    /// The commit that settles the run (`completed` with an output, or `failed` / `cancelled`
    /// with an error).
    pub fn settle_commit(
        &mut self,
        now: Millis,
        status: RunStatus,
        output: Option<Payload>,
        error: Option<StepError>,
    ) -> Commit {
        let mut c = self.commit(now);
        c.end = Some(TurnEnd::Settle { status, output, error });
        c
    }

    /// A call started executing (a step closure, a commit in progress, an in-memory backoff).
    pub fn begin_flight(&mut self) {
        self.in_flight += 1;
    }

    /// A call that was executing finished (or was dropped).
    pub fn end_flight(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The call at `seq` is parked until `wake_at`, or until a delivery (`None`).
    pub fn park(&mut self, seq: u32, wake_at: Option<Millis>) {
        self.parked.insert(seq, wake_at);
    }

    /// The call at `seq` is no longer parked (its future was dropped).
    pub fn unpark(&mut self, seq: u32) {
        self.parked.remove(&seq);
    }

    /// The earliest `wake_at` among parked calls.
    pub fn earliest_wake(&self) -> Option<Millis> {
        self.parked.values().flatten().min().copied()
    }

    /// Whether the turn should end: nothing executing and at least one branch parked. Call it
    /// each time the body returns `Pending`.
    pub fn is_parked(&self) -> bool {
        self.in_flight == 0 && !self.parked.is_empty()
    }

    /// Calls executing right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Stops the turn; the first reason given wins.
    pub fn stop(&mut self, reason: TurnStop) {
        if self.stop.is_none() {
            self.stop = Some(reason);
        }
    }

    /// Why the turn was stopped, if it was.
    pub fn stopped(&self) -> Option<&TurnStop> {
        self.stop.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(history: Vec<Checkpoint>) -> Turn {
        Turn::new(RunId::from("r"), "me", 7, History::new(history))
    }

    #[test]
    fn seqs_follow_call_order_and_commit_drains() {
        let mut t = turn(vec![]);
        assert_eq!((t.take_seq(), t.take_seq(), t.take_seq()), (0, 1, 2));
        let mut cp = Checkpoint::new(RunId::from("r"), 1, "now", StepKind::Now, CheckpointStatus::Completed, 5);
        cp.output = Some(Payload::encode(&5).unwrap());
        t.record(cp.clone());
        assert!(t.has_uncommitted());
        let c = t.commit(9);
        assert_eq!(c.checkpoints, vec![cp]);
        assert_eq!((c.owner.as_str(), c.now, c.end), ("me", 9, None));
        assert!(!t.has_uncommitted());
        assert_eq!(t.decide(1, "now", StepKind::Now, 0), Decision::Replay(Payload::encode(&5).unwrap()));
    }

    #[test]
    fn suspension_carries_earliest_wake_and_wake_gen() {
        let mut t = turn(vec![]);
        t.park(0, Some(300));
        t.park(1, None);
        t.park(2, Some(200));
        t.begin_flight();
        assert!(!t.is_parked());
        t.end_flight();
        assert!(t.is_parked());
        let c = t.suspend_commit(10);
        assert_eq!(c.end, Some(TurnEnd::Suspend { wake_at: Some(200), seen_wake_gen: 7 }));
        t.unpark(2);
        assert_eq!(t.earliest_wake(), Some(300));
    }

    #[test]
    fn patched_consumes_a_seq_only_when_taken() {
        let old = Checkpoint::new(RunId::from("r"), 0, "a", StepKind::Step, CheckpointStatus::Completed, 0);
        let mut t = turn(vec![old]);
        assert!(!t.patched("v2", 0));
        assert_eq!(t.take_seq(), 0);
        let mut fresh = turn(vec![]);
        assert!(fresh.patched("v2", 0));
        assert_eq!(fresh.take_seq(), 1);
        let c = fresh.commit(0);
        assert_eq!(c.checkpoints[0].kind, StepKind::Patch);
        let mut replay = turn(c.checkpoints);
        assert!(replay.patched("v2", 0));
        assert_eq!(replay.take_seq(), 1);
    }

    #[test]
    fn first_stop_reason_wins() {
        let mut t = turn(vec![]);
        t.stop(TurnStop::Abort("lease lost".into()));
        t.stop(TurnStop::Fail(StepError::fatal("x")));
        assert_eq!(t.stopped(), Some(&TurnStop::Abort("lease lost".into())));
    }
}
