//! `cargo xtask ci` runs the same gates locally and in CI; `cargo xtask bench` runs the
//! benchmark workloads in release mode and writes `<target dir>/bench/results.json`.
//!
//! Built binaries are run from where cargo says it put them (its `compiler-artifact` message),
//! and outputs go under cargo's target directory (`cargo metadata`), so `CARGO_TARGET_DIR` and
//! `build.target-dir` are honoured.

mod cycles;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci                      fmt check, clippy -D warnings, core purity, package, cycles, tests,
                          rustdoc -D warnings, quick bench
  bench [options]         run benchmark workloads (release mode), write <target dir>/bench/results.json
      --quick             shrink every workload (a smoke run)
      --store S[,S..]     memory, sqlite, postgres (default: memory,sqlite; postgres uses DURABLE_PG_URL)
      --workload W[,W..]  chain, long_chain, timers, sleeps, signals, events, fanout, bulk, starts, start_many,
                          schedules, remote_chain, keyed_chain, admission, api, scale (default: all but
                          scale; with --quick all, scale at 10,000 runs)
      --runs N            scale: the suspended runs to populate (default 1000000; 10000000 documented)
      --workers N         run in N worker processes sharing the store (sqlite, postgres; default 0: in-process)
      --transport T[,T..] the workers' run queue: store, nats, redis (default: store; needs --workers;
                          nats uses DURABLE_NATS_URL, redis DURABLE_REDIS_URL)
      --repeat N          run every combination N times, interleaved (round after round), and print
                          the median and range of each (default 1)
  sim [options]           the engine's sample workflows under seeded simulation (release mode, every core)
      --seeds N           how many seeds (default 10000; nightly size: 100000)
      --from S            the first seed (default 0)
      --seed S            one seed only, printing its whole trace (--calls: and every store call)
      --fault-rate P, --crashes N, --engines N   harsher runs (defaults 0.05, 3, one or two)
  purity                  check that durable-core pulls in no I/O crates
  package                 cargo package every publishable crate (no verify build), warnings fail
  cycles [--deny]         import cycles between durable-runtime's modules, nested ones included
                          (--deny: fail on one)
";

/// Whether `ci` fails on an import cycle between durable-runtime's modules (DESIGN §5).
const CYCLES_ENFORCED: bool = true;

/// The crate whose module graph `cycles` checks, relative to the workspace root.
const CYCLES_CRATE: &str = "crates/durable-runtime/src";

/// The README's test command: CI runs exactly this.
const TEST_COMMAND: &[&str] = &["test", "--workspace"];

/// Crates `durable-core` must never depend on (it is the pure, sans-I/O core).
const FORBIDDEN_IN_CORE: &[&str] = &[
    "tokio",
    "mio",
    "rusqlite",
    "libsqlite3-sys",
    "postgres",
    "tokio-postgres",
    "sqlx",
    "reqwest",
    "hyper",
    "socket2",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(&args[1..]),
        Some("purity") => purity(),
        Some("sim") => sim(&args[1..]),
        Some("package") => package(),
        Some("cycles") => match &args[1..] {
            [] => cycles(CYCLES_ENFORCED),
            [flag] if flag == "--deny" => cycles(true),
            other => Err(format!("unknown cycles option {other:?}\n{USAGE}")),
        },
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// `cargo metadata --no-deps` of the workspace.
fn metadata() -> Result<serde_json::Value, String> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err("cargo metadata failed".into());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata printed no JSON: {e}"))
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, `build.target-dir`, or `target/` of the
/// workspace), from `cargo metadata`.
fn target_directory() -> Result<PathBuf, String> {
    target_directory_of(&metadata()?)
}

fn target_directory_of(metadata: &serde_json::Value) -> Result<PathBuf, String> {
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata: no target_directory".to_string())
}

/// Builds the binary `bin` of `package` in release mode and returns the path of its
/// executable, as cargo reports it (so it is found wherever the target directory is).
fn build_release_bin(package: &str, bin: &str) -> Result<PathBuf, String> {
    let step = format!("build {package} (release)");
    eprintln!("\n==> {step}");
    // `json-render-diagnostics`: warnings and errors are still printed for people (stderr);
    // stdout carries only cargo's JSON messages.
    let out = cargo()
        .args(["build", "--release", "-p", package, "--bin", bin, "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{step}: could not start: {e}"))?;
    if !out.status.success() {
        return Err(format!("{step} failed ({})", out.status));
    }
    executable_of(&String::from_utf8_lossy(&out.stdout), bin).map_err(|e| format!("{step}: {e}"))
}

/// The `executable` of the `compiler-artifact` message for the bin target `bin`, among the
/// JSON lines cargo printed with `--message-format=json…`.
fn executable_of(messages: &str, bin: &str) -> Result<PathBuf, String> {
    for line in messages.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let target = &message["target"];
        let is_bin = target["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k == "bin"));
        if message["reason"] == "compiler-artifact"
            && is_bin
            && target["name"] == bin
            && let Some(executable) = message["executable"].as_str()
        {
            return Ok(PathBuf::from(executable));
        }
    }
    Err(format!("cargo reported no executable for the binary {bin:?}"))
}

fn run(step: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n==> {step}");
    let status = cmd.status().map_err(|e| format!("{step}: could not start: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{step} failed ({status})")) }
}

fn ci() -> Result<(), String> {
    run("fmt", cargo().args(["fmt", "--all", "--check"]))?;
    run("clippy", cargo().args(["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"]))?;
    purity()?;
    package()?;
    cycles(CYCLES_ENFORCED)?;
    run("test", cargo().args(TEST_COMMAND))?;
    run("doc", cargo().args(["doc", "--workspace", "--no-deps", "--all-features"]).env("RUSTDOCFLAGS", "-D warnings"))?;
    bench(&["--quick".to_string()])
}

fn purity() -> Result<(), String> {
    eprintln!("\n==> purity: cargo tree -p durable-core -e normal");
    let out = cargo()
        .args(["tree", "-p", "durable-core", "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo tree: {e}"))?;
    if !out.status.success() {
        return Err("cargo tree failed".into());
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| FORBIDDEN_IN_CORE.contains(name))
        .collect();
    if bad.is_empty() {
        eprintln!("durable-core depends on no I/O crate ({} crates checked)", tree.lines().count());
        Ok(())
    } else {
        Err(format!("durable-core must stay free of I/O, but its dependency tree contains: {}", bad.join(", ")))
    }
}

/// `cargo package` of every publishable crate of the workspace (those without `publish = false`,
/// from `cargo metadata`), in one call: cargo packages them in dependency order and resolves
/// their dependencies on each other from the packages it just made, so nothing needs to be on
/// crates.io. `--no-verify` skips building each tarball (the rest of `ci` builds the same
/// sources); a missing description or license, a path dependency without a version, a
/// dependency cycle through dev-dependencies or any other warning fails the step.
fn package() -> Result<(), String> {
    let metadata = metadata()?;
    let crates: Vec<&str> = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?
        .iter()
        // `publish = false` is an empty list of registries.
        .filter(|p| p["publish"].as_array().is_none_or(|registries| !registries.is_empty()))
        .filter_map(|p| p["name"].as_str())
        .collect();
    eprintln!("\n==> package: {}", crates.join(", "));
    let started = std::time::Instant::now();
    let mut cmd = cargo();
    // The working tree may hold uncommitted changes locally; CI packages a clean clone.
    cmd.args(["package", "--no-verify", "--allow-dirty"]);
    for name in &crates {
        cmd.args(["-p", name]);
    }
    let out = cmd.output().map_err(|e| format!("cargo package: could not start: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    eprint!("{log}");
    if !out.status.success() {
        return Err(format!("cargo package failed ({})", out.status));
    }
    let warnings: Vec<&str> = log.lines().filter(|l| l.trim_start().starts_with("warning")).collect();
    if !warnings.is_empty() {
        return Err(format!("cargo package warned (fix the manifests):\n{}", warnings.join("\n")));
    }
    eprintln!("packaged {} crates in {:.1} s", crates.len(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Import cycles between the modules of durable-runtime, nested ones included (see
/// [`mod@cycles`] for the graph and the rule between a parent and its children): printed, and an
/// error when `enforce`.
fn cycles(enforce: bool) -> Result<(), String> {
    let src = root().join(CYCLES_CRATE);
    let graph = cycles::Graph::from_dir(&src)?;
    eprintln!(
        "\n==> cycles: modules of {CYCLES_CRATE} ({} modules, {} edges){}",
        graph.modules.len(),
        graph.edge_count(),
        if enforce { "" } else { ", report only" }
    );
    let components = graph.components();
    let mut count = 0;
    for component in &components {
        for cycle in graph.cycles_in(component) {
            count += 1;
            let hops: Vec<(&String, &String)> = cycle.iter().zip(cycle.iter().cycle().skip(1)).collect();
            eprintln!("cycle: {} -> {}", cycle.join(" -> "), cycle[0]);
            for (from, to) in hops {
                eprintln!("    {from} -> {to}  ({})", graph.edges[from][to]);
            }
        }
    }
    if components.is_empty() {
        eprintln!("no import cycle");
        return Ok(());
    }
    let tangled: usize = components.iter().map(Vec::len).sum();
    let summary = format!("{count} import cycles among {tangled} modules of {CYCLES_CRATE}");
    if enforce {
        Err(summary)
    } else {
        eprintln!("{summary} (report only: CYCLES_ENFORCED in xtask/src/main.rs, or `cargo xtask cycles --deny`)");
        Ok(())
    }
}

const WORKLOADS: &[&str] = &[
    "chain",
    "long_chain",
    "timers",
    "sleeps",
    "signals",
    "events",
    "fanout",
    "bulk",
    "starts",
    "start_many",
    "schedules",
    "remote_chain",
    "keyed_chain",
    "admission",
    "api",
    "scale",
];
/// Workloads run only when named (`--workload`), except at their `--quick` size: `scale`
/// populates a million runs (minutes, ~400 MB of disk).
const ON_REQUEST: &[&str] = &["scale"];
/// Workloads that measure a SQLite file: the other stores are skipped.
const SQLITE_ONLY: &[&str] = &["scale"];
/// The run queues of `--workers` runs: the store-backed queue and the brokers.
const TRANSPORTS: &[&str] = &["store", "nats", "redis"];
/// Workloads that run in one process only (no `--workers`).
const IN_PROCESS_ONLY: &[&str] = &["schedules", "api", "scale"];
/// Stores run by default…
const STORES: &[&str] = &["memory", "sqlite"];
/// …and those that may be asked for (`postgres` needs a server: DURABLE_PG_URL).
const KNOWN_STORES: &[&str] = &["memory", "sqlite", "postgres"];

fn list(value: Option<&String>, flag: &str, known: &[&str]) -> Result<Vec<String>, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    let items: Vec<String> = value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    for item in &items {
        if !known.contains(&item.as_str()) {
            return Err(format!("unknown {flag} value {item:?}; known: {}", known.join(", ")));
        }
    }
    Ok(items)
}

/// `cargo xtask sim`: the `simulate` example of durable-conformance in release mode, with
/// the options passed through (it checks them and prints progress).
fn sim(args: &[String]) -> Result<(), String> {
    let status = cargo()
        .args(["run", "--release", "-p", "durable-conformance", "--example", "simulate", "--"])
        .args(args)
        .status()
        .map_err(|e| format!("cargo run: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("simulation failed ({status})")) }
}

/// The workloads of a `bench` without `--workload`: all but those run on request, which
/// `--quick` includes at their quick size.
fn default_workloads(quick: bool) -> Vec<String> {
    WORKLOADS.iter().filter(|w| quick || !ON_REQUEST.contains(w)).map(|s| s.to_string()).collect()
}

fn bench(args: &[String]) -> Result<(), String> {
    let mut quick = false;
    let mut stores: Vec<String> = STORES.iter().map(|s| s.to_string()).collect();
    let mut workloads: Option<Vec<String>> = None;
    let mut runs: Option<u64> = None;
    let mut workers = 0u32;
    let mut transports = vec!["store".to_string()];
    let mut repeat = 1u32;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--store" => stores = list(it.next(), "--store", KNOWN_STORES)?,
            "--workload" => workloads = Some(list(it.next(), "--workload", WORKLOADS)?),
            "--runs" => {
                runs = Some(
                    it.next()
                        .and_then(|v| v.replace('_', "").parse().ok())
                        .filter(|n| *n >= 10_000)
                        .ok_or("--runs needs a number ≥ 10000")?,
                )
            }
            "--workers" => {
                workers =
                    it.next().and_then(|v| v.parse().ok()).filter(|n| *n >= 1).ok_or("--workers needs a number ≥ 1")?
            }
            "--transport" => transports = list(it.next(), "--transport", TRANSPORTS)?,
            "--repeat" => {
                repeat =
                    it.next().and_then(|v| v.parse().ok()).filter(|n| *n >= 1).ok_or("--repeat needs a number ≥ 1")?
            }
            other => return Err(format!("unknown bench option {other:?}\n{USAGE}")),
        }
    }
    let workloads = workloads.unwrap_or_else(|| default_workloads(quick));
    if runs.is_some() && !workloads.iter().any(|w| w == "scale") {
        return Err("--runs sizes the scale workload: add --workload scale".into());
    }
    if workers == 0 && transports.iter().any(|t| t != "store") {
        return Err("--transport nats|redis is the run queue of worker processes: add --workers N".into());
    }
    let exe = build_release_bin("durable-bench", "durable-bench")?;
    let out_dir = target_directory()?.join("bench");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let mut results = Vec::new();
    if workers > 0 && stores.iter().any(|s| s == "memory") {
        eprintln!("--workers {workers}: worker processes need a shared store; skipping memory");
        stores.retain(|s| s != "memory");
    }
    let mut workloads = workloads;
    if workers > 0 {
        for w in workloads.iter().filter(|w| IN_PROCESS_ONLY.contains(&w.as_str())) {
            eprintln!("--workers {workers}: {w} runs in one process; skipping it");
        }
        workloads.retain(|w| !IN_PROCESS_ONLY.contains(&w.as_str()));
    }
    for round in 1..=repeat {
        for workload in &workloads {
            for store in &stores {
                if SQLITE_ONLY.contains(&workload.as_str()) && store != "sqlite" {
                    if round == 1 {
                        eprintln!("{workload} measures a SQLite file; skipping {store}");
                    }
                    continue;
                }
                for transport in &transports {
                    let mut cmd = Command::new(&exe);
                    cmd.args(["--workload", workload, "--store", store, "--dir"]).arg(&out_dir);
                    cmd.args(["--workers", &workers.to_string(), "--transport", transport]);
                    if quick {
                        cmd.arg("--quick");
                    }
                    if let (Some(runs), "scale") = (runs, workload.as_str()) {
                        cmd.args(["--runs", &runs.to_string()]);
                    }
                    let what = if workers > 0 {
                        format!("{workload} on {store} with {workers} worker processes over {transport}")
                    } else {
                        format!("{workload} on {store}")
                    };
                    let of = if repeat > 1 { format!(" (round {round} of {repeat})") } else { String::new() };
                    eprintln!("==> bench {what}{}{of}", if quick { " (quick)" } else { "" });
                    let out =
                        cmd.stderr(Stdio::inherit()).output().map_err(|e| format!("running {}: {e}", exe.display()))?;
                    if !out.status.success() {
                        return Err(format!("bench {what} failed ({})", out.status));
                    }
                    let line = String::from_utf8_lossy(&out.stdout);
                    let value: serde_json::Value = serde_json::from_str(line.trim())
                        .map_err(|e| format!("bench {what} printed no JSON result ({e}): {line}"))?;
                    results.push(value);
                }
            }
        }
    }
    let path = out_dir.join("results.json");
    let json = serde_json::to_string_pretty(&results).expect("JSON values serialize");
    std::fs::write(&path, json + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    print_table(&results);
    if repeat > 1 {
        print_medians(&results);
    }
    eprintln!("\nwrote {}", path.display());
    Ok(())
}

fn print_table(results: &[serde_json::Value]) {
    println!(
        "\n{:<12} {:<8} {:>3} {:<9} {:>7} {:>6} {:>8} {:>11} {:>9} {:>8} {:>8} {:>8}",
        "workload",
        "store",
        "wrk",
        "transport",
        "runs",
        "steps",
        "wall_s",
        "steps/s",
        "runs/s",
        "p50_ms",
        "p99_ms",
        "rss_mb"
    );
    for r in results {
        let num = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<12} {:<8} {:>3} {:<9} {:>7} {:>6} {:>8.3} {:>11.0} {:>9.0} {:>8.2} {:>8.2} {:>8.1}",
            r["workload"].as_str().unwrap_or("?"),
            r["store"].as_str().unwrap_or("?"),
            num("workers"),
            r["transport"].as_str().unwrap_or("?"),
            num("runs"),
            num("steps_per_run"),
            num("wall_s"),
            num("steps_per_s"),
            num("runs_per_s"),
            num("p50_ms"),
            num("p99_ms"),
            num("peak_rss_mb"),
        );
    }
    print_requests(results);
    print_scale(results);
}

/// The `scale` workload's figures: one line per result, then the first page of each filter.
fn print_scale(results: &[serde_json::Value]) {
    let scaled: Vec<&serde_json::Value> = results.iter().filter(|r| r["workload"] == "scale").collect();
    if scaled.is_empty() {
        return;
    }
    println!(
        "\n{:>10} {:>10} {:>10} {:>11} {:>12} {:>11} {:>10} {:>9} {:>10}",
        "runs",
        "populate/s",
        "startup_ms",
        "idle_rss_mb",
        "worst_pg_ms",
        "wake100_ms",
        "bytes/run",
        "bytes/cp",
        "cp_row_b"
    );
    for r in &scaled {
        let num = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:>10} {:>10.0} {:>10.1} {:>11.1} {:>12.2} {:>11.1} {:>10.0} {:>9.0} {:>10.0}",
            num("runs"),
            num("runs_per_s"),
            num("startup_ms"),
            num("idle_rss_mb"),
            num("slowest_filter_ms"),
            num("wake_100_ms"),
            num("bytes_per_run"),
            num("bytes_per_checkpoint"),
            num("checkpoint_row_bytes"),
        );
    }
    println!("\n{:<48} {:>10} {:>6} {:>9} {:>9}", "scale: list_runs first page", "runs", "rows", "cold_ms", "warm_ms");
    for r in scaled {
        for (filter, t) in r["filters"].as_object().into_iter().flatten() {
            println!(
                "{:<48} {:>10} {:>6} {:>9.2} {:>9.2}",
                filter,
                r["runs"].as_u64().unwrap_or(0),
                t["rows"].as_u64().unwrap_or(0),
                t["cold_ms"].as_f64().unwrap_or(f64::NAN),
                t["warm_ms"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
}

/// The per-request latencies of the workloads that time requests (`api`: its `requests` field,
/// one object per request kind).
fn print_requests(results: &[serde_json::Value]) {
    let timed: Vec<&serde_json::Value> = results.iter().filter(|r| r["requests"].is_object()).collect();
    if timed.is_empty() {
        return;
    }
    println!(
        "\n{:<11} {:<8} {:<12} {:>6} {:>8} {:>8} {:>8}",
        "workload", "store", "request", "n", "p50_ms", "p95_ms", "p99_ms"
    );
    for r in timed {
        for (kind, t) in r["requests"].as_object().into_iter().flatten() {
            let num = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:<11} {:<8} {:<12} {:>6} {:>8.2} {:>8.2} {:>8.2}",
                r["workload"].as_str().unwrap_or("?"),
                r["store"].as_str().unwrap_or("?"),
                kind,
                num("n"),
                num("p50_ms"),
                num("p95_ms"),
                num("p99_ms"),
            );
        }
    }
}

/// One combination's `steps_per_s` over the rounds of `--repeat`.
#[derive(Debug, PartialEq)]
struct Spread {
    /// `workload store workers transport`.
    key: String,
    median: f64,
    min: f64,
    max: f64,
    count: usize,
}

/// The median and range of `steps_per_s` per combination (workload, store, workers,
/// transport), in the order the combinations first appear.
fn spreads(results: &[serde_json::Value]) -> Vec<Spread> {
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for r in results {
        let key = format!(
            "{} {} {} {}",
            r["workload"].as_str().unwrap_or("?"),
            r["store"].as_str().unwrap_or("?"),
            r["workers"],
            r["transport"].as_str().unwrap_or("?")
        );
        let value = r["steps_per_s"].as_f64().unwrap_or(f64::NAN);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(value),
            None => groups.push((key, vec![value])),
        }
    }
    groups
        .into_iter()
        .map(|(key, mut values)| {
            values.sort_by(f64::total_cmp);
            let n = values.len();
            let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
            Spread { key, median, min: values[0], max: values[n - 1], count: n }
        })
        .collect()
}

fn print_medians(results: &[serde_json::Value]) {
    println!("\n{:<40} {:>11} {:>21} {:>3}", "workload store workers transport", "median", "steps/s range", "n");
    for s in spreads(results) {
        println!("{:<40} {:>11.0} {:>10.0}–{:<10.0} {:>3}", s.key, s.median, s.min, s.max, s.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `cargo build --release -p durable-bench --message-format=json-render-diagnostics`
    /// prints on stdout (abridged): artifacts of dependencies, a build script, the bin.
    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#serde@1.0.228","target":{"kind":["lib"],"crate_types":["lib"],"name":"serde","src_path":"/r/serde/src/lib.rs"},"filenames":["/t/release/deps/libserde-1.rlib"],"executable":null,"fresh":true}
{"reason":"build-script-executed","package_id":"registry+https://github.com/rust-lang/crates.io-index#libsqlite3-sys@0.35.0","out_dir":"/t/release/build/libsqlite3-sys-2/out"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/durable#0.1.0","target":{"kind":["lib"],"crate_types":["lib"],"name":"durable","src_path":"/w/crates/durable/src/lib.rs"},"filenames":["/t/release/deps/libdurable-3.rlib"],"executable":null,"fresh":false}
{"reason":"compiler-artifact","package_id":"path+file:///w/bench#durable-bench@0.1.0","target":{"kind":["bin"],"crate_types":["bin"],"name":"durable-bench","src_path":"/w/bench/src/main.rs"},"filenames":["/tmp/xt/release/durable-bench"],"executable":"/tmp/xt/release/durable-bench","fresh":false}
{"reason":"build-finished","success":true}
"#;

    #[test]
    fn the_executable_is_the_bin_artifact_cargo_reported() {
        assert_eq!(executable_of(MESSAGES, "durable-bench"), Ok(PathBuf::from("/tmp/xt/release/durable-bench")));
        // A library of that name, another bin, or no artifact at all: no executable.
        let lib_only = MESSAGES.replace(r#""kind":["bin"]"#, r#""kind":["lib"]"#);
        assert!(executable_of(&lib_only, "durable-bench").is_err());
        assert!(executable_of(MESSAGES, "durable").is_err());
        let err = executable_of("", "durable-bench").unwrap_err();
        assert!(err.contains("durable-bench"), "{err}");
        // Lines that are not JSON (a cargo that printed something else) are skipped.
        let noisy = format!("warning: something\n{MESSAGES}");
        assert_eq!(executable_of(&noisy, "durable-bench"), Ok(PathBuf::from("/tmp/xt/release/durable-bench")));
    }

    #[test]
    fn repeated_runs_are_summed_up_per_combination_by_median_and_range() {
        let r = |transport: &str, steps: f64| serde_json::json!({ "workload": "chain", "store": "postgres", "workers": 3, "transport": transport, "steps_per_s": steps });
        // Interleaved rounds: store, nats, store, nats, store.
        let results = [r("store", 300.0), r("nats", 10.0), r("store", 100.0), r("nats", 30.0), r("store", 200.0)];
        let spread = |key: &str, median, min, max, count| Spread { key: key.into(), median, min, max, count };
        assert_eq!(
            spreads(&results),
            [
                spread("chain postgres 3 store", 200.0, 100.0, 300.0, 3),
                spread("chain postgres 3 nats", 20.0, 10.0, 30.0, 2)
            ]
        );
    }

    #[test]
    fn scale_runs_at_full_size_only_when_named() {
        assert!(!default_workloads(false).iter().any(|w| w == "scale"));
        assert!(default_workloads(false).iter().any(|w| w == "chain"));
        // `--quick` (CI) runs it, at its quick size.
        assert_eq!(default_workloads(true).len(), WORKLOADS.len());
        // `--runs` sizes `scale` alone, and not below its smallest size; refused before any build.
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let err = bench(&args(&["--workload", "chain", "--runs", "20000"])).unwrap_err();
        assert!(err.contains("--workload scale"), "{err}");
        let err = bench(&args(&["--runs", "20000"])).unwrap_err();
        assert!(err.contains("--workload scale"), "{err}");
        let err = bench(&args(&["--workload", "scale", "--runs", "999"])).unwrap_err();
        assert!(err.contains("10000"), "{err}");
    }

    #[test]
    fn the_target_directory_comes_from_cargo_metadata() {
        let metadata = serde_json::json!({ "packages": [], "target_directory": "/tmp/xt", "workspace_root": "/w" });
        assert_eq!(target_directory_of(&metadata), Ok(PathBuf::from("/tmp/xt")));
        assert!(target_directory_of(&serde_json::json!({ "packages": [] })).is_err());
    }
}
