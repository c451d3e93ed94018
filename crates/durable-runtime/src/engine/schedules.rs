//! Schedules: declaring, changing, pausing, triggering and deleting the stored schedules
//! every engine's scheduler fires.

use durable_core::{RunId, RunStatus, SaveOutcome, SaveSchedule, Schedule, ScheduleError, ScheduleRecord, StepError};
use serde::Serialize;

use super::Engine;
use crate::error::{Error, Result};
use crate::sched::Cancel;

/// Schedules listed per store call by [`Engine::list_schedules`].
const LIST_PAGE: usize = 500;

impl Engine {
    /// Declares the schedule `key`: every fire of `schedule` starts a run of the newest
    /// version of `workflow` with `input`, id `sched:<key>:<fire-ms>` (`…~<n>` for a fire
    /// decided again after a pause or change cancelled its run: [`ScheduleRecord::fire_id`]),
    /// tagged `schedule:<key>`. The schedule is stored, so every engine sharing the store fires it —
    /// each fire exactly once — and it outlives this process.
    ///
    /// Idempotent: declaring the same definition again (at every boot, say) changes nothing;
    /// a different one replaces it and keeps what was fired so far. A new cadence or time zone
    /// counts from now (or from the last fire decided ahead that it shares): runs of fires the old one decided ahead of their time
    /// ([`FIRE_AHEAD_MS`](durable_core::schedule::FIRE_AHEAD_MS)) at times the new one does
    /// not fire are cancelled, as a pause cancels them; a new workflow or input alone leaves
    /// them to start as decided. `Schedule::paused` applies when the schedule is created: declaring an existing
    /// schedule again keeps it paused or running as it is (an operator's `durable schedules
    /// pause` survives the next deploy); [`Engine::pause_schedule`] and
    /// [`Engine::resume_schedule`] change it. A bad cron expression, an unknown time zone, an interval of zero, a
    /// first fire after the year 9999 or a blank key is
    /// [`Error::BadSchedule`] naming it; an unregistered workflow is
    /// [`Error::UnknownWorkflow`]; an input the workflow cannot decode is
    /// [`Error::InvalidInput`]; an input that gives no usable concurrency key is
    /// [`Error::BadKey`]. Nothing is saved then.
    ///
    /// ```no_run
    /// # use durable_runtime::{Engine, Overlap, Schedule};
    /// # async fn demo(engine: Engine) -> Result<(), durable_runtime::Error> {
    /// let report = Schedule::cron("0 9 * * MON-FRI").timezone("Europe/Paris").overlap(Overlap::Skip);
    /// engine.schedule("morning-report", report, "report", &"sales").await?;
    /// # Ok(()) }
    /// ```
    pub async fn schedule<I: Serialize + ?Sized>(
        &self,
        key: &str,
        schedule: Schedule,
        workflow: &str,
        input: &I,
    ) -> Result<ScheduleRecord> {
        let shared = self.shared();
        let bad = |source| Error::BadSchedule { key: key.to_string(), source };
        durable_core::schedule::check_schedule_key(key).map_err(bad)?;
        schedule.validate_at(shared.clock.now()).map_err(bad)?;
        let (_, handler) =
            shared.registry.latest(workflow).ok_or_else(|| Error::UnknownWorkflow { name: workflow.to_string() })?;
        let input = self.encode_payload(|| format!("the input of schedule {key:?}"), input)?;
        handler.check_input(&input).map_err(|source| Error::InvalidInput { workflow: workflow.to_string(), source })?;
        let namespace = shared.config.namespace.clone().unwrap_or_else(|| "default".into());
        shared.flow.check_key(workflow, &namespace, &input)?;
        loop {
            let now = shared.clock.now();
            let fresh =
                ScheduleRecord::new(key, &namespace, workflow, input.clone(), schedule.clone(), now).map_err(bad)?;
            let mut ahead = Vec::new();
            let (record, expected) = match shared.store.get_schedule(key).await? {
                None => (self.after_a_delete(fresh, now).await?, None),
                Some(current) => {
                    // Pausing is an operator's decision: declaring again (a deploy) keeps it.
                    let mut fresh = fresh;
                    fresh.schedule.paused = current.schedule.paused;
                    if current.same_definition(&fresh) {
                        return Ok(current);
                    }
                    ahead = fire_ids(&current, current.fires_dropped_by(&fresh, now));
                    (current.redefine(&fresh, now).map_err(bad)?, Some(current.revision))
                }
            };
            if let Some(saved) = self.save_schedule(record, expected).await? {
                self.cancel_fires_ahead(key, ahead, "changed").await?;
                return Ok(saved);
            }
        }
    }

    /// A new record of a key whose schedule may have been deleted moments ago: a fire that
    /// one decided ahead of its time keeps its (cancelled) run, so a fire at that time decided
    /// now gets a run id of its own ([`ScheduleRecord::fire_id`]).
    async fn after_a_delete(&self, mut record: ScheduleRecord, now: durable_core::Millis) -> Result<ScheduleRecord> {
        let store = &self.shared().store;
        for at in record.fire_times_ahead(now) {
            while store.get_run(&record.fire_id(at)).await?.is_some() {
                *record.state.redecided.entry(at).or_default() += 1;
            }
        }
        Ok(record)
    }

    /// The schedule `key`, if there is one.
    pub async fn get_schedule(&self, key: &str) -> Result<Option<ScheduleRecord>> {
        Ok(self.shared().store.get_schedule(key).await?)
    }

    /// Every stored schedule, by key. [`ScheduleRecord::schedule`] has the definition
    /// (`schedule.upcoming(now, n)` gives the next fire times), [`ScheduleRecord::state`]
    /// what was fired so far.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleRecord>> {
        let store = &self.shared().store;
        let mut out: Vec<ScheduleRecord> = Vec::new();
        loop {
            let after = out.last().map(|r| r.key.clone());
            let page = store.list_schedules(None, after.as_deref(), LIST_PAGE).await?;
            let done = page.len() < LIST_PAGE;
            out.extend(page);
            if done {
                return Ok(out);
            }
        }
    }

    /// Changes the definition of schedule `key` (workflow and input stay); a new cadence or
    /// time zone counts from now, and runs of fires the old one decided ahead of their time,
    /// at times the new one does not fire, are cancelled (see [`Engine::schedule`]); a
    /// definition with `paused(true)` cancels them all, as [`Engine::pause_schedule`] does.
    pub async fn update_schedule(&self, key: &str, schedule: Schedule) -> Result<ScheduleRecord> {
        schedule
            .validate_at(self.shared().clock.now())
            .map_err(|source| Error::BadSchedule { key: key.to_string(), source })?;
        let mut ahead = Vec::new();
        let updated = self
            .modify_schedule(key, |current, now| {
                let mut fresh = current.clone();
                fresh.schedule = schedule.clone();
                ahead = fire_ids(current, current.fires_dropped_by(&fresh, now));
                current.redefine(&fresh, now)
            })
            .await?;
        self.cancel_fires_ahead(key, ahead, "changed").await?;
        Ok(updated)
    }

    /// Pauses schedule `key`: it fires nothing until resumed. Runs of fires decided ahead of
    /// their time ([`FIRE_AHEAD_MS`](durable_core::schedule::FIRE_AHEAD_MS)) that have not
    /// started yet are cancelled.
    pub async fn pause_schedule(&self, key: &str) -> Result<ScheduleRecord> {
        let mut ahead = Vec::new();
        let paused = self
            .modify_schedule(key, |current, now| {
                let paused = current.set_paused(true, now)?;
                ahead = fire_ids(current, current.fires_dropped_by(&paused, now));
                Ok(paused)
            })
            .await?;
        self.cancel_fires_ahead(key, ahead, "paused").await?;
        Ok(paused)
    }

    /// Resumes schedule `key`; the fires it would have had while paused are skipped.
    pub async fn resume_schedule(&self, key: &str) -> Result<ScheduleRecord> {
        self.modify_schedule(key, |current, now| current.set_paused(false, now)).await
    }

    /// Fires schedule `key` now, whatever its cadence, overlap policy or pause: returns the
    /// id of the run it starts (`sched:<key>:<now-ms>`, see [`ScheduleRecord::fire_id`]). A
    /// manual fire asked for before, whose run is not created yet, stands instead: the call
    /// returns that fire's run id (two quick triggers start one run). The fire is stored; the scheduler of
    /// this engine creates the run right after the call if it executes runs, any other
    /// executing engine within its `schedule_poll_interval` (1 s). Until then the run does
    /// not exist: `get_run` answers `None` and `wait_for_run` `RunNotFound` for a moment;
    /// wait for the engine's `RunCreated` event (or poll `get_run`) before waiting for it.
    pub async fn trigger_schedule(&self, key: &str) -> Result<RunId> {
        let mut at = 0;
        let saved = self
            .modify_schedule(key, |current, now| {
                at = current.pending_trigger().unwrap_or(now);
                Ok(current.trigger(now))
            })
            .await?;
        Ok(saved.fire_id(at))
    }

    /// Deletes schedule `key`; returns whether it existed. Runs it started are kept; runs of
    /// fires decided ahead of their time that have not started yet are cancelled.
    pub async fn delete_schedule(&self, key: &str) -> Result<bool> {
        let shared = self.shared();
        let ahead = match shared.store.get_schedule(key).await? {
            Some(current) => fire_ids(&current, current.fires_ahead(shared.clock.now())),
            None => Vec::new(),
        };
        let existed = shared.store.delete_schedule(key).await?;
        self.cancel_fires_ahead(key, ahead, "deleted").await?;
        Ok(existed)
    }

    /// Cancels the runs of fires decided ahead, `ids`, that are still `pending` (their start
    /// time not reached), saying the schedule was `what` (paused, deleted, …) before their
    /// time; a run that started meanwhile is left alone.
    async fn cancel_fires_ahead(&self, key: &str, ids: Vec<RunId>, what: &str) -> Result<()> {
        for id in ids {
            let error = StepError::fatal(format!("schedule {key:?} was {what} before this fire's time"))
                .with_code(durable_core::codes::CANCELLED);
            match self.shared().cancel_run_from(&id, Cancel::Abandon, Some(error), &[RunStatus::Pending]).await {
                Ok(_) | Err(Error::RunNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Applies `change` to the stored record with a compare-and-set, again on a race; a change
    /// that leaves the record as it is writes nothing.
    async fn modify_schedule(
        &self,
        key: &str,
        mut change: impl FnMut(&ScheduleRecord, durable_core::Millis) -> std::result::Result<ScheduleRecord, ScheduleError>,
    ) -> Result<ScheduleRecord> {
        let shared = self.shared();
        loop {
            let current = shared
                .store
                .get_schedule(key)
                .await?
                .ok_or_else(|| Error::ScheduleNotFound { key: key.to_string() })?;
            let record = change(&current, shared.clock.now())
                .map_err(|source| Error::BadSchedule { key: key.to_string(), source })?;
            if record == current {
                return Ok(current);
            }
            if let Some(saved) = self.save_schedule(record, Some(current.revision)).await? {
                return Ok(saved);
            }
        }
    }

    /// Saves with a compare-and-set; `None` when another writer got there first.
    async fn save_schedule(&self, record: ScheduleRecord, expected: Option<u64>) -> Result<Option<ScheduleRecord>> {
        let shared = self.shared();
        let save = SaveSchedule { record: record.clone(), expected, start: Vec::new() };
        match shared.store.save_schedule(save).await? {
            SaveOutcome::Saved(revision) => {
                if let Some(due) = record.due_at {
                    shared.note_due(due);
                }
                Ok(Some(ScheduleRecord { revision, ..record }))
            }
            SaveOutcome::Stale(_) => Ok(None),
        }
    }
}

/// The run ids `record` gave its fires at `times`.
fn fire_ids(record: &ScheduleRecord, times: Vec<durable_core::Millis>) -> Vec<RunId> {
    times.into_iter().map(|at| record.fire_id(at)).collect()
}
