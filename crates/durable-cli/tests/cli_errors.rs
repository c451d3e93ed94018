//! Bad input to every command: exit code 2 and a one-line reason on stderr, never a panic;
//! operator commands never create or initialise a database.

mod support;

use support::{default_db, path_str, run, run_bad, run_ok};

/// Every operator command, with valid arguments, on `db`.
fn operator_commands(db: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["runs", "list", "--db", db],
        vec!["runs", "list", "--json", "--db", db],
        vec!["runs", "show", "some-run", "--db", db],
        vec!["runs", "retry", "some-run", "--db", db],
        vec!["runs", "cancel", "some-run", "--db", db],
        vec!["runs", "delete", "some-run", "--db", db],
        vec!["signal", "some-token", "{}", "--db", db],
    ]
}

#[test]
fn files_that_are_not_durable_databases_are_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"my notes, not a database\n").unwrap();
    let missing = dir.path().join("typo.db");

    for (path, why) in [(&empty, "the file is empty"), (&text, "not an SQLite database"), (&missing, "does not exist")]
    {
        let p = path_str(path);
        for args in operator_commands(p) {
            let err = run_bad(dir.path(), &args, &format!("{p} is not a durable database"));
            assert!(err.contains(why), "{args:?}: {err}");
        }
    }
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "the empty file is still empty");
    assert_eq!(std::fs::read(&text).unwrap(), b"my notes, not a database\n");
    assert!(!missing.exists(), "no database was created");
    // DURABLE_DB names the database too.
    let ran = support::durable(dir.path()).env("DURABLE_DB", &missing).args(["runs", "list"]).output().unwrap();
    assert_eq!(ran.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&ran.stderr).contains("typo.db is not a durable database"));
    // The default ./durable.db is not created either.
    run_bad(dir.path(), &["runs", "list"], "./durable.db is not a durable database");
    assert!(!default_db(dir.path()).exists());
    // The demo refuses a text file as well (it only creates missing or empty files).
    run_bad(dir.path(), &["demo", "--runs", "1", "--db", path_str(&text)], "is not a durable database");
}

#[test]
fn a_database_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    run_ok(dir.path(), &["demo", "--runs", "1", "--db", path_str(&db)]);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("INSERT INTO durable_schema VALUES (999, 'from the future', 0)", []).unwrap();
    drop(conn);
    for args in operator_commands(path_str(&db)) {
        run_bad(dir.path(), &args, "newer than version");
    }
    run_bad(dir.path(), &["demo", "--runs", "1", "--db", path_str(&db)], "upgrade durable");
}

#[test]
fn bad_arguments_and_unknown_runs_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "1", "--db", dbs]);

    let cases: Vec<(Vec<&str>, &str)> = vec![
        // Unknown runs.
        (vec!["runs", "show", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "show", "nope", "--json", "--db", dbs], "run nope not found"),
        (vec!["runs", "retry", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "cancel", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "cancel", "nope", "--compensate", "--db", dbs], "run nope not found"),
        (vec!["runs", "delete", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "show", "", "--db", dbs], "invalid run id"),
        // A run in the wrong state.
        (vec!["runs", "retry", "demo-order-0", "--db", dbs], "only failed or dead runs can be retried"),
        // Malformed JSON, an empty token.
        (vec!["signal", "tok", "{not json", "--db", dbs], "not valid JSON"),
        (vec!["signal", "tok", "", "--db", dbs], "not valid JSON"),
        (vec!["signal", "tok", "{\"a\": 1} trailing", "--db", dbs], "not valid JSON"),
        (vec!["signal", "", "1", "--db", dbs], "token is empty"),
        // Usage errors.
        (vec!["runs", "list", "--status", "bogus", "--db", dbs], "unknown run status \"bogus\""),
        (vec!["runs", "list", "--limit", "many", "--db", dbs], "--limit"),
        (vec!["runs", "show"], "<ID>"),
        (vec!["runs", "frobnicate"], "unrecognized subcommand"),
        (vec!["demo", "--runs", "0"], "--runs"),
        (vec!["demo", "--runs", "lots"], "--runs"),
        (vec!["signal", "tok"], "<JSON>"),
        (vec!["completions", "tcsh"], "tcsh"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ];
    for (args, expected) in cases {
        run_bad(dir.path(), &args, expected);
    }
}

#[test]
fn help_works_on_every_command_and_completions_are_printed() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--help"][..],
        &["demo", "--help"],
        &["runs", "--help"],
        &["runs", "list", "--help"],
        &["runs", "show", "--help"],
        &["runs", "retry", "--help"],
        &["runs", "cancel", "--help"],
        &["runs", "delete", "--help"],
        &["signal", "--help"],
        &["completions", "--help"],
        &["help", "runs", "list"],
    ] {
        let ran = run_ok(dir.path(), args);
        assert!(ran.stdout.contains("Usage: durable"), "{args:?}: {}", ran.stdout);
    }
    // No command at all: the help, as a usage error.
    let ran = run(dir.path(), &[]);
    assert_eq!(ran.code, Some(2));
    assert!(ran.stderr.contains("Usage: durable"), "{ran:?}");
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let ran = run_ok(dir.path(), &["completions", shell]);
        assert!(ran.stdout.contains("durable"), "{shell}: {}", ran.stdout);
    }
    assert!(!default_db(dir.path()).exists(), "help and completions touch no database");
}
