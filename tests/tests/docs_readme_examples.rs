//! The README's examples are real programs: "Several workers on one database" is the `durable`
//! crate's example `postgres_worker` (compiled with the workspace's examples), line for line;
//! "Remote steps and workers" and "Flow control" show the lines of the examples
//! `remote_pipeline` and `flow_control`, "A fleet on NATS" those of `fleet_nats`, and "Traces"
//! those of `otel_traces`, between their `// readme:begin` and `// readme:end` markers.

/// The lines of the first fenced block after the heading `heading` in `text`.
fn block_after(text: &str, heading: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start_matches('#').trim() == heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let open = at + lines[at..].iter().position(|l| l.starts_with("```")).expect("an opening fence");
    let close = open + 1 + lines[open + 1..].iter().position(|l| l.starts_with("```")).expect("a closing fence");
    lines[open + 1..close].iter().map(|l| l.to_string()).collect()
}

/// The code of an example file: its lines after the module docs (`//!`) and the blank line
/// that ends them.
fn example_code(text: &str) -> Vec<String> {
    text.lines().skip_while(|l| l.starts_with("//!")).skip_while(|l| l.trim().is_empty()).map(String::from).collect()
}

#[test]
fn the_readme_shows_the_postgres_worker_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/crates/durable/examples/postgres_worker.rs"))
        .expect("crates/durable/examples/postgres_worker.rs");
    let in_readme = block_after(&readme, "Several workers on one database");
    let code = example_code(&example);
    assert!(code.len() > 10 && code.iter().any(|l| l.contains("queue_wakeups")), "{code:#?}");
    assert_eq!(in_readme, code, "README.md and crates/durable/examples/postgres_worker.rs differ");
}

/// The lines of `text` strictly between the `// readme:begin` and `// readme:end` lines.
fn between_markers(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines.iter().position(|l| l.trim() == "// readme:begin").expect("a `// readme:begin` line");
    let end = lines.iter().position(|l| l.trim() == "// readme:end").expect("a `// readme:end` line");
    assert!(begin < end, "`// readme:begin` must come before `// readme:end`");
    lines[begin + 1..end].iter().map(|l| l.to_string()).collect()
}

#[test]
fn the_readme_shows_the_remote_pipeline_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/crates/durable/examples/remote_pipeline.rs"))
        .expect("crates/durable/examples/remote_pipeline.rs");
    let in_readme = block_after(&readme, "Remote steps and workers");
    let code = between_markers(&example);
    assert!(code.len() > 10 && code.iter().any(|l| l.contains("remote_step(")), "{code:#?}");
    assert!(code.iter().any(|l| l.contains("Worker::builder()")), "{code:#?}");
    assert_eq!(in_readme, code, "README.md and crates/durable/examples/remote_pipeline.rs differ");
}

#[test]
fn the_readme_shows_the_otel_traces_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/crates/durable/examples/otel_traces.rs"))
        .expect("crates/durable/examples/otel_traces.rs");
    let code = between_markers(&example);
    assert!(code.iter().any(|l| l.contains("tracing_opentelemetry::layer()")), "{code:#?}");
    assert_eq!(block_after(&readme, "Traces"), code, "README.md and crates/durable/examples/otel_traces.rs differ");
}

#[test]
fn the_readme_shows_the_flow_control_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/crates/durable/examples/flow_control.rs"))
        .expect("crates/durable/examples/flow_control.rs");
    let in_readme = block_after(&readme, "Flow control");
    let code = between_markers(&example);
    assert!(code.iter().any(|l| l.contains(".singleton(")), "{code:#?}");
    assert!(code.iter().any(|l| l.contains("register_queue(")), "{code:#?}");
    assert!(code.iter().any(|l| l.contains(".queue(\"crm-api\")")), "{code:#?}");
    assert_eq!(in_readme, code, "README.md and crates/durable/examples/flow_control.rs differ");
}

#[test]
fn the_readme_shows_the_fleet_nats_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example = std::fs::read_to_string(format!("{root}/crates/durable/examples/fleet_nats.rs"))
        .expect("crates/durable/examples/fleet_nats.rs");
    let in_readme = block_after(&readme, "A fleet on NATS");
    let code = between_markers(&example);
    assert!(code.iter().any(|l| l.contains("NatsTransport::connect")), "{code:#?}");
    assert!(code.iter().any(|l| l.contains(".control_plane(plane)")), "{code:#?}");
    assert_eq!(in_readme, code, "README.md and crates/durable/examples/fleet_nats.rs differ");
}
