//! The control plane from the engine's side: what it publishes (its events, filtered by
//! [`EventForwarding`]; cancels; "work was queued" nudges, coalesced), what it does with what
//! it hears from other instances (re-emits their events to local subscribers, and wakes the
//! local `wait_for_run` callers of a run another engine settled; stops its own turn of a
//! cancelled run), and the registry of the turns executing here that a cancel stops.
//!
//! Nothing here waits in a turn: an event is handed to a bounded queue (dropped and counted
//! when it is full) that a background task publishes in batches, a nudge is a set insert that a
//! second task publishes at most once per [`NUDGE_INTERVAL`] per queue. A cancel is published
//! by the caller of `cancel`, after the store write.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use durable_core::{ControlMessage, ControlPlane, ControlSink, RunId};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};

use super::Shared;
use crate::events::{EngineEvent, EventForwarding};
use crate::turn::TurnState;

/// Events waiting to be published; beyond this they are dropped (and counted).
const EVENT_QUEUE: usize = 4096;

/// Events published per batch (one `publish_all`).
const EVENT_BATCH: usize = 256;

/// A nudge for one queue is published at most once per this interval (the first one at once).
pub(super) const NUDGE_INTERVAL: Duration = Duration::from_millis(20);

/// How long a cancel's publish, or the last events' at shutdown, may take.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Failures are reported at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The engine's control plane and what travels on it.
pub(super) struct Control {
    plane: Arc<dyn ControlPlane>,
    /// Which events are published (`None` on the engine's own default plane).
    forwarding: EventForwarding,
    events: mpsc::Sender<EngineEvent>,
    /// The publisher loop's end of `events` (a tokio mutex: the loop holds it across its
    /// receive; the shutdown takes it to publish what is left).
    pending_events: tokio::sync::Mutex<mpsc::Receiver<EngineEvent>>,
    /// Events dropped because the queue was full, since the last report.
    dropped_report: Mutex<FailureTally>,
    publish_report: Mutex<FailureTally>,
    /// The kinds of messages whose last publish failed (each one's recovery is reported).
    publish_failing: Mutex<BTreeSet<String>>,
    /// Queues to nudge: `(namespace, task queue)`; `None` queue: the run queue.
    nudges: Mutex<BTreeSet<(Option<String>, Option<String>)>>,
    nudged: Notify,
    /// The runs executing here, with their turn (if one is under way) and whether a cancel
    /// arrived since their last claim began.
    turns: Mutex<HashMap<RunId, Watched>>,
    next_watch: AtomicU64,
}

/// A run executing here, as the cancel path sees it.
struct Watched {
    /// Which [`TurnWatch`] registered it (a newer task of the same run may replace it).
    token: u64,
    /// A cancel arrived since the run's last claim began.
    cancelled: bool,
    turn: Option<Weak<TurnState>>,
}

impl Control {
    /// `plane: None`: the engine gets one of its own (an in-process plane), on which no event
    /// is forwarded.
    pub(super) fn new(plane: Option<Arc<dyn ControlPlane>>, forwarding: EventForwarding) -> Self {
        let (plane, forwarding) = match plane {
            Some(plane) => (plane, forwarding),
            None => (
                Arc::new(durable_transport::InProcessControlPlane::new()) as Arc<dyn ControlPlane>,
                EventForwarding::None,
            ),
        };
        let (events, pending_events) = mpsc::channel(EVENT_QUEUE);
        Control {
            plane,
            forwarding,
            events,
            pending_events: tokio::sync::Mutex::new(pending_events),
            dropped_report: Mutex::new(FailureTally::default()),
            publish_report: Mutex::new(FailureTally::default()),
            publish_failing: Mutex::new(BTreeSet::new()),
            nudges: Mutex::new(BTreeSet::new()),
            nudged: Notify::new(),
            turns: Mutex::new(HashMap::new()),
            next_watch: AtomicU64::new(0),
        }
    }

    pub(super) fn plane(&self) -> &Arc<dyn ControlPlane> {
        &self.plane
    }
}

/// Failures of one kind counted between reports: reported at most once a minute, with how
/// many there were since the last report (a broker outage would otherwise log one line per
/// refused item).
#[derive(Debug, Default)]
pub(crate) struct FailureTally {
    since_report: u64,
    last_report: Option<Instant>,
}

impl FailureTally {
    /// Counts `n` failures; returns how many to report now (all since the last report) if a
    /// report is due.
    pub(crate) fn failed(&mut self, n: u64) -> Option<u64> {
        self.since_report += n;
        if self.last_report.is_some_and(|t| t.elapsed() < REPORT_EVERY) {
            return None;
        }
        self.last_report = Some(Instant::now());
        Some(std::mem::take(&mut self.since_report))
    }
}

/// The registration of a run executing here (from its first claim to the end of its last
/// turn), so a cancel heard meanwhile stops its turn. Dropped when the run task is done.
pub(super) struct TurnWatch<'a> {
    shared: &'a Shared,
    id: RunId,
    token: u64,
}

impl TurnWatch<'_> {
    /// A claim of the run begins: a cancel heard before now is one the claim sees in the store.
    pub(super) fn claiming(&self) {
        if let Some(w) = self.shared.control.turns.lock().get_mut(&self.id).filter(|w| w.token == self.token) {
            w.cancelled = false;
        }
    }

    /// The turn of the claimed run starts: a cancel heard since the claim began (which the
    /// claim may not have seen) stops it at once; a later one stops it when heard.
    pub(super) fn turn(&self, t: &Arc<TurnState>) {
        let cancelled = {
            let mut turns = self.shared.control.turns.lock();
            match turns.get_mut(&self.id).filter(|w| w.token == self.token) {
                Some(w) => {
                    w.turn = Some(Arc::downgrade(t));
                    w.cancelled
                }
                None => false,
            }
        };
        if cancelled {
            t.interrupt(format!("run {} was cancelled while its turn was being claimed", self.id));
        }
    }
}

impl Drop for TurnWatch<'_> {
    fn drop(&mut self) {
        let mut turns = self.shared.control.turns.lock();
        if turns.get(&self.id).is_some_and(|w| w.token == self.token) {
            turns.remove(&self.id);
        }
    }
}

impl Shared {
    /// The plane this engine publishes on and listens to.
    pub(crate) fn control_plane(&self) -> &Arc<dyn ControlPlane> {
        self.control.plane()
    }

    /// Registers `id` as executing here until the returned watch is dropped.
    pub(super) fn watch_turns(&self, id: &RunId) -> TurnWatch<'_> {
        let token = self.control.next_watch.fetch_add(1, Ordering::Relaxed);
        let watched = Watched { token, cancelled: false, turn: None };
        self.control.turns.lock().insert(id.clone(), watched);
        TurnWatch { shared: self, id: id.clone(), token }
    }

    /// Wakes the driver of every turn executing here, so that each asks its core again (see
    /// [`TurnState::nudge`]).
    pub(super) fn nudge_turns(&self) {
        for t in self.executing_turns() {
            t.nudge();
        }
    }

    /// Wakes the driver of one turn waiting out a held sleep here (one no other caller asked
    /// already), so that it asks its core again whether it may go on holding — it may not
    /// while no slot is free, and suspends: one slot for the one caller waiting.
    pub(super) fn nudge_a_held_turn(&self) {
        if let Some(t) = self.executing_turns().into_iter().find(|t| t.take_holding()) {
            t.nudge();
        }
    }

    fn executing_turns(&self) -> Vec<Arc<TurnState>> {
        self.control.turns.lock().values().filter_map(|w| w.turn.as_ref().and_then(Weak::upgrade)).collect()
    }

    /// An operator cancelled `id` (the store holds the cancel): the turn executing it here, if
    /// any, stops at once and the run is claimed again, so what follows is decided on what the
    /// store holds (nothing, for an abandoned run; the undos, for a cancel with compensation).
    pub(super) fn interrupt_turn(&self, id: &RunId, why: String) {
        // A turn of the run kept in memory is stale now: the next claim replays.
        self.drop_warm_run(id);
        let turn = {
            let mut turns = self.control.turns.lock();
            let Some(w) = turns.get_mut(id) else { return };
            w.cancelled = true;
            w.turn.as_ref().and_then(Weak::upgrade)
        };
        if let Some(t) = turn {
            tracing::debug!(run_id = %id, "stopping the turn: {why}");
            t.interrupt(why);
        }
    }

    /// Hands an event to the publisher (if this engine forwards it). Never waits: when the
    /// queue is full the event is dropped and counted, reported at most once a minute.
    pub(super) fn forward_event(&self, event: &EngineEvent) {
        let control = &self.control;
        if !control.forwarding.forwards(event) {
            return;
        }
        if control.events.try_send(event.clone()).is_ok() {
            return;
        }
        if let Some(dropped) = control.dropped_report.lock().failed(1) {
            tracing::warn!(
                dropped,
                "the control plane is not keeping up: {dropped} engine events were not forwarded to other engines \
                 since the last report"
            );
        }
    }

    /// Asks for a nudge of `queue` (`None`: the run queue) of `namespace` to be published:
    /// at once if none was lately, else within [`NUDGE_INTERVAL`].
    pub(super) fn nudge(&self, namespace: Option<&str>, queue: Option<&str>) {
        let key = (namespace.map(str::to_string), queue.map(str::to_string));
        let added = self.control.nudges.lock().insert(key);
        if added {
            self.control.nudged.notify_one();
        }
    }

    /// Publishes `Cancel` for a run whose cancel the store applied. A failure is logged: a
    /// turn of the run elsewhere then stops at its next commit instead.
    pub(super) async fn publish_cancel(&self, id: &RunId) {
        let message = ControlMessage::Cancel { origin: self.owner.clone(), run_id: id.clone() };
        match tokio::time::timeout(PUBLISH_TIMEOUT, self.control.plane.publish(message)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(run_id = %id, error = %e, "could not publish the cancel; a turn of the run on another engine stops at its next commit")
            }
            Err(_) => {
                tracing::warn!(run_id = %id, "publishing the cancel timed out; a turn of the run on another engine stops at its next commit")
            }
        }
    }

    /// Starts hearing the plane: subscribes now if the plane answers without waiting (the
    /// in-process plane and PostgreSQL's do), otherwise in the returned task.
    pub(super) fn subscribe_control(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let weak = Arc::downgrade(self);
        let sink: ControlSink = Arc::new(move |message| {
            if let Some(shared) = weak.upgrade() {
                shared.heard(message);
            }
        });
        let plane = self.control.plane.clone();
        let mut subscribe = Box::pin(async move {
            if let Err(e) = plane.subscribe(sink).await {
                tracing::warn!(error = %e, "could not subscribe to the control plane; events, cancels and nudges of other engines are not heard");
            }
        });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match subscribe.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(()) => None,
            std::task::Poll::Pending => Some(tokio::spawn(subscribe)),
        }
    }

    /// A message from the plane (called on the plane's listener: hands it on, never waits).
    fn heard(&self, message: ControlMessage) {
        if message.origin() == self.owner {
            return; // what this engine did, it has acted on already
        }
        match message {
            ControlMessage::Event { event, .. } => match serde_json::from_value::<EngineEvent>(event) {
                Ok(event) => {
                    // `wait_for_run` callers here read the run now, not at their next poll.
                    match &event {
                        EngineEvent::RunSettled { run_id, .. } | EngineEvent::RunDeleted { run_id, .. } => {
                            self.notify_run(run_id)
                        }
                        EngineEvent::RunSuspended { run_id, .. } => self.notify_suspended(run_id),
                        _ => {}
                    }
                    self.hooks.emit(event);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "an engine event from another engine does not decode (a newer version?); dropped")
                }
            },
            ControlMessage::Cancel { origin, run_id } => {
                let why = format!("run {run_id} was cancelled by an operator (on {origin})");
                self.interrupt_turn(&run_id, why);
            }
            // Work other engines queued: this engine's run-queue consumer is the transport's
            // (`ControlWakeups` nudges it); task queues are workers'.
            _ => {}
        }
    }

    /// Publishes the forwarded events, in batches, as they come.
    pub(super) async fn event_loop(self: Arc<Self>) {
        let mut batch = Vec::with_capacity(EVENT_BATCH);
        loop {
            {
                let mut rx = self.control.pending_events.lock().await;
                if rx.recv_many(&mut batch, EVENT_BATCH).await == 0 {
                    return;
                }
            }
            self.publish_events(&mut batch).await;
        }
    }

    /// Publishes what is left in the event queue (the shutdown, once every turn ended).
    pub(crate) async fn flush_events(&self) {
        let mut batch = Vec::new();
        {
            let mut rx = self.control.pending_events.lock().await;
            while let Ok(event) = rx.try_recv() {
                batch.push(event);
            }
        }
        if !batch.is_empty() {
            let _ = tokio::time::timeout(PUBLISH_TIMEOUT, self.publish_events(&mut batch)).await;
        }
    }

    async fn publish_events(&self, batch: &mut Vec<EngineEvent>) {
        let messages: Vec<ControlMessage> = batch
            .drain(..)
            .filter_map(|event| match serde_json::to_value(&event) {
                Ok(event) => Some(ControlMessage::Event { origin: self.owner.clone(), event }),
                Err(e) => {
                    tracing::debug!(error = %e, ?event, "an engine event does not encode; not forwarded");
                    None
                }
            })
            .collect();
        self.publish(messages, "engine events").await;
    }

    /// Publishes the nudges asked for: the first at once, then at most one per queue per
    /// [`NUDGE_INTERVAL`].
    pub(super) async fn nudge_loop(self: Arc<Self>) {
        loop {
            self.control.nudged.notified().await;
            let keys = std::mem::take(&mut *self.control.nudges.lock());
            let messages = keys
                .into_iter()
                .map(|(namespace, queue)| ControlMessage::Enqueued { origin: self.owner.clone(), namespace, queue })
                .collect();
            self.publish(messages, "nudges").await;
            tokio::time::sleep(NUDGE_INTERVAL).await;
        }
    }

    async fn publish(&self, messages: Vec<ControlMessage>, what: &str) {
        if messages.is_empty() {
            return;
        }
        let n = messages.len();
        match self.control.plane.publish_all(messages).await {
            Ok(()) => {
                if self.control.publish_failing.lock().remove(what) {
                    tracing::info!("the control plane is working again: {what} are published");
                }
            }
            Err(e) => {
                self.control.publish_failing.lock().insert(what.to_string());
                if self.control.publish_report.lock().failed(1).is_some() {
                    tracing::warn!(error = %e, "the control plane is failing: {n} {what} not published (reported at most once a minute)");
                }
            }
        }
    }
}
