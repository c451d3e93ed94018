//! Schedules: cron and interval cadences, and the pure decision of what a due schedule fires.
//!
//! A [`ScheduleRecord`] is what a store keeps per schedule: the definition ([`Schedule`]), the
//! workflow and input each fire starts, and the [`ScheduleState`] the scheduler moves on. The
//! scheduler of any engine sharing the store asks [`ScheduleRecord::plan`] what to do at `now`
//! and writes the answer back with a compare-and-set on the record's revision, creating the
//! fired runs in the same store call. A fire's run id is `sched:<key>:<fire-ms>`
//! ([`fire_run_id`]), so two engines firing the same schedule at once start one run; a fire
//! decided again after a pause or change cancelled its first run gets `sched:<key>:<fire-ms>~<n>`
//! ([`ScheduleRecord::fire_id`]).
//!
//! Calendar and time-zone arithmetic come from `croner` and `chrono-tz` (the IANA database is
//! compiled in); nothing here reads a clock or a file.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};

use crate::{Millis, Payload, RunId, millis, splitmix64};

/// A manual or buffered fire waits no longer than this for its chance to be looked at again
/// (a `buffer_one` fire checks whether the previous run ended at this interval).
pub const RECHECK_MS: Millis = 1_000;

/// An `Allow` schedule's fires are decided up to this long before their time: their runs are
/// created `pending` with the fire time as a delayed start, so the run is due at the fire time
/// itself however many schedules share that instant (creating 10,000 runs takes longer than a
/// fire may be late). A fire so decided starts even if the schedule's workflow or input is
/// changed within this window; a pause, a delete, or a new cadence or time zone that does not
/// fire at that time too cancels its run ([`Engine::pause_schedule`], `delete_schedule`,
/// `schedule`, `update_schedule`).
///
/// [`Engine::pause_schedule`]: https://docs.rs/durable-runtime/latest/durable_runtime/struct.Engine.html#method.pause_schedule
pub const FIRE_AHEAD_MS: Millis = 5_000;

/// At most this many fires are decided ahead of their time in one look (a fast interval would
/// otherwise create a run per millisecond of [`FIRE_AHEAD_MS`]).
const MAX_AHEAD: usize = 64;

/// Fire times a record remembers as cancelled ([`ScheduleState::redecided`]), latest kept.
const MAX_REDECIDED: usize = 64;

/// At most this many missed fires are walked through when a schedule catches up; past it the
/// schedule skips ahead to the next fire after `now` (a per-second schedule down for a year).
const MAX_WALK: usize = 10_000;

/// How often a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Cadence {
    /// A cron expression (5 fields, 6 with seconds first, or 7 with a year last), in the
    /// schedule's time zone.
    Cron {
        /// The expression, as given.
        expr: String,
    },
    /// Every `every_ms` milliseconds, aligned to the Unix epoch (`every(1 h)` fires on the hour).
    Every {
        /// The period.
        every_ms: Millis,
    },
}

/// What a fire does while the previous fire's run is still active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Overlap {
    /// Start it anyway (the default).
    #[default]
    Allow,
    /// Skip it: nothing starts while the previous run is active.
    Skip,
    /// Hold one fire back and start it once the previous run has ended; fires beyond the one
    /// held are skipped.
    BufferOne,
}

/// A schedule's definition: cadence, zone and options. Build with [`Schedule::cron`] or
/// [`Schedule::every`]; [`Schedule::validate`] names what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// How often it fires.
    pub cadence: Cadence,
    /// The IANA time zone cron fields are read in (default `UTC`).
    #[serde(default = "utc")]
    pub timezone: String,
    /// What a fire does while the previous run is active.
    #[serde(default)]
    pub overlap: Overlap,
    /// Each fire's run starts up to this much after the fire time (a stable offset per fire,
    /// the same on every engine), spreading load from many schedules on the same minute.
    #[serde(default)]
    pub jitter_ms: Millis,
    /// After downtime, start at most this many of the missed fires (the most recent); 0: none.
    #[serde(default)]
    pub max_catchup: u32,
    /// A fire noticed later than this is missed rather than late (default 60 s).
    #[serde(default = "default_grace")]
    pub misfire_grace_ms: Millis,
    /// A paused schedule fires nothing; resuming it skips the fires it would have had.
    #[serde(default)]
    pub paused: bool,
}

fn utc() -> String {
    "UTC".to_string()
}

fn default_grace() -> Millis {
    60_000
}

/// Why a schedule definition is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error(
        "bad cron expression {expr:?}: {reason}; use 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or 7 with a year last, for example \"0 9 * * MON-FRI\""
    )]
    BadCron {
        /// The expression.
        expr: String,
        /// What the parser said.
        reason: String,
    },
    /// The time zone is not in the IANA database.
    #[error("unknown time zone {zone:?}; use an IANA name such as \"Europe/Paris\" or \"UTC\"")]
    UnknownZone {
        /// The zone as given.
        zone: String,
    },
    /// `every(0)`.
    #[error(
        "a schedule interval of zero (or under 1 ms, which rounds to zero) fires continuously; use an interval of at least 1 ms"
    )]
    ZeroInterval,
    /// The schedule's first fire would come after [`LATEST_START`](crate::LATEST_START) (the
    /// year 9999): an interval or a cron year too far out.
    #[error(
        "its first fire would come after the year 9999 (at {first_at} ms since 1970); use an interval or a cron expression that fires before then"
    )]
    TooLate {
        /// When the first fire would be, in milliseconds since 1970.
        first_at: Millis,
    },
    /// The key is empty, only whitespace, too long or has control characters.
    #[error("bad schedule key {key:?}: {reason}")]
    BadKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Schedule {
    /// Fires on a cron expression, read in UTC unless [`Schedule::timezone`] says otherwise.
    pub fn cron(expr: impl Into<String>) -> Self {
        Self::with(Cadence::Cron { expr: expr.into() })
    }

    /// Fires every `period`, aligned to the Unix epoch.
    pub fn every(period: Duration) -> Self {
        Self::with(Cadence::Every { every_ms: millis(period) })
    }

    fn with(cadence: Cadence) -> Self {
        Schedule {
            cadence,
            timezone: utc(),
            overlap: Overlap::Allow,
            jitter_ms: 0,
            max_catchup: 0,
            misfire_grace_ms: default_grace(),
            paused: false,
        }
    }

    /// Reads the cron fields in this IANA time zone (`"Europe/Paris"`).
    pub fn timezone(mut self, zone: impl Into<String>) -> Self {
        self.timezone = zone.into();
        self
    }

    /// Sets the overlap policy.
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// Starts each fire's run up to `jitter` late.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter_ms = millis(jitter);
        self
    }

    /// After downtime, starts at most `n` of the missed fires, the most recent ones.
    pub fn max_catchup(mut self, n: u32) -> Self {
        self.max_catchup = n;
        self
    }

    /// A fire noticed later than `grace` counts as missed (default 60 s).
    pub fn misfire_grace(mut self, grace: Duration) -> Self {
        self.misfire_grace_ms = millis(grace);
        self
    }

    /// Creates the schedule paused (or not).
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = paused;
        self
    }

    /// Checks the expression, the zone and the interval, and that a cron expression matches
    /// some time at all (`0 0 30 2 *`, the 30th of February, parses but never fires).
    pub fn validate(&self) -> Result<(), ScheduleError> {
        self.validate_at(0)
    }

    /// [`Schedule::validate`], and that a cron expression matches some time after `now`: one
    /// whose years have all passed (`0 0 1 1 * 2020`) would never fire again. The first fire
    /// after `now` must come by [`LATEST_START`](crate::LATEST_START) (the year 9999).
    pub fn validate_at(&self, now: Millis) -> Result<(), ScheduleError> {
        let compiled = self.compiled()?;
        let first = compiled.next_after_unbounded(now);
        if let Some(first_at) = first.filter(|at| *at > crate::LATEST_START) {
            return Err(ScheduleError::TooLate { first_at });
        }
        match &self.cadence {
            Cadence::Cron { expr } if first.is_none() => Err(ScheduleError::BadCron {
                expr: expr.clone(),
                reason: if now == 0 {
                    "it matches no time from 1970 on: a day its months never have (such as the 30th of February)".into()
                } else {
                    "it matches no time from now on: only years that have passed, or a day its months never \
                     have (such as the 30th of February)"
                        .into()
                },
            }),
            _ => Ok(()),
        }
    }

    fn compiled(&self) -> Result<Compiled, ScheduleError> {
        let zone = chrono_tz::Tz::from_str(&self.timezone)
            .map_err(|_| ScheduleError::UnknownZone { zone: self.timezone.clone() })?;
        match &self.cadence {
            Cadence::Every { every_ms: 0 } => Err(ScheduleError::ZeroInterval),
            Cadence::Every { every_ms } => Ok(Compiled::Every(*every_ms)),
            Cadence::Cron { expr } => {
                let cron = CronParser::builder()
                    .seconds(Seconds::Optional)
                    .build()
                    .parse(expr)
                    .map_err(|e| ScheduleError::BadCron { expr: expr.clone(), reason: e.to_string() })?;
                Ok(Compiled::Cron(Box::new(cron), zone))
            }
        }
    }

    /// The first fire time strictly after `t`; `None` if the cadence never fires again (a
    /// cron expression whose years have passed, or a next fire after
    /// [`LATEST_START`](crate::LATEST_START), the year 9999).
    pub fn next_after(&self, t: Millis) -> Result<Option<Millis>, ScheduleError> {
        Ok(self.compiled()?.next_after(t))
    }

    /// The next `n` fire times strictly after `t`.
    pub fn upcoming(&self, t: Millis, n: usize) -> Result<Vec<Millis>, ScheduleError> {
        let compiled = self.compiled()?;
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            let Some(next) = compiled.next_after(at) else { break };
            out.push(next);
            at = next;
        }
        Ok(out)
    }

    /// The stable jitter of the fire at `nominal` of schedule `key`: in `0..=jitter_ms`.
    pub fn jitter_of(&self, key: &str, nominal: Millis) -> Millis {
        if self.jitter_ms == 0 {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        splitmix64(h ^ nominal) % (self.jitter_ms.saturating_add(1).max(1))
    }
}

enum Compiled {
    Every(Millis),
    Cron(Box<Cron>, chrono_tz::Tz),
}

impl Compiled {
    /// The next fire strictly after `t`, if it comes by the year 9999: a run cannot start
    /// later ([`LATEST_START`](crate::LATEST_START)), so a cadence whose next fire is later
    /// fires no more, like a cron expression whose years have passed.
    fn next_after(&self, t: Millis) -> Option<Millis> {
        self.next_after_unbounded(t).filter(|at| *at <= crate::LATEST_START)
    }

    fn next_after_unbounded(&self, t: Millis) -> Option<Millis> {
        match self {
            Compiled::Every(every) => (t / every).checked_add(1)?.checked_mul(*every),
            Compiled::Cron(cron, zone) => {
                let ms = i64::try_from(t).ok()?;
                let from = zone.from_utc_datetime(&DateTime::<Utc>::from_timestamp_millis(ms)?.naive_utc());
                // Croner searches whole seconds: ask from the second `t` falls in, then step on
                // until the answer is strictly later than `t`.
                let mut next = cron.find_next_occurrence(&from, false).ok()?;
                loop {
                    let at = u64::try_from(next.timestamp_millis()).ok()?;
                    if at > t {
                        return Some(at);
                    }
                    next = cron.find_next_occurrence(&next, false).ok()?;
                }
            }
        }
    }
}

/// The run id of the fire of schedule `key` at `nominal`: `sched:<key>:<nominal-ms>` (the
/// first time that fire is decided; see [`ScheduleRecord::fire_id`]).
pub fn fire_run_id(key: &str, nominal: Millis) -> RunId {
    RunId::new(format!("sched:{key}:{nominal}"))
}

/// Checks a schedule key: non-empty, at most 200 bytes, no control characters.
pub fn check_schedule_key(key: &str) -> Result<(), ScheduleError> {
    let reason = if key.is_empty() {
        "it is empty"
    } else if key.trim().is_empty() {
        "it is only whitespace"
    } else if key.len() > 200 {
        "it is longer than 200 bytes"
    } else if key.chars().any(char::is_control) {
        "it contains a control character"
    } else {
        return Ok(());
    };
    Err(ScheduleError::BadKey { key: key.chars().take(64).collect(), reason })
}

/// What the scheduler has done with a schedule so far.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ScheduleState {
    /// The next cadence fire not yet looked at; `None` when the cadence has ended.
    pub next_fire_at: Option<Millis>,
    /// The fire time of the latest fire started.
    pub last_fire_at: Option<Millis>,
    /// The run of the latest fire started.
    pub last_run_id: Option<RunId>,
    /// `buffer_one`: a fire held back until the latest run ends.
    pub buffered_fire: Option<Millis>,
    /// When a held-back fire is looked at again.
    pub recheck_at: Option<Millis>,
    /// A manual fire asked for at this time ([`ScheduleRecord::trigger`]).
    pub trigger_at: Option<Millis>,
    /// Fires started, less those decided ahead whose runs a pause or change cancelled before
    /// their time.
    pub fires: u64,
    /// Fires skipped by the overlap policy.
    pub skipped: u64,
    /// Fires missed during downtime and not caught up.
    pub missed: u64,
    /// Fire times whose run, decided ahead, a pause or change cancelled, with how many times
    /// that happened: such a fire decided again gets a run id of its own
    /// ([`ScheduleRecord::fire_id`]), since the cancelled run keeps the first.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub redecided: BTreeMap<Millis, u32>,
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    /// The key (unique in the store).
    pub key: String,
    /// The namespace fired runs go to.
    pub namespace: String,
    /// The workflow each fire starts.
    pub workflow: String,
    /// The input each fire's run gets.
    pub input: Payload,
    /// The definition.
    pub schedule: Schedule,
    /// The scheduler's progress.
    pub state: ScheduleState,
    /// When the scheduler must next look at it; `None` when paused or ended. Stores index it.
    pub due_at: Option<Millis>,
    /// Bumped by every save; saves compare-and-set on it.
    pub revision: u64,
    /// Creation time.
    pub created_at: Millis,
    /// Last save.
    pub updated_at: Millis,
}

/// A fire to start: its run id, fire time and the time its run may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// `sched:<key>:<nominal>` ([`ScheduleRecord::fire_id`]).
    pub run_id: RunId,
    /// The fire time the cadence gave (or the time a manual fire was asked for).
    pub nominal: Millis,
    /// With jitter: the run is created to start at this later time.
    pub start_at: Option<Millis>,
}

/// The answer of [`ScheduleRecord::plan`]: fires to start and the record to write back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Fires to start now, oldest first.
    pub fires: Vec<Fire>,
    /// The record after them (revision unchanged: the store bumps it).
    pub record: ScheduleRecord,
}

impl ScheduleRecord {
    /// A new schedule, first firing after `now`. Fails on a bad key or definition.
    pub fn new(
        key: &str,
        namespace: &str,
        workflow: &str,
        input: Payload,
        schedule: Schedule,
        now: Millis,
    ) -> Result<Self, ScheduleError> {
        check_schedule_key(key)?;
        let next_fire_at = schedule.next_after(now)?;
        let mut record = ScheduleRecord {
            key: key.to_string(),
            namespace: namespace.to_string(),
            workflow: workflow.to_string(),
            input,
            schedule,
            state: ScheduleState { next_fire_at, ..ScheduleState::default() },
            due_at: None,
            revision: 0,
            created_at: now,
            updated_at: now,
        };
        record.due_at = record.compute_due();
        Ok(record)
    }

    /// The record with a new definition, workflow or input (as [`ScheduleRecord::new`] would
    /// make them); what the scheduler did so far is kept. A changed cadence or zone, or a
    /// resume, counts from `now` (or from the last fire decided ahead that it keeps): fires it
    /// would have had before are not caught up.
    ///
    /// The fires decided ahead that the change drops ([`ScheduleRecord::fires_dropped_by`]) are
    /// remembered, so one decided again (a resume before its time, a cadence changed back) gets
    /// a run of its own instead of the cancelled one ([`ScheduleRecord::fire_id`]); they no
    /// longer count in [`ScheduleState::fires`], and if the latest fire is one of them, the
    /// latest one kept takes its place.
    pub fn redefine(&self, fresh: &ScheduleRecord, now: Millis) -> Result<Self, ScheduleError> {
        let mut record = self.clone();
        let dropped = self.fires_dropped_by(fresh, now);
        // The fires decided ahead that keep their runs: the latest of them is the latest fire
        // now, and the cadence goes on after it (they are not decided, nor counted, again).
        let kept = self.fires_ahead(now).into_iter().filter(|at| !dropped.contains(at)).max();
        if let (Some(last), Some(kept)) = (record.state.last_fire_at, kept)
            && dropped.contains(&last)
        {
            record.state.last_fire_at = Some(kept);
            record.state.last_run_id = Some(self.fire_id(kept));
        }
        // Their runs are cancelled: they no longer count as fires started.
        record.state.fires = record.state.fires.saturating_sub(dropped.len() as u64);
        for at in dropped {
            *record.state.redecided.entry(at).or_default() += 1;
        }
        while record.state.redecided.len() > MAX_REDECIDED {
            record.state.redecided.pop_first();
        }
        let retimed = self.retimed_by(fresh);
        record.namespace = fresh.namespace.clone();
        record.workflow = fresh.workflow.clone();
        record.input = fresh.input.clone();
        record.schedule = fresh.schedule.clone();
        if retimed {
            record.state.next_fire_at = record.schedule.next_after(kept.map_or(now, |at| at.max(now)))?;
        }
        record.updated_at = now;
        record.due_at = record.compute_due();
        Ok(record)
    }

    /// Whether saving `fresh` over this record changes its timing: another cadence or time
    /// zone, or a resume. Its next fire then counts from the change ([`ScheduleRecord::redefine`]).
    pub fn retimed_by(&self, fresh: &ScheduleRecord) -> bool {
        self.schedule.cadence != fresh.schedule.cadence
            || self.schedule.timezone != fresh.schedule.timezone
            || (self.schedule.paused && !fresh.schedule.paused)
    }

    /// The fires decided ahead of their time, still to come at `now`, whose runs saving
    /// `fresh` over this record leaves to be cancelled: all of them if it pauses the schedule;
    /// with a new cadence or time zone, those it does not fire at too (a fire time both have
    /// keeps its run, one per fire id); none for a new workflow or input alone.
    pub fn fires_dropped_by(&self, fresh: &ScheduleRecord, now: Millis) -> Vec<Millis> {
        if self.schedule.paused {
            // Dropped when it was paused.
            return Vec::new();
        }
        let ahead = self.fires_ahead(now);
        let Some(&last) = ahead.last() else { return ahead };
        if fresh.schedule.paused {
            return ahead;
        }
        if !self.retimed_by(fresh) {
            return Vec::new();
        }
        let mut kept = fresh.schedule.upcoming(now, MAX_AHEAD).unwrap_or_default();
        kept.retain(|at| *at <= last);
        ahead.into_iter().filter(|at| !kept.contains(at)).collect()
    }

    /// Whether saving `fresh` over this record would change anything.
    pub fn same_definition(&self, fresh: &ScheduleRecord) -> bool {
        self.namespace == fresh.namespace
            && self.workflow == fresh.workflow
            && self.input == fresh.input
            && self.schedule == fresh.schedule
    }

    /// The run id of this schedule's fire at `nominal`: [`fire_run_id`], with `~<n>` appended
    /// when a pause or change cancelled the run of that fire `n` times before
    /// ([`ScheduleState::redecided`]).
    pub fn fire_id(&self, nominal: Millis) -> RunId {
        match self.state.redecided.get(&nominal) {
            Some(n) => RunId::new(format!("{}~{n}", fire_run_id(&self.key, nominal))),
            None => fire_run_id(&self.key, nominal),
        }
    }

    /// The record paused or resumed at `now`.
    pub fn set_paused(&self, paused: bool, now: Millis) -> Result<Self, ScheduleError> {
        let mut fresh = self.clone();
        fresh.schedule.paused = paused;
        self.redefine(&fresh, now)
    }

    /// The record with a manual fire asked for at `now`; its run id is
    /// [`ScheduleRecord::fire_id`]`(now)`. A manual fire still pending (asked for, its run not
    /// created yet) stands instead: the record is returned as it is, and that fire's run
    /// ([`ScheduleRecord::pending_trigger`]) is the one both asked for.
    pub fn trigger(&self, now: Millis) -> Self {
        if self.state.trigger_at.is_some() {
            return self.clone();
        }
        let mut record = self.clone();
        record.state.trigger_at = Some(now);
        record.updated_at = now;
        // A manual fire happens even on a paused schedule.
        record.due_at = Some(record.compute_due().map_or(now, |d| d.min(now)));
        record
    }

    /// When the pending manual fire ([`ScheduleRecord::trigger`]) was asked for, if one is.
    pub fn pending_trigger(&self) -> Option<Millis> {
        self.state.trigger_at
    }

    /// When the scheduler must next look at the record: [`FIRE_AHEAD_MS`] before the next
    /// fire of an `Allow` schedule.
    fn compute_due(&self) -> Option<Millis> {
        let st = &self.state;
        let manual = st.trigger_at;
        if self.schedule.paused {
            return manual;
        }
        let recheck = st.buffered_fire.and(st.recheck_at);
        let next = st.next_fire_at.map(|at| at.saturating_sub(self.ahead()));
        [next, recheck, manual].into_iter().flatten().min()
    }

    /// How far ahead of their time fires are decided: only without an overlap policy, which
    /// needs to know whether the previous run is still active at the fire time.
    fn ahead(&self) -> Millis {
        if self.schedule.overlap == Overlap::Allow { FIRE_AHEAD_MS } else { 0 }
    }

    /// The times after `now` this record would decide fires for ahead of their time at `now`
    /// ([`FIRE_AHEAD_MS`], only without an overlap policy): where a schedule of the same key,
    /// deleted just before, may have left a run ([`ScheduleRecord::fire_id`]).
    pub fn fire_times_ahead(&self, now: Millis) -> Vec<Millis> {
        let horizon = now.saturating_add(self.ahead());
        let mut out =
            if self.schedule.paused { Vec::new() } else { self.schedule.upcoming(now, MAX_AHEAD).unwrap_or_default() };
        out.retain(|at| *at <= horizon && *at > now);
        out
    }

    /// The fires decided ahead of their time that are still to come at `now`, as far as
    /// the cadence can tell (for cancelling them when the schedule is paused, retimed or
    /// deleted).
    pub fn fires_ahead(&self, now: Millis) -> Vec<Millis> {
        let Some(last) = self.state.last_fire_at.filter(|at| *at > now) else { return Vec::new() };
        if self.withdrawn_ahead(now) {
            // Cancelled by a pause or change already, and not decided again since.
            return Vec::new();
        }
        let mut out = self.schedule.upcoming(now, MAX_AHEAD).unwrap_or_default();
        out.retain(|at| *at <= last);
        out
    }

    /// Whether the latest fire, decided ahead of its time (still to come at `now`), had its
    /// run cancelled by a pause or change since ([`ScheduleRecord::redefine`]) and was not
    /// decided again: its run id is no longer the one [`ScheduleRecord::fire_id`] gives.
    pub fn withdrawn_ahead(&self, now: Millis) -> bool {
        match (self.state.last_fire_at, &self.state.last_run_id) {
            (Some(at), Some(run)) if at > now => *run != self.fire_id(at),
            _ => false,
        }
    }

    /// What to do at `now`, given whether the run of the latest fire is still active.
    ///
    /// Cadence fires up to `now` are due (for an `Allow` schedule, up to [`FIRE_AHEAD_MS`]
    /// later: their runs start at their time); those older than the misfire grace are missed
    /// and at most `max_catchup` of them (the most recent) are kept. The overlap policy then
    /// decides which start; a manual fire always starts.
    pub fn plan(&self, now: Millis, last_run_active: bool) -> Result<Plan, ScheduleError> {
        let compiled = self.schedule.compiled()?;
        let horizon = now.saturating_add(self.ahead());
        let mut record = self.clone();
        let st = &mut record.state;
        let mut due = Vec::new();
        if !self.schedule.paused {
            let mut next = st.next_fire_at;
            let mut ahead = 0;
            while let Some(at) = next.filter(|at| *at <= horizon) {
                if at > now {
                    if ahead == MAX_AHEAD {
                        break;
                    }
                    ahead += 1;
                }
                if due.len() == MAX_WALK {
                    st.missed += 1; // at least: the rest are skipped unseen
                    next = compiled.next_after(now);
                    break;
                }
                due.push(at);
                next = compiled.next_after(at);
            }
            st.next_fire_at = next;
        }
        let cutoff = now.saturating_sub(self.schedule.misfire_grace_ms);
        let late = due.partition_point(|at| *at < cutoff);
        let keep_from = late.saturating_sub(self.schedule.max_catchup as usize);
        st.missed += keep_from as u64;
        let mut candidates: Vec<Millis> = st.buffered_fire.take().into_iter().chain(due.drain(keep_from..)).collect();
        candidates.dedup();
        let mut fires = match self.schedule.overlap {
            Overlap::Allow => candidates,
            Overlap::Skip if last_run_active => {
                st.skipped += candidates.len() as u64;
                Vec::new()
            }
            Overlap::Skip => {
                let last = candidates.pop();
                st.skipped += candidates.len() as u64;
                last.into_iter().collect()
            }
            Overlap::BufferOne => {
                let first = if last_run_active || candidates.is_empty() { None } else { Some(candidates.remove(0)) };
                st.buffered_fire = candidates.pop();
                st.skipped += candidates.len() as u64;
                first.into_iter().collect()
            }
        };
        st.recheck_at = st.buffered_fire.map(|_| now.saturating_add(RECHECK_MS));
        // A manual fire starts now: no jitter.
        let manual = st.trigger_at.take();
        fires.extend(manual);
        fires.sort_unstable();
        fires.dedup();
        if let Some(last) = fires.last() {
            st.last_fire_at = Some(*last);
            st.last_run_id = Some(self.fire_id(*last));
            st.fires += fires.len() as u64;
        }
        let fires = fires
            .into_iter()
            .map(|nominal| {
                let jitter = if manual == Some(nominal) { 0 } else { self.schedule.jitter_of(&self.key, nominal) };
                let start = nominal.saturating_add(jitter);
                Fire { run_id: self.fire_id(nominal), nominal, start_at: (start > now).then_some(start) }
            })
            .collect();
        // A fire time passed is never decided again: what it was cancelled for is forgotten.
        record.state.redecided.retain(|at, _| *at > now);
        record.updated_at = now;
        record.due_at = record.compute_due();
        Ok(Plan { fires, record })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Millis = 3_600_000;
    /// 2026-01-01T00:00:00Z.
    const T2026: Millis = 1_767_225_600_000;

    fn record(schedule: Schedule, now: Millis) -> ScheduleRecord {
        ScheduleRecord::new("k", "default", "wf", Payload::null(), schedule, now).unwrap()
    }

    fn nominals(plan: &Plan) -> Vec<Millis> {
        plan.fires.iter().map(|f| f.nominal).collect()
    }

    #[test]
    fn bad_definitions_are_refused_by_name() {
        let e = Schedule::cron("61 * * * *").validate().unwrap_err();
        assert!(matches!(&e, ScheduleError::BadCron { expr, .. } if expr == "61 * * * *"), "{e}");
        assert!(e.to_string().contains("\"61 * * * *\""), "{e}");
        let e = Schedule::cron("0 9 * * *").timezone("Mars/Olympus").validate().unwrap_err();
        assert!(e.to_string().contains("Mars/Olympus"), "{e}");
        let e = Schedule::every(Duration::ZERO).validate().unwrap_err();
        assert_eq!(e, ScheduleError::ZeroInterval);
        // Parses, but no month has the day: it would never fire.
        for never in ["0 0 30 2 *", "0 0 31 4,6,9,11 *"] {
            let e = Schedule::cron(never).validate().unwrap_err();
            assert!(matches!(&e, ScheduleError::BadCron { expr, .. } if expr == never), "{e}");
            assert!(e.to_string().contains("matches no time"), "{e}");
        }
        Schedule::cron("0 0 29 2 *").validate().expect("the 29th of February comes every four years");
        // Its year has passed: valid from 1970, refused from now on.
        let past = Schedule::cron("0 0 0 1 1 * 2020");
        past.validate().expect("it fired once, in 2020");
        let now = 1_796_083_200_000; // 2026-12-01
        let e = past.validate_at(now).unwrap_err();
        assert!(e.to_string().contains("matches no time from now on: only years that have passed"), "{e}");
        Schedule::cron("0 0 0 1 1 * 2020-2099").validate_at(now).expect("years to come");
        // Its first fire after the year 9999: a mistake, refused.
        let e = Schedule::every(Duration::MAX).validate_at(now).unwrap_err();
        assert!(matches!(e, ScheduleError::TooLate { first_at } if first_at > crate::LATEST_START), "{e}");
        assert!(e.to_string().contains("after the year 9999"), "{e}");
        assert!(Schedule::every(Duration::from_secs(9_000 * 366 * 86_400)).validate_at(now).is_err());
        let far = Schedule::every(Duration::from_secs(7_000 * 365 * 86_400));
        far.validate_at(now).expect("before 9999");
        // Its second fire would come after 9999: it fires once, then no more.
        let first = far.next_after(now).unwrap().expect("a first fire");
        assert!(first <= crate::LATEST_START);
        assert_eq!(far.next_after(first).unwrap(), None);
        assert_eq!(far.upcoming(now, 3).unwrap(), vec![first]);
        Schedule::cron("0 0 0 1 1 * 2099").validate_at(now).expect("a year to come");
        assert!(check_schedule_key("").is_err());
        assert!(check_schedule_key(" ").unwrap_err().to_string().contains("only whitespace"));
        assert!(check_schedule_key("a\nb").is_err());
        assert!(check_schedule_key("report").is_ok());
    }

    #[test]
    fn intervals_align_to_the_epoch() {
        let s = Schedule::every(Duration::from_secs(3600));
        assert_eq!(s.next_after(T2026 + 1).unwrap(), Some(T2026 + H));
        assert_eq!(s.next_after(T2026).unwrap(), Some(T2026 + H), "strictly after");
        assert_eq!(s.upcoming(T2026, 3).unwrap(), vec![T2026 + H, T2026 + 2 * H, T2026 + 3 * H]);
    }

    #[test]
    fn cron_in_a_zone_follows_daylight_saving() {
        // 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer (2026: summer time
        // from 29 March, winter time from 25 October).
        let s = Schedule::cron("0 9 * * *").timezone("Europe/Paris");
        let at = |iso: &str| u64::try_from(DateTime::parse_from_rfc3339(iso).unwrap().timestamp_millis()).unwrap();
        let next = |iso: &str| s.next_after(at(iso)).unwrap().unwrap();
        assert_eq!(next("2026-03-28T12:00:00Z"), at("2026-03-29T07:00:00Z"));
        assert_eq!(next("2026-03-27T12:00:00Z"), at("2026-03-28T08:00:00Z"));
        assert_eq!(next("2026-10-24T12:00:00Z"), at("2026-10-25T08:00:00Z"));
        assert_eq!(next("2026-10-23T12:00:00Z"), at("2026-10-24T07:00:00Z"));
        // Strictly after, also within the same second.
        assert_eq!(next("2026-10-24T07:00:00.500Z"), at("2026-10-25T08:00:00Z"));
        // Six fields: seconds first.
        let every_second = Schedule::cron("* * * * * *");
        assert_eq!(every_second.next_after(T2026 + 1_500).unwrap(), Some(T2026 + 2_000));
    }

    #[test]
    fn a_paris_morning_fires_at_nine_local_all_year_and_moves_twice_in_utc() {
        use chrono::Timelike;
        let s = Schedule::cron("0 9 * * *").timezone("Europe/Paris");
        let fires = s.upcoming(T2026, 365).unwrap();
        assert_eq!(fires.len(), 365);
        let mut utc_hours = Vec::new();
        for at in &fires {
            let utc = DateTime::<Utc>::from_timestamp_millis(*at as i64).unwrap();
            let local = utc.with_timezone(&chrono_tz::Europe::Paris);
            assert_eq!((local.hour(), local.minute(), local.second()), (9, 0, 0), "{local}");
            if utc_hours.last() != Some(&utc.hour()) {
                utc_hours.push(utc.hour());
                println!("from {utc}: {}:00 UTC", utc.hour());
            }
        }
        // Winter time (UTC+1), summer time from 29 March (UTC+2), winter time from 25 October.
        assert_eq!(utc_hours, vec![8, 7, 8]);
        let day = |at: Millis| DateTime::<Utc>::from_timestamp_millis(at as i64).unwrap().date_naive().to_string();
        let switches: Vec<String> = fires.windows(2).filter(|w| (w[1] - w[0]) != 24 * H).map(|w| day(w[1])).collect();
        assert_eq!(switches, vec!["2026-03-29", "2026-10-25"]);
    }

    #[test]
    fn on_time_fires_start_and_the_record_moves_on() {
        let r = record(Schedule::every(Duration::from_secs(3600)), T2026);
        assert_eq!(r.due_at, Some(T2026 + H - FIRE_AHEAD_MS), "looked at ahead of the fire");
        let plan = r.plan(T2026 + H + 5, false).unwrap();
        assert_eq!(nominals(&plan), vec![T2026 + H]);
        assert_eq!(plan.fires[0].run_id.as_str(), format!("sched:k:{}", T2026 + H));
        assert_eq!(plan.fires[0].start_at, None, "late: starts at once");
        assert_eq!(plan.record.due_at, Some(T2026 + 2 * H - FIRE_AHEAD_MS));
        assert_eq!(plan.record.state.fires, 1);
        // Nothing due yet: nothing fires.
        let again = plan.record.plan(T2026 + H + 10, false).unwrap();
        assert!(again.fires.is_empty());
    }

    #[test]
    fn downtime_catches_up_at_most_max_catchup_of_the_most_recent_fires() {
        let every_hour = Schedule::every(Duration::from_secs(3600));
        // Down from just after creation until 5.5 hours later: fires 1..=5 were missed.
        let now = T2026 + 5 * H + H / 2;
        let plan = record(every_hour.clone().max_catchup(2), T2026).plan(now, false).unwrap();
        assert_eq!(nominals(&plan), vec![T2026 + 4 * H, T2026 + 5 * H]);
        assert_eq!(plan.record.state.missed, 3);
        let plan = record(every_hour, T2026).plan(now, false).unwrap();
        assert!(plan.fires.is_empty(), "no backfill: none");
        assert_eq!(plan.record.state.missed, 5);
        assert_eq!(plan.record.due_at, Some(T2026 + 6 * H - FIRE_AHEAD_MS));
    }

    #[test]
    fn allow_fires_are_decided_ahead_and_start_at_their_time() {
        let r = record(Schedule::every(Duration::from_secs(3600)), T2026);
        let plan = r.plan(T2026 + H - FIRE_AHEAD_MS, false).unwrap();
        assert_eq!(plan.fires.len(), 1);
        assert_eq!((plan.fires[0].nominal, plan.fires[0].start_at), (T2026 + H, Some(T2026 + H)));
        assert_eq!(plan.record.fires_ahead(T2026 + H - 1), vec![T2026 + H]);
        assert_eq!(plan.record.fires_ahead(T2026 + H), Vec::<Millis>::new(), "started by then");
        // A fast interval: at most MAX_AHEAD fires ahead per look, none skipped.
        let fast = record(Schedule::every(Duration::from_millis(10)), T2026);
        let plan = fast.plan(T2026, false).unwrap();
        assert_eq!(plan.fires.len(), MAX_AHEAD);
        assert_eq!(plan.record.state.next_fire_at, Some(T2026 + 10 * (MAX_AHEAD as Millis + 1)));
        // An overlap policy needs the previous run's end: no fire ahead of its time.
        let skip = record(Schedule::every(Duration::from_secs(3600)).overlap(Overlap::Skip), T2026);
        assert_eq!(skip.due_at, Some(T2026 + H));
        assert!(skip.plan(T2026 + H - 1, false).unwrap().fires.is_empty());
    }

    #[test]
    fn a_new_definition_drops_the_fires_ahead_it_does_not_share() {
        let fast = record(Schedule::every(Duration::from_millis(10)), T2026);
        let decided = fast.plan(T2026, false).unwrap().record;
        let now = T2026 + 5;
        let ahead = decided.fires_ahead(now);
        assert_eq!(ahead.len(), MAX_AHEAD);
        // Every 20 ms: the fires at odd multiples of 10 ms go, those it shares stay. It counts
        // on from the last of those (they are not decided again).
        let mut slower = decided.clone();
        slower.schedule = Schedule::every(Duration::from_millis(20));
        assert!(decided.retimed_by(&slower));
        let dropped = decided.fires_dropped_by(&slower, now);
        assert_eq!(dropped.len(), MAX_AHEAD / 2, "{dropped:?}");
        assert!(dropped.iter().all(|at| at % 20 == 10), "{dropped:?}");
        assert_eq!(decided.redefine(&slower, now).unwrap().state.next_fire_at, Some(T2026 + 660));
        // Paused: all of them go. A new input alone: none.
        let mut paused = decided.clone();
        paused.schedule.paused = true;
        assert_eq!(decided.fires_dropped_by(&paused, now), ahead);
        let mut other_input = decided.clone();
        other_input.input = Payload::encode(&7).unwrap();
        assert!(!decided.retimed_by(&other_input));
        assert!(decided.fires_dropped_by(&other_input, now).is_empty());
        assert_eq!(decided.redefine(&other_input, now).unwrap().state.next_fire_at, decided.state.next_fire_at);
        // Once they are past, nothing is left to drop.
        assert!(decided.fires_dropped_by(&slower, T2026 + 10 * MAX_AHEAD as Millis).is_empty());
    }

    #[test]
    fn a_fire_decided_again_after_its_run_was_cancelled_gets_a_run_id_of_its_own() {
        let every_hour = record(Schedule::every(Duration::from_secs(3600)), T2026);
        let fire = T2026 + H;
        let decided = every_hour.plan(fire - 3_000, false).unwrap().record;
        assert_eq!(decided.fire_id(fire).as_str(), format!("sched:k:{fire}"));
        // Paused, resumed and decided again before its time, twice: each pause cancels the
        // run the fire had, so each decision gets the next id.
        let mut r = decided;
        for n in 1..=2u32 {
            let now = fire - 3_000 + Millis::from(n);
            let paused = r.set_paused(true, now).unwrap();
            assert_eq!(paused.state.redecided.get(&fire), Some(&n));
            assert!(
                paused.fires_dropped_by(&paused.set_paused(false, now).unwrap(), now).is_empty(),
                "dropped already"
            );
            let resumed = paused.set_paused(false, now).unwrap();
            assert_eq!(resumed.state.redecided.get(&fire), Some(&n), "a resume drops nothing more");
            let plan = resumed.plan(now, false).unwrap();
            assert_eq!(plan.fires.len(), 1);
            assert_eq!(plan.fires[0].run_id.as_str(), format!("sched:k:{fire}~{n}"));
            assert_eq!(plan.record.state.last_run_id, Some(plan.fires[0].run_id.clone()));
            r = plan.record;
        }
        // A cadence changed and changed back: the shared fire time is decided again too.
        let every_7s = Schedule::every(Duration::from_secs(7));
        let now = fire - 2_000;
        let mut changed = r.clone();
        changed.schedule = every_7s;
        let changed = r.redefine(&changed, now).unwrap();
        assert_eq!(changed.state.redecided.get(&fire), Some(&3), "{:?}", changed.state.redecided);
        let mut back = changed.clone();
        back.schedule = r.schedule.clone();
        let back = changed.redefine(&back, now).unwrap();
        let plan = back.plan(now, false).unwrap();
        assert_eq!(plan.fires.last().map(|f| f.run_id.as_str().to_string()), Some(format!("sched:k:{fire}~3")));
        // Once its time passed, the record forgets it.
        let later = plan.record.plan(fire + 1, false).unwrap();
        assert!(later.record.state.redecided.is_empty(), "{:?}", later.record.state.redecided);
        assert_eq!(later.record.fire_id(fire).as_str(), format!("sched:k:{fire}"));
    }

    #[test]
    fn a_pause_uncounts_the_fires_it_cancels_once() {
        let every_2s = record(Schedule::every(Duration::from_secs(2)), T2026);
        let now = T2026 + 1_000;
        // Decided ahead: the fires at +2 s, +4 s and +6 s (within FIRE_AHEAD_MS of now).
        let decided = every_2s.plan(now, false).unwrap().record;
        assert_eq!(decided.state.fires, 3);
        assert!(!decided.withdrawn_ahead(now));
        let paused = decided.set_paused(true, now).unwrap();
        assert_eq!(paused.state.fires, 0, "the cancelled runs are not fires started");
        assert!(paused.withdrawn_ahead(now));
        // Resumed and paused again before the scheduler decided them again: nothing more is
        // cancelled or uncounted.
        let resumed = paused.set_paused(false, now).unwrap();
        assert!(resumed.fires_ahead(now).is_empty());
        let again = resumed.set_paused(true, now).unwrap();
        assert_eq!(again.state.fires, 0);
        assert_eq!(again.state.redecided, paused.state.redecided);
        // Decided again after a resume: counted once more, under new run ids.
        let redecided = resumed.plan(now, false).unwrap();
        assert_eq!(redecided.record.state.fires, 3);
        assert!(!redecided.record.withdrawn_ahead(now));
        assert!(redecided.fires.iter().all(|f| f.run_id.as_str().ends_with("~1")), "{:?}", redecided.fires);
    }

    #[test]
    fn a_new_cadence_keeps_the_fires_it_shares_counted_once_and_moves_the_latest_fire() {
        let every_1s = record(Schedule::every(Duration::from_secs(1)), T2026);
        let now = T2026 + 500;
        // Decided ahead: +1 s … +5 s.
        let decided = every_1s.plan(now, false).unwrap().record;
        assert_eq!((decided.state.fires, decided.state.last_fire_at), (5, Some(T2026 + 5_000)));
        // Every 2 s: +2 s and +4 s keep their runs, +1 s, +3 s and +5 s are cancelled.
        let mut every_2s = decided.clone();
        every_2s.schedule = Schedule::every(Duration::from_secs(2));
        assert_eq!(decided.fires_dropped_by(&every_2s, now), vec![T2026 + 1_000, T2026 + 3_000, T2026 + 5_000]);
        let changed = decided.redefine(&every_2s, now).unwrap();
        assert_eq!(changed.state.fires, 2);
        assert_eq!(changed.state.last_fire_at, Some(T2026 + 4_000), "the latest fire kept");
        assert_eq!(changed.state.last_run_id, Some(decided.fire_id(T2026 + 4_000)));
        assert!(!changed.withdrawn_ahead(now));
        assert_eq!(changed.state.next_fire_at, Some(T2026 + 6_000), "the cadence goes on after them");
        // Planned again: the kept fires are not decided (or counted) a second time.
        let planned = changed.plan(now, false).unwrap();
        assert!(planned.fires.is_empty(), "{:?}", planned.fires);
        assert_eq!(planned.record.state.fires, 2);
        // A pause now cancels the two kept ones.
        assert_eq!(changed.fires_ahead(now), vec![T2026 + 2_000, T2026 + 4_000]);
        let paused = changed.set_paused(true, now).unwrap();
        assert_eq!(paused.state.fires, 0);
    }

    #[test]
    fn skip_starts_nothing_while_the_last_run_is_active() {
        let r = record(Schedule::every(Duration::from_secs(60)).overlap(Overlap::Skip), T2026);
        let plan = r.plan(T2026 + 60_000, true).unwrap();
        assert!(plan.fires.is_empty());
        assert_eq!(plan.record.state.skipped, 1);
        let plan = plan.record.plan(T2026 + 120_000, false).unwrap();
        assert_eq!(nominals(&plan), vec![T2026 + 120_000]);
    }

    #[test]
    fn buffer_one_holds_one_fire_until_the_last_run_ends() {
        let r = record(Schedule::every(Duration::from_secs(60)).overlap(Overlap::BufferOne), T2026);
        let p1 = r.plan(T2026 + 60_000, true).unwrap();
        assert!(p1.fires.is_empty());
        assert_eq!(p1.record.state.buffered_fire, Some(T2026 + 60_000));
        assert_eq!(p1.record.due_at, Some(T2026 + 60_000 + RECHECK_MS), "looked at again soon");
        // Another fire while still active: the newer one is held, the older skipped.
        let p2 = p1.record.plan(T2026 + 120_000, true).unwrap();
        assert!(p2.fires.is_empty());
        assert_eq!(p2.record.state.buffered_fire, Some(T2026 + 120_000));
        assert_eq!(p2.record.state.skipped, 1);
        // The run ended: the held fire starts.
        let p3 = p2.record.plan(T2026 + 121_000, false).unwrap();
        assert_eq!(nominals(&p3), vec![T2026 + 120_000]);
        assert_eq!(p3.record.state.buffered_fire, None);
        assert_eq!(p3.record.due_at, Some(T2026 + 180_000));
    }

    #[test]
    fn a_manual_fire_starts_even_when_paused() {
        let r = record(Schedule::every(Duration::from_secs(60)).paused(true), T2026);
        assert_eq!(r.due_at, None, "paused: never due");
        let t = r.trigger(T2026 + 5);
        assert_eq!(t.due_at, Some(T2026 + 5));
        // Asked for again before its run was created: the first fire stands, once.
        assert_eq!(t.trigger(T2026 + 6), t);
        assert_eq!(t.pending_trigger(), Some(T2026 + 5));
        let plan = t.plan(T2026 + 6, false).unwrap();
        assert_eq!(nominals(&plan), vec![T2026 + 5]);
        assert_eq!(plan.record.due_at, None);
        // Resuming counts from now: the fires of the pause are not caught up.
        let resumed = plan.record.set_paused(false, T2026 + 10 * 60_000 + 1).unwrap();
        assert_eq!(resumed.state.next_fire_at, Some(T2026 + 11 * 60_000));
    }

    #[test]
    fn jitter_is_stable_and_bounded() {
        let s = Schedule::every(Duration::from_secs(60)).jitter(Duration::from_secs(10));
        let j = s.jitter_of("k", T2026);
        assert_eq!(j, s.jitter_of("k", T2026));
        assert!(j <= 10_000);
        let r = record(s, T2026);
        let plan = r.plan(T2026 + 60_000, false).unwrap();
        let start = plan.fires[0].start_at.unwrap_or(T2026 + 60_000);
        assert_eq!(start, T2026 + 60_000 + r.schedule.jitter_of("k", T2026 + 60_000));
    }

    #[test]
    fn a_manual_fire_is_not_jittered() {
        let r = record(Schedule::every(Duration::from_secs(3600)).jitter(Duration::from_secs(600)), T2026);
        let asked = T2026 + 5;
        assert!(r.schedule.jitter_of("k", asked) > 0, "this fire time would be jittered");
        let plan = r.trigger(asked).plan(asked + 1, false).unwrap();
        assert_eq!(nominals(&plan), vec![asked]);
        assert_eq!(plan.fires[0].start_at, None, "the manual fire starts now");
    }

    #[test]
    fn a_long_outage_of_a_fast_schedule_skips_ahead() {
        let r = record(Schedule::every(Duration::from_millis(1)), T2026);
        let plan = r.plan(T2026 + 1_000_000, false).unwrap();
        assert!(plan.fires.is_empty());
        assert_eq!(plan.record.state.next_fire_at, Some(T2026 + 1_000_001));
    }
}
