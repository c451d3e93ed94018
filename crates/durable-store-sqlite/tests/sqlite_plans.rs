//! The query plans of the statements the store builds: every `list_runs` filter and combination
//! of filters, the three poller scans and the claim of due runs, are served by an index on the runs (SQLite's
//! `EXPLAIN QUERY PLAN`: a `SEARCH`, never a `SCAN` of the table or a walk of an index that the
//! query does not narrow, and no sort of the rows found), so they cost what they return, not
//! the number of runs (a workflow with statuses searches `runs_workflow_status_created` by both,
//! whether the statuses are rare among the workflow's runs or not); `run_counts` reads that index
//! alone (a covering index, in group order, no sort); so are the schedulers' due scans (schedules, trigger buffers) and the
//! schedule listing; so are the remote-step scans (a worker's claim, and the task listings by
//! run, expiry, silence and state); so are the admission lookups (a gate's queue head, the
//! waiters ranked before a request, a fairness key's round, a run's slots and requests). And
//! the answers of every combination are the memory store's.

mod common;

use std::sync::Arc;

use durable_core::TaskFilter;
use durable_core::task::TaskClaim;
use durable_core::{
    BufferAppend, DueQuery, Gather, NewRun, ParentLink, Payload, Publish, RunFilter, RunId, RunQuery, RunStatus,
    SaveSchedule, Schedule, ScheduleRecord, Store, encode_cursor,
};
use durable_store_memory::MemoryStore;
use durable_store_sqlite::__private::{
    Due, Poll, RUN_COUNTS_SQL, Value, admission_sql, claim_due_sql, claim_tasks_sql, due_sql, list_runs_sql,
    list_schedules_sql, list_tasks_sql, poll_sql,
};
use rusqlite::Connection;

/// The indexes the plans below rest on: dropping any one of them must break a plan.
const PLAN_INDEXES: &[&str] = &[
    "runs_created",
    "runs_status_created",
    "runs_workflow_created",
    "runs_workflow_status_created",
    "runs_namespace_created",
    "runs_parent_created",
    "run_tags_created",
    "runs_pending",
    "runs_due",
    "runs_orphaned",
    "schedules_due",
    "schedules_namespace",
    "trigger_buffers_due",
    "tasks_claim",
    "tasks_deadline",
    "tasks_seen",
    "tasks_unfinished",
    "tasks_created",
];

/// The tables whose whole walk a plan must not do.
const TABLES: &[&str] = &["runs", "run_tags", "schedules", "trigger_buffers", "tasks", "run_queue"];

const T0: u64 = 1_700_000_000_000;

/// The status filters: none, one rare status, several, and several with `completed` (where most
/// runs end).
fn status_filters() -> Vec<Vec<RunStatus>> {
    vec![
        vec![],
        vec![RunStatus::Dead],
        vec![RunStatus::Failed, RunStatus::Dead, RunStatus::Suspended],
        vec![RunStatus::Completed, RunStatus::Failed],
    ]
}

/// Every combination of every filter `RunFilter` offers (each present or not; the statuses as
/// in [`status_filters`]), with and without a cursor.
fn filters(cursor: &str) -> Vec<RunFilter> {
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
                created_after: on(4).then_some(T0 + 3),
                created_before: on(5).then_some(T0 + 40),
                limit: 3,
                cursor: on(6).then(|| cursor.to_string()),
            });
        }
    }
    out
}

/// Every query of the three poller scans: with and without a namespace, any workflow, none, or
/// two of them; the due scan also leaving runs to their items in the run queue.
fn poll_queries() -> Vec<(Poll, RunQuery)> {
    let mut out = Vec::new();
    for which in [Poll::Pending, Poll::Due, Poll::Orphaned] {
        let leaves: &[Option<u64>] = if which == Poll::Due { &[None, Some(T0 + 40)] } else { &[None] };
        for namespace in [None, Some("tenant".to_string())] {
            for workflows in [None, Some(vec![]), Some(vec![("wf-1".to_string(), 1), ("wf-2".to_string(), 3)])] {
                for &leave_queued_since in leaves {
                    let (namespace, workflows) = (namespace.clone(), workflows.clone());
                    out.push((which, RunQuery { namespace, workflows, now: T0 + 50, limit: 10, leave_queued_since }));
                }
            }
        }
    }
    out
}

/// Every query of the two due scans: with and without a namespace, any workflow, none, or two
/// of them.
fn due_queries() -> Vec<(Due, DueQuery)> {
    let mut out = Vec::new();
    for which in [Due::Schedules, Due::Buffers] {
        for namespace in [None, Some("tenant".to_string())] {
            for workflows in [None, Some(vec![]), Some(vec!["wf-1".to_string(), "wf-2".to_string()])] {
                out.push((which, DueQuery { namespace: namespace.clone(), workflows, now: T0 + 50, limit: 10 }));
            }
        }
    }
    out
}

/// One statement to plan, and what its plan may do besides searching an index.
struct Case {
    name: String,
    /// The table it reads (through an index).
    table: &'static str,
    sql: String,
    args: Vec<Value>,
    /// The one index it may walk whole (`SCAN <table> USING INDEX …`): a partial index that
    /// holds exactly the rows wanted, or the index in the listing order for an unfiltered
    /// listing.
    may_walk: Option<&'static str>,
    /// Whether it may sort what it found (the orphan scan sorts the orphans by age).
    may_sort: bool,
    /// How every read of its table must begin, when only one index and terms serve it (a
    /// workflow with statuses: a search of `runs_workflow_status_created` by both, not of the
    /// workflow's runs checking each one's status).
    must: Option<&'static str>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for f in filters(&format!("{}:run-0020", T0 + 20)) {
        let (sql, args) = list_runs_sql(&f).expect("a valid filter");
        let unfiltered = f == RunFilter { limit: f.limit, ..RunFilter::default() };
        let by_workflow_status =
            f.workflow.is_some() && !f.statuses.is_empty() && f.parent.is_none() && f.tag.is_none();
        out.push(Case {
            name: format!("list_runs {f:?}"),
            table: "runs",
            sql,
            args,
            may_walk: unfiltered.then_some("runs_created"),
            may_sort: false,
            must: by_workflow_status
                .then_some("SEARCH runs USING INDEX runs_workflow_status_created (workflow=? AND status=?"),
        });
    }
    // The counts by workflow and status: the covering index alone, in group order.
    out.push(Case {
        name: "run_counts".into(),
        table: "runs",
        sql: RUN_COUNTS_SQL.into(),
        args: vec![],
        may_walk: Some("runs_workflow_status_created"),
        may_sort: false,
        must: Some("SCAN runs USING COVERING INDEX runs_workflow_status_created"),
    });
    for (which, q) in poll_queries() {
        let Some((sql, args)) = poll_sql(which, &q) else {
            assert_eq!(q.workflows, Some(vec![]), "only a query for no workflow asks nothing");
            continue;
        };
        out.push(Case {
            name: format!("{which:?} {q:?}"),
            table: "runs",
            sql,
            args,
            may_walk: (which == Poll::Pending).then_some("runs_pending"),
            may_sort: which == Poll::Orphaned,
            must: None,
        });
    }
    // The claim of due runs: the due scan inside an update of the rows it found (by id).
    for (which, q) in poll_queries().into_iter().filter(|(which, _)| *which == Poll::Due) {
        let Some((sql, args)) = claim_due_sql(&q, q.now + 30_000) else {
            assert_eq!(q.workflows, Some(vec![]), "only a query for no workflow asks nothing");
            continue;
        };
        out.push(Case {
            name: format!("claim_due_runs {which:?} {q:?}"),
            table: "runs",
            sql,
            args,
            may_walk: None,
            may_sort: false,
            must: None,
        });
    }
    for (which, q) in due_queries() {
        let Some((sql, args)) = due_sql(which, &q) else {
            assert_eq!(q.workflows, Some(vec![]), "only a query for no workflow asks nothing");
            continue;
        };
        let table = if which == Due::Schedules { "schedules" } else { "trigger_buffers" };
        out.push(Case {
            name: format!("{which:?} {q:?}"),
            table,
            sql,
            args,
            may_walk: None,
            may_sort: false,
            must: None,
        });
    }
    for namespace in [None, Some("tenant")] {
        for after in [None, Some("daily")] {
            let (sql, args) = list_schedules_sql(namespace, after, 10).expect("a limit");
            // The first page of all schedules walks the keys from the first: that is the page.
            let may_walk = (namespace.is_none() && after.is_none()).then_some("sqlite_autoindex_schedules_1");
            out.push(Case {
                name: format!("list_schedules {namespace:?} after {after:?}"),
                table: "schedules",
                sql,
                args,
                may_walk,
                may_sort: false,
                must: None,
            });
        }
    }
    out.extend(task_cases());
    out
}

/// The worker claims (one queue, one in a namespace, several queues) and the task listings.
fn task_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (queues, namespace) in [(vec!["resize"], None), (vec!["resize"], Some("tenant")), (vec!["a", "b"], None)] {
        let claim = TaskClaim {
            worker: "w".into(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            namespace: namespace.map(str::to_string),
            capabilities: vec!["gpu".into()],
            limit: 10,
            now: T0 + 50,
        };
        let (sql, args) = claim_tasks_sql(&claim).expect("a claim with queues");
        // One queue is walked in claim order; several are merged by a sort of their entries.
        let may_sort = queues.len() > 1;
        out.push(Case {
            name: format!("claim_tasks {claim:?}"),
            table: "tasks",
            sql,
            args,
            may_walk: None,
            may_sort,
            must: None,
        });
    }
    let run = Some(RunId::from("r"));
    let filters = [
        // (filter, the index it may walk whole, whether it sorts what it found: the tasks of one
        // run, or those past a time, by age)
        (TaskFilter { run_id: run.clone(), ..TaskFilter::default() }, None, true),
        (TaskFilter { run_id: run.clone(), unfinished: true, ..TaskFilter::default() }, None, true),
        (TaskFilter { expired_at: Some(T0), ..TaskFilter::default() }, None, true),
        (TaskFilter { expired_at: Some(T0), queued: true, ..TaskFilter::default() }, None, true),
        (TaskFilter { silent_since: Some(T0), ..TaskFilter::default() }, None, true),
        (TaskFilter { unfinished: true, ..TaskFilter::default() }, Some("tasks_unfinished"), false),
        (TaskFilter { queued: true, ..TaskFilter::default() }, Some("tasks_unfinished"), false),
        (TaskFilter::default(), Some("tasks_created"), false),
    ];
    for (filter, may_walk, may_sort) in filters {
        let (sql, args) = list_tasks_sql(&TaskFilter { limit: 10, ..filter.clone() });
        out.push(Case {
            name: format!("list_tasks {filter:?}"),
            table: "tasks",
            sql,
            args,
            may_walk,
            may_sort,
            must: None,
        });
    }
    out
}

/// The lines of the statement's `EXPLAIN QUERY PLAN` (the `detail` column).
fn plan(conn: &Connection, sql: &str, args: &[Value]) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| r.get::<_, String>(3))?;
    rows.collect()
}

/// What is wrong with the plans of `cases` on `conn`, one line per problem.
fn violations(conn: &Connection, cases: &[Case]) -> Vec<String> {
    let mut out = Vec::new();
    for case in cases {
        let lines = match plan(conn, &case.sql, &case.args) {
            Ok(lines) => lines,
            Err(e) => {
                out.push(format!("{}: cannot be planned: {e}\n  {}", case.name, case.sql));
                continue;
            }
        };
        let mut bad =
            |why: &str| out.push(format!("{}: {why}\n  {}\n  plan: {}", case.name, case.sql, lines.join(" | ")));
        let table = case.table;
        for line in &lines {
            // `SCAN t` is the whole table; `SCAN t USING [COVERING] INDEX i` the whole of index i:
            // allowed only where that is what the query wants. (`SCAN t ` with the space, so
            // `SCAN runs` does not match `SCAN run_tags`.)
            if TABLES.iter().any(|t| line == &format!("SCAN {t}") || line.starts_with(&format!("SCAN {t} "))) {
                let allowed = case.may_walk.is_some_and(|i| {
                    line == &format!("SCAN {table} USING INDEX {i}")
                        || line == &format!("SCAN {table} USING COVERING INDEX {i}")
                });
                if !allowed {
                    bad(&format!("walks more than it returns ({line})"));
                }
            }
            if line.contains("TEMP B-TREE") && !case.may_sort {
                bad(&format!("sorts what it found ({line})"));
            }
        }
        let reads: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("SEARCH {table} ")) || l.starts_with(&format!("SCAN {table} USING")))
            .collect();
        if reads.is_empty() {
            bad(&format!("reads no index of {table}"));
        }
        if let Some(must) = case.must
            && let Some(read) = reads.iter().find(|l| !l.starts_with(must))
        {
            bad(&format!("reads {table} otherwise than by `{must}…` ({read})"));
        }
    }
    out
}

/// A database file with the store's schema (created by the store, through its migrations),
/// on a connection that plans as the store's do: with the query planner stability guarantee
/// (a plan never depends on the values bound).
fn database() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plans.db");
    drop(common::open(&path));
    let conn = Connection::open(&path).unwrap();
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).unwrap();
    (dir, conn)
}

#[test]
fn every_list_filter_poller_and_due_scan_is_served_by_an_index() {
    let (_dir, conn) = database();
    let cases = cases();
    assert_eq!(cases.len(), 4 * 128 + 1 + 4 * 4 + 2 * 4 + 2 * 4 + 4 + 3 + 8);
    let found = violations(&conn, &cases);
    assert!(found.is_empty(), "{} plans read more than they return:\n{}", found.len(), found.join("\n"));

    // The check has teeth: without any one of the indexes, some plan breaks.
    for index in PLAN_INDEXES {
        conn.execute_batch(&format!("SAVEPOINT without; DROP INDEX {index};")).unwrap();
        let found = violations(&conn, &cases);
        conn.execute_batch("ROLLBACK TO without; RELEASE without;").unwrap();
        assert!(!found.is_empty(), "no plan needs index {index}");
    }
    assert!(violations(&conn, &cases).is_empty(), "the indexes are back");
}

/// How many temporary tables the statement's program opens (`OpenEphemeral` in its `EXPLAIN`).
fn temporary_tables(conn: &Connection, sql: &str) -> usize {
    let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
    // Its program does not depend on the values: NULLs stand in for them.
    let nulls = vec![Value::Null; stmt.parameter_count()];
    let ops = stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(1)).unwrap();
    ops.map(Result::unwrap).filter(|op| op == "OpenEphemeral").count()
}

/// The writes every step makes (a run's status and `wake_at` change, which SQLite checks against
/// every partial index of `runs`; a task's state), a worker's claim of one queue and the due scan
/// fill no temporary table: a list of more than two constants (`IN ('a', 'b', 'c')`) in a
/// partial index or a statement makes SQLite build one on every execution.
#[test]
fn hot_writes_claims_and_the_due_scan_fill_no_temporary_table() {
    let (_dir, conn) = database();
    // The count sees what it looks for.
    assert_eq!(temporary_tables(&conn, "SELECT 1 FROM runs WHERE status IN ('a', 'b', 'c')"), 1);
    let mut statements = vec![
        "UPDATE runs SET status = ?1, wake_at = ?2, updated_at = ?3 WHERE id = ?4".to_string(),
        "UPDATE tasks SET state = ?1, lease_until = ?2, deadline = ?3, seen_at = ?4 WHERE run_id = ?5 AND seq = ?6"
            .to_string(),
    ];
    for namespace in [None, Some("tenant".to_string())] {
        let claim = TaskClaim {
            worker: "w".into(),
            queues: vec!["resize".into()],
            namespace,
            capabilities: vec!["gpu".into()],
            limit: 10,
            now: T0,
        };
        statements.push(claim_tasks_sql(&claim).expect("a claim with a queue").0);
    }
    let due = RunQuery { now: T0, limit: 10, namespace: None, workflows: None, leave_queued_since: None };
    statements.push(poll_sql(Poll::Due, &due).expect("a due scan").0);
    for sql in statements {
        assert_eq!(temporary_tables(&conn, &sql), 0, "{sql}");
    }
}

/// The admission indexes: each must serve one of the admission statements.
const ADMISSION_INDEXES: &[&str] =
    &["admission_slots_run", "admission_waiters_rank", "admission_waiters_key", "admission_waiters_run"];

/// What is wrong with the plans of the admission statements on `conn`, one line per problem:
/// each must search its table by the index and terms it names (the queue's head, the waiters
/// ranked before a request, a key's round: a step into `admission_waiters_rank` or
/// `admission_waiters_key`, never a walk of a gate's queue), never walk a table or index whole,
/// and never sort.
fn admission_violations(conn: &Connection) -> Vec<String> {
    let mut out = Vec::new();
    for (name, table, sql, args, by) in admission_sql() {
        let lines = match plan(conn, sql, &args) {
            Ok(lines) => lines,
            Err(e) => {
                out.push(format!("{name}: cannot be planned: {e}\n  {sql}"));
                continue;
            }
        };
        let mut bad = |why: &str| out.push(format!("{name}: {why}\n  {sql}\n  plan: {}", lines.join(" | ")));
        for line in &lines {
            if line.starts_with("SCAN ") && line.contains("admission_") {
                bad(&format!("walks a whole table or index ({line})"));
            }
            if line.contains("TEMP B-TREE") {
                bad(&format!("sorts what it found ({line})"));
            }
        }
        if !lines.iter().any(|l| l.starts_with(&format!("SEARCH {table} ")) && l.contains(by)) {
            bad(&format!("does not search {table} by {by}"));
        }
    }
    out
}

#[test]
fn every_admission_lookup_is_served_by_an_index() {
    let (_dir, conn) = database();
    let found = admission_violations(&conn);
    assert!(found.is_empty(), "{} admission plans read more than they need:\n{}", found.len(), found.join("\n"));
    for index in ADMISSION_INDEXES {
        conn.execute_batch(&format!("SAVEPOINT without; DROP INDEX {index};")).unwrap();
        let found = admission_violations(&conn);
        conn.execute_batch("ROLLBACK TO without; RELEASE without;").unwrap();
        assert!(!found.is_empty(), "no admission plan needs index {index}");
    }
    assert!(admission_violations(&conn).is_empty(), "the indexes are back");
}

/// Run `i` of the data set the listing test reads: ids and creation times in order, so the
/// listing order is known.
fn run(i: usize) -> NewRun {
    NewRun {
        trace_context: None,
        admission: None,
        id: RunId::from(format!("run-{i:04}")),
        workflow: format!("wf-{}", i % 3),
        version: 1,
        namespace: if i % 4 == 1 { "tenant".into() } else { "default".into() },
        input: Payload::from_trusted(i.to_string()),
        tags: match i % 5 {
            0 => vec!["vip".into()],
            1 => vec!["vip".into(), "blue".into()],
            _ => vec![],
        },
        priority: 0,
        parent: i.is_multiple_of(2).then(|| ParentLink { run_id: RunId::from("parent"), seq: i as u32 }),
        // Two runs per millisecond: the id breaks the ties.
        created_at: T0 + (i / 2) as u64,
        // Every third run is a delayed start (those left pending are due runs, not pending ones).
        start_at: i.is_multiple_of(3).then_some(T0 + 20 + i as u64),
    }
}

/// Sets run `i`'s status through the store's own writes.
async fn settle(store: &dyn Store, i: usize) {
    use durable_core::{Claim, Commit, RunPatch, TurnEnd};
    let id = RunId::from(format!("run-{i:04}"));
    let now = T0 + 1_000;
    let claim = || Claim { run_id: id.clone(), owner: "me".into(), lease_until: now + 60_000, now };
    let end = |status| {
        let mut c = Commit::new(id.clone(), "me", now);
        c.end = Some(TurnEnd::Settle { status, output: None, error: None });
        c
    };
    match i % 7 {
        0 => {}
        1 => drop(store.claim_run(claim()).await.unwrap()),
        2 => {
            store.claim_run(claim()).await.unwrap();
            let mut c = Commit::new(id.clone(), "me", now);
            c.end = Some(TurnEnd::Suspend { wake_at: Some(now + 5), seen_wake_gen: 0 });
            store.commit(c).await.unwrap();
        }
        3 => {
            store.claim_run(claim()).await.unwrap();
            store.commit(end(RunStatus::Failed)).await.unwrap();
        }
        4 => {
            let patch = RunPatch { status: Some(RunStatus::Dead), now, ..RunPatch::default() };
            assert!(store.update_run_if(&id, &[RunStatus::Pending], patch).await.unwrap());
        }
        _ => {
            store.claim_run(claim()).await.unwrap();
            store.commit(end(RunStatus::Completed)).await.unwrap();
        }
    }
}

#[test]
fn every_filter_combination_lists_what_the_memory_store_lists() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(common::open(&dir.path().join("lists.db")));
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    common::block_on(async {
        for store in [&sqlite, &memory] {
            for i in 0..60 {
                store.create_run(run(i)).await.unwrap();
                settle(&**store, i).await;
            }
        }
        let cursor = encode_cursor(&sqlite.get_run(&RunId::from("run-0041")).await.unwrap().unwrap());
        let mut nonempty = 0;
        for f in filters(&cursor) {
            // Every page, following the cursors to the end.
            let (mut a, mut b) = (f.clone(), f.clone());
            let mut listed = 0;
            loop {
                let (pa, pb) = (sqlite.list_runs(&a).await.unwrap(), memory.list_runs(&b).await.unwrap());
                assert_eq!(pa, pb, "{a:?}");
                listed += pa.runs.len();
                match (pa.next_cursor, pb.next_cursor) {
                    (Some(ca), Some(cb)) => (a.cursor, b.cursor) = (Some(ca), Some(cb)),
                    _ => break,
                }
            }
            nonempty += usize::from(listed > 0);
        }
        assert!(nonempty > 200, "most combinations list something ({nonempty})");
    });
}

/// The schedule `i` of the data set the due-scan test reads: due at spread times (every fifth
/// one paused: never due), in two namespaces and three workflows.
fn schedule(i: usize) -> ScheduleRecord {
    let workflow = format!("wf-{}", i % 3);
    let namespace = if i % 4 == 1 { "tenant" } else { "default" };
    let every = Schedule::every(std::time::Duration::from_secs(60));
    let mut r = ScheduleRecord::new(&format!("sched-{i:03}"), namespace, &workflow, Payload::null(), every, T0)
        .expect("a valid schedule");
    // Several share a due time: the key breaks the ties.
    r.due_at = (!i.is_multiple_of(5)).then_some(T0 + (i as u64 % 7) * 10);
    r
}

/// The event `i` of the data set: it feeds the buffer of one of three workflows and two keys.
fn event(i: usize) -> Publish {
    let workflow = format!("wf-{}", i % 3);
    let gather = if i.is_multiple_of(2) {
        Gather::Debounce { quiet_ms: 5 + i as u64 }
    } else {
        Gather::Batch { max_items: 4, max_wait_ms: 30 }
    };
    let append = BufferAppend {
        workflow: workflow.clone(),
        key: format!("k{}", i % 2),
        gather,
        batch_id: format!("batch-{i:03}"),
        run: NewRun { workflow, namespace: if i % 4 == 1 { "tenant" } else { "default" }.into(), ..run(1) },
    };
    Publish { gather: vec![append], ..Publish::event("e", Payload::from_trusted(i.to_string()), T0 + i as u64) }
}

#[test]
fn every_poller_and_due_scan_answers_what_the_memory_store_answers() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(common::open(&dir.path().join("scans.db")));
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    common::block_on(async {
        for store in [&sqlite, &memory] {
            for i in 0..60 {
                store.create_run(run(i)).await.unwrap();
                settle(&**store, i).await;
            }
            let saves = (0..40).map(|i| SaveSchedule { record: schedule(i), expected: None, start: vec![] }).collect();
            store.save_schedules(saves).await.unwrap();
            for i in 0..30 {
                store.publish(event(i)).await.unwrap();
            }
        }
        let mut nonempty = 0;
        for now in [T0, T0 + 25, T0 + 45, T0 + 1_000, T0 + 100_000] {
            for (which, q) in poll_queries() {
                let q = RunQuery { now, ..q };
                let (a, b) = match which {
                    Poll::Pending => (sqlite.pending_runs(&q).await, memory.pending_runs(&q).await),
                    Poll::Due => (sqlite.due_runs(&q).await, memory.due_runs(&q).await),
                    Poll::Orphaned => (sqlite.orphaned_runs(&q).await, memory.orphaned_runs(&q).await),
                };
                let a = a.unwrap();
                assert_eq!(a, b.unwrap(), "{which:?} {q:?}");
                nonempty += usize::from(!a.is_empty());
            }
            for (which, q) in due_queries() {
                let q = DueQuery { now, limit: 7, ..q };
                let n = match which {
                    Due::Schedules => {
                        let a = sqlite.due_schedules(&q).await.unwrap();
                        assert_eq!(a, memory.due_schedules(&q).await.unwrap(), "{which:?} {q:?}");
                        a.len()
                    }
                    Due::Buffers => {
                        let a = sqlite.due_buffers(&q).await.unwrap();
                        assert_eq!(a, memory.due_buffers(&q).await.unwrap(), "{which:?} {q:?}");
                        a.len()
                    }
                };
                nonempty += usize::from(n > 0);
            }
        }
        assert!(nonempty > 60, "most scans find something ({nonempty})");
        for namespace in [None, Some("tenant")] {
            for after in [None, Some("sched-007")] {
                let a = sqlite.list_schedules(namespace, after, 9).await.unwrap();
                assert_eq!(a, memory.list_schedules(namespace, after, 9).await.unwrap(), "{namespace:?} {after:?}");
                assert!(!a.is_empty());
            }
        }
    });
}
