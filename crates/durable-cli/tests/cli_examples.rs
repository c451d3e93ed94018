//! Every example the command line shows works as shown: the `durable …` lines of every
//! command's `--help` (its after-help text, and `durable …` in backticks in its about texts and
//! flag descriptions) and of the README (```sh blocks, and `$ durable …` in ```text blocks)
//! run against a database prepared by `durable demo --runs 10` (plus what the schedule and
//! delayed-start examples name, made as the user's code makes it: [`add_schedules_and_a_delayed_run`]),
//! each on a fresh copy, and exit with code 0 — or with the code a trailing `# exits N: …` comment documents,
//! for an example meant to show an error. The flow-control examples (`durable queues`, and the runs
//! of [`add_flow_control_runs`]) need a store that keeps admission records: on one that declares
//! none (`Capabilities::admission`) they are reported as skipped.

mod support;

use std::path::Path;

use clap::CommandFactory;
use support::{default_db, run, run_ok, with_client};

/// What the examples of `durable schedules …` and of a delayed start name, made on the demo's
/// database by an engine with the demo's workflows (the README shows this code where it shows
/// them): the schedules `daily-order`, a demo order at 09:00 on weekdays in Paris, and
/// `hourly-sleep`, a demo sleep every hour; and `order-later`, an order that starts in 2 hours.
fn add_schedules_and_a_delayed_run(db: &Path) {
    use durable::{Overlap, Schedule, StartOptions};
    with_client(db, durable_cli::register_demo_workflows, async |engine| {
        let daily = Schedule::cron("0 9 * * MON-FRI").timezone("Europe/Paris").overlap(Overlap::Skip);
        engine.schedule("daily-order", daily, "demo_order", &serde_json::json!({"n": 0})).await.unwrap();
        let hourly = Schedule::every(std::time::Duration::from_secs(3600)).overlap(Overlap::BufferOne);
        engine.schedule("hourly-sleep", hourly, "demo_sleep", &serde_json::json!({"n": 1})).await.unwrap();
        let later = StartOptions::id("order-later").delay(std::time::Duration::from_secs(2 * 3600));
        engine.start("demo_order", &serde_json::json!({"n": 99}), later).await.unwrap();
    });
}

/// The runs the flow-control examples name, made as the example `flow_control` of the `durable`
/// crate makes them: `sync-acme-1` holds the key `acme` of the singleton workflow `customer_sync`,
/// `sync-acme-2` and `sync-acme-3` wait for it (`pending`). Only on a store that keeps admission
/// records.
fn add_flow_control_runs(db: &Path) {
    use durable::{StartOptions, WorkflowCtx, WorkflowError, WorkflowOptions};
    #[derive(serde::Serialize, serde::Deserialize)]
    struct SyncJob {
        customer: String,
        n: u32,
    }
    let register = |engine: &durable::Engine| {
        let one_per_customer =
            WorkflowOptions::default().singleton(|job: &SyncJob| job.customer.clone()).max_queue_depth(2);
        engine.register_with("customer_sync", 1, one_per_customer, |_: WorkflowCtx, job: SyncJob| async move {
            Ok::<_, WorkflowError>(job.n)
        });
    };
    with_client(db, register, async |engine| {
        for n in 1..=3 {
            let job = SyncJob { customer: "acme".into(), n };
            engine.start("customer_sync", &job, StartOptions::id(format!("sync-acme-{n}"))).await.unwrap();
        }
    });
}

/// Whether an example needs the store's admission records: `durable queues`, or a run of
/// [`add_flow_control_runs`].
fn needs_admission(ex: &Example) -> bool {
    ex.args.first().is_some_and(|a| a == "queues") || ex.args.iter().any(|a| a.starts_with("sync-acme-"))
}

/// One example: where it was found, the line as shown, the arguments after `durable`, and the
/// exit code it should end with.
#[derive(Debug, Clone, PartialEq)]
struct Example {
    source: String,
    line: String,
    args: Vec<String>,
    code: i32,
}

/// Splits `line` like a POSIX shell would (words; '…' and "…" quoting; backslash escapes
/// outside single quotes) up to the first unquoted redirection, pipe, `;`, `&` or `#` comment.
/// Returns the words and the comment (without `#`), if any.
fn shell_words(line: &str) -> (Vec<String>, Option<String>) {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$' | '`')) => w.push(chars.next().unwrap()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            c if c.is_whitespace() => words.extend(word.take()),
            '#' if word.is_none() => {
                let comment: String = chars.collect();
                return (words, Some(comment.trim().to_string()));
            }
            '>' | '<' | '|' | ';' | '&' => break,
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    (words, None)
}

/// The example on `line`, if it is a `durable …` command: `# exits N` at the start of its
/// comment sets the expected exit code (0 otherwise).
fn example(source: &str, line: &str) -> Option<Example> {
    let (words, comment) = shell_words(line);
    let (first, args) = words.split_first()?;
    if first != "durable" {
        return None;
    }
    let code = comment
        .as_deref()
        .and_then(|c| c.strip_prefix("exits "))
        .map(|rest| {
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            n.parse().unwrap_or_else(|_| panic!("{source}: `# exits N` without a number: {line}"))
        })
        .unwrap_or(0);
    Some(Example { source: source.to_string(), line: line.trim().to_string(), args: args.to_vec(), code })
}

/// The `durable …` spans in backticks of a prose text.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).filter(|span| span.starts_with("durable ")).collect()
}

/// The examples of every command's help.
fn help_examples() -> Vec<Example> {
    fn walk(cmd: &clap::Command, name: &str, out: &mut Vec<Example>) {
        let source = format!("`{name} --help`");
        for text in [cmd.get_after_help(), cmd.get_after_long_help()].into_iter().flatten() {
            let text = text.to_string();
            out.extend(text.lines().filter_map(|l| example(&source, l.trim_start().trim_start_matches("$ "))));
        }
        let mut prose: Vec<String> =
            [cmd.get_about(), cmd.get_long_about()].into_iter().flatten().map(|t| t.to_string()).collect();
        for arg in cmd.get_arguments() {
            prose.extend([arg.get_help(), arg.get_long_help()].into_iter().flatten().map(|t| t.to_string()));
        }
        for text in &prose {
            out.extend(code_spans(text).into_iter().filter_map(|span| example(&source, span)));
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{name} {}", sub.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(&durable_cli::Cli::command(), "durable", &mut out);
    out
}

/// The examples of the README: the lines of ```sh blocks that start with `durable `, and the
/// `$ durable …` lines of ```text blocks (a command shown with its output).
fn readme_examples() -> Vec<Example> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut block: Option<&str> = None;
    for (i, line) in readme.lines().enumerate() {
        let source = format!("README.md:{}", i + 1);
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            block = if block.is_some() { None } else { Some(fence.trim()) };
            continue;
        }
        match block {
            Some("sh" | "shell" | "bash" | "console") if line.starts_with("durable ") => {
                out.extend(example(&source, line));
            }
            Some(_) if line.starts_with("$ durable ") => out.extend(example(&source, &line[2..])),
            _ => {}
        }
    }
    out
}

/// Copies the prepared database (and its WAL files, if any) into `to`.
fn copy_db(from: &Path, to: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let name = format!("durable.db{suffix}");
        if from.join(&name).exists() {
            std::fs::copy(from.join(&name), to.join(&name)).expect("copy the prepared database");
        }
    }
}

#[test]
fn every_example_in_the_help_and_the_readme_works_as_shown() {
    let help = help_examples();
    let readme = readme_examples();
    // The extraction found what is there (a change that hides the examples from it fails).
    assert!(help.len() >= 5, "help examples: {help:#?}");
    assert!(readme.len() >= 5, "README examples: {readme:#?}");

    let template = tempfile::tempdir().unwrap();
    run_ok(template.path(), &["demo", "--runs", "10"]);
    assert!(default_db(template.path()).exists());
    add_schedules_and_a_delayed_run(&default_db(template.path()));
    let admission = {
        use durable::store::Store;
        durable::SqliteStore::open(default_db(template.path())).unwrap().capabilities().admission
    };
    if admission {
        add_flow_control_runs(&default_db(template.path()));
    }

    let mut seen: Vec<(Vec<String>, i32)> = Vec::new();
    let mut failures = Vec::new();
    for ex in help.iter().chain(&readme) {
        if seen.contains(&(ex.args.clone(), ex.code)) {
            continue;
        }
        seen.push((ex.args.clone(), ex.code));
        if needs_admission(ex) && !admission {
            eprintln!("skipped {}: `{}`: the SQLite store keeps no admission records", ex.source, ex.line);
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        copy_db(template.path(), dir.path());
        let args: Vec<&str> = ex.args.iter().map(String::as_str).collect();
        let ran = run(dir.path(), &args);
        if ran.code != Some(ex.code) {
            failures.push(format!(
                "{}: `{}` exited {:?}, expected {}\n  stderr: {}",
                ex.source,
                ex.line,
                ran.code,
                ex.code,
                ran.stderr.trim_end()
            ));
        } else if ex.code != 0 {
            let err = ran.stderr.trim_end();
            assert!(err.starts_with("error: ") && err.lines().count() == 1, "{}: `{}`: {err}", ex.source, ex.line);
        }
    }
    assert!(failures.is_empty(), "examples that do not work as shown:\n{}", failures.join("\n"));
}

#[test]
fn shell_words_split_quotes_and_stop_at_redirections_and_comments() {
    let (words, comment) = shell_words(r#"durable signal approve:x '{"approved": true}'  # exits 2: why"#);
    assert_eq!(words, ["durable", "signal", "approve:x", r#"{"approved": true}"#]);
    assert_eq!(comment.as_deref(), Some("exits 2: why"));
    let (words, comment) = shell_words(r#"durable a "b \"c\" d" e\ f > /etc/x"#);
    assert_eq!(words, ["durable", "a", r#"b "c" d"#, "e f"]);
    assert_eq!(comment, None);
    assert_eq!(shell_words("durable completions bash|tee x").0, ["durable", "completions", "bash"]);
    assert_eq!(shell_words("durable a#b").0, ["durable", "a#b"]);

    let ex = example("t", "durable runs retry x   # exits 2: it is compensated").unwrap();
    assert_eq!((ex.args, ex.code), (vec!["runs".to_string(), "retry".into(), "x".into()], 2));
    assert_eq!(example("t", "durable runs list").unwrap().code, 0);
    assert_eq!(example("t", "cargo run -p durable-cli -- demo"), None);
    assert_eq!(code_spans("e.g. `durable completions bash > f`, or `runs retry`"), ["durable completions bash > f"]);
}
