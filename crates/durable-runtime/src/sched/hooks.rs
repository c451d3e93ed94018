//! What callers register with the engine or listen to: its events, dead-run listeners,
//! update validators, per-workflow execution timeouts and event triggers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use durable_core::{Payload, Run};
use parking_lot::{Mutex, RwLock};
use tokio::sync::broadcast;

use crate::events::EngineEvent;
use crate::trigger::EventTrigger;

/// A callback fired when a run becomes `dead`.
pub(crate) type DeadListener = Arc<dyn Fn(&Run) + Send + Sync>;

/// A validator of update arguments, registered per workflow and update name.
pub(crate) type UpdateValidator = Arc<dyn Fn(&Payload) -> Result<(), String> + Send + Sync>;

/// What callers registered or listen to: engine events, dead-run listeners, update
/// validators and execution timeouts.
pub(crate) struct Hooks {
    events: broadcast::Sender<EngineEvent>,
    dead_listeners: RwLock<Vec<DeadListener>>,
    update_validators: Mutex<HashMap<(String, String), UpdateValidator>>,
    timeouts: Mutex<BTreeMap<String, Duration>>,
    /// Event triggers by workflow.
    triggers: RwLock<BTreeMap<String, Vec<EventTrigger>>>,
}

impl Hooks {
    pub(super) fn new() -> Self {
        Hooks {
            events: broadcast::channel(4096).0,
            dead_listeners: RwLock::new(Vec::new()),
            update_validators: Mutex::new(HashMap::new()),
            timeouts: Mutex::new(BTreeMap::new()),
            triggers: RwLock::new(BTreeMap::new()),
        }
    }

    pub(super) fn emit(&self, event: EngineEvent) {
        let _ = self.events.send(event);
    }

    /// A receiver of this engine's events.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<EngineEvent> {
        self.events.subscribe()
    }

    pub(crate) fn add_dead_listener(&self, listener: DeadListener) {
        self.dead_listeners.write().push(listener);
    }

    /// The dead-run listeners, copied: they are called without the lock held.
    pub(super) fn dead_listeners(&self) -> Vec<DeadListener> {
        self.dead_listeners.read().clone()
    }

    pub(crate) fn add_update_validator(&self, workflow: &str, update: &str, validator: UpdateValidator) {
        self.update_validators.lock().insert((workflow.to_string(), update.to_string()), validator);
    }

    /// The validator of `update` for runs of `workflow`, copied: it is called without the lock
    /// held.
    pub(crate) fn update_validator(&self, workflow: &str, update: &str) -> Option<UpdateValidator> {
        self.update_validators.lock().get(&(workflow.to_string(), update.to_string())).cloned()
    }

    /// Sets (or, with `None`, removes) the execution timeout of a workflow.
    pub(crate) fn set_timeout(&self, workflow: &str, limit: Option<Duration>) {
        let mut timeouts = self.timeouts.lock();
        match limit {
            Some(limit) => timeouts.insert(workflow.to_string(), limit),
            None => timeouts.remove(workflow),
        };
    }

    /// Sets the event triggers of a workflow (replacing the ones it had).
    pub(crate) fn set_triggers(&self, workflow: &str, triggers: Vec<EventTrigger>) {
        let mut all = self.triggers.write();
        if triggers.is_empty() {
            all.remove(workflow);
        } else {
            all.insert(workflow.to_string(), triggers);
        }
    }

    /// The triggers on events named `event`, with their workflows, copied.
    pub(crate) fn triggers_for(&self, event: &str) -> Vec<(String, EventTrigger)> {
        let all = self.triggers.read();
        all.iter()
            .flat_map(|(wf, ts)| ts.iter().filter(|t| t.event == event).map(move |t| (wf.clone(), t.clone())))
            .collect()
    }

    /// Every execution timeout, copied.
    pub(super) fn timeouts(&self) -> Vec<(String, Duration)> {
        self.timeouts.lock().iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}
