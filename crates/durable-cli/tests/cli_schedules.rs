//! `durable schedules …` on real database files: schedules declared with the library (as a
//! worker of the user's declares them), then listed, shown, paused, resumed, triggered and
//! deleted with the binary; and a delayed start as `runs show` shows it.

mod support;

use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use durable::store::SaveSchedule;
use durable::{
    Engine, EngineEvent, Millis, Overlap, RunId, RunStatus, Schedule, SqliteStore, StartOptions, WorkflowCtx,
};
use serde_json::Value;
use support::{default_db, list_schedules, path_str, run_bad, run_ok, show, show_schedule, with_client};

/// The workflow every schedule here starts: it returns its input.
fn register(engine: &Engine) {
    engine.register("report", 1, |_ctx: WorkflowCtx, what: String| async move { Ok(what) });
}

/// Declares `paris-morning` (09:00 every day in Paris) and `hourly` (every hour, buffer_one)
/// on the database at `db`, as a worker would at startup.
fn declare(db: &std::path::Path) {
    with_client(db, register, async |engine| {
        let paris = Schedule::cron("0 9 * * *").timezone("Europe/Paris");
        engine.schedule("paris-morning", paris, "report", "sales").await.unwrap();
        let hourly = Schedule::every(Duration::from_secs(3600)).overlap(Overlap::BufferOne);
        engine.schedule("hourly", hourly, "report", "cleanup").await.unwrap();
    });
}

/// `at` in Paris, as the command line shows it: `2026-12-01 09:00 CET`.
fn paris(at: Millis) -> DateTime<chrono_tz::Tz> {
    DateTime::<Utc>::from_timestamp_millis(i64::try_from(at).unwrap()).unwrap().with_timezone(&chrono_tz::Europe::Paris)
}

fn millis(v: &Value) -> Millis {
    v.as_u64().unwrap_or_else(|| panic!("not a time in ms: {v}"))
}

/// The line of `table` that starts with `key` and a space.
fn line<'a>(table: &'a str, key: &str) -> &'a str {
    table.lines().find(|l| l.starts_with(&format!("{key} "))).unwrap_or_else(|| panic!("no {key} in:\n{table}"))
}

#[test]
fn list_and_show_give_fire_times_in_the_schedules_own_zone() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    declare(&db);

    // JSON: one record per line, by key, as stored.
    let listed = list_schedules(dir.path(), &db);
    let keys: Vec<&str> = listed.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["hourly", "paris-morning"]);
    let morning = &listed[1];
    assert_eq!(morning["workflow"], "report");
    assert_eq!(morning["schedule"]["timezone"], "Europe/Paris");
    let next = millis(&morning["state"]["next_fire_at"]);
    let local = paris(next);
    assert_eq!((local.hour(), local.minute()), (9, 0), "09:00 in Paris");
    assert_ne!(DateTime::<Utc>::from_timestamp_millis(next as i64).unwrap().hour(), 9, "not 09:00 UTC");
    let shown_local = local.format("%Y-%m-%d 09:00 %Z").to_string();
    assert!(shown_local.ends_with(" CET") || shown_local.ends_with(" CEST"), "{shown_local}");

    // The table: cadence with its zone, not paused, nothing fired, the next fire in Paris time.
    let table = run_ok(dir.path(), &["schedules", "list", "--db", dbs]).stdout;
    assert!(table.starts_with("KEY "), "{table}");
    let row = line(&table, "paris-morning");
    assert!(row.contains("report") && row.contains("0 9 * * * (Europe/Paris)"), "{row}");
    let words: Vec<&str> = row.split_whitespace().collect();
    assert!(words.contains(&"no") && words.contains(&"0/0/0"), "{row}");
    assert!(row.contains(&format!("{shown_local} (in ")), "{shown_local} in {row}");
    let row = line(&table, "hourly");
    assert!(row.contains("every 1h") && row.contains(":00 UTC ("), "{row}");

    // show: the definition, and the next 5 fire times in Paris and in UTC.
    let text = run_ok(dir.path(), &["schedules", "show", "paris-morning", "--db", dbs]).stdout;
    for expected in [
        "schedule       paris-morning",
        "cadence        0 9 * * * (Europe/Paris)",
        "time zone      Europe/Paris",
        "input          \"sales\"",
        "last fire      none yet",
        "status         active",
        "0 started, 0 skipped",
        &format!("next fire      {shown_local} (in "),
        "next 5 fire times (Europe/Paris, UTC)",
    ] {
        assert!(text.contains(expected), "{expected:?} in:\n{text}");
    }
    let times: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("next 5 fire times")).skip(1).collect();
    assert_eq!(times.len(), 5, "{text}");
    for t in &times {
        assert!(t.contains(" 09:00 CET  ") || t.contains(" 09:00 CEST  "), "{t}");
        assert!(t.ends_with(":00:00.000Z") && !t.contains("T09:00"), "{t}");
    }
    assert!(times[0].trim_start().starts_with(&shown_local), "{}", times[0]);
    assert!(!text.contains("held fire") && !text.contains("manual fire"), "{text}");

    // show --json: the record, and the same 5 times.
    let doc = show_schedule(dir.path(), &db, "paris-morning");
    assert_eq!(doc["schedule"], *morning);
    let upcoming = doc["upcoming"].as_array().unwrap();
    assert_eq!(upcoming.len(), 5);
    assert_eq!(millis(&upcoming[0]["at"]), next);
    assert_eq!(upcoming[0]["local"], shown_local.as_str());
    assert!(upcoming[0]["utc"].as_str().unwrap().ends_with(":00:00.000Z"), "{doc}");
}

#[test]
fn show_gives_the_last_fire_its_run_and_a_held_buffer_one_fire() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    declare(&db);
    // The state a scheduler leaves after firing twice while the first run was still active:
    // one fire started, one skipped, the latest held back (buffer_one).
    let (fired, held) = with_client(&db, register, async |engine| {
        let mut record = engine.get_schedule("hourly").await.unwrap().unwrap();
        let fired = record.state.next_fire_at.unwrap() - 3 * 3_600_000;
        let held = fired + 2 * 3_600_000;
        record.state.last_fire_at = Some(fired);
        record.state.last_run_id = Some(RunId::new(format!("sched:hourly:{fired}")));
        record.state.buffered_fire = Some(held);
        (record.state.fires, record.state.skipped) = (1, 1);
        let expected = Some(record.revision);
        let saved = engine.store().save_schedule(SaveSchedule { record, expected, start: Vec::new() }).await;
        assert!(matches!(saved, Ok(durable::store::SaveOutcome::Saved(_))), "{saved:?}");
        (fired, held)
    });
    let text = run_ok(dir.path(), &["schedules", "show", "hourly", "--db", dbs]).stdout;
    let row = |name: &str| {
        text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{text}")).to_string()
    };
    assert!(row("fired").contains("1 started, 1 skipped (overlap policy), 0 missed"), "{text}");
    let last = row("last fire");
    assert!(last.contains(&format!("run sched:hourly:{fired}")) && last.contains(" UTC ("), "{last}");
    let held_row = row("held fire");
    assert!(held_row.contains(&format!("starts when run sched:hourly:{fired} ends")), "{held_row}");
    assert!(row("overlap").contains("buffer_one"), "{text}");
    assert!(text.contains("\nnext 5 fire times (UTC)\n"), "{text}");
    let doc = show_schedule(dir.path(), &db, "hourly");
    assert_eq!(millis(&doc["schedule"]["state"]["buffered_fire"]), held);
    let table = run_ok(dir.path(), &["schedules", "list", "--db", dbs]).stdout;
    assert!(line(&table, "hourly").contains(" 1/1/0 "), "{table}");

    // A fire decided ahead (its run created, due at the fire time) is not said to be past.
    let ahead = with_client(&db, register, async |engine| {
        let mut record = engine.get_schedule("hourly").await.unwrap().unwrap();
        let ahead = record.state.next_fire_at.unwrap();
        record.state.last_fire_at = Some(ahead);
        record.state.last_run_id = Some(RunId::new(format!("sched:hourly:{ahead}")));
        record.state.buffered_fire = None;
        let expected = Some(record.revision);
        let saved = engine.store().save_schedule(SaveSchedule { record, expected, start: Vec::new() }).await;
        assert!(matches!(saved, Ok(durable::store::SaveOutcome::Saved(_))), "{saved:?}");
        ahead
    });
    let text = run_ok(dir.path(), &["schedules", "show", "hourly", "--db", dbs]).stdout;
    assert!(!text.lines().any(|l| l.starts_with("last fire")), "{text}");
    let decided = text.lines().find(|l| l.starts_with("decided fire")).unwrap_or_else(|| panic!("{text}"));
    assert!(decided.contains(&format!("run sched:hourly:{ahead}, due then")) && decided.contains(", in "), "{decided}");

    // Paused before its time: that run is cancelled, and said to be.
    run_ok(dir.path(), &["schedules", "pause", "hourly", "--db", dbs]);
    let text = run_ok(dir.path(), &["schedules", "show", "hourly", "--db", dbs]).stdout;
    let decided = text.lines().find(|l| l.starts_with("decided fire")).unwrap_or_else(|| panic!("{text}"));
    assert!(
        decided.contains(&format!("run sched:hourly:{ahead} cancelled by a pause or change before its time")),
        "{decided}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_trigger_and_delete_change_the_stored_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db).to_string();
    let dbs = dbs.as_str();
    // Declared on a thread of its own: `with_client` runs a runtime of its own.
    let declared = db.clone();
    std::thread::spawn(move || declare(&declared)).join().unwrap();
    let record = |key: &str| {
        let listed = list_schedules(dir.path(), &db);
        listed.into_iter().find(|r| r["key"] == key)
    };

    // Pause: the list says so, and no scheduler looks at it (`due_at` none).
    let out = run_ok(dir.path(), &["schedules", "pause", "paris-morning", "--db", dbs]).stdout;
    assert!(out.starts_with("schedule paris-morning is paused; next fire: none while paused"), "{out}");
    let table = run_ok(dir.path(), &["schedules", "list", "--db", dbs]).stdout;
    let row = line(&table, "paris-morning");
    assert!(row.split_whitespace().any(|w| w == "yes") && row.trim_end().ends_with(" -"), "{row}");
    let paused = record("paris-morning").unwrap();
    assert_eq!(paused["schedule"]["paused"], true);
    assert!(paused["due_at"].is_null(), "{paused}");
    let out = run_ok(dir.path(), &["schedules", "pause", "paris-morning", "--db", dbs]).stdout;
    assert!(out.contains("already paused; nothing changed"), "{out}");
    assert_eq!(record("paris-morning").unwrap()["revision"], paused["revision"], "nothing written");

    // Trigger (even paused): prints the run id; the record holds the manual fire.
    let out = run_ok(dir.path(), &["schedules", "trigger", "paris-morning", "--db", dbs]).stdout;
    let run_id = out
        .split_whitespace()
        .find(|w| w.starts_with("sched:paris-morning:"))
        .unwrap_or_else(|| panic!("no run id in {out:?}"))
        .to_string();
    let at: Millis = run_id.rsplit(':').next().unwrap().parse().unwrap();
    let triggered = record("paris-morning").unwrap();
    assert_eq!(millis(&triggered["state"]["trigger_at"]), at);
    assert_eq!(millis(&triggered["due_at"]), at, "due now, although paused");
    let table = run_ok(dir.path(), &["schedules", "list", "--db", dbs]).stdout;
    assert!(line(&table, "paris-morning").contains("a manual fire, pending"), "{table}");
    let text = run_ok(dir.path(), &["schedules", "show", "paris-morning", "--db", dbs]).stdout;
    assert!(text.contains(&format!("run {run_id} starts when a worker with workflow report registered")), "{text}");

    // Resume: active again, next fire at 09:00 in Paris.
    let out = run_ok(dir.path(), &["schedules", "resume", "paris-morning", "--db", dbs]).stdout;
    assert!(out.starts_with("schedule paris-morning is active again; next fire: "), "{out}");
    assert!(out.trim_end().ends_with("a manual fire is pending too"), "{out}");
    let resumed = record("paris-morning").unwrap();
    assert_eq!(resumed["schedule"]["paused"], false);
    let next = millis(&resumed["state"]["next_fire_at"]);
    assert!(out.contains(&paris(next).format("%Y-%m-%d 09:00 %Z (in ").to_string()), "{out}");
    assert!(!resumed["due_at"].is_null());
    let out = run_ok(dir.path(), &["schedules", "resume", "paris-morning", "--db", dbs]).stdout;
    assert!(out.contains("is not paused; nothing changed"), "{out}");

    // A worker with the workflow registered starts the triggered run, with the printed id.
    let engine = Engine::builder().store(SqliteStore::open(&db).unwrap()).build().unwrap();
    // Subscribed before the workflow is registered: the scheduler fires nothing before that.
    let mut events = engine.subscribe();
    register(&engine);
    let id = RunId::new(run_id.clone());
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let EngineEvent::RunCreated { run_id, .. } = events.recv().await.expect("event stream open")
                && run_id == id
            {
                break;
            }
        }
        engine.wait_for_run(&id).await.unwrap()
    })
    .await
    .expect("the triggered run started and ended");
    assert_eq!(outcome.status(), RunStatus::Completed);
    assert_eq!(outcome.output::<String>().unwrap(), "sales");
    engine.shutdown().await;
    drop(engine);
    let fired = record("paris-morning").unwrap();
    assert!(fired["state"]["trigger_at"].is_null(), "{fired}");
    assert_eq!(fired["state"]["last_run_id"], run_id.as_str());
    let text = run_ok(dir.path(), &["schedules", "show", "paris-morning", "--db", dbs]).stdout;
    assert!(text.lines().any(|l| l.starts_with("last fire") && l.ends_with(&format!(": run {run_id}"))), "{text}");

    // Delete: says so; the run it started is kept; then the key is unknown.
    let out = run_ok(dir.path(), &["schedules", "delete", "paris-morning", "--db", dbs]).stdout;
    assert!(out.starts_with("deleted schedule paris-morning: the runs it started are kept"), "{out}");
    assert!(record("paris-morning").is_none());
    assert_eq!(show(dir.path(), &db, &run_id)["run"]["status"], "completed");
    run_bad(dir.path(), &["schedules", "delete", "paris-morning", "--db", dbs], "schedule paris-morning not found");
    let keys: Vec<Value> = list_schedules(dir.path(), &db).into_iter().map(|r| r["key"].clone()).collect();
    assert_eq!(keys, ["hourly"]);
}

#[test]
fn an_unknown_key_exits_2_naming_it_and_how_to_list_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    declare(&db);
    for command in ["show", "pause", "resume", "trigger", "delete"] {
        let err = run_bad(dir.path(), &["schedules", command, "nope", "--db", dbs], "schedule nope not found");
        assert!(err.contains("`durable schedules list`"), "{err}");
    }
    run_bad(dir.path(), &["schedules", "show", "nope", "--json", "--db", dbs], "schedule nope not found");
    run_bad(dir.path(), &["schedules", "trigger", "a\nb", "--db", dbs], r#"invalid schedule key "a\nb""#);
    run_bad(dir.path(), &["schedules", "pause", "", "--db", dbs], r#"invalid schedule key "": it is empty"#);
    // Nothing was changed or created.
    let listed = list_schedules(dir.path(), &db);
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|r| r["revision"] == 1 && r["schedule"]["paused"] == false), "{listed:?}");
}

#[test]
fn a_database_without_schedules_lists_none() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    with_client(&db, register, async |_| ());
    let out = run_ok(dir.path(), &["schedules", "list", "--db", path_str(&db)]).stdout;
    assert_eq!(out, "no schedules (workers declare them with Engine::schedule)\n");
    assert_eq!(run_ok(dir.path(), &["schedules", "list", "--json", "--db", path_str(&db)]).stdout, "");
}

#[test]
fn runs_show_gives_the_start_time_of_a_delayed_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    with_client(&db, register, async |engine| {
        let options = StartOptions::id("later").delay(Duration::from_secs(2 * 3600));
        engine.start("report", "tomorrow", options).await.unwrap();
    });
    let run = show(dir.path(), &db, "later");
    assert_eq!(run["run"]["status"], "pending");
    let start = millis(&run["run"]["wake_at"]);
    let utc =
        DateTime::<Utc>::from_timestamp_millis(start as i64).unwrap().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();

    let text = run_ok(dir.path(), &["runs", "show", "later", "--db", dbs]).stdout;
    let row = text.lines().find(|l| l.starts_with("starts at")).unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains(&format!("{utc} (in 1 h 59 min)")) || row.contains(&format!("{utc} (in 2 h 00 min)")),
        "{row}"
    );
    let waiting = text.lines().find(|l| l.starts_with("waiting on")).unwrap_or_else(|| panic!("{text}"));
    assert!(waiting.contains(&format!("its delayed start at {utc}")), "{waiting}");
    assert!(!text.contains("wake at"), "{text}");
    let table = run_ok(dir.path(), &["runs", "list", "--db", dbs]).stdout;
    assert!(line(&table, "later").contains("its delayed start at"), "{table}");
}
