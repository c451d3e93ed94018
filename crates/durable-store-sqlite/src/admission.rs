//! Flow control: admission gates, held slots and queued requests as SQL on one connection.
//!
//! The records are `durable_core::admission`'s, one row each (`admission_gates`,
//! `admission_slots`, `admission_waiters`), and every call does what
//! [`AdmissionBook`](durable_core::admission::AdmissionBook) does, step for step: the gate's row
//! is loaded into a [`GateRecord`], the pure helpers ([`GateRecord::touch`],
//! [`GateRecord::roll`], [`GateRecord::capacity`], [`GateRecord::rank`], [`decide`],
//! [`GateRecord::admitted`], [`handed_lease`]) decide, and the row is written back. SQL only
//! answers what the book reads from its collections: the live slots of a gate, whether a holder
//! holds or waits, the queue's head, how many waiters rank before a request, a fairness key's
//! last round.
//!
//! Writes run in the caller's write transaction (see `ops`), so a decision and what it records
//! are atomic, across processes too (`BEGIN IMMEDIATE`). On the writer thread a gate's row is
//! kept for the transaction: read once, its changes written before the commit (see `KEPT`).
//! The slots handed on are collected as
//! [`Handoff`]s and their runs woken by [`wake_handed`] where the memory store wakes them.
//!
//! Cost: a gate's row counts its slot rows (`held`, kept by every write that inserts or deletes
//! a slot and saved with the row), so its live slots are `held` less those whose lease passed
//! (one step of `admission_slots_leased`; a request counts them, a release only when someone
//! waits) and no slot is read to count them; the queue's head, the count of waiters ranked
//! before a request (stopped at the count that can change the answer), a key's round and a
//! holder's row are index reads; a hand-off of `k` slots is `k` head reads and writes (none
//! more once the gate is full). No call walks a gate's whole queue, except the stats and a
//! refusal (`Full` reports how many wait).

use std::collections::{BTreeMap, HashMap};

use durable_core::admission::{
    Admission, Decision, GateRecord, GateStats, Handoff, Limits, Rank, SlotRecord, SlotRequest, WaiterRecord, decide,
    handed_lease,
};
use durable_core::{CreateRun, Millis, NewRun, RunId, StoreError, protocol};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::ops::{OpError, OpResult, corrupt, millis_from_sql, millis_to_sql, opt_millis, text, u32_from_sql};

// ---- statements ---------------------------------------------------------------------------

const GATE_LOAD: &str = "SELECT gate, limits, next_ticket, round, window_start, window_count, touched, held \
     FROM admission_gates WHERE gate = ?1";

/// Saves a gate that has no row yet.
const GATE_INSERT: &str = "INSERT INTO admission_gates \
     (gate, limits, next_ticket, round, window_start, window_count, touched, held) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
     ON CONFLICT (gate) DO UPDATE SET limits = excluded.limits, next_ticket = excluded.next_ticket, \
     round = excluded.round, window_start = excluded.window_start, window_count = excluded.window_count, \
     touched = excluded.touched, held = excluded.held";

/// Saves a loaded gate: its limits only when they changed (`?8` not NULL), so the common save
/// encodes no JSON and rewrites one row in place.
const GATE_UPDATE: &str = "UPDATE admission_gates SET next_ticket = ?2, round = ?3, window_start = ?4, \
     window_count = ?5, touched = ?6, held = ?7, limits = COALESCE(?8, limits) WHERE gate = ?1";

/// All the slots of a gate (live or not), a count of its primary-key prefix: only for a gate
/// without a row yet, whose `held` is not known (a gate's row counts its slots).
const SLOTS: &str = "SELECT COUNT(*) FROM admission_slots WHERE gate = ?1";

/// The slots of a gate whose lease passed at `?2` (`admission_slots_leased`; none right after
/// a [`RECLAIM`] at the same time, so usually an empty range): the live slots are the gate's
/// `held` less these.
const EXPIRED: &str =
    "SELECT COUNT(*) FROM admission_slots WHERE gate = ?1 AND lease_until IS NOT NULL AND lease_until <= ?2";

/// Deletes the slots of a gate whose lease passed at `?2`.
/// Only leased slots can expire: `admission_slots_leased` holds just those, so a gate of
/// unleased slots (a concurrency key's) is answered without reading them.
const RECLAIM: &str = "DELETE FROM admission_slots WHERE gate = ?1 AND lease_until IS NOT NULL AND lease_until <= ?2";

/// Queues a request.
const WAITER_INSERT: &str = "INSERT INTO admission_waiters (gate, holder, run_id, rank_priority, rank_round, \
     rank_ticket, priority, fairness_key, lease_ms, since) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// The head of a gate's queue (`admission_waiters_rank`).
const QUEUE_HEAD: &str = "SELECT gate, holder, run_id, rank_priority, rank_round, rank_ticket, priority, \
     fairness_key, lease_ms, since FROM admission_waiters WHERE gate = ?1 \
     ORDER BY rank_priority, rank_round, rank_ticket LIMIT 1";

/// How many waiters of a gate rank before `(?2, ?3, ?4)`, counting no further than `?5`
/// (`admission_waiters_rank`).
const AHEAD: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM admission_waiters WHERE gate = ?1 \
     AND (rank_priority, rank_round, rank_ticket) < (?2, ?3, ?4) LIMIT ?5)";

/// How many requests wait at a gate, counting no further than `?2` (a negative `?2`: all).
const WAITING: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM admission_waiters WHERE gate = ?1 LIMIT ?2)";

/// The last round a fairness key's waiters hold (`admission_waiters_key`).
const KEY_ROUND: &str = "SELECT MAX(rank_round) FROM admission_waiters WHERE gate = ?1 AND fairness_key = ?2";

/// The rank of a holder's queued request (the primary key).
const WAITER_RANK: &str =
    "SELECT rank_priority, rank_round, rank_ticket FROM admission_waiters WHERE gate = ?1 AND holder = ?2";

/// A run's slots and queued requests, by gate then holder (`admission_slots_run`,
/// `admission_waiters_run`).
const RUN_SLOTS: &str = "SELECT gate, holder, run_id, acquired_at, lease_until FROM admission_slots \
     WHERE run_id = ?1 ORDER BY gate, holder";
const RUN_WAITERS: &str = "SELECT gate, holder, run_id, rank_priority, rank_round, rank_ticket, priority, \
     fairness_key, lease_ms, since FROM admission_waiters WHERE run_id = ?1 ORDER BY gate, holder";

/// The gates a run holds slots of (`admission_slots_run`).
/// The gates a run holds a slot at (`1`) or waits at (`0`): one read, empty for a run that never
/// used flow control (its settle costs no more).
const RUN_GATES: &str = "SELECT gate, 1 FROM admission_slots WHERE run_id = ?1 \
     UNION ALL SELECT gate, 0 FROM admission_waiters WHERE run_id = ?1";

/// The statements whose plans `tests/sqlite_plans.rs` checks: `(name, table, sql, args, what
/// the plan must search by)`.
pub(crate) fn plan_statements() -> Vec<(&'static str, &'static str, &'static str, Vec<Value>, &'static str)> {
    let gate = || Value::Text("queue:default:api".into());
    let run = || Value::Text("r".into());
    let int = Value::Integer;
    vec![
        ("queue head", "admission_waiters", QUEUE_HEAD, vec![gate()], "INDEX admission_waiters_rank (gate=?)"),
        (
            "waiters ranked before",
            "admission_waiters",
            AHEAD,
            vec![gate(), int(0), int(0), int(7), int(64)],
            "INDEX admission_waiters_rank (gate=? AND (rank_priority,rank_round,rank_ticket)<(?,?,?))",
        ),
        ("waiting, up to a bound", "admission_waiters", WAITING, vec![gate(), int(10)], "(gate=?)"),
        (
            "a fairness key's round",
            "admission_waiters",
            KEY_ROUND,
            vec![gate(), Value::Text("acme".into())],
            "INDEX admission_waiters_key (gate=? AND fairness_key=?)",
        ),
        (
            "a holder's rank",
            "admission_waiters",
            WAITER_RANK,
            vec![gate(), Value::Text("r:1".into())],
            "PRIMARY KEY (gate=? AND holder=?)",
        ),
        (
            "a run's queued requests",
            "admission_waiters",
            RUN_WAITERS,
            vec![run()],
            "INDEX admission_waiters_run (run_id=?)",
        ),
        ("a run's slots", "admission_slots", RUN_SLOTS, vec![run()], "INDEX admission_slots_run (run_id=?)"),
        ("the gates of a run", "admission_slots", RUN_GATES, vec![run()], "INDEX admission_slots_run (run_id=?)"),
        ("the gates of a run", "admission_waiters", RUN_GATES, vec![run()], "INDEX admission_waiters_run (run_id=?)"),
        ("a gate's slots", "admission_slots", SLOTS, vec![gate()], "PRIMARY KEY (gate=?)"),
        (
            "a gate's slots whose lease passed",
            "admission_slots",
            EXPIRED,
            vec![gate(), int(5)],
            "INDEX admission_slots_leased (gate=? AND lease_until",
        ),
        (
            "a gate's expired slots",
            "admission_slots",
            RECLAIM,
            vec![gate(), int(5)],
            "INDEX admission_slots_leased (gate=? AND lease_until",
        ),
        ("a gate", "admission_gates", GATE_LOAD, vec![gate()], "(gate=?)"),
    ]
}

// ---- rows ---------------------------------------------------------------------------------

fn json_text(encoded: serde_json::Result<String>) -> OpResult<String> {
    encoded.map_err(|e| OpError::Store(StoreError::backend(e)))
}

/// The gate columns, `gate` first, `held` last.
const GATE_COLS: &str = "gate, limits, next_ticket, round, window_start, window_count, touched, held";

/// A gate's row: the book's record and the number of slot rows the gate has (`held`, live or
/// not), which every write that inserts or deletes a slot keeps, saved with the record.
#[derive(Clone)]
struct Gate {
    record: GateRecord,
    held: u32,
    /// The limits its row holds (`None`: it has no row yet).
    stored_limits: Option<Limits>,
}

impl Gate {
    /// `held` less `n` slots just deleted (rows the count included).
    fn freed(&mut self, n: u32) -> OpResult<()> {
        self.held = self.held.checked_sub(n).ok_or_else(|| {
            corrupt(format!(
                "admission gate {:?}: {n} slots deleted but its row counts {} (held)",
                self.record.gate, self.held
            ))
        })?;
        Ok(())
    }
}

fn stored_gate_from_row(row: &Row<'_>) -> OpResult<Gate> {
    let record = gate_from_row(row)?;
    let held = u32_from_sql(row.get(7)?, || format!("admission gate {:?}: held", record.gate))?;
    Ok(Gate { stored_limits: Some(record.limits), record, held })
}

fn gate_from_row(row: &Row<'_>) -> OpResult<GateRecord> {
    let gate = text(row, 0)?.to_string();
    let what = |col: &str| format!("admission gate {gate:?}: {col}");
    let limits: Limits =
        serde_json::from_str(text(row, 1)?).map_err(|e| corrupt(format!("{}: {e}", what("limits"))))?;
    Ok(GateRecord {
        limits,
        next_ticket: row.get(2)?,
        round: row.get(3)?,
        window_start: millis_from_sql(row.get(4)?, || what("window_start"))?,
        window_count: u32_from_sql(row.get(5)?, || what("window_count"))?,
        touched: millis_from_sql(row.get(6)?, || what("touched"))?,
        gate,
    })
}

// ---- the gates of the writer's transaction ------------------------------------------------

/// The gate rows of the writer thread's open write transaction.
#[derive(Default)]
struct Kept {
    /// Each gate read or written in the transaction, as it stands in it, and whether it was
    /// changed since it was last written to its row.
    gates: HashMap<String, (Gate, bool)>,
    /// How many times a gate was changed (saved) in the transaction.
    saves: u64,
}

std::thread_local! {
    /// The gates the writer thread's open write transaction has read or written (`None`: no
    /// transaction is open on this thread, nothing is kept). A keyed start and a keyed settle
    /// each read their gate and change it: kept here, a gate's row is read once per group of
    /// writes and written once before its commit, instead of both once per request (it is
    /// read again after a rollback, and written before each savepoint that follows a change).
    /// Inside `BEGIN IMMEDIATE` no other connection writes, and every read and write of a
    /// gate's row on the writer connection goes through [`load_gate`] and [`save_gate`]
    /// (`stats` reads committed rows on a reader connection). The writer writes the changed
    /// gates to their rows ([`write_changed_gates`]) before a savepoint and before the
    /// commit, and drops them all when a rollback undoes writes ([`forget_kept_gates`]) and
    /// when the transaction ends.
    static KEPT: std::cell::RefCell<Option<Kept>> = const { std::cell::RefCell::new(None) };
}

/// The writer thread opened a write transaction: gates are kept for it from now on.
pub(crate) fn transaction_began() {
    KEPT.with(|k| *k.borrow_mut() = Some(Kept::default()));
}

/// Writes the gates changed in the writer's transaction to their rows (before a savepoint,
/// so that rolling it back undoes only what came after; and before the commit).
pub(crate) fn write_changed_gates(conn: &Connection) -> OpResult<()> {
    // Outside a transaction (SQLite rolled it back) nothing kept may be written: it would
    // commit on its own.
    if conn.is_autocommit() {
        return Err(OpError::Store(StoreError::backend(
            "SQLite rolled back the write transaction: the admission gates it changed are not written",
        )));
    }
    // Taken as they are to be written; kept as they will then stand (a failed write fails
    // the transaction, which drops them all).
    let mut changed: Vec<Gate> = KEPT.with(|k| {
        let mut k = k.borrow_mut();
        let Some(kept) = k.as_mut() else { return Vec::new() };
        let dirty = kept.gates.values_mut().filter(|(_, dirty)| *dirty);
        dirty
            .map(|(g, dirty)| {
                *dirty = false;
                let to_write = g.clone();
                g.stored_limits = Some(g.record.limits);
                to_write
            })
            .collect()
    });
    changed.sort_by(|a, b| a.record.gate.cmp(&b.record.gate));
    changed.iter().try_for_each(|g| write_gate(conn, g))
}

/// How many times gates were changed in the writer's transaction: a write that changed one
/// changed the database, though its row is written later.
pub(crate) fn gate_saves() -> u64 {
    KEPT.with(|k| k.borrow().as_ref().map_or(0, |kept| kept.saves))
}

/// A rollback (of a savepoint or of the transaction) is about to undo writes: the kept gates
/// may no longer be the stored ones (and those changed since the last
/// [`write_changed_gates`] are undone too).
pub(crate) fn forget_kept_gates() {
    KEPT.with(|k| {
        if let Some(kept) = k.borrow_mut().as_mut() {
            kept.gates.clear();
        }
    });
}

/// The write transaction ended (committed or rolled back): nothing is kept.
pub(crate) fn transaction_ended() {
    KEPT.with(|k| *k.borrow_mut() = None);
}

fn load_gate(conn: &Connection, gate: &str) -> OpResult<Option<Gate>> {
    let kept = KEPT.with(|k| k.borrow().as_ref().map(|kept| kept.gates.get(gate).map(|(g, _)| g.clone())));
    if let Some(Some(g)) = kept {
        return Ok(Some(g));
    }
    let mut stmt = conn.prepare_cached(GATE_LOAD)?;
    let mut rows = stmt.query([gate])?;
    let loaded = rows.next()?.map(stored_gate_from_row).transpose()?;
    if kept.is_some()
        && let Some(g) = &loaded
    {
        KEPT.with(|k| {
            if let Some(kept) = k.borrow_mut().as_mut() {
                kept.gates.insert(gate.to_string(), (g.clone(), false));
            }
        });
    }
    Ok(loaded)
}

/// Saves `g`: kept, changed, for the writer's open transaction (written to its row by
/// [`write_changed_gates`]), or written at once when none is open.
fn save_gate(conn: &Connection, g: &Gate) -> OpResult<()> {
    let kept = KEPT.with(|k| match k.borrow_mut().as_mut() {
        Some(kept) => {
            kept.gates.insert(g.record.gate.clone(), (g.clone(), true));
            kept.saves += 1;
            true
        }
        None => false,
    });
    if kept { Ok(()) } else { write_gate(conn, g) }
}

/// Writes `g` to its row (inserted if it has none).
fn write_gate(conn: &Connection, g: &Gate) -> OpResult<()> {
    let r = &g.record;
    match g.stored_limits {
        Some(stored) => {
            let limits = if stored == r.limits { None } else { Some(json_text(serde_json::to_string(&r.limits))?) };
            conn.prepare_cached(GATE_UPDATE)?.execute(params![
                r.gate,
                r.next_ticket,
                r.round,
                millis_to_sql(r.window_start),
                r.window_count,
                millis_to_sql(r.touched),
                g.held,
                limits,
            ])?;
        }
        None => {
            conn.prepare_cached(GATE_INSERT)?.execute(params![
                r.gate,
                json_text(serde_json::to_string(&r.limits))?,
                r.next_ticket,
                r.round,
                millis_to_sql(r.window_start),
                r.window_count,
                millis_to_sql(r.touched),
                g.held,
            ])?;
        }
    }
    Ok(())
}

fn waiter_from_row(row: &Row<'_>) -> OpResult<WaiterRecord> {
    let gate = text(row, 0)?.to_string();
    let holder = text(row, 1)?.to_string();
    let what = |col: &str| format!("admission waiter {holder:?} at {gate:?}: {col}");
    let priority = i32::try_from(row.get::<_, i64>(6)?).map_err(|_| corrupt(what("priority out of range")))?;
    Ok(WaiterRecord {
        run_id: RunId::new(text(row, 2)?),
        rank: Rank { priority: row.get(3)?, round: row.get(4)?, ticket: row.get(5)? },
        priority,
        fairness_key: text(row, 7)?.to_string(),
        lease_ms: opt_millis(row, 8, || what("lease_ms"))?,
        since: millis_from_sql(row.get(9)?, || what("since"))?,
        gate,
        holder,
    })
}

fn slot_from_row(row: &Row<'_>) -> OpResult<SlotRecord> {
    let gate = text(row, 0)?.to_string();
    let holder = text(row, 1)?.to_string();
    let what = |col: &str| format!("admission slot {holder:?} at {gate:?}: {col}");
    Ok(SlotRecord {
        run_id: RunId::new(text(row, 2)?),
        acquired_at: millis_from_sql(row.get(3)?, || what("acquired_at"))?,
        lease_until: opt_millis(row, 4, || what("lease_until"))?,
        gate,
        holder,
    })
}

fn count(v: i64) -> OpResult<u32> {
    u32_from_sql(v, || "admission count".to_string())
}

// ---- the book's collections, as queries ---------------------------------------------------

/// `Gate::live`: the slots of `g` that count at `now` (its slot rows less those whose lease
/// passed).
fn count_live(conn: &Connection, g: &Gate, now: Millis) -> OpResult<u32> {
    let expired =
        count(conn.prepare_cached(EXPIRED)?.query_row(params![g.record.gate, millis_to_sql(now)], |r| r.get(0))?)?;
    Ok(g.held.saturating_sub(expired))
}

/// The slot rows of `gate`, for a gate without a row (see [`SLOTS`]).
fn count_slots(conn: &Connection, gate: &str) -> OpResult<u32> {
    count(conn.prepare_cached(SLOTS)?.query_row([gate], |r| r.get(0))?)
}

/// `Gate::reclaim`: deletes the slots of `gate` whose lease passed; how many there were. They
/// are counted first (a read of `admission_slots_leased`, usually an empty range), and
/// deleted only if there are any.
fn reclaim(conn: &Connection, gate: &str, now: Millis) -> OpResult<u32> {
    let expired = count(conn.prepare_cached(EXPIRED)?.query_row(params![gate, millis_to_sql(now)], |r| r.get(0))?)?;
    if expired == 0 {
        return Ok(0);
    }
    count(conn.prepare_cached(RECLAIM)?.execute(params![gate, millis_to_sql(now)])? as i64)
}

/// Records `slot` (replacing the holder's slot at its gate, if it has one); the gate's `held`
/// counts it if it is new.
fn insert_slot(conn: &Connection, g: &mut Gate, slot: &SlotRecord) -> OpResult<()> {
    let inserted =
        conn.prepare_cached(
            "INSERT INTO admission_slots (gate, holder, run_id, acquired_at, lease_until) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (gate, holder) DO NOTHING",
        )?
        .execute(params![
            slot.gate,
            slot.holder,
            slot.run_id.as_str(),
            millis_to_sql(slot.acquired_at),
            slot.lease_until.map(millis_to_sql)
        ])? > 0;
    if inserted {
        g.held = g.held.saturating_add(1);
    } else {
        conn.prepare_cached(
            "UPDATE admission_slots SET run_id = ?3, acquired_at = ?4, lease_until = ?5 WHERE gate = ?1 AND holder = ?2",
        )?
        .execute(params![
            slot.gate,
            slot.holder,
            slot.run_id.as_str(),
            millis_to_sql(slot.acquired_at),
            slot.lease_until.map(millis_to_sql)
        ])?;
    }
    Ok(())
}

/// `Gate::unqueue`: deletes `holder`'s queued request at `gate`.
fn unqueue(conn: &Connection, gate: &str, holder: &str) -> OpResult<()> {
    conn.prepare_cached("DELETE FROM admission_waiters WHERE gate = ?1 AND holder = ?2")?.execute([gate, holder])?;
    Ok(())
}

fn queue_head(conn: &Connection, gate: &str) -> OpResult<Option<WaiterRecord>> {
    let mut stmt = conn.prepare_cached(QUEUE_HEAD)?;
    let mut rows = stmt.query([gate])?;
    rows.next()?.map(waiter_from_row).transpose()
}

/// `Gate::key_round`: the round after the last one `key`'s waiters hold.
fn key_round(conn: &Connection, gate: &str, key: &str) -> OpResult<Option<i64>> {
    let last: Option<i64> = conn.prepare_cached(KEY_ROUND)?.query_row([gate, key], |r| r.get(0))?;
    Ok(last.map(|r| r + 1))
}

/// How many waiters of `gate` rank before `rank`, or `bound` if at least that many do.
fn count_ahead(conn: &Connection, gate: &str, rank: Rank, bound: u32) -> OpResult<u32> {
    count(
        conn.prepare_cached(AHEAD)?
            .query_row(params![gate, rank.priority, rank.round, rank.ticket, i64::from(bound)], |r| r.get(0))?,
    )
}

/// How many requests wait at `gate`, or `bound` if at least that many do (`None`: all).
fn count_waiting(conn: &Connection, gate: &str, bound: Option<u32>) -> OpResult<u32> {
    let limit = bound.map_or(-1, i64::from);
    count(conn.prepare_cached(WAITING)?.query_row(params![gate, limit], |r| r.get(0))?)
}

/// `Gate::hand_off`, on a loaded gate (the caller saves it) whose slots were just reclaimed
/// at `now`: hands free capacity to the best waiters at `now` (or the gate's latest time, if
/// later).
fn hand_off(conn: &Connection, g: &mut Gate, now: Millis, out: &mut Vec<Handoff>) -> OpResult<()> {
    let reclaimed_at = now;
    let now = g.record.touch(now);
    g.record.roll(now);
    // The slots are counted only when someone waits: a release at a gate with an empty queue
    // (the common case) costs the head read alone. Once counted, a gate with no capacity left
    // reads no head.
    let mut live = None;
    loop {
        if let Some(n) = live
            && g.record.capacity(n) == 0
        {
            break;
        }
        let Some(w) = queue_head(conn, &g.record.gate)? else { break };
        let held = match live {
            Some(n) => n,
            // Right after a reclaim at the same time, every slot row is live.
            None if now == reclaimed_at => *live.insert(g.held),
            None => *live.insert(count_live(conn, g, now)?),
        };
        if g.record.capacity(held) == 0 {
            break;
        }
        unqueue(conn, &w.gate, &w.holder)?;
        g.record.admitted(w.rank);
        if g.record.limits.concurrency.is_some() {
            let slot = SlotRecord {
                gate: w.gate.clone(),
                holder: w.holder.clone(),
                run_id: w.run_id.clone(),
                acquired_at: now,
                lease_until: handed_lease(&w, now),
            };
            insert_slot(conn, g, &slot)?;
            // The book counts the slots again: the new one counts if it is live.
            if slot.live(now) {
                live = Some(held + 1);
            }
        }
        out.push(Handoff { gate: w.gate, holder: w.holder, run_id: w.run_id });
    }
    Ok(())
}

/// [`hand_off`] at `gate` after `freed` of its slots were deleted and its slots reclaimed at
/// `now`, loading and saving its row (nothing when it has none).
fn hand_off_gate(conn: &Connection, gate: &str, freed: u32, now: Millis, out: &mut Vec<Handoff>) -> OpResult<()> {
    let Some(mut g) = load_gate(conn, gate)? else { return Ok(()) };
    g.freed(freed)?;
    hand_off(conn, &mut g, now, out)?;
    save_gate(conn, &g)
}

// ---- the book's methods -------------------------------------------------------------------

/// `AdmissionBook::acquire`: decides `request` and records the outcome; slots a reclaim handed
/// on are added to `out`.
///
/// `fresh`: the holder is a run id with no run row (a start's key request): it holds nothing
/// and waits nowhere (a run's slots and requests go with its row), so that is not read.
pub(crate) fn acquire(
    conn: &Connection,
    request: &SlotRequest,
    fresh: bool,
    out: &mut Vec<Handoff>,
) -> OpResult<Admission> {
    let now = request.now;
    let gate = request.gate.as_str();
    let mut stored = load_gate(conn, gate)?;
    let reclaimed = reclaim(conn, gate, now)?;
    if reclaimed > 0
        && let Some(g) = stored.as_mut()
    {
        g.freed(reclaimed)?;
        hand_off(conn, g, now, out)?;
        save_gate(conn, g)?;
    }
    // A holder is admitted again (its lease set to the request's, if it brings one).
    let held = match request.lease_until {
        _ if fresh => false,
        Some(until) => {
            conn.prepare_cached("UPDATE admission_slots SET lease_until = ?3 WHERE gate = ?1 AND holder = ?2")?
                .execute(params![gate, request.holder, millis_to_sql(until)])?
                > 0
        }
        None => conn
            .prepare_cached("SELECT 1 FROM admission_slots WHERE gate = ?1 AND holder = ?2")?
            .exists([gate, request.holder.as_str()])?,
    };
    if held {
        return Ok(Admission::Admitted);
    }
    // A successor takes its predecessor's slot over (`SlotRequest::succeeds`): the gate's
    // count of slots is unchanged.
    if let Some(from) = &request.succeeds {
        let moved = conn
            .prepare_cached(
                "UPDATE admission_slots SET holder = ?3, run_id = ?4, acquired_at = ?5, lease_until = ?6 \
                 WHERE gate = ?1 AND holder = ?2",
            )?
            .execute(params![
                gate,
                from,
                request.holder,
                request.run_id.as_str(),
                millis_to_sql(now),
                request.lease_until.map(millis_to_sql)
            ])?;
        if moved > 0 {
            if !fresh {
                conn.prepare_cached("DELETE FROM admission_waiters WHERE gate = ?1 AND holder = ?2")?
                    .execute([gate, request.holder.as_str()])?;
            }
            return Ok(Admission::Admitted);
        }
    }
    let mut g = match stored {
        Some(g) => g,
        None => Gate {
            record: GateRecord::new(gate, request.limits, now),
            held: count_slots(conn, gate)?,
            stored_limits: None,
        },
    };
    g.record.limits = request.limits;
    g.record.touch(now);
    g.record.roll(now);
    // The slots were reclaimed at `now`: every slot row is live.
    let live = g.held;
    let queued: Option<Rank> = if fresh {
        None
    } else {
        conn.prepare_cached(WAITER_RANK)?
            .query_row([gate, request.holder.as_str()], |r| {
                Ok(Rank { priority: r.get(0)?, round: r.get(1)?, ticket: r.get(2)? })
            })
            .optional()?
    };
    let key_round =
        if queued.is_none() && g.record.limits.fairness { key_round(conn, gate, &request.fairness_key)? } else { None };
    // A new request's rank is probed on a copy: it takes a ticket only if it waits.
    let rank = match queued {
        Some(rank) => rank,
        None => g.record.clone().rank(request.priority, &mut { key_round }),
    };
    let bound = g.record.ahead_cap(live);
    let ahead = if bound == 0 { 0 } else { count_ahead(conn, gate, rank, bound)? };
    // The queue's length matters only to a new request with a maximum: counted up to it.
    let waiting = match request.max_waiting {
        Some(max) if queued.is_none() => count_waiting(conn, gate, Some(max))?,
        _ => 0,
    };
    let answer = match decide(&g.record, request, live, ahead, waiting, queued.is_some()) {
        Decision::Admit => {
            if queued.is_some() {
                unqueue(conn, gate, &request.holder)?;
            }
            g.record.admitted(rank);
            if g.record.limits.concurrency.is_some() {
                insert_slot(
                    conn,
                    &mut g,
                    &SlotRecord {
                        gate: request.gate.clone(),
                        holder: request.holder.clone(),
                        run_id: request.run_id.clone(),
                        acquired_at: now,
                        lease_until: request.lease_until,
                    },
                )?;
            }
            Admission::Admitted
        }
        // Nothing written: the gate's row stays as it was.
        Decision::Full => return Ok(Admission::Full { held: live, waiting: count_waiting(conn, gate, None)? }),
        Decision::Wait { retry_at } => {
            if queued.is_none() {
                let rank = g.record.rank(request.priority, &mut { key_round });
                conn.prepare_cached(WAITER_INSERT)?.execute(params![
                    gate,
                    request.holder,
                    request.run_id.as_str(),
                    rank.priority,
                    rank.round,
                    rank.ticket,
                    request.priority,
                    request.fairness_key,
                    request.lease_until.map(|t| millis_to_sql(t.saturating_sub(now))),
                    millis_to_sql(now),
                ])?;
            }
            Admission::Waiting { retry_at }
        }
    };
    save_gate(conn, &g)?;
    Ok(answer)
}

/// `AdmissionBook::release`: releases `holder`'s slot or queued request at `gate` and hands
/// the freed capacity on.
pub(crate) fn release(
    conn: &Connection,
    gate: &str,
    holder: &str,
    now: Millis,
    out: &mut Vec<Handoff>,
) -> OpResult<()> {
    let freed = count(
        conn.prepare_cached("DELETE FROM admission_slots WHERE gate = ?1 AND holder = ?2")?.execute([gate, holder])?
            as i64,
    )?;
    unqueue(conn, gate, holder)?;
    let freed = freed + reclaim(conn, gate, now)?;
    if freed > 0 {
        hand_off_gate(conn, gate, freed, now, out)?;
    }
    Ok(())
}

/// `AdmissionBook::release_run`: releases every slot and queued request of `run` and hands the
/// freed capacity on (see [`release_runs`]).
pub(crate) fn release_run(conn: &Connection, run: &str, now: Millis, out: &mut Vec<Handoff>) -> OpResult<()> {
    release_runs(conn, &[run], now, out)
}

/// `AdmissionBook::release_runs`: releases every slot and queued request of `runs`, then, at
/// each gate they had something at (in name order), reclaims the slots whose lease passed at
/// `now` and hands the freed capacity on.
pub(crate) fn release_runs(conn: &Connection, runs: &[&str], now: Millis, out: &mut Vec<Handoff>) -> OpResult<()> {
    // Gate → how many slots were freed there (none: the runs only waited at it).
    let mut touched: BTreeMap<String, u32> = BTreeMap::new();
    for run in runs {
        let (mut holds, mut waits) = (false, false);
        {
            let mut stmt = conn.prepare_cached(RUN_GATES)?;
            for row in stmt.query_map([run], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))? {
                let (gate, slot) = row?;
                *touched.entry(gate).or_default() += u32::from(slot);
                holds |= slot;
                waits |= !slot;
            }
        }
        if holds {
            conn.prepare_cached("DELETE FROM admission_slots WHERE run_id = ?1")?.execute([run])?;
        }
        if waits {
            conn.prepare_cached("DELETE FROM admission_waiters WHERE run_id = ?1")?.execute([run])?;
        }
    }
    for (gate, freed) in &touched {
        let freed = freed + reclaim(conn, gate, now)?;
        if freed > 0 {
            hand_off_gate(conn, gate, freed, now, out)?;
        }
    }
    Ok(())
}

/// `AdmissionBook::renew`: the leased slots of `run` take the run's new lease.
pub(crate) fn renew(conn: &Connection, run: &str, lease_until: Millis) -> OpResult<()> {
    conn.prepare_cached("UPDATE admission_slots SET lease_until = ?2 WHERE run_id = ?1 AND lease_until IS NOT NULL")?
        .execute(params![run, millis_to_sql(lease_until)])?;
    Ok(())
}

/// Wakes the runs slots were handed to at `now`, the time of the call that handed them (as the
/// memory store does; a deletion's is 0): a run waiting for its concurrency key (`pending`,
/// `wake_at = GATED`) is due then; any other is woken as a delivery wakes it.
pub(crate) fn wake_handed(conn: &Connection, handed: &[Handoff], now: Millis) -> OpResult<()> {
    let at = millis_to_sql(now);
    for h in handed {
        let id = h.run_id.as_str();
        let gated = conn
            .prepare_cached(
                "UPDATE runs SET wake_at = ?2, wake_gen = wake_gen + 1, updated_at = ?2 \
                 WHERE id = ?1 AND status = 'pending' AND wake_at = ?3",
            )?
            .execute(params![id, at, millis_to_sql(protocol::GATED)])?;
        if gated == 0 {
            crate::ops::wake(conn, id, at)?;
        }
    }
    Ok(())
}

// ---- store methods ------------------------------------------------------------------------

/// `acquire_slot`.
pub(crate) fn acquire_slot(conn: &Connection, request: &SlotRequest) -> OpResult<Admission> {
    let mut handed = Vec::new();
    let answer = acquire(conn, request, false, &mut handed)?;
    wake_handed(conn, &handed, request.now)?;
    Ok(answer)
}

/// `AdmissionBook::release_holder`: the slot `holder` of `run` holds at whatever gate is
/// released and handed on, its runs woken (a gated remote step's accepted result).
pub(crate) fn release_holder(conn: &Connection, run: &str, holder: &str, now: Millis) -> OpResult<()> {
    let gate: Option<String> = conn
        .prepare_cached("SELECT gate FROM admission_slots WHERE run_id = ?1 AND holder = ?2")?
        .query_row([run, holder], |r| r.get(0))
        .optional()?;
    if let Some(gate) = gate {
        release_slot(conn, &gate, holder, now)?;
    }
    Ok(())
}

/// `release_slot`: the runs woken.
pub(crate) fn release_slot(conn: &Connection, gate: &str, holder: &str, now: Millis) -> OpResult<Vec<RunId>> {
    let mut handed = Vec::new();
    release(conn, gate, holder, now, &mut handed)?;
    wake_handed(conn, &handed, now)?;
    Ok(handed.into_iter().map(|h| h.run_id).collect())
}

/// `create_run` with the run's concurrency key decided first (holder = the run): refused
/// (`QueueFull`, decided before any row is written — a key's slots have no lease, so there
/// is nothing to reclaim first; in a batch, the caller's savepoint undoes the runs created
/// before it), created due-never
/// (`wake_at = GATED`) to wait for its slot, or created as usual. An existing id is answered
/// without deciding anything.
pub(crate) fn create_run(conn: &Connection, mut new: NewRun) -> OpResult<CreateRun> {
    if let Some(mut request) = new.admission.take() {
        // The common case, a new id, is one step of the runs' primary key.
        let exists = conn.prepare_cached("SELECT 1 FROM runs WHERE id = ?1")?.exists([new.id.as_str()])?;
        if exists && let Some(existing) = crate::ops::get_run(conn, &new.id)? {
            return Ok(CreateRun::Existing(existing));
        }
        request.holder = new.id.to_string();
        request.run_id = new.id.clone();
        request.lease_until = None;
        let mut handed = Vec::new();
        let answer = acquire(conn, &request, !exists, &mut handed)?;
        wake_handed(conn, &handed, request.now)?;
        match answer {
            Admission::Admitted => {}
            Admission::Waiting { .. } => new.start_at = Some(protocol::GATED),
            Admission::Full { held, waiting } => {
                return Err(StoreError::QueueFull { gate: request.gate, held, waiting }.into());
            }
        }
    }
    crate::ops::create_run(conn, new)
}

/// `admission_stats`, from one snapshot.
pub(crate) fn stats(conn: &Connection, now: Millis) -> OpResult<Vec<GateStats>> {
    let tx = conn.unchecked_transaction()?;
    let mut held: HashMap<String, u32> = HashMap::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT gate, COUNT(*) FROM admission_slots WHERE lease_until IS NULL OR lease_until > ?1 GROUP BY gate",
        )?;
        let mut rows = stmt.query([millis_to_sql(now)])?;
        while let Some(row) = rows.next()? {
            held.insert(text(row, 0)?.to_string(), count(row.get(1)?)?);
        }
    }
    #[derive(Default)]
    struct Queue {
        waiting: u32,
        oldest: Option<Millis>,
        by_key: BTreeMap<String, u32>,
    }
    let mut queues: HashMap<String, Queue> = HashMap::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT gate, fairness_key, COUNT(*), MIN(since) FROM admission_waiters GROUP BY gate, fairness_key",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let n = count(row.get(2)?)?;
            let since = millis_from_sql(row.get(3)?, || "admission stats: since".to_string())?;
            let q = queues.entry(text(row, 0)?.to_string()).or_default();
            q.waiting = q.waiting.saturating_add(n);
            q.oldest = Some(q.oldest.map_or(since, |o| o.min(since)));
            q.by_key.insert(text(row, 1)?.to_string(), n);
        }
    }
    let mut out = Vec::new();
    let mut stmt = tx.prepare_cached(&format!("SELECT {GATE_COLS} FROM admission_gates ORDER BY gate"))?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let mut record = gate_from_row(row)?;
        record.roll(now);
        let q = queues.remove(&record.gate).unwrap_or_default();
        out.push(GateStats {
            held: held.get(&record.gate).copied().unwrap_or(0),
            waiting: q.waiting,
            window_count: record.window_count,
            window_start: record.window_start,
            oldest_waiting_since: q.oldest,
            waiting_by_key: q.by_key.into_iter().collect(),
            limits: record.limits,
            gate: record.gate,
        });
    }
    Ok(out)
}

/// `run_admission`, from one snapshot.
pub(crate) fn run_admission(conn: &Connection, id: &RunId) -> OpResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
    let tx = conn.unchecked_transaction()?;
    let mut slots = Vec::new();
    {
        let mut stmt = tx.prepare_cached(RUN_SLOTS)?;
        let mut rows = stmt.query([id.as_str()])?;
        while let Some(row) = rows.next()? {
            slots.push(slot_from_row(row)?);
        }
    }
    let mut waits = Vec::new();
    {
        let mut stmt = tx.prepare_cached(RUN_WAITERS)?;
        let mut rows = stmt.query([id.as_str()])?;
        while let Some(row) = rows.next()? {
            waits.push(waiter_from_row(row)?);
        }
    }
    Ok((slots, waits))
}
