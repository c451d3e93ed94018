//! The store's operations: how writes are encoded for the server-side functions (`sql/v*.sql`)
//! and how their JSON answers and read queries' rows decode into the data model.
//!
//! Each mirrors the method of the same name in `durable-store-memory`, the reference.

use durable_core::admission::{Admission, Limits, Order, PriorityOrder, Rate, SlotRequest};
use durable_core::task::{
    BeatOutcome, NewTask, QueueStats, Task, TaskCompletion, TaskDone, TaskLog, TaskState, WorkerInfo,
};
use durable_core::{
    BufferAppend, BufferedDeliveries, BufferedKind, BufferedQuery, Checkpoint, Claim, ClaimOutcome, Commit,
    CommitOutcome, CreateRun, Delivery, DueQuery, Gather, Millis, NewRun, ParentLink, Payload, Publish, Published,
    QueueReason, QueuedRun, Run, RunFilter, RunId, RunPatch, RunQuery, RunStatus, SaveOutcome, SaveSchedule,
    ScheduleRecord, StepError, StoreError, TriggerBuffer, TurnEnd, WaitKind, Waiter, decode_cursor,
};
use durable_core::{TaskFilter, codes, protocol};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

// ---- value codecs -------------------------------------------------------------------------

/// Times are `u64` milliseconds; PostgreSQL's bigint is `i64`. Values past `i64::MAX` (only
/// "forever" sentinels like `u64::MAX`) are stored as `i64::MAX`, which reads back as
/// `u64::MAX`. Order is preserved, so comparisons in SQL stay right.
pub(crate) fn millis_to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn millis_from_sql(v: i64, what: impl FnOnce() -> String) -> Result<u64, String> {
    if v == i64::MAX {
        return Ok(u64::MAX);
    }
    u64::try_from(v).map_err(|_| format!("{}: negative value {v}", what()))
}

pub(crate) fn u32_from_sql(v: i64, what: impl FnOnce() -> String) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{}: {v} is out of range", what()))
}

fn error_json(e: &StepError) -> String {
    // A struct of strings and a bool: serialising cannot fail.
    serde_json::to_string(e).unwrap_or_else(|_| String::from("{}"))
}

fn step_error(s: Option<String>, what: impl FnOnce() -> String) -> Result<Option<StepError>, String> {
    s.map(|s| serde_json::from_str(&s).map_err(|e| format!("{}: error is not valid: {e}", what()))).transpose()
}

fn run_status(s: &str, id: &str) -> Result<RunStatus, String> {
    s.parse().map_err(|e| format!("run {id}: {e}"))
}

// ---- rows, as columns or as JSON ------------------------------------------------------------

/// The columns of `runs`, in [`RunRow::from_row`]'s order.
pub(crate) const RUN_COLS: &str = "id, workflow, version, namespace, status, input, output, error, tags, priority, \
     parent_id, parent_seq, created_at, updated_at, wake_at, lease_owner, lease_until, recovery_attempts, wake_gen, \
     trace_context, claims";

/// A `runs` row, as the server's `to_jsonb(runs)` or a query's columns.
#[derive(Debug, Deserialize)]
pub(crate) struct RunRow {
    id: String,
    workflow: String,
    version: i64,
    namespace: String,
    status: String,
    input: String,
    output: Option<String>,
    error: Option<String>,
    tags: Vec<String>,
    priority: i32,
    parent_id: Option<String>,
    parent_seq: Option<i64>,
    created_at: i64,
    updated_at: i64,
    wake_at: Option<i64>,
    lease_owner: Option<String>,
    lease_until: Option<i64>,
    recovery_attempts: i64,
    wake_gen: i64,
    #[serde(default)]
    trace_context: Option<String>,
    /// The claims that acquired the run (schema version 14).
    #[serde(default)]
    claims: i64,
}

impl RunRow {
    pub(crate) fn from_row(row: &Row) -> Result<RunRow, tokio_postgres::Error> {
        Ok(RunRow {
            id: row.try_get(0)?,
            workflow: row.try_get(1)?,
            version: row.try_get(2)?,
            namespace: row.try_get(3)?,
            status: row.try_get(4)?,
            input: row.try_get(5)?,
            output: row.try_get(6)?,
            error: row.try_get(7)?,
            tags: row.try_get(8)?,
            priority: row.try_get(9)?,
            parent_id: row.try_get(10)?,
            parent_seq: row.try_get(11)?,
            created_at: row.try_get(12)?,
            updated_at: row.try_get(13)?,
            wake_at: row.try_get(14)?,
            lease_owner: row.try_get(15)?,
            lease_until: row.try_get(16)?,
            recovery_attempts: row.try_get(17)?,
            wake_gen: row.try_get(18)?,
            trace_context: row.try_get(19)?,
            claims: row.try_get(20)?,
        })
    }

    pub(crate) fn into_run(self) -> Result<Run, String> {
        let id = self.id;
        let what = |col: &str| format!("run {id}: {col}");
        let parent = match (self.parent_id, self.parent_seq) {
            (Some(pid), Some(seq)) => {
                Some(ParentLink { run_id: RunId::new(pid), seq: u32_from_sql(seq, || what("parent_seq"))? })
            }
            _ => None,
        };
        let status = run_status(&self.status, &id)?;
        Ok(Run {
            workflow: self.workflow,
            version: u32_from_sql(self.version, || what("version"))?,
            namespace: self.namespace,
            input: Payload::from_trusted(self.input),
            output: self.output.map(Payload::from_trusted),
            error: step_error(self.error, || what("error"))?,
            tags: self.tags,
            priority: self.priority,
            parent,
            created_at: millis_from_sql(self.created_at, || what("created_at"))?,
            updated_at: millis_from_sql(self.updated_at, || what("updated_at"))?,
            wake_at: self.wake_at.map(|v| millis_from_sql(v, || what("wake_at"))).transpose()?,
            status,
            lease_owner: self.lease_owner,
            lease_until: self.lease_until.map(|v| millis_from_sql(v, || what("lease_until"))).transpose()?,
            recovery_attempts: u32_from_sql(self.recovery_attempts, || what("recovery_attempts"))?,
            wake_gen: millis_from_sql(self.wake_gen, || what("wake_gen"))?,
            claims: millis_from_sql(self.claims, || what("claims"))?,
            trace_context: self.trace_context,
            id: RunId::new(id),
        })
    }
}

/// The columns of `checkpoints`, in [`CheckpointRow::from_row`]'s order.
pub(crate) const CHECKPOINT_COLS: &str =
    "run_id, seq, name, kind, status, input, output, error, attempts, wake_at, started_at, updated_at";

/// A `checkpoints` row.
#[derive(Debug, Deserialize)]
pub(crate) struct CheckpointRow {
    run_id: String,
    seq: i64,
    name: String,
    kind: String,
    status: String,
    input: Option<String>,
    output: Option<String>,
    error: Option<String>,
    attempts: i64,
    wake_at: Option<i64>,
    started_at: i64,
    updated_at: i64,
}

impl CheckpointRow {
    pub(crate) fn from_row(row: &Row) -> Result<CheckpointRow, tokio_postgres::Error> {
        Ok(CheckpointRow {
            run_id: row.try_get(0)?,
            seq: row.try_get(1)?,
            name: row.try_get(2)?,
            kind: row.try_get(3)?,
            status: row.try_get(4)?,
            input: row.try_get(5)?,
            output: row.try_get(6)?,
            error: row.try_get(7)?,
            attempts: row.try_get(8)?,
            wake_at: row.try_get(9)?,
            started_at: row.try_get(10)?,
            updated_at: row.try_get(11)?,
        })
    }

    pub(crate) fn into_checkpoint(self) -> Result<Checkpoint, String> {
        let (run_id, seq_raw) = (self.run_id, self.seq);
        let what = |col: &str| format!("run {run_id} seq {seq_raw}: {col}");
        Ok(Checkpoint {
            seq: u32_from_sql(seq_raw, || what("seq"))?,
            name: self.name,
            kind: self.kind.parse().map_err(|e| format!("{}: {e}", what("kind")))?,
            status: self.status.parse().map_err(|e| format!("{}: {e}", what("status")))?,
            input: self.input.map(Payload::from_trusted),
            output: self.output.map(Payload::from_trusted),
            error: step_error(self.error, || what("error"))?,
            attempts: u32_from_sql(self.attempts, || what("attempts"))?,
            wake_at: self.wake_at.map(|v| millis_from_sql(v, || what("wake_at"))).transpose()?,
            started_at: millis_from_sql(self.started_at, || what("started_at"))?,
            updated_at: millis_from_sql(self.updated_at, || what("updated_at"))?,
            run_id: RunId::new(run_id),
        })
    }
}

/// The columns of `waiters` that [`waiter_from_row`] reads.
pub(crate) const WAITER_COLS: &str = "run_id, seq, name, kind, key, matcher, created_at";

pub(crate) fn waiter_from_row(row: &Row) -> Result<Result<Waiter, String>, tokio_postgres::Error> {
    let run_id: String = row.try_get(0)?;
    let seq_raw: i64 = row.try_get(1)?;
    let name: String = row.try_get(2)?;
    let kind: String = row.try_get(3)?;
    let key: String = row.try_get(4)?;
    let matcher: Option<String> = row.try_get(5)?;
    let created_at: i64 = row.try_get(6)?;
    let what = |col: &str| format!("waiter of run {run_id} seq {seq_raw}: {col}");
    let kind = match kind.as_str() {
        "signal" => WaitKind::Signal { token: key },
        "event" => match matcher {
            Some(m) => WaitKind::Event { name: key, matcher: Payload::from_trusted(m) },
            None => return Ok(Err(what("event matcher missing"))),
        },
        other => return Ok(Err(format!("{}: {other:?}", what("unknown wait kind")))),
    };
    let seq = match u32_from_sql(seq_raw, || what("seq")) {
        Ok(seq) => seq,
        Err(e) => return Ok(Err(e)),
    };
    let created_at = match millis_from_sql(created_at, || what("created_at")) {
        Ok(t) => t,
        Err(e) => return Ok(Err(e)),
    };
    Ok(Ok(Waiter { run_id: RunId::new(run_id), seq, name, kind, created_at }))
}

// ---- writes: what the client sends ----------------------------------------------------------

/// One write, as `apply()` reads it.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op<'a> {
    CreateRun(CreateRunJson<'a>),
    CreateRuns {
        runs: Vec<KeyedRunJson<'a>>,
    },
    ClaimRun(ClaimJson<'a>),
    RenewLease {
        id: &'a str,
        owner: &'a str,
        until: i64,
    },
    ReleaseLease {
        id: &'a str,
        owner: &'a str,
    },
    Commit(CommitJson<'a>),
    StepCommit(StepCommitJson<'a>),
    SettleCommit(CommitJson<'a>),
    UpdateRunIf(PatchJson<'a>),
    SendSignal {
        token: &'a str,
        payload: &'a str,
        now: i64,
        /// The claim of the run the signal wakes, if it is this one (schema version 23).
        #[serde(skip_serializing_if = "Option::is_none")]
        claim: Option<ClaimJson<'a>>,
    },
    Publish(PublishJson<'a>),
    FlushBuffer {
        workflow: &'a str,
        key: &'a str,
        batch_id: &'a str,
        now: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        admission: Option<SlotRequestJson<'a>>,
    },
    SaveSchedule(SaveScheduleJson<'a>),
    DeleteSchedule {
        key: &'a str,
    },
    DeleteRun {
        id: &'a str,
    },
    CompleteTask(TaskDoneJson<'a>),
    AcquireSlot(SlotRequestJson<'a>),
    ReleaseSlot {
        gate: &'a str,
        holder: &'a str,
        now: i64,
    },
    Enqueue {
        items: Vec<QueueItemJson<'a>>,
        now: i64,
    },
    AckQueued {
        ids: Vec<i64>,
        owner: &'a str,
    },
    ReleaseQueued {
        ids: Vec<i64>,
        owner: &'a str,
    },
}

impl<'a> Op<'a> {
    /// The operation that writes `c`: a [`StepCommit`](Op::StepCommit) if it makes one checkpoint
    /// and nothing else (no turn end, waits, expired waits, state, children, signals, tasks or
    /// released slots: a step's commit), a [`SettleCommit`](Op::SettleCommit) if it settles the
    /// run and makes checkpoints only (a workflow's return), else a [`Commit`](Op::Commit). The
    /// server runs a step's commit in two statements, taking no advisory key, so [`BatchLocks`]
    /// names nothing for it; a settle in three when the run has no waiter, admission slot or
    /// request and no unfinished task (schema version 19), and as a commit otherwise, so its
    /// locks are a settling commit's.
    pub(crate) fn commit(c: &'a Commit) -> Self {
        let Commit {
            run_id,
            owner,
            now,
            checkpoints,
            waits,
            expire_waits,
            state,
            children,
            signals,
            tasks,
            release_slots,
            end,
        } = c;
        let checkpoints_only = waits.is_empty()
            && expire_waits.is_empty()
            && state.is_empty()
            && children.is_empty()
            && signals.is_empty()
            && tasks.is_empty()
            && release_slots.is_empty();
        match checkpoints.as_slice() {
            _ if checkpoints_only && matches!(end, Some(TurnEnd::Settle { .. })) => {
                Op::SettleCommit(CommitJson::new(c))
            }
            [cp] if end.is_none() && checkpoints_only => Op::StepCommit(StepCommitJson {
                run: run_id.as_str(),
                owner,
                now: millis_to_sql(*now),
                checkpoint: CheckpointJson::new(cp),
            }),
            _ => Op::Commit(CommitJson::new(c)),
        }
    }

    /// The JSON text of the operation.
    pub(crate) fn encode(&self) -> String {
        // Strings, numbers and bools only: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// What the operations of one batch lock, gathered by the client for the batch's lock phase
/// (`lock_batch`, schema versions 12 and 18): `apply` takes every advisory key any operation of
/// the batch will take, ascending, then the rows of the admission gates it names, in gate order,
/// then the rows of the runs the batch delivers to (when it delivers to two or more), in id
/// order, before the first operation runs; so batches in flight together take their locks in
/// one global order. Each field lists what an operation's function locks as it runs (they take
/// the keys and rows again, held already); keep them in step with the SQL.
#[derive(Debug, Default, Serialize)]
pub(crate) struct BatchLocks {
    /// Runs all of whose waiters' keys are locked: a commit's run, a patched run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    probe: Vec<String>,
    /// Deleted runs: their waiters' keys, and those of their descendants.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    delete: Vec<String>,
    /// Advisory keys named outright, as `[kind, key]`: waits registered, signal tokens, task
    /// result tokens, event names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    keys: Vec<(&'static str, String)>,
    /// Trigger buffers a publish appends to, as `[workflow, key]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    buffers: Vec<(String, String)>,
    /// Whether the queue lock is taken (an enqueue, a release of queue items).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    queue: bool,
    /// Signal tokens delivered to: their waiters' runs are woken.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tokens: Vec<String>,
    /// Event names published: their waiters' runs are woken.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    events: Vec<String>,
    /// Runs of completed tasks (their rows are locked, then woken).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    task_runs: Vec<String>,
    /// Admission gates whose rows are locked: keyed children and starts, slots acquired or
    /// released.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gates: Vec<String>,
    /// Runs that settle or are cancelled: the rows of every gate they hold or wait at are
    /// locked (they release them all; so are those of `task_runs` and deleted runs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    settles: Vec<String>,
}

impl BatchLocks {
    /// The locks of `op`.
    pub(crate) fn of(op: &Op<'_>) -> BatchLocks {
        fn signal(locks: &mut BatchLocks, token: &str) {
            locks.keys.push(("signal", token.to_string()));
            locks.tokens.push(token.to_string());
        }
        let mut locks = BatchLocks::default();
        match op {
            Op::Commit(c) | Op::SettleCommit(c) => {
                locks.probe.push(c.run.to_string());
                locks.keys.extend(c.waits.iter().map(|w| (w.kind, w.key.to_string())));
                for s in &c.signals {
                    signal(&mut locks, s.token);
                }
                locks.keyed(&c.children);
                locks.gates.extend(c.release_slots.iter().map(|(gate, _)| gate.to_string()));
                if matches!(c.end, Some(EndJson::Settle { .. })) {
                    locks.settles.push(c.run.to_string());
                }
            }
            Op::UpdateRunIf(p) => {
                locks.probe.push(p.id.to_string());
                if RunStatus::ALL.iter().any(|s| s.is_terminal() && p.status == Some(s.as_str())) {
                    // A cancel: it releases every gate of the run.
                    locks.settles.push(p.id.to_string());
                }
                for s in &p.signals {
                    signal(&mut locks, s.token);
                }
            }
            Op::SendSignal { token, .. } => signal(&mut locks, token),
            Op::CompleteTask(t) => {
                locks.keys.push(("signal", t.token.clone()));
                locks.task_runs.push(t.run_id.to_string());
            }
            Op::Publish(p) => {
                locks.keys.push(("event", p.name.to_string()));
                locks.buffers.extend(p.gather.iter().map(|g| (g.workflow.to_string(), g.key.to_string())));
                locks.events.push(p.name.to_string());
                locks.keyed(&p.start);
            }
            Op::DeleteRun { id } => locks.delete.push(id.to_string()),
            Op::Enqueue { .. } | Op::ReleaseQueued { .. } => locks.queue = true,
            Op::CreateRun(c) => locks.gates.extend(c.admission.as_ref().map(|a| a.gate.to_string())),
            Op::CreateRuns { runs } => {
                locks.gates.extend(runs.iter().filter_map(|r| r.admission.as_ref()).map(|a| a.gate.to_string()));
            }
            Op::AcquireSlot(a) => locks.gates.push(a.gate.to_string()),
            Op::ReleaseSlot { gate, .. } => locks.gates.push(gate.to_string()),
            Op::FlushBuffer { admission, .. } => locks.gates.extend(admission.as_ref().map(|a| a.gate.to_string())),
            Op::SaveSchedule(save) => locks.keyed(&save.start),
            Op::ClaimRun(_)
            | Op::StepCommit(_)
            | Op::RenewLease { .. }
            | Op::ReleaseLease { .. }
            | Op::DeleteSchedule { .. }
            | Op::AckQueued { .. } => {}
        }
        locks
    }

    /// The gates of the runs of `runs` created with a concurrency key.
    fn keyed(&mut self, runs: &[NewRunJson<'_>]) {
        self.gates.extend(runs.iter().filter_map(|r| r.admission.as_ref()).map(|a| a.gate.to_string()));
    }

    /// Adds the locks of another request of the batch.
    pub(crate) fn extend(&mut self, other: &BatchLocks) {
        self.probe.extend(other.probe.iter().cloned());
        self.delete.extend(other.delete.iter().cloned());
        self.keys.extend(other.keys.iter().cloned());
        self.buffers.extend(other.buffers.iter().cloned());
        self.queue |= other.queue;
        self.tokens.extend(other.tokens.iter().cloned());
        self.events.extend(other.events.iter().cloned());
        self.task_runs.extend(other.task_runs.iter().cloned());
        self.gates.extend(other.gates.iter().cloned());
        self.settles.extend(other.settles.iter().cloned());
    }

    /// The JSON `lock_batch` reads.
    pub(crate) fn encode(&self) -> String {
        // Strings and bools only: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// An error of the caller's data, found before anything was sent.
fn refused(message: String) -> StoreError {
    StoreError::backend(message)
}

#[derive(Debug, Serialize)]
pub(crate) struct NewRunJson<'a> {
    id: &'a str,
    workflow: &'a str,
    version: u32,
    namespace: &'a str,
    input: &'a str,
    tags: &'a [String],
    priority: i32,
    parent_id: Option<&'a str>,
    parent_seq: Option<u32>,
    created_at: i64,
    /// A delayed start: the run's `wake_at`.
    start_at: Option<i64>,
    trace_context: Option<&'a str>,
    /// The run's concurrency key, for `create_run()` to decide (never refused): only on the
    /// runs of a commit, a publish or a schedule save ([`NewRunJson::keyed`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    admission: Option<SlotRequestJson<'a>>,
}

impl<'a> NewRunJson<'a> {
    /// The run alone, without its concurrency key (a create operation sends the key beside it).
    pub(crate) fn new(run: &'a NewRun) -> Self {
        NewRunJson {
            admission: None,
            id: run.id.as_str(),
            workflow: &run.workflow,
            version: run.version,
            namespace: &run.namespace,
            input: run.input.as_str(),
            tags: &run.tags,
            priority: run.priority,
            parent_id: run.parent.as_ref().map(|p| p.run_id.as_str()),
            parent_seq: run.parent.as_ref().map(|p| p.seq),
            created_at: millis_to_sql(run.created_at),
            start_at: run.start_at.map(millis_to_sql),
            trace_context: run.trace_context.as_deref(),
        }
    }

    /// The run with its concurrency key, which `create_run()` decides (schema version 17).
    pub(crate) fn keyed(run: &'a NewRun) -> Self {
        NewRunJson { admission: run.admission.as_ref().map(SlotRequestJson::unchecked), ..NewRunJson::new(run) }
    }
}

/// A [`NewRunJson`] read back (the run a trigger buffer starts).
#[derive(Debug, Deserialize)]
struct NewRunRow {
    id: String,
    workflow: String,
    version: u32,
    namespace: String,
    input: String,
    tags: Vec<String>,
    priority: i32,
    parent_id: Option<String>,
    parent_seq: Option<u32>,
    created_at: i64,
    #[serde(default)]
    start_at: Option<i64>,
    #[serde(default)]
    trace_context: Option<String>,
}

impl NewRunRow {
    fn into_new_run(self) -> Result<NewRun, String> {
        let what = |col: &str| format!("trigger buffer run {}: {col}", self.id);
        let parent = match (self.parent_id.as_deref(), self.parent_seq) {
            (Some(pid), Some(seq)) => Some(ParentLink { run_id: RunId::new(pid), seq }),
            _ => None,
        };
        let created_at = millis_from_sql(self.created_at, || what("created_at"))?;
        let start_at = self.start_at.map(|v| millis_from_sql(v, || what("start_at"))).transpose()?;
        Ok(NewRun {
            admission: None,
            id: RunId::new(self.id),
            workflow: self.workflow,
            version: self.version,
            namespace: self.namespace,
            input: Payload::from_trusted(self.input),
            tags: self.tags,
            priority: self.priority,
            parent,
            created_at,
            start_at,
            trace_context: self.trace_context,
        })
    }
}

/// How a trigger buffer gathers, as the store keeps it (its own format, not the core's serde
/// form, so the stored rows do not change with it).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum GatherJson {
    Debounce { quiet_ms: u64 },
    Batch { max_items: u32, max_wait_ms: u64 },
}

impl GatherJson {
    fn new(g: &Gather) -> Result<Self, StoreError> {
        match *g {
            Gather::Debounce { quiet_ms } => Ok(GatherJson::Debounce { quiet_ms }),
            Gather::Batch { max_items, max_wait_ms } => Ok(GatherJson::Batch { max_items, max_wait_ms }),
            ref other => Err(refused(format!("this PostgreSQL store cannot gather by {other:?}"))),
        }
    }

    fn into_gather(self) -> Gather {
        match self {
            GatherJson::Debounce { quiet_ms } => Gather::Debounce { quiet_ms },
            GatherJson::Batch { max_items, max_wait_ms } => Gather::Batch { max_items, max_wait_ms },
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct BufferAppendJson<'a> {
    workflow: &'a str,
    key: &'a str,
    batch_id: &'a str,
    gather: GatherJson,
    run: NewRunJson<'a>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DedupeJson<'a> {
    id: &'a str,
    keep_until: i64,
}

/// A [`Publish`], as `publish()` reads it.
#[derive(Debug, Serialize)]
pub(crate) struct PublishJson<'a> {
    name: &'a str,
    payload: &'a str,
    now: i64,
    dedupe: Option<DedupeJson<'a>>,
    start: Vec<NewRunJson<'a>>,
    gather: Vec<BufferAppendJson<'a>>,
}

impl<'a> PublishJson<'a> {
    pub(crate) fn new(p: &'a Publish) -> Result<Self, StoreError> {
        let gather = p
            .gather
            .iter()
            .map(|a: &'a BufferAppend| {
                Ok(BufferAppendJson {
                    workflow: &a.workflow,
                    key: &a.key,
                    batch_id: &a.batch_id,
                    gather: GatherJson::new(&a.gather)?,
                    run: NewRunJson::new(&a.run),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(PublishJson {
            name: &p.name,
            payload: p.payload.as_str(),
            now: millis_to_sql(p.now),
            dedupe: p.dedupe.as_ref().map(|d| DedupeJson { id: &d.id, keep_until: millis_to_sql(d.keep_until) }),
            start: p.start.iter().map(NewRunJson::keyed).collect(),
            gather,
        })
    }
}

/// A [`SaveSchedule`], as `save_schedule()` reads it: the record's columns and its JSON text,
/// with the revision it gets if the save applies.
#[derive(Debug, Serialize)]
pub(crate) struct SaveScheduleJson<'a> {
    key: &'a str,
    namespace: &'a str,
    workflow: &'a str,
    due_at: Option<i64>,
    expected: Option<i64>,
    body: String,
    start: Vec<NewRunJson<'a>>,
}

impl<'a> SaveScheduleJson<'a> {
    pub(crate) fn new(save: &'a SaveSchedule) -> Result<Self, StoreError> {
        let r = &save.record;
        // The revision the server gives it (expected + 1, or 1): the body says the same.
        let revision = save.expected.map_or(1, |e| e.saturating_add(1));
        let body = serde_json::to_string(&ScheduleRecord { revision, ..r.clone() })
            .map_err(|e| refused(format!("schedule {}: cannot be written as JSON: {e}", r.key)))?;
        Ok(SaveScheduleJson {
            key: &r.key,
            namespace: &r.namespace,
            workflow: &r.workflow,
            due_at: r.due_at.map(millis_to_sql),
            expected: save.expected.map(|e| i64::try_from(e).unwrap_or(i64::MAX)),
            body,
            start: save.start.iter().map(NewRunJson::keyed).collect(),
        })
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct CheckpointJson<'a> {
    seq: u32,
    name: &'a str,
    kind: &'static str,
    status: &'static str,
    input: Option<&'a str>,
    output: Option<&'a str>,
    error: Option<String>,
    attempts: u32,
    wake_at: Option<i64>,
    started_at: i64,
    updated_at: i64,
}

/// `step_commit()`'s operation (schema version 15): a commit that makes one checkpoint and
/// nothing else; see [`Op::commit`].
#[derive(Debug, Serialize)]
pub(crate) struct StepCommitJson<'a> {
    run: &'a str,
    owner: &'a str,
    now: i64,
    checkpoint: CheckpointJson<'a>,
}

impl<'a> CheckpointJson<'a> {
    fn new(cp: &'a Checkpoint) -> Self {
        CheckpointJson {
            seq: cp.seq,
            name: &cp.name,
            kind: cp.kind.as_str(),
            status: cp.status.as_str(),
            input: cp.input.as_ref().map(Payload::as_str),
            output: cp.output.as_ref().map(Payload::as_str),
            error: cp.error.as_ref().map(error_json),
            attempts: cp.attempts,
            wake_at: cp.wake_at.map(millis_to_sql),
            started_at: millis_to_sql(cp.started_at),
            updated_at: millis_to_sql(cp.updated_at),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct WaitJson<'a> {
    run_id: &'a str,
    seq: u32,
    name: &'a str,
    kind: &'static str,
    key: &'a str,
    matcher: Option<&'a str>,
    created_at: i64,
}

impl<'a> WaitJson<'a> {
    fn new(w: &'a Waiter) -> Self {
        let (kind, key, matcher) = match &w.kind {
            WaitKind::Signal { token } => ("signal", token.as_str(), None),
            WaitKind::Event { name, matcher } => ("event", name.as_str(), Some(matcher.as_str())),
        };
        WaitJson {
            run_id: w.run_id.as_str(),
            seq: w.seq,
            name: &w.name,
            kind,
            key,
            matcher,
            created_at: millis_to_sql(w.created_at),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct SignalJson<'a> {
    token: &'a str,
    payload: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum EndJson<'a> {
    Suspend {
        wake_at: Option<i64>,
        seen_wake_gen: i64,
    },
    Settle {
        status: &'static str,
        output: Option<&'a str>,
        error: Option<String>,
        /// The statuses the run may settle from (the transition table, evaluated here).
        allowed_from: Vec<&'static str>,
    },
}

#[derive(Debug, Serialize)]
pub(crate) struct CommitJson<'a> {
    run: &'a str,
    owner: &'a str,
    now: i64,
    checkpoints: Vec<CheckpointJson<'a>>,
    waits: Vec<WaitJson<'a>>,
    expire: &'a [u32],
    state: Vec<(&'a str, &'a str)>,
    children: Vec<NewRunJson<'a>>,
    signals: Vec<SignalJson<'a>>,
    tasks: Vec<TaskJson<'a>>,
    /// `(gate, holder)` pairs, as two-element arrays.
    release_slots: Vec<(&'a str, &'a str)>,
    end: Option<EndJson<'a>>,
}

/// The statuses that may become `next` (itself included): the transition table, evaluated on
/// this side so the server-side compare needs no copy of it.
fn allowed_from(next: RunStatus) -> Vec<&'static str> {
    RunStatus::ALL.into_iter().filter(|s| *s == next || s.can_become(next)).map(RunStatus::as_str).collect()
}

impl<'a> CommitJson<'a> {
    pub(crate) fn new(c: &'a Commit) -> Self {
        CommitJson {
            run: c.run_id.as_str(),
            owner: &c.owner,
            now: millis_to_sql(c.now),
            checkpoints: c.checkpoints.iter().map(CheckpointJson::new).collect(),
            waits: c.waits.iter().map(WaitJson::new).collect(),
            expire: &c.expire_waits,
            state: c.state.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            children: c.children.iter().map(NewRunJson::keyed).collect(),
            signals: c.signals.iter().map(|s| SignalJson { token: &s.token, payload: s.payload.as_str() }).collect(),
            tasks: c.tasks.iter().map(TaskJson::new).collect(),
            release_slots: c.release_slots.iter().map(|(g, h)| (g.as_str(), h.as_str())).collect(),
            end: c.end.as_ref().map(|end| match end {
                TurnEnd::Suspend { wake_at, seen_wake_gen } => EndJson::Suspend {
                    wake_at: wake_at.map(millis_to_sql),
                    seen_wake_gen: millis_to_sql(*seen_wake_gen),
                },
                TurnEnd::Settle { status, output, error } => EndJson::Settle {
                    status: status.as_str(),
                    output: output.as_ref().map(Payload::as_str),
                    error: error.as_ref().map(error_json),
                    allowed_from: allowed_from(*status),
                },
            }),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct PatchJson<'a> {
    id: &'a str,
    expected: Vec<&'static str>,
    status: Option<&'static str>,
    allowed_from: Vec<&'static str>,
    set_output: bool,
    output: Option<&'a str>,
    set_error: bool,
    error: Option<String>,
    set_wake_at: bool,
    wake_at: Option<i64>,
    release_lease: bool,
    reset_recovery: bool,
    truncate_history_from: Option<u32>,
    wake: bool,
    signals: Vec<SignalJson<'a>>,
    now: i64,
}

impl<'a> PatchJson<'a> {
    pub(crate) fn new(id: &'a RunId, expected: &[RunStatus], p: &'a RunPatch) -> Self {
        PatchJson {
            id: id.as_str(),
            expected: expected.iter().map(|s| s.as_str()).collect(),
            status: p.status.map(RunStatus::as_str),
            allowed_from: p.status.map(allowed_from).unwrap_or_default(),
            set_output: p.output.is_some(),
            output: p.output.as_ref().and_then(|o| o.as_ref().map(Payload::as_str)),
            set_error: p.error.is_some(),
            error: p.error.as_ref().and_then(|e| e.as_ref().map(error_json)),
            set_wake_at: p.wake_at.is_some(),
            wake_at: p.wake_at.flatten().map(millis_to_sql),
            release_lease: p.release_lease,
            reset_recovery: p.reset_recovery,
            truncate_history_from: p.truncate_history_from,
            wake: p.wake,
            signals: p.signals.iter().map(|s| SignalJson { token: &s.token, payload: s.payload.as_str() }).collect(),
            now: millis_to_sql(p.now),
        }
    }
}

/// A [`NewTask`] of a commit, as `dispatch_tasks()` reads it.
#[derive(Debug, Serialize)]
pub(crate) struct TaskJson<'a> {
    run_id: &'a str,
    seq: u32,
    attempt: u32,
    name: &'a str,
    queue: &'a str,
    namespace: &'a str,
    input: &'a str,
    priority: i32,
    requires: &'a [String],
    pickup_timeout_ms: Option<i64>,
    timeout_ms: Option<i64>,
    heartbeat_timeout_ms: i64,
    created_at: i64,
    trace_context: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claimed_by: Option<&'a str>,
}

impl<'a> TaskJson<'a> {
    fn new(t: &'a NewTask) -> Self {
        TaskJson {
            run_id: t.run_id.as_str(),
            seq: t.seq,
            attempt: t.attempt,
            name: &t.name,
            queue: &t.queue,
            namespace: &t.namespace,
            input: t.input.as_str(),
            priority: t.priority,
            requires: &t.requires,
            pickup_timeout_ms: t.pickup_timeout_ms.map(millis_to_sql),
            timeout_ms: t.timeout_ms.map(millis_to_sql),
            heartbeat_timeout_ms: millis_to_sql(t.heartbeat_timeout_ms),
            created_at: millis_to_sql(t.created_at),
            trace_context: t.trace_context.as_deref(),
            claimed_by: t.claimed_by.as_deref(),
        }
    }
}

/// [`Limits`], as the store keeps them (its own format, not the core's serde form, so the
/// stored rows do not change with it): flat fields the server-side functions read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LimitsJson {
    concurrency: Option<u32>,
    rate_limit: Option<u32>,
    rate_period_ms: Option<i64>,
    lowest_first: bool,
    fairness: bool,
    lifo: bool,
}

impl From<&Limits> for LimitsJson {
    fn from(l: &Limits) -> Self {
        LimitsJson {
            concurrency: l.concurrency,
            rate_limit: l.rate.map(|r| r.limit),
            rate_period_ms: l.rate.map(|r| millis_to_sql(r.period_ms)),
            lowest_first: l.priority == PriorityOrder::LowestFirst,
            fairness: l.fairness,
            lifo: l.order == Order::Lifo,
        }
    }
}

impl LimitsJson {
    /// Refuses a rate window of 0 ms (the window's start is `now - now % period`).
    pub(crate) fn new(gate: &str, l: &Limits) -> Result<Self, StoreError> {
        if l.rate.is_some_and(|r| r.period_ms == 0) {
            return Err(refused(format!("{gate}: a rate window must be at least 1 ms")));
        }
        Ok(LimitsJson::from(l))
    }

    pub(crate) fn into_limits(self, gate: &str) -> Result<Limits, String> {
        let rate = match (self.rate_limit, self.rate_period_ms) {
            (Some(limit), Some(period)) => {
                Some(Rate { limit, period_ms: millis_from_sql(period, || format!("gate {gate}: rate period"))? })
            }
            (None, None) => None,
            _ => return Err(format!("gate {gate}: a rate limit without its period")),
        };
        Ok(Limits {
            concurrency: self.concurrency,
            rate,
            priority: if self.lowest_first { PriorityOrder::LowestFirst } else { PriorityOrder::HighestFirst },
            fairness: self.fairness,
            order: if self.lifo { Order::Lifo } else { Order::Fifo },
        })
    }
}

/// A [`SlotRequest`], as `admission_acquire()` reads it.
#[derive(Debug, Serialize)]
pub(crate) struct SlotRequestJson<'a> {
    gate: &'a str,
    holder: &'a str,
    run_id: &'a str,
    priority: i32,
    fairness_key: &'a str,
    limits: LimitsJson,
    lease_until: Option<i64>,
    max_waiting: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    succeeds: Option<&'a str>,
    now: i64,
}

impl<'a> SlotRequestJson<'a> {
    pub(crate) fn new(r: &'a SlotRequest) -> Result<Self, StoreError> {
        LimitsJson::new(&r.gate, &r.limits)?;
        Ok(SlotRequestJson::unchecked(r))
    }

    /// [`SlotRequestJson::new`] without refusing a 0 ms rate window: a concurrency key, which
    /// has no rate (the server would refuse such a window too, dividing by it).
    fn unchecked(r: &'a SlotRequest) -> Self {
        SlotRequestJson {
            gate: &r.gate,
            holder: &r.holder,
            run_id: r.run_id.as_str(),
            priority: r.priority,
            fairness_key: &r.fairness_key,
            limits: LimitsJson::from(&r.limits),
            lease_until: r.lease_until.map(millis_to_sql),
            max_waiting: r.max_waiting,
            succeeds: r.succeeds.as_deref(),
            now: millis_to_sql(r.now),
        }
    }
}

/// A [`NewRun`], as `create_admitted()` reads it: the run, and a keyed start's concurrency key.
#[derive(Debug, Serialize)]
pub(crate) struct CreateRunJson<'a> {
    run: NewRunJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admission: Option<SlotRequestJson<'a>>,
}

impl<'a> CreateRunJson<'a> {
    pub(crate) fn new(run: &'a NewRun) -> Result<Self, StoreError> {
        Ok(CreateRunJson {
            run: NewRunJson::new(run),
            admission: run.admission.as_ref().map(SlotRequestJson::new).transpose()?,
        })
    }

    /// The run alone (a bulk start without keyed starts).
    pub(crate) fn unkeyed(run: &'a NewRun) -> Self {
        CreateRunJson { run: NewRunJson::new(run), admission: None }
    }
}

/// A run of a keyed bulk start (`Op::CreateRuns`: one operation, all or nothing), as
/// `create_runs()` reads it.
#[derive(Debug, Serialize)]
pub(crate) struct KeyedRunJson<'a> {
    run: NewRunJson<'a>,
    admission: Option<SlotRequestJson<'a>>,
}

impl<'a> KeyedRunJson<'a> {
    pub(crate) fn new(run: &'a NewRun) -> Result<Self, StoreError> {
        Ok(KeyedRunJson {
            run: NewRunJson::new(run),
            admission: run.admission.as_ref().map(SlotRequestJson::new).transpose()?,
        })
    }
}

/// A [`TaskDone`], as `complete_task()` reads it: the output, or the error (as the
/// checkpoints store it) and whether it is the engine's `remote_timeout`.
#[derive(Debug, Serialize)]
pub(crate) struct TaskDoneJson<'a> {
    run_id: &'a str,
    seq: u32,
    attempt: u32,
    /// The wait's token ([`protocol::remote_token`]).
    token: String,
    output: Option<&'a str>,
    error: Option<String>,
    timed_out: bool,
    logs: &'a [TaskLog],
    now: i64,
    /// With a claim, an accepted result claims the run it wakes in the same write of the run
    /// row (`Store::complete_task_and_claim`).
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<TaskClaimJson<'a>>,
}

/// The claim `complete_task()` makes of the run an accepted result wakes: `claim_run()`'s
/// fields but the run id (the result's).
#[derive(Debug, Serialize)]
struct TaskClaimJson<'a> {
    owner: &'a str,
    until: i64,
    now: i64,
    from: i64,
}

impl<'a> TaskDoneJson<'a> {
    /// `d`, claiming the run it wakes when it is accepted (the claim's run is `d`'s: see
    /// [`TaskDone::check_claim`]).
    pub(crate) fn with_claim(d: &'a TaskDone, c: &'a Claim) -> Self {
        TaskDoneJson {
            claim: Some(TaskClaimJson {
                owner: &c.owner,
                until: millis_to_sql(c.lease_until),
                now: millis_to_sql(c.now),
                from: 0,
            }),
            ..Self::new(d)
        }
    }

    pub(crate) fn new(d: &'a TaskDone) -> Self {
        let (output, error, timed_out) = match &d.result {
            Ok(p) => (Some(p.as_str()), None, false),
            Err(e) => (None, Some(error_json(e)), e.code() == Some(codes::REMOTE_TIMEOUT)),
        };
        TaskDoneJson {
            run_id: d.run_id.as_str(),
            seq: d.seq,
            attempt: d.attempt,
            token: protocol::remote_token(&d.run_id, d.seq),
            output,
            error,
            timed_out,
            logs: &d.logs,
            now: millis_to_sql(d.now),
            claim: None,
        }
    }
}

/// One run-queue item, as `enqueue()` reads it.
#[derive(Debug, Serialize)]
pub(crate) struct QueueItemJson<'a> {
    run_id: &'a str,
    reason: &'static str,
    namespace: Option<&'a str>,
    priority: i32,
    dedupe_key: &'a str,
}

impl<'a> QueueItemJson<'a> {
    pub(crate) fn new(item: &'a QueuedRun) -> Self {
        QueueItemJson {
            run_id: item.run_id.as_str(),
            reason: item.reason.as_str(),
            namespace: item.namespace.as_deref(),
            priority: item.priority,
            dedupe_key: &item.dedupe_key,
        }
    }
}

/// Folds the items of one batch into at most one per run, in first-arrival order, as the queue
/// itself would (a wake replaces a start, the higher priority is kept, the first namespace
/// given is kept): one upsert per run keeps `enqueue()` a single statement.
pub(crate) fn merge_queue_items(items: Vec<QueuedRun>) -> Vec<QueuedRun> {
    let mut out: Vec<QueuedRun> = Vec::with_capacity(items.len());
    let mut index: std::collections::HashMap<RunId, usize> = std::collections::HashMap::with_capacity(items.len());
    for item in items {
        match index.get(&item.run_id) {
            Some(&i) => {
                let queued = &mut out[i];
                if item.reason == QueueReason::Wake {
                    queued.reason = QueueReason::Wake;
                    queued.fold_wake_key(item.dedupe_key);
                }
                queued.priority = queued.priority.max(item.priority);
                if queued.namespace.is_none() {
                    queued.namespace = item.namespace;
                }
            }
            None => {
                index.insert(item.run_id.clone(), out.len());
                out.push(item);
            }
        }
    }
    out
}

/// Queue item ids as the server's bigint (ids come from an identity column: they fit).
pub(crate) fn queue_ids(ids: &[u64]) -> Vec<i64> {
    ids.iter().filter_map(|id| i64::try_from(*id).ok()).collect()
}

/// `claim_run()`'s fields: the claim of a run whose answer's history holds the checkpoints from
/// `from` on.
#[derive(Debug, Serialize)]
pub(crate) struct ClaimJson<'a> {
    id: &'a str,
    owner: &'a str,
    until: i64,
    now: i64,
    from: i64,
}

impl<'a> ClaimJson<'a> {
    pub(crate) fn new(c: &'a Claim, from_seq: u32) -> Self {
        ClaimJson {
            id: c.run_id.as_str(),
            owner: &c.owner,
            until: millis_to_sql(c.lease_until),
            now: millis_to_sql(c.now),
            from: i64::from(from_seq),
        }
    }
}

/// The claim of `c`, whose answer's history holds the checkpoints from `from_seq` on.
pub(crate) fn claim_op(c: &Claim, from_seq: u32) -> Op<'_> {
    Op::ClaimRun(ClaimJson::new(c, from_seq))
}

// ---- writes: what the server answers --------------------------------------------------------

/// Why an answer does not decode, or the contract outcome it carries.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A contract outcome the caller returns as is (`LeaseLost`, `NotFound`, `Conflict`).
    Store(StoreError),
    /// The answer is malformed or holds invalid data.
    Corrupt(String),
}

/// Parses an answer, turning `{"err": ...}` into the contract error it stands for.
fn parse(text: &str, run_id: &RunId, owner: Option<&str>) -> Result<Value, Answer> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| Answer::Corrupt(format!("the server's answer is not JSON: {e}")))?;
    checked(value, run_id, owner)
}

/// An answer, or the contract error its `{"err": ...}` stands for.
fn checked(mut value: Value, run_id: &RunId, owner: Option<&str>) -> Result<Value, Answer> {
    let Some(err) = value.get("err").and_then(Value::as_str).map(str::to_string) else {
        return Ok(value);
    };
    let message = value.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
    Err(Answer::Store(match err.as_str() {
        "lease_lost" => StoreError::LeaseLost { run_id: run_id.clone(), owner: owner.unwrap_or_default().to_string() },
        "not_found" => StoreError::NotFound { what: format!("run {run_id}") },
        "conflict" => StoreError::Conflict { message },
        "queue_full" => StoreError::QueueFull {
            gate: field(&mut value, "gate")?,
            held: count_field(&mut value, "held")?,
            waiting: count_field(&mut value, "waiting")?,
        },
        other => return Err(Answer::Corrupt(format!("the server answered error {other:?}: {message}"))),
    }))
}

fn field<T: serde::de::DeserializeOwned>(value: &mut Value, key: &str) -> Result<T, Answer> {
    let v = value.get_mut(key).map(Value::take).unwrap_or(Value::Null);
    serde_json::from_value(v).map_err(|e| Answer::Corrupt(format!("the server's answer has a bad {key:?}: {e}")))
}

fn run_field(value: &mut Value) -> Result<Run, Answer> {
    field::<RunRow>(value, "run")?.into_run().map_err(Answer::Corrupt)
}

/// A count of the server's (a bigint), as the core's `u32` counts (saturating, as they do).
fn count_field(value: &mut Value, key: &str) -> Result<u32, Answer> {
    let n: i64 = field(value, key)?;
    Ok(u32::try_from(n.max(0)).unwrap_or(u32::MAX))
}

pub(crate) fn create_answer(text: &str, new: NewRun) -> Result<CreateRun, Answer> {
    let v = parse(text, &new.id, None)?;
    created(v, new)
}

/// `create_run()`'s answer (`create_admitted()`'s: `"gated"` when the run waits for its key).
fn created(mut v: Value, mut new: NewRun) -> Result<CreateRun, Answer> {
    if field::<bool>(&mut v, "created")? {
        if field::<Option<bool>>(&mut v, "gated")?.unwrap_or(false) {
            new.start_at = Some(protocol::GATED);
        }
        Ok(CreateRun::Created(new.into_run()))
    } else {
        Ok(CreateRun::Existing(run_field(&mut v)?))
    }
}

/// `create_runs()`'s answer: one `create_admitted()` answer per run, in order, or the refusal of
/// the whole group (`queue_full`).
pub(crate) fn creates_answer(text: &str, runs: Vec<NewRun>) -> Result<Vec<CreateRun>, Answer> {
    let first = runs.first().map(|r| r.id.clone()).unwrap_or_else(|| RunId::new(""));
    let mut v = parse(text, &first, None)?;
    let answers: Vec<Value> = field(&mut v, "answers")?;
    if answers.len() != runs.len() {
        return Err(Answer::Corrupt(format!("{} keyed creates got {} answers", runs.len(), answers.len())));
    }
    runs.into_iter().zip(answers).map(|(run, answer)| created(checked(answer, &run.id, None)?, run)).collect()
}

pub(crate) fn claim_answer(text: &str, claim: &Claim) -> Result<ClaimOutcome, Answer> {
    claim_value(parse(text, &claim.run_id, Some(&claim.owner))?)
}

/// A claim's answer, parsed.
fn claim_value(mut v: Value) -> Result<ClaimOutcome, Answer> {
    let outcome: String = field(&mut v, "outcome")?;
    Ok(match outcome.as_str() {
        "not_found" => ClaimOutcome::NotFound,
        "busy" => ClaimOutcome::Busy(run_field(&mut v)?),
        "terminal" => ClaimOutcome::Terminal(run_field(&mut v)?),
        "acquired" => {
            let run = run_field(&mut v)?;
            let previous: String = field(&mut v, "previous")?;
            let history: Vec<CheckpointRow> = field(&mut v, "history")?;
            ClaimOutcome::Acquired {
                previous: run_status(&previous, run.id.as_str()).map_err(Answer::Corrupt)?,
                recovered: field(&mut v, "recovered")?,
                history: history
                    .into_iter()
                    .map(CheckpointRow::into_checkpoint)
                    .collect::<Result<_, _>>()
                    .map_err(Answer::Corrupt)?,
                run,
            }
        }
        other => return Err(Answer::Corrupt(format!("unknown claim outcome {other:?}"))),
    })
}

/// An answer that only says the operation was applied (`{"ok": true}`).
pub(crate) fn ok_answer(text: &str) -> Result<(), Answer> {
    parse(text, &RunId::new(""), None).map(drop)
}

pub(crate) fn bool_answer(text: &str, run_id: &RunId, key: &str) -> Result<bool, Answer> {
    let mut v = parse(text, run_id, None)?;
    field(&mut v, key)
}

#[derive(Debug, Deserialize)]
struct DeliveryJson {
    run: String,
    seq: i64,
}

impl DeliveryJson {
    fn into_delivery(self) -> Result<Delivery, Answer> {
        let seq = u32_from_sql(self.seq, || format!("delivery to run {}", self.run)).map_err(Answer::Corrupt)?;
        Ok(Delivery::Delivered { run_id: RunId::new(self.run), seq })
    }
}

fn delivery(d: Option<DeliveryJson>) -> Result<Delivery, Answer> {
    d.map_or(Ok(Delivery::Buffered), DeliveryJson::into_delivery)
}

pub(crate) fn commit_answer(text: &str, commit: &Commit) -> Result<CommitOutcome, Answer> {
    let mut v = parse(text, &commit.run_id, Some(&commit.owner))?;
    let deliveries: Vec<Option<DeliveryJson>> = field(&mut v, "deliveries")?;
    let raced: Vec<i64> = field(&mut v, "raced")?;
    Ok(CommitOutcome {
        woken: field(&mut v, "woken")?,
        settled: field(&mut v, "settled")?,
        deliveries: deliveries.into_iter().map(delivery).collect::<Result<_, _>>()?,
        raced: raced
            .into_iter()
            .map(|s| u32_from_sql(s, || "raced seq".into()).map_err(Answer::Corrupt))
            .collect::<Result<_, _>>()?,
        handed_off: field::<Vec<String>>(&mut v, "handed_off")?.into_iter().map(RunId::new).collect(),
    })
}

/// `acquire_slot()`'s answer.
pub(crate) fn admission_answer(text: &str, run_id: &RunId) -> Result<Admission, Answer> {
    let mut v = parse(text, run_id, None)?;
    let admission: String = field(&mut v, "admission")?;
    match admission.as_str() {
        "admitted" => Ok(Admission::Admitted),
        "waiting" => {
            let retry_at: Option<i64> = field(&mut v, "retry_at")?;
            let retry_at = retry_at.map(|t| millis_from_sql(t, || "retry_at".into())).transpose();
            Ok(Admission::Waiting { retry_at: retry_at.map_err(Answer::Corrupt)? })
        }
        "full" => Ok(Admission::Full { held: count_field(&mut v, "held")?, waiting: count_field(&mut v, "waiting")? }),
        other => Err(Answer::Corrupt(format!("unknown admission {other:?}"))),
    }
}

/// `release_slot()`'s answer: the runs woken.
pub(crate) fn handed_answer(text: &str) -> Result<Vec<RunId>, Answer> {
    let mut v = parse(text, &RunId::new(""), None)?;
    Ok(field::<Vec<String>>(&mut v, "handed")?.into_iter().map(RunId::new).collect())
}

/// `complete_task()`'s answer.
pub(crate) fn completion_answer(text: &str, run_id: &RunId) -> Result<TaskCompletion, Answer> {
    completion_value(&mut parse(text, run_id, None)?)
}

/// A completion's answer, parsed.
fn completion_value(v: &mut Value) -> Result<TaskCompletion, Answer> {
    let outcome: String = field(v, "outcome")?;
    match outcome.as_str() {
        "accepted" => Ok(TaskCompletion::Accepted),
        "duplicate" => Ok(TaskCompletion::Duplicate),
        "run_terminal" => Ok(TaskCompletion::RunTerminal),
        other => Err(Answer::Corrupt(format!("unknown task completion {other:?}"))),
    }
}

/// `complete_task()`'s answer to a result sent with a claim ([`TaskDoneJson::with_claim`]):
/// the completion and, when it is accepted, the claim's outcome.
pub(crate) fn completion_and_claim_answer(
    text: &str,
    claim: &Claim,
) -> Result<(TaskCompletion, Option<ClaimOutcome>), Answer> {
    let mut v = parse(text, &claim.run_id, None)?;
    let completion = completion_value(&mut v)?;
    if completion != TaskCompletion::Accepted {
        return Ok((completion, None));
    }
    match v.get_mut("claim").map(Value::take) {
        Some(answer) => Ok((completion, Some(claim_value(checked(answer, &claim.run_id, Some(&claim.owner))?)?))),
        None => {
            Err(Answer::Corrupt("an accepted result sent with a claim was answered without the claim's outcome".into()))
        }
    }
}

/// `heartbeat_task()`'s answer.
pub(crate) fn beat_answer(text: &str, run_id: &RunId) -> Result<BeatOutcome, Answer> {
    let mut v = parse(text, run_id, None)?;
    let outcome: String = field(&mut v, "outcome")?;
    match outcome.as_str() {
        "extended" => {
            let until: i64 = field(&mut v, "until")?;
            let until =
                millis_from_sql(until, || format!("heartbeat of run {run_id}: lease")).map_err(Answer::Corrupt)?;
            Ok(BeatOutcome::Extended(until))
        }
        "lost" => Ok(BeatOutcome::Lost),
        "cancelled" => Ok(BeatOutcome::Cancelled),
        other => Err(Answer::Corrupt(format!("unknown heartbeat outcome {other:?}"))),
    }
}

pub(crate) fn signal_answer(text: &str) -> Result<Delivery, Answer> {
    let mut v = parse(text, &RunId::new(""), None)?;
    delivery(field(&mut v, "delivery")?)
}

/// `signal_op()`'s answer to a signal sent with a claim: the delivery and, when it went to the
/// claim's run, the claim's outcome.
pub(crate) fn signal_and_claim_answer(text: &str, claim: &Claim) -> Result<(Delivery, Option<ClaimOutcome>), Answer> {
    let mut v = parse(text, &claim.run_id, None)?;
    let answer = v.get_mut("claim").map(Value::take);
    let delivered = delivery(field(&mut v, "delivery")?)?;
    let to_claimed = delivered.is_to(&claim.run_id);
    match answer {
        Some(answer) if to_claimed => {
            Ok((delivered, Some(claim_value(checked(answer, &claim.run_id, Some(&claim.owner))?)?)))
        }
        None if !to_claimed => Ok((delivered, None)),
        Some(_) => Err(Answer::Corrupt("a signal claimed a run it was not delivered to".into())),
        None => Err(Answer::Corrupt(format!(
            "a signal delivered to run {} was answered without the outcome of its claim",
            claim.run_id
        ))),
    }
}

/// A run a write created or found: `create_run`'s answer, read with the row it carries (always
/// for an existing run; for a created one when the write had to build the run itself), else
/// as [`created`] reads it (a run waiting for its key is `"gated"`).
fn started(mut v: Value, new: Option<NewRun>) -> Result<CreateRun, Answer> {
    let has_row = v.get("run").is_some_and(|r| !r.is_null());
    match new {
        Some(new) if !has_row => created(v, new),
        _ if !field::<bool>(&mut v, "created")? => Ok(CreateRun::Existing(run_field(&mut v)?)),
        _ if has_row => Ok(CreateRun::Created(run_field(&mut v)?)),
        _ => Err(Answer::Corrupt("a created run came without its row".into())),
    }
}

pub(crate) fn publish_answer(text: &str, start: Vec<NewRun>) -> Result<Published, Answer> {
    let mut v = parse(text, &RunId::new(""), None)?;
    if v.get("duplicate").and_then(Value::as_bool) == Some(true) {
        return Ok(Published::Duplicate);
    }
    let list: Vec<DeliveryJson> = field(&mut v, "deliveries")?;
    let deliveries = list.into_iter().map(DeliveryJson::into_delivery).collect::<Result<_, _>>()?;
    let answers: Vec<Value> = field(&mut v, "started")?;
    if answers.len() < start.len() {
        return Err(Answer::Corrupt(format!("{} trigger runs got {} answers", start.len(), answers.len())));
    }
    let mut start = start.into_iter();
    let started = answers.into_iter().map(|a| started(a, start.next())).collect::<Result<_, _>>()?;
    Ok(Published::Done { deliveries, started })
}

pub(crate) fn flush_answer(text: &str) -> Result<Option<CreateRun>, Answer> {
    let v = parse(text, &RunId::new(""), None)?;
    if v.get("flushed").and_then(Value::as_bool) != Some(true) {
        return Ok(None);
    }
    started(v, None).map(Some)
}

pub(crate) fn save_answer(text: &str) -> Result<SaveOutcome, Answer> {
    let mut v = parse(text, &RunId::new(""), None)?;
    if field::<bool>(&mut v, "saved")? {
        let revision: i64 = field(&mut v, "revision")?;
        let revision = u64::try_from(revision).map_err(|_| Answer::Corrupt(format!("schedule revision {revision}")))?;
        return Ok(SaveOutcome::Saved(revision));
    }
    let current: Option<String> = field(&mut v, "current")?;
    Ok(SaveOutcome::Stale(current.map(|body| schedule_body(&body)).transpose().map_err(Answer::Corrupt)?.map(Box::new)))
}

/// A stored schedule (`schedules.body`).
pub(crate) fn schedule_body(body: &str) -> Result<ScheduleRecord, String> {
    serde_json::from_str(body).map_err(|e| format!("a stored schedule is not a valid record: {e}"))
}

pub(crate) fn delete_answer(text: &str, id: &RunId) -> Result<u64, Answer> {
    let mut v = parse(text, id, None)?;
    let n: i64 = field(&mut v, "deleted")?;
    u64::try_from(n).map_err(|_| Answer::Corrupt(format!("deleted {n} runs")))
}

// ---- reads: dynamic queries -----------------------------------------------------------------

/// A query with its parameters and their types (sent in one round trip, unprepared).
#[derive(Debug, Default)]
pub(crate) struct Query {
    pub(crate) sql: String,
    pub(crate) params: Vec<(Box<dyn ToSql + Sync + Send>, Type)>,
}

impl Query {
    /// Adds a parameter and returns its placeholder (`$n`).
    fn bind(&mut self, value: impl ToSql + Sync + Send + 'static, ty: Type) -> String {
        self.params.push((Box::new(value), ty));
        format!("${}", self.params.len())
    }

    pub(crate) fn param_refs(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        self.params.iter().map(|(v, t)| (&**v as &(dyn ToSql + Sync), t.clone())).collect()
    }
}

/// The `list_runs` statement of `filter`, and the page size.
///
/// The planner picks the index from its statistics, but a status term has to be written so that
/// an index can yield the rows in the listing order. Without a workflow, the statuses are split
/// in two terms (settled and active statuses are in different partial indexes). With a workflow,
/// each status is one arm walking `runs_workflow_status_created` (workflow, status, newest first)
/// up to the page size, and the arms are merged in order (`Merge Append`, no sort): a page costs
/// about the page, however rare the status is among the workflow's runs.
pub(crate) fn list_runs_query(schema: &str, filter: &RunFilter) -> Result<(Query, usize), StoreError> {
    let after = filter.cursor.as_deref().map(decode_cursor).transpose()?;
    let limit = if filter.limit == 0 { 100 } else { filter.limit };
    let mut q = Query::default();
    // The terms other than the statuses.
    let mut terms: Vec<String> = Vec::new();
    if let Some(w) = &filter.workflow {
        terms.push(format!("workflow = {}", q.bind(w.clone(), Type::TEXT)));
    }
    if let Some(ns) = &filter.namespace {
        terms.push(format!("namespace = {}", q.bind(ns.clone(), Type::TEXT)));
    }
    if let Some(tag) = &filter.tag {
        terms.push(format!("tags @> ARRAY[{}]::text[]", q.bind(tag.clone(), Type::TEXT)));
    }
    if let Some(parent) = &filter.parent {
        terms.push(format!("parent_id = {}", q.bind(parent.as_str().to_string(), Type::TEXT)));
    }
    if let Some(t) = filter.created_after {
        terms.push(format!("created_at >= {}", q.bind(millis_to_sql(t), Type::INT8)));
    }
    if let Some(t) = filter.created_before {
        terms.push(format!("created_at < {}", q.bind(millis_to_sql(t), Type::INT8)));
    }
    if let Some((t, id)) = after {
        let (t, id) = (q.bind(millis_to_sql(t), Type::INT8), q.bind(id.as_str().to_string(), Type::TEXT));
        terms.push(format!("(created_at, id) < ({t}, {id})"));
    }
    let mut statuses: Vec<&'static str> = filter.statuses.iter().map(|s| s.as_str()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    let lim = q.bind(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX), Type::INT8);
    let order = "ORDER BY created_at DESC, id DESC";
    let select = |status: &str| {
        let all: Vec<&str> = std::iter::once("true").chain(terms.iter().map(String::as_str)).collect();
        let and_status = if status.is_empty() { String::new() } else { format!(" AND {status}") };
        format!("SELECT {RUN_COLS} FROM {schema}.runs WHERE {}{and_status}", all.join(" AND "))
    };
    q.sql = if filter.workflow.is_some() && statuses.len() > 1 {
        let arms: Vec<String> = statuses
            .iter()
            .map(|s| {
                let st = q.bind((*s).to_string(), Type::TEXT);
                format!("({} {order} LIMIT {lim})", select(&format!("status = {st}")))
            })
            .collect();
        format!("SELECT * FROM ({}) AS arms {order} LIMIT {lim}", arms.join(" UNION ALL "))
    } else if filter.workflow.is_some() && statuses.len() == 1 {
        let st = q.bind(statuses[0].to_string(), Type::TEXT);
        format!("{} {order} LIMIT {lim}", select(&format!("status = {st}")))
    } else {
        // Settled and active statuses are in different partial indexes: one term for each half,
        // so the planner can see which index each half may use.
        let mut halves: Vec<String> = Vec::new();
        for settled in [true, false] {
            let mut half: Vec<String> =
                filter.statuses.iter().filter(|s| s.is_terminal() == settled).map(|s| s.as_str().to_string()).collect();
            half.sort_unstable();
            half.dedup();
            match half.len() {
                0 => {}
                // An equality, so an index scan of runs_settled_created is in the listing order.
                1 => halves.push(format!("status = {}", q.bind(half.remove(0), Type::TEXT))),
                _ => halves.push(format!("status = ANY ({})", q.bind(half, Type::TEXT_ARRAY))),
            }
        }
        let status = match halves.as_slice() {
            [] => String::new(),
            [one] => one.clone(),
            _ => format!("({})", halves.join(" OR ")),
        };
        format!("{} {order} LIMIT {lim}", select(&status))
    };
    Ok((q, limit))
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

/// `pending_runs`, `due_runs` and `orphaned_runs`: pending runs without a delayed start in claim
/// order (`runs_pending`), due timers and delayed starts by `wake_at` up to now (`runs_due`), orphans by the end of their lease up to now
/// (`runs_orphaned`; only they are sorted by age). A due scan with
/// `RunQuery::leave_queued_since` reads the `limit` earliest due runs and then drops those
/// left to an item of their own ([`leave_to_fresh_item`]).
pub(crate) fn poll_query(schema: &str, which: Poll, rq: &RunQuery) -> Query {
    let mut q = Query::default();
    let now = q.bind(millis_to_sql(rq.now), Type::INT8);
    // A lease is live when it has an owner and lease_until >= now.
    let no_live_lease = format!("(lease_owner IS NULL OR lease_until IS NULL OR lease_until < {now})");
    let (head, order) = match which {
        // A pending run with a `wake_at` is a delayed start: due_runs finds it when it is due.
        Poll::Pending => {
            (format!("status = 'pending' AND wake_at IS NULL AND {no_live_lease}"), "priority DESC, created_at, id")
        }
        Poll::Due => {
            let due = "status IN ('suspended', 'blocked', 'pending')";
            (format!("{due} AND wake_at <= {now} AND {no_live_lease}"), "wake_at, id")
        }
        Poll::Orphaned => (format!("status = 'running' AND {LEASE_FREE_AT} < {now}"), "updated_at, id"),
    };
    // Left to items: the scan's runs are filtered afterwards, in due order (see below).
    let leave = if which == Poll::Due { rq.leave_queued_since } else { None };
    let cols = if leave.is_some() { "id, wake_at" } else { "id" };
    let mut sql = format!("SELECT {cols} FROM {schema}.runs WHERE {head}");
    if let Some(ns) = &rq.namespace {
        sql.push_str(&format!(" AND namespace = {}", q.bind(ns.clone(), Type::TEXT)));
    }
    if let Some(ws) = &rq.workflows {
        let names: Vec<String> = ws.iter().map(|(w, _)| w.clone()).collect();
        let versions: Vec<i64> = ws.iter().map(|(_, v)| i64::from(*v)).collect();
        let (names, versions) = (q.bind(names, Type::TEXT_ARRAY), q.bind(versions, Type::INT8_ARRAY));
        // `workflow || ''`, an expression no index is on: the scan keeps to its partial index in
        // its order. On the column, runs_workflow_status_created (workflow and status, both
        // equalities) looks cheaper whenever the statistics say the status is rare, and after
        // a burst of pending runs that plan would read and sort all of them on every poll.
        sql.push_str(&format!(
            " AND (workflow || '', version) IN (SELECT * FROM unnest({names}::text[], {versions}::bigint[]))"
        ));
    }
    let lim = q.bind(i64::try_from(rq.limit).unwrap_or(i64::MAX), Type::INT8);
    sql.push_str(&format!(" ORDER BY {order} LIMIT {lim}"));
    q.sql = sql;
    if let Some(since) = leave {
        // The due runs the scan found, less those left to an item of their own: dropped, not
        // replaced by runs due later, so a poll reads at most `limit` of them however many wait.
        let fresh = leave_to_fresh_item(&mut q, schema, since, rq.now, "due.id");
        q.sql = format!("SELECT due.id FROM ({}) AS due WHERE {fresh} ORDER BY due.wake_at, due.id", q.sql);
    }
    q
}

/// The term that leaves the run whose id is `id` to a fresh unclaimed item of its own in the
/// run queue, enqueued after `since` and not after `now` (`RunQuery::leave_queued_since`): one
/// probe of `run_queue_open`. `OFFSET 0` keeps it a probe: as an anti-join the planner may hash
/// the whole queue.
fn leave_to_fresh_item(q: &mut Query, schema: &str, since: Millis, now: Millis, id: &str) -> String {
    let since = q.bind(millis_to_sql(since), Type::INT8);
    let now = q.bind(millis_to_sql(now), Type::INT8);
    format!(
        "NOT EXISTS (SELECT 1 FROM {schema}.run_queue WHERE run_queue.run_id = {id} \
         AND run_queue.claimed_by IS NULL AND run_queue.enqueued_at > {since} \
         AND run_queue.enqueued_at <= {now} OFFSET 0)"
    )
}

/// `claim_due_runs`: the due scan of [`poll_query`] (walking `runs_due`), locking what it picks
/// with `SKIP LOCKED`, and one `UPDATE` of the picked rows moving their `wake_at` to `until`,
/// `RETURNING` their ids — one statement, a transaction of its own. It never waits for a row
/// lock: a run another claim (or a commit) holds is skipped; a run another claim moved since
/// this statement's snapshot is re-read once locked and no longer due, so it is left out. With
/// `RunQuery::leave_queued_since` the `UPDATE` skips the picked runs left to an item of their
/// own: they stay locked, unchanged, until the statement ends, and a consumer's `claim_run` of
/// one in that instant answers busy (it does not wait), so its engine looks again shortly.
pub(crate) fn claim_due_query(schema: &str, rq: &RunQuery, until: Millis) -> Query {
    // The scan without the items' filter: wrapped, it would have no `runs` to lock.
    let mut q = poll_query(schema, Poll::Due, &RunQuery { leave_queued_since: None, ..rq.clone() });
    let until = q.bind(millis_to_sql(until), Type::INT8);
    let fresh = rq.leave_queued_since.map_or_else(String::new, |since| {
        format!(" AND {}", leave_to_fresh_item(&mut q, schema, since, rq.now, "r.id"))
    });
    q.sql = format!(
        "WITH picked AS ({scan} FOR UPDATE OF runs SKIP LOCKED) \
         UPDATE {schema}.runs AS r SET wake_at = {until} FROM picked WHERE r.id = picked.id{fresh} \
         RETURNING r.id",
        scan = q.sql
    );
    q
}

/// The namespace and workflow terms of a [`DueQuery`].
fn due_filters(q: &mut Query, sql: &mut String, dq: &DueQuery, prefix: &str) {
    if let Some(ns) = &dq.namespace {
        sql.push_str(&format!(" AND {prefix}namespace = {}", q.bind(ns.clone(), Type::TEXT)));
    }
    if let Some(ws) = &dq.workflows {
        sql.push_str(&format!(" AND {prefix}workflow = ANY ({})", q.bind(ws.clone(), Type::TEXT_ARRAY)));
    }
}

fn limit_param(q: &mut Query, limit: usize) -> String {
    q.bind(i64::try_from(limit).unwrap_or(i64::MAX), Type::INT8)
}

/// `due_schedules`: by `due_at` up to now, then key (`schedules_due`). One column: the body.
pub(crate) fn due_schedules_query(schema: &str, dq: &DueQuery) -> Query {
    let mut q = Query::default();
    let now = q.bind(millis_to_sql(dq.now), Type::INT8);
    let mut sql = format!("SELECT body FROM {schema}.schedules WHERE due_at <= {now}");
    due_filters(&mut q, &mut sql, dq, "");
    let lim = limit_param(&mut q, dq.limit);
    sql.push_str(&format!(" ORDER BY due_at, key LIMIT {lim}"));
    q.sql = sql;
    q
}

/// `list_schedules`: by key after `after` (the primary key, or `schedules_namespace` for one
/// namespace). One column: the body.
pub(crate) fn list_schedules_query(schema: &str, namespace: Option<&str>, after: Option<&str>, limit: usize) -> Query {
    let mut q = Query::default();
    let mut sql = format!("SELECT body FROM {schema}.schedules WHERE true");
    if let Some(ns) = namespace {
        sql.push_str(&format!(" AND namespace = {}", q.bind(ns.to_string(), Type::TEXT)));
    }
    if let Some(after) = after {
        sql.push_str(&format!(" AND key > {}", q.bind(after.to_string(), Type::TEXT)));
    }
    let lim = limit_param(&mut q, limit);
    sql.push_str(&format!(" ORDER BY key LIMIT {lim}"));
    q.sql = sql;
    q
}

/// The table and key column of a kind of buffered delivery.
fn buffered_table(kind: BufferedKind) -> (&'static str, &'static str) {
    match kind {
        BufferedKind::Signal => ("buffered_signals", "token"),
        BufferedKind::Event => ("buffered_events", "name"),
    }
}

/// `buffered`, for one kind: a `GROUP BY` of its key over the table, in byte order, at most
/// `limit` keys. Columns: key, count, oldest, newest.
pub(crate) fn buffered_query(schema: &str, kind: BufferedKind, bq: &BufferedQuery, limit: usize) -> Query {
    let (table, key) = buffered_table(kind);
    let mut q = Query::default();
    let mut sql = format!("SELECT {key}, count(*), min(created_at), max(created_at) FROM {schema}.{table}");
    if let Some(prefix) = &bq.prefix {
        sql.push_str(&format!(" WHERE starts_with({key}, {})", q.bind(prefix.clone(), Type::TEXT)));
    }
    sql.push_str(&format!(" GROUP BY {key}"));
    if let Some(before) = bq.oldest_before {
        sql.push_str(&format!(" HAVING min(created_at) < {}", q.bind(millis_to_sql(before), Type::INT8)));
    }
    let lim = limit_param(&mut q, limit);
    sql.push_str(&format!(" ORDER BY {key} COLLATE \"C\" LIMIT {lim}"));
    q.sql = sql;
    q
}

/// A row of [`buffered_query`].
pub(crate) fn buffered_from_row(
    kind: BufferedKind,
    row: &Row,
) -> Result<Result<BufferedDeliveries, String>, tokio_postgres::Error> {
    let key: String = row.try_get(0)?;
    let count: i64 = row.try_get(1)?;
    let (oldest, newest): (i64, i64) = (row.try_get(2)?, row.try_get(3)?);
    let what = || format!("buffered {kind}s of {key:?}");
    Ok(millis_from_sql(oldest, what).and_then(|oldest_at| {
        let newest_at = millis_from_sql(newest, what)?;
        Ok(BufferedDeliveries {
            kind,
            count: u64::try_from(count).unwrap_or(0),
            oldest_at,
            newest_at,
            key: key.clone(),
        })
    }))
}

/// `purge_buffered`: one `DELETE` on the key's index. Parameters: key, buffered before (or
/// NULL). A wait consuming the same row at once deletes it first or finds it gone.
pub(crate) fn purge_buffered_sql(schema: &str, kind: BufferedKind) -> String {
    let (table, key) = buffered_table(kind);
    format!("DELETE FROM {schema}.{table} WHERE {key} = $1 AND ($2::bigint IS NULL OR created_at < $2)")
}

/// The columns of a trigger buffer, in [`buffer_from_row`]'s order (`b` is `trigger_buffers`).
fn buffer_cols(schema: &str) -> String {
    format!(
        "b.workflow, b.key, b.batch_id, b.gather::text, b.run::text, b.first_at, b.last_at, b.due_at, \
         ARRAY(SELECT p.payload FROM {schema}.trigger_buffer_payloads AS p \
                WHERE p.workflow = b.workflow AND p.key = b.key ORDER BY p.n)"
    )
}

/// `due_buffers`: by `due_at` up to now, then workflow and key (`trigger_buffers_due`).
pub(crate) fn due_buffers_query(schema: &str, dq: &DueQuery) -> Query {
    let mut q = Query::default();
    let now = q.bind(millis_to_sql(dq.now), Type::INT8);
    let mut sql = format!("SELECT {} FROM {schema}.trigger_buffers AS b WHERE b.due_at <= {now}", buffer_cols(schema));
    due_filters(&mut q, &mut sql, dq, "b.");
    let lim = limit_param(&mut q, dq.limit);
    sql.push_str(&format!(" ORDER BY b.due_at, b.workflow, b.key LIMIT {lim}"));
    q.sql = sql;
    q
}

pub(crate) fn buffer_from_row(row: &Row) -> Result<Result<TriggerBuffer, String>, tokio_postgres::Error> {
    let workflow: String = row.try_get(0)?;
    let key: String = row.try_get(1)?;
    let batch_id: String = row.try_get(2)?;
    let gather: String = row.try_get(3)?;
    let run: String = row.try_get(4)?;
    let (first_at, last_at, due_at): (i64, i64, i64) = (row.try_get(5)?, row.try_get(6)?, row.try_get(7)?);
    let payloads: Vec<String> = row.try_get(8)?;
    let what = |col: &str| format!("trigger buffer ({workflow:?}, {key:?}): {col}");
    let decoded = (|| {
        let gather: GatherJson = serde_json::from_str(&gather).map_err(|e| format!("{}: {e}", what("gather")))?;
        let run: NewRunRow = serde_json::from_str(&run).map_err(|e| format!("{}: {e}", what("run")))?;
        Ok(TriggerBuffer {
            gather: gather.into_gather(),
            run: run.into_new_run()?,
            payloads: payloads.into_iter().map(Payload::from_trusted).collect(),
            first_at: millis_from_sql(first_at, || what("first_at"))?,
            last_at: millis_from_sql(last_at, || what("last_at"))?,
            due_at: millis_from_sql(due_at, || what("due_at"))?,
            workflow: workflow.clone(),
            key: key.clone(),
            batch_id,
        })
    })();
    Ok(decoded)
}

// ---- tasks and workers ------------------------------------------------------------------------

/// The columns of `tasks`, in [`task_from_row`]'s order (unqualified: `RETURNING` and `SELECT`
/// name the same table).
pub(crate) const TASK_COLS: &str = "run_id, seq, attempt, name, queue, namespace, input, priority, requires, \
     pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state, worker, lease_until, claimed_at, \
     heartbeat_at, progress, claims, logs::text, outcome, trace_context";

pub(crate) fn task_from_row(row: &Row) -> Result<Result<Task, String>, tokio_postgres::Error> {
    let run_id: String = row.try_get(0)?;
    let seq: i64 = row.try_get(1)?;
    let attempt: i64 = row.try_get(2)?;
    let name: String = row.try_get(3)?;
    let queue: String = row.try_get(4)?;
    let namespace: String = row.try_get(5)?;
    let input: String = row.try_get(6)?;
    let priority: i32 = row.try_get(7)?;
    let requires: Vec<String> = row.try_get(8)?;
    let pickup: Option<i64> = row.try_get(9)?;
    let timeout: Option<i64> = row.try_get(10)?;
    let heartbeat_timeout: i64 = row.try_get(11)?;
    let created_at: i64 = row.try_get(12)?;
    let state: String = row.try_get(13)?;
    let worker: Option<String> = row.try_get(14)?;
    let lease_until: Option<i64> = row.try_get(15)?;
    let claimed_at: Option<i64> = row.try_get(16)?;
    let heartbeat_at: Option<i64> = row.try_get(17)?;
    let progress: Option<String> = row.try_get(18)?;
    let claims: i64 = row.try_get(19)?;
    let logs: String = row.try_get(20)?;
    let outcome: Option<String> = row.try_get(21)?;
    let trace_context: Option<String> = row.try_get(22)?;
    let what = |col: &str| format!("task of run {run_id} seq {seq}: {col}");
    let t = || -> Result<Task, String> {
        let ms = |v: i64, col: &str| millis_from_sql(v, || what(col));
        let opt = |v: Option<i64>, col: &str| v.map(|v| ms(v, col)).transpose();
        Ok(Task {
            task: NewTask {
                run_id: RunId::new(run_id.clone()),
                seq: u32_from_sql(seq, || what("seq"))?,
                attempt: u32_from_sql(attempt, || what("attempt"))?,
                name: name.clone(),
                queue: queue.clone(),
                namespace: namespace.clone(),
                input: Payload::from_trusted(input.clone()),
                priority,
                requires: requires.clone(),
                pickup_timeout_ms: opt(pickup, "pickup_timeout_ms")?,
                timeout_ms: opt(timeout, "timeout_ms")?,
                heartbeat_timeout_ms: ms(heartbeat_timeout, "heartbeat_timeout_ms")?,
                created_at: ms(created_at, "created_at")?,
                trace_context: trace_context.clone(),
                claimed_by: None,
            },
            state: state.parse::<TaskState>().map_err(|e| format!("{}: {e}", what("state")))?,
            worker: worker.clone(),
            lease_until: opt(lease_until, "lease_until")?,
            claimed_at: opt(claimed_at, "claimed_at")?,
            heartbeat_at: opt(heartbeat_at, "heartbeat_at")?,
            progress: progress.clone().map(Payload::from_trusted),
            claims: u32_from_sql(claims, || what("claims"))?,
            logs: serde_json::from_str(&logs).map_err(|e| format!("{}: {e}", what("logs")))?,
            outcome: outcome.clone(),
        })
    };
    Ok(t())
}

/// Decodes task rows.
pub(crate) fn task_rows(rows: &[Row]) -> Result<Result<Vec<Task>, String>, tokio_postgres::Error> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        match task_from_row(row)? {
            Ok(t) => out.push(t),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(out))
}

/// A not-finished task, as every open-task index is partial on it.
const OPEN: &str = "state <> 'finished'";

/// `list_tasks`: oldest first (then run and seq). A run's tasks by the primary key, expired
/// ones by `tasks_deadline`, silent ones by `tasks_silent`, the rest by `tasks_created`.
pub(crate) fn list_tasks_query(schema: &str, f: &TaskFilter) -> Query {
    let mut q = Query::default();
    let mut sql = format!("SELECT {TASK_COLS} FROM {schema}.tasks WHERE true");
    if let Some(run) = &f.run_id {
        sql.push_str(&format!(" AND run_id = {}", q.bind(run.as_str().to_string(), Type::TEXT)));
    }
    if f.unfinished {
        sql.push_str(&format!(" AND {OPEN}"));
    }
    if f.queued {
        sql.push_str(&format!(" AND {OPEN} AND state = 'queued'"));
    }
    if let Some(at) = f.expired_at {
        sql.push_str(&format!(" AND {OPEN} AND deadline <= {}", q.bind(millis_to_sql(at), Type::INT8)));
    }
    if let Some(at) = f.silent_since {
        let at = q.bind(millis_to_sql(at), Type::INT8);
        sql.push_str(&format!(" AND {OPEN} AND COALESCE(heartbeat_at, created_at) < {at}"));
    }
    let limit = if f.limit == 0 { 100 } else { f.limit };
    let lim = limit_param(&mut q, limit);
    // A filter on the state, the deadline or the last heartbeat is served by its own index and
    // its matches sorted; `created_at + 0` keeps the planner from walking `tasks_created` in
    // the listing order instead, filtering every finished task on the way (its estimates for
    // these filters are guesses, and a LIMIT makes that walk look cheap).
    let filtered = f.unfinished || f.queued || f.expired_at.is_some() || f.silent_since.is_some();
    let by = if filtered && f.run_id.is_none() { "created_at + 0" } else { "created_at" };
    sql.push_str(&format!(" ORDER BY {by}, run_id, seq LIMIT {lim}"));
    q.sql = sql;
    q
}

/// `queue_stats`: open tasks of active runs, per namespace and queue (by bytes, like Rust).
pub(crate) fn queue_stats_sql(schema: &str) -> String {
    format!(
        "SELECT t.namespace, t.queue, count(*) FILTER (WHERE t.state = 'queued'),
                count(*) FILTER (WHERE t.state = 'claimed'), min(t.created_at)
           FROM {schema}.tasks AS t JOIN {schema}.runs AS r ON r.id = t.run_id
          WHERE t.{OPEN} AND r.status IN ('pending', 'running', 'suspended', 'blocked')
          GROUP BY t.namespace, t.queue
          ORDER BY t.namespace COLLATE \"C\", t.queue COLLATE \"C\""
    )
}

pub(crate) fn stats_from_row(row: &Row) -> Result<Result<QueueStats, String>, tokio_postgres::Error> {
    let namespace: String = row.try_get(0)?;
    let queue: String = row.try_get(1)?;
    let queued: i64 = row.try_get(2)?;
    let claimed: i64 = row.try_get(3)?;
    let oldest: Option<i64> = row.try_get(4)?;
    let what = || format!("queue {namespace}/{queue}: oldest_at");
    let oldest_at = match oldest.map(|v| millis_from_sql(v, what)).transpose() {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    Ok(Ok(QueueStats {
        namespace,
        queue,
        queued: u64::try_from(queued).unwrap_or(0),
        claimed: u64::try_from(claimed).unwrap_or(0),
        oldest_at,
    }))
}

/// The columns of `workers`, in [`worker_from_row`]'s order.
pub(crate) const WORKER_COLS: &str =
    "id, queues, capabilities, protocol_min, protocol_max, concurrency, started_at, heartbeat_at";

pub(crate) fn worker_from_row(row: &Row) -> Result<Result<WorkerInfo, String>, tokio_postgres::Error> {
    let id: String = row.try_get(0)?;
    let queues: Vec<String> = row.try_get(1)?;
    let capabilities: Vec<String> = row.try_get(2)?;
    let (pmin, pmax, conc): (i64, i64, i64) = (row.try_get(3)?, row.try_get(4)?, row.try_get(5)?);
    let (started, beat): (i64, i64) = (row.try_get(6)?, row.try_get(7)?);
    let what = |col: &str| format!("worker {id}: {col}");
    let w = || -> Result<WorkerInfo, String> {
        Ok(WorkerInfo {
            queues,
            capabilities,
            protocol_min: u32_from_sql(pmin, || what("protocol_min"))?,
            protocol_max: u32_from_sql(pmax, || what("protocol_max"))?,
            concurrency: u32_from_sql(conc, || what("concurrency"))?,
            started_at: millis_from_sql(started, || what("started_at"))?,
            heartbeat_at: millis_from_sql(beat, || what("heartbeat_at"))?,
            id: id.clone(),
        })
    };
    Ok(w())
}

/// Whole-row decoding helpers for the read paths.
pub(crate) fn run_rows(rows: &[Row]) -> Result<Result<Vec<Run>, String>, tokio_postgres::Error> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        match RunRow::from_row(row)?.into_run() {
            Ok(run) => out.push(run),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(out))
}

pub(crate) fn checkpoint_rows(rows: &[Row]) -> Result<Result<Vec<Checkpoint>, String>, tokio_postgres::Error> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        match CheckpointRow::from_row(row)?.into_checkpoint() {
            Ok(cp) => out.push(cp),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(out))
}

/// The statement of `run_counts`: runs by workflow and status, one aggregate.
pub(crate) fn run_counts_sql(schema: &str) -> String {
    format!("SELECT workflow, status, count(*) FROM {schema}.runs GROUP BY workflow, status")
}

/// The rows of [`run_counts_sql`], ordered by workflow then status.
pub(crate) fn run_count_rows(
    rows: &[Row],
) -> Result<Result<Vec<durable_core::RunCount>, String>, tokio_postgres::Error> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let status: &str = row.try_get(1)?;
        let Ok(status) = status.parse::<RunStatus>() else {
            return Ok(Err(format!("runs: unknown status {status:?}")));
        };
        out.push(durable_core::RunCount { workflow: row.try_get(0)?, status, count: row.try_get::<_, i64>(2)? as u64 });
    }
    out.sort_by(|a, b| (&a.workflow, a.status).cmp(&(&b.workflow, b.status)));
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use durable_core::{CheckpointStatus, StepKind};

    use super::*;

    #[test]
    fn forever_round_trips() {
        assert_eq!(millis_to_sql(u64::MAX), i64::MAX);
        assert_eq!(millis_from_sql(i64::MAX, String::new).unwrap(), u64::MAX);
        assert!(millis_from_sql(-1, String::new).is_err());
    }

    #[test]
    fn payloads_travel_as_strings() {
        let mut c = Commit::new(RunId::from("r"), "o", 5);
        let mut cp = Checkpoint::new(RunId::from("r"), 0, "s", StepKind::Step, CheckpointStatus::Completed, 5);
        cp.output = Some(Payload::from_trusted("{ \"a\" :1.0 }"));
        c.checkpoints.push(cp);
        let text = Op::Commit(CommitJson::new(&c)).encode();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["op"], "commit");
        assert_eq!(v["checkpoints"][0]["output"], "{ \"a\" :1.0 }");
    }

    /// Run `id` of workflow `wf`, created at `at`, with no key.
    fn plain_run(id: &str, at: Millis) -> NewRun {
        NewRun {
            trace_context: None,
            admission: None,
            id: RunId::from(id),
            workflow: "wf".into(),
            version: 1,
            namespace: "default".into(),
            input: Payload::null(),
            tags: vec![],
            priority: 0,
            parent: None,
            created_at: at,
            start_at: None,
        }
    }

    #[test]
    fn batch_locks_name_every_key_and_delivery_of_the_batch() {
        let run = RunId::from("p");
        let mut c = Commit::new(run.clone(), "o", 5);
        c.waits.push(Waiter {
            run_id: run.clone(),
            seq: 0,
            name: "w".into(),
            kind: WaitKind::Event { name: "paid".into(), matcher: Payload::null() },
            created_at: 5,
        });
        c.signals.push(durable_core::OutgoingSignal { token: "child:q:1".into(), payload: Payload::null() });
        let patch = RunPatch {
            signals: vec![durable_core::OutgoingSignal { token: "child:q:2".into(), payload: Payload::null() }],
            ..RunPatch::default()
        };
        let done = TaskDone {
            run_id: RunId::from("t"),
            seq: 3,
            attempt: 1,
            worker: None,
            result: Ok(Payload::null()),
            logs: vec![],
            now: 5,
        };
        let event = Publish {
            gather: vec![BufferAppend {
                workflow: "wf".into(),
                key: "k".into(),
                gather: Gather::Batch { max_items: 3, max_wait_ms: 9 },
                batch_id: "b".into(),
                run: plain_run("x", 0),
            }],
            ..Publish::event("e", Payload::null(), 5)
        };
        let target = RunId::from("u");
        let claim = Claim { run_id: RunId::from("c"), owner: "o".into(), lease_until: 9, now: 5 };
        let ops = [
            Op::Commit(CommitJson::new(&c)),
            Op::UpdateRunIf(PatchJson::new(&target, &[], &patch)),
            Op::SendSignal { token: "sig", payload: "1", now: 5, claim: None },
            Op::CompleteTask(TaskDoneJson::new(&done)),
            Op::Publish(PublishJson::new(&event).unwrap()),
            Op::DeleteRun { id: "gone" },
            Op::Enqueue { items: vec![], now: 5 },
            claim_op(&claim, 0),
        ];
        let mut locks = BatchLocks::default();
        for op in &ops {
            locks.extend(&BatchLocks::of(op));
        }
        let v: Value = serde_json::from_str(&locks.encode()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "probe": ["p", "u"],
                "delete": ["gone"],
                "keys": [["event", "paid"], ["signal", "child:q:1"], ["signal", "child:q:2"], ["signal", "sig"],
                         ["signal", protocol::remote_token(&done.run_id, 3)], ["event", "e"]],
                "buffers": [["wf", "k"]],
                "queue": true,
                "tokens": ["child:q:1", "child:q:2", "sig"],
                "events": ["e"],
                "task_runs": ["t"],
            })
        );
        // A commit without checkpoints (a lease touch) names its run only; a step's commit, and a
        // claim, nothing.
        let mut step = Commit::new(RunId::from("s"), "o", 5);
        assert_eq!(BatchLocks::of(&Op::commit(&step)).encode(), r#"{"probe":["s"]}"#);
        step.checkpoints.push(Checkpoint::new(
            RunId::from("s"),
            0,
            "a",
            StepKind::Step,
            CheckpointStatus::Completed,
            5,
        ));
        assert!(matches!(Op::commit(&step), Op::StepCommit(_)));
        let v: Value = serde_json::from_str(&Op::commit(&step).encode()).unwrap();
        assert_eq!(
            (v["op"].as_str(), v["run"].as_str(), v["checkpoint"]["name"].as_str()),
            (Some("step_commit"), Some("s"), Some("a"))
        );
        assert_eq!(BatchLocks::of(&Op::commit(&step)).encode(), "{}");
        assert_eq!(BatchLocks::of(&ops[7]).encode(), "{}");
        // A settle with checkpoints only goes as a settle commit, with a settling commit's locks;
        // with anything else, or a suspend, as a commit.
        let mut settle = step.clone();
        settle.end = Some(TurnEnd::Settle { status: RunStatus::Completed, output: None, error: None });
        assert!(matches!(Op::commit(&settle), Op::SettleCommit(_)));
        let v: Value = serde_json::from_str(&Op::commit(&settle).encode()).unwrap();
        assert_eq!((v["op"].as_str(), v["end"]["type"].as_str()), (Some("settle_commit"), Some("settle")));
        assert_eq!(BatchLocks::of(&Op::commit(&settle)).encode(), r#"{"probe":["s"],"settles":["s"]}"#);
        let mut releasing = settle.clone();
        releasing.release_slots.push(("q:default:api".into(), "s:4".into()));
        assert!(matches!(Op::commit(&releasing), Op::Commit(_)));
        let mut suspending = step.clone();
        suspending.end = Some(TurnEnd::Suspend { wake_at: None, seen_wake_gen: 0 });
        assert!(matches!(Op::commit(&suspending), Op::Commit(_)));
    }

    /// The gate rows a batch locks: its keyed children and starts, the slots it acquires and
    /// releases, and every gate of a run that settles.
    #[test]
    fn batch_locks_name_the_gates_of_keyed_runs_slots_and_settles() {
        let keyed = |id: &str, gate: &str| NewRun {
            admission: Some(SlotRequest {
                gate: gate.into(),
                holder: id.into(),
                run_id: RunId::from(id),
                priority: 0,
                fairness_key: String::new(),
                limits: Limits { concurrency: Some(1), ..Limits::default() },
                lease_until: None,
                max_waiting: None,
                succeeds: None,
                now: 5,
            }),
            ..plain_run(id, 5)
        };
        let mut c = Commit::new(RunId::from("p"), "o", 5);
        c.children.push(keyed("c1", "key:default:wf:b"));
        c.children.push(NewRun { admission: None, ..keyed("c2", "-") });
        c.children.push(keyed("c3", "key:default:wf:a"));
        c.release_slots.push(("q:default:api".into(), "p:4".into()));
        let mut settling = c.clone();
        settling.end = Some(TurnEnd::Settle { status: RunStatus::Completed, output: None, error: None });
        let start = keyed("s", "key:default:wf:c");
        let request = keyed("x", "q:default:db").admission.unwrap();
        let (cancelled, paused) = (RunId::from("k"), RunId::from("q"));
        let cancel = RunPatch { status: Some(RunStatus::Cancelled), ..RunPatch::default() };
        let pause = RunPatch { status: Some(RunStatus::Suspended), ..RunPatch::default() };
        let ops = [
            Op::Commit(CommitJson::new(&c)),
            Op::Commit(CommitJson::new(&settling)),
            Op::UpdateRunIf(PatchJson::new(&cancelled, &[], &cancel)),
            Op::UpdateRunIf(PatchJson::new(&paused, &[], &pause)),
            Op::CreateRun(CreateRunJson::new(&start).unwrap()),
            Op::AcquireSlot(SlotRequestJson::new(&request).unwrap()),
            Op::ReleaseSlot { gate: "q:default:db", holder: "x", now: 5 },
        ];
        let mut locks = BatchLocks::default();
        for op in &ops {
            locks.extend(&BatchLocks::of(op));
        }
        let v: Value = serde_json::from_str(&locks.encode()).unwrap();
        assert_eq!(
            (&v["gates"], &v["settles"]),
            (
                &serde_json::json!([
                    "key:default:wf:b",
                    "key:default:wf:a",
                    "q:default:api",
                    "key:default:wf:b",
                    "key:default:wf:a",
                    "q:default:api",
                    "key:default:wf:c",
                    "q:default:db",
                    "q:default:db"
                ]),
                &serde_json::json!(["p", "k"])
            )
        );
    }

    #[test]
    fn results_travel_with_their_token_and_timeout_flag() {
        let error = StepError { code: Some(codes::REMOTE_TIMEOUT.into()), ..StepError::retryable("slow") };
        let d = TaskDone {
            run_id: RunId::from("r"),
            seq: 3,
            attempt: 2,
            worker: None,
            result: Err(error),
            logs: vec![],
            now: u64::MAX,
        };
        let v: Value = serde_json::from_str(&Op::CompleteTask(TaskDoneJson::new(&d)).encode()).unwrap();
        assert_eq!(v["op"], "complete_task");
        assert_eq!(v["token"], protocol::remote_token(&d.run_id, 3));
        assert_eq!(
            (v["timed_out"].as_bool(), v["output"].is_null(), v["now"].as_i64()),
            (Some(true), true, Some(i64::MAX))
        );
        let d = TaskDone { result: Ok(Payload::from_trusted("{ \"a\": 1 }")), ..d };
        let v: Value = serde_json::from_str(&Op::CompleteTask(TaskDoneJson::new(&d)).encode()).unwrap();
        assert_eq!(
            (v["output"].as_str(), v["error"].is_null(), v["timed_out"].as_bool()),
            (Some("{ \"a\": 1 }"), true, Some(false))
        );
    }

    #[test]
    fn settle_carries_the_transition_table() {
        let all = allowed_from(RunStatus::Completed);
        assert_eq!(all, vec!["running", "completed"]);
        assert!(allowed_from(RunStatus::Pending).contains(&"failed"));
    }

    #[test]
    fn queue_items_merge_per_run_like_the_queue() {
        let item = |run: &str, reason: QueueReason, ns: Option<&str>, priority: i32| QueuedRun {
            id: 0,
            run_id: RunId::from(run),
            reason,
            namespace: ns.map(str::to_string),
            priority,
            dedupe_key: format!("{reason}:{run}:{priority}"),
        };
        let merged = merge_queue_items(vec![
            item("a", QueueReason::Start, None, 1),
            item("b", QueueReason::Wake, Some("x"), 0),
            item("a", QueueReason::Wake, Some("y"), 0),
            item("a", QueueReason::Start, Some("z"), 5),
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].run_id.as_str(), "a");
        assert_eq!(merged[0].reason, QueueReason::Wake);
        assert_eq!(merged[0].dedupe_key, "wake:a:0");
        assert_eq!(merged[0].priority, 5);
        assert_eq!(merged[0].namespace.as_deref(), Some("y"));
        assert_eq!(merged[1].run_id.as_str(), "b");
        let text = Op::Enqueue { items: merged.iter().map(QueueItemJson::new).collect(), now: 7 }.encode();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["op"], "enqueue");
        assert_eq!(v["items"][0]["reason"], "wake");
        assert_eq!(
            Op::AckQueued { ids: queue_ids(&[3, u64::MAX]), owner: "o" }.encode(),
            r#"{"op":"ack_queued","ids":[3],"owner":"o"}"#
        );
    }

    #[test]
    fn publishes_and_saves_travel_in_the_stores_own_format() {
        let run = NewRun {
            trace_context: None,
            admission: None,
            id: RunId::from("x"),
            workflow: "wf".into(),
            version: 1,
            namespace: "default".into(),
            input: Payload::null(),
            tags: vec![],
            priority: 0,
            parent: None,
            created_at: 0,
            start_at: Some(u64::MAX),
        };
        let event = Publish {
            start: vec![run.clone()],
            gather: vec![BufferAppend {
                workflow: "wf".into(),
                key: "k".into(),
                gather: Gather::Batch { max_items: 3, max_wait_ms: 9 },
                batch_id: "b".into(),
                run: run.clone(),
            }],
            ..Publish::event("e", Payload::from_trusted("{ \"a\" :1 }"), 5)
        };
        let v: Value = serde_json::from_str(&Op::Publish(PublishJson::new(&event).unwrap()).encode()).unwrap();
        assert_eq!(v["op"], "publish");
        assert_eq!(v["payload"], "{ \"a\" :1 }");
        assert_eq!(v["start"][0]["start_at"], i64::MAX, "delayed starts carry their wake_at");
        assert_eq!(v["gather"][0]["gather"], serde_json::json!({"kind": "batch", "max_items": 3, "max_wait_ms": 9}));
        assert_eq!(v["dedupe"], Value::Null);

        let record = ScheduleRecord::new(
            "k",
            "default",
            "wf",
            Payload::from_trusted("[1 ]"),
            durable_core::Schedule::every(std::time::Duration::from_secs(60)),
            0,
        )
        .unwrap();
        let save = SaveSchedule { record: record.clone(), expected: Some(4), start: vec![] };
        let json = SaveScheduleJson::new(&save).unwrap();
        let stored = schedule_body(&json.body).unwrap();
        assert_eq!(stored, ScheduleRecord { revision: 5, ..record }, "the body carries the revision it gets");
        assert_eq!(save_answer(r#"{"saved": true, "revision": 5}"#).unwrap(), SaveOutcome::Saved(5));
        let stale = serde_json::json!({"saved": false, "current": json.body}).to_string();
        assert_eq!(save_answer(&stale).unwrap(), SaveOutcome::Stale(Some(Box::new(stored))));
        assert_eq!(save_answer(r#"{"saved": false, "current": null}"#).unwrap(), SaveOutcome::Stale(None));
        assert!(matches!(save_answer(r#"{"saved": false, "current": "{"}"#), Err(Answer::Corrupt(_))));
    }

    #[test]
    fn admission_travels_in_the_stores_own_format() {
        let limits = Limits {
            concurrency: Some(2),
            rate: Some(Rate::per(5, std::time::Duration::from_secs(1))),
            priority: PriorityOrder::LowestFirst,
            fairness: true,
            order: Order::Lifo,
        };
        let json = LimitsJson::new("g", &limits).unwrap();
        assert_eq!(
            serde_json::to_value(&json).unwrap(),
            serde_json::json!({"concurrency": 2, "rate_limit": 5, "rate_period_ms": 1000, "lowest_first": true,
                               "fairness": true, "lifo": true})
        );
        assert_eq!(json.into_limits("g").unwrap(), limits);
        let none = LimitsJson::new("g", &Limits::default()).unwrap();
        assert_eq!(none.into_limits("g").unwrap(), Limits::default());
        let zero = Limits { rate: Some(Rate { limit: 1, period_ms: 0 }), ..Limits::default() };
        assert!(LimitsJson::new("g", &zero).is_err(), "a 0 ms window is refused before anything is sent");

        let mut c = Commit::new(RunId::from("r"), "o", 5);
        c.release_slots.push(("queue:default:api".into(), "r:3".into()));
        let v: Value = serde_json::from_str(&Op::Commit(CommitJson::new(&c)).encode()).unwrap();
        assert_eq!(v["release_slots"], serde_json::json!([["queue:default:api", "r:3"]]));
        let mut run = plain_run("k", 0);
        let plain: Value = serde_json::from_str(&Op::CreateRun(CreateRunJson::new(&run).unwrap()).encode()).unwrap();
        assert!(plain.get("admission").is_none(), "a plain create carries no key");
        run.admission = Some(SlotRequest {
            gate: "key:default:wf:acme".into(),
            holder: "k".into(),
            run_id: RunId::from("k"),
            priority: 0,
            fairness_key: String::new(),
            limits,
            lease_until: None,
            max_waiting: Some(3),
            succeeds: None,
            now: 7,
        });
        let keyed: Value = serde_json::from_str(&Op::CreateRun(CreateRunJson::new(&run).unwrap()).encode()).unwrap();
        assert_eq!((keyed["op"].as_str(), keyed["admission"]["max_waiting"].as_u64()), (Some("create_run"), Some(3)));

        let id = RunId::from("r");
        let waiting = admission_answer(r#"{"admission": "waiting", "retry_at": 9}"#, &id).unwrap();
        assert_eq!(waiting, Admission::Waiting { retry_at: Some(9) });
        let full = admission_answer(r#"{"admission": "full", "held": 2, "waiting": 5000000000}"#, &id).unwrap();
        assert_eq!(full, Admission::Full { held: 2, waiting: u32::MAX }, "counts saturate as the core's do");
        match create_answer(r#"{"err": "queue_full", "gate": "g", "held": 1, "waiting": 2}"#, run) {
            Err(Answer::Store(StoreError::QueueFull { gate, held: 1, waiting: 2 })) => assert_eq!(gate, "g"),
            other => panic!("{other:?}"),
        }
        assert_eq!(handed_answer(r#"{"handed": ["a", "b"]}"#).unwrap(), [RunId::from("a"), RunId::from("b")]);
    }

    #[test]
    fn error_answers_become_contract_errors() {
        let id = RunId::from("r");
        match parse(r#"{"err":"lease_lost"}"#, &id, Some("me")) {
            Err(Answer::Store(StoreError::LeaseLost { owner, .. })) => assert_eq!(owner, "me"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(r#"{"err":"not_found"}"#, &id, None), Err(Answer::Store(StoreError::NotFound { .. }))));
        assert!(matches!(parse("nope", &id, None), Err(Answer::Corrupt(_))));
    }
}
