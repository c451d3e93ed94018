//! Things that start runs, on the virtual clock: schedules (cadence, overlap, catch-up,
//! operations), delayed starts, event triggers with dedupe, debounce and batch.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use durable_conformance::{TestEngine, test_config};
use durable_core::{Millis, RunId, RunStatus};
use durable_runtime::{
    Clock, EngineEvent, Error, Overlap, PublishOptions, RunFilter, Schedule, StartOptions, WorkflowCtx, WorkflowError,
    WorkflowOptions,
};
use serde_json::json;
use support::StoreFixture;
use tokio::sync::broadcast;

const H: Duration = Duration::from_secs(3600);
const MIN: Duration = Duration::from_secs(60);

fn ms(d: Duration) -> Millis {
    d.as_millis() as Millis
}

/// A workflow that returns its input.
fn register_echo(t: &TestEngine) {
    t.register("echo", 1, |_ctx: WorkflowCtx, n: serde_json::Value| async move { Ok::<_, WorkflowError>(n) });
}

/// A workflow that waits for the signal named by its input.
fn register_hold(t: &TestEngine) {
    t.register("hold", 1, |ctx: WorkflowCtx, token: String| async move {
        ctx.wait_for_signal::<()>(&token).await?;
        Ok::<_, WorkflowError>(())
    });
}

/// Waits for the scheduler to save its decision on `key`; returns the runs it fired.
async fn advanced(rx: &mut broadcast::Receiver<EngineEvent>, key: &str) -> (Vec<RunId>, u64, u64, Option<Millis>) {
    loop {
        match rx.recv().await.expect("event stream open") {
            EngineEvent::ScheduleAdvanced { key: k, fired, skipped, missed, buffered } if k == key => {
                return (fired, skipped, missed, buffered);
            }
            _ => {}
        }
    }
}

/// Waits until `rx` has seen the creation of `n` runs; returns their ids.
async fn created(rx: &mut broadcast::Receiver<EngineEvent>, n: usize) -> Vec<RunId> {
    let mut ids = Vec::new();
    while ids.len() < n {
        if let EngineEvent::RunCreated { run_id, .. } = rx.recv().await.expect("event stream open") {
            ids.push(run_id);
        }
    }
    ids
}

fn fire_id(key: &str, at: Millis) -> RunId {
    RunId::new(format!("sched:{key}:{at}"))
}

async fn an_hourly_schedule_over_a_day_starts_24_runs(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    t.schedule("hourly", Schedule::every(H), "echo", &json!({"report": "sales"})).await.unwrap();
    let mut expected = BTreeSet::new();
    for h in 1..=24u64 {
        t.advance(H);
        let (fired, ..) = advanced(&mut rx, "hourly").await;
        let id = fire_id("hourly", t0 + h * ms(H));
        assert_eq!(fired, vec![id.clone()], "hour {h}");
        expected.insert(id);
    }
    for id in &expected {
        assert_eq!(
            t.wait_for_run(id).await.unwrap().output::<serde_json::Value>().unwrap(),
            json!({"report": "sales"})
        );
    }
    let filter = RunFilter { tag: Some("schedule:hourly".into()), limit: 100, ..Default::default() };
    let listed: BTreeSet<RunId> = t.list_runs(&filter).await.unwrap().runs.into_iter().map(|r| r.id).collect();
    assert_eq!(listed, expected, "exactly 24 runs, one per fire");
    let record = t.get_schedule("hourly").await.unwrap().expect("stored");
    assert_eq!(record.state.fires, 24);
}

async fn overlap_skip_starts_nothing_while_the_last_run_is_active(store: StoreFixture) {
    let t = store.engine();
    register_hold(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    t.schedule("skipper", Schedule::every(MIN).overlap(Overlap::Skip), "hold", &"go-skip").await.unwrap();
    t.advance(MIN);
    let (fired, ..) = advanced(&mut rx, "skipper").await;
    let first = fire_id("skipper", t0 + ms(MIN));
    assert_eq!(fired, vec![first.clone()]);
    t.wait_until_suspended_or_terminal(&first).await.unwrap();
    t.advance(MIN);
    let (fired, skipped, ..) = advanced(&mut rx, "skipper").await;
    assert_eq!((fired, skipped), (vec![], 1), "the first run is still waiting: skipped");
    t.signal("go-skip", &()).await.unwrap();
    t.wait_for_run(&first).await.unwrap();
    t.advance(MIN);
    let (fired, skipped, ..) = advanced(&mut rx, "skipper").await;
    assert_eq!((fired, skipped), (vec![fire_id("skipper", t0 + 3 * ms(MIN))], 1));
}

async fn overlap_buffer_one_starts_one_after_the_last_run_ends(store: StoreFixture) {
    let t = store.engine();
    register_hold(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    t.schedule("buffered", Schedule::every(MIN).overlap(Overlap::BufferOne), "hold", &"go-buf").await.unwrap();
    t.advance(MIN);
    let first = fire_id("buffered", t0 + ms(MIN));
    assert_eq!(advanced(&mut rx, "buffered").await.0, vec![first.clone()]);
    t.wait_until_suspended_or_terminal(&first).await.unwrap();
    t.advance(MIN);
    let (fired, _, _, held) = advanced(&mut rx, "buffered").await;
    assert_eq!((fired, held), (vec![], Some(t0 + 2 * ms(MIN))), "held back, not started");
    // A third fire while still active: still one held (the newest), one skipped.
    t.advance(MIN);
    let (fired, skipped, _, held) = advanced(&mut rx, "buffered").await;
    assert_eq!((fired, skipped, held), (vec![], 1, Some(t0 + 3 * ms(MIN))));
    t.signal("go-buf", &()).await.unwrap();
    t.wait_for_run(&first).await.unwrap();
    // The held fire is looked at again within a second.
    t.advance(Duration::from_secs(1));
    let (fired, _, _, held) = advanced(&mut rx, "buffered").await;
    assert_eq!((fired, held), (vec![fire_id("buffered", t0 + 3 * ms(MIN))], None), "started once the first ended");
}

async fn after_downtime_at_most_max_catchup_missed_fires_start(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let t0 = t.clock().now();
    t.schedule("catchup", Schedule::every(H).max_catchup(2), "echo", &1).await.unwrap();
    t.schedule("no-backfill", Schedule::every(H), "echo", &2).await.unwrap();
    let (shared, clock) = (t.shared_store(), t.clock().clone());
    t.engine().shutdown().await;
    // Down for five and a half hours: the fires of hours 1 to 5 are missed.
    clock.advance(5 * H + H / 2);
    let t = TestEngine::with_parts(shared, clock, test_config());
    let mut rx = t.subscribe();
    register_echo(&t);
    let mut seen = std::collections::HashMap::new();
    while seen.len() < 2 {
        let event = rx.recv().await.expect("event stream open");
        if let EngineEvent::ScheduleAdvanced { key, fired, missed, .. } = event {
            seen.insert(key, (fired, missed));
        }
    }
    assert_eq!(seen["catchup"], (vec![fire_id("catchup", t0 + 4 * ms(H)), fire_id("catchup", t0 + 5 * ms(H))], 3));
    assert_eq!(seen["no-backfill"], (vec![], 5));
    let next = t.get_schedule("no-backfill").await.unwrap().unwrap().state.next_fire_at;
    assert_eq!(next, Some(t0 + 6 * ms(H)), "it carries on with the next fire");
}

async fn bad_schedules_are_refused_by_name_and_nothing_is_saved(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let cases = [
        ("bad-cron", Schedule::cron("0 25 * * *"), "\"0 25 * * *\""),
        ("bad-zone", Schedule::cron("0 9 * * *").timezone("Europe/Atlantis"), "Europe/Atlantis"),
        ("zero", Schedule::every(Duration::ZERO), "interval of zero"),
        ("never", Schedule::cron("0 0 30 2 *"), "matches no time"),
        ("past", Schedule::cron("0 0 0 1 1 * 2020"), "only years that have passed"),
        ("far", Schedule::every(Duration::MAX), "after the year 9999"),
    ];
    for (key, schedule, named) in cases {
        let err = t.schedule(key, schedule, "echo", &1).await.unwrap_err();
        assert!(matches!(&err, Error::BadSchedule { key: k, .. } if k == key), "{err}");
        assert!(err.to_string().contains(named), "{err}");
        assert!(err.to_string().contains(key), "{err}");
        assert_eq!(t.get_schedule(key).await.unwrap(), None, "nothing saved");
    }
    let err = t.schedule("k", Schedule::every(H), "nope", &1).await.unwrap_err();
    assert!(matches!(err, Error::UnknownWorkflow { .. }), "{err}");
    for key in ["", " "] {
        let err = t.schedule(key, Schedule::every(H), "echo", &1).await.unwrap_err();
        assert!(matches!(err, Error::BadSchedule { .. }), "{key:?}: {err}");
    }
    assert!(matches!(t.pause_schedule("missing").await.unwrap_err(), Error::ScheduleNotFound { .. }));
    assert!(t.list_schedules().await.unwrap().is_empty());
}

async fn schedules_are_paused_resumed_triggered_updated_and_deleted(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    let first = t.schedule("ops", Schedule::every(H), "echo", &1).await.unwrap();
    // Declaring the same again changes nothing.
    let again = t.schedule("ops", Schedule::every(H), "echo", &1).await.unwrap();
    assert_eq!(again.revision, first.revision);
    let paused = t.pause_schedule("ops").await.unwrap();
    assert_eq!(paused.due_at, None);
    // Declaring it again (the next deploy) keeps the operator's pause.
    let redeclared = t.schedule("ops", Schedule::every(H), "echo", &1).await.unwrap();
    assert!(redeclared.schedule.paused && redeclared.due_at.is_none(), "{redeclared:?}");
    // A manual fire starts even while paused.
    let manual = t.trigger_schedule("ops").await.unwrap();
    assert_eq!(manual, fire_id("ops", t0));
    assert_eq!(advanced(&mut rx, "ops").await.0, vec![manual.clone()]);
    t.wait_for_run(&manual).await.unwrap();
    // Paused through two hours: nothing fires; resumed, the next hour does.
    t.advance(2 * H + MIN);
    let resumed = t.resume_schedule("ops").await.unwrap();
    assert_eq!(resumed.state.next_fire_at, Some(t0 + 3 * ms(H)), "the paused fires are skipped");
    let updated = t.update_schedule("ops", Schedule::every(MIN)).await.unwrap();
    assert_eq!(updated.state.next_fire_at, Some(t0 + 2 * ms(H) + 2 * ms(MIN)), "a new cadence counts from now");
    let listed = t.list_schedules().await.unwrap();
    assert_eq!(listed.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["ops"]);
    assert!(t.delete_schedule("ops").await.unwrap());
    assert!(!t.delete_schedule("ops").await.unwrap());
    t.advance(H);
    assert_eq!(t.get_run(&manual).await.unwrap().map(|r| r.status), Some(RunStatus::Completed), "runs are kept");
}

/// A manual fire asked for again before its run exists stands: both calls answer its run id,
/// and that run — the only one — is created once an engine executes runs (before, the second
/// call replaced the first fire, whose promised run never came).
async fn two_quick_triggers_start_the_first_fires_run_once(store: StoreFixture) {
    // Only a client while the schedule is triggered: no scheduler can create the first fire's
    // run between the two calls.
    let mut config = test_config();
    config.execute = false;
    let client = TestEngine::with_parts(store.store.clone(), durable_runtime::VirtualClock::starting_2026(), config);
    register_echo(&client);
    client.schedule("ops", Schedule::every(H).paused(true), "echo", &7).await.unwrap();
    let t0 = client.clock().now();
    let first = client.trigger_schedule("ops").await.unwrap();
    let revision = client.list_schedules().await.unwrap()[0].revision;
    client.advance(Duration::from_millis(5));
    let second = client.trigger_schedule("ops").await.unwrap();
    assert_eq!(client.list_schedules().await.unwrap()[0].revision, revision, "the second call wrote nothing");
    assert_eq!((first.clone(), second), (fire_id("ops", t0), fire_id("ops", t0)), "the first fire stands");
    // A worker creates it (its scheduler may look before anything here could subscribe to its
    // events: wait for the run itself; the timeout is a hang guard).
    let worker = TestEngine::with_parts(store.store.clone(), client.clock().clone(), test_config());
    register_echo(&worker);
    worker.advance(Duration::from_secs(2));
    let exists = async {
        while worker.get_run(&first).await.unwrap().is_none() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), exists).await.expect("the first fire's run is created");
    assert_eq!(worker.wait_for_run(&first).await.unwrap().output::<serde_json::Value>().unwrap(), json!(7));
    let filter = RunFilter { workflow: Some("echo".into()), limit: 100, ..Default::default() };
    assert_eq!(worker.list_runs(&filter).await.unwrap().runs.len(), 1, "one run for two triggers");
    client.shutdown().await;
}

async fn two_engines_firing_one_schedule_start_each_fire_once(store: StoreFixture) {
    let a = store.engine();
    let b = a.sibling();
    register_echo(&a);
    register_echo(&b);
    let t0 = a.clock().now();
    let (mut rx_a, mut rx_b) = (a.subscribe(), b.subscribe());
    a.schedule("shared", Schedule::every(MIN), "echo", &0).await.unwrap();
    let mut fired = 0;
    for m in 1..=10u64 {
        a.advance(MIN);
        // Whichever engine saves first fires it; the other's save is stale.
        let id = fire_id("shared", t0 + m * ms(MIN));
        let (by_a, by_b) = tokio::select! {
            f = advanced(&mut rx_a, "shared") => (f.0, vec![]),
            f = advanced(&mut rx_b, "shared") => (vec![], f.0),
        };
        assert_eq!([by_a, by_b].concat(), vec![id.clone()], "minute {m}");
        fired += 1;
        a.wait_for_run(&id).await.unwrap();
    }
    let filter = RunFilter { tag: Some("schedule:shared".into()), limit: 100, ..Default::default() };
    let runs = a.list_runs(&filter).await.unwrap().runs;
    assert_eq!(runs.len(), 10, "one run per fire");
    assert_eq!(a.get_schedule("shared").await.unwrap().unwrap().state.fires, 10, "each fire counted once");
    // Neither engine saved a fire twice.
    for rx in [&mut rx_a, &mut rx_b] {
        while let Ok(event) = rx.try_recv() {
            if let EngineEvent::ScheduleAdvanced { fired: f, .. } = event {
                fired += f.len();
            }
        }
    }
    assert_eq!(fired, 10);
}

async fn fires_are_decided_ahead_start_at_their_time_and_a_pause_cancels_them(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    t.schedule("ahead", Schedule::every(H), "echo", &1).await.unwrap();
    t.schedule("paused-ahead", Schedule::every(H), "echo", &2).await.unwrap();
    // Three seconds before the fire: both are decided, their runs wait for the fire time.
    t.advance(H - Duration::from_secs(3));
    let mut decided = std::collections::HashMap::new();
    while decided.len() < 2 {
        let (key, fired) = match rx.recv().await.expect("event stream open") {
            EngineEvent::ScheduleAdvanced { key, fired, .. } => (key, fired),
            _ => continue,
        };
        decided.insert(key, fired);
    }
    let (ahead, paused) = (fire_id("ahead", t0 + ms(H)), fire_id("paused-ahead", t0 + ms(H)));
    assert_eq!((&decided["ahead"], &decided["paused-ahead"]), (&vec![ahead.clone()], &vec![paused.clone()]));
    let run = t.get_run(&ahead).await.unwrap().unwrap();
    assert_eq!((run.status, run.wake_at), (RunStatus::Pending, Some(t0 + ms(H))), "due at the fire time");
    t.pause_schedule("paused-ahead").await.unwrap();
    assert_eq!(t.get_run(&paused).await.unwrap().unwrap().status, RunStatus::Cancelled, "a pause cancels it");
    assert_eq!(t.get_schedule("paused-ahead").await.unwrap().unwrap().state.fires, 0, "and uncounts it");
    t.advance(Duration::from_secs(3));
    assert_eq!(t.wait_for_run(&ahead).await.unwrap().output::<i32>().unwrap(), 1);
    let run = t.get_run(&ahead).await.unwrap().unwrap();
    assert!(run.updated_at >= t0 + ms(H), "it ran at its time, not before");
    assert_eq!(t.get_run(&paused).await.unwrap().unwrap().status, RunStatus::Cancelled);
}

async fn a_fire_cancelled_by_a_pause_is_decided_again_by_a_resume_before_its_time(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    t.schedule("again", Schedule::every(H), "echo", &3).await.unwrap();
    t.advance(H - Duration::from_secs(3));
    let (fired, ..) = advanced(&mut rx, "again").await;
    let first = fire_id("again", t0 + ms(H));
    assert_eq!(fired, vec![first.clone()]);
    // Paused and resumed twice before the fire's time: each pause cancels the run decided
    // for it, each resume decides it again with a run of its own.
    let mut cancelled = vec![first];
    for n in 1..=2 {
        t.pause_schedule("again").await.unwrap();
        let last = cancelled.last().unwrap();
        assert_eq!(t.get_run(last).await.unwrap().unwrap().status, RunStatus::Cancelled, "{last}");
        t.resume_schedule("again").await.unwrap();
        let (fired, ..) = advanced(&mut rx, "again").await;
        let again = RunId::new(format!("sched:again:{}~{n}", t0 + ms(H)));
        assert_eq!(fired, vec![again.clone()], "resume {n}");
        assert_eq!(t.get_run(&again).await.unwrap().unwrap().status, RunStatus::Pending);
        cancelled.push(again);
    }
    let runs = cancelled.pop().unwrap();
    t.advance(Duration::from_secs(3));
    assert_eq!(t.wait_for_run(&runs).await.unwrap().output::<i32>().unwrap(), 3, "the fire ran at its time");
    for id in &cancelled {
        assert_eq!(t.get_run(id).await.unwrap().unwrap().status, RunStatus::Cancelled, "{id}");
    }
    let state = t.get_schedule("again").await.unwrap().unwrap().state;
    assert_eq!((state.last_run_id, state.fires), (Some(runs), 1), "the fire counted once, not once per decision");

    // Deleted and declared again before a fire's time: the new schedule's fire gets a run of
    // its own too.
    t.schedule("redo", Schedule::every(H), "echo", &4).await.unwrap();
    // From the first fire's time to 3 s before the next.
    t.advance(H - Duration::from_secs(3));
    let (fired, ..) = advanced(&mut rx, "redo").await;
    let next = t0 + 2 * ms(H);
    assert_eq!(fired, vec![fire_id("redo", next)]);
    assert!(t.delete_schedule("redo").await.unwrap());
    assert_eq!(t.get_run(&fire_id("redo", next)).await.unwrap().unwrap().status, RunStatus::Cancelled);
    t.schedule("redo", Schedule::every(H), "echo", &5).await.unwrap();
    let (fired, ..) = advanced(&mut rx, "redo").await;
    let again = RunId::new(format!("sched:redo:{next}~1"));
    assert_eq!(fired, vec![again.clone()]);
    t.advance(Duration::from_secs(3));
    assert_eq!(t.wait_for_run(&again).await.unwrap().output::<i32>().unwrap(), 5);
}

async fn a_new_cadence_cancels_the_fires_ahead_it_does_not_share(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let t0 = t.clock().now();
    let mut rx = t.subscribe();
    // Schedules whose fire at t0 + H is decided 3 s before it; then, before that time, one
    // gets a new cadence through `update_schedule`, one is declared again with a new workflow
    // and cadence (a deploy), one gets a cadence that fires at t0 + H too, one is declared
    // again with a new input only.
    let keys = ["updated", "redeclared", "halved", "new-input"];
    for key in keys {
        t.schedule(key, Schedule::every(H), "echo", &1).await.unwrap();
    }
    t.advance(H - Duration::from_secs(3));
    let mut decided = BTreeSet::new();
    while decided.len() < keys.len() {
        if let EngineEvent::ScheduleAdvanced { key, fired, .. } = rx.recv().await.expect("event stream open") {
            assert_eq!(fired, vec![fire_id(&key, t0 + ms(H))]);
            decided.insert(key);
        }
    }
    register_hold(&t);
    let updated = t.update_schedule("updated", Schedule::every(2 * H)).await.unwrap();
    let redeclared = t.schedule("redeclared", Schedule::every(3 * H), "hold", &"never").await.unwrap();
    t.update_schedule("halved", Schedule::every(H / 2)).await.unwrap();
    t.schedule("new-input", Schedule::every(H), "echo", &2).await.unwrap();
    for (key, record) in [("updated", &updated), ("redeclared", &redeclared)] {
        let run = t.get_run(&fire_id(key, t0 + ms(H))).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Cancelled, "{key}: the old cadence's fire is cancelled");
        let message = run.error.map(|e| e.message).unwrap_or_default();
        assert!(message.contains("was changed before this fire's time"), "{key}: {message}");
        assert!(record.state.next_fire_at.expect("a next fire") > t0 + ms(H), "{key}");
    }
    // A cadence that fires at t0 + H too, or a new input alone, leaves the decided fire to
    // start as decided (once), with the input it had.
    for key in ["halved", "new-input"] {
        let kept = fire_id(key, t0 + ms(H));
        assert_eq!(t.get_run(&kept).await.unwrap().unwrap().status, RunStatus::Pending, "{key}");
    }
    t.advance(Duration::from_secs(3));
    for key in ["halved", "new-input"] {
        let kept = fire_id(key, t0 + ms(H));
        assert_eq!(t.wait_for_run(&kept).await.unwrap().output::<i32>().unwrap(), 1, "{key}");
    }
    for key in ["updated", "redeclared"] {
        assert_eq!(t.get_run(&fire_id(key, t0 + ms(H))).await.unwrap().unwrap().status, RunStatus::Cancelled);
    }
    // Counted as they went: the cancelled fires not at all, a kept one once (the new cadence
    // counts on after it, not from the change).
    for (key, fires) in [("updated", 0), ("redeclared", 0), ("halved", 1), ("new-input", 1)] {
        let state = t.get_schedule(key).await.unwrap().unwrap().state;
        assert_eq!(state.fires, fires, "{key}: {state:?}");
    }
    let halved = t.get_schedule("halved").await.unwrap().unwrap().state;
    assert_eq!(halved.next_fire_at, Some(t0 + ms(H) + ms(H / 2)));
}

async fn a_delayed_start_waits_pending_then_completes(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let now = t.clock().now();
    let month = Duration::from_secs(30 * 86_400);
    let started = t.start("echo", &5, StartOptions::id("later").delay(month)).await.unwrap();
    assert_eq!((started.run.status, started.run.wake_at), (RunStatus::Pending, Some(now + ms(month))));
    t.advance(month - MIN);
    let run = t.get_run(&started.id).await.unwrap().unwrap();
    assert_eq!((run.status, run.wake_at), (RunStatus::Pending, Some(now + ms(month))), "not before its time");
    t.advance(MIN);
    assert_eq!(t.wait_for_run(&started.id).await.unwrap().output::<i32>().unwrap(), 5);
    // A start time in the past starts at once.
    let past = t.start("echo", &6, StartOptions::id("past").start_at(now)).await.unwrap();
    assert_eq!(past.run.wake_at, None);
    assert_eq!(t.wait_for_run(&past.id).await.unwrap().output::<i32>().unwrap(), 6);
    // A start after the year 9999 is a mistake: refused by name, nothing written.
    for (id, options) in [
        ("max", StartOptions::id("max").start_at(u64::MAX)),
        ("forever", StartOptions::id("forever").delay(Duration::MAX)),
    ] {
        let err = t.start("echo", &7, options).await.unwrap_err();
        assert!(matches!(&err, Error::StartTooLate { workflow, .. } if workflow == "echo"), "{err}");
        assert!(err.to_string().contains("after the year 9999"), "{err}");
        assert_eq!(t.get_run(&RunId::new(id)).await.unwrap(), None, "{id}: nothing written");
    }
    t.start("echo", &8, StartOptions::id("last-year").start_at(durable_core::LATEST_START))
        .await
        .expect("9999 is fine");
}

async fn a_delayed_start_survives_a_restart(store: StoreFixture) {
    let t = store.engine();
    register_echo(&t);
    let started = t.start("echo", &7, StartOptions::id("later").delay(H)).await.unwrap();
    let t = t.restart().await;
    register_echo(&t);
    t.advance(H);
    assert_eq!(t.wait_for_run(&started.id).await.unwrap().output::<i32>().unwrap(), 7);
}

async fn each_matching_event_starts_one_run_and_a_dedupe_id_starts_once(store: StoreFixture) {
    let t = store.engine();
    t.register_with(
        "on-paid",
        1,
        WorkflowOptions::default().on_event("order.paid", json!({"region": "eu"})),
        |_ctx: WorkflowCtx, order: serde_json::Value| async move { Ok::<_, WorkflowError>(order["id"].clone()) },
    );
    let p = t.publish("order.paid", &json!({"id": 1, "region": "eu"}), PublishOptions::dedupe("pay-1")).await.unwrap();
    assert_eq!(p.started.len(), 1, "{p:?}");
    assert!(p.started[0].as_str().starts_with("evt:on-paid:"), "{p:?}");
    assert_eq!(t.wait_for_run(&p.started[0]).await.unwrap().output::<i32>().unwrap(), 1);
    let again =
        t.publish("order.paid", &json!({"id": 1, "region": "eu"}), PublishOptions::dedupe("pay-1")).await.unwrap();
    assert!(again.duplicate && again.started.is_empty(), "{again:?}");
    // Not matching: nothing starts. Without a dedupe id: a run each.
    let other = t.publish("order.paid", &json!({"id": 2, "region": "us"}), PublishOptions::default()).await.unwrap();
    assert!(other.started.is_empty());
    let a = t.publish("order.paid", &json!({"id": 3, "region": "eu"}), PublishOptions::default()).await.unwrap();
    let b = t.publish("order.paid", &json!({"id": 3, "region": "eu"}), PublishOptions::default()).await.unwrap();
    assert_eq!((a.started.len(), b.started.len()), (1, 1));
    assert_ne!(a.started, b.started);
    // A payload the workflow cannot take is refused, naming it; nothing is published.
    t.register_with(
        "typed",
        1,
        WorkflowOptions::default().on_event("typed.evt", json!({})),
        |_ctx: WorkflowCtx, n: u32| async move { Ok::<_, WorkflowError>(n) },
    );
    let err = t.publish("typed.evt", &"not a number", PublishOptions::dedupe("t-1")).await.unwrap_err();
    assert!(matches!(&err, Error::InvalidInput { workflow, .. } if workflow == "typed"), "{err}");
    let ok = t.publish("typed.evt", &4u32, PublishOptions::dedupe("t-1")).await.unwrap();
    assert!(!ok.duplicate, "the refused publish recorded nothing");
}

/// A dedupe id dedupes one event name's publishes within the window, nothing more: the same id
/// on another event, each of two triggers of a workflow that an event matches, and the same id
/// past its window start their runs.
async fn a_dedupe_id_starts_each_trigger_once_per_event_and_window(store: StoreFixture) {
    let t = store.engine();
    let options = WorkflowOptions::default()
        .on_event("a", json!({}))
        .on_event("b", json!({}))
        .on_event("both", json!({"x": 1}))
        .on_event("both", json!({"y": 2}));
    t.register_with(
        "on",
        1,
        options,
        |_ctx: WorkflowCtx, e: serde_json::Value| async move { Ok::<_, WorkflowError>(e) },
    );
    let publish = |name: &'static str, payload: serde_json::Value, options: PublishOptions| {
        let t = &t;
        async move { t.publish(name, &payload, options).await.unwrap() }
    };
    let a = publish("a", json!({"n": 1}), PublishOptions::dedupe("same")).await;
    let b = publish("b", json!({"n": 2}), PublishOptions::dedupe("same")).await;
    assert_eq!((a.started.len(), b.started.len(), b.duplicate), (1, 1, false), "{a:?} {b:?}");
    assert_ne!(a.started, b.started);
    let both = publish("both", json!({"x": 1, "y": 2}), PublishOptions::dedupe("m1")).await;
    assert_eq!(both.started.len(), 2, "one run per matching trigger: {both:?}");
    let short = PublishOptions::dedupe("win").dedupe_window(Duration::from_secs(1));
    let first = publish("a", json!({"n": 3}), short.clone()).await;
    assert!(publish("a", json!({"n": 3}), short.clone()).await.duplicate, "within the window");
    t.advance(Duration::from_secs(2));
    let later = publish("a", json!({"n": 4}), short).await;
    assert_eq!((later.duplicate, later.started.len()), (false, 1), "past the window: {later:?}");
    assert_ne!(first.started, later.started);
    for id in [&a.started[0], &b.started[0], &both.started[0], &both.started[1], &later.started[0]] {
        t.wait_for_run(id).await.unwrap();
    }
    assert_eq!(
        t.wait_for_run(&later.started[0]).await.unwrap().output::<serde_json::Value>().unwrap(),
        json!({"n": 4})
    );
}

async fn a_debounce_starts_one_run_with_the_last_payload(store: StoreFixture) {
    let t = store.engine();
    t.register_with(
        "settle",
        1,
        WorkflowOptions::default().on_event("cart.changed", json!({})).debounce(Duration::from_secs(1)).key_by("cart"),
        |_ctx: WorkflowCtx, last: serde_json::Value| async move { Ok::<_, WorkflowError>(last) },
    );
    let mut rx = t.subscribe();
    for i in 0..100 {
        let p = t.publish_event("cart.changed", &json!({"cart": "c1", "n": i})).await.unwrap();
        assert!(p.is_empty());
        t.advance(Duration::from_millis(10));
    }
    // 990 ms after the first, 0 after the last: quiet for a second from the last one.
    t.advance(Duration::from_millis(990));
    let ids = created(&mut rx, 1).await;
    let out = t.wait_for_run(&ids[0]).await.unwrap().output::<serde_json::Value>().unwrap();
    assert_eq!(out, json!({"cart": "c1", "n": 99}));
    let filter = RunFilter { workflow: Some("settle".into()), limit: 100, ..Default::default() };
    assert_eq!(t.list_runs(&filter).await.unwrap().runs.len(), 1, "one run for 100 events");
}

async fn a_batch_starts_runs_of_at_most_max_items(store: StoreFixture) {
    let t = store.engine();
    t.register_with(
        "bulk",
        1,
        WorkflowOptions::default().on_event("order", json!({})).batch(10, Duration::from_secs(5)),
        |_ctx: WorkflowCtx, orders: Vec<u32>| async move { Ok::<_, WorkflowError>(orders) },
    );
    let mut rx = t.subscribe();
    let mut started = Vec::new();
    for i in 0..25u32 {
        started.extend(t.publish("order", &i, PublishOptions::default()).await.unwrap().started);
    }
    assert_eq!(started.len(), 2, "two full batches start with the event that fills them");
    let full = created(&mut rx, 2).await;
    assert_eq!(full, started);
    t.advance(Duration::from_secs(5));
    let last = created(&mut rx, 1).await;
    let mut outputs = Vec::new();
    for id in started.iter().chain(&last) {
        outputs.push(t.wait_for_run(id).await.unwrap().output::<Vec<u32>>().unwrap());
    }
    assert_eq!(outputs, vec![(0..10).collect::<Vec<_>>(), (10..20).collect(), (20..25).collect()]);
}

on_every_store!(
    an_hourly_schedule_over_a_day_starts_24_runs,
    overlap_skip_starts_nothing_while_the_last_run_is_active,
    overlap_buffer_one_starts_one_after_the_last_run_ends,
    after_downtime_at_most_max_catchup_missed_fires_start,
    bad_schedules_are_refused_by_name_and_nothing_is_saved,
    schedules_are_paused_resumed_triggered_updated_and_deleted,
    two_quick_triggers_start_the_first_fires_run_once,
    two_engines_firing_one_schedule_start_each_fire_once,
    fires_are_decided_ahead_start_at_their_time_and_a_pause_cancels_them,
    a_new_cadence_cancels_the_fires_ahead_it_does_not_share,
    a_fire_cancelled_by_a_pause_is_decided_again_by_a_resume_before_its_time,
    a_delayed_start_waits_pending_then_completes,
    a_delayed_start_survives_a_restart,
    each_matching_event_starts_one_run_and_a_dedupe_id_starts_once,
    a_dedupe_id_starts_each_trigger_once_per_event_and_window,
    a_debounce_starts_one_run_with_the_last_payload,
    a_batch_starts_runs_of_at_most_max_items,
);
