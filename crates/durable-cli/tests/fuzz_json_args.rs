//! Fuzzing of the command line's JSON arguments, as property tests (they run in `cargo test`).
//!
//! `durable signal <TOKEN> <JSON>` is the one command that takes JSON (`runs retry` takes none).
//! Arbitrary strings go through the grammar and the command exactly as the binary runs them
//! (`Cli::try_parse_from`, then `durable_cli::run`), in-process; a dozen hostile inputs go to
//! the real binary. For any input: no panic; malformed JSON is a bad-input error (exit code 2)
//! with a one-line message; well-formed JSON gets past the parser (here, to the store).

mod support;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use clap::Parser;
use durable_cli::Cli;
use proptest::prelude::*;
use serde_json::Value;
use support::{durable, path_str, run_bad, run_ok};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z\"\\\\]{0,4}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// What a user might type as the payload: JSON, JSON with a typo, JSON-ish tokens, negative
/// numbers and flags, shell leftovers, anything.
fn payload_arg() -> impl Strategy<Value = String> {
    let valid = json_value().prop_map(|v| v.to_string());
    let typo = (json_value(), any::<prop::sample::Index>(), "[\\[\\]{}\",:'\\\\ a-z0-9-]").prop_map(|(v, at, c)| {
        let mut s = v.to_string();
        let mut at = at.index(s.len() + 1);
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.insert_str(at, &c);
        s
    });
    let tokens = prop::collection::vec(
        prop::sample::select(vec![
            "[",
            "]",
            "{",
            "}",
            ",",
            ":",
            "\"",
            "\\u",
            "\\ud800",
            "-",
            "--",
            "1",
            "1e999",
            "e",
            ".",
            "true",
            "nul",
            "'",
            " ",
            "\t",
            "\n",
            "\u{1b}[31m",
            "é",
        ]),
        0..16,
    )
    .prop_map(|t| t.concat());
    prop_oneof![
        3 => valid,
        3 => typo,
        2 => tokens,
        1 => "-[0-9.eE+-]{0,8}",
        1 => "--?[a-z-]{0,8}(=[a-z]{0,3})?",
        2 => any::<String>(),
    ]
    // `-` reads the payload from standard input: the hostile-input test covers it.
    .prop_filter("stdin", |s| s != "-")
}

/// How `durable --db <db> signal tok <payload>` ended, run in-process.
#[derive(Debug)]
enum Outcome {
    /// `-h`, `--help`, `-V`, `--version`: clap shows help (exit code 0).
    Help,
    /// The grammar refused the arguments.
    Usage(u8, String),
    /// The command failed: its exit code and one-line message.
    Failed(u8, String),
    /// It succeeded.
    Done,
}

fn signal(rt: &tokio::runtime::Runtime, db: &Path, payload: &str) -> Outcome {
    use clap::error::ErrorKind;
    let args = ["durable", "--db", path_str(db), "signal", "tok", payload];
    match Cli::try_parse_from(args) {
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => Outcome::Help,
        Err(e) => Outcome::Usage(e.exit_code() as u8, e.to_string()),
        Ok(cli) => match rt.block_on(durable_cli::run(cli)) {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Failed(e.exit_code(), e.one_line()),
        },
    }
}

/// Whether clap takes `arg` for a negative number (a value) rather than a flag: `-` then
/// digits, at most one `.`, at most one `e` (no exponent sign).
fn clap_negative_number(arg: &str) -> bool {
    arg.strip_prefix('-').is_some_and(|n| {
        n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars().all(|c| c.is_ascii_digit() || ".eE".contains(c))
            && n.matches('.').count() <= 1
            && n.matches(['e', 'E']).count() <= 1
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_024, ..ProptestConfig::default() })]

    /// Against a missing database: malformed JSON is refused as such before the store is
    /// opened; well-formed JSON gets to the store, which refuses the missing file. Both exit 2.
    #[test]
    fn a_signal_payload_is_parsed_or_refused_with_exit_code_2(payload in payload_arg()) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("missing.db");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let valid = serde_json::from_str::<Value>(&payload).is_ok();
        match signal(&rt, &db, &payload) {
            // `-h`, `--help`, `-hx`, `-V`, …: clap answers with help, as it should.
            Outcome::Help => prop_assert!(payload.starts_with('-') && payload.contains(['h', 'V', 'v'])),
            Outcome::Usage(code, message) => {
                // The grammar took it for a flag (or the `--` escape): a usage error, as for any
                // mistyped flag; `durable signal tok -- '<json>'` passes it.
                prop_assert_eq!(code, 2, "{}", message);
                prop_assert!(payload.starts_with('-'), "{:?}: {}", payload, message);
                prop_assert!(!(valid && clap_negative_number(&payload)), "{:?}: {}", payload, message);
            }
            Outcome::Failed(code, message) => {
                prop_assert_eq!(code, 2, "{}", message);
                prop_assert!(!message.contains('\n'), "{:?}: {}", payload, message);
                if valid {
                    prop_assert!(message.contains("missing.db is not a durable database"), "{:?}: {}", payload, message);
                } else {
                    prop_assert!(message.contains("the payload is not valid JSON ("), "{:?}: {}", payload, message);
                }
            }
            Outcome::Done => prop_assert!(false, "{:?}: there is no database, yet the signal was sent", payload),
        }
        prop_assert!(!db.exists(), "nothing was created");
    }
}

/// A negative JSON number is a payload, not a flag.
#[test]
fn negative_numbers_are_payloads() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("missing.db");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for payload in ["-1", "-0", "-2.5", "-1e3", "-1E9"] {
        assert!(clap_negative_number(payload));
        match signal(&rt, &db, payload) {
            Outcome::Failed(2, message) => {
                assert!(message.contains("is not a durable database"), "{payload}: {message}")
            }
            other => panic!("{payload}: {other:?}"),
        }
    }
}

/// Runs the real binary with `payload` on standard input (`durable signal tok -`).
fn signal_stdin(dir: &Path, db: &Path, payload: &[u8]) -> (Option<i32>, String, String) {
    let mut child = durable(dir)
        .args(["signal", "tok", "-", "--db", path_str(db)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run durable");
    let mut stdin = child.stdin.take().unwrap();
    let payload = payload.to_vec();
    // Written from another thread: the binary may exit before reading it all.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&payload);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Hostile payloads through the real binary, on a real database: exit 2 and one line naming
/// what is wrong, or delivered (buffered: nobody waits on the token).
#[test]
fn hostile_payloads_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("durable.db");
    drop(durable::SqliteStore::open(&db).expect("a fresh durable database"));
    let dbs = path_str(&db);
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    // An argument is at most 128 KiB on Linux: the larger ones go through standard input.
    let refused: Vec<(String, &str)> = vec![
        ("[".repeat(100_000), "recursion limit exceeded"),
        (deep(128), "recursion limit exceeded"),
        ("1e999".into(), "number out of range"),
        ("-1e999".into(), "number out of range"),
        ("\"\\ud800\"".into(), "hex escape"),
        ("\u{1}\u{7}\u{8}\u{b}\u{c}\u{1b}[2J\u{7f}".into(), "not valid JSON"),
        ("\"tab\there\"".into(), "control character"),
        ("{\"a\": 1} {\"b\": 2}".into(), "trailing characters"),
        (" \t\r\n ".into(), "EOF while parsing"),
        (format!("\"{}", "x".repeat(120_000)), "EOF while parsing a string"),
    ];
    for (payload, expected) in &refused {
        let err = run_bad(dir.path(), &["signal", "tok", payload, "--db", dbs], expected);
        assert!(err.contains("the payload is not valid JSON"), "{err}");
        assert!(err.len() < 400, "the message does not echo the payload: {err}");
    }
    let delivered: Vec<String> = vec![
        deep(127),
        format!("\"{}\"", "x".repeat(120_000)),
        "\"\\u0000\\u001b[31m\\ud83d\\ude00\"".into(),
        "-1".into(),
        "18446744073709551616".into(),
        "1e-999".into(),
    ];
    for payload in &delivered {
        let out = run_ok(dir.path(), &["signal", "tok", payload, "--db", dbs]).stdout;
        assert!(out.starts_with("buffered: no run waits on \"tok\""), "{out}");
    }

    // Standard input: nested 100,000 deep (closed), 10 MB, and bytes that are not UTF-8.
    let cases: Vec<(Vec<u8>, Option<i32>, &str)> = vec![
        (deep(100_000).into_bytes(), Some(2), "recursion limit exceeded"),
        (format!("\"{}\"", "x".repeat(10 << 20)).into_bytes(), Some(2), "over the 4194304-byte payload limit"),
        (b"\"\xff\xfe\"".to_vec(), Some(2), "could not read the payload from standard input"),
        (deep(127).into_bytes(), Some(0), ""),
    ];
    for (payload, code, expected) in cases {
        let (got, stdout, stderr) = signal_stdin(dir.path(), &db, &payload);
        assert_eq!(got, code, "{stderr}");
        if code == Some(2) {
            let err = stderr.trim_end();
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.starts_with("error: ") && err.contains(expected), "{err}");
            assert!(!err.contains("internal error"), "{err}");
        } else {
            assert!(stdout.starts_with("buffered:"), "{stdout} {stderr}");
        }
    }
}
