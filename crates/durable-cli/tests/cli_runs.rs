//! The operator commands on real database files: `runs show` (timeline, attempts, errors,
//! children), `runs retry` (the run completes when a worker picks it up), `runs cancel`,
//! `runs delete`, `signal`, `runs list` filters.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use durable::{Engine, RunId, RunStatus, SqliteStore, StartOptions, StepError, WorkflowCtx, WorkflowError};
use support::{default_db, list_runs, path_str, run, run_bad, run_ok, show, summary_count, with_client};

/// An engine on the database file, as a worker process of the user's would build it.
fn worker(db: &std::path::Path) -> Engine {
    Engine::builder().store(SqliteStore::open(db).expect("open the database")).build().expect("build an engine")
}

fn checkpoint<'a>(history: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    history.as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} in {history}"))
}

#[test]
fn show_prints_the_timeline_with_attempts_errors_and_children() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "5", "--db", dbs]);

    // The order's payment step failed twice and was retried.
    let order = show(dir.path(), &db, "demo-order-0");
    assert_eq!(order["run"]["status"], "completed");
    assert_eq!(checkpoint(&order["history"], "charge_card")["attempts"], 3);
    let text = run_ok(dir.path(), &["runs", "show", "demo-order-0", "--db", dbs]).stdout;
    let line = text.lines().find(|l| l.contains("charge_card")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(line.split_whitespace().collect::<Vec<_>>()[..5], ["1", "charge_card", "step", "completed", "3"]);
    // It completed: the error its last failed attempt left is said to be an earlier attempt's.
    assert!(!checkpoint(&order["history"], "charge_card")["error"].is_null(), "{order}");
    assert!(line.contains("(an earlier attempt failed: payment gateway timed out (attempt 2))"), "{line}");

    // The saga's last step failed on every attempt: its attempts and its error are shown, then
    // the undos that ran.
    let saga = show(dir.path(), &db, "demo-saga-3");
    assert_eq!(saga["run"]["status"], "failed");
    let confirm = checkpoint(&saga["history"], "confirm_trip");
    assert_eq!(confirm["status"], "failed");
    assert_eq!(confirm["attempts"], 3);
    assert!(confirm["error"]["message"].as_str().unwrap().contains("the supplier rejected the itinerary (attempt 3)"));
    let text = run_ok(dir.path(), &["runs", "show", "demo-saga-3", "--db", dbs]).stdout;
    let line = text.lines().find(|l| l.contains("confirm_trip")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("failed") && line.contains(" 3 "), "{line}");
    assert!(line.contains("the supplier rejected the itinerary (attempt 3)"), "{line}");
    for undo in ["undo:book_car", "undo:book_hotel", "undo:book_flight"] {
        assert!(
            text.lines().any(|l| l.contains(undo) && l.contains("compensation") && l.contains("completed")),
            "{text}"
        );
    }
    assert!(text.lines().any(|l| l.starts_with("error") && l.contains("confirm_trip")), "{text}");

    // The fan-out's children.
    let fan_out = show(dir.path(), &db, "demo-fanout-4");
    let children: Vec<&str> =
        fan_out["children"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(children, ["demo-fanout-4.child.1", "demo-fanout-4.child.2", "demo-fanout-4.child.3"]);
    let text = run_ok(dir.path(), &["runs", "show", "demo-fanout-4", "--db", dbs]).stdout;
    assert!(text.contains("children (3)"), "{text}");

    // List filters.
    let failed = run_ok(dir.path(), &["runs", "list", "--status", "failed", "--db", dbs]).stdout;
    assert_eq!(failed.lines().count(), 2, "a header and the saga: {failed}");
    assert!(failed.lines().nth(1).unwrap().starts_with("demo-saga-3 "), "{failed}");
    let items = run_ok(dir.path(), &["runs", "list", "--workflow", "demo_fanout_item", "--json", "--db", dbs]).stdout;
    assert_eq!(items.lines().count(), 3, "{items}");
    let two = run_ok(dir.path(), &["runs", "list", "--limit", "2", "--json", "--db", dbs]).stdout;
    assert_eq!(two.lines().count(), 2, "{two}");
    let none = run_ok(dir.path(), &["runs", "list", "--namespace", "elsewhere", "--db", dbs]).stdout;
    assert_eq!(none.trim(), "no runs match");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_run_completes_when_a_worker_picks_it_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db).to_string();

    // A workflow whose second step fails while an outside system is down.
    let up = Arc::new(AtomicBool::new(false));
    let prepared = Arc::new(AtomicU32::new(0));
    let register = |engine: &Engine| {
        let (up, prepared) = (up.clone(), prepared.clone());
        engine.register("import", 1, move |ctx: WorkflowCtx, _: ()| {
            let (up, prepared) = (up.clone(), prepared.clone());
            async move {
                ctx.step("prepare", move |_| {
                    let prepared = prepared.clone();
                    async move {
                        prepared.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                })
                .await?;
                let rows: u32 = ctx
                    .step("fetch", move |_| {
                        let up = up.clone();
                        async move {
                            if up.load(Ordering::SeqCst) { Ok(42) } else { Err(StepError::fatal("the source is down")) }
                        }
                    })
                    .await?;
                Ok::<_, WorkflowError>(rows)
            }
        });
    };
    let engine = worker(&db);
    register(&engine);
    let id = RunId::from("import-1");
    engine.start("import", &(), StartOptions::id("import-1")).await.unwrap();
    assert_eq!(engine.wait_for_run(&id).await.unwrap().status(), RunStatus::Failed);
    engine.shutdown().await;
    drop(engine);

    // The operator retries it: it is pending, nothing executes it (no worker is running).
    let out = run_ok(dir.path(), &["runs", "retry", "import-1", "--db", &dbs]).stdout;
    assert!(out.contains("pending") && out.contains("\"fetch\"") && out.contains("import@1"), "{out}");
    let pending = run_ok(dir.path(), &["runs", "list", "--status", "pending", "--json", "--db", &dbs]).stdout;
    assert!(pending.contains("\"import-1\""), "{pending}");
    let shown = show(dir.path(), &db, "import-1");
    assert_eq!(shown["run"]["status"], "pending");
    assert!(shown["run"]["lease_owner"].is_null(), "the command left no lease behind: {shown}");
    // Retrying a pending run is refused.
    run_bad(dir.path(), &["runs", "retry", "import-1", "--db", &dbs], "only failed or dead runs can be retried");

    // The outside system is back; a worker with the workflow picks the run up and completes it.
    up.store(true, Ordering::SeqCst);
    let engine = worker(&db);
    register(&engine);
    let outcome = tokio::time::timeout(Duration::from_secs(60), engine.wait_for_run(&id)).await.unwrap().unwrap();
    assert_eq!(outcome.output::<u32>().unwrap(), 42);
    assert_eq!(prepared.load(Ordering::SeqCst), 1, "the completed step before the failed one was kept");
    engine.shutdown().await;
    let shown = show(dir.path(), &db, "import-1");
    assert_eq!(shown["run"]["status"], "completed");
    assert_eq!(checkpoint(&shown["history"], "fetch")["status"], "completed");
}

#[test]
fn retrying_a_compensated_demo_saga_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "4", "--db", dbs]);
    let before = show(dir.path(), &db, "demo-saga-3");
    assert_eq!(before["run"]["status"], "failed");
    // Its undos ran: a retry would replay bookings that were cancelled.
    run_bad(dir.path(), &["runs", "retry", "demo-saga-3", "--db", dbs], "ran its undos");
    assert_eq!(show(dir.path(), &db, "demo-saga-3"), before);
    // A later demo finds nothing to resume.
    let ran = run_ok(dir.path(), &["demo", "--runs", "4", "--db", dbs]);
    assert_eq!(summary_count(&ran.stdout, "resumed"), 0, "{}", ran.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_signal_and_delete_act_on_parked_runs() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db).to_string();
    let register = |engine: &Engine| {
        engine.register("approve", 1, |ctx: WorkflowCtx, token: String| async move {
            ctx.step("ask", |_| async { Ok(()) }).await?;
            let answer: serde_json::Value = ctx.wait_for_signal(&token).await?;
            Ok::<_, WorkflowError>(answer)
        });
        engine.register("approve_within", 1, |ctx: WorkflowCtx, token: String| async move {
            let answer: Option<serde_json::Value> =
                ctx.wait_for_signal_timeout(&token, Duration::from_secs(3 * 86_400)).await?;
            Ok::<_, WorkflowError>(answer)
        });
    };
    let engine = worker(&db);
    register(&engine);
    for (workflow, id, token) in [
        ("approve", "to-cancel", "tok-cancel"),
        ("approve", "to-signal", "tok-signal"),
        ("approve_within", "timed", "tok-timed"),
    ] {
        let run = engine.start(workflow, token, StartOptions::id(id)).await.unwrap();
        assert_eq!(engine.wait_until_suspended_or_terminal(&run.id).await.unwrap().status(), RunStatus::Suspended);
    }
    engine.shutdown().await;
    drop(engine);

    // A suspended run shows what it waits for.
    let listed = run_ok(dir.path(), &["runs", "list", "--status", "suspended", "--db", &dbs]).stdout;
    let line = listed.lines().find(|l| l.starts_with("to-cancel ")).unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains("signal tok-cancel"), "{line}");
    let shown = run_ok(dir.path(), &["runs", "show", "to-cancel", "--db", &dbs]).stdout;
    assert!(shown.contains("waiters (1)") && shown.contains("signal tok-cancel"), "{shown}");
    // The wait is still going: its duration is how long so far, not a finished one's.
    let wait = shown.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap_or_else(|| panic!("{shown}"));
    assert!(wait.contains("waiting") && wait.contains(" so far"), "{wait}");

    // Cancel: the suspended run is cancelled; cancelling again changes nothing.
    let out = run_ok(dir.path(), &["runs", "cancel", "to-cancel", "--db", &dbs]).stdout;
    assert!(out.contains("is cancelled"), "{out}");
    let shown = show(dir.path(), &db, "to-cancel");
    assert_eq!(shown["run"]["status"], "cancelled");
    assert_eq!(shown["run"]["error"]["code"], "cancelled");
    let out = run_ok(dir.path(), &["runs", "cancel", "to-cancel", "--db", &dbs]).stdout;
    assert!(out.contains("already cancelled"), "{out}");
    // The wait the cancelled run left stays `waiting`, with no duration (not one that grows).
    let text = run_ok(dir.path(), &["runs", "show", "to-cancel", "--db", &dbs]).stdout;
    let wait = text.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap_or_else(|| panic!("{text}"));
    assert!(wait.contains("waiting") && !wait.contains("so far"), "{wait}");

    // Signal: delivered to the waiting run, which completes on a worker with the payload.
    let out = run_ok(dir.path(), &["signal", "tok-signal", r#"{"approved": true, "by": "ops"}"#, "--db", &dbs]).stdout;
    assert!(out.contains("delivered to run to-signal (seq 1)"), "{out}");
    let out = run_ok(dir.path(), &["signal", "tok-nobody", "\"hello\"", "--db", &dbs]).stdout;
    assert!(out.contains("buffered"), "{out}");
    // A wait with a timeout: the timeout is folded into the wait; once the signal is in, the
    // run waits for a worker, not for the timeout.
    let waiting = |id: &str| {
        let shown = run_ok(dir.path(), &["runs", "show", id, "--db", &dbs]).stdout;
        let line = shown.lines().find(|l| l.starts_with("waiting on")).unwrap_or_else(|| panic!("{shown}"));
        line.trim_start_matches("waiting on").trim().to_string()
    };
    let before = waiting("timed");
    assert!(before.starts_with("signal tok-timed (times out in 2 d"), "{before}");
    run_ok(dir.path(), &["signal", "tok-timed", "true", "--db", &dbs]);
    let after = waiting("timed");
    assert!(after.starts_with("a worker to run it (due ") && !after.contains("timeout"), "{after}");
    assert_eq!(waiting("to-signal").split(" (due ").next(), Some("a worker to run it"));
    let engine = worker(&db);
    register(&engine);
    let outcome = tokio::time::timeout(Duration::from_secs(60), engine.wait_for_run(&RunId::from("to-signal")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome.output::<serde_json::Value>().unwrap(), serde_json::json!({"approved": true, "by": "ops"}));
    let timed = tokio::time::timeout(Duration::from_secs(60), engine.wait_for_run(&RunId::from("timed")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(timed.output::<Option<bool>>().unwrap(), Some(true));
    // One more, parked, for delete.
    let parked = engine.start("approve", "tok-parked", StartOptions::id("parked")).await.unwrap();
    assert_eq!(engine.wait_until_suspended_or_terminal(&parked.id).await.unwrap().status(), RunStatus::Suspended);
    engine.shutdown().await;
    drop(engine);

    // Delete: an active run only with --force; a finished one at once; then it is gone.
    run_bad(dir.path(), &["runs", "delete", "parked", "--db", &dbs], "cancel it first");
    let out = run_ok(dir.path(), &["runs", "delete", "parked", "--force", "--db", &dbs]).stdout;
    assert!(out.contains("deleted run parked"), "{out}");
    let out = run_ok(dir.path(), &["runs", "delete", "to-signal", "--db", &dbs]).stdout;
    assert!(out.contains("deleted run to-signal"), "{out}");
    run_ok(dir.path(), &["runs", "delete", "timed", "--db", &dbs]);
    run_bad(dir.path(), &["runs", "show", "to-signal", "--db", &dbs], "run to-signal not found");
    let left: Vec<String> = list_runs(dir.path(), &db).iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(left, ["to-cancel"]);
    // A run with children goes with its subtree.
    let ran = run(dir.path(), &["demo", "--runs", "5", "--db", &dbs]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let out = run_ok(dir.path(), &["runs", "delete", "demo-fanout-4", "--db", &dbs]).stdout;
    assert!(out.contains("and 3 descendant runs"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_continued_as_new_names_its_successor_in_show_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db).to_string();
    let engine = worker(&db);
    engine.register("again", 1, |ctx: WorkflowCtx, n: u32| async move {
        if n == 0 {
            return ctx.continue_as_new(&1u32).await;
        }
        let _: bool = ctx.wait_for_signal("tok-again").await?;
        Ok::<_, WorkflowError>(n)
    });
    let run = engine.start("again", &0u32, StartOptions::id("can")).await.unwrap();
    let next = RunId::from("can~1");
    engine.wait_for_run(&run.id).await.unwrap();
    assert_eq!(engine.wait_until_suspended_or_terminal(&next).await.unwrap().status(), RunStatus::Suspended);
    engine.shutdown().await;
    drop(engine);

    let shown = run_ok(dir.path(), &["runs", "show", "can", "--db", &dbs]).stdout;
    let line = shown.lines().find(|l| l.starts_with("output")).unwrap_or_else(|| panic!("{shown}"));
    assert!(line.contains("continued as new as run can~1"), "{line}");
    let out = run_ok(dir.path(), &["runs", "cancel", "can", "--db", &dbs]).stdout;
    assert!(out.contains("continued as new as run can~1") && out.contains("nothing to cancel"), "{out}");
    let out = run_ok(dir.path(), &["runs", "cancel", "can~1", "--db", &dbs]).stdout;
    assert!(out.contains("is cancelled"), "{out}");
}

#[test]
fn signals_list_and_purge_the_buffered_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    // An empty database: nothing is buffered.
    with_client(&db, |_| {}, async |_| ());
    let out = run_ok(dir.path(), &["signals", "list", "--db", dbs]).stdout;
    assert_eq!(out.trim(), "nothing buffered");

    // Signals and events nobody waits for.
    for (token, payload) in [("typo-token", "\"a\""), ("approve:x", "1"), ("typo-token", "\"b\"")] {
        let out = run_ok(dir.path(), &["signal", token, payload, "--db", dbs]).stdout;
        assert!(out.starts_with("buffered"), "{out}");
    }
    with_client(
        &db,
        |_| {},
        async |engine| {
            for order in [1, 2] {
                assert_eq!(engine.publish_event("order.paid", &serde_json::json!({"order": order})).await.unwrap(), []);
            }
        },
    );
    let listed = |args: &[&str]| -> Vec<(String, String, u64)> {
        let mut argv = vec!["signals", "list", "--json", "--db", dbs];
        argv.extend_from_slice(args);
        let out = run_ok(dir.path(), &argv).stdout;
        out.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
                assert!(v["oldest_at"].as_u64().unwrap() <= v["newest_at"].as_u64().unwrap(), "{v}");
                (v["kind"].as_str().unwrap().into(), v["key"].as_str().unwrap().into(), v["count"].as_u64().unwrap())
            })
            .collect()
    };
    let entry = |kind: &str, key: &str, count| (kind.to_string(), key.to_string(), count);
    let all = [entry("signal", "approve:x", 1), entry("signal", "typo-token", 2), entry("event", "order.paid", 2)];
    assert_eq!(listed(&[]), all, "signals first, then events, each by key");
    assert_eq!(listed(&["--kind", "event"]), all[2..]);
    assert_eq!(listed(&["--prefix", "typo"]), all[1..2]);
    assert_eq!(listed(&["--older-than", "1h"]), [], "all were buffered just now");
    let table = run_ok(dir.path(), &["signals", "list", "--db", dbs]).stdout;
    let row = table
        .lines()
        .find(|l| l.starts_with("signal") && l.contains("typo-token"))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(row.split_whitespace().take(3).collect::<Vec<_>>(), ["signal", "typo-token", "2"], "{table}");
    let first = run_ok(dir.path(), &["signals", "list", "--limit", "1", "--db", dbs]).stdout;
    assert_eq!(first.lines().filter(|l| l.starts_with("signal")).count(), 1, "{first}");
    assert!(first.contains("the first 1 key: narrow with --prefix or --kind, or raise --limit"), "{first}");

    // Purge: by age first (nothing that old), then all of one token, then one event name.
    let out = run_ok(dir.path(), &["signals", "purge", "typo-token", "--older-than", "1h", "--db", dbs]).stdout;
    assert!(out.contains("nothing purged"), "{out}");
    let out = run_ok(dir.path(), &["signals", "purge", "typo-token", "--db", dbs]).stdout;
    assert_eq!(out.trim(), "purged 2 buffered signals of token \"typo-token\"");
    let out = run_ok(dir.path(), &["signals", "purge", "order.paid", "--db", dbs]).stdout;
    assert!(out.contains("nothing purged"), "a signal token, not the event name: {out}");
    let out = run_ok(dir.path(), &["signals", "purge", "order.paid", "--kind", "event", "--db", dbs]).stdout;
    assert_eq!(out.trim(), "purged 2 buffered events of name \"order.paid\"");
    assert_eq!(listed(&[]), [entry("signal", "approve:x", 1)], "the other token is kept");

    // Bad keys: refused with what is wrong, nothing purged.
    run_bad(dir.path(), &["signals", "purge", "", "--db", dbs], "empty or only whitespace");
    run_bad(dir.path(), &["signals", "purge", "   ", "--db", dbs], "empty or only whitespace");
    run_bad(dir.path(), &["signals", "purge", "approve:\u{7}x", "--db", dbs], "control character");
    run_bad(dir.path(), &["signals", "list", "--older-than", "soon", "--db", dbs], "invalid duration");
    // A negative value is a bad value of its flag, not an unknown argument.
    run_bad(dir.path(), &["signals", "list", "--older-than", "-1d", "--db", dbs], "for '--older-than <DURATION>'");
    run_bad(dir.path(), &["runs", "list", "--limit", "-5", "--db", dbs], "for '--limit <N>'");
    assert_eq!(listed(&[]), [entry("signal", "approve:x", 1)]);
}
