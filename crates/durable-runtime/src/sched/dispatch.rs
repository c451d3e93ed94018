//! Execution slots on this engine: the ready queue the dispatcher loop serves, which runs
//! execute here, and the task that runs one until it is quiet (also for runs the transport's
//! consumer hands over).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use durable_core::task::{TaskCompletion, TaskDone};
use durable_core::{Delivery, Millis, Payload, Run, RunId, RunStatus, StoreError, StoreResult};
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::executor::FirstClaim;
use super::{Mark, Nudge, Shared};

/// Who executes what on this engine.
pub(super) struct Dispatch {
    /// Run ids waiting for an execution slot on this engine: wakes are served before starts,
    /// so runs already in progress finish before new ones begin. Each has a `Runs::active`
    /// entry, so a run is in here at most once.
    ready: Mutex<Ready>,
    ready_changed: Notify,
    /// The runs queued or executing here, and those that went quiet lately.
    runs: Mutex<Runs>,
    /// Execution slots shared by the dispatcher and the transport's consumer.
    slots: Arc<Semaphore>,
    /// Run tasks in flight (counted from the moment a slot is taken), and the most ever.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Runs whose turn a `shutdown` dropped: their leases are released once all turns ended.
    interrupted: Mutex<Option<Vec<RunId>>>,
    /// Notified each time a run task ends.
    idle: Notify,
    /// Turns waiting out a held sleep ([`TurnEnv::hold_began`](crate::turn::TurnEnv::hold_began)),
    /// each keeping its slot.
    held: AtomicUsize,
    /// Callers waiting for an execution slot: a held turn gives its slot up for them.
    slot_wanted: AtomicUsize,
}

impl Dispatch {
    pub(super) fn new(slots: usize) -> Self {
        Dispatch {
            ready: Mutex::new(Ready::default()),
            ready_changed: Notify::new(),
            runs: Mutex::new(Runs::default()),
            slots: Arc::new(Semaphore::new(slots)),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            interrupted: Mutex::new(None),
            idle: Notify::new(),
            held: AtomicUsize::new(0),
            slot_wanted: AtomicUsize::new(0),
        }
    }

    /// Asks for a run to execute here: queued for a slot unless it is already queued or
    /// executing here (then an executing run looks again once its turn ends, see
    /// [`Nudge`]).
    pub(super) fn push(&self, id: RunId, nudge: Nudge) {
        if self.enter(&id, nudge).is_none() {
            return;
        }
        let mut ready = self.ready.lock();
        if nudge.wake {
            ready.wakes.push_back(id)
        } else {
            ready.others.push_back(id)
        }
        drop(ready);
        self.ready_changed.notify_one();
    }

    /// Records a run as queued here, unless it is known: `None` when it is queued or executing
    /// here already (an executing one is marked to look again after its turn, unless the
    /// nudge is a poller's) or when a poller found it after it went quiet here. Otherwise
    /// `Some(check)`: whether to read the run before executing it.
    fn enter(&self, id: &RunId, nudge: Nudge) -> Option<bool> {
        let mut runs = self.runs.lock();
        if let Some(active) = runs.active.get_mut(id) {
            if active.started && !nudge.found {
                active.again = true;
            }
            return None;
        }
        let check = match (nudge.since.map(|mark| runs.quiet.since(id, mark)), nudge.found) {
            (None, _) | (Some(Some(false)), _) => false,
            (Some(Some(true)), true) => return None,
            (Some(Some(true)), false) | (Some(None), _) => true,
        };
        runs.active.insert(id.clone(), Active { started: false, check, again: false });
        Some(check)
    }

    /// Records a run as executing here at once (it took a slot without queueing), unless it
    /// is queued or executing here already: whether it was recorded.
    fn enter_started(&self, id: &RunId) -> bool {
        let mut runs = self.runs.lock();
        if runs.active.contains_key(id) {
            return false;
        }
        runs.active.insert(id.clone(), Active { started: true, check: false, again: false });
        true
    }

    /// Whether a poller that read the store since `mark` should leave the run alone: it is
    /// queued or executing here, or went quiet here since.
    pub(super) fn knows(&self, id: &RunId, mark: Mark) -> bool {
        let runs = self.runs.lock();
        runs.active.contains_key(id) || runs.quiet.since(id, mark) == Some(true)
    }

    /// A position in the order runs go quiet here (see [`Nudge`]).
    pub(super) fn mark(&self) -> Mark {
        Mark(self.runs.lock().quiet.next)
    }

    /// Marks a queued run as executing (it took a slot); returns whether to read it first, or
    /// `None` if it is not queued here.
    fn begin(&self, id: &RunId) -> Option<bool> {
        let mut runs = self.runs.lock();
        match runs.active.get_mut(id) {
            Some(a) if !a.started => {
                a.started = true;
                Some(std::mem::take(&mut a.check))
            }
            _ => None,
        }
    }

    /// A turn of an executing run ended: whether to look again (a nudge arrived while it
    /// executed). If not, the run leaves the dispatcher, recorded as gone quiet.
    fn look_again(&self, id: &RunId) -> bool {
        let mut runs = self.runs.lock();
        match runs.active.get_mut(id) {
            Some(a) if a.again => {
                a.again = false;
                true
            }
            _ => {
                runs.active.remove(id);
                runs.quiet.record(id.clone());
                false
            }
        }
    }
}

/// Run ids waiting for a slot, by kind.
#[derive(Default)]
struct Ready {
    wakes: VecDeque<RunId>,
    others: VecDeque<RunId>,
}

/// The runs known to the dispatcher.
#[derive(Default)]
struct Runs {
    /// Queued for a slot or executing here.
    active: HashMap<RunId, Active>,
    /// Went quiet lately.
    quiet: Quiet,
}

/// A run known to the dispatcher: queued (waiting for a slot) or executing.
struct Active {
    /// It holds an execution slot (a run task, or the transport consumer's task for it).
    started: bool,
    /// Queued on news that may be older than its last turn here: read the run first, and
    /// execute it only if it has something to do.
    check: bool,
    /// A nudge arrived while it executed: look again once the turn ends.
    again: bool,
}

/// How many runs that went quiet [`Quiet`] remembers.
const QUIET_REMEMBERED: usize = 8192;

/// The runs that went quiet here lately, numbered in the order they did (the newest number
/// per run). Bounded: the oldest are forgotten, and then a question about a run not
/// remembered has no sure answer.
#[derive(Default)]
struct Quiet {
    next: u64,
    by_run: HashMap<RunId, u64>,
    order: VecDeque<(u64, RunId)>,
    /// Every number below this may have been forgotten.
    forgotten_below: u64,
}

impl Quiet {
    fn record(&mut self, id: RunId) {
        let n = self.next;
        self.next += 1;
        self.by_run.insert(id.clone(), n);
        self.order.push_back((n, id));
        while self.order.len() > QUIET_REMEMBERED {
            let Some((old, id)) = self.order.pop_front() else { break };
            if self.by_run.get(&id) == Some(&old) {
                self.by_run.remove(&id);
                self.forgotten_below = old + 1;
            }
        }
    }

    /// Whether the run went quiet here at or after `mark`; `None`: it may have, forgotten since.
    fn since(&self, id: &RunId, mark: Mark) -> Option<bool> {
        match self.by_run.get(id) {
            Some(&n) => Some(n >= mark.0),
            None if self.forgotten_below > mark.0 => None,
            None => Some(false),
        }
    }
}

/// Whether a run as read from the store has something to do: it is pending, due, or running
/// (orphaned, or another engine's — whose claim answers `Busy` and re-checks, so a wake is
/// not lost). A blocked run is parked like a suspended one, and due the same way (as the
/// stores' due scans take it): a worker's result for its step wakes it while it is still
/// marked blocked.
fn has_work(run: &Run, now: Millis) -> bool {
    match run.status {
        RunStatus::Pending | RunStatus::Running => true,
        status if status.is_parked() => run.wake_at.is_some_and(|w| w <= now),
        _ => false,
    }
}

impl Shared {
    /// Run tasks executing turns right now.
    pub(crate) fn in_flight(&self) -> usize {
        self.dispatch.in_flight.load(Ordering::Acquire)
    }

    /// The most run tasks ever in flight at once.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.dispatch.max_in_flight.load(Ordering::Acquire)
    }

    /// Runs known to the dispatcher: queued for a slot or executing.
    pub(crate) fn dispatched(&self) -> usize {
        self.dispatch.runs.lock().active.len()
    }

    /// Waits for an execution slot (`None`: the semaphore is closed). When none is free, a
    /// turn holding its sleeps is woken first: it asks whether it may go on holding
    /// ([`TurnEnv::may_hold`](crate::turn::TurnEnv::may_hold): not while no slot is free), and
    /// suspends instead, so its slot goes to the run waiting here rather than sitting idle
    /// until its sleep ends. One turn per caller: the other held turns keep their slots.
    pub(super) async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.dispatch.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        let _wanted = Counted::new(&self.dispatch.slot_wanted);
        // Sequentially consistent with `hold_began`: either this sees the hold counted, or the
        // turn that began it sees this wait.
        if self.dispatch.held.load(Ordering::SeqCst) > 0 {
            self.nudge_a_held_turn();
        }
        self.dispatch.slots.clone().acquire_owned().await.ok()
    }

    /// Counts a turn beginning to wait out a held sleep; returns whether a caller waits for a
    /// slot already (the turn should then give its own up: see [`Shared::slot`]).
    pub(crate) fn hold_began(&self) -> bool {
        self.dispatch.held.fetch_add(1, Ordering::SeqCst);
        self.dispatch.slot_wanted.load(Ordering::SeqCst) > 0
    }

    /// Counts the end of a held turn's wait.
    pub(crate) fn hold_ended(&self) {
        self.dispatch.held.fetch_sub(1, Ordering::SeqCst);
    }

    /// From now on, a run task cut off by the shutdown records its run for
    /// [`Shared::release_interrupted`].
    pub(crate) fn record_interrupted(&self) {
        self.dispatch.interrupted.lock().get_or_insert_with(Vec::new);
    }

    /// Releases the leases of the runs whose turns the shutdown dropped.
    pub(crate) async fn release_interrupted(&self) {
        let interrupted = self.dispatch.interrupted.lock().take().unwrap_or_default();
        for id in interrupted {
            let _ = self.store.release_lease(&id, &self.owner).await;
        }
    }

    /// Whether an execution slot is free right now.
    pub(crate) fn has_free_slot(&self) -> bool {
        self.dispatch.slots.available_permits() > 0
    }

    /// Resolves once no run task is in flight.
    pub(crate) async fn until_idle(&self) {
        loop {
            let idle = self.dispatch.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The next run to execute.
    async fn next_ready(&self) -> RunId {
        loop {
            let changed = self.dispatch.ready_changed.notified();
            {
                let mut ready = self.dispatch.ready.lock();
                if let Some(id) = ready.wakes.pop_front().or_else(|| ready.others.pop_front()) {
                    return id;
                }
            }
            changed.await;
        }
    }

    pub(super) async fn dispatch_loop(self: Arc<Self>) {
        loop {
            let id = self.next_ready().await;
            if self.is_draining() {
                self.dispatch.runs.lock().active.remove(&id);
                continue;
            }
            let Some(slot) = self.slot().await else { return };
            if self.is_draining() {
                self.dispatch.runs.lock().active.remove(&id);
                continue;
            }
            let Some(check) = self.begin_queued(&id) else { continue };
            // Counted as in flight from here, so a shutdown waits for it even if it has not
            // been polled yet.
            let guard = TaskGuard::new(&self, id);
            let shared = self.clone();
            tokio::spawn(async move {
                shared.run_in_slot(guard, slot, check, None).await;
            });
        }
    }

    /// Marks a queued run as executing (it took a slot); returns whether to read it first, or
    /// `None` if it is not queued here.
    pub(super) fn begin_queued(&self, id: &RunId) -> Option<bool> {
        self.dispatch.begin(id)
    }

    /// Records a run handed over by the transport as queued here (so the pollers leave it
    /// alone while it waits for a slot; `since`: the mark of the item's news, if this engine
    /// sent it): `false` if it is queued or executing here already (an executing one looks
    /// again after its turn).
    pub(super) fn enter_queued(&self, id: &RunId, wake: bool, since: Option<Mark>) -> bool {
        self.dispatch.enter(id, Nudge::queued(wake, since)).is_some()
    }

    /// Forgets a run [`Shared::enter_queued`] recorded that will not execute here after all.
    pub(super) fn leave_queued(&self, id: &RunId) {
        let mut runs = self.dispatch.runs.lock();
        if runs.active.get(id).is_some_and(|a| !a.started) {
            runs.active.remove(id);
        }
    }

    /// Executes a run marked as executing here (`check`: read it first), until it is quiet or
    /// the engine shuts down (a shutdown drops the turn wherever it is; the store keeps what
    /// was committed, and `shutdown` releases the lease).
    /// With `result`: a worker's result for the run, recorded by its first claim (see
    /// [`Shared::complete_and_execute`]).
    /// `slot`: the execution slot it runs in, released when it is quiet.
    pub(super) async fn run_in_slot(
        self: &Arc<Self>,
        mut guard: TaskGuard,
        slot: OwnedSemaphorePermit,
        check: bool,
        first: Option<FirstClaim>,
    ) {
        let id = guard.id.clone();
        // Dropped last, whatever ends the drive (a panic in it included).
        let stash = HandStashed { shared: self, id: &id };
        guard.quiet = tokio::select! {
            biased;
            () = self.shutdown_signal() => false,
            () = self.run_until_quiet(&id, check, first) => true,
        };
        drop(guard);
        drop(slot);
        drop(stash);
    }

    /// Records the result of a worker beside this engine and starts the woken run's turn
    /// without another round trip: when this engine executes runs of the namespace, has a
    /// free execution slot and no run waiting for one, and the run is not
    /// queued or executing here, the run takes the slot and its first claim records the
    /// result in the same store call ([`Store::complete_task_and_claim`](durable_core::Store::complete_task_and_claim)).
    /// Otherwise the result is recorded alone and the run woken as usual. Returns the
    /// completion (`Err`: nothing was recorded, or the engine stopped before it could say).
    pub(crate) async fn complete_and_execute(
        self: &Arc<Self>,
        done: TaskDone,
        namespace: &str,
    ) -> StoreResult<TaskCompletion> {
        let mark = self.mark();
        let id = done.run_id.clone();
        let Some(slot) = self.slot_now(&id, namespace) else {
            let completion = self.store.complete_task(done).await?;
            if completion == TaskCompletion::Accepted {
                self.wake_in(id, namespace, mark);
            }
            return Ok(completion);
        };
        self.drive_with_first(id, slot, |reply| FirstClaim::Result { done, reply }, "the worker's result was recorded")
            .await
    }

    /// Drives `id` in `slot` (taken with [`Shared::slot_now`]), its first claim making the
    /// write `first` builds; returns that write's answer (`Err` too if the engine stopped
    /// before `what`).
    async fn drive_with_first<T: Send + 'static>(
        self: &Arc<Self>,
        id: RunId,
        slot: OwnedSemaphorePermit,
        first: impl FnOnce(tokio::sync::oneshot::Sender<StoreResult<T>>) -> FirstClaim,
        what: &str,
    ) -> StoreResult<T> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let first = first(reply);
        let guard = TaskGuard::new(self, id);
        let shared = self.clone();
        tokio::spawn(async move { shared.run_in_slot(guard, slot, false, Some(first)).await });
        answer.await.unwrap_or_else(|_| Err(StoreError::unavailable(format!("the engine stopped before {what}"))))
    }

    /// Sends a signal from this engine and wakes the run it reaches. When a run whose suspended
    /// turn this engine keeps in memory waits on the token, and an execution slot is free at
    /// once, the run takes the slot and its drive's first claim sends the signal and claims the
    /// run in the same store call ([`Store::send_signal_and_claim`](durable_core::Store::send_signal_and_claim)):
    /// the turn goes on without a claim of its own. Otherwise the signal is sent alone.
    pub(crate) async fn send_signal(self: &Arc<Self>, token: &str, payload: Payload) -> StoreResult<Delivery> {
        let mark = self.mark();
        let kept = self.warm.waiting_on(token);
        let slot = kept.as_ref().and_then(|(id, namespace, _)| Some((id.clone(), self.slot_now(id, namespace)?)));
        let (Some((_, _, from_seq)), Some((id, slot))) = (kept, slot) else {
            let delivery = self.store.send_signal(token, payload, self.clock.now()).await?;
            self.wake_delivered(std::slice::from_ref(&delivery), mark);
            return Ok(delivery);
        };
        let token = token.to_string();
        let first = |reply| FirstClaim::Signal { token, payload, from_seq, reply };
        let delivery = self.drive_with_first(id.clone(), slot, first, "the signal was sent").await?;
        // Another run's wait took it: that run is woken as usual (this one's drive ends).
        if !delivery.is_to(&id) {
            self.wake_delivered(std::slice::from_ref(&delivery), mark);
        }
        Ok(delivery)
    }

    /// An execution slot for `id` at once, with the run marked as executing here (see
    /// [`Shared::complete_and_execute`]); `None` when the run must wait its turn.
    fn slot_now(&self, id: &RunId, namespace: &str) -> Option<OwnedSemaphorePermit> {
        if !self.config.execute || self.is_stopping() || self.is_draining() || !self.serves(namespace) {
            return None;
        }
        // With a run queue too: the task queue already spread the work over the workers, and
        // the worker that took the task is beside this engine. Sent through the queue, the
        // wake would cost an enqueue, a queue claim and an ack before the same claim.
        {
            let ready = self.dispatch.ready.lock();
            if !ready.wakes.is_empty() || !ready.others.is_empty() {
                return None; // runs waiting for a slot go first
            }
        }
        let slot = self.dispatch.slots.clone().try_acquire_owned().ok()?;
        self.dispatch.enter_started(id).then_some(slot)
    }

    /// Drives the run, and looks again as long as nudges arrived while it executed: a store
    /// read, and another drive only if the run has something to do — so a wake racing the end
    /// of a turn costs a read, not a replay, and is never lost (the nudge's own store write
    /// came before it, so the read sees it). `check`: read before the first drive too.
    /// Removes the run's dispatcher entry when it returns, recording it as gone quiet: from
    /// then on, a new nudge starts a new task.
    async fn run_until_quiet(self: &Arc<Self>, id: &RunId, mut check: bool, mut first: Option<FirstClaim>) {
        loop {
            if let Some(first) = first.take() {
                self.drive_run(id, Some(first)).await;
            } else if !check || self.has_work(id).await {
                self.drive_run(id, None).await;
            }
            if !self.dispatch.look_again(id) {
                return;
            }
            check = true;
        }
    }

    /// Reads the run: whether it has something to do now — or this engine's poller claimed it
    /// and no turn parked it since ([`Shared::claimed_here`]: the claim moved its `wake_at`).
    /// A read error says yes: a spare turn is harmless, a missed wake is not.
    async fn has_work(&self, id: &RunId) -> bool {
        match self.read_run(id).await {
            Ok(run) => run.is_some_and(|r| has_work(&r, self.clock.now()) || self.claimed_here(&r)),
            Err(_) => true,
        }
    }
}

/// Keeps the in-flight gauge and the dispatcher's view right however a run task ends
/// (including being aborted).
pub(super) struct TaskGuard {
    shared: Arc<Shared>,
    id: RunId,
    /// The run went quiet: `run_until_quiet` already removed its dispatcher entry, and any
    /// entry there now belongs to a newer task of the same run, which must not be touched
    /// (removing it would let a third task execute the run beside the second).
    quiet: bool,
}

impl TaskGuard {
    pub(super) fn new(shared: &Arc<Shared>, id: RunId) -> Self {
        let now = shared.dispatch.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.dispatch.max_in_flight.fetch_max(now, Ordering::AcqRel);
        TaskGuard { shared: shared.clone(), id, quiet: false }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let dispatch = &self.shared.dispatch;
        if let Some(interrupted) = dispatch.interrupted.lock().as_mut() {
            interrupted.push(self.id.clone());
        }
        if !self.quiet {
            // Cut off (shutdown or abort): the entry is still this task's.
            dispatch.runs.lock().active.remove(&self.id);
        }
        dispatch.in_flight.fetch_sub(1, Ordering::AcqRel);
        dispatch.idle.notify_waiters();
    }
}

/// Hands the tasks a run's last turn dispatched to workers beside this engine to them when
/// dropped: once the run no longer executes here and its slot is free, so a result that comes
/// back at once claims it in the same store call. Also when the drive unwinds, so the tasks
/// and the worker slots they hold are never left behind.
struct HandStashed<'a> {
    shared: &'a Arc<Shared>,
    id: &'a RunId,
}

impl Drop for HandStashed<'_> {
    fn drop(&mut self) {
        let orphans = self.shared.hand_stashed(self.id);
        // Their worker stopped taking tasks: back to the store (rare), off this frame.
        if !orphans.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let shared = self.shared.clone();
            runtime.spawn(async move { shared.hand_back_tasks(orphans).await });
        }
    }
}

/// Counts one of something in `count` while it lasts: a caller waiting for an execution slot,
/// an item in the run queue consumer's hands (their futures may be dropped).
pub(super) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    pub(super) fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        RunId::new(s)
    }

    /// Takes a slot for a queued run, as the dispatcher does.
    fn start(d: &Dispatch, id: &RunId) {
        d.begin(id).expect("queued");
    }

    /// A turn of the run ends: whether it looks again.
    fn end_turn(d: &Dispatch, id: &RunId) -> bool {
        d.look_again(id)
    }

    #[test]
    fn a_run_is_queued_once_however_often_it_is_nudged() {
        let d = Dispatch::new(4);
        let (r, m) = (id("r"), d.mark());
        assert_eq!(d.enter(&r, Nudge::start(m)), Some(false));
        for nudge in [Nudge::start(m), Nudge::wake(m), Nudge::found(false, m), Nudge::queued(true, None)] {
            assert_eq!(d.enter(&r, nudge), None, "{nudge:?}");
        }
        assert!(!d.runs.lock().active[&r].again, "a queued run reads the latest state anyway");
    }

    #[test]
    fn a_nudge_for_an_executing_run_makes_it_look_again_but_a_pollers_find_does_not() {
        let d = Dispatch::new(4);
        let (r, m) = (id("r"), d.mark());
        d.enter(&r, Nudge::start(m));
        start(&d, &r);
        assert_eq!(d.enter(&r, Nudge::found(true, m)), None);
        assert!(!end_turn(&d, &r), "a poller's find of an executing run is older than the turn");
        d.enter(&r, Nudge::start(d.mark()));
        start(&d, &r);
        assert_eq!(d.enter(&r, Nudge::wake(m)), None);
        assert!(end_turn(&d, &r), "a wake racing the end of the turn is not lost");
        assert!(!end_turn(&d, &r));
    }

    #[test]
    fn news_older_than_a_turn_that_went_quiet_is_dropped_or_read_first() {
        let d = Dispatch::new(4);
        let r = id("r");
        let before = d.mark();
        d.enter(&r, Nudge::start(before));
        start(&d, &r);
        end_turn(&d, &r);
        // News read before the run went quiet: a poller's find is dropped, a start or a wake
        // reads the run first.
        assert_eq!(d.enter(&r, Nudge::found(false, before)), None);
        assert!(d.knows(&r, before));
        assert_eq!(d.enter(&r, Nudge::wake(before)), Some(true));
        start(&d, &r);
        end_turn(&d, &r);
        // News read after it went quiet: executed as it is.
        let after = d.mark();
        assert!(!d.knows(&r, after));
        assert_eq!(d.enter(&r, Nudge::found(true, after)), Some(false));
        // An item of the run queue this engine sent carries its mark; another's is taken as
        // news.
        d.runs.lock().active.remove(&r);
        assert_eq!(d.enter(&r, Nudge::queued(true, Some(before))), Some(true));
        let other = id("other");
        assert_eq!(d.enter(&other, Nudge::queued(false, None)), Some(false));
    }

    #[test]
    fn a_run_forgotten_since_the_mark_is_read_first() {
        let d = Dispatch::new(4);
        let r = id("r");
        let mark = d.mark();
        d.enter(&r, Nudge::start(mark));
        start(&d, &r);
        end_turn(&d, &r);
        for i in 0..QUIET_REMEMBERED {
            let other = id(&format!("other-{i}"));
            d.enter(&other, Nudge::start(d.mark()));
            start(&d, &other);
            end_turn(&d, &other);
        }
        assert_eq!(d.runs.lock().quiet.by_run.len(), QUIET_REMEMBERED, "bounded");
        assert!(!d.runs.lock().quiet.by_run.contains_key(&r), "forgotten");
        // It may have gone quiet since the mark: a poller's find and a wake both read it first.
        assert_eq!(d.enter(&r, Nudge::found(false, mark)), Some(true));
        d.runs.lock().active.remove(&r);
        assert_eq!(d.enter(&r, Nudge::wake(mark)), Some(true));
        // A mark taken after it was forgotten knows it did not.
        d.runs.lock().active.remove(&r);
        assert_eq!(d.enter(&r, Nudge::found(false, d.mark())), Some(false));
    }

    /// A poller claims a due run in a claim begun before a turn of the run went quiet here
    /// (the turn parked it due, just before the claim): a poller's find would be dropped as
    /// older than that turn, but the claim moved the run's `wake_at` so that no poller finds it
    /// again for a lease period — so the claim queues a wake that reads the run first, and the
    /// read, knowing the claim, finds the run due. Once a turn parks the run again it is not.
    #[tokio::test]
    async fn a_claimed_run_that_went_quiet_here_is_read_and_found_due() {
        use durable_core::{Claim, ClaimOutcome, Commit, RunQuery, Store, TurnEnd};

        let store = Arc::new(durable_store_memory::MemoryStore::new());
        let engine = |owner: &str| {
            let config = crate::config::EngineConfig::default();
            Shared::new(store.clone(), Arc::new(crate::clock::SystemClock), config, None, None, owner.into())
        };
        let (here, other) = (engine("here"), engine("other"));
        let now = here.clock.now();
        let r = id("r");
        let new = durable_core::NewRun {
            trace_context: None,
            admission: None,
            id: r.clone(),
            workflow: "w".into(),
            version: 1,
            namespace: "default".into(),
            input: durable_core::Payload::encode(&()).expect("encodes"),
            tags: Vec::new(),
            priority: 0,
            parent: None,
            created_at: now,
            start_at: None,
        };
        store.create_run(new).await.expect("create");
        let park = |wake_at: Millis| {
            let (store, r) = (store.clone(), r.clone());
            async move {
                let claim = Claim { run_id: r.clone(), owner: "here".into(), lease_until: now + 60_000, now };
                let ClaimOutcome::Acquired { run, .. } = store.claim_run(claim).await.expect("claim") else {
                    panic!("not acquired")
                };
                let mut commit = Commit::new(r, "here", now);
                commit.end = Some(TurnEnd::Suspend { wake_at: Some(wake_at), seen_wake_gen: run.wake_gen });
                store.commit(commit).await.expect("park");
            }
        };
        // The poller's claim begins; a turn of the run parks it, due, and goes quiet here.
        let mark = here.mark();
        let d = &here.dispatch;
        d.enter(&r, Nudge::wake(mark));
        start(d, &r);
        park(now - 1).await;
        end_turn(d, &r);
        assert!(d.knows(&r, mark), "a poller's find would be dropped");
        // The claim takes it.
        let until = now + 30_000;
        let query = RunQuery { namespace: None, workflows: None, now, limit: 10, leave_queued_since: None };
        assert_eq!(store.claim_due_runs(&query, until).await.expect("claim due"), vec![r.clone()]);
        here.record_claims(std::slice::from_ref(&r), until);
        here.queue_claimed(r.clone(), mark, until);
        assert!(d.runs.lock().active[&r].check, "queued to be read first");
        assert!(here.has_work(&r).await, "the claim tells the read that the run is due");
        assert!(!other.has_work(&r).await, "without the claim, its wake_at says later");
        // A turn parks it again: not due any more, claim or not.
        park(now + 3_600_000).await;
        assert!(!here.has_work(&r).await);
    }

    #[test]
    fn only_a_due_pending_or_running_run_has_work() {
        // A blocked run is due like a suspended one: a result for its step is work.
        let mut run = durable_core::NewRun {
            trace_context: None,
            admission: None,
            id: id("r"),
            workflow: "w".into(),
            version: 1,
            namespace: "default".into(),
            input: durable_core::Payload::encode(&()).expect("encodes"),
            tags: Vec::new(),
            priority: 0,
            parent: None,
            created_at: 0,
            start_at: None,
        }
        .into_run();
        for (status, wake_at, work) in [
            (RunStatus::Pending, None, true),
            (RunStatus::Running, None, true),
            (RunStatus::Suspended, Some(10), true),
            (RunStatus::Suspended, Some(11), false),
            (RunStatus::Suspended, None, false),
            (RunStatus::Blocked, Some(10), true),
            (RunStatus::Blocked, Some(11), false),
            (RunStatus::Blocked, None, false),
            (RunStatus::Completed, None, false),
            (RunStatus::Failed, Some(0), false),
        ] {
            (run.status, run.wake_at) = (status, wake_at);
            assert_eq!(has_work(&run, 10), work, "{status:?} {wake_at:?}");
        }
    }
}
