//! Event triggers that gather: debounce and batch buffers, and the event publish that fills
//! them.
//!
//! A workflow registered to start on an event either starts one run per matching event, or
//! gathers events per key in a [`TriggerBuffer`] kept in the store: `debounce` keeps the last
//! payload and starts one run after a quiet period; `batch` collects up to `max_items`
//! payloads and starts one run when full or `max_wait` after the first. The decisions are the
//! pure functions here; a store applies them inside the same transaction as the publish (or
//! the flush of a due buffer), so a crash between events loses none.

use serde::{Deserialize, Serialize};

use crate::{Millis, NewRun, Payload, RunId};

/// How a trigger gathers events before starting a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Gather {
    /// One run with the last payload once no event came for `quiet_ms`.
    Debounce {
        /// The quiet period.
        quiet_ms: Millis,
    },
    /// One run with up to `max_items` payloads (as a JSON array), started when full or
    /// `max_wait_ms` after the first.
    Batch {
        /// Payloads per run (at least 1).
        max_items: u32,
        /// The longest the first payload waits.
        max_wait_ms: Millis,
    },
}

/// Events gathered for one `(workflow, key)`, waiting to start a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerBuffer {
    /// The workflow to start.
    pub workflow: String,
    /// The gathering key (from the payload, or `""`).
    pub key: String,
    /// Names this generation of the buffer; the run it starts is `trig:<workflow>:<batch_id>`.
    pub batch_id: String,
    /// How it gathers.
    pub gather: Gather,
    /// The run to start (id and input are filled in when it starts).
    pub run: NewRun,
    /// Gathered payloads, oldest first (one for a debounce).
    pub payloads: Vec<Payload>,
    /// When the first payload arrived.
    pub first_at: Millis,
    /// When the last payload arrived.
    pub last_at: Millis,
    /// When the run starts unless more events change it. Stores index it.
    pub due_at: Millis,
}

/// One gathering trigger an event feeds, part of [`Publish`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferAppend {
    /// The workflow to start.
    pub workflow: String,
    /// The gathering key.
    pub key: String,
    /// How it gathers.
    pub gather: Gather,
    /// The id of a buffer this event opens (a fresh UUID; unused if one is open).
    pub batch_id: String,
    /// The run a full or due buffer starts (namespace, version, tags, priority; id and input
    /// are filled in).
    pub run: NewRun,
}

/// What [`TriggerBuffer::gather`] leaves.
#[derive(Debug, Clone, PartialEq)]
pub enum Gathered {
    /// The buffer to store (created or updated).
    Keep(TriggerBuffer),
    /// The buffer is full: start this run and delete the buffer.
    Start(NewRun),
}

impl TriggerBuffer {
    /// Adds an event's payload to the open buffer (`open`) or a new one.
    pub fn gather(open: Option<TriggerBuffer>, append: &BufferAppend, payload: Payload, now: Millis) -> Gathered {
        let mut buffer = open.unwrap_or_else(|| TriggerBuffer {
            workflow: append.workflow.clone(),
            key: append.key.clone(),
            batch_id: append.batch_id.clone(),
            gather: append.gather,
            run: append.run.clone(),
            payloads: Vec::new(),
            first_at: now,
            last_at: now,
            due_at: now,
        });
        buffer.last_at = now;
        match buffer.gather {
            Gather::Debounce { quiet_ms } => {
                buffer.payloads = vec![payload];
                buffer.due_at = now.saturating_add(quiet_ms);
            }
            Gather::Batch { max_items, max_wait_ms } => {
                buffer.payloads.push(payload);
                if buffer.payloads.len() >= max_items.max(1) as usize {
                    return Gathered::Start(buffer.into_run(now));
                }
                buffer.due_at = buffer.first_at.saturating_add(max_wait_ms);
            }
        }
        Gathered::Keep(buffer)
    }

    /// The run id this buffer starts: `trig:<workflow>:<batch_id>`.
    pub fn run_id(&self) -> RunId {
        RunId::new(format!("trig:{}:{}", self.workflow, self.batch_id))
    }

    /// The run the buffer starts at `now`: the last payload (debounce) or all of them as a
    /// JSON array (batch).
    pub fn into_run(self, now: Millis) -> NewRun {
        let id = self.run_id();
        let input = match self.gather {
            Gather::Debounce { .. } => self.payloads.last().cloned().unwrap_or_else(Payload::null),
            Gather::Batch { .. } => {
                let items: Vec<&str> = self.payloads.iter().map(Payload::as_str).collect();
                Payload::from_trusted(format!("[{}]", items.join(",")))
            }
        };
        NewRun { id, input, created_at: now, ..self.run }
    }
}

/// A dedupe id for a publish: the same `(event name, id)` seen again before `keep_until` is
/// a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dedupe {
    /// The publisher's id for the event.
    pub id: String,
    /// Until when the id is remembered.
    pub keep_until: Millis,
}

/// An event to publish ([`Store::publish`](crate::Store::publish)).
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// The event name.
    pub name: String,
    /// The payload.
    pub payload: Payload,
    /// The caller's clock.
    pub now: Millis,
    /// Publish once per id.
    pub dedupe: Option<Dedupe>,
    /// Runs to create (idempotently) with the event: one per matching trigger.
    pub start: Vec<NewRun>,
    /// Gathering triggers the event feeds.
    pub gather: Vec<BufferAppend>,
}

impl Publish {
    /// A plain event: delivered to waiters or buffered, no dedupe, no triggers.
    pub fn event(name: impl Into<String>, payload: Payload, now: Millis) -> Self {
        Publish { name: name.into(), payload, now, dedupe: None, start: Vec::new(), gather: Vec::new() }
    }
}

/// The answer of [`Store::publish`](crate::Store::publish).
#[derive(Debug, Clone, PartialEq)]
pub enum Published {
    /// The dedupe id was seen before: nothing was done.
    Duplicate,
    /// Published.
    Done {
        /// Where the event went (empty: buffered for a later wait).
        deliveries: Vec<crate::Delivery>,
        /// Runs created or found for `start`, then runs started by full batches.
        started: Vec<crate::CreateRun>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(gather: Gather) -> BufferAppend {
        BufferAppend {
            workflow: "wf".into(),
            key: "k".into(),
            gather,
            batch_id: "b1".into(),
            run: NewRun {
                trace_context: None,
                admission: None,
                id: RunId::new("unused"),
                workflow: "wf".into(),
                version: 1,
                namespace: "default".into(),
                input: Payload::null(),
                tags: vec![],
                priority: 0,
                parent: None,
                created_at: 0,
                start_at: None,
            },
        }
    }

    fn p(n: u32) -> Payload {
        Payload::encode(&n).unwrap()
    }

    #[test]
    fn debounce_keeps_the_last_payload_and_moves_the_due_time() {
        let a = append(Gather::Debounce { quiet_ms: 1_000 });
        let Gathered::Keep(b) = TriggerBuffer::gather(None, &a, p(1), 10) else { panic!() };
        assert_eq!(b.due_at, 1_010);
        let Gathered::Keep(b) = TriggerBuffer::gather(Some(b), &a, p(2), 500) else { panic!() };
        assert_eq!((b.due_at, b.first_at, b.payloads.len()), (1_500, 10, 1));
        let run = b.into_run(1_500);
        assert_eq!(run.id.as_str(), "trig:wf:b1");
        assert_eq!(run.input, p(2));
        assert_eq!(run.created_at, 1_500);
    }

    #[test]
    fn a_batch_starts_when_full_or_due() {
        let a = append(Gather::Batch { max_items: 3, max_wait_ms: 5_000 });
        let Gathered::Keep(b) = TriggerBuffer::gather(None, &a, p(1), 0) else { panic!() };
        let Gathered::Keep(b) = TriggerBuffer::gather(Some(b), &a, p(2), 100) else { panic!() };
        assert_eq!(b.due_at, 5_000, "max_wait counts from the first");
        let Gathered::Start(run) = TriggerBuffer::gather(Some(b.clone()), &a, p(3), 200) else { panic!() };
        assert_eq!(run.input.as_str(), "[1,2,3]");
        assert_eq!(b.into_run(5_000).input.as_str(), "[1,2]");
    }
}
