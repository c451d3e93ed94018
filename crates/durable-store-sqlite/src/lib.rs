//! # durable-store-sqlite
//!
//! [`SqliteStore`]: the embedded default [`Store`] of `durable`, on one SQLite file (bundled
//! SQLite, so nothing to install). Runs, checkpoints, waiters, buffered signals, schedules and
//! trigger buffers survive `kill -9`, deploys and power loss; several processes may open the
//! same file.
//!
//! ## What it does
//!
//! - **WAL mode**, `synchronous = FULL` by default ([`Durability::Full`]: an acknowledged write
//!   survives a power loss) or `NORMAL` ([`Durability::Normal`]: it survives a process crash).
//! - **Group commit.** One writer thread per store owns the write connection. When it wakes it
//!   takes every write request waiting, and those that arrive while it applies them (up to
//!   [`SqliteOptions::max_group`] in all), in one `BEGIN IMMEDIATE … COMMIT` transaction, so one
//!   fsync covers them all.
//!   Each request runs in its own `SAVEPOINT`: one that fails (`LeaseLost`, `Conflict`, …) is
//!   rolled back alone. Answers are sent only after the `COMMIT` succeeded; if it fails, every
//!   request of the group gets the error and nothing of the group was written. The hot writes
//!   (`create_run`, `commit`, `commit_and_claim_handed`, `claim_run`, `claim_run_from`, `claim_tasks`,
//!   `complete_task`, `complete_task_and_claim`) run without a savepoint (which costs every
//!   page they touch a copy in a statement journal): they decide every refusal before they
//!   change a row (a keyed start's `QueueFull` too), so a refusal leaves nothing to undo;
//!   one that fails after changing rows (a disk error, a row that does not decode) rolls back
//!   the group's transaction, the writes applied before it in the group get a retryable
//!   `Unavailable` (nothing of them was written) and the rest of the group goes on in a new
//!   transaction.
//! - **Statements planned once.** Every connection keeps its prepared statements in a cache
//!   and plans with SQLite's query planner stability guarantee (`SQLITE_DBCONFIG_ENABLE_QPSG`):
//!   a plan never depends on the values bound to it, so a cached statement is not parsed and
//!   planned again when it is used with other values.
//! - **Reads never wait for the writer.** Reader threads ([`SqliteOptions::readers`]) each own
//!   a connection; WAL lets them read the last committed state while a write is in progress.
//! - **Shared files.** Every transaction that writes starts with `BEGIN IMMEDIATE`, and every
//!   contract rule (lease checks, compare-and-set, waiter take) is checked inside it, so two
//!   processes (or two `SqliteStore`s in one process) on one file stay correct. A write that
//!   waits for another process's lock longer than [`SqliteOptions::busy_timeout`] fails with a
//!   retryable [`StoreError::Unavailable`](durable_core::StoreError::Unavailable).
//! - **Versioned schema.** A `durable_schema` table records the schema version. An empty file
//!   gets the latest schema; an older file is migrated forward in one transaction when opened
//!   (or, with [`SqliteOptions::migrate`]`(false)`, refused as it is: [`Error::SchemaTooOld`]);
//!   a file from a newer build is refused ([`Error::SchemaTooNew`]); a file that is not a
//!   durable database is refused without being written ([`Error::NotADatabase`]). Tools that
//!   must never create a database (an operator's command line) open with
//!   [`SqliteOptions::create_if_missing`]`(false)`: a missing or empty file is refused too.
//! - **Indexed reads.** Every [`RunFilter`] of [`Store::list_runs`] (statuses, workflow,
//!   namespace, tag, parent, created range, and any combination, newest first, with the cursor)
//!   walks an index kept in the listing order (a workflow with statuses: one range of the
//!   workflow-and-status index per status), [`Store::run_counts`] reads that index alone (a
//!   covering index, no sort), and the poller scans ([`Store::pending_runs`],
//!   [`Store::due_runs`], [`Store::orphaned_runs`]) each walk a partial index of their own: a
//!   first page costs about what it returns, not the number of runs in the file. A poller's
//!   claim of due runs ([`Store::claim_due_runs`]) is the due scan inside one `UPDATE … RETURNING`
//!   of the writer, so pollers in other processes never claim the same run. So do the
//!   schedulers' scans ([`Store::due_schedules`], [`Store::due_buffers`]): they read the
//!   schedules and trigger buffers that are due, not all of them.
//! - **Schedules and triggers in the same transactions.** A schedule save is a compare-and-set
//!   on its revision that creates the fired runs in the same write; a publish checks and records
//!   its dedupe id, delivers or buffers the event, creates the trigger runs and updates the
//!   gathering buffers in one write; flushing a due buffer deletes it and creates its run in one.
//!   Expired dedupe ids are forgotten a few at a time by later publishes with a dedupe id.
//! - **Remote steps.** Tasks live in a `tasks` table beside the runs: the commit that records a
//!   remote step's in-flight checkpoint and its wait stores the task in the same transaction
//!   (an outbox); a worker's claim reads the claimable tasks of its queues (priority, then age,
//!   from an index) and marks them claimed in one write, so concurrent workers never share a
//!   task; a result writes the checkpoint, consumes the wait and wakes the run in one write.
//!   Expired and silent tasks are found through indexes on their deadline and last heartbeat.
//!   Worker descriptors live in a `workers` table.
//! - **Flow control.** Admission gates, held slots and queued requests live in three tables
//!   (`admission_gates`, `admission_slots`, `admission_waiters`). A request is decided by
//!   `durable-core`'s pure admission helpers on the gate's row, in the write transaction that
//!   records the outcome, so two processes on one file never admit past a limit. A gate's
//!   queue is kept in rank order by an index: its head, and how many waiters rank before a
//!   request, are index reads, so a release at a gate with thousands waiting costs what it
//!   hands on, not the length of the queue. A gate's row counts its slot rows (`held`, kept
//!   by every write that adds or removes a slot), so no decision counts a gate's slots. Within
//!   one group's transaction the writer keeps a gate's row: read once, its changes written
//!   before the commit (and before a savepoint, so a rollback undoes only what came after):
//!   a keyed start and a keyed settle each change it, and a group holds dozens of them. A settle that hands
//!   a run its concurrency key and claims it (`commit_and_claim_handed`) wakes and claims it in
//!   one `UPDATE`. Releases in a commit, and those of a run that
//!   settles, is cancelled or deleted, hand the slots on (and wake the runs they go to) in
//!   the same transaction; a keyed start refused with `QueueFull` writes nothing.
//! - **Clean close.** Dropping the store checkpoints the WAL into the file and truncates it, so
//!   no `-wal` file of megabytes is left behind (see [`SqliteStore`]).
//! - Errors name the file. Busy or locked → [`StoreError::Unavailable`](durable_core::StoreError::Unavailable) (retryable); read-only,
//!   disk full, corrupt, not a database → [`StoreError::Backend`](durable_core::StoreError::Backend) wrapping an [`Error`].
//!
//! ## What it does not do
//!
//! - It does not need, detect or spawn on an async runtime: its threads are plain OS threads
//!   and answers come back on runtime-agnostic channels. It never sleeps or polls.
//! - It does not work on network file systems (NFS, SMB): SQLite's WAL needs shared memory
//!   between the processes on one machine. Use the PostgreSQL store across machines.
//! - It does not vacuum, back up or prune old runs: that is the operator's (or the engine's
//!   retention policy's) job, through [`Store::delete_run`].
//! - Times are the caller's: a value past `i64::MAX` ms (a "forever" sentinel such as
//!   `u64::MAX`) is stored as `i64::MAX` and read back as `u64::MAX`.
//!
//! ## Example
//!
//! ```
//! use durable_core::{NewRun, Payload, RunId, Store};
//! use durable_store_sqlite::{Durability, SqliteOptions, SqliteStore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?; // any directory: here a temporary one
//! let path = dir.path().join("app.db");
//! let store = SqliteStore::open_with(&path, SqliteOptions::new().durability(Durability::Normal))?;
//! let new = NewRun {
//!     id: RunId::from("order:42"),
//!     workflow: "checkout".into(),
//!     version: 1,
//!     namespace: "default".into(),
//!     input: Payload::encode(&42)?,
//!     tags: vec![],
//!     priority: 0,
//!     parent: None,
//!     created_at: 1_000,
//!     start_at: None,
//!     admission: None,
//!     trace_context: None,
//! };
//! // Any executor works; the store needs no tokio runtime.
//! let created = futures_lite_block_on(store.create_run(new))?;
//! assert!(created.created());
//! drop(store);
//! # Ok(())
//! # }
//! # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     use std::sync::Arc;
//! #     use std::task::{Context, Poll, Wake, Waker};
//! #     struct Unpark(std::thread::Thread);
//! #     impl Wake for Unpark { fn wake(self: Arc<Self>) { self.0.unpark() } }
//! #     let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
//! #     let mut f = std::pin::pin!(f);
//! #     loop {
//! #         if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) { return v; }
//! #         std::thread::park();
//! #     }
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod admission;
mod busy;
mod error;
mod ops;
mod options;
mod queue;
mod schema;
mod tasks;
mod workers;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use durable_core::admission::{Admission, GateStats, SlotRecord, SlotRequest, WaiterRecord};
use durable_core::task::{BeatOutcome, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, WorkerInfo};
use durable_core::{
    BufferedDeliveries, BufferedPurge, BufferedQuery, Capabilities, Checkpoint, Claim, ClaimOutcome, Commit,
    CommitOutcome, CreateRun, Delivery, DueQuery, Millis, NewRun, Payload, Publish, Published, Run, RunCount,
    RunFilter, RunId, RunPage, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule, ScheduleRecord, Store,
    StoreResult, TaskFilter, TriggerBuffer, Waiter,
};

pub use error::{Error, Result};
pub use options::{Durability, SqliteOptions};
pub use schema::SCHEMA_VERSION;
pub use workers::SqliteStats;

use ops::{Ctx, Poll};
use workers::Workers;

/// Not public API: the statements the store runs, for the tests that read their query plans
/// (`tests/sqlite_plans.rs`). May change in any release.
#[doc(hidden)]
pub mod __private {
    use durable_core::{DueQuery, RunFilter, RunQuery, StoreError};
    pub use rusqlite::types::Value;

    pub use crate::ops::{Due, Poll};

    /// The statement `run_counts()` runs.
    pub const RUN_COUNTS_SQL: &str = crate::ops::RUN_COUNTS_SQL;

    /// The statement `list_runs(filter)` runs and its arguments (`?N` placeholders).
    pub fn list_runs_sql(filter: &RunFilter) -> Result<(String, Vec<Value>), StoreError> {
        match crate::ops::list_runs_sql(filter) {
            Ok((q, _)) => Ok((q.text, q.args)),
            Err(crate::ops::OpError::Store(e)) => Err(e),
            Err(e) => Err(StoreError::backend(format!("{e:?}"))),
        }
    }

    /// The statement of `pending_runs`, `due_runs` or `orphaned_runs` and its arguments; `None`
    /// when the query matches nothing (the store then asks nothing).
    pub fn poll_sql(which: Poll, query: &RunQuery) -> Option<(String, Vec<Value>)> {
        crate::ops::poll_sql(which, query).map(|q| (q.text, q.args))
    }

    /// The statement of `claim_due_runs` and its arguments; `None` when the query matches
    /// nothing.
    pub fn claim_due_sql(query: &RunQuery, until: durable_core::Millis) -> Option<(String, Vec<Value>)> {
        crate::ops::claim_due_sql(query, until).map(|q| (q.text, q.args))
    }

    /// The statement of `due_schedules` or `due_buffers` and its arguments; `None` when the
    /// query matches nothing.
    pub fn due_sql(which: Due, query: &DueQuery) -> Option<(String, Vec<Value>)> {
        crate::ops::due_sql(which, query).map(|q| (q.text, q.args))
    }

    /// The statement of `claim_tasks` and its arguments; `None` when the claim matches nothing.
    pub fn claim_tasks_sql(claim: &durable_core::task::TaskClaim) -> Option<(String, Vec<Value>)> {
        crate::tasks::claim_sql(claim).map(|q| (q.text, q.args))
    }

    /// The statement of `list_tasks` and its arguments.
    pub fn list_tasks_sql(filter: &durable_core::TaskFilter) -> (String, Vec<Value>) {
        let q = crate::tasks::list_tasks_sql(filter);
        (q.text, q.args)
    }

    /// The admission statements whose plans must use an index: `(name, table, sql, args, what
    /// the plan must search by)`.
    #[allow(clippy::type_complexity)]
    pub fn admission_sql() -> Vec<(&'static str, &'static str, &'static str, Vec<Value>, &'static str)> {
        crate::admission::plan_statements()
    }

    /// The statement of `list_schedules` and its arguments; `None` for a limit of 0.
    pub fn list_schedules_sql(
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Option<(String, Vec<Value>)> {
        crate::ops::list_schedules_sql(namespace, after, limit).map(|q| (q.text, q.args))
    }
}

/// The SQLite [`Store`]: one database file, one writer thread with group commit, a few reader
/// threads. See the [crate docs](crate) for what it guarantees.
///
/// Open it once per process and share it (`Arc<SqliteStore>` or `Arc<dyn Store>`).
///
/// **Closing.** Dropping it finishes the writes already queued, then checkpoints the WAL into
/// the database file and truncates it to 0 bytes (`PRAGMA wal_checkpoint(TRUNCATE)` on the
/// writer connection, after the readers closed), then closes the file; if no other connection
/// has it open, the `-wal` file is removed too. Either way the file alone holds everything and
/// no multi-megabyte `-wal` is left beside it. If another connection (another store, another
/// process) is still reading older data from the WAL or writing, the checkpoint waits for it
/// for at most the busy timeout capped at one second, then gives up and leaves the WAL as it is
/// (nothing is lost: the WAL is part of the database until the next checkpoint copies it).
/// Dropping blocks the dropping thread for that long at most, plus the queued writes. A store
/// that wrote nothing (one that only read, as the command line's `runs list`) skips the
/// checkpoint: the WAL is the writers' to fold, and SQLite folds it when the last connection
/// to the file closes.
pub struct SqliteStore {
    path: PathBuf,
    options: SqliteOptions,
    workers: Workers,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.path).field("options", &self.options).finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the database at `path` with the default [`SqliteOptions`].
    ///
    /// See [`SqliteStore::open_with`].
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens (or creates) the database at `path`.
    ///
    /// A missing or empty file, or an SQLite database without tables, gets the latest schema
    /// (unless [`SqliteOptions::create_if_missing`] is `false`: then it is refused and nothing
    /// is created); a file with an older schema is migrated forward (in one transaction: a
    /// failed migration leaves the file as it was), unless [`SqliteOptions::migrate`] is
    /// `false`.
    ///
    /// # Errors
    /// - [`Error::NotADatabase`]: the file is not SQLite, or is another program's database; or,
    ///   with `create_if_missing(false)`, it is missing, empty, or has no durable schema.
    /// - [`Error::SchemaTooNew`]: the file was written by a newer build; upgrade to open it.
    /// - [`Error::SchemaTooOld`]: with `migrate(false)`, the file was written by an older build.
    /// - [`Error::Busy`]: another connection held the write lock past the busy timeout while
    ///   this one had to create or migrate the schema.
    /// - [`Error::Sqlite`]: the directory or the file is read-only, the disk is full, …
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        let writer = schema::open_writer(&path, &options)?;
        let mut readers = Vec::with_capacity(options.readers);
        for _ in 0..options.readers {
            let conn = schema::connect(&path, &options, "reader")?;
            conn.pragma_update(None, "query_only", true)
                .map_err(|e| Error::sqlite(&path, options.busy_timeout, "configuring a reader connection", e))?;
            readers.push(conn);
        }
        let ctx = Arc::new(Ctx { path: path.clone(), busy_timeout: options.busy_timeout });
        let workers = Workers::start(ctx, writer, readers, options.max_group)?;
        Ok(SqliteStore { path, options, workers })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// The writer's counters: transactions committed, writes answered, writes queued. With
    /// group commit, `transactions` grows much slower than `writes` under concurrent load.
    pub fn stats(&self) -> SqliteStats {
        self.workers.stats()
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL.with_claimed_dispatch(true)
    }

    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
        // Without a savepoint: a start decides its refusals (an existing id, a full queue)
        // before it writes a row.
        self.workers.write_hot("create_run", move |c| admission::create_run(c, run)).await
    }

    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        // One write: one savepoint of the writer's group transaction, all of it or none (a start
        // refused by its concurrency key undoes the whole batch).
        self.workers
            .write("create_runs", move |c| runs.into_iter().map(|run| admission::create_run(c, run)).collect())
            .await
    }

    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        let id = id.clone();
        self.workers.read("get_run", move |c| ops::get_run(c, &id)).await
    }

    async fn get_runs(&self, ids: &[RunId]) -> StoreResult<Vec<Run>> {
        let ids = ids.to_vec();
        self.workers
            .read("get_runs", move |c| {
                let mut runs = Vec::with_capacity(ids.len());
                for id in &ids {
                    runs.extend(ops::get_run(c, id)?);
                }
                Ok(runs)
            })
            .await
    }

    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
        let filter = filter.clone();
        self.workers.read("list_runs", move |c| ops::list_runs(c, &filter)).await
    }

    async fn run_counts(&self) -> StoreResult<Vec<RunCount>> {
        self.workers.read("run_counts", ops::run_counts).await
    }

    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
        let id = id.clone();
        self.workers.read("history", move |c| ops::history(c, &id)).await
    }

    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
        self.workers.write_hot("claim_run", move |c| ops::claim_run(c, claim)).await
    }

    /// One write, like `claim_run`, that reads the checkpoints from `from_seq` on only.
    async fn claim_run_from(&self, claim: Claim, from_seq: u32) -> StoreResult<ClaimOutcome> {
        self.workers.write_hot("claim_run", move |c| ops::claim_run_from(c, claim, from_seq)).await
    }

    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
        let (id, owner) = (id.clone(), owner.to_string());
        self.workers.write("renew_lease", move |c| ops::renew_lease(c, &id, &owner, lease_until)).await
    }

    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
        let (id, owner) = (id.clone(), owner.to_string());
        self.workers.write("release_lease", move |c| ops::release_lease(c, &id, &owner)).await
    }

    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        self.workers.write_hot("commit", move |c| ops::commit(c, commit)).await
    }

    /// One write: the commit, the hand-offs and the claim of the first run handed a slot, in
    /// one transaction.
    async fn commit_and_claim_handed(
        &self,
        commit: Commit,
        lease_until: Millis,
    ) -> StoreResult<(CommitOutcome, Option<ClaimOutcome>)> {
        self.workers
            .write_hot("commit_and_claim_handed", move |c| ops::commit_and_claim_handed(c, commit, lease_until))
            .await
    }

    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
        let (id, expected) = (id.clone(), expected.to_vec());
        self.workers.write("update_run_if", move |c| ops::update_run_if(c, &id, &expected, patch)).await
    }

    async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        let query = query.clone();
        self.workers.read("pending_runs", move |c| ops::poll_runs(c, Poll::Pending, &query)).await
    }

    async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        let query = query.clone();
        self.workers.read("due_runs", move |c| ops::poll_runs(c, Poll::Due, &query)).await
    }

    /// A write of the writer (one `UPDATE … WHERE id IN (the due scan) RETURNING id`), grouped
    /// with the writes waiting at that moment.
    async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
        if ops::poll_sql(Poll::Due, query).is_none() {
            return Ok(Vec::new());
        }
        let query = query.clone();
        self.workers.write("claim_due_runs", move |c| ops::claim_due_runs(c, &query, until)).await
    }

    async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        let query = query.clone();
        self.workers.read("orphaned_runs", move |c| ops::poll_runs(c, Poll::Orphaned, &query)).await
    }

    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
        let token = token.to_string();
        self.workers.write("send_signal", move |c| ops::send_signal(c, &token, payload.as_str(), now)).await
    }

    /// One write: the delivery, and the claim of the run it woke if that is `claim.run_id`.
    async fn send_signal_and_claim(
        &self,
        token: &str,
        payload: Payload,
        claim: Claim,
        from_seq: u32,
    ) -> StoreResult<(Delivery, Option<ClaimOutcome>)> {
        let token = token.to_string();
        self.workers
            .write("send_signal_and_claim", move |c| {
                ops::send_signal_and_claim(c, &token, payload.as_str(), claim, from_seq)
            })
            .await
    }

    async fn publish(&self, event: Publish) -> StoreResult<Published> {
        self.workers.write("publish", move |c| ops::publish(c, event)).await
    }

    async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
        let query = query.clone();
        self.workers.read("due_buffers", move |c| ops::due_buffers(c, &query)).await
    }

    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<SlotRequest>,
    ) -> StoreResult<Option<CreateRun>> {
        let (workflow, key, batch_id) = (workflow.to_string(), key.to_string(), batch_id.to_string());
        self.workers
            .write("flush_buffer", move |c| ops::flush_buffer(c, &workflow, &key, &batch_id, now, admission))
            .await
    }

    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
        let key = key.to_string();
        self.workers.read("get_schedule", move |c| ops::get_schedule(c, &key)).await
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>> {
        let (namespace, after) = (namespace.map(str::to_string), after.map(str::to_string));
        self.workers
            .read("list_schedules", move |c| ops::list_schedules(c, namespace.as_deref(), after.as_deref(), limit))
            .await
    }

    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
        self.workers.write("save_schedule", move |c| ops::save_schedule(c, save)).await
    }

    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        if saves.is_empty() {
            return Ok(Vec::new());
        }
        // One write: each save checks its own revision, so a stale one writes nothing and the
        // others apply; an SQL failure rolls back the whole call.
        self.workers
            .write("save_schedules", move |c| saves.into_iter().map(|save| ops::save_schedule(c, save)).collect())
            .await
    }

    async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
        let key = key.to_string();
        self.workers.write("delete_schedule", move |c| ops::delete_schedule(c, &key)).await
    }

    async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
        let query = query.clone();
        self.workers.read("due_schedules", move |c| ops::due_schedules(c, &query)).await
    }

    async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        if claim.queues.is_empty() || claim.limit == 0 {
            return Ok(Vec::new());
        }
        let claim = claim.clone();
        // One write: the claimable rows are read and marked claimed in the same transaction.
        self.workers.write_hot("claim_tasks", move |c| tasks::claim_tasks(c, &claim)).await
    }

    async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        let beat = beat.clone();
        self.workers.write("heartbeat_task", move |c| tasks::heartbeat_task(c, &beat)).await
    }

    async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
        self.workers.write_hot("complete_task", move |c| tasks::complete_task(c, done)).await
    }

    /// One write: the result, the wake and the claim of the woken run in one transaction.
    async fn complete_task_and_claim(
        &self,
        done: TaskDone,
        claim: Claim,
    ) -> StoreResult<(TaskCompletion, Option<ClaimOutcome>)> {
        done.check_claim(&claim)?;
        self.workers
            .write_hot("complete_task_and_claim", move |c| {
                let completion = tasks::complete_task(c, done)?;
                let claimed = match completion {
                    TaskCompletion::Accepted => Some(ops::claim_run(c, claim)?),
                    _ => None,
                };
                Ok((completion, claimed))
            })
            .await
    }

    async fn release_tasks(&self, released: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        if released.is_empty() {
            return Ok(());
        }
        let (released, worker) = (released.to_vec(), worker.to_string());
        self.workers.write("release_tasks", move |c| tasks::release_tasks(c, &released, &worker)).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<Task>> {
        let filter = filter.clone();
        self.workers.read("list_tasks", move |c| tasks::list_tasks(c, &filter)).await
    }

    async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.workers.read("queue_stats", tasks::queue_stats).await
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
        let worker = worker.clone();
        self.workers.write("register_worker", move |c| tasks::register_worker(c, &worker)).await
    }

    async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_string();
        self.workers.write("remove_worker", move |c| tasks::remove_worker(c, &id)).await
    }

    async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        self.workers.write("workers", move |c| tasks::workers(c, heartbeat_before)).await
    }

    async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
        let request = request.clone();
        self.workers.write("acquire_slot", move |c| admission::acquire_slot(c, &request)).await
    }

    async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        let (gate, holder) = (gate.to_string(), holder.to_string());
        self.workers.write("release_slot", move |c| admission::release_slot(c, &gate, &holder, now)).await
    }

    async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        self.workers.read("admission_stats", move |c| admission::stats(c, now)).await
    }

    async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        let id = id.clone();
        self.workers.read("run_admission", move |c| admission::run_admission(c, &id)).await
    }

    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
        let id = id.clone();
        self.workers.read("waiters", move |c| ops::waiters(c, &id)).await
    }

    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
        let (id, key) = (id.clone(), key.to_string());
        self.workers.read("get_state", move |c| ops::get_state(c, &id, &key)).await
    }

    async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
        let query = query.clone();
        self.workers.read("buffered", move |c| ops::buffered(c, &query)).await
    }

    async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
        let purge = purge.clone();
        self.workers.write("purge_buffered", move |c| ops::purge_buffered(c, &purge)).await
    }

    async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
        let id = id.clone();
        self.workers.write("delete_run", move |c| ops::delete_run(c, &id)).await
    }
}
