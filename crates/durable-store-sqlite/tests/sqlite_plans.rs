//! The query plans of the statements the store builds: every `list_runs` filter and combination
//! of filters, and the three poller scans, are served by an index on the runs (SQLite's
//! `EXPLAIN QUERY PLAN`: a `SEARCH`, never a `SCAN` of the table or a walk of an index that the
//! query does not narrow, and no sort of the rows found), so they cost what they return, not
//! the number of runs. And the answers of every combination are the memory store's.

mod common;

use std::sync::Arc;

use durable_core::{NewRun, ParentLink, Payload, RunFilter, RunId, RunQuery, RunStatus, Store, encode_cursor};
use durable_store_memory::MemoryStore;
use durable_store_sqlite::__private::{Poll, Value, list_runs_sql, poll_sql};
use rusqlite::Connection;

/// The indexes the plans below rest on: dropping any one of them must break a plan.
const PLAN_INDEXES: &[&str] = &[
    "runs_created",
    "runs_status_created",
    "runs_workflow_created",
    "runs_namespace_created",
    "runs_parent_created",
    "run_tags_created",
    "runs_pending",
    "runs_due",
    "runs_orphaned",
];

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
/// two of them.
fn poll_queries() -> Vec<(Poll, RunQuery)> {
    let mut out = Vec::new();
    for which in [Poll::Pending, Poll::Due, Poll::Orphaned] {
        for namespace in [None, Some("tenant".to_string())] {
            for workflows in [None, Some(vec![]), Some(vec![("wf-1".to_string(), 1), ("wf-2".to_string(), 3)])] {
                out.push((which, RunQuery { namespace: namespace.clone(), workflows, now: T0 + 50, limit: 10 }));
            }
        }
    }
    out
}

/// One statement to plan, and what its plan may do besides searching an index.
struct Case {
    name: String,
    sql: String,
    args: Vec<Value>,
    /// The one index it may walk whole (`SCAN runs USING INDEX …`): a partial index that holds
    /// exactly the rows wanted, or the newest-first index for an unfiltered listing.
    may_walk: Option<&'static str>,
    /// Whether it may sort what it found (the orphan scan sorts the orphans by age).
    may_sort: bool,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for f in filters(&format!("{}:run-0020", T0 + 20)) {
        let (sql, args) = list_runs_sql(&f).expect("a valid filter");
        let unfiltered = f == RunFilter { limit: f.limit, ..RunFilter::default() };
        out.push(Case {
            name: format!("list_runs {f:?}"),
            sql,
            args,
            may_walk: unfiltered.then_some("runs_created"),
            may_sort: false,
        });
    }
    for (which, q) in poll_queries() {
        let Some((sql, args)) = poll_sql(which, &q) else {
            assert_eq!(q.workflows, Some(vec![]), "only a query for no workflow asks nothing");
            continue;
        };
        out.push(Case {
            name: format!("{which:?} {q:?}"),
            sql,
            args,
            may_walk: (which == Poll::Pending).then_some("runs_pending"),
            may_sort: which == Poll::Orphaned,
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
        for line in &lines {
            let walked = |table: &str| line.starts_with(&format!("SCAN {table}"));
            if walked("runs") || walked("run_tags") {
                // `SCAN runs` is the whole table; `SCAN runs USING [COVERING] INDEX i` the whole of
                // index i: allowed only where that is what the query wants.
                let allowed = case.may_walk.is_some_and(|i| {
                    line == &format!("SCAN runs USING INDEX {i}")
                        || line == &format!("SCAN runs USING COVERING INDEX {i}")
                });
                if !allowed {
                    bad(&format!("walks more than it returns ({line})"));
                }
            }
            if line.contains("TEMP B-TREE") && !case.may_sort {
                bad(&format!("sorts what it found ({line})"));
            }
        }
        if !lines.iter().any(|l| l.starts_with("SEARCH runs") || l.starts_with("SCAN runs USING")) {
            bad("reads no index of the runs");
        }
    }
    out
}

/// A database file with the store's schema (created by the store, through its migrations).
fn database() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plans.db");
    drop(common::open(&path));
    let conn = Connection::open(&path).unwrap();
    (dir, conn)
}

#[test]
fn every_list_filter_and_poller_scan_is_served_by_an_index() {
    let (_dir, conn) = database();
    let cases = cases();
    assert_eq!(cases.len(), 4 * 128 + 3 * 4);
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

/// Run `i` of the data set the listing test reads: ids and creation times in order, so the
/// listing order is known.
fn run(i: usize) -> NewRun {
    NewRun {
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
        start_at: None,
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
