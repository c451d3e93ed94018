//! `durable demo` as a user runs it: on a fresh directory, and killed with SIGKILL midway then
//! run again (it resumes the same runs and starts none twice).

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;
use support::{DEMO_WORKFLOWS, default_db, durable, is_terminal, list_runs, run_ok, summary_count};

fn top_level(runs: &[Value]) -> Vec<&Value> {
    runs.iter().filter(|r| r["parent"].is_null()).collect()
}

fn expected_ids(n: u32) -> Vec<String> {
    let kinds = ["order", "sleep", "approval", "saga", "fanout"];
    let mut ids: Vec<String> = (0..n).map(|i| format!("demo-{}-{i}", kinds[i as usize % 5])).collect();
    ids.sort();
    ids
}

#[test]
fn demo_runs_50_workflows_on_a_fresh_directory_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    // No --db: the default ./durable.db in the working directory, created by the demo.
    let ran = run_ok(dir.path(), &["demo", "--runs", "50"]);
    assert!(default_db(dir.path()).exists(), "the demo created ./durable.db");
    let out = &ran.stdout;
    assert!(out.contains("done: 50 of 50 runs finished"), "{out}");
    assert_eq!(summary_count(out, "completed"), 40, "{out}");
    assert_eq!(summary_count(out, "failed"), 0, "{out}");
    assert_eq!(summary_count(out, "compensated"), 10, "{out}");
    assert_eq!(summary_count(out, "new"), 50, "{out}");
    assert_eq!(summary_count(out, "resumed"), 0, "{out}");
    assert!(summary_count(out, "steps executed") >= 200, "{out}");
    for label in ["steps/s", "wall time"] {
        assert!(out.lines().any(|l| l.trim_start().starts_with(label)), "no {label} in the summary:\n{out}");
    }
    // The rate counts the demo's deliberate sleeps and waits: it says so, and where the
    // engine's throughput is measured.
    let rate = out.lines().find(|l| l.trim_start().starts_with("steps/s")).unwrap_or_default();
    assert!(rate.contains("includes the demo's deliberate sleeps and waits"), "{rate}");
    assert!(rate.contains("cargo xtask bench"), "{rate}");
    // Without a terminal, progress is plain lines on stderr, ending with the final state.
    let last = ran.stderr.lines().last().unwrap_or_default();
    assert!(last.contains("50/50 runs finished"), "stderr: {}", ran.stderr);

    let runs = list_runs(dir.path(), &default_db(dir.path()));
    let top = top_level(&runs);
    assert_eq!(top.len(), 50, "50 top-level runs");
    let mut ids: Vec<String> = top.iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, expected_ids(50));
    for run in &top {
        let status = run["status"].as_str().unwrap();
        assert!(is_terminal(status), "{} is {status}", run["id"]);
        assert!(DEMO_WORKFLOWS.contains(&run["workflow"].as_str().unwrap()), "{run}");
    }
    // Ten fan-outs over three children each.
    assert_eq!(runs.len() - top.len(), 30, "fan-out children");
    assert!(runs.iter().filter(|r| !r["parent"].is_null()).all(|r| r["status"] == "completed"));
}

#[test]
fn a_demo_killed_midway_resumes_the_same_runs_when_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());

    // 1. Start the demo and SIGKILL it once some runs finished and others did not.
    let mut child = durable(dir.path())
        .args(["demo", "--runs", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start durable demo");
    let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let mut killed_at = None;
    for line in stderr.lines() {
        let line = line.expect("read the demo's progress");
        // "[  0.26s] 40/50 runs finished · …"
        let finished =
            line.split_once("] ").and_then(|(_, rest)| rest.split_once('/')).and_then(|(n, _)| n.parse::<u32>().ok());
        if let Some(n) = finished
            && n > 0
        {
            assert!(n < 50, "the demo finished every run before it could be killed: {line}");
            child.kill().expect("SIGKILL the demo");
            killed_at = Some(n);
            break;
        }
    }
    let _ = child.wait();
    assert!(killed_at.is_some(), "the demo never reported progress");

    // 2. What the killed demo left.
    let before = list_runs(dir.path(), &db);
    let before: BTreeMap<String, (u64, String)> = top_level(&before)
        .into_iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                (r["created_at"].as_u64().unwrap(), r["status"].as_str().unwrap().into()),
            )
        })
        .collect();
    let existed = before.len() as u64;
    let unfinished = before.values().filter(|(_, s)| !is_terminal(s)).count() as u64;
    assert!(unfinished > 0, "some runs were unfinished when the demo was killed: {before:?}");

    // 3. Run it again: it starts only the missing runs and resumes the unfinished ones.
    let ran = run_ok(dir.path(), &["demo", "--runs", "50"]);
    let out = &ran.stdout;
    assert!(out.contains("done: 50 of 50 runs finished"), "{out}");
    assert_eq!(summary_count(out, "new"), 50 - existed, "{out}");
    assert_eq!(summary_count(out, "resumed"), unfinished, "{out}");
    assert_eq!(summary_count(out, "already finished"), existed - unfinished, "{out}");
    assert_eq!(summary_count(out, "completed") + summary_count(out, "compensated"), 50, "{out}");

    // 4. Every run exactly once, all finished; the runs from before were not created again.
    let after = list_runs(dir.path(), &db);
    let top = top_level(&after);
    let mut ids: Vec<String> = top.iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, expected_ids(50), "each demo run exists once");
    for run in &top {
        let id = run["id"].as_str().unwrap();
        assert!(is_terminal(run["status"].as_str().unwrap()), "{id} is {}", run["status"]);
        if let Some((created_at, _)) = before.get(id) {
            assert_eq!(run["created_at"].as_u64(), Some(*created_at), "{id} was created again");
        }
    }
    for fan_out in top.iter().filter(|r| r["workflow"] == "demo_fanout") {
        let children = after.iter().filter(|r| r["parent"]["run_id"] == fan_out["id"]).count();
        assert_eq!(children, 3, "{} has 3 children", fan_out["id"]);
    }

    // 5. A third run has nothing left to do.
    let ran = run_ok(dir.path(), &["demo", "--runs", "50"]);
    assert_eq!(summary_count(&ran.stdout, "already finished"), 50, "{}", ran.stdout);
    assert_eq!(summary_count(&ran.stdout, "new") + summary_count(&ran.stdout, "resumed"), 0, "{}", ran.stdout);
}

#[cfg(unix)]
#[test]
fn ctrl_c_drains_the_demo_and_leaves_no_lease_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = durable(dir.path())
        .args(["demo", "--runs", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start durable demo");
    let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    for line in stderr.lines() {
        let line = line.expect("read the demo's progress");
        if line.split_once("] ").is_some_and(|(_, rest)| !rest.starts_with("0/")) {
            break;
        }
    }
    let sent = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill -INT");
    assert!(sent.success());
    let output = child.wait_with_output().expect("wait for the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(130), "stdout: {stdout}");
    assert!(stdout.contains("interrupted: "), "{stdout}");
    assert!(stdout.contains("run the same command again to resume the rest"), "{stdout}");

    // Drained: nothing is left running or leased, so the next demo resumes at once.
    let runs = list_runs(dir.path(), &default_db(dir.path()));
    for run in &runs {
        assert_ne!(run["status"], "running", "{run}");
        assert!(run["lease_owner"].is_null(), "{run}");
    }
    let unfinished = top_level(&runs).iter().filter(|r| !is_terminal(r["status"].as_str().unwrap())).count() as u64;
    let ran = run_ok(dir.path(), &["demo", "--runs", "50"]);
    assert_eq!(summary_count(&ran.stdout, "resumed"), unfinished, "{}", ran.stdout);
    assert!(ran.stdout.contains("done: 50 of 50 runs finished"), "{}", ran.stdout);
}

#[test]
fn a_run_deleted_while_the_demo_waits_for_it_is_counted_and_the_others_finish() {
    let dir = tempfile::tempdir().unwrap();
    let db = default_db(dir.path());
    // One of the demo's runs left unfinished where no demo can execute it: started at a version
    // of its workflow the demo does not register, it stays pending until an operator acts.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = durable::SqliteStore::open(&db).expect("create the database");
        let client = durable::Engine::builder().store(store).client_only().build().expect("a client");
        client.register("demo_sleep", 99, |_: durable::WorkflowCtx, _: Value| async move {
            Ok::<_, durable::WorkflowError>(())
        });
        client
            .start("demo_sleep", &serde_json::json!({ "n": 1 }), durable::StartOptions::id("demo-sleep-1"))
            .await
            .expect("start the stranded run");
        client.shutdown().await;
    });

    let mut child = durable(dir.path())
        .args(["demo", "--runs", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start durable demo");
    let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (lines, progress) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // Every run but the stranded one finishes; then the demo only waits for it.
    loop {
        match progress.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(line) if line.contains("49/50 runs finished") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("the demo never finished the 49 runs it can execute: {e}");
            }
        }
    }
    run_ok(dir.path(), &["runs", "delete", "demo-sleep-1", "--force"]);
    let output = child.wait_with_output().expect("wait for the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "stdout: {stdout}");
    assert!(stdout.contains("done: 50 of 50 runs finished"), "{stdout}");
    assert_eq!(summary_count(&stdout, "deleted"), 1, "{stdout}");
    assert_eq!(summary_count(&stdout, "resumed"), 1, "{stdout}");
    assert_eq!(summary_count(&stdout, "completed") + summary_count(&stdout, "compensated"), 49, "{stdout}");
}
