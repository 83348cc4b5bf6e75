//! No shipped binary links test code. The shipped binaries are the ones the Dockerfile builds
//! (`--bin NAME` lines); for each, the crates it links with normal (non-dev, non-build)
//! dependencies, read from `cargo metadata`, must not include the test kit or this stack runner.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Crates that exist for tests, the demo and the benchmarks only.
const TEST_ONLY: [&str; 2] = ["dlock-testkit", "dlock-stack"];

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("services/stack has no workspace root"))
}

fn shipped_binaries() -> Vec<String> {
    let dockerfile = std::fs::read_to_string(workspace_root().join("Dockerfile"))
        .unwrap_or_else(|e| panic!("read the Dockerfile: {e}"));
    let bins: Vec<String> = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("--bin "))
        .map(|b| b.trim_end_matches('\\').trim().to_owned())
        .collect();
    assert!(bins.len() >= 5, "too few --bin lines in the Dockerfile: {bins:?}");
    bins
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("run cargo metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("parse cargo metadata: {e}"))
}

/// Package name of every node reachable from `root` through normal dependencies.
fn normal_closure(meta: &Value, root: &str) -> BTreeSet<String> {
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            // `kind: null` is a normal dependency; "dev" and "build" are not linked into the binary.
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if normal && let Some(pkg) = dep["pkg"].as_str() {
                todo.push(pkg);
            }
        }
    }
    seen.into_iter()
        .filter_map(|id| names.get(id).map(|n| (*n).to_owned()))
        .collect()
}

#[test]
fn shipped_binaries_link_no_test_code() {
    let meta = metadata();
    let mut checked = 0;
    for bin in shipped_binaries() {
        let package = meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["targets"].as_array().into_iter().flatten().any(|t| {
                    t["name"] == bin.as_str()
                        && t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin"))
                })
            })
            .unwrap_or_else(|| panic!("no workspace package has the binary {bin}"));
        let id = package["id"].as_str().unwrap_or_default();
        let linked = normal_closure(&meta, id);
        let bad: Vec<&str> = TEST_ONLY
            .iter()
            .copied()
            .filter(|t| linked.contains(*t))
            .collect();
        assert!(
            bad.is_empty(),
            "the shipped binary {bin} ({}) links {bad:?}",
            package["name"]
        );
        checked += 1;
    }
    assert!(checked >= 5);
}

/// The check itself can fail: the dlock command (a dev tool, not shipped) does link the stack.
#[test]
fn the_closure_sees_a_crate_that_does_link_test_code() {
    let meta = metadata();
    let cli = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "dlock-cli")
        .and_then(|p| p["id"].as_str())
        .unwrap_or_else(|| panic!("no dlock-cli package"));
    let linked = normal_closure(&meta, cli);
    assert!(
        linked.contains("dlock-stack") && linked.contains("dlock-testkit"),
        "{linked:?}"
    );
}
