//! Fuzzing `SqliteStore::open` on damaged database files, as property tests (they run in
//! `cargo test`).
//!
//! A valid store file with runs, histories, waiters, state and buffered deliveries is written
//! once through the Store API and closed. Each case damages a copy of it — bit flips anywhere
//! and in the 100-byte header, truncations (0, 1, 99, 100, 4096 bytes, mid-page), appended
//! garbage, a page overwritten, a garbage `-wal` file beside it, or a file that is not SQLite at
//! all — and opens it. What must hold: no panic (not even one caught inside the store's
//! threads) and no hang (each case is bounded by a timeout); opening either fails with an error
//! that names the file and says what is wrong, or gives a store on which `list_runs` (paged to
//! the end), `get_run`, `history`, `waiters` and two writes each work or fail with such an
//! error. Refusals that promise to write nothing ("not a durable database", "newer schema")
//! leave the file as it was.

mod common;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use common::{claim, new_run, step};
use durable_core::{
    ClaimOutcome, Commit, Payload, RunFilter, RunId, RunStatus, Store, StoreError, TurnEnd, WaitKind, Waiter,
};
use durable_store_sqlite::{Durability, Error, SqliteOptions, SqliteStore};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;

/// How long one case may take before it counts as a hang (they take milliseconds).
const CASE_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Panics anywhere, counted (the store catches panics on its threads and answers with an error,
// which would hide them).
// ---------------------------------------------------------------------------------------------

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

// ---------------------------------------------------------------------------------------------
// The valid file
// ---------------------------------------------------------------------------------------------

struct Golden {
    bytes: Vec<u8>,
    ids: Vec<RunId>,
}

/// The bytes of a closed store file holding 24 runs in every status, with histories, child
/// links, waiters, state, tags and buffered signals and events.
fn golden() -> &'static Golden {
    static GOLDEN: OnceLock<Golden> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("golden.db");
        let store = SqliteStore::open_with(&path, SqliteOptions::new().durability(Durability::Normal)).unwrap();
        let ids = common::block_on(fill(&store));
        // Dropping the store closes its connections; the last one checkpoints the WAL into the
        // file and removes it, so the file alone holds everything.
        drop(store);
        let wal = PathBuf::from(format!("{}-wal", path.display()));
        assert!(!wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0, "the WAL was checkpointed on close");
        let bytes = std::fs::read(&path).unwrap();
        // The intact copy opens and holds every run.
        let copy = dir.path().join("copy.db");
        std::fs::write(&copy, &bytes).unwrap();
        let store = SqliteStore::open_with(&copy, options(false)).unwrap();
        let page = common::block_on(store.list_runs(&RunFilter { limit: 1_000, ..RunFilter::default() })).unwrap();
        assert_eq!(page.runs.len(), ids.len());
        Golden { bytes, ids }
    })
}

async fn fill(store: &dyn Store) -> Vec<RunId> {
    let mut ids = Vec::new();
    for i in 0..24u64 {
        let id = format!("run-{i}");
        let mut run = new_run(&id, 1_000 + i);
        run.tags = vec![format!("t{}", i % 3), "all".into()];
        run.priority = (i % 5) as i32 - 2;
        if i % 4 == 3 {
            run.parent = Some(durable_core::ParentLink { run_id: RunId::from("run-0"), seq: i as u32 });
        }
        store.create_run(run).await.unwrap();
        ids.push(RunId::from(id.as_str()));
        if i % 6 == 5 {
            continue; // left pending
        }
        let now = 2_000 + i;
        assert!(matches!(
            store.claim_run(claim(&id, "engine", now + 60_000, now)).await.unwrap(),
            ClaimOutcome::Acquired { .. }
        ));
        let mut c = Commit::new(RunId::from(id.as_str()), "engine", now);
        for seq in 0..(i % 7) as u32 {
            let mut cp = step(&id, seq, now, json!({"seq": seq, "text": "é😀".repeat(seq as usize * 8), "n": 1.5e300}));
            if seq % 3 == 2 {
                cp.error = Some(durable_core::StepError::retryable(format!("attempt {seq} failed")).with_code("flaky"));
            }
            c.checkpoints.push(cp);
        }
        c.state.push(("progress".into(), Payload::encode(&json!({"i": i})).unwrap()));
        let seq = (i % 7) as u32;
        c.end = Some(match i % 4 {
            0 => TurnEnd::Settle {
                status: RunStatus::Completed,
                output: Some(Payload::encode(&json!([i, "done"])).unwrap()),
                error: None,
            },
            1 => {
                c.waits.push(Waiter {
                    run_id: RunId::from(id.as_str()),
                    seq,
                    name: "approval".into(),
                    kind: if i % 8 == 1 {
                        WaitKind::Signal { token: format!("approve-{i}") }
                    } else {
                        WaitKind::Event { name: "paid".into(), matcher: Payload::encode(&json!({"order": i})).unwrap() }
                    },
                    created_at: now,
                });
                TurnEnd::Suspend { wake_at: Some(9_000 + i), seen_wake_gen: 0 }
            }
            2 => TurnEnd::Settle {
                status: RunStatus::Failed,
                output: None,
                error: Some(durable_core::StepError::fatal("card declined").with_code("declined")),
            },
            _ => TurnEnd::Suspend { wake_at: None, seen_wake_gen: 0 },
        });
        store.commit(c).await.unwrap();
    }
    store.send_signal("nobody", Payload::encode(&json!({"early": true})).unwrap(), 3_000).await.unwrap();
    store.publish_event("shipped", Payload::encode(&json!({"order": 99})).unwrap(), 3_001).await.unwrap();
    ids
}

fn options(create_if_missing: bool) -> SqliteOptions {
    SqliteOptions::new()
        .durability(Durability::Normal)
        .busy_timeout(Duration::from_secs(2))
        .create_if_missing(create_if_missing)
}

// ---------------------------------------------------------------------------------------------
// Damage
// ---------------------------------------------------------------------------------------------

/// Where a truncation cuts.
#[derive(Debug, Clone)]
enum Cut {
    At(usize),
    /// Inside a page, past the first.
    MidPage(Index),
    Anywhere(Index),
}

#[derive(Debug, Clone)]
enum Damage {
    /// Bits flipped anywhere.
    Flip(Vec<(Index, u8)>),
    /// Bits flipped in the 100-byte database header.
    FlipHeader(Vec<(u8, u8)>),
    Truncate(Cut),
    Append(Vec<u8>),
    /// One page (4096 bytes) overwritten with zeros or noise.
    OverwritePage(Index, Option<u8>),
    /// A leftover `-wal` file: garbage, or a WAL header followed by garbage.
    Wal(Vec<u8>),
    /// The file replaced by something that is not SQLite.
    Replace(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    let bit = 0..8u8;
    prop_oneof![
        4 => prop::collection::vec((any::<Index>(), bit.clone()), 1..16).prop_map(Damage::Flip),
        3 => prop::collection::vec((0..100u8, bit), 1..4).prop_map(Damage::FlipHeader),
        3 => prop_oneof![
            prop::sample::select(vec![0usize, 1, 99, 100, 4095, 4096, 4097]).prop_map(Cut::At),
            any::<Index>().prop_map(Cut::MidPage),
            any::<Index>().prop_map(Cut::Anywhere),
        ]
        .prop_map(Damage::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..9_000).prop_map(Damage::Append),
        2 => (any::<Index>(), prop::option::of(any::<u8>())).prop_map(|(i, fill)| Damage::OverwritePage(i, fill)),
        1 => prop_oneof![
            prop::collection::vec(any::<u8>(), 0..5_000),
            prop::collection::vec(any::<u8>(), 0..5_000).prop_map(|tail| {
                // WAL magic, version 3007000, page size 4096: a plausible header, then noise.
                let mut wal = vec![0x37, 0x7f, 0x06, 0x82, 0x00, 0x2d, 0xe2, 0x18, 0x00, 0x00, 0x10, 0x00];
                wal.extend(tail);
                wal
            }),
        ]
        .prop_map(Damage::Wal),
        1 => prop_oneof![
            prop::collection::vec(any::<u8>(), 1..10_000),
            "[ -~\n]{1,200}".prop_map(String::into_bytes),
            // The SQLite magic, then noise.
            prop::collection::vec(any::<u8>(), 0..5_000).prop_map(|tail| [&b"SQLite format 3\0"[..], &tail].concat()),
        ]
        .prop_map(Damage::Replace),
    ]
}

/// Applies the damage: the file's bytes, and the `-wal` file's if one is left beside it.
fn apply(bytes: &mut Vec<u8>, wal: &mut Option<Vec<u8>>, damage: &Damage) {
    const PAGE: usize = 4096;
    match damage {
        Damage::Flip(flips) if !bytes.is_empty() => {
            for (i, bit) in flips {
                let at = i.index(bytes.len());
                bytes[at] ^= 1 << bit;
            }
        }
        Damage::FlipHeader(flips) => {
            for (at, bit) in flips {
                if let Some(b) = bytes.get_mut(usize::from(*at)) {
                    *b ^= 1 << bit;
                }
            }
        }
        Damage::Truncate(cut) => {
            let len = match cut {
                Cut::At(n) => *n,
                Cut::MidPage(i) => {
                    let pages = (bytes.len() / PAGE).max(1);
                    (1 + i.index(pages)) * PAGE - PAGE / 2
                }
                Cut::Anywhere(i) => i.index(bytes.len() + 1),
            };
            bytes.truncate(len);
        }
        Damage::Append(garbage) => bytes.extend_from_slice(garbage),
        Damage::OverwritePage(i, fill) if !bytes.is_empty() => {
            let start = i.index(bytes.len().div_ceil(PAGE)) * PAGE;
            let end = (start + PAGE).min(bytes.len());
            for (k, b) in bytes[start..end].iter_mut().enumerate() {
                *b = fill.map_or(0, |f| f.wrapping_mul(k as u8).wrapping_add(0x5a));
            }
        }
        Damage::Wal(w) => *wal = Some(w.clone()),
        Damage::Replace(other) => *bytes = other.clone(),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Opening and using a damaged file
// ---------------------------------------------------------------------------------------------

/// What happened to one damaged file (for the summary).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Refused(String),
    /// Opened; every call worked.
    Works,
    /// Opened; some calls failed (with the first failure's kind).
    Degraded(String),
}

/// The first words of an error's reason, to group outcomes.
fn kind_of(message: &str, path: &Path) -> String {
    let rest = message.split_once(&path.display().to_string()).map_or(message, |(_, r)| r);
    let rest = rest.trim_start_matches([':', ' ']);
    let known = [
        "is not a durable database: it is not an SQLite database",
        "is not a durable database: the file is empty",
        "is not a durable database: it is an SQLite database without a durable schema",
        "is not a durable database: it is an SQLite database of another application",
        "is not a durable database: it is an SQLite database with other tables",
        "is not a durable database: its header names file format write version",
        "is not a durable database: SQLite refused it",
        "is not a durable database",
        "has durable schema version",
        "the database file is corrupt",
        "stored data is invalid",
        "the write transaction failed",
        "cannot switch the database to WAL mode",
    ];
    known.iter().find(|k| rest.contains(*k)).map_or_else(|| rest.chars().take(60).collect(), |k| k.to_string())
}

/// An error of the store: names the file, says something, and is no caught panic.
fn check_error(message: &str, path: &Path) -> Result<(), TestCaseError> {
    prop_assert!(message.contains(&path.display().to_string()), "the error names the file: {message}");
    prop_assert!(!message.contains("panicked") && !message.contains("internal error"), "a panic: {message}");
    prop_assert!(kind_of(message, path).len() > 8, "the error says what is wrong: {message}");
    Ok(())
}

fn check_store_error(e: &StoreError, path: &Path) -> Result<(), TestCaseError> {
    check_error(&e.to_string(), path)
}

/// Opens the file and uses the store: every call either works or fails with a clear error.
async fn exercise(path: PathBuf, create: bool, ids: Vec<RunId>) -> Result<Outcome, TestCaseError> {
    let opened = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || SqliteStore::open_with(&path, options(create))).await
    };
    let store = match opened {
        Err(join) => return Err(TestCaseError::fail(format!("open panicked: {join}"))),
        Ok(Err(e)) => {
            prop_assert_eq!(e.path(), path.as_path());
            check_error(&e.to_string(), &path)?;
            prop_assert!(!matches!(e, Error::Stopped { .. }), "{}", e);
            return Ok(Outcome::Refused(kind_of(&e.to_string(), &path)));
        }
        Ok(Ok(store)) => store,
    };
    let mut first_failure: Option<String> = None;
    let mut note = |e: &StoreError| -> Result<(), TestCaseError> {
        check_store_error(e, &path)?;
        first_failure.get_or_insert_with(|| kind_of(&e.to_string(), &path));
        Ok(())
    };

    // Page through every run, as `durable runs list --limit 0` does.
    let mut listed = Vec::new();
    let mut filter = RunFilter { limit: 7, ..RunFilter::default() };
    for page in 0.. {
        prop_assert!(page < 100, "paging does not end: {} runs listed so far", listed.len());
        match store.list_runs(&filter).await {
            Ok(p) => {
                listed.extend(p.runs.into_iter().map(|r| r.id));
                match p.next_cursor {
                    Some(c) => filter.cursor = Some(c),
                    None => break,
                }
            }
            Err(e) => {
                note(&e)?;
                break;
            }
        }
    }
    for filter in [
        RunFilter { statuses: vec![RunStatus::Suspended, RunStatus::Failed], ..RunFilter::default() },
        RunFilter { tag: Some("t1".into()), ..RunFilter::default() },
        RunFilter { parent: Some(RunId::from("run-0")), ..RunFilter::default() },
    ] {
        if let Err(e) = store.list_runs(&filter).await {
            note(&e)?;
        }
    }
    for id in listed.iter().chain(&ids) {
        if let Err(e) = store.get_run(id).await {
            note(&e)?;
        }
        if let Err(e) = store.history(id).await {
            note(&e)?;
        }
        if let Err(e) = store.waiters(id).await {
            note(&e)?;
        }
    }
    // A write, and reading it back.
    match store.create_run(new_run("fresh", 5_000)).await {
        Ok(_) => {
            if let Err(e) = store.get_run(&RunId::from("fresh")).await {
                note(&e)?;
            }
        }
        Err(e) => note(&e)?,
    }
    if let Err(e) = store.send_signal("approve-1", Payload::encode(&json!(1)).unwrap(), 6_000).await {
        note(&e)?;
    }
    // Closing joins the store's threads.
    tokio::task::spawn_blocking(move || drop(store))
        .await
        .map_err(|e| TestCaseError::fail(format!("closing panicked: {e}")))?;
    Ok(first_failure.map_or(Outcome::Works, Outcome::Degraded))
}

/// Writes the damaged copy, opens and uses it under a timeout, and checks that nothing
/// panicked.
fn check_case(damages: &[Damage], create: bool) -> Result<Outcome, TestCaseError> {
    count_panics();
    let golden = golden();
    let mut bytes = golden.bytes.clone();
    let mut wal = None;
    for d in damages {
        apply(&mut bytes, &mut wal, d);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.db");
    std::fs::write(&path, &bytes).unwrap();
    if let Some(wal) = &wal {
        std::fs::write(format!("{}-wal", path.display()), wal).unwrap();
    }
    let panics_before = PANICS.load(Ordering::SeqCst);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let result =
        rt.block_on(async { tokio::time::timeout(CASE_TIMEOUT, exercise(path, create, golden.ids.clone())).await });
    // A hung store thread must not hang the test too.
    rt.shutdown_background();
    let outcome = result.map_err(|_| TestCaseError::fail(format!("no answer within {CASE_TIMEOUT:?}: a hang")))??;
    prop_assert_eq!(PANICS.load(Ordering::SeqCst), panics_before, "something panicked (see the output above)");
    if let Outcome::Refused(kind) = &outcome
        && (kind.starts_with("is not a durable database") || kind.starts_with("has durable schema version"))
    {
        // These refusals promise that nothing was written.
        prop_assert!(std::fs::read(dir.path().join("damaged.db")).unwrap() == bytes, "{kind}: the file changed");
    }
    Ok(outcome)
}

/// Prints how many cases ended each way (with `--nocapture`).
fn summary(label: &str, mut outcomes: Vec<Outcome>) {
    outcomes.sort();
    let mut lines: Vec<(usize, Outcome)> = Vec::new();
    for o in outcomes.drain(..) {
        match lines.last_mut() {
            Some((n, last)) if *last == o => *n += 1,
            _ => lines.push((1, o)),
        }
    }
    let text: Vec<String> = lines.iter().map(|(n, o)| format!("  {n:>4} {o:?}")).collect();
    eprintln!("{label}:\n{}", text.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

/// Random damage: 1 to 3 kinds at once.
const CASES: u32 = 256;

#[test]
fn damaged_files_are_refused_clearly_or_open_into_a_working_store() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        max_shrink_iters: 256,
        source_file: Some(file!()),
        ..Config::default()
    });
    let outcomes = RefCell::new(Vec::new());
    let result = runner.run(&(prop::collection::vec(damage(), 1..4), any::<bool>()), |(damages, create)| {
        outcomes.borrow_mut().push(check_case(&damages, create)?);
        Ok(())
    });
    summary(&format!("outcomes of {CASES} damaged files"), outcomes.into_inner());
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The damage the brief names, each on its own: truncations at the header's and the first
/// page's edges, a header that is not SQLite's, a text file, an empty file.
#[test]
fn truncated_and_foreign_files() {
    let g = golden();
    let cases: Vec<Damage> = vec![
        Damage::Truncate(Cut::At(0)),
        Damage::Truncate(Cut::At(1)),
        Damage::Truncate(Cut::At(99)),
        Damage::Truncate(Cut::At(100)),
        Damage::Truncate(Cut::At(4096)),
        Damage::Truncate(Cut::At(4096 + 2048)),
        Damage::Truncate(Cut::At(g.bytes.len() - 1)),
        Damage::Truncate(Cut::At(g.bytes.len() - 4096)),
        Damage::Append(vec![0xAB; 100]),
        Damage::FlipHeader(vec![(0, 0)]),
        Damage::FlipHeader(vec![(16, 4)]),
        Damage::FlipHeader(vec![(18, 0), (19, 1)]),
        Damage::FlipHeader(vec![(28, 7)]),
        Damage::FlipHeader(vec![(60, 0)]),
        Damage::Replace(b"my notes, not a database\n".to_vec()),
        Damage::Replace(b"SQLite format 3\0".to_vec()),
        Damage::Wal(vec![0; 32]),
    ];
    let mut outcomes = Vec::new();
    for damage in cases {
        for create in [false, true] {
            match check_case(std::slice::from_ref(&damage), create) {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => panic!("{damage:?} (create_if_missing {create}): {e}"),
            }
        }
    }
    summary("outcomes of the named damage", outcomes);
}
