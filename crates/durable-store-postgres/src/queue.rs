//! The run queue ([`RunQueue`]) of the store-backed transport: a `run_queue` table in the same
//! schema (`sql/v2.sql`), and the `LISTEN` side of its wake-ups ([`PostgresStore::queue_wakeups`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use durable_core::{Millis, QueueReason, QueuedRun, RunId, RunQueue, StoreResult};
use tokio::sync::Notify;
use tokio_postgres::types::Type;

use crate::PostgresStore;
use crate::error::{Error, Result};
use crate::listener::{self, Listener};
use crate::ops::{self, Op, QueueItemJson};

/// The claim statements, with the schema filled in: of any namespace, or of one (`$5`).
pub(crate) struct QueueStatements {
    claim_any: String,
    claim_ns: String,
    len: String,
}

impl QueueStatements {
    pub(crate) fn new(schema: &str) -> Self {
        let claim = |filter: &str| {
            // The subquery picks and locks (skipping rows another claimer holds: a claim never
            // waits), the UPDATE marks: one statement, one round trip, its own transaction.
            format!(
                "WITH picked AS (
                    SELECT id FROM {schema}.run_queue
                     WHERE (claimed_by IS NULL OR claim_until < $1){filter}
                     ORDER BY priority DESC, enqueued_at, id
                     LIMIT $2
                     FOR UPDATE SKIP LOCKED)
                 UPDATE {schema}.run_queue AS q SET claimed_by = $3, claim_until = $4
                   FROM picked WHERE q.id = picked.id
                 RETURNING q.id, q.run_id, q.reason, q.namespace, q.priority, q.dedupe_key, q.enqueued_at"
            )
        };
        QueueStatements {
            claim_any: claim(""),
            claim_ns: claim(" AND namespace = $5"),
            len: format!("SELECT count(*) FROM {schema}.run_queue"),
        }
    }
}

#[async_trait]
impl RunQueue for PostgresStore {
    async fn enqueue(&self, items: Vec<QueuedRun>, now: Millis) -> StoreResult<()> {
        let items = ops::merge_queue_items(items);
        if items.is_empty() {
            return Ok(());
        }
        let op = Op::Enqueue { items: items.iter().map(QueueItemJson::new).collect(), now: ops::millis_to_sql(now) };
        let answer = self.queue_write(op).await?;
        self.answer(ops::ok_answer(&answer))
    }

    async fn claim_queued(
        &self,
        namespace: Option<&str>,
        owner: &str,
        limit: usize,
        claim_until: Millis,
        now: Millis,
    ) -> StoreResult<Vec<QueuedRun>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let sql = &self.inner.queue_sql;
        let now = ops::millis_to_sql(now);
        let until = ops::millis_to_sql(claim_until);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> =
            vec![(&now, Type::INT8), (&limit, Type::INT8), (&owner, Type::TEXT), (&until, Type::INT8)];
        let statement = match &namespace {
            Some(ns) => {
                params.push((ns, Type::TEXT));
                &sql.claim_ns
            }
            None => &sql.claim_any,
        };
        let rows = self.statement("claiming queued runs", statement, &params).await?;
        self.inner.shared.counters.claims.fetch_add(1, Ordering::Relaxed);
        let mut items = Vec::with_capacity(rows.len());
        for row in &rows {
            let item = self.decode("claiming queued runs", queued_from_row(row))?;
            items.push(item);
        }
        // The UPDATE returns rows in no particular order: highest priority first, then oldest.
        items.sort_by_key(|(item, enqueued_at)| (std::cmp::Reverse(item.priority), *enqueued_at, item.id));
        Ok(items.into_iter().map(|(item, _)| item).collect())
    }

    async fn ack_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let answer = self.queue_write(Op::AckQueued { ids: ops::queue_ids(ids), owner }).await?;
        self.answer(ops::ok_answer(&answer))
    }

    async fn release_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let answer = self.queue_write(Op::ReleaseQueued { ids: ops::queue_ids(ids), owner }).await?;
        self.answer(ops::ok_answer(&answer))
    }

    async fn queued_len(&self) -> StoreResult<u64> {
        let rows = self.query("counting queued runs", &self.inner.queue_sql.len, &[]).await?;
        let n = rows.first().map(|r| r.try_get::<_, i64>(0)).transpose();
        let n = self.decode("counting queued runs", n.map(|n| Ok(n.unwrap_or(0))))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// A claimed row, with its `enqueued_at` (for the order).
fn queued_from_row(
    row: &tokio_postgres::Row,
) -> std::result::Result<std::result::Result<(QueuedRun, i64), String>, tokio_postgres::Error> {
    let id: i64 = row.try_get(0)?;
    let run_id: String = row.try_get(1)?;
    let reason: String = row.try_get(2)?;
    let namespace: String = row.try_get(3)?;
    let priority: i32 = row.try_get(4)?;
    let dedupe_key: String = row.try_get(5)?;
    let enqueued_at: i64 = row.try_get(6)?;
    let reason = match reason.as_str() {
        "start" => QueueReason::Start,
        "wake" => QueueReason::Wake,
        other => return Ok(Err(format!("run_queue item {id} (run {run_id}): unknown reason {other:?}"))),
    };
    let Ok(id) = u64::try_from(id) else {
        return Ok(Err(format!("run_queue item id {id} (run {run_id}) is negative")));
    };
    let item = QueuedRun { id, run_id: RunId::new(run_id), reason, namespace: Some(namespace), priority, dedupe_key };
    Ok(Ok((item, enqueued_at)))
}

// ---- wake-ups: LISTEN on `<notify_channel>:queue` (and `:tasks`) ---------------------------------

/// The suffix of the run queue's channel: enqueues and releases NOTIFY `<notify_channel>:queue`.
pub(crate) const QUEUE_CHANNEL: &str = "queue";

/// The suffix of the task channel: dispatches and releases NOTIFY `<notify_channel>:tasks`.
pub(crate) const TASKS_CHANNEL: &str = "tasks";

/// The channel `suffix` of a store whose notify channel is `channel`.
pub(crate) fn sub_channel(channel: &str, suffix: &str) -> String {
    format!("{channel}:{suffix}")
}

impl PostgresStore {
    /// Wake-ups for a run-queue consumer: a [`Notify`] that is triggered
    /// ([`Notify::notify_one`]) each time any engine on this schema queues runs, within
    /// milliseconds of the enqueue's commit. Give it to the transport so an idle worker claims
    /// new runs at once instead of at its next poll:
    /// `QueueTransport::new(store.clone()).with_wakeups(store.queue_wakeups().await?)`.
    ///
    /// It needs [`PostgresOptions::notify_channel`](crate::PostgresOptions::notify_channel)
    /// (say `C`) on every store of the schema: enqueues then `NOTIFY` `C:queue` with the
    /// namespace queued. The first call opens a dedicated connection (not from the pool) that
    /// `LISTEN`s; later calls return the same `Notify`. The listener lives as long as the store
    /// (its last clone). When its connection drops it reconnects (50 ms, doubling up to 5 s)
    /// and triggers once after reconnecting, since notifications sent meanwhile are lost; keep
    /// the consumer's polling on as the safety net.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] if no channel is configured or the store was built with
    /// [`PostgresStore::from_pool`] (no URL to connect with); connection errors as for
    /// [`PostgresStore::connect_with`].
    pub async fn queue_wakeups(&self) -> Result<Arc<Notify>> {
        self.wakeups(&self.inner.listener, QUEUE_CHANNEL, "queue_wakeups").await
    }

    /// The `Notify` of the listener in `slot` on `<notify_channel>:<suffix>`, started on first
    /// use (`what` names the caller in errors).
    pub(crate) async fn wakeups(
        &self,
        slot: &tokio::sync::Mutex<Option<Listener<Arc<Notify>>>>,
        suffix: &str,
        what: &str,
    ) -> Result<Arc<Notify>> {
        let Some(channel) = self.inner.options.notify_channel.as_deref() else {
            return Err(Error::InvalidOptions {
                reason: format!("{what} needs a channel: set PostgresOptions::notify_channel"),
            });
        };
        self.listener(slot, sub_channel(channel, suffix), what, || {
            let notify = Arc::new(Notify::new());
            (notify.clone(), listener::nudge(notify))
        })
        .await
    }
}
