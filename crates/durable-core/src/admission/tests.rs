use proptest::prelude::*;

use super::*;

fn limits(concurrency: Option<u32>) -> Limits {
    Limits { concurrency, ..Limits::default() }
}

fn req(holder: &str, limits: Limits, now: Millis) -> SlotRequest {
    SlotRequest {
        gate: "q:default:api".into(),
        holder: holder.into(),
        run_id: RunId::from(holder),
        priority: 0,
        fairness_key: String::new(),
        limits,
        lease_until: None,
        max_waiting: None,
        succeeds: None,
        now,
    }
}

fn acquire(book: &mut AdmissionBook, r: &SlotRequest) -> Admission {
    book.acquire(r).0
}

fn holders(h: &[Handoff]) -> Vec<&str> {
    h.iter().map(|h| h.holder.as_str()).collect()
}

#[test]
fn a_successor_takes_over_its_predecessors_slot_ahead_of_the_waiters() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(1));
    assert_eq!(acquire(&mut book, &req("a", l, 0)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("w", l, 1)), Admission::Waiting { retry_at: None });
    let next = SlotRequest { succeeds: Some("a".into()), ..req("a~1", l, 2) };
    assert_eq!(book.acquire(&next), (Admission::Admitted, vec![]));
    assert_eq!(book.stats(2)[0].held, 1, "one slot, now the successor's");
    // The predecessor settling releases nothing of the successor's: the waiter still waits.
    assert!(book.release_run(&RunId::from("a"), 3).is_empty());
    assert_eq!(holders(&book.release_run(&RunId::from("a~1"), 4)), ["w"]);
    // A `succeeds` naming no holder of the gate is decided as any request.
    let stray = SlotRequest { succeeds: Some("gone".into()), ..req("x", l, 5) };
    assert_eq!(acquire(&mut book, &stray), Admission::Waiting { retry_at: None });
}

#[test]
fn a_concurrency_limit_queues_the_rest_and_a_release_hands_the_slot_on() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(2));
    assert_eq!(acquire(&mut book, &req("a", l, 0)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("b", l, 0)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("c", l, 0)), Admission::Waiting { retry_at: None });
    assert_eq!(acquire(&mut book, &req("d", l, 0)), Admission::Waiting { retry_at: None });
    // A holder asking again is still admitted; a waiter asking again still waits.
    assert_eq!(acquire(&mut book, &req("a", l, 1)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("d", l, 1)), Admission::Waiting { retry_at: None });
    assert_eq!(holders(&book.release("q:default:api", "a", 2)), ["c"]);
    assert_eq!(acquire(&mut book, &req("c", l, 3)), Admission::Admitted, "the handed-off slot is c's");
    assert!(book.release("q:default:api", "nobody", 3).is_empty());
    let stats = book.stats(3);
    assert_eq!((stats[0].held, stats[0].waiting), (2, 1));
}

#[test]
fn a_full_queue_refuses_and_records_nothing() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(1));
    let mut r = req("a", l, 0);
    r.max_waiting = Some(1);
    assert_eq!(acquire(&mut book, &r), Admission::Admitted);
    r.holder = "b".into();
    assert_eq!(acquire(&mut book, &r), Admission::Waiting { retry_at: None });
    r.holder = "c".into();
    assert_eq!(acquire(&mut book, &r), Admission::Full { held: 1, waiting: 1 });
    assert_eq!(book.stats(0)[0].waiting, 1, "the refused request is not queued");
    // b, already queued, is never refused.
    r.holder = "b".into();
    assert_eq!(acquire(&mut book, &r), Admission::Waiting { retry_at: None });
}

#[test]
fn higher_priority_first_then_fifo_or_lifo() {
    for (order, expected) in [(Order::Fifo, ["p9", "a", "b", "c"]), (Order::Lifo, ["p9", "c", "b", "a"])] {
        let mut book = AdmissionBook::default();
        let l = Limits { concurrency: Some(1), order, ..Limits::default() };
        assert_eq!(acquire(&mut book, &req("h", l, 0)), Admission::Admitted);
        for h in ["a", "b", "c"] {
            acquire(&mut book, &req(h, l, 1));
        }
        let mut hi = req("p9", l, 2);
        hi.priority = 9;
        acquire(&mut book, &hi);
        let mut served = Vec::new();
        let mut last = "h".to_string();
        for t in 3..7 {
            let h = book.release("q:default:api", &last, t);
            last = h[0].holder.clone();
            served.push(last.clone());
        }
        assert_eq!(served, expected, "{order:?}");
    }
}

#[test]
fn lowest_first_priority_order_is_respected() {
    let mut book = AdmissionBook::default();
    let l = Limits { concurrency: Some(1), priority: PriorityOrder::LowestFirst, ..Limits::default() };
    acquire(&mut book, &req("h", l, 0));
    let mut a = req("a", l, 1);
    a.priority = 5;
    let mut b = req("b", l, 1);
    b.priority = 1;
    acquire(&mut book, &a);
    acquire(&mut book, &b);
    assert_eq!(holders(&book.release("q:default:api", "h", 2)), ["b"]);
}

#[test]
fn fairness_serves_keys_round_robin_so_a_small_key_is_not_starved() {
    let mut book = AdmissionBook::default();
    let l = Limits { concurrency: Some(1), fairness: true, ..Limits::default() };
    acquire(&mut book, &req("h", l, 0));
    for i in 0..100 {
        let mut r = req(&format!("big{i}"), l, 1);
        r.fairness_key = "big".into();
        acquire(&mut book, &r);
    }
    // Serve a few of the big key first.
    let mut last = "h".to_string();
    for t in 0..3 {
        last = book.release("q:default:api", &last, 2 + t)[0].holder.clone();
    }
    let mut small = req("small", l, 10);
    small.fairness_key = "small".into();
    assert!(matches!(acquire(&mut book, &small), Admission::Waiting { .. }));
    let next = book.release("q:default:api", &last, 11)[0].holder.clone();
    let then = if next == "small" { next } else { book.release("q:default:api", &next, 12)[0].holder.clone() };
    assert_eq!(then, "small", "the key with one waiter is served within one slot turn");
}

#[test]
fn a_rate_window_admits_its_limit_and_says_when_to_retry() {
    let mut book = AdmissionBook::default();
    let l = Limits { rate: Some(Rate::per(2, Duration::from_secs(1))), ..Limits::default() };
    assert_eq!(acquire(&mut book, &req("a", l, 1_200)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("b", l, 1_300)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("c", l, 1_400)), Admission::Waiting { retry_at: Some(2_000) });
    assert_eq!(acquire(&mut book, &req("d", l, 1_500)), Admission::Waiting { retry_at: Some(2_000) });
    // In the next window the queued ones go first, in order; a newcomer waits behind them.
    assert_eq!(acquire(&mut book, &req("e", l, 2_001)), Admission::Waiting { retry_at: Some(3_000) });
    assert_eq!(acquire(&mut book, &req("d", l, 2_002)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("c", l, 2_003)), Admission::Admitted);
    assert_eq!(acquire(&mut book, &req("e", l, 2_004)), Admission::Waiting { retry_at: Some(3_000) });
}

#[test]
fn an_expired_lease_is_reclaimed_and_handed_on() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(1));
    let mut dead = req("dead", l, 0);
    dead.lease_until = Some(1_000);
    assert_eq!(acquire(&mut book, &dead), Admission::Admitted);
    let mut w = req("w", l, 10);
    w.lease_until = Some(1_010);
    assert_eq!(acquire(&mut book, &w), Admission::Waiting { retry_at: None });
    // Renewing keeps the slot past its first lease.
    book.renew(&RunId::from("dead"), 2_000);
    assert_eq!(book.acquire(&req("x", l, 1_500)).1, vec![]);
    // Past the renewed lease, the next acquire reclaims it and hands it to the waiter.
    let (answer, handed) = book.acquire(&req("x", l, 2_001));
    assert_eq!(holders(&handed), ["w"]);
    assert!(matches!(answer, Admission::Waiting { .. }));
    assert_eq!(book.slots_of(&RunId::from("w"))[0].lease_until, Some(2_001 + 1_000), "the lease length carries over");
}

#[test]
fn releasing_a_run_frees_its_slots_and_drops_its_queued_requests() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(1));
    acquire(&mut book, &req("a", l, 0));
    acquire(&mut book, &req("b", l, 0));
    acquire(&mut book, &req("c", l, 0));
    assert!(book.release_run(&RunId::from("b"), 1).is_empty(), "b held nothing");
    assert_eq!(holders(&book.release_run(&RunId::from("a"), 2)), ["c"]);
    assert!(book.waits_of(&RunId::from("b")).is_empty());
}

#[test]
fn releasing_several_runs_at_once_hands_nothing_to_them() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(1));
    acquire(&mut book, &req("a", l, 0));
    acquire(&mut book, &req("b", l, 0));
    acquire(&mut book, &req("c", l, 0));
    // a and b go together (a run and its child, deleted): the slot goes past b, to c.
    let ab = [RunId::from("b"), RunId::from("a")];
    assert_eq!(holders(&book.release_runs(&ab, 1)), ["c"]);
    assert_eq!(book.stats(1)[0].window_count, 2, "one admission each for a and c, none for b");
}

#[test]
fn a_refusal_leaves_the_gate_as_it_was() {
    let mut book = AdmissionBook::default();
    let mut r = req("a", limits(Some(1)), 10);
    r.max_waiting = Some(0);
    assert_eq!(acquire(&mut book, &r), Admission::Admitted);
    let before = book.stats(10);
    // A refused request brings other limits and a later time: neither is kept.
    r.holder = "b".into();
    r.limits = Limits { rate: Some(Rate { limit: 5, period_ms: 100 }), ..limits(Some(1)) };
    r.now = 500;
    assert_eq!(acquire(&mut book, &r), Admission::Full { held: 1, waiting: 0 });
    assert_eq!(book.stats(10), before);
}

#[test]
fn a_runs_requests_are_listed_by_gate_then_holder() {
    let mut book = AdmissionBook::default();
    let l = limits(Some(1));
    acquire(&mut book, &req("h", l, 0));
    let mut r = req("x", l, 1);
    r.holder = "x:2".into();
    acquire(&mut book, &r);
    r.holder = "x:1".into();
    acquire(&mut book, &r);
    let waits = book.waits_of(&RunId::from("x"));
    assert_eq!(waits.iter().map(|w| w.holder.as_str()).collect::<Vec<_>>(), ["x:1", "x:2"]);
}

#[test]
fn invalid_limits_are_refused_saying_why() {
    let e = limits(Some(0)).validate().unwrap_err();
    assert!(e.contains("concurrency of 0") && e.contains("at least 1"), "{e}");
    let l = Limits { rate: Some(Rate { limit: 0, period_ms: 1_000 }), ..Limits::default() };
    assert!(l.validate().unwrap_err().contains("rate of 0"));
    assert!(limits(Some(1)).validate().is_ok());
}

#[derive(Debug, Clone)]
enum Op {
    Acquire { holder: u8, key: u8, priority: i8 },
    Release { holder: u8 },
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, 0u8..4, -2i8..3).prop_map(|(holder, key, priority)| Op::Acquire { holder, key, priority }),
        3 => (0u8..24).prop_map(|holder| Op::Release { holder }),
        1 => (0u16..700).prop_map(Op::Advance),
    ]
}

fn arb_limits() -> impl Strategy<Value = Limits> {
    (
        proptest::option::of(1u32..4),
        proptest::option::of((1u32..4, 100u64..1_000)),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_filter("gated", |(c, r, ..)| c.is_some() || r.is_some())
        .prop_map(|(concurrency, rate, lowest, fairness, lifo)| Limits {
            concurrency,
            rate: rate.map(|(limit, period_ms)| Rate { limit, period_ms }),
            priority: if lowest { PriorityOrder::LowestFirst } else { PriorityOrder::HighestFirst },
            fairness,
            order: if lifo { Order::Lifo } else { Order::Fifo },
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Under any script: the concurrency limit is never exceeded, no rate window admits more
    /// than its limit, every hand-off goes to the best-ranked waiter, and once the script
    /// stops and holders keep releasing, every waiter is admitted (nobody starves).
    #[test]
    fn limits_hold_order_holds_and_nobody_starves(l in arb_limits(), ops in proptest::collection::vec(op(), 1..120)) {
        let gate = "q:ns:g";
        let mut book = AdmissionBook::default();
        let mut now: Millis = 10_000;
        let mut admitted_at: Vec<Millis> = Vec::new();
        let mut holding: std::collections::BTreeSet<u8> = Default::default();
        let mut waiting: std::collections::BTreeSet<u8> = Default::default();
        let request = |h: u8, key: u8, priority: i8, now: Millis| SlotRequest {
            gate: gate.into(),
            holder: format!("h{h}"),
            run_id: RunId::from(format!("h{h}").as_str()),
            priority: i32::from(priority),
            fairness_key: format!("k{key}"),
            limits: l,
            lease_until: None,
            max_waiting: None,
            succeeds: None,
            now,
        };
        let parse = |s: &str| s[1..].parse::<u8>().unwrap();
        let check_best = |book: &AdmissionBook, handed: &[Handoff], before: &BTreeMap<Rank, WaiterRecord>| {
            // Hand-offs take the queue's head, in rank order.
            let expected: Vec<&str> = before.values().take(handed.len()).map(|w| w.holder.as_str()).collect();
            prop_assert_eq!(holders(handed), expected);
            let _ = book;
            Ok(())
        };
        for op in ops {
            match op {
                Op::Acquire { holder, key, priority } => {
                    let before = book.gates.get(gate).map(|g| g.queue.clone()).unwrap_or_default();
                    let (answer, handed) = book.acquire(&request(holder, key, priority, now));
                    check_best(&book, &handed, &before)?;
                    for h in &handed {
                        let h = parse(&h.holder);
                        waiting.remove(&h);
                        holding.insert(h);
                        admitted_at.push(now);
                    }
                    match answer {
                        Admission::Admitted => {
                            if holding.insert(holder) || l.concurrency.is_none() {
                                admitted_at.push(now);
                            }
                            waiting.remove(&holder);
                        }
                        Admission::Waiting { .. } => { waiting.insert(holder); }
                        Admission::Full { .. } => prop_assert!(false, "no max_waiting set"),
                    }
                }
                Op::Release { holder } => {
                    let before = book.gates.get(gate).map(|g| {
                        let mut q = g.queue.clone();
                        q.retain(|_, w| w.holder != format!("h{holder}"));
                        q
                    }).unwrap_or_default();
                    let handed = book.release(gate, &format!("h{holder}"), now);
                    check_best(&book, &handed, &before)?;
                    holding.remove(&holder);
                    waiting.remove(&holder);
                    for h in &handed {
                        let h = parse(&h.holder);
                        waiting.remove(&h);
                        holding.insert(h);
                        admitted_at.push(now);
                    }
                }
                Op::Advance(ms) => now += Millis::from(ms),
            }
            if let Some(c) = l.concurrency {
                prop_assert!(book.gates.get(gate).map_or(0, |g| g.live(now)) <= c, "concurrency exceeded");
                prop_assert!(holding.len() as u32 <= c);
            }
            if let Some(r) = l.rate {
                let w = now - now % r.period_ms;
                let in_window = admitted_at.iter().filter(|&&t| t >= w).count() as u32;
                prop_assert!(in_window <= r.limit, "{} admissions in the window from {}", in_window, w);
            }
        }
        // Drain: holders release, waiters retry after windows; everyone gets through.
        for _ in 0..200 {
            if waiting.is_empty() {
                break;
            }
            now += l.rate.map_or(1, |r| r.period_ms);
            for h in std::mem::take(&mut holding) {
                for handed in book.release(gate, &format!("h{h}"), now) {
                    waiting.remove(&parse(&handed.holder));
                    holding.insert(parse(&handed.holder));
                }
            }
            for h in waiting.clone() {
                if book.acquire(&request(h, 0, 0, now)).0 == Admission::Admitted {
                    waiting.remove(&h);
                    holding.insert(h);
                }
            }
        }
        prop_assert!(waiting.is_empty(), "starved: {:?}", waiting);
    }
}

#[derive(Debug, Clone)]
enum BookOp {
    Acquire { gate: u8, run: u8, seq: Option<u8>, key: u8, leased: bool },
    Release { gate: u8, run: u8, seq: Option<u8> },
    ReleaseHolder { run: u8, seq: Option<u8> },
    ReleaseRuns(Vec<u8>),
    Renew { run: u8 },
    Advance(u16),
}

fn book_op() -> impl Strategy<Value = BookOp> {
    let seq = proptest::option::of(0u8..2);
    prop_oneof![
        5 => (0u8..3, 0u8..6, seq.clone(), 0u8..3, any::<bool>())
            .prop_map(|(gate, run, seq, key, leased)| BookOp::Acquire { gate, run, seq, key, leased }),
        2 => (0u8..3, 0u8..6, seq.clone()).prop_map(|(gate, run, seq)| BookOp::Release { gate, run, seq }),
        1 => (0u8..6, seq).prop_map(|(run, seq)| BookOp::ReleaseHolder { run, seq }),
        1 => proptest::collection::vec(0u8..6, 0..3).prop_map(BookOp::ReleaseRuns),
        1 => (0u8..6).prop_map(|run| BookOp::Renew { run }),
        1 => (0u16..300).prop_map(BookOp::Advance),
    ]
}

/// The book's indexes say what a scan of its queues and slots says.
fn check_indexes(book: &AdmissionBook) -> Result<(), TestCaseError> {
    let mut runs: BTreeSet<RunId> = BTreeSet::new();
    for (name, g) in &book.gates {
        let ranks: HashMap<String, Rank> = g.queue.values().map(|w| (w.holder.clone(), w.rank)).collect();
        prop_assert_eq!(&g.ranks, &ranks, "ranks of {}", name);
        let mut rounds: HashMap<String, BTreeMap<i64, u32>> = HashMap::new();
        let mut queued: HashMap<RunId, BTreeSet<String>> = HashMap::new();
        for w in g.queue.values() {
            *rounds.entry(w.fairness_key.clone()).or_default().entry(w.rank.round).or_default() += 1;
            queued.entry(w.run_id.clone()).or_default().insert(w.holder.clone());
            runs.insert(w.run_id.clone());
        }
        prop_assert_eq!(&g.rounds, &rounds, "rounds of {}", name);
        prop_assert_eq!(&g.queued, &queued, "queued of {}", name);
        for s in g.slots.values() {
            runs.insert(s.run_id.clone());
        }
    }
    for run in runs {
        let waits: Vec<WaiterRecord> = {
            let mut w: Vec<WaiterRecord> =
                book.gates.values().flat_map(|g| g.queue.values()).filter(|w| w.run_id == run).cloned().collect();
            w.sort_by(|a, b| (&a.gate, &a.holder).cmp(&(&b.gate, &b.holder)));
            w
        };
        prop_assert_eq!(book.waits_of(&run), waits, "waits of {}", run);
        let slots: Vec<SlotRecord> =
            book.gates.values().flat_map(|g| g.slots.values()).filter(|s| s.run_id == run).cloned().collect();
        prop_assert_eq!(book.slots_of(&run), slots, "slots of {}", run);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Over several gates, runs and holders per run, the indexes the book keeps (by holder,
    /// fairness key and run) always agree with its queues and slots, so a release, a renewal
    /// or a listing that reads only a run's gates sees all of it.
    #[test]
    fn the_indexes_agree_with_the_queues_and_slots(ops in proptest::collection::vec(book_op(), 1..150)) {
        let mut book = AdmissionBook::default();
        let mut now: Millis = 1_000;
        let holder = |run: u8, seq: Option<u8>| seq.map_or(format!("r{run}"), |s| format!("r{run}:{s}"));
        let gate_limits = |gate: u8| Limits {
            concurrency: Some(1 + u32::from(gate)),
            rate: (gate == 2).then_some(Rate { limit: 3, period_ms: 200 }),
            fairness: gate != 0,
            ..Limits::default()
        };
        for op in ops {
            match op {
                BookOp::Acquire { gate, run, seq, key, leased } => {
                    book.acquire(&SlotRequest {
                        gate: format!("g{gate}"),
                        holder: holder(run, seq),
                        run_id: RunId::from(format!("r{run}").as_str()),
                        priority: 0,
                        fairness_key: format!("k{key}"),
                        limits: gate_limits(gate),
                        lease_until: leased.then_some(now + 100),
                        max_waiting: None,
                        succeeds: None,
                        now,
                    });
                }
                BookOp::Release { gate, run, seq } => {
                    book.release(&format!("g{gate}"), &holder(run, seq), now);
                }
                BookOp::ReleaseHolder { run, seq } => {
                    book.release_holder(&RunId::from(format!("r{run}").as_str()), &holder(run, seq), now);
                }
                BookOp::ReleaseRuns(runs) => {
                    let runs: Vec<RunId> = runs.iter().map(|r| RunId::from(format!("r{r}").as_str())).collect();
                    book.release_runs(&runs, now);
                    for r in &runs {
                        prop_assert!(book.waits_of(r).is_empty() && book.slots_of(r).is_empty(), "{} released", r);
                    }
                }
                BookOp::Renew { run } => book.renew(&RunId::from(format!("r{run}").as_str()), now + 150),
                BookOp::Advance(ms) => now += Millis::from(ms),
            }
            check_indexes(&book)?;
        }
    }

    /// `ahead` counted only up to `GateRecord::ahead_cap` decides like the full count.
    #[test]
    fn a_capped_ahead_decides_like_the_full_count(
        concurrency in proptest::option::of(1u32..6),
        rate in proptest::option::of(1u32..6),
        window_count in 0u32..8,
        live in 0u32..8,
        ahead in 0u32..40,
        waiting in 0u32..40,
        queued in any::<bool>(),
        max_waiting in proptest::option::of(0u32..40),
    ) {
        let limits = Limits { concurrency, rate: rate.map(|limit| Rate { limit, period_ms: 1_000 }), ..Limits::default() };
        let mut record = GateRecord::new("g", limits, 0);
        record.window_count = window_count;
        let mut request = req("a", limits, 10);
        request.max_waiting = max_waiting;
        let capped = ahead.min(record.ahead_cap(live));
        prop_assert_eq!(
            decide(&record, &request, live, capped, waiting, queued),
            decide(&record, &request, live, ahead, waiting, queued)
        );
    }
}
