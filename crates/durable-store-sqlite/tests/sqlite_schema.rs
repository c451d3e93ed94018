//! Opening files: fresh, empty, older schema (migrated), newer schema (refused), not a
//! database, another program's database, a directory, a read-only directory, a locked file.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{block_on, new_run};
use durable_core::{
    Payload, RunFilter, RunId, RunQuery, RunStatus, SaveOutcome, SaveSchedule, Schedule, ScheduleRecord, Store,
};
use durable_store_sqlite::{Error, SCHEMA_VERSION, SqliteOptions, SqliteStore};
use rusqlite::Connection;

fn versions(path: &Path) -> Vec<u32> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT version FROM durable_schema ORDER BY version").unwrap();
    stmt.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
}

fn open_err(path: &Path) -> Error {
    match SqliteStore::open(path) {
        Ok(_) => panic!("{} opened, expected an error", path.display()),
        Err(e) => e,
    }
}

/// Prints a skip past the test harness's output capture, so it shows in a plain `cargo test`.
fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipped {test}: {why}");
}

fn assert_names_path(e: &Error, path: &Path) {
    assert_eq!(e.path(), path);
    assert!(e.to_string().contains(&path.display().to_string()), "message names the path: {e}");
}

#[test]
fn a_missing_file_gets_the_latest_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.path(), path);
    block_on(store.create_run(new_run("r", 1))).unwrap();
    drop(store);
    assert_eq!(versions(&path), (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let conn = Connection::open(&path).unwrap();
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn an_empty_file_is_initialised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    let store = SqliteStore::open(&path).unwrap();
    assert!(block_on(store.create_run(new_run("r", 1))).unwrap().created());
    drop(store);
    assert_eq!(versions(&path).last(), Some(&SCHEMA_VERSION));
}

#[test]
fn an_sqlite_database_without_tables_is_initialised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA user_version = 7; PRAGMA page_size = 8192; VACUUM;").unwrap();
    drop(conn);
    let store = SqliteStore::open(&path).unwrap();
    assert!(block_on(store.create_run(new_run("r", 1))).unwrap().created());
}

#[test]
fn reopening_an_up_to_date_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("again.db");
    drop(SqliteStore::open(&path).unwrap());
    let before = versions(&path);
    let store = SqliteStore::open(&path).unwrap();
    drop(store);
    assert_eq!(versions(&path), before);
}

fn existing_only() -> SqliteOptions {
    SqliteOptions::new().create_if_missing(false)
}

fn open_existing_err(path: &Path) -> Error {
    match SqliteStore::open_with(path, existing_only()) {
        Ok(_) => panic!("{} opened with create_if_missing(false), expected an error", path.display()),
        Err(e) => e,
    }
}

fn assert_not_a_durable_database(e: &Error, path: &Path, why: &str) {
    assert!(matches!(e, Error::NotADatabase { .. }), "{e:?}");
    assert_names_path(e, path);
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{} is not a durable database: ", path.display())), "{msg}");
    assert!(msg.contains(why), "says why ({why}): {msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}

#[test]
fn without_create_if_missing_a_missing_file_is_refused_and_not_created() {
    assert!(SqliteOptions::new().get_create_if_missing(), "creating is the default");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.db");
    let e = open_existing_err(&path);
    assert_not_a_durable_database(&e, &path, "does not exist");
    assert!(!path.exists(), "nothing was created");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no WAL or SHM files either");
}

#[test]
fn without_create_if_missing_an_empty_file_is_refused_and_left_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    let e = open_existing_err(&path);
    assert_not_a_durable_database(&e, &path, "empty");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "the file is still empty");
    assert!(!dir.path().join("empty.db-wal").exists(), "no WAL file was created");
}

#[test]
fn without_create_if_missing_a_bare_sqlite_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA user_version = 7; VACUUM;").unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    let e = open_existing_err(&path);
    assert_not_a_durable_database(&e, &path, "without a durable schema");
    assert!(std::fs::read(&path).unwrap() == before, "the file is unchanged");
}

#[test]
fn without_create_if_missing_a_text_file_is_still_not_a_durable_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"not a database\n").unwrap();
    let e = open_existing_err(&path);
    assert_not_a_durable_database(&e, &path, "SQLite header");
}

#[test]
fn without_create_if_missing_an_existing_database_opens_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let store = SqliteStore::open(&path).unwrap();
    block_on(store.create_run(new_run("kept", 1))).unwrap();
    drop(store);
    let store = SqliteStore::open_with(&path, existing_only()).unwrap();
    assert!(!store.options().get_create_if_missing());
    let run = block_on(store.get_run(&RunId::from("kept"))).unwrap();
    assert!(run.is_some(), "the existing run is there");
    // It is a normal store: writes work.
    assert!(block_on(store.create_run(new_run("more", 2))).unwrap().created());
}

#[test]
fn without_create_if_missing_a_newer_schema_is_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.execute("INSERT INTO durable_schema VALUES (?1, 'from the future', 0)", [SCHEMA_VERSION + 1]).unwrap();
    drop(conn);
    assert!(matches!(open_existing_err(&path), Error::SchemaTooNew { .. }));
}

/// The version-1 schema, exactly as release 1 of this crate wrote it (kept here by hand, so
/// the test does not depend on the migration code it checks).
const V1_SCHEMA: &str = "
CREATE TABLE durable_schema (version INTEGER PRIMARY KEY NOT NULL, description TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT;
INSERT INTO durable_schema VALUES (1, 'runs, checkpoints, waiters, buffered signals and events, query state', 0);
CREATE TABLE runs (
    id TEXT PRIMARY KEY NOT NULL, workflow TEXT NOT NULL, version INTEGER NOT NULL, namespace TEXT NOT NULL,
    status TEXT NOT NULL, input TEXT NOT NULL, output TEXT, error TEXT, tags TEXT NOT NULL DEFAULT '[]',
    priority INTEGER NOT NULL DEFAULT 0, parent_id TEXT, parent_seq INTEGER, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, wake_at INTEGER, lease_owner TEXT, lease_until INTEGER,
    recovery_attempts INTEGER NOT NULL DEFAULT 0, wake_gen INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX runs_pending ON runs (priority DESC, created_at, id) WHERE status = 'pending';
CREATE INDEX runs_due ON runs (wake_at, id) WHERE status = 'suspended';
CREATE INDEX runs_running_lease ON runs (lease_until) WHERE status = 'running';
CREATE INDEX runs_created ON runs (created_at DESC, id DESC);
CREATE INDEX runs_parent ON runs (parent_id) WHERE parent_id IS NOT NULL;
CREATE TABLE checkpoints (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
    input TEXT, output TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 0, wake_at INTEGER,
    started_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE waiters (
    wid INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,
    key TEXT NOT NULL, matcher TEXT, created_at INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX waiters_run ON waiters (run_id, seq);
CREATE INDEX waiters_key ON waiters (kind, key);
CREATE TABLE buffered_signals (id INTEGER PRIMARY KEY, token TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL) STRICT;
CREATE INDEX buffered_signals_token ON buffered_signals (token);
CREATE TABLE buffered_events (id INTEGER PRIMARY KEY, name TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL) STRICT;
CREATE INDEX buffered_events_name ON buffered_events (name);
CREATE TABLE run_state (run_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (run_id, key)) STRICT, WITHOUT ROWID;
PRAGMA application_id = 1146442305;
";

/// Told not to migrate (`migrate(false)`, as the command line's operator commands open it), a
/// file an older durable wrote is refused naming both versions and `durable migrate`, and left
/// byte for byte as it was.
#[test]
fn an_older_file_is_refused_without_migrate_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(V1_SCHEMA).unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    let e = SqliteStore::open_with(&path, SqliteOptions::new().migrate(false)).unwrap_err();
    assert!(matches!(&e, Error::SchemaTooOld { found: 1, supported, .. } if *supported == SCHEMA_VERSION), "{e:?}");
    assert!(e.to_string().contains("durable migrate"), "{e}");
    assert_names_path(&e, &path);
    assert_eq!(std::fs::read(&path).unwrap(), before, "left as it was");
    drop(SqliteStore::open(&path).unwrap());
    assert_eq!(versions(&path), (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

#[test]
fn a_version_1_file_is_migrated_forward_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL;").unwrap();
    conn.execute_batch(V1_SCHEMA).unwrap();
    conn.execute_batch(
        r#"
        INSERT INTO runs (id, workflow, version, namespace, status, input, tags, created_at, updated_at)
            VALUES ('old-1', 'wf', 1, 'default', 'completed', '{"n":1}', '["red","blue"]', 10, 20),
                   ('old-2', 'wf', 1, 'default', 'suspended', '{"n":2}', '["blue"]', 11, 21),
                   ('old-3', 'wf', 1, 'default', 'pending', '{"n":3}', '[]', 12, 12);
        INSERT INTO runs (id, workflow, version, namespace, status, input, tags, parent_id, parent_seq, created_at, updated_at)
            VALUES ('old-child', 'child', 1, 'default', 'dead', '{}', '["red"]', 'old-1', 0, 13, 13);
        INSERT INTO checkpoints (run_id, seq, name, kind, status, output, attempts, started_at, updated_at)
            VALUES ('old-1', 0, 'charge', 'step', 'completed', '"receipt"', 1, 10, 15);
        INSERT INTO waiters (run_id, seq, name, kind, key, created_at)
            VALUES ('old-2', 0, 'approval', 'signal', 'approve:2', 11);
        "#,
    )
    .unwrap();
    drop(conn);
    assert_eq!(versions(&path), [1]);

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(versions(&path), (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    block_on(async {
        // The data is all there and reads through the store.
        let old1 = store.get_run(&RunId::from("old-1")).await.unwrap().unwrap();
        assert_eq!(old1.tags, ["red", "blue"]);
        assert_eq!(old1.input.as_str(), r#"{"n":1}"#);
        let history = store.history(&RunId::from("old-1")).await.unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].output.as_ref().map(|p| p.as_str()), Some(r#""receipt""#));
        assert_eq!(store.waiters(&RunId::from("old-2")).await.unwrap().len(), 1);
        // Version 2's tag index was backfilled from the version-1 rows.
        let ids = |tag: &str| {
            let filter = RunFilter { tag: Some(tag.into()), ..RunFilter::default() };
            let store = &store;
            async move {
                store.list_runs(&filter).await.unwrap().runs.into_iter().map(|r| r.id.to_string()).collect::<Vec<_>>()
            }
        };
        assert_eq!(ids("blue").await, ["old-2", "old-1"]);
        assert_eq!(ids("red").await, ["old-child", "old-1"]);
        // And new runs work on the migrated file.
        let mut tagged = new_run("new", 30);
        tagged.tags = vec!["red".into()];
        store.create_run(tagged).await.unwrap();
        assert_eq!(ids("red").await, ["new", "old-child", "old-1"]);
        // Version 4's indexes list the old rows: by parent, by status, by workflow.
        let list = |filter: RunFilter| {
            let store = &store;
            async move {
                store.list_runs(&filter).await.unwrap().runs.into_iter().map(|r| r.id.to_string()).collect::<Vec<_>>()
            }
        };
        assert_eq!(list(RunFilter { parent: Some(RunId::from("old-1")), ..RunFilter::default() }).await, ["old-child"]);
        let dead_or_suspended = vec![RunStatus::Dead, RunStatus::Suspended];
        assert_eq!(
            list(RunFilter { statuses: dead_or_suspended, ..RunFilter::default() }).await,
            ["old-child", "old-2"]
        );
        assert_eq!(list(RunFilter { workflow: Some("child".into()), ..RunFilter::default() }).await, ["old-child"]);
        // Version 5: the old pending run (no wake_at) is pending work, like the new one; the old
        // suspended one without a timer is not due; schedules can be stored.
        let q = RunQuery { namespace: None, workflows: None, now: 100, limit: 10, leave_queued_since: None };
        assert_eq!(store.pending_runs(&q).await.unwrap(), [RunId::from("old-3"), RunId::from("new")]);
        assert_eq!(store.due_runs(&q).await.unwrap(), Vec::<RunId>::new());
        let every = Schedule::every(std::time::Duration::from_secs(60));
        let record = ScheduleRecord::new("k", "default", "wf", Payload::null(), every, 100).unwrap();
        let save = SaveSchedule { record, expected: None, start: vec![] };
        assert_eq!(store.save_schedule(save).await.unwrap(), SaveOutcome::Saved(1));
        assert_eq!(store.list_schedules(None, None, 10).await.unwrap().len(), 1);
    });
    drop(store);
    // The migrated file has the indexes a new file has (version 5's partial run indexes with
    // their new terms among them), and none of those version 4 replaced.
    let indexes = |path: &Path| {
        let conn = Connection::open(path).unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT name, tbl_name, sql FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL ORDER BY name",
            )
            .unwrap();
        stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    };
    let fresh = dir.path().join("fresh.db");
    drop(SqliteStore::open(&fresh).unwrap());
    assert_eq!(indexes(&path), indexes(&fresh));
    let names: Vec<String> = indexes(&path).into_iter().map(|(name, _, _)| name).collect();
    for gone in ["runs_parent", "runs_running_lease", "run_tags_tag"] {
        assert!(!names.iter().any(|n| n == gone), "{gone} was dropped: {names:?}");
    }
    for new in [
        "runs_status_created",
        "runs_parent_created",
        "run_tags_created",
        "runs_orphaned",
        "runs_pending",
        "runs_due",
        "schedules_due",
        "schedules_namespace",
        "trigger_buffers_due",
        "event_dedupe_expiry",
    ] {
        assert!(names.iter().any(|n| n == new), "{new} was created: {names:?}");
    }
}

#[test]
fn a_file_from_a_newer_build_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    drop(SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.execute("INSERT INTO durable_schema VALUES (?1, 'from the future', 0)", [SCHEMA_VERSION + 97]).unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();

    let e = open_err(&path);
    match &e {
        Error::SchemaTooNew { found, supported, .. } => {
            assert_eq!(*found, SCHEMA_VERSION + 97);
            assert_eq!(*supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_names_path(&e, &path);
    let msg = e.to_string();
    assert!(msg.contains(&(SCHEMA_VERSION + 97).to_string()) && msg.contains(&SCHEMA_VERSION.to_string()), "{msg}");
    assert!(msg.contains("upgrade"), "tells the user to upgrade: {msg}");
    assert!(std::fs::read(&path).unwrap() == before, "the file is unchanged");
}

#[test]
fn a_header_with_an_unknown_write_version_is_refused_and_left_alone() {
    // SQLite opens such a file read-only; the refusal says so instead of blaming permissions.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.db");
    drop(SqliteStore::open(&path).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[18] = 3;
    std::fs::write(&path, &bytes).unwrap();
    let e = open_err(&path);
    assert!(matches!(e, Error::NotADatabase { .. }), "{e:?}");
    assert_names_path(&e, &path);
    assert!(e.to_string().contains("write version 3"), "{e}");
    assert!(std::fs::read(&path).unwrap() == bytes, "the file is unchanged");
}

#[test]
fn a_text_file_is_not_a_durable_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = b"These are my notes, not a database.\nSecond line.\n";
    std::fs::write(&path, text).unwrap();
    let e = open_err(&path);
    assert!(matches!(e, Error::NotADatabase { .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{} is not a durable database: ", path.display())), "{e}");
    assert!(std::fs::read(&path).unwrap() == text, "the file is unchanged");
    assert!(
        !dir.path().join("notes.txt-wal").exists() && !dir.path().join("notes.txt-shm").exists(),
        "no WAL files were created"
    );
    // A tiny file that is not even a header long is refused too.
    std::fs::write(&path, b"x").unwrap();
    assert!(matches!(open_err(&path), Error::NotADatabase { .. }));
}

#[test]
fn another_programs_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users VALUES (1, 'ann');")
        .unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    let e = open_err(&path);
    assert!(matches!(e, Error::NotADatabase { .. }), "{e:?}");
    assert!(e.to_string().contains("users"), "names what it found: {e}");
    assert_names_path(&e, &path);
    assert!(std::fs::read(&path).unwrap() == before, "the file is unchanged");
}

#[test]
fn a_directory_is_not_a_durable_database() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_err(dir.path());
    assert!(matches!(e, Error::NotADatabase { .. }), "{e:?}");
    assert_names_path(&e, dir.path());
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no").join("such").join("dir.db");
    let e = open_err(&path);
    assert!(matches!(e, Error::Sqlite { .. }), "{e:?}");
    assert_names_path(&e, &path);
    assert!(e.to_string().contains("cannot open"), "{e}");
}

#[cfg(unix)]
#[test]
fn a_read_only_directory_is_a_clear_error_and_nothing_is_written() {
    use std::os::unix::fs::PermissionsExt;
    /// Makes the directory writable again before it is removed, also when an assertion fails.
    struct Writable<'a>(&'a std::path::Path);
    impl Drop for Writable<'_> {
        fn drop(&mut self) {
            let _ = std::fs::set_permissions(self.0, std::fs::Permissions::from_mode(0o755));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let _writable = Writable(dir.path());
    // Root (and CAP_DAC_OVERRIDE) can write to a read-only directory: find out by trying.
    let probe = dir.path().join("probe");
    if std::fs::write(&probe, b"x").is_ok() {
        let _ = std::fs::remove_file(&probe);
        skip("a_read_only_directory_is_a_clear_error", "this user can write to a read-only directory (root?)");
        return;
    }
    let path = dir.path().join("ro.db");
    let e = open_err(&path);
    assert!(matches!(e, Error::Sqlite { .. }), "{e:?}");
    assert_names_path(&e, &path);
    assert!(!path.exists(), "no file was created");
    // Through the Store error type it is a Backend error.
    assert_eq!(durable_core::StoreError::from(e).kind(), durable_core::StoreErrorKind::Backend);
}

#[cfg(unix)]
#[test]
fn a_read_only_file_is_a_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.db");
    drop(SqliteStore::open(&path).unwrap());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    if std::fs::OpenOptions::new().append(true).open(&path).is_ok() {
        skip("a_read_only_file_is_a_clear_error", "this user can write to a read-only file (root?)");
        return;
    }
    let e = open_err(&path);
    assert!(matches!(e, Error::Sqlite { .. }), "{e:?}");
    assert_names_path(&e, &path);
    assert!(e.to_string().contains("read-only"), "{e}");
}

#[test]
fn a_file_locked_past_the_busy_timeout_is_busy_and_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    // Another program holds an exclusive lock on a fresh (rollback-journal) database.
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE; CREATE TABLE t (x);").unwrap();
    let opts = SqliteOptions::new().busy_timeout(Duration::from_millis(20));
    let e = SqliteStore::open_with(&path, opts.clone()).expect_err("the file is locked");
    assert!(matches!(e, Error::Busy { .. }), "{e:?}");
    assert!(e.is_retryable());
    assert_names_path(&e, &path);
    let store_err = durable_core::StoreError::from(e);
    assert!(store_err.is_retryable(), "{store_err}");
    // Once the lock is gone (the other program's table was rolled back), it opens.
    conn.execute_batch("ROLLBACK").unwrap();
    drop(conn);
    let store = SqliteStore::open_with(&path, opts).unwrap();
    assert!(block_on(store.create_run(new_run("r", 1))).unwrap().created());
}

fn slot_request(holder: &str, now: u64) -> durable_core::admission::SlotRequest {
    durable_core::admission::SlotRequest {
        gate: "queue:default:api".into(),
        holder: holder.into(),
        run_id: RunId::from(holder),
        priority: 0,
        fairness_key: String::new(),
        limits: durable_core::admission::Limits { concurrency: Some(2), ..Default::default() },
        lease_until: None,
        max_waiting: None,
        succeeds: None,
        now,
    }
}

/// Takes a file back from version 12 to version 11: no claim count on the runs.
fn undo_version_12(conn: &Connection) {
    undo_version_13(conn);
    conn.execute_batch("ALTER TABLE runs DROP COLUMN claims; DELETE FROM durable_schema WHERE version = 12;").unwrap();
}

/// Takes a file back from version 13 to version 12: a data cleanup, so only the record.
fn undo_version_13(conn: &Connection) {
    conn.execute_batch("DELETE FROM durable_schema WHERE version = 13;").unwrap();
}

/// Takes a file back from version 11 to version 10: `runs_due` with its old `IN` list.
fn undo_version_11(conn: &Connection) {
    conn.execute_batch(
        "DROP INDEX runs_due;
         CREATE INDEX runs_due ON runs (wake_at, id)
             WHERE status IN ('suspended', 'blocked', 'pending') AND wake_at IS NOT NULL;
         DELETE FROM durable_schema WHERE version = 11;",
    )
    .unwrap();
}

/// Version 10 counts a gate's slot rows on its row (`held`): a version-9 file's gates get the
/// count of the slots they hold when it is migrated, so a full gate stays full (a gate counted
/// 0 would admit past its limit) and a release still hands its slot to the first waiter.
#[test]
fn a_version_9_file_with_held_slots_is_migrated_with_its_gates_counts() {
    use durable_core::admission::Admission;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v9.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        block_on(async {
            for (holder, expected) in [("a", Admission::Admitted), ("b", Admission::Admitted)] {
                assert_eq!(store.acquire_slot(&slot_request(holder, 1_000)).await.unwrap(), expected);
            }
            assert_eq!(
                store.acquire_slot(&slot_request("c", 1_000)).await.unwrap(),
                Admission::Waiting { retry_at: None }
            );
        });
    }
    // Back to version 9 exactly: the column version 12 added is dropped, version 11's index goes
    // back to its old terms, the column version 10 added is dropped.
    let conn = Connection::open(&path).unwrap();
    undo_version_12(&conn);
    undo_version_11(&conn);
    conn.execute_batch("ALTER TABLE admission_gates DROP COLUMN held; DELETE FROM durable_schema WHERE version = 10;")
        .unwrap();
    drop(conn);
    assert_eq!(versions(&path).last(), Some(&9));

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(versions(&path), (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let conn = Connection::open(&path).unwrap();
    let held: i64 = conn.query_row("SELECT held FROM admission_gates", [], |r| r.get(0)).unwrap();
    assert_eq!(held, 2, "the migrated gate counts its two slots");
    block_on(async {
        assert_eq!(
            store.acquire_slot(&slot_request("d", 2_000)).await.unwrap(),
            Admission::Waiting { retry_at: None },
            "the gate is still full"
        );
        assert_eq!(store.release_slot("queue:default:api", "a", 3_000).await.unwrap(), [RunId::from("c")]);
        let stats = store.admission_stats(4_000).await.unwrap();
        assert_eq!((stats[0].held, stats[0].waiting), (2, 1));
    });
    let held: i64 = conn.query_row("SELECT held FROM admission_gates", [], |r| r.get(0)).unwrap();
    assert_eq!(held, 2);
}

/// Version 12 counts each run's claims (`Run::claims`): a version-11 file's runs start at 0 and
/// count from their next claim on.
#[test]
fn a_version_11_file_is_migrated_with_claims_counted_from_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v11.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        assert!(block_on(store.create_run(new_run("r", 1))).unwrap().created());
    }
    let conn = Connection::open(&path).unwrap();
    undo_version_12(&conn);
    drop(conn);
    assert_eq!(versions(&path).last(), Some(&11));

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(versions(&path), (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let id = RunId::from("r");
    assert_eq!(block_on(store.get_run(&id)).unwrap().unwrap().claims, 0);
    let claim = durable_core::Claim { run_id: id.clone(), owner: "o".into(), lease_until: 10_000, now: 1_000 };
    match block_on(store.claim_run(claim)).unwrap() {
        durable_core::ClaimOutcome::Acquired { run, .. } => assert_eq!(run.claims, 1),
        other => panic!("expected the claim to acquire the run, got {other:?}"),
    }
    assert_eq!(block_on(store.get_run(&id)).unwrap().unwrap().claims, 1);
}

#[test]
fn an_empty_or_in_memory_path_is_refused() {
    for path in ["", ":memory:"] {
        let e = open_err(Path::new(path));
        assert!(matches!(&e, Error::InvalidPath { path: p, .. } if p == Path::new(path)), "{e}");
        assert!(e.to_string().contains("give the path of a file"), "{e}");
    }
}

/// Version 13 deletes the child results an older build buffered for parents no wait of which
/// can take them (gone, completed or cancelled): a run given such a parent's id took them.
/// Those of active parents, and tokens that only look like a child's, are kept.
#[test]
fn version_13_deletes_the_child_results_no_parent_can_take() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v12.db");
    let store = SqliteStore::open(&path).unwrap();
    for id in ["p", "p:1", "done", "cancelled", "failed"] {
        block_on(store.create_run(new_run(id, 1))).unwrap();
    }
    drop(store);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "UPDATE runs SET status = 'completed' WHERE id = 'done';
         UPDATE runs SET status = 'cancelled' WHERE id = 'cancelled';
         UPDATE runs SET status = 'failed' WHERE id = 'failed';
         INSERT INTO buffered_signals (token, payload, created_at) VALUES
             ('child:done:0', '1', 1), ('child:cancelled:3', '1', 1), ('child:gone:0', '1', 1),
             ('child:p:0', '1', 1), ('child:p:1:0', '1', 1), ('child:failed:2', '1', 1),
             ('child:p:1:x', '1', 1), ('child::4', '1', 1), ('approve', '1', 1);",
    )
    .unwrap();
    undo_version_13(&conn);
    drop(conn);
    assert_eq!(versions(&path).last(), Some(&12));
    drop(SqliteStore::open(&path).unwrap());
    assert_eq!(versions(&path).last(), Some(&13));
    let conn = Connection::open(&path).unwrap();
    let mut stmt = conn.prepare("SELECT token FROM buffered_signals ORDER BY token").unwrap();
    let kept: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(kept, ["approve", "child::4", "child:failed:2", "child:p:0", "child:p:1:0", "child:p:1:x"]);
}
