//! The generated CRDs: installing them, and keeping the chart's copy identical to `crds/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::wait::conditions;
use kube::{Client, ResourceExt};
use tokio::sync::OnceCell;

use crate::{env, k8s};

/// `crds/` at the repository root, written by `cargo run -p dlock-operator --bin crdgen`
/// (`DLOCK_E2E_CRDS_DIR` points elsewhere, e.g. at `crdgen --out-dir` output of a work in progress).
pub fn generated_dir() -> PathBuf {
    std::env::var_os("DLOCK_E2E_CRDS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env::repo_root().join("crds"))
}

/// `charts/dlock-operator/crds/`, the copy helm installs.
pub fn chart_dir() -> PathBuf {
    crate::helm::chart_dir().join("crds")
}

/// The `*.yaml` files of a directory, by file name.
pub fn yaml_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    let mut files = BTreeMap::new();
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .path();
        if path.extension().is_some_and(|x| x == "yaml") {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            files.insert(name, bytes);
        }
    }
    files
}

/// Differences between two sets of CRD files: missing on either side, or different bytes.
/// Empty means identical.
pub fn diff(generated: &BTreeMap<String, Vec<u8>>, chart: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, bytes) in generated {
        match chart.get(name) {
            None => problems.push(format!("{name}: in crds/ but not in the chart")),
            Some(other) if other != bytes => problems.push(format!("{name}: the chart's copy differs")),
            Some(_) => {}
        }
    }
    for name in chart.keys() {
        if !generated.contains_key(name) {
            problems.push(format!("{name}: in the chart but not in crds/"));
        }
    }
    problems
}

static INSTALLED: OnceCell<Vec<String>> = OnceCell::const_new();

/// Applies every CRD in `crds/` (server-side, as `kubectl apply --server-side -f crds/` would: the
/// schemas are too large for client-side apply's annotation) and waits until each is Established.
/// Returns the CRD names. Idempotent and safe to call from parallel tests.
pub async fn install(client: &Client) -> Vec<String> {
    INSTALLED
        .get_or_init(|| async {
            let files = yaml_files(&generated_dir());
            assert!(
                !files.is_empty(),
                "no CRDs in {}: run cargo run -p dlock-operator --bin crdgen",
                generated_dir().display()
            );
            let api = k8s::cluster_api::<CustomResourceDefinition>(client);
            let mut names = Vec::new();
            for (file, bytes) in &files {
                let crd: CustomResourceDefinition = serde_yaml::from_slice(bytes)
                    .unwrap_or_else(|e| panic!("{file} is not a CustomResourceDefinition: {e}"));
                names.push(k8s::apply(&api, &crd).await.name_any());
            }
            for crd in &names {
                k8s::wait_until(
                    &api,
                    crd,
                    &format!("CRD {crd} Established"),
                    Duration::from_secs(60),
                    conditions::is_crd_established(),
                )
                .await;
            }
            names
        })
        .await
        .clone()
}
