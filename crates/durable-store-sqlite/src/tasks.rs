//! Remote steps: the `tasks` table (one row per step, the latest attempt) and the `workers`
//! registry, as SQL on one connection.
//!
//! Writes run on the writer thread inside the group's `BEGIN IMMEDIATE` transaction, like every
//! other write (see `ops`): a claim reads the claimable rows and marks them claimed in one
//! transaction, so concurrent claimers (threads or processes) never share a task.

use durable_core::task::{
    BeatOutcome, NewTask, QueueStats, Task, TaskBeat, TaskClaim, TaskCompletion, TaskDone, TaskLog, TaskState,
    WorkerInfo,
};
use durable_core::{Millis, Payload, RunId, StoreError, TaskFilter, codes, protocol};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::ops::{
    OpError, OpResult, Sql, corrupt, error_json, millis_from_sql, millis_to_sql, opt_millis, opt_payload, opt_text,
    query_rows, run_status, sql_limit, text, u32_from_sql, wake,
};

const TASK_COLS: &str = "run_id, seq, attempt, name, queue, namespace, input, priority, requires, \
     pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state, worker, lease_until, claimed_at, \
     heartbeat_at, progress, claims, logs, outcome, trace_context";

/// The run of `runs` is not terminal. Equalities, not `IN (list)`: SQLite fills a temporary table
/// with a list of more than two constants on every execution of the statement.
const RUN_ACTIVE: &str =
    "(runs.status = 'pending' OR runs.status = 'running' OR runs.status = 'suspended' OR runs.status = 'blocked')";

/// JSON text of a value (`serde_json::to_string`'s result), or a backend error.
fn json_text(encoded: serde_json::Result<String>) -> OpResult<String> {
    encoded.map_err(|e| OpError::Store(StoreError::backend(e)))
}

fn task_from_row(row: &Row<'_>) -> OpResult<Task> {
    let run_id = RunId::new(text(row, 0)?);
    let seq_raw: i64 = row.get(1)?;
    let what = |col: &str| format!("task of run {run_id} seq {seq_raw}: {col}");
    let requires: Vec<String> =
        serde_json::from_str(text(row, 8)?).map_err(|e| corrupt(format!("{}: {e}", what("requires"))))?;
    let logs: Vec<TaskLog> =
        serde_json::from_str(text(row, 20)?).map_err(|e| corrupt(format!("{}: {e}", what("logs"))))?;
    let state: TaskState = text(row, 13)?.parse().map_err(|e| corrupt(format!("{}: {e}", what("state"))))?;
    let task = NewTask {
        seq: u32_from_sql(seq_raw, || what("seq"))?,
        attempt: u32_from_sql(row.get(2)?, || what("attempt"))?,
        name: text(row, 3)?.to_string(),
        queue: text(row, 4)?.to_string(),
        namespace: text(row, 5)?.to_string(),
        input: Payload::from_trusted(text(row, 6)?),
        priority: i32::try_from(row.get::<_, i64>(7)?).map_err(|_| corrupt(what("priority out of range")))?,
        requires,
        pickup_timeout_ms: opt_millis(row, 9, || what("pickup_timeout_ms"))?,
        timeout_ms: opt_millis(row, 10, || what("timeout_ms"))?,
        heartbeat_timeout_ms: millis_from_sql(row.get(11)?, || what("heartbeat_timeout_ms"))?,
        created_at: millis_from_sql(row.get(12)?, || what("created_at"))?,
        trace_context: opt_text(row, 22)?.map(str::to_string),
        run_id: run_id.clone(),
        claimed_by: None,
    };
    Ok(Task {
        state,
        worker: opt_text(row, 14)?.map(str::to_string),
        lease_until: opt_millis(row, 15, || what("lease_until"))?,
        claimed_at: opt_millis(row, 16, || what("claimed_at"))?,
        heartbeat_at: opt_millis(row, 17, || what("heartbeat_at"))?,
        progress: opt_payload(row, 18)?,
        claims: u32_from_sql(row.get(19)?, || what("claims"))?,
        logs,
        outcome: opt_text(row, 21)?.map(str::to_string),
        task,
    })
}

/// The task at `(run_id, seq)`.
fn get_task(conn: &Connection, run_id: &str, seq: u32) -> OpResult<Option<Task>> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE run_id = ?1 AND seq = ?2"))?;
    let mut rows = stmt.query(params![run_id, seq])?;
    match rows.next()? {
        Some(row) => task_from_row(row).map(Some),
        None => Ok(None),
    }
}

/// The status of a run (`None`: no such run).
fn run_status_of(conn: &Connection, run_id: &RunId) -> OpResult<Option<durable_core::RunStatus>> {
    let status = conn
        .prepare_cached("SELECT status FROM runs WHERE id = ?1")?
        .query_row([run_id.as_str()], |r| r.get::<_, String>(0))
        .optional()?;
    status.map(|s| run_status(&s, run_id)).transpose()
}

/// When a worker last showed life for the task (its last heartbeat, else its creation): the
/// `seen_at` column `tasks_seen` orders silent tasks by.
fn seen_at(t: &Task) -> Millis {
    t.heartbeat_at.unwrap_or(t.task.created_at)
}

/// Writes where a task stands (everything but its dispatch fields), with the derived
/// `deadline` and `seen_at`.
fn save_state(conn: &Connection, t: &Task) -> OpResult<()> {
    conn.prepare_cached(
        "UPDATE tasks SET state = ?3, worker = ?4, lease_until = ?5, claimed_at = ?6, heartbeat_at = ?7, \
         progress = ?8, claims = ?9, logs = ?10, outcome = ?11, deadline = ?12, seen_at = ?13 \
         WHERE run_id = ?1 AND seq = ?2",
    )?
    .execute(params![
        t.task.run_id.as_str(),
        t.task.seq,
        t.state.as_str(),
        t.worker,
        t.lease_until.map(millis_to_sql),
        t.claimed_at.map(millis_to_sql),
        t.heartbeat_at.map(millis_to_sql),
        t.progress.as_ref().map(Payload::as_str),
        t.claims,
        json_text(serde_json::to_string(&t.logs))?,
        t.outcome,
        t.deadline().map(millis_to_sql),
        millis_to_sql(seen_at(t)),
    ])?;
    Ok(())
}

/// Writes a claim of a task: the claim's own columns and the derived `deadline` and `seen_at`
/// (the rest of the row, its logs among them, is left as it is: nothing is re-encoded).
fn save_claim(conn: &Connection, t: &Task) -> OpResult<()> {
    conn.prepare_cached(
        "UPDATE tasks SET state = ?3, worker = ?4, lease_until = ?5, claimed_at = ?6, heartbeat_at = ?7, \
         claims = ?8, deadline = ?9, seen_at = ?10 WHERE run_id = ?1 AND seq = ?2",
    )?
    .execute(params![
        t.task.run_id.as_str(),
        t.task.seq,
        t.state.as_str(),
        t.worker,
        t.lease_until.map(millis_to_sql),
        t.claimed_at.map(millis_to_sql),
        t.heartbeat_at.map(millis_to_sql),
        t.claims,
        t.deadline().map(millis_to_sql),
        millis_to_sql(seen_at(t)),
    ])?;
    Ok(())
}

/// Finishes the task a result came for with `outcome` (its `deadline` and `seen_at` do not
/// change: they follow the claim and the heartbeats). `with_logs`: the task as read before the
/// result's first write, when the result brings logs to append.
fn finish(conn: &Connection, done: &TaskDone, outcome: &str, with_logs: Option<Task>) -> OpResult<()> {
    let Some(mut t) = with_logs else {
        conn.prepare_cached("UPDATE tasks SET state = 'finished', outcome = ?3 WHERE run_id = ?1 AND seq = ?2")?
            .execute(params![done.run_id.as_str(), done.seq, outcome])?;
        return Ok(());
    };
    t.logs.extend(done.logs.iter().cloned());
    t.state = TaskState::Finished;
    t.outcome = Some(outcome.into());
    save_state(conn, &t)
}

/// Stores a dispatched attempt as [`Task::dispatched`] does (`queued`, or `claimed` by the
/// worker it was dispatched to), replacing the task at its `(run_id, seq)` (a re-dispatch) but
/// keeping that task's logs.
pub(crate) fn dispatch(conn: &Connection, t: &NewTask) -> OpResult<()> {
    let stored = Task::dispatched(t.clone());
    let millis = |m: Option<Millis>| m.map(millis_to_sql);
    conn.prepare_cached(
        "INSERT INTO tasks (run_id, seq, attempt, name, queue, namespace, input, priority, requires, \
         pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state, deadline, seen_at, trace_context, \
         worker, lease_until, claimed_at, heartbeat_at, claims) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?16, ?14, ?22, ?15, ?17, ?18, ?19, ?20, ?21) \
         ON CONFLICT (run_id, seq) DO UPDATE SET attempt = excluded.attempt, name = excluded.name, \
         queue = excluded.queue, namespace = excluded.namespace, input = excluded.input, \
         priority = excluded.priority, requires = excluded.requires, \
         pickup_timeout_ms = excluded.pickup_timeout_ms, timeout_ms = excluded.timeout_ms, \
         heartbeat_timeout_ms = excluded.heartbeat_timeout_ms, created_at = excluded.created_at, \
         trace_context = excluded.trace_context, \
         state = excluded.state, worker = excluded.worker, lease_until = excluded.lease_until, \
         claimed_at = excluded.claimed_at, heartbeat_at = excluded.heartbeat_at, \
         progress = NULL, claims = excluded.claims, outcome = NULL, deadline = excluded.deadline, seen_at = excluded.seen_at",
    )?
    .execute(params![
        t.run_id.as_str(),
        t.seq,
        t.attempt,
        t.name,
        t.queue,
        t.namespace,
        t.input.as_str(),
        t.priority,
        json_text(serde_json::to_string(&t.requires))?,
        t.pickup_timeout_ms.map(millis_to_sql),
        t.timeout_ms.map(millis_to_sql),
        millis_to_sql(t.heartbeat_timeout_ms),
        millis_to_sql(t.created_at),
        millis(stored.deadline()),
        t.trace_context,
        stored.state.as_str(),
        stored.worker,
        millis(stored.lease_until),
        millis(stored.claimed_at),
        millis(stored.heartbeat_at),
        stored.claims,
        millis_to_sql(seen_at(&stored)),
    ])?;
    Ok(())
}

/// Finishes the run's unfinished tasks as `cancelled` (its `Settle` was applied).
pub(crate) fn cancel_tasks_of(conn: &Connection, run_id: &str) -> OpResult<()> {
    conn.prepare_cached(
        "UPDATE tasks SET state = 'finished', outcome = 'cancelled' WHERE run_id = ?1 AND state <> 'finished'",
    )?
    .execute([run_id])?;
    Ok(())
}

/// The statement of `claim_tasks`: the claimable tasks, in claim order, at most `limit`.
///
/// It walks `tasks_claim` (the unfinished tasks of a queue by priority, then age): for one
/// queue in claim order, no sort; for several, the entries of those queues, sorted. A task is
/// claimable when it is queued or its lease has expired, it is not past its deadline, the
/// claim's capabilities hold all it requires and its run is not terminal. `None` when the claim
/// can match nothing (no queue, a limit of 0).
pub(crate) fn claim_sql(claim: &TaskClaim) -> Option<Sql> {
    if claim.queues.is_empty() || claim.limit == 0 {
        return None;
    }
    let mut sql = Sql::default();
    let now = sql.bind(Value::Integer(millis_to_sql(claim.now)));
    let queues: Vec<String> = claim.queues.iter().map(|q| sql.bind(Value::Text(q.clone()))).collect();
    let caps = sql.bind(Value::Text(serde_json::to_string(&claim.capabilities).unwrap_or_else(|_| "[]".into())));
    let mut text = format!(
        "SELECT {TASK_COLS} FROM tasks INDEXED BY tasks_claim WHERE state <> 'finished' AND queue IN ({}) \
         AND (state = 'queued' OR lease_until <= {now}) AND (deadline IS NULL OR deadline > {now}) \
         AND NOT EXISTS (SELECT 1 FROM json_each(tasks.requires) AS r \
             WHERE NOT EXISTS (SELECT 1 FROM json_each({caps}) AS c WHERE c.value = r.value)) \
         AND EXISTS (SELECT 1 FROM runs WHERE runs.id = tasks.run_id AND {RUN_ACTIVE})",
        queues.join(", ")
    );
    if let Some(ns) = &claim.namespace {
        text.push_str(&format!(" AND namespace = {}", sql.bind(Value::Text(ns.clone()))));
    }
    let lim = sql.bind(Value::Integer(sql_limit(claim.limit)));
    text.push_str(&format!(" ORDER BY priority DESC, created_at, run_id, seq LIMIT {lim}"));
    sql.text = text;
    Some(sql)
}

/// `claim_tasks`: see [`claim_sql`]; each task found is claimed in the same transaction.
pub(crate) fn claim_tasks(conn: &Connection, claim: &TaskClaim) -> OpResult<Vec<Task>> {
    let mut tasks = query_rows(conn, claim_sql(claim), task_from_row)?;
    for t in &mut tasks {
        t.state = TaskState::Claimed;
        t.worker = Some(claim.worker.clone());
        // Never stamped before the dispatch (a claimer's clock behind the dispatcher's).
        let at = claim.now.max(t.task.created_at);
        t.lease_until = Some(at.saturating_add(t.task.heartbeat_timeout_ms));
        t.heartbeat_at = Some(at);
        t.claimed_at = Some(t.claimed_at.unwrap_or(at));
        t.claims += 1;
        save_claim(conn, t)?;
    }
    Ok(tasks)
}

pub(crate) fn heartbeat_task(conn: &Connection, beat: &TaskBeat) -> OpResult<BeatOutcome> {
    let Some(mut t) = get_task(conn, beat.run_id.as_str(), beat.seq)? else {
        return Ok(BeatOutcome::Lost);
    };
    if t.task.attempt != beat.attempt {
        return Ok(BeatOutcome::Lost);
    }
    if t.state == TaskState::Finished {
        return Ok(BeatOutcome::Cancelled);
    }
    if t.state != TaskState::Claimed || t.worker.as_deref() != Some(beat.worker.as_str()) {
        return Ok(BeatOutcome::Lost);
    }
    let terminal = run_status_of(conn, &beat.run_id)?.is_none_or(|s| s.is_terminal());
    if terminal || t.deadline().is_some_and(|d| d <= beat.now) {
        return Ok(BeatOutcome::Cancelled);
    }
    let lease_until = beat.now.saturating_add(t.task.heartbeat_timeout_ms);
    t.lease_until = Some(lease_until);
    t.heartbeat_at = Some(beat.now);
    if let Some(p) = &beat.progress {
        t.progress = Some(p.clone());
    }
    t.logs.extend(beat.logs.iter().cloned());
    save_state(conn, &t)?;
    Ok(BeatOutcome::Extended(lease_until))
}

/// `complete_task`: the checkpoint, the wake and the task's end, in the caller's write.
pub(crate) fn complete_task(conn: &Connection, done: TaskDone) -> OpResult<TaskCompletion> {
    let run_id = done.run_id.as_str();
    // The answer depends on the attempt and the state alone: the row is not decoded.
    let found = conn
        .prepare_cached("SELECT attempt, state FROM tasks WHERE run_id = ?1 AND seq = ?2")?
        .query_row(params![run_id, done.seq], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .optional()?;
    let Some((attempt, state)) = found else {
        return Ok(TaskCompletion::Duplicate);
    };
    let state: TaskState =
        state.parse().map_err(|e| corrupt(format!("task of run {run_id} seq {}: state: {e}", done.seq)))?;
    if attempt != i64::from(done.attempt) || state == TaskState::Finished {
        return Ok(TaskCompletion::Duplicate);
    }
    // Logs to append: the row is decoded now, before anything is written (a row that does not
    // decode fails this result alone, not its write group).
    let with_logs = if done.logs.is_empty() { None } else { get_task(conn, run_id, done.seq)? };
    if run_status_of(conn, &done.run_id)?.is_none_or(|s| s.is_terminal()) {
        finish(conn, &done, "cancelled", with_logs)?;
        return Ok(TaskCompletion::RunTerminal);
    }
    let waiter = conn
        .prepare_cached("SELECT wid, name FROM waiters WHERE run_id = ?1 AND seq = ?2")?
        .query_row(params![run_id, done.seq], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .optional()?;
    let Some((wid, name)) = waiter else {
        return Ok(TaskCompletion::Duplicate);
    };
    conn.prepare_cached("DELETE FROM waiters WHERE wid = ?1")?.execute([wid])?;
    let now = millis_to_sql(done.now);
    let (status, output, error) = match &done.result {
        Ok(p) => ("completed", Some(p.as_str().to_string()), None),
        Err(e) => ("waiting", None, Some(error_json(e)?)),
    };
    conn.prepare_cached(
        "INSERT INTO checkpoints (run_id, seq, name, kind, status, output, error, attempts, started_at, updated_at) \
         VALUES (?1, ?2, ?3, 'remote', ?4, ?5, ?6, ?7, ?8, ?8) \
         ON CONFLICT (run_id, seq) DO UPDATE SET status = excluded.status, \
         output = CASE WHEN ?9 THEN excluded.output ELSE output END, \
         error = CASE WHEN ?9 THEN error ELSE excluded.error END, \
         attempts = excluded.attempts, wake_at = NULL, updated_at = excluded.updated_at",
    )?
    .execute(params![run_id, done.seq, name, status, output, error, done.attempt, now, done.result.is_ok()])?;
    wake(conn, run_id, now)?;
    let outcome = match &done.result {
        Ok(_) => "completed",
        Err(e) if e.code() == Some(codes::REMOTE_TIMEOUT) => "timed_out",
        Err(_) => "failed",
    };
    finish(conn, &done, outcome, with_logs)?;
    // A gated remote step held an admission slot while its attempt was out.
    crate::admission::release_holder(conn, run_id, &protocol::step_id(&done.run_id, done.seq), done.now)?;
    Ok(TaskCompletion::Accepted)
}

pub(crate) fn release_tasks(conn: &Connection, tasks: &[(RunId, u32, u32)], worker: &str) -> OpResult<()> {
    let mut stmt = conn.prepare_cached(
        "UPDATE tasks SET state = 'queued', lease_until = NULL \
         WHERE run_id = ?1 AND seq = ?2 AND attempt = ?3 AND state = 'claimed' AND worker = ?4",
    )?;
    for (run_id, seq, attempt) in tasks {
        stmt.execute(params![run_id.as_str(), seq, attempt, worker])?;
    }
    Ok(())
}

/// The statement of `list_tasks`.
///
/// One filter drives the walk: a run's tasks come from the primary key; expired tasks from
/// `tasks_deadline` up to the time; silent ones from `tasks_seen`; unfinished or queued ones
/// from `tasks_unfinished` in the listing order; all of them from `tasks_created`. The other
/// filters narrow what the walk yields.
pub(crate) fn list_tasks_sql(filter: &TaskFilter) -> Sql {
    let limit = if filter.limit == 0 { 100 } else { filter.limit };
    let mut sql = Sql::default();
    let mut terms: Vec<String> = Vec::new();
    let unfinished = filter.unfinished || filter.queued || filter.expired_at.is_some() || filter.silent_since.is_some();
    let index = if filter.run_id.is_some() {
        None
    } else if filter.expired_at.is_some() {
        Some("tasks_deadline")
    } else if filter.silent_since.is_some() {
        Some("tasks_seen")
    } else if unfinished {
        Some("tasks_unfinished")
    } else {
        Some("tasks_created")
    };
    if let Some(run_id) = &filter.run_id {
        terms.push(format!("run_id = {}", sql.bind(Value::Text(run_id.to_string()))));
    }
    if unfinished {
        terms.push("state <> 'finished'".into());
    }
    if filter.queued {
        terms.push("state = 'queued'".into());
    }
    if let Some(at) = filter.expired_at {
        terms.push(format!("deadline IS NOT NULL AND deadline <= {}", sql.bind(Value::Integer(millis_to_sql(at)))));
    }
    if let Some(since) = filter.silent_since {
        terms.push(format!("seen_at < {}", sql.bind(Value::Integer(millis_to_sql(since)))));
    }
    let indexed = index.map(|i| format!(" INDEXED BY {i}")).unwrap_or_default();
    let wher = if terms.is_empty() { String::new() } else { format!(" WHERE {}", terms.join(" AND ")) };
    let lim = sql.bind(Value::Integer(sql_limit(limit)));
    sql.text = format!("SELECT {TASK_COLS} FROM tasks{indexed}{wher} ORDER BY created_at, run_id, seq LIMIT {lim}");
    sql
}

pub(crate) fn list_tasks(conn: &Connection, filter: &TaskFilter) -> OpResult<Vec<Task>> {
    query_rows(conn, Some(list_tasks_sql(filter)), task_from_row)
}

pub(crate) fn queue_stats(conn: &Connection) -> OpResult<Vec<QueueStats>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT namespace, queue, SUM(state = 'queued'), SUM(state = 'claimed'), MIN(created_at) \
         FROM tasks INDEXED BY tasks_claim WHERE state <> 'finished' \
         AND EXISTS (SELECT 1 FROM runs WHERE runs.id = tasks.run_id AND {RUN_ACTIVE}) \
         GROUP BY namespace, queue ORDER BY namespace, queue"
    ))?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let count = |i: usize| -> OpResult<u64> {
            let v: i64 = row.get(i)?;
            u64::try_from(v).map_err(|_| corrupt(format!("queue stats: negative count {v}")))
        };
        out.push(QueueStats {
            namespace: text(row, 0)?.to_string(),
            queue: text(row, 1)?.to_string(),
            queued: count(2)?,
            claimed: count(3)?,
            oldest_at: opt_millis(row, 4, || "queue stats: oldest".to_string())?,
        });
    }
    Ok(out)
}

pub(crate) fn register_worker(conn: &Connection, worker: &WorkerInfo) -> OpResult<()> {
    conn.prepare_cached(
        "INSERT INTO workers (id, heartbeat_at, body) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, body = excluded.body",
    )?
    .execute(params![worker.id, millis_to_sql(worker.heartbeat_at), json_text(serde_json::to_string(worker))?])?;
    Ok(())
}

pub(crate) fn remove_worker(conn: &Connection, id: &str) -> OpResult<bool> {
    Ok(conn.prepare_cached("DELETE FROM workers WHERE id = ?1")?.execute([id])? > 0)
}

/// Forgets the workers silent since before `heartbeat_before`, then lists the others by id.
pub(crate) fn workers(conn: &Connection, heartbeat_before: Millis) -> OpResult<Vec<WorkerInfo>> {
    conn.prepare_cached("DELETE FROM workers WHERE heartbeat_at < ?1")?.execute([millis_to_sql(heartbeat_before)])?;
    let mut stmt = conn.prepare_cached("SELECT body FROM workers ORDER BY id")?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(
            serde_json::from_str(text(row, 0)?)
                .map_err(|e| corrupt(format!("a stored worker descriptor does not decode: {e}")))?,
        );
    }
    Ok(out)
}
