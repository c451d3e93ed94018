//! Replay: a run's recorded checkpoints indexed by seq, and the per-seq [`Decision`].

use std::fmt;

use crate::{Checkpoint, CheckpointStatus, Millis, Payload, RunId, StepError, StepKind};

/// A run's recorded checkpoints, indexed by seq for O(1) lookups.
#[derive(Debug, Clone, Default)]
pub struct History {
    by_seq: Vec<Option<Checkpoint>>,
}

/// What the runtime must do for the ctx call at one seq.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The call already completed: return this recorded output without running anything.
    Replay(Payload),
    /// The call already failed after its last attempt: return this recorded error.
    ReplayError {
        /// The recorded error.
        error: StepError,
        /// Attempts that were made.
        attempts: u32,
    },
    /// Run the call now; this is attempt number `attempt` (1-based).
    Execute {
        /// The attempt about to be made.
        attempt: u32,
    },
    /// Parked: wait until `wake_at` (a sleep or a retry backoff), or for a delivery (`None`).
    Wait {
        /// When the wait is due, if it is a timed one.
        wake_at: Option<Millis>,
    },
    /// The code asked for something other than what history recorded at this seq.
    NonDeterminism(NonDeterminism),
}

/// A mismatch between the code and the recorded history at one seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonDeterminism {
    /// The run.
    pub run_id: RunId,
    /// The seq where they differ.
    pub seq: u32,
    /// `(name, kind)` the code asked for.
    pub expected: (String, StepKind),
    /// `(name, kind)` history recorded.
    pub recorded: (String, StepKind),
}

impl NonDeterminism {
    /// The error the run fails with (`code = "non_determinism"`).
    pub fn to_error(&self) -> StepError {
        StepError::fatal(self.to_string()).with_code(crate::codes::NON_DETERMINISM)
    }
}

impl fmt::Display for NonDeterminism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {}: non-determinism at seq {}: the workflow code asked for {} {:?} but history recorded {} {:?}; \
             the body changed under a running run — register the change as a new version, or guard it with ctx.patched(..); \
             or the body is not deterministic (it decides by random numbers, the clock or a HashMap's order: use \
             ctx.random_u64(), ctx.now() and ordered maps)",
            self.run_id, self.seq, self.expected.1, self.expected.0, self.recorded.1, self.recorded.0
        )
    }
}

/// The answer of [`History::patched`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patched {
    /// No record at this seq: the run reaches the patch fresh. Record a marker; take the new path.
    Record,
    /// A marker for this patch is recorded here: take the new path.
    Replayed,
    /// History has something else at this seq: an older run. Take the old path; the seq is not
    /// consumed.
    Old,
}

impl History {
    /// Builds the index from a run's checkpoints (any order).
    pub fn new(checkpoints: impl IntoIterator<Item = Checkpoint>) -> Self {
        let mut h = History::default();
        for cp in checkpoints {
            h.record(cp);
        }
        h
    }

    /// The checkpoint at `seq`.
    pub fn get(&self, seq: u32) -> Option<&Checkpoint> {
        self.by_seq.get(seq as usize).and_then(Option::as_ref)
    }

    /// One past the highest recorded seq.
    pub fn len(&self) -> u32 {
        self.by_seq.len() as u32
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.by_seq.iter().all(Option::is_none)
    }

    /// Inserts or replaces the checkpoint at its seq.
    pub fn record(&mut self, cp: Checkpoint) {
        let i = cp.seq as usize;
        if self.by_seq.len() <= i {
            self.by_seq.resize(i + 1, None);
        }
        self.by_seq[i] = Some(cp);
    }

    /// The first recorded checkpoint at `seq` or later.
    pub fn first_from(&self, seq: u32) -> Option<&Checkpoint> {
        self.by_seq.get(seq as usize..).into_iter().flatten().flatten().next()
    }

    /// Every recorded checkpoint, by seq.
    pub fn iter(&self) -> impl Iterator<Item = &Checkpoint> {
        self.by_seq.iter().flatten()
    }

    /// Decides the ctx call `(name, kind)` at `seq`, at time `now`.
    ///
    /// - nothing recorded → `Execute { attempt: 1 }`;
    /// - a different name or kind recorded → `NonDeterminism`;
    /// - `completed` → `Replay`, `failed` → `ReplayError`;
    /// - `waiting` with `wake_at` in the future → `Wait`; due → `Replay` for a sleep, the next
    ///   attempt for anything else (a retry backoff);
    /// - `waiting` without `wake_at` → `Wait { wake_at: None }` (a delivery is awaited);
    /// - `running` (a crash mid-call) → `Execute` with the attempt after the recorded ones.
    pub fn decide(&self, run_id: &RunId, seq: u32, name: &str, kind: StepKind, now: Millis) -> Decision {
        let Some(cp) = self.get(seq) else {
            return Decision::Execute { attempt: 1 };
        };
        if cp.name != name || cp.kind != kind {
            return Decision::NonDeterminism(NonDeterminism {
                run_id: run_id.clone(),
                seq,
                expected: (name.to_string(), kind),
                recorded: (cp.name.clone(), cp.kind),
            });
        }
        match cp.status {
            CheckpointStatus::Completed => Decision::Replay(cp.output.clone().unwrap_or_else(Payload::null)),
            CheckpointStatus::Failed => Decision::ReplayError {
                error: cp.error.clone().unwrap_or_else(|| StepError::fatal("failed (no error recorded)")),
                attempts: cp.attempts,
            },
            CheckpointStatus::Waiting => match cp.wake_at {
                Some(at) if at > now => Decision::Wait { wake_at: Some(at) },
                Some(_) if kind == StepKind::Sleep => Decision::Replay(cp.output.clone().unwrap_or_else(Payload::null)),
                Some(_) => Decision::Execute { attempt: cp.attempts + 1 },
                None => Decision::Wait { wake_at: None },
            },
            CheckpointStatus::Running => Decision::Execute { attempt: cp.attempts.max(1) },
        }
    }

    /// Decides `ctx.patched(id)` at `seq`.
    pub fn patched(&self, seq: u32, id: &str) -> Patched {
        match self.get(seq) {
            None => Patched::Record,
            Some(cp) if cp.kind == StepKind::Patch && cp.name == id => Patched::Replayed,
            Some(_) => Patched::Old,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(seq: u32, name: &str, kind: StepKind, status: CheckpointStatus) -> Checkpoint {
        Checkpoint::new(RunId::from("r"), seq, name, kind, status, 0)
    }

    #[test]
    fn decisions() {
        let r = RunId::from("r");
        let mut done = cp(0, "a", StepKind::Step, CheckpointStatus::Completed);
        done.output = Some(Payload::encode(&5).unwrap());
        let mut failed = cp(1, "b", StepKind::Step, CheckpointStatus::Failed);
        failed.error = Some(StepError::fatal("boom"));
        failed.attempts = 3;
        let mut sleep = cp(2, "sleep", StepKind::Sleep, CheckpointStatus::Waiting);
        sleep.wake_at = Some(100);
        let mut backoff = cp(3, "c", StepKind::Step, CheckpointStatus::Waiting);
        backoff.wake_at = Some(100);
        backoff.attempts = 2;
        let signal = cp(4, "tok", StepKind::Signal, CheckpointStatus::Waiting);
        let mut crashed = cp(5, "d", StepKind::Step, CheckpointStatus::Running);
        crashed.attempts = 1;
        let h = History::new([done, failed, sleep, backoff, signal, crashed]);

        assert_eq!(h.decide(&r, 0, "a", StepKind::Step, 0), Decision::Replay(Payload::encode(&5).unwrap()));
        assert!(matches!(h.decide(&r, 1, "b", StepKind::Step, 0), Decision::ReplayError { attempts: 3, .. }));
        assert_eq!(h.decide(&r, 2, "sleep", StepKind::Sleep, 99), Decision::Wait { wake_at: Some(100) });
        assert_eq!(h.decide(&r, 2, "sleep", StepKind::Sleep, 100), Decision::Replay(Payload::null()));
        assert_eq!(h.decide(&r, 3, "c", StepKind::Step, 50), Decision::Wait { wake_at: Some(100) });
        assert_eq!(h.decide(&r, 3, "c", StepKind::Step, 100), Decision::Execute { attempt: 3 });
        assert_eq!(h.decide(&r, 4, "tok", StepKind::Signal, 0), Decision::Wait { wake_at: None });
        assert_eq!(h.decide(&r, 5, "d", StepKind::Step, 0), Decision::Execute { attempt: 1 });
        assert_eq!(h.decide(&r, 6, "e", StepKind::Step, 0), Decision::Execute { attempt: 1 });
    }

    #[test]
    fn non_determinism_compares_name_and_kind() {
        let r = RunId::from("r");
        let h = History::new([cp(0, "a", StepKind::Step, CheckpointStatus::Completed)]);
        let Decision::NonDeterminism(nd) = h.decide(&r, 0, "b", StepKind::Step, 0) else { panic!() };
        let msg = nd.to_string();
        assert!(msg.contains("seq 0") && msg.contains("\"a\"") && msg.contains("\"b\""), "{msg}");
        assert_eq!(nd.to_error().code(), Some("non_determinism"));
        assert!(matches!(h.decide(&r, 0, "a", StepKind::SideEffect, 0), Decision::NonDeterminism(_)));
    }

    #[test]
    fn patch_markers() {
        let h = History::new([
            cp(0, "v2", StepKind::Patch, CheckpointStatus::Completed),
            cp(1, "a", StepKind::Step, CheckpointStatus::Completed),
        ]);
        assert_eq!(h.patched(0, "v2"), Patched::Replayed);
        assert_eq!(h.patched(1, "v2"), Patched::Old);
        assert_eq!(h.patched(2, "v2"), Patched::Record);
    }
}
