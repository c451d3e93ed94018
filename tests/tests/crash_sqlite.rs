//! Crash test with real processes: a worker runs a 20-step workflow on a SQLite file and is
//! SIGKILLed at random points, at least five times, then restarted until the run completes.
//! No step may run again after its checkpoint committed; a step may run twice only when a kill
//! landed between its side effect and its commit (at most one duplicate per kill). The same
//! again with a short durable sleep after each step, held in the turn
//! (`EngineConfig::hold_sleeps_under`): kills land during holds too. And again with steps that
//! fail twice before they succeed, retried in memory: kills land during the backoffs, and a
//! step's attempts never start over (each failed attempt's count is committed before its
//! retry).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

const STEPS: u32 = 20;
const KILLS: usize = 6;

/// The worker's database and its side-effect ledger, in a temp dir removed (with everything in
/// it) when the test ends.
struct Files {
    db: PathBuf,
    ledger: PathBuf,
    _dir: tempfile::TempDir,
}

/// A small deterministic PRNG (xorshift), seeded and printed so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What the worker's workflow does besides its steps.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Steps only.
    Plain,
    /// A held durable sleep after each step.
    Held,
    /// Each step fails twice (retried in memory after 100 ms), then succeeds.
    Retries,
}

fn worker(files: &Files, mode: Mode) -> std::process::Child {
    let arg = match mode {
        Mode::Plain => None,
        Mode::Held => Some("held"),
        Mode::Retries => Some("retries"),
    };
    Command::new(env!("CARGO_BIN_EXE_crash_worker"))
        .arg(&files.db)
        .arg(&files.ledger)
        .args(arg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start crash_worker")
}

#[test]
fn a_run_survives_repeated_sigkills_without_repeating_committed_steps() {
    survives_sigkills(Mode::Plain);
}

#[test]
fn a_run_of_held_sleeps_survives_repeated_sigkills() {
    survives_sigkills(Mode::Held);
}

#[test]
fn retries_in_memory_survive_repeated_sigkills_without_starting_over() {
    survives_sigkills(Mode::Retries);
}

/// Kills the worker at random points (after 0 to 4 more lines: commits, and the holds or
/// retries of its mode) until it has been killed [`KILLS`] times, then lets it finish; checks
/// the output and the ledger.
fn survives_sigkills(mode: Mode) {
    let held = mode == Mode::Held;
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    eprintln!("crash test seed: {seed} (set CRASH_SEED to replay)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("a temp dir");
    let files = Files { db: dir.path().join("crash.db"), ledger: dir.path().join("crash.ledger"), _dir: dir };

    let mut kills = 0;
    let mut holds = 0;
    let mut retries = 0;
    // (seq, attempt, ledger lines then) for each failed attempt whose count was committed.
    let mut retried = Vec::new();
    let mut committed_before_kills = Vec::new();
    let output = loop {
        let mut child = worker(&files, mode);
        let stdout = BufReader::new(child.stdout.take().unwrap());
        // Kill after a random number of further commits (0 = at start-up), unless enough
        // kills happened: then let it finish.
        let kill_after = if kills < KILLS { Some(rng.below(5)) } else { None };
        let mut seen = 0;
        let mut done = None;
        let mut lines = stdout.lines();
        if kill_after == Some(0) {
            // Let the worker get somewhere (open the file, maybe start the run), then kill.
            let _ = lines.next();
        } else {
            for line in lines.by_ref() {
                let line = line.expect("read worker output");
                if let Some(sum) = line.strip_prefix("done ") {
                    done = Some(sum.parse::<u64>().expect("sum"));
                    break;
                }
                holds += usize::from(line.starts_with("held "));
                if let Some(rest) = line.strip_prefix("retrying ") {
                    // The attempt's failure is committed: from here on the ledger may not show
                    // it, or an earlier attempt of the step, again.
                    let (seq, attempt) = rest.split_once(' ').expect("retrying <seq> <attempt>");
                    let written = std::fs::read_to_string(&files.ledger).map_or(0, |l| l.lines().count());
                    retried.push((seq.parse::<u32>().expect("seq"), attempt.parse::<u32>().expect("attempt"), written));
                    retries += 1;
                }
                seen += 1;
                if Some(seen) == kill_after {
                    break;
                }
            }
        }
        if let Some(sum) = done {
            assert!(child.wait().unwrap().success());
            break sum;
        }
        if kill_after.is_some() {
            child.kill().expect("SIGKILL the worker");
            child.wait().unwrap();
            kills += 1;
            committed_before_kills.push(seen);
        } else {
            let status = child.wait().unwrap();
            panic!("the last worker exited ({status}) without finishing the run");
        }
    };
    assert!(kills >= 5, "only {kills} kills");
    assert_eq!(output, (0..u64::from(STEPS)).sum::<u64>(), "wrong output");

    // The ledger: every step ran; a step ran again only right after a kill that landed
    // before its commit, and never after its checkpoint committed.
    let ledger = std::fs::read_to_string(&files.ledger).expect("ledger");
    // `<run>:<seq>`, and with `Retries` ` <attempt>` after it.
    let entries: Vec<(u32, u32)> = ledger
        .lines()
        .map(|l| {
            let (id, attempt) = l.split_once(' ').unwrap_or((l, "1"));
            let seq = id.rsplit_once(':').expect("step id <run>:<seq>").1.parse().expect("seq");
            (seq, attempt.parse().expect("attempt"))
        })
        .collect();
    if mode == Mode::Retries {
        // Per step, attempts never go back: a kill may repeat the attempt it cut off (before its
        // failure was committed), never an earlier one; each step ends with its third.
        for seq in 0..STEPS {
            let attempts: Vec<u32> = entries.iter().filter(|e| e.0 == seq).map(|e| e.1).collect();
            assert!(attempts.windows(2).all(|w| w[0] <= w[1]), "step {seq} started its attempts over: {attempts:?}");
            assert_eq!(attempts.first(), Some(&1), "step {seq}: {attempts:?}");
            assert_eq!(attempts.last(), Some(&3), "step {seq}: {attempts:?}");
        }
        for (seq, attempt, written) in &retried {
            let again = entries[*written..].iter().find(|e| e.0 == *seq && e.1 <= *attempt);
            assert!(
                again.is_none(),
                "step {seq} ran attempt {again:?} after attempt {attempt}'s failure was committed"
            );
        }
        let repeated = entries.len().checked_sub(3 * STEPS as usize).expect("three attempts per step in the ledger");
        assert!(repeated <= kills, "{repeated} repeated attempts for {kills} kills: {entries:?}");
        assert!(retries > 0, "no retry was seen");
        eprintln!(
            "{kills} kills after {committed_before_kills:?} lines; {repeated} repeated attempts; {retries} retries seen"
        );
        return;
    }
    let seqs: Vec<u32> = entries.iter().map(|e| e.0).collect();
    let mut deduped = seqs.clone();
    deduped.dedup();
    // With `held`, a sleep takes the seq after each step's.
    let step_seqs: Vec<u32> = (0..STEPS).map(|i| if held { 2 * i } else { i }).collect();
    assert_eq!(deduped, step_seqs, "steps ran out of order or one was skipped: {seqs:?}");
    let duplicates = seqs.len() - deduped.len();
    assert!(duplicates <= kills, "{duplicates} duplicate executions for {kills} kills: {seqs:?}");
    for (seq, n) in step_seqs.iter().map(|s| (s, seqs.iter().filter(|x| *x == s).count())) {
        assert!(n <= 2, "step {seq} ran {n} times: {seqs:?}");
    }
    if held {
        assert!(holds > 0, "no sleep was held");
    }
    eprintln!(
        "{kills} kills after {committed_before_kills:?} lines; {duplicates} duplicate side effects; {holds} holds seen"
    );
}
