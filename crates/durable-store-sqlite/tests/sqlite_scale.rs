//! How long the reads of a large store take: `list_runs` filters and the three poller scans on
//! a file of 1,000,000 runs, populated through the store's own write path.
//!
//! Ignored by default (it writes about 3,000,000 times and leaves nothing behind):
//!
//! ```text
//! cargo test --release -p durable-store-sqlite --test sqlite_scale -- --ignored --nocapture
//! ```
//!
//! `DURABLE_SCALE_RUNS` sets another number of runs. It prints one line per query (the median of
//! several first pages) and checks that each page holds what the data says it must.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_core::{
    Claim, ClaimOutcome, Commit, NewRun, ParentLink, Payload, RunFilter, RunId, RunPatch, RunQuery, RunStatus, Store,
    TurnEnd,
};
use durable_store_sqlite::SqliteStore;

const T0: u64 = 1_700_000_000_000;

fn id(i: usize) -> String {
    format!("run-{i:07}")
}

/// Run `i`: ten workflows round robin; one run in a thousand in another namespace, one tagged
/// `vip`, one a child of run 0; one in ten thousand `dead` and one left `pending`; the rest
/// `completed` (claimed, then settled).
fn new_run(i: usize) -> NewRun {
    NewRun {
        trace_context: None,
        admission: None,
        id: RunId::from(id(i)),
        workflow: format!("wf-{}", i % 10),
        version: 1,
        namespace: if i % 1_000 == 7 { "tenant-b".into() } else { "default".into() },
        input: Payload::from_trusted(format!("{{\"order\":{i}}}")),
        tags: if i % 1_000 == 3 { vec!["vip".into()] } else { vec![] },
        priority: 0,
        parent: (i % 1_000 == 5).then(|| ParentLink { run_id: RunId::from(id(0)), seq: i as u32 }),
        created_at: T0 + i as u64,
        start_at: None,
    }
}

#[derive(Clone, Copy)]
enum Fate {
    Dead,
    Pending,
    Completed,
}

fn fate(i: usize) -> Fate {
    match i % 10_000 {
        9 => Fate::Dead,
        19 => Fate::Pending,
        _ => Fate::Completed,
    }
}

async fn populate_one(store: &SqliteStore, i: usize) {
    store.create_run(new_run(i)).await.expect("create");
    let run_id = RunId::from(id(i));
    let now = T0 + i as u64;
    match fate(i) {
        Fate::Pending => {}
        Fate::Dead => {
            let patch = RunPatch { status: Some(RunStatus::Dead), now, ..RunPatch::default() };
            assert!(store.update_run_if(&run_id, &[RunStatus::Pending], patch).await.expect("bury"));
        }
        Fate::Completed => {
            let claim = Claim { run_id: run_id.clone(), owner: "scale".into(), lease_until: now + 60_000, now };
            assert!(matches!(store.claim_run(claim).await.expect("claim"), ClaimOutcome::Acquired { .. }));
            let mut c = Commit::new(run_id, "scale", now);
            c.end = Some(TurnEnd::Settle {
                status: RunStatus::Completed,
                output: Some(Payload::from_trusted("true")),
                error: None,
            });
            store.commit(c).await.expect("settle");
        }
    }
}

/// The median time of `reps` calls of `f`, and what the last one returned.
async fn time<T, F, Fut>(reps: usize, mut f: F) -> (Duration, T)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut times = Vec::with_capacity(reps);
    let mut last = None;
    for _ in 0..reps {
        let t = Instant::now();
        last = Some(f().await);
        times.push(t.elapsed());
    }
    times.sort();
    (times[reps / 2], last.expect("reps > 0"))
}

fn report(name: &str, d: Duration, got: usize) {
    println!("{name:<48} {:>9.3} ms  {got:>4} runs", d.as_secs_f64() * 1e3);
}

#[test]
#[ignore = "populates 1,000,000 runs; run with --ignored --nocapture (see the file's docs)"]
fn list_filters_and_poller_scans_at_a_million_runs() {
    let n: usize = std::env::var("DURABLE_SCALE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scale.db");
    let store = Arc::new(common::open(&path));
    let rt = common::rt();
    rt.block_on(async {
        let began = Instant::now();
        const WAVE: usize = 2_000;
        for wave in (0..n).step_by(WAVE) {
            let tasks: Vec<_> = (wave..(wave + WAVE).min(n))
                .map(|i| {
                    let store = store.clone();
                    tokio::spawn(async move { populate_one(&store, i).await })
                })
                .collect();
            for t in tasks {
                t.await.expect("populate task");
            }
        }
        let took = began.elapsed();
        println!(
            "populated {n} runs in {:.1} s ({:.0} runs/s, 3 writes per completed run)",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64()
        );
        let wal = std::fs::metadata(format!("{}-wal", path.display())).map(|m| m.len()).unwrap_or(0);
        let db = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!("file {:.0} MB, WAL {:.0} MB", db as f64 / 1e6, wal as f64 / 1e6);

        let s: &dyn Store = &*store;
        let rare = |i: usize| i % 10_000 == 9;
        let list = |filter: RunFilter| async move { s.list_runs(&filter).await.expect("list").runs };
        let f = |f: RunFilter| RunFilter { limit: 100, ..f };
        let reps = 7;

        let (d, page) =
            time(reps, || list(f(RunFilter { statuses: vec![RunStatus::Dead], ..RunFilter::default() }))).await;
        report("status dead (rare), first page", d, page.len());
        let expected: Vec<String> = (0..n).rev().filter(|i| rare(*i)).take(100).map(id).collect();
        assert_eq!(page.iter().map(|r| r.id.to_string()).collect::<Vec<_>>(), expected);

        let (d, page) = time(reps, || {
            list(f(RunFilter { statuses: vec![RunStatus::Dead, RunStatus::Failed], ..RunFilter::default() }))
        })
        .await;
        report("statuses dead+failed", d, page.len());
        assert_eq!(page.len(), expected.len());

        let (d, page) = time(reps, || {
            list(f(RunFilter {
                statuses: vec![RunStatus::Pending],
                workflow: Some("wf-9".into()),
                ..RunFilter::default()
            }))
        })
        .await;
        report("status pending + workflow wf-9", d, page.len());
        assert_eq!(page.len(), (0..n).filter(|i| i % 10_000 == 19 && i % 10 == 9).count().min(100));

        let (d, page) = time(reps, || list(f(RunFilter { tag: Some("vip".into()), ..RunFilter::default() }))).await;
        report("tag vip", d, page.len());
        assert_eq!(page.len(), (0..n).filter(|i| i % 1_000 == 3).count().min(100));

        let (d, page) =
            time(reps, || list(f(RunFilter { parent: Some(RunId::from(id(0))), ..RunFilter::default() }))).await;
        report("parent run-0000000", d, page.len());
        assert_eq!(page.len(), (0..n).filter(|i| i % 1_000 == 5).count().min(100));

        let (d, page) =
            time(reps, || list(f(RunFilter { namespace: Some("tenant-b".into()), ..RunFilter::default() }))).await;
        report("namespace tenant-b", d, page.len());
        assert_eq!(page.len(), (0..n).filter(|i| i % 1_000 == 7).count().min(100));

        let (d, page) = time(reps, || {
            list(f(RunFilter {
                statuses: vec![RunStatus::Completed],
                workflow: Some("wf-3".into()),
                ..RunFilter::default()
            }))
        })
        .await;
        report("status completed + workflow wf-3", d, page.len());
        assert_eq!(page.len(), 100.min(n / 10));

        let (d, page) = time(reps, || {
            list(f(RunFilter {
                workflow: Some("wf-9".into()),
                statuses: RunStatus::ACTIVE.to_vec(),
                namespace: Some("default".into()),
                created_before: Some(T0 + n as u64),
                ..RunFilter::default()
            }))
        })
        .await;
        report("engine timeout scan (workflow, active, before)", d, page.len());
        assert_eq!(page.len(), (0..n).filter(|i| i % 10_000 == 19 && i % 10 == 9 && i % 1_000 != 7).count().min(100));

        let (d, page) = time(reps, || list(f(RunFilter::default()))).await;
        report("no filter", d, page.len());
        assert_eq!(page.len(), 100.min(n));

        let q = RunQuery {
            namespace: Some("default".into()),
            workflows: Some((0..10).map(|w| (format!("wf-{w}"), 1)).collect()),
            now: T0 + n as u64,
            limit: 100,
            leave_queued_since: None,
        };
        let (d, ids) = time(reps, || async { s.pending_runs(&q).await.expect("pending") }).await;
        report("pending_runs", d, ids.len());
        assert_eq!(ids.len(), (0..n).filter(|i| i % 10_000 == 19 && i % 1_000 != 7).count().min(100));
        let (d, ids) = time(reps, || async { s.due_runs(&q).await.expect("due") }).await;
        report("due_runs", d, ids.len());
        assert!(ids.is_empty());
        let (d, ids) = time(reps, || async { s.orphaned_runs(&q).await.expect("orphaned") }).await;
        report("orphaned_runs", d, ids.len());
        assert!(ids.is_empty());
    });
}

/// Inserts `n` runs straight into the file in one statement (no store write path: the point is
/// the reads): four workflows (`order` 40%, `invoice` 30%, `shipment` 20%, `refund` 10%) over 16
/// namespaces, created one millisecond apart; every run suspended except one in 25,000
/// `completed` (all of them `order` runs, spread over the whole file) and one in 100,000
/// `failed`.
fn bulk_insert(path: &std::path::Path, n: usize) {
    let conn = rusqlite::Connection::open(path).expect("open the file");
    conn.execute_batch("PRAGMA synchronous = OFF; PRAGMA cache_size = -262144;").expect("pragmas");
    conn.execute(
        "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < ?1)
         INSERT INTO runs (id, workflow, version, namespace, status, input, tags, priority, created_at, updated_at,
                           wake_at)
         SELECT printf('run-%07d', i),
                CASE WHEN i % 10 < 4 THEN 'order' WHEN i % 10 < 7 THEN 'invoice'
                     WHEN i % 10 < 9 THEN 'shipment' ELSE 'refund' END,
                1, 'tenant-' || (i % 16),
                CASE WHEN i % 25000 = 0 THEN 'completed' WHEN i % 100000 = 1 THEN 'failed' ELSE 'suspended' END,
                '{\"order\":' || i || '}', '[]', 0, ?2 + i, ?2 + i,
                CASE WHEN i % 25000 = 0 OR i % 100000 = 1 THEN NULL ELSE ?2 + i + 2592000000 END
         FROM g",
        rusqlite::params![n as i64, T0 as i64],
    )
    .expect("bulk insert");
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").expect("checkpoint");
}

#[test]
#[ignore = "bulk-inserts 1,000,000 runs (about 300 MB); run with --ignored --nocapture"]
fn a_rare_status_of_a_workflow_and_the_run_counts_at_a_million_runs() {
    let n: usize = std::env::var("DURABLE_SCALE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bulk.db");
    drop(common::open(&path));
    let began = Instant::now();
    bulk_insert(&path, n);
    let db = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("inserted {n} runs in {:.1} s, file {:.0} MB", began.elapsed().as_secs_f64(), db as f64 / 1e6);
    let store = common::open(&path);
    common::rt().block_on(async {
        let s: &dyn Store = &store;
        let completed = (0..n).filter(|i| i % 25_000 == 0).count();
        let failed_orders = (0..n).filter(|i| i % 100_000 == 1 && i % 10 < 4).count();
        let reps = 9;
        let list = |filter: RunFilter| async move { s.list_runs(&filter).await.expect("list").runs };
        let cases = [
            ("workflow order + status completed", vec![RunStatus::Completed], completed),
            ("workflow order + status failed", vec![RunStatus::Failed], failed_orders),
            (
                "workflow order + completed|failed",
                vec![RunStatus::Completed, RunStatus::Failed],
                completed + failed_orders,
            ),
            ("workflow order + status suspended", vec![RunStatus::Suspended], 100),
        ];
        for (name, statuses, expected) in cases {
            let filter = RunFilter { workflow: Some("order".into()), statuses, limit: 100, ..RunFilter::default() };
            let t = Instant::now();
            let page = list(filter.clone()).await;
            let cold = t.elapsed();
            let (d, _) = time(reps, || list(filter.clone())).await;
            println!(
                "{name:<48} cold {:>9.3} ms  warm {:>9.3} ms  {:>4} runs",
                cold.as_secs_f64() * 1e3,
                d.as_secs_f64() * 1e3,
                page.len()
            );
            assert_eq!(page.len(), expected.min(100), "{name}");
            assert!(page.iter().all(|r| r.workflow == "order" && filter.statuses.contains(&r.status)), "{name}");
            assert!(page.windows(2).all(|w| (w[0].created_at, &w[0].id) > (w[1].created_at, &w[1].id)), "{name}");
        }
        let t = Instant::now();
        let counts = s.run_counts().await.expect("run_counts");
        let cold = t.elapsed();
        let (d, _) = time(reps, || async { s.run_counts().await.expect("run_counts") }).await;
        println!(
            "{:<48} cold {:>9.3} ms  warm {:>9.3} ms  {:>4} rows",
            "run_counts",
            cold.as_secs_f64() * 1e3,
            d.as_secs_f64() * 1e3,
            counts.len()
        );
        assert_eq!(counts.iter().map(|c| c.count).sum::<u64>(), n as u64);
        let order_completed = counts.iter().find(|c| c.workflow == "order" && c.status == RunStatus::Completed);
        assert_eq!(order_completed.map(|c| c.count), Some(completed as u64));
    });
}
