//! The schedule commands: `schedules list | show | pause | resume | trigger | delete`.
//!
//! They read and change the stored schedules through a client engine (see
//! [`with_operator_engine`]) and never start a run themselves: a fire's run is created by the
//! scheduler of a worker with the schedule's workflow registered. Fire times are shown in the
//! schedule's own time zone (the zone its cron fields are read in), and in UTC where both help.

use std::io::Write;

use durable::{Cadence, Engine, Millis, Overlap, ScheduleRecord};
use serde_json::json;

use crate::cli::{ScheduleKeyArgs, ScheduleListArgs, ScheduleShowArgs, StoreArgs};
use crate::error::{Error, Result};
use crate::format::{Table, ago, duration_ms, interval, now_ms, timestamp, truncate, zoned};
use crate::store::{Access, with_operator_engine};

/// How many fire times `show` lists.
const UPCOMING: usize = 5;

/// A schedule key from the command line: refused before opening the store when no schedule
/// can have it (the engine refuses to declare an empty key or one with control characters).
fn check_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "it is empty"
    } else if key.chars().any(char::is_control) {
        "it contains a control character"
    } else {
        return Ok(());
    };
    Err(Error::bad(format!("invalid schedule key {key:?}: {reason}; use a non-empty key without control characters")))
}

fn not_found(key: &str) -> Error {
    Error::bad(format!(
        "schedule {} not found (list the schedules with `durable schedules list`, or check --db / --url)",
        Error::shown(key)
    ))
}

/// Reads a schedule that must exist.
async fn require(engine: &Engine, key: &str) -> Result<ScheduleRecord> {
    engine.get_schedule(key).await?.ok_or_else(|| not_found(key))
}

/// The outcome of an engine call on schedule `key`: the engine's own "not found" (the schedule
/// was deleted meanwhile) says the same as [`not_found`].
fn found<T>(key: &str, result: durable::Result<T>) -> Result<T> {
    match result {
        Err(durable::Error::ScheduleNotFound { .. }) => Err(not_found(key)),
        other => Ok(other?),
    }
}

/// `0 9 * * MON-FRI (Europe/Paris)`, or `every 1h`.
fn cadence(record: &ScheduleRecord) -> String {
    match &record.schedule.cadence {
        Cadence::Cron { expr } => format!("{expr} ({})", record.schedule.timezone),
        Cadence::Every { every_ms } => format!("every {}", interval(*every_ms)),
        other => format!("{other:?}"),
    }
}

/// The next fire of the cadence: none while paused, or when the cadence has ended.
fn next_fire(record: &ScheduleRecord) -> Option<Millis> {
    if record.schedule.paused { None } else { record.state.next_fire_at }
}

/// `2026-12-01 09:00 CET (in 5 h 02 min)` in the schedule's zone; a time already passed is
/// `(due 3 h ago)`: no scheduler has looked at the schedule since (no worker with its
/// workflow registered was running).
fn when(record: &ScheduleRecord, at: Millis, now: Millis) -> String {
    let local = zoned(at, &record.schedule.timezone);
    if at > now { format!("{local} ({})", ago(at, now)) } else { format!("{local} (due {})", ago(at, now)) }
}

/// The next fire in words, for `pause`, `resume` and `show`.
fn next_fire_text(record: &ScheduleRecord, now: Millis) -> String {
    match (record.schedule.paused, next_fire(record)) {
        (true, _) => "none while paused".into(),
        (false, Some(at)) => when(record, at, now),
        (false, None) => "none: the cadence has no more fires".into(),
    }
}

/// `durable schedules list`.
pub(crate) async fn list(store: &StoreArgs, args: &ScheduleListArgs, out: &mut dyn Write) -> Result<()> {
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let schedules = engine.list_schedules().await?;
        if args.json {
            for record in &schedules {
                let line = serde_json::to_string(record)
                    .map_err(|e| Error::failed(format!("encoding schedule {}: {e}", record.key)))?;
                writeln!(out, "{line}")?;
            }
            return Ok(());
        }
        if schedules.is_empty() {
            writeln!(out, "no schedules (workers declare them with Engine::schedule)")?;
            return Ok(());
        }
        let now = now_ms();
        let mut table = Table::new(&["KEY", "WORKFLOW", "CADENCE", "PAUSED", "FIRES/SKIPPED/MISSED", "NEXT FIRE"]);
        for record in &schedules {
            let st = &record.state;
            let next = next_fire(record).map_or_else(|| "-".to_string(), |at| when(record, at, now));
            let next = match (st.trigger_at, next.as_str()) {
                (Some(_), "-") => "a manual fire, pending".to_string(),
                (Some(_), _) => format!("a manual fire, pending; then {next}"),
                (None, _) => next,
            };
            table.row(vec![
                record.key.clone(),
                record.workflow.clone(),
                truncate(&cadence(record), 48),
                if record.schedule.paused { "yes" } else { "no" }.into(),
                format!("{}/{}/{}", st.fires, st.skipped, st.missed),
                next,
            ]);
        }
        table.write(out, "")?;
        Ok(())
    })
    .await
}

/// `durable schedules show`.
pub(crate) async fn show(store: &StoreArgs, args: &ScheduleShowArgs, out: &mut dyn Write) -> Result<()> {
    check_key(&args.key)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let record = require(&engine, &args.key).await?;
        let now = now_ms();
        // A definition this build cannot read (a zone or expression from a newer one) still
        // shows; only its upcoming fires are missing.
        let upcoming = record.schedule.upcoming(now, UPCOMING);
        if args.json {
            let upcoming: Vec<serde_json::Value> = upcoming
                .unwrap_or_default()
                .into_iter()
                .map(|at| json!({ "at": at, "local": zoned(at, &record.schedule.timezone), "utc": timestamp(at) }))
                .collect();
            let doc = json!({ "schedule": record, "upcoming": upcoming });
            let text = serde_json::to_string_pretty(&doc)
                .map_err(|e| Error::failed(format!("encoding schedule {}: {e}", record.key)))?;
            writeln!(out, "{text}")?;
            return Ok(());
        }
        write_schedule(out, &record, upcoming, now)?;
        Ok(())
    })
    .await
}

fn write_schedule(
    out: &mut dyn Write,
    record: &ScheduleRecord,
    upcoming: std::result::Result<Vec<Millis>, durable::ScheduleError>,
    now: Millis,
) -> Result<()> {
    let (s, st) = (&record.schedule, &record.state);
    let zone = s.timezone.as_str();
    let local_and_utc = |at: Millis| format!("{} ({}, {})", zoned(at, zone), timestamp(at), ago(at, now));
    let mut fields = Table::new(&["schedule", record.key.as_str()]);
    fields
        .row(vec!["workflow".into(), format!("{} (its newest version on the worker that fires it)", record.workflow)]);
    fields.row(vec!["namespace".into(), record.namespace.clone()]);
    fields.row(vec!["input".into(), truncate(record.input.as_str(), 200)]);
    fields.row(vec!["cadence".into(), cadence(record)]);
    fields.row(vec!["time zone".into(), zone.to_string()]);
    let overlap = match s.overlap {
        Overlap::Allow => "allow (a fire starts even while the previous run is active)",
        Overlap::Skip => "skip (no fire starts while the previous run is active)",
        Overlap::BufferOne => "buffer_one (one fire is held back until the previous run ends)",
        _ => "(a policy this build does not know)",
    };
    fields.row(vec!["overlap".into(), overlap.into()]);
    fields.row(vec![
        "jitter".into(),
        if s.jitter_ms == 0 {
            "none".into()
        } else {
            format!("each run starts up to {} late", duration_ms(s.jitter_ms))
        },
    ]);
    fields.row(vec![
        "catch-up".into(),
        match s.max_catchup {
            0 => "none: fires missed while no worker ran are not started".into(),
            n => format!("the {n} most recent fires missed while no worker ran are started"),
        },
    ]);
    fields.row(vec!["misfire grace".into(), duration_ms(s.misfire_grace_ms)]);
    fields.row(vec![
        "status".into(),
        if s.paused { "paused (fires nothing until resumed)".into() } else { "active".to_string() },
    ]);
    fields.row(vec![
        "fired".into(),
        format!(
            "{} started, {} skipped (overlap policy), {} missed (no worker ran in time)",
            st.fires, st.skipped, st.missed
        ),
    ]);
    // The scheduler decides a fire (and creates its run, due then) a few seconds ahead: one
    // still to come is said to be decided, not done.
    let ahead = st.last_fire_at.is_some_and(|at| at > now);
    fields.row(vec![
        if ahead { "decided fire" } else { "last fire" }.into(),
        match (st.last_fire_at, &st.last_run_id) {
            (Some(at), Some(run)) if record.withdrawn_ahead(now) => {
                format!("{}: run {run} cancelled by a pause or change before its time", local_and_utc(at))
            }
            (Some(at), Some(run)) if ahead => format!("{}: run {run}, due then", local_and_utc(at)),
            (Some(at), Some(run)) => format!("{}: run {run}", local_and_utc(at)),
            (Some(at), None) => local_and_utc(at),
            (None, _) => "none yet".into(),
        },
    ]);
    if let Some(at) = st.buffered_fire {
        let until = st.last_run_id.as_ref().map_or_else(|| "the previous run".to_string(), |r| format!("run {r}"));
        fields.row(vec!["held fire".into(), format!("{}: starts when {until} ends", local_and_utc(at))]);
    }
    if let Some(at) = st.trigger_at {
        fields.row(vec![
            "manual fire".into(),
            format!(
                "asked for at {}: run {} starts when a worker with workflow {} registered is running",
                local_and_utc(at),
                record.fire_id(at),
                record.workflow
            ),
        ]);
    }
    fields.row(vec!["next fire".into(), next_fire_text(record, now)]);
    fields.row(vec![
        "due at".into(),
        record.due_at.map_or_else(
            || "- (no scheduler looks at it until it is resumed or triggered)".into(),
            |at| format!("{} (when a scheduler looks at it next)", timestamp(at)),
        ),
    ]);
    fields.row(vec!["revision".into(), record.revision.to_string()]);
    fields.row(vec!["created".into(), format!("{} ({})", timestamp(record.created_at), ago(record.created_at, now))]);
    fields.row(vec!["updated".into(), format!("{} ({})", timestamp(record.updated_at), ago(record.updated_at, now))]);
    fields.write(out, "")?;

    match upcoming {
        Ok(times) => {
            let note = if s.paused { "; none fires while paused" } else { "" };
            let zones = if zone == "UTC" { "UTC".to_string() } else { format!("{zone}, UTC") };
            writeln!(out, "\nnext {} fire times ({zones}{note})", times.len())?;
            let rows: Vec<(String, String)> = times.into_iter().map(|at| (zoned(at, zone), timestamp(at))).collect();
            let width = rows.iter().map(|(local, _)| local.chars().count()).max().unwrap_or(0);
            for (local, utc) in rows {
                writeln!(out, "  {local:<width$}  {utc}")?;
            }
        }
        Err(e) => writeln!(out, "\nnext fire times: unknown ({e})")?,
    }
    Ok(())
}

/// `durable schedules pause`.
pub(crate) async fn pause(store: &StoreArgs, args: &ScheduleKeyArgs, out: &mut dyn Write) -> Result<()> {
    let key = args.key.as_str();
    check_key(key)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let before = require(&engine, key).await?;
        if before.schedule.paused {
            writeln!(
                out,
                "schedule {key} is already paused; nothing changed (resume it with `durable schedules resume {key}`)"
            )?;
            return Ok(());
        }
        let after = found(key, engine.pause_schedule(key).await)?;
        let manual =
            if after.state.trigger_at.is_some() { "; the manual fire asked for earlier still starts" } else { "" };
        writeln!(
            out,
            "schedule {key} is paused; next fire: {} (resume it with `durable schedules resume {key}`){manual}",
            next_fire_text(&after, now_ms())
        )?;
        Ok(())
    })
    .await
}

/// `durable schedules resume`.
pub(crate) async fn resume(store: &StoreArgs, args: &ScheduleKeyArgs, out: &mut dyn Write) -> Result<()> {
    let key = args.key.as_str();
    check_key(key)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let before = require(&engine, key).await?;
        if !before.schedule.paused {
            writeln!(
                out,
                "schedule {key} is not paused; nothing changed; next fire: {}",
                next_fire_text(&before, now_ms())
            )?;
            return Ok(());
        }
        let after = found(key, engine.resume_schedule(key).await)?;
        let manual = if after.state.trigger_at.is_some() { "; a manual fire is pending too" } else { "" };
        writeln!(
            out,
            "schedule {key} is active again; next fire: {}; the fires it would have had while paused are skipped{manual}",
            next_fire_text(&after, now_ms())
        )?;
        Ok(())
    })
    .await
}

/// `durable schedules trigger`.
pub(crate) async fn trigger(store: &StoreArgs, args: &ScheduleKeyArgs, out: &mut dyn Write) -> Result<()> {
    let key = args.key.as_str();
    check_key(key)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        let record = require(&engine, key).await?;
        let run_id = found(key, engine.trigger_schedule(key).await)?;
        writeln!(
            out,
            "triggered schedule {key}: it starts run {run_id} when a worker with workflow {} registered is running",
            record.workflow
        )?;
        Ok(())
    })
    .await
}

/// `durable schedules delete`.
pub(crate) async fn delete(store: &StoreArgs, args: &ScheduleKeyArgs, out: &mut dyn Write) -> Result<()> {
    let key = args.key.as_str();
    check_key(key)?;
    let store = store.open(Access::Existing).await?;
    with_operator_engine(store, |engine| async move {
        if !engine.delete_schedule(key).await? {
            return Err(not_found(key));
        }
        writeln!(
            out,
            "deleted schedule {key}: the runs it started are kept (a worker that declares it at startup declares it again)"
        )?;
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_no_schedule_can_have_are_refused() {
        assert!(check_key("daily-order").is_ok());
        assert!(check_key("with space").is_ok());
        let e = check_key("").unwrap_err();
        assert_eq!((e.exit_code(), e.to_string().contains("it is empty")), (2, true), "{e}");
        let e = check_key("a\nb").unwrap_err();
        assert!(e.to_string().contains(r#""a\nb""#), "{e}");
    }
}
