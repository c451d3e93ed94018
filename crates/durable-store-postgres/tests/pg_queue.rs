//! The run queue (`durable_core::RunQueue`) on PostgreSQL: the contract (one unclaimed item per
//! run, namespaces and priorities from the run row, each item to exactly one claimer, ack and
//! release by owner, expired claims), round trips, the `LISTEN/NOTIFY` wake-ups (also across a
//! terminated listener connection), migrating a version-1 schema, and `create_if_missing(false)`.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{ScratchSchema, T0, new_run, url_or_skip};
use durable_core::{NewRun, QueueReason, QueuedRun, RunId, RunQueue, Store};
use durable_store_postgres::{Error, PostgresStore};

fn item(run: &str, reason: QueueReason, priority: i32) -> QueuedRun {
    QueuedRun {
        id: 0,
        run_id: RunId::from(run),
        reason,
        namespace: None,
        priority,
        dedupe_key: format!("{reason}:{run}:0"),
    }
}

fn run_in(id: &str, namespace: &str, priority: i32) -> NewRun {
    NewRun { namespace: namespace.into(), priority, ..new_run(id) }
}

fn ids(items: &[QueuedRun]) -> Vec<&str> {
    items.iter().map(|i| i.run_id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_keeps_the_run_queue_contract() {
    let Some(url) = url_or_skip("the_queue_keeps_the_run_queue_contract") else { return };
    let scratch = ScratchSchema::new(&url, "queue").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(run_in("a", "default", 0)).await.unwrap();
    store.create_run(run_in("b", "billing", 7)).await.unwrap();
    store.create_run(run_in("c", "default", 0)).await.unwrap();

    // One unclaimed item per run: a wake replaces a start (in one batch and across batches);
    // unknown runs are dropped; namespace and priority come from the run row.
    store
        .enqueue(
            vec![item("a", QueueReason::Start, 0), item("zz", QueueReason::Start, 0), item("b", QueueReason::Start, 0)],
            T0,
        )
        .await
        .unwrap();
    store.enqueue(vec![item("a", QueueReason::Wake, 2), item("c", QueueReason::Start, 0)], T0 + 1).await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 3);

    // Of one namespace only.
    let billing = store.claim_queued(Some("billing"), "w1", 10, T0 + 60_000, T0 + 2).await.unwrap();
    assert_eq!(ids(&billing), ["b"]);
    assert_eq!(billing[0].namespace.as_deref(), Some("billing"));
    assert_eq!(billing[0].priority, 7, "the run's priority");
    // Highest priority first, then oldest; the merged item of `a` is a wake with its key.
    let rest = store.claim_queued(None, "w2", 10, T0 + 60_000, T0 + 2).await.unwrap();
    assert_eq!(ids(&rest), ["a", "c"]);
    assert_eq!((rest[0].reason, rest[0].priority), (QueueReason::Wake, 2));
    assert_eq!(rest[0].dedupe_key, "wake:a:0");
    assert_eq!(rest[0].namespace.as_deref(), Some("default"));
    assert!(store.claim_queued(None, "w3", 10, T0 + 60_000, T0 + 3).await.unwrap().is_empty(), "all claimed");

    // A claimed item leaves the one-per-run rule: a new start of `a` queues next to it.
    store.enqueue(vec![item("a", QueueReason::Start, 0)], T0 + 4).await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 4);

    // Ack and release act only on the owner's items.
    store.ack_queued(&[billing[0].id], "w2").await.unwrap();
    store.release_queued(&[rest[1].id], "w1").await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 4, "not the owner: nothing happened");
    store.ack_queued(&[billing[0].id], "w1").await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 3);
    // Released `a` (a wake) merges into the unclaimed start of `a`: one item, a wake.
    store.release_queued(&[rest[0].id, rest[1].id], "w2").await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 2);
    let again = store.claim_queued(None, "w3", 10, T0 + 60_000, T0 + 5).await.unwrap();
    assert_eq!(ids(&again), ["a", "c"]);
    assert_eq!(again[0].reason, QueueReason::Wake);

    // An expired claim is handed out again; its old owner can no longer ack it.
    let expired = store.claim_queued(None, "w4", 10, T0 + 60_000, T0 + 60_001).await.unwrap();
    assert_eq!(ids(&expired), ["a", "c"]);
    store.ack_queued(&[again[0].id, again[1].id], "w3").await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 2);
    store.ack_queued(&[expired[0].id, expired[1].id], "w4").await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_get_each_item_once_and_batches_cost_one_round_trip() {
    let Some(url) = url_or_skip("concurrent_claimers_get_each_item_once_and_batches_cost_one_round_trip") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "claimers").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let other = scratch.connect().await.unwrap(); // a second engine: its own pool and writer
    const N: usize = 500;
    let mut tasks = Vec::new();
    for i in 0..N {
        let store = store.clone();
        tasks.push(tokio::spawn(async move { store.create_run(new_run(&format!("r{i:03}"))).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }

    let before = store.stats();
    let batch: Vec<QueuedRun> = (0..N).map(|i| item(&format!("r{i:03}"), QueueReason::Start, 0)).collect();
    store.enqueue(batch, T0).await.unwrap();
    let after = store.stats();
    assert_eq!(after.round_trips() - before.round_trips(), 1, "a batch of 500 is one write");
    assert_eq!(store.queued_len().await.unwrap(), N as u64);

    // Eight claimers on two stores race for the items, 7 at a time.
    let mut claimers = Vec::new();
    for c in 0..8 {
        let store = if c % 2 == 0 { store.clone() } else { other.clone() };
        claimers.push(tokio::spawn(async move {
            let owner = format!("claimer-{c}");
            let mut mine = Vec::new();
            loop {
                let before = store.stats().claims;
                let got = store.claim_queued(None, &owner, 7, T0 + 60_000, T0 + 1).await.unwrap();
                assert!(store.stats().claims > before);
                if got.is_empty() {
                    return mine;
                }
                assert!(got.len() <= 7);
                let ids: Vec<u64> = got.iter().map(|i| i.id).collect();
                store.ack_queued(&ids, &owner).await.unwrap();
                mine.extend(got.into_iter().map(|i| i.run_id));
            }
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let distinct: BTreeSet<&RunId> = all.iter().collect();
    assert_eq!(all.len(), N, "every item handed out exactly once");
    assert_eq!(distinct.len(), N);
    assert_eq!(store.queued_len().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_nudge_queue_wakeups_also_after_the_listener_was_terminated() {
    let Some(url) = url_or_skip("enqueues_nudge_queue_wakeups_also_after_the_listener_was_terminated") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "wakeups").await.unwrap();
    let options = scratch.options().notify_channel("durable_test");
    let consumer = PostgresStore::connect_with(&url, options.clone()).await.unwrap();
    let producer = PostgresStore::connect_with(&url, options).await.unwrap();
    let nudges = consumer.queue_wakeups().await.unwrap();
    assert!(Arc::ptr_eq(&nudges, &consumer.queue_wakeups().await.unwrap()), "one listener per store");

    producer.create_run(new_run("r1")).await.unwrap();
    producer.enqueue(vec![item("r1", QueueReason::Start, 0)], T0).await.unwrap();
    nudges.notified().await; // the NOTIFY of another store's enqueue

    // The listener's connection is terminated (with every other connection of this test): it
    // reconnects and nudges once, since notifications may have been missed meanwhile…
    assert!(scratch.terminate_backends().await.unwrap() >= 1);
    nudges.notified().await;
    // …and enqueues reach it again (the producer's pool reconnects too).
    producer.create_run(new_run("r2")).await.ok();
    let mut queued = false;
    for _ in 0..20 {
        if producer.enqueue(vec![item("r2", QueueReason::Start, 0)], T0).await.is_ok() {
            queued = true;
            break;
        }
    }
    assert!(queued, "the producer's pool reconnected");
    tokio::time::timeout(Duration::from_secs(30), nudges.notified()).await.expect("a nudge after reconnecting");

    // Without a channel there is nothing to listen to.
    let plain = scratch.connect().await.unwrap();
    assert!(matches!(plain.queue_wakeups().await, Err(Error::InvalidOptions { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_migrated_and_create_if_missing_false_creates_nothing() {
    let Some(url) = url_or_skip("a_version_1_schema_is_migrated_and_create_if_missing_false_creates_nothing") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "v1").await.unwrap();
    // Not created when told not to.
    let e = PostgresStore::connect_with(&url, scratch.options().create_if_missing(false)).await.unwrap_err();
    assert!(matches!(e, Error::SchemaNotFound { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(!msg.contains('\n') && msg.contains(scratch.name()), "{msg}");
    let admin = scratch.client().await.unwrap();
    let exists: bool = admin
        .query_one("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", &[&scratch.name()])
        .await
        .unwrap()
        .get(0);
    assert!(!exists, "no schema was created");

    // A schema as version 1 left it (a run in it): versions 2 to 11 are applied on connect
    // (versions 3 and 4 only replace `commit`, and version 6 `create_run` and `apply`, so the
    // functions left in place are what re-running them writes anyway).
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("old")).await.unwrap();
    drop(store);
    common::undo_version_15(&admin, scratch.name()).await;
    common::undo_version_14(&admin, scratch.name()).await;
    common::undo_version_13(&admin, scratch.name()).await;
    common::undo_version_12(&admin, scratch.name()).await;
    common::undo_version_11(&admin, scratch.name()).await;
    common::undo_version_9(&admin, scratch.name()).await;
    common::undo_version_8(&admin, scratch.name()).await;
    common::undo_version_7(&admin, scratch.name()).await;
    common::undo_version_6(&admin, scratch.name()).await;
    common::undo_version_5(&admin, scratch.name()).await;
    let s = format!("\"{}\"", scratch.name());
    admin
        .batch_execute(&format!(
            "DROP TABLE {s}.run_queue; DROP FUNCTION {s}.enqueue(jsonb); DROP FUNCTION {s}.ack_queued(jsonb);
             DROP FUNCTION {s}.release_queued(jsonb); DROP FUNCTION {s}.notify_queue(text);
             DROP FUNCTION {s}.lock_queue();
             DELETE FROM {s}.schema_version WHERE version >= 2"
        ))
        .await
        .unwrap();
    let store = PostgresStore::connect_with(&url, scratch.options().create_if_missing(false)).await.unwrap();
    assert!(store.get_run(&RunId::from("old")).await.unwrap().is_some(), "the run survived the migration");
    store.enqueue(vec![item("old", QueueReason::Start, 0)], T0).await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 1);
}

/// The waiting item of `run` as the server holds it: `(row version, reason, priority, dedupe key)`.
async fn waiting_item(
    admin: &durable_store_postgres::deadpool_postgres::tokio_postgres::Client,
    scratch: &ScratchSchema,
    run: &str,
) -> (String, String, i32, String) {
    let row = admin
        .query_one(
            &format!(
                "SELECT xmin::text || ctid::text, reason, priority, dedupe_key FROM \"{}\".run_queue
                  WHERE run_id = $1 AND claimed_by IS NULL",
                scratch.name()
            ),
            &[&run],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_the_waiting_item_already_covers_writes_nothing() {
    let Some(url) = url_or_skip("an_enqueue_the_waiting_item_already_covers_writes_nothing") else { return };
    let scratch = ScratchSchema::new(&url, "queue_noop").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let admin = scratch.client().await.unwrap();
    store.create_run(new_run("a")).await.unwrap();
    store.create_run(new_run("b")).await.unwrap();
    store.enqueue(vec![item("a", QueueReason::Start, 0)], T0).await.unwrap();
    let first = waiting_item(&admin, &scratch, "a").await;

    // A start again (a poller that found the run pending), at no higher priority: the waiting
    // item is left as it was, not even rewritten (same row version).
    store.enqueue(vec![item("a", QueueReason::Start, 0), item("b", QueueReason::Start, 0)], T0 + 1).await.unwrap();
    assert_eq!(waiting_item(&admin, &scratch, "a").await, first, "a start merged into a start rewrote the item");
    assert_eq!(store.queued_len().await.unwrap(), 2, "b was queued beside it");

    // What does change the item still does: a higher priority, then a wake replacing the start.
    store.enqueue(vec![item("a", QueueReason::Start, 3)], T0 + 2).await.unwrap();
    let raised = waiting_item(&admin, &scratch, "a").await;
    assert_ne!(raised.0, first.0);
    assert_eq!((raised.1.as_str(), raised.2), ("start", 3));
    store.enqueue(vec![item("a", QueueReason::Wake, 0)], T0 + 3).await.unwrap();
    let woken = waiting_item(&admin, &scratch, "a").await;
    assert_ne!(woken.0, raised.0);
    assert_eq!((woken.1.as_str(), woken.2, woken.3.as_str()), ("wake", 3, "wake:a:0"));

    // The same wake again, and a start after it: covered, nothing written.
    store.enqueue(vec![item("a", QueueReason::Wake, 1)], T0 + 4).await.unwrap();
    store.enqueue(vec![item("a", QueueReason::Start, 0)], T0 + 5).await.unwrap();
    assert_eq!(waiting_item(&admin, &scratch, "a").await, woken);
    // A wake whose dedupe key names a claim replaces the key (as before).
    let claim =
        QueuedRun { dedupe_key: QueuedRun::claim_key(T0 + 60_000, "wake:a:1"), ..item("a", QueueReason::Wake, 0) };
    store.enqueue(vec![claim.clone()], T0 + 6).await.unwrap();
    assert_eq!(waiting_item(&admin, &scratch, "a").await.3, claim.dedupe_key);

    // A run whose only item is claimed gets a waiting item beside it (its claimer may be gone).
    let claimed = store.claim_queued(None, "w1", 10, T0 + 60_000, T0 + 7).await.unwrap();
    assert_eq!(claimed.len(), 2);
    store.enqueue(vec![item("a", QueueReason::Start, 0)], T0 + 8).await.unwrap();
    assert_eq!(store.queued_len().await.unwrap(), 3);
    assert_eq!(waiting_item(&admin, &scratch, "a").await.1, "start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_finds_its_runs_by_key_not_by_a_scan_of_the_runs() {
    let Some(url) = url_or_skip("an_enqueue_finds_its_runs_by_key_not_by_a_scan_of_the_runs") else { return };
    let scratch = ScratchSchema::new(&url, "queue_probe").await.unwrap();
    let store = scratch.connect().await.unwrap();
    for id in ["a", "b", "c"] {
        store.create_run(new_run(id)).await.unwrap();
    }
    // A new schema has no statistics (as with autovacuum off): a join may be planned as a scan
    // of every run row, dead versions included, on each enqueue.
    let admin = scratch.client().await.unwrap();
    let s = format!("\"{}\"", scratch.name());
    let scans = || {
        let (admin, s) = (&admin, &s);
        async move {
            let row = admin
                .query_one(&format!("SELECT seq_scan FROM pg_stat_user_tables WHERE relid = '{s}.runs'::regclass"), &[])
                .await
                .unwrap();
            row.get::<_, i64>(0)
        }
    };
    let before = scans().await;
    let items = r#"{"items": [{"run_id": "b", "reason": "start", "namespace": null, "priority": 0,
                                "dedupe_key": "start:b:0"},
                               {"run_id": "zz", "reason": "start", "namespace": null, "priority": 0,
                                "dedupe_key": "start:zz:0"}], "now": 1}"#;
    admin.query_one(&format!("SELECT {s}.enqueue($1::text::jsonb)"), &[&items]).await.unwrap();
    // This session's counters reach the shared statistics once it is idle after this request.
    admin.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    assert_eq!(scans().await, before, "the enqueue scanned the runs table");
    // And it queued what it should: b (a known run), not zz.
    let queued = store.claim_queued(None, "w", 10, T0 + 60_000, T0).await.unwrap();
    assert_eq!(ids(&queued), ["b"]);
}
