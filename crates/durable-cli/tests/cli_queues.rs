//! Flow control as the operator sees it, on a real database file: `durable queues`, and what a
//! run holds and waits for in `runs show` and `runs list`.
//!
//! The runs are started the way the user's code starts them (an engine with a workflow that is
//! a singleton per customer); what the steps of the runs ask of the queue `crm-api` is then
//! written with the store's own call (`acquire_slot`), some of it back-dated, so a step can
//! have waited 5 minutes without the test waiting for it.
//!
//! A store that declares no admission records (`Capabilities::admission`) keeps none to show:
//! the tests that need them print one skip line and pass on such a store, and check the
//! one-line error `durable queues` gives instead.

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable::admission::{Admission, Limits, Rate, SlotRequest};
use durable::store::Store;
use durable::{
    Engine, Millis, RunId, SqliteStore, StartOptions, WorkflowCtx, WorkflowError, WorkflowOptions, protocol,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use support::{default_db, path_str, run_bad, run_ok, show, with_client};

const MINUTE: Millis = 60_000;

fn now() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as Millis
}

#[derive(Debug, Serialize, Deserialize)]
struct Sync {
    customer: String,
}

/// `sync`: a singleton per customer whose one step goes through the queue `crm-api`.
fn register(engine: &Engine) {
    let options = WorkflowOptions::default().singleton(|s: &Sync| s.customer.clone());
    engine.register_with("sync", 1, options, |ctx: WorkflowCtx, s: Sync| async move {
        ctx.step("call", |_| async { Ok(()) }).queue("crm-api").fairness_key(s.customer.clone()).await?;
        Ok::<_, WorkflowError>(())
    });
}

/// Whether the store of `db` keeps admission records; when not, prints why `test` is skipped.
fn admission_or_skip(db: &Path, test: &str) -> bool {
    let supported = SqliteStore::open(db).expect("open the database").capabilities().admission;
    if !supported {
        eprintln!("skipped {test}: the SQLite store keeps no admission records (Capabilities::admission is false)");
    }
    supported
}

/// The limits the engines registered for `crm-api`: one call at a time, 100 a minute, fair.
fn api() -> Limits {
    Limits {
        concurrency: Some(1),
        rate: Some(Rate::per(100, Duration::from_secs(60))),
        fairness: true,
        ..Limits::default()
    }
}

/// Asks for a slot of `queue` for the step at `seq` of `run`, at `at`.
async fn acquire(store: &dyn Store, queue: &str, limits: Limits, run: &str, seq: u32, at: Millis) -> Admission {
    let run_id = RunId::from(run);
    let request = SlotRequest {
        gate: protocol::queue_gate("default", queue),
        holder: protocol::step_id(&run_id, seq),
        run_id,
        priority: 0,
        fairness_key: run.split('-').next().unwrap_or_default().to_string(),
        limits,
        lease_until: Some(now() + 10 * MINUTE),
        max_waiting: None,
        succeeds: None,
        now: at,
    };
    store.acquire_slot(&request).await.expect("acquire_slot")
}

/// `acme-1` holds acme's key, and its step 0 holds `crm-api`'s slot since 6 minutes ago;
/// `acme-2` and `acme-3` wait for acme's key; `globex-1` holds globex's key and its step 0 has
/// waited for `crm-api` for 5 minutes. The queue `mail` has a rate only (5 a second).
fn seed(db: &Path) {
    with_client(db, register, async |engine| {
        for (id, customer) in [("acme-1", "acme"), ("acme-2", "acme"), ("acme-3", "acme"), ("globex-1", "globex")] {
            let started =
                engine.start("sync", &Sync { customer: customer.into() }, StartOptions::id(id)).await.unwrap();
            let gated = started.run.wake_at == Some(protocol::GATED);
            assert_eq!(gated, id == "acme-2" || id == "acme-3", "{id}");
        }
        let store = engine.store().as_ref();
        let t = now();
        assert_eq!(acquire(store, "crm-api", api(), "acme-1", 0, t - 6 * MINUTE).await, Admission::Admitted);
        let waiting = acquire(store, "crm-api", api(), "globex-1", 0, t - 5 * MINUTE).await;
        assert!(matches!(waiting, Admission::Waiting { .. }), "{waiting:?}");
        let mail = Limits { rate: Some(Rate::per(5, Duration::from_secs(1))), ..Limits::default() };
        assert_eq!(acquire(store, "mail", mail, "acme-1", 1, t).await, Admission::Admitted);
    });
}

/// The line of `text` that contains every one of `words`.
fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in:\n{text}"))
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect()
}

#[test]
fn queues_list_every_gate_with_its_limits_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    drop(SqliteStore::open(&db).unwrap());
    if !admission_or_skip(&db, "queues_list_every_gate_with_its_limits_and_load") {
        return;
    }
    seed(&db);

    let text = run_ok(dir.path(), &["queues", "--db", dbs]).stdout;
    let header = text.lines().next().unwrap();
    let columns: Vec<&str> = header.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        columns,
        [
            "KIND",
            "NAMESPACE",
            "NAME",
            "KEY",
            "LIMITS",
            "HELD",
            "WAITING",
            "RATE WINDOW",
            "OLDEST WAIT",
            "WAITING BY FAIRNESS KEY"
        ]
    );
    assert_eq!(text.lines().count(), 5, "a header, two keys, two queues:\n{text}");
    // The queue: one slot of one held, globex's step waiting 5 minutes; the rate window of
    // the back-dated admission is over.
    let row = line_with(&text, &["queue ", " crm-api "]);
    assert!(row.contains("concurrency 1, 100 per 1m, fair"), "{row}");
    assert!(row.contains(" 1/1 ") && row.contains(" 0/100, ends in "), "{row}");
    assert!(row.contains(" 5 min "), "the oldest waiter: {row}");
    assert!(row.ends_with(" globex 1"), "{row}");
    // A rate-only queue keeps no slots: only its window counts.
    let row = line_with(&text, &["queue ", " mail "]);
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[..9], ["queue", "default", "mail", "-", "5", "per", "1s", "-", "0"], "{row}");
    // The keys: acme held, two waiting for it; globex held.
    let row = line_with(&text, &["key ", " acme "]);
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[..9], ["key", "default", "sync", "acme", "concurrency", "1", "1/1", "2", "-"], "{row}");
    assert!(row.ends_with(" -"), "no fairness: {row}");
    let words: Vec<&str> = line_with(&text, &["key ", " globex "]).split_whitespace().collect();
    assert_eq!(words, ["key", "default", "sync", "globex", "concurrency", "1", "1/1", "0", "-", "-", "-"]);

    // Filters.
    let keys = run_ok(dir.path(), &["queues", "--kind", "key", "--db", dbs]).stdout;
    assert_eq!(keys.lines().count(), 3, "{keys}");
    assert!(keys.lines().skip(1).all(|l| l.starts_with("key ")), "{keys}");
    let queues = run_ok(dir.path(), &["queues", "--kind", "queue", "--namespace", "default", "--db", dbs]).stdout;
    assert_eq!(queues.lines().count(), 3, "{queues}");
    let none = run_ok(dir.path(), &["queues", "--namespace", "prod", "--db", dbs]).stdout;
    assert_eq!(
        none,
        "no step queues or concurrency keys in namespace prod (`durable queues` without --namespace lists every \
         namespace)\n"
    );

    // JSON: one object per gate and per line, every field present.
    let gates = json_lines(&run_ok(dir.path(), &["queues", "--json", "--db", dbs]).stdout);
    assert_eq!(gates.len(), 4);
    let mut fields: Vec<&str> = gates[0].as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "gate",
            "held",
            "key",
            "kind",
            "limits",
            "name",
            "namespace",
            "oldest_wait_ms",
            "oldest_waiting_since",
            "waiting",
            "waiting_by_fairness_key",
            "window_count",
            "window_end",
            "window_start"
        ]
    );
    let api = gates.iter().find(|g| g["name"] == "crm-api").unwrap();
    assert_eq!(api["gate"], "queue:default:crm-api");
    assert_eq!(
        (api["kind"].as_str(), api["namespace"].as_str(), &api["key"]),
        (Some("queue"), Some("default"), &Value::Null)
    );
    assert_eq!(
        api["limits"],
        json!({"concurrency": 1, "rate": {"limit": 100, "period_ms": 60_000}, "fairness": true, "order": "fifo",
               "priority": "highest_first"})
    );
    assert_eq!((api["held"].as_u64(), api["waiting"].as_u64()), (Some(1), Some(1)));
    assert_eq!(api["waiting_by_fairness_key"], json!({"globex": 1}));
    assert!(api["oldest_wait_ms"].as_u64().unwrap() >= 5 * MINUTE, "{api}");
    assert_eq!(api["window_count"], 0, "a new window: {api}");
    let acme = gates.iter().find(|g| g["key"] == "acme").unwrap();
    assert_eq!((acme["kind"].as_str(), acme["name"].as_str()), (Some("key"), Some("sync")));
    assert_eq!((acme["held"].as_u64(), acme["waiting"].as_u64()), (Some(1), Some(2)));
    assert_eq!((&acme["window_count"], &acme["window_end"]), (&Value::Null, &Value::Null), "no rate: {acme}");
    let keys = json_lines(&run_ok(dir.path(), &["queues", "--json", "--kind", "key", "--db", dbs]).stdout);
    assert!(keys.len() == 2 && keys.iter().all(|g| g["kind"] == "key"), "{keys:?}");
}

#[test]
fn runs_show_and_list_say_what_a_run_holds_and_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    drop(SqliteStore::open(&db).unwrap());
    if !admission_or_skip(&db, "runs_show_and_list_say_what_a_run_holds_and_waits_for") {
        return;
    }
    seed(&db);

    // Waiting for its key: where it stands; no date for a start that is not due by time.
    let text = run_ok(dir.path(), &["runs", "show", "acme-3", "--db", dbs]).stdout;
    let waiting = line_with(&text, &["waiting on"]);
    assert!(waiting.ends_with("concurrency key acme of workflow sync (position 2 of 2 waiting)"), "{waiting}");
    let starts = line_with(&text, &["starts at"]);
    assert!(starts.ends_with("when a slot of its concurrency key is handed to it (a run holding the key settles)"));
    assert!(text.contains("\nadmission (0 held, 1 waiting)\n"), "{text}");
    line_with(&text, &["  waiting for concurrency key acme of workflow sync (position 2 of 2 waiting), since "]);
    let text = run_ok(dir.path(), &["runs", "show", "acme-2", "--db", dbs]).stdout;
    assert!(line_with(&text, &["waiting on"]).ends_with("(position 1 of 2 waiting)"), "{text}");

    // A step waiting for its queue; its run holds its key.
    let text = run_ok(dir.path(), &["runs", "show", "globex-1", "--db", dbs]).stdout;
    assert!(text.contains("\nadmission (1 held, 1 waiting)\n"), "{text}");
    let wait = line_with(&text, &["  step 0 waiting for queue crm-api (1 waiting), fairness key globex, since "]);
    assert!(wait.ends_with("(5 min ago)"), "{wait}");
    line_with(&text, &["  holds concurrency key globex of workflow sync since "]);

    // The slots a run holds: its key, and its step's slot of the queue with its lease.
    let text = run_ok(dir.path(), &["runs", "show", "acme-1", "--db", dbs]).stdout;
    assert!(text.contains("\nadmission (2 held, 0 waiting)\n"), "{text}");
    line_with(&text, &["  holds concurrency key acme of workflow sync since "]);
    let slot = line_with(&text, &["  step 0 holds a slot of queue crm-api since "]);
    assert!(slot.contains("(6 min ago), lease until ") && slot.ends_with(" s)"), "{slot}");

    // JSON: the records as stored; a wait with where it stands.
    let doc = show(dir.path(), &db, "acme-3");
    assert_eq!(doc["run"]["wake_at"], json!(protocol::GATED), "the run as stored");
    let waits = doc["admission"]["waits"].as_array().unwrap();
    assert_eq!(waits.len(), 1, "{doc}");
    assert_eq!(
        (waits[0]["gate"].as_str(), waits[0]["holder"].as_str()),
        (Some("key:default:sync:acme"), Some("acme-3"))
    );
    assert_eq!((waits[0]["position"].as_u64(), waits[0]["waiting"].as_u64()), (Some(2), Some(2)));
    assert_eq!(doc["admission"]["holds"], json!([]));
    let doc = show(dir.path(), &db, "acme-1");
    let holders: Vec<&str> =
        doc["admission"]["holds"].as_array().unwrap().iter().map(|s| s["holder"].as_str().unwrap()).collect();
    assert!(holders.len() == 2 && holders.contains(&"acme-1") && holders.contains(&"acme-1:0"), "{holders:?}");

    // `runs list`: the gated runs wait for their key (no date).
    let text = run_ok(dir.path(), &["runs", "list", "--db", dbs]).stdout;
    for id in ["acme-2 ", "acme-3 "] {
        let row = line_with(&text, &[id]);
        assert!(row.contains(" pending ") && row.ends_with("concurrency key acme of workflow sync"), "{row}");
    }
}

#[test]
fn queues_on_an_empty_database_say_how_gates_come_to_exist() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    drop(SqliteStore::open(&db).unwrap());
    if !admission_or_skip(&db, "queues_on_an_empty_database_say_how_gates_come_to_exist") {
        // What such a store says instead: one line, exit 2, nothing on stdout.
        let err = run_bad(dir.path(), &["queues"], "does not support flow control");
        assert!(err.contains("./durable.db") && err.contains("no admission records"), "{err}");
        run_bad(dir.path(), &["queues", "--json"], "does not support flow control");
        return;
    }
    let text = run_ok(dir.path(), &["queues"]).stdout;
    assert!(text.starts_with("no step queues or concurrency keys yet; they appear when first used:\n"), "{text}");
    line_with(&text, &["  a step queue (`engine.register_queue(name, ..)`)", "`ctx.step(..).queue(name)`"]);
    line_with(&text, &["  a concurrency key", "`WorkflowOptions::concurrency`", "`singleton`"]);
    assert_eq!(run_ok(dir.path(), &["queues", "--json"]).stdout, "", "no gates: no JSON lines");
}

#[test]
fn queues_bad_input_is_one_line_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    drop(SqliteStore::open(&db).unwrap());
    let err = run_bad(dir.path(), &["queues", "--kind", "bogus"], "invalid value 'bogus' for '--kind <KIND>'");
    assert!(err.contains("queue") && err.contains("key"), "the possible values: {err}");
    run_bad(dir.path(), &["queues", "--kind"], "a value is required for '--kind <KIND>'");
    run_bad(dir.path(), &["queues", "--namespace"], "a value is required for '--namespace <NAME>'");
    run_bad(dir.path(), &["queues", "extra"], "unexpected argument 'extra'");
    let err = run_bad(dir.path(), &["queues", "--bogus"], "unexpected argument '--bogus'");
    assert!(!err.contains("-- --bogus"), "no tip to pass it after `--`, which no command takes: {err}");
    run_bad(dir.path(), &["queues", "--db", "missing/durable.db"], "missing/durable.db");
    let err = run_bad(dir.path(), &["queues", "--url", "postgres://u:s3cret@h:notaport/d"], "invalid PostgreSQL URL");
    assert!(!err.contains("s3cret"), "{err}");
}
