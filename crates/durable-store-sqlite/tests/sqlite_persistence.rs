//! What a store keeps when it is dropped and the file opened again.

mod common;

use common::{claim, create_and_claim, new_run, rt, step};
use durable_core::{
    BufferAppend, ClaimOutcome, Commit, Dedupe, Delivery, DueQuery, Gather, NewRun, Payload, Publish, Published,
    RunFilter, RunId, SaveOutcome, SaveSchedule, Schedule, ScheduleRecord, Store, TurnEnd, WaitKind, Waiter,
};
use durable_store_sqlite::{Durability, SqliteOptions, SqliteStore};
use serde_json::json;

#[test]
fn everything_survives_close_and_reopen() {
    for durability in [Durability::Full, Durability::Normal] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reopen.db");
        let opts = SqliteOptions::new().durability(durability);
        let rt = rt();
        let (runs, histories, waiters, state, schedules, buffers) = {
            let store = SqliteStore::open_with(&path, opts.clone()).unwrap();
            rt.block_on(async {
                let s: &dyn Store = &store;
                let mut tagged = new_run("tagged", 1_000);
                tagged.tags = vec!["blue".into()];
                s.create_run(tagged).await.unwrap();
                create_and_claim(s, "done", "engine", 1_000).await;
                let mut c = Commit::new(RunId::from("done"), "engine", 1_100);
                c.checkpoints.push(step("done", 0, 1_100, json!({"receipt": "ü-42"})));
                c.state.push(("progress".into(), Payload::encode(&json!(100)).unwrap()));
                c.end = Some(TurnEnd::Settle {
                    status: durable_core::RunStatus::Completed,
                    output: Some(Payload::encode(&json!("ok")).unwrap()),
                    error: None,
                });
                s.commit(c).await.unwrap();
                create_and_claim(s, "parked", "engine", 1_000).await;
                let mut c = Commit::new(RunId::from("parked"), "engine", 1_200);
                c.waits.push(Waiter {
                    run_id: RunId::from("parked"),
                    seq: 0,
                    name: "approval".into(),
                    kind: WaitKind::Signal { token: "approve".into() },
                    created_at: 1_200,
                });
                c.end = Some(TurnEnd::Suspend { wake_at: Some(9_000), seen_wake_gen: 0 });
                s.commit(c).await.unwrap();
                // A lease "forever" round-trips.
                create_and_claim(s, "held", "engine", 1_000).await;
                assert!(s.renew_lease(&RunId::from("held"), "engine", u64::MAX).await.unwrap());
                assert_eq!(
                    s.send_signal("early", Payload::encode(&json!(1)).unwrap(), 1_300).await.unwrap(),
                    Delivery::Buffered
                );
                assert_eq!(
                    s.publish_event("evt", Payload::encode(&json!({"k": 1})).unwrap(), 1_300).await.unwrap(),
                    vec![]
                );
                let runs = s.list_runs(&RunFilter::default()).await.unwrap();
                let mut histories = Vec::new();
                let mut waiters = Vec::new();
                for r in &runs.runs {
                    histories.push(s.history(&r.id).await.unwrap());
                    waiters.push(s.waiters(&r.id).await.unwrap());
                }
                let state = s.get_state(&RunId::from("done"), "progress").await.unwrap();
                // A schedule (due, and saved twice), and an open batch fed by an event with a
                // dedupe id.
                let daily = ScheduleRecord::new(
                    "daily",
                    "default",
                    "report",
                    Payload::encode(&json!({"to": "ops"})).unwrap(),
                    Schedule::cron("0 9 * * *").timezone("Europe/Paris"),
                    1_000,
                )
                .unwrap();
                let save = |record, expected| SaveSchedule { record, expected, start: vec![] };
                assert_eq!(s.save_schedule(save(daily.clone(), None)).await.unwrap(), SaveOutcome::Saved(1));
                let fired = ScheduleRecord { due_at: Some(1_500), ..daily };
                assert_eq!(s.save_schedule(save(fired, Some(1))).await.unwrap(), SaveOutcome::Saved(2));
                assert!(matches!(s.publish(order(1_400)).await.unwrap(), Published::Done { .. }));
                let schedules = s.list_schedules(None, None, 10).await.unwrap();
                let buffers = s.due_buffers(&due(u64::MAX)).await.unwrap();
                assert_eq!((schedules.len(), buffers.len()), (1, 1));
                (runs, histories, waiters, state, schedules, buffers)
            })
        };
        // Dropped: the file is closed. Open it again.
        let store = SqliteStore::open_with(&path, opts).unwrap();
        rt.block_on(async {
            let s: &dyn Store = &store;
            let again = s.list_runs(&RunFilter::default()).await.unwrap();
            assert_eq!(again, runs, "{durability:?}");
            for (i, r) in again.runs.iter().enumerate() {
                assert_eq!(s.history(&r.id).await.unwrap(), histories[i]);
                assert_eq!(s.waiters(&r.id).await.unwrap(), waiters[i]);
            }
            assert_eq!(s.get_state(&RunId::from("done"), "progress").await.unwrap(), state);
            let held = s.get_run(&RunId::from("held")).await.unwrap().unwrap();
            assert_eq!(held.lease_until, Some(u64::MAX));
            assert!(matches!(
                s.claim_run(claim("held", "other", 2_000, u64::MAX - 1)).await.unwrap(),
                ClaimOutcome::Busy(_)
            ));
            let tagged = s.list_runs(&RunFilter { tag: Some("blue".into()), ..RunFilter::default() }).await.unwrap();
            assert_eq!(tagged.runs.len(), 1);
            // The schedule, the buffer and the dedupe id are all still there and still work.
            assert_eq!(s.list_schedules(None, None, 10).await.unwrap(), schedules);
            assert_eq!(s.due_schedules(&due(1_500)).await.unwrap(), schedules);
            assert_eq!(s.due_buffers(&due(u64::MAX)).await.unwrap(), buffers);
            assert_eq!(s.publish(order(1_600)).await.unwrap(), Published::Duplicate);
            let stale = SaveSchedule { record: schedules[0].clone(), expected: Some(1), start: vec![] };
            assert_eq!(s.save_schedule(stale).await.unwrap(), SaveOutcome::Stale(Some(Box::new(schedules[0].clone()))));
            let flushed =
                s.flush_buffer("batch", "", &buffers[0].batch_id, buffers[0].due_at, None).await.unwrap().unwrap();
            assert_eq!(flushed.run().input, Payload::encode(&json!([{"order": 7}])).unwrap());
            // The waiter, the buffered signal and the buffered event still work.
            assert_eq!(
                s.send_signal("approve", Payload::encode(&json!("yes")).unwrap(), 2_000).await.unwrap(),
                Delivery::Delivered { run_id: RunId::from("parked"), seq: 0 }
            );
            create_and_claim(s, "late", "engine", 2_000).await;
            let mut c = Commit::new(RunId::from("late"), "engine", 2_100);
            c.waits.push(Waiter {
                run_id: RunId::from("late"),
                seq: 0,
                name: "early".into(),
                kind: WaitKind::Signal { token: "early".into() },
                created_at: 2_100,
            });
            c.waits.push(Waiter {
                run_id: RunId::from("late"),
                seq: 1,
                name: "evt".into(),
                kind: WaitKind::Event { name: "evt".into(), matcher: Payload::encode(&json!({"k": 1})).unwrap() },
                created_at: 2_100,
            });
            s.commit(c).await.unwrap();
            let outputs: Vec<_> =
                s.history(&RunId::from("late")).await.unwrap().into_iter().map(|cp| cp.output.unwrap()).collect();
            assert_eq!(outputs, [Payload::encode(&json!(1)).unwrap(), Payload::encode(&json!({"k": 1})).unwrap()]);
        });
    }
}

/// Every due schedule or buffer at `now`.
fn due(now: u64) -> DueQuery {
    DueQuery { namespace: None, workflows: None, now, limit: 10 }
}

/// An `order` event with dedupe id `order-7`, gathered into the open batch of workflow `batch`.
fn order(now: u64) -> Publish {
    let append = BufferAppend {
        workflow: "batch".into(),
        key: String::new(),
        gather: Gather::Batch { max_items: 10, max_wait_ms: 60_000 },
        batch_id: format!("b-{now}"),
        run: NewRun { workflow: "batch".into(), ..new_run("unused", now) },
    };
    Publish {
        dedupe: Some(Dedupe { id: "order-7".into(), keep_until: 1_000_000 }),
        gather: vec![append],
        ..Publish::event("order", Payload::encode(&json!({"order": 7})).unwrap(), now)
    }
}

#[test]
fn closing_the_store_checkpoints_and_removes_the_wal() {
    // The store's connections used to close at the same time, each seeing the others still
    // open, and then none checkpointed: the WAL was left behind about one close in fifty.
    for _ in 0..25 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("closed.db");
        let store = common::open(&path);
        common::block_on(async { store.create_run(new_run("a", 1_000)).await.unwrap() });
        drop(store);
        let wal = dir.path().join("closed.db-wal");
        assert!(!wal.exists(), "the WAL is gone after the store is dropped");
        assert!(copy_holds_run_a(&path), "a copy of the file alone holds the run");
    }
}

/// A store that only read (a `durable runs list`) does not checkpoint on close: that is for
/// the stores that wrote, and while another connection holds the write lock the checkpoint
/// would wait for it, up to a second, for nothing.
#[test]
fn a_store_that_only_read_leaves_the_wal_to_the_stores_that_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("read.db");
    let writer = common::open(&path);
    write_runs(&writer, 0, 50);
    let len = wal_len(&path);
    assert!(len > 0, "the writer's commits are in the WAL");
    let reader = common::open(&path);
    common::block_on(async { reader.get_run(&RunId::from("big-0000")).await.unwrap().expect("the run") });
    drop(reader);
    assert_eq!(wal_len(&path), len, "the reader's close left the WAL as it was");
    drop(writer);
    assert_eq!(wal_len(&path), 0, "the writer's close checkpointed it");
    reads_back(&path, 50);
}

/// Whether a copy of the file alone (no WAL beside it) holds run `a`.
fn copy_holds_run_a(path: &std::path::Path) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    std::fs::copy(path, &copy).unwrap();
    let store = common::open(&copy);
    common::block_on(async { store.get_run(&RunId::from("a")).await.unwrap().is_some() })
}

/// The size of the file's `-wal` (0 when there is none).
fn wal_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(format!("{}-wal", path.display())).map_or(0, |m| m.len())
}

/// Writes `n` runs of 8 KiB each: a few megabytes of WAL.
fn write_runs(store: &SqliteStore, from: usize, n: usize) {
    common::block_on(async {
        for i in from..from + n {
            let mut run = new_run(&format!("big-{i:04}"), 1_000 + i as u64);
            run.input = Payload::encode(&json!({ "i": i, "pad": "x".repeat(8_192) })).unwrap();
            store.create_run(run).await.unwrap();
        }
    });
}

/// Reopens the file and checks that it holds the `n` runs `write_runs` wrote, each intact.
fn reads_back(path: &std::path::Path, n: usize) {
    let store = common::open(path);
    common::block_on(async {
        let page = store.list_runs(&RunFilter { limit: n + 1, ..RunFilter::default() }).await.unwrap();
        assert_eq!(page.runs.len(), n);
        for (i, run) in page.runs.iter().rev().enumerate() {
            assert_eq!(run.id.as_str(), format!("big-{i:04}"));
            assert_eq!(run.input, Payload::encode(&json!({ "i": i, "pad": "x".repeat(8_192) })).unwrap());
        }
    });
}

#[test]
fn closing_the_store_truncates_the_wal_while_another_connection_keeps_the_file_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let store = common::open(&path);
    // Another connection on the file, idle (another process, a tool): the store's connections
    // are then never the last to close, and SQLite's own checkpoint on the last close does
    // not happen.
    let other = rusqlite::Connection::open(&path).unwrap();
    let _: i64 = other.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
    write_runs(&store, 0, 500);
    assert!(wal_len(&path) > 1_000_000, "the WAL grew ({} bytes)", wal_len(&path));
    drop(store);
    assert_eq!(wal_len(&path), 0, "the closed store truncated the WAL");
    drop(other);
    reads_back(&path, 500);
}

#[test]
fn closing_the_store_waits_for_a_reader_of_the_wal_only_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.db");
    let busy = std::time::Duration::from_secs(30);
    let store = SqliteStore::open_with(&path, common::fast().busy_timeout(busy)).unwrap();
    write_runs(&store, 0, 300);
    // A reader in the middle of a read transaction on what the WAL holds: a truncating
    // checkpoint must wait for it to end, which it does not do before the store is closed.
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let seen: i64 = reader.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
    assert_eq!(seen, 300);
    write_runs(&store, 300, 100);
    let began = std::time::Instant::now();
    drop(store);
    let took = began.elapsed();
    assert!(took < busy / 3, "closing waited {took:?}, not the busy timeout of {busy:?}");
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    reads_back(&path, 400);
}
