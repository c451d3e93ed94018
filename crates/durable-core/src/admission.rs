//! Admission: concurrency limits, rate limits, priority and fairness, decided purely.
//!
//! Work that must be throttled passes a *gate*: a workflow's concurrency key
//! ([`protocol::key_gate`](crate::protocol::key_gate)) or a named step queue
//! ([`protocol::queue_gate`](crate::protocol::queue_gate)). A gate has [`Limits`]; a request
//! to pass it is a [`SlotRequest`] made by a *holder* (a run, or one step of a run). The
//! answer is an [`Admission`]: admitted (a slot is held until it is released), waiting (the
//! request is queued; it is woken when a slot is handed to it, or retries at a rate window's
//! end), or full (the gate's queue depth is reached; nothing was recorded).
//!
//! # The rules
//!
//! - **Concurrency**: at most `concurrency` live slots. A slot with a lease (a step's) is live
//!   until the lease passes; a slot without one (a run's) until it is released.
//! - **Rate**: at most `rate.limit` admissions per fixed window of `rate.period`.
//! - **Order** among waiters, served first to last: higher priority first (or lower, by
//!   [`PriorityOrder`]); then, with fairness, by *round*: each fairness key's waiters take
//!   rounds one after another, and a key never served (or idle) joins the round being served,
//!   so keys are served round robin and a key with one waiter waits at most one slot turn
//!   behind a key with a hundred; then FIFO or LIFO by arrival.
//! - A newcomer is admitted only if fewer waiters rank ahead of it than there are free slots;
//!   so a waiter is never overtaken by a lower-ranked newcomer.
//! - **Hand-off**: releasing a slot (or reclaiming an expired one) hands the free capacity to
//!   the best waiters at once, in the same atomic store call: they become holders and their
//!   runs are woken, so no process has to poll for the freed slot.
//!
//! [`AdmissionBook`] is the reference implementation over in-memory collections, used by the
//! memory store and property-tested here; the SQL stores keep the same records in tables and
//! call the same pure helpers ([`GateRecord::capacity`], [`GateRecord::rank`], [`decide`],
//! [`GateRecord::admitted`]), and the conformance suite checks that they agree.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Millis, RunId, millis};

/// Which priority is served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorityOrder {
    /// A higher priority is served first (the default).
    #[default]
    HighestFirst,
    /// A lower priority is served first.
    LowestFirst,
}

/// The order among waiters of equal priority (and round).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// First come, first served (the default).
    #[default]
    Fifo,
    /// Last come, first served.
    Lifo,
}

/// A fixed-window rate limit: at most `limit` admissions per `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Admissions per window.
    pub limit: u32,
    /// The window, in milliseconds (at least 1).
    pub period_ms: u64,
}

impl Rate {
    /// `limit` admissions per `period`.
    pub fn per(limit: u32, period: Duration) -> Self {
        Rate { limit, period_ms: millis(period).max(1) }
    }
}

/// How a gate admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limits {
    /// At most this many slots held at once (`None`: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most this many admissions per window (`None`: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Which priority goes first.
    #[serde(default)]
    pub priority: PriorityOrder,
    /// Serve fairness keys round robin.
    #[serde(default)]
    pub fairness: bool,
    /// FIFO or LIFO among equals.
    #[serde(default)]
    pub order: Order,
}

impl Limits {
    /// Whether the gate limits anything at all.
    pub fn gates(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some()
    }

    /// Checks the limits; the error says what is wrong (the caller names the gate).
    pub fn validate(&self) -> Result<(), String> {
        if self.concurrency == Some(0) {
            return Err("a concurrency of 0 would admit nothing; use at least 1".into());
        }
        if let Some(rate) = self.rate {
            if rate.limit == 0 {
                return Err("a rate of 0 per window would admit nothing; use at least 1".into());
            }
            if rate.period_ms == 0 {
                return Err("a rate window must be at least 1 ms".into());
            }
        }
        Ok(())
    }
}

/// A request to pass a gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotRequest {
    /// The gate ([`protocol::key_gate`](crate::protocol::key_gate) or
    /// [`protocol::queue_gate`](crate::protocol::queue_gate)).
    pub gate: String,
    /// Who holds the slot: the run id for a run's slot, the step id for a step's.
    pub holder: String,
    /// The run the holder belongs to (woken when a slot is handed to it).
    pub run_id: RunId,
    /// The request's priority (see [`PriorityOrder`]).
    pub priority: i32,
    /// The fairness key (`""`: none).
    #[serde(default)]
    pub fairness_key: String,
    /// The gate's limits, as the caller configured them (stored with the gate, so a release
    /// elsewhere hands off by the same rules).
    pub limits: Limits,
    /// The slot's lease: it is reclaimed after this time unless renewed (`None`: held until
    /// released, as a run's slot is until the run settles).
    pub lease_until: Option<Millis>,
    /// Refuse (with [`Admission::Full`]) when this many requests already wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<u32>,
    /// The holder whose slot at this gate passes to this request's holder, if it holds one:
    /// admitted at once, ahead of any waiter, and the slot stays counted once. A run continued
    /// as new hands its concurrency key's slot to its successor this way, so a chain of runs
    /// keeps its key without queueing behind others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeds: Option<String>,
    /// The caller's clock.
    pub now: Millis,
}

impl SlotRequest {
    /// This request for a run's own slot (holder: the run's id): how a run created with a
    /// concurrency key asks ([`NewRun::admission`](crate::NewRun::admission)).
    pub fn for_run(self, run: &RunId) -> SlotRequest {
        SlotRequest { holder: run.to_string(), run_id: run.clone(), lease_until: None, ..self }
    }
}

/// The answer to a [`SlotRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Admission {
    /// A slot is held (or was held already) by the request's holder.
    Admitted,
    /// The request waits. It is woken when a slot is handed to it; with a rate limit in the
    /// way it should also retry at `retry_at` (the window's end).
    Waiting {
        /// When to ask again (`None`: only when woken).
        retry_at: Option<Millis>,
    },
    /// The gate's queue is full: nothing was recorded.
    Full {
        /// Slots held.
        held: u32,
        /// Requests waiting.
        waiting: u32,
    },
}

impl Admission {
    /// When a request held back should ask again at the latest, if the answer says
    /// (`Waiting` held back by a rate window).
    pub fn retry_at(&self) -> Option<Millis> {
        match self {
            Admission::Waiting { retry_at } => *retry_at,
            Admission::Admitted | Admission::Full { .. } => None,
        }
    }
}

/// Where a waiter stands in its gate's queue: compared ascending, the least is served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Rank {
    /// From the priority (negated when higher goes first).
    pub priority: i64,
    /// The fairness round (0 without fairness).
    pub round: i64,
    /// The arrival ticket (negated for LIFO).
    pub ticket: i64,
}

/// A gate's stored state (one row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRecord {
    /// The gate.
    pub gate: String,
    /// Its limits, as last configured.
    pub limits: Limits,
    /// The next arrival ticket.
    pub next_ticket: i64,
    /// The fairness round being served.
    pub round: i64,
    /// The start of the current rate window.
    pub window_start: Millis,
    /// Admissions in the current rate window.
    pub window_count: u32,
    /// The latest `now` any call on the gate brought: a release that knows no time (the
    /// deletion of a run) hands off at this time, and time never runs backwards for a gate.
    #[serde(default)]
    pub touched: Millis,
}

/// A held slot (one row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// The gate.
    pub gate: String,
    /// The holder.
    pub holder: String,
    /// Its run.
    pub run_id: RunId,
    /// When it was admitted.
    pub acquired_at: Millis,
    /// Reclaimed after this (`None`: held until released).
    pub lease_until: Option<Millis>,
}

impl SlotRecord {
    /// Whether the slot still counts at `now`.
    pub fn live(&self, now: Millis) -> bool {
        self.lease_until.is_none_or(|t| t > now)
    }
}

/// A queued request (one row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterRecord {
    /// The gate.
    pub gate: String,
    /// The holder it would be.
    pub holder: String,
    /// Its run.
    pub run_id: RunId,
    /// Its place in the queue.
    pub rank: Rank,
    /// Its priority.
    pub priority: i32,
    /// Its fairness key.
    pub fairness_key: String,
    /// The lease its slot takes when it is handed one.
    pub lease_ms: Option<u64>,
    /// When it started waiting.
    pub since: Millis,
}

/// A slot handed to a waiter by a release or a reclaim: the store wakes `run_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// The gate.
    pub gate: String,
    /// The new holder.
    pub holder: String,
    /// Its run, to wake.
    pub run_id: RunId,
}

/// What the stores report per gate (for `durable queues`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateStats {
    /// The gate.
    pub gate: String,
    /// Its limits.
    pub limits: Limits,
    /// Live slots.
    pub held: u32,
    /// Queued requests.
    pub waiting: u32,
    /// Admissions in the current rate window, and when it started.
    pub window_count: u32,
    /// The start of the current rate window.
    pub window_start: Millis,
    /// When the oldest waiter started waiting.
    pub oldest_waiting_since: Option<Millis>,
    /// Waiting requests per fairness key (keys with waiters only; `""` is no key).
    pub waiting_by_key: Vec<(String, u32)>,
}

/// The pure decision for a request that holds no slot yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take a slot now.
    Admit,
    /// Queue (or stay queued); retry at this time if set.
    Wait {
        /// The rate window's end, if the rate is what holds the request back.
        retry_at: Option<Millis>,
    },
    /// Refuse: the queue is full.
    Full,
}

impl GateRecord {
    /// A fresh gate.
    pub fn new(gate: impl Into<String>, limits: Limits, now: Millis) -> Self {
        let window_start = limits.rate.map_or(now, |r| now - now % r.period_ms);
        GateRecord { gate: gate.into(), limits, next_ticket: 0, round: 0, window_start, window_count: 0, touched: now }
    }

    /// The time a call at `now` acts at: never before the gate's latest ([`GateRecord::touched`]),
    /// which it advances.
    pub fn touch(&mut self, now: Millis) -> Millis {
        self.touched = self.touched.max(now);
        self.touched
    }

    /// Starts a new rate window if the current one is over (windows are aligned to the
    /// period, so every process agrees where they begin).
    pub fn roll(&mut self, now: Millis) {
        if let Some(rate) = self.limits.rate
            && now >= self.window_start.saturating_add(rate.period_ms)
        {
            self.window_start = now - now % rate.period_ms;
            self.window_count = 0;
        }
    }

    /// The end of the current rate window, if the gate has a rate.
    pub fn window_end(&self) -> Option<Millis> {
        self.limits.rate.map(|r| self.window_start.saturating_add(r.period_ms))
    }

    /// How many more requests may be admitted now, with `live` slots held (after
    /// [`GateRecord::roll`]); `u32::MAX` when nothing limits.
    pub fn capacity(&self, live: u32) -> u32 {
        let conc = self.limits.concurrency.map_or(u32::MAX, |c| c.saturating_sub(live));
        let rate = self.limits.rate.map_or(u32::MAX, |r| r.limit.saturating_sub(self.window_count));
        conc.min(rate)
    }

    /// The rank of a new waiter with `priority`, taking the next ticket. With fairness,
    /// `key_round` is the round after the last one its key's waiters hold (`None` when the key
    /// has none waiting); it is set to the one after the new waiter's.
    pub fn rank(&mut self, priority: i32, key_round: &mut Option<i64>) -> Rank {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let round = if self.limits.fairness {
            let round = key_round.map_or(self.round, |r| r.max(self.round));
            *key_round = Some(round + 1);
            round
        } else {
            0
        };
        Rank {
            priority: match self.limits.priority {
                PriorityOrder::HighestFirst => -i64::from(priority),
                PriorityOrder::LowestFirst => i64::from(priority),
            },
            round,
            ticket: match self.limits.order {
                Order::Fifo => ticket,
                Order::Lifo => -ticket,
            },
        }
    }

    /// Books an admission (of a waiter with `rank`, or a newcomer that ranks at `rank`).
    pub fn admitted(&mut self, rank: Rank) {
        self.window_count = self.window_count.saturating_add(1);
        if self.limits.fairness {
            self.round = self.round.max(rank.round);
        }
    }

    /// The retry time of a request held back while `capacity` is free and `ahead` waiters
    /// rank before it: the window's end when the rate (not concurrency) is what is used up.
    fn retry_at(&self, live: u32, ahead: u32) -> Option<Millis> {
        let conc_free = self.limits.concurrency.is_none_or(|c| c.saturating_sub(live) > ahead);
        conc_free.then(|| self.window_end()).flatten()
    }

    /// How far [`decide`] needs `ahead` counted, with `live` slots held: it compares the
    /// waiters ahead with the free capacity and the free concurrency only, so a count that
    /// stops here (the free concurrency when limited, else the capacity; nothing when the
    /// capacity is unbounded) decides the same as the full count, and a store need not read a
    /// long queue through.
    pub fn ahead_cap(&self, live: u32) -> u32 {
        let capacity = self.capacity(live);
        if capacity == u32::MAX {
            return 0;
        }
        self.limits.concurrency.map_or(capacity, |c| c.saturating_sub(live))
    }
}

/// Decides a request that holds no slot, after [`GateRecord::roll`]: `live` slots are held,
/// `ahead` waiters rank before the request (counted up to [`GateRecord::ahead_cap`] at least),
/// `waiting` requests wait in all, and the request is (`queued`) or is not one of them yet.
pub fn decide(gate: &GateRecord, request: &SlotRequest, live: u32, ahead: u32, waiting: u32, queued: bool) -> Decision {
    if ahead < gate.capacity(live) {
        return Decision::Admit;
    }
    if !queued
        && let Some(max) = request.max_waiting
        && waiting >= max
    {
        return Decision::Full;
    }
    Decision::Wait { retry_at: gate.retry_at(live, ahead) }
}

/// The lease a slot handed to `waiter` at `now` takes.
pub fn handed_lease(waiter: &WaiterRecord, now: Millis) -> Option<Millis> {
    waiter.lease_ms.map(|ms| now.saturating_add(ms))
}

#[derive(Debug, Clone, Default)]
struct Gate {
    record: Option<GateRecord>,
    slots: BTreeMap<String, SlotRecord>,
    queue: BTreeMap<Rank, WaiterRecord>,
    /// The queue's index by holder.
    ranks: HashMap<String, Rank>,
    /// The queue's index by fairness key: the rounds its waiters hold, with how many hold each.
    rounds: HashMap<String, BTreeMap<i64, u32>>,
    /// The queue's index by run: the holders each run has queued.
    queued: HashMap<RunId, BTreeSet<String>>,
}

impl Gate {
    fn live(&self, now: Millis) -> u32 {
        u32::try_from(self.slots.values().filter(|s| s.live(now)).count()).unwrap_or(u32::MAX)
    }

    fn reclaim(&mut self, now: Millis) -> bool {
        let before = self.slots.len();
        self.slots.retain(|_, s| s.live(now));
        self.slots.len() != before
    }

    /// Queues `w` (its holder queues nothing at the gate yet).
    fn enqueue(&mut self, w: WaiterRecord) {
        self.ranks.insert(w.holder.clone(), w.rank);
        *self.rounds.entry(w.fairness_key.clone()).or_default().entry(w.rank.round).or_default() += 1;
        self.queued.entry(w.run_id.clone()).or_default().insert(w.holder.clone());
        self.queue.insert(w.rank, w);
    }

    fn unqueue(&mut self, holder: &str) -> Option<WaiterRecord> {
        let rank = self.ranks.remove(holder)?;
        let w = self.queue.remove(&rank)?;
        if let Some(rounds) = self.rounds.get_mut(&w.fairness_key) {
            if let Some(n) = rounds.get_mut(&w.rank.round) {
                *n -= 1;
                if *n == 0 {
                    rounds.remove(&w.rank.round);
                }
            }
            if rounds.is_empty() {
                self.rounds.remove(&w.fairness_key);
            }
        }
        if let Some(holders) = self.queued.get_mut(&w.run_id) {
            holders.remove(&w.holder);
            if holders.is_empty() {
                self.queued.remove(&w.run_id);
            }
        }
        Some(w)
    }

    /// The round after the last one `key`'s waiters hold (`None`: the key has no waiters).
    fn key_round(&self, key: &str) -> Option<i64> {
        self.rounds.get(key).and_then(|r| r.keys().next_back()).map(|round| round + 1)
    }

    /// Records a slot held by `holder` (of `run`) from `now`.
    fn hold(&mut self, gate: &str, holder: &str, run: &RunId, now: Millis, lease_until: Option<Millis>) {
        let slot = SlotRecord {
            gate: gate.to_string(),
            holder: holder.to_string(),
            run_id: run.clone(),
            acquired_at: now,
            lease_until,
        };
        self.slots.insert(holder.to_string(), slot);
    }

    /// Hands free capacity to the best waiters.
    fn hand_off(&mut self, now: Millis) -> Vec<Handoff> {
        let mut out = Vec::new();
        let Some(mut record) = self.record.take() else {
            return out;
        };
        let now = record.touch(now);
        record.roll(now);
        loop {
            let live = self.live(now);
            if record.capacity(live) == 0 {
                break;
            }
            let Some((&rank, _)) = self.queue.iter().next() else {
                break;
            };
            let holder = self.queue[&rank].holder.clone();
            let w = self.unqueue(&holder).expect("queued waiter");
            record.admitted(rank);
            if record.limits.concurrency.is_some() {
                self.hold(&w.gate, &w.holder, &w.run_id, now, handed_lease(&w, now));
            }
            out.push(Handoff { gate: w.gate, holder: w.holder, run_id: w.run_id });
        }
        self.record = Some(record);
        out
    }
}

/// The reference implementation of a store's admission records, over in-memory collections.
///
/// Every method is one atomic store call: the memory store calls it under its lock; the SQL
/// stores do the same steps in one transaction.
#[derive(Debug, Clone, Default)]
pub struct AdmissionBook {
    gates: BTreeMap<String, Gate>,
    /// The gates each run has held a slot or queued a request at (some perhaps no more): what
    /// a run's release, renewal and listings look at, instead of every gate.
    runs: HashMap<RunId, BTreeSet<String>>,
}

impl AdmissionBook {
    /// Decides `request` and records the outcome; returns it with the slots a reclaim of
    /// expired slots handed to other waiters (their runs are to be woken).
    ///
    /// # Contract
    /// - A holder that holds a slot of the gate is admitted again (its lease renewed).
    /// - A request whose [`succeeds`](SlotRequest::succeeds) holds a slot of the gate takes
    ///   that slot over: admitted, nothing else decided or counted.
    /// - A waiting holder keeps its rank; a new one is ranked by the gate's rules.
    /// - `Full` records nothing (the gate's record is left as it was); `Waiting` records the
    ///   waiter; `Admitted` records the slot (when the gate limits concurrency) and counts the
    ///   admission in the rate window.
    pub fn acquire(&mut self, request: &SlotRequest) -> (Admission, Vec<Handoff>) {
        let now = request.now;
        let gate = self.gates.entry(request.gate.clone()).or_default();
        let mut handoffs = Vec::new();
        if gate.reclaim(now) {
            handoffs = gate.hand_off(now);
        }
        if let Some(slot) = gate.slots.get_mut(&request.holder) {
            if request.lease_until.is_some() {
                slot.lease_until = request.lease_until;
            }
            return (Admission::Admitted, handoffs);
        }
        if let Some(from) = &request.succeeds
            && gate.slots.remove(from).is_some()
        {
            gate.unqueue(&request.holder);
            gate.hold(&request.gate, &request.holder, &request.run_id, now, request.lease_until);
            self.index(request);
            return (Admission::Admitted, handoffs);
        }
        // `Full` writes nothing: the stored record stays as it was (a refused keyed start must
        // leave no trace, not even the limits it brought or its time).
        let stored = gate.record.clone();
        let mut record = gate.record.take().unwrap_or_else(|| GateRecord::new(&request.gate, request.limits, now));
        record.limits = request.limits;
        record.touch(now);
        record.roll(now);
        let live = gate.live(now);
        let queued = gate.ranks.get(&request.holder).copied();
        let waiting = u32::try_from(gate.queue.len()).unwrap_or(u32::MAX);
        let (rank, fresh_rank) = match queued {
            Some(rank) => (rank, false),
            None => {
                let mut key_round = gate.key_round(&request.fairness_key);
                let probe = record.clone().rank(request.priority, &mut key_round);
                (probe, true)
            }
        };
        let cap = record.ahead_cap(live) as usize;
        let ahead = u32::try_from(gate.queue.range(..rank).take(cap).count()).unwrap_or(u32::MAX);
        let answer = match decide(&record, request, live, ahead, waiting, queued.is_some()) {
            Decision::Admit => {
                gate.unqueue(&request.holder);
                record.admitted(rank);
                if record.limits.concurrency.is_some() {
                    gate.hold(&request.gate, &request.holder, &request.run_id, now, request.lease_until);
                }
                Admission::Admitted
            }
            Decision::Full => {
                gate.record = stored;
                return (Admission::Full { held: live, waiting }, handoffs);
            }
            Decision::Wait { retry_at } => {
                if fresh_rank {
                    let mut key_round = gate.key_round(&request.fairness_key);
                    let rank = record.rank(request.priority, &mut key_round);
                    gate.enqueue(WaiterRecord {
                        gate: request.gate.clone(),
                        holder: request.holder.clone(),
                        run_id: request.run_id.clone(),
                        rank,
                        priority: request.priority,
                        fairness_key: request.fairness_key.clone(),
                        lease_ms: request.lease_until.map(|t| t.saturating_sub(now)),
                        since: now,
                    });
                }
                Admission::Waiting { retry_at }
            }
        };
        gate.record = Some(record);
        self.index(request);
        (answer, handoffs)
    }

    /// Notes that `request`'s run holds or waits for a slot at its gate.
    fn index(&mut self, request: &SlotRequest) {
        self.runs.entry(request.run_id.clone()).or_default().insert(request.gate.clone());
    }

    /// Releases `holder`'s slot (or queued request) at `gate` and hands the freed capacity
    /// on. Releasing what is not held changes nothing.
    pub fn release(&mut self, gate: &str, holder: &str, now: Millis) -> Vec<Handoff> {
        let Some(g) = self.gates.get_mut(gate) else {
            return Vec::new();
        };
        let freed = g.slots.remove(holder).is_some();
        g.unqueue(holder);
        let reclaimed = g.reclaim(now);
        if freed || reclaimed { g.hand_off(now) } else { Vec::new() }
    }

    /// Releases the slot `holder` (of `run`) holds at whatever gate, and hands it on (a remote
    /// step's result is recorded).
    pub fn release_holder(&mut self, run: &RunId, holder: &str, now: Millis) -> Vec<Handoff> {
        let gate = self.gates_of(run).find(|(_, g)| g.slots.get(holder).is_some_and(|s| &s.run_id == run));
        let gate = gate.map(|(name, _)| name.to_string());
        gate.map_or_else(Vec::new, |gate| self.release(&gate, holder, now))
    }

    /// The gates `run` may hold slots or queue requests at, by name.
    fn gates_of<'a>(&'a self, run: &RunId) -> impl Iterator<Item = (&'a str, &'a Gate)> + 'a {
        let names = self.runs.get(run).into_iter().flatten();
        names.filter_map(|name| self.gates.get(name).map(|g| (name.as_str(), g)))
    }

    /// Releases every slot and queued request of `run` (it settled, was cancelled or deleted)
    /// and hands the freed capacity on, at `now` or each gate's [`GateRecord::touched`] time if
    /// later (a deletion passes 0: it knows no time).
    pub fn release_run(&mut self, run: &RunId, now: Millis) -> Vec<Handoff> {
        self.release_runs(std::slice::from_ref(run), now)
    }

    /// [`AdmissionBook::release_run`] for several runs at once (a run and its descendants,
    /// deleted together): everything of all of them is released before any capacity is handed
    /// on, so none of it goes to one of them, and the outcome does not depend on their order.
    pub fn release_runs(&mut self, runs: &[RunId], now: Millis) -> Vec<Handoff> {
        let gates: BTreeSet<String> = runs.iter().filter_map(|r| self.runs.remove(r)).flatten().collect();
        let runs: BTreeSet<&RunId> = runs.iter().collect();
        let mut out = Vec::new();
        for name in &gates {
            let Some(g) = self.gates.get_mut(name) else {
                continue;
            };
            let before = g.slots.len();
            g.slots.retain(|_, s| !runs.contains(&s.run_id));
            let held: Vec<String> = runs.iter().filter_map(|r| g.queued.get(*r)).flatten().cloned().collect();
            let freed = g.slots.len() != before;
            if !freed && held.is_empty() {
                // A gate the runs had nothing at is left alone (its expired slots are reclaimed
                // by the next call on it): a settle costs nothing at gates it never used.
                continue;
            }
            for h in held {
                g.unqueue(&h);
            }
            let reclaimed = g.reclaim(now);
            if freed || reclaimed {
                out.extend(g.hand_off(now));
            }
        }
        out
    }

    /// Extends the leases of `run`'s leased slots to `lease_until` (the engine renews them
    /// with the run's own lease).
    pub fn renew(&mut self, run: &RunId, lease_until: Millis) {
        let Some(gates) = self.runs.get(run) else {
            return;
        };
        for name in gates {
            let Some(g) = self.gates.get_mut(name) else {
                continue;
            };
            for s in g.slots.values_mut() {
                if &s.run_id == run && s.lease_until.is_some() {
                    s.lease_until = Some(lease_until);
                }
            }
        }
    }

    /// The requests `run` has queued, by gate then holder (as `Store::run_admission` lists them).
    pub fn waits_of(&self, run: &RunId) -> Vec<WaiterRecord> {
        let mut waits: Vec<WaiterRecord> = (self.gates_of(run))
            .flat_map(|(_, g)| g.queued.get(run).into_iter().flatten().map(|h| &g.queue[&g.ranks[h]]))
            .cloned()
            .collect();
        waits.sort_by(|a, b| (&a.gate, &a.holder).cmp(&(&b.gate, &b.holder)));
        waits
    }

    /// The slots `run` holds (live or not).
    pub fn slots_of(&self, run: &RunId) -> Vec<SlotRecord> {
        self.gates_of(run).flat_map(|(_, g)| g.slots.values()).filter(|s| &s.run_id == run).cloned().collect()
    }

    /// Per-gate figures at `now`, by gate name.
    pub fn stats(&self, now: Millis) -> Vec<GateStats> {
        self.gates
            .values()
            .filter_map(|g| {
                let mut record = g.record.clone()?;
                record.roll(now);
                let mut by_key: BTreeMap<String, u32> = BTreeMap::new();
                for w in g.queue.values() {
                    *by_key.entry(w.fairness_key.clone()).or_default() += 1;
                }
                Some(GateStats {
                    gate: record.gate.clone(),
                    limits: record.limits,
                    held: g.live(now),
                    waiting: u32::try_from(g.queue.len()).unwrap_or(u32::MAX),
                    window_count: record.window_count,
                    window_start: record.window_start,
                    oldest_waiting_since: g.queue.values().map(|w| w.since).min(),
                    waiting_by_key: by_key.into_iter().collect(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
