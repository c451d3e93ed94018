//! # durable-store-postgres
//!
//! [`PostgresStore`]: the [`Store`] of `durable` on PostgreSQL, for when many engines on many
//! machines share the runs. Everything lives in one schema of your database (default `durable`),
//! created and migrated on connect.
//!
//! ## What it does
//!
//! - **One round trip per write, batched.** Every write (a step commit, a suspension, a claim, a
//!   signal, …) is one call of a server-side PL/pgSQL function taking the whole operation as
//!   JSON, so its rules are checked and its rows written in one statement. A writer task folds
//!   every write waiting at that moment (up to [`PostgresOptions::max_batch`]) into one
//!   transaction, and pipelines `BEGIN`, the batch and `COMMIT` on one connection: one network
//!   round trip and one WAL flush for the whole batch, answered only after `COMMIT` succeeded.
//!   One batch is in flight at a time, or up to [`PostgresOptions::write_connections`]. A bulk
//!   create ([`Store::create_runs`]) is one group of operations the writer never splits: one
//!   transaction, one round trip. [`PostgresStore::stats`] counts them. Reads are one query each, on the pool.
//! - **One lock order per batch.** Before its first operation runs, a batch takes every advisory
//!   lock its operations will take (signal tokens, event names, the waits of the runs it commits),
//!   in ascending key order, then the rows of the admission gates it touches (keyed children
//!   and starts, step-queue slots, the gates of runs that settle) in gate order, and, when it
//!   wakes two or more runs (signals, events, task results, children finishing), their rows in
//!   id order; a commit with keyed children does the same on its own (schema version 18).
//!   Batches in flight together therefore do not deadlock on each other (a fan-out's children
//!   waking their parents in two concurrent batches did, and so did two parents starting keyed
//!   children at the same keys in opposite orders; each deadlock cost `deadlock_timeout`). A
//!   batch that wakes no other run (step commits, claims) locks nothing early: it reads the
//!   waiters of its runs, as each commit does.
//! - **A step's commit is two statements.** A commit that makes one checkpoint and nothing else
//!   (no turn end, waits, state, children, signals, tasks or released slots) is sent as its own
//!   operation (`step_commit`, schema version 15): the lease-check `UPDATE`, then the
//!   checkpoint's upsert, with no advisory key (it touches no waiter or token), so its batch
//!   names no run to probe. It costs the server about half of a general commit (`chain` on three
//!   worker processes: about 5,800 steps/s before, 7,200 after).
//! - **Every contract rule is enforced in SQL**, inside the transaction that writes: the
//!   compare-and-set of [`Store::update_run_if`] and the lease predicate of a claim are in the
//!   `WHERE` of their `UPDATE` (under the row lock the same function took), the lease check is
//!   the first statement of a commit, waiters are taken with `DELETE … RETURNING`, and senders
//!   and waiters of one signal token (or event name) are serialised by a transaction-scoped
//!   advisory lock, so a signal is never buffered while a wait for it registers. Several
//!   engines (several `PostgresStore`s) on one schema stay correct.
//! - **Byte-exact payloads**: JSON payloads are stored as `text`, never `jsonb` (which
//!   reformats). Ids sort by bytes (`COLLATE "C"`), like Rust strings. Event matchers are
//!   evaluated on the server with `durable_core::json_subset`'s rules (serde_json equality).
//! - **Indexed reads.** Every [`RunFilter`] of [`Store::list_runs`]
//!   (statuses, workflow, namespace, tag, parent, created range, any combination, newest first,
//!   with the cursor) can be served by an index: settled runs by status, active runs (the
//!   working set) in one partial index, workflow, namespace and parent each in the listing order,
//!   a workflow with statuses by both (one arm per status, merged in order), tags in a GIN
//!   index. [`Store::run_counts`] reads the workflow-and-status index alone once vacuum has
//!   marked the table all-visible. The poller scans ([`Store::pending_runs`], [`Store::due_runs`],
//!   [`Store::orphaned_runs`]) walk partial indexes that no listing index can stand in for, so the
//!   planner keeps them even when its statistics lag a burst of runs. A poller's claim of due
//!   runs ([`Store::claim_due_runs`]) is the due scan locking what it picks `FOR UPDATE SKIP
//!   LOCKED` and one `UPDATE` of those rows in the same statement: concurrent pollers never
//!   wait for each other and never claim the same run. No index names
//!   `updated_at`: a step commit, which changes only that and the recovery count, is a HOT update
//!   that writes no index entry when the row's page has room (the table's fill factor is 90).
//! - **Schedules, event triggers and delayed starts, in the same writes.** A schedule save
//!   ([`Store::save_schedule`]) is a compare-and-set on the stored revision — the `WHERE` of its
//!   `UPDATE`, or the primary key of a create's `INSERT` — with the runs it fires created in the
//!   same transaction, so of concurrent schedulers exactly one fires; [`Store::save_schedules`]
//!   is one group (one transaction, one round trip), each save applied on its own. A publish
//!   ([`Store::publish`]) is one write too: its dedupe id is an `INSERT … ON CONFLICT` under the
//!   event name's advisory lock (concurrent duplicates: one publishes), then the deliveries, the
//!   trigger runs, and the debounce and batch buffers, gathered on the server by
//!   [`TriggerBuffer::gather`]'s rules (a test runs both side by side) with one row per
//!   gathered payload. A run created with a `start_at` is `pending` with that `wake_at`: the
//!   pending scan skips it, the due scan finds it. Due schedules, due buffers, pending runs and
//!   due runs each walk an index of their own, from the earliest due.
//! - **Versioned schema.** A `schema_version` table records the version. Connecting creates the
//!   schema or migrates it forward, in one transaction holding an advisory lock (concurrent
//!   engines do not race), unless told not to ([`PostgresOptions::migrate`]`(false)`: an older
//!   schema is refused as it is, [`Error::SchemaTooOld`]); a schema written by a newer build is refused
//!   ([`Error::SchemaTooNew`]); a schema holding someone else's tables is refused
//!   ([`Error::ForeignSchema`]).
//! - **Network faults are retryable.** A dropped connection, a server restarting or refusing
//!   connections, a deadlock, a statement timeout, an exhausted pool: the call fails with
//!   [`StoreError::Unavailable`] `{ retryable: true }`
//!   and the pool replaces broken connections, so later calls succeed. (A write whose
//!   connection dropped mid-flight may or may not have committed, as with any database: the
//!   engine treats it as unknown and retries idempotently.)
//! - **Clear errors** for bad configuration: a malformed URL, a refused connection, a missing
//!   database, a rejected login, a newer schema — each one line naming
//!   `user@host:port/database` (never the password).
//! - Optionally, `NOTIFY` on run creation and wake-up ([`PostgresOptions::notify_channel`]),
//!   received with [`PostgresStore::listen`].
//! - **The run queue** of the store-backed transport ([`RunQueue`](durable_core::RunQueue), for
//!   `durable_transport::QueueTransport`): a `run_queue` table with at most one unclaimed item
//!   per run, claimed with `FOR UPDATE SKIP LOCKED` in one statement, enqueued, acked and
//!   released in batches by a writer of its own. With a notify channel every enqueue
//!   `NOTIFY`s, and [`PostgresStore::queue_wakeups`] turns that into wake-ups for the
//!   transport: an idle worker takes a new run within milliseconds, not at its next poll.
//! - **Remote steps** ([`durable_core::task`]): a `tasks` table keyed by `(run, seq)`, written
//!   by the commit that records the step's in-flight checkpoint and registers its wait (an
//!   outbox: no task without its wait, no wait without its task). Workers claim with one
//!   `FOR UPDATE SKIP LOCKED` statement (each task to exactly one of any number of concurrent
//!   claimers, by priority then age, filtered by queue, namespace and capabilities), heartbeat
//!   and release in transactions of their own that lock task rows only. A result
//!   ([`Store::complete_task`]) is a write of the writer like a signal: under the wait token's
//!   advisory lock and the run row's lock it consumes the wait, writes the checkpoint and wakes
//!   the run as a delivery does; a run's settle finishes its tasks, and a result for a settled
//!   run is `RunTerminal` and never revives it. Sent with a claim
//!   ([`Store::complete_task_and_claim`], schema version 16), an accepted result also claims
//!   the run in the `UPDATE` that wakes it: one write of the run row. Likewise a signal sent
//!   with a claim ([`Store::send_signal_and_claim`], schema version 23: an engine signalling a
//!   run whose suspended turn it keeps) claims the run it wakes in the same transaction. A
//!   `blocked` run is parked like a `suspended` one in every wake path. With a notify channel,
//!   dispatches and releases `NOTIFY`, and [`PostgresStore::task_wakeups`] wakes an idle worker
//!   at once. The claim, the expiry and silence scans and the listings walk indexes of open
//!   tasks only (`tests/pg_plans.rs`).
//! - **A control plane** ([`PostgresStore::control_plane`], a [`PostgresControlPlane`]): engine
//!   events, cancels and "work was queued" nudges between every engine and worker on the schema,
//!   over `LISTEN/NOTIFY` on the schema's own channel (`<schema>:control`); a batch of messages
//!   is one statement, a listener one dedicated connection per store.
//! - **Flow control** ([`durable_core::admission`]): gates, held slots and queued requests in
//!   `admission_gates`, `admission_slots` and `admission_waiters`, kept by the rules of
//!   [`AdmissionBook`](durable_core::admission::AdmissionBook) in PL/pgSQL (`tests/pg_admission.rs`
//!   runs both side by side). [`Store::acquire_slot`] and [`Store::release_slot`] are writes of the
//!   writer that lock the gate's row first (creating it if new), so acquirers and releasers of one
//!   gate in any process take turns and a limit is never exceeded; a call touching several gates
//!   locks them in gate order, and before any run row. A commit's `release_slots`, an applied
//!   settle, a cancel through [`Store::update_run_if`] and a [`Store::delete_run`] release in
//!   their own transaction and hand the freed slots to the next waiters at once, waking their runs
//!   (as a delivery does, with `NOTIFY`). A keyed start ([`NewRun::admission`]) is decided in the
//!   create; a keyed bulk start is all or nothing (a subtransaction). The queue's head, the count
//!   of waiters ranked ahead and a fairness key's round are index reads (`tests/pg_plans.rs`).
//! - **Claims never wait for a run another transaction is writing** (its lease holder
//!   committing, a delivery waking it): [`Store::claim_run`] answers `Busy` with the run as last
//!   committed and the engine looks again. Engines sharing a run queue often claim runs that
//!   another engine's batch is writing; waiting there made whole batches deadlock.
//! - **Claims are counted** (`runs.claims`, schema version 14): each claim that acquires a run
//!   increments [`Run::claims`](durable_core::Run::claims) in the claim's own write, and nothing
//!   else does, so an engine that kept a suspended run's turn in memory can tell that nobody else
//!   ran the run since and continue the parked body instead of replaying (warm runs).
//!   [`Store::claim_run_from`] is that claim reading the checkpoints from a seq on only (one range
//!   of the `(run_id, seq)` primary key).
//!
//! ## What it does not do
//!
//! - **TLS only as the URL's `sslmode` asks** ([`PostgresStore::connect`]): `require`
//!   (encrypted, the certificate not checked), `verify-ca` (against the CAs of
//!   `sslrootcert=<PEM file>`), `verify-full` (that file's CAs or the system's, and the host
//!   name), on rustls with `ring`. No `sslmode`,
//!   `disable` and `prefer` stay plain. No client certificates: for those, or another TLS
//!   stack, build a `deadpool_postgres::Pool` with your connector and pass it to
//!   [`PostgresStore::from_pool`].
//! - It needs a **tokio runtime**: the driver, the pool and the writer are tokio tasks, spawned
//!   on the runtime that connected the store. It never polls; the only timer is the backoff of
//!   the queue listener's reconnections.
//! - It does not retry a failed call for you (the engine decides), vacuum, back up or prune old
//!   runs. It does not wire `NOTIFY` into the engine's dispatch itself: it hands a `Notify` to
//!   the transport ([`PostgresStore::queue_wakeups`]) and to workers
//!   ([`PostgresStore::task_wakeups`]), which decide when to look. A task whose lease expires
//!   is claimable again without a notification (nothing is written at that moment).
//! - Ids, names and payloads cannot contain NUL characters (PostgreSQL `text` cannot).
//! - Times are the caller's: a value past `i64::MAX` ms (a "forever" sentinel such as
//!   `u64::MAX`) is stored as `i64::MAX` and read back as `u64::MAX`.
//!   [`protocol::GATED`](durable_core::protocol::GATED) (`i64::MAX - 1`, the `wake_at` of a run
//!   waiting for its concurrency key) round-trips as it is.
//! - Do not rename the schema once created: the server-side functions name it.
//!
//! ## Example
//!
//! ```no_run
//! use durable_core::{NewRun, Payload, RunId, Store};
//! use durable_store_postgres::{PostgresOptions, PostgresStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect_with(
//!     "postgres://postgres@127.0.0.1:5432/test",
//!     PostgresOptions::new().schema("durable").pool_size(16),
//! )
//! .await?;
//! let created = store
//!     .create_run(NewRun {
//!         id: RunId::from("order:42"),
//!         workflow: "checkout".into(),
//!         version: 1,
//!         namespace: "default".into(),
//!         input: Payload::encode(&42)?,
//!         tags: vec![],
//!         priority: 0,
//!         parent: None,
//!         created_at: 1_000,
//!         start_at: None,
//!         admission: None,
//!         trace_context: None,
//!     })
//!     .await?;
//! assert!(created.created());
//! println!("{} round trips so far", store.stats().round_trips());
//! # Ok(())
//! # }
//! ```
//!
//! ## Several workers on one database
//!
//! Engines in any number of processes and machines share the runs of one schema: the run queue
//! hands each start and wake to one of them, and `LISTEN/NOTIFY` wakes an idle one at once. A
//! worker process uses this store through the `durable` facade (feature `postgres`), with
//! `QueueTransport` and [`PostgresStore::queue_wakeups`]: the README's "Several workers on one
//! database" shows one, and it is the `durable` crate's example `postgres_worker`.
//!
//! ## Testing on PostgreSQL
//!
//! With the `test-support` feature (a dev-dependency:
//! `durable-store-postgres = { version = "…", features = ["test-support"] }`), the
//! `test_support` module gives tests the server named by `DURABLE_PG_URL` — or one line saying
//! the test was skipped and how to run it, so `cargo test` passes without a server — and a scratch
//! schema per test, dropped when the test ends. Every PostgreSQL test of this workspace uses it.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod admission;
mod control;
mod error;
mod listener;
mod ops;
mod options;
mod queue;
mod schema;
mod tasks;
#[cfg(feature = "test-support")]
pub mod test_support;
mod tls;
mod writer;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use durable_core::admission::{Admission, GateStats, SlotRecord, SlotRequest, WaiterRecord};
use durable_core::task::{BeatOutcome, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, WorkerInfo};
use durable_core::{
    BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Capabilities, Checkpoint, Claim, ClaimOutcome,
    Commit, CommitOutcome, CreateRun, Delivery, DueQuery, Millis, NewRun, Payload, Publish, Published, Run, RunCount,
    RunFilter, RunId, RunPage, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule, ScheduleRecord, Store,
    StoreError, StoreResult, TaskFilter, TriggerBuffer, Waiter, encode_cursor,
};
use tokio::sync::mpsc;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{NoTls, Row};

/// The connection pool crate (and, through it, `tokio_postgres`), re-exported so that pools for
/// [`PostgresStore::from_pool`] are built with the versions this crate uses.
pub use deadpool_postgres;

/// Not public API: the statements the store runs, for the tests that read their query plans
/// (`tests/pg_plans.rs`). May change in any release.
#[doc(hidden)]
pub mod __private {
    use durable_core::{DueQuery, RunFilter, RunQuery, StoreError};
    use tokio_postgres::types::{ToSql, Type};

    use crate::PostgresStore;
    pub use crate::ops::Poll;

    /// A statement and its parameters with their types (for `query_typed`).
    pub type Statement = (String, Vec<(Box<dyn ToSql + Sync + Send>, Type)>);

    /// The statement `store.list_runs(filter)` runs.
    pub fn list_runs_sql(store: &PostgresStore, filter: &RunFilter) -> Result<Statement, StoreError> {
        let (q, _) = crate::ops::list_runs_query(&store.inner.sql.schema, filter)?;
        Ok((q.sql, q.params))
    }

    /// The statement of `pending_runs`, `due_runs` or `orphaned_runs`.
    pub fn poll_sql(store: &PostgresStore, which: Poll, query: &RunQuery) -> Statement {
        let q = crate::ops::poll_query(&store.inner.sql.schema, which, query);
        (q.sql, q.params)
    }

    /// The statement of `claim_due_runs`.
    pub fn claim_due_sql(store: &PostgresStore, query: &RunQuery, until: durable_core::Millis) -> Statement {
        let q = crate::ops::claim_due_query(&store.inner.sql.schema, query, until);
        (q.sql, q.params)
    }

    /// The statement of `due_schedules`.
    pub fn due_schedules_sql(store: &PostgresStore, query: &DueQuery) -> Statement {
        let q = crate::ops::due_schedules_query(&store.inner.sql.schema, query);
        (q.sql, q.params)
    }

    /// The statement of `due_buffers`.
    pub fn due_buffers_sql(store: &PostgresStore, query: &DueQuery) -> Statement {
        let q = crate::ops::due_buffers_query(&store.inner.sql.schema, query);
        (q.sql, q.params)
    }

    /// The statement of `list_tasks`.
    pub fn list_tasks_sql(store: &PostgresStore, filter: &durable_core::TaskFilter) -> Statement {
        let q = crate::ops::list_tasks_query(&store.inner.sql.schema, filter);
        (q.sql, q.params)
    }

    /// The statement of `claim_tasks`.
    pub fn claim_tasks_sql(store: &PostgresStore, claim: &durable_core::task::TaskClaim) -> Statement {
        let mut params: Vec<(Box<dyn ToSql + Sync + Send>, Type)> = vec![
            (Box::new(crate::ops::millis_to_sql(claim.now)), Type::INT8),
            (Box::new(i64::try_from(claim.limit).unwrap_or(i64::MAX)), Type::INT8),
            (Box::new(claim.worker.clone()), Type::TEXT),
            (Box::new(claim.queues.clone()), Type::TEXT_ARRAY),
            (Box::new(claim.capabilities.clone()), Type::TEXT_ARRAY),
        ];
        if let Some(ns) = &claim.namespace {
            params.push((Box::new(ns.clone()), Type::TEXT));
        }
        (crate::tasks::claim_sql(&store.inner.sql.schema, claim.namespace.is_some()), params)
    }

    /// The statement of `queue_stats`.
    pub fn queue_stats_sql(store: &PostgresStore) -> Statement {
        (crate::ops::queue_stats_sql(&store.inner.sql.schema), Vec::new())
    }

    /// The statement `run_counts()` runs.
    pub fn run_counts_sql(store: &PostgresStore) -> Statement {
        (crate::ops::run_counts_sql(&store.inner.sql.schema), Vec::new())
    }

    /// The statements of the admission helpers (`sql/v8.sql`, `sql/v18.sql`) with these
    /// parameters: the queue head of `gate`, the waiters ranked before `rank` (up to 64), the
    /// requests waiting (up to 100), the round of fairness key `key`, the
    /// slots that count at `now`, the gates a release of `run` at `now` looks at; then the stats
    /// and the run's records. Named for the messages.
    pub fn admission_sql(
        store: &PostgresStore,
        gate: &str,
        rank: durable_core::admission::Rank,
        key: &str,
        run: &str,
        now: u64,
    ) -> Vec<(&'static str, Statement)> {
        use crate::admission::{AHEAD, GATES_OF, KEY_ROUND, LIVE, QUEUE_HEAD, WAITING};
        let s = &store.inner.sql.schema;
        let text = |v: &str| (Box::new(v.to_string()) as Box<dyn ToSql + Sync + Send>, Type::TEXT);
        let int = |v: i64| (Box::new(v) as Box<dyn ToSql + Sync + Send>, Type::INT8);
        let now = crate::ops::millis_to_sql(now);
        vec![
            ("queue head", (QUEUE_HEAD.render(s), vec![text(gate)])),
            (
                "waiters ahead",
                (AHEAD.render(s), vec![text(gate), int(rank.priority), int(rank.round), int(rank.ticket), int(64)]),
            ),
            ("waiting", (WAITING.render(s), vec![text(gate), int(100)])),
            ("key round", (KEY_ROUND.render(s), vec![text(gate), text(key)])),
            ("live slots", (LIVE.render(s), vec![text(gate), int(now)])),
            ("gates of a run", (GATES_OF.render(s), vec![text(run)])),
            ("admission stats", (store.inner.admission_sql.stats.clone(), vec![int(now)])),
            ("run admission", (store.inner.admission_sql.run_admission.clone(), vec![text(run)])),
        ]
    }

    /// The statement of `list_schedules`.
    pub fn list_schedules_sql(
        store: &PostgresStore,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Statement {
        let q = crate::ops::list_schedules_query(&store.inner.sql.schema, namespace, after, limit);
        (q.sql, q.params)
    }
}
pub use control::{MAX_CONTROL_MESSAGE, PostgresControlPlane};
pub use error::{Error, Result};
pub use options::PostgresOptions;
pub use schema::SCHEMA_VERSION;
pub use writer::PostgresStats;

use ops::{Answer, BatchLocks, Op, Poll};
use options::quote_ident;
use writer::{Counters, Shared, Writer};

/// The PostgreSQL [`Store`]: a connection pool, a writer task with group commit, and one schema
/// of tables and server-side functions. See the [crate docs](crate) for what it guarantees.
///
/// Connect it once per process and share it (it is cheap to clone: clones share the pool and the
/// writer). Dropping the last clone lets the writer finish the writes already queued; the pool's
/// connections close with it.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    writer: Writer,
    /// The run queue's writes (enqueue, ack, release), batched apart from everything else so a
    /// queue transaction never holds a run row or a signal lock (see `sql/v2.sql`).
    queue_writer: Writer,
    options: PostgresOptions,
    /// How to connect, when the store was connected from a URL (for `listen`).
    config: Option<tls::Dial>,
    sql: Statements,
    queue_sql: queue::QueueStatements,
    task_sql: tasks::TaskStatements,
    admission_sql: admission::AdmissionStatements,
    /// The run queue's LISTEN connection, once [`PostgresStore::queue_wakeups`] started it.
    listener: tokio::sync::Mutex<Option<listener::Listener<Arc<tokio::sync::Notify>>>>,
    /// The task channel's LISTEN connection, once [`PostgresStore::task_wakeups`] started it.
    task_listener: tokio::sync::Mutex<Option<listener::Listener<Arc<tokio::sync::Notify>>>>,
    /// The control channel's LISTEN connection and the plane's subscribers, once
    /// [`PostgresStore::control_plane`] started it.
    control_listener: tokio::sync::Mutex<Option<listener::Listener<Arc<durable_core::ControlSinks>>>>,
}

/// The fixed read statements, with the schema filled in.
struct Statements {
    schema: String,
    get_run: String,
    get_runs: String,
    history: String,
    waiters: String,
    get_state: String,
    get_schedule: String,
}

impl Statements {
    fn new(schema: &str) -> Self {
        let s = quote_ident(schema);
        Statements {
            get_run: format!("SELECT {} FROM {s}.runs WHERE id = $1", ops::RUN_COLS),
            // A semi-join with the ids, not `id = ANY($1)`: a parameter array is not hashed, so
            // on a table without statistics (the planner then picks a scan for a long list) each
            // row was compared with every id — a read of 2,000 runs cost 4 million comparisons.
            get_runs: format!("SELECT {} FROM {s}.runs WHERE id IN (SELECT unnest($1::text[]))", ops::RUN_COLS),
            history: format!("SELECT {} FROM {s}.checkpoints WHERE run_id = $1 ORDER BY seq", ops::CHECKPOINT_COLS),
            waiters: format!("SELECT {} FROM {s}.waiters WHERE run_id = $1 ORDER BY seq", ops::WAITER_COLS),
            get_state: format!("SELECT value FROM {s}.run_state WHERE run_id = $1 AND key = $2"),
            get_schedule: format!("SELECT body FROM {s}.schedules WHERE key = $1"),
            schema: s,
        }
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.shared.target)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` with the default [`PostgresOptions`] (schema `durable`).
    ///
    /// See [`PostgresStore::connect_with`].
    pub async fn connect(url: &str) -> Result<PostgresStore> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects to the database at `url` (`postgres://user[:password]@host[:port]/database`, or
    /// libpq's `key=value` form), creates or migrates the schema, and starts the writer task.
    ///
    /// One connection is opened now (so a wrong URL fails here, not on the first call); the pool
    /// opens more as calls need them, up to [`PostgresOptions::pool_size`]. The connections run
    /// with `jit = off` unless the URL's `options` set `jit`: the store's statements read a few
    /// rows by index, and a planner that guesses them costly (tables without statistics) would
    /// compile them for 100-350 ms first.
    ///
    /// # Errors
    /// - [`Error::InvalidUrl`], [`Error::InvalidOptions`]: nothing was attempted.
    /// - [`Error::Connect`]: refused, unreachable or timed out (retryable).
    /// - [`Error::DatabaseNotFound`], [`Error::AuthFailed`]: fix the URL or the server.
    /// - [`Error::SchemaTooNew`], [`Error::ForeignSchema`]: nothing was changed.
    /// - [`Error::SchemaNotFound`]: with `create_if_missing(false)`, no durable schema is there.
    /// - [`Error::SchemaTooOld`]: with `migrate(false)`, an older build wrote the schema.
    /// - [`Error::Postgres`]: a statement of the migration failed (no permission to create the
    ///   schema, …); it was rolled back.
    /// - [`Error::NoRuntime`]: called outside a tokio runtime.
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<PostgresStore> {
        options.validate()?;
        let (url, tls_params) = tls::split_url(url)?;
        let cfg = schema::config(&url, &options)?;
        let target = schema::target(&cfg);
        let tls = tls::MakeRustls::new(&tls_params)?;
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match &tls {
            None => Manager::from_config(cfg.clone(), NoTls, recycling),
            Some(tls) => Manager::from_config(cfg.clone(), tls.clone(), recycling),
        };
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.acquire_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| Error::InvalidOptions { reason: format!("building the connection pool: {e}") })?;
        Self::start(pool, options, Some(target), Some(tls::Dial { cfg, tls })).await
    }

    /// Uses a pool you built (for TLS, custom connection hooks, or to share it), creates or
    /// migrates the schema and starts the writer task.
    ///
    /// The pool's own settings stand: [`PostgresOptions::pool_size`], `statement_timeout`, `jit`,
    /// `connect_timeout`, `acquire_timeout` and `application_name` are not applied (set them on
    /// the pool and its `tokio_postgres::Config`). Build it with `Runtime::Tokio1` and a wait
    /// timeout, so an exhausted pool fails calls instead of blocking them forever. The store
    /// keeps its lookups by key prepared on each pooled connection (the pool's statement
    /// cache): recycle connections with `RecyclingMethod::Fast`, `Verified` or `Clean`, not a
    /// custom `DISCARD ALL` (which drops them); through PgBouncer in transaction mode, set its
    /// `max_prepared_statements`.
    ///
    /// # Errors
    /// As [`PostgresStore::connect_with`].
    pub async fn from_pool(pool: Pool, options: PostgresOptions) -> Result<PostgresStore> {
        options.validate()?;
        Self::start(pool, options, None, None).await
    }

    async fn start(
        pool: Pool,
        options: PostgresOptions,
        target: Option<String>,
        config: Option<tls::Dial>,
    ) -> Result<PostgresStore> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        let described = target.clone().unwrap_or_else(|| "(the given pool's server)".into());
        let client = pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Timeout(_) => Error::Connect {
                target: described.clone(),
                reason: "timed out: is the host reachable and the port right? (PostgresOptions::connect_timeout)"
                    .into(),
                source: None,
            },
            e => error::pool_error(&described, e),
        })?;
        let target = match target {
            Some(t) => t,
            None => schema::server_target(&client).await,
        };
        schema::migrate(&client, &target, &options.schema, options.create_if_missing, options.migrate).await?;
        drop(client);
        let sql = Statements::new(&options.schema);
        let queue_sql = queue::QueueStatements::new(&sql.schema);
        let task_sql = tasks::TaskStatements::new(&sql.schema);
        let admission_sql = admission::AdmissionStatements::new(&sql.schema);
        let shared = Arc::new(Shared {
            pool,
            target,
            apply_sql: format!("SELECT r FROM {}.apply($1::jsonb, $2, $3::jsonb) AS r", sql.schema),
            channel: options.notify_channel.clone(),
            max_batch: options.max_batch,
            write_connections: options.write_connections,
            counters: Counters::default(),
        });
        let writer = Writer::start(shared.clone());
        let queue_writer = Writer::start(shared.clone());
        let (listener, task_listener) = (tokio::sync::Mutex::new(None), tokio::sync::Mutex::new(None));
        let control_listener = tokio::sync::Mutex::new(None);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                shared,
                writer,
                queue_writer,
                options,
                config,
                sql,
                queue_sql,
                task_sql,
                admission_sql,
                listener,
                task_listener,
                control_listener,
            }),
        })
    }

    /// The options the store was connected with.
    pub fn options(&self) -> &PostgresOptions {
        &self.inner.options
    }

    /// The server, as `user@host:port/database`.
    pub fn target(&self) -> &str {
        &self.inner.shared.target
    }

    /// The connection pool (shared with clones of this store).
    pub fn pool(&self) -> &Pool {
        &self.inner.shared.pool
    }

    /// The store's counters: write batches (one round trip each), writes answered, retries,
    /// reads. Under concurrent load `batches` grows much slower than `writes`.
    pub fn stats(&self) -> PostgresStats {
        self.inner.shared.counters.snapshot()
    }

    /// Listens on [`PostgresOptions::notify_channel`]: every run created, handed back to
    /// `pending` or woken (by a signal, an event, a `wake` patch) by any engine on this schema
    /// is announced with its id once its transaction commits.
    ///
    /// It opens a dedicated connection (not from the pool). A notification is a hint, not a
    /// queue: ids may repeat, and none arrive while the connection is down —
    /// [`RunNotifications::recv`] returns `None` when it drops; listen again and poll
    /// ([`Store::pending_runs`], [`Store::due_runs`]) for what was missed.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] if no channel is configured or the store was built with
    /// [`PostgresStore::from_pool`] (no URL to connect with); connection errors as for
    /// [`PostgresStore::connect_with`].
    pub async fn listen(&self) -> Result<RunNotifications> {
        let Some(channel) = self.inner.options.notify_channel.clone() else {
            return Err(Error::InvalidOptions {
                reason: "listen needs a channel: set PostgresOptions::notify_channel".into(),
            });
        };
        let Some(dial) = &self.inner.config else {
            return Err(Error::InvalidOptions {
                reason: "listen needs a store connected with a URL (PostgresStore::connect_with), not from_pool".into(),
            });
        };
        let target = self.target().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        let (client, task) = dial
            .connect_listening(move |payload| tx.send(RunId::new(payload)).is_ok())
            .await
            .map_err(|e| error::connect_error(&target, e))?;
        client
            .batch_execute(&format!("LISTEN {}", quote_ident(&channel)))
            .await
            .map_err(|e| error::query_error(&target, "subscribing to the notify channel", e))?;
        Ok(RunNotifications { rx, _client: client, task })
    }

    // ---- plumbing ---------------------------------------------------------------------------

    async fn write(&self, op: Op<'_>) -> StoreResult<String> {
        self.inner.writer.write(&self.inner.shared, op.encode(), BatchLocks::of(&op)).await
    }

    /// A run-queue write, through the queue's own writer.
    async fn queue_write(&self, op: Op<'_>) -> StoreResult<String> {
        self.inner.queue_writer.write(&self.inner.shared, op.encode(), BatchLocks::of(&op)).await
    }

    fn answer<T>(&self, answer: std::result::Result<T, Answer>) -> StoreResult<T> {
        answer.map_err(|a| match a {
            Answer::Store(e) => e,
            Answer::Corrupt(message) => self.corrupt(message),
        })
    }

    fn corrupt(&self, message: String) -> StoreError {
        Error::Corrupt { target: self.inner.shared.target.clone(), message }.into_store_error()
    }

    /// A group of writes the writer never splits (one transaction, one round trip); one answer
    /// per operation, in order (`what` names them in the error if the count is off).
    async fn write_group(&self, group: Vec<String>, what: &str) -> StoreResult<Vec<String>> {
        let n = group.len();
        // Creates and schedule saves: no advisory keys, no deliveries.
        let answers = self.inner.writer.write_group(&self.inner.shared, group, BatchLocks::default()).await?;
        if answers.len() != n {
            return Err(self.corrupt(format!("{n} {what} got {} answers", answers.len())));
        }
        Ok(answers)
    }

    /// One read query, one round trip (unprepared: parse, bind and execute are sent together).
    async fn query(&self, doing: &str, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> StoreResult<Vec<Row>> {
        let client = self.reader().await?;
        client.query_typed(sql, params).await.map_err(|e| self.query_failed(doing, e))
    }

    /// A pooled connection for one read, counted as a round trip.
    async fn reader(&self) -> StoreResult<deadpool_postgres::Object> {
        let shared = &self.inner.shared;
        let client = shared.pool.get().await.map_err(|e| error::pool_error(&shared.target, e).into_store_error())?;
        shared.counters.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(client)
    }

    fn query_failed(&self, doing: &str, e: tokio_postgres::Error) -> durable_core::StoreError {
        error::query_error(&self.inner.shared.target, doing, e).into_store_error()
    }

    /// One read of a statement whose text is fixed for the store (a lookup by key: a run, its
    /// history, its waiters, a schedule), prepared once per pooled connection and kept in the
    /// connection's statement cache: one round trip, and the server neither parses nor plans
    /// it again (about a fifth more of the `signals` workload's round trips per second).
    async fn query_prepared(
        &self,
        doing: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> StoreResult<Vec<Row>> {
        let client = self.reader().await?;
        self.prepared(&client, doing, sql, params).await
    }

    /// `sql` on `client`, prepared once per connection (see [`PostgresStore::query_prepared`]).
    async fn prepared(
        &self,
        client: &deadpool_postgres::Object,
        doing: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> StoreResult<Vec<Row>> {
        let failed = |e| self.query_failed(doing, e);
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let statement = client.prepare_typed_cached(sql, &types).await.map_err(failed)?;
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        client.query(&statement, &values).await.map_err(failed)
    }

    /// A pooled connection for a statement that writes in a transaction of its own.
    async fn statement_client(&self) -> StoreResult<deadpool_postgres::Object> {
        let shared = &self.inner.shared;
        shared.pool.get().await.map_err(|e| error::pool_error(&shared.target, e).into_store_error())
    }

    /// One statement that writes (a task or queue claim, a heartbeat) in a transaction of its
    /// own, on the pool: one round trip. Its text is fixed for the store, so it is prepared once
    /// per pooled connection: the server neither parses nor plans it again (the task claim, a
    /// CTE over two tables, was about a tenth of the server's time under `remote_chain`).
    async fn statement(&self, doing: &str, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> StoreResult<Vec<Row>> {
        let client = self.statement_client().await?;
        self.prepared(&client, doing, sql, params).await
    }

    /// [`PostgresStore::statement`] of a text made for this call (it holds the time): not
    /// prepared, parse, bind and execute are sent together.
    async fn statement_once(
        &self,
        doing: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> StoreResult<Vec<Row>> {
        let client = self.statement_client().await?;
        client.query_typed(sql, params).await.map_err(|e| self.query_failed(doing, e))
    }

    /// Decodes rows, mapping a column type mismatch or an invalid value to a corrupt-data error.
    fn decode<T>(
        &self,
        doing: &str,
        decoded: std::result::Result<std::result::Result<T, String>, tokio_postgres::Error>,
    ) -> StoreResult<T> {
        match decoded {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(message)) => Err(self.corrupt(message)),
            Err(e) => Err(self.corrupt(format!("{doing}: {e}"))),
        }
    }

    /// Decodes rows whose one column is a schedule's body.
    fn schedule_rows(&self, doing: &str, rows: &[Row]) -> StoreResult<Vec<ScheduleRecord>> {
        rows.iter()
            .map(|row| {
                let body = row.try_get::<_, String>(0).map(|body| ops::schedule_body(&body));
                self.decode(doing, body)
            })
            .collect()
    }

    async fn poll(&self, which: Poll, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let q = ops::poll_query(&self.inner.sql.schema, which, query);
        let rows = self.query("polling runs", &q.sql, &q.param_refs()).await?;
        let ids: std::result::Result<Vec<String>, _> = rows.iter().map(|r| r.try_get::<_, String>(0)).collect();
        self.decode("polling runs", ids.map(|ids| Ok(ids.into_iter().map(RunId::new).collect())))
    }
}

/// Run ids announced on a store's notify channel; see [`PostgresStore::listen`].
///
/// Dropping it closes its connection.
#[derive(Debug)]
pub struct RunNotifications {
    rx: mpsc::UnboundedReceiver<RunId>,
    _client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<()>,
}

impl RunNotifications {
    /// The next announced run id; `None` once the connection is gone (listen again).
    pub async fn recv(&mut self) -> Option<RunId> {
        self.rx.recv().await
    }
}

impl Drop for RunNotifications {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL.with_claimed_dispatch(true)
    }

    /// A keyed start ([`NewRun::admission`]) is decided in the same operation, before the run
    /// is written (`create_admitted` in `sql/v8.sql`).
    async fn create_run(&self, run: NewRun) -> StoreResult<CreateRun> {
        let answer = self.write(Op::CreateRun(ops::CreateRunJson::new(&run)?)).await?;
        self.answer(ops::create_answer(&answer, run))
    }

    /// One group of `create_run` operations: always in one batch of the writer, never split
    /// from each other, so one transaction and one round trip (alone, or with other writes
    /// waiting at that moment). One corner is not all-or-nothing: an item whose id conflicts
    /// with a run that another transaction deletes before the existing run is read answers an
    /// error (as `create_run` does) while the rest of the group commits; the call then fails
    /// with that error, and starting the batch again finds the others `Existing`.
    ///
    /// A batch with keyed starts ([`NewRun::admission`]) is one operation instead, whose
    /// creates run in a subtransaction: a start refused with [`StoreError::QueueFull`] undoes
    /// the whole batch (its admissions too) and the call fails with it.
    async fn create_runs(&self, runs: Vec<NewRun>) -> StoreResult<Vec<CreateRun>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        if runs.iter().any(|run| run.admission.is_some()) {
            let keyed = runs.iter().map(ops::KeyedRunJson::new).collect::<StoreResult<Vec<_>>>()?;
            let answer = self.write(Op::CreateRuns { runs: keyed }).await?;
            return self.answer(ops::creates_answer(&answer, runs));
        }
        let group = runs.iter().map(|run| Op::CreateRun(ops::CreateRunJson::unkeyed(run)).encode()).collect();
        let answers = self.write_group(group, "creates").await?;
        runs.into_iter().zip(answers).map(|(run, answer)| self.answer(ops::create_answer(&answer, run))).collect()
    }

    async fn get_run(&self, id: &RunId) -> StoreResult<Option<Run>> {
        let id_s = id.as_str();
        let rows = self.query_prepared("reading a run", &self.inner.sql.get_run, &[(&id_s, Type::TEXT)]).await?;
        let runs = self.decode("reading a run", ops::run_rows(&rows))?;
        Ok(runs.into_iter().next())
    }

    async fn get_runs(&self, ids: &[RunId]) -> StoreResult<Vec<Run>> {
        let ids: Vec<&str> = ids.iter().map(RunId::as_str).collect();
        let rows = self.query_prepared("reading runs", &self.inner.sql.get_runs, &[(&ids, Type::TEXT_ARRAY)]).await?;
        self.decode("reading runs", ops::run_rows(&rows))
    }

    async fn list_runs(&self, filter: &RunFilter) -> StoreResult<RunPage> {
        let (q, limit) = ops::list_runs_query(&self.inner.sql.schema, filter)?;
        let rows = self.query("listing runs", &q.sql, &q.param_refs()).await?;
        let mut runs = self.decode("listing runs", ops::run_rows(&rows))?;
        let more = runs.len() > limit;
        runs.truncate(limit);
        let next_cursor = if more { runs.last().map(encode_cursor) } else { None };
        Ok(RunPage { runs, next_cursor })
    }

    async fn run_counts(&self) -> StoreResult<Vec<RunCount>> {
        let sql = ops::run_counts_sql(&self.inner.sql.schema);
        let rows = self.query("counting runs", &sql, &[]).await?;
        self.decode("counting runs", ops::run_count_rows(&rows))
    }

    async fn history(&self, id: &RunId) -> StoreResult<Vec<Checkpoint>> {
        let id_s = id.as_str();
        let rows = self.query_prepared("reading a history", &self.inner.sql.history, &[(&id_s, Type::TEXT)]).await?;
        self.decode("reading a history", ops::checkpoint_rows(&rows))
    }

    async fn claim_run(&self, claim: Claim) -> StoreResult<ClaimOutcome> {
        let answer = self.write(ops::claim_op(&claim, 0)).await?;
        self.answer(ops::claim_answer(&answer, &claim))
    }

    /// One write, like `claim_run`, whose history is one range read of the checkpoints from
    /// `from_seq` on.
    async fn claim_run_from(&self, claim: Claim, from_seq: u32) -> StoreResult<ClaimOutcome> {
        let answer = self.write(ops::claim_op(&claim, from_seq)).await?;
        self.answer(ops::claim_answer(&answer, &claim))
    }

    async fn renew_lease(&self, id: &RunId, owner: &str, lease_until: Millis) -> StoreResult<bool> {
        let op = Op::RenewLease { id: id.as_str(), owner, until: ops::millis_to_sql(lease_until) };
        let answer = self.write(op).await?;
        self.answer(ops::bool_answer(&answer, id, "ok"))
    }

    async fn release_lease(&self, id: &RunId, owner: &str) -> StoreResult<bool> {
        let answer = self.write(Op::ReleaseLease { id: id.as_str(), owner }).await?;
        self.answer(ops::bool_answer(&answer, id, "ok"))
    }

    async fn commit(&self, commit: Commit) -> StoreResult<CommitOutcome> {
        let answer = self.write(Op::commit(&commit)).await?;
        self.answer(ops::commit_answer(&answer, &commit))
    }

    async fn update_run_if(&self, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> StoreResult<bool> {
        let answer = self.write(Op::UpdateRunIf(ops::PatchJson::new(id, expected, &patch))).await?;
        self.answer(ops::bool_answer(&answer, id, "applied"))
    }

    async fn pending_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.poll(Poll::Pending, query).await
    }

    async fn due_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.poll(Poll::Due, query).await
    }

    /// One statement on the pool, in a transaction of its own (not a write of the writer): see
    /// `claim_due_query` in `ops.rs`. Concurrent claimers never wait for each other.
    async fn claim_due_runs(&self, query: &RunQuery, until: Millis) -> StoreResult<Vec<RunId>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let q = ops::claim_due_query(&self.inner.sql.schema, query, until);
        let rows = self.statement_once("claiming due runs", &q.sql, &q.param_refs()).await?;
        let ids: std::result::Result<Vec<String>, _> = rows.iter().map(|r| r.try_get::<_, String>(0)).collect();
        self.decode("claiming due runs", ids.map(|ids| Ok(ids.into_iter().map(RunId::new).collect())))
    }

    async fn orphaned_runs(&self, query: &RunQuery) -> StoreResult<Vec<RunId>> {
        self.poll(Poll::Orphaned, query).await
    }

    async fn send_signal(&self, token: &str, payload: Payload, now: Millis) -> StoreResult<Delivery> {
        let op = Op::SendSignal { token, payload: payload.as_str(), now: ops::millis_to_sql(now), claim: None };
        let answer = self.write(op).await?;
        self.answer(ops::signal_answer(&answer))
    }

    /// One write: the signal, and the claim of the run it wakes if that is `claim.run_id`.
    async fn send_signal_and_claim(
        &self,
        token: &str,
        payload: Payload,
        claim: Claim,
        from_seq: u32,
    ) -> StoreResult<(Delivery, Option<ClaimOutcome>)> {
        let op = Op::SendSignal {
            token,
            payload: payload.as_str(),
            now: ops::millis_to_sql(claim.now),
            claim: Some(ops::ClaimJson::new(&claim, from_seq)),
        };
        let answer = self.write(op).await?;
        self.answer(ops::signal_and_claim_answer(&answer, &claim))
    }

    async fn publish(&self, event: Publish) -> StoreResult<Published> {
        let op = Op::Publish(ops::PublishJson::new(&event)?);
        let answer = self.write(op).await?;
        self.answer(ops::publish_answer(&answer, event.start))
    }

    async fn due_buffers(&self, query: &DueQuery) -> StoreResult<Vec<TriggerBuffer>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let q = ops::due_buffers_query(&self.inner.sql.schema, query);
        let rows = self.query("reading due trigger buffers", &q.sql, &q.param_refs()).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode("reading due trigger buffers", ops::buffer_from_row(row))?);
        }
        Ok(out)
    }

    async fn flush_buffer(
        &self,
        workflow: &str,
        key: &str,
        batch_id: &str,
        now: Millis,
        admission: Option<SlotRequest>,
    ) -> StoreResult<Option<CreateRun>> {
        let admission = admission.as_ref().map(ops::SlotRequestJson::new).transpose()?;
        let op = Op::FlushBuffer { workflow, key, batch_id, now: ops::millis_to_sql(now), admission };
        let answer = self.write(op).await?;
        self.answer(ops::flush_answer(&answer))
    }

    async fn get_schedule(&self, key: &str) -> StoreResult<Option<ScheduleRecord>> {
        let rows =
            self.query_prepared("reading a schedule", &self.inner.sql.get_schedule, &[(&key, Type::TEXT)]).await?;
        let mut records = self.schedule_rows("reading a schedule", &rows)?;
        Ok(records.pop())
    }

    async fn list_schedules(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let q = ops::list_schedules_query(&self.inner.sql.schema, namespace, after, limit);
        let rows = self.query("listing schedules", &q.sql, &q.param_refs()).await?;
        self.schedule_rows("listing schedules", &rows)
    }

    async fn save_schedule(&self, save: SaveSchedule) -> StoreResult<SaveOutcome> {
        let answer = self.write(Op::SaveSchedule(ops::SaveScheduleJson::new(&save)?)).await?;
        self.answer(ops::save_answer(&answer))
    }

    /// One group of `save_schedule` operations: one transaction and one round trip (as
    /// [`Store::create_runs`]), each save applied on its own (a stale one writes nothing and
    /// the others still apply).
    async fn save_schedules(&self, saves: Vec<SaveSchedule>) -> StoreResult<Vec<SaveOutcome>> {
        if saves.is_empty() {
            return Ok(Vec::new());
        }
        let group = saves
            .iter()
            .map(|save| Ok(Op::SaveSchedule(ops::SaveScheduleJson::new(save)?).encode()))
            .collect::<StoreResult<Vec<_>>>()?;
        let answers = self.write_group(group, "schedule saves").await?;
        answers.iter().map(|answer| self.answer(ops::save_answer(answer))).collect()
    }

    async fn delete_schedule(&self, key: &str) -> StoreResult<bool> {
        let answer = self.write(Op::DeleteSchedule { key }).await?;
        self.answer(ops::bool_answer(&answer, &RunId::new(""), "deleted"))
    }

    async fn due_schedules(&self, query: &DueQuery) -> StoreResult<Vec<ScheduleRecord>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let q = ops::due_schedules_query(&self.inner.sql.schema, query);
        let rows = self.query("reading due schedules", &q.sql, &q.param_refs()).await?;
        self.schedule_rows("reading due schedules", &rows)
    }

    /// One statement in a transaction of its own (`UPDATE … FROM (SELECT … FOR UPDATE SKIP
    /// LOCKED)`): it never waits for a lock, and concurrent claimers each get other tasks.
    async fn claim_tasks(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        self.claim_tasks_now(claim).await
    }

    async fn heartbeat_task(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        self.heartbeat_now(beat).await
    }

    /// An operation of the writer, like a signal: batched with the writes waiting at that
    /// moment, serialised with the run's commits by the wait token's advisory lock and the run
    /// row's lock.
    async fn complete_task(&self, done: TaskDone) -> StoreResult<TaskCompletion> {
        let answer = self.write(Op::CompleteTask(ops::TaskDoneJson::new(&done))).await?;
        self.answer(ops::completion_answer(&answer, &done.run_id))
    }

    /// One operation of the writer: the result, and for an accepted one the claim of the run it
    /// wakes, in the same write of the run row (schema version 16).
    async fn complete_task_and_claim(
        &self,
        done: TaskDone,
        claim: Claim,
    ) -> StoreResult<(TaskCompletion, Option<ClaimOutcome>)> {
        done.check_claim(&claim)?;
        let answer = self.write(Op::CompleteTask(ops::TaskDoneJson::with_claim(&done, &claim))).await?;
        self.answer(ops::completion_and_claim_answer(&answer, &claim))
    }

    async fn release_tasks(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        self.release_now(tasks, worker).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<Task>> {
        let q = ops::list_tasks_query(&self.inner.sql.schema, filter);
        let rows = self.query("listing tasks", &q.sql, &q.param_refs()).await?;
        self.decode("listing tasks", ops::task_rows(&rows))
    }

    async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        let rows = self.query("reading queue stats", &self.inner.task_sql.queue_stats, &[]).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode("reading queue stats", ops::stats_from_row(row))?);
        }
        Ok(out)
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> StoreResult<()> {
        self.register_worker_now(worker).await
    }

    async fn remove_worker(&self, id: &str) -> StoreResult<bool> {
        self.remove_worker_now(id).await
    }

    async fn workers(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        self.workers_now(heartbeat_before).await
    }

    /// An operation of the writer: it locks the gate's row (creating it if new), so acquirers
    /// and releasers of one gate in any process take turns.
    async fn acquire_slot(&self, request: &SlotRequest) -> StoreResult<Admission> {
        self.acquire_slot_now(request).await
    }

    async fn release_slot(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        self.release_slot_now(gate, holder, now).await
    }

    async fn admission_stats(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        self.admission_stats_now(now).await
    }

    async fn run_admission(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        self.run_admission_now(id).await
    }

    async fn waiters(&self, id: &RunId) -> StoreResult<Vec<Waiter>> {
        let id_s = id.as_str();
        let rows = self.query_prepared("reading waiters", &self.inner.sql.waiters, &[(&id_s, Type::TEXT)]).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode("reading waiters", ops::waiter_from_row(row))?);
        }
        Ok(out)
    }

    /// One `GROUP BY` per kind asked for: a scan of its table (an operator's summary).
    async fn buffered(&self, query: &BufferedQuery) -> StoreResult<Vec<BufferedDeliveries>> {
        let mut out = Vec::new();
        for kind in [BufferedKind::Signal, BufferedKind::Event] {
            if query.kind.is_some_and(|k| k != kind) || out.len() >= query.limit {
                continue;
            }
            let q = ops::buffered_query(&self.inner.sql.schema, kind, query, query.limit - out.len());
            let rows = self.query("listing buffered deliveries", &q.sql, &q.param_refs()).await?;
            for row in &rows {
                out.push(self.decode("listing buffered deliveries", ops::buffered_from_row(kind, row))?);
            }
        }
        Ok(out)
    }

    /// One `DELETE`, in a transaction of its own.
    async fn purge_buffered(&self, purge: &BufferedPurge) -> StoreResult<u64> {
        let sql = ops::purge_buffered_sql(&self.inner.sql.schema, purge.kind);
        let before = purge.buffered_before.map(ops::millis_to_sql);
        let key = purge.key.as_str();
        let shared = &self.inner.shared;
        let client = shared.pool.get().await.map_err(|e| error::pool_error(&shared.target, e).into_store_error())?;
        client
            .execute_typed(&sql, &[(&key, Type::TEXT), (&before, Type::INT8)])
            .await
            .map_err(|e| self.query_failed("purging buffered deliveries", e))
    }

    async fn get_state(&self, id: &RunId, key: &str) -> StoreResult<Option<Payload>> {
        let id_s = id.as_str();
        let rows = self
            .query("reading query state", &self.inner.sql.get_state, &[(&id_s, Type::TEXT), (&key, Type::TEXT)])
            .await?;
        match rows.first() {
            None => Ok(None),
            Some(row) => {
                let value = row.try_get::<_, String>(0).map(|v| Ok(Some(Payload::from_trusted(v))));
                self.decode("reading query state", value)
            }
        }
    }

    async fn delete_run(&self, id: &RunId) -> StoreResult<u64> {
        let answer = self.write(Op::DeleteRun { id: id.as_str() }).await?;
        self.answer(ops::delete_answer(&answer, id))
    }
}
