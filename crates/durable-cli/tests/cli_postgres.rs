//! The command line on PostgreSQL (`--url`, `--schema`, or `DURABLE_URL`/`DURABLE_SCHEMA`): the
//! demo and every operator command, and bad configuration as one line with the right exit code.
//!
//! The server comes from `DURABLE_PG_URL`; without it every test prints one skip line and passes:
//!
//! ```text
//! DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p durable-cli --test cli_postgres
//! ```
//!
//! Each test uses a schema of its own (`durable_test_cli_<pid>_<n>_<random>`, from
//! `durable_store_postgres::test_support`), dropped at the end, also when it fails.

mod support;

use durable_store_postgres::deadpool_postgres::tokio_postgres;
use durable_store_postgres::test_support::{self, ScratchSchema, url_or_skip, with_database};
use serde_json::Value;
use support::{DEMO_WORKFLOWS, default_db, durable, is_terminal, run, run_bad, run_ok, summary_count};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
}

/// A scratch schema of the test's own, dropped (with everything in it) when the test ends, also
/// when it fails. Only its name is reserved: the `durable` command creates it, or not.
fn scratch_schema(url: &str) -> ScratchSchema {
    runtime().block_on(ScratchSchema::new(url, "cli")).expect("a scratch schema")
}

fn exists(schema: &ScratchSchema) -> bool {
    runtime().block_on(schema.exists()).expect("look the schema up")
}

/// Runs `sql` on the server (a connection of its own).
fn sql(url: &str, sql: &str) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    runtime().block_on(async { test_support::client(url).await?.query(sql, &[]).await })
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect()
}

#[test]
fn the_demo_and_every_operator_command_work_on_postgres() {
    let Some(url) = url_or_skip("the_demo_and_every_operator_command_work_on_postgres") else { return };
    let dir = tempfile::tempdir().unwrap();
    let schema = scratch_schema(&url);
    let pg = ["--url", url.as_str(), "--schema", schema.name()];

    // Operator commands never create the schema.
    let err = run_bad(dir.path(), &[&["runs", "list"][..], &pg].concat(), "no durable schema");
    assert!(err.contains(schema.name()), "{err}");
    assert!(!exists(&schema), "an operator command created the schema");

    // The demo creates it and runs 20 workflows on it.
    let ran = run_ok(dir.path(), &[&["demo", "--runs", "20"][..], &pg].concat());
    let out = &ran.stdout;
    assert!(out.contains("done: 20 of 20 runs finished"), "{out}");
    assert!(out.contains(&format!("(schema \"{}\")", schema.name())), "the demo names where it runs: {out}");
    assert!(!out.contains("s3cret"));
    assert_eq!(summary_count(out, "completed"), 16, "{out}");
    assert_eq!(summary_count(out, "compensated"), 4, "{out}");
    assert!(!default_db(dir.path()).exists(), "no SQLite file was created");

    // `runs list --json`: every run, one JSON object per line.
    let ran = run_ok(dir.path(), &[&["runs", "list", "--json", "--limit", "0"][..], &pg].concat());
    let runs = json_lines(&ran.stdout);
    let top: Vec<&Value> = runs.iter().filter(|r| r["parent"].is_null()).collect();
    assert_eq!(top.len(), 20, "20 top-level runs");
    assert_eq!(runs.len() - top.len(), 12, "four fan-outs over three children each");
    for run in &runs {
        let status = run["status"].as_str().unwrap();
        assert!(is_terminal(status), "{} is {status}", run["id"]);
    }
    for run in &top {
        assert!(DEMO_WORKFLOWS.contains(&run["workflow"].as_str().unwrap()), "{run}");
    }
    // The same through the environment, filtered.
    let ran = durable(dir.path())
        .env("DURABLE_URL", &url)
        .env("DURABLE_SCHEMA", schema.name())
        .args(["runs", "list", "--json", "--status", "failed"])
        .output()
        .unwrap();
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let failed = json_lines(&String::from_utf8_lossy(&ran.stdout));
    assert_eq!(failed.len(), 4, "the four sagas failed (and compensated)");

    // show, retry, cancel, delete, signal, schedules.
    let ran = run_ok(dir.path(), &[&["runs", "show", "demo-saga-3", "--json"][..], &pg].concat());
    let shown: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(shown["run"]["status"], "failed");
    assert_eq!(shown["history"].as_array().map(Vec::len), Some(7), "{shown}");
    // A compensated saga is not retried (its undos ran); cancelling a settled run reports it.
    run_bad(dir.path(), &[&["runs", "retry", "demo-saga-3"][..], &pg].concat(), "ran its undos");
    let ran = run_ok(dir.path(), &[&["runs", "cancel", "demo-saga-3"][..], &pg].concat());
    assert!(ran.stdout.contains("failed"), "{}", ran.stdout);
    run_ok(dir.path(), &[&["runs", "delete", "demo-saga-3"][..], &pg].concat());
    run_bad(dir.path(), &[&["runs", "show", "demo-saga-3"][..], &pg].concat(), "run demo-saga-3 not found");
    let ran = run_ok(dir.path(), &[&["signal", "nobody-waits", "{\"ok\": true}"][..], &pg].concat());
    assert!(ran.stdout.contains("buffered"), "{}", ran.stdout);
    // Schedules: none declared on this schema; an unknown key is bad input.
    let ran = run_ok(dir.path(), &[&["schedules", "list"][..], &pg].concat());
    assert!(ran.stdout.starts_with("no schedules"), "{}", ran.stdout);
    run_bad(dir.path(), &[&["schedules", "trigger", "nope"][..], &pg].concat(), "schedule nope not found");
    // Flow control: nothing is gated on the demo's schema; a store that keeps no admission
    // records says so on one line.
    let admission = runtime().block_on(async {
        use durable::store::Store;
        let options = durable::PostgresOptions::new().schema(schema.name()).create_if_missing(false);
        durable::PostgresStore::connect_with(&url, options).await.expect("connect").capabilities().admission
    });
    if admission {
        let ran = run_ok(dir.path(), &[&["queues"][..], &pg].concat());
        assert!(ran.stdout.starts_with("no step queues or concurrency keys yet"), "{}", ran.stdout);
        assert_eq!(run_ok(dir.path(), &[&["queues", "--json"][..], &pg].concat()).stdout, "");
    } else {
        let err = run_bad(dir.path(), &[&["queues"][..], &pg].concat(), "does not support flow control");
        assert!(err.contains(schema.name()) && !err.contains("s3cret"), "{err}");
    }
    // A demo run again on the same schema resumes nothing and starts nothing.
    let ran = run_ok(dir.path(), &[&["demo", "--runs", "20"][..], &pg].concat());
    assert_eq!(summary_count(&ran.stdout, "new"), 1, "only the deleted run is started again: {}", ran.stdout);
}

/// The command line connects over TLS as the URL's `sslmode` says (the store does the work):
/// `require` encrypts, `verify-ca` with the server's CA file works, and `verify-full` by an
/// address the certificate is not for is refused in one line saying what to fix.
#[test]
fn the_command_line_connects_over_tls_as_the_url_says() {
    let test = "the_command_line_connects_over_tls_as_the_url_says";
    let Some(url) = url_or_skip(test) else { return };
    let on: String = sql(&url, "SHOW ssl").unwrap()[0].get(0);
    if on != "on" {
        println!("{test}: skipped, the server has TLS off (ssl = {on}); turn it on to run this test");
        return;
    }
    let cert: String = sql(&url, "SHOW ssl_cert_file").unwrap()[0].get(0);
    let dir = tempfile::tempdir().unwrap();
    let schema = scratch_schema(&url);
    let with = |url: &str, params: &str| format!("{url}{}{params}", if url.contains('?') { '&' } else { '?' });
    let require = with(&url, "sslmode=require");
    run_ok(dir.path(), &["demo", "--runs", "1", "--url", &require, "--schema", schema.name()]);
    let ca = with(&url, &format!("sslmode=verify-ca&sslrootcert={cert}"));
    let ran = run_ok(dir.path(), &["runs", "list", "--json", "--url", &ca, "--schema", schema.name()]);
    assert_eq!(json_lines(&ran.stdout).iter().filter(|r| r["parent"].is_null()).count(), 1, "{}", ran.stdout);
    // The certificate is for a host name, not an address: verify-full by address is refused.
    if url.contains("127.0.0.1") {
        let wrong_name = with(&url, &format!("sslmode=verify-full&sslrootcert={cert}"));
        // The URL is what must change: exit 2, as for any --url that cannot be opened as given.
        let err =
            run_bad(dir.path(), &["runs", "list", "--url", &wrong_name, "--schema", schema.name()], "certificate");
        assert!(err.contains("sslrootcert"), "{err}");
    }
}

#[test]
fn bad_postgres_configuration_is_one_line_with_the_right_exit_code() {
    let Some(url) = url_or_skip("bad_postgres_configuration_is_one_line_with_the_right_exit_code") else { return };
    let dir = tempfile::tempdir().unwrap();
    let list = |url: &str, schema: &str| -> Vec<String> {
        ["runs", "list", "--url", url, "--schema", schema].iter().map(|s| s.to_string()).collect()
    };

    // A malformed URL: bad input, and the password is never shown.
    let bad_url = list("postgres://u:s3cret@127.0.0.1:notaport/test", "durable");
    let err = run_bad(dir.path(), &args(&bad_url), "invalid PostgreSQL URL");
    assert!(!err.contains("s3cret"), "{err}");
    // A database that does not exist: bad input, naming it.
    let missing = format!("durable_no_such_db_{}", std::process::id());
    let err = run_bad(dir.path(), &args(&list(&with_database(&url, &missing), "durable")), "does not exist");
    assert!(err.contains(&missing), "{err}");
    // A schema written by a newer build: bad input, for every command (the demo too).
    let schema = scratch_schema(&url);
    let pg = ["--url", url.as_str(), "--schema", schema.name()];
    run_ok(dir.path(), &[&["demo", "--runs", "1"][..], &pg].concat());
    sql(
        &url,
        &format!("INSERT INTO \"{}\".schema_version (version, description) VALUES (99, 'future')", schema.name()),
    )
    .unwrap();
    for command in [&["runs", "list"][..], &["signal", "t", "1"], &["demo", "--runs", "1"]] {
        let err = run_bad(dir.path(), &[command, &pg].concat(), "newer than version");
        assert!(err.contains("version 99") && err.contains("upgrade durable"), "{err}");
    }
    // Nothing listens there: a failure (exit 1), not bad input; one line, no password.
    let ran = run(dir.path(), &args(&list("postgres://postgres:s3cret@127.0.0.1:1/test", "durable")));
    assert_eq!(ran.code, Some(1), "{ran:?}");
    let err = ran.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("connection refused") && !err.contains("s3cret"), "{err}");
    // --url and --db together: a usage error.
    let both = ["runs", "list", "--url", url.as_str(), "--db", "x.db"];
    let ran = run(dir.path(), &both);
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(ran.stderr.contains("--url") && ran.stderr.contains("--db"), "{}", ran.stderr);
}

/// An older schema: operator commands refuse it (exit 2) and leave it; `durable migrate`
/// migrates it and says from which version; then it has nothing to do.
#[test]
fn an_older_schema_is_refused_until_durable_migrate() {
    let Some(url) = url_or_skip("an_older_schema_is_refused_until_durable_migrate") else { return };
    let dir = tempfile::tempdir().unwrap();
    let schema = scratch_schema(&url);
    let pg = ["--url", url.as_str(), "--schema", schema.name()];
    run_ok(dir.path(), &[&["demo", "--runs", "1"][..], &pg].concat());
    let version = || -> i32 {
        sql(&url, &format!("SELECT max(version) FROM \"{}\".schema_version", schema.name())).unwrap()[0].get(0)
    };
    let latest = version();
    // The last migration's scripts replace what they define: it runs again unharmed.
    sql(&url, &format!("DELETE FROM \"{}\".schema_version WHERE version = {latest}", schema.name())).unwrap();
    let err = run_bad(dir.path(), &[&["runs", "list"][..], &pg].concat(), &format!("older than version {latest}"));
    assert!(err.contains("durable migrate"), "{err}");
    assert_eq!(version(), latest - 1, "left as it was");
    let out = run_ok(dir.path(), &[&["migrate"][..], &pg].concat()).stdout;
    assert!(out.contains(&format!("from durable schema version {} to {latest}", latest - 1)), "{out}");
    assert_eq!(version(), latest);
    assert!(run_ok(dir.path(), &[&["runs", "list"][..], &pg].concat()).stdout.contains("demo-order-0"));
    let out = run_ok(dir.path(), &[&["migrate"][..], &pg].concat()).stdout;
    assert!(out.contains("nothing to migrate"), "{out}");
}
