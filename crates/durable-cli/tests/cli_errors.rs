//! Bad input to every command: exit code 2 and a one-line reason on stderr, never a panic;
//! operator commands never create or initialise a database.

mod support;

use clap::CommandFactory;
use support::{default_db, durable, path_str, run, run_bad, run_ok};

/// Every operator command, with valid arguments, on `db`.
fn operator_commands(db: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["runs", "list", "--db", db],
        vec!["runs", "list", "--json", "--db", db],
        vec!["runs", "show", "some-run", "--db", db],
        vec!["runs", "export", "some-run", "--db", db],
        vec!["runs", "retry", "some-run", "--db", db],
        vec!["runs", "cancel", "some-run", "--db", db],
        vec!["runs", "delete", "some-run", "--db", db],
        vec!["signal", "some-token", "{}", "--db", db],
        vec!["schedules", "list", "--db", db],
        vec!["schedules", "list", "--json", "--db", db],
        vec!["schedules", "show", "some-key", "--db", db],
        vec!["schedules", "pause", "some-key", "--db", db],
        vec!["schedules", "resume", "some-key", "--db", db],
        vec!["schedules", "trigger", "some-key", "--db", db],
        vec!["schedules", "delete", "some-key", "--db", db],
        vec!["queues", "--db", db],
        vec!["queues", "--json", "--kind", "key", "--db", db],
        vec!["workers", "--db", db],
        vec!["signals", "list", "--db", db],
        vec!["signals", "purge", "some-token", "--db", db],
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

/// A database an older durable wrote: operator commands refuse it and leave it as it is (looking
/// must not upgrade a fleet's database: its older workers would then refuse it), naming
/// `durable migrate`, which migrates it and says from which version; a second run has nothing
/// to do.
#[test]
fn an_older_database_is_refused_by_operator_commands_until_durable_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "1", "--db", dbs]);
    // Back to version 12, as a build before the cleanup of children's results left it.
    let version = |db: &std::path::Path| -> i64 {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.query_row("SELECT max(version) FROM durable_schema", [], |r| r.get(0)).unwrap()
    };
    let latest = version(&db);
    assert_eq!(latest, 13, "this test undoes migration 13 (a data cleanup): make it undo the new last one");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(&format!("DELETE FROM durable_schema WHERE version = {latest};")).unwrap();
    drop(conn);
    for args in operator_commands(dbs) {
        let err = run_bad(dir.path(), &args, &format!("older than version {latest} of this build"));
        assert!(err.contains("durable migrate"), "{err}");
    }
    run_bad(dir.path(), &["serve", "--dev", "--addr", "127.0.0.1:0", "--db", dbs], "durable migrate");
    assert_eq!(version(&db), latest - 1, "left as it was");
    let out = run_ok(dir.path(), &["migrate", "--db", dbs]).stdout;
    assert!(out.contains(&format!("from durable schema version {} to {latest}", latest - 1)), "{out}");
    assert_eq!(version(&db), latest);
    let listed = run_ok(dir.path(), &["runs", "list", "--db", dbs]).stdout;
    assert!(listed.contains("demo-order-0"), "{listed}");
    let out = run_ok(dir.path(), &["migrate", "--db", dbs]).stdout;
    assert!(out.contains("nothing to migrate"), "{out}");
    // A file that is not there is not created by `migrate` either.
    run_bad(dir.path(), &["migrate", "--db", "nope.db"], "does not exist");
    assert!(!dir.path().join("nope.db").exists());
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
        // `runs history` is `runs show`.
        (vec!["runs", "history", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "export", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "retry", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "cancel", "nope", "--db", dbs], "run nope not found"),
        (vec!["runs", "cancel", "nope", "--compensate", "--db", dbs], "run nope not found"),
        (vec!["runs", "delete", "nope", "--db", dbs], "run nope not found"),
        (vec!["schedules", "show", "nope", "--db", dbs], "schedule nope not found"),
        (vec!["schedules", "trigger", "nope", "--db", dbs], "schedule nope not found"),
        // An id or key with a space is quoted: the space is not folded into the words around it.
        (vec!["runs", "show", " nope", "--db", dbs], "run \" nope\" not found"),
        (vec!["schedules", "show", "no pe", "--db", dbs], "schedule \"no pe\" not found"),
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
        (vec!["runs", "list", "--namespace", "", "--db", dbs], "--namespace <NAME>"),
        (vec!["runs", "list", "--workflow", " ", "--db", dbs], "it is empty"),
        (vec!["queues", "--namespace", "", "--db", dbs], "--namespace <NAME>"),
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
    // A store variable set but empty is named; a flag given on the command line wins over it.
    for var in ["DURABLE_DB", "DURABLE_URL", "DURABLE_SCHEMA"] {
        let ran = durable(dir.path()).env(var, "").args(["runs", "list"]).output().expect("run durable");
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert_eq!(ran.status.code(), Some(2), "{var}: {stderr}");
        assert!(stderr.contains(&format!("{var} is set but empty")) && stderr.lines().count() == 1, "{var}: {stderr}");
    }
    let ran =
        durable(dir.path()).env("DURABLE_DB", "").args(["runs", "list", "--db", dbs]).output().expect("run durable");
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    // A store flag wins over the other store's variable: --db with DURABLE_URL set lists the
    // file; --url with DURABLE_DB set (even empty) goes to PostgreSQL (here nobody listens).
    let ran = durable(dir.path())
        .env("DURABLE_URL", "postgres://u@127.0.0.1:1/d")
        .args(["runs", "list", "--db", dbs])
        .output()
        .expect("run durable");
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    for db_var in [dbs, ""] {
        let ran = durable(dir.path())
            .env("DURABLE_DB", db_var)
            .args(["runs", "list", "--url", "postgres://u@127.0.0.1:1/d"])
            .output()
            .expect("run durable");
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert_eq!(ran.status.code(), Some(1), "DURABLE_DB={db_var:?}: {stderr}");
        assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
    }
    // Both variables and no flag: which store is meant is not known.
    let ran = durable(dir.path())
        .env("DURABLE_DB", dbs)
        .env("DURABLE_URL", "postgres://u@127.0.0.1:1/d")
        .args(["runs", "list"])
        .output()
        .expect("run durable");
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("DURABLE_DB and DURABLE_URL are both set"), "{stderr}");
    // --schema is PostgreSQL's: without --url it is refused, not dropped while the file is
    // listed; DURABLE_SCHEMA, set for a shell's PostgreSQL work, leaves --db alone.
    for args in [&["runs", "list", "--schema", "app"][..], &["--schema=app", "runs", "list", "--db", dbs]] {
        let ran = durable(dir.path()).args(args).output().expect("run durable");
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert_eq!(ran.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--schema names a PostgreSQL schema and needs --url"), "{stderr}");
        assert!(ran.stdout.is_empty(), "{args:?}");
    }
    run_bad(dir.path(), &["runs", "list", "--url", "postgres://u@127.0.0.1:1/d", "--schema", ""], "--schema is empty");
    let ran = durable(dir.path()).env("DURABLE_SCHEMA", "app").args(["runs", "list", "--db", dbs]).output().unwrap();
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
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
        &["signals", "--help"],
        &["signals", "list", "--help"],
        &["signals", "purge", "--help"],
        &["schedules", "--help"],
        &["schedules", "list", "--help"],
        &["schedules", "show", "--help"],
        &["schedules", "trigger", "--help"],
        &["workers", "--help"],
        &["queues", "--help"],
        &["serve", "--help"],
        &["migrate", "--help"],
        &["completions", "--help"],
        &["help", "runs", "list"],
    ] {
        let ran = run_ok(dir.path(), args);
        assert!(ran.stdout.contains("Usage: durable"), "{args:?}: {}", ran.stdout);
    }
    // No command at all: one line naming the commands (see
    // `a_command_without_its_subcommand_is_one_line_naming_them`).
    run_bad(
        dir.path(),
        &[],
        "'durable' needs a command: demo, runs, schedules, signal, signals, workers, queues, serve, migrate, completions",
    );
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let ran = run_ok(dir.path(), &["completions", shell]);
        assert!(ran.stdout.contains("durable"), "{shell}: {}", ran.stdout);
    }
    assert!(!default_db(dir.path()).exists(), "help and completions touch no database");
}

/// Every command that takes a subcommand, by its words after `durable` (`[]` is `durable`
/// itself), with the names of its subcommands.
fn command_groups() -> Vec<(Vec<String>, Vec<String>)> {
    fn walk(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, Vec<String>)>) {
        let subs: Vec<&clap::Command> =
            cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help").collect();
        if subs.is_empty() {
            return;
        }
        out.push((path.clone(), subs.iter().map(|s| s.get_name().to_string()).collect()));
        for sub in subs {
            walk(sub, [path.clone(), vec![sub.get_name().to_string()]].concat(), out);
        }
    }
    let mut out = Vec::new();
    walk(&durable_cli::Cli::command(), Vec::new(), &mut out);
    out
}

#[test]
fn a_command_without_its_subcommand_is_one_line_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    // The case from the issue, word for word.
    let err = run_bad(dir.path(), &["runs"], "");
    assert_eq!(
        err,
        "error: 'durable runs' needs a subcommand: list, show, export, retry, cancel, delete (see 'durable runs --help')"
    );
    // Every group, with or without flags before the missing subcommand.
    let groups = command_groups();
    assert!(groups.len() >= 2, "{groups:?}");
    for (path, subs) in groups {
        let name = ["durable".to_string()].iter().chain(&path).cloned().collect::<Vec<_>>().join(" ");
        let what = if path.is_empty() { "command" } else { "subcommand" };
        let expected = format!("error: '{name}' needs a {what}: {} (see '{name} --help')", subs.join(", "));
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        for extra in [&[][..], &["--db", "x.db"]] {
            let args = [&words[..], extra].concat();
            assert_eq!(run_bad(dir.path(), &args, ""), expected, "durable {args:?}");
        }
    }
    assert!(!default_db(dir.path()).exists());
}

#[test]
fn an_invalid_run_id_is_quoted_and_escaped_once() {
    let dir = tempfile::tempdir().unwrap();
    let hint = "use a non-empty id of at most 512 bytes without control characters";
    let long = "x".repeat(600);
    let cases = [
        ("line\nbreak", format!(r#"error: invalid run id "line\nbreak": it contains a control character; {hint}"#)),
        ("tab\there", format!(r#"error: invalid run id "tab\there": it contains a control character; {hint}"#)),
        ("", format!(r#"error: invalid run id "": it is empty; {hint}"#)),
        (
            long.as_str(),
            format!(r#"error: invalid run id "{}…" (600 bytes): it is longer than 512 bytes; {hint}"#, "x".repeat(64)),
        ),
    ];
    for (id, expected) in &cases {
        for command in ["show", "export", "retry", "cancel", "delete"] {
            assert_eq!(&run_bad(dir.path(), &["runs", command, id], ""), expected, "runs {command} {id:?}");
        }
    }
}

/// Every command, the demo included, with valid arguments, on the SQLite file `db`.
fn every_command(db: &str) -> Vec<Vec<&str>> {
    let mut commands = operator_commands(db);
    commands.push(vec!["demo", "--runs", "1", "--db", db]);
    commands
}

#[test]
fn a_db_path_that_cannot_be_opened_as_given_exits_2_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, b"a file, not a directory\n").unwrap();
    let in_missing_dir = dir.path().join("no-such-dir").join("durable.db");
    let under_a_file = file.join("durable.db");
    for path in [&in_missing_dir, &under_a_file] {
        let p = path_str(path);
        for args in every_command(p) {
            run_bad(dir.path(), &args, p);
        }
    }
    assert!(!dir.path().join("no-such-dir").exists(), "no directory was created");
    assert_eq!(std::fs::read(&file).unwrap(), b"a file, not a directory\n");
}

#[test]
fn an_unreachable_store_is_a_failure_exit_1_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1: the connection is refused at once.
    let url = "postgres://durable:s3cret@127.0.0.1:1/durable";
    for mut args in every_command("unused.db") {
        let at = args.iter().position(|a| *a == "--db").unwrap();
        args.splice(at..at + 2, ["--url", url]);
        let ran = run(dir.path(), &args);
        assert_eq!(ran.code, Some(1), "durable {args:?}: {ran:?}");
        let err = ran.stderr.trim_end();
        assert_eq!(err.lines().count(), 1, "durable {args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains("connection refused"), "durable {args:?}: {err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}

#[test]
fn a_database_locked_by_another_writer_is_a_failure_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    let dbs = path_str(&db);
    run_ok(dir.path(), &["demo", "--runs", "1", "--db", dbs]);
    // Another process holds the write lock for longer than the store's busy timeout (5 s).
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE; INSERT INTO durable_schema VALUES (998, 'lock holder', 0);").unwrap();
    let ran = run(dir.path(), &["signal", "some-token", "1", "--db", dbs]);
    assert_eq!(ran.code, Some(1), "{ran:?}");
    let err = ran.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("locked"), "{err}");
    conn.execute_batch("ROLLBACK").unwrap();
}

#[test]
fn help_documents_the_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let help = run_ok(dir.path(), &["--help"]).stdout;
    let codes = help.split_once("Exit codes:").map(|(_, rest)| rest).unwrap_or_else(|| panic!("{help}"));
    for line in ["0  ", "1  ", "2  ", "130  "] {
        assert!(codes.lines().any(|l| l.trim_start().starts_with(line)), "no {line:?} line in:\n{codes}");
    }
    assert!(codes.contains("cannot be opened as given"), "{codes}");
}
