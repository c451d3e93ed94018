//! The store's operations as SQL on one connection.
//!
//! Write operations run on the writer thread inside the group's `BEGIN IMMEDIATE` transaction
//! and their own savepoint, so every read they make and every write that depends on it are in
//! one transaction (the contract's compare-and-set rules hold across processes). Read
//! operations are single statements on a reader connection. Each mirrors the method of the
//! same name in `durable-store-memory`, the reference implementation.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use durable_core::{
    BufferedDeliveries, BufferedKind, BufferedPurge, BufferedQuery, Checkpoint, Claim, ClaimOutcome, Commit,
    CommitOutcome, CreateRun, Delivery, DueQuery, Gathered, Millis, NewRun, ParentLink, Payload, Publish, Published,
    Run, RunFilter, RunId, RunPage, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule, ScheduleRecord,
    StepError, StepKind, StoreError, TriggerBuffer, TurnEnd, WaitKind, Waiter, decode_cursor, encode_cursor,
    json_subset, protocol,
};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row, params, params_from_iter};

use crate::admission;
use crate::error::Error;

/// What every operation needs to describe its errors.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) path: PathBuf,
    pub(crate) busy_timeout: Duration,
}

/// An operation's failure, before it is turned into a [`StoreError`] naming the file.
#[derive(Debug)]
pub(crate) enum OpError {
    /// SQLite failed.
    Sql(rusqlite::Error),
    /// A contract outcome (`LeaseLost`, `Conflict`, `NotFound`, …).
    Store(StoreError),
    /// A stored value does not decode.
    Corrupt(String),
}

impl From<rusqlite::Error> for OpError {
    fn from(e: rusqlite::Error) -> Self {
        OpError::Sql(e)
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

pub(crate) type OpResult<T> = Result<T, OpError>;

impl OpError {
    pub(crate) fn into_store_error(self, ctx: &Ctx, op: &str) -> StoreError {
        match self {
            OpError::Store(e) => e,
            OpError::Corrupt(message) => Error::Corrupt { path: ctx.path.clone(), message }.into_store_error(),
            OpError::Sql(
                e @ (rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::IntegralValueOutOfRange(..)
                | rusqlite::Error::Utf8Error(..)),
            ) => Error::Corrupt { path: ctx.path.clone(), message: format!("{op}: {e}") }.into_store_error(),
            OpError::Sql(e) => Error::sqlite(&ctx.path, ctx.busy_timeout, op, e).into_store_error(),
        }
    }
}

pub(crate) fn corrupt(message: String) -> OpError {
    OpError::Corrupt(message)
}

// ---- value codecs -------------------------------------------------------------------------

/// Times are `u64` milliseconds; SQLite integers are `i64`. Values past `i64::MAX` (only
/// "forever" sentinels like `u64::MAX`, 292 million years from now) are stored as `i64::MAX`,
/// which reads back as `u64::MAX`. Order is preserved, so comparisons in SQL stay right.
pub(crate) fn millis_to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn millis_from_sql(v: i64, what: impl FnOnce() -> String) -> OpResult<u64> {
    if v == i64::MAX {
        return Ok(u64::MAX);
    }
    u64::try_from(v).map_err(|_| corrupt(format!("{}: negative value {v}", what())))
}

pub(crate) fn u32_from_sql(v: i64, what: impl FnOnce() -> String) -> OpResult<u32> {
    u32::try_from(v).map_err(|_| corrupt(format!("{}: {v} is out of range", what())))
}

fn tags_json(tags: &[String]) -> OpResult<String> {
    serde_json::to_string(tags).map_err(|e| OpError::Store(StoreError::backend(e)))
}

pub(crate) fn error_json(e: &StepError) -> OpResult<String> {
    serde_json::to_string(e).map_err(|e| OpError::Store(StoreError::backend(e)))
}

pub(crate) fn text<'a>(row: &'a Row<'_>, i: usize) -> OpResult<&'a str> {
    Ok(row.get_ref(i)?.as_str().map_err(rusqlite::Error::from)?)
}

pub(crate) fn opt_text<'a>(row: &'a Row<'_>, i: usize) -> OpResult<Option<&'a str>> {
    Ok(row.get_ref(i)?.as_str_or_null().map_err(rusqlite::Error::from)?)
}

pub(crate) fn opt_payload(row: &Row<'_>, i: usize) -> OpResult<Option<Payload>> {
    Ok(opt_text(row, i)?.map(Payload::from_trusted))
}

pub(crate) fn opt_step_error(row: &Row<'_>, i: usize, what: impl FnOnce() -> String) -> OpResult<Option<StepError>> {
    match opt_text(row, i)? {
        None => Ok(None),
        Some(s) => {
            serde_json::from_str(s).map(Some).map_err(|e| corrupt(format!("{}: error is not valid: {e}", what())))
        }
    }
}

pub(crate) fn opt_millis(row: &Row<'_>, i: usize, what: impl FnOnce() -> String) -> OpResult<Option<u64>> {
    match row.get::<_, Option<i64>>(i)? {
        None => Ok(None),
        Some(v) => millis_from_sql(v, what).map(Some),
    }
}

fn opt_payload_str(p: &Option<Payload>) -> Option<&str> {
    p.as_ref().map(Payload::as_str)
}

fn opt_error_json(e: &Option<StepError>) -> OpResult<Option<String>> {
    e.as_ref().map(error_json).transpose()
}

pub(crate) fn run_status(s: &str, id: &RunId) -> OpResult<RunStatus> {
    s.parse().map_err(|e| corrupt(format!("run {id}: {e}")))
}

// ---- rows ---------------------------------------------------------------------------------

/// A run by id (the SQL is a constant: a read formats nothing to find its cached statement).
const GET_RUN: &str = "SELECT id, workflow, version, namespace, status, input, output, error, tags, priority, \
     parent_id, parent_seq, created_at, updated_at, wake_at, lease_owner, lease_until, recovery_attempts, wake_gen, \
     trace_context, claims FROM runs WHERE id = ?1";

/// The columns of [`GET_RUN`], for a query that joins another table.
const RUN_COLS_QUALIFIED: &str = "runs.id, runs.workflow, runs.version, runs.namespace, runs.status, runs.input, \
     runs.output, runs.error, runs.tags, runs.priority, runs.parent_id, runs.parent_seq, runs.created_at, \
     runs.updated_at, runs.wake_at, runs.lease_owner, runs.lease_until, runs.recovery_attempts, runs.wake_gen, \
     runs.trace_context, runs.claims";

fn run_from_row(row: &Row<'_>) -> OpResult<Run> {
    let raw_id = text(row, 0)?;
    // No run is created with such an id, and a list cursor could not name it: a damaged file.
    if durable_core::protocol::has_control_char(raw_id) {
        return Err(corrupt(format!("run id {raw_id:?} has a control character, which no run id has")));
    }
    let id = RunId::new(raw_id);
    let what = |col: &str| format!("run {id}: {col}");
    let tags: Vec<String> =
        serde_json::from_str(text(row, 8)?).map_err(|e| corrupt(format!("{}: {e}", what("tags"))))?;
    let parent = match (opt_text(row, 10)?, row.get::<_, Option<i64>>(11)?) {
        (Some(pid), Some(seq)) => {
            Some(ParentLink { run_id: RunId::new(pid), seq: u32_from_sql(seq, || what("parent_seq"))? })
        }
        _ => None,
    };
    Ok(Run {
        workflow: text(row, 1)?.to_string(),
        version: u32_from_sql(row.get(2)?, || what("version"))?,
        namespace: text(row, 3)?.to_string(),
        status: run_status(text(row, 4)?, &id)?,
        input: Payload::from_trusted(text(row, 5)?),
        output: opt_payload(row, 6)?,
        error: opt_step_error(row, 7, || what("error"))?,
        tags,
        priority: i32::try_from(row.get::<_, i64>(9)?).map_err(|_| corrupt(what("priority out of range")))?,
        parent,
        created_at: millis_from_sql(row.get(12)?, || what("created_at"))?,
        updated_at: millis_from_sql(row.get(13)?, || what("updated_at"))?,
        wake_at: opt_millis(row, 14, || what("wake_at"))?,
        lease_owner: opt_text(row, 15)?.map(str::to_string),
        lease_until: opt_millis(row, 16, || what("lease_until"))?,
        recovery_attempts: u32_from_sql(row.get(17)?, || what("recovery_attempts"))?,
        wake_gen: millis_from_sql(row.get(18)?, || what("wake_gen"))?,
        trace_context: opt_text(row, 19)?.map(str::to_string),
        claims: millis_from_sql(row.get(20)?, || what("claims"))?,
        id,
    })
}

/// A run's checkpoints from a seq on, in one range of the `(run_id, seq)` primary key.
const HISTORY_FROM: &str = "SELECT run_id, seq, name, kind, status, input, output, error, attempts, wake_at, \
     started_at, updated_at FROM checkpoints WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq";

fn checkpoint_from_row(row: &Row<'_>) -> OpResult<Checkpoint> {
    let run_id = RunId::new(text(row, 0)?);
    let seq_raw: i64 = row.get(1)?;
    let what = |col: &str| format!("run {run_id} seq {seq_raw}: {col}");
    let seq = u32_from_sql(seq_raw, || what("seq"))?;
    Ok(Checkpoint {
        seq,
        name: text(row, 2)?.to_string(),
        kind: text(row, 3)?.parse().map_err(|e| corrupt(format!("{}: {e}", what("kind"))))?,
        status: text(row, 4)?.parse().map_err(|e| corrupt(format!("{}: {e}", what("status"))))?,
        input: opt_payload(row, 5)?,
        output: opt_payload(row, 6)?,
        error: opt_step_error(row, 7, || what("error"))?,
        attempts: u32_from_sql(row.get(8)?, || what("attempts"))?,
        wake_at: opt_millis(row, 9, || what("wake_at"))?,
        started_at: millis_from_sql(row.get(10)?, || what("started_at"))?,
        updated_at: millis_from_sql(row.get(11)?, || what("updated_at"))?,
        run_id,
    })
}

/// A run's waiters, by seq.
const RUN_WAITERS: &str =
    "SELECT run_id, seq, name, kind, key, matcher, created_at FROM waiters WHERE run_id = ?1 ORDER BY seq";

fn waiter_from_row(row: &Row<'_>) -> OpResult<Waiter> {
    let run_id = RunId::new(text(row, 0)?);
    let seq_raw: i64 = row.get(1)?;
    let what = |col: &str| format!("waiter of run {run_id} seq {seq_raw}: {col}");
    let key = text(row, 4)?.to_string();
    let kind = match text(row, 3)? {
        "signal" => WaitKind::Signal { token: key },
        "event" => WaitKind::Event {
            name: key,
            matcher: Payload::from_trusted(opt_text(row, 5)?.ok_or_else(|| corrupt(what("event matcher missing")))?),
        },
        other => return Err(corrupt(format!("{}: {other:?}", what("unknown wait kind")))),
    };
    Ok(Waiter {
        seq: u32_from_sql(seq_raw, || what("seq"))?,
        name: text(row, 2)?.to_string(),
        kind,
        created_at: millis_from_sql(row.get(6)?, || what("created_at"))?,
        run_id,
    })
}

// ---- reads --------------------------------------------------------------------------------

pub(crate) fn get_run(conn: &Connection, id: &RunId) -> OpResult<Option<Run>> {
    let mut stmt = conn.prepare_cached(GET_RUN)?;
    let mut rows = stmt.query([id.as_str()])?;
    match rows.next()? {
        Some(row) => run_from_row(row).map(Some),
        None => Ok(None),
    }
}

/// The run's whole history, in one query on the `(run_id, seq)` primary key.
pub(crate) fn history(conn: &Connection, id: &RunId) -> OpResult<Vec<Checkpoint>> {
    history_from(conn, id, 0)
}

/// The run's checkpoints from `from_seq` on, in one range query on the `(run_id, seq)`
/// primary key.
pub(crate) fn history_from(conn: &Connection, id: &RunId, from_seq: u32) -> OpResult<Vec<Checkpoint>> {
    let mut stmt = conn.prepare_cached(HISTORY_FROM)?;
    let mut rows = stmt.query(params![id.as_str(), i64::from(from_seq)])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(checkpoint_from_row(row)?);
    }
    Ok(out)
}

/// A statement and its arguments (`?N` placeholders, numbered, so a value can be used twice).
#[derive(Debug, Default)]
pub(crate) struct Sql {
    pub(crate) text: String,
    pub(crate) args: Vec<Value>,
}

impl Sql {
    /// Adds an argument and returns its placeholder.
    pub(crate) fn bind(&mut self, v: Value) -> String {
        self.args.push(v);
        format!("?{}", self.args.len())
    }
}

/// The index a `list_runs` query walks: one filter drives, the others filter what it yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Walk {
    /// `runs_parent_created`.
    Parent,
    /// `run_tags_created`, joined to the runs.
    Tag,
    /// `runs_status_created`, one walk per status, merged.
    Status,
    /// `runs_workflow_status_created`, one walk per status, merged.
    WorkflowStatus,
    /// `runs_workflow_created`.
    Workflow,
    /// `runs_namespace_created`.
    Namespace,
    /// `runs_created` (no filter that an index leads with; the created range and the cursor
    /// still narrow it).
    Created,
}

impl Walk {
    /// The filter most likely to be selective drives, without statistics to ask: a parent's
    /// children, then a tag, then a workflow with statuses (both narrow the walk), then
    /// statuses, then a workflow, then a namespace.
    pub(crate) fn of(filter: &RunFilter) -> Walk {
        let statuses = !filter.statuses.is_empty();
        if filter.parent.is_some() {
            Walk::Parent
        } else if filter.tag.is_some() {
            Walk::Tag
        } else if statuses && filter.workflow.is_some() {
            Walk::WorkflowStatus
        } else if statuses {
            Walk::Status
        } else if filter.workflow.is_some() {
            Walk::Workflow
        } else if filter.namespace.is_some() {
            Walk::Namespace
        } else {
            Walk::Created
        }
    }
}

/// The `list_runs` statement of `filter`, and the page size.
///
/// Every filter is served by an index that ends in the listing order (`created_at DESC, id
/// DESC`), so a page reads the entries of the walked index from the cursor on and stops at the
/// page size; see [`Walk::of`] for which one. The terms of the other filters are written `+col`,
/// which keeps SQLite from walking their index instead (SQLite has no statistics to tell which
/// filter is rarer). Several statuses are one walk of `runs_status_created` (or, with a
/// workflow, of `runs_workflow_status_created`) each, merged in order by a `UNION ALL … ORDER
/// BY` (SQLite's merge, no sort).
pub(crate) fn list_runs_sql(filter: &RunFilter) -> OpResult<(Sql, usize)> {
    let after = filter.cursor.as_deref().map(decode_cursor).transpose()?;
    let limit = if filter.limit == 0 { 100 } else { filter.limit };
    let walk = Walk::of(filter);
    let mut q = Sql::default();
    let by_status = matches!(walk, Walk::Status | Walk::WorkflowStatus);
    let plus = |w: Walk| if w == walk || (w == Walk::Workflow && walk == Walk::WorkflowStatus) { "" } else { "+" };
    // The listing order's columns: the tag walk reads them from run_tags (the same values).
    let (created, id) =
        if walk == Walk::Tag { ("run_tags.created_at", "run_tags.run_id") } else { ("runs.created_at", "runs.id") };
    let mut terms: Vec<String> = Vec::new();
    if let Some(parent) = &filter.parent {
        terms.push(format!("{}runs.parent_id = {}", plus(Walk::Parent), q.bind(Value::Text(parent.to_string()))));
    }
    if let Some(tag) = &filter.tag {
        let tag = q.bind(Value::Text(tag.clone()));
        terms.push(if walk == Walk::Tag {
            format!("run_tags.tag = {tag}")
        } else {
            format!("EXISTS (SELECT 1 FROM run_tags WHERE run_tags.run_id = runs.id AND run_tags.tag = {tag})")
        });
    }
    if let Some(w) = &filter.workflow {
        terms.push(format!("{}runs.workflow = {}", plus(Walk::Workflow), q.bind(Value::Text(w.clone()))));
    }
    if let Some(ns) = &filter.namespace {
        terms.push(format!("{}runs.namespace = {}", plus(Walk::Namespace), q.bind(Value::Text(ns.clone()))));
    }
    let mut statuses: Vec<&'static str> = filter.statuses.iter().map(|s| s.as_str()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    if !statuses.is_empty() && !by_status {
        let list: Vec<String> = statuses.iter().map(|s| q.bind(Value::Text((*s).to_string()))).collect();
        terms.push(format!("+runs.status IN ({})", list.join(", ")));
    }
    if let Some(t) = filter.created_after {
        terms.push(format!("{created} >= {}", q.bind(Value::Integer(millis_to_sql(t)))));
    }
    if let Some(t) = filter.created_before {
        terms.push(format!("{created} < {}", q.bind(Value::Integer(millis_to_sql(t)))));
    }
    if let Some((t, after_id)) = &after {
        let (t, after_id) =
            (q.bind(Value::Integer(millis_to_sql(*t))), q.bind(Value::Text(after_id.as_str().to_string())));
        terms.push(format!("({created}, {id}) < ({t}, {after_id})"));
    }
    // A workflow with statuses names its index: with a created range or a cursor, SQLite (with
    // no statistics) takes runs_workflow_created's equality and range for as narrow.
    let from = match walk {
        Walk::Tag => "run_tags CROSS JOIN runs ON runs.id = run_tags.run_id",
        Walk::WorkflowStatus => "runs INDEXED BY runs_workflow_status_created",
        _ => "runs",
    };
    let select = |extra: Option<String>| {
        let all: Vec<&str> = extra.iter().map(String::as_str).chain(terms.iter().map(String::as_str)).collect();
        let wher = if all.is_empty() { String::new() } else { format!(" WHERE {}", all.join(" AND ")) };
        format!("SELECT {RUN_COLS_QUALIFIED} FROM {from}{wher}")
    };
    let arms: Vec<String> = if by_status {
        statuses
            .iter()
            .map(|s| {
                let st = q.bind(Value::Text((*s).to_string()));
                select(Some(format!("runs.status = {st}")))
            })
            .collect()
    } else {
        vec![select(None)]
    };
    let lim = q.bind(Value::Integer(sql_limit(limit.saturating_add(1))));
    q.text = if arms.len() == 1 {
        format!("{} ORDER BY {created} DESC, {id} DESC LIMIT {lim}", arms[0])
    } else {
        // A compound's ORDER BY names its result columns.
        format!("{} ORDER BY created_at DESC, id DESC LIMIT {lim}", arms.join(" UNION ALL "))
    };
    Ok((q, limit))
}

pub(crate) fn list_runs(conn: &Connection, filter: &RunFilter) -> OpResult<RunPage> {
    let (q, limit) = list_runs_sql(filter)?;
    let mut stmt = conn.prepare_cached(&q.text)?;
    let mut rows = stmt.query(params_from_iter(q.args))?;
    let mut runs = Vec::new();
    while let Some(row) = rows.next()? {
        runs.push(run_from_row(row)?);
    }
    let more = runs.len() > limit;
    runs.truncate(limit);
    let next_cursor = if more { runs.last().map(encode_cursor) } else { None };
    Ok(RunPage { runs, next_cursor })
}

/// The statement of `run_counts`: runs by workflow and status, one aggregate over
/// `runs_workflow_status_created` alone (a covering index in group order: no sort, and the
/// rows themselves, with their payloads, are not read).
pub(crate) const RUN_COUNTS_SQL: &str = "SELECT workflow, status, count(*) FROM runs GROUP BY workflow, status";

pub(crate) fn run_counts(conn: &Connection) -> OpResult<Vec<durable_core::RunCount>> {
    let mut stmt = conn.prepare_cached(RUN_COUNTS_SQL)?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let status: String = row.get(1)?;
        let status = status.parse::<RunStatus>().map_err(|e| corrupt(format!("runs: {e}")))?;
        out.push(durable_core::RunCount { workflow: row.get(0)?, status, count: row.get::<_, i64>(2)? as u64 });
    }
    out.sort_by(|a, b| (&a.workflow, a.status).cmp(&(&b.workflow, b.status)));
    Ok(out)
}

pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Which poller query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// [`Store::pending_runs`](durable_core::Store::pending_runs).
    Pending,
    /// [`Store::due_runs`](durable_core::Store::due_runs).
    Due,
    /// [`Store::orphaned_runs`](durable_core::Store::orphaned_runs).
    Orphaned,
}

/// The expression `runs_orphaned` indexes: when the run's lease stops holding it (-1: it has
/// none). A lease is live while `lease_owner` and `lease_until` are set and `lease_until >= now`,
/// so (as `now >= 0`) there is no live lease exactly when this is `< now`.
const LEASE_FREE_AT: &str = "(CASE WHEN lease_owner IS NULL OR lease_until IS NULL THEN -1 ELSE lease_until END)";

/// The statuses of the runs `runs_due` holds, exactly as its `WHERE` names them (SQLite uses a
/// partial index only for a query that repeats its terms). Equalities, not `IN`: see migration 11.
pub(crate) const DUE_STATUSES: &str = "(status = 'suspended' OR status = 'blocked' OR status = 'pending')";

/// The statement of `pending_runs`, `due_runs` or `orphaned_runs`.
///
/// Each names its partial index (`INDEXED BY`): the status index covers the same rows and,
/// without statistics, SQLite would take it (an equality beats a partial index's order or
/// range), then sort everything of that status. Pending runs without a `wake_at` are walked in
/// claim order (`runs_pending`), due timers and delayed starts (suspended, blocked or pending runs with a
/// `wake_at`) by `wake_at` up to now (`runs_due`), orphans by the end of their lease up to now
/// (`runs_orphaned`, then sorted by `updated_at`: only the orphans are). The status and
/// `wake_at` terms repeat the partial index's own, so SQLite can tell the index holds the rows.
/// The namespace and workflow terms filter what the walk yields. A due scan with
/// `RunQuery::leave_queued_since` reads the `limit` earliest due runs, then drops those left to
/// a fresh unclaimed item of their own (a probe of `run_queue_open` each).
///
/// `None` for a query that matches nothing (a limit of 0, an empty list of workflows): there is
/// nothing to ask.
pub(crate) fn poll_sql(which: Poll, q: &RunQuery) -> Option<Sql> {
    if q.limit == 0 || q.workflows.as_ref().is_some_and(Vec::is_empty) {
        return None;
    }
    let mut sql = Sql::default();
    let now = sql.bind(Value::Integer(millis_to_sql(q.now)));
    // A lease is live when it has an owner and lease_until >= now.
    let no_live_lease = format!("(lease_owner IS NULL OR lease_until IS NULL OR lease_until < {now})");
    let (index, head, order) = match which {
        Poll::Pending => (
            "runs_pending",
            format!("status = 'pending' AND wake_at IS NULL AND {no_live_lease}"),
            "priority DESC, created_at, id",
        ),
        Poll::Due => ("runs_due", format!("{DUE_STATUSES} AND wake_at <= {now} AND {no_live_lease}"), "wake_at, id"),
        Poll::Orphaned => {
            ("runs_orphaned", format!("status = 'running' AND {LEASE_FREE_AT} < {now}"), "updated_at, id")
        }
    };
    // Left to items: the scan's runs are filtered afterwards, in due order (see below).
    let leave = if which == Poll::Due { q.leave_queued_since } else { None };
    let cols = if leave.is_some() { "id, wake_at" } else { "id" };
    let mut text = format!("SELECT {cols} FROM runs INDEXED BY {index} WHERE {head}");
    if let Some(ns) = &q.namespace {
        text.push_str(&format!(" AND namespace = {}", sql.bind(Value::Text(ns.clone()))));
    }
    if let Some(ws) = &q.workflows {
        let pairs: Vec<String> = ws
            .iter()
            .map(|(w, v)| {
                let (w, v) = (sql.bind(Value::Text(w.clone())), sql.bind(Value::Integer(i64::from(*v))));
                format!("(workflow = {w} AND version = {v})")
            })
            .collect();
        text.push_str(&format!(" AND ({})", pairs.join(" OR ")));
    }
    let lim = sql.bind(Value::Integer(sql_limit(q.limit)));
    text.push_str(&format!(" ORDER BY {order} LIMIT {lim}"));
    if let Some(since) = leave {
        // The due runs the scan found, less those left to a fresh unclaimed item of their own
        // (a probe of `run_queue_open` each): dropped, not replaced by runs due later, so a
        // poll reads at most `limit` of them however many wait.
        let since = sql.bind(Value::Integer(millis_to_sql(since)));
        text = format!(
            "SELECT due.id FROM ({text}) AS due WHERE NOT EXISTS (SELECT 1 FROM run_queue \
             WHERE run_queue.run_id = due.id AND run_queue.claimed_by IS NULL \
             AND run_queue.enqueued_at > {since} AND run_queue.enqueued_at <= {now}) \
             ORDER BY due.wake_at, due.id"
        );
    }
    sql.text = text;
    Some(sql)
}

/// `pending_runs`, `due_runs` and `orphaned_runs`: see [`poll_sql`].
pub(crate) fn poll_runs(conn: &Connection, which: Poll, q: &RunQuery) -> OpResult<Vec<RunId>> {
    let Some(sql) = poll_sql(which, q) else { return Ok(Vec::new()) };
    run_ids(conn, sql)
}

/// Runs a statement whose rows are one run id each.
fn run_ids(conn: &Connection, sql: Sql) -> OpResult<Vec<RunId>> {
    let mut stmt = conn.prepare_cached(&sql.text)?;
    let mut rows = stmt.query(params_from_iter(sql.args))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(RunId::new(text(row, 0)?));
    }
    Ok(out)
}

/// The statement of `claim_due_runs`: `due_runs`'s own ([`poll_sql`], walking `runs_due`) as
/// the set of ids an `UPDATE` moves to `until`, found by the primary key, `RETURNING` them. Run
/// by the writer, inside its `BEGIN IMMEDIATE` transaction, so the select and the update are
/// one write: another handle's claim (another process) waits for the file's write lock and
/// then sees the moved `wake_at`s.
///
/// `None` for a query that matches nothing.
pub(crate) fn claim_due_sql(q: &RunQuery, until: Millis) -> Option<Sql> {
    let mut sql = poll_sql(Poll::Due, q)?;
    let until = sql.bind(Value::Integer(millis_to_sql(until)));
    sql.text = format!("UPDATE runs SET wake_at = {until} WHERE id IN ({}) RETURNING id", sql.text);
    Some(sql)
}

/// `claim_due_runs`: see [`claim_due_sql`].
pub(crate) fn claim_due_runs(conn: &Connection, q: &RunQuery, until: Millis) -> OpResult<Vec<RunId>> {
    let Some(sql) = claim_due_sql(q, until) else { return Ok(Vec::new()) };
    run_ids(conn, sql)
}

/// Which due scan of the schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// [`Store::due_schedules`](durable_core::Store::due_schedules).
    Schedules,
    /// [`Store::due_buffers`](durable_core::Store::due_buffers).
    Buffers,
}

/// The statement of `due_schedules` or `due_buffers`: the `body` (and, for a schedule, the
/// `revision`) of each due row.
///
/// Each walks its due index up to now (`schedules_due`, partial: a schedule without a `due_at`
/// is not in it; `trigger_buffers_due`), in the order the contract asks for, so it reads about
/// as many entries as are due; the namespace and workflow terms filter what the walk yields.
/// `INDEXED BY`, as in [`poll_sql`]: an equality on the workflow would otherwise draw SQLite to
/// the primary key of the buffers and a sort.
///
/// `None` for a query that matches nothing (a limit of 0, an empty list of workflows).
pub(crate) fn due_sql(which: Due, q: &DueQuery) -> Option<Sql> {
    if q.limit == 0 || q.workflows.as_ref().is_some_and(Vec::is_empty) {
        return None;
    }
    let mut sql = Sql::default();
    let now = sql.bind(Value::Integer(millis_to_sql(q.now)));
    let (cols, table, index, order) = match which {
        Due::Schedules => ("body, revision", "schedules", "schedules_due", "due_at, key"),
        Due::Buffers => ("body", "trigger_buffers", "trigger_buffers_due", "due_at, workflow, key"),
    };
    let mut text = format!("SELECT {cols} FROM {table} INDEXED BY {index} WHERE due_at <= {now}");
    if let Some(ns) = &q.namespace {
        text.push_str(&format!(" AND namespace = {}", sql.bind(Value::Text(ns.clone()))));
    }
    if let Some(ws) = &q.workflows {
        let list: Vec<String> = ws.iter().map(|w| sql.bind(Value::Text(w.clone()))).collect();
        text.push_str(&format!(" AND workflow IN ({})", list.join(", ")));
    }
    let lim = sql.bind(Value::Integer(sql_limit(q.limit)));
    text.push_str(&format!(" ORDER BY {order} LIMIT {lim}"));
    sql.text = text;
    Some(sql)
}

/// The statement of `list_schedules`: by key from the primary key, or, in one namespace, from
/// `schedules_namespace`; `None` for a limit of 0.
pub(crate) fn list_schedules_sql(namespace: Option<&str>, after: Option<&str>, limit: usize) -> Option<Sql> {
    if limit == 0 {
        return None;
    }
    let mut sql = Sql::default();
    let mut terms = Vec::new();
    if let Some(ns) = namespace {
        terms.push(format!("namespace = {}", sql.bind(Value::Text(ns.to_string()))));
    }
    if let Some(after) = after {
        terms.push(format!("key > {}", sql.bind(Value::Text(after.to_string()))));
    }
    let wher = if terms.is_empty() { String::new() } else { format!(" WHERE {}", terms.join(" AND ")) };
    let lim = sql.bind(Value::Integer(sql_limit(limit)));
    sql.text = format!("SELECT body, revision FROM schedules{wher} ORDER BY key LIMIT {lim}");
    Some(sql)
}

fn schedule_from_row(row: &Row<'_>) -> OpResult<ScheduleRecord> {
    let mut record: ScheduleRecord =
        serde_json::from_str(text(row, 0)?).map_err(|e| corrupt(format!("a stored schedule does not decode: {e}")))?;
    let revision: i64 = row.get(1)?;
    record.revision = u64::try_from(revision)
        .map_err(|_| corrupt(format!("schedule {:?}: negative revision {revision}", record.key)))?;
    Ok(record)
}

fn buffer_from_row(row: &Row<'_>) -> OpResult<TriggerBuffer> {
    serde_json::from_str(text(row, 0)?).map_err(|e| corrupt(format!("a stored trigger buffer does not decode: {e}")))
}

/// `due_schedules`: see [`due_sql`].
pub(crate) fn due_schedules(conn: &Connection, q: &DueQuery) -> OpResult<Vec<ScheduleRecord>> {
    query_rows(conn, due_sql(Due::Schedules, q), schedule_from_row)
}

/// `due_buffers`: see [`due_sql`].
pub(crate) fn due_buffers(conn: &Connection, q: &DueQuery) -> OpResult<Vec<TriggerBuffer>> {
    query_rows(conn, due_sql(Due::Buffers, q), buffer_from_row)
}

/// The rows of a built query, decoded (none when there is no query: a limit of 0).
pub(crate) fn query_rows<T>(
    conn: &Connection,
    sql: Option<Sql>,
    decode: fn(&Row<'_>) -> OpResult<T>,
) -> OpResult<Vec<T>> {
    let Some(sql) = sql else { return Ok(Vec::new()) };
    let mut stmt = conn.prepare_cached(&sql.text)?;
    let mut rows = stmt.query(params_from_iter(sql.args))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(row)?);
    }
    Ok(out)
}

pub(crate) fn get_schedule(conn: &Connection, key: &str) -> OpResult<Option<ScheduleRecord>> {
    let mut stmt = conn.prepare_cached("SELECT body, revision FROM schedules WHERE key = ?1")?;
    let mut rows = stmt.query([key])?;
    match rows.next()? {
        Some(row) => schedule_from_row(row).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn list_schedules(
    conn: &Connection,
    namespace: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> OpResult<Vec<ScheduleRecord>> {
    query_rows(conn, list_schedules_sql(namespace, after, limit), schedule_from_row)
}

pub(crate) fn waiters(conn: &Connection, id: &RunId) -> OpResult<Vec<Waiter>> {
    let mut stmt = conn.prepare_cached(RUN_WAITERS)?;
    let mut rows = stmt.query([id.as_str()])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(waiter_from_row(row)?);
    }
    Ok(out)
}

pub(crate) fn get_state(conn: &Connection, id: &RunId, key: &str) -> OpResult<Option<Payload>> {
    let mut stmt = conn.prepare_cached("SELECT value FROM run_state WHERE run_id = ?1 AND key = ?2")?;
    let mut rows = stmt.query([id.as_str(), key])?;
    match rows.next()? {
        Some(row) => Ok(Some(Payload::from_trusted(text(row, 0)?))),
        None => Ok(None),
    }
}

/// The table and key column of a kind of buffered delivery.
fn buffer_table(kind: BufferedKind) -> (&'static str, &'static str) {
    match kind {
        BufferedKind::Signal => ("buffered_signals", "token"),
        BufferedKind::Event => ("buffered_events", "name"),
    }
}

/// `Store::buffered`: a `GROUP BY` of each kind's table (walking the key's index), in key order.
pub(crate) fn buffered(conn: &Connection, query: &BufferedQuery) -> OpResult<Vec<BufferedDeliveries>> {
    let mut out = Vec::new();
    for kind in [BufferedKind::Signal, BufferedKind::Event] {
        if query.kind.is_some_and(|k| k != kind) || out.len() >= query.limit {
            continue;
        }
        let (table, key) = buffer_table(kind);
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {key}, COUNT(*), MIN(created_at), MAX(created_at) FROM {table} \
             WHERE ?1 IS NULL OR substr({key}, 1, length(?1)) = ?1 GROUP BY {key} \
             HAVING ?2 IS NULL OR MIN(created_at) < ?2 ORDER BY {key} LIMIT ?3"
        ))?;
        let limit = i64::try_from(query.limit - out.len()).unwrap_or(i64::MAX);
        let before = query.oldest_before.map(millis_to_sql);
        let mut rows = stmt.query(params![query.prefix, before, limit])?;
        while let Some(row) = rows.next()? {
            let key = text(row, 0)?.to_string();
            let what = || format!("buffered {kind}s of {key:?}");
            out.push(BufferedDeliveries {
                kind,
                count: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                oldest_at: millis_from_sql(row.get(2)?, what)?,
                newest_at: millis_from_sql(row.get(3)?, what)?,
                key,
            });
        }
    }
    Ok(out)
}

/// `Store::purge_buffered`: one `DELETE` on the key's index.
pub(crate) fn purge_buffered(conn: &Connection, purge: &BufferedPurge) -> OpResult<u64> {
    let (table, key) = buffer_table(purge.kind);
    let mut stmt =
        conn.prepare_cached(&format!("DELETE FROM {table} WHERE {key} = ?1 AND (?2 IS NULL OR created_at < ?2)"))?;
    let deleted = stmt.execute(params![purge.key, purge.buffered_before.map(millis_to_sql)])?;
    Ok(deleted as u64)
}

// ---- writes -------------------------------------------------------------------------------

/// Inserts the run unless its id exists; returns the existing run then. A delayed start
/// (`start_at`) is stored `pending` with `wake_at = start_at`.
fn create(conn: &Connection, new: &NewRun) -> OpResult<Option<Run>> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO runs (id, workflow, version, namespace, status, input, tags, priority, parent_id, parent_seq, \
         created_at, updated_at, wake_at, trace_context) \
         VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?12) \
         ON CONFLICT (id) DO NOTHING",
    )?;
    let inserted = stmt.execute(params![
        new.id.as_str(),
        new.workflow,
        new.version,
        new.namespace,
        new.input.as_str(),
        tags_json(&new.tags)?,
        new.priority,
        new.parent.as_ref().map(|p| p.run_id.as_str()),
        new.parent.as_ref().map(|p| p.seq),
        millis_to_sql(new.created_at),
        new.start_at.map(millis_to_sql),
        new.trace_context,
    ])?;
    if inserted == 0 {
        return get_run(conn, &new.id)?
            .map(Some)
            .ok_or_else(|| corrupt(format!("run {}: insert conflicted but the run is missing", new.id)));
    }
    if !new.tags.is_empty() {
        let mut tag =
            conn.prepare_cached("INSERT OR IGNORE INTO run_tags (run_id, tag, created_at) VALUES (?1, ?2, ?3)")?;
        for t in &new.tags {
            tag.execute(params![new.id.as_str(), t.as_str(), millis_to_sql(new.created_at)])?;
        }
    }
    Ok(None)
}

/// Creates a run no caller is there to refuse (a commit's child, a schedule's start): with a
/// concurrency key it waits for its slot however many wait ([`NewRun::never_refused`]).
fn create_never_refused(conn: &Connection, new: &NewRun) -> OpResult<()> {
    match new.admission {
        None => create(conn, new).map(drop),
        Some(_) => admission::create_run(conn, new.clone().never_refused()).map(drop),
    }
}

pub(crate) fn create_run(conn: &Connection, new: NewRun) -> OpResult<CreateRun> {
    Ok(match create(conn, &new)? {
        Some(existing) => CreateRun::Existing(existing),
        None => CreateRun::Created(new.into_run()),
    })
}

fn lease_is_live(run: &Run, now: Millis) -> bool {
    run.lease_owner.is_some() && run.lease_until.is_some_and(|until| until >= now)
}

pub(crate) fn claim_run(conn: &Connection, claim: Claim) -> OpResult<ClaimOutcome> {
    claim_run_from(conn, claim, 0)
}

/// [`claim_run`] whose answer holds the checkpoints from `from_seq` on only
/// ([`Store::claim_run_from`](durable_core::Store::claim_run_from)).
pub(crate) fn claim_run_from(conn: &Connection, claim: Claim, from_seq: u32) -> OpResult<ClaimOutcome> {
    let Some(run) = get_run(conn, &claim.run_id)? else {
        return Ok(ClaimOutcome::NotFound);
    };
    if run.status.is_terminal() {
        return Ok(ClaimOutcome::Terminal(run));
    }
    // A run waiting for its concurrency key runs once a release hands it the slot.
    if run.status == RunStatus::Pending && run.wake_at == Some(protocol::GATED) {
        return Ok(ClaimOutcome::Busy(run));
    }
    let held_by_other = run.lease_owner.as_deref().is_some_and(|o| o != claim.owner);
    if held_by_other && lease_is_live(&run, claim.now) {
        return Ok(ClaimOutcome::Busy(run));
    }
    let recovered = run.status == RunStatus::Running && held_by_other;
    acquire(conn, run, claim, from_seq, recovered, false)
}

/// Takes `run` (found claimable by the caller) for `claim`: reads its checkpoints from
/// `from_seq` on, then one `UPDATE` makes it `running` under the claim's lease and counts the
/// claim (and the recovery, if it takes the run over from an expired lease; a stale `blocked`
/// error is dropped: [`Run::claim_clears_error`]). `woken`: the same `UPDATE` wakes it, as a
/// hand-off wakes a run waiting for its key (`wake_at` now, one more `wake_gen`).
fn acquire(
    conn: &Connection,
    mut run: Run,
    claim: Claim,
    from_seq: u32,
    recovered: bool,
    woken: bool,
) -> OpResult<ClaimOutcome> {
    // Read before the write: a history that fails to load (a corrupt row) fails the claim
    // before it changed anything, so the writer need not undo it.
    let history = history_from(conn, &claim.run_id, from_seq)?;
    let clear_error = run.claim_clears_error();
    conn.prepare_cached(
        "UPDATE runs SET status = 'running', lease_owner = ?2, lease_until = ?3, updated_at = ?4, \
         recovery_attempts = recovery_attempts + ?5, claims = claims + 1, \
         wake_at = CASE WHEN ?6 THEN ?4 ELSE wake_at END, wake_gen = wake_gen + ?6, \
         error = CASE WHEN ?7 THEN NULL ELSE error END WHERE id = ?1",
    )?
    .execute(params![
        claim.run_id.as_str(),
        claim.owner,
        millis_to_sql(claim.lease_until),
        millis_to_sql(claim.now),
        i64::from(recovered),
        i64::from(woken),
        clear_error,
    ])?;
    if clear_error {
        run.error = None;
    }
    let previous = run.status;
    if recovered {
        run.recovery_attempts += 1;
    }
    if woken {
        run.wake_at = Some(claim.now);
        run.wake_gen += 1;
    }
    run.status = RunStatus::Running;
    run.lease_owner = Some(claim.owner);
    run.lease_until = Some(claim.lease_until);
    run.updated_at = claim.now;
    run.claims += 1;
    Ok(ClaimOutcome::Acquired { run, history, previous, recovered })
}

pub(crate) fn renew_lease(conn: &Connection, id: &RunId, owner: &str, lease_until: Millis) -> OpResult<bool> {
    let mut stmt = conn.prepare_cached("UPDATE runs SET lease_until = ?3 WHERE id = ?1 AND lease_owner = ?2")?;
    let renewed = stmt.execute(params![id.as_str(), owner, millis_to_sql(lease_until)])? > 0;
    if renewed {
        // A step's slot lives as long as its run's lease.
        admission::renew(conn, id.as_str(), lease_until)?;
    }
    Ok(renewed)
}

pub(crate) fn release_lease(conn: &Connection, id: &RunId, owner: &str) -> OpResult<bool> {
    let mut stmt = conn
        .prepare_cached("UPDATE runs SET lease_owner = NULL, lease_until = NULL WHERE id = ?1 AND lease_owner = ?2")?;
    Ok(stmt.execute(params![id.as_str(), owner])? > 0)
}

fn check_transition(id: &RunId, from: RunStatus, next: RunStatus) -> OpResult<()> {
    if from == next || from.can_become(next) {
        Ok(())
    } else {
        Err(StoreError::Conflict { message: format!("run {id}: status {from} cannot become {next}") }.into())
    }
}

fn upsert_checkpoint(conn: &Connection, run_id: &RunId, cp: &Checkpoint) -> OpResult<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO checkpoints (run_id, seq, name, kind, status, input, output, error, attempts, wake_at, \
         started_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
         ON CONFLICT (run_id, seq) DO UPDATE SET name = excluded.name, kind = excluded.kind, \
         status = excluded.status, input = excluded.input, output = excluded.output, error = excluded.error, \
         attempts = excluded.attempts, wake_at = excluded.wake_at, started_at = excluded.started_at, \
         updated_at = excluded.updated_at",
    )?;
    stmt.execute(params![
        run_id.as_str(),
        cp.seq,
        cp.name,
        cp.kind.as_str(),
        cp.status.as_str(),
        opt_payload_str(&cp.input),
        opt_payload_str(&cp.output),
        opt_error_json(&cp.error)?,
        cp.attempts,
        cp.wake_at.map(millis_to_sql),
        millis_to_sql(cp.started_at),
        millis_to_sql(cp.updated_at),
    ])?;
    Ok(())
}

/// Records a delivered payload as the `completed` checkpoint at the waiter's seq and wakes its
/// run ([`wake`]).
fn resolve(
    conn: &Connection,
    run_id: &str,
    seq: i64,
    name: &str,
    kind: StepKind,
    payload: &str,
    now: i64,
) -> OpResult<()> {
    let mut cp = conn.prepare_cached(
        "INSERT INTO checkpoints (run_id, seq, name, kind, status, output, attempts, started_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 'completed', ?5, 0, ?6, ?6) \
         ON CONFLICT (run_id, seq) DO UPDATE SET status = 'completed', output = excluded.output, \
         updated_at = excluded.updated_at",
    )?;
    cp.execute(params![run_id, seq, name, kind.as_str(), payload, now])?;
    wake(conn, run_id, now)
}

/// Wakes a run as a delivery does: `wake_gen + 1` (a turn in progress sees it when it tries to
/// suspend) and a parked run (`suspended` or `blocked`) due now.
pub(crate) fn wake(conn: &Connection, run_id: &str, now: i64) -> OpResult<()> {
    let mut run = conn.prepare_cached(
        "UPDATE runs SET wake_gen = wake_gen + 1, \
         wake_at = CASE WHEN status IN ('suspended', 'blocked') THEN MIN(COALESCE(wake_at, ?2), ?2) ELSE wake_at END, \
         updated_at = ?2 WHERE id = ?1",
    )?;
    run.execute(params![run_id, now])?;
    Ok(())
}

pub(crate) fn seq_of(v: i64) -> OpResult<u32> {
    u32_from_sql(v, || "waiter seq".to_string())
}

/// [`send_signal`], then [`claim_run_from`] if the signal woke `claim.run_id`
/// ([`Store::send_signal_and_claim`](durable_core::Store::send_signal_and_claim)).
pub(crate) fn send_signal_and_claim(
    conn: &Connection,
    token: &str,
    payload: &str,
    claim: Claim,
    from_seq: u32,
) -> OpResult<(Delivery, Option<ClaimOutcome>)> {
    let delivery = send_signal(conn, token, payload, claim.now)?;
    if !delivery.is_to(&claim.run_id) {
        return Ok((delivery, None));
    }
    Ok((delivery, Some(claim_run_from(conn, claim, from_seq)?)))
}

pub(crate) fn send_signal(conn: &Connection, token: &str, payload: &str, now: Millis) -> OpResult<Delivery> {
    let now = millis_to_sql(now);
    let waiter = conn
        .prepare_cached(
            "SELECT wid, run_id, seq, name FROM waiters WHERE kind = 'signal' AND key = ?1 ORDER BY wid LIMIT 1",
        )?
        .query_row([token], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, String>(3)?))
        })
        .optional()?;
    if let Some((wid, run_id, seq, name)) = waiter {
        conn.prepare_cached("DELETE FROM waiters WHERE wid = ?1")?.execute([wid])?;
        resolve(conn, &run_id, seq, &name, StepKind::Signal, payload, now)?;
        return Ok(Delivery::Delivered { run_id: RunId::new(run_id), seq: seq_of(seq)? });
    }
    if let Some(parent) = protocol::child_token_parent(token) {
        // A child's result for a parent no wait of which can ever take it is dropped.
        let status: Option<String> = conn
            .prepare_cached("SELECT status FROM runs WHERE id = ?1")?
            .query_row([parent], |r| r.get(0))
            .optional()?;
        let live = status.is_some_and(|s| s.parse::<RunStatus>().is_ok_and(|s| !s.is_final()));
        if !live {
            return Ok(Delivery::Buffered);
        }
    }
    conn.prepare_cached("INSERT INTO buffered_signals (token, payload, created_at) VALUES (?1, ?2, ?3)")?
        .execute(params![token, payload, now])?;
    Ok(Delivery::Buffered)
}

/// Deletes the buffered results of `parent`'s children ([`protocol::child_token`]s): the
/// tokens `child:<parent>:<digits>`, found by their prefix in the token index.
fn purge_child_results(conn: &Connection, parent: &str) -> OpResult<()> {
    let prefix = format!("child:{parent}:");
    // Every token with the prefix sorts from it up to the prefix with its last byte (`:`)
    // raised by one (`;`).
    let end = format!("child:{parent};");
    let mut stmt = conn.prepare_cached("SELECT id, token FROM buffered_signals WHERE token >= ?1 AND token < ?2")?;
    let doomed: Vec<i64> = stmt
        .query_map([&prefix, &end], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?
        .filter_map(|row| match row {
            Ok((id, token)) => (protocol::child_token_parent(&token) == Some(parent)).then_some(Ok(id)),
            Err(e) => Some(Err(e)),
        })
        .collect::<rusqlite::Result<_>>()?;
    let mut delete = conn.prepare_cached("DELETE FROM buffered_signals WHERE id = ?1")?;
    for id in doomed {
        delete.execute([id])?;
    }
    Ok(())
}

/// Delivers an event to every waiter on `name` whose matcher accepts it, or, if none does,
/// buffers it for the first later wait that matches.
fn deliver_event(conn: &Connection, name: &str, payload: &str, now: i64) -> OpResult<Vec<Delivery>> {
    let value: serde_json::Value = serde_json::from_str(payload).unwrap_or(serde_json::Value::Null);
    let mut accepted = Vec::new();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT wid, run_id, seq, name, matcher FROM waiters WHERE kind = 'event' AND key = ?1 ORDER BY wid",
        )?;
        let mut rows = stmt.query([name])?;
        while let Some(row) = rows.next()? {
            let matcher: serde_json::Value =
                opt_text(row, 4)?.and_then(|m| serde_json::from_str(m).ok()).unwrap_or(serde_json::Value::Null);
            if json_subset(&matcher, &value) {
                accepted.push((
                    row.get::<_, i64>(0)?,
                    text(row, 1)?.to_string(),
                    row.get::<_, i64>(2)?,
                    text(row, 3)?.to_string(),
                ));
            }
        }
    }
    let mut delivered = Vec::with_capacity(accepted.len());
    for (wid, run_id, seq, wname) in accepted {
        conn.prepare_cached("DELETE FROM waiters WHERE wid = ?1")?.execute([wid])?;
        resolve(conn, &run_id, seq, &wname, StepKind::Event, payload, now)?;
        delivered.push(Delivery::Delivered { run_id: RunId::new(run_id), seq: seq_of(seq)? });
    }
    if delivered.is_empty() {
        conn.prepare_cached("INSERT INTO buffered_events (name, payload, created_at) VALUES (?1, ?2, ?3)")?
            .execute(params![name, payload, now])?;
    }
    Ok(delivered)
}

/// How many expired dedupe ids a publish with a dedupe id forgets, at most: the table stays
/// about as large as the ids still remembered, and no publish pays for a backlog at once.
const DEDUPE_PRUNE: i64 = 64;

/// `publish`, in the caller's write: the dedupe check, the delivery, the trigger runs and the
/// gathering buffers, all or nothing.
pub(crate) fn publish(conn: &Connection, event: Publish) -> OpResult<Published> {
    let now = millis_to_sql(event.now);
    if let Some(d) = &event.dedupe {
        // Remembered and not expired: the upsert changes nothing, and it is a duplicate.
        let recorded = conn
            .prepare_cached(
                "INSERT INTO event_dedupe (name, id, keep_until) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name, id) DO UPDATE SET keep_until = excluded.keep_until \
                 WHERE event_dedupe.keep_until < ?4",
            )?
            .execute(params![event.name, d.id, millis_to_sql(d.keep_until), now])?;
        if recorded == 0 {
            return Ok(Published::Duplicate);
        }
        conn.prepare_cached(
            "DELETE FROM event_dedupe WHERE (name, id) IN \
             (SELECT name, id FROM event_dedupe WHERE keep_until < ?1 ORDER BY keep_until LIMIT ?2)",
        )?
        .execute(params![now, DEDUPE_PRUNE])?;
    }
    let deliveries = deliver_event(conn, &event.name, event.payload.as_str(), now)?;
    let mut started = Vec::with_capacity(event.start.len());
    for run in event.start {
        started.push(admission::create_run(conn, run.never_refused())?);
    }
    for append in &event.gather {
        let open = conn
            .prepare_cached("SELECT body FROM trigger_buffers WHERE workflow = ?1 AND key = ?2")?
            .query_row([append.workflow.as_str(), append.key.as_str()], |r| r.get::<_, String>(0))
            .optional()?
            .map(|body| {
                serde_json::from_str::<TriggerBuffer>(&body)
                    .map_err(|e| corrupt(format!("trigger buffer of {:?} key {:?}: {e}", append.workflow, append.key)))
            })
            .transpose()?;
        let was_open = open.is_some();
        match TriggerBuffer::gather(open, append, event.payload.clone(), event.now) {
            Gathered::Keep(buffer) => store_buffer(conn, &buffer)?,
            Gathered::Start(run) => {
                if was_open {
                    conn.prepare_cached("DELETE FROM trigger_buffers WHERE workflow = ?1 AND key = ?2")?
                        .execute([append.workflow.as_str(), append.key.as_str()])?;
                }
                started.push(admission::create_run(conn, run.never_refused())?);
            }
        }
    }
    Ok(Published::Done { deliveries, started })
}

/// Creates or replaces the open buffer of `(workflow, key)`.
fn store_buffer(conn: &Connection, buffer: &TriggerBuffer) -> OpResult<()> {
    let body = serde_json::to_string(buffer).map_err(|e| OpError::Store(StoreError::backend(e)))?;
    conn.prepare_cached(
        "INSERT INTO trigger_buffers (workflow, key, namespace, batch_id, due_at, body) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (workflow, key) DO UPDATE SET namespace = excluded.namespace, batch_id = excluded.batch_id, \
         due_at = excluded.due_at, body = excluded.body",
    )?
    .execute(params![
        buffer.workflow,
        buffer.key,
        buffer.run.namespace,
        buffer.batch_id,
        millis_to_sql(buffer.due_at),
        body
    ])?;
    Ok(())
}

/// `flush_buffer`: deletes the open buffer of `(workflow, key)` if it is still `batch_id`'s and
/// due at `now`, and creates its run, in the caller's write.
pub(crate) fn flush_buffer(
    conn: &Connection,
    workflow: &str,
    key: &str,
    batch_id: &str,
    now: Millis,
    admission: Option<durable_core::admission::SlotRequest>,
) -> OpResult<Option<CreateRun>> {
    let body = conn
        .prepare_cached(
            "DELETE FROM trigger_buffers WHERE workflow = ?1 AND key = ?2 AND batch_id = ?3 AND due_at <= ?4 \
             RETURNING body",
        )?
        .query_row(params![workflow, key, batch_id, millis_to_sql(now)], |r| r.get::<_, String>(0))
        .optional()?;
    let Some(body) = body else { return Ok(None) };
    let buffer: TriggerBuffer =
        serde_json::from_str(&body).map_err(|e| corrupt(format!("trigger buffer of {workflow:?} key {key:?}: {e}")))?;
    let run = NewRun { admission, ..buffer.into_run(now) };
    admission::create_run(conn, run.never_refused()).map(Some)
}

/// `save_schedule`: compare-and-set on the stored revision, then the record and the runs of
/// `start`; a stale save writes nothing.
pub(crate) fn save_schedule(conn: &Connection, save: SaveSchedule) -> OpResult<SaveOutcome> {
    // The compare-and-set needs the stored revision only (and the indexed columns, to leave
    // their index alone when they stay): the record is read, and its body decoded, only for a
    // stale save, which returns it.
    let stored: Option<(i64, String, String)> = conn
        .prepare_cached("SELECT revision, namespace, workflow FROM schedules WHERE key = ?1")?
        .query_row([&save.record.key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let revision = stored
        .as_ref()
        .map(|(r, _, _)| {
            u64::try_from(*r).map_err(|_| corrupt(format!("schedule {:?}: negative revision {r}", save.record.key)))
        })
        .transpose()?;
    if revision != save.expected {
        return Ok(SaveOutcome::Stale(get_schedule(conn, &save.record.key)?.map(Box::new)));
    }
    let mut record = save.record;
    record.revision = save.expected.map_or(1, |r| r + 1);
    let revision = i64::try_from(record.revision)
        .map_err(|_| StoreError::Conflict { message: format!("schedule {:?}: revision overflow", record.key) })?;
    let body = serde_json::to_string(&record).map_err(|e| OpError::Store(StoreError::backend(e)))?;
    let due_at = record.due_at.map(millis_to_sql);
    match stored {
        // A fire or a change of definition in place: namespace and workflow stay.
        Some((_, namespace, workflow)) if namespace == record.namespace && workflow == record.workflow => {
            conn.prepare_cached("UPDATE schedules SET due_at = ?2, revision = ?3, body = ?4 WHERE key = ?1")?
                .execute(params![record.key, due_at, revision, body])?;
        }
        _ => {
            conn.prepare_cached(
                "INSERT INTO schedules (key, namespace, workflow, due_at, revision, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (key) DO UPDATE SET namespace = excluded.namespace, \
                 workflow = excluded.workflow, due_at = excluded.due_at, revision = excluded.revision, \
                 body = excluded.body",
            )?
            .execute(params![record.key, record.namespace, record.workflow, due_at, revision, body])?;
        }
    }
    for run in &save.start {
        create_never_refused(conn, run)?;
    }
    Ok(SaveOutcome::Saved(record.revision))
}

pub(crate) fn delete_schedule(conn: &Connection, key: &str) -> OpResult<bool> {
    Ok(conn.prepare_cached("DELETE FROM schedules WHERE key = ?1")?.execute([key])? > 0)
}

/// Registers a wait, unless a buffered delivery satisfies it: then that delivery is consumed
/// and resolves the wait at once.
fn register_wait(conn: &Connection, w: &Waiter, now: i64) -> OpResult<()> {
    let run_id = w.run_id.as_str();
    let seq = i64::from(w.seq);
    let (kind, key, matcher) = match &w.kind {
        WaitKind::Signal { token } => {
            let buffered = conn
                .prepare_cached("SELECT id, payload FROM buffered_signals WHERE token = ?1 ORDER BY id LIMIT 1")?
                .query_row([token], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                .optional()?;
            if let Some((id, payload)) = buffered {
                conn.prepare_cached("DELETE FROM buffered_signals WHERE id = ?1")?.execute([id])?;
                return resolve(conn, run_id, seq, &w.name, StepKind::Signal, &payload, now);
            }
            ("signal", token, None)
        }
        WaitKind::Event { name, matcher } => {
            let m = matcher.to_value();
            let mut found = None;
            {
                let mut stmt =
                    conn.prepare_cached("SELECT id, payload FROM buffered_events WHERE name = ?1 ORDER BY id")?;
                let mut rows = stmt.query([name])?;
                while let Some(row) = rows.next()? {
                    let p = text(row, 1)?;
                    let v: serde_json::Value = serde_json::from_str(p).unwrap_or(serde_json::Value::Null);
                    if json_subset(&m, &v) {
                        found = Some((row.get::<_, i64>(0)?, p.to_string()));
                        break;
                    }
                }
            }
            if let Some((id, payload)) = found {
                conn.prepare_cached("DELETE FROM buffered_events WHERE id = ?1")?.execute([id])?;
                return resolve(conn, run_id, seq, &w.name, StepKind::Event, &payload, now);
            }
            ("event", name, Some(matcher.as_str()))
        }
    };
    // Replaces an earlier registration at the same seq (a re-suspension re-registers); the new
    // row gets a new wid, so it queues behind the waiters registered before it.
    conn.prepare_cached(
        "INSERT OR REPLACE INTO waiters (run_id, seq, name, kind, key, matcher, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![run_id, seq, w.name, kind, key, matcher, millis_to_sql(w.created_at)])?;
    Ok(())
}

pub(crate) fn commit(conn: &Connection, c: Commit) -> OpResult<CommitOutcome> {
    Ok(commit_claiming(conn, c, None)?.0)
}

/// [`commit`], then the claim of the first run it handed a slot to, for the committing owner
/// and until `lease_until` ([`Store::commit_and_claim_handed`](durable_core::Store::commit_and_claim_handed)).
/// A claim that fails on a row that does not decode leaves the commit standing: every claim
/// reads before it writes, so it changed nothing, and the run is woken as any hand-off wakes
/// it. An SQL error fails the whole write.
pub(crate) fn commit_and_claim_handed(
    conn: &Connection,
    c: Commit,
    lease_until: Millis,
) -> OpResult<(CommitOutcome, Option<ClaimOutcome>)> {
    commit_claiming(conn, c, Some(lease_until))
}

/// The claim of a run a release has just handed its concurrency key to (`pending`, waiting
/// for its key: `wake_at = GATED`): its wake (as [`admission::wake_handed`] wakes it) and its
/// claim (as [`claim_run`] claims it) in one `UPDATE` of its row. `None`: the run is not such a
/// run (a step's slot handed to a suspended run), and is woken and claimed as usual.
fn claim_gated(conn: &Connection, claim: Claim) -> OpResult<Option<ClaimOutcome>> {
    let Some(run) = get_run(conn, &claim.run_id)? else { return Ok(None) };
    let held_by_other = run.lease_owner.as_deref().is_some_and(|o| o != claim.owner) && lease_is_live(&run, claim.now);
    if run.status != RunStatus::Pending || run.wake_at != Some(protocol::GATED) || held_by_other {
        return Ok(None);
    }
    acquire(conn, run, claim, 0, false, true).map(Some)
}

/// [`commit`], and with `claim_lease` the claim of [`commit_and_claim_handed`].
fn commit_claiming(
    conn: &Connection,
    c: Commit,
    claim_lease: Option<Millis>,
) -> OpResult<(CommitOutcome, Option<ClaimOutcome>)> {
    let row = conn
        .prepare_cached("SELECT status, lease_owner FROM runs WHERE id = ?1")?
        .query_row([c.run_id.as_str()], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))
        .optional()?;
    let Some((status, owner)) = row else {
        return Err(StoreError::NotFound { what: format!("run {}", c.run_id) }.into());
    };
    if owner.as_deref() != Some(c.owner.as_str()) {
        return Err(StoreError::LeaseLost { run_id: c.run_id, owner: c.owner }.into());
    }
    let status = run_status(&status, &c.run_id)?;
    if let Some(TurnEnd::Settle { status: next, .. }) = &c.end
        && status == RunStatus::Running
    {
        check_transition(&c.run_id, status, *next)?;
    }
    let now = millis_to_sql(c.now);
    let id = c.run_id.as_str();
    let mut out = CommitOutcome::default();
    // Expired waits first: a wait whose waiter a delivery already took keeps the delivery.
    if !c.expire_waits.is_empty() {
        let mut del = conn.prepare_cached("DELETE FROM waiters WHERE run_id = ?1 AND seq = ?2")?;
        for seq in &c.expire_waits {
            if del.execute(params![id, seq])? == 0 {
                out.raced.push(*seq);
            }
        }
    }
    for cp in &c.checkpoints {
        if !out.raced.contains(&cp.seq) {
            upsert_checkpoint(conn, &c.run_id, cp)?;
        }
    }
    for w in &c.waits {
        register_wait(conn, w, now)?;
    }
    if !c.state.is_empty() {
        let mut st = conn.prepare_cached(
            "INSERT INTO run_state (run_id, key, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
        )?;
        for (k, v) in &c.state {
            st.execute(params![id, k, v.as_str()])?;
        }
    }
    for child in &c.children {
        create_never_refused(conn, child)?;
    }
    for sig in &c.signals {
        out.deliveries.push(send_signal(conn, &sig.token, sig.payload.as_str(), c.now)?);
    }
    for task in &c.tasks {
        crate::tasks::dispatch(conn, task)?;
    }
    // Released slots are handed on in this transaction; the runs they go to are woken after
    // the turn end is applied (as the memory store does), so a hand-off to this very run does
    // not keep it from suspending: it is suspended, then woken.
    let mut handed = Vec::new();
    for (gate, holder) in &c.release_slots {
        admission::release(conn, gate, holder, c.now, &mut handed)?;
    }
    let running = status == RunStatus::Running;
    // Progress of a running run resets its recovery count, in the UPDATE the commit makes anyway.
    let progress = running && c.makes_progress();
    let touch = |conn: &Connection| -> OpResult<()> {
        conn.prepare_cached(
            "UPDATE runs SET updated_at = ?2, recovery_attempts = CASE WHEN ?3 THEN 0 ELSE recovery_attempts END \
             WHERE id = ?1",
        )?
        .execute(params![id, now, progress])?;
        Ok(())
    };
    match c.end {
        None => touch(conn)?,
        Some(TurnEnd::Suspend { wake_at, seen_wake_gen }) if running => {
            // Suspends only if nothing was delivered since the turn loaded the run: the
            // wake_gen compare is part of the UPDATE.
            let suspended = out.raced.is_empty()
                && conn
                    .prepare_cached(
                        "UPDATE runs SET status = 'suspended', wake_at = ?2, lease_owner = NULL, lease_until = NULL, \
                         updated_at = ?3, recovery_attempts = 0 WHERE id = ?1 AND status = 'running' AND wake_gen = ?4",
                    )?
                    .execute(params![id, wake_at.map(millis_to_sql), now, millis_to_sql(seen_wake_gen)])?
                    > 0;
            if !suspended {
                out.woken = true;
                touch(conn)?;
            }
        }
        Some(TurnEnd::Settle { status: next, output, error }) if running => {
            out.settled =
                conn.prepare_cached(
                    "UPDATE runs SET status = ?2, output = ?3, error = ?4, wake_at = NULL, lease_owner = NULL, \
                     lease_until = NULL, updated_at = ?5, \
                     recovery_attempts = CASE WHEN ?6 THEN 0 ELSE recovery_attempts END \
                     WHERE id = ?1 AND status = 'running'",
                )?
                .execute(params![
                    id,
                    next.as_str(),
                    opt_payload_str(&output),
                    opt_error_json(&error)?,
                    now,
                    progress
                ])? > 0;
            if out.settled {
                // A settled run must not swallow later signals, nor keep work or slots out.
                remove_waiters_of(conn, id)?;
                crate::tasks::cancel_tasks_of(conn, id)?;
                admission::release_run(conn, id, c.now, &mut handed)?;
            }
        }
        // A turn end that finds the run no longer running (an operator cancelled it mid-turn)
        // changes nothing of the run row: terminal runs accept no transition.
        Some(_) => {}
    }
    // The first run handed a slot, when the caller claims it: a run that waited for its key
    // (and is handed nothing else) is woken and claimed in one write; any other is woken
    // with the rest, then claimed. A claim's SQL error fails the write (SQLite may have
    // rolled back the transaction); a row that does not decode fails only the claim, which
    // read before it wrote: the run is woken as any hand-off wakes it.
    let mut claimed = None;
    let first = match claim_lease {
        Some(lease_until) => {
            handed.first().map(|h| Claim { run_id: h.run_id.clone(), owner: c.owner, lease_until, now: c.now })
        }
        None => None,
    };
    if let Some(claim) = &first
        && !handed[1..].iter().any(|h| h.run_id == claim.run_id)
    {
        claimed = unless_undecodable(claim_gated(conn, claim.clone()))?.flatten();
    }
    admission::wake_handed(conn, &handed[usize::from(claimed.is_some())..], c.now)?;
    if let (Some(claim), None) = (first, &claimed) {
        claimed = unless_undecodable(claim_run(conn, claim))?;
    }
    out.handed_off = handed.into_iter().map(|h| h.run_id).collect();
    Ok((out, claimed))
}

/// `result`, or `None` if it failed on a row that does not decode (or a contract outcome);
/// an SQL error stays an error.
fn unless_undecodable<T>(result: OpResult<T>) -> OpResult<Option<T>> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(OpError::Sql(e)) => Err(OpError::Sql(e)),
        Err(_) => Ok(None),
    }
}

pub(crate) fn update_run_if(conn: &Connection, id: &RunId, expected: &[RunStatus], patch: RunPatch) -> OpResult<bool> {
    let current = conn
        .prepare_cached("SELECT status FROM runs WHERE id = ?1")?
        .query_row([id.as_str()], |r| r.get::<_, String>(0))
        .optional()?;
    let Some(current) = current else {
        return Ok(false);
    };
    let current = run_status(&current, id)?;
    if !expected.is_empty() && !expected.contains(&current) {
        return Ok(false);
    }
    if let Some(next) = patch.status {
        check_transition(id, current, next)?;
    }
    let next = patch.status.unwrap_or(current);
    let output = patch.output.as_ref().map(opt_payload_str);
    let error = patch.error.as_ref().map(opt_error_json).transpose()?;
    let wake_at = patch.wake_at.map(|w| w.map(millis_to_sql));
    let now = millis_to_sql(patch.now);
    // The status read above is the compare of this compare-and-set: the UPDATE repeats it.
    // `wake` acts as a delivery: wake_gen + 1 and a parked run (after the patch) is due now.
    let changed = conn
        .prepare_cached(
            "UPDATE runs SET status = ?2, \
             output = CASE WHEN ?3 THEN ?4 ELSE output END, \
             error = CASE WHEN ?5 THEN ?6 ELSE error END, \
             wake_at = CASE WHEN ?13 \
                 THEN MIN(COALESCE(CASE WHEN ?7 THEN ?8 ELSE wake_at END, ?11), ?11) \
                 ELSE CASE WHEN ?7 THEN ?8 ELSE wake_at END END, \
             lease_owner = CASE WHEN ?9 THEN NULL ELSE lease_owner END, \
             lease_until = CASE WHEN ?9 THEN NULL ELSE lease_until END, \
             recovery_attempts = CASE WHEN ?10 THEN 0 ELSE recovery_attempts END, \
             wake_gen = wake_gen + ?14, \
             updated_at = ?11 \
             WHERE id = ?1 AND status = ?12",
        )?
        .execute(params![
            id.as_str(),
            next.as_str(),
            output.is_some(),
            output.flatten(),
            error.is_some(),
            error.flatten(),
            wake_at.is_some(),
            wake_at.flatten(),
            patch.release_lease,
            patch.reset_recovery,
            now,
            current.as_str(),
            patch.wake && next.is_parked(),
            i64::from(patch.wake),
        ])?;
    if changed == 0 {
        return Err(corrupt(format!("run {id}: the run row changed inside the write transaction")));
    }
    if let Some(from) = patch.truncate_history_from {
        conn.prepare_cached("DELETE FROM checkpoints WHERE run_id = ?1 AND seq >= ?2")?
            .execute(params![id.as_str(), from])?;
    }
    if next.is_terminal() {
        // A settled run must not swallow later signals, nor keep slots.
        remove_waiters_of(conn, id.as_str())?;
        let mut handed = Vec::new();
        admission::release_run(conn, id.as_str(), patch.now, &mut handed)?;
        admission::wake_handed(conn, &handed, patch.now)?;
    }
    for sig in &patch.signals {
        send_signal(conn, &sig.token, sig.payload.as_str(), patch.now)?;
    }
    Ok(true)
}

fn remove_waiters_of(conn: &Connection, run_id: &str) -> OpResult<()> {
    conn.prepare_cached("DELETE FROM waiters WHERE run_id = ?1")?.execute([run_id])?;
    Ok(())
}

pub(crate) fn delete_run(conn: &Connection, id: &RunId) -> OpResult<u64> {
    let exists = conn.prepare_cached("SELECT 1 FROM runs WHERE id = ?1")?.exists([id.as_str()])?;
    if !exists {
        return Ok(0);
    }
    let mut doomed: Vec<String> = vec![id.as_str().to_string()];
    let mut seen: HashSet<String> = doomed.iter().cloned().collect();
    {
        let mut children = conn.prepare_cached("SELECT id FROM runs WHERE parent_id = ?1")?;
        let mut i = 0;
        while i < doomed.len() {
            let mut rows = children.query([doomed[i].as_str()])?;
            while let Some(row) = rows.next()? {
                let child = text(row, 0)?;
                if seen.insert(child.to_string()) {
                    doomed.push(child.to_string());
                }
            }
            i += 1;
        }
    }
    // Their slots and queued requests are released first, all of them before any is handed on
    // (none goes to a doomed run). A deletion knows no time: it passes 0, and each gate hands
    // off at its latest time (the runs woken are due at once, as in the memory store).
    let mut handed = Vec::new();
    let runs: Vec<&str> = doomed.iter().map(String::as_str).collect();
    admission::release_runs(conn, &runs, 0, &mut handed)?;
    admission::wake_handed(conn, &handed, 0)?;
    for table in ["checkpoints", "waiters", "run_state", "run_tags", "tasks"] {
        let mut stmt = conn.prepare_cached(&format!("DELETE FROM {table} WHERE run_id = ?1"))?;
        for d in &doomed {
            stmt.execute([d.as_str()])?;
        }
    }
    let mut stmt = conn.prepare_cached("DELETE FROM runs WHERE id = ?1")?;
    for d in &doomed {
        stmt.execute([d.as_str()])?;
        // A later run given this id must not take them.
        purge_child_results(conn, d)?;
    }
    Ok(doomed.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE durable_schema (version INTEGER PRIMARY KEY NOT NULL, description TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT;").unwrap();
        for sql in crate::schema::migration_sql() {
            conn.execute_batch(sql).unwrap();
        }
        conn
    }

    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows: Vec<String> =
            stmt.query_map([], |r| r.get::<_, String>(3)).unwrap().collect::<Result<_, _>>().unwrap();
        rows.join(" | ")
    }

    /// The lookups outside the runs table (`tests/sqlite_plans.rs` reads the plans of the
    /// runs queries, from the statements the store builds).
    #[test]
    fn every_lookup_uses_an_index() {
        let conn = conn();
        let cases = [
            ("SELECT wid FROM waiters WHERE kind = 'signal' AND key = 't' ORDER BY wid LIMIT 1", "waiters_key"),
            ("SELECT wid FROM waiters WHERE kind = 'event' AND key = 'e' ORDER BY wid", "waiters_key"),
            ("SELECT seq FROM waiters WHERE run_id = 'r' ORDER BY seq", "waiters_run"),
            ("SELECT id FROM buffered_signals WHERE token = 't' ORDER BY id LIMIT 1", "buffered_signals_token"),
            ("SELECT id FROM buffered_events WHERE name = 'e' ORDER BY id", "buffered_events_name"),
            ("SELECT seq FROM checkpoints WHERE run_id = 'r' ORDER BY seq", "PRIMARY KEY"),
            ("SELECT id FROM runs WHERE parent_id = 'p'", "runs_parent_created"),
            ("DELETE FROM run_tags WHERE run_id = 'r'", "PRIMARY KEY"),
            ("SELECT keep_until FROM event_dedupe WHERE name = 'e' AND id = 'i'", "PRIMARY KEY"),
            (
                "SELECT name, id FROM event_dedupe WHERE keep_until < 5 ORDER BY keep_until LIMIT 64",
                "event_dedupe_expiry",
            ),
            (
                "SELECT body FROM trigger_buffers WHERE workflow = 'w' AND key = 'k' AND batch_id = 'b'",
                "sqlite_autoindex_trigger_buffers_1",
            ),
            ("SELECT body, revision FROM schedules WHERE key = 'k'", "sqlite_autoindex_schedules_1"),
            ("SELECT attempt FROM tasks WHERE run_id = 'r' AND seq = 1", "sqlite_autoindex_tasks_1"),
            (
                "UPDATE tasks SET state = 'finished' WHERE run_id = 'r' AND state <> 'finished'",
                "sqlite_autoindex_tasks_1",
            ),
            ("DELETE FROM tasks WHERE run_id = 'r'", "sqlite_autoindex_tasks_1"),
            ("SELECT wid, name FROM waiters WHERE run_id = 'r' AND seq = 1", "waiters_run"),
            ("DELETE FROM workers WHERE heartbeat_at < 5", "workers_heartbeat"),
            ("SELECT body FROM workers ORDER BY id", "sqlite_autoindex_workers_1"),
            // Admission writes by run and by holder (tests/sqlite_plans.rs reads the plans of
            // the admission reads), and the stats' groupings, in index order.
            ("DELETE FROM admission_slots WHERE run_id = 'r'", "admission_slots_run"),
            ("DELETE FROM admission_waiters WHERE run_id = 'r'", "admission_waiters_run"),
            (
                "UPDATE admission_slots SET lease_until = 5 WHERE run_id = 'r' AND lease_until IS NOT NULL",
                "admission_slots_run",
            ),
            ("DELETE FROM admission_slots WHERE gate = 'g' AND holder = 'h'", "PRIMARY KEY"),
            ("DELETE FROM admission_waiters WHERE gate = 'g' AND holder = 'h'", "PRIMARY KEY"),
            ("UPDATE admission_slots SET lease_until = 5 WHERE gate = 'g' AND holder = 'h'", "PRIMARY KEY"),
            ("SELECT 1 FROM admission_slots WHERE gate = 'g' AND holder = 'h'", "PRIMARY KEY"),
            (
                "SELECT gate, fairness_key, COUNT(*), MIN(since) FROM admission_waiters GROUP BY gate, fairness_key",
                "admission_waiters_key",
            ),
            ("SELECT gate FROM admission_gates ORDER BY gate", "sqlite_autoindex_admission_gates_1"),
        ];
        for (sql, index) in cases {
            let plan = plan(&conn, sql);
            assert!(plan.contains(index), "{sql}\n  plan: {plan}\n  expected index {index}");
            assert!(!plan.contains("TEMP B-TREE"), "{sql}\n  sorts: {plan}");
        }
    }
}
