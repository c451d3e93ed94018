//! Event triggers: what a workflow registered with
//! [`WorkflowOptions::on_event`](crate::WorkflowOptions::on_event) starts on, and the options
//! of a publish.

use std::time::Duration;

use durable_core::Gather;

/// One event that starts runs of a workflow ([`WorkflowOptions::on_event`](crate::WorkflowOptions::on_event)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventTrigger {
    /// The event name.
    pub event: String,
    /// The JSON subset a payload must contain.
    pub matcher: serde_json::Value,
    /// Gather events before starting (`None`: one run per event).
    pub gather: Option<Gather>,
    /// The payload field whose value keys the gathering.
    pub key_field: Option<String>,
}

impl EventTrigger {
    /// The gathering key of `payload`: the key field's value (a string as is, anything
    /// else as JSON), or `""`.
    pub(crate) fn key_of(&self, payload: &serde_json::Value) -> String {
        match self.key_field.as_ref().and_then(|f| payload.get(f)) {
            None => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        }
    }

    /// Whether an event's payload starts the workflow: the matcher is a JSON subset of it;
    /// `null` or `{}` takes every payload (also one that is not an object).
    pub(crate) fn accepts(&self, payload: &serde_json::Value) -> bool {
        match &self.matcher {
            serde_json::Value::Null => true,
            serde_json::Value::Object(fields) if fields.is_empty() => true,
            matcher => durable_core::json_subset(matcher, payload),
        }
    }

    /// Checks the trigger: a name, and a batch of at least one item.
    pub(crate) fn check(&self, workflow: &str) -> Result<(), String> {
        if self.event.is_empty() {
            return Err(format!("workflow {workflow:?}: an event trigger needs a non-empty event name"));
        }
        match self.gather {
            Some(Gather::Batch { max_items: 0, .. }) => Err(format!(
                "workflow {workflow:?}: the batch of event {:?} takes at most 0 items; use 1 or more",
                self.event
            )),
            Some(Gather::Debounce { quiet_ms: 0 }) => Err(format!(
                "workflow {workflow:?}: the debounce of event {:?} waits 0 ms; use a quiet period of at least 1 ms, or no debounce",
                self.event
            )),
            _ => Ok(()),
        }
    }
}

/// Options of [`Engine::publish`](crate::Engine::publish).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishOptions {
    /// Publish once per id: the same `(event name, id)` published again within the engine's
    /// `event_dedupe_window` (default 24 h) delivers, buffers and starts nothing.
    pub dedupe_id: Option<String>,
    /// How long this id is remembered (default: the engine's `event_dedupe_window`).
    pub dedupe_window: Option<Duration>,
}

impl PublishOptions {
    /// Options that publish once per `id`.
    pub fn dedupe(id: impl Into<String>) -> Self {
        PublishOptions { dedupe_id: Some(id.into()), dedupe_window: None }
    }

    /// Remembers the dedupe id this long.
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.dedupe_window = Some(window);
        self
    }
}
