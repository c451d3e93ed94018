//! The run queue ([`RunQueue`]) of the store-backed transport: a `run_queue` table in the
//! same file, claimed with a lease so a consumer that dies leaves its items to others.

use async_trait::async_trait;
use durable_core::{Millis, QueueReason, QueuedRun, RunId, RunQueue, StoreResult};
use rusqlite::{Connection, OptionalExtension, params};

use crate::SqliteStore;
use crate::ops::{OpError, OpResult, millis_to_sql};

fn enqueue(conn: &Connection, items: &[QueuedRun], now: Millis) -> OpResult<()> {
    for item in items {
        let run: Option<(String, i32)> = conn
            .prepare_cached("SELECT namespace, priority FROM runs WHERE id = ?1")?
            .query_row([item.run_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((run_ns, run_priority)) = run else { continue };
        let namespace = item.namespace.clone().unwrap_or(run_ns);
        let priority = item.priority.max(run_priority);
        let updated = conn
            .prepare_cached(
                "UPDATE run_queue SET \
                     reason = CASE WHEN ?2 = 'wake' THEN 'wake' ELSE reason END, \
                     dedupe_key = CASE WHEN ?2 = 'wake' AND (?3 LIKE 'claim=%' OR dedupe_key NOT LIKE 'claim=%') \
                         THEN ?3 ELSE dedupe_key END, \
                     priority = max(priority, ?4) \
                 WHERE run_id = ?1 AND claimed_by IS NULL",
            )?
            .execute(params![item.run_id.as_str(), item.reason.as_str(), item.dedupe_key, priority])?;
        if updated == 0 {
            conn.prepare_cached(
                "INSERT INTO run_queue (run_id, reason, namespace, priority, dedupe_key, enqueued_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                item.run_id.as_str(),
                item.reason.as_str(),
                namespace,
                priority,
                item.dedupe_key,
                millis_to_sql(now)
            ])?;
        }
    }
    Ok(())
}

fn claim(
    conn: &Connection,
    namespace: Option<&str>,
    owner: &str,
    limit: usize,
    claim_until: Millis,
    now: Millis,
) -> OpResult<Vec<QueuedRun>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, run_id, reason, namespace, priority, dedupe_key FROM run_queue \
         WHERE (claimed_by IS NULL OR claim_until < ?1) AND (?2 IS NULL OR namespace = ?2) \
         ORDER BY priority DESC, enqueued_at, id LIMIT ?3",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt.query_map(params![millis_to_sql(now), namespace, limit], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
    })?;
    let mut items = Vec::new();
    for row in rows {
        let (id, run_id, reason, namespace, priority, dedupe_key) = row?;
        let reason = match reason.as_str() {
            "start" => QueueReason::Start,
            "wake" => QueueReason::Wake,
            other => return Err(OpError::Corrupt(format!("run_queue item {id}: unknown reason {other:?}"))),
        };
        let id = u64::try_from(id).map_err(|_| OpError::Corrupt(format!("run_queue item id {id}")))?;
        items.push(QueuedRun {
            id,
            run_id: RunId::new(run_id),
            reason,
            namespace: Some(namespace),
            priority,
            dedupe_key,
        });
    }
    let mut mark = conn.prepare_cached("UPDATE run_queue SET claimed_by = ?2, claim_until = ?3 WHERE id = ?1")?;
    for item in &items {
        // A claimed item leaves the "one unclaimed item per run" index; a newer unclaimed item
        // of the same run may exist next to it.
        mark.execute(params![item.id as i64, owner, millis_to_sql(claim_until)])?;
    }
    Ok(items)
}

fn ack(conn: &Connection, ids: &[u64], owner: &str) -> OpResult<()> {
    let mut stmt = conn.prepare_cached("DELETE FROM run_queue WHERE id = ?1 AND claimed_by = ?2")?;
    for id in ids {
        stmt.execute(params![*id as i64, owner])?;
    }
    Ok(())
}

/// Puts items claimed by `owner` back in line, keeping their place. When the run was queued
/// again meanwhile (it has an unclaimed item), the released item folds into that one as an
/// enqueue would (a wake wins with its dedupe key, the higher priority and the earlier place
/// are kept), so the run keeps at most one unclaimed item and loses none of what was sent.
fn release(conn: &Connection, ids: &[u64], owner: &str) -> OpResult<()> {
    let mut claimed = conn.prepare_cached(
        "SELECT run_id, reason, priority, dedupe_key, enqueued_at FROM run_queue WHERE id = ?1 AND claimed_by = ?2",
    )?;
    let mut fold = conn.prepare_cached(
        "UPDATE run_queue SET \
             reason = CASE WHEN ?2 = 'wake' THEN 'wake' ELSE reason END, \
             dedupe_key = CASE WHEN ?2 = 'wake' AND (?3 LIKE 'claim=%' OR dedupe_key NOT LIKE 'claim=%') \
                         THEN ?3 ELSE dedupe_key END, \
             priority = max(priority, ?4), \
             enqueued_at = min(enqueued_at, ?5) \
         WHERE run_id = ?1 AND claimed_by IS NULL",
    )?;
    let mut delete = conn.prepare_cached("DELETE FROM run_queue WHERE id = ?1")?;
    let mut unclaim =
        conn.prepare_cached("UPDATE run_queue SET claimed_by = NULL, claim_until = NULL WHERE id = ?1")?;
    for id in ids {
        let id = *id as i64;
        let row: Option<(String, String, i32, String, i64)> = claimed
            .query_row(params![id, owner], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
            .optional()?;
        let Some((run_id, reason, priority, dedupe_key, enqueued_at)) = row else { continue };
        if fold.execute(params![run_id, reason, dedupe_key, priority, enqueued_at])? > 0 {
            delete.execute([id])?;
        } else {
            unclaim.execute([id])?;
        }
    }
    Ok(())
}

#[async_trait]
impl RunQueue for SqliteStore {
    async fn enqueue(&self, items: Vec<QueuedRun>, now: Millis) -> StoreResult<()> {
        self.workers.write("enqueue", move |c| enqueue(c, &items, now)).await
    }

    async fn claim_queued(
        &self,
        namespace: Option<&str>,
        owner: &str,
        limit: usize,
        claim_until: Millis,
        now: Millis,
    ) -> StoreResult<Vec<QueuedRun>> {
        let (namespace, owner) = (namespace.map(str::to_string), owner.to_string());
        self.workers
            .write("claim_queued", move |c| claim(c, namespace.as_deref(), &owner, limit, claim_until, now))
            .await
    }

    async fn ack_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
        let (ids, owner) = (ids.to_vec(), owner.to_string());
        self.workers.write("ack_queued", move |c| ack(c, &ids, &owner)).await
    }

    async fn release_queued(&self, ids: &[u64], owner: &str) -> StoreResult<()> {
        let (ids, owner) = (ids.to_vec(), owner.to_string());
        self.workers.write("release_queued", move |c| release(c, &ids, &owner)).await
    }

    async fn queued_len(&self) -> StoreResult<u64> {
        self.workers
            .read("queued_len", |c| {
                let n: i64 = c.query_row("SELECT count(*) FROM run_queue", [], |r| r.get(0))?;
                Ok(n as u64)
            })
            .await
    }
}
