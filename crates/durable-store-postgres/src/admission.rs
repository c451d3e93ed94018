//! Flow control ([`durable_core::admission`]): the `admission_*` tables and functions
//! (`sql/v8.sql`), the reads of [`Store::admission_stats`](durable_core::Store::admission_stats)
//! and [`Store::run_admission`](durable_core::Store::run_admission), and the statements the plan
//! test reads.
//!
//! Acquires and releases are operations of the writer, batched like a signal: each locks its
//! gate's row, so acquirers and releasers of one gate, in any process, take turns. The rules are
//! [`AdmissionBook`](durable_core::admission::AdmissionBook)'s, in PL/pgSQL; the stats are rolled
//! with [`GateRecord::roll`] on this side.

use durable_core::admission::{Admission, GateRecord, GateStats, Rank, SlotRecord, SlotRequest, WaiterRecord};
use durable_core::{Millis, RunId, StoreResult};
use serde::Deserialize;
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::PostgresStore;
use crate::ops::{self, LimitsJson, Op, SlotRequestJson, millis_from_sql, millis_to_sql, u32_from_sql};

/// A statement of a server-side helper of `sql/v8.sql` or `sql/v18.sql`, as the helper runs it:
/// `{s}` stands for the schema, `$n` for the helper's `n`-th parameter or variable (named in
/// `params`, as in the SQL). The plan test EXPLAINs these; a unit test checks the migrations run
/// exactly this text.
pub(crate) struct HelperStatement {
    pub(crate) sql: &'static str,
    /// Read by the unit test that finds the statement in the migration.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) params: &'static [&'static str],
}

/// `admission_head`: the holder at the head of a gate's queue.
pub(crate) const QUEUE_HEAD: HelperStatement = HelperStatement {
    sql: "SELECT w.holder FROM {s}.admission_waiters AS w \
          WHERE w.gate = $1 ORDER BY w.rank_priority, w.rank_round, w.rank_ticket LIMIT 1",
    params: &["p_gate"],
};

/// `admission_acquire` (v18): how many waiters of a gate rank before a rank, counted no further
/// than its decision needs.
pub(crate) const AHEAD: HelperStatement = HelperStatement {
    sql: "SELECT count(*) FROM (SELECT 1 FROM {s}.admission_waiters AS w \
          WHERE w.gate = $1 AND (w.rank_priority, w.rank_round, w.rank_ticket) < ($2, $3, $4) \
          LIMIT $5) AS l",
    params: &["v_gate", "v_rp", "v_rr", "v_rt", "v_cap"],
};

/// `admission_acquire` (v18): how many requests wait at a gate, counted up to a new request's
/// maximum.
pub(crate) const WAITING: HelperStatement = HelperStatement {
    sql: "SELECT count(*) FROM (SELECT 1 FROM {s}.admission_waiters AS w WHERE w.gate = $1 LIMIT $2) AS l",
    params: &["v_gate", "v_max"],
};

/// `admission_key_round`: the round after the last one a fairness key's waiters hold.
pub(crate) const KEY_ROUND: HelperStatement = HelperStatement {
    sql: "SELECT max(w.rank_round) + 1 FROM {s}.admission_waiters AS w \
          WHERE w.gate = $1 AND w.fairness_key = $2",
    params: &["p_gate", "p_key"],
};

/// `admission_live`: the slots of a gate that count at a time.
pub(crate) const LIVE: HelperStatement = HelperStatement {
    sql: "SELECT count(*) FROM {s}.admission_slots AS s \
          WHERE s.gate = $1 AND (s.lease_until IS NULL OR s.lease_until > $2)",
    params: &["p_gate", "p_now"],
};

/// `admission_gates_of`: the gates a release of a run looks at.
pub(crate) const GATES_OF: HelperStatement = HelperStatement {
    sql: "SELECT x.gate FROM ( \
          SELECT s.gate FROM {s}.admission_slots AS s WHERE s.run_id = $1 \
          UNION SELECT w.gate FROM {s}.admission_waiters AS w WHERE w.run_id = $1) AS x \
          ORDER BY x.gate",
    params: &["p_run"],
};

impl HelperStatement {
    pub(crate) fn render(&self, schema: &str) -> String {
        self.sql.replace("{s}", schema)
    }
}

/// The admission reads, with the schema filled in.
pub(crate) struct AdmissionStatements {
    pub(crate) stats: String,
    pub(crate) run_admission: String,
}

impl AdmissionStatements {
    pub(crate) fn new(s: &str) -> Self {
        AdmissionStatements {
            // One statement, one snapshot: `$1` is now (for the slots that count).
            stats: format!(
                "SELECT g.gate, g.limits::text, g.next_ticket, g.round, g.window_start, g.window_count, g.touched,
                        (SELECT count(*) FROM {s}.admission_slots AS s
                          WHERE s.gate = g.gate AND (s.lease_until IS NULL OR s.lease_until > $1)),
                        (SELECT count(*) FROM {s}.admission_waiters AS w WHERE w.gate = g.gate),
                        (SELECT min(w.since) FROM {s}.admission_waiters AS w WHERE w.gate = g.gate),
                        (SELECT COALESCE(jsonb_agg(jsonb_build_array(k.fairness_key, k.n) ORDER BY k.fairness_key),
                                         '[]'::jsonb)
                           FROM (SELECT w.fairness_key, count(*) AS n FROM {s}.admission_waiters AS w
                                  WHERE w.gate = g.gate GROUP BY w.fairness_key) AS k)::text
                   FROM {s}.admission_gates AS g ORDER BY g.gate"
            ),
            // A run's slots and queued requests, each by gate then holder, in one snapshot.
            run_admission: format!(
                "SELECT (SELECT COALESCE(jsonb_agg(to_jsonb(s) ORDER BY s.gate, s.holder), '[]'::jsonb)
                           FROM {s}.admission_slots AS s WHERE s.run_id = $1)::text,
                        (SELECT COALESCE(jsonb_agg(to_jsonb(w) ORDER BY w.gate, w.holder), '[]'::jsonb)
                           FROM {s}.admission_waiters AS w WHERE w.run_id = $1)::text"
            ),
        }
    }
}

/// An `admission_slots` row, as `to_jsonb` writes it.
#[derive(Debug, Deserialize)]
struct SlotRow {
    gate: String,
    holder: String,
    run_id: String,
    acquired_at: i64,
    lease_until: Option<i64>,
}

impl SlotRow {
    fn into_record(self) -> Result<SlotRecord, String> {
        let what = |col: &str| format!("slot {} of gate {}: {col}", self.holder, self.gate);
        Ok(SlotRecord {
            acquired_at: millis_from_sql(self.acquired_at, || what("acquired_at"))?,
            lease_until: self.lease_until.map(|t| millis_from_sql(t, || what("lease_until"))).transpose()?,
            run_id: RunId::new(self.run_id),
            gate: self.gate,
            holder: self.holder,
        })
    }
}

/// An `admission_waiters` row, as `to_jsonb` writes it.
#[derive(Debug, Deserialize)]
struct WaiterRow {
    gate: String,
    holder: String,
    run_id: String,
    rank_priority: i64,
    rank_round: i64,
    rank_ticket: i64,
    priority: i32,
    fairness_key: String,
    lease_ms: Option<i64>,
    since: i64,
}

impl WaiterRow {
    fn into_record(self) -> Result<WaiterRecord, String> {
        let what = |col: &str| format!("waiter {} of gate {}: {col}", self.holder, self.gate);
        Ok(WaiterRecord {
            rank: Rank { priority: self.rank_priority, round: self.rank_round, ticket: self.rank_ticket },
            priority: self.priority,
            lease_ms: self.lease_ms.map(|t| millis_from_sql(t, || what("lease_ms"))).transpose()?,
            since: millis_from_sql(self.since, || what("since"))?,
            run_id: RunId::new(self.run_id),
            fairness_key: self.fairness_key,
            gate: self.gate,
            holder: self.holder,
        })
    }
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// A row of the stats statement, rolled to `now` as [`AdmissionBook::stats`] does.
///
/// [`AdmissionBook::stats`]: durable_core::admission::AdmissionBook::stats
fn stats_from_row(row: &Row, now: Millis) -> Result<Result<GateStats, String>, tokio_postgres::Error> {
    let gate: String = row.try_get(0)?;
    let limits: String = row.try_get(1)?;
    let (next_ticket, round): (i64, i64) = (row.try_get(2)?, row.try_get(3)?);
    let (window_start, window_count, touched): (i64, i64, i64) = (row.try_get(4)?, row.try_get(5)?, row.try_get(6)?);
    let (held, waiting): (i64, i64) = (row.try_get(7)?, row.try_get(8)?);
    let oldest: Option<i64> = row.try_get(9)?;
    let by_key: String = row.try_get(10)?;
    let what = |col: &str| format!("gate {gate}: {col}");
    let stats = || -> Result<GateStats, String> {
        let limits: LimitsJson = serde_json::from_str(&limits).map_err(|e| format!("{}: {e}", what("limits")))?;
        let mut record = GateRecord {
            limits: limits.into_limits(&gate)?,
            next_ticket,
            round,
            window_start: millis_from_sql(window_start, || what("window_start"))?,
            window_count: u32_from_sql(window_count, || what("window_count"))?,
            touched: millis_from_sql(touched, || what("touched"))?,
            gate: gate.clone(),
        };
        record.roll(now);
        let by_key: Vec<(String, i64)> =
            serde_json::from_str(&by_key).map_err(|e| format!("{}: {e}", what("waiting by key")))?;
        Ok(GateStats {
            limits: record.limits,
            held: count(held),
            waiting: count(waiting),
            window_count: record.window_count,
            window_start: record.window_start,
            oldest_waiting_since: oldest.map(|t| millis_from_sql(t, || what("since"))).transpose()?,
            waiting_by_key: by_key.into_iter().map(|(k, n)| (k, count(n))).collect(),
            gate: record.gate,
        })
    };
    Ok(stats())
}

impl PostgresStore {
    pub(crate) async fn acquire_slot_now(&self, request: &SlotRequest) -> StoreResult<Admission> {
        let answer = self.write(Op::AcquireSlot(SlotRequestJson::new(request)?)).await?;
        self.answer(ops::admission_answer(&answer, &request.run_id))
    }

    pub(crate) async fn release_slot_now(&self, gate: &str, holder: &str, now: Millis) -> StoreResult<Vec<RunId>> {
        let answer = self.write(Op::ReleaseSlot { gate, holder, now: millis_to_sql(now) }).await?;
        self.answer(ops::handed_answer(&answer))
    }

    pub(crate) async fn admission_stats_now(&self, now: Millis) -> StoreResult<Vec<GateStats>> {
        let at = millis_to_sql(now);
        let rows = self.query("reading admission stats", &self.inner.admission_sql.stats, &[(&at, Type::INT8)]).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(self.decode("reading admission stats", stats_from_row(row, now))?);
        }
        Ok(out)
    }

    pub(crate) async fn run_admission_now(&self, id: &RunId) -> StoreResult<(Vec<SlotRecord>, Vec<WaiterRecord>)> {
        let doing = "reading a run's admission records";
        let id_s = id.as_str();
        let rows = self.query(doing, &self.inner.admission_sql.run_admission, &[(&id_s, Type::TEXT)]).await?;
        let texts =
            rows.first().map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, String>(1)?))).transpose();
        let decoded = texts.map(|texts| {
            let (slots, waiters) = texts.unwrap_or_else(|| ("[]".into(), "[]".into()));
            let slots: Vec<SlotRow> = serde_json::from_str(&slots).map_err(|e| format!("{doing}: {e}"))?;
            let waiters: Vec<WaiterRow> = serde_json::from_str(&waiters).map_err(|e| format!("{doing}: {e}"))?;
            Ok((
                slots.into_iter().map(SlotRow::into_record).collect::<Result<_, String>>()?,
                waiters.into_iter().map(WaiterRow::into_record).collect::<Result<_, String>>()?,
            ))
        });
        self.decode(doing, decoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The plan test EXPLAINs these statements: they must be what the server-side helpers run.
    #[test]
    fn helper_statements_are_the_migrations_own() {
        let migration = normalized(concat!(include_str!("sql/v8.sql"), include_str!("sql/v18.sql")));
        for h in [QUEUE_HEAD, AHEAD, WAITING, KEY_ROUND, LIVE, GATES_OF] {
            let mut sql = h.render("__SCHEMA__");
            for (i, name) in h.params.iter().enumerate().rev() {
                sql = sql.replace(&format!("${}", i + 1), name);
            }
            let sql = normalized(&sql);
            assert!(migration.contains(&sql), "no migration runs: {sql}");
        }
    }
}
