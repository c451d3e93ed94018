//! The README's "Several workers on one database" example is the crate docs' doctest of the
//! same name, line for line: the doctest compiles it, this test keeps the README's copy equal.

/// The code of the first fenced block after `heading` in `text` (whose lines start with
/// `prefix`, e.g. `//! ` in a source file).
fn example(text: &str, heading: &str, prefix: &str) -> Vec<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.strip_prefix(prefix).or_else(|| l.strip_prefix(prefix.trim_end())).unwrap_or(l))
        .collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start_matches('#').trim() == heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    let open = at + lines[at..].iter().position(|l| l.starts_with("```")).expect("an opening fence");
    let close = open + 1 + lines[open + 1..].iter().position(|l| l.starts_with("```")).expect("a closing fence");
    lines[open + 1..close].iter().map(|l| l.to_string()).collect()
}

#[test]
fn the_readme_shows_the_doctested_worker_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).expect("src/lib.rs");
    let heading = "Several workers on one database";
    let in_docs = example(&docs, heading, "//! ");
    assert!(in_docs.len() > 10 && in_docs.iter().any(|l| l.contains("queue_wakeups")), "{in_docs:#?}");
    assert_eq!(example(&readme, heading, ""), in_docs, "README.md and the crate docs of durable-store-postgres differ");
}
