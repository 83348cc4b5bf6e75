//! The chart, rendered with the real `helm` binary.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::env;

pub fn chart_dir() -> PathBuf {
    env::repo_root().join("charts").join("dlock-operator")
}

/// The helm binary, or `None` (with the reason printed) when it is not installed.
pub fn helm(test: &str) -> Option<PathBuf> {
    let found = env::tool("helm");
    if found.is_none() {
        eprintln!("skipped {test}: helm is not installed (scripts/cluster-tools.sh builds it)");
    }
    found
}

/// Runs helm; returns (success, stdout, stderr).
pub fn run(helm: &PathBuf, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn helm {}: {e}", args.join(" ")));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template RELEASE charts/dlock-operator -n NS --set k=v ...` as YAML text.
pub fn template(helm: &PathBuf, release: &str, ns: &str, sets: &[(&str, &str)], extra: &[&str]) -> String {
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        chart.to_string(),
        "--namespace".into(),
        ns.into(),
    ];
    for (k, v) in sets {
        args.push("--set".into());
        args.push(format!("{k}={v}"));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = run(helm, &refs);
    assert!(ok, "helm {} failed:\n{stderr}", refs.join(" "));
    stdout
}

/// The rendered documents of one kind, as JSON (rendered YAML converted by `kubectl create
/// --dry-run=client -o json`, so no YAML parser is needed here).
pub fn rendered_of_kind(kubectl: &crate::Kubectl, yaml: &str, kind: &str) -> Vec<Value> {
    let out = kubectl
        .run_stdin(&["create", "--dry-run=client", "-o", "json", "-f", "-"], yaml)
        .ok();
    // One JSON document per object, concatenated.
    serde_json::Deserializer::from_str(&out.stdout)
        .into_iter::<Value>()
        .map(|v| v.unwrap_or_else(|e| panic!("kubectl printed bad JSON ({e}):\n{}", out.stdout)))
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
        .collect()
}
