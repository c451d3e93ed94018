//! The dependency rules between the crates (docs/ARCHITECTURE.md, "Dependency rules"), read
//! from `cargo metadata`: a store crate builds on `durable-core` alone (never on the runtime,
//! the transport or another store), `durable-transport` on `durable-core` alone, and
//! `durable-runtime` on `durable-core` and `durable-transport` (it never names a concrete
//! store). Only normal dependencies count: tests, examples and doctests may use anything.
//! The purity of `durable-core` itself (no I/O crate in its tree) is `cargo xtask purity`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Each workspace package's normal dependencies on other workspace packages.
fn workspace_edges() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").ok().or_else(|| option_env!("CARGO").map(String::from));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(cargo.as_deref().unwrap_or("cargo"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages.iter().filter_map(|p| p["name"].as_str()).map(String::from).collect();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().expect("package name").to_string();
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null()) // normal (dev and build dependencies have a kind)
                .filter_map(|d| d["name"].as_str())
                .filter(|d| members.contains(*d))
                .map(String::from)
                .collect();
            (name, deps)
        })
        .collect()
}

fn check(edges: &BTreeMap<String, BTreeSet<String>>, krate: &str, allowed: &[&str]) -> Option<String> {
    let deps = edges.get(krate)?;
    let extra: Vec<&str> = deps.iter().map(String::as_str).filter(|d| !allowed.contains(d)).collect();
    (!extra.is_empty()).then(|| format!("{krate} may build on {allowed:?} only, but depends on {extra:?}"))
}

#[test]
fn crates_keep_the_dependency_rules() {
    let edges = workspace_edges();
    let stores: Vec<&String> = edges.keys().filter(|k| k.starts_with("durable-store-")).collect();
    assert!(stores.len() >= 3, "expected the memory, SQLite and PostgreSQL stores, found {stores:?}");
    for required in ["durable-core", "durable-transport", "durable-runtime"] {
        assert!(edges.contains_key(required), "no package {required} in the workspace");
    }
    let mut broken = Vec::new();
    broken.extend(check(&edges, "durable-core", &[]));
    broken.extend(check(&edges, "durable-transport", &["durable-core"]));
    broken.extend(check(&edges, "durable-runtime", &["durable-core", "durable-transport"]));
    for store in stores {
        broken.extend(check(&edges, store, &["durable-core"]));
    }
    assert!(broken.is_empty(), "crate dependency rules broken (docs/ARCHITECTURE.md):\n{}", broken.join("\n"));
}
