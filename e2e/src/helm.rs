//! The chart, rendered with the real `helm` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::env;
use crate::k8s::Kind;

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
pub fn run(helm: &Path, args: &[&str]) -> (bool, String, String) {
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
pub fn template(helm: &Path, release: &str, ns: &str, sets: &[(&str, &str)], extra: &[&str]) -> String {
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

/// The rendered objects, as YAML values (empty documents left out).
fn documents(yaml: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("helm rendered bad YAML ({e}):\n{yaml}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The `kind` of every rendered object, in order.
pub fn kinds(yaml: &str) -> Vec<String> {
    documents(yaml)
        .iter()
        .map(|d| {
            d.get("kind")
                .and_then(serde_yaml::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// The rendered objects of kind `K`, typed.
pub fn rendered<K: Kind>(yaml: &str) -> Vec<K> {
    let kind = K::kind(&());
    rendered_yaml(yaml, &kind)
        .into_iter()
        .map(|d| serde_yaml::from_value(d).unwrap_or_else(|e| panic!("a rendered {kind}: {e}")))
        .collect()
}

/// The rendered objects of `kind` as YAML, for the kinds no crate here types (the
/// monitoring.coreos.com ones).
pub fn rendered_yaml(yaml: &str, kind: &str) -> Vec<serde_yaml::Value> {
    documents(yaml)
        .into_iter()
        .filter(|d| d.get("kind").and_then(serde_yaml::Value::as_str) == Some(kind))
        .collect()
}
