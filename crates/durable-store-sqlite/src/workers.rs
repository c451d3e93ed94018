//! The threads of a store: one writer doing group commit, a few readers.
//!
//! Callers never block a thread: a request is a closure sent over a channel, the answer comes
//! back on a `tokio::sync::oneshot` (which needs no runtime, only a waker), so the store works
//! under any executor and spawns nothing on one.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use durable_core::{StoreError, StoreResult};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::{Error, SharedFailure};
use crate::ops::{Ctx, OpError, OpResult};

/// Counters of a store's writer, for observability and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SqliteStats {
    /// Write transactions committed (each is one fsync with [`Durability::Full`](crate::Durability::Full)).
    pub transactions: u64,
    /// Write requests answered (successful or not).
    pub writes: u64,
    /// Write requests submitted and not answered yet (queued or in the running group).
    pub queued: u64,
    /// Groups whose transaction failed as a whole (every write in them got the error).
    pub failed_groups: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    transactions: AtomicU64,
    submitted: AtomicU64,
    answered: AtomicU64,
    failed_groups: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> SqliteStats {
        // `answered` is read first: `queued` never underflows.
        let writes = self.answered.load(Ordering::Acquire);
        let submitted = self.submitted.load(Ordering::Acquire);
        SqliteStats {
            transactions: self.transactions.load(Ordering::Acquire),
            writes,
            queued: submitted.saturating_sub(writes),
            failed_groups: self.failed_groups.load(Ordering::Acquire),
        }
    }
}

/// How a write of a group is kept apart from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// In a `SAVEPOINT` of its own: a write that fails is rolled back alone.
    Savepoint,
    /// No savepoint, for the hot writes (a savepoint costs its statements a statement journal
    /// of every page they touch). A write that fails before it changed a row (the writer
    /// compares the connection's `total_changes`, and the count of admission gates changed in
    /// the transaction, before and after) costs the group nothing;
    /// one that fails after it changed rows rolls back the whole transaction: the writes of
    /// the group applied before it get a retryable `Unavailable` (nothing of them was
    /// written), the failed one its own error, and the rest of the group goes on in a new
    /// transaction. The operations run this way check what can refuse them before they
    /// write, so that is a rare failure (a disk error, a row that does not decode).
    None,
}

/// One write request: applied inside the group's transaction, answered after it commits.
pub(crate) trait WriteJob: Send {
    /// How it is kept apart from the other writes of its group.
    fn guard(&self) -> Guard;
    /// The operation's name, for errors.
    fn op(&self) -> &'static str;
    /// Runs the operation; returns whether it succeeded (if not, its savepoint is rolled back).
    fn apply(&mut self, conn: &Connection) -> bool;
    /// Sends the answer: the operation's result, or the group's failure.
    fn finish(self: Box<Self>, ctx: &Ctx, failure: Option<&SharedFailure>);
}

struct Job<F, T> {
    op: &'static str,
    guard: Guard,
    f: Option<F>,
    out: Option<OpResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<F, T> WriteJob for Job<F, T>
where
    F: FnOnce(&Connection) -> OpResult<T> + Send,
    T: Send,
{
    fn guard(&self) -> Guard {
        self.guard
    }

    fn op(&self) -> &'static str {
        self.op
    }

    fn apply(&mut self, conn: &Connection) -> bool {
        let Some(f) = self.f.take() else { return false };
        let out = f(conn);
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn finish(self: Box<Self>, ctx: &Ctx, failure: Option<&SharedFailure>) {
        let Job { op, out, reply, f, .. } = *self;
        // Taken and no answer: it panicked (`f` is still here: it never ran).
        let panicked = f.is_none() && out.is_none();
        let answer = match (failure, out) {
            // A failed request keeps its own error even when the whole group failed.
            (_, Some(Err(e))) => Err(e.into_store_error(ctx, op)),
            (Some(f), _) if !panicked => Err(f.to_store_error()),
            (None, Some(Ok(v))) => Ok(v),
            _ => Err(StoreError::backend(format!(
                "{}: internal error: the {op} request panicked; nothing of it was written",
                ctx.path.display()
            ))),
        };
        // The caller may have stopped waiting; the write stands either way.
        let _ = reply.send(answer);
    }
}

type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// The handles to a store's threads. Dropping it stops them (after they finish what is queued).
#[derive(Debug)]
pub(crate) struct Workers {
    ctx: Arc<Ctx>,
    writer: Option<Sender<Box<dyn WriteJob>>>,
    readers: Option<Sender<ReadJob>>,
    writer_thread: Option<JoinHandle<()>>,
    reader_threads: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Workers {
    pub(crate) fn start(
        ctx: Arc<Ctx>,
        writer_conn: Connection,
        reader_conns: Vec<Connection>,
        max_group: usize,
    ) -> Result<Workers, Error> {
        let counters = Arc::new(Counters::default());
        let spawn_err = |e: std::io::Error| Error::Io {
            path: ctx.path.clone(),
            message: "cannot start the store's threads".into(),
            source: e,
        };
        let (wtx, wrx) = mpsc::channel::<Box<dyn WriteJob>>();
        let mut workers = Workers {
            ctx: ctx.clone(),
            writer: None,
            readers: None,
            writer_thread: None,
            reader_threads: Vec::with_capacity(reader_conns.len()),
            counters: counters.clone(),
        };
        {
            let ctx = ctx.clone();
            let counters = counters.clone();
            workers.writer_thread = Some(
                std::thread::Builder::new()
                    .name("durable-sqlite-writer".into())
                    .spawn(move || {
                        crate::busy::set_timeout(ctx.busy_timeout);
                        writer_loop(&writer_conn, &ctx, &wrx, &counters, max_group)
                    })
                    .map_err(spawn_err)?,
            );
        }
        workers.writer = Some(wtx);
        let (rtx, rrx) = mpsc::channel::<ReadJob>();
        let rrx = Arc::new(Mutex::new(rrx));
        for (i, conn) in reader_conns.into_iter().enumerate() {
            let rrx = rrx.clone();
            let busy_timeout = ctx.busy_timeout;
            match std::thread::Builder::new().name(format!("durable-sqlite-reader-{i}")).spawn(move || {
                crate::busy::set_timeout(busy_timeout);
                reader_loop(&conn, &rrx)
            }) {
                Ok(t) => workers.reader_threads.push(t),
                Err(e) => return Err(spawn_err(e)),
            }
        }
        workers.readers = Some(rtx);
        Ok(workers)
    }

    pub(crate) fn stats(&self) -> SqliteStats {
        self.counters.snapshot()
    }

    /// Runs `f` on the writer thread, inside a group's transaction, in a savepoint of its
    /// own; answers after the commit.
    pub(crate) async fn write<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> OpResult<T> + Send + 'static,
    {
        self.write_as(op, Guard::Savepoint, f).await
    }

    /// [`Workers::write`] without a savepoint ([`Guard::None`]), for a hot write whose
    /// refusals are all decided before it changes a row.
    pub(crate) async fn write_hot<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> OpResult<T> + Send + 'static,
    {
        self.write_as(op, Guard::None, f).await
    }

    async fn write_as<T, F>(&self, op: &'static str, guard: Guard, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> OpResult<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Box<dyn WriteJob> = Box::new(Job { op, guard, f: Some(f), out: None, reply });
        let stopped = || Error::Stopped { path: self.ctx.path.clone(), which: "writer" }.into_store_error();
        let Some(writer) = &self.writer else { return Err(stopped()) };
        self.counters.submitted.fetch_add(1, Ordering::AcqRel);
        if writer.send(job).is_err() {
            self.counters.answered.fetch_add(1, Ordering::AcqRel);
            return Err(stopped());
        }
        rx.await.map_err(|_| stopped())?
    }

    /// Runs `f` on a reader thread.
    pub(crate) async fn read<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> OpResult<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let ctx = self.ctx.clone();
        let job: ReadJob = Box::new(move |conn| {
            let _ = reply.send(f(conn).map_err(|e| e.into_store_error(&ctx, op)));
        });
        let stopped = || Error::Stopped { path: self.ctx.path.clone(), which: "reader" }.into_store_error();
        let Some(readers) = &self.readers else { return Err(stopped()) };
        readers.send(job).map_err(|_| stopped())?;
        rx.await.map_err(|_| {
            StoreError::backend(format!(
                "{}: internal error: the {op} request panicked on a reader thread",
                self.ctx.path.display()
            ))
        })?
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Closing the channels ends the threads once they have answered what is queued; joining
        // them closes their connections, so the file is released when the store is dropped.
        // The readers close first and the writer last: the writer, alone on the file as far as
        // this store goes, checkpoints and truncates the WAL (`checkpoint_on_close`), and the
        // last connection to close removes it (connections closing at the same time each saw
        // the other still open, and the WAL was left behind).
        self.readers.take();
        for t in self.reader_threads.drain(..) {
            let _ = t.join();
        }
        self.writer.take();
        if let Some(t) = self.writer_thread.take() {
            let _ = t.join();
        }
    }
}

fn reader_loop(conn: &Connection, rx: &Mutex<Receiver<ReadJob>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            rx.recv()
        };
        let Ok(job) = job else { return };
        // A panicking request drops its reply sender: its caller gets an error, the thread lives.
        let _ = panic::catch_unwind(AssertUnwindSafe(|| job(conn)));
    }
}

fn writer_loop(conn: &Connection, ctx: &Ctx, rx: &Receiver<Box<dyn WriteJob>>, counters: &Counters, max_group: usize) {
    let mut group: Vec<Box<dyn WriteJob>> = Vec::with_capacity(max_group.min(1024));
    // Wait for one request: the group is it and every request that is waiting, or arrives,
    // while it is applied (`Late`).
    let late = Late { rx, max_group };
    while let Ok(first) = rx.recv() {
        group.push(first);
        run_group(conn, ctx, &mut group, counters, Some(&late));
    }
    // The store is closing and every queued write is done. A store that wrote nothing (a
    // command that only read) leaves the WAL to those that wrote it: its checkpoint would only
    // wait for them, up to a second, while one holds the file.
    if counters.transactions.load(Ordering::Acquire) > 0 {
        checkpoint_on_close(conn, ctx);
    }
}

/// How long a closing store waits, at most, for other connections to the file (other stores,
/// other processes) to let its WAL checkpoint finish: the store's busy timeout, capped at this.
pub(crate) const CLOSE_CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

/// Copies the WAL into the database file and truncates it to 0 bytes
/// (`PRAGMA wal_checkpoint(TRUNCATE)`), so a cleanly closed store leaves no multi-megabyte `-wal`
/// file behind, even when another connection keeps the file open (then SQLite's own checkpoint
/// when the last connection closes does not happen).
///
/// The checkpoint waits for writers, and for readers still reading older data from the WAL,
/// through the busy handler: here for at most [`CLOSE_CHECKPOINT_WAIT`]. If they hold on longer
/// it gives up and the WAL stays as it is; nothing is lost either way (the WAL is part of the
/// database, and the next checkpoint, by any connection, copies it).
fn checkpoint_on_close(conn: &Connection, ctx: &Ctx) {
    if conn.busy_timeout(ctx.busy_timeout.min(CLOSE_CHECKPOINT_WAIT)).is_err() {
        return;
    }
    // One row: (1 if another connection kept it from completing, WAL frames, frames copied).
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get::<_, i64>(0));
}

/// Writes the gates the transaction changed to their rows
/// (`admission::write_changed_gates`), as part of `doing`.
fn flush_gates(conn: &Connection, ctx: &Ctx, doing: &str) -> Result<(), Error> {
    crate::admission::write_changed_gates(conn).map_err(|e| match e {
        OpError::Sql(e) => Error::sqlite(&ctx.path, ctx.busy_timeout, doing, e),
        OpError::Corrupt(message) => Error::Corrupt { path: ctx.path.clone(), message },
        OpError::Store(e) => Error::Sqlite {
            path: ctx.path.clone(),
            message: format!("{doing}: writing an admission gate: {e}"),
            source: Box::new(e),
        },
    })
}

fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Applies a group of requests in one `BEGIN IMMEDIATE … COMMIT`, each in its own savepoint
/// (or none, see [`Guard`]), then answers them all. If the transaction fails as a whole, every
/// request gets the error — but for an unguarded write that failed after changing rows: after
/// it, the rest of the group goes on in a new transaction.
fn run_group(
    conn: &Connection,
    ctx: &Ctx,
    group: &mut Vec<Box<dyn WriteJob>>,
    counters: &Counters,
    late: Option<&Late<'_>>,
) {
    while !group.is_empty() {
        run_transaction(conn, ctx, group, counters, late);
    }
}

/// Where requests that arrive while a transaction is applied come from: they join it, up to
/// `max_group` requests in all, and share its commit (its fsync). A caller waits for its
/// answer until the commit anyway, so joining costs it nothing, and with a few dozen writers
/// (runs under a concurrency key, say) it halves the transactions.
struct Late<'a> {
    rx: &'a Receiver<Box<dyn WriteJob>>,
    max_group: usize,
}

impl Late<'_> {
    /// A request waiting to join a group of `len`, if there is one and room for it.
    fn next(&self, len: usize) -> Option<Box<dyn WriteJob>> {
        if len >= self.max_group {
            return None;
        }
        self.rx.try_recv().ok()
    }
}

/// Applies the writes of `group` (and those that join it from `late` as it goes) in one
/// transaction and answers them: all of them, or, when an unguarded one fails after changing
/// rows, those up to it (the transaction is rolled back: the writes before it get an error
/// saying so, it keeps its own), which leave `group`.
fn run_transaction(
    conn: &Connection,
    ctx: &Ctx,
    group: &mut Vec<Box<dyn WriteJob>>,
    counters: &Counters,
    late: Option<&Late<'_>>,
) {
    let sql_err = |doing: &str, e| Error::sqlite(&ctx.path, ctx.busy_timeout, doing, e);
    let mut broken: Option<Error> = None;
    // An unguarded write that failed after changing rows: the transaction is undone for it.
    let mut rolled_back: Option<&'static str> = None;
    let mut end = None;
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
        broken = Some(sql_err("starting a write transaction", e));
    } else {
        crate::admission::transaction_began();
        let mut i = 0;
        loop {
            if i == group.len() {
                match late.and_then(|late| late.next(group.len())) {
                    Some(job) => group.push(job),
                    None => break,
                }
            }
            let job = &mut group[i];
            i += 1;
            let guarded = job.guard() == Guard::Savepoint;
            if guarded
                && let Err(e) = flush_gates(conn, ctx, "starting a savepoint")
                    .and_then(|()| exec(conn, "SAVEPOINT write").map_err(|e| sql_err("starting a savepoint", e)))
            {
                broken = Some(e);
                break;
            }
            // Rows it changed, and gates it changed (written to their rows later).
            let changes = || conn.total_changes().wrapping_add(crate::admission::gate_saves());
            let before = changes();
            let ok = panic::catch_unwind(AssertUnwindSafe(|| job.apply(conn))).unwrap_or(false);
            if conn.is_autocommit() {
                // SQLite rolled the whole transaction back (disk full, I/O error, …), under a
                // write that failed or one that went on: the writes applied before it are gone
                // too, and nothing more may run outside the transaction.
                broken = Some(Error::Sqlite {
                    path: ctx.path.clone(),
                    message: "SQLite rolled back the whole transaction during a write".into(),
                    source: "transaction rolled back".into(),
                });
                break;
            }
            if ok {
                if guarded && let Err(e) = exec(conn, "RELEASE write") {
                    broken = Some(sql_err("releasing a savepoint", e));
                    break;
                }
            } else if !guarded {
                if changes() != before {
                    // Part of it may be written: only the whole transaction can undo it. The
                    // writes after it have not run: they go on in a new transaction.
                    rolled_back = Some(job.op());
                    end = Some(i);
                    break;
                }
                // It changed nothing: nothing to undo.
            } else {
                crate::admission::forget_kept_gates();
                if let Err(e) = exec(conn, "ROLLBACK TO write").and_then(|()| exec(conn, "RELEASE write")) {
                    broken = Some(sql_err("rolling back a failed write", e));
                    break;
                }
            }
        }
        if broken.is_none()
            && rolled_back.is_none()
            && let Err(e) = flush_gates(conn, ctx, "committing a write transaction")
                .and_then(|()| exec(conn, "COMMIT").map_err(|e| sql_err("committing a write transaction", e)))
        {
            broken = Some(e);
        }
    }
    crate::admission::transaction_ended();
    let end = end.unwrap_or(group.len());
    counters.answered.fetch_add(end as u64, Ordering::AcqRel);
    let failure = match (broken, rolled_back) {
        (Some(err), _) => Some(SharedFailure::new(&err)),
        (None, Some(op)) => Some(SharedFailure::rolled_back(&ctx.path, op)),
        (None, None) => None,
    };
    match failure {
        None => {
            counters.transactions.fetch_add(1, Ordering::AcqRel);
            for job in group.drain(..end) {
                job.finish(ctx, None);
            }
        }
        Some(failure) => {
            if !conn.is_autocommit() {
                let _ = exec(conn, "ROLLBACK");
            }
            counters.failed_groups.fetch_add(1, Ordering::AcqRel);
            for job in group.drain(..end) {
                job.finish(ctx, Some(&failure));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use durable_core::StoreErrorKind;

    use super::*;

    /// A WAL database with one table, in a temp dir of its own (removed with the dir).
    fn setup() -> (tempfile::TempDir, Connection, Ctx) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unit.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER NOT NULL);").unwrap();
        let ctx = Ctx { path, busy_timeout: Duration::from_secs(5) };
        (dir, conn, ctx)
    }

    type Reply = oneshot::Receiver<StoreResult<()>>;

    fn job(f: impl FnOnce(&Connection) -> OpResult<()> + Send + 'static) -> (Box<dyn WriteJob>, Reply) {
        let (reply, rx) = oneshot::channel();
        (Box::new(Job { op: "test", guard: Guard::Savepoint, f: Some(f), out: None, reply }), rx)
    }

    /// A write without a savepoint ([`Guard::None`]), named `op`.
    fn hot(
        op: &'static str,
        f: impl FnOnce(&Connection) -> OpResult<()> + Send + 'static,
    ) -> (Box<dyn WriteJob>, Reply) {
        let (reply, rx) = oneshot::channel();
        (Box::new(Job { op, guard: Guard::None, f: Some(f), out: None, reply }), rx)
    }

    fn insert(x: i64) -> impl FnOnce(&Connection) -> OpResult<()> + Send + 'static {
        move |c| {
            c.execute("INSERT INTO t VALUES (?1)", [x])?;
            Ok(())
        }
    }

    fn rows(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn.prepare("SELECT x FROM t ORDER BY x").unwrap();
        stmt.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
    }

    fn answer(mut rx: Reply) -> StoreResult<()> {
        rx.try_recv().expect("answered")
    }

    #[test]
    fn writes_that_arrive_while_a_transaction_is_applied_join_it_up_to_the_group_limit() {
        let (_dir, conn, ctx) = setup();
        let counters = Counters::default();
        let (tx, rx) = mpsc::channel::<Box<dyn WriteJob>>();
        // The first write sends three more while it is applied (as callers would while the
        // writer is busy): with room for three writes in all, two of them join its
        // transaction, the third waits for the next one.
        let (later, replies): (Vec<_>, Vec<_>) = (2..=4).map(|x| job(insert(x))).unzip();
        let (first, r1) = job(move |c| {
            for j in later {
                tx.send(j).unwrap();
            }
            insert(1)(c)
        });
        let late = Late { rx: &rx, max_group: 3 };
        let mut group = vec![first];
        run_transaction(&conn, &ctx, &mut group, &counters, Some(&late));
        assert!(group.is_empty());
        assert_eq!(counters.snapshot().transactions, 1);
        assert_eq!(rows(&conn), [1, 2, 3], "the two that fit joined the transaction");
        let mut replies = replies.into_iter();
        assert!(answer(r1).is_ok());
        assert!(answer(replies.next().unwrap()).is_ok());
        assert!(answer(replies.next().unwrap()).is_ok());
        let last = replies.next().unwrap();
        assert_eq!(rx.try_recv().map(|j| j.op()).ok(), Some("test"), "the third is still queued");
        drop(last);
    }

    #[test]
    fn each_write_of_a_group_rolls_back_alone() {
        let (_dir, conn, ctx) = setup();
        let counters = Counters::default();
        let (a, ra) = job(insert(1));
        // Writes, then fails: its write must be undone, the others kept.
        let (b, rb) = job(|c| {
            c.execute("INSERT INTO t VALUES (2)", [])?;
            Err(OpError::Store(StoreError::Conflict { message: "no".into() }))
        });
        let (p, rp) = job(|c| {
            c.execute("INSERT INTO t VALUES (3)", []).unwrap();
            panic!("a bug in a write");
        });
        let (d, rd) = job(insert(4));
        let mut group = vec![a, b, p, d];
        run_group(&conn, &ctx, &mut group, &counters, None);
        assert!(group.is_empty());
        assert_eq!(counters.snapshot().transactions, 1);
        assert!(answer(ra).is_ok());
        assert_eq!(answer(rb).unwrap_err().kind(), StoreErrorKind::Conflict);
        assert_eq!(answer(rp).unwrap_err().kind(), StoreErrorKind::Backend);
        assert!(answer(rd).is_ok());
        assert_eq!(rows(&conn), [1, 4]);
        assert!(conn.is_autocommit(), "no transaction is left open");
    }

    #[test]
    fn an_unguarded_write_refused_before_it_changed_a_row_costs_its_group_nothing() {
        let (_dir, conn, ctx) = setup();
        let counters = Counters::default();
        let (a, ra) = hot("a", insert(1));
        let (b, rb) = hot("b", |_| Err(OpError::Store(StoreError::Conflict { message: "refused".into() })));
        let (c, rc) = job(insert(3));
        let (d, rd) = hot("d", insert(4));
        let mut group = vec![a, b, c, d];
        run_group(&conn, &ctx, &mut group, &counters, None);
        assert!(answer(ra).is_ok());
        assert_eq!(answer(rb).unwrap_err().kind(), StoreErrorKind::Conflict);
        assert!(answer(rc).is_ok());
        assert!(answer(rd).is_ok());
        assert_eq!(rows(&conn), [1, 3, 4]);
        let stats = counters.snapshot();
        assert_eq!((stats.transactions, stats.failed_groups, stats.writes), (1, 0, 4));
        assert!(conn.is_autocommit());
    }

    /// An unguarded write that fails (or panics) after it changed rows leaves nothing of itself:
    /// the group's transaction is rolled back with it, the writes applied before it in the
    /// transaction are told to try again (nothing of them was written), and the writes after
    /// it are applied in a new transaction.
    #[test]
    fn an_unguarded_write_failing_after_it_changed_rows_rolls_back_its_group() {
        let (_dir, conn, ctx) = setup();
        let counters = Counters::default();
        let (a, ra) = job(insert(1));
        let (b, rb) = hot("b", insert(2));
        let (bad, rbad) = hot("claim_run", |c| {
            c.execute("INSERT INTO t VALUES (3)", [])?;
            Err(OpError::Corrupt("a row that does not decode".into()))
        });
        let (d, rd) = hot("d", insert(4));
        let (p, rp) = hot("commit", |c| {
            c.execute("INSERT INTO t VALUES (5)", []).unwrap();
            panic!("a bug in a write");
        });
        let (e, re) = job(insert(6));
        let mut group = vec![a, b, bad, d, p, e];
        run_group(&conn, &ctx, &mut group, &counters, None);
        assert!(group.is_empty());
        for (rx, failed) in [(ra, "claim_run"), (rb, "claim_run"), (rd, "commit")] {
            let err = answer(rx).unwrap_err();
            assert!(err.is_retryable(), "{err}");
            let msg = err.to_string();
            assert!(msg.contains(failed) && msg.contains("try again"), "{msg}");
            assert!(msg.contains(&ctx.path.display().to_string()), "names the file: {msg}");
        }
        assert_eq!(answer(rbad).unwrap_err().kind(), StoreErrorKind::Backend, "keeps its own error");
        assert_eq!(answer(rp).unwrap_err().kind(), StoreErrorKind::Backend);
        assert!(answer(re).is_ok());
        assert_eq!(rows(&conn), [6], "nothing of the rolled-back transactions is left");
        let stats = counters.snapshot();
        assert_eq!((stats.transactions, stats.failed_groups, stats.writes), (1, 2, 6));
        assert!(conn.is_autocommit());
    }

    #[test]
    fn a_transaction_lost_mid_group_fails_every_write_and_keeps_nothing() {
        let (_dir, conn, ctx) = setup();
        let counters = Counters::default();
        let (a, ra) = job(insert(1));
        // Ends the whole transaction, as SQLite does on disk full or an I/O error.
        let (b, rb) = job(|c| {
            c.execute_batch("ROLLBACK")?;
            Err(OpError::Corrupt("the disk caught fire".into()))
        });
        let (d, rd) = job(insert(3));
        let mut group = vec![a, b, d];
        run_group(&conn, &ctx, &mut group, &counters, None);
        let stats = counters.snapshot();
        assert_eq!((stats.transactions, stats.failed_groups, stats.writes), (0, 1, 3));
        // The write that broke it gets its own error; the others the group's.
        assert_eq!(answer(rb).unwrap_err().kind(), StoreErrorKind::Backend);
        assert_eq!(answer(ra).unwrap_err().kind(), StoreErrorKind::Backend);
        assert_eq!(answer(rd).unwrap_err().kind(), StoreErrorKind::Backend);
        assert!(rows(&conn).is_empty());
        assert!(conn.is_autocommit());
    }

    /// A write that goes on after SQLite rolled back the transaction under it (it swallowed
    /// the error): the group fails, and no write after it runs outside the transaction.
    #[test]
    fn a_transaction_lost_under_a_write_that_succeeds_fails_the_group() {
        for guard in [Guard::Savepoint, Guard::None] {
            let (_dir, conn, ctx) = setup();
            let counters = Counters::default();
            let (a, ra) = hot("a", insert(1));
            let (reply, rb) = oneshot::channel();
            let swallowing = |c: &Connection| {
                c.execute_batch("ROLLBACK")?;
                Ok(())
            };
            let b: Box<dyn WriteJob> = Box::new(Job { op: "b", guard, f: Some(swallowing), out: None, reply });
            let (d, rd) = hot("d", insert(3));
            run_group(&conn, &ctx, &mut vec![a, b, d], &counters, None);
            for rx in [ra, rb, rd] {
                assert_eq!(answer(rx).unwrap_err().kind(), StoreErrorKind::Backend, "{guard:?}");
            }
            assert!(rows(&conn).is_empty(), "{guard:?}: nothing committed on its own");
            assert!(conn.is_autocommit());
        }
    }

    #[test]
    fn a_full_disk_fails_the_write_that_hit_it_names_the_file_and_keeps_nothing_of_it() {
        let (_dir, conn, ctx) = setup();
        // SQLite's page limit stands in for a full disk: the same SQLITE_FULL error.
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        conn.execute_batch(&format!("PRAGMA max_page_count = {}", pages + 2)).unwrap();
        let counters = Counters::default();
        let (a, ra) = job(insert(1));
        let (big, rbig) = job(|c| {
            c.execute("INSERT INTO t VALUES (?1)", [2])?;
            c.execute("CREATE TABLE blobs (b BLOB)", [])?;
            c.execute("INSERT INTO blobs VALUES (zeroblob(1000000))", [])?;
            Ok(())
        });
        let mut group = vec![a, big];
        run_group(&conn, &ctx, &mut group, &counters, None);
        let err = answer(rbig).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Backend);
        let msg = err.to_string();
        assert!(msg.contains("disk is full") && msg.contains(&ctx.path.display().to_string()), "{msg}");
        // Whether SQLite kept the transaction (then the other write commits) or rolled it
        // back (then it fails too), nothing of the failed write is left and no transaction
        // stays open.
        let kept_a = answer(ra).is_ok();
        assert_eq!(rows(&conn), if kept_a { vec![1] } else { vec![] });
        assert!(conn.is_autocommit());
        let (c, rc) = job(insert(3));
        run_group(&conn, &ctx, &mut vec![c], &counters, None);
        answer(rc).unwrap();
    }

    #[test]
    fn a_group_that_cannot_start_is_unavailable_and_retryable() {
        let (_dir, conn, ctx) = setup();
        let ctx = Ctx { busy_timeout: Duration::from_millis(1), ..ctx };
        conn.busy_timeout(Duration::from_millis(1)).unwrap();
        let other = Connection::open(&ctx.path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let counters = Counters::default();
        let (a, ra) = job(insert(1));
        run_group(&conn, &ctx, &mut vec![a], &counters, None);
        let err = answer(ra).unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(err.to_string().contains(&ctx.path.display().to_string()), "names the file: {err}");
        other.execute_batch("ROLLBACK").unwrap();
        let (b, rb) = job(insert(2));
        run_group(&conn, &ctx, &mut vec![b], &counters, None);
        answer(rb).unwrap();
        assert_eq!(rows(&conn), [2]);
    }

    /// A gate with `limits`, on a store with the whole schema.
    fn gate_setup() -> (tempfile::TempDir, Connection, Ctx) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gates.db");
        let conn = crate::schema::open_writer(&path, &crate::SqliteOptions::default()).unwrap();
        let ctx = Ctx { path, busy_timeout: Duration::from_secs(5) };
        (dir, conn, ctx)
    }

    /// A write that asks `limits`' gate for a slot for `holder`, then fails (a conflict) if
    /// `fail`.
    fn take_slot(
        guard: Guard,
        holder: &'static str,
        limits: durable_core::admission::Limits,
        fail: bool,
    ) -> (Box<dyn WriteJob>, oneshot::Receiver<StoreResult<durable_core::admission::Admission>>) {
        let request = durable_core::admission::SlotRequest {
            gate: "queue:default:api".into(),
            holder: holder.into(),
            run_id: durable_core::RunId::new(holder),
            priority: 0,
            fairness_key: String::new(),
            limits,
            lease_until: None,
            max_waiting: None,
            succeeds: None,
            now: 1_000,
        };
        let f = move |conn: &Connection| {
            let admission = crate::admission::acquire_slot(conn, &request)?;
            if fail {
                return Err(OpError::Store(StoreError::Conflict { message: format!("{holder} fails") }));
            }
            Ok(admission)
        };
        let (reply, rx) = oneshot::channel();
        (Box::new(Job { op: "acquire_slot", guard, f: Some(f), out: None, reply }), rx)
    }

    /// (the gate row's `window_count`, its `held`, its slot rows).
    fn gate_row(conn: &Connection) -> (i64, i64, i64) {
        conn.query_row(
            "SELECT window_count, held, (SELECT COUNT(*) FROM admission_slots) FROM admission_gates",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    }

    /// The gate rows a transaction keeps (read once, written at its end) follow its
    /// rollbacks: a write that took a slot and then failed leaves the slot free for the writes
    /// after it in the group, whether its savepoint is rolled back or (unguarded) the whole
    /// transaction; a failed unguarded write that changed only a gate (a rate window) counts
    /// as a write that changed rows.
    #[test]
    fn a_failed_write_leaves_the_gates_it_changed_as_they_were() {
        use durable_core::admission::{Admission, Limits, Rate};
        // Room for three: the first, taken before the group, then `a` and `b`, or `a` and `c`.
        let three = Limits { concurrency: Some(3), ..Limits::default() };
        let three_per_minute = Limits { rate: Some(Rate { limit: 3, period_ms: 60_000 }), ..Limits::default() };
        for (guard, limits) in [(Guard::Savepoint, three), (Guard::None, three), (Guard::None, three_per_minute)] {
            let what = format!("{guard:?}, {limits:?}");
            let (_dir, conn, ctx) = gate_setup();
            let counters = Counters::default();
            let (first, first_rx) = take_slot(Guard::Savepoint, "first", limits, false);
            run_group(&conn, &ctx, &mut vec![first], &counters, None);
            first_rx.blocking_recv().unwrap().unwrap();
            let (a, ra) = take_slot(guard, "a", limits, false);
            let (b, rb) = take_slot(guard, "b", limits, true);
            let (c, rc) = take_slot(guard, "c", limits, false);
            run_group(&conn, &ctx, &mut vec![a, b, c], &counters, None);
            let (a, b, c) = (ra.blocking_recv().unwrap(), rb.blocking_recv().unwrap(), rc.blocking_recv().unwrap());
            assert_eq!(b.unwrap_err().kind(), StoreErrorKind::Conflict, "{what}");
            // `c` is admitted where `b` was, whatever happened to `a`.
            let a_stands = match guard {
                Guard::Savepoint => a.unwrap() == Admission::Admitted,
                // The unguarded failure rolled back the transaction `a` was in.
                Guard::None => {
                    assert!(a.unwrap_err().is_retryable(), "{what}");
                    false
                }
            };
            assert_eq!(c.unwrap(), Admission::Admitted, "{what}: b's slot or window is free again");
            let (window, held, slots) = gate_row(&conn);
            let admitted = 2 + i64::from(a_stands);
            if limits.concurrency.is_some() {
                assert_eq!((held, slots), (admitted, admitted), "{what}: the row counts the slots that stand");
            } else {
                assert_eq!(window, admitted, "{what}: the window counts the admissions that stand");
            }
        }
    }
}
