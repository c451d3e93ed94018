//! Helpers for the command line's integration tests: running the real `durable` binary in a
//! temp dir, reading its output.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The database the demo and the operator commands use by default: `durable.db` in `dir` (the
/// working directory they run in; tests run them in a `tempfile::tempdir()`).
pub fn default_db(dir: &Path) -> PathBuf {
    dir.join("durable.db")
}

/// The `durable` binary, run in `dir`, with no `DURABLE_DB`, `DURABLE_URL`, `DURABLE_SCHEMA` or
/// `RUST_LOG` from the environment.
pub fn durable(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_durable"));
    cmd.current_dir(dir)
        .env_remove("DURABLE_DB")
        .env_remove("DURABLE_URL")
        .env_remove("DURABLE_SCHEMA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    fn from(output: Output) -> Ran {
        Ran {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// Runs `durable <args>` in `dir` to completion.
pub fn run(dir: &Path, args: &[&str]) -> Ran {
    Ran::from(durable(dir).args(args).output().expect("run durable"))
}

/// Runs `durable <args>` in `dir` and expects exit code 0.
pub fn run_ok(dir: &Path, args: &[&str]) -> Ran {
    let ran = run(dir, args);
    assert_eq!(ran.code, Some(0), "durable {args:?} failed:\nstdout: {}\nstderr: {}", ran.stdout, ran.stderr);
    ran
}

/// Runs `durable <args>` in `dir` and expects exit code 2 with a one-line error on stderr
/// containing `expected`, and nothing on stdout.
pub fn run_bad(dir: &Path, args: &[&str], expected: &str) -> String {
    let ran = run(dir, args);
    assert_eq!(ran.code, Some(2), "durable {args:?}: expected exit code 2, got {ran:?}");
    let err = ran.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "durable {args:?}: expected one line on stderr, got {err:?}");
    assert!(err.starts_with("error: "), "durable {args:?}: {err:?}");
    assert!(err.contains(expected), "durable {args:?}: expected {expected:?} in {err:?}");
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!err.contains(bad), "durable {args:?}: {err:?}");
    }
    assert!(ran.stdout.is_empty(), "durable {args:?}: nothing on stdout, got {:?}", ran.stdout);
    err.to_string()
}

/// Every run in the database at `db`, from `durable runs list --json --limit 0`.
pub fn list_runs(dir: &Path, db: &Path) -> Vec<Value> {
    let ran = run_ok(dir, &["runs", "list", "--json", "--limit", "0", "--db", path_str(db)]);
    ran.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

/// `durable runs show <id> --json`.
pub fn show(dir: &Path, db: &Path, id: &str) -> Value {
    let ran = run_ok(dir, &["runs", "show", id, "--json", "--db", path_str(db)]);
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", ran.stdout))
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// The number after `label` in the demo's summary (`  resumed   3  (…)`).
pub fn summary_count(stdout: &str, label: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| {
            let rest = l.trim_start().strip_prefix(label)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {label:?} count in the summary:\n{stdout}"))
}

pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled" | "dead")
}

pub const DEMO_WORKFLOWS: [&str; 5] = ["demo_order", "demo_sleep", "demo_approval", "demo_saga", "demo_fanout"];

/// Runs `f` with a client engine on the SQLite database at `db` (created if missing) with the
/// workflows `register` registers: how a test declares schedules (`Engine::schedule`) or starts
/// runs the way the user's code would. A client engine executes nothing and fires no schedule.
pub fn with_client<T>(
    db: &Path,
    register: impl FnOnce(&durable::Engine),
    f: impl AsyncFnOnce(&durable::Engine) -> T,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        let store = durable::SqliteStore::open(db).expect("open the database");
        let engine = durable::Engine::builder().store(store).client_only().build().expect("build a client engine");
        register(&engine);
        let out = f(&engine).await;
        engine.shutdown().await;
        out
    })
}

/// `durable schedules show <key> --json`.
pub fn show_schedule(dir: &Path, db: &Path, key: &str) -> Value {
    let ran = run_ok(dir, &["schedules", "show", key, "--json", "--db", path_str(db)]);
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", ran.stdout))
}

/// Every schedule in the database at `db`, from `durable schedules list --json`.
pub fn list_schedules(dir: &Path, db: &Path) -> Vec<Value> {
    let ran = run_ok(dir, &["schedules", "list", "--json", "--db", path_str(db)]);
    ran.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}
