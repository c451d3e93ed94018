//! Replay checks: does the workflow code you are about to deploy still replay the runs your
//! users have in flight?
//!
//! Export real runs (`durable runs export <id> --out tests/fixtures/replay/<name>.json`, or
//! [`Engine::export_history`]), commit the JSON next to your code, and replay it in a test:
//!
//! ```no_run
//! use durable_conformance::replay::{assert_replayable, assert_replayable_dir, read_export};
//! use durable_runtime::{Engine, WorkflowCtx, WorkflowError};
//!
//! /// What the application's workers register (the same function, called from `main`).
//! fn register(engine: &Engine) {
//!     engine.register("order", 1, |ctx: WorkflowCtx, id: u64| async move {
//!         let _: String = ctx.step("charge", |_| async { Ok("receipt".to_string()) }).await?;
//!         Ok::<_, WorkflowError>(id)
//!     });
//! }
//!
//! # async fn test() {
//! // One history...
//! let history = read_export("tests/fixtures/replay/order-42.json").unwrap();
//! assert_replayable(register, &history).await;
//! // ...or every `*.json` of a directory.
//! assert_replayable_dir(register, "tests/fixtures/replay").await;
//! # }
//! ```
//!
//! The replay executes **nothing**: no step closure, side effect, task dispatch or undo runs
//! (your closures call real services), nothing is written anywhere, and no time passes.
//! Recorded results are handed to the code as a resumed run would get them; the replay stops
//! where the recorded history ends — at the first call history holds no result for, on the
//! waits a suspended run is parked on, or where the run ended. It fails when the code departs
//! from the history: a changed call (named with its seq and both calls: what the code asks for
//! and what history recorded), calls the code no longer makes, a run that now ends otherwise
//! (a recorded `completed` run must complete with the same output, a `failed` one fail with
//! the same error code), a recorded value that no longer decodes, a body that panics.
//!
//! Adding calls after the last recorded one, or branching new code with
//! [`WorkflowCtx::patched`](durable_runtime::WorkflowCtx::patched), replays fine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use durable_core::export::{ExportError, FORMAT, HistoryExport};
pub use durable_core::{ReplayMismatch, Replayed, RunEnd};
use durable_runtime::Engine;
pub use durable_runtime::ReplayError;
use durable_store_memory::MemoryStore;

/// An engine that executes nothing, with the caller's workflows registered.
fn replay_engine(register: impl FnOnce(&Engine)) -> Engine {
    let engine = Engine::builder().store(MemoryStore::new()).client_only().build().expect("a store is set");
    register(&engine);
    engine
}

/// Replays `history` against the workflows `register` registers (call your application's
/// registration function, or register the workflows in a closure), executing nothing. See the
/// [module docs](self) for what matches; [`Engine::check_replay`] is the same check on an engine
/// of your own. Needs a tokio runtime (a `#[tokio::test]`).
pub async fn check_replayable(
    register: impl FnOnce(&Engine),
    history: &HistoryExport,
) -> Result<Replayed, ReplayError> {
    let engine = replay_engine(register);
    let result = engine.check_replay(history).await;
    engine.shutdown().await;
    result
}

/// [`check_replayable`], panicking with the mismatch — which names the run, and for a changed
/// call the seq and both calls — when the code does not replay `history`. Returns how far the
/// replay went.
///
/// ```text
/// the history does not replay against the current code: run order:42: non-determinism at
/// seq 1: the workflow code asked for step "ship" but history recorded step "charge"; …
/// ```
pub async fn assert_replayable(register: impl FnOnce(&Engine), history: &HistoryExport) -> Replayed {
    match check_replayable(register, history).await {
        Ok(replayed) => replayed,
        // Every error names the run.
        Err(e) => panic!("the history does not replay against the current code: {e}"),
    }
}

/// Reads a history export from a file ([`HistoryExport::from_json`]); the error names the file.
pub fn read_export(path: impl AsRef<Path>) -> Result<HistoryExport, String> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    HistoryExport::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Replays every `*.json` history export in `dir` (not its subdirectories), in file name order,
/// against the workflows `register` registers, executing nothing. Panics listing every file
/// that does not load or does not replay, and when `dir` holds no export at all (a mistyped
/// path must not pass). Returns each file with how far its replay went.
pub async fn assert_replayable_dir(register: impl FnOnce(&Engine), dir: impl AsRef<Path>) -> Vec<(PathBuf, Replayed)> {
    let dir = dir.as_ref();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(e) => panic!("cannot read the history exports in {}: {e}", dir.display()),
    };
    files.sort();
    assert!(
        !files.is_empty(),
        "{} holds no history export (*.json): export runs with `durable runs export`",
        dir.display()
    );
    let engine = replay_engine(register);
    let mut replayed = Vec::new();
    let mut failures = String::new();
    for path in files {
        // A file that does not load says so naming its path already.
        let outcome = match read_export(&path) {
            Ok(history) => engine.check_replay(&history).await.map_err(|e| format!("{}: {e}", path.display())),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(r) => replayed.push((path, r)),
            Err(e) => {
                let _ = writeln!(failures, "  {e}");
            }
        }
    }
    engine.shutdown().await;
    assert!(failures.is_empty(), "history exports that do not replay against the current code:\n{failures}");
    replayed
}
