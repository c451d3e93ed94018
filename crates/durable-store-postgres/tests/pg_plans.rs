//! The query plans of the statements the store builds: every `list_runs` filter and combination
//! of filters, the three poller scans, the claim of due runs, the due schedules and trigger
//! buffers and the schedule listings are served by an index (PostgreSQL's `EXPLAIN (FORMAT
//! JSON)`, with the statement's own parameters: no `Seq Scan`, and no index scanned whole
//! without a condition unless that is what the query wants), so they cost what they match, not
//! the number of rows.
//!
//! The task scans are in it too: the claim (of any namespace or one, one queue or several, with
//! and without capabilities), every `list_tasks` filter (a run's, unfinished, queued, expired,
//! silent) and the queue figures, on 20,000 tasks: most finished, one in five claimed, and the
//! queued ones in two rare queues.
//!
//! The admission statements too (the helpers of `sql/v8.sql` that a slot's acquire and release
//! run: the queue's head, the waiters ranked ahead, a fairness key's round, the live slots, the
//! gates of a run; and the stats and a run's records), on 20,000 slots and 20,000 waiters over
//! 1,000 gates.
//!
//! The runs table holds 20,000 runs, mostly `completed` runs of a few bulk workflows, with rare
//! slices for each filter to find (delayed starts among them); the schedules and trigger buffers
//! 20,000 each, one in a thousand due. The tables are `ANALYZE`d, and `enable_seqscan = off` asks
//! whether an index *can* serve each statement rather than whether the planner prefers one on
//! this data.

mod common;

use common::{ScratchSchema, url_or_skip};
use durable_core::admission::Rank;
use durable_core::task::TaskClaim;
use durable_core::{DueQuery, RunFilter, RunId, RunQuery, RunStatus, TaskFilter};
use durable_store_postgres::__private::{
    Poll, Statement, admission_sql, claim_due_sql, claim_tasks_sql, due_buffers_sql, due_schedules_sql, list_runs_sql,
    list_schedules_sql, list_tasks_sql, poll_sql, queue_stats_sql, run_counts_sql,
};
use durable_store_postgres::PostgresStore;
use durable_store_postgres::deadpool_postgres::tokio_postgres::Client;
use durable_store_postgres::deadpool_postgres::tokio_postgres::types::{FromSql, ToSql, Type};
use serde_json::Value;

/// The indexes the plans below rest on: dropping any one of them must break a plan.
const PLAN_INDEXES: &[&str] = &[
    "runs_created",
    "runs_settled_created",
    "runs_active_created",
    "runs_workflow_created",
    "runs_workflow_status_created",
    "runs_namespace_created",
    "runs_parent_created",
    "runs_tags",
    "runs_pending",
    "runs_due",
    "runs_orphaned",
    "schedules_due",
    "schedules_namespace",
    "trigger_buffers_due",
    "tasks_claim",
    "tasks_deadline",
    "tasks_silent",
    "tasks_created",
    "admission_slots_run",
    "admission_waiters_rank",
    "admission_waiters_key",
    "admission_waiters_run",
];

const T0: i64 = 1_700_000_000_000;
const RUNS: i64 = 20_000;

/// 20,000 runs: run `g` is created at `T0 + g`; most are `completed` runs of workflows
/// `bulk-0` … `bulk-4` in namespace `default`; one in a thousand is `dead`, `failed`,
/// `suspended` (due), `running` (lease expired), `pending`, `running` (lease held) or `pending`
/// with a delayed start (due for the first half of them); a few dozen each are of workflow
/// `wf-1`, of namespace `tenant`, tagged `vip`, children of `parent`.
///
/// 20,000 schedules and 20,000 trigger buffers (of two payloads each), alike: most due in the
/// future (the schedules a few paused), one in a thousand due, in the same workflows and
/// namespaces.
fn populate_sql(schema: &str) -> String {
    format!(
        "INSERT INTO \"{schema}\".runs (id, workflow, version, namespace, status, input, tags, priority, parent_id,
             parent_seq, created_at, updated_at, wake_at, lease_owner, lease_until)
         SELECT 'run-' || lpad(g::text, 6, '0'),
                CASE WHEN g % 500 = 7 THEN 'wf-1' ELSE 'bulk-' || (g % 5) END,
                1,
                CASE WHEN g % 400 = 9 THEN 'tenant' ELSE 'default' END,
                CASE g % 1000 WHEN 1 THEN 'dead' WHEN 2 THEN 'failed' WHEN 3 THEN 'suspended'
                              WHEN 4 THEN 'running' WHEN 5 THEN 'pending' WHEN 6 THEN 'running'
                              WHEN 8 THEN 'pending' ELSE 'completed' END,
                '{{}}',
                CASE WHEN g % 300 = 10 THEN ARRAY['vip'] ELSE '{{}}'::text[] END,
                0,
                CASE WHEN g % 350 = 11 THEN 'parent' END,
                CASE WHEN g % 350 = 11 THEN g END,
                {T0} + g, {T0} + g,
                CASE WHEN g % 1000 = 3 THEN {T0} + g WHEN g % 1000 = 8 THEN {T0} + 2 * g END,
                CASE WHEN g % 1000 IN (4, 6) THEN 'engine' END,
                CASE WHEN g % 1000 = 4 THEN {T0} WHEN g % 1000 = 6 THEN {T0} + 10 * {RUNS} END
         FROM generate_series(1, {RUNS}) AS g;
         INSERT INTO \"{schema}\".schedules (key, namespace, workflow, due_at, revision, body)
         SELECT 'sched-' || lpad(g::text, 6, '0'),
                CASE WHEN g % 400 = 9 THEN 'tenant' ELSE 'default' END,
                CASE WHEN g % 500 = 7 THEN 'wf-1' ELSE 'bulk-' || (g % 5) END,
                CASE WHEN g % 1000 = 3 THEN {T0} + g WHEN g % 100 = 1 THEN NULL ELSE {T0} + 100 * {RUNS} + g END,
                1, '{{}}'
         FROM generate_series(1, {RUNS}) AS g;
         INSERT INTO \"{schema}\".trigger_buffers (workflow, key, namespace, batch_id, due_at, first_at, last_at,
                                                   size, gather, run)
         SELECT CASE WHEN g % 500 = 7 THEN 'wf-1' ELSE 'bulk-' || (g % 5) END, 'key-' || g,
                CASE WHEN g % 400 = 9 THEN 'tenant' ELSE 'default' END, 'batch-' || g,
                CASE WHEN g % 1000 = 3 THEN {T0} + g ELSE {T0} + 100 * {RUNS} + g END, {T0} + g, {T0} + g,
                2, '{{\"kind\": \"batch\", \"max_items\": 10, \"max_wait_ms\": 1000}}', '{{}}'
         FROM generate_series(1, {RUNS}) AS g;
         INSERT INTO \"{schema}\".trigger_buffer_payloads (workflow, key, n, payload)
         SELECT b.workflow, b.key, n, '{{}}' FROM \"{schema}\".trigger_buffers AS b, generate_series(0, 1) AS n;
         INSERT INTO \"{schema}\".tasks (run_id, seq, attempt, name, queue, namespace, input, priority, requires,
                                        pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state,
                                        worker, lease_until, claimed_at, heartbeat_at, outcome)
         SELECT 'run-' || lpad(g::text, 6, '0'), 1, 1, 'resize',
                CASE g % 100 WHEN 3 THEN 'rare' WHEN 13 THEN 'rare-2' ELSE 'q-' || (g % 5) END,
                CASE WHEN g % 400 = 9 THEN 'tenant' ELSE 'default' END, '{{}}', 0,
                CASE WHEN g % 7 = 0 THEN ARRAY['gpu'] ELSE '{{}}'::text[] END,
                CASE WHEN g % 3 = 0 THEN 60000 END, CASE WHEN g % 3 = 1 THEN 60000 END, 30000, {T0} + g, st,
                CASE WHEN st = 'claimed' THEN 'w' END,
                CASE WHEN st = 'claimed' AND g % 2 = 0 THEN {T0} WHEN st = 'claimed' THEN {T0} + 10 * {RUNS} END,
                CASE WHEN st <> 'queued' THEN {T0} + g END,
                CASE WHEN st <> 'queued' THEN {T0} + g END,
                CASE WHEN st = 'finished' THEN 'completed' END
         FROM (SELECT g, CASE WHEN g % 100 IN (3, 13) THEN 'queued' WHEN g % 10 IN (4, 5) THEN 'claimed'
                              ELSE 'finished' END AS st
                 FROM generate_series(1, {RUNS}) AS g) AS x;
         INSERT INTO \"{schema}\".admission_gates (gate, limits, next_ticket, round, window_start, window_count,
                                                  touched)
         SELECT 'gate-' || lpad(g::text, 4, '0'), '{{\"concurrency\": 5}}', {RUNS}, 0, {T0}, 0, {T0}
         FROM generate_series(0, 999) AS g;
         INSERT INTO \"{schema}\".admission_slots (gate, holder, run_id, acquired_at, lease_until)
         SELECT 'gate-' || lpad((g % 1000)::text, 4, '0'), 'run-' || lpad(g::text, 6, '0') || ':1',
                'run-' || lpad(g::text, 6, '0'), {T0} + g,
                CASE WHEN g % 1000 = 5 THEN {T0} WHEN g % 3 = 0 THEN NULL ELSE {T0} + 10 * {RUNS} END
         FROM generate_series(1, {RUNS}) AS g;
         INSERT INTO \"{schema}\".admission_waiters (gate, holder, run_id, rank_priority, rank_round, rank_ticket,
                                                    priority, fairness_key, lease_ms, since)
         SELECT 'gate-' || lpad((g % 1000)::text, 4, '0'), 'run-' || lpad(g::text, 6, '0') || ':2',
                'run-' || lpad(g::text, 6, '0'), -(g % 3), g % 7, g, g % 3, 'key-' || (g % 10), 30000, {T0} + g
         FROM generate_series(1, {RUNS}) AS g;
         ANALYZE \"{schema}\".admission_gates;
         ANALYZE \"{schema}\".admission_slots;
         ANALYZE \"{schema}\".admission_waiters;
         ANALYZE \"{schema}\".tasks;
         ANALYZE \"{schema}\".runs;
         ANALYZE \"{schema}\".schedules;
         ANALYZE \"{schema}\".trigger_buffers;
         ANALYZE \"{schema}\".trigger_buffer_payloads;"
    )
}

/// The status filters: none, one rare status, several rare ones, the active ones.
fn status_filters() -> Vec<Vec<RunStatus>> {
    vec![
        vec![],
        vec![RunStatus::Dead],
        vec![RunStatus::Failed, RunStatus::Dead, RunStatus::Suspended],
        RunStatus::ACTIVE.to_vec(),
    ]
}

/// Every combination of every filter `RunFilter` offers (each present or not; the statuses as
/// in [`status_filters`]), with and without a cursor.
fn filters() -> Vec<RunFilter> {
    let cursor = format!("{}:run-015000", T0 + 15_000);
    let mut out = Vec::new();
    for statuses in status_filters() {
        for mask in 0u32..(1 << 7) {
            let on = |bit: u32| mask & (1 << bit) != 0;
            out.push(RunFilter {
                workflow: on(0).then(|| "wf-1".to_string()),
                statuses: statuses.clone(),
                namespace: on(1).then(|| "tenant".to_string()),
                tag: on(2).then(|| "vip".to_string()),
                parent: on(3).then(|| RunId::from("parent")),
                created_after: on(4).then_some((T0 + 10_000) as u64),
                created_before: on(5).then_some((T0 + 10_600) as u64),
                limit: 20,
                cursor: on(6).then(|| cursor.clone()),
            });
        }
    }
    out
}

/// One statement to plan, and the indexes it may scan whole (an index scan without an index
/// condition): partial indexes that hold only rows of the statuses wanted, or the newest-first
/// index for an unfiltered listing.
struct Case {
    name: String,
    statement: Statement,
    may_walk: Vec<&'static str>,
    /// The index it must use (the poller scans: their partial index, which reads only what they
    /// return, where the status index would read every run of the status).
    must_use: Option<&'static str>,
    /// The columns that `must_use`'s index condition must name (a workflow and status filter:
    /// both, not the workflow alone with each row's status checked).
    cond_on: &'static [&'static str],
    /// Whether `must_use` must be read alone (an `Index Only Scan`) and nothing sorted
    /// (`run_counts`: the counts in the index's order, without visiting the rows).
    index_only: bool,
}

fn cases(store: &PostgresStore) -> Vec<Case> {
    let mut out = Vec::new();
    for f in filters() {
        let unfiltered = f == RunFilter { limit: f.limit, ..RunFilter::default() };
        // Active runs (the working set) are found by walking the partial indexes that hold
        // only them.
        let active = f.statuses.iter().any(|s| !s.is_terminal());
        out.push(Case {
            name: format!("list_runs {f:?}"),
            statement: list_runs_sql(store, &f).expect("a valid filter"),
            may_walk: if unfiltered {
                vec!["runs_created"]
            } else if active {
                vec!["runs_active_created", "runs_pending", "runs_due", "runs_orphaned"]
            } else {
                vec![]
            },
            must_use: None,
            cond_on: &[],
            index_only: false,
        });
    }
    // A workflow with many runs and statuses rare among them: each status is a range of
    // runs_workflow_status_created (workflow and status in its condition), not a walk of the
    // workflow's runs checking their status. The workflow alone walks runs_workflow_created in
    // the listing order (not all its runs of every status, sorted; past the cursor, the
    // planner may as well walk runs_created, a fifth of whose runs are the workflow's).
    for statuses in status_filters() {
        let by_status = !statuses.is_empty();
        let cursors = if by_status { vec![None, Some(format!("{}:run-015000", T0 + 15_000))] } else { vec![None] };
        for cursor in cursors {
            let f = RunFilter {
                workflow: Some("bulk-1".into()),
                statuses: statuses.clone(),
                limit: 20,
                cursor,
                ..RunFilter::default()
            };
            out.push(Case {
                name: format!("list_runs {f:?}"),
                statement: list_runs_sql(store, &f).expect("a valid filter"),
                may_walk: vec![],
                must_use: Some(if by_status { "runs_workflow_status_created" } else { "runs_workflow_created" }),
                cond_on: if by_status { &["workflow", "status"] } else { &["workflow"] },
                index_only: false,
            });
        }
    }
    let workflows = [None, Some(vec![("bulk-1".to_string(), 1), ("wf-1".to_string(), 1)])];
    for which in [Poll::Pending, Poll::Due, Poll::Orphaned] {
        // The due scan also leaving runs to their fresh items in the run queue.
        let leaves: &[Option<u64>] = if which == Poll::Due { &[None, Some((T0 + RUNS - 10) as u64)] } else { &[None] };
        for namespace in [None, Some("default".to_string())] {
            for (workflows, &leave_queued_since) in workflows.iter().flat_map(|w| leaves.iter().map(move |l| (w, l))) {
                let (namespace, workflows) = (namespace.clone(), workflows.clone());
                let q = RunQuery { namespace, workflows, now: (T0 + RUNS) as u64, limit: 10, leave_queued_since };
                let (may_walk, must_use) = match which {
                    Poll::Pending => (vec!["runs_pending"], "runs_pending"),
                    Poll::Due => (vec![], "runs_due"),
                    Poll::Orphaned => (vec![], "runs_orphaned"),
                };
                out.push(Case {
                    name: format!("{which:?} {q:?}"),
                    statement: poll_sql(store, which, &q),
                    may_walk,
                    must_use: Some(must_use),
                    cond_on: &[],
                    index_only: false,
                });
            }
        }
    }
    // The claim of due runs: the due scan, locking what it picks, and an update of those rows;
    // also leaving runs to their fresh items in the run queue (a probe of `run_queue_open` each).
    for namespace in [None, Some("default".to_string())] {
        for (workflows, leave_queued_since) in
            workflows.clone().into_iter().flat_map(|w| [(w.clone(), None), (w, Some((T0 + RUNS - 10) as u64))])
        {
            let (namespace, now) = (namespace.clone(), (T0 + RUNS) as u64);
            let q = RunQuery { namespace, workflows, now, limit: 10, leave_queued_since };
            out.push(Case {
                name: format!("claim_due_runs {q:?}"),
                statement: claim_due_sql(store, &q, q.now + 30_000),
                may_walk: vec![],
                must_use: Some("runs_due"),
                cond_on: &[],
                index_only: false,
            });
        }
    }
    // Due schedules and trigger buffers: those due now, and the next one to come due.
    let workflows = [None, Some(vec!["bulk-1".to_string(), "wf-1".to_string()])];
    for (now, limit) in [((T0 + RUNS) as u64, 10), (u64::MAX, 1)] {
        for namespace in [None, Some("default".to_string())] {
            for workflows in workflows.clone() {
                let q = DueQuery { namespace: namespace.clone(), workflows, now, limit };
                out.push(Case {
                    name: format!("due_schedules {q:?}"),
                    statement: due_schedules_sql(store, &q),
                    may_walk: vec![],
                    must_use: Some("schedules_due"),
                    cond_on: &[],
                    index_only: false,
                });
                out.push(Case {
                    name: format!("due_buffers {q:?}"),
                    statement: due_buffers_sql(store, &q),
                    may_walk: vec![],
                    must_use: Some("trigger_buffers_due"),
                    cond_on: &[],
                    index_only: false,
                });
            }
        }
    }
    // Schedule listings: every schedule by key (the primary key, walked from the start), or one
    // namespace's.
    for namespace in [None, Some("tenant")] {
        for after in [None, Some("sched-010000")] {
            let (may_walk, must_use) = match (namespace, after) {
                (None, None) => (vec!["schedules_pkey"], "schedules_pkey"),
                (None, Some(_)) => (vec![], "schedules_pkey"),
                (Some(_), _) => (vec![], "schedules_namespace"),
            };
            out.push(Case {
                name: format!("list_schedules {namespace:?} after {after:?}"),
                statement: list_schedules_sql(store, namespace, after, 20),
                may_walk,
                must_use: Some(must_use),
                cond_on: &[],
                index_only: false,
            });
        }
    }
    out.extend(task_cases(store));
    out.extend(admission_cases(store));
    out
}

/// The admission helpers' statements, the stats and a run's records.
fn admission_cases(store: &PostgresStore) -> Vec<Case> {
    let rank = Rank { priority: -1, round: 3, ticket: 10_007 };
    admission_sql(store, "gate-0007", rank, "key-7", "run-000007", (T0 + RUNS) as u64)
        .into_iter()
        .map(|(name, statement)| {
            let (may_walk, must_use) = match name {
                "queue head" | "waiters ahead" => (vec![], Some("admission_waiters_rank")),
                // The gate's first entries of either index that leads with it.
                "waiting" => (vec![], None),
                "key round" => (vec![], Some("admission_waiters_key")),
                "live slots" => (vec![], Some("admission_slots_pkey")),
                // The run's slots and waiters.
                "gates of a run" => (vec![], Some("admission_waiters_run")),
                "run admission" => (vec![], Some("admission_slots_run")),
                // Every gate, in order; each gate's slots and waiters by their indexes.
                "admission stats" => (vec!["admission_gates_pkey"], Some("admission_waiters_key")),
                other => panic!("unknown admission statement {other}"),
            };
            Case { name: format!("admission: {name}"), statement, may_walk, must_use, cond_on: &[], index_only: false }
        })
        .collect()
}

/// The claim, every `list_tasks` filter and the queue figures.
fn task_cases(store: &PostgresStore) -> Vec<Case> {
    let mut out = Vec::new();
    for namespace in [None, Some("tenant".to_string())] {
        for queues in [vec!["rare".to_string()], vec!["rare".to_string(), "rare-2".to_string()]] {
            for capabilities in [vec![], vec!["gpu".to_string()]] {
                let claim = TaskClaim {
                    worker: "w".into(),
                    queues: queues.clone(),
                    namespace: namespace.clone(),
                    capabilities,
                    limit: 10,
                    now: (T0 + RUNS) as u64,
                };
                out.push(Case {
                    name: format!("claim_tasks {claim:?}"),
                    statement: claim_tasks_sql(store, &claim),
                    may_walk: vec![],
                    must_use: Some("tasks_claim"),
                    cond_on: &[],
                    index_only: false,
                });
            }
        }
    }
    let (expired_at, silent_since) = ((T0 + 60_100) as u64, (T0 + 100) as u64);
    let filters = [
        (TaskFilter::default(), vec!["tasks_created"], "tasks_created"),
        (TaskFilter { run_id: Some(RunId::from("run-000003")), ..TaskFilter::default() }, vec![], "tasks_pkey"),
        // Open tasks (the working set, in the partial indexes that hold only them), or the
        // queued ones among them.
        (TaskFilter { unfinished: true, ..TaskFilter::default() }, vec!["tasks_claim", "tasks_silent"], ""),
        (TaskFilter { queued: true, ..TaskFilter::default() }, vec!["tasks_claim", "tasks_silent"], ""),
        (TaskFilter { expired_at: Some(expired_at), ..TaskFilter::default() }, vec![], "tasks_deadline"),
        (TaskFilter { silent_since: Some(silent_since), ..TaskFilter::default() }, vec![], "tasks_silent"),
    ];
    for (filter, may_walk, must_use) in filters {
        out.push(Case {
            name: format!("list_tasks {filter:?}"),
            statement: list_tasks_sql(store, &TaskFilter { limit: 20, ..filter }),
            may_walk,
            must_use: (!must_use.is_empty()).then_some(must_use),
            cond_on: &[],
            index_only: false,
        });
    }
    out.push(Case {
        name: "queue_stats".into(),
        statement: queue_stats_sql(store),
        may_walk: vec!["tasks_claim", "tasks_silent", "runs_active_created"],
        must_use: None,
        cond_on: &[],
        index_only: false,
    });
    out
}

/// The text of a `json` value, as the server sends it.
struct Json(String);

impl<'a> FromSql<'a> for Json {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Json(String::from_utf8(raw.to_vec())?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON
    }
}

/// The statement's plan: `EXPLAIN (FORMAT JSON)` with its own parameters.
async fn plan(client: &Client, statement: &Statement) -> Result<Value, String> {
    let (sql, params) = statement;
    let refs: Vec<(&(dyn ToSql + Sync), Type)> =
        params.iter().map(|(v, t)| (&**v as &(dyn ToSql + Sync), t.clone())).collect();
    let rows = client.query_typed(&format!("EXPLAIN (FORMAT JSON) {sql}"), &refs).await.map_err(|e| e.to_string())?;
    let Json(text) = rows[0].get(0);
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(v[0]["Plan"].clone())
}

/// Every node of a plan, depth first.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut out = vec![plan];
    if let Some(children) = plan["Plans"].as_array() {
        for child in children {
            out.extend(nodes(child));
        }
    }
    out
}

/// What is wrong with the plans of `cases`, one line per problem.
async fn violations(client: &Client, cases: &[Case]) -> Vec<String> {
    let mut out = Vec::new();
    for case in cases {
        let plan = match plan(client, &case.statement).await {
            Ok(plan) => plan,
            Err(e) => {
                out.push(format!("{}: cannot be planned: {e}", case.name));
                continue;
            }
        };
        let mut bad = |why: String| out.push(format!("{}: {why}\n  {}\n  plan: {plan}", case.name, case.statement.0));
        let mut used = Vec::new();
        for node in nodes(&plan) {
            let kind = node["Node Type"].as_str().unwrap_or_default();
            let index = node["Index Name"].as_str();
            used.extend(index.map(str::to_string));
            if kind == "Seq Scan" {
                bad(format!("reads the whole table (Seq Scan on {})", node["Relation Name"]));
            }
            if let Some(index) = index
                && node["Index Cond"].is_null()
                && !case.may_walk.contains(&index)
            {
                bad(format!("scans index {index} whole ({kind})"));
            }
        }
        if used.is_empty() {
            bad("reads no index".into());
        }
        if let Some(index) = case.must_use
            && !used.iter().any(|u| u == index)
        {
            bad(format!("does not use {index} (uses {used:?})"));
        }
        for node in nodes(&plan) {
            let kind = node["Node Type"].as_str().unwrap_or_default();
            if case.must_use.is_some() && node["Index Name"].as_str() == case.must_use {
                let cond = node["Index Cond"].as_str().unwrap_or_default();
                for col in case.cond_on {
                    if !cond.contains(col) {
                        bad(format!("reads {kind} without {col} in its condition ({cond:?})"));
                    }
                }
                if case.index_only && kind != "Index Only Scan" {
                    bad(format!("visits the rows ({kind}), not the index alone"));
                }
            }
            if case.index_only && kind.contains("Sort") {
                bad(format!("sorts ({kind})"));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_filter_and_poller_scan_is_served_by_an_index() {
    let Some(url) = url_or_skip("every_list_filter_and_poller_scan_is_served_by_an_index") else { return };
    let scratch = ScratchSchema::new(&url, "plans").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let admin = scratch.client().await.unwrap();
    admin.batch_execute(&populate_sql(scratch.name())).await.unwrap();
    // As autovacuum leaves a settled table: its pages all-visible, so an index can be read alone.
    // (Not when another session's older snapshot still needs the rows' previous state: then
    // PostgreSQL would visit every row whatever the index, and run_counts is not checked.)
    admin.batch_execute(&format!("VACUUM \"{}\".runs", scratch.name())).await.unwrap();
    let all_visible: bool = admin
        .query_one(
            "SELECT relallvisible >= relpages FROM pg_class WHERE oid = to_regclass($1)",
            &[&format!("\"{}\".runs", scratch.name())],
        )
        .await
        .unwrap()
        .get(0);
    admin.batch_execute("SET enable_seqscan = off").await.unwrap();
    let mut cases = cases(&store);
    assert_eq!(cases.len(), 4 * 128 + 3 * 2 + 1 + 4 * 4 + 2 * 4 + 2 * 8 + 4 + 8 + 6 + 1 + 8);
    if all_visible {
        // The counts by workflow and status: the index alone, in its order.
        cases.push(Case {
            name: "run_counts".into(),
            statement: run_counts_sql(&store),
            may_walk: vec!["runs_workflow_status_created"],
            must_use: Some("runs_workflow_status_created"),
            cond_on: &[],
            index_only: true,
        });
    } else {
        eprintln!("run_counts not checked: VACUUM could not mark the runs all-visible (an older snapshot is open)");
    }
    let found = violations(&admin, &cases).await;
    assert!(found.is_empty(), "{} plans read more than they match:\n{}", found.len(), found.join("\n"));

    // The check has teeth: without any one of the indexes, some plan breaks.
    for index in PLAN_INDEXES {
        admin.batch_execute(&format!("BEGIN; DROP INDEX \"{}\".{index};", scratch.name())).await.unwrap();
        let found = violations(&admin, &cases).await;
        admin.batch_execute("ROLLBACK").await.unwrap();
        assert!(!found.is_empty(), "no plan needs index {index}");
    }
    assert!(violations(&admin, &cases).await.is_empty(), "the indexes are back");
}
