//! No shipped binary links test code or has fault injection compiled in. The shipped binaries are
//! the ones the Dockerfile builds (`--bin NAME` lines, from the packages of its `-p NAME` list); for
//! each, the crates it links with normal (non-dev, non-build) dependencies, read from `cargo
//! metadata`, must not include the test kit; and the features cargo resolves for exactly the
//! Dockerfile's package selection (`cargo tree -p …`) must not include `fault-injection`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Crates that exist for tests, the demo and the benchmarks only.
const TEST_ONLY: [&str; 1] = ["dlock-testkit"];

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("services/testkit has no workspace root"))
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

/// The packages of the Dockerfile's `cargo build` (`-p NAME` on its lines).
fn shipped_packages() -> Vec<String> {
    let dockerfile = std::fs::read_to_string(workspace_root().join("Dockerfile"))
        .unwrap_or_else(|e| panic!("read the Dockerfile: {e}"));
    let packages: Vec<String> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("-p "))
        .flat_map(|l| {
            l.split_whitespace()
                .filter(|w| *w != "-p" && *w != "\\")
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        packages.len() >= 5,
        "too few -p packages in the Dockerfile: {packages:?}"
    );
    packages
}

/// `(package, features)` of every package a build of `packages` links (normal dependencies), with
/// the features cargo resolves for that selection.
fn resolved_features(packages: &[String]) -> Vec<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args: Vec<String> = [
        "tree", "--locked", "-e", "normal", "--prefix", "none", "-f", "{p}|{f}",
    ]
    .map(String::from)
    .to_vec();
    for p in packages {
        args.push("-p".into());
        args.push(p.clone());
    }
    let out = Command::new(cargo)
        .args(&args)
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("run cargo tree: {e}"));
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (package, features) = l.split_once('|')?;
            let name = package.split_whitespace().next()?;
            Some((name.to_owned(), features.trim_end_matches(" (*)").to_owned()))
        })
        .collect()
}

fn with_fault_injection(features: &[(String, String)]) -> Vec<String> {
    let mut found: Vec<String> = features
        .iter()
        .filter(|(_, f)| f.split(',').any(|f| f == "fault-injection"))
        .map(|(p, _)| p.clone())
        .collect();
    found.dedup();
    found
}

#[test]
fn the_release_build_has_no_fault_injection() {
    let packages = shipped_packages();
    let features = resolved_features(&packages);
    assert!(
        features.iter().any(|(p, _)| p == "payout-executor")
            && features.iter().any(|(p, _)| p == "rail-proxy"),
        "the Dockerfile's packages should include the two with fault injection: {packages:?}"
    );
    let bad = with_fault_injection(&features);
    assert!(
        bad.is_empty(),
        "the release image would be built with fault injection in {bad:?}"
    );
}

/// The check itself can fail: a build that includes the test kit (the workspace's tests, the demo)
/// does turn the feature on.
#[test]
fn the_feature_check_sees_a_build_that_has_fault_injection() {
    let mut packages = shipped_packages();
    packages.push("dlock-testkit".into());
    let found = with_fault_injection(&resolved_features(&packages));
    assert!(
        found.contains(&"payout-executor".to_owned()) && found.contains(&"rail-proxy".to_owned()),
        "{found:?}"
    );
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
        assert!(
            shipped_packages().iter().any(|p| package["name"] == p.as_str()),
            "the Dockerfile builds {bin} but does not name its package {} with -p",
            package["name"]
        );
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

/// The check itself can fail: the developer binary `dlock-dev` (demo, benchmarks, campaign; not
/// shipped) does link the test kit.
#[test]
fn the_closure_sees_a_crate_that_does_link_test_code() {
    let meta = metadata();
    let cli = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "dlock-devtools")
        .and_then(|p| p["id"].as_str())
        .unwrap_or_else(|| panic!("no dlock-devtools package"));
    let linked = normal_closure(&meta, cli);
    assert!(linked.contains("dlock-testkit"), "{linked:?}");
}
