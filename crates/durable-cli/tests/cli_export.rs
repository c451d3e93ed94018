//! `durable runs export`: a run's history as a versioned JSON document, on stdout or in a file,
//! that reads back exactly and replays against the workflow code that wrote it.

mod support;

use durable::{Engine, HistoryExport, MemoryStore, Replayed, RunStatus};
use support::{default_db, path_str, run_bad, run_ok, show};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_prints_or_writes_the_history_and_it_replays_against_the_demo_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db).to_string();
    run_ok(dir.path(), &["demo", "--runs", "5", "--db", &dbs]);

    // On stdout: the whole document, exactly as `HistoryExport::to_json` writes it.
    let printed = run_ok(dir.path(), &["runs", "export", "demo-order-0", "--db", &dbs]).stdout;
    let export = HistoryExport::from_json(&printed).unwrap_or_else(|e| panic!("{e}: {printed}"));
    assert_eq!(printed, format!("{}\n", export.to_json().unwrap()), "written again, the bytes differ");
    assert_eq!(export.format, 1);
    assert_eq!(export.run.id.as_str(), "demo-order-0");
    assert_eq!(export.run.status, RunStatus::Completed);
    let shown = show(dir.path(), &db, "demo-order-0");
    assert_eq!(serde_json::to_value(&export.checkpoints).unwrap(), shown["history"], "the checkpoints of `runs show`");
    assert_eq!(serde_json::to_value(&export.run).unwrap(), shown["run"]);

    // In a file (its directories created): the same bytes, and one line on stdout saying so.
    let file = dir.path().join("fixtures/replay/order.json");
    let said = run_ok(dir.path(), &["runs", "export", "demo-order-0", "--out", path_str(&file), "--db", &dbs]).stdout;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), printed);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.starts_with("exported run demo-order-0 (demo_order@1, completed, ")
            && said.trim_end().ends_with(&format!("to {}", file.display())),
        "{said}"
    );
    // A second export replaces the file.
    run_ok(dir.path(), &["runs", "export", "demo-saga-3", "--out", path_str(&file), "--db", &dbs]);
    let saga = HistoryExport::from_json(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saga.run.id.as_str(), "demo-saga-3");
    assert!(!dir.path().join("fixtures/replay/order.json.tmp").exists(), "no temp file left behind");

    // Both replay against the demo's workflow code, which executes nothing while it does.
    let engine = Engine::builder().store(MemoryStore::new()).client_only().build().unwrap();
    durable_cli::register_demo_workflows(&engine);
    assert_eq!(engine.check_replay(&export).await, Ok(Replayed::Finished { status: RunStatus::Completed }));
    assert_eq!(engine.check_replay(&saga).await, Ok(Replayed::Finished { status: RunStatus::Failed }));
    engine.shutdown().await;
}

#[test]
fn exporting_an_unknown_run_or_to_an_unwritable_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "1", "--db", dbs]);

    run_bad(dir.path(), &["runs", "export", "nope", "--db", dbs], "run nope not found");
    // A file where a directory should be.
    let file = dir.path().join("plain");
    std::fs::write(&file, "x").unwrap();
    let target = file.join("order.json");
    let err =
        run_bad(dir.path(), &["runs", "export", "demo-order-0", "--out", path_str(&target), "--db", dbs], "cannot");
    assert!(err.contains(path_str(&target)), "{err}");
    // A directory where the file should be.
    run_bad(
        dir.path(),
        &["runs", "export", "demo-order-0", "--out", path_str(dir.path()), "--db", dbs],
        "is a directory",
    );
    // The database itself (a typo away from --db): refused, and the database still opens.
    let err = run_bad(dir.path(), &["runs", "export", "demo-order-0", "--out", dbs, "--db", dbs], "SQLite database");
    assert!(err.contains("name another file"), "{err}");
    run_ok(dir.path(), &["runs", "show", "demo-order-0", "--db", dbs]);
    // An existing export is replaced as before.
    let json = dir.path().join("order.json");
    std::fs::write(&json, "old").unwrap();
    run_ok(dir.path(), &["runs", "export", "demo-order-0", "--out", path_str(&json), "--db", dbs]);
    assert!(std::fs::read_to_string(&json).unwrap().contains("demo-order-0"));
}
