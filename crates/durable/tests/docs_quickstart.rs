//! The README's quickstart is the code of `examples/quickstart.rs`, line for line.
//!
//! The README shows the first ```` ```rust ```` block under `## Quickstart`; the example marks
//! the same lines with `// quickstart:begin` and `// quickstart:end`. The output printed in the
//! README comes from running that example, so the two must not drift apart: edit both together
//! (and paste the example's new output into the README).

use std::path::Path;

const BEGIN: &str = "// quickstart:begin";
const END: &str = "// quickstart:end";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The lines of the first ```` ```rust ```` block after the `## Quickstart` heading.
fn readme_quickstart(readme: &str) -> Vec<&str> {
    let mut lines = readme.lines().skip_while(|l| l.trim_end() != "## Quickstart");
    assert!(lines.next().is_some(), "README.md has no `## Quickstart` heading");
    let mut lines = lines.skip_while(|l| !l.starts_with("## ") && l.trim_end() != "```rust");
    match lines.next() {
        Some(l) if l.trim_end() == "```rust" => {}
        _ => panic!("README.md's `## Quickstart` section has no ```rust code block"),
    }
    let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim_end() != "```").collect();
    assert!(!block.is_empty(), "README.md's quickstart code block is empty");
    block
}

/// The lines strictly between the markers.
fn example_quickstart(example: &str) -> Vec<&str> {
    let all: Vec<&str> = example.lines().collect();
    let begin = all.iter().position(|l| l.trim() == BEGIN).unwrap_or_else(|| panic!("no `{BEGIN}` line"));
    let end = all.iter().position(|l| l.trim() == END).unwrap_or_else(|| panic!("no `{END}` line"));
    assert!(begin < end, "`{BEGIN}` must come before `{END}`");
    all[begin + 1..end].to_vec()
}

#[test]
fn readme_quickstart_is_the_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = read(&root.join("../../README.md"));
    let example = read(&root.join("examples/quickstart.rs"));
    let shown = readme_quickstart(&readme);
    let code = example_quickstart(&example);
    let differs = shown.len() != code.len() || shown.iter().zip(&code).any(|(a, b)| a.trim_end() != b.trim_end());
    if differs {
        let first = shown
            .iter()
            .zip(&code)
            .position(|(a, b)| a.trim_end() != b.trim_end())
            .unwrap_or(shown.len().min(code.len()));
        panic!(
            "README.md's quickstart ({} lines) and examples/quickstart.rs between `{BEGIN}` and `{END}` ({} lines) \
             differ; first difference at line {} of the block:\n  README:  {:?}\n  example: {:?}\n\
             Edit both together, then run `cargo run --release --example quickstart` and paste its output into \
             the README.",
            shown.len(),
            code.len(),
            first + 1,
            shown.get(first).copied().unwrap_or("<end of block>"),
            code.get(first).copied().unwrap_or("<end of block>"),
        );
    }
}

#[test]
fn the_comparison_catches_an_edit_on_either_side() {
    let readme = "# x\n\n## Quickstart\n\n```rust\nlet a = 1;\nlet b = 2;\n```\n\n## Next\n";
    let example = "//! doc\n\n// quickstart:begin\nlet a = 1;\nlet b = 2;\n// quickstart:end\nfn more() {}\n";
    assert_eq!(readme_quickstart(readme), example_quickstart(example));
    // A line dropped from the README, or added to the example, is a difference.
    let shorter = readme.replace("let b = 2;\n", "");
    assert_ne!(readme_quickstart(&shorter), example_quickstart(example));
    let longer = example.replace("let b = 2;\n", "let b = 2;\nlet c = 3;\n");
    assert_ne!(readme_quickstart(readme), example_quickstart(&longer));
}
