//! Concurrent write batches take their locks in one global order (schema version 12's
//! `lock_batch`): every advisory key first, ascending, then the rows of the runs the batch
//! delivers to, in id order. Each test drives two batches (`apply` calls, as the writer sends
//! them with `write_connections` > 1) on two connections into the interleaving that deadlocked
//! when each operation took its own locks as it ran, holding a third connection's lock as the
//! gate; PostgreSQL then broke the cycle after `deadlock_timeout` and failed one batch with
//! `deadlock detected` (40P01).

mod common;

use std::time::Duration;

use common::{ScratchSchema, T0, hold_token_lock, new_run, parked_on_a_lock, parked_on_locks, url_or_skip};
use durable_core::admission::{Limits, SlotRequest};
use durable_core::{Claim, ClaimOutcome, Commit, NewRun, RunId, RunStatus, Store, TurnEnd, WaitKind, Waiter};
use durable_store_postgres::PostgresStore;
use durable_store_postgres::deadpool_postgres::tokio_postgres::{self, Client};

/// Creates run `id` and parks it waiting for signal tokens `tokens` (seq 0, 1, …).
async fn park(store: &PostgresStore, id: &str, tokens: &[&str]) {
    store.create_run(new_run(id)).await.unwrap();
    let claim = Claim { run_id: RunId::from(id), owner: "me".into(), lease_until: T0 + 60_000, now: T0 };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    let mut c = Commit::new(RunId::from(id), "me", T0);
    for (seq, token) in tokens.iter().enumerate() {
        c.waits.push(Waiter {
            run_id: RunId::from(id),
            seq: seq as u32,
            name: format!("wait-{seq}"),
            kind: WaitKind::Signal { token: (*token).into() },
            created_at: T0,
        });
    }
    c.end = Some(TurnEnd::Suspend { wake_at: None, seen_wake_gen: 0 });
    assert!(!store.commit(c).await.unwrap().woken);
}

/// A batch of `send_signal` operations, one per token, and what they lock, as the writer sends
/// them (the store's unit tests check that `BatchLocks` names these keys and tokens).
fn signals(tokens: &[&str]) -> (String, String) {
    let ops: Vec<_> = tokens
        .iter()
        .map(|t| serde_json::json!({"op": "send_signal", "token": t, "payload": "1", "now": T0 + 1}))
        .collect();
    let keys: Vec<_> = tokens.iter().map(|t| serde_json::json!(["signal", t])).collect();
    let locks = serde_json::json!({"keys": keys, "tokens": tokens});
    (serde_json::Value::Array(ops).to_string(), locks.to_string())
}

/// Runs `ops` as one batch on `client`: `BEGIN`, `apply`, `COMMIT`.
async fn batch(client: &Client, schema: &str, (ops, locks): (String, String)) -> Result<(), tokio_postgres::Error> {
    client.batch_execute("BEGIN").await?;
    let sql = format!("SELECT r FROM \"{schema}\".apply($1::text::jsonb, NULL, $2::text::jsonb) AS r");
    let applied = client.query(&sql, &[&ops, &locks]).await;
    match applied {
        Ok(_) => client.batch_execute("COMMIT").await,
        Err(e) => {
            client.batch_execute("ROLLBACK").await?;
            Err(e)
        }
    }
}

/// Waits until the backend `pid` waits on a lock (true) or `done` says its batch ended (false),
/// for at most 60 s (a hang guard, not a timing assertion; nothing announces a lock wait, so it
/// looks at `pg_stat_activity` every 5 ms).
async fn parked_or_done(admin: &Client, pid: i32, done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if done() {
            return false;
        }
        let row = admin
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", &[&pid])
            .await
            .unwrap();
        if row.get::<_, i64>(0) > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("backend {pid} neither waited on a lock nor finished in 60 s");
}

async fn pid(client: &Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0)
}

/// Starts `ops` as one batch on a new connection of `scratch`; answers its backend pid and the
/// batch's task.
async fn start(
    scratch: &ScratchSchema,
    ops: (String, String),
) -> (i32, tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>) {
    let client = scratch.client().await.unwrap();
    let pid = pid(&client).await;
    let schema = scratch.name().to_string();
    (pid, tokio::spawn(async move { batch(&client, &schema, ops).await }))
}

/// The completed wait checkpoints of `id`, by seq.
async fn resolved(admin: &Client, schema: &str, id: &str) -> Vec<i64> {
    let sql =
        format!("SELECT seq FROM \"{schema}\".checkpoints WHERE run_id = $1 AND status = 'completed' ORDER BY seq");
    admin.query(&sql, &[&id]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// Two batches each waking the same two runs, in opposite orders (children of two parents
/// finishing in two concurrent batches). Before version 12, batch 2 woke `p2`, then waited for
/// `p3` (the gate holds its row), batch 1 woke `p1` and waited for `p2`, and once the gate let
/// go batch 2 woke `p3` and wanted `p1`: a deadlock. Now each batch locks the rows of the runs
/// it wakes in id order before its first operation: batch 2 holds `p1` and `p2` while it waits
/// for `p3`, and batch 1 waits for `p1` holding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_waking_the_same_runs_in_opposite_orders_do_not_deadlock() {
    let Some(url) = url_or_skip("batches_waking_the_same_runs_in_opposite_orders_do_not_deadlock") else { return };
    let scratch = ScratchSchema::new(&url, "lockrows").await.unwrap();
    let store = scratch.connect().await.unwrap();
    park(&store, "p1", &["p1-a", "p1-b"]).await;
    park(&store, "p2", &["p2-a", "p2-b"]).await;
    park(&store, "p3", &["p3-a"]).await;
    let gate = scratch.client().await.unwrap();
    let admin = scratch.client().await.unwrap();

    // The gate: the row of `p3`, which batch 2 wakes second.
    gate.batch_execute("BEGIN").await.unwrap();
    let lock_p3 = format!("SELECT 1 FROM \"{}\".runs WHERE id = 'p3' FOR UPDATE", scratch.name());
    assert_eq!(gate.query(&lock_p3, &[]).await.unwrap().len(), 1);
    let (pid2, second) = start(&scratch, signals(&["p2-a", "p3-a", "p1-b"])).await;
    assert!(parked_or_done(&admin, pid2, || second.is_finished()).await, "batch 2 waits for the gate's row");
    let (pid1, first) = start(&scratch, signals(&["p1-a", "p2-b"])).await;
    // Batch 1 waits for a row batch 2 holds (`p2` before version 12, `p1` with it).
    assert!(parked_or_done(&admin, pid1, || first.is_finished()).await, "batch 1 waits for batch 2");
    gate.batch_execute("COMMIT").await.unwrap();

    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(first.is_ok() && second.is_ok(), "a batch failed: {first:?} / {second:?}");
    for (run, waits) in [("p1", vec![0, 1]), ("p2", vec![0, 1]), ("p3", vec![0])] {
        assert_eq!(resolved(&admin, scratch.name(), run).await, waits, "{run}'s waits are resolved");
        let run = store.get_run(&RunId::from(run)).await.unwrap().unwrap();
        assert_eq!(run.wake_gen, waits.len() as u64, "{} is woken once per delivery", run.id);
    }
}

/// Two batches taking the same advisory keys in opposite orders (signals to tokens nobody waits
/// for yet, so they are buffered). Before version 12 each `send_signal` took its token's key as
/// it ran: batch 1 took `a` and waited for the gate's `m`, batch 2 took `b` and waited for `a`,
/// and once the gate opened batch 1 wanted `b`: a deadlock. Now each batch takes its keys
/// ascending before its first operation runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_taking_the_same_keys_in_opposite_orders_do_not_deadlock() {
    let Some(url) = url_or_skip("batches_taking_the_same_keys_in_opposite_orders_do_not_deadlock") else { return };
    let scratch = ScratchSchema::new(&url, "lockkeys").await.unwrap();
    let _store = scratch.connect().await.unwrap();
    let gate = scratch.client().await.unwrap();
    let admin = scratch.client().await.unwrap();

    hold_token_lock(&scratch, &gate, "m").await;
    let (pid1, first) = start(&scratch, signals(&["a", "m", "b"])).await;
    assert!(parked_or_done(&admin, pid1, || first.is_finished()).await, "batch 1 waits for the gate's token");
    let (pid2, second) = start(&scratch, signals(&["b", "a"])).await;
    // Batch 2 waits for a key batch 1 holds, or is done.
    parked_or_done(&admin, pid2, || second.is_finished()).await;
    gate.batch_execute("COMMIT").await.unwrap();

    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(first.is_ok() && second.is_ok(), "a batch failed: {first:?} / {second:?}");
    let sql =
        format!("SELECT token, count(*) FROM \"{}\".buffered_signals GROUP BY token ORDER BY token", scratch.name());
    let buffered: Vec<(String, i64)> =
        admin.query(&sql, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(buffered, [("a".to_string(), 2), ("b".to_string(), 2), ("m".to_string(), 1)]);
}

/// Run `id` created with a concurrency key at `gate` (limit 10: it is admitted).
fn keyed(id: &str, gate: &str) -> NewRun {
    NewRun {
        admission: Some(SlotRequest {
            gate: gate.into(),
            holder: id.into(),
            run_id: RunId::from(id),
            priority: 0,
            fairness_key: String::new(),
            limits: Limits { concurrency: Some(10), ..Limits::default() },
            lease_until: None,
            max_waiting: None,
            succeeds: None,
            now: T0,
        }),
        ..new_run(id)
    }
}

/// Two commits starting keyed children at the same gates in opposite orders (two parents
/// fanning out over the same keys), from two stores (two processes). Before version 18 a commit
/// locked each child's gate row as it created the child: with gate `m` held by a third
/// connection, commit 1 held `a` and waited for `m`, commit 2 held `b` and waited for `a`, and
/// once `m` was let go commit 1 wanted `b`: a deadlock, which PostgreSQL broke after
/// `deadlock_timeout` by failing one commit, and its store ran it again (a retry). Now a commit
/// locks its gate rows in gate order before its first child: commit 2 waits for `a` holding
/// nothing, and neither commit is run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_starting_keyed_children_in_opposite_gate_orders_do_not_deadlock() {
    let Some(url) = url_or_skip("commits_starting_keyed_children_in_opposite_gate_orders_do_not_deadlock") else {
        return;
    };
    let scratch = ScratchSchema::new(&url, "lockgates").await.unwrap();
    let one = scratch.connect().await.unwrap();
    let two = scratch.connect().await.unwrap();
    let admin = scratch.client().await.unwrap();
    let gate = scratch.client().await.unwrap();
    // The gates' rows exist (a run holds a slot at each), and two parents run.
    for g in ["a", "b", "m"] {
        one.create_run(keyed(&format!("holder-{g}"), g)).await.unwrap();
    }
    let mut commits = Vec::new();
    for (parent, gates) in [("p1", ["a", "m", "b"].as_slice()), ("p2", ["b", "a"].as_slice())] {
        one.create_run(new_run(parent)).await.unwrap();
        let claim = Claim { run_id: RunId::from(parent), owner: "me".into(), lease_until: T0 + 60_000, now: T0 };
        assert!(matches!(one.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
        let mut c = Commit::new(RunId::from(parent), "me", T0 + 1);
        c.children = gates.iter().map(|g| keyed(&format!("{parent}-{g}"), g)).collect();
        commits.push(c);
    }
    let (c2, c1) = (commits.pop().unwrap(), commits.pop().unwrap());

    gate.batch_execute("BEGIN").await.unwrap();
    let lock_m = format!("SELECT 1 FROM \"{}\".admission_gates WHERE gate = 'm' FOR UPDATE", scratch.name());
    assert_eq!(gate.query(&lock_m, &[]).await.unwrap().len(), 1);
    let first = tokio::spawn(async move { one.commit(c1).await.map(|_| one) });
    assert!(parked_on_a_lock(&scratch, &admin).await, "commit 1 waits for the gate row of m");
    let second = tokio::spawn(async move { two.commit(c2).await.map(|_| two) });
    assert!(parked_on_locks(&scratch, &admin, 2).await, "commit 2 waits for a row commit 1 holds");
    gate.batch_execute("COMMIT").await.unwrap();

    let one = first.await.unwrap().expect("commit 1");
    let two = second.await.unwrap().expect("commit 2");
    assert_eq!((one.stats().retries, two.stats().retries), (0, 0), "no commit was run again after a deadlock");
    for id in ["p1-a", "p1-m", "p1-b", "p2-b", "p2-a"] {
        let run = one.get_run(&RunId::from(id)).await.unwrap().expect("child created");
        assert_eq!(run.status, RunStatus::Pending, "{id} is admitted and ready to start");
        assert!(run.wake_at != Some(durable_core::protocol::GATED), "{id} holds its key");
    }
}

/// A batch creating keyed runs at `gates`, in that order, and what it locks (the store's unit
/// tests check that `BatchLocks` names these gates).
fn keyed_creates(gates: &[&str]) -> (String, String) {
    let ops: Vec<_> = gates
        .iter()
        .map(|g| {
            let id = format!("{}-{g}", gates.join(""));
            serde_json::json!({
                "op": "create_run",
                "run": {"id": id, "workflow": "wf", "version": 1, "namespace": "default", "input": "{}",
                        "tags": [], "priority": 0, "parent_id": null, "parent_seq": null, "created_at": T0,
                        "start_at": null, "trace_context": null},
                "admission": {"gate": g, "holder": id, "run_id": id, "priority": 0, "fairness_key": "",
                              "limits": {"concurrency": 10, "rate_limit": null, "rate_period_ms": null,
                                         "lowest_first": false, "fairness": false, "lifo": false},
                              "lease_until": null, "max_waiting": null, "now": T0},
            })
        })
        .collect();
    (serde_json::Value::Array(ops).to_string(), serde_json::json!({ "gates": gates }).to_string())
}

/// Two batches of keyed starts at the same gates in opposite orders. Before version 18 each
/// start locked its gate's row as it ran: batch 1 held `a` and waited for the gate's `m`, batch
/// 2 held `b` and waited for `a`, and once `m` was let go batch 1 wanted `b`: a deadlock. Now
/// `lock_batch` locks a batch's gate rows in gate order before its first operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_locking_the_same_gates_in_opposite_orders_do_not_deadlock() {
    let Some(url) = url_or_skip("batches_locking_the_same_gates_in_opposite_orders_do_not_deadlock") else { return };
    let scratch = ScratchSchema::new(&url, "lockbgates").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let admin = scratch.client().await.unwrap();
    let gate = scratch.client().await.unwrap();
    for g in ["a", "b", "m"] {
        store.create_run(keyed(&format!("holder-{g}"), g)).await.unwrap();
    }

    gate.batch_execute("BEGIN").await.unwrap();
    let lock_m = format!("SELECT 1 FROM \"{}\".admission_gates WHERE gate = 'm' FOR UPDATE", scratch.name());
    assert_eq!(gate.query(&lock_m, &[]).await.unwrap().len(), 1);
    let (pid1, first) = start(&scratch, keyed_creates(&["a", "m", "b"])).await;
    assert!(parked_or_done(&admin, pid1, || first.is_finished()).await, "batch 1 waits for the gate row of m");
    let (pid2, second) = start(&scratch, keyed_creates(&["b", "a"])).await;
    assert!(parked_or_done(&admin, pid2, || second.is_finished()).await, "batch 2 waits for batch 1");
    gate.batch_execute("COMMIT").await.unwrap();

    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(first.is_ok() && second.is_ok(), "a batch failed: {first:?} / {second:?}");
    for id in ["amb-a", "amb-m", "amb-b", "ba-b", "ba-a"] {
        let run = store.get_run(&RunId::from(id)).await.unwrap().expect("run created");
        assert!(run.wake_at != Some(durable_core::protocol::GATED), "{id} holds its key");
    }
}

/// A commit whose keyed children use a gate that has no row yet takes it in its place in gate
/// order too. A batch of keyed starts at `a`, `m` and a new `b` locks `a` (its `lock_batch`
/// skips the missing `b`) and waits for the gate's `m`; a commit then starting children at `a`
/// and the new `b` must wait for `a` before it creates `b`'s row: had it inserted `b` first (an
/// inserted row holds off other inserts as a lock does), the batch would wait for it at `b`
/// while it waited for the batch at `a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_takes_a_new_gate_in_its_place_in_gate_order() {
    let Some(url) = url_or_skip("a_commit_takes_a_new_gate_in_its_place_in_gate_order") else { return };
    let scratch = ScratchSchema::new(&url, "locknewgate").await.unwrap();
    let store = scratch.connect().await.unwrap();
    let admin = scratch.client().await.unwrap();
    let gate = scratch.client().await.unwrap();
    for g in ["a", "m"] {
        store.create_run(keyed(&format!("holder-{g}"), g)).await.unwrap();
    }
    store.create_run(new_run("p")).await.unwrap();
    let claim = Claim { run_id: RunId::from("p"), owner: "me".into(), lease_until: T0 + 60_000, now: T0 };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    let mut c = Commit::new(RunId::from("p"), "me", T0 + 1);
    c.children = ["b", "a"].iter().map(|g| keyed(&format!("p-{g}"), g)).collect();

    gate.batch_execute("BEGIN").await.unwrap();
    let lock_m = format!("SELECT 1 FROM \"{}\".admission_gates WHERE gate = 'm' FOR UPDATE", scratch.name());
    assert_eq!(gate.query(&lock_m, &[]).await.unwrap().len(), 1);
    let (pid, batch) = start(&scratch, keyed_creates(&["a", "m", "b"])).await;
    assert!(parked_or_done(&admin, pid, || batch.is_finished()).await, "the batch waits for the gate row of m");
    let commit = tokio::spawn(async move { store.commit(c).await.map(|_| store) });
    assert!(parked_on_a_lock(&scratch, &admin).await, "the commit waits for the row of a");
    gate.batch_execute("COMMIT").await.unwrap();

    let batch = batch.await.unwrap();
    let store = commit.await.unwrap().expect("the commit");
    assert!(batch.is_ok(), "the batch failed: {batch:?}");
    assert_eq!(store.stats().retries, 0, "the commit was not run again after a deadlock");
    for id in ["amb-b", "p-a", "p-b"] {
        assert!(store.get_run(&RunId::from(id)).await.unwrap().is_some(), "{id} created");
    }
}

/// A commit refused for its lease writes nothing, not even the rows of its keyed children's
/// new gates (which `durable queues` would list with the refused commit's limits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_creates_no_gate() {
    let Some(url) = url_or_skip("a_refused_commit_creates_no_gate") else { return };
    let scratch = ScratchSchema::new(&url, "refusedgate").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("p")).await.unwrap();
    let claim = Claim { run_id: RunId::from("p"), owner: "me".into(), lease_until: T0 + 60_000, now: T0 };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    let mut c = Commit::new(RunId::from("p"), "zombie", T0 + 1);
    c.children.push(keyed("p-new", "new"));
    let refused = store.commit(c).await.expect_err("another owner's commit is refused");
    assert_eq!(refused.kind(), durable_core::StoreErrorKind::LeaseLost, "{refused}");
    assert!(store.get_run(&RunId::from("p-new")).await.unwrap().is_none());
    let admin = scratch.client().await.unwrap();
    let sql = format!("SELECT count(*) FROM \"{}\".admission_gates", scratch.name());
    assert_eq!(admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0), 0, "no gate row was written");
}

/// A run's settle with checkpoints only (schema version 19's `settle_commit`) looks for the
/// run's waiters, slots and tasks before it takes the run's row. Another batch of the same run
/// (a commit of a call the body abandoned, sent on another write connection) may hold that row
/// and commit a waiter while the settle waits for it: the settle looks again once it holds the
/// row and fails its batch with a serialization failure, which the writer runs again; run again,
/// the settle takes the general path, which removes the waiter with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_that_waited_for_its_runs_row_looks_again() {
    let Some(url) = url_or_skip("a_settle_that_waited_for_its_runs_row_looks_again") else { return };
    let scratch = ScratchSchema::new(&url, "settlerace").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("r")).await.unwrap();
    let claim = Claim { run_id: RunId::from("r"), owner: "me".into(), lease_until: T0 + 60_000, now: T0 };
    assert!(matches!(store.claim_run(claim).await.unwrap(), ClaimOutcome::Acquired { .. }));
    let (other, admin) = (scratch.client().await.unwrap(), scratch.client().await.unwrap());
    let schema = scratch.name();

    // The other batch: a waiter of `r` written and the run's row held, not committed yet.
    other.batch_execute("BEGIN").await.unwrap();
    let wait = format!(
        "INSERT INTO \"{schema}\".waiters (run_id, seq, name, kind, key, created_at) \
         VALUES ('r', 0, 'wait-0', 'signal', 'tok', {T0})"
    );
    other.batch_execute(&wait).await.unwrap();
    let touch = format!("UPDATE \"{schema}\".runs SET updated_at = {} WHERE id = 'r'", T0 + 1);
    other.batch_execute(&touch).await.unwrap();

    let settle = serde_json::json!([{
        "op": "settle_commit", "run": "r", "owner": "me", "now": T0 + 2, "checkpoints": [], "waits": [],
        "expire": [], "state": [], "children": [], "signals": [], "tasks": [], "release_slots": [],
        "end": {"type": "settle", "status": "completed", "output": "1", "error": null,
                "allowed_from": ["running", "completed"]},
    }]);
    let locks = serde_json::json!({"probe": ["r"], "settles": ["r"]});
    let ops = (settle.to_string(), locks.to_string());
    let (pid, settling) = start(&scratch, ops.clone()).await;
    assert!(parked_or_done(&admin, pid, || settling.is_finished()).await, "the settle waits for the run's row");
    other.batch_execute("COMMIT").await.unwrap();

    let failed = settling.await.unwrap().expect_err("the settle's batch fails once it sees the waiter");
    assert_eq!(failed.code(), Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE), "{failed}");
    assert_eq!(store.get_run(&RunId::from("r")).await.unwrap().unwrap().status, RunStatus::Running);

    batch(&admin, schema, ops).await.expect("run again, the settle takes the general path");
    assert_eq!(store.get_run(&RunId::from("r")).await.unwrap().unwrap().status, RunStatus::Completed);
    assert!(store.waiters(&RunId::from("r")).await.unwrap().is_empty(), "the settle removed the waiter");
}

/// What `lock_batch` reads of `waiters` (by any scan) and of `runs` by sequential scans, for a
/// batch of signals to `tokens`, in a transaction rolled back.
async fn read_by_lock_batch(client: &Client, schema: &str, tokens: &[String]) -> (i64, i64) {
    client.batch_execute("BEGIN").await.unwrap();
    let locks = serde_json::json!({"keys": [], "tokens": tokens}).to_string();
    let sql = format!("SELECT \"{schema}\".lock_batch($1::text::jsonb)");
    client.execute(&sql, &[&locks]).await.unwrap();
    let read = |table: &str| {
        format!(
            "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0), COALESCE(seq_tup_read, 0)
               FROM pg_stat_xact_user_tables WHERE schemaname = '{schema}' AND relname = '{table}'"
        )
    };
    let waiters: i64 = client.query_one(&read("waiters"), &[]).await.unwrap().get(0);
    let runs_scanned: i64 = client.query_one(&read("runs"), &[]).await.unwrap().get(1);
    client.batch_execute("ROLLBACK").await.unwrap();
    (waiters, runs_scanned)
}

/// A batch of signals finds the runs it wakes with one index probe per token and locks their
/// rows with one per run, on a new schema (no statistics: the planner's guess for
/// `kind = 'signal'` is a handful of rows). Before version 24 a batch of 150 signals read every
/// signal waiter and scanned all of `runs`, each row compared with each token: at scale, millions
/// of rows per batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_signals_reads_only_the_waiters_and_runs_it_wakes() {
    let Some(url) = url_or_skip("a_batch_of_signals_reads_only_the_waiters_and_runs_it_wakes") else { return };
    let scratch = ScratchSchema::new(&url, "lockprobe").await.unwrap();
    let store = scratch.connect().await.unwrap();
    const PARKED: usize = 400;
    for i in 0..PARKED {
        park(&store, &format!("run-{i:03}"), &[&format!("token-{i:03}")]).await;
    }
    let client = scratch.client().await.unwrap();
    for batch in [2, 150] {
        let tokens: Vec<String> = (0..batch).map(|i| format!("token-{:03}", i * 2)).collect();
        let (waiters, runs_scanned) = read_by_lock_batch(&client, scratch.name(), &tokens).await;
        // About one waiter per token (a probe may step over a row or two), not all of them.
        assert!(waiters <= batch as i64 + 5, "{batch} signals read {waiters} of {PARKED} waiters");
        assert!(runs_scanned <= 1, "{batch} signals scanned {runs_scanned} of {PARKED} runs");
    }
}
