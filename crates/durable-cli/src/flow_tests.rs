//! `durable queues`, `runs show` and `runs list` on flow-control records made by a real engine
//! on the memory store (the SQLite version, through the binary, is `tests/cli_queues.rs`; it
//! runs once the SQLite store keeps admission records).

use std::sync::Arc;
use std::time::Duration;

use durable::{
    Engine, EngineConfig, MemoryStore, QueueOptions, RunId, StartOptions, WorkflowCtx, WorkflowError, WorkflowOptions,
    protocol,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::cli::{GateKind, ListArgs, QueuesArgs};
use crate::{queues, runs};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sync {
    customer: String,
    n: u32,
}

/// An engine on a memory store: `sync` is a singleton per customer whose one step goes through
/// the queue `crm-api` (one at a time, 100 a minute, fair by customer) and blocks until `gate`
/// has a permit.
fn engine(gate: Arc<Semaphore>) -> Engine {
    let mut config = EngineConfig::default();
    config.admission_recheck = Duration::from_millis(200);
    let engine = Engine::builder().store(MemoryStore::new()).config(config).build().unwrap();
    let api = QueueOptions::default().concurrency(1).rate(100, Duration::from_secs(60)).fair();
    engine.register_queue("crm-api", api).unwrap();
    let options = WorkflowOptions::default().singleton(|s: &Sync| s.customer.clone());
    engine.register_with("sync", 1, options, move |ctx: WorkflowCtx, s: Sync| {
        let gate = gate.clone();
        async move {
            ctx.step("call", move |_| {
                let gate = gate.clone();
                async move {
                    gate.acquire().await.expect("open").forget();
                    Ok(())
                }
            })
            .queue("crm-api")
            .fairness_key(s.customer.clone())
            .await?;
            Ok::<_, WorkflowError>(s.n)
        }
    });
    engine
}

async fn start(engine: &Engine, id: &str, customer: &str, n: u32) {
    engine.start("sync", &Sync { customer: customer.into(), n }, StartOptions::id(id)).await.unwrap();
}

/// Until the gate `gate` has `held` slots held and `waiting` requests waiting.
async fn until(engine: &Engine, gate: &str, held: u32, waiting: u32) {
    for _ in 0..1_000 {
        let stats = engine.admission_stats().await.unwrap();
        if stats.iter().any(|g| g.gate == gate && g.held == held && g.waiting == waiting) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{gate} never had {held} held and {waiting} waiting: {:?}", engine.admission_stats().await.unwrap());
}

fn text(out: Vec<u8>) -> String {
    String::from_utf8(out).unwrap()
}

async fn queues_text(engine: &Engine, kind: Option<GateKind>, namespace: Option<&str>, json: bool) -> String {
    let args = QueuesArgs { kind, namespace: namespace.map(String::from), json };
    let mut out = Vec::new();
    queues::write_queues(engine, "mem", &args, &mut out).await.unwrap();
    text(out)
}

async fn show_text(engine: &Engine, id: &str, json: bool) -> String {
    let mut out = Vec::new();
    runs::show_run(engine, &RunId::from(id), json, &mut out).await.unwrap();
    text(out)
}

/// The line of `text` that contains every one of `words`.
fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_and_runs_show_what_is_held_and_waits() {
    let gate = Arc::new(Semaphore::new(0));
    let engine = engine(gate.clone());
    let (queue, acme) = (protocol::queue_gate("default", "crm-api"), protocol::key_gate("default", "sync", "acme"));

    // Nothing yet: the line that says how gates come to exist.
    let empty = queues_text(&engine, None, None, false).await;
    assert!(empty.starts_with("no step queues or concurrency keys yet"), "{empty}");
    assert!(empty.contains("engine.register_queue") && empty.contains("singleton"), "{empty}");
    assert_eq!(queues_text(&engine, None, None, true).await, "", "no JSON lines");

    // acme-1 holds acme's key and the queue's slot (its step blocks); acme-2 and acme-3 wait
    // for the key; globex-1 holds globex's key and its step waits for the queue.
    start(&engine, "acme-1", "acme", 1).await;
    until(&engine, &queue, 1, 0).await;
    start(&engine, "acme-2", "acme", 2).await;
    start(&engine, "acme-3", "acme", 3).await;
    start(&engine, "globex-1", "globex", 1).await;
    until(&engine, &queue, 1, 1).await;
    until(&engine, &acme, 1, 2).await;

    let table = queues_text(&engine, None, None, false).await;
    let header = line_with(&table, &["KIND", "NAMESPACE", "NAME", "KEY", "LIMITS", "HELD", "WAITING", "RATE WINDOW"]);
    assert!(header.ends_with("OLDEST WAIT  WAITING BY FAIRNESS KEY"), "{header}");
    assert_eq!(table.lines().count(), 4, "a header, the queue, two keys:\n{table}");
    let row = line_with(&table, &["queue ", "crm-api"]);
    assert!(row.contains("concurrency 1, 100 per 1m, fair"), "{row}");
    assert!(row.contains(" 1/1 ") && row.contains("1/100, ends in "), "held 1 of 1, 1 admitted this window: {row}");
    assert!(row.ends_with(" globex 1"), "{row}");
    let row = line_with(&table, &["key ", " acme "]);
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[..8], ["key", "default", "sync", "acme", "concurrency", "1", "1/1", "2"], "{row}");
    assert_eq!(words[8], "-", "no rate window: {row}");
    assert!(row.ends_with(" -"), "no fairness: {row}");
    let row = line_with(&table, &["key ", " globex "]);
    assert_eq!(row.split_whitespace().collect::<Vec<_>>()[6..8], ["1/1", "0"], "{row}");

    // Filters.
    let keys = queues_text(&engine, Some(GateKind::Key), None, false).await;
    assert_eq!(keys.lines().count(), 3, "{keys}");
    assert!(!keys.contains("crm-api"), "{keys}");
    let none = queues_text(&engine, None, Some("other"), false).await;
    assert!(none.starts_with("no step queues or concurrency keys in namespace other"), "{none}");
    let none = queues_text(&engine, Some(GateKind::Queue), Some("other"), false).await;
    assert!(none.starts_with("no step queues in namespace other"), "{none}");

    // JSON: one object per gate.
    let json = queues_text(&engine, None, None, true).await;
    let gates: Vec<Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(gates.len(), 3);
    let q = gates.iter().find(|g| g["kind"] == "queue").unwrap();
    assert_eq!(q["gate"], queue.as_str());
    assert_eq!(
        (q["namespace"].as_str(), q["name"].as_str(), q["key"].as_null()),
        (Some("default"), Some("crm-api"), Some(()))
    );
    assert_eq!(
        q["limits"],
        serde_json::json!({"concurrency": 1, "rate": {"limit": 100, "period_ms": 60_000}, "fairness": true,
                            "order": "fifo", "priority": "highest_first"})
    );
    assert_eq!((q["held"].as_u64(), q["waiting"].as_u64()), (Some(1), Some(1)));
    assert_eq!(q["waiting_by_fairness_key"], serde_json::json!({"globex": 1}));
    assert_eq!(q["window_count"], 1);
    assert!(q["window_end"].as_u64().unwrap() > q["window_start"].as_u64().unwrap());
    assert!(q["oldest_wait_ms"].as_u64().is_some() && q["oldest_waiting_since"].as_u64().is_some(), "{q}");
    let k = gates.iter().find(|g| g["key"] == "acme").unwrap();
    assert_eq!((k["kind"].as_str(), k["name"].as_str(), k["waiting"].as_u64()), (Some("key"), Some("sync"), Some(2)));
    assert_eq!(k["window_count"], Value::Null, "no rate: no window");
    assert_eq!(k["waiting_by_fairness_key"], serde_json::json!({"": 2}));

    // A run waiting for its key: where it stands, and no date for its never-due wake_at.
    let show = show_text(&engine, "acme-3", false).await;
    let waiting = line_with(&show, &["waiting on"]);
    assert!(waiting.ends_with("concurrency key acme of workflow sync (position 2 of 2 waiting)"), "{waiting}");
    let starts = line_with(&show, &["starts at"]);
    assert!(starts.ends_with("when a slot of its concurrency key is handed to it (a run holding the key settles)"));
    assert!(!show.contains("292278994"), "no date for GATED: {show}");
    assert!(show.contains("\nadmission (0 held, 1 waiting)\n"), "{show}");
    line_with(&show, &["  waiting for concurrency key acme of workflow sync (position 2 of 2 waiting), since "]);
    let show = show_text(&engine, "acme-2", false).await;
    assert!(line_with(&show, &["waiting on"]).ends_with("(position 1 of 2 waiting)"), "{show}");

    // A step waiting for its queue, in a run that holds its key.
    let show = show_text(&engine, "globex-1", false).await;
    assert!(show.contains("\nadmission (1 held, 1 waiting)\n"), "{show}");
    line_with(&show, &["  step 0 waiting for queue crm-api (1 waiting), fairness key globex, since "]);
    line_with(&show, &["  holds concurrency key globex of workflow sync since "]);
    // A step holding the queue's slot (with its lease), and the key.
    let show = show_text(&engine, "acme-1", false).await;
    assert!(show.contains("\nadmission (2 held, 0 waiting)\n"), "{show}");
    let slot = line_with(&show, &["  step 0 holds a slot of queue crm-api since "]);
    assert!(slot.contains(", lease until "), "{slot}");
    line_with(&show, &["  holds concurrency key acme of workflow sync since "]);

    // JSON: the records as stored, waits with where they stand.
    let doc: Value = serde_json::from_str(&show_text(&engine, "acme-3", true).await).unwrap();
    let waits = doc["admission"]["waits"].as_array().unwrap();
    assert_eq!(waits.len(), 1, "{doc}");
    assert_eq!(waits[0]["gate"], acme.as_str());
    assert_eq!(waits[0]["holder"], "acme-3");
    assert_eq!((waits[0]["position"].as_u64(), waits[0]["waiting"].as_u64()), (Some(2), Some(2)));
    assert_eq!(doc["admission"]["holds"], serde_json::json!([]));
    assert!(doc["run"].is_object() && doc["history"].is_array(), "the rest as before: {doc}");
    let doc: Value = serde_json::from_str(&show_text(&engine, "acme-1", true).await).unwrap();
    let holders: Vec<&str> =
        doc["admission"]["holds"].as_array().unwrap().iter().map(|s| s["holder"].as_str().unwrap()).collect();
    assert_eq!(holders.len(), 2);
    assert!(holders.contains(&"acme-1") && holders.contains(&"acme-1:0"), "{holders:?}");

    // `runs list`: the gated runs wait for their key, with no date.
    let args = ListArgs { status: Vec::new(), workflow: None, namespace: None, stale: None, limit: 50, json: false };
    let mut out = Vec::new();
    runs::list_runs(&engine, &args, &mut out).await.unwrap();
    let list = text(out);
    let row = line_with(&list, &["acme-3 ", "pending"]);
    assert!(row.ends_with("concurrency key acme of workflow sync"), "{row}");
    let row = line_with(&list, &["globex-1 "]);
    assert!(row.contains("step 0 waiting for queue crm-api"), "{row}");

    // Let every step finish: the slots are handed on, each run in turn, and nothing is left.
    gate.add_permits(100);
    for id in ["acme-1", "acme-2", "acme-3", "globex-1"] {
        engine.wait_for_run(&RunId::from(id)).await.unwrap();
    }
    let table = queues_text(&engine, None, None, false).await;
    let row = line_with(&table, &["queue ", "crm-api"]);
    assert!(row.contains(" 0/1 ") && row.contains("4/100"), "{row}");
    let show = show_text(&engine, "acme-3", false).await;
    assert!(!show.contains("\nadmission"), "a finished run holds nothing: {show}");
    engine.shutdown().await;
}
