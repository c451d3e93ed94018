//! Runs the engine's sample workflows under seeded simulation for a range of seeds, on every
//! core, with a progress line on stderr; stops at the first seed that breaks an invariant and
//! prints it (with how to reproduce it). `cargo xtask sim` runs this in release mode.
//!
//! ```text
//! cargo run --release -p durable-conformance --example simulate -- --seeds 100000
//! cargo run --release -p durable-conformance --example simulate -- --seed 4242   # one seed, with its trace
//! cargo run --release -p durable-conformance --example simulate -- --seed 4242 --calls  # and every store call
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use durable_conformance::sim::{SimFailure, Simulation};
use parking_lot::Mutex;

const USAGE: &str = "usage: simulate [--seeds N (default 10000)] [--from S (default 0)] [--threads T] | --seed S [--calls]
                [--fault-rate P (default 0.05)] [--crashes N (most per seed, default 3)] [--engines N (default: 1 or 2)]";

/// What may go wrong, beyond the defaults.
#[derive(Clone, Copy, Default)]
struct Knobs {
    fault_rate: Option<f64>,
    crashes: Option<u32>,
    engines: Option<usize>,
}

impl Knobs {
    fn simulation(self, seed: u64) -> Simulation {
        let mut sim = Simulation::seeded(seed).samples();
        if let Some(rate) = self.fault_rate {
            sim = sim.fault_rate(rate);
        }
        if let Some(crashes) = self.crashes {
            sim = sim.max_crashes(crashes);
        }
        if let Some(engines) = self.engines {
            sim = sim.engines(engines);
        }
        sim
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut seeds, mut from, mut one, mut threads, mut calls) = (10_000u64, 0u64, None, None, false);
    let mut knobs = Knobs::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--calls" {
            calls = true;
            continue;
        }
        let text = it.next().map(String::as_str).unwrap_or("");
        if arg == "--fault-rate" {
            match text.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => knobs.fault_rate = Some(p),
                _ => {
                    eprintln!("--fault-rate takes a share between 0 and 1, not {text:?}\n{USAGE}");
                    return ExitCode::from(2);
                }
            }
            continue;
        }
        let value = text.parse::<u64>().ok();
        match (arg.as_str(), value) {
            ("--crashes", Some(n)) => knobs.crashes = Some(u32::try_from(n).unwrap_or(u32::MAX)),
            ("--engines", Some(n)) if n >= 1 => knobs.engines = Some(n as usize),
            ("--seeds", Some(n)) => seeds = n,
            ("--from", Some(s)) => from = s,
            ("--seed", Some(s)) => one = Some(s),
            ("--threads", Some(t)) => threads = Some(t.max(1)),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(seed) = one {
        let sim = knobs.simulation(seed);
        return match if calls { sim.trace_store_calls() } else { sim }.run() {
            Ok(report) => {
                for line in &report.trace {
                    println!("{line}");
                }
                eprintln!(
                    "seed {seed}: every invariant held ({} runs, {} engine(s), {} crash(es), {} store faults, trace {:016x})",
                    report.runs.len(),
                    report.engines,
                    report.crashes,
                    report.store_faults,
                    report.trace_hash
                );
                ExitCode::SUCCESS
            }
            Err(failure) => {
                for line in &failure.trace {
                    println!("{line}");
                }
                eprintln!("{failure}");
                ExitCode::FAILURE
            }
        };
    }
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64)).min(seeds.max(1));
    let next = Arc::new(AtomicU64::new(from));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<SimFailure>>> = Arc::new(Mutex::new(None));
    let end = from.saturating_add(seeds);
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, done, stop, failure) = (next.clone(), done.clone(), stop.clone(), failure.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        return;
                    }
                    if let Err(f) = knobs.simulation(seed).run() {
                        stop.store(true, Ordering::Relaxed);
                        let mut first = failure.lock();
                        if first.as_ref().is_none_or(|g| f.seed < g.seed) {
                            *first = Some(f);
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut last = 0;
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let n = done.load(Ordering::Relaxed);
        if n != last {
            last = n;
            let rate = n as f64 / started.elapsed().as_secs_f64().max(1e-9);
            eprint!("\r{n}/{seeds} seeds ({rate:.0}/s, {threads} threads)   ");
            let _ = std::io::stderr().flush();
        }
    }
    eprintln!();
    if let Some(f) = failure.lock().take() {
        eprintln!("{f}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "seeds {from}..{end}: every invariant held ({:.1} s, {threads} threads)",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
