//! Flow control in words: admission gates by kind and name, their limits, and what a run holds
//! and waits for ([`Engine::run_admission`](durable::Engine::run_admission)), shared by
//! `durable queues` and `durable runs show | list`.

use durable::admission::{Limits, Order, PriorityOrder, SlotRecord, WaiterRecord};
use durable::{Engine, Run, RunFilter, RunStatus, protocol};
use serde_json::{Value, json};

use crate::cli::GateKind;
use crate::error::Result;
use crate::format::{ago, interval, timestamp};

/// A gate's name, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GateName {
    /// `None` for a gate name this build does not know (a newer build's?).
    pub(crate) kind: Option<GateKind>,
    pub(crate) namespace: String,
    /// The queue's name, or the workflow of a concurrency key.
    pub(crate) name: String,
    /// The key of a concurrency key.
    pub(crate) key: Option<String>,
}

impl GateName {
    /// Takes `gate` apart ([`protocol::parse_gate`]).
    pub(crate) fn parse(gate: &str) -> GateName {
        match protocol::parse_gate(gate) {
            Some(protocol::GateName::Queue { namespace, name }) => {
                GateName { kind: Some(GateKind::Queue), namespace, name, key: None }
            }
            Some(protocol::GateName::Key { namespace, workflow, key }) => {
                GateName { kind: Some(GateKind::Key), namespace, name: workflow, key: Some(key) }
            }
            None => GateName { kind: None, namespace: "-".into(), name: gate.into(), key: None },
        }
    }

    /// `queue`, `key`, or `?` for a gate this build does not know.
    pub(crate) fn kind_str(&self) -> &'static str {
        self.kind.map_or("?", GateKind::as_str)
    }

    /// `queue crm-api`, `concurrency key acme of workflow sync`, or the gate as stored.
    pub(crate) fn describe(&self) -> String {
        match (self.kind, &self.key) {
            (Some(GateKind::Queue), _) => format!("queue {}", self.name),
            (Some(GateKind::Key), Some(key)) => format!("concurrency key {} of workflow {}", shown_key(key), self.name),
            _ => format!("gate {}", self.name),
        }
    }
}

/// The limits in a few words: `concurrency 4, 10 per 1s, fair, lifo, lowest priority first`
/// (the default orders — FIFO, highest priority first — are not mentioned).
pub(crate) fn limits_text(limits: &Limits) -> String {
    let mut parts = Vec::new();
    if let Some(c) = limits.concurrency {
        parts.push(format!("concurrency {c}"));
    }
    if let Some(rate) = limits.rate {
        parts.push(format!("{} per {}", rate.limit, interval(rate.period_ms)));
    }
    if parts.is_empty() {
        parts.push("unlimited".into());
    }
    if limits.fairness {
        parts.push("fair".into());
    }
    if limits.order == Order::Lifo {
        parts.push("lifo".into());
    }
    if limits.priority == PriorityOrder::LowestFirst {
        parts.push("lowest priority first".into());
    }
    parts.join(", ")
}

/// The limits as `--json` shows them: every field present.
pub(crate) fn limits_json(limits: &Limits) -> Value {
    json!({
        "concurrency": limits.concurrency,
        "rate": limits.rate.map(|r| json!({"limit": r.limit, "period_ms": r.period_ms})),
        "fairness": limits.fairness,
        "order": match limits.order { Order::Fifo => "fifo", Order::Lifo => "lifo" },
        "priority": match limits.priority {
            PriorityOrder::HighestFirst => "highest_first",
            PriorityOrder::LowestFirst => "lowest_first",
        },
    })
}

/// What a run holds and waits for at admission gates.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunAdmission {
    /// The slots it holds.
    pub(crate) holds: Vec<SlotRecord>,
    /// Its queued requests, with where they stand.
    pub(crate) waits: Vec<Wait>,
}

/// A queued request of a run, and where it stands.
#[derive(Debug, Clone)]
pub(crate) struct Wait {
    pub(crate) record: WaiterRecord,
    /// How many requests wait at the gate in all (when looked up).
    pub(crate) waiting: Option<u32>,
    /// Its place in the line, 1 first (for a run's concurrency key, when looked up).
    pub(crate) position: Option<u32>,
}

/// How many waiting runs of a key are looked at to find a run's place in the line: with more
/// waiting, `runs show` says how many wait, not where the run stands.
const POSITION_SCAN: usize = 2_000;

impl RunAdmission {
    /// What `run` holds and waits for, or `None` when the store keeps no admission records.
    /// `detailed`: also how many wait at each gate and, for its concurrency key, the run's
    /// place in the line (a few more store calls: `runs show`, not `runs list`).
    pub(crate) async fn of(engine: &Engine, run: &Run, detailed: bool) -> Result<Option<RunAdmission>> {
        if !engine.store().capabilities().admission {
            return Ok(None);
        }
        let (holds, waits) = engine.run_admission(&run.id).await?;
        let mut waits: Vec<Wait> =
            waits.into_iter().map(|record| Wait { record, waiting: None, position: None }).collect();
        if detailed && !waits.is_empty() {
            let stats = engine.admission_stats().await?;
            for w in &mut waits {
                w.waiting = stats.iter().find(|g| g.gate == w.record.gate).map(|g| g.waiting);
                if w.record.holder == run.id.as_str() {
                    w.position = position(engine, run, &w.record, w.waiting).await?;
                }
            }
        }
        Ok(Some(RunAdmission { holds, waits }))
    }

    /// Whether there is nothing to show.
    pub(crate) fn is_empty(&self) -> bool {
        self.holds.is_empty() && self.waits.is_empty()
    }

    /// As `runs show --json` shows it: the records as stored; each wait with `"waiting"` (at its
    /// gate) and `"position"` (1 first) when known.
    pub(crate) fn to_json(&self) -> Value {
        let waits: Vec<Value> = self
            .waits
            .iter()
            .map(|w| {
                let mut v = serde_json::to_value(&w.record).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut v {
                    map.insert("waiting".into(), json!(w.waiting));
                    map.insert("position".into(), json!(w.position));
                }
                v
            })
            .collect();
        json!({ "holds": self.holds, "waits": waits })
    }

    /// What the run waits for at its gates, in a few words each, for the "waiting on" of `runs
    /// list` and `runs show`: `concurrency key acme of workflow sync (position 2 of 3
    /// waiting)`, `step 1 waiting for queue crm-api (4 waiting)`.
    pub(crate) fn waiting_on(&self, run: &Run) -> Vec<String> {
        self.waits.iter().map(|w| wait_text(run, w)).collect()
    }

    /// One line per wait and per held slot, with times, for the admission section of `runs
    /// show`.
    pub(crate) fn lines(&self, run: &Run, now: u64) -> Vec<String> {
        let mut out = Vec::new();
        for w in &self.waits {
            let mut text = wait_text(run, w);
            if w.record.holder == run.id.as_str() {
                text = format!("waiting for {text}");
            }
            let mut extra = Vec::new();
            if w.record.priority != 0 {
                extra.push(format!("priority {}", w.record.priority));
            }
            if !w.record.fairness_key.is_empty() {
                extra.push(format!("fairness key {}", w.record.fairness_key));
            }
            let extra = if extra.is_empty() { String::new() } else { format!(", {}", extra.join(", ")) };
            out.push(format!("{text}{extra}, since {} ({})", timestamp(w.record.since), ago(w.record.since, now)));
        }
        for s in &self.holds {
            let what = gate_of(run, &s.gate);
            let who = match step_seq(run, &s.holder) {
                Some(seq) => format!("step {seq} holds a slot of {what}"),
                None if s.holder == run.id.as_str() => format!("holds {what}"),
                None => format!("{} holds a slot of {what}", s.holder),
            };
            let lease = match s.lease_until {
                None => String::new(),
                Some(until) if until > now => format!(", lease until {} ({})", timestamp(until), ago(until, now)),
                Some(until) => {
                    format!(", lease expired {}: the slot is reclaimed at the next call on the gate", ago(until, now))
                }
            };
            out.push(format!("{who} since {} ({}){lease}", timestamp(s.acquired_at), ago(s.acquired_at, now)));
        }
        out
    }
}

/// `concurrency key acme of workflow sync (position 2 of 3 waiting)` for the run's own request,
/// `step 1 waiting for queue crm-api (4 waiting)` for a step's.
fn wait_text(run: &Run, w: &Wait) -> String {
    let what = gate_of(run, &w.record.gate);
    let line = match (w.position, w.waiting) {
        (Some(p), Some(n)) => format!(" (position {p} of {n} waiting)"),
        (None, Some(n)) => format!(" ({n} waiting)"),
        _ => String::new(),
    };
    match step_seq(run, &w.record.holder) {
        Some(seq) => format!("step {seq} waiting for {what}{line}"),
        None => format!("{what}{line}"),
    }
}

/// The gate in words, exact for the run's own namespace and workflow.
fn gate_of(run: &Run, gate: &str) -> String {
    let own_key = protocol::key_gate(&run.namespace, &run.workflow, "");
    if let Some(key) = gate.strip_prefix(&own_key) {
        return format!("concurrency key {} of workflow {}", shown_key(key), run.workflow);
    }
    if let Some(queue) = gate.strip_prefix(&protocol::queue_gate(&run.namespace, "")) {
        return format!("queue {queue}");
    }
    GateName::parse(gate).describe()
}

/// A concurrency key as shown: as it is, or `""` for the empty key (a key function may
/// return one; it is a key like any other).
pub(crate) fn shown_key(key: &str) -> String {
    // Quoted where plain text would hide it (empty, blank, spaces at an end), and cut when long
    // (a key may be 1,024 bytes: a table of such keys would be that wide).
    if key.trim().is_empty() || key.trim() != key || key.chars().count() > 80 {
        protocol::shown(key)
    } else {
        key.to_string()
    }
}

/// The seq of a step holder of `run` (`<run>:<seq>`, [`protocol::step_id`]).
fn step_seq(run: &Run, holder: &str) -> Option<u32> {
    holder.strip_prefix(run.id.as_str())?.strip_prefix(':')?.parse().ok()
}

/// Where `run`'s request `mine` stands at its concurrency key: 1 + the requests ranked before it,
/// from the other runs of the key waiting (`pending`, `wake_at` = [`protocol::GATED`]); `None`
/// when more than [`POSITION_SCAN`] wait (or the count does not add up: the line moved while
/// it was read).
async fn position(engine: &Engine, run: &Run, mine: &WaiterRecord, waiting: Option<u32>) -> Result<Option<u32>> {
    let Some(waiting) = waiting else { return Ok(None) };
    if waiting as usize > POSITION_SCAN {
        return Ok(None);
    }
    let mut filter = RunFilter {
        workflow: Some(run.workflow.clone()),
        statuses: vec![RunStatus::Pending],
        namespace: Some(run.namespace.clone()),
        limit: 500,
        ..RunFilter::default()
    };
    let (mut ahead, mut seen, mut scanned) = (0u32, 0u32, 0usize);
    loop {
        let page = engine.list_runs(&filter).await?;
        for other in page.runs.iter().filter(|r| r.wake_at == Some(protocol::GATED)) {
            scanned += 1;
            if scanned > POSITION_SCAN {
                return Ok(None);
            }
            let (_, waits) = engine.run_admission(&other.id).await?;
            for w in waits.iter().filter(|w| w.gate == mine.gate) {
                seen += 1;
                if w.holder != mine.holder && w.rank < mine.rank {
                    ahead += 1;
                }
            }
        }
        match page.next_cursor {
            Some(cursor) => filter.cursor = Some(cursor),
            None => break,
        }
    }
    Ok((seen == waiting).then_some(ahead + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use durable::admission::Rate;

    #[test]
    fn keys_are_quoted_where_plain_text_would_hide_them_and_cut_when_long() {
        assert_eq!(shown_key("acme"), "acme");
        assert_eq!(shown_key("acme corp"), "acme corp");
        assert_eq!(shown_key(""), "\"\"");
        assert_eq!(shown_key("   "), "\"   \"");
        assert_eq!(shown_key(" acme"), "\" acme\"");
        let long = "k".repeat(1024);
        let shown = shown_key(&long);
        assert!(shown.len() < 100 && shown.ends_with("… (1024 bytes)"), "{shown}");
    }

    #[test]
    fn gate_names_come_apart() {
        let key = GateName::parse(&protocol::key_gate("default", "sync", "acme:eu"));
        assert_eq!(
            key,
            GateName {
                kind: Some(GateKind::Key),
                namespace: "default".into(),
                name: "sync".into(),
                key: Some("acme:eu".into())
            }
        );
        assert_eq!(key.describe(), "concurrency key acme:eu of workflow sync");
        // The empty key is a key like any other, shown quoted.
        let empty = GateName::parse(&protocol::key_gate("default", "sync", ""));
        assert_eq!(empty.describe(), "concurrency key \"\" of workflow sync");
        let queue = GateName::parse(&protocol::queue_gate("prod", "crm-api"));
        assert_eq!((queue.kind_str(), queue.namespace.as_str(), queue.name.as_str()), ("queue", "prod", "crm-api"));
        assert_eq!(queue.describe(), "queue crm-api");
        let other = GateName::parse("lane:x:y");
        assert_eq!((other.kind_str(), other.describe()), ("?", "gate lane:x:y".to_string()));
    }

    #[test]
    fn limits_read_as_words() {
        assert_eq!(limits_text(&Limits { concurrency: Some(1), ..Limits::default() }), "concurrency 1");
        let all = Limits {
            concurrency: Some(4),
            rate: Some(Rate::per(10, std::time::Duration::from_secs(1))),
            priority: PriorityOrder::LowestFirst,
            fairness: true,
            order: Order::Lifo,
        };
        assert_eq!(limits_text(&all), "concurrency 4, 10 per 1s, fair, lifo, lowest priority first");
        assert_eq!(limits_text(&Limits::default()), "unlimited");
        assert_eq!(
            limits_json(&all),
            json!({"concurrency": 4, "rate": {"limit": 10, "period_ms": 1000}, "fairness": true, "order": "lifo",
                   "priority": "lowest_first"})
        );
    }
}
