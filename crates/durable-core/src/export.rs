//! Exported run histories: one run and everything recorded for it, as one versioned JSON
//! document.
//!
//! A [`HistoryExport`] is what `Engine::export_history` and `durable runs export <id>` write:
//! the run row, its checkpoints in seq order, the waits it has registered and its query state.
//! Commit exports of real runs next to your code and check in CI that the code you are about
//! to deploy still replays them (`durable::testing::replay::assert_replayable`): a change that
//! would break running runs fails the build instead of the runs.
//!
//! The document is versioned by [`FORMAT`]. A version of `durable` reads every format up to its
//! own and refuses a newer one with an error that names the format and says to upgrade.
//!
//! ```
//! use durable_core::export::HistoryExport;
//! use durable_core::{Checkpoint, CheckpointStatus, NewRun, Payload, RunId, StepKind};
//!
//! let run = NewRun {
//!     id: RunId::from("order:42"), workflow: "order".into(), version: 1, namespace: "default".into(),
//!     input: Payload::null(), tags: vec![], priority: 0, parent: None, created_at: 0,
//!     start_at: None,
//!     admission: None,
//!     trace_context: None,
//! }
//! .into_run();
//! let cp = Checkpoint::new(run.id.clone(), 0, "charge", StepKind::Step, CheckpointStatus::Completed, 5);
//! let export = HistoryExport::new(run, vec![cp], vec![], Default::default());
//!
//! let json = export.to_json().unwrap();
//! let back = HistoryExport::from_json(&json).unwrap();
//! assert_eq!(back, export);
//! assert_eq!(back.to_json().unwrap(), json);
//!
//! // A document written by a newer durable is refused, naming its format.
//! let newer = json.replacen("\"format\": 1", "\"format\": 999", 1);
//! let err = HistoryExport::from_json(&newer).unwrap_err();
//! assert!(err.to_string().contains("format 999"), "{err}");
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Checkpoint, Payload, Run, RunId, Waiter};

/// The newest export format this version writes and reads. Every older format stays readable.
pub const FORMAT: u32 = 1;

/// The version of `durable` this crate belongs to (every `durable` crate shares it).
pub const DURABLE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// One run's recorded history, as exported (format [`FORMAT`]).
///
/// Build it with [`HistoryExport::new`] (or `Engine::export_history`), write it with
/// [`HistoryExport::to_json`], read it back with [`HistoryExport::from_json`]: the round trip
/// is exact, and writing a document read back gives the same bytes.
///
/// The JSON document:
///
/// ```text
/// {
///   "format": 1,                       // the export format (FORMAT)
///   "durable_version": "0.1.0",        // the durable version that wrote it
///   "run": { … },                      // the run row, as the store held it (durable_core::Run)
///   "checkpoints": [ { … }, … ],       // its checkpoints, by seq (durable_core::Checkpoint)
///   "waiters": [ … ],                  // the waits it has registered (durable_core::Waiter)
///   "state": { "key": value, … }       // its query state (ctx.set_state)
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HistoryExport {
    /// The export format ([`FORMAT`] for documents this version writes).
    pub format: u32,
    /// The version of `durable` that wrote the document.
    pub durable_version: String,
    /// The run row.
    pub run: Run,
    /// The run's checkpoints, in seq order.
    pub checkpoints: Vec<Checkpoint>,
    /// The waits the run has registered (a suspended run's signal, event, update, task and
    /// child waits).
    #[serde(default)]
    pub waiters: Vec<Waiter>,
    /// The run's query state: the latest value of every key it set with `ctx.set_state`.
    #[serde(default)]
    pub state: BTreeMap<String, Payload>,
}

/// Why a document is not a history export this version can read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The document was written in a format newer than this version of `durable` reads.
    #[error(
        "this history export has format {format} (written by durable {written_by}), but durable {DURABLE_VERSION} reads \
         formats up to {FORMAT}: upgrade durable to load it"
    )]
    NewerFormat {
        /// The document's format.
        format: u32,
        /// The `durable_version` the document names.
        written_by: String,
    },
    /// The document names a format that never existed.
    #[error("unknown history export format {format}: formats start at 1")]
    UnknownFormat {
        /// The document's format.
        format: u32,
    },
    /// The document is not valid JSON, or not a history export of the format it names.
    #[error("not a durable history export (format {FORMAT}): {source}")]
    Json {
        /// What serde_json reported (with its line and column).
        #[source]
        source: serde_json::Error,
    },
    /// The document parses, but its contents do not fit together.
    #[error("invalid history export of run {run_id}: {reason}")]
    Invalid {
        /// The run the document holds.
        run_id: RunId,
        /// What is wrong (names the seq concerned).
        reason: String,
    },
}

/// The fields every format has: read first, so a newer format is refused before its shape is.
#[derive(Deserialize)]
struct Probe {
    format: u32,
    #[serde(default)]
    durable_version: Option<String>,
}

impl HistoryExport {
    /// An export of `run` with its `checkpoints` (sorted by seq here), `waiters` and query
    /// `state`, in format [`FORMAT`], written by this version.
    pub fn new(
        run: Run,
        mut checkpoints: Vec<Checkpoint>,
        waiters: Vec<Waiter>,
        state: BTreeMap<String, Payload>,
    ) -> Self {
        checkpoints.sort_by_key(|c| c.seq);
        HistoryExport { format: FORMAT, durable_version: DURABLE_VERSION.to_string(), run, checkpoints, waiters, state }
    }

    /// The document as pretty-printed JSON (no trailing newline). Recorded payloads are
    /// written exactly as stored.
    pub fn to_json(&self) -> Result<String, ExportError> {
        serde_json::to_string_pretty(self).map_err(|source| ExportError::Json { source })
    }

    /// Reads a document written by [`HistoryExport::to_json`] (this version or an older one).
    ///
    /// Refused: a `format` newer than [`FORMAT`] ([`ExportError::NewerFormat`]: upgrade
    /// durable), text that is not an export ([`ExportError::Json`]), and an export whose
    /// checkpoints or waiters belong to another run or whose checkpoints are not in strictly
    /// increasing seq order ([`ExportError::Invalid`], naming the seq).
    pub fn from_json(text: &str) -> Result<Self, ExportError> {
        let probe: Probe = serde_json::from_str(text).map_err(|source| ExportError::Json { source })?;
        if probe.format == 0 {
            return Err(ExportError::UnknownFormat { format: probe.format });
        }
        if probe.format > FORMAT {
            return Err(ExportError::NewerFormat {
                format: probe.format,
                written_by: probe.durable_version.unwrap_or_else(|| "(version unknown)".into()),
            });
        }
        let export: HistoryExport = serde_json::from_str(text).map_err(|source| ExportError::Json { source })?;
        export.validate()?;
        Ok(export)
    }

    /// Checks that the parts belong together: every checkpoint and waiter is of this run, and
    /// checkpoints come in strictly increasing seq order.
    pub fn validate(&self) -> Result<(), ExportError> {
        let invalid = |reason: String| ExportError::Invalid { run_id: self.run.id.clone(), reason };
        let mut last: Option<u32> = None;
        for cp in &self.checkpoints {
            if cp.run_id != self.run.id {
                return Err(invalid(format!("the checkpoint at seq {} belongs to run {}", cp.seq, cp.run_id)));
            }
            if last.is_some_and(|l| cp.seq <= l) {
                return Err(invalid(format!(
                    "the checkpoint at seq {} comes after seq {}: checkpoints must be in strictly increasing seq order",
                    cp.seq,
                    last.unwrap_or_default()
                )));
            }
            last = Some(cp.seq);
        }
        if let Some(w) = self.waiters.iter().find(|w| w.run_id != self.run.id) {
            return Err(invalid(format!("the waiter at seq {} belongs to run {}", w.seq, w.run_id)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckpointStatus, NewRun, RunStatus, StepError, StepKind, WaitKind};

    fn export() -> HistoryExport {
        let mut run = NewRun {
            trace_context: None,
            admission: None,
            id: RunId::from("r"),
            workflow: "wf".into(),
            version: 2,
            namespace: "default".into(),
            input: Payload::from_json(r#"{"b": 1, "a": [1, 2.5, "x"]}"#).unwrap(),
            tags: vec!["t".into()],
            priority: 3,
            parent: None,
            created_at: 10,
            start_at: None,
        }
        .into_run();
        run.status = RunStatus::Suspended;
        let mut done = Checkpoint::new(run.id.clone(), 0, "charge", StepKind::Step, CheckpointStatus::Completed, 11);
        done.output = Some(Payload::from_json("\"receipt\"").unwrap());
        done.error = Some(StepError::retryable("gateway timeout").with_code("timeout"));
        done.attempts = 2;
        let wait = Checkpoint::new(run.id.clone(), 1, "go", StepKind::Signal, CheckpointStatus::Waiting, 12);
        let waiters = vec![
            Waiter {
                run_id: run.id.clone(),
                seq: 1,
                name: "go".into(),
                kind: WaitKind::Signal { token: "go".into() },
                created_at: 12,
            },
            Waiter {
                run_id: run.id.clone(),
                seq: 2,
                name: "paid".into(),
                kind: WaitKind::Event {
                    name: "paid".into(),
                    matcher: Payload::encode(&serde_json::json!({"id": 1})).unwrap(),
                },
                created_at: 12,
            },
        ];
        let state = BTreeMap::from([("progress".to_string(), Payload::encode(&50).unwrap())]);
        HistoryExport::new(run, vec![wait, done], waiters, state)
    }

    #[test]
    fn round_trips_exactly_and_byte_for_byte() {
        let e = export();
        assert_eq!(e.checkpoints.iter().map(|c| c.seq).collect::<Vec<_>>(), [0, 1], "sorted by seq");
        let json = e.to_json().unwrap();
        let back = HistoryExport::from_json(&json).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.to_json().unwrap(), json);
        // Payloads keep their text exactly, spaces and key order included.
        assert!(json.contains(r#""input": {"b": 1, "a": [1, 2.5, "x"]}"#), "{json}");
        assert!(json.starts_with("{\n  \"format\": 1,\n  \"durable_version\": "), "{json}");
    }

    #[test]
    fn a_newer_format_is_refused_naming_it_and_saying_to_upgrade() {
        let json = export().to_json().unwrap().replacen("\"format\": 1", "\"format\": 999", 1);
        let err = HistoryExport::from_json(&json).unwrap_err();
        assert!(matches!(err, ExportError::NewerFormat { format: 999, .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("format 999") && msg.contains("upgrade durable") && msg.contains("up to 1"), "{msg}");
        // Refused before its shape is looked at: a newer format may look entirely different.
        let err = HistoryExport::from_json(r#"{"format": 2, "durable_version": "9.0.0", "runs": []}"#).unwrap_err();
        assert!(err.to_string().contains("format 2 (written by durable 9.0.0)"), "{err}");
    }

    #[test]
    fn other_documents_are_refused_clearly() {
        for text in ["", "[]", "{\"run\": 1}", "{\"format\": 1}"] {
            let err = HistoryExport::from_json(text).unwrap_err();
            assert!(matches!(err, ExportError::Json { .. }), "{text}: {err:?}");
            assert!(err.to_string().starts_with("not a durable history export"), "{err}");
        }
        let err = HistoryExport::from_json(r#"{"format": 0}"#).unwrap_err();
        assert_eq!(err.to_string(), "unknown history export format 0: formats start at 1");
    }

    #[test]
    fn checkpoints_of_another_run_or_out_of_order_are_refused_naming_the_seq() {
        let mut e = export();
        e.checkpoints[1].run_id = RunId::from("other");
        let err = HistoryExport::from_json(&e.to_json().unwrap()).unwrap_err();
        assert_eq!(err.to_string(), "invalid history export of run r: the checkpoint at seq 1 belongs to run other");

        let mut e = export();
        e.checkpoints.swap(0, 1);
        let err = HistoryExport::from_json(&e.to_json().unwrap()).unwrap_err();
        assert!(err.to_string().contains("the checkpoint at seq 0 comes after seq 1"), "{err}");

        let mut e = export();
        e.waiters[0].run_id = RunId::from("other");
        let err = HistoryExport::from_json(&e.to_json().unwrap()).unwrap_err();
        assert!(err.to_string().contains("the waiter at seq 1 belongs to run other"), "{err}");
    }
}
