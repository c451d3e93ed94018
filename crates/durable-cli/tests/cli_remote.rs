//! Remote steps as the operator sees them, on a real database file: `durable workers`, the
//! pending remote steps of `runs show` (worker, heartbeat, progress, redeliveries, logs),
//! `runs list --stale` and `runs list --status blocked`.
//!
//! The runs are made the way the user's code makes them (an engine with workflows that call
//! `ctx.remote_step`); what workers do to their tasks is then written with the store's own
//! calls (`claim_tasks`, `heartbeat_task`, `register_worker`), some of them back-dated, so a
//! step can be silent for 19 minutes without the test waiting for it.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable::store::TaskFilter;
use durable::task::{BeatOutcome, TaskBeat, TaskClaim, TaskLog, WorkerInfo};
use durable::{
    Engine, EngineConfig, Millis, Payload, RunId, RunStatus, SqliteStore, StartOptions, VirtualClock, WorkflowCtx,
};
use serde_json::{Value, json};
use support::{default_db, path_str, run_bad, run_ok, show};

const MINUTE: Millis = 60_000;

fn now() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as Millis
}

/// The workflows: `thumbnail` resizes on a worker serving `resize`; `render` needs a worker
/// with the `gpu` capability.
fn register(engine: &Engine) {
    engine.register("thumbnail", 1, |ctx: WorkflowCtx, url: String| async move {
        let small: String = ctx.remote_step("resize", &url).await?;
        Ok(small)
    });
    engine.register("render", 1, |ctx: WorkflowCtx, scene: String| async move {
        let frame: String = ctx.remote_step("render", &scene).requires(["gpu"]).await?;
        Ok(frame)
    });
}

fn worker_info(id: &str, queues: &[&str], capabilities: &[&str], at: Millis) -> WorkerInfo {
    WorkerInfo {
        id: id.into(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
        protocol_min: durable::task::PROTOCOL_VERSION,
        protocol_max: durable::task::PROTOCOL_VERSION,
        concurrency: 4,
        started_at: at,
        heartbeat_at: at,
    }
}

async fn wait_for(engine: &Engine, clock: &VirtualClock, id: &str, status: RunStatus) {
    let id = RunId::from(id);
    for _ in 0..400 {
        // The engine's time moves on (its blocked routing runs every 50 ms of it).
        clock.advance(Duration::from_millis(100));
        let run = engine.get_run(&id).await.unwrap().unwrap();
        let tasks = engine
            .store()
            .list_tasks(&TaskFilter { run_id: Some(id.clone()), unfinished: true, ..TaskFilter::default() })
            .await
            .unwrap();
        if run.status == status && !tasks.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("run {id} did not become {status} with a task");
}

fn claim(worker: &str, limit: usize, at: Millis) -> TaskClaim {
    TaskClaim {
        worker: worker.into(),
        queues: vec!["resize".into()],
        namespace: None,
        capabilities: vec!["cpu".into()],
        limit,
        now: at,
    }
}

fn beat(run: &str, worker: &str, progress: Value, message: &str, data: Value, at: Millis) -> TaskBeat {
    TaskBeat {
        run_id: RunId::from(run),
        seq: 0,
        attempt: 1,
        worker: worker.into(),
        progress: Some(Payload::encode(&progress).unwrap()),
        logs: vec![TaskLog { attempt: 1, at, level: "info".into(), message: message.into(), data: Some(data) }],
        now: at,
    }
}

/// `img-1`: its resize was claimed by w-0 20 minutes ago, redelivered to w-1 19 minutes ago
/// (w-0's lease ran out), and w-1 has been silent on it since. `img-2`: claimed by w-1 too,
/// which heartbeats it now with progress. `render-1`: waits for a gpu worker nobody runs, so it is `blocked`. w-1 is live.
fn seed(db: &std::path::Path) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut config = EngineConfig::default();
        config.blocked_poll = Duration::from_millis(50);
        // img-1 and img-2 are made 21 minutes ago (a claim is never stamped before its
        // dispatch, and the test back-dates claims).
        let clock = VirtualClock::new(now() - 21 * MINUTE);
        let engine = Engine::builder()
            .store(SqliteStore::open(db).unwrap())
            .clock(clock.clone())
            .config(config)
            .build()
            .unwrap();
        register(&engine);
        let store = engine.store().clone();
        store.register_worker(&worker_info("w-1", &["resize"], &["cpu"], now())).await.unwrap();

        engine.start("thumbnail", "https://img.example/1.png", StartOptions::id("img-1")).await.unwrap();
        wait_for(&engine, &clock, "img-1", RunStatus::Suspended).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        engine.start("thumbnail", "https://img.example/2.png", StartOptions::id("img-2")).await.unwrap();
        wait_for(&engine, &clock, "img-2", RunStatus::Suspended).await;
        // render-1 is made now.
        clock.set(now());
        engine.start("render", "scene-7", StartOptions::id("render-1")).await.unwrap();
        wait_for(&engine, &clock, "render-1", RunStatus::Blocked).await;
        engine.shutdown().await;

        let t = now();
        let first = store.claim_tasks(&claim("w-0", 1, t - 20 * MINUTE)).await.unwrap();
        assert_eq!(first[0].task.run_id.as_str(), "img-1");
        // w-0's lease ran out 30 s later: w-1 takes img-1 again, and img-2.
        let both = store.claim_tasks(&claim("w-1", 2, t - 19 * MINUTE)).await.unwrap();
        let taken: Vec<(&str, u32)> = both.iter().map(|t| (t.task.run_id.as_str(), t.claims)).collect();
        assert_eq!(taken, [("img-1", 2), ("img-2", 1)], "img-1 redelivered");
        let b = beat("img-1", "w-1", json!({"stage": "download"}), "downloading", json!({"bytes": 0}), t - 19 * MINUTE);
        assert!(matches!(store.heartbeat_task(&b).await.unwrap(), BeatOutcome::Extended(_)));
        let b = beat("img-2", "w-1", json!({"done": 3, "of": 10}), "resizing", json!({"width": 640}), t);
        assert!(matches!(store.heartbeat_task(&b).await.unwrap(), BeatOutcome::Extended(_)));
    });
}

/// The line of `text` that contains every one of `words`.
fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in:\n{text}"))
}

#[test]
fn workers_show_queues_and_live_workers() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    seed(&db);

    let text = run_ok(dir.path(), &["workers", "--db", dbs]).stdout;
    assert!(text.starts_with("queues (2)\n"), "{text}");
    let header = line_with(&text, &["NAMESPACE", "QUEUE", "DEPTH", "CLAIMED", "OLDEST", "LIVE WORKERS"]);
    assert!(header.starts_with("  "), "{header}");
    let resize: Vec<&str> = line_with(&text, &[" resize "]).split_whitespace().collect();
    assert_eq!(resize[..4], ["default", "resize", "0", "2"], "nothing waits, two claimed");
    assert_eq!(resize.last(), Some(&"w-1"));
    let render = line_with(&text, &[" render "]);
    assert_eq!(render.split_whitespace().collect::<Vec<_>>()[..4], ["default", "render", "1", "0"]);
    assert!(render.ends_with("none (its runs wait)"), "{render}");
    assert!(text.contains("\nlive workers (1, heartbeat within 30.0 s)\n"), "{text}");
    let w1: Vec<&str> = line_with(&text, &["  w-1 "]).split_whitespace().collect();
    assert_eq!(w1[..4], ["w-1", "resize", "cpu", "4"]);
    assert!(!text.contains("w-0"), "w-0 never registered: {text}");

    let doc: Value = serde_json::from_str(&run_ok(dir.path(), &["workers", "--json", "--db", dbs]).stdout).unwrap();
    let queues = doc["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 2, "{doc}");
    let render = queues.iter().find(|q| q["queue"] == "render").unwrap();
    assert_eq!((render["depth"].as_u64(), render["claimed"].as_u64()), (Some(1), Some(0)));
    assert!(render["oldest_age_ms"].as_u64().is_some(), "{render}");
    assert_eq!(render["workers"], json!([]));
    assert_eq!(doc["workers"][0]["id"], "w-1");
    assert_eq!(doc["workers"][0]["capabilities"], json!(["cpu"]));
}

#[test]
fn workers_on_a_database_without_remote_steps() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    drop(SqliteStore::open(&db).unwrap());
    let text = run_ok(dir.path(), &["workers"]).stdout;
    assert_eq!(text, "no remote steps waiting and no live workers (heartbeat within 30.0 s)\n");
    let doc: Value = serde_json::from_str(&run_ok(dir.path(), &["workers", "--json"]).stdout).unwrap();
    assert_eq!(doc, json!({"queues": [], "workers": []}));
    run_bad(dir.path(), &["workers", "--db", "missing/durable.db"], "missing/durable.db");
}

#[test]
fn show_lists_pending_remote_steps_with_heartbeats_progress_claims_and_logs() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    seed(&db);

    // Redelivered once, silent for 19 minutes, with the handler's log line.
    let text = run_ok(dir.path(), &["runs", "show", "img-1", "--db", dbs]).stdout;
    assert!(line_with(&text, &["waiting on"]).ends_with("remote step resize (attempt 1)"), "{text}");
    assert!(text.contains("\npending remote steps (1)\n"), "{text}");
    line_with(&text, &["SEQ", "NAME", "ATTEMPT", "STATE", "WORKER", "LAST HEARTBEAT", "CLAIMS", "PROGRESS"]);
    let row = line_with(&text, &["resize", "claimed"]);
    assert!(row.contains("w-1") && row.contains("19 min ago"), "{row}");
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[..5], ["0", "resize", "1", "claimed", "w-1"], "{row}");
    assert_eq!(words[5..], ["19", "min", "ago", "2", r#"{"stage":"download"}"#], "two claims, the progress: {row}");
    assert!(text.contains("\n  log of resize (seq 0):\n    [1] info downloading {\"bytes\":0}\n"), "{text}");
    line_with(&text, &["0", "the result of remote step resize (remote:img-1:0)"]);

    // Claimed just now, with progress.
    let text = run_ok(dir.path(), &["runs", "show", "img-2", "--db", dbs]).stdout;
    let row = line_with(&text, &["resize", "claimed"]);
    assert!(row.contains("<1 s ago") || row.contains(" s ago"), "{row}");
    assert!(row.split_whitespace().rev().take(2).eq([r#"{"done":3,"of":10}"#, "1"]), "{row}");
    assert!(text.contains("    [1] info resizing {\"width\":640}\n"), "{text}");

    // Blocked: why, and the task nobody picked up.
    let text = run_ok(dir.path(), &["runs", "show", "render-1", "--db", dbs]).stdout;
    assert!(line_with(&text, &["status"]).ends_with("blocked"), "{text}");
    let waiting = line_with(&text, &["waiting on"]);
    assert!(waiting.ends_with("blocked: no compatible worker (requires gpu)"), "{waiting}");
    let row = line_with(&text, &["render", "queued"]);
    assert!(row.contains(" - ") && row.contains("never (dispatched "), "{row}");
    assert!(row.split_whitespace().rev().take(2).eq(["-", "0"]), "no claim, no progress: {row}");
    assert!(!text.contains("log of"), "{text}");

    // JSON: the tasks as stored.
    let doc = show(dir.path(), &db, "img-1");
    let steps = doc["remote_steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0]["state"], "claimed");
    assert_eq!(steps[0]["claims"], 2);
    assert_eq!(steps[0]["worker"], "w-1");
    assert_eq!(steps[0]["task"]["name"], "resize");
    assert_eq!(steps[0]["logs"][0]["message"], "downloading");
}

#[test]
fn list_stale_finds_silent_remote_steps_and_blocked_runs_list() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    seed(&db);

    let text = run_ok(dir.path(), &["runs", "list", "--stale", "15m", "--db", dbs]).stdout;
    assert_eq!(text.lines().count(), 2, "a header and img-1: {text}");
    let row = text.lines().nth(1).unwrap();
    assert!(row.starts_with("img-1 "), "{row}");
    assert!(row.contains("thumbnail@1") && row.contains("suspended"), "{row}");
    assert!(row.contains("remote step resize (attempt 1) silent 19 min") && row.contains("on w-1"), "{row}");

    // Longer than any silence: none. The other filters narrow.
    let none = run_ok(dir.path(), &["runs", "list", "--stale", "1h", "--db", dbs]).stdout;
    assert_eq!(none, "no runs match: no remote step is silent for 1h or more\n");
    let none = run_ok(dir.path(), &["runs", "list", "--stale", "15m", "--workflow", "render", "--db", dbs]).stdout;
    assert_eq!(none, "no runs match: no remote step of a run the other filters select is silent for 15m or more\n");
    let json = run_ok(dir.path(), &["runs", "list", "--stale", "10m", "--json", "--db", dbs]).stdout;
    let ids: Vec<String> =
        json.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, ["img-1"]);

    // A step never picked up is silent since its dispatch.
    std::thread::sleep(Duration::from_millis(1_100));
    let text = run_ok(dir.path(), &["runs", "list", "--stale", "1s", "--db", dbs]).stdout;
    let row = line_with(&text, &["render-1 "]);
    assert!(row.contains("blocked") && row.contains("remote step render (attempt 1) not picked up for"), "{row}");
    assert!(text.contains("img-1 "), "{text}");

    // `--status blocked`.
    let text = run_ok(dir.path(), &["runs", "list", "--status", "blocked", "--db", dbs]).stdout;
    assert_eq!(text.lines().count(), 2, "{text}");
    let row = text.lines().nth(1).unwrap();
    assert!(row.starts_with("render-1 ") && row.contains("blocked: no compatible worker (requires gpu)"), "{row}");

    // Bad durations are usage errors.
    for (stale, why) in [("abc", "expected a number"), ("15", "a number needs a unit"), ("0m", "longer than 0")] {
        let err = run_bad(dir.path(), &["runs", "list", "--stale", stale, "--db", dbs], why);
        assert!(err.contains("e.g. 90s, 15m, 1h30m, 2d"), "{err}");
    }
}
