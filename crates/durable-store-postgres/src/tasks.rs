//! Remote steps ([`durable_core::task`]): the `tasks` and `workers` tables (`sql/v7.sql`), the
//! statements a worker's calls run, and the `LISTEN` side of the task wake-ups
//! ([`PostgresStore::task_wakeups`]).
//!
//! The result of a task ([`Store::complete_task`](durable_core::Store::complete_task)) is an
//! operation of the writer, batched like a signal; every other call here is one statement in a
//! transaction of its own on the pool, that locks task rows only (never a run row or an advisory
//! lock), so a busy fleet of workers never queues behind the engines' batches.

use std::cmp::Reverse;
use std::sync::Arc;

use durable_core::task::{BeatOutcome, Task, TaskBeat, TaskClaim, WorkerInfo};
use durable_core::{Millis, RunId, StoreResult};
use serde::Serialize;
use tokio::sync::Notify;
use tokio_postgres::types::{ToSql, Type};

use crate::PostgresStore;
use crate::error::Result;
use crate::ops::{self, TASK_COLS, WORKER_COLS};

/// The task statements, with the schema filled in.
pub(crate) struct TaskStatements {
    claim_any: String,
    claim_ns: String,
    heartbeat: String,
    release: String,
    pub(crate) queue_stats: String,
    register_worker: String,
    remove_worker: String,
    workers: String,
}

/// The claim: `$1` now, `$2` limit, `$3` worker, `$4` queues, `$5` capabilities (and `$6` the
/// namespace). The subquery picks and locks (skipping rows another claimer holds: a claim never
/// waits, and a row claimed meanwhile is re-checked against the predicate once locked), the
/// UPDATE marks: one statement, one round trip, its own transaction.
pub(crate) fn claim_sql(schema: &str, namespace: bool) -> String {
    let ns = if namespace { " AND t.namespace = $6" } else { "" };
    format!(
        "WITH picked AS (
            SELECT t.run_id, t.seq FROM {schema}.tasks AS t
             WHERE t.state <> 'finished' AND t.state IN ('queued', 'claimed') AND t.queue = ANY ($4){ns}
               AND (t.state = 'queued' OR t.lease_until <= $1)
               AND (t.deadline IS NULL OR t.deadline > $1)
               AND t.requires <@ $5::text[]
               AND EXISTS (SELECT 1 FROM {schema}.runs AS r
                            WHERE r.id = t.run_id AND r.status IN ('pending', 'running', 'suspended', 'blocked'))
             ORDER BY t.priority DESC, t.created_at, t.run_id, t.seq
             LIMIT $2
             FOR UPDATE OF t SKIP LOCKED)
         UPDATE {schema}.tasks AS t
            SET state = 'claimed', worker = $3, heartbeat_at = GREATEST($1, t.created_at), claims = t.claims + 1,
                lease_until = {schema}.saturating_add(GREATEST($1, t.created_at), t.heartbeat_timeout_ms::numeric),
                claimed_at = COALESCE(t.claimed_at, GREATEST($1, t.created_at))
           FROM picked WHERE t.run_id = picked.run_id AND t.seq = picked.seq
         RETURNING {cols}",
        cols = TASK_COLS.split(", ").map(|c| format!("t.{c}")).collect::<Vec<_>>().join(", ")
    )
}

impl TaskStatements {
    pub(crate) fn new(schema: &str) -> Self {
        TaskStatements {
            claim_any: claim_sql(schema, false),
            claim_ns: claim_sql(schema, true),
            heartbeat: format!("SELECT {schema}.heartbeat_task($1::jsonb)::text"),
            release: format!("SELECT {schema}.release_tasks($1::jsonb, $2)"),
            queue_stats: ops::queue_stats_sql(schema),
            register_worker: format!(
                "INSERT INTO {schema}.workers ({WORKER_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (id) DO UPDATE
                    SET queues = excluded.queues, capabilities = excluded.capabilities,
                        protocol_min = excluded.protocol_min, protocol_max = excluded.protocol_max,
                        concurrency = excluded.concurrency, started_at = excluded.started_at,
                        heartbeat_at = excluded.heartbeat_at"
            ),
            remove_worker: format!("DELETE FROM {schema}.workers WHERE id = $1"),
            // The DELETE runs whatever the SELECT reads; both see the statement's snapshot, so
            // the SELECT leaves the deleted rows out itself.
            workers: format!(
                "WITH gone AS (DELETE FROM {schema}.workers WHERE heartbeat_at < $1)
                 SELECT {WORKER_COLS} FROM {schema}.workers WHERE heartbeat_at >= $1 ORDER BY id"
            ),
        }
    }
}

#[derive(Serialize)]
struct BeatJson<'a> {
    run_id: &'a str,
    seq: u32,
    attempt: u32,
    worker: &'a str,
    progress: Option<&'a str>,
    logs: &'a [durable_core::task::TaskLog],
    now: i64,
}

#[derive(Serialize)]
struct ReleaseItem<'a> {
    run_id: &'a str,
    seq: u32,
    attempt: u32,
}

#[derive(Serialize)]
struct ReleaseJson<'a> {
    worker: &'a str,
    tasks: Vec<ReleaseItem<'a>>,
}

fn json(v: &impl Serialize) -> String {
    // Strings, numbers and log lines (JSON already): serialising cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| String::from("{}"))
}

impl PostgresStore {
    fn task_sql(&self) -> &TaskStatements {
        &self.inner.task_sql
    }

    pub(crate) async fn claim_tasks_now(&self, claim: &TaskClaim) -> StoreResult<Vec<Task>> {
        if claim.limit == 0 || claim.queues.is_empty() {
            return Ok(Vec::new());
        }
        let now = ops::millis_to_sql(claim.now);
        let limit = i64::try_from(claim.limit).unwrap_or(i64::MAX);
        let worker = claim.worker.as_str();
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&now, Type::INT8),
            (&limit, Type::INT8),
            (&worker, Type::TEXT),
            (&claim.queues, Type::TEXT_ARRAY),
            (&claim.capabilities, Type::TEXT_ARRAY),
        ];
        let sql = match &claim.namespace {
            Some(ns) => {
                params.push((ns, Type::TEXT));
                &self.task_sql().claim_ns
            }
            None => &self.task_sql().claim_any,
        };
        let rows = self.statement("claiming tasks", sql, &params).await?;
        let mut tasks = self.decode("claiming tasks", ops::task_rows(&rows))?;
        // The UPDATE returns rows in no particular order: highest priority first, then oldest.
        tasks.sort_by(|a, b| {
            let key = |t: &Task| (Reverse(t.task.priority), t.task.created_at);
            key(a).cmp(&key(b)).then_with(|| (&a.task.run_id, a.task.seq).cmp(&(&b.task.run_id, b.task.seq)))
        });
        Ok(tasks)
    }

    pub(crate) async fn heartbeat_now(&self, beat: &TaskBeat) -> StoreResult<BeatOutcome> {
        let body = json(&BeatJson {
            run_id: beat.run_id.as_str(),
            seq: beat.seq,
            attempt: beat.attempt,
            worker: &beat.worker,
            progress: beat.progress.as_ref().map(|p| p.as_str()),
            logs: &beat.logs,
            now: ops::millis_to_sql(beat.now),
        });
        let rows = self.statement("heartbeating a task", &self.task_sql().heartbeat, &[(&body, Type::TEXT)]).await?;
        let answer = rows.first().map(|r| r.try_get::<_, String>(0)).transpose();
        let answer = self.decode("heartbeating a task", answer.map(|a| a.ok_or_else(|| "no answer".to_string())))?;
        self.answer(ops::beat_answer(&answer, &beat.run_id))
    }

    pub(crate) async fn release_now(&self, tasks: &[(RunId, u32, u32)], worker: &str) -> StoreResult<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        let body = json(&ReleaseJson {
            worker,
            tasks: tasks
                .iter()
                .map(|(r, seq, attempt)| ReleaseItem { run_id: r.as_str(), seq: *seq, attempt: *attempt })
                .collect(),
        });
        let channel = self.inner.options.notify_channel.as_deref();
        self.statement("releasing tasks", &self.task_sql().release, &[(&body, Type::TEXT), (&channel, Type::TEXT)])
            .await?;
        Ok(())
    }

    pub(crate) async fn register_worker_now(&self, w: &WorkerInfo) -> StoreResult<()> {
        let (pmin, pmax, conc) = (i64::from(w.protocol_min), i64::from(w.protocol_max), i64::from(w.concurrency));
        let (started, beat) = (ops::millis_to_sql(w.started_at), ops::millis_to_sql(w.heartbeat_at));
        let id = w.id.as_str();
        self.statement(
            "registering a worker",
            &self.task_sql().register_worker,
            &[
                (&id, Type::TEXT),
                (&w.queues, Type::TEXT_ARRAY),
                (&w.capabilities, Type::TEXT_ARRAY),
                (&pmin, Type::INT8),
                (&pmax, Type::INT8),
                (&conc, Type::INT8),
                (&started, Type::INT8),
                (&beat, Type::INT8),
            ],
        )
        .await?;
        Ok(())
    }

    pub(crate) async fn remove_worker_now(&self, id: &str) -> StoreResult<bool> {
        let shared = &self.inner.shared;
        let client =
            shared.pool.get().await.map_err(|e| crate::error::pool_error(&shared.target, e).into_store_error())?;
        let n = client
            .execute_typed(&self.task_sql().remove_worker, &[(&id, Type::TEXT)])
            .await
            .map_err(|e| crate::error::query_error(&shared.target, "removing a worker", e).into_store_error())?;
        Ok(n > 0)
    }

    pub(crate) async fn workers_now(&self, heartbeat_before: Millis) -> StoreResult<Vec<WorkerInfo>> {
        let before = ops::millis_to_sql(heartbeat_before);
        let rows = self.statement("listing workers", &self.task_sql().workers, &[(&before, Type::INT8)]).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode("listing workers", ops::worker_from_row(row))?);
        }
        Ok(out)
    }

    /// Wake-ups for a worker waiting for tasks: a [`Notify`] that is triggered
    /// ([`Notify::notify_one`]) each time any engine on this schema queues tasks (a commit that
    /// dispatches remote steps) or a worker hands tasks back
    /// ([`Store::release_tasks`](durable_core::Store::release_tasks)), within milliseconds of
    /// the transaction's commit. An idle worker waits on it (with its poll interval as a
    /// timeout) and claims at once instead of at its next poll.
    ///
    /// It needs [`PostgresOptions::notify_channel`](crate::PostgresOptions::notify_channel)
    /// (say `C`) on every store of the schema: those writes then `NOTIFY` `C:tasks` with the
    /// queue's name. A task whose lease expires becomes claimable again without a
    /// notification (nothing writes at that moment): keep polling as the safety net. As
    /// [`PostgresStore::queue_wakeups`]: the first call opens a dedicated connection (not from
    /// the pool) that `LISTEN`s, later calls return the same `Notify`, the listener lives as
    /// long as the store and reconnects (triggering once after reconnecting) when its
    /// connection drops. The notify is per store, not per queue: a worker serving some queues
    /// is also woken by tasks of others, and finds nothing to claim.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if no channel is configured or the
    /// store was built with [`PostgresStore::from_pool`]; connection errors as for
    /// [`PostgresStore::connect_with`].
    pub async fn task_wakeups(&self) -> Result<Arc<Notify>> {
        self.wakeups(&self.inner.task_listener, crate::queue::TASKS_CHANNEL, "task_wakeups").await
    }
}
