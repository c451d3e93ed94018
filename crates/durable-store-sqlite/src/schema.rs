//! Opening a database file: header check, connection settings and versioned migrations.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};

use crate::error::{Error, Result};
use crate::options::SqliteOptions;

/// The schema version this build writes and reads. Files with an older version are migrated
/// forward when opened (unless `migrate(false)`: [`Error::SchemaTooOld`]); files with a newer
/// one are refused ([`Error::SchemaTooNew`]).
pub const SCHEMA_VERSION: u32 = 13;

/// `PRAGMA application_id` of a durable database ("DURA"), so tools like `file(1)` and this
/// crate can tell a durable file from another program's SQLite database.
pub(crate) const APPLICATION_ID: i32 = 0x4455_5241;

/// One step of the schema's history. Applied in order, each in the same transaction as the
/// row recording it in `durable_schema`.
struct Migration {
    version: u32,
    description: &'static str,
    sql: &'static str,
}

/// The whole history of the schema. Never edit an entry once released: add one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "runs, checkpoints, waiters, buffered signals and events, query state",
        sql: "
CREATE TABLE runs (
    id                TEXT PRIMARY KEY NOT NULL,
    workflow          TEXT NOT NULL,
    version           INTEGER NOT NULL,
    namespace         TEXT NOT NULL,
    status            TEXT NOT NULL,
    input             TEXT NOT NULL,
    output            TEXT,
    error             TEXT,
    tags              TEXT NOT NULL DEFAULT '[]',
    priority          INTEGER NOT NULL DEFAULT 0,
    parent_id         TEXT,
    parent_seq        INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    wake_at           INTEGER,
    lease_owner       TEXT,
    lease_until       INTEGER,
    recovery_attempts INTEGER NOT NULL DEFAULT 0,
    wake_gen          INTEGER NOT NULL DEFAULT 0
) STRICT;
-- Pollers: pending by priority then age, due timers by wake_at, running runs by lease.
CREATE INDEX runs_pending ON runs (priority DESC, created_at, id) WHERE status = 'pending';
CREATE INDEX runs_due ON runs (wake_at, id) WHERE status = 'suspended';
CREATE INDEX runs_running_lease ON runs (lease_until) WHERE status = 'running';
-- list_runs (newest first) and children by parent.
CREATE INDEX runs_created ON runs (created_at DESC, id DESC);
CREATE INDEX runs_parent ON runs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE checkpoints (
    run_id     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    status     TEXT NOT NULL,
    input      TEXT,
    output     TEXT,
    error      TEXT,
    attempts   INTEGER NOT NULL DEFAULT 0,
    wake_at    INTEGER,
    started_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;

-- wid is the registration order, which is the delivery order.
CREATE TABLE waiters (
    wid        INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    key        TEXT NOT NULL,
    matcher    TEXT,
    created_at INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX waiters_run ON waiters (run_id, seq);
CREATE INDEX waiters_key ON waiters (kind, key);

CREATE TABLE buffered_signals (
    id         INTEGER PRIMARY KEY,
    token      TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX buffered_signals_token ON buffered_signals (token);

CREATE TABLE buffered_events (
    id         INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX buffered_events_name ON buffered_events (name);

CREATE TABLE run_state (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) STRICT, WITHOUT ROWID;
",
    },
    Migration {
        version: 2,
        description: "run_tags: an index of run tags for list_runs, backfilled from runs.tags",
        sql: "
CREATE TABLE run_tags (
    run_id TEXT NOT NULL,
    tag    TEXT NOT NULL,
    PRIMARY KEY (run_id, tag)
) STRICT, WITHOUT ROWID;
CREATE INDEX run_tags_tag ON run_tags (tag, run_id);
INSERT OR IGNORE INTO run_tags (run_id, tag)
    SELECT runs.id, j.value FROM runs, json_each(runs.tags) AS j WHERE j.type = 'text';
",
    },
    Migration {
        version: 3,
        description: "run_queue: runs to execute (starts and wakes) for the store-backed transport",
        sql: "
CREATE TABLE run_queue (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL,
    reason      TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    priority    INTEGER NOT NULL,
    dedupe_key  TEXT NOT NULL,
    enqueued_at INTEGER NOT NULL,
    claimed_by  TEXT,
    claim_until INTEGER
) STRICT;
-- At most one unclaimed item per run.
CREATE UNIQUE INDEX run_queue_open ON run_queue (run_id) WHERE claimed_by IS NULL;
CREATE INDEX run_queue_next ON run_queue (namespace, priority DESC, enqueued_at, id);
",
    },
    Migration {
        version: 4,
        description: "an index for every list_runs filter and for the orphan scan; run_tags carries created_at",
        sql: "
-- list_runs: one index per filter, each ending in the listing order (newest first), so the first
-- page of any filter reads about a page of index entries whatever the number of runs. The query
-- builder (ops::list_runs_sql) chooses which one a filter walks.
CREATE INDEX runs_status_created ON runs (status, created_at DESC, id DESC);
CREATE INDEX runs_workflow_created ON runs (workflow, created_at DESC, id DESC);
CREATE INDEX runs_namespace_created ON runs (namespace, created_at DESC, id DESC);
DROP INDEX runs_parent;
CREATE INDEX runs_parent_created ON runs (parent_id, created_at DESC, id DESC) WHERE parent_id IS NOT NULL;
-- A run's tags in the listing order: run_tags gets the run's created_at (which never changes).
CREATE TABLE run_tags_v4 (
    run_id     TEXT NOT NULL,
    tag        TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, tag)
) STRICT, WITHOUT ROWID;
INSERT INTO run_tags_v4 (run_id, tag, created_at)
    SELECT t.run_id, t.tag, r.created_at FROM run_tags AS t JOIN runs AS r ON r.id = t.run_id;
DROP TABLE run_tags;
ALTER TABLE run_tags_v4 RENAME TO run_tags;
CREATE INDEX run_tags_created ON run_tags (tag, created_at DESC, run_id DESC);
-- The orphan scan: running runs by the time their lease stops holding them (-1: no lease), so a
-- scan that finds no orphan reads nothing, however many runs are running.
DROP INDEX runs_running_lease;
CREATE INDEX runs_orphaned ON runs ((CASE WHEN lease_owner IS NULL OR lease_until IS NULL THEN -1 ELSE lease_until END))
    WHERE status = 'running';
",
    },
    Migration {
        version: 5,
        description: "schedules, trigger buffers and publish dedupe ids; delayed starts are due runs, not pending ones",
        sql: "
-- Delayed starts: a pending run with a wake_at (NewRun::start_at) is not pending work; it comes
-- due through the due scan, with the suspended runs. Both scans keep a partial index of exactly
-- their rows (ops::poll_sql names them and repeats their WHERE terms).
DROP INDEX runs_pending;
CREATE INDEX runs_pending ON runs (priority DESC, created_at, id) WHERE status = 'pending' AND wake_at IS NULL;
DROP INDEX runs_due;
CREATE INDEX runs_due ON runs (wake_at, id) WHERE status IN ('suspended', 'pending') AND wake_at IS NOT NULL;

-- Stored schedules: the record (durable_core::ScheduleRecord) as JSON in body; the columns the
-- queries filter and order on beside it. revision is the compare-and-set of every save.
CREATE TABLE schedules (
    key       TEXT PRIMARY KEY NOT NULL,
    namespace TEXT NOT NULL,
    workflow  TEXT NOT NULL,
    due_at    INTEGER,
    revision  INTEGER NOT NULL,
    body      TEXT NOT NULL
) STRICT;
-- The due scan reads only the schedules that are due (a paused or ended one has no due_at).
CREATE INDEX schedules_due ON schedules (due_at, key) WHERE due_at IS NOT NULL;
-- list_schedules of one namespace, by key.
CREATE INDEX schedules_namespace ON schedules (namespace, key);

-- Open trigger buffers (durable_core::TriggerBuffer as JSON in body), one per (workflow, key);
-- namespace is that of the run the buffer starts.
CREATE TABLE trigger_buffers (
    workflow  TEXT NOT NULL,
    key       TEXT NOT NULL,
    namespace TEXT NOT NULL,
    batch_id  TEXT NOT NULL,
    due_at    INTEGER NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (workflow, key)
) STRICT;
CREATE INDEX trigger_buffers_due ON trigger_buffers (due_at, workflow, key);

-- Publish dedupe ids, remembered until keep_until; a publish with a dedupe id forgets a few of
-- the expired ones (by keep_until).
CREATE TABLE event_dedupe (
    name       TEXT NOT NULL,
    id         TEXT NOT NULL,
    keep_until INTEGER NOT NULL,
    PRIMARY KEY (name, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX event_dedupe_expiry ON event_dedupe (keep_until);
",
    },
    Migration {
        version: 6,
        description: "remote steps: tasks and workers; blocked runs are due like suspended ones",
        sql: "
-- A blocked run is a suspended one that no live worker can serve: its timers and wakes make it
-- due the same way.
DROP INDEX runs_due;
CREATE INDEX runs_due ON runs (wake_at, id)
    WHERE status IN ('suspended', 'blocked', 'pending') AND wake_at IS NOT NULL;

-- One row per remote step (durable_core::Task), the latest attempt, keyed by the step's
-- (run_id, seq). requires and logs are JSON arrays; input and progress payload text.
-- deadline is Task::deadline (NULL: never), kept in step with claimed_at; seen_at is the last
-- heartbeat, or the dispatch before any claim (the silence scan).
CREATE TABLE tasks (
    run_id               TEXT NOT NULL,
    seq                  INTEGER NOT NULL,
    attempt              INTEGER NOT NULL,
    name                 TEXT NOT NULL,
    queue                TEXT NOT NULL,
    namespace            TEXT NOT NULL,
    input                TEXT NOT NULL,
    priority             INTEGER NOT NULL,
    requires             TEXT NOT NULL,
    pickup_timeout_ms    INTEGER,
    timeout_ms           INTEGER,
    heartbeat_timeout_ms INTEGER NOT NULL,
    created_at           INTEGER NOT NULL,
    state                TEXT NOT NULL,
    worker               TEXT,
    lease_until          INTEGER,
    claimed_at           INTEGER,
    heartbeat_at         INTEGER,
    progress             TEXT,
    claims               INTEGER NOT NULL DEFAULT 0,
    logs                 TEXT NOT NULL DEFAULT '[]',
    outcome              TEXT,
    deadline             INTEGER,
    seen_at              INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT;
-- Claims: the unfinished tasks of a queue in claim order (priority, then age).
CREATE INDEX tasks_claim ON tasks (queue, priority DESC, created_at, run_id, seq) WHERE state <> 'finished';
-- Expiry and silence scans read the unfinished tasks past the time, not all of them.
CREATE INDEX tasks_deadline ON tasks (deadline) WHERE state <> 'finished' AND deadline IS NOT NULL;
CREATE INDEX tasks_seen ON tasks (seen_at) WHERE state <> 'finished';
-- Listings, oldest first: of the unfinished tasks, and of all.
CREATE INDEX tasks_unfinished ON tasks (created_at, run_id, seq) WHERE state <> 'finished';
CREATE INDEX tasks_created ON tasks (created_at, run_id, seq);

-- Worker descriptors (durable_core::WorkerInfo as JSON in body), by id.
CREATE TABLE workers (
    id           TEXT PRIMARY KEY NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    body         TEXT NOT NULL
) STRICT;
CREATE INDEX workers_heartbeat ON workers (heartbeat_at);
",
    },
    Migration {
        version: 7,
        description: "flow control: admission gates, held slots and queued requests",
        sql: "
-- One row per gate (durable_core::admission::GateRecord): its limits as JSON, the next arrival
-- ticket, the fairness round being served, the rate window, and the latest time a call brought.
-- Gates are never deleted (the stats list every gate ever used).
CREATE TABLE admission_gates (
    gate         TEXT PRIMARY KEY NOT NULL,
    limits       TEXT NOT NULL,
    next_ticket  INTEGER NOT NULL,
    round        INTEGER NOT NULL,
    window_start INTEGER NOT NULL,
    window_count INTEGER NOT NULL,
    touched      INTEGER NOT NULL
) STRICT;

-- Held slots (SlotRecord): a gate's are read by its primary-key prefix (at most about its
-- concurrency), a run's by admission_slots_run (a settle or delete releases them all).
-- lease_until NULL: held until released.
CREATE TABLE admission_slots (
    gate        TEXT NOT NULL,
    holder      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    acquired_at INTEGER NOT NULL,
    lease_until INTEGER,
    PRIMARY KEY (gate, holder)
) STRICT, WITHOUT ROWID;
CREATE INDEX admission_slots_run ON admission_slots (run_id, gate, holder);
-- A gate's leased slots (steps'), the only ones that can expire: reclaiming reads these alone.
CREATE INDEX admission_slots_leased ON admission_slots (gate, lease_until) WHERE lease_until IS NOT NULL;

-- Queued requests (WaiterRecord). The rank (priority, round, ticket) orders a gate's queue:
-- the head and the number ranked before a request are range reads of admission_waiters_rank;
-- a fairness key's next round is one step down admission_waiters_key.
CREATE TABLE admission_waiters (
    gate          TEXT NOT NULL,
    holder        TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    rank_priority INTEGER NOT NULL,
    rank_round    INTEGER NOT NULL,
    rank_ticket   INTEGER NOT NULL,
    priority      INTEGER NOT NULL,
    fairness_key  TEXT NOT NULL,
    lease_ms      INTEGER,
    since         INTEGER NOT NULL,
    PRIMARY KEY (gate, holder)
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX admission_waiters_rank ON admission_waiters (gate, rank_priority, rank_round, rank_ticket);
CREATE INDEX admission_waiters_key ON admission_waiters (gate, fairness_key, rank_round);
CREATE INDEX admission_waiters_run ON admission_waiters (run_id, gate, holder);
",
    },
    Migration {
        version: 8,
        description: "trace contexts: runs and tasks keep the W3C traceparent their spans join",
        sql: "
-- NULL on rows written before (their spans derive a trace id from the run id).
ALTER TABLE runs ADD COLUMN trace_context TEXT;
ALTER TABLE tasks ADD COLUMN trace_context TEXT;
",
    },
    Migration {
        version: 9,
        description: "runs by workflow and status in the listing order, for list_runs filters and run_counts",
        sql: "
-- A list_runs filter on a workflow and statuses walks this index, one range per status (merged
-- in order), so its first page reads about a page of entries however rare the status is among
-- the workflow's runs; run_counts reads this index alone, in group order. A status change moves
-- the run's entry here as in runs_status_created; a step commit changes no column of it.
CREATE INDEX runs_workflow_status_created ON runs (workflow, status, created_at DESC, id DESC);
",
    },
    Migration {
        version: 10,
        description: "admission gates count their slot rows (held), so a decision reads no slot to count them",
        sql: "
-- The number of admission_slots rows of the gate (live or with a passed lease), kept by every
-- write that inserts or deletes a slot, in the same transaction, and saved with the gate's row:
-- a request or a hand-off counts a gate's live slots as held less the (usually no) slots whose
-- lease passed, one step of admission_slots_leased, instead of counting the gate's slots.
ALTER TABLE admission_gates ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
UPDATE admission_gates SET held = (SELECT COUNT(*) FROM admission_slots s WHERE s.gate = admission_gates.gate);
",
    },
    Migration {
        version: 11,
        description: "runs_due names its statuses with equalities, so writing a run builds no temporary table",
        sql: "
-- The same rows as before, by the same key. SQLite evaluates a partial index's WHERE for the old
-- and the new row of every UPDATE of runs; `status IN (three values)` made it fill a temporary
-- table with the list each time (a list of more than two constants is looked up, not compared),
-- equalities joined by OR are compared in place. ops::poll_sql repeats this term exactly.
DROP INDEX runs_due;
CREATE INDEX runs_due ON runs (wake_at, id)
    WHERE (status = 'suspended' OR status = 'blocked' OR status = 'pending') AND wake_at IS NOT NULL;
",
    },
    Migration {
        version: 12,
        description: "runs count the claims that acquired them (claims), so an engine can tell nobody else ran a run",
        sql: "
-- Incremented by every claim_run that acquires the run. An engine that kept a suspended run's
-- turn in memory resumes it only when its next claim finds the count one past its own last claim.
ALTER TABLE runs ADD COLUMN claims INTEGER NOT NULL DEFAULT 0;
",
    },
    Migration {
        version: 13,
        description: "the results buffered for parents that are gone, completed or cancelled are deleted (a run given \
                      a deleted parent's id took them)",
        sql: "
-- From this version a child's result for such a parent is dropped, and deleting a run deletes
-- its children's buffered results (ops::send_signal, ops::delete_run); these are the ones an
-- older build left. A token `child:<parent>:<digits>`: rtrim drops the seq, leaving the `:`.
DELETE FROM buffered_signals
 WHERE token GLOB 'child:*'
   AND length(token) > length(rtrim(token, '0123456789'))
   AND substr(rtrim(token, '0123456789'), -1) = ':'
   AND length(rtrim(token, '0123456789')) > 7
   AND NOT EXISTS (SELECT 1 FROM runs r
                    WHERE r.id = substr(token, 7, length(rtrim(token, '0123456789')) - 7)
                      AND r.status NOT IN ('completed', 'cancelled'));
",
    },
];

const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Refuses a file that exists and is not SQLite, before SQLite opens (and maybe writes) it;
/// without `create_if_missing`, also a missing or empty file.
fn check_header(path: &Path, opts: &SqliteOptions) -> Result<()> {
    let io_err = |message: &str, source| Error::Io { path: path.to_path_buf(), message: message.into(), source };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if opts.create_if_missing {
                return Ok(());
            }
            return Err(not_created(path, "the file does not exist (nothing was created)"));
        }
        Err(e) => return Err(io_err("cannot read the file's metadata", e)),
    };
    if meta.is_dir() {
        return Err(Error::NotADatabase { path: path.to_path_buf(), reason: "it is a directory".into() });
    }
    if meta.len() == 0 {
        // SQLite treats an empty file as an empty database: it is initialised, if allowed.
        if opts.create_if_missing {
            return Ok(());
        }
        return Err(not_created(path, "the file is empty (it was left as it is)"));
    }
    let mut head = Vec::with_capacity(20);
    File::open(path)
        .and_then(|f| f.take(20).read_to_end(&mut head))
        .map_err(|e| io_err("cannot read the file header", e))?;
    if !head.starts_with(SQLITE_HEADER) {
        return Err(Error::NotADatabase {
            path: path.to_path_buf(),
            reason: "it is not an SQLite database (the file does not start with the SQLite header)".into(),
        });
    }
    // Byte 18, the file format's write version: 1 (rollback journal) or 2 (WAL). SQLite opens a
    // file with a higher one read-only, which would be reported as a permission problem.
    if let Some(&write_version) = head.get(18)
        && write_version > 2
    {
        return Err(Error::NotADatabase {
            path: path.to_path_buf(),
            reason: format!(
                "its header names file format write version {write_version}, which this SQLite cannot write \
                 (1 or 2 expected): the header is damaged, or the file needs a newer SQLite"
            ),
        });
    }
    Ok(())
}

/// The refusal of a file that `create_if_missing(false)` does not let the store initialise.
fn not_created(path: &Path, reason: &str) -> Error {
    Error::NotADatabase { path: path.to_path_buf(), reason: reason.into() }
}

/// Opens one connection with the store's settings: busy timeout, WAL, synchronous, cache.
pub(crate) fn connect(path: &Path, opts: &SqliteOptions, role: &str) -> Result<Connection> {
    let conn = open_plain(path, opts, role)?;
    configure(&conn, path, opts)?;
    Ok(conn)
}

/// Opens a connection without changing anything in the file.
fn open_plain(path: &Path, opts: &SqliteOptions, role: &str) -> Result<Connection> {
    let err = |doing: &str, e| Error::sqlite(path, opts.busy_timeout, doing, e);
    // No SQLITE_OPEN_URI: the path is a path, never a `file:` URI with options.
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if opts.create_if_missing {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let mut conn =
        Connection::open_with_flags(path, flags).map_err(|e| err(&format!("opening the {role} connection"), e))?;
    // Short, jittered pauses between tries for the write lock, up to the busy timeout (see
    // `busy`); this thread runs the opening statements.
    crate::busy::set_timeout(opts.busy_timeout);
    conn.busy_handler(Some(crate::busy::wait)).map_err(|e| err("setting the busy handler", e))?;
    if conn.is_readonly(rusqlite::MAIN_DB).map_err(|e| err("opening the database", e))? {
        return Err(Error::Sqlite {
            path: path.to_path_buf(),
            message: "the database is read-only (check the permissions of the file and of its directory); \
                      durable needs to write to it"
                .into(),
            source: "SQLite opened the file read-only".into(),
        });
    }
    conn.set_prepared_statement_cache_capacity(128);
    // The query planner stability guarantee: a statement's plan never depends on the values
    // bound to it. Without it, SQLite marks a statement whose plan looked at a bound value
    // (an equality with `?N`, a `LIMIT ?N`) to be re-prepared when that value is rebound,
    // and rusqlite's statement cache clears the bindings of every statement it takes back,
    // so each use of such a cached statement was parsed and planned again (about as costly
    // as the statement itself: a run's claim re-planned its history read every time).
    // The plans do not need the values: `tests/sqlite_plans.rs` checks them.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| err("configuring the query planner", e))?;
    Ok(conn)
}

/// Switches to WAL and sets the per-connection pragmas.
fn configure(conn: &Connection, path: &Path, opts: &SqliteOptions) -> Result<()> {
    let err = |doing: &str, e| Error::sqlite(path, opts.busy_timeout, doing, e);
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|e| err("switching to WAL mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Sqlite {
            path: path.to_path_buf(),
            message: format!("cannot switch the database to WAL mode (SQLite kept journal mode {mode:?})"),
            source: "journal_mode=WAL refused".into(),
        });
    }
    let pragmas = format!(
        "PRAGMA synchronous = {}; PRAGMA foreign_keys = OFF; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -16384;",
        opts.durability.synchronous()
    );
    conn.execute_batch(&pragmas).map_err(|e| err("configuring the connection", e))
}

/// Opens the writer connection of a store: checks the file, then brings its schema to
/// [`SCHEMA_VERSION`] (creating it in an empty database) in one transaction.
pub(crate) fn open_writer(path: &Path, opts: &SqliteOptions) -> Result<Connection> {
    // SQLite opens a private temporary database for these, which is gone once closed.
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
        let reason = "SQLite would open a temporary database, lost when the store closes; give the path of a file \
                      (it is created if missing)";
        return Err(Error::InvalidPath { path: path.to_path_buf(), reason });
    }
    check_header(path, opts)?;
    let conn = open_plain(path, opts, "writer")?;
    // Refuse another program's database, or one from a newer build, before switching it to
    // WAL (which rewrites the header): a refused file is left exactly as it was.
    let err = |doing: &str, e| Error::sqlite(path, opts.busy_timeout, doing, e);
    match schema_version(&conn).map_err(|e| err("reading the schema version", e))? {
        None => {
            check_foreign(&conn, path, opts)?;
            if !opts.create_if_missing {
                return Err(no_schema(path));
            }
        }
        // Refused before the switch to WAL, which rewrites the header: left exactly as it was.
        Some(v) => check_version(path, v, opts)?,
    }
    configure(&conn, path, opts)?;
    migrate(&conn, path, opts)?;
    Ok(conn)
}

/// The refusal of an SQLite database without a durable schema under `create_if_missing(false)`.
fn no_schema(path: &Path) -> Error {
    not_created(path, "it is an SQLite database without a durable schema (it was left as it is)")
}

/// Fails unless a database without a durable schema is empty (then it may be initialised).
fn check_foreign(conn: &Connection, path: &Path, opts: &SqliteOptions) -> Result<()> {
    let err = |doing: &str, e| Error::sqlite(path, opts.busy_timeout, doing, e);
    let not_durable = |reason: String| Error::NotADatabase { path: path.to_path_buf(), reason };
    let app_id: i32 =
        conn.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(|e| err("reading the header", e))?;
    if app_id != 0 && app_id != APPLICATION_ID {
        return Err(not_durable(format!(
            "it is an SQLite database of another application (application_id {app_id:#x})"
        )));
    }
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' \
             ORDER BY name LIMIT 6",
        )
        .map_err(|e| err("listing tables", e))?;
    let names: Vec<String> =
        stmt.query_map([], |r| r.get(0)).and_then(|rows| rows.collect()).map_err(|e| err("listing tables", e))?;
    if !names.is_empty() {
        return Err(not_durable(format!(
            "it is an SQLite database with other tables ({}) and no durable schema; give durable a file of its own",
            names.join(", ")
        )));
    }
    Ok(())
}

fn schema_version(conn: &Connection) -> rusqlite::Result<Option<u32>> {
    let has_table: bool =
        conn.prepare("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'durable_schema'")?.exists([])?;
    if !has_table {
        return Ok(None);
    }
    let v: Option<i64> = conn.query_row("SELECT MAX(version) FROM durable_schema", [], |r| r.get(0))?;
    Ok(Some(v.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32))
}

fn migrate(conn: &Connection, path: &Path, opts: &SqliteOptions) -> Result<()> {
    let err = |doing: &str, e| Error::sqlite(path, opts.busy_timeout, doing, e);
    // A quick read first, so opening an up-to-date file never waits for the write lock.
    let current = schema_version(conn).map_err(|e| err("reading the schema version", e))?;
    match current {
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        Some(v) => check_version(path, v, opts)?,
        None => {}
    }
    conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| err("starting the schema migration", e))?;
    let result = migrate_locked(conn, path, opts);
    match result {
        Ok(from) => {
            conn.execute_batch("COMMIT").map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                err("committing the schema migration", e)
            })?;
            if from > 0 && from < SCHEMA_VERSION {
                tracing::info!(path = %path.display(), from, to = SCHEMA_VERSION, "migrated the durable schema; builds older than this one now refuse the file");
            }
            Ok(())
        }
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Err(e)
        }
    }
}

/// Refuses a file of schema version `found` this build cannot open as `opts` say: a newer
/// build's ([`Error::SchemaTooNew`]), or an older build's without `migrate`
/// ([`Error::SchemaTooOld`]).
fn check_version(path: &Path, found: u32, opts: &SqliteOptions) -> Result<()> {
    let (path, supported) = (path.to_path_buf(), SCHEMA_VERSION);
    match found {
        v if v > SCHEMA_VERSION => Err(Error::SchemaTooNew { path, found, supported }),
        v if v < SCHEMA_VERSION && !opts.migrate => Err(Error::SchemaTooOld { path, found, supported }),
        _ => Ok(()),
    }
}

/// The migration proper, inside `BEGIN IMMEDIATE` (another process may have migrated since
/// the first look, so everything is read again); the version the file had (0: none).
fn migrate_locked(conn: &Connection, path: &Path, opts: &SqliteOptions) -> Result<u32> {
    let err = |doing: &str, e| Error::sqlite(path, opts.busy_timeout, doing, e);
    let current = schema_version(conn).map_err(|e| err("reading the schema version", e))?;
    let from = match current {
        // An older build may have made the schema since the first look (a refusal rolls back).
        Some(v) => {
            check_version(path, v, opts)?;
            v
        }
        None => {
            // No durable schema: only an empty database may be initialised, never another
            // program's, and only when the options allow it.
            check_foreign(conn, path, opts)?;
            if !opts.create_if_missing {
                return Err(no_schema(path));
            }
            conn.execute_batch(
                "CREATE TABLE durable_schema (
                    version     INTEGER PRIMARY KEY NOT NULL,
                    description TEXT NOT NULL,
                    applied_at  INTEGER NOT NULL
                ) STRICT;",
            )
            .map_err(|e| err("creating the schema table", e))?;
            0
        }
    };
    let applied_at = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    for m in MIGRATIONS.iter().filter(|m| m.version > from) {
        let doing = format!("migrating the schema to version {}", m.version);
        conn.execute_batch(m.sql).map_err(|e| err(&doing, e))?;
        conn.execute(
            "INSERT INTO durable_schema (version, description, applied_at) VALUES (?1, ?2, ?3)",
            rusqlite::params![m.version, m.description, applied_at],
        )
        .map_err(|e| err(&doing, e))?;
    }
    conn.pragma_update(None, "application_id", APPLICATION_ID).map_err(|e| err("writing the header", e))?;
    Ok(from)
}

/// The SQL of every migration, in order.
#[cfg(test)]
pub(crate) fn migration_sql() -> impl Iterator<Item = &'static str> {
    MIGRATIONS.iter().map(|m| m.sql)
}

/// The schema version recorded in an open connection's file (`None`: no durable schema).
#[cfg(test)]
pub(crate) fn version_of(conn: &Connection) -> Option<u32> {
    schema_version(conn).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_ordered_and_end_at_the_schema_version() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1, "migration versions are 1, 2, … without gaps");
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn every_migration_applies_on_an_empty_database() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE durable_schema (version INTEGER PRIMARY KEY NOT NULL, description TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT;").unwrap();
        for m in MIGRATIONS {
            conn.execute_batch(m.sql).unwrap();
            conn.execute("INSERT INTO durable_schema VALUES (?1, ?2, 0)", rusqlite::params![m.version, m.description])
                .unwrap();
        }
        assert_eq!(version_of(&conn), Some(SCHEMA_VERSION));
    }

    /// How often `sql` was re-prepared over uses from the statement cache, each with other
    /// values bound (a run's history read, then a count of a gate's queue up to a bound).
    fn reprepares(conn: &Connection, sql: &str, args: &[(&str, i64)]) -> i32 {
        for (text, n) in args {
            let mut stmt = conn.prepare_cached(sql).unwrap();
            let mut rows = stmt.query(rusqlite::params![text, n]).unwrap();
            while rows.next().unwrap().is_some() {}
        }
        conn.prepare_cached(sql).unwrap().get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn cached_statements_are_not_planned_again_for_new_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plans.db");
        let store = open_writer(&path, &SqliteOptions::default()).unwrap();
        let history = "SELECT seq FROM checkpoints WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq";
        let ahead = "SELECT COUNT(*) FROM (SELECT 1 FROM admission_waiters WHERE gate = ?1 LIMIT ?2)";
        let args = [("a", 0), ("b", 1), ("c", 7), ("d", 0)];
        // A connection without the stability guarantee re-plans them (this is what it avoids).
        let plain = Connection::open(&path).unwrap();
        assert!(reprepares(&plain, history, &args) > 0 && reprepares(&plain, ahead, &args) > 0);
        // The store's connections do not.
        assert_eq!(reprepares(&store, history, &args), 0);
        assert_eq!(reprepares(&store, ahead, &args), 0);
        let reader = connect(&path, &SqliteOptions::default(), "reader").unwrap();
        assert_eq!(reprepares(&reader, history, &args), 0);
    }
}
