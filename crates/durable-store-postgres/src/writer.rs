//! The writer task: group commit over pooled connections (one batch in flight by default).
//!
//! Every write of the store is queued here as one JSON operation (a bulk create as a group
//! of them, which always travels in one batch, so it is one transaction). Once one of its
//! `write_connections` (default 1) is free, the writer takes every operation waiting at that
//! moment (up to `max_batch`), and sends them in one pipelined flight on one connection —
//! `BEGIN`, `SELECT apply($ops)`, `COMMIT` — so a batch costs one network round trip and one
//! WAL flush however many commits it carries, and the server works on up to that many batches
//! at once. Answers are sent back only after the `COMMIT` succeeded. Batches in flight together
//! are independent transactions, as those of two processes are; one caller's writes are
//! awaited one by one, so they never overtake each other.
//!
//! A batch of two or more operations travels with what they lock ([`BatchLocks`], gathered from
//! each request's operations): `apply` takes every advisory key of the batch, ascending, the rows
//! of the admission gates it names, in gate order, and the rows of the runs it delivers to, in
//! id order, before its first operation runs, so batches in flight together cannot deadlock on
//! each other's keys, gates or woken runs (schema versions 12, 18 and 24, `lock_batch`).
//!
//! Contract outcomes (lease lost, conflict, …) are answers, not errors, so one refused
//! operation does not disturb its batch. If the batch fails for another reason: a deadlock or a
//! serialization failure (another engine's transaction) is retried as a whole; a lost
//! connection fails every operation of the batch with a retryable `Unavailable` (the pool
//! replaces the connection); any other error re-runs each operation alone, so only the one at
//! fault reports it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::Pool;
use durable_core::StoreError;
use futures_util::future::join3;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_postgres::types::Type;

use crate::error::{Error, is_conflict, pool_error, query_error};
use crate::ops::BatchLocks;

/// How many times a batch that lost a deadlock or serialization conflict is run again.
const CONFLICT_RETRIES: usize = 4;

/// A batch stops growing past this many bytes of JSON (1 MiB payloads stay in small batches).
const MAX_BATCH_BYTES: usize = 8 << 20;

/// Counters shared by the store and its writer.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) batches: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) claims: AtomicU64,
}

/// What the store's counters say; see [`PostgresStore::stats`](crate::PostgresStore::stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Write transactions sent: each one is one network round trip (`BEGIN`, the batch and
    /// `COMMIT` are pipelined), including the retries of conflicted batches.
    pub batches: u64,
    /// Writes answered (commits, creates, claims, signals, …).
    pub writes: u64,
    /// Batches run again after a deadlock or serialization failure, or split after an error.
    pub retries: u64,
    /// Read queries sent: one round trip each.
    pub reads: u64,
    /// Run-queue claims ([`RunQueue::claim_queued`](durable_core::RunQueue::claim_queued)):
    /// one statement in a transaction of its own, one round trip each.
    pub claims: u64,
}

impl PostgresStats {
    /// Network round trips so far: write batches, reads and queue claims.
    pub fn round_trips(&self) -> u64 {
        self.batches + self.reads + self.claims
    }
}

impl Counters {
    pub(crate) fn snapshot(&self) -> PostgresStats {
        PostgresStats {
            batches: self.batches.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            claims: self.claims.load(Ordering::Relaxed),
        }
    }
}

/// What the writer needs, shared with the store.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) pool: Pool,
    pub(crate) target: String,
    /// `SELECT r FROM "schema".apply($1::jsonb, $2, $3::jsonb) AS r`.
    pub(crate) apply_sql: String,
    pub(crate) channel: Option<String>,
    pub(crate) max_batch: usize,
    /// Batches in flight at once, each on its own connection.
    pub(crate) write_connections: usize,
    pub(crate) counters: Counters,
}

/// One queued write: its operations (JSON; more than one for a group that must commit
/// together), what they lock, and where their answers go.
struct Request {
    ops: Vec<String>,
    locks: BatchLocks,
    reply: oneshot::Sender<Result<Vec<String>, StoreError>>,
}

impl Request {
    fn bytes(&self) -> usize {
        self.ops.iter().map(String::len).sum()
    }
}

/// The store's handle on its writer task. Dropping it lets the task finish the queued writes
/// and stop.
#[derive(Debug)]
pub(crate) struct Writer {
    tx: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("ops", &self.ops.len()).field("bytes", &self.bytes()).finish_non_exhaustive()
    }
}

impl Writer {
    /// Spawns the writer task on the current tokio runtime.
    pub(crate) fn start(shared: Arc<Shared>) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(shared, rx));
        Writer { tx }
    }

    /// Queues one operation (JSON text) and what it locks, and waits for its answer (JSON text).
    pub(crate) async fn write(&self, shared: &Shared, op: String, locks: BatchLocks) -> Result<String, StoreError> {
        let mut answers = self.write_group(shared, vec![op], locks).await?;
        answers.pop().ok_or_else(|| {
            Error::Corrupt { target: shared.target.clone(), message: "a write got no answer".into() }.into_store_error()
        })
    }

    /// Queues operations that must be applied in one transaction (they travel in one batch,
    /// and are never split from each other), with what they lock, and waits for their answers,
    /// in order.
    pub(crate) async fn write_group(
        &self,
        shared: &Shared,
        ops: Vec<String>,
        locks: BatchLocks,
    ) -> Result<Vec<String>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || Error::WriterStopped { target: shared.target.clone() }.into_store_error();
        self.tx.send(Request { ops, locks, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Request>) {
    let in_flight = Arc::new(Semaphore::new(shared.write_connections));
    // A batch is taken once a connection is free for it, so it holds everything that arrived
    // while the others were in flight.
    while let Ok(permit) = in_flight.clone().acquire_owned().await {
        let Some(first) = rx.recv().await else { break };
        let (mut ops, mut bytes) = (first.ops.len(), first.bytes());
        let mut batch = vec![first];
        while ops < shared.max_batch && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(next) => {
                    ops += next.ops.len();
                    bytes += next.bytes();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            execute(&shared, batch).await;
            drop(permit);
        });
    }
}

/// How a batch failed.
enum Failure {
    /// A deadlock or serialization failure: nothing was written, run it again.
    Conflict(Error),
    /// The connection or the pool failed: every operation gets this error.
    Unavailable(Error),
    /// A statement failed: nothing was written; one of the operations is at fault.
    Statement(Error),
}

async fn execute(shared: &Shared, batch: Vec<Request>) {
    let ops = join(&batch);
    let count: usize = batch.iter().map(|r| r.ops.len()).sum();
    let locks = batch_locks(&batch, count);
    match apply_retrying(shared, &ops, locks.as_deref(), count).await {
        Ok(answers) => {
            shared.counters.writes.fetch_add(count as u64, Ordering::Relaxed);
            let mut answers = answers.into_iter();
            for req in batch {
                let mine = answers.by_ref().take(req.ops.len()).collect();
                let _ = req.reply.send(Ok(mine));
            }
        }
        Err(Failure::Statement(_)) if batch.len() > 1 => {
            // Someone's request is at fault: run each alone (a group stays whole), so only it
            // gets the error.
            shared.counters.retries.fetch_add(1, Ordering::Relaxed);
            for req in batch {
                let ops = join(std::slice::from_ref(&req));
                let locks = batch_locks(std::slice::from_ref(&req), req.ops.len());
                let answer = match apply_retrying(shared, &ops, locks.as_deref(), req.ops.len()).await {
                    Ok(answers) => {
                        shared.counters.writes.fetch_add(req.ops.len() as u64, Ordering::Relaxed);
                        Ok(answers)
                    }
                    Err(Failure::Conflict(e) | Failure::Unavailable(e) | Failure::Statement(e)) => {
                        Err(e.into_store_error())
                    }
                };
                let _ = req.reply.send(answer);
            }
        }
        Err(Failure::Conflict(e) | Failure::Unavailable(e) | Failure::Statement(e)) => {
            // One error, many receivers: StoreError is not Clone, so rebuild it for each.
            let retryable = e.is_retryable();
            let message = e.to_string();
            let mut first = Some(e);
            for req in batch {
                let err = match first.take() {
                    Some(e) => e.into_store_error(),
                    None if retryable => StoreError::Unavailable { message: message.clone(), retryable: true },
                    None => Error::Postgres {
                        target: shared.target.clone(),
                        message: message.clone(),
                        retryable: false,
                        source: None,
                    }
                    .into_store_error(),
                };
                let _ = req.reply.send(Err(err));
            }
        }
    }
}

/// `[op, op, …]`: every operation of every request, in order.
fn join(batch: &[Request]) -> String {
    let mut s = String::with_capacity(batch.iter().map(|r| r.bytes() + r.ops.len()).sum::<usize>() + 2);
    s.push('[');
    for (i, op) in batch.iter().flat_map(|r| &r.ops).enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(op);
    }
    s.push(']');
    s
}

/// What the batch's operations lock (`None` for a single operation: it orders its own locks).
fn batch_locks(batch: &[Request], count: usize) -> Option<String> {
    if count < 2 {
        return None;
    }
    let mut all = BatchLocks::default();
    for req in batch {
        all.extend(&req.locks);
    }
    Some(all.encode())
}

async fn apply_retrying(
    shared: &Shared,
    ops: &str,
    locks: Option<&str>,
    expected: usize,
) -> Result<Vec<String>, Failure> {
    let mut attempt = 0;
    loop {
        match apply(shared, ops, locks, expected).await {
            Err(Failure::Conflict(_)) if attempt < CONFLICT_RETRIES => {
                attempt += 1;
                shared.counters.retries.fetch_add(1, Ordering::Relaxed);
            }
            other => return other,
        }
    }
}

/// Runs one batch in one transaction, in one round trip: `BEGIN`, the batch and `COMMIT` are
/// pipelined on one connection (tokio-postgres sends requests in the order they are first
/// polled, without waiting for earlier answers). If the batch fails, the server turns the
/// `COMMIT` into a rollback.
async fn apply(shared: &Shared, ops: &str, locks: Option<&str>, expected: usize) -> Result<Vec<String>, Failure> {
    let target = &shared.target;
    let client = shared.pool.get().await.map_err(|e| {
        let e = pool_error(target, e);
        if e.is_retryable() { Failure::Unavailable(e) } else { Failure::Statement(e) }
    })?;
    shared.counters.batches.fetch_add(1, Ordering::Relaxed);
    let channel: Option<&str> = shared.channel.as_deref();
    let (begin, rows, commit) = join3(
        client.batch_execute("BEGIN"),
        client.query_typed(&shared.apply_sql, &[(&ops, Type::TEXT), (&channel, Type::TEXT), (&locks, Type::TEXT)]),
        client.batch_execute("COMMIT"),
    )
    .await;
    let classify = |doing: &str, e: tokio_postgres::Error| {
        let conflict = is_conflict(&e);
        let err = query_error(target, doing, e);
        if conflict {
            Failure::Conflict(err)
        } else if err.is_retryable() {
            Failure::Unavailable(err)
        } else {
            Failure::Statement(err)
        }
    };
    begin.map_err(|e| classify("starting a write transaction", e))?;
    let rows = rows.map_err(|e| classify("applying a batch of writes", e))?;
    commit.map_err(|e| classify("committing a batch of writes", e))?;
    let mut answers = Vec::with_capacity(rows.len());
    for row in &rows {
        let answer: Option<String> = row.try_get(0).map_err(|e| classify("reading the batch's answers", e))?;
        answers.push(answer.unwrap_or_default());
    }
    if answers.len() != expected {
        return Err(Failure::Statement(Error::Corrupt {
            target: target.clone(),
            message: format!("a batch of {expected} writes got {} answers", answers.len()),
        }));
    }
    Ok(answers)
}
